"""RemoteFiles over file:// (quick cases): one cached copy per node, bounded eviction that spares held files,
crash-safe partials, changed objects refused, credentials never shown, pickling by configuration."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
from pathlib import Path

import pytest

from conformance.impl_tests.remote_servers import run_spawned
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
    results = run_spawned(_read_all, [(f"file://{root}", str(tmp_path / "cache"), sorted(content))] * 2, timeout=120)
    assert sum(downloads for downloads, _ in results) == len(content)
    assert all(got == content for _, got in results)


def test_waiting_on_a_download_that_makes_no_progress_is_bounded_and_names_the_holder(tmp_path):
    root, content = _remote(tmp_path, [4 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", download_timeout=0.2, download_retry=0)
    waits = pytest.raises(CacheWaitError, match=rf"held by host '.+' pid {os.getpid()} .*made no progress")
    with files.cache.download_lock("f0.bin"), waits:   # another holder (its own lock description), never progressing
        files.map("f0.bin")
    assert bytes(files.map("f0.bin")) == content["f0.bin"]   # released: the next reader downloads it


def _flip_in_place(path: Path, at: int) -> None:
    """Flip one byte of ``path`` without changing its inode (as a copy that arrived corrupted would be)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _store_docs(store) -> list[bytes]:
    import numpy as np

    return [np.asarray(store[i]).tobytes() for i in range(len(store))]


