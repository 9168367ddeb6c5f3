"""Files a store, a dataset or a loader opened are released: at ``close()``, and when dropped, at once.

Why: a token file stays mapped (and its descriptor open) while any object
holds its mapping, and a deleted store keeps its disk space until then. A job
that opens datasets repeatedly (an eval set rebuilt each epoch, a mixture
reopened at a resume) would otherwise pile them up until the cyclic garbage
collector happens to run, and hit ``ulimit -n``. Counted from
``/proc/self/fd`` and ``/proc/self/maps`` (Linux).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.adapter import close
from conformance.adapters.impl import ImplAdapter
from impl.dataset import PackedDataset
from impl.errors import StoreError
from impl.loader import build_dataloader
from impl.mixed_dataset import MixedDataset
from impl.store import TokenStore
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, Topology

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc (Linux)")

CORPUS = [[list(range(1, 40)), list(range(5, 90))], [list(range(3, 50))] * 3, [list(range(7, 30))]]
GPT2 = Path(__file__).resolve().parents[2] / "fixtures" / "tokenizer" / "gpt2"


def open_under(root: Path) -> tuple[int, int]:
    """``(descriptors, mappings)`` this process holds on files under ``root``."""
    prefix = str(root)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(prefix)
    with open("/proc/self/maps") as maps:
        mapped = sum(1 for line in maps if prefix in line)
    return fds, mapped


def open_files() -> list[str]:
    """The files this process holds descriptors on (a worker's pipes and sockets, which torch closes late, left out)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/"):
                found.append(target)
    return sorted(found)


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Only reference counting frees objects: what a job sees between two runs of the cyclic collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _store(path: Path, corpus: list = CORPUS) -> Path:
    TokenStore.from_token_files(corpus, path).close()
    return path


def _train_one_epoch(dataset, workers: int = 0) -> int:
    loader = build_dataloader(dataset, batch_size=2, rank=0, world_size=1, num_workers=workers)
    return sum(1 for _ in loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_datasets_built_and_dropped_repeatedly_leave_no_file_open_without_the_garbage_collector(
        tmp_path, no_cyclic_gc, workers):
    path = _store(tmp_path / "store")
    _train_one_epoch(PackedDataset(path, seq_len=16, shuffle="global"), workers)   # torch's one-time setup
    baseline = open_files()
    for epoch in range(5):
        dataset = PackedDataset(path, seq_len=16, shuffle="global", epoch=epoch)
        assert _train_one_epoch(dataset, workers) > 0
        assert workers or open_under(path) != (0, 0)   # with workers, each maps its own copy's files
        del dataset
        assert open_under(path) == (0, 0), f"after dropping the dataset of round {epoch}"
    assert open_files() == baseline   # with workers: the shared-memory epoch cell of each dataset went with it


def test_closing_a_dataset_that_opened_its_store_unmaps_its_files_while_the_dataset_is_still_held(tmp_path):
    path = _store(tmp_path / "store")
    with PackedDataset(path, seq_len=16, shuffle="global") as dataset:
        with build_dataloader(dataset, batch_size=2, rank=0, world_size=1) as loader:
            batches = [batch["input_ids"] for batch in loader]
        assert open_under(path) != (0, 0)
    assert open_under(path) == (0, 0)
    assert batches and dataset.store.closed
    with pytest.raises(StoreError, match="is closed"):
        dataset.samples(0, [0])


def test_a_store_passed_to_a_dataset_stays_open_after_the_dataset_closes(tmp_path):
    path = _store(tmp_path / "store")
    with TokenStore.open(path) as store:
        dataset = PackedDataset(store, seq_len=16, cache_dir=False)
        first = dataset.samples(0, [0])["input_ids"].tolist()
        dataset.close()
        assert not store.closed
        assert dataset.samples(0, [0])["input_ids"].tolist() == first
        assert open_under(path) != (0, 0)
    assert store.closed
    del dataset
    assert open_under(path) == (0, 0)


def test_with_token_store_open_unmaps_every_file_at_the_end_of_the_block(tmp_path):
    path = _store(tmp_path / "store")
    with TokenStore.open(path) as store:
        store.gather(list(range(len(store))))
        assert open_under(path) != (0, 0)
    assert store.closed
    assert open_under(path) == (0, 0)


def test_closing_a_mixture_closes_the_stores_its_sources_opened(tmp_path):
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b", [[list(range(100, 170))], [list(range(9, 60))]])
    sources = [PackedDataset(a, seq_len=16, shuffle="global"), PackedDataset(b, seq_len=16)]
    with MixedDataset(sources, weights=(0.5, 0.5)) as mixed:
        assert _train_one_epoch(mixed) > 0
        assert open_under(tmp_path) != (0, 0)
    assert open_under(tmp_path) == (0, 0)
    assert all(source.store.closed for source in sources)


def test_the_impl_adapters_closed_loaders_hold_no_file_of_their_store_while_still_referenced(tmp_path):
    config = PipelineConfig(packing=PackingConfig(seq_len=8), end="drop_last")
    loaders = [ImplAdapter().build(CORPUS, config, Topology(world_size=2, rank=r, batch_size=1), workdir=tmp_path)
               for r in range(2)]
    assert all(list(loader) for loader in loaders)
    assert open_under(tmp_path) != (0, 0)
    close(*loaders)
    assert open_under(tmp_path) == (0, 0)


def test_an_eval_set_built_in_this_process_leaves_no_token_file_open(tmp_path, no_cyclic_gc):
    pytest.importorskip("datasets")
    from impl.evaluation import build_eval_dataset

    texts = [f"Evaluation document number {i} says {'many words ' * (i % 5)}and ends." for i in range(30)]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cache = tmp_path / "cache"
    eval_set = build_eval_dataset("json", str(GPT2), split="train", seq_len=8, cache_dir=str(cache),
                                  load_kwargs={"data_files": str(data), "cache_dir": str(tmp_path / "hf")})
    assert len(eval_set) > 0
    assert open_under(cache) == (0, 0)
