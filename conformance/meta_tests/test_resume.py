"""Meta tests: the reference pipeline obeys its own resume contract (RES-*)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import ConfigError, StateError, TopologyError
from reference.loader import MixtureReferenceLoader, ReferenceLoader, global_steps, resume_mismatch, take
from reference.mixing import STOPPING_STRATEGIES, MixConfig, balance_remaining
from reference.packing import PackingConfig
from reference.partition import PartitionConfig, steps_in_epoch
from reference.resume import (
    MixtureConfig,
    PipelineConfig,
    Topology,
    canonical_json,
    corpus_fingerprint,
    epoch_samples,
    make_state,
    mixture_fingerprint,
    mixture_samples,
    pipeline_fingerprint,
)
from reference.streams import StreamConfig


@pytest.mark.clause("RES-1")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(), topology=ls.topologies(max_world=3))
def test_reference_resumes_at_every_position_across_epoch_boundaries(corpus, config, topology):
    make = lambda: ReferenceLoader(corpus, config, topology)
    horizon = 2 * len(make()) + 3
    mismatch = resume_mismatch(make, range(horizon + 1), horizon)
    check(mismatch is None, clause="RES-1", what=f"resume at step {mismatch and mismatch[0]} diverged at step "
          f"{mismatch and mismatch[1]}", repro={"corpus": corpus, "config": config, "topology": topology})


@pytest.mark.clause("RES-1")
def test_resume_mismatch_detects_a_loader_that_forgets_its_position():
    corpus = [[[1, 2, 3, 4], [5, 6, 7, 8, 9]]]
    config = PipelineConfig(packing=PackingConfig(seq_len=2, mode="concat"))

    class Forgetful(ReferenceLoader):
        def load_state_dict(self, state):
            super().load_state_dict(dict(state, consumed=0))

    check(resume_mismatch(lambda: Forgetful(corpus, config), [2], 6) == (2, 2), clause="RES-1",
          what="a loader restarting from 0 was not caught")


@pytest.mark.clause("RES-2")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(), k=st.integers(0, 10))
def test_reference_state_is_small_json_of_epoch_and_consumed(corpus, config, k):
    loader = ReferenceLoader(corpus, config)
    take(loader, k)
    state = loader.state_dict()
    check(json.loads(json.dumps(state)) == state, clause="RES-2", what="JSON round trip")
    assert_equal(sorted(state), ["consumed", "epoch", "fingerprint", "format", "parts", "version"], clause="RES-2",
                 what="state keys")
    check(len(json.dumps(state)) < 1024, clause="RES-2", what="state size")


@pytest.mark.clause("RES-3")
def test_reference_refuses_foreign_future_mismatched_and_overlong_states():
    corpus = [[[1, 2, 3, 4, 5]]]
    config = PipelineConfig(packing=PackingConfig(seq_len=2))
    loader = ReferenceLoader(corpus, config)
    good = loader.state_dict()
    cases = [({"epoch": 0}, "format"), (dict(good, version=3), "version"), (dict(good, fingerprint="0" * 64), "fingerprint"),
             (dict(good, consumed=99), "consumed"), (dict(good, epoch=-1), "epoch")]
    for state, word in cases:
        assert_raises_typed(StateError, loader.load_state_dict, state, clause="RES-3", what=f"state {state}",
                            mentions=[word])
    other = ReferenceLoader(corpus, PipelineConfig(packing=PackingConfig(seq_len=3)))
    assert_raises_typed(StateError, other.load_state_dict, good, clause="RES-3", what="state of another config",
                        mentions=["fingerprint"])
    check(corpus_fingerprint(corpus) != corpus_fingerprint([[[1, 2, 3, 4, 6]]]), clause="RES-3",
          what="fingerprint ignores a changed token")


@pytest.mark.clause("RES-3")
def test_topology_out_of_range_is_refused():
    assert_raises_typed(TopologyError, Topology, world_size=2, rank=2, clause="RES-3", what="rank 2 of 2",
                        mentions=["rank"])


@pytest.mark.clause("RES-4")
@given(corpus=ls.corpora(max_docs=12), config=ls.pipeline_configs(), before=ls.topologies(replication=False),
       after=ls.topologies(replication=False), k=st.integers(0, 5))
def test_reference_elastic_resume_covers_each_sample_once(corpus, config, before, after, k):
    config = PipelineConfig(ordering=config.ordering, packing=config.packing, end="drop_last")
    rows = global_steps(corpus, config, 0, [(before, k), (after, -1)])
    total = len(ReferenceLoader(corpus, config).samples(0))
    g1, g2 = before.world_size * before.batch_size, after.world_size * after.batch_size
    if k > steps_in_epoch(total, PartitionConfig(world_size=before.world_size, batch_size=before.batch_size)):
        covered = total - total % g1  # the first topology ended the epoch (PART-7)
    else:
        consumed = k * g1
        covered = consumed + (total - consumed) - (total - consumed) % g2
    assert_exactly_once([r.sample_index for batch in rows for r in batch], range(covered), clause="RES-4",
                        what="samples over both topologies",
                        repro={"corpus": corpus, "config": config, "before": before, "after": after, "k": k})


@pytest.mark.clause("RES-5")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(), workers=st.integers(0, 4))
def test_reference_stream_ignores_the_worker_count(corpus, config, workers):
    plain = take(ReferenceLoader(corpus, config, Topology(batch_size=2)), 50)
    other = take(ReferenceLoader(corpus, config, Topology(batch_size=2, num_workers=workers)), 50)
    assert_equal(other, plain, clause="RES-5", what=f"batches with num_workers={workers}")


@pytest.mark.clause("RES-6")
def test_state_counts_handed_out_batches_only():
    corpus = [[list(range(1, 40))]]
    loader = ReferenceLoader(corpus, PipelineConfig(packing=PackingConfig(seq_len=3)), Topology(batch_size=2))
    it = iter(loader)
    next(it)
    next(it)
    assert_equal(loader.state_dict()["consumed"], 4, clause="RES-6", what="consumed after 2 batches of 2")


@pytest.mark.clause("RES-7")
def test_epochs_follow_each_other_and_set_epoch_keeps_a_resumed_position():
    corpus = [[list(range(1, 30))]]
    config = PipelineConfig(packing=PackingConfig(seq_len=4))
    loader = ReferenceLoader(corpus, config)
    first = list(loader)
    assert_equal((loader.state_dict()["epoch"], loader.state_dict()["consumed"]), (1, 0), clause="RES-7",
                 what="state after an epoch")
    check(all(r.epoch == 1 for b in list(loader) for r in b), clause="RES-7", what="second pass is epoch 1")
    resumed = ReferenceLoader(corpus, config)
    resumed.load_state_dict(dict(loader.state_dict(), epoch=2, consumed=3))
    resumed.set_epoch(2)
    assert_equal(resumed.state_dict()["consumed"], 3, clause="RES-7", what="consumed after set_epoch(2)")
    resumed.set_epoch(3)
    assert_equal(resumed.state_dict()["consumed"], 0, clause="RES-7", what="consumed after set_epoch(3)")
    check(len(first) == 7, clause="RES-7", what=f"epoch 0 has {len(first)} steps, expected (29-1)//4 = 7")


# ---------------------------------------------------------------- the composed pipeline: splits and mixtures


@st.composite
def mixtures(draw, *, max_sources: int = 3, stoppings=STOPPING_STRATEGIES):
    """(corpora, MixtureConfig): 1..max_sources sources sharing one packing, each with its own order and split."""
    k = draw(st.integers(1, max_sources))
    packing = draw(ls.packing_configs())
    sources, configs = [], []
    for _ in range(k):
        corpus = draw(ls.corpora(max_docs=6, max_len=30))
        n = sum(len(f) for f in corpus)
        split = None
        if n >= 2 and draw(st.booleans()):
            a = draw(st.integers(0, n - 1))
            split = draw(st.sampled_from([(a, None), (None, a + 1), (a, draw(st.integers(a + 1, n))), (None, "50%")]))
            if split == (None, "50%") and round(n / 2) == 0:
                split = None
        sources.append(corpus)
        configs.append(PipelineConfig(packing=packing, ordering=draw(ls.ordering_configs()), split=split))
    weighted = draw(st.sampled_from(["round_robin", "weights", "balance", "streams"]))
    stopping = draw(st.sampled_from(sorted(stoppings)))
    weights = tuple(draw(st.lists(st.integers(1, 5), min_size=k, max_size=k))) if weighted == "weights" else None
    mixing = MixConfig(weights=weights, stopping=stopping, seed=draw(ls.seeds))
    fn = balance_remaining if weighted == "balance" else None
    streams = None
    if weighted == "streams":
        streams = tuple(draw(st.sampled_from([StreamConfig(), StreamConfig(repeat=1.5), StreamConfig(repeat=0.5)]))
                        for _ in range(k))
        mixing = MixConfig(seed=mixing.seed)
    return sources, MixtureConfig(sources=tuple(configs), mixing=mixing, end=draw(st.sampled_from(["drop_last", "pad", "even"])),
                                  weight_fn=fn, streams=streams, allow_repeat=True)   # drawn corpora may coincide (MIX-17)


def _old_fingerprint(corpus, config):
    """RES-3's fingerprint as it was before splits existed: data and {ordering, packing, end} (and PACK-22's bins)."""
    old = {"ordering": dataclasses.asdict(config.ordering), "packing": dataclasses.asdict(config.packing), "end": config.end}
    if config.packing.mode in ("greedy", "first_fit", "best_fit") and config.ordering.kind != "sequential":
        old["bins"] = "keyed"
    return hashlib.sha256(canonical_json({"data": corpus_fingerprint(corpus), "config": old}).encode()).hexdigest()


@pytest.mark.clause("SPLIT-8")
@pytest.mark.clause("MIX-13")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(), topology=ls.topologies(max_world=3))
def test_one_source_pipeline_without_split_keeps_its_samples_fingerprint_and_states(corpus, config, topology):
    assert_equal(ReferenceLoader(corpus, config).fingerprint, _old_fingerprint(corpus, config), clause="SPLIT-8",
                 what="fingerprint of an unsplit pipeline")
    check("split" not in config.to_json(), clause="SPLIT-8", what="split=None added a key to the config JSON")
    one = MixtureConfig(sources=(config,), end=config.end)
    plain = take(ReferenceLoader(corpus, config, topology), 50)
    mixed = take(MixtureReferenceLoader([corpus], one, topology), 50)
    assert_equal(mixed, plain, clause="MIX-13", what="a one-source round-robin mixture against the plain pipeline",
                 repro={"corpus": corpus, "config": config, "topology": topology})


@pytest.mark.clause("MIX-13")
@given(mixture=mixtures(), epoch=st.integers(0, 3))
def test_mixture_is_each_source_pipeline_interleaved_by_mix(mixture, epoch):
    sources, config = mixture
    assume(config.streams is None)   # streams pick samples by MIX-15, checked in test_mixing
    per_source = [epoch_samples(c, cfg, epoch) for c, cfg in zip(sources, config.sources)]
    mixed = mixture_samples(sources, config, epoch)
    taken = [0] * len(sources)
    for s, sample in mixed:
        i = taken[s] % max(1, len(per_source[s]))
        assert_equal(sample, per_source[s][i], clause="MIX-13", what=f"sample {taken[s]} of source {s}",
                     repro={"mixture": mixture, "epoch": epoch})
        taken[s] += 1
    if config.mixing.stopping == "all_exhausted":
        assert_equal(taken, [len(p) for p in per_source], clause="MIX-13",
                     what="all_exhausted: every sample of every source exactly once")


@pytest.mark.clause("MIX-13")
@given(mixture=mixtures(max_sources=2), topology=ls.topologies(max_world=3))
def test_mixture_resumes_at_every_position_across_epoch_boundaries(mixture, topology):
    sources, config = mixture
    make = lambda: MixtureReferenceLoader(sources, config, topology)
    horizon = 2 * len(make()) + 3
    mismatch = resume_mismatch(make, range(0, horizon + 1, 2), horizon)
    check(mismatch is None, clause="MIX-13", what=f"resume at step {mismatch and mismatch[0]} diverged",
          repro={"mixture": mixture, "topology": topology})


@pytest.mark.clause("MIX-13")
@given(mixture=mixtures(), before=ls.topologies(replication=False), after=ls.topologies(replication=False),
       k=st.integers(0, 4))
def test_mixture_state_is_elastic_and_covers_each_mixed_sample_once(mixture, before, after, k):
    sources, config = mixture
    config = dataclasses.replace(config, end="drop_last")
    seen: list[int] = []
    state = None
    for topology, steps in ((before, k), (after, -1)):
        loaders = [MixtureReferenceLoader(sources, config, dataclasses.replace(topology, rank=r))
                   for r in range(topology.world_size)]
        for ld in loaders:
            if state is not None:
                ld.load_state_dict(json.loads(json.dumps(state)))
        iterators = [iter(ld) for ld in loaders]
        done = 0
        while steps < 0 or done < steps:
            step = [next(it, None) for it in iterators]
            if step[0] is None:
                break
            seen.extend(r.sample_index for batch in step for r in batch)
            done += 1
        state = loaders[0].state_dict()
        if state["epoch"] != 0:
            break
    total = len(MixtureReferenceLoader(sources, config).samples(0))
    g1, g2 = before.world_size * before.batch_size, after.world_size * after.batch_size
    if k > steps_in_epoch(total, PartitionConfig(world_size=before.world_size, batch_size=before.batch_size)):
        covered = total - total % g1
    else:
        consumed = k * g1
        covered = consumed + (total - consumed) - (total - consumed) % g2
    assert_exactly_once(seen, range(covered), clause="MIX-13", what="mixed samples over both topologies",
                        repro={"mixture": mixture, "before": before, "after": after, "k": k})


@pytest.mark.clause("MIX-13")
def test_mixture_rows_carry_their_source_and_a_fresh_mixture_every_epoch():
    p = PipelineConfig(packing=PackingConfig(seq_len=2, mode="none"))
    corpora = [[[[i, i + 1, i + 2] for i in range(1, 60, 3)]], [[[i, i + 1, i + 2] for i in range(100, 160, 3)]]]
    config = MixtureConfig(sources=(p, p), mixing=MixConfig(weights=(1.0, 1.0), stopping="all_exhausted", seed=7))
    loader = MixtureReferenceLoader(corpora, config)
    epoch0 = [(r.source, r.sample.input_ids) for batch in loader for r in batch]
    epoch1 = [(r.source, r.sample.input_ids) for batch in loader for r in batch]
    check(all((s == 0) == (ids[0] < 100) for s, ids in epoch0), clause="MIX-13", what="row source tags")
    check([s for s, _ in epoch0] != [s for s, _ in epoch1], clause="MIX-13",
          what="epochs 0 and 1 drew the same source sequence")
    assert_equal(sorted(epoch0), sorted(epoch1), clause="MIX-13", what="all_exhausted covers the same samples each epoch")


@pytest.mark.clause("MIX-14")
def test_mixture_refuses_mismatched_sources_and_states_of_another_mixture():
    a = PipelineConfig(packing=PackingConfig(seq_len=4))
    b = PipelineConfig(packing=PackingConfig(seq_len=8))
    assert_raises_typed(ConfigError, MixtureConfig, sources=(a, b), clause="MIX-14", what="seq_len mismatch",
                        mentions=["seq_len=8", "seq_len=4"])
    assert_raises_typed(ConfigError, MixtureConfig, sources=(a, a), mixing=MixConfig(weights=(1.0, 2.0, 3.0)),
                        clause="MIX-14", what="three weights for two sources", mentions=["3 entries", "2 sources"])
    corpora = [[[[1, 2, 3, 4, 5, 6]]], [[[7, 8, 9, 10, 11, 12]]]]
    ab = MixtureReferenceLoader(corpora, MixtureConfig(sources=(a, a)))
    ba = MixtureReferenceLoader(corpora[::-1], MixtureConfig(sources=(a, a)))
    weighted = MixtureReferenceLoader(corpora, MixtureConfig(sources=(a, a), mixing=MixConfig(weights=(1.0, 2.0))))
    check(len({ab.fingerprint, ba.fingerprint, weighted.fingerprint}) == 3, clause="MIX-14",
          what="source order and weights must change the fingerprint")
    assert_equal(ab.fingerprint, mixture_fingerprint([corpus_fingerprint(c) for c in corpora], ab.mixture),
                 clause="MIX-14", what="fingerprint formula")
    check(ab.fingerprint != pipeline_fingerprint(corpus_fingerprint(corpora[0]), a), clause="MIX-14",
          what="a mixture's fingerprint must differ from its first source's")
    assert_raises_typed(StateError, ba.load_state_dict, ab.state_dict(), clause="MIX-14",
                        what="a state of another mixture", mentions=["fingerprint"])


@pytest.mark.clause("RES-8")
def test_a_refused_state_names_the_part_of_the_pipeline_that_differs():
    corpus = [[[1, 2, 3, 4, 5, 6, 7, 8, 9]]]
    base = PipelineConfig(packing=PackingConfig(seq_len=2))
    good = ReferenceLoader(corpus, base).state_dict()
    cases = [(ReferenceLoader(corpus, PipelineConfig(packing=PackingConfig(seq_len=3))), ["packing differs", "seq_len"]),
             (ReferenceLoader(corpus, dataclasses.replace(base, split="train[:50%]")), ["split differs"]),
             (ReferenceLoader(corpus, dataclasses.replace(base, end="pad")), ["end policy differs"]),
             (ReferenceLoader([[[1, 2, 3, 4, 5, 6, 7, 8, 10]]], base), ["data differs", "rebuilt"])]
    for loader, mentions in cases:
        assert_raises_typed(StateError, loader.load_state_dict, good, clause="RES-8", what=f"state of {loader.config}",
                            mentions=["fingerprint", *mentions, "fresh state"])
        other = ("packing", "split", "end", "data")
        with pytest.raises(StateError) as info:
            loader.load_state_dict(good)
        named = [p for p in other if f"{p} differs" in str(info.value) or f"{p} policy differs" in str(info.value)]
        assert_equal(len(named), 1, clause="RES-8", what=f"parts named in {info.value}")
    check(len(json.dumps(good)) < 512, clause="RES-2", what="a one-source state with its parts")


@pytest.mark.clause("RES-8")
def test_a_refused_mixture_state_names_swapped_sources_rebuilt_sources_weights_and_seed():
    p = PipelineConfig(packing=PackingConfig(seq_len=2, mode="chunk"))
    web, code, books = [[[[b + i for i in range(7)]]] for b in (10, 100, 1000)]
    mix = lambda sources, **kw: MixtureReferenceLoader(sources, MixtureConfig(sources=(p,) * len(sources),
                                                                               mixing=MixConfig(**kw)))
    good = mix([web, code], weights=(0.7, 0.3), seed=1).state_dict()
    cases = [(mix([code, web], weights=(0.7, 0.3), seed=1),
              ["sources swapped", "the checkpoint's source 0 is this mixture's source 1"]),
             (mix([web, books], weights=(0.7, 0.3), seed=1), ["source 1's data differs", "rebuilt"]),
             (mix([web, code], weights=(0.5, 0.5), seed=1), ["weights differ"]),
             (mix([web, code], weights=(0.7, 0.3), seed=2), ["mix seed differs"]),
             (mix([web, code, books], weights=(0.7, 0.2, 0.1), seed=1), ["mixture of 2 sources", "3"])]
    for loader, mentions in cases:
        assert_raises_typed(StateError, loader.load_state_dict, good, clause="RES-8", what="a state of another mixture",
                            mentions=["fingerprint", *mentions])
    with pytest.raises(StateError) as info:
        cases[0][0].load_state_dict(good)
    check("data differs" not in str(info.value), clause="RES-8", what=f"a swap blamed on the data: {info.value}")


@pytest.mark.clause("RES-8")
def test_the_fingerprint_alone_decides_and_a_version_1_state_still_loads():
    corpus = [[[1, 2, 3, 4, 5, 6, 7, 8, 9]]]
    loader = ReferenceLoader(corpus, PipelineConfig(packing=PackingConfig(seq_len=2)))
    edited = dict(loader.state_dict(), consumed=2, parts={"packing": "0" * 16})
    loader.load_state_dict(edited)
    assert_equal(loader.consumed, 2, clause="RES-8", what="consumed after a state whose parts disagree")
    v1 = {k: v for k, v in make_state(loader.fingerprint, 0, 4).items() if k != "parts"} | {"version": 1}
    loader.load_state_dict(v1)
    assert_equal(loader.consumed, 4, clause="RES-8", what="consumed after a version-1 state")
    other = ReferenceLoader(corpus, PipelineConfig(packing=PackingConfig(seq_len=3)))
    assert_raises_typed(StateError, other.load_state_dict, v1, clause="RES-8", what="a version-1 state of another config",
                        mentions=["fingerprint", "another dataset or pipeline configuration"])
    assert_raises_typed(StateError, loader.load_state_dict, dict(v1, parts={}), clause="RES-8",
                        what="a version-1 state with parts", mentions=["extra: ['parts']"])
    assert_raises_typed(StateError, loader.load_state_dict, dict(loader.state_dict(), parts=[1]), clause="RES-8",
                        what="parts that are not a dict of strings", mentions=["parts", "dict of strings"])
