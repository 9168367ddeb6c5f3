"""impl's loader layer: ElasticSampler, ElasticLoader, collation (typed errors, RES-6, protocols, bit-exact arithmetic).

Datasets are the real ``impl.dataset.PackedDataset`` over a token store.
The end-to-end conformance of the impl loader is ``conformance/tests`` with
the default ``--loader``; these tests pin what that suite cannot see from
rows alone: which errors are raised, that prefetching workers do not leak
into the state, that the loader is a ``Stateful`` for
``torch.distributed.checkpoint``, and that the tensor code equals the
reference functions bit for bit.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import pickle
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint.stateful import Stateful

from conformance.adapter import CanonicalRow
from conformance.adapters.impl import build_packed_dataset, rows_from_batch
from conformance.assertions import assert_equal, assert_raises_typed, check
from impl.collation import collate, cu_seqlens, pad_stack_1d
from impl.errors import ConfigError, StateError, TopologyError
from impl.keys import SampleKey
from impl.loader import ElasticLoader, build_dataloader, collate_to_numpy, tensors_from_numpy
from impl.partition import ElasticSampler, group_batch
from reference import collation as ref_collation
from reference.loader import ReferenceLoader, take
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.partition import END_POLICIES, PartitionConfig, epoch_steps, rank_batch, step_slice
from reference.resume import PipelineConfig, Topology, make_state

CORPUS = [[[i * 10 + j + 1 for j in range(i % 7 + 2)] for i in range(f * 9, f * 9 + 9)] for f in range(3)]
CONFIG = PipelineConfig(packing=PackingConfig(seq_len=4, mode="concat"),
                        ordering=OrderingConfig(kind="global", seed=5))


_WORKDIR: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _workdir(tmp_path_factory):
    _WORKDIR[:] = [tmp_path_factory.mktemp("impl-loader")]
    yield
    _WORKDIR.clear()


def dataset(corpus=CORPUS, config=CONFIG):
    """The real ``PackedDataset`` over a token store of ``corpus`` (built once per module and corpus)."""
    return build_packed_dataset(corpus, config, _WORKDIR[0])


def reference_rows(topology: Topology, steps: int, config: PipelineConfig = CONFIG) -> list[list[CanonicalRow]]:
    return [[CanonicalRow.from_reference(r) for r in batch] for batch in take(ReferenceLoader(CORPUS, config, topology), steps)]


def rows(batches) -> list[list[CanonicalRow]]:
    return [rows_from_batch(b) for b in batches]


# --------------------------------------------------------------------------- typed errors


@pytest.mark.clause("PART-12")
def test_a_rank_outside_the_world_is_refused_with_a_topology_error_naming_the_valid_ranks():
    assert_raises_typed(TopologyError, build_dataloader, dataset(), batch_size=2, rank=2, world_size=2,
                        clause="PART-12", what="rank=2 of world_size=2", mentions=["rank=2", "0..1"])
    assert_raises_typed(TopologyError, build_dataloader, dataset(), batch_size=2, rank=-1, world_size=2,
                        clause="PART-12", what="rank=-1", mentions=["rank=-1"])
    assert_raises_typed(TopologyError, build_dataloader, dataset(), batch_size=2, rank=0, world_size=0,
                        clause="PART-12", what="world_size=0", mentions=["world_size=0"])


@pytest.mark.clause("PART-12")
def test_a_replication_that_does_not_divide_the_world_size_is_refused_with_the_divisors():
    assert_raises_typed(TopologyError, build_dataloader, dataset(), batch_size=1, rank=0, world_size=6, replication=4,
                        clause="PART-12", what="replication=4 on 6 ranks", mentions=["replication=4", "[1, 2, 3, 6]"])


@pytest.mark.clause("PART-12")
def test_a_batch_size_below_one_or_an_unknown_end_policy_is_refused_as_a_config_error():
    assert_raises_typed(ConfigError, build_dataloader, dataset(), batch_size=0, clause="PART-12",
                        what="batch_size=0", mentions=["batch_size=0"])
    assert_raises_typed(ConfigError, build_dataloader, dataset(), batch_size=1, end="wrap", clause="PART-12",
                        what="end='wrap'", mentions=["drop_last"])


def test_rank_without_world_size_is_refused_when_no_process_group_is_initialised():
    assert_raises_typed(TopologyError, build_dataloader, dataset(), batch_size=1, rank=1, clause="PART-12",
                        what="rank given alone", mentions=["world_size"])


def test_rank_and_world_size_default_to_one_process_without_torch_distributed():
    loader = build_dataloader(dataset(), batch_size=2)
    check((loader.sampler.rank, loader.partition.world_size) == (0, 1), clause="PART-1",
          what=f"defaults rank={loader.sampler.rank}, world_size={loader.partition.world_size}")


def test_prefetch_options_without_workers_are_refused_naming_num_workers():
    assert_raises_typed(ConfigError, build_dataloader, dataset(), batch_size=1, prefetch_factor=2, clause="RES-6",
                        what="prefetch_factor without workers", mentions=["num_workers"])


@pytest.mark.clause("RES-3")
def test_a_state_of_other_data_is_refused_naming_the_fingerprint():
    other = dataset([[[t + 1 for t in doc] for doc in f] for f in CORPUS])
    state = build_dataloader(other, batch_size=1).state_dict()
    assert_raises_typed(StateError, build_dataloader(dataset(), batch_size=1).load_state_dict, state, clause="RES-3",
                        what="a state of other data", mentions=["fingerprint"])


@pytest.mark.clause("RES-8")
def test_a_refused_state_names_the_packing_split_or_data_that_differs_and_equals_the_reference_state():
    loader = build_dataloader(dataset(), batch_size=1)
    state = loader.state_dict()
    store_fp = dataset().store.fingerprint
    assert_equal(state, ReferenceLoader(CORPUS, CONFIG, data_fingerprint=store_fp).state_dict(), clause="RES-8",
                 what="a fresh state, parts included")
    rebuilt = dataset([[[t + 1 for t in doc] for doc in f] for f in CORPUS])
    cases = [(dataset(config=PipelineConfig(packing=PackingConfig(seq_len=5, mode="concat"), ordering=CONFIG.ordering)),
              ["packing differs", "seq_len"]),
             (dataset(config=PipelineConfig(packing=CONFIG.packing, ordering=CONFIG.ordering, split="train[:80%]")),
              ["split differs"]),
             (dataset(config=PipelineConfig(packing=CONFIG.packing, ordering=OrderingConfig(kind="global", seed=6))),
              ["ordering differs", "seed"]),
             (rebuilt, ["data differs", "rebuilt"])]
    for other, mentions in cases:
        assert_raises_typed(StateError, build_dataloader(other, batch_size=1).load_state_dict, state, clause="RES-8",
                            what=f"a state loaded into {other.config}", mentions=["fingerprint", *mentions])


@pytest.mark.clause("RES-8")
def test_a_version_1_state_without_parts_loads_when_its_fingerprint_matches():
    loader = build_dataloader(dataset(), batch_size=1)
    v1 = {k: v for k, v in loader.state_dict().items() if k != "parts"} | {"version": 1, "consumed": 3}
    loader.load_state_dict(v1)
    assert_equal(loader.consumed, 3, clause="RES-8", what="consumed after a version-1 state")
    other = build_dataloader(dataset(config=PipelineConfig(packing=PackingConfig(seq_len=5, mode="concat"))),
                             batch_size=1)
    assert_raises_typed(StateError, other.load_state_dict, v1, clause="RES-8", what="a version-1 state of another config",
                        mentions=["fingerprint", "another dataset or pipeline configuration"])


@pytest.mark.clause("RES-3")
def test_a_future_version_or_a_foreign_format_is_refused():
    loader = build_dataloader(dataset(), batch_size=1)
    state = loader.state_dict()
    assert_raises_typed(StateError, loader.load_state_dict, dict(state, version=state["version"] + 1), clause="RES-3",
                        what="a future version", mentions=["version", "upgrade"])
    assert_raises_typed(StateError, loader.load_state_dict, dict(state, format="torchdata"), clause="RES-3",
                        what="a foreign format", mentions=["format"])
    assert_raises_typed(StateError, loader.load_state_dict, [1, 2], clause="RES-3", what="a list as state",
                        mentions=["dict"])


@pytest.mark.clause("RES-3")
def test_a_state_with_consumed_beyond_the_epoch_is_refused_naming_the_sample_count():
    loader = build_dataloader(dataset(), batch_size=1)
    total = loader.num_samples(0)
    assert_raises_typed(StateError, loader.load_state_dict, dict(loader.state_dict(), consumed=total + 1),
                        clause="RES-3", what="consumed beyond the epoch", mentions=[f"consumed={total + 1}", str(total)])
    assert_raises_typed(StateError, loader.load_state_dict, dict(loader.state_dict(), consumed=-1),
                        clause="RES-3", what="negative consumed", mentions=["consumed=-1"])
    loader.load_state_dict(dict(loader.state_dict(), consumed=total))  # the end of the epoch is a position
    check(list(loader) == [] and loader.state_dict()["epoch"] == 1, clause="RES-7",
          what="a state at the epoch's end yields nothing and moves to the next epoch")


# --------------------------------------------------------------------------- state and protocols


@pytest.mark.clause("RES-6")
def test_the_state_counts_only_batches_handed_out_while_two_workers_prefetch():
    loader = build_dataloader(dataset(), batch_size=2, num_workers=2, prefetch_factor=2)
    produced = []
    batches = loader.sampler.batches

    def counting(*args):
        for keys in batches(*args):
            produced.append(keys)
            yield keys

    loader.sampler.batches = counting
    iterator = iter(loader)
    got = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    check(len(produced) > 3, clause="RES-6", what=f"the sampler ran only {len(produced)} batches ahead: no prefetch to test")
    assert_equal(state["consumed"], 3 * 2, clause="RES-6", what="consumed after 3 handed-out batches of 2")
    del iterator
    resumed = build_dataloader(dataset(), batch_size=2)
    resumed.load_state_dict(state)
    uninterrupted = reference_rows(Topology(batch_size=2), 6)
    assert_equal(rows(got) + rows(take(resumed, 3)), uninterrupted, clause="RES-6",
                 what="3 batches with 2 prefetching workers, then 3 after resuming")


def test_the_loader_is_a_torch_distributed_checkpoint_stateful():
    loader = build_dataloader(dataset(), batch_size=1)
    check(isinstance(loader, Stateful), clause="RES-2", what="ElasticLoader is not a torch Stateful")
    check(issubclass(ElasticLoader, Stateful), clause="RES-2", what="ElasticLoader does not implement Stateful")


@pytest.mark.clause("RES-2", "RES-1")
def test_the_state_survives_a_json_round_trip_and_resumes_at_the_same_batch():
    first = build_dataloader(dataset(), batch_size=3)
    head = take(first, 2)
    text = json.dumps(first.state_dict())
    state = json.loads(text)
    check(state == first.state_dict() and len(text) < 512, clause="RES-2", what=f"state {text} is not small JSON")
    check(set(state) == {"format", "version", "fingerprint", "parts", "epoch", "consumed"}, clause="RES-2",
          what=f"state keys {sorted(state)}")
    resumed = build_dataloader(dataset(), batch_size=3)
    resumed.load_state_dict(state)
    assert_equal(rows(head) + rows(take(resumed, 3)), reference_rows(Topology(batch_size=3), 5), clause="RES-1",
                 what="2 batches, JSON state, 3 more")


@pytest.mark.clause("RES-7")
def test_the_state_moves_to_the_next_epoch_when_the_pass_ends_as_the_reference_does():
    loader = build_dataloader(dataset(), batch_size=4, end="drop_last")
    reference = ReferenceLoader(CORPUS, CONFIG, Topology(batch_size=4), data_fingerprint=dataset().store.fingerprint)
    states = [loader.state_dict() for _ in loader]
    expected = [reference.state_dict() for _ in reference]
    assert_equal(states, expected, clause="RES-7", what="states inside the loop body, step by step")
    check((loader.epoch, loader.consumed) == (reference.epoch, reference.consumed) == (1, 0), clause="RES-7",
          what=f"position after the pass: {(loader.epoch, loader.consumed)}")
    check(len(states) == len(build_dataloader(dataset(), batch_size=4)) > 0, clause="PART-10",
          what=f"{len(states)} steps, len() says {len(loader)}")
    last = build_dataloader(dataset(), batch_size=4)
    last.load_state_dict(states[-1])                 # taken after the last step, inside the loop
    assert_equal(rows(take(last, 1)), reference_rows(Topology(batch_size=4), len(states) + 1)[-1:], clause="RES-7",
                 what="the batch after resuming from the state of the epoch's last step")


@pytest.mark.clause("RES-7")
def test_set_epoch_keeps_a_resumed_position_and_restarts_any_other_epoch():
    loader = build_dataloader(dataset(), batch_size=2)
    loader.load_state_dict(dict(loader.state_dict(), epoch=2, consumed=6))
    loader.set_epoch(2)
    check((loader.epoch, loader.consumed) == (2, 6), clause="RES-7", what="set_epoch(2) moved a state inside epoch 2")
    check(loader.steps_remaining == len(loader) - 3, clause="PART-10",
          what=f"steps_remaining={loader.steps_remaining} with len={len(loader)} at consumed 6")
    first = next(iter(loader))
    check(first["sample_index"].tolist() == [6, 7] and first["epoch"].tolist() == [2, 2], clause="RES-7",
          what=f"first batch after the resumed set_epoch(2): {first['sample_index'].tolist()}")
    loader.set_epoch(3)
    check((loader.epoch, loader.consumed) == (3, 0), clause="RES-7", what="set_epoch(3) did not restart at epoch 3")
    assert_raises_typed(ConfigError, loader.set_epoch, -1, clause="RES-7", what="set_epoch(-1)", mentions=["epoch=-1"])


@pytest.mark.clause("RES-1", "COLL-9")
@pytest.mark.parametrize("collate_fn", ["default", "list"])
def test_a_loader_without_workers_yields_what_its_dataloader_yields_from_the_same_position(collate_fn):
    """In one process the loader runs ``collate_fn(fetch(keys))`` itself; torch's DataLoader must agree, batch for batch."""
    kw = {} if collate_fn == "default" else {"collate_fn": list}
    loader = build_dataloader(dataset(), batch_size=2, **kw)
    loader.load_state_dict(make_state(loader.fingerprint, 0, 4))
    expected = list(loader.dataloader)               # torch's own iterator, started at the loader's position
    got = list(loader)
    assert_equal(len(got), len(expected), clause="RES-1", what="batches of the in-process loop")
    for b, (g, e) in enumerate(zip(got, expected)):
        samples = (g, e) if collate_fn == "list" else ([g], [e])
        for one, other in zip(*samples):
            assert_equal(sorted(one), sorted(other), clause="COLL-9", what=f"batch {b} fields")
            for key in other:
                check(torch.equal(torch.as_tensor(one[key]), torch.as_tensor(other[key])), clause="COLL-9",
                      what=f"batch {b} field {key}")