def test_a_cached_copy_refused_by_the_crcs_is_dropped_named_by_url_and_downloaded_again_on_the_next_open(tmp_path):
    from impl.errors import StoreCorruptError
    from impl.store import TokenStore

    built = tmp_path / "remote"
    TokenStore.from_token_files([[[i * 7 + j for j in range(40)] for i in range(30)] for _ in range(3)], built,
                                vocab_size=1000)
    want = _store_docs(TokenStore.open(built))
    url, cache = f"file://{built}", tmp_path / "cache"
    victim = TokenStore.open(built).file_records[1].name
    first = RemoteFiles(url, cache)
    assert _store_docs(TokenStore.open(url, files=first)) == want and first.downloads == 6
    _flip_in_place(cache / victim, (cache / victim).stat().st_size // 3)   # the copy is bad, its record still matches
    before = (cache / victim).stat().st_ino
    files = RemoteFiles(url, cache)
    store = TokenStore.open(url, files=files)
    with pytest.raises(StoreCorruptError) as refused:
        _store_docs(store)
    message = str(refused.value)
    assert f"{url}/{victim}" in message and str(cache / victim) in message and "dropped" in message
    assert "rebuild" not in message.lower() and files.downloads == 0
    assert not (cache / victim).exists()                         # only the refused copy went
    assert all((cache / r.name).exists() for r in store.file_records if r.name != victim)
    again = RemoteFiles(url, cache)
    assert _store_docs(TokenStore.open(url, files=again)) == want
    assert again.downloads == 1 and (cache / victim).stat().st_ino != before


def test_a_local_store_refused_by_its_crcs_still_says_restore_or_rebuild_and_keeps_its_file(tmp_path):
    from impl.errors import StoreCorruptError
    from impl.store import TokenStore

    built = tmp_path / "store"
    TokenStore.from_token_files([[[i + j for j in range(40)] for i in range(30)]], built, vocab_size=1000)
    name = TokenStore.open(built).file_records[0].name
    _flip_in_place(built / name, (built / name).stat().st_size // 3)
    with pytest.raises(StoreCorruptError, match="restore the file from a good copy or rebuild"):
        _store_docs(TokenStore.open(built))
    assert (built / name).exists()


def test_a_refused_copy_that_another_process_already_replaced_is_left_in_place(tmp_path):
    root, content = _remote(tmp_path, [4 * KIB])
    files = RemoteFiles(f"file://{root}", tmp_path / "cache")
    assert bytes(files.map("f0.bin")) == content["f0.bin"]
    assert files.cache.drop("f0.bin", "some other version", 4 * KIB) is False    # not the copy that was refused
    assert (tmp_path / "cache" / "f0.bin").exists()
    (tmp_path / "cache" / "other").write_bytes(content["f0.bin"])
    (tmp_path / "cache" / "other").replace(tmp_path / "cache" / "f0.bin")   # a file the cache did not install
    st = files.stat("f0.bin")
    assert st is not None and files.cache.drop("f0.bin", st.version, st.size) is False
    assert (tmp_path / "cache" / "f0.bin").exists()


def test_prefetch_downloads_exactly_the_files_named_in_a_background_thread_and_the_read_then_only_maps(tmp_path):
    root, content = _remote(tmp_path, [8 * KIB] * 6)
    files = RemoteFiles(f"file://{root}", tmp_path / "cache")
    upcoming = ["f1.bin", "f3.bin", "f4.bin"]
    thread = files.prefetch(upcoming)
    thread.join(60)
    assert not thread.is_alive() and files.downloads == len(upcoming)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_file()) == upcoming
    assert [bytes(files.map(n)) for n in upcoming] == [content[n] for n in upcoming] and files.downloads == 3
    files.prefetch(upcoming).join(60)                      # already cached: nothing downloaded again
    assert files.downloads == 3


def _belady_misses(order: list[str], slots: int) -> int:
    """Downloads of ``order`` through ``slots`` files when the file needed furthest ahead is evicted (the optimum)."""
    held: list[str] = []
    misses = 0
    for i, name in enumerate(order):
        if name in held:
            continue
        misses += 1
        if len(held) == slots:
            ahead = order[i + 1:]
            held.remove(max(held, key=lambda h: ahead.index(h) if h in ahead else len(order)))
        held.append(name)
    return misses


def test_a_scheduled_reader_evicts_the_file_needed_furthest_ahead_and_downloads_fewer_than_lru(tmp_path):
    root, content = _remote(tmp_path, [30 * KIB] * 4)
    order = [f"f{i}.bin" for i in range(4)] * 3            # a cycle one file larger than the cache: LRU misses always
    lru = RemoteFiles(f"file://{root}", tmp_path / "lru", cache_limit=3 * 30 * KIB)
    assert all(bytes(lru.map(n)) == content[n] for n in order) and lru.downloads == len(order)
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", cache_limit=3 * 30 * KIB)
    files.schedule(order)
    assert all(bytes(files.map(n)) == content[n] for n in order)
    assert files.downloads == _belady_misses(order, 3) == 6


def test_a_sequential_scheduled_epoch_under_eviction_downloads_each_byte_once(tmp_path):
    root, content = _remote(tmp_path, [20 * KIB] * 9)
    order = [f"f{i}.bin" for i in (4, 0, 8, 2, 6, 1, 7, 3, 5)]
    files = RemoteFiles(f"file://{root}", tmp_path / "cache", cache_limit=3 * 20 * KIB)
    files.schedule(order)
    held = []
    for name in order:                                    # a store holds the last two files it read
        held = [*held[-1:], files.map(name)]
        assert bytes(held[-1]) == content[name]
    assert files.downloads == len(order) and files.downloaded_bytes == sum(map(len, content.values()))


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


def test_a_url_with_no_store_says_to_build_locally_and_copy_the_files_not_to_build_at_the_url(tmp_path):
    from impl.errors import StoreNotFoundError
    from impl.store import TokenStore

    (tmp_path / "empty").mkdir()
    url = (tmp_path / "empty").as_uri()
    with pytest.raises(StoreNotFoundError, match="build the store locally") as refused:
        TokenStore.open(url, local=tmp_path / "cache")
    assert url in str(refused.value) and "file:/" + str(tmp_path) not in str(refused.value).replace(url, "")


def _sequential_epoch_bytes(built: Path, cache: Path, limit: int | None) -> tuple[RemoteFiles, list[bytes]]:
    """Every sample of a file-shuffled epoch read from ``built`` through a fresh cache: (its access, the samples)."""
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    files = RemoteFiles(f"file://{built}", cache, cache_limit=limit)
    store = TokenStore.open(f"file://{built}", files=files)
    ds = PackedDataset(store, seq_len=256, shuffle="window", window=1, seed=3, cache_dir=cache.parent / "plans")
    return files, [ds.sample(0, i)["input_ids"].tobytes() for i in range(len(ds))]


def test_a_fresh_first_epoch_from_a_remote_store_downloads_each_token_file_about_once(tmp_path):
    import numpy as np

    from impl.store import TokenStore

    rng = np.random.default_rng(5)
    built = tmp_path / "remote"
    TokenStore.from_token_files([[rng.integers(0, 50_000, size=int(rng.integers(200, 1800))).tolist()
                                  for _ in range(150)] for _ in range(8)], built, vocab_size=50_000)
    token_bytes = sum(p.stat().st_size for p in built.glob("tokens-*"))
    sizes = sorted((p.stat().st_size for p in built.glob("tokens-*")), reverse=True)
    limit = sum(p.stat().st_size for p in built.iterdir() if p.is_file()) - token_bytes + sum(sizes[:3])
    files, samples = _sequential_epoch_bytes(built, tmp_path / "cache", limit)   # no plan cached: it is built
    local = TokenStore.open(built)
    block = local.meta["layout"]["block_bytes"]
    offsets_blocks = 0                         # the blocks holding each file's document offsets, read by range
    for rec in local.file_records:
        at, n = rec.buffers["offsets"]
        offsets_blocks += min(-(-(at + n) // block) * block, rec.size) - at // block * block
    tables = sum(p.stat().st_size for p in built.iterdir() if p.is_file()) - token_bytes
    assert files.downloads == 8 + 3            # the token files once each, meta.json and the two CRC tables
    assert files.downloaded_bytes == tables + token_bytes + offsets_blocks
    assert files.downloaded_bytes / token_bytes < 1.2   # it was about 2: every file whole for the plan, then again
    from impl.dataset import PackedDataset

    want = PackedDataset(local, seq_len=256, shuffle="window", window=1, seed=3, cache_dir=False)
    assert samples == [want.sample(0, i)["input_ids"].tobytes() for i in range(len(want))]


def test_a_corrupted_offsets_region_read_by_range_is_refused_before_any_entry_is_used(tmp_path):
    from impl.errors import StoreCorruptError
    from impl.store import TokenStore

    built = TokenStore.from_token_files([[[i * 7 + j for j in range(300)] for i in range(40)] for _ in range(3)],
                                        tmp_path / "remote", vocab_size=1000)
    rec = built.file_records[1]
    at, _ = rec.buffers["offsets"]
    _flip_in_place(tmp_path / "remote" / rec.name, at + 8 * 5 + 1)     # document 5's start offset, in the object
    files = RemoteFiles(f"file://{tmp_path / 'remote'}", tmp_path / "cache")
    store = TokenStore.open(f"file://{tmp_path / 'remote'}", files=files)
    with pytest.raises(StoreCorruptError, match=rf"{rec.name} changed since it was built: block \d+ .*read by range "
                                                r"for its document offsets.*restore it from a good copy"):
        store.lengths   # noqa: B018 - the property reads every file's offsets
    assert not list((tmp_path / "cache").glob("tokens-*"))   # no token file was downloaded whole


def test_a_cache_limit_too_small_for_every_rank_of_the_node_is_refused_at_open_naming_how_it_was_counted(
        tmp_path, monkeypatch):
    from impl.errors import ConfigError
    from impl.store import TokenStore

    built = TokenStore.from_token_files([[[i * 7 + j for j in range(100 * (f + 1))] for i in range(20)]
                                         for f in range(6)], tmp_path / "remote", vocab_size=1000)
    sizes = sorted((r.size for r in built.file_records), reverse=True)
    tables = sum(p.stat().st_size for p in (tmp_path / "remote").iterdir() if p.is_file()) - sum(sizes)
    url, limit = f"file://{tmp_path / 'remote'}", tables + sum(sizes[:3])   # one reader's tables and three files
    TokenStore.open(url, local=tmp_path / "cache", cache_limit=limit)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")                            # two ranks of this node share it
    needed = tables + sum(sizes[:6])
    with pytest.raises(CacheLimitError, match=rf"maps up to {needed} bytes at once: meta.json, blocks.crc32, "
                                              rf"documents.crc32 \({tables} bytes, shared by the node\) and 3 token "
                                              r"files for each of 2 readers \(LOCAL_WORLD_SIZE=2 ranks of this node\)"
                                              rf", the 6 largest: {sum(sizes[:6])} bytes; raise cache_limit to at "
                                              rf"least {needed} bytes"):
        TokenStore.open(url, local=tmp_path / "cache", cache_limit=limit)
    TokenStore.open(url, local=tmp_path / "cache", cache_limit=needed)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE='0' must be a positive integer"):
        TokenStore.open(url, local=tmp_path / "cache", cache_limit=limit)
