"""Catalogue of bad input to the loader: one test per case, each asserting the error type and that the message
names the problem (the value) and the fix.

Why a catalogue: a refusal is only useful if the person reading it at 3 a.m.
knows what to change. Every case here is a way a real job goes wrong: a
checkpoint from another run or version, an edited state, a topology too big
for the data, a loader configured against its dataset, an error inside a
DataLoader worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.assertions import assert_equal, assert_raises_typed, check
from impl.dataset import PackedDataset
from impl.errors import ConfigError, StateError, StoreCorruptError, TopologyError
from impl.loader import build_dataloader
from impl.store import TokenStore
from reference.resume import MAX_STATE_INT, SUPPORTED_STATE_VERSIONS

SEQ_LEN = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[TokenStore]:
    docs = [[list(range(10 * d + 1, 10 * d + 2 + d % 5)) for d in range(f * 8, f * 8 + 8)] for f in range(2)]
    with TokenStore.from_token_files(docs, tmp_path_factory.mktemp("catalogue") / "store", vocab_size=200) as store:
        yield store


@pytest.fixture
def dataset(store) -> PackedDataset:
    return PackedDataset(store, seq_len=SEQ_LEN, cache_dir=False)


@pytest.fixture
def loader(dataset):
    return build_dataloader(dataset, batch_size=2)


def refused(loader, state, *mentions):
    __tracebackhide__ = True
    return assert_raises_typed(StateError, loader.load_state_dict, state, clause="RES-3", what=f"state {state!r}",
                               mentions=list(mentions))


# --------------------------------------------------------------------------- states


@pytest.mark.clause("RES-3")
def test_state_version_0_is_refused_as_no_version_loadspec_wrote(loader):
    refused(loader, dict(loader.state_dict(), version=0), "version 0", "supported: 1", "upgrade")


@pytest.mark.clause("RES-3")
def test_state_version_minus_1_is_refused(loader):
    refused(loader, dict(loader.state_dict(), version=-1), "version -1", "supported: 1")


@pytest.mark.clause("RES-3")
def test_state_version_given_as_the_string_1_is_refused(loader):
    refused(loader, dict(loader.state_dict(), version="1"), "version '1'", "supported: 1")


@pytest.mark.clause("RES-3")
def test_state_version_true_is_refused_although_it_equals_1(loader):
    refused(loader, dict(loader.state_dict(), version=True), "version True", "supported: 1")


@pytest.mark.clause("RES-3")
def test_a_future_state_version_is_refused_naming_the_upgrade(loader):
    future = max(SUPPORTED_STATE_VERSIONS) + 1
    refused(loader, dict(loader.state_dict(), version=future), f"version {future}", "upgrade loadspec")


@pytest.mark.clause("RES-3")
def test_a_state_missing_a_key_is_refused_naming_the_key(loader):
    state = loader.state_dict()
    del state["consumed"]
    refused(loader, state, "missing: ['consumed']", "state_dict() returned")


@pytest.mark.clause("RES-3")
def test_a_state_with_a_foreign_extra_key_is_refused_naming_it(loader):
    refused(loader, dict(loader.state_dict(), sampler_iter_state={"samples_yielded": 4}),
            "extra: ['sampler_iter_state']", "unchanged")


@pytest.mark.clause("RES-3")
def test_a_state_of_another_format_is_refused_as_not_written_by_loadspec(loader):
    refused(loader, {"_snapshot": {}, "_steps_since_snapshot": 0}, "format None", "not written by loadspec")


@pytest.mark.clause("RES-3")
def test_a_state_that_is_not_a_dict_is_refused(loader):
    refused(loader, [0, 4], "must be a dict", "got list")


@pytest.mark.clause("RES-3")
def test_a_state_with_epoch_2_to_the_70_is_refused_at_load_not_at_the_first_batch(loader):
    refused(loader, dict(loader.state_dict(), epoch=2**70), f"epoch={2**70}", str(MAX_STATE_INT), "fresh state")


@pytest.mark.clause("RES-3")
def test_a_state_with_a_float_epoch_is_refused(loader):
    refused(loader, dict(loader.state_dict(), epoch=1.0), "epoch=1.0", "integer")


@pytest.mark.clause("RES-3")
def test_a_state_with_negative_consumed_is_refused(loader):
    refused(loader, dict(loader.state_dict(), consumed=-4), "consumed=-4", "fresh state")


@pytest.mark.clause("RES-3")
def test_a_state_with_consumed_beyond_the_epoch_is_refused_naming_the_sample_count(loader):
    total = loader.num_samples(0)
    refused(loader, dict(loader.state_dict(), consumed=total + 2), f"consumed={total + 2}", f"holds {total} samples",
            "fresh state")


@pytest.mark.clause("RES-3")
def test_a_state_of_other_data_is_refused_naming_the_fingerprint(store, tmp_path, loader):
    other = TokenStore.from_token_files([[[7, 8, 9, 10, 11, 12]] * 4], tmp_path / "other", vocab_size=200)
    state = build_dataloader(PackedDataset(other, seq_len=SEQ_LEN, cache_dir=False), batch_size=2).state_dict()
    refused(loader, state, "fingerprint", "data differs", "the store was rebuilt or is another store", "restore")


@pytest.mark.clause("RES-3")
def test_a_refused_state_leaves_the_position_unchanged(loader):
    next(iter(loader))
    before = loader.state_dict()
    refused(loader, dict(before, epoch=-1), "epoch=-1")
    assert_equal(loader.state_dict(), before, clause="RES-3", what="state after a refused load")


# --------------------------------------------------------------------------- topology and settings


@pytest.mark.clause("PART-12")
def test_an_epoch_with_zero_steps_for_the_topology_is_refused_naming_the_numbers(dataset):
    total = dataset.num_samples(0)
    err = assert_raises_typed(TopologyError, build_dataloader, dataset, batch_size=total, rank=0, world_size=2,
                              clause="PART-12", what="world_size x batch_size beyond the epoch",
                              mentions=[f"holds {total} samples", f"2 x {total} = {2 * total}", "no batch",
                                        "lower batch_size"])
    check(isinstance(err, ConfigError), clause="PART-12", what="a TopologyError is a ConfigError")


@pytest.mark.clause("PART-12")
def test_an_empty_epoch_is_built_when_asked_for_explicitly(dataset):
    loader = build_dataloader(dataset, batch_size=dataset.num_samples(0), rank=0, world_size=2, allow_empty_epoch=True)
    assert_equal(list(loader), [], clause="PART-10", what="an allowed empty epoch")


@pytest.mark.clause("PART-12")
@pytest.mark.parametrize("batch_size", [0, True, 2.0, "2"])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(dataset, batch_size):
    assert_raises_typed(ConfigError, build_dataloader, dataset, batch_size=batch_size, clause="PART-12",
                        what=f"batch_size={batch_size!r}", mentions=[f"batch_size={batch_size!r}", "integer >= 1"])


@pytest.mark.clause("PART-12")
def test_a_rank_at_or_beyond_the_world_size_is_refused_naming_the_valid_ranks(dataset):
    assert_raises_typed(TopologyError, build_dataloader, dataset, batch_size=1, rank=3, world_size=3, clause="PART-12",
                        what="rank=3 of 3", mentions=["rank=3", "pass one of 0..2"])


@pytest.mark.clause("PART-12")
def test_a_world_size_of_zero_is_refused(dataset):
    assert_raises_typed(TopologyError, build_dataloader, dataset, batch_size=1, rank=0, world_size=0, clause="PART-12",
                        what="world_size=0", mentions=["world_size=0", "at least one rank"])


@pytest.mark.clause("PART-4", "RES-3")
def test_an_end_policy_contradicting_the_dataset_is_refused_naming_both(store):
    padded = PackedDataset(store, seq_len=SEQ_LEN, cache_dir=False, end="pad")
    assert_raises_typed(ConfigError, build_dataloader, padded, batch_size=3, end="drop_last", clause="PART-4",
                        what="end='drop_last' over a dataset with end='pad'",
                        mentions=["end='drop_last'", "end='pad'", "leave end unset"])


@pytest.mark.clause("PART-4")
def test_an_unknown_end_policy_is_refused_with_the_choices(dataset):
    assert_raises_typed(ConfigError, build_dataloader, dataset, batch_size=1, end="wrap", clause="PART-4",
                        what="end='wrap'", mentions=["end='wrap'", "drop_last", "pad", "even"])


@pytest.mark.clause("RES-6")
def test_prefetch_options_without_workers_are_refused_naming_num_workers(dataset):
    assert_raises_typed(ConfigError, build_dataloader, dataset, batch_size=1, persistent_workers=True,
                        clause="RES-6", what="persistent_workers without workers", mentions=["num_workers >= 1"])


# --------------------------------------------------------------------------- errors inside workers


class _CorruptAtSample(PackedDataset):
    """A dataset whose store "goes bad" at one sample: a worker raises a LoadspecError mid-epoch."""

    BAD = 5

    def __getitems__(self, keys):
        if any(k.index == self.BAD for k in keys):
            raise StoreCorruptError(f"tokens-00000.bin changed since the store was built (sample {self.BAD}); "
                                    "rebuild it with TokenStore.build(..., overwrite=True)")
        return super().__getitems__(keys)


class _OddError(Exception):
    """An exception whose constructor does not take its message: it cannot be rebuilt from its text."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code