@pytest.mark.clause("RES-5", "ORD-1")
def test_persistent_workers_get_each_epoch_from_the_keys_without_set_epoch_reaching_them():
    loader = build_dataloader(dataset(), batch_size=2, num_workers=1, persistent_workers=True)
    got = rows(list(loader)) + rows(list(loader))
    expected = reference_rows(Topology(batch_size=2), len(got))
    check({r.epoch for b in got for r in b} == {0, 1}, clause="RES-7", what="two passes did not cover epochs 0 and 1")
    assert_equal(got, expected, clause="RES-5", what="two epochs through one persistent worker")


@pytest.mark.clause("RES-5")
def test_spawned_workers_unpickle_the_dataset_and_yield_the_same_batches():
    loader = build_dataloader(dataset(), batch_size=3, num_workers=1, multiprocessing_context="spawn")
    assert_equal(rows(take(loader, 4)), reference_rows(Topology(batch_size=3), 4), clause="RES-5",
                 what="4 batches from a spawned worker")


@pytest.mark.clause("RES-5", "PART-11")
def test_abandoning_an_epoch_with_workers_and_iterating_again_continues_after_the_last_handed_out_batch():
    loader = build_dataloader(dataset(), batch_size=1, num_workers=2, prefetch_factor=3)
    head = take(loader, 2)
    rest = take(loader, 4)
    assert_equal(rows(head + rest), reference_rows(Topology(batch_size=1), 6), clause="RES-6",
                 what="2 batches, a new iterator, 4 more")


