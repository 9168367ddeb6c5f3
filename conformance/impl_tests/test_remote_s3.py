"""A token store in an S3 bucket (moto's server on 127.0.0.1), read through RemoteFiles and a node-local cache:
identical to the local store, one download per node, every injected fault retried or refused with a typed error,
no corrupted token ever served, a rewritten object refused."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conformance.impl_tests.remote_servers import CREDENTIALS, FaultProxy, S3Server, run_spawned, s3_options
from impl.cache import STATE_DIR
from impl.errors import CacheLimitError, ConfigError, DownloadError, RemoteChangedError, StoreCorruptError
from impl.remote import RemoteFiles
from impl.store import TokenStore

BUCKET, PREFIX = "bucket", "store"
REMOTE = f"s3://{BUCKET}/{PREFIX}"
VICTIM = "tokens-00002.arrow"


def _documents(seed: int, files: int = 4, docs: int = 40) -> list[list[list[int]]]:
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, 50_000, size=int(rng.integers(50, 3000))).tolist() for _ in range(docs)]
            for _ in range(files)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    local = tmp_path_factory.mktemp("built") / "store"
    TokenStore.from_token_files(_documents(0), local, vocab_size=50_000)
    with S3Server() as server:
        server.upload_dir(local, BUCKET, PREFIX)
        server.local_store = local   # type: ignore[attr-defined]
        yield server


def _all_documents(store: TokenStore) -> list[bytes]:
    return [np.asarray(store[i]).tobytes() for i in range(len(store))]


def _open(endpoint: str, cache: Path, **kwargs) -> TokenStore:
    files = RemoteFiles(REMOTE, cache, storage_options=s3_options(endpoint), **kwargs)
    return TokenStore.open(REMOTE, files=files)


def _cache_is_clean(cache: Path, name: str) -> None:
    """Nothing of ``name`` that a later reader would trust, and no partial left behind."""
    assert not (cache / name).exists()
    assert os.listdir(cache / STATE_DIR / "partial") == []


def test_a_store_in_s3_reads_identically_to_the_local_store_and_each_file_downloads_once(s3, tmp_path):
    local = TokenStore.open(s3.local_store)
    remote = _open(s3.url, tmp_path / "cache")
    assert remote.fingerprint == local.fingerprint and len(remote) == len(local)
    assert _all_documents(remote) == _all_documents(local)
    np.testing.assert_array_equal(remote.lengths, local.lengths)
    remote.verify()
    files = remote._files
    assert isinstance(files, RemoteFiles)
    assert files.downloads == len(os.listdir(s3.local_store))       # every file once (meta.json, tables, tokens)
    again = _open(s3.url, tmp_path / "cache")
    assert _all_documents(again) == _all_documents(local) and again._files.downloads == 0


def test_the_proxy_counts_the_body_bytes_it_forwards_so_a_cold_read_counts_every_file_and_reset_starts_from_zero(
        s3, tmp_path):
    import boto3

    victim = (s3.local_store / VICTIM).read_bytes()
    with FaultProxy(s3.url) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1",
                              aws_access_key_id=CREDENTIALS["key"], aws_secret_access_key=CREDENTIALS["secret"])
        assert client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{VICTIM}")["Body"].read() == victim
        assert (proxy.body_bytes, proxy.requests) == (len(victim), 1)
        proxy.reset()
        assert (proxy.body_bytes, proxy.requests) == (0, 0)
        _all_documents(_open(proxy.url, tmp_path / "cache"))
        files = sum(p.stat().st_size for p in s3.local_store.iterdir() if p.is_file())
        assert proxy.body_bytes >= files and proxy.requests >= len(os.listdir(s3.local_store))


@pytest.mark.parametrize("fault", ["500", "reset", "stall", "truncate"])
def test_a_transient_fault_is_retried_and_the_store_reads_identically(s3, tmp_path, fault):
    with FaultProxy(s3.url, stall_s=3.0) as proxy:
        proxy.add(VICTIM, fault, times=1)
        store = _open(proxy.url, tmp_path / "cache", download_timeout=1.0, download_retry=2)
        assert _all_documents(store) == _all_documents(TokenStore.open(s3.local_store))
        assert proxy.hits(fault) == 1


@pytest.mark.parametrize("fault", ["500", "reset", "stall", "truncate"])
def test_a_fault_that_persists_past_download_retry_is_a_download_error_naming_url_attempts_and_cause(
        s3, tmp_path, fault):
    cache = tmp_path / "cache"
    with FaultProxy(s3.url, stall_s=3.0) as proxy:
        proxy.add(VICTIM, fault, times=-1)
        store = _open(proxy.url, cache, download_timeout=1.0, download_retry=1)
        with pytest.raises(DownloadError) as err:
            _all_documents(store)
    message = str(err.value)
    assert f"{REMOTE}/{VICTIM}: download failed after 2 attempts (download_retry=1); last cause:" in message
    assert CREDENTIALS["secret"] not in message and CREDENTIALS["key"] not in message
    _cache_is_clean(cache, VICTIM)


def _no_checksums(endpoint: str) -> dict[str, object]:
    """Storage options with botocore's response checksums off, so the layers behind it are what refuses."""
    return {**s3_options(endpoint), "config_kwargs": {"response_checksum_validation": "when_required",
                                                      "retries": {"total_max_attempts": 1}}}


