"""impl's mixing, streams and MixedDataset against the reference: the same mixed streams, samples and fingerprints (MIX-*)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import impl.mixed_dataset
import impl.mixing
from conformance import strategies as ls
from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from impl.dataset import PackedDataset, SampleKey
from impl.errors import ConfigError, EmptyDataError, StateError, TopologyError
from impl.interleave import interleave_datasets
from impl.loader import build_dataloader
from impl.mixed_dataset import MixedDataset
from impl.mixing import balance_remaining, mix_plan
from impl.packing import PackPlan
from impl.streams import stream_plan
from reference import mixing as ref_mixing
from reference import streams as ref_streams
from reference.loader import MixtureReferenceLoader
from reference.mixing import STOPPING_STRATEGIES, MixConfig
from reference.packing import MODES, PackingConfig
from reference.resume import MixtureConfig, PipelineConfig, mixture_samples
from reference.streams import StreamConfig

FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mixing")


@st.composite
def mix_options(draw, *, max_sources: int = 4, max_size: int = 40):
    k = draw(st.integers(1, max_sources))
    sizes = draw(st.lists(st.integers(0, max_size), min_size=k, max_size=k))
    kind = draw(st.sampled_from(["round_robin", "weights", "weight_fn"]))
    weights = None
    if kind == "weights":
        weights = tuple(draw(st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0]), min_size=k, max_size=k)))
        assume(any(weights))
    config = MixConfig(weights=weights, stopping=draw(st.sampled_from(STOPPING_STRATEGIES)), seed=draw(ls.seeds))
    return sizes, config, kind == "weight_fn", draw(st.integers(0, 5))


def _reference_or_error(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except ConfigError as exc:
        return None, type(exc)


@pytest.mark.clause("MIX-1")
@pytest.mark.clause("MIX-2")
@pytest.mark.clause("MIX-3")
@pytest.mark.clause("MIX-6")
@pytest.mark.clause("RES-8")
def test_a_refused_mixture_state_names_swapped_sources_a_rebuilt_source_weights_or_seed(two_corpora, workdir):
    web, code = two_corpora
    state = build_dataloader(MixedDataset([web, code], weights=(0.7, 0.3), seed=1), batch_size=2).state_dict()
    rebuilt = PackedDataset.from_config(build_store([[[5000 + 10 * d + t + 1 for t in range(5)] for d in range(11)]],
                                                    workdir), code.config, cache_dir=False)
    cases = [(MixedDataset([code, web], weights=(0.7, 0.3), seed=1),
              ["sources swapped", "the checkpoint's source 0 is this mixture's source 1"]),
             (MixedDataset([web, rebuilt], weights=(0.7, 0.3), seed=1), ["source 1's data differs", "rebuilt"]),
             (MixedDataset([web, code], weights=(0.5, 0.5), seed=1), ["weights differ"]),
             (MixedDataset([web, code], weights=(0.7, 0.3), seed=2), ["mix seed differs"])]
    for mixed, mentions in cases:
        assert_raises_typed(StateError, build_dataloader(mixed, batch_size=2).load_state_dict, state, clause="RES-8",
                            what="a state of another mixture", mentions=["fingerprint", *mentions])


@pytest.mark.clause("MIX-7")
@pytest.mark.clause("MIX-8")
@pytest.mark.clause("MIX-9")
@pytest.mark.clause("MIX-11")
@given(options=mix_options())
def test_mix_plan_equals_the_reference_stream_for_every_option(options):
    sizes, config, dynamic, epoch = options
    expected, expected_error = _reference_or_error(ref_mixing.mix, sizes, config, epoch,
                                                   weight_fn=ref_mixing.balance_remaining if dynamic else None)
    plan, error = _reference_or_error(mix_plan, sizes, config, epoch, weight_fn=balance_remaining if dynamic else None)
    assert_equal(error, expected_error, clause="MIX-5", what="error type", repro={"options": options})
    if plan is not None:
        assert_equal(list(zip(plan.source.tolist(), plan.item.tolist())), expected, clause="MIX-1",
                     what="mixed stream", repro={"options": options})


@pytest.mark.clause("MIX-3")
@given(sizes=st.lists(st.integers(200, 3000), min_size=2, max_size=4), seed=ls.seeds,
       stopping=st.sampled_from(STOPPING_STRATEGIES), block=st.sampled_from([97, 1024, 1 << 18]))
def test_mix_plan_equals_the_reference_on_streams_longer_than_one_phase(sizes, seed, stopping, block):
    weights = tuple(float(i + 1) for i in range(len(sizes)))
    config = MixConfig(weights=weights, stopping=stopping, seed=seed)
    with mock.patch.object(impl.mixing, "_BLOCK", block):   # draws computed in blocks of this many steps
        plan = mix_plan(sizes, config, 3)
    assert_equal(list(zip(plan.source.tolist(), plan.item.tolist())), ref_mixing.mix(sizes, config, 3), clause="MIX-3",
                 what="weighted stream", repro={"sizes": sizes, "seed": seed, "stopping": stopping, "block": block})


def _dataset(corpus, config, workdir):
    try:
        return PackedDataset.from_config(build_store(corpus, workdir), config, cache_dir=False)
    except EmptyDataError:
        return None


@st.composite
def mixtures(draw, *, max_sources: int = 3):
    """(corpora, MixtureConfig) that PackedDataset can express: no buffer order, every source non-empty."""
    k = draw(st.integers(1, max_sources))
    packing = draw(ls.packing_configs())
    alike = draw(st.booleans())   # one packing (MixedDataset's one-fill path) or a mode per source (a fill per source)
    corpora, configs = [], []
    for _ in range(k):
        corpora.append(draw(ls.corpora(max_docs=6, max_len=30)))
        mine = packing if alike else dataclasses.replace(packing, mode=draw(st.sampled_from(MODES)))
        configs.append(PipelineConfig(packing=mine, ordering=draw(ls.ordering_configs(("sequential", "global", "window")))))
    kind = draw(st.sampled_from(["round_robin", "weights", "balance"]))
    weights = tuple(draw(st.lists(st.integers(1, 5), min_size=k, max_size=k))) if kind == "weights" else None
    mixing = MixConfig(weights=weights, stopping=draw(st.sampled_from(STOPPING_STRATEGIES)), seed=draw(ls.seeds))
    return corpora, MixtureConfig(sources=tuple(configs), mixing=mixing,
                                  weight_fn=ref_mixing.balance_remaining if kind == "balance" else None,
                                  allow_repeat=draw(st.booleans()))   # drawn corpora may coincide (MIX-17)


def _mixed(sources, config):
    weight_fn = balance_remaining if config.weight_fn is not None else None
    return MixedDataset(sources, weights=config.mixing.weights, stopping=config.mixing.stopping,
                        seed=config.mixing.seed, weight_fn=weight_fn, end=config.end, allow_repeat=config.allow_repeat)


def _impl_mixture(corpora, config, workdir):
    sources = [_dataset(c, cfg, workdir) for c, cfg in zip(corpora, config.sources)]
    assume(all(s is not None for s in sources))
    reference, refused = _reference_or_error(MixtureReferenceLoader, corpora, config,
                                             data_fingerprints=[s.store.fingerprint for s in sources])
    mixed, error = _reference_or_error(_mixed, sources, config)
    assert_equal(error, refused, clause="MIX-17", what="refusal of sources that repeat a corpus",
                 repro={"corpora": corpora, "allow_repeat": config.allow_repeat})
    assume(mixed is not None)
    return mixed, sources, reference


def _assert_rows_equal(batch, expected, first, what, repro):
    for i, (s, sample) in enumerate(expected):
        got = {name: tuple(batch[name][i].tolist()) for name in FIELDS}
        want = {name: tuple(getattr(sample, name)) for name in FIELDS}
        assert_equal((int(batch["source"][i]), got), (s, want), clause="MIX-13", what=f"{what}: mixed sample {first + i}",
                     repro=repro)


@pytest.mark.clause("MIX-13")
@pytest.mark.clause("MIX-14")
@pytest.mark.clause("MIX-17")
@given(mixture=mixtures(), epoch=st.integers(0, 3), batch_size=st.integers(1, 4), block=st.sampled_from([1, 3, 1024]))
def test_mixed_dataset_samples_and_fingerprint_equal_the_reference_mixture(mixture, epoch, batch_size, block, workdir):
    corpora, config = mixture
    mixed, sources, reference = _impl_mixture(corpora, config, workdir)
    expected = mixture_samples(corpora, config, epoch)
    repro = {"mixture": mixture, "epoch": epoch, "batch_size": batch_size, "block": block}
    assert_equal(mixed.num_samples(epoch), len(expected), clause="MIX-13", what="mixed samples in the epoch",
                 repro=repro)
    assert_equal(mixed.fingerprint, reference.fingerprint, clause="MIX-14", what="fingerprint")
    if not expected:
        return
    _assert_rows_equal(mixed.samples(epoch, range(len(expected))), expected, 0, "the epoch in one call", repro)
    with mock.patch.object(impl.mixed_dataset, "PIECE_BLOCK", block):   # a sequential reader: cached blocks of pieces
        reader = _mixed(sources, config)
    for first in range(0, len(expected), batch_size):
        rows = range(first, min(first + batch_size, len(expected)))
        _assert_rows_equal(reader.samples(epoch, rows), expected[rows.start:rows.stop], first,
                           f"batches of {batch_size}, blocks of {block}", repro)


@pytest.fixture(scope="module")
def two_corpora(workdir):
    web = [[[1000 + 10 * d + t for t in range(7)] for d in range(f * 9, f * 9 + 9)] for f in range(3)]
    code = [[[5000 + 10 * d + t for t in range(5)] for d in range(11)]]
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="chunk"))
    return [PackedDataset.from_config(build_store(c, workdir), config, cache_dir=False) for c in (web, code)]


def _run(dataset, world, batch_size, state=None, steps=-1):
    """Every rank's batches for `steps` steps (or to the epoch's end) and the state after them."""
    loaders = [build_dataloader(dataset, batch_size=batch_size, rank=r, world_size=world) for r in range(world)]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(json.loads(json.dumps(state)))
    iterators = [iter(ld) for ld in loaders]
    rows, done = [], 0
    while steps < 0 or done < steps:
        step = [next(it, None) for it in iterators]
        if step[0] is None:
            break
        for batch in step:
            rows.extend(zip(batch["sample_index"].tolist(), batch["source"].tolist(), batch["source_index"].tolist()))
        done += 1
    return rows, loaders[0].state_dict()


@pytest.mark.clause("MIX-13")
@pytest.mark.parametrize("stopping", STOPPING_STRATEGIES)
def test_mixture_resumed_on_another_world_size_trains_every_sample_of_every_source_once(two_corpora, stopping):
    mixed = MixedDataset(two_corpora, weights=(0.7, 0.3), stopping=stopping, seed=11)
    total = mixed.num_samples(0)
    before, state = _run(mixed, world=2, batch_size=2, steps=3)
    after, _ = _run(mixed, world=3, batch_size=1, state=state)
    covered = 12 + (total - 12) - (total - 12) % 3
    assert_exactly_once([i for i, _, _ in before + after], range(covered), clause="MIX-13",
                        what=f"mixed samples, 2 ranks then 3 ({stopping})")
    plan = mixed.plan(0)
    assert_equal([(s, j) for i, s, j in before + after], [(int(plan.source[i]), int(plan.item[i])) for i, _, _ in before + after],
                 clause="MIX-13", what="source tags of the trained rows")
    if stopping == "all_exhausted":
        sizes = mixed.source_sizes(0)
        for s in range(2):
            assert_exactly_once(plan.item[plan.source == s].tolist(), range(sizes[s]), clause="MIX-7",
                                what=f"source {s} under all_exhausted")


@pytest.mark.clause("MIX-3")
def test_realised_token_shares_match_the_weights_until_a_source_runs_out(workdir):
    big = [[[7 + (d * 13 + t) % 900 for t in range(9)] for d in range(400)]]
    config = PipelineConfig(packing=PackingConfig(seq_len=8, mode="chunk"))
    a = PackedDataset.from_config(build_store(big, workdir), config, cache_dir=False)
    b = PackedDataset.from_config(build_store([f[:] for f in big] + [[[3, 4, 5, 6, 7, 8, 9, 10, 11]]], workdir), config,
                                  cache_dir=False)
    mixed = MixedDataset([a, b], weights=(0.8, 0.2), seed=5)
    plan = mixed.plan(0)
    share = float((plan.source == 0).mean())
    n = len(plan.source)
    check(abs(share - 0.8) <= 4 * math.sqrt(0.16 / n), clause="MIX-3",
          what=f"source 0 holds {share:.3f} of {n} samples (each seq_len tokens), weight 0.8")


@pytest.mark.clause("RES-5")
def test_mixture_workers_and_a_late_resume_need_no_replay(two_corpora, monkeypatch):
    mixed = MixedDataset(two_corpora, weights=(1.0, 1.0), stopping="all_exhausted", seed=3)
    plain = [b["sample_index"].tolist() for b in build_dataloader(mixed, batch_size=3)]
    workers = [b["sample_index"].tolist() for b in build_dataloader(mixed, batch_size=3, num_workers=2)]
    assert_equal(workers, plain, clause="RES-5", what="batches with 2 workers")
    fetched: list[int] = []
    original = PackPlan.batch_pieces

    def spy(self, indices):
        fetched.extend(np.asarray(indices).reshape(-1).tolist())
        return original(self, indices)

    fresh = MixedDataset(two_corpora, weights=(1.0, 1.0), stopping="all_exhausted", seed=3)
    loader = build_dataloader(fresh, batch_size=3)
    monkeypatch.setattr(PackPlan, "batch_pieces", spy)
    total = fresh.num_samples(0)
    loader.load_state_dict({**loader.state_dict(), "consumed": total - total % 3 - 3})
    last = list(loader)
    assert_equal([b["sample_index"].tolist() for b in last], plain[-1:], clause="RES-1", what="the last batch")
    assert_equal(len(fetched), 3, clause="RES-1", what="source samples computed to resume at the last batch")


@pytest.mark.clause("MIX-5")
@pytest.mark.clause("MIX-14")
def test_bad_mixtures_are_refused_with_the_fix(two_corpora, workdir):
    web, code = two_corpora
    for weights, mention in (((1.0, -0.5), "weights[1]=-0.5"), ((float("nan"), 1.0), "nan"), ((0.0, 0.0), "all zero")):
        assert_raises_typed(ConfigError, MixedDataset, [web, code], weights=weights, clause="MIX-5",
                            what=f"weights={weights}", mentions=[mention])
    assert_raises_typed(ConfigError, MixedDataset, [web, code], weights=(1.0,), clause="MIX-14",
                        what="one weight for two sources", mentions=["one weight per source"])
    wrong_length = MixedDataset([web, code], weight_fn=lambda t, sizes, taken, gone: [1.0])
    assert_raises_typed(ConfigError, wrong_length.num_samples, 0, clause="MIX-5", what="weight_fn of the wrong length",
                        mentions=["returned 1 weights", "one weight per source"])
    negative = MixedDataset([web, code], weight_fn=lambda t, sizes, taken, gone: [1.0, -1.0])
    assert_raises_typed(ConfigError, negative.num_samples, 0, clause="MIX-5", what="negative weight_fn weights",
                        mentions=["weights[1]=-1.0"])
    other = PackedDataset.from_config(build_store([[[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]], workdir),
                                      PipelineConfig(packing=PackingConfig(seq_len=8, mode="chunk")), cache_dir=False)
    assert_raises_typed(ConfigError, MixedDataset, [web, other], clause="MIX-14", what="seq_len 4 with seq_len 8",
                        mentions=["seq_len=8", "seq_len=4"])
    assert_raises_typed(ConfigError, MixedDataset, [web, code], stopping="longest", clause="MIX-12",
                        what="unknown stopping", mentions=["'longest'"])
    ab = build_dataloader(MixedDataset([web, code]), batch_size=2)
    ba = build_dataloader(MixedDataset([code, web]), batch_size=2)
    assert_raises_typed(StateError, ba.load_state_dict, ab.state_dict(), clause="MIX-14", what="a state of another mixture",
                        mentions=["fingerprint"])


@pytest.mark.clause("MIX-7")
@pytest.mark.clause("MIX-8")
def test_interleave_datasets_refuses_the_ambiguous_all_exhausted_and_maps_the_seed_systems_names(two_corpora):
    web, code = two_corpora
    assert_raises_typed(ConfigError, interleave_datasets, [web, code], stopping_strategy="all_exhausted",
                        clause="MIX-7", what="all_exhausted without oversample=", mentions=["oversample=True", "Forgather"])
    hf = interleave_datasets([web, code], [0.5, 0.5], seed=1, stopping_strategy="all_exhausted", oversample=True)
    forgather = interleave_datasets([web, code], [0.5, 0.5], seed=1, stopping_strategy="all_exhausted", oversample=False)
    assert_equal((hf.mix_config.stopping, forgather.mix_config.stopping), ("all_exhausted_oversample", "all_exhausted"),
                 clause="MIX-8", what="stopping strategies")
    balanced = interleave_datasets([web, code], seed=2, stopping_strategy="all_exhausted", oversample=False,
                                   balance_remaining_examples=True)
    assert_equal(balanced.weight_fn, balance_remaining, clause="MIX-11", what="balance_remaining_examples")
    assert_equal(mix_plan(balanced.source_sizes(0), balanced.mix_config, 0, weight_fn=balance_remaining).source.tolist(),
                 balanced.plan(0).source.tolist(), clause="MIX-11", what="plan")
    check(SampleKey(0, 0) in [SampleKey(0, 0)], clause="MIX-13", what="keys are impl.dataset's SampleKey")


# ---------------------------------------------------------------- MosaicML-style streams (MIX-15, MIX-16)


@st.composite
def stream_options(draw):
    k = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(0, 30), min_size=k, max_size=k))
    if draw(st.booleans()):
        streams = [StreamConfig(proportion=draw(st.sampled_from([0.1, 0.25, 1.0, 3.0]))) for _ in range(k)]
    else:
        streams = [draw(st.sampled_from([StreamConfig(), StreamConfig(repeat=0.5), StreamConfig(repeat=2.5),
                                         StreamConfig(choose=draw(st.integers(0, 40)))])) for _ in range(k)]
    return sizes, streams, draw(st.one_of(st.none(), st.integers(1, 80))), draw(ls.seeds), draw(st.integers(0, 5))


@pytest.mark.clause("MIX-15")
@given(options=stream_options())
def test_stream_plan_equals_the_reference_streams(options):
    sizes, streams, epoch_size, seed, epoch = options
    expected, expected_error = _reference_or_error(ref_streams.mix_streams, sizes, streams, seed, epoch,
                                                   epoch_size=epoch_size)
    plan, error = _reference_or_error(stream_plan, sizes, streams, seed, epoch, epoch_size=epoch_size)
    assert_equal(error, expected_error, clause="MIX-15", what="error type", repro={"options": options})
    if plan is not None:
        assert_equal(list(zip(plan.source.tolist(), plan.item.tolist())), expected, clause="MIX-15",
                     what="stream epoch", repro={"options": options})


@pytest.mark.clause("MIX-15")
@given(seed=ls.seeds, epoch=st.integers(0, 3), epoch_size=st.one_of(st.none(), st.integers(1, 60)))
def test_mixed_dataset_with_streams_equals_the_reference_mixture(two_corpora, seed, epoch, epoch_size):
    web, code = two_corpora
    streams = (StreamConfig(proportion=0.6), StreamConfig(proportion=0.4)) if epoch_size else \
        (StreamConfig(repeat=0.5), StreamConfig(choose=30))
    mixed = MixedDataset([web, code], seed=seed, streams=streams, epoch_size=epoch_size)
    config = MixtureConfig(sources=(web.config, code.config), mixing=MixConfig(seed=seed), streams=streams,
                           epoch_size=epoch_size)
    assert_equal(mixed.fingerprint, MixtureReferenceLoader([[], []], config, data_fingerprints=[web.store.fingerprint,
                 code.store.fingerprint]).fingerprint, clause="MIX-14", what="fingerprint with streams")
    sizes = mixed.source_sizes(epoch)
    expected = ref_streams.mix_streams(sizes, streams, seed, epoch, epoch_size=epoch_size)
    batch = mixed.samples(epoch, range(mixed.num_samples(epoch)))
    assert_equal(list(zip(batch["source"].tolist(), batch["source_index"].tolist())), expected, clause="MIX-15",
                 what="mixed stream of streams", repro={"seed": seed, "epoch": epoch, "epoch_size": epoch_size})
    for i, (s, j) in enumerate(expected[:5]):
        row = (web, code)[s].samples(epoch, [j])["input_ids"][0]
        check(np.array_equal(batch["input_ids"][i], row), clause="MIX-15", what=f"tokens of mixed sample {i}")


@pytest.mark.clause("MIX-16")
def test_bad_streams_are_refused_with_the_fix(two_corpora):
    web, code = two_corpora
    assert_raises_typed(ConfigError, StreamConfig, proportion=0.5, repeat=2.0, clause="MIX-15",
                        what="proportion and repeat", mentions=["at most one"])
    for bad in (0, -1):
        mixed = MixedDataset([web, code], streams=[StreamConfig(), StreamConfig()], epoch_size=bad)
        assert_raises_typed(ConfigError, mixed.num_samples, 0, clause="MIX-15", what=f"epoch_size={bad}",
                            mentions=[f"epoch_size={bad}"])
    assert_raises_typed(ConfigError, MixedDataset, [web, code], weights=(1.0, 1.0),
                        streams=[StreamConfig(), StreamConfig()], clause="MIX-15", what="weights with streams",
                        mentions=["weights=None"])
    for method in ("stratified", "per_stream", "device_per_stream"):
        assert_raises_typed(ConfigError, MixedDataset, [web, code], streams=[StreamConfig(), StreamConfig()],
                            batching_method=method, clause="MIX-16", what=f"{method} without a batch size",
                            mentions=["global_batch_size="])


@pytest.mark.clause("MIX-16")
def test_numpy_integer_batch_sizes_give_the_mixture_of_the_same_ints_and_bad_ones_the_references_message(two_corpora):
    web, code = two_corpora
    streams = [StreamConfig(), StreamConfig()]
    plain = MixedDataset([web, code], streams=streams, batching_method="device_per_stream", global_batch_size=4,
                         device_batch_size=2, cache_dir=False)
    numpy = MixedDataset([web, code], streams=streams, batching_method="device_per_stream",
                         global_batch_size=np.int64(4), device_batch_size=np.int32(2), cache_dir=False)
    assert_equal((numpy.fingerprint, numpy.plan(0).source.tolist()), (plain.fingerprint, plain.plan(0).source.tolist()),
                 clause="MIX-16", what="the mixture built from numpy integer batch sizes")
    for g, d in ((np.int64(4), np.int64(3)), (np.int64(0), None), (True, None)):
        try:
            ref_streams.check_batching("device_per_stream" if d else "per_stream", g if g is True else int(g),
                                       None if d is None else int(d))
        except ConfigError as exc:
            expected = str(exc)
        assert_raises_typed(ConfigError, MixedDataset, [web, code], streams=streams,
                            batching_method="device_per_stream" if d else "per_stream", global_batch_size=g,
                            device_batch_size=d, clause="MIX-16", what=f"global_batch_size={g!r}, device={d!r}",
                            mentions=[expected])


# ---------------------------------------------------------------- what a mixture refuses (MIX-17, MIX-18), shares (MIX-19)


@pytest.fixture(scope="module")
def thirteen(workdir):
    """A store of 13 documents (of one file) and a second, other store."""
    web = build_store([[[100 + 10 * d + t for t in range(5)] for d in range(13)]], workdir)
    code = build_store([[[5000 + 10 * d + t for t in range(5)] for d in range(7)]], workdir)
    return web, code


def _split(store, split=None):
    return PackedDataset.from_config(store, PipelineConfig(packing=PackingConfig(seq_len=4, mode="chunk"), split=split),
                                     cache_dir=False)


@pytest.mark.clause("MIX-17")
def test_a_source_given_twice_is_refused_naming_both_indices_and_the_fix(thirteen):
    web, code = thirteen
    a, other = _split(web), _split(code)
    assert_raises_typed(ConfigError, MixedDataset, [a, a], clause="MIX-17", what="one dataset twice",
                        mentions=["sources[0] and sources[1] are the same source", "13 documents", "allow_repeat=True"])
    assert_raises_typed(ConfigError, MixedDataset, [a, other, _split(web)], weights=(1.0, 2.0, 3.0), clause="MIX-17",
                        what="two datasets over one store", mentions=["sources[0] and sources[2]", "drop sources[2]"])
    assert_raises_typed(ConfigError, interleave_datasets, [other, a, a], clause="MIX-17", what="interleave_datasets",
                        mentions=["sources[1] and sources[2]"])


@pytest.mark.clause("MIX-17")
def test_overlapping_splits_of_one_store_are_refused_naming_the_shared_rows(thirteen):
    web, code = thirteen
    head, tail = _split(web, "train[:60%]"), _split(web, "train[50%:]")
    assert_raises_typed(ConfigError, MixedDataset, [_split(code), head, tail], clause="MIX-17", what="overlapping splits",
                        mentions=["sources[1] (rows [0, 8))", "sources[2] (rows [6, 13))", "rows [6, 8) (2 documents)",
                                  "make the splits disjoint"])
    assert_raises_typed(ConfigError, MixedDataset, [head, _split(web)], clause="MIX-17", what="a split and its store",
                        mentions=["rows [0, 8) (8 documents)"])
    disjoint = MixedDataset([head, _split(web, "train[60%:]")])
    check(disjoint.num_samples(0) > 0, clause="MIX-17", what="disjoint splits of one store are a mixture")


@pytest.mark.clause("MIX-17")
@pytest.mark.clause("MIX-14")
def test_allow_repeat_accepts_a_repeat_and_leaves_the_fingerprint_as_the_reference_computes_it(thirteen):
    web, _ = thirteen
    head, tail = _split(web, "train[:60%]"), _split(web, "train[50%:]")
    repeated = MixedDataset([head, tail], allow_repeat=True)
    config = MixtureConfig(sources=(head.config, tail.config))
    assert_equal(repeated.fingerprint, MixtureReferenceLoader([[], []], config, data_fingerprints=[web.fingerprint] * 2)
                 .fingerprint, clause="MIX-14", what="fingerprint of a mixture with allow_repeat=True")
    disjoint = [head, _split(web, "train[60%:]")]
    assert_equal(MixedDataset(disjoint, allow_repeat=True).fingerprint, MixedDataset(disjoint).fingerprint,
                 clause="MIX-17", what="allow_repeat=True on a mixture that does not repeat")
    twice = MixedDataset([head, head], allow_repeat=True, stopping="all_exhausted")
    plan = twice.plan(0)
    assert_equal(np.bincount(plan.source).tolist(), [head.num_samples(0)] * 2, clause="MIX-17",
                 what="a repeat asked for trains the source twice")
    assert_raises_typed(ConfigError, MixedDataset, [head, tail], allow_repeat="yes", clause="MIX-17",
                        what="allow_repeat='yes'", mentions=["True or False"])


@pytest.mark.clause("MIX-18")
@pytest.mark.parametrize("stopping", STOPPING_STRATEGIES)
def test_a_zero_weight_is_refused_at_construction_with_drop_the_source_as_the_fix(two_corpora, stopping):
    web, code = two_corpora
    error = assert_raises_typed(ConfigError, MixedDataset, [web, code], weights=(0, 1), stopping=stopping,
                                clause="MIX-18", what=f"weights=(0, 1) under {stopping}",
                                mentions=["weights[0]=0", "never drawn", "drop sources[0]"])
    check("all_exhausted'" not in str(error).split("drop")[1], clause="MIX-18",
          what="the fix offers stopping='all_exhausted', which refuses a zero weight too")
    assert_raises_typed(ConfigError, interleave_datasets, [web, code], [1.0, 0.0], clause="MIX-18",
                        what="interleave_datasets probabilities [1, 0]", mentions=["weights[1]=0"])
    dynamic = MixedDataset([web, code], weights=(0, 1), stopping=stopping, weight_fn=balance_remaining)
    check(dynamic.num_samples(0) > 0, clause="MIX-18", what="a weight_fn overrides the static weights")


@pytest.mark.clause("MIX-18")
def test_dropping_a_zero_weight_source_trains_the_same_samples_under_first_exhausted(two_corpora):
    web, code = two_corpora
    config = MixConfig(weights=(0.0, 0.4, 0.6), seed=3)
    with_zero = mix_plan([web.num_samples(0), web.num_samples(0), code.num_samples(0)], config, 0)
    without = MixedDataset([web, code], weights=(0.4, 0.6), seed=3).plan(0)
    assert_equal((with_zero.source - 1).tolist(), without.source.tolist(), clause="MIX-18",
                 what="sources of the plan with a zero-weight first source, against the mixture without it")
    assert_equal(with_zero.item.tolist(), without.item.tolist(), clause="MIX-18", what="items")


@pytest.mark.clause("MIX-19")
@pytest.mark.parametrize("seed", [0, 5])
def test_weights_are_the_share_under_first_exhausted_and_sizes_are_under_all_exhausted(workdir, seed):
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="chunk"))
    big = PackedDataset.from_config(build_store([[[7 + (d * 13 + t) % 900 for t in range(4)] for d in range(400)]],
                                                workdir), config, cache_dir=False)
    small = PackedDataset.from_config(build_store([[[3000 + d * 4 + t for t in range(4)] for d in range(100)]], workdir),
                                      config, cache_dir=False)
    sizes = (big.num_samples(0), small.num_samples(0))
    first = MixedDataset([big, small], weights=(0.5, 0.5), stopping="first_exhausted", seed=seed).plan(0)
    every = MixedDataset([big, small], weights=(0.5, 0.5), stopping="all_exhausted", seed=seed).plan(0)
    share, n = float((first.source == 0).mean()), len(first.source)
    check(abs(share - 0.5) <= 4 * math.sqrt(0.25 / n), clause="MIX-19",
          what=f"first_exhausted: source 0 holds {share:.3f} of {n} samples, its weight share 0.5")
    assert_equal(float((every.source == 0).mean()), sizes[0] / sum(sizes), clause="MIX-19",
                 what=f"all_exhausted: source 0's share of {sizes} is its size share, not its weight")
    ran_out = int(np.flatnonzero(every.source == 1)[-1]) + 1
    assert_equal(every.source[:ran_out].tolist(), first.source[:ran_out].tolist(), clause="MIX-19",
                 what="all_exhausted draws by weight until source 1 runs out")
    check(bool((every.source[ran_out:] == 0).all()), clause="MIX-19", what="then source 0 alone fills the epoch")


# --------------------------------------------------------------------------- a weight_fn that weights exhausted sources


def _keeps_weighting_every_source(step, sizes, taken, exhausted):
    """A user's weight_fn that ignores ``exhausted``: source 0 keeps the largest weight after it runs out.

    all_exhausted makes exactly ``sum(sizes)`` draws; a step past them would
    be a stream that restarts a source and never ends, so it fails here.
    """
    if step >= sum(sizes):
        raise AssertionError(f"weight_fn called at step {step}, past the {sum(sizes)} draws of all_exhausted")
    return [10.0, 3.0, 2.0]


@pytest.mark.clause("MIX-4")
@pytest.mark.clause("MIX-7")
@pytest.mark.parametrize("seed", [5, 11])
def test_a_weight_fn_weighting_an_exhausted_source_draws_among_live_sources_by_their_weights_under_all_exhausted(seed):
    """Fault caught: a weight_fn's weights normalised over all of them, the exhausted sources' included.

    Only ``balance_remaining`` (which gives exhausted sources 0) was tested.
    Here source 0 (20 items) runs out early but keeps weight 10; afterwards
    sources 1 and 2 must share the draws 3 : 2 (60 % to source 1), as the
    reference does bit for bit; normalised by 15 instead of 5 they would get
    20 % and 80 % (the fall-back to the last positive weight takes the rest).
    """
    sizes = [20, 4000, 4000]
    config = MixConfig(stopping="all_exhausted", seed=seed)
    plan = mix_plan(sizes, config, 0, weight_fn=_keeps_weighting_every_source)
    got = list(zip(plan.source.tolist(), plan.item.tolist()))
    repro = {"sizes": sizes, "seed": seed}
    assert_equal(got, ref_mixing.mix(sizes, config, 0, weight_fn=_keeps_weighting_every_source), clause="MIX-4",
                 what="mixed stream", repro=repro)
    assert_exactly_once(got, [(s, j) for s, n in enumerate(sizes) for j in range(n)], clause="MIX-7",
                        what="(source, item) pairs", repro=repro)
    sources = [s for s, _ in got]
    gone_0 = max(t for t, s in enumerate(sources) if s == 0)
    gone_1_or_2 = min(max(t for t, s in enumerate(sources) if s == k) for k in (1, 2))
    both_live = sources[gone_0 + 1:gone_1_or_2 + 1]
    share = both_live.count(1) / len(both_live)
    check(len(both_live) > 5000 and abs(share - 0.6) < 0.03, clause="MIX-4",
          what=f"source 1 got {share:.3f} of the {len(both_live)} draws after source 0 ran out, not 3 / (3 + 2) = 0.6",
          repro=repro)


class _EmptySource:
    """A map-style source with no sample (a filtered-out corpus), with the fingerprint a mixture needs."""

    fingerprint = "e" * 64

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index):
        raise IndexError(index)


@pytest.mark.clause("MIX-9")
def test_an_empty_source_under_first_exhausted_is_named_in_the_error_not_blamed_on_the_batch_size(two_corpora):
    web, _ = two_corpora
    for weights in (None, (0.5, 0.5)):
        mixed = MixedDataset([web, _EmptySource()], weights=weights)
        error = assert_raises_typed(EmptyDataError, build_dataloader, mixed, batch_size=2, clause="MIX-9",
                                    what=f"an empty sources[1] under first_exhausted, weights={weights}",
                                    mentions=["sources[1] (_EmptySource)", "first_exhausted", "stopping='all_exhausted'",
                                              "drop sources[1]"])
        check("batch_size" not in str(error), clause="MIX-9", what=f"the batch size blamed: {error}")
        check("weight 0" not in str(error), clause="MIX-18", what=f"a static weight of 0 is refused, yet offered: {error}")
    with_fn = MixedDataset([web, _EmptySource()], weight_fn=lambda step, sizes, taken, exhausted: [1.0, 1.0])
    assert_raises_typed(EmptyDataError, build_dataloader, with_fn, batch_size=2, clause="MIX-9",
                        what="an empty source weighted by a weight_fn", mentions=["make weight_fn give it weight 0"])
    for fixed in (MixedDataset([web], weights=(1.0,)), MixedDataset([web, _EmptySource()], stopping="all_exhausted"),
                  MixedDataset([web, _EmptySource()], weight_fn=lambda step, sizes, taken, exhausted: [1.0, 0.0])):
        check(len(build_dataloader(fixed, batch_size=2)) > 0, clause="MIX-9", what="a fix the message offers")


# ---------------------------------------------------------------- batching methods (MIX-16, MIX-20, MIX-21)

BATCHING = ("stratified", "per_stream", "device_per_stream")


@st.composite
def batching_options(draw):
    sizes, streams, epoch_size, seed, epoch = draw(stream_options())
    device = draw(st.integers(1, 4))
    return sizes, streams, epoch_size, seed, epoch, draw(st.sampled_from(BATCHING)), device * draw(st.integers(1, 3)), \
        device


@pytest.mark.clause("MIX-20", "MIX-21")
@given(options=batching_options())
def test_stream_plan_equals_the_reference_under_every_batching_method(options):
    sizes, streams, epoch_size, seed, epoch, method, glob, device = options
    kw = dict(epoch_size=epoch_size, batching_method=method, global_batch_size=glob,
              device_batch_size=device if method == "device_per_stream" else None)
    expected, expected_error = _reference_or_error(ref_streams.mix_streams, sizes, streams, seed, epoch, **kw)
    plan, error = _reference_or_error(stream_plan, sizes, streams, seed, epoch, **kw)
    assert_equal(error, expected_error, clause="MIX-20", what="error type", repro={"options": options})
    if plan is not None:
        assert_equal(list(zip(plan.source.tolist(), plan.item.tolist())), expected, clause=method,
                     what="composed epoch", repro={"options": options})


@pytest.mark.clause("MIX-16", "MIX-21")
def test_per_stream_global_batches_hold_one_stream_and_resume_exactly_on_another_world_size(two_corpora):
    def mixed(**kw):
        return MixedDataset(two_corpora, streams=[StreamConfig(), StreamConfig()], seed=3,
                            batching_method="per_stream", **{"global_batch_size": 4, **kw})

    whole, _ = _run(mixed(), world=2, batch_size=2)
    check(len(whole) >= 40 and len(whole) % 4 == 0, clause="MIX-21", what=f"an epoch of {len(whole)} samples")
    steps = [whole[t:t + 4] for t in range(0, len(whole), 4)]
    check(all(len({s for _, s, _ in step}) == 1 for step in steps), clause="MIX-21",
          what="every global batch of 2 ranks x 2 holds one stream")
    check({step[0][1] for step in steps} == {0, 1}, clause="MIX-21", what="both streams have batches")
    assert_equal([i for i, _, _ in whole], list(range(len(whole))), clause="MIX-16", what="the steps follow PART-2")
    before, state = _run(mixed(), world=2, batch_size=2, steps=3)
    after, _ = _run(mixed(), world=4, batch_size=1, state=state)
    assert_equal(before + after, whole, clause="MIX-16", what="2 ranks x 2 then 4 ranks x 1: the uninterrupted epoch")
    assert_raises_typed(TopologyError, build_dataloader, mixed(), batch_size=4, world_size=2, rank=0,
                        clause="MIX-16", what="8 per step for a mixture of 4",
                        mentions=["= 8", "global_batch_size=4", "batch_size=2 on these 2"])
    assert_raises_typed(StateError, build_dataloader(mixed(global_batch_size=8), batch_size=4, world_size=2,
                                                     rank=0).load_state_dict, state, clause="MIX-16",
                        what="a state of global_batch_size=4 in a mixture of 8", mentions=["streams differ"])


@pytest.mark.clause("MIX-16", "MIX-21")
def test_device_per_stream_gives_each_rank_one_stream_and_refuses_another_device_batch(two_corpora):
    mixed = MixedDataset(two_corpora, streams=[StreamConfig(), StreamConfig()], seed=5,
                         batching_method="device_per_stream", global_batch_size=4, device_batch_size=2)
    loaders = [build_dataloader(mixed, batch_size=2, rank=r, world_size=2) for r in range(2)]
    mixes = 0
    for batches in zip(*loaders):
        per_rank = [set(b["source"].tolist()) for b in batches]
        check(all(len(s) == 1 for s in per_rank), clause="MIX-21", what=f"a rank's batch mixes streams: {per_rank}")
        mixes += per_rank[0] != per_rank[1]
    check(mixes > 0, clause="MIX-21", what="some step gives the two ranks different streams")
    assert_raises_typed(TopologyError, build_dataloader, mixed, batch_size=1, world_size=4, rank=0, clause="MIX-16",
                        what="device batch 1 of a mixture of device batches of 2",
                        mentions=["batch_size=1", "device_batch_size=2"])
    replicated = build_dataloader(mixed, batch_size=2, world_size=4, rank=3, replication=2)
    check(all(len(set(b["source"].tolist())) == 1 for b in replicated), clause="MIX-16",
          what="4 ranks in 2 replicated groups of batch 2 keep the composed device batches")


@pytest.mark.clause("MIX-20")
def test_stratified_mixed_dataset_gives_every_global_batch_its_stream_counts(two_corpora):
    mixed = MixedDataset(two_corpora, streams=[StreamConfig(proportion=0.75), StreamConfig(proportion=0.25)], seed=2,
                         batching_method="stratified", global_batch_size=4, epoch_size=40)
    whole, _ = _run(mixed, world=2, batch_size=2)
    assert_equal(len(whole), 40, clause="MIX-20", what="10 whole batches of 3 + 1")
    for t in range(0, 40, 4):
        assert_equal(sorted(s for _, s, _ in whole[t:t + 4]), [0, 0, 0, 1], clause="MIX-20",
                     what=f"global batch {t // 4}")