@pytest.mark.clause("RES-4", "PART-1")
def test_replicated_ranks_receive_identical_batches_and_groups_split_the_stream():
    per_rank = [rows(list(build_dataloader(dataset(), batch_size=2, rank=r, world_size=4, replication=2)))
                for r in range(4)]
    expected = [[[CanonicalRow.from_reference(row) for row in b]
                 for b in ReferenceLoader(CORPUS, CONFIG, Topology(world_size=4, rank=r, batch_size=2, replication=2))]
                for r in range(4)]
    for r in range(4):
        assert_equal(per_rank[r], expected[r], clause="PART-1", what=f"rank {r} of 4 with replication 2")


# --------------------------------------------------------------------------- the sampler's arithmetic


class _Sized:
    epoch = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def num_samples(self, epoch: int) -> int:
        return self.n


@pytest.mark.clause("PART-2", "PART-4", "PART-5", "PART-6", "PART-7")
@given(total=st.integers(0, 60), world=st.integers(1, 6), batch=st.integers(1, 5), end=st.sampled_from(END_POLICIES),
       data=st.data())
def test_every_group_batch_equals_the_reference_step_slice_bit_for_bit(total, world, batch, end, data):
    replication = data.draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    config = PartitionConfig(world_size=world, batch_size=batch, replication=replication, end=end)
    consumed = data.draw(st.integers(0, total))
    step = step_slice(consumed, total, config)
    for g in range(config.data_parallel_size):
        assert_equal(group_batch(consumed, total, config, g), step[g] if step else [], clause="PART-2",
                     what=f"group {g} at consumed={consumed}", repro={"total": total, "config": config})
    rank = data.draw(st.integers(0, world - 1))
    sampler = ElasticSampler(_Sized(total), batch_size=batch, rank=rank, world_size=world, replication=replication, end=end,
                             position=lambda: (0, consumed))
    expected = [s[rank // replication] for s in epoch_steps(total, config, start=consumed)]
    assert_equal([[k.index for k in keys] for keys in sampler], expected, clause="PART-9",
                 what=f"rank {rank}'s sampler from consumed={consumed}", repro={"total": total, "config": config})
    assert_equal([[k.index for k in keys] for keys in sampler.batches(0, consumed)], expected, clause="PART-9",
                 what=f"sampler.batches(0, {consumed})", repro={"total": total, "config": config})
    check(len(sampler) == len(expected), clause="PART-10", what="len(sampler) from the position")
    check(all(isinstance(k, SampleKey) for keys in sampler for k in keys), clause="PART-2", what="keys are SampleKeys")
    check(rank_batch(consumed, total, config, rank) == (expected[0] if expected else []), clause="PART-1",
          what="first batch vs rank_batch")


# --------------------------------------------------------------------------- collation


rows_of_ints = st.lists(st.lists(st.integers(-5, 50), max_size=9), min_size=1, max_size=6)


@pytest.mark.clause("COLL-1")
@given(items=rows_of_ints, pad=st.integers(-100, 100), side=st.sampled_from(["right", "left"]),
       multiple=st.one_of(st.none(), st.integers(1, 8)))
def test_pad_stack_1d_on_tensors_equals_the_reference(items, pad, side, multiple):
    got = pad_stack_1d([torch.tensor(r, dtype=torch.int64) for r in items], pad, side=side, pad_to_multiple_of=multiple)
    expected = ref_collation.pad_stack_1d(items, pad, side=side, pad_to_multiple_of=multiple)
    assert_equal(got.tolist(), expected, clause="COLL-1", what="padded rows",
                 repro={"items": items, "pad": pad, "side": side, "multiple": multiple})
    check(got.shape == (len(items), len(expected[0])), clause="COLL-1", what=f"shape {tuple(got.shape)}")


@pytest.mark.clause("COLL-2")
def test_pad_stack_1d_refuses_requests_without_a_shape_like_the_reference():
    for args, kwargs, mentions in [(([], 0), {}, ["empty"]), (([[1]], 0), {"pad_to_multiple_of": 0}, ["pad_to_multiple_of"]),
                                   (([[1]], 0), {"side": "middle"}, ["side"])]:
        assert_raises_typed(ConfigError, ref_collation.pad_stack_1d, *args, clause="COLL-2", what="reference", **kwargs)
        tensors = [torch.tensor(r) for r in args[0]]
        assert_raises_typed(ConfigError, pad_stack_1d, tensors, args[1], clause="COLL-2", what=f"impl {kwargs}",
                            mentions=mentions, **kwargs)


@pytest.mark.clause("COLL-8")
@given(rows_=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=7), min_size=1, max_size=4), data=st.data())
def test_cu_seqlens_of_a_batch_is_the_reference_row_boundaries_offset_by_row(rows_, data):
    length = len(rows_[0])
    rows_ = [(r + [0] * length)[:length] for r in rows_]
    cu, longest = cu_seqlens(torch.tensor(rows_, dtype=torch.int64).reshape(len(rows_), length))
    expected = [0]
    for r, row in enumerate(rows_):
        expected = expected[:-1] + [b + r * length for b in ref_collation.cu_seqlens(row)]
    assert_equal(cu.tolist(), expected, clause="COLL-8", what="cu_seqlens", repro={"position_ids": rows_})
    check(cu.dtype == torch.int32, clause="COLL-8", what=f"dtype {cu.dtype}")
    diffs = [b - a for a, b in pairwise(expected)]
    check(longest == max(diffs, default=0), clause="COLL-8", what=f"max_seqlen={longest}, segments {diffs}")


