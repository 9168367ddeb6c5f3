"""predownload: a remote store's next files scheduled and downloaded ahead in read order, never what the next
samples do not need, never evicting a file needed sooner; samples unchanged; a cache_limit checked for every
reader of the node (ranks x workers)."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from impl.dataset import PackedDataset
from impl.errors import CacheLimitError, ConfigError
from impl.loader import build_dataloader
from impl.mixed_dataset import MixedDataset
from impl.partition import ElasticSampler
from impl.predownload import Reader, upcoming
from impl.remote import RemoteFiles
from impl.store import TokenStore

BATCH = 2


class Recording(RemoteFiles):
    """A file:// RemoteFiles that records each completed download: (thread name, file name), in order."""

    def __init__(self, *args, **kwargs) -> None:   # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, str]] = []
        self.peak = 0
        self.asked: list[list[str]] = []

    def predownload(self, names):   # type: ignore[no-untyped-def]
        self.asked.append(list(names))
        super().predownload(names)

    def _download_once(self, name, st, partial):   # type: ignore[no-untyped-def]
        super()._download_once(name, st, partial)
        self.log.append((threading.current_thread().name, name))
        cached = sum(p.stat().st_size for p in Path(self.config.local).iterdir() if p.is_file())
        self.peak = max(self.peak, cached + st.size)   # what the cache holds once this one is installed


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    rng = np.random.default_rng(11)
    out = tmp_path_factory.mktemp("predownload") / "store"
    TokenStore.from_token_files([[rng.integers(0, 50_000, size=int(rng.integers(20, 200))).tolist()
                                  for _ in range(12)] for _ in range(10)], out, vocab_size=50_000)
    return out


def _dataset(store, predownload, cache_dir) -> PackedDataset:
    return PackedDataset(store, seq_len=64, shuffle="window", window=1, seed=4, cache_dir=cache_dir,
                         predownload=predownload)


def _run(built: Path, tmp: Path, predownload: int | None, limit: int | None = None
         ) -> tuple[Recording, list[bytes], list[set[str]]]:
    """One epoch through build_dataloader (in process): (the access, each batch's input_ids, token files cached after each batch)."""
    files = Recording(f"file://{built}", tmp / "cache", cache_limit=limit)
    store = TokenStore.open(f"file://{built}", files=files)
    store.lengths   # noqa: B018 - the plan's offsets, read by range, before any token file
    loader = build_dataloader(_dataset(store, predownload, tmp / "plans"), batch_size=BATCH)
    batches, seen = [], []
    for batch in loader:
        batches.append(batch["input_ids"].numpy().tobytes())
        assert files.wait_predownload(60)
        seen.append({name for _, name in files.log if name.startswith("tokens-")})
    return files, batches, seen


def test_the_samples_a_worker_reads_next_are_its_samplers_steps_dealt_round_robin():
    class Forty:
        epoch = 0

        def num_samples(self, epoch):
            return 40

    for workers in (0, 1, 3):
        sampler = ElasticSampler(Forty(), batch_size=3, rank=1, world_size=2, end="pad")
        steps = [[k.index for k in b] for b in sampler]
        reader = Reader(partition=sampler.config, group=sampler.group, workers=workers)
        stride = max(1, workers)
        for j, step in enumerate(steps):
            mine = [i for later in steps[j + stride::stride] for i in later if i != -1]
            assert upcoming(reader, step, 40, 5) == mine[:5], (workers, j)


def test_predownload_fetches_the_next_samples_files_ahead_in_read_order_and_nothing_else(built, tmp_path):
    plain, want, cached = _run(built, tmp_path / "plain", predownload=0)
    assert all(thread != "loadspec-predownload" for thread, _ in plain.log)
    order = [name for _, name in plain.log if name.startswith("tokens-")]   # the read order of first use
    ahead = 3                                   # batches of BATCH samples
    files, got, seen = _run(built, tmp_path / "ahead", predownload=ahead * BATCH)
    assert got == want                          # bit for bit the same samples
    tokens = [(thread, name) for thread, name in files.log if name.startswith("tokens-")]
    assert [name for _, name in tokens] == order                       # fetched in exactly the read order
    for j, now in enumerate(seen):              # after batch j: the files of batches up to j + ahead, no more
        assert now == cached[min(j + ahead, len(cached) - 1)], j
    first_batch = len(cached[0])
    assert all(thread == "loadspec-predownload" for thread, _ in tokens[first_batch:])   # the reader never waited


def test_a_small_cache_limit_with_predownload_keeps_the_files_needed_next_and_downloads_no_more_than_without(
        built, tmp_path):
    sizes = sorted((p.stat().st_size for p in built.glob("tokens-*")), reverse=True)
    limit = sum(p.stat().st_size for p in built.iterdir() if p.is_file()) - sum(sizes) + sum(sizes[:3])
    plain, want, _ = _run(built, tmp_path / "plain", predownload=0, limit=limit)
    files, got, _ = _run(built, tmp_path / "ahead", predownload=8 * BATCH, limit=limit)
    assert got == want
    assert files.peak <= limit and plain.peak <= limit
    token_files = len(sizes)
    assert sum(name.startswith("tokens-") for _, name in files.log) == token_files   # each file once
    assert len(files.log) <= len(plain.log)


