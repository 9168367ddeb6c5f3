"""impl.bucketing against reference.bucketing, and BufferSortedDataset over a plain torch dataset.

The reference is the oracle for the order (every buffer, pack and in-pack
permutation, bit for bit). The dataset tests check what the wrapper
promises on top: the order does not depend on how items are asked for
(random access, DataLoader with 0 or 2 workers), resume through
``build_dataloader`` is exact on the same and on another world size, the
state is JSON, and bad input gets typed errors.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed
from impl import bucketing as ib
from impl.collation import pad_stack_1d
from impl.errors import ConfigError, StateError
from impl.loader import build_dataloader
from reference import bucketing as rb
from reference.bucketing import BucketConfig

configs = st.builds(lambda b, p, seed: BucketConfig(buffer_size=b, pack_size=min(p, b), seed=seed),
                    st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**64 - 1))
lengths_lists = st.lists(st.integers(0, 30), max_size=150)


@pytest.mark.clause("BUCK-1", "BUCK-3", "BUCK-4", "BUCK-5", "BUCK-6")
@given(lengths=lengths_lists, config=configs, epoch=st.integers(0, 5))
def test_impl_bucket_order_equals_the_reference_bit_for_bit(lengths, config, epoch):
    assert_equal(ib.bucket_order(lengths, config, epoch).tolist(), rb.bucket_order(lengths, config, epoch),
                 clause="BUCK-1", what="epoch order", repro={"lengths": lengths, "config": config, "epoch": epoch})


@pytest.mark.clause("BUCK-2", "BUCK-7")
@given(lengths=lengths_lists.filter(len), config=configs, epoch=st.integers(0, 3), data=st.data())
def test_any_position_is_computed_from_its_own_buffer_as_the_reference_does(lengths, config, epoch, data):
    position = data.draw(st.integers(0, len(lengths) - 1))
    assert_equal(ib.bucket_at(lengths, config, epoch, position), rb.bucket_at(lengths, config, epoch, position),
                 clause="BUCK-7", what="bucket_at", repro={"lengths": lengths, "config": config, "position": position})


class Sequences(Dataset):
    """A plain torch dataset of variable-length token rows, with d9d's sort_key protocol."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.lengths[index],), index, dtype=torch.int64)

    def sort_key(self, index: int) -> int:
        return self.lengths[index]


def _item_id(row: torch.Tensor) -> int:
    return int(row[0])


LENGTHS = [(i * 37) % 23 + 1 for i in range(90)]
CONFIG = BucketConfig(buffer_size=12, pack_size=4, seed=7)


def _dataset(epoch: int = 0) -> ib.BufferSortedDataset:
    return ib.BufferSortedDataset(Sequences(LENGTHS), buffer_size=12, pack_size=4, init_seed=7, epoch=epoch)


@pytest.mark.clause("BUCK-7")
def test_random_access_in_any_order_gives_the_same_items_as_sequential_access():
    ds = _dataset(epoch=2)
    expected = rb.bucket_order(LENGTHS, CONFIG, 2)
    positions = list(range(len(ds)))
    random.Random(3).shuffle(positions)
    got = {p: _item_id(ds[p]) for p in positions}
    assert_equal([got[p] for p in range(len(ds))], expected, clause="BUCK-7", what="random access order")
    assert_equal(_item_id(ds[(1, 5)]), rb.bucket_at(LENGTHS, CONFIG, 1, 5), clause="BUCK-2",
                 what="an (epoch, position) key")


def _pad_collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"input_ids": pad_stack_1d(rows, -1), "first": torch.tensor([int(r[0]) for r in rows])}


@pytest.mark.clause("BUCK-1", "BUCK-7")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataloader_with_any_number_of_workers_yields_the_reference_order_once(num_workers):
    loader = DataLoader(_dataset(), batch_size=4, num_workers=num_workers, collate_fn=_pad_collate)
    seen = [i for batch in loader for i in batch["first"].tolist()]
    assert_equal(seen, rb.bucket_order(LENGTHS, CONFIG, 0), clause="BUCK-1", what=f"order with {num_workers} workers")
    assert_exactly_once(seen, range(len(LENGTHS)), clause="BUCK-1", what="items of the epoch")