def test_collate_stacks_samples_into_batch_tensors_with_varlen_boundaries():
    ds = dataset()
    batch = collate([ds[SampleKey(0, 0)], ds[SampleKey(0, 1)], ds[SampleKey(0, -1)]])
    check(batch["input_ids"].shape == (3, 4) and batch["input_ids"].dtype == torch.int64, clause="COLL-9",
          what=f"input_ids {tuple(batch['input_ids'].shape)} {batch['input_ids'].dtype}")
    check(batch["sample_index"].tolist() == [0, 1, -1], clause="PART-5", what="sample indices with a padding slot")
    check(batch["labels"][2].eq(-100).all().item(), clause="PART-5", what="the padding slot is fully masked")
    expected = [0]
    for r, (row, docs) in enumerate(zip(batch["position_ids"].tolist(), batch["doc_ids"].tolist())):
        expected = expected[:-1] + [b + r * 4 for b in ref_collation.cu_seqlens(row, docs)]
    assert_equal(batch["cu_seqlens"].tolist(), expected, clause="COLL-8", what="cu_seqlens of a collated batch")


@pytest.mark.clause("COLL-10")
def test_collate_refuses_samples_of_different_shapes_or_fields():
    a = {"input_ids": torch.tensor([1, 2]), "position_ids": torch.tensor([0, 1])}
    assert_raises_typed(ConfigError, collate, [a, {"input_ids": torch.tensor([1]), "position_ids": torch.tensor([0])}],
                        clause="COLL-10", what="rows of different lengths", mentions=["input_ids", "pad_stack_1d"])
    assert_raises_typed(ConfigError, collate, [a, {"input_ids": torch.tensor([1, 2])}], clause="COLL-10",
                        what="different fields", mentions=["fields"])
    assert_raises_typed(ConfigError, collate, [], clause="COLL-10", what="an empty batch", mentions=["empty"])


