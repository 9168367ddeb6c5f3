"""Integrity of the plan cache: its key covers every input that changes a plan, and a damaged file is never trusted.

The key: starting from a cached plan, changing any config field that can
change the plan, the store (its fingerprint: other lengths, other tokens) or
the epoch (for shuffled orders) must miss the cache (the plan is computed
again); fields that cannot change a plan are listed with the reason, so a
new config field fails here until it is classified.

Damage: a byte flipped anywhere in the values of a cached plan (checked per
block, on first use, while the plan is in use) or a half-written file must
give the same samples as a dataset with no cache at all.
"""

from __future__ import annotations

import dataclasses
import io
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, check
from conformance.impl_tests.test_dataset import make_store
from impl import plan_cache as plan_cache_module
from impl.dataset import PackedDataset
from impl.store import TokenStore
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig

CORPUS = [[[11, 12, 13], [14, 15, 16, 17, 18, 19], [40, 41]], [[20, 21], [22, 23, 24, 25, 26, 27, 28, 29, 30, 31]],
          [[32, 33, 34, 35], [36]]]
OTHER_LENGTHS = [[[11, 12, 13], [14, 15, 16, 17, 18]], [[20, 21, 22], [22, 23, 24, 25, 26, 27, 28, 29, 30, 31]]]
OTHER_TOKENS = [[[d + 1 for d in doc] for doc in f] for f in CORPUS]

BASE = PipelineConfig(
    packing=PackingConfig(seq_len=4, mode="none", window=3, overflow="split", stride=1, bos_id=50_256, eos_id=50_256,
                          pad_id=0),
    ordering=OrderingConfig(kind="window", seed=3, window=2))

# Each field that may change a plan, and a value that differs from BASE's (valid with the rest of BASE).
PACKING_FLIPS = {"seq_len": 5, "mode": "greedy", "window": 1, "overflow": "truncate", "stride": 2,
                 "bos_on_continuation": True, "add_bos": True, "add_eos": True, "min_len": 3}
ORDERING_FLIPS = {"kind": "global", "seed": 4, "window": 3}
# Fields that cannot change which tokens a sample holds, or where.
PLAN_NEUTRAL = {
    "packing.bos_id": "the plan holds positions and spans; the token id written at a BOS position is the fill's",
    "packing.eos_id": "as bos_id",
    "packing.pad_id": "padding is written by the fill",
    "ordering.buffer_size": "the buffered shuffle is refused by impl",
    "end": "the end policy is the sampler's, after the plan",
    "split": "keyed through the store: a split's plan is the SplitStore view's, whose fingerprint names its rows "
             "(test_a_split_and_the_whole_store_never_share_a_cached_plan)",
}


@pytest.fixture(scope="module")
def stores():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        yield {"base": make_store(CORPUS, root / "base"), "lengths": make_store(OTHER_LENGTHS, root / "lengths"),
               "tokens": make_store(OTHER_TOKENS, root / "tokens")}


def flipped(field: str) -> PipelineConfig:
    group, name = field.split(".")
    if group == "packing":
        return dataclasses.replace(BASE, packing=dataclasses.replace(BASE.packing, **{name: PACKING_FLIPS[name]}))
    return dataclasses.replace(BASE, ordering=dataclasses.replace(BASE.ordering, **{name: ORDERING_FLIPS[name]}))


def computes(ds: PackedDataset, epoch: int) -> bool:
    """Does getting epoch ``epoch``'s plan compute it (a cache miss)?"""
    calls = []
    original = ds.compute_plan
    ds.compute_plan = lambda e: calls.append(e) or original(e)
    try:
        ds.plan(epoch)
    finally:
        del ds.compute_plan   # the wrapper refers to ds: left in place, ds and its files would wait for the gc
    return bool(calls)


@pytest.mark.clause("PACK-20")
def test_every_config_field_is_either_in_the_plan_key_or_declared_plan_neutral():
    fields = {f"packing.{f.name}" for f in dataclasses.fields(PackingConfig)}
    fields |= {f"ordering.{f.name}" for f in dataclasses.fields(OrderingConfig)}
    fields |= {f.name for f in dataclasses.fields(PipelineConfig)} - {"packing", "ordering"}
    keyed = {f"packing.{n}" for n in PACKING_FLIPS} | {f"ordering.{n}" for n in ORDERING_FLIPS}
    assert_equal(sorted(fields - keyed - set(PLAN_NEUTRAL)), [], clause="PACK-20",
                 what="config fields neither flipped by the key test nor declared plan-neutral")


@pytest.mark.clause("PACK-20")
@given(field=st.sampled_from([f"packing.{n}" for n in PACKING_FLIPS] + [f"ordering.{n}" for n in ORDERING_FLIPS]),
       epoch=st.integers(0, 3))
def test_changing_any_plan_field_misses_the_cache(stores, field, epoch):
    with tempfile.TemporaryDirectory() as cache:
        base = PackedDataset.from_config(stores["base"], BASE, cache_dir=cache)
        base.plan(epoch)
        check(not computes(PackedDataset.from_config(stores["base"], BASE, cache_dir=cache), epoch), clause="PACK-20",
              what="the same config and store hit the cache")
        other = PackedDataset.from_config(stores["base"], flipped(field), cache_dir=cache)
        check(other.plan_key(epoch) != base.plan_key(epoch) and computes(other, epoch), clause="PACK-20",
              what=f"changing {field} misses the cache", repro={"field": field, "epoch": epoch})


