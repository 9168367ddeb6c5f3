"""A mixture's epoch plan cached on disk: read back bit for bit, keyed by every input that changes it, never trusted blindly.

``MixedDataset.plan(e)`` is ``mix_plan`` / ``stream_plan`` of the sources'
sizes; ``impl.plan_cache`` writes it once and every later construction (a
resuming process, a DataLoader worker) reads it. Computations are counted
through the two functions ``impl.mixed_dataset`` calls, never by timing.
"""

from __future__ import annotations

import inspect
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import impl.mixed_dataset
from conformance import strategies as ls
from conformance.assertions import assert_equal, check
from conformance.impl_tests.test_dataset import make_store
from impl.dataset import PackedDataset
from impl.loader import build_dataloader
from impl.mixed_dataset import MixedDataset
from impl.mixing import balance_remaining, mix_plan
from impl.streams import stream_counts, stream_plan
from reference.mixing import STOPPING_STRATEGIES, MixConfig
from reference.streams import StreamConfig

pytestmark = pytest.mark.clause("MIX-13")


class Toy:
    """A map-style source of ``n`` one-field samples whose ``fingerprint`` names it (enough for a mixture)."""

    def __init__(self, n: int, name: str) -> None:
        self.n, self.fingerprint = n, (name * 64)[:64]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.full(3, i, dtype=np.int64)}