@pytest.mark.clause("COLL-9")
def test_a_custom_collate_fn_receives_the_list_of_per_sample_dicts(tmp_path):
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.store import TokenStore

    store = TokenStore.from_token_files([[list(range(1, 40)), list(range(50, 90))]], tmp_path / "store", vocab_size=100)
    dataset = PackedDataset(store, seq_len=8, cache_dir=False)
    received = []

    def collate_fn(items):
        received.append(items)
        return [int(item["sample_index"]) for item in items]

    batches = list(build_dataloader(dataset, batch_size=3, collate_fn=collate_fn))
    check(all(isinstance(items, list) and all(isinstance(i, dict) for i in items) for items in received),
          clause="COLL-9", what=f"collate_fn received {type(received[0]).__name__}, not a list of sample dicts")
    assert_equal(batches[:2], [[0, 1, 2], [3, 4, 5]], clause="COLL-9", what="batches from the custom collate_fn")


@pytest.mark.clause("RES-5", "COLL-9")
def test_batches_from_workers_have_the_same_keys_types_dtypes_and_values_as_from_the_main_process(tmp_path):
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.store import TokenStore

    store = TokenStore.from_token_files([[list(range(1, 60)), list(range(60, 75))], [list(range(80, 130))]],
                                        tmp_path / "store", vocab_size=200)
    dataset = PackedDataset(store, seq_len=8, shuffle="global", cache_dir=False)
    plain = list(build_dataloader(dataset, batch_size=3))
    with_workers = list(build_dataloader(dataset, batch_size=3, num_workers=2))
    assert_equal(len(with_workers), len(plain), clause="RES-5", what="batches with 2 workers")
    for a, b in zip(with_workers, plain):
        assert_equal(sorted(a), sorted(b), clause="COLL-9", what="batch keys")
        for key in b:
            if isinstance(b[key], torch.Tensor):
                check(isinstance(a[key], torch.Tensor) and a[key].dtype == b[key].dtype, clause="COLL-9",
                      what=f"{key}: {type(a[key]).__name__} {getattr(a[key], 'dtype', '')} vs {b[key].dtype}")
                assert_equal(a[key].tolist(), b[key].tolist(), clause="RES-5", what=key)
            else:
                assert_equal(a[key], b[key], clause="RES-5", what=key)