@pytest.mark.clause("PACK-20")
@given(store=st.sampled_from(["lengths", "tokens"]), epoch=st.integers(0, 3))
def test_another_store_or_another_epoch_misses_the_cache(stores, store, epoch):
    with tempfile.TemporaryDirectory() as cache:
        PackedDataset.from_config(stores["base"], BASE, cache_dir=cache).plan(epoch)
        check(computes(PackedDataset.from_config(stores[store], BASE, cache_dir=cache), epoch), clause="PACK-20",
              what=f"a store with other {store} misses the cache")
        check(computes(PackedDataset.from_config(stores["base"], BASE, cache_dir=cache), epoch + 1), clause="PACK-20",
              what="another epoch of a shuffled order misses the cache")


def header_size(data: bytes) -> int:
    buf = io.BytesIO(data)
    np.lib.format.read_magic(buf)
    np.lib.format.read_array_header_1_0(buf)
    return buf.tell()


def all_samples(ds: PackedDataset, epoch: int) -> dict[str, np.ndarray]:
    return ds.samples(epoch, range(ds.num_samples(epoch)))


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("mode", ["concat", "greedy"])
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_bit_flipped_anywhere_in_a_cached_plan_file_never_reaches_a_sample(stores, mode, where, bit):
    config = dataclasses.replace(BASE, packing=dataclasses.replace(BASE.packing, mode=mode, stride=0),
                                 ordering=OrderingConfig(kind="global", seed=9))
    expected = all_samples(PackedDataset.from_config(stores["base"], config, cache_dir=False), 1)
    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_cache_module, "PLAN_BLOCK", 4)              # many blocks, so most are first read mid-epoch
        PackedDataset.from_config(stores["base"], config, cache_dir=cache).plan(1)
        npy, _ = PackedDataset.from_config(stores["base"], config, cache_dir=cache).plan_paths(1)
        data = bytearray(npy.read_bytes())
        at = int(where * len(data))                              # the header included
        data[at] ^= 1 << bit
        npy.write_bytes(bytes(data))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = all_samples(PackedDataset.from_config(stores["base"], config, cache_dir=cache), 1)
    for name in expected:
        check(np.array_equal(got[name], expected[name]), clause="PACK-20",
              what=f"{name} with byte {at} of the cached {mode} plan flipped", repro={"at": at, "bit": bit})


@pytest.mark.clause("PACK-20")
def test_a_block_failing_mid_epoch_recomputes_the_plan_once_and_rewrites_the_cache(stores, monkeypatch, tmp_path):
    monkeypatch.setattr(plan_cache_module, "PLAN_BLOCK", 4)
    config = dataclasses.replace(BASE, packing=dataclasses.replace(BASE.packing, mode="concat", stride=0),
                                 ordering=OrderingConfig(kind="global", seed=9))
    expected = all_samples(PackedDataset.from_config(stores["base"], config, cache_dir=False), 0)
    PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path).plan(0)
    npy, _ = PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path).plan_paths(0)
    data = bytearray(npy.read_bytes())
    data[header_size(data) + 8 * 9] ^= 0x01                    # kept[1] (cum holds 8): block 2, unread at load
    npy.write_bytes(bytes(data))
    ds = PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path)
    check(not computes(ds, 0), clause="PACK-20", what="loading the plan reads only the blocks it needs")
    calls = []
    original = ds.compute_plan
    ds.compute_plan = lambda e: calls.append(e) or original(e)
    with pytest.warns(RuntimeWarning, match="corrupt"):
        got = all_samples(ds, 0)
    del ds.compute_plan   # the wrapper refers to ds (a cycle): ds and its files go when the test ends, not at a gc
    assert_equal(calls, [0], clause="PACK-20", what="recomputations of the damaged plan")
    for name in expected:
        check(np.array_equal(got[name], expected[name]), clause="PACK-20", what=f"{name} after mid-epoch recovery")
    check(not computes(PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path), 0), clause="PACK-20",
          what="the rewritten cache is used by the next dataset")


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("damage", ["half-written npy", "npy without sidecar", "sidecar of another size"])
def test_a_half_written_cache_file_is_never_trusted(stores, tmp_path, damage):
    config = dataclasses.replace(BASE, ordering=OrderingConfig(kind="global", seed=2))
    expected = all_samples(PackedDataset.from_config(stores["base"], config, cache_dir=False), 0)
    PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path).plan(0)
    npy, sidecar = PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path).plan_paths(0)
    data = npy.read_bytes()
    if damage == "half-written npy":
        npy.write_bytes(data[:len(data) // 2])
    elif damage == "npy without sidecar":
        sidecar.unlink()
    else:
        npy.write_bytes(data + b"\0" * 8)
    ds = PackedDataset.from_config(stores["base"], config, cache_dir=tmp_path)
    check(computes(ds, 0), clause="PACK-20", what=f"{damage}: the plan is recomputed")
    got = all_samples(ds, 0)
    for name in expected:
        check(np.array_equal(got[name], expected[name]), clause="PACK-20", what=f"{name} after {damage}")


@pytest.mark.clause("PACK-20", "SPLIT-8")
def test_a_split_and_the_whole_store_never_share_a_cached_plan(tmp_path):
    store = TokenStore.from_token_files([[[1, 2, 3]] * 6, [[4, 5]] * 6], tmp_path / "store", vocab_size=8)
    keys = {split: PackedDataset(store, seq_len=4, split=split, cache_dir=tmp_path / "cache").plan_key(0)
            for split in (None, "train[:50%]", "train[50%:]")}
    assert len(set(keys.values())) == 3, f"plan keys {keys} must differ for the whole store and each split"