def test_flipped_bytes_are_refused_by_the_s3_clients_checksum_at_download_and_never_cached(s3, tmp_path):
    cache = tmp_path / "cache"
    with FaultProxy(s3.url) as proxy:
        proxy.add(VICTIM, "flip", times=-1)
        store = _open(proxy.url, cache, download_retry=1)
        with pytest.raises(DownloadError, match="after 2 attempts.*checksum"):
            _all_documents(store)
    _cache_is_clean(cache, VICTIM)


def test_flipped_bytes_in_a_token_file_are_refused_by_the_stores_crc_checks_never_served(s3, tmp_path):
    local = _all_documents(TokenStore.open(s3.local_store))
    with FaultProxy(s3.url) as proxy:
        proxy.add(VICTIM, "flip", times=-1)
        files = RemoteFiles(REMOTE, tmp_path / "cache", storage_options=_no_checksums(proxy.url))
        store = TokenStore.open(REMOTE, files=files)
        served = []
        with pytest.raises(StoreCorruptError, match=VICTIM):
            for i in range(len(store)):
                served.append(np.asarray(store[i]).tobytes())
        assert served == local[: len(served)]      # every document served before the refusal is the built one
        assert proxy.hits("flip") >= 1


def test_flipped_bytes_with_validate_hash_md5_are_refused_at_download_and_never_cached(s3, tmp_path):
    cache = tmp_path / "cache"
    with FaultProxy(s3.url) as proxy:
        proxy.add(VICTIM, "flip", times=-1)
        files = RemoteFiles(REMOTE, cache, storage_options=_no_checksums(proxy.url), validate_hash="md5",
                            download_retry=1)
        store = TokenStore.open(REMOTE, files=files)
        with pytest.raises(DownloadError, match=r"the body's md5 is [0-9a-f]{32}, the object's is [0-9a-f]{32}"):
            _all_documents(store)
    _cache_is_clean(cache, VICTIM)


def test_an_object_rewritten_after_the_store_was_opened_is_refused_never_mixed(s3, tmp_path):
    client = s3.client()
    other = TokenStore.from_token_files(_documents(1), tmp_path / "other", vocab_size=50_000)
    key = f"{PREFIX}/{VICTIM}"
    original = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    store = _open(s3.url, tmp_path / "cache")
    try:
        client.put_object(Bucket=BUCKET, Key=key, Body=(other.path / VICTIM).read_bytes())
        with pytest.raises(RemoteChangedError, match=f"{REMOTE}/{VICTIM} changed since this reader first saw it"):
            _all_documents(store)
    finally:
        client.put_object(Bucket=BUCKET, Key=key, Body=original)