int64s = st.integers(-(2**63), 2**63 - 1)


@pytest.mark.clause("COLL-8")
@given(fields=st.dictionaries(st.sampled_from(["input_ids", "labels", "position_ids", "doc_ids", "token_offsets"]),
                              st.lists(st.one_of(st.integers(-300, 70000), int64s), max_size=12), min_size=1),
       max_seqlen=st.integers(0, 10))
def test_a_batch_sent_from_a_worker_arrives_with_the_same_keys_dtypes_and_values(fields, max_seqlen):
    """Workers narrow int64 fields for the pipe; the training process must see exactly what collate made."""
    batch = {key: torch.tensor(values, dtype=torch.int64) for key, values in fields.items()}
    batch["cu_seqlens"], batch["max_seqlen"] = torch.tensor([0, 3], dtype=torch.int32), max_seqlen
    wire = pickle.loads(pickle.dumps(collate_to_numpy(batch)))
    got = tensors_from_numpy(wire)
    assert_equal(list(got), list(batch), clause="COLL-8", what="keys after the pipe")
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert_equal((got[key].dtype, got[key].tolist()), (value.dtype, value.tolist()), clause="COLL-8",
                         what=f"{key} after the pipe")
        else:
            assert_equal(got[key], value, clause="COLL-8", what=f"{key} after the pipe")