def test_predownload_defaults_to_eight_batches_and_refuses_a_negative_count(built, tmp_path):
    store = TokenStore.open(built)
    for bad in (-1, 1.5, "8"):
        with pytest.raises(ConfigError, match="predownload=.* must be None .* or an integer >= 0"):
            _dataset(store, bad, False)
        with pytest.raises(ConfigError, match="predownload"):
            MixedDataset([_dataset(store, None, False)], predownload=bad)
    local = build_dataloader(_dataset(store, None, False), batch_size=BATCH)    # a local store: accepted, no-op
    assert len(list(local)) == len(local)
    tiny = TokenStore.from_token_files([[[f * 100 + d] * 40 for d in range(2)] for f in range(40)], tmp_path / "tiny",
                                       vocab_size=50_000).path   # 80 tokens a file: a sample of 64 spans one or two
    files, _, _ = _run(tiny, tmp_path, predownload=None)
    store = TokenStore.open(f"file://{tiny}", local=tmp_path / "probe")
    after_first = _dataset(store, None, tmp_path / "plans").reads(0, np.arange(BATCH, BATCH + 8 * BATCH))
    assert files.asked[0] == list(dict.fromkeys(name for _, name in after_first))   # 8 x batch_size samples ahead
    assert files.asked[0] != list(dict.fromkeys(name for _, name in after_first[:-1]))


def test_a_mixture_of_remote_stores_predownloads_its_own_next_samples_files(built, tmp_path):
    halves = []
    for i, bounds in enumerate(("train[:50%]", "train[50%:]")):
        files = Recording(f"file://{built}", tmp_path / f"cache{i}")
        store = TokenStore.open(f"file://{built}", files=files)
        halves.append((files, PackedDataset(store, seq_len=64, shuffle="window", window=1, seed=4, split=bounds,
                                            cache_dir=tmp_path / "plans")))
    local = TokenStore.open(built)
    want = MixedDataset([PackedDataset(local, seq_len=64, shuffle="window", window=1, seed=4, split=b, cache_dir=False)
                         for b in ("train[:50%]", "train[50%:]")], weights=(0.5, 0.5), seed=2)
    mixed = MixedDataset([ds for _, ds in halves], weights=(0.5, 0.5), seed=2, predownload=4 * BATCH)
    loader = build_dataloader(mixed, batch_size=BATCH)
    wanted = build_dataloader(want, batch_size=BATCH)
    for got, ref in zip(loader, wanted):
        assert all(f.wait_predownload(60) for f, _ in halves)
        assert got["input_ids"].numpy().tobytes() == ref["input_ids"].numpy().tobytes()
    threads = {thread for files, _ in halves for thread, name in files.log if name.startswith("tokens-")}
    assert "loadspec-predownload" in threads


def test_a_cache_limit_is_checked_for_every_reader_of_the_node_ranks_times_workers(built, tmp_path, monkeypatch):
    sizes = sorted((p.stat().st_size for p in built.glob("tokens-*")), reverse=True)
    tables = sum(p.stat().st_size for p in built.iterdir() if p.is_file()) - sum(sizes)
    limit = tables + sum(sizes[:3])                          # one reader's three files
    store = TokenStore.open(f"file://{built}", local=tmp_path / "cache", cache_limit=limit)
    ds = _dataset(store, None, tmp_path / "plans")
    build_dataloader(ds, batch_size=BATCH)                   # one reader: enough
    needed = tables + sum(sizes[:6])
    with pytest.raises(CacheLimitError, match=rf"maps up to {needed} bytes at once: .* 3 token files for each of 2 "
                                              r"readers \(LOCAL_WORLD_SIZE=1 rank x 2 DataLoader workers\), the 6 "
                                              rf"largest: .* at least {needed} bytes"):
        build_dataloader(ds, batch_size=BATCH, num_workers=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(CacheLimitError, match=r"each of 2 readers \(LOCAL_WORLD_SIZE=2 ranks of this node\)"):
        TokenStore.open(f"file://{built}", local=tmp_path / "cache", cache_limit=limit)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE='two' must be a positive integer"):
        TokenStore.open(f"file://{built}", local=tmp_path / "cache", cache_limit=limit)


def _log_predownloads(path: str) -> None:
    """In each DataLoader worker: append (pid, names) of every predownload call to ``path``."""
    original = RemoteFiles.predownload

    def logged(self, names):   # type: ignore[no-untyped-def]
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {','.join(names)}\n")
        original(self, names)

    RemoteFiles.predownload = logged   # type: ignore[method-assign]


def test_dataloader_workers_predownload_their_own_next_samples_and_the_samples_are_unchanged(built, tmp_path):
    log = tmp_path / "calls.log"
    store = TokenStore.open(f"file://{built}", local=tmp_path / "cache")
    loader = build_dataloader(_dataset(store, 2 * BATCH, tmp_path / "plans"), batch_size=BATCH, num_workers=2,
                              multiprocessing_context="spawn", worker_init_fn=functools.partial(_worker_init, str(log)))
    want = [b["input_ids"].numpy().tobytes()
            for b in build_dataloader(_dataset(TokenStore.open(built), 0, False), batch_size=BATCH)]
    assert [b["input_ids"].numpy().tobytes() for b in loader] == want
    calls = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert {pid for pid, _ in calls} - {str(os.getpid())} == {pid for pid, _ in calls} and len(calls) >= 2
    assert len({pid for pid, names in calls if names}) == 2      # each worker predownloaded files for itself
    tokens = {p.name for p in built.glob("tokens-*")}
    assert all(set(names.split(",")) <= tokens for _, names in calls if names)


def _worker_init(path: str, _worker: int) -> None:
    _log_predownloads(path)