def _read_pickled(blob: bytes, out: mp.Queue) -> None:   # type: ignore[type-arg]
    store = pickle.loads(blob)
    docs = _all_documents(store)
    out.put((store._files.downloads, docs))


def test_two_processes_given_the_pickled_store_share_one_download_of_each_file(s3, tmp_path):
    store = _open(s3.url, tmp_path / "cache")          # meta.json is now cached; the tables and tokens are not
    opened = store._files.downloads
    blob = pickle.dumps(store)
    assert b"s3fs" not in blob and b"RemoteConfig" in blob   # the configuration travels, never a client or handle
    results = run_spawned(_read_pickled, [(blob,)] * 2, timeout=120)
    local = _all_documents(TokenStore.open(s3.local_store))
    assert all(docs == local for _, docs in results)
    assert opened == 1
    assert opened + sum(n for n, _ in results) == len(os.listdir(s3.local_store))   # each file once on the node


def _download_forever(endpoint: str, cache: str) -> None:
    RemoteFiles(REMOTE, cache, storage_options=s3_options(endpoint), download_timeout=60.0).map(VICTIM)


def test_a_process_killed_mid_download_leaves_nothing_trusted_and_its_lock_and_partial_go(s3, tmp_path):
    cache = tmp_path / "cache"
    with FaultProxy(s3.url, stall_s=60.0) as proxy:
        proxy.add(VICTIM, "stall", times=1)
        ctx = mp.get_context("spawn")
        child = ctx.Process(target=_download_forever, args=(proxy.url, str(cache)))
        child.start()
        try:
            partial_dir = cache / STATE_DIR / "partial"
            for _ in range(600):
                if proxy.hits("stall") and partial_dir.is_dir() and os.listdir(partial_dir):   # its GET is stalled
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the child never started its download")
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.join(30)
        assert child.exitcode == -signal.SIGKILL
        assert not (cache / VICTIM).exists()
        files = RemoteFiles(REMOTE, cache, storage_options=s3_options(proxy.url), download_timeout=5.0)
        assert bytes(files.map(VICTIM)) == (s3.local_store / VICTIM).read_bytes()
        assert files.downloads == 1
        assert os.listdir(cache / STATE_DIR / "partial") == []


def _cached_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.iterdir() if p.is_file())


def test_reading_the_whole_store_twice_under_a_third_of_its_size_evicts_but_never_a_held_file(s3, tmp_path):
    built = tmp_path / "many"
    TokenStore.from_token_files(_documents(2, files=12, docs=12), built, vocab_size=50_000)
    s3.upload_dir(built, BUCKET, "many")
    limit = sum(p.stat().st_size for p in built.iterdir()) // 3
    cache = tmp_path / "cache"
    files = RemoteFiles(f"s3://{BUCKET}/many", cache, cache_limit=limit, storage_options=s3_options(s3.url))
    store = TokenStore.open(f"s3://{BUCKET}/many", files=files)
    want = _all_documents(TokenStore.open(built))
    first = store.file_records[0].name
    held = store[0]                                   # a reader keeps a view of file 0 throughout
    for _ in range(2):
        got = []
        for i in range(len(store)):
            got.append(np.asarray(store[i]).tobytes())
            assert _cached_bytes(cache) <= limit
            assert (cache / first).exists()
        assert got == want
    assert np.asarray(held).tobytes() == want[0]
    assert files.downloads >= 2 * store.num_files     # every token file evicted and fetched again in epoch 2


def test_token_store_open_takes_a_url_and_a_local_cache_and_refuses_a_url_without_one(s3, tmp_path):
    store = TokenStore.open(REMOTE, local=tmp_path / "cache", storage_options=s3_options(s3.url))
    assert _all_documents(store) == _all_documents(TokenStore.open(s3.local_store))
    with pytest.raises(ConfigError, match=r"is a URL: pass a local cache directory, TokenStore.open\("):
        TokenStore.open(REMOTE)