class _OddAtSample(PackedDataset):
    def __getitems__(self, keys):
        if any(k.index == 1 for k in keys):
            raise _OddError(7, "odd")
        return super().__getitems__(keys)


@pytest.mark.clause("RES-6")
def test_a_loadspec_error_in_a_worker_arrives_as_the_same_class_and_message(store):
    ds = _CorruptAtSample(store, seq_len=SEQ_LEN, cache_dir=False)
    expected = ("tokens-00000.bin changed since the store was built (sample 5); "
                "rebuild it with TokenStore.build(..., overwrite=True)")
    loader = build_dataloader(ds, batch_size=2, num_workers=2)
    got = []
    with pytest.raises(StoreCorruptError) as info:
        for batch in loader:
            got.append(batch["sample_index"].tolist())
    check(type(info.value) is StoreCorruptError, clause="RES-6", what=f"raised {type(info.value).__name__}")
    assert_equal(str(info.value), expected, clause="RES-6", what="the message of the worker's error")
    check(any("DataLoader worker" in note for note in getattr(info.value, "__notes__", [])), clause="RES-6",
          what="the worker's traceback is attached as a note")
    assert_equal(got, [[0, 1], [2, 3]], clause="RES-6", what="batches before the failing one")
    assert_equal(loader.consumed, 4, clause="RES-6", what="the failed batch is not counted as consumed")


@pytest.mark.clause("RES-6")
def test_an_error_in_a_custom_collate_fn_in_a_worker_arrives_unchanged(dataset):
    def collate_fn(items):
        raise ConfigError(f"collate_fn got {len(items)} items; pass batch_size=3")

    with pytest.raises(ConfigError) as info:
        next(iter(build_dataloader(dataset, batch_size=2, num_workers=2, collate_fn=collate_fn)))
    assert_equal(str(info.value), "collate_fn got 2 items; pass batch_size=3", clause="RES-6",
                 what="the message of collate_fn's error")


@pytest.mark.clause("RES-6")
def test_an_exception_that_cannot_be_rebuilt_is_left_to_torch_and_still_stops_the_loop(store):
    ds = _OddAtSample(store, seq_len=SEQ_LEN, cache_dir=False)
    with pytest.raises(Exception) as info:
        list(build_dataloader(ds, batch_size=1, num_workers=2))
    check("code 7: odd" in str(info.value), clause="RES-6", what=f"torch's error {info.value!r} names the original")