def test_workers_send_token_ids_in_fewer_bytes_than_int64():
    batch = {"input_ids": torch.arange(50000, 50000 + 4096, dtype=torch.int64).reshape(2, 2048),
             "labels": torch.full((2, 2048), -100, dtype=torch.int64)}
    wire = collate_to_numpy(batch)
    assert wire["input_ids"].dtype.itemsize == 2 and wire["labels"].dtype.itemsize == 1
    assert len(pickle.dumps(wire)) < 4096 * 8 // 2


# --------------------------------------------------------------------------- one owner per setting and position


@pytest.mark.clause("PART-5", "RES-3")
def test_a_pad_dataset_in_a_loader_without_end_pads_the_tail_as_its_fingerprint_says(tmp_path):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    store = TokenStore.from_token_files([[list(range(1, 30)), list(range(40, 52))]], tmp_path / "store", vocab_size=100)
    padded = PackedDataset(store, seq_len=4, cache_dir=False, end="pad")
    loader = build_dataloader(padded, batch_size=4)
    total = padded.num_samples(0)
    check(total % 4 != 0, clause="PART-5", what=f"{total} samples leave no tail to pad")
    check(loader.partition.end == "pad", clause="PART-5", what=f"the loader's end is {loader.partition.end!r}")
    indices = [i for batch in loader for i in batch["sample_index"].tolist()]
    assert_equal(indices, list(range(total)) + [-1] * (-total % 4), clause="PART-5", what="the padded epoch")
    drop = PackedDataset(store, seq_len=4, cache_dir=False)
    check(padded.fingerprint != drop.fingerprint and loader.state_dict()["fingerprint"] == padded.fingerprint,
          clause="RES-3", what="the state's fingerprint is the pad dataset's")


@pytest.mark.clause("PART-3")
def test_the_sampler_keeps_no_position_and_starts_where_the_loader_is():
    loader = build_dataloader(dataset(), batch_size=2)
    for name in ("set_epoch", "set_position", "advance", "state", "consumed"):
        check(not hasattr(loader.sampler, name), clause="PART-3", what=f"the sampler still has {name}")
    loader.load_state_dict(dict(loader.state_dict(), epoch=1, consumed=4))
    first = next(iter(loader.sampler))
    assert_equal(first, [SampleKey(1, 4), SampleKey(1, 5)], clause="PART-3", what="the sampler's first batch")
    check(len(loader.sampler) == loader.steps_remaining, clause="PART-10", what="len(sampler) vs steps_remaining")