def test_a_cache_limit_that_cannot_hold_one_read_is_refused_at_open_with_the_bytes_it_needs(s3, tmp_path):
    cache = tmp_path / "cache"
    sizes = sorted((p.stat().st_size for p in s3.local_store.glob("tokens-*")), reverse=True)
    tables = sum(p.stat().st_size for p in s3.local_store.iterdir() if not p.name.startswith("tokens-"))
    needed = tables + sizes[0] + sizes[1] + sizes[2]   # two files held, the next one downloading
    with pytest.raises(CacheLimitError, match=rf"raise cache_limit to at least {needed} bytes"):
        TokenStore.open(REMOTE, local=cache, cache_limit=needed - 1, storage_options=s3_options(s3.url))
    assert not list(cache.glob("tokens-*"))
    TokenStore.open(REMOTE, local=cache, cache_limit=needed, storage_options=s3_options(s3.url))


def test_a_file_larger_than_cache_limit_reaches_the_reader_as_a_cache_limit_error_not_a_corrupt_store(s3, tmp_path):
    files = RemoteFiles(REMOTE, tmp_path / "cache", cache_limit=10_000, storage_options=s3_options(s3.url))
    store = TokenStore.open(REMOTE, files=files)
    with pytest.raises(CacheLimitError, match=r"raise cache_limit to at least \d+ bytes"):
        _all_documents(store)


def test_validate_hash_sha256_checks_each_token_file_against_its_meta_json_record_as_it_downloads(s3, tmp_path):
    cache = tmp_path / "cache"
    with FaultProxy(s3.url) as proxy:
        proxy.add(VICTIM, "flip", times=-1)
        store = TokenStore.open(REMOTE, local=cache, validate_hash="sha256", download_retry=0,
                                storage_options=_no_checksums(proxy.url))
        with pytest.raises(DownloadError, match=r"after 1 attempt .*the body's sha256 is [0-9a-f]{64}"):
            _all_documents(store)
    _cache_is_clean(cache, VICTIM)


def test_a_packed_dataset_over_the_remote_store_yields_the_local_stores_samples_and_writes_no_url_directory(
        s3, tmp_path, monkeypatch):
    from impl.dataset import PackedDataset

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    remote = TokenStore.open(REMOTE, local=tmp_path / "cache", storage_options=s3_options(s3.url))
    local = TokenStore.open(s3.local_store)
    a = PackedDataset(remote, seq_len=64, shuffle="global", seed=3)
    b = PackedDataset(local, seq_len=64, shuffle="global", seed=3, cache_dir=False)
    assert len(a) == len(b)
    for i in range(len(a)):
        for key, value in a.sample(0, i).items():
            np.testing.assert_array_equal(value, b.sample(0, i)[key])
    assert not (tmp_path / "s3:").exists()


def _cache_bytes_now(cache: Path) -> int:
    total = 0
    for entry in os.scandir(cache):
        try:
            if entry.is_file():
                total += entry.stat().st_size
        except FileNotFoundError:   # evicted by the other reader meanwhile
            pass
    return total


def _read_under_limit(url: str, endpoint: str, cache: str, limit: int, reverse: bool,
                      out: mp.Queue) -> None:   # type: ignore[type-arg]
    os.environ["LOCAL_WORLD_SIZE"] = "2"   # two readers share each cache: open refuses a limit too small for both
    store = TokenStore.open(url, local=cache, cache_limit=limit, download_timeout=5.0,
                            storage_options=s3_options(endpoint))
    order = range(len(store) - 1, -1, -1) if reverse else range(len(store))
    docs, over = {}, 0
    for i in order:
        docs[i] = np.asarray(store[i]).tobytes()
        over = max(over, _cache_bytes_now(Path(cache)) - limit)
    out.put((store._files.downloads, over, [docs[i] for i in range(len(store))]))


