"""RemoteFiles over file:// (quick cases): one cached copy per node, bounded eviction that spares held files,
crash-safe partials, changed objects refused, credentials never shown, pickling by configuration."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
from pathlib import Path

import pytest

from impl.cache import STATE_DIR, parse_bytes
from impl.errors import CacheLimitError, CacheWaitError, ConfigError, LoadspecError, RemoteChangedError
from impl.files import FileAccess
from impl.remote import RemoteFiles, redact_url, scrub

KIB = 1024


def _remote(tmp_path: Path, sizes: list[int]) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "remote"
    root.mkdir()
    content = {}
    for i, size in enumerate(sizes):
        data = os.urandom(size)
        (root / f"f{i}.bin").write_bytes(data)
        content[f"f{i}.bin"] = data
    return root, content


def _cached_bytes(local: Path) -> int:
    return sum(p.stat().st_size for p in local.iterdir() if p.is_file())


def test_a_file_url_is_read_identically_through_the_cache_and_downloaded_once_per_cache_directory(tmp_path):
    root, content = _remote(tmp_path, [100 * KIB, 0, 3])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache")
    assert isinstance(files, FileAccess)
    for name, data in content.items():
        st = files.stat(name)
        assert st is not None and st.size == len(data)
        assert bytes(files.map(name)) == data
        with files.open(name) as fh:
            assert fh.read() == data
    assert files.stat("missing.bin") is None
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        files.map("missing.bin")
    assert files.downloads == 3
    again = RemoteFiles(f"file://{root}", tmp_path / "cache")   # another process of the node, same cache
    assert all(bytes(again.map(name)) == data for name, data in content.items())
    assert again.downloads == 0


def test_cache_limit_takes_bytes_or_mosaicml_sizes_and_refuses_nonsense():
    assert parse_bytes("10gb") == 10 * 1024**3
    assert parse_bytes("1.5KB") == 1536
    assert parse_bytes(4096) == 4096 and parse_bytes(None) is None
    for bad in ("ten", "5 parsecs", 0, -1, True, 1.5):
        with pytest.raises(CacheLimitError, match="cache_limit"):
            parse_bytes(bad)   # type: ignore[arg-type]


def test_a_file_larger_than_cache_limit_is_refused_with_the_bytes_it_needs(tmp_path):
    root, _ = _remote(tmp_path, [50 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", cache_limit=10 * KIB)
    with pytest.raises(CacheLimitError, match=rf"at least {50 * KIB} bytes"):
        files.map("f0.bin")
    assert not (tmp_path / "cache" / "f0.bin").exists()


def test_reading_every_file_in_turn_under_a_third_of_the_total_evicts_but_never_a_held_file(tmp_path):
    sizes = [30 * KIB] * 9
    root, content = _remote(tmp_path, sizes)
    limit = sum(sizes) // 3                        # three files
    local = tmp_path / "cache"
    files = RemoteFiles(f"file://{root}", local, cache_limit=limit)
    held = files.map("f0.bin")                     # a reader keeps f0 mapped throughout
    for epoch in range(2):
        for name, data in content.items():
            view = files.map(name)
            assert bytes(view) == data
            assert _cached_bytes(local) <= limit
            assert (local / "f0.bin").exists(), f"the held f0.bin was evicted (epoch {epoch}, reading {name})"
            del view
            gc.collect()
    assert bytes(held) == content["f0.bin"]
    assert files.downloads > len(content)           # files were evicted and fetched again in epoch 2
    del held
    gc.collect()
    for name in content:                            # once released, f0 is evictable like any other
        files.map(name)
    assert not (local / "f0.bin").exists()


def test_a_read_that_only_held_files_block_is_refused_naming_the_bytes_held(tmp_path):
    root, _ = _remote(tmp_path, [30 * KIB, 30 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", cache_limit=40 * KIB, download_timeout=0.2,
                        download_retry=0)
    held = files.map("f0.bin")
    with pytest.raises(CacheLimitError, match=rf"{30 * KIB} of them held by readers"):
        files.map("f1.bin")
    del held


def test_an_object_rewritten_after_it_was_first_seen_is_refused_and_a_new_reader_gets_the_new_bytes(tmp_path):
    root, content = _remote(tmp_path, [8 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache")
    assert files.stat("f0.bin") is not None        # pinned here
    (root / "f0.bin").write_bytes(b"x" * 100)
    with pytest.raises(RemoteChangedError, match="changed since this reader first saw it"):
        files.map("f0.bin")
    fresh = RemoteFiles(f"file://{root}", tmp_path / "cache")
    assert bytes(fresh.map("f0.bin")) == b"x" * 100
    os.utime(root / "f0.bin", ns=(1, 1))           # and a copy cached at an older version is never served
    newer = RemoteFiles(f"file://{root}", tmp_path / "cache")
    (root / "f0.bin").write_bytes(b"y" * 100)
    assert bytes(newer.map("f0.bin")) == b"y" * 100
    assert newer.downloads == 1
    del content


def test_a_copy_without_its_record_and_a_dead_holders_partial_are_never_trusted(tmp_path):
    root, content = _remote(tmp_path, [8 * KIB])
    local = tmp_path / "cache"
    files = RemoteFiles(f"file://{root}", local)
    (local / "f0.bin").write_bytes(b"half a download")   # as a crash before the rename would never leave it, but
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=int)
    child.start()
    child.join(30)
    dead = child.pid
    partial = local / STATE_DIR / "partial" / f"partial,{files.cache.host},{dead},abc,{8 * KIB},f0.bin"
    partial.write_bytes(b"partial")
    again = RemoteFiles(f"file://{root}", local)
    assert not partial.exists()
    assert bytes(again.map("f0.bin")) == content["f0.bin"]
    assert again.downloads == 1


def test_credentials_never_appear_in_urls_shown(tmp_path):
    assert redact_url("s3://AKIA:SECRET@bucket/store?X-Amz-Signature=abc#f") == "s3://bucket/store"
    text = "GET https://user:pw@host:9000/b/k?X-Amz-Credential=AKIA&X-Amz-Signature=sig failed"
    assert scrub(text) == "GET https://host:9000/b/k failed"
    root, _ = _remote(tmp_path, [10])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", storage_options={"auto_mkdir": False})
    assert "SECRET" not in repr(files) and files.where("f0.bin") == f"file://{root}/f0.bin"


def test_bad_options_are_refused_with_what_is_allowed(tmp_path):
    for kwargs, match in ((dict(download_retry=-1), "download_retry"), (dict(download_timeout=0), "download_timeout"),
                          (dict(validate_hash="crc"), "validate_hash must be None or one of md5, sha256")):
        with pytest.raises(ConfigError, match=match):
            RemoteFiles(f"file://{tmp_path}", tmp_path / "cache", **kwargs)   # type: ignore[arg-type]
    with pytest.raises(LoadspecError, match="no filesystem for nosuchproto"):
        RemoteFiles("nosuchproto://x/y", tmp_path / "cache")


def test_a_remote_files_pickles_as_its_configuration_and_shares_the_cache(tmp_path):
    root, content = _remote(tmp_path, [4 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", cache_limit="1mb", download_retry=5)
    files.map("f0.bin")
    clone = pickle.loads(pickle.dumps(files))
    assert clone.config == files.config and clone.config.download_retry == 5
    assert bytes(clone.map("f0.bin")) == content["f0.bin"] and clone.downloads == 0


def _read_all(remote: str, local: str, names: list[str], out: mp.Queue) -> None:   # type: ignore[type-arg]
    files = RemoteFiles(remote, local)
    digests = {name: bytes(files.map(name)) for name in names}
    out.put((files.downloads, digests))


def test_two_processes_of_a_node_share_one_download_of_each_file(tmp_path):
    root, content = _remote(tmp_path, [2 * 1024 * KIB] * 3)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(f"file://{root}", str(tmp_path / "cache"), sorted(content), out))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sum(downloads for downloads, _ in results) == len(content)
    assert all(got == content for _, got in results)


def test_waiting_on_a_download_that_makes_no_progress_is_bounded_and_names_the_holder(tmp_path):
    root, content = _remote(tmp_path, [4 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", download_timeout=0.2, download_retry=0)
    waits = pytest.raises(CacheWaitError, match=rf"held by host '.+' pid {os.getpid()} .*made no progress")
    with files.cache.download_lock("f0.bin"), waits:   # another holder (its own lock description), never progressing
        files.map("f0.bin")
    assert bytes(files.map("f0.bin")) == content["f0.bin"]   # released: the next reader downloads it


def test_a_store_opened_by_url_names_the_url_unfolded_in_its_repr_and_messages(tmp_path):
    from impl.errors import StoreCorruptError, StoreError
    from impl.store import TokenStore

    built = TokenStore.from_token_files([[[1, 2, 3], [4]], [[5, 6]]], tmp_path / "store", vocab_size=10)
    url = f"file://{built.path}"          # file:///tmp/...: Path() would fold it to file:/tmp/...
    store = TokenStore.open(url, local=tmp_path / "cache")
    assert store[2].tolist() == [5, 6]
    assert f"TokenStore({url!r}," in repr(store)
    store.close()
    with pytest.raises(StoreError, match=f"token store {url} is closed; open it again with TokenStore.open"):
        store[0]
    second = built.file_records[1].name
    (built.path / second).unlink()
    with pytest.raises(StoreCorruptError, match=f"token store {url}: file {second} is missing"):
        TokenStore.open(url, local=tmp_path / "cache2")