@pytest.mark.clause("PART-3", "PART-5", "PART-10")
@given(total=st.integers(0, 80), world=st.integers(1, 6), batch=st.integers(1, 5), end=st.sampled_from(END_POLICIES),
       data=st.data())
def test_impl_partition_arithmetic_equals_the_reference(total, world, batch, end, data):
    from impl import partition as ip
    from impl import schema
    from reference import partition as rp
    from reference.resume import padding_sample

    config = PartitionConfig(world_size=world, batch_size=batch, end=end)
    consumed = data.draw(st.integers(0, total))
    rep = {"total": total, "config": config, "consumed": consumed}
    assert_equal(ip.advance(consumed, total, config), rp.advance(consumed, total, config), clause="PART-3",
                 what="advance", repro=rep)
    assert_equal(ip.steps_in_epoch(total, config, consumed), rp.steps_in_epoch(total, config, consumed),
                 clause="PART-10", what="steps_in_epoch", repro=rep)
    packing = PackingConfig(seq_len=batch + 1, pad_id=world)
    pad = padding_sample(packing)
    rows_ = schema.padding_rows(2, packing)
    for name in schema.BATCH_FIELDS:
        assert_equal(rows_[name].tolist(), [list(getattr(pad, name))] * 2, clause="PART-5", what=f"padding {name}",
                     repro={"packing": packing})


@pytest.mark.clause("RES-6")
@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_abandoned_by_load_state_dict_or_a_new_iter_yields_nothing_more(workers):
    kw = {"num_workers": workers, "persistent_workers": True} if workers else {}
    loader = build_dataloader(dataset(), batch_size=2, **kw)
    expected = reference_rows(Topology(batch_size=2), len(loader))
    old = iter(loader)
    next(old)
    state = loader.state_dict()
    next(old)
    loader.load_state_dict(state)
    assert_equal(list(old), [], clause="RES-6", what="the iterator abandoned by load_state_dict")
    newer = iter(loader)
    head = next(newer)
    newest = iter(loader)
    assert_equal(list(newer), [], clause="RES-6", what="the iterator abandoned by a new iter()")
    assert_equal(rows([head] + list(newest)), expected[1:], clause="RES-6",
                 what="batches after load_state_dict and a new iter(), from the state's position")


def _new_workers(before: set[int]) -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.pid not in before]


@pytest.mark.clause("RES-6")
def test_an_iterator_dropped_mid_epoch_stops_its_workers_at_once_not_when_the_garbage_collector_runs():
    loader = build_dataloader(dataset(), batch_size=1, num_workers=2)
    before = {p.pid for p in multiprocessing.active_children()}
    gc.disable()   # a loader<->iterator cycle would leave the workers to the collector, at some later allocation
    try:
        it = iter(loader)
        next(it)
        workers = _new_workers(before)
        check(len(workers) == 2, clause="RES-6", what=f"{len(workers)} worker processes started, expected 2")
        del it
        alive = [p.pid for p in workers if p.is_alive()]
    finally:
        gc.enable()
    check(not alive, clause="RES-6", what=f"workers {alive} still run after their iterator was dropped")


@pytest.mark.clause("RES-6")
def test_close_stops_the_live_pass_and_its_workers_and_the_next_pass_continues_after_the_last_handed_out_batch():
    loader = build_dataloader(dataset(), batch_size=1, num_workers=2)
    before = {p.pid for p in multiprocessing.active_children()}
    it = iter(loader)
    head = [next(it), next(it)]
    workers = _new_workers(before)
    state = loader.state_dict()
    loader.close()
    check(not [p.pid for p in workers if p.is_alive()], clause="RES-6", what="workers still run after close()")
    assert_equal(list(it), [], clause="RES-6", what="the iterator closed by close()")
    assert_equal(loader.state_dict(), state, clause="RES-6", what="the state after close()")
    assert_equal(rows(head + take(loader, 3)), reference_rows(Topology(batch_size=1), 5), clause="RES-6",
                 what="2 batches, close(), 3 more")