def test_two_processes_reading_in_opposite_orders_under_a_third_of_the_store_share_the_cache_and_evict_safely(
        s3, tmp_path):
    built = tmp_path / "wide"
    TokenStore.from_token_files(_documents(3, files=27, docs=8), built, vocab_size=50_000)
    s3.upload_dir(built, BUCKET, "wide")
    limit = sum(p.stat().st_size for p in built.iterdir()) // 3
    sizes = sorted((p.stat().st_size for p in built.glob("tokens-*")), reverse=True)
    tables = sum(p.stat().st_size for p in built.iterdir()) - sum(sizes)
    assert tables + sum(sizes[:6]) <= limit   # each reader maps two files and downloads a third: room for both
    results = run_spawned(_read_under_limit, [(f"s3://{BUCKET}/wide", s3.url, str(tmp_path / "cache"), limit, reverse)
                                              for reverse in (False, True)], timeout=180)
    want = _all_documents(TokenStore.open(built))
    assert all(docs == want for _, _, docs in results)
    assert all(over <= 0 for _, over, _ in results)                 # the cache never held more than cache_limit
    assert sum(n for n, _, _ in results) > len(os.listdir(built))   # evictions: more than one download a file


def test_a_file_released_evicted_and_downloaded_again_corrupted_is_checked_anew_never_served_as_verified(
        s3, tmp_path):
    built = tmp_path / "again"
    TokenStore.from_token_files(_documents(4, files=12, docs=12), built, vocab_size=50_000)
    s3.upload_dir(built, BUCKET, "again")
    limit = sum(p.stat().st_size for p in built.iterdir()) // 3
    want = _all_documents(TokenStore.open(built))
    with FaultProxy(s3.url) as proxy:
        files = RemoteFiles(f"s3://{BUCKET}/again", tmp_path / "cache", cache_limit=limit,
                            storage_options=_no_checksums(proxy.url))
        store = TokenStore.open(f"s3://{BUCKET}/again", files=files)
        assert _all_documents(store) == want               # every document verified once, file 0 long evicted
        assert not (tmp_path / "cache" / "tokens-00000.arrow").exists()
        proxy.add("tokens-00000", "flip", times=-1)         # its next download arrives with a flipped byte
        with pytest.raises(StoreCorruptError, match="tokens-00000.arrow"):
            _all_documents(store)


def test_two_nodes_with_their_own_caches_read_one_bucket_concurrently_each_evicting_only_in_its_own_cache(
        s3, tmp_path):
    built = tmp_path / "nodes"
    TokenStore.from_token_files(_documents(5, files=12, docs=8), built, vocab_size=50_000)
    s3.upload_dir(built, BUCKET, "nodes")
    sizes = sorted((p.stat().st_size for p in built.glob("tokens-*")), reverse=True)
    tables = sum(p.stat().st_size for p in built.iterdir() if not p.name.startswith("tokens-"))
    limit = tables + sum(sizes[:7])   # two readers' three files each, and one: under half the token files
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    ctx = mp.get_context("spawn")
    outs = [ctx.Queue() for _ in nodes]
    procs = [ctx.Process(target=_read_under_limit, args=(f"s3://{BUCKET}/nodes", s3.url, str(node), limit, reverse,
                                                          out))
             for node, out in zip(nodes, outs) for reverse in (False, True)]
    for p in procs:
        p.start()
    results = [[out.get(timeout=240) for _ in range(2)] for out in outs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    want = _all_documents(TokenStore.open(built))
    tokens = len(list(built.glob("tokens-*")))
    for node, got in zip(nodes, results):
        assert all(docs == want for _, _, docs in got)                 # every document, both orders, both nodes
        assert all(over <= 0 for _, over, _ in got)                    # each cache within cache_limit throughout
        assert sum(n for n, _, _ in got) >= tokens + 3                 # each node downloads every file itself
        assert os.listdir(node / STATE_DIR / "partial") == []
        for copy in node.glob("tokens-*"):
            assert copy.read_bytes() == (built / copy.name).read_bytes()