class Counted:
    """Counts the plans ``impl.mixed_dataset`` computes (its ``mix_plan`` and ``stream_plan``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name, fn in (("mix_plan", mix_plan), ("stream_plan", stream_plan)):
            monkeypatch.setattr(impl.mixed_dataset, name, self._wrap(fn))

    def _wrap(self, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return fn(*args, **kwargs)
        return counted


def fresh(sizes: list[int], kwargs: dict[str, Any], epoch: int) -> Any:
    """The plan computed directly, with no dataset and no cache."""
    if kwargs.get("streams") is not None:
        return stream_plan(sizes, kwargs["streams"], kwargs.get("seed", 0), epoch,
                           **{k: kwargs[k] for k in ("epoch_size", "batching_method", "global_batch_size",
                                                     "device_batch_size") if k in kwargs})
    config = MixConfig(weights=kwargs.get("weights"), stopping=kwargs.get("stopping", "first_exhausted"),
                       seed=kwargs.get("seed", 0))
    return mix_plan(sizes, config, epoch, weight_fn=kwargs.get("weight_fn"))


def mixture(sizes: list[int], cache: Path | bool, **kwargs: Any) -> MixedDataset:
    return MixedDataset([Toy(n, "abcdef"[i]) for i, n in enumerate(sizes)], cache_dir=cache, **kwargs)


@st.composite
def mixtures(draw: Any) -> tuple[list[int], dict[str, Any], int]:
    k = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 300), min_size=k, max_size=k))
    kind = draw(st.sampled_from(["round_robin", "weights", "balance", "streams"]))
    kwargs: dict[str, Any] = {"seed": draw(ls.seeds)}
    if kind == "streams":
        method = draw(st.sampled_from(["random", "stratified", "per_stream", "device_per_stream"]))
        kwargs.update(streams=[StreamConfig(repeat=draw(st.sampled_from([0.5, 1.0, 2.0]))) for _ in sizes],
                      batching_method=method)
        if method == "stratified":   # every stream's share of a global batch must round to at least one slot
            counts = [c for c in stream_counts(sizes, kwargs["streams"]) if c]
            kwargs["global_batch_size"] = (-(-sum(counts) // min(counts)) if counts else 1) + draw(st.integers(0, 5))
        elif method == "per_stream":
            kwargs["global_batch_size"] = draw(st.integers(1, 12))
        elif method == "device_per_stream":
            kwargs["device_batch_size"] = draw(st.integers(1, 3))
            kwargs["global_batch_size"] = kwargs["device_batch_size"] * draw(st.integers(1, 3))
    else:
        kwargs["stopping"] = draw(st.sampled_from(STOPPING_STRATEGIES))
        if kind == "weights":
            kwargs["weights"] = tuple(draw(st.lists(st.sampled_from([0.25, 1.0, 2.5, 7.0]), min_size=k, max_size=k)))
        elif kind == "balance":
            kwargs["weight_fn"] = balance_remaining
    return sizes, kwargs, draw(st.integers(0, 3))


@given(case=mixtures())
def test_a_cached_mixture_plan_is_read_back_bit_for_bit_equal_to_the_freshly_computed_one(case):
    sizes, kwargs, epoch = case
    expected = fresh(sizes, kwargs, epoch)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mixture(sizes, Path(tmp), **kwargs).plan(epoch)   # computes it and writes the cache
        counted = Counted(mp)
        got = mixture(sizes, Path(tmp), **kwargs).plan(epoch)
    assert_equal(counted.calls, 0, clause="MIX-13", what="plans computed by a second construction",
                 repro={"sizes": sizes, **kwargs, "epoch": epoch})
    for name in ("source", "item"):
        array = getattr(got, name)
        check(array.dtype == np.int64 and array.tobytes() == getattr(expected, name).tobytes(), clause="MIX-13",
              what=f"the cached plan's {name} array, bit for bit", repro={"sizes": sizes, **kwargs, "epoch": epoch})


def test_a_second_mixture_of_packed_datasets_reads_the_plan_cached_beside_its_first_store(tmp_path, monkeypatch):
    corpus = [[[100 + 10 * d + t for t in range(5)] for d in range(12)]]
    web, code = (PackedDataset(make_store(corpus if i else [[[7] * 4] * 9], tmp_path / name), seq_len=3,
                               packing="chunk", cache_dir=False) for i, name in enumerate(("web", "code")))
    args = dict(weights=(1.0, 2.0), stopping="all_exhausted", seed=5)
    first = build_dataloader(MixedDataset([web, code], **args), batch_size=2)
    state = first.state_dict()
    batches = [b["sample_index"].tolist() for b in first]
    counted = Counted(monkeypatch)
    loader = build_dataloader(MixedDataset([web, code], **args), batch_size=2)
    loader.load_state_dict({**state, "consumed": 4})
    assert_equal([b["sample_index"].tolist() for b in loader], batches[2:], clause="RES-1",
                 what="batches after a resume from the cached plan")
    assert_equal(counted.calls, 0, clause="MIX-13", what="plans computed by the resuming mixture")
    written = sorted(p.suffix for p in (tmp_path / "web").rglob("plan-*") if p.suffix in (".npy", ".json"))
    assert_equal(written, [".json", ".npy"], clause="MIX-13", what="files cached in the first store's .plans")
    MixedDataset([web, code], cache_dir=False, **args).plan(0)
    MixedDataset([web, code], weight_fn=lambda t, sizes, taken, gone: [1.0, 1.0], stopping="all_exhausted").plan(0)
    MixedDataset([web, code], weight_fn=lambda t, sizes, taken, gone: [1.0, 1.0], stopping="all_exhausted").plan(0)
    assert_equal(counted.calls, 3, clause="MIX-13",
                 what="plans computed with cache_dir=False, and with a weight_fn whose code the key cannot name")


def _damage(npy: Path, sidecar: Path, how: str) -> None:
    data = bytearray(npy.read_bytes())
    if how == "flipped value byte":
        data[-3] ^= 0x10
        npy.write_bytes(bytes(data))
    elif how == "truncated values":
        npy.write_bytes(bytes(data[:-8]))
    elif how == "header only":
        npy.write_bytes(bytes(data[:128]))
    elif how == "truncated sidecar":
        sidecar.write_bytes(sidecar.read_bytes()[:40])
    elif how == "no sidecar":
        sidecar.unlink()
    elif how == "item out of range, checksums redone":   # a well-formed file naming samples the sources lack
        meta = json.loads(sidecar.read_bytes())
        header = len(data) - 8 * meta["values"]
        values = np.frombuffer(bytes(data[header:]), dtype=np.int64).copy()
        values[-1] = 10_000
        npy.write_bytes(bytes(data[:header]) + values.tobytes())
        from impl._crc import crc32
        from impl.plan_cache import PLAN_BLOCK
        meta["block_crc32"] = [crc32(values[i:i + PLAN_BLOCK].data) for i in range(0, len(values), PLAN_BLOCK)]
        sidecar.write_text(json.dumps(meta))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["flipped value byte", "truncated values", "header only", "truncated sidecar",
                                 "no sidecar", "item out of range, checksums redone"])
def test_a_damaged_cached_mixture_plan_is_rebuilt_and_rewritten_never_served(tmp_path, monkeypatch, how):
    sizes, kwargs = [40, 25, 7], dict(weights=(1.0, 2.0, 0.5), stopping="all_exhausted_oversample", seed=9)
    expected = fresh(sizes, kwargs, 1)
    first = mixture(sizes, tmp_path, **kwargs)
    first.plan(1)
    paths = first._plan_cache.paths(first.plan_key(1, sizes))
    assert paths is not None and paths[0].exists() and paths[1].exists()
    _damage(*paths, how)
    counted = Counted(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a failed CRC warns; the others rebuild silently
        got = mixture(sizes, tmp_path, **kwargs).plan(1)
    check(got.source.tobytes() == expected.source.tobytes() and got.item.tobytes() == expected.item.tobytes(),
          clause="MIX-13", what=f"the plan after damage ({how}) equals the computed one", repro={"how": how})
    assert_equal(counted.calls, 1, clause="MIX-13", what=f"plans computed after damage ({how})")
    mixture(sizes, tmp_path, **kwargs).plan(1)
    assert_equal(counted.calls, 1, clause="MIX-13", what=f"plans computed once the damaged file ({how}) was rewritten")


BASE_SIZES = [30, 20]
BASE = dict(weights=(1.0, 2.0), stopping="all_exhausted", seed=3)
STREAMS = dict(streams=[StreamConfig(), StreamConfig()], seed=3)
# Every input that changes a plan, as (what, sizes, MixedDataset kwargs, epoch), each differing from its base in it.
FLIPS: list[tuple[str, list[int], dict[str, Any], int]] = [
    ("sizes", [30, 21], BASE, 0),
    ("epoch", BASE_SIZES, BASE, 1),
    ("weights", BASE_SIZES, dict(BASE, weights=(2.0, 1.0)), 0),
    ("stopping", BASE_SIZES, dict(BASE, stopping="first_exhausted"), 0),
    ("seed", BASE_SIZES, dict(BASE, seed=4), 0),
    ("weight_fn", BASE_SIZES, dict(BASE, weights=None, weight_fn=balance_remaining), 0),
    ("streams", BASE_SIZES, dict(STREAMS, streams=[StreamConfig(repeat=2.0), StreamConfig()]), 0),
    ("epoch_size", BASE_SIZES, dict(STREAMS, epoch_size=40), 0),
    ("batching_method", BASE_SIZES, dict(STREAMS, batching_method="per_stream", global_batch_size=4), 0),
    ("global_batch_size", BASE_SIZES, dict(STREAMS, batching_method="per_stream", global_batch_size=2), 0),
    ("device_batch_size", BASE_SIZES, dict(STREAMS, batching_method="device_per_stream", global_batch_size=4,
                                           device_batch_size=1), 0),
]
PLAN_NEUTRAL = {
    "end": "the end policy is the sampler's, after the plan",
    "allow_repeat": "it lets two sources read the same documents; it changes no sample",
    "cache_dir": "where the plan is cached, not what it holds",
    "predownload": "how far ahead remote files are downloaded; it changes no sample",
}


def test_every_mixed_dataset_argument_is_either_a_key_input_or_declared_plan_neutral():
    keyed = {"sources", "weights", "stopping", "seed", "weight_fn", "epoch", "streams", "epoch_size",
             "batching_method", "global_batch_size", "device_batch_size"}
    assert_equal(sorted(keyed - {what for what, *_ in FLIPS} - {"sources"}), [], clause="MIX-13",
                 what="keyed arguments without a flip in FLIPS")
    arguments = set(inspect.signature(MixedDataset.__init__).parameters) - {"self"}
    assert_equal(sorted(arguments - keyed - set(PLAN_NEUTRAL)), [], clause="MIX-13",
                 what="MixedDataset arguments neither in the mixture plan's key nor declared plan-neutral")


def test_each_input_of_a_mixture_plan_names_its_own_cache_entry(tmp_path, monkeypatch):
    cases = [("base", BASE_SIZES, BASE, 0), ("streams base", BASE_SIZES, STREAMS, 0), *FLIPS]
    for _, sizes, kwargs, epoch in cases:
        mixture(sizes, tmp_path, **kwargs).plan(epoch)
    counted = Counted(monkeypatch)
    for what, sizes, kwargs, epoch in cases:   # each was cached by the loop above, under its own key
        got = mixture(sizes, tmp_path, **kwargs).plan(epoch)
        expected = fresh(sizes, kwargs, epoch)
        check(got.source.tobytes() == expected.source.tobytes() and got.item.tobytes() == expected.item.tobytes(),
              clause="MIX-13", what=f"the cached plan after changing {what}")
    assert_equal(counted.calls, 0, clause="MIX-13", what="plans computed on a second pass over the cached cases")
    keys = [mixture(s, False, **k).plan_key(e, s) for _, s, k, e in cases]
    assert_equal(len(set(keys)), len(cases), clause="MIX-13", what="distinct cache keys over the cases")
    other = MixedDataset([Toy(30, "x"), Toy(20, "b")], cache_dir=tmp_path, **BASE)   # same sizes, other data
    other.plan(0)
    assert_equal(counted.calls, 1, clause="MIX-13", what="plans computed for a source of other data, same size")
    assert_equal(mixture(BASE_SIZES, False, **dict(BASE, end="pad", allow_repeat=True, predownload=0)).plan_key(
                 0, BASE_SIZES),
                 keys[0], clause="MIX-13", what="the key with only plan-neutral arguments changed")


def test_the_key_holds_no_topology_and_a_new_format_version_misses(monkeypatch):
    from impl.plan_cache import mix_plan_key
    args: dict[str, Any] = dict(source_fingerprints=["a" * 64], source_sizes=[3], epoch=0, weights=None,
                                stopping="all_exhausted", seed=0, weight_fn=None, streams=None, epoch_size=None,
                                batching_method="random", global_batch_size=None, device_batch_size=None)
    key = mix_plan_key(**args)
    params = set(inspect.signature(mix_plan_key).parameters)
    check(not params & {"world_size", "rank", "batch_size", "num_workers", "replication"}, clause="MIX-13",
          what="the mixture plan's key names no topology")
    monkeypatch.setattr("impl.plan_cache.MIX_PLAN_VERSION", 2)
    check(mix_plan_key(**args) != key, clause="MIX-13", what="a new format version gives another key")