def _global_steps(world_size: int, state: dict | None = None, steps: int | None = None, num_workers: int = 0):
    """Every rank's batches, step by step, as lists of item ids (ranks simulated in one process)."""
    loaders = [build_dataloader(_dataset(), batch_size=4, rank=r, world_size=world_size, collate_fn=_pad_collate,
                                num_workers=num_workers) for r in range(world_size)]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    its = [iter(loader) for loader in loaders]
    out = []
    while steps is None or len(out) < steps:
        try:
            batches = [next(it) for it in its]
        except StopIteration:
            break
        out.append([b["first"].tolist() for b in batches])
    return out, loaders[0].state_dict()


@pytest.mark.clause("BUCK-4", "BUCK-7")
def test_bucketed_loading_resumes_exactly_on_the_same_and_on_another_world_size():
    order = rb.bucket_order(LENGTHS, CONFIG, 0)
    full, _ = _global_steps(2)
    flat = [i for step in full for batch in step for i in batch]
    assert_equal(flat, order[:len(flat)], clause="BUCK-1", what="2-rank global stream")
    head, state = _global_steps(2, steps=3)
    state = json.loads(json.dumps(state))
    again, _ = _global_steps(2, state=state)
    assert_equal(head + again, full, clause="BUCK-7", what="same world size resume")
    elastic, _ = _global_steps(3, state=state)
    resumed = [i for step in elastic for batch in step for i in batch]
    assert_equal(resumed, order[24:24 + len(resumed)], clause="BUCK-7", what="resume on 3 ranks")
    for step in elastic:
        for batch in step:
            spread = {LENGTHS[i] for i in batch}
            pack = {LENGTHS[i] for i in order[order.index(batch[0]) // 4 * 4:][:4]}
            assert_equal(spread, pack, clause="BUCK-4", what="a rank's batch is one pack")


def test_padding_saved_by_bucketing_is_real_on_a_spread_of_lengths():
    ds = _dataset()
    bucketed = sum(4 * max(LENGTHS[i] for i in chunk) - sum(LENGTHS[i] for i in chunk)
                   for chunk in (ds.indices()[k:k + 4].tolist() for k in range(0, len(ds), 4)))
    plain = sum(4 * max(LENGTHS[k:k + 4]) - sum(LENGTHS[k:k + 4]) for k in range(0, len(LENGTHS), 4))
    assert bucketed < plain / 2, (bucketed, plain)


def test_state_is_json_and_refuses_another_configuration():
    ds = _dataset()
    ds.set_epoch(3)
    state = json.loads(json.dumps(ds.state_dict()))
    fresh = _dataset()
    fresh.load_state_dict(state)
    assert fresh.epoch == 3
    other = ib.BufferSortedDataset(Sequences(LENGTHS), buffer_size=12, pack_size=3, init_seed=7)
    with pytest.raises(StateError, match="pack_size"):
        other.load_state_dict(state)
    with pytest.raises(StateError):
        fresh.load_state_dict({"format": "pickle"})


@pytest.mark.clause("BUCK-8")
def test_bad_bucketing_input_is_refused_with_typed_errors():
    assert_raises_typed(ConfigError, ib.BufferSortedDataset, [1, 2, 3], 4, 2, clause="BUCK-8",
                        what="dataset without sort_key", mentions=["sort_key"])
    assert_raises_typed(ConfigError, ib.BufferSortedDataset, Sequences([1]), 0, 1, clause="BUCK-8",
                        what="buffer_size=0", mentions=["buffer_size=0"])
    assert_raises_typed(ConfigError, ib.BufferSortedDataset, Sequences([1]), 4, 0, clause="BUCK-8",
                        what="pack_size=0", mentions=["pack_size=0"])
    assert_raises_typed(ConfigError, ib.BufferSortedDataset, Sequences([1]), 4, 2, None, clause="BUCK-8",
                        what="unseeded", mentions=["init_seed=None"])
    bad = Sequences([3, 1])
    bad.sort_key = lambda index: "long" if index else 2
    assert_raises_typed(ConfigError, lambda: ib.BufferSortedDataset(bad, 2, 1)[0], clause="BUCK-8",
                        what="a non-integer sort key", mentions=["item 1", "'long'"])
    negative = Sequences([3, 1])
    negative.sort_key = lambda index: -index
    assert_raises_typed(ConfigError, lambda: ib.BufferSortedDataset(negative, 2, 1)[0], clause="BUCK-8",
                        what="a negative sort key", mentions=["item 1", "-1"])
    with pytest.raises(IndexError):
        _dataset()[len(LENGTHS)]
