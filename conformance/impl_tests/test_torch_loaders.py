"""``PackedDataset``, ``MixedDataset`` and the dataset wrappers inside torch's own loaders: a plain ``DataLoader`` and torchdata's ``StatefulDataLoader``.

Why: users put a dataset in the loader they already have. With the default
collate, a batch must be what ``default_collate([ds[i] for i in batch])``
gives (``__getitems__`` returns a ``SampleBatch``, read as that list), and
``ds.set_epoch(e)`` must reach persistent workers (the epoch of int indices
lives in shared memory). These tests run the real loaders, with and without
worker processes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from conformance.assertions import assert_equal, check
from impl import epoch_cell
from impl.collation import SampleBatch, collate
from impl.dataset import PackedDataset, SampleKey
from impl.errors import SharedEpochError
from impl.mixed_dataset import MixedDataset
from impl.store import TokenStore

BATCH = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[TokenStore]:
    docs = [[list(range(100 * f + d * 7 + 1, 100 * f + d * 7 + 5 + d)) for d in range(6)] for f in range(3)]
    with TokenStore.from_token_files(docs, tmp_path_factory.mktemp("torch-loaders") / "store", vocab_size=400) as store:
        yield store


@pytest.fixture(params=["packed", "mixed"])
def make(request, store: TokenStore) -> Callable[..., Any]:
    """A factory of the dataset under test: one ``PackedDataset``, or a mixture of two disjoint splits of the store."""
    def build(**kw: Any) -> Any:
        if request.param == "packed":
            return PackedDataset(store, seq_len=6, shuffle="global", seed=3, cache_dir=False, **kw)
        sources = [PackedDataset(store, seq_len=6, shuffle="global", seed=seed, cache_dir=False, split=split)
                   for seed, split in ((3, "train[:50%]"), (4, "train[50%:]"))]
        return MixedDataset(sources, weights=(0.6, 0.4), seed=5, **kw)
    return build


def expected_batches(ds: Any, epoch: int, batch: int = BATCH) -> list[dict[str, torch.Tensor]]:
    """What a plain DataLoader must give: ``default_collate`` of ``ds[SampleKey(epoch, i)]`` per batch of indices."""
    n = ds.num_samples(epoch)
    return [default_collate([ds[SampleKey(epoch, i)] for i in range(s, min(s + batch, n))]) for s in range(0, n, batch)]


def assert_same(got: list[dict[str, torch.Tensor]], expected: list[dict[str, torch.Tensor]], what: str) -> None:
    __tracebackhide__ = True
    assert_equal(len(got), len(expected), clause="COLL-9", what=f"{what}: number of batches")
    for b, (g, e) in enumerate(zip(got, expected)):
        assert_equal(sorted(g), sorted(e), clause="COLL-9", what=f"{what}: batch {b} fields")
        for key in e:
            check(g[key].dtype == e[key].dtype and torch.equal(g[key], e[key]), clause="COLL-9",
                  what=f"{what}: batch {b} field {key}: {g[key].tolist()} != {e[key].tolist()}")


@pytest.mark.clause("COLL-9", "PACK-20")
def test_getitems_reads_as_the_list_of_samples_getitem_returns_including_padding(make):
    ds = make()
    keys = [SampleKey(0, 2), SampleKey(1, 0), SampleKey(0, -1), SampleKey(0, 2)]
    got = ds.__getitems__(keys)
    check(isinstance(got, SampleBatch) and len(got) == len(keys), clause="COLL-9", what=f"__getitems__ gave {got!r}")
    for i, key in enumerate(keys):
        one, sample = ds[key], got[i]
        assert_equal(list(sample), list(one), clause="COLL-9", what=f"fields of sample {i} ({key})")
        for name in one:
            check(sample[name].dtype == one[name].dtype and torch.equal(sample[name], one[name]), clause="COLL-9",
                  what=f"sample {i} ({key}) field {name}")
    check(collate(got) is got.batch, clause="COLL-9", what="collate of a SampleBatch is not its batch")


@pytest.mark.clause("COLL-9")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_with_the_default_collate_yields_the_stacked_samples(make, workers):
    ds = make()
    got = list(DataLoader(ds, batch_size=BATCH, num_workers=workers))
    assert_same(got, expected_batches(ds, 0), f"DataLoader(num_workers={workers})")


@pytest.mark.clause("RES-7", "COLL-9")
def test_set_epoch_reaches_persistent_workers_of_a_plain_dataloader(make):
    ds = make()
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    first = list(loader)
    ds.set_epoch(1)
    second = list(loader)
    check(all(b["epoch"].eq(1).all() for b in second), clause="RES-7",
          what=f"epochs after set_epoch(1): {[b['epoch'].tolist() for b in second]}")
    assert_same(first, expected_batches(ds, 0), "persistent workers, epoch 0")
    assert_same(second, expected_batches(ds, 1), "persistent workers after set_epoch(1)")


@pytest.mark.clause("RES-7")
def test_set_epoch_reaches_a_persistent_spawned_worker(make):
    ds = make()
    loader = DataLoader(ds, batch_size=BATCH, num_workers=1, persistent_workers=True, multiprocessing_context="spawn")
    next(iter(loader))
    ds.set_epoch(2)
    assert_same(list(loader), expected_batches(ds, 2), "a spawned persistent worker after set_epoch(2)")


@pytest.mark.clause("RES-7")
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_epoch_set_before_the_workers_start_reaches_them_and_so_does_the_next(make, context):
    ds = make()
    ds.set_epoch(2)     # held in the process until a copy can leave it: then moved into shared memory
    loader = DataLoader(ds, batch_size=BATCH, num_workers=1, persistent_workers=True, multiprocessing_context=context)
    assert_same(list(loader), expected_batches(ds, 2), f"a {context} worker started after set_epoch(2)")
    ds.set_epoch(3)
    assert_same(list(loader), expected_batches(ds, 3), f"the same {context} worker after set_epoch(3)")


@pytest.mark.clause("RES-7")
def test_a_subclass_that_never_sets_its_epoch_still_shares_it_with_forked_workers(monkeypatch):
    class Keyed(epoch_cell.SharedEpoch):   # no __init__, no set_epoch before the fork
        pass

    ds = Keyed()
    monkeypatch.setattr(epoch_cell, "_UNSHARED", weakref.WeakValueDictionary({id(ds): ds}))   # this dataset only
    epoch_cell._share_before_fork()
    check("_epoch_cell" in ds.__dict__ and ds.epoch == 0, clause="RES-7",
          what="the epoch of a dataset never given one is in shared memory before a fork")


@pytest.mark.clause("RES-7")
def test_set_epoch_refuses_when_the_epoch_could_not_be_shared_before_a_fork(make, monkeypatch):
    ds = make()
    def fail(self):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as patch:
        patch.setattr(epoch_cell, "_UNSHARED", weakref.WeakValueDictionary({id(ds): ds}))   # this dataset only
        patch.setattr(epoch_cell.SharedEpoch, "_share_epoch", fail)
        with pytest.warns(RuntimeWarning, match="could not be put in shared memory"):
            epoch_cell._share_before_fork()
    with pytest.raises(SharedEpochError, match="cannot reach this dataset's forked workers.*No space left"):
        ds.set_epoch(1)


def test_a_pickled_dataset_keeps_its_own_epoch(make):
    import pickle

    ds = make(epoch=1)
    copy = pickle.loads(pickle.dumps(ds))
    ds.set_epoch(3)
    check((copy.epoch, ds.epoch) == (1, 3), clause="RES-7", what=f"copy epoch {copy.epoch}, original {ds.epoch}")


@pytest.mark.clause("RES-1", "COLL-9")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_state_round_trip_continues_with_the_next_batch(make, workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = make()
    expected = expected_batches(ds, 0)
    loader = StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(2)]
    state = loader.state_dict()
    del iterator
    resumed = StatefulDataLoader(make(), batch_size=BATCH, num_workers=workers)
    resumed.load_state_dict(state)
    assert_same(head + list(resumed), expected, f"StatefulDataLoader(num_workers={workers}) resumed after 2 batches")


class _Lengths(torch.utils.data.Dataset):
    """Items of different lengths, as dicts of tensors (what a fine-tuning dataset yields)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"length": torch.tensor(1 + (i * 7) % 23), "item": torch.tensor(i)}

    def sort_key(self, i: int) -> int:
        return 1 + (i * 7) % 23


@pytest.mark.clause("COLL-9")
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("wrapper", ["sharded", "bucketed"])
def test_the_dataset_wrappers_in_a_plain_dataloader_with_the_default_collate_yield_their_stacked_items(
        store, wrapper, workers):
    from impl.bucketing import BufferSortedDataset
    from impl.sharding import ShardedDataset

    if wrapper == "sharded":
        view: Any = ShardedDataset(PackedDataset(store, seq_len=6, shuffle="global", seed=3, cache_dir=False),
                                   total_shards=2, current_shard=1)
    else:
        view = BufferSortedDataset(_Lengths(), buffer_size=16, pack_size=4, init_seed=0)
    n = len(view)
    expected = [default_collate([view[i] for i in range(s, min(s + BATCH, n))]) for s in range(0, n, BATCH)]
    assert_same(list(DataLoader(view, batch_size=BATCH, num_workers=workers)), expected,
                f"{wrapper} in DataLoader(num_workers={workers})")
