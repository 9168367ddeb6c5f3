"""Meta tests: the reference pipeline obeys its own resume contract (RES-*)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import StateError, TopologyError
from reference.packing import PackingConfig
from reference.partition import PartitionConfig, steps_in_epoch
from reference.resume import (PipelineConfig, ReferenceLoader, Topology, corpus_fingerprint, global_steps,
                              resume_mismatch, take)


@pytest.mark.clause("RES-1")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(), topology=ls.topologies(max_world=3))
def test_reference_resumes_at_every_position_across_epoch_boundaries(corpus, config, topology):
    make = lambda: ReferenceLoader(corpus, config, topology)  # noqa: E731
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
    assert_equal(sorted(state), ["consumed", "epoch", "fingerprint", "format", "version"], clause="RES-2",
                 what="state keys")
    check(len(json.dumps(state)) < 256, clause="RES-2", what="state size")


@pytest.mark.clause("RES-3")
def test_reference_refuses_foreign_future_mismatched_and_overlong_states():
    corpus = [[[1, 2, 3, 4, 5]]]
    config = PipelineConfig(packing=PackingConfig(seq_len=2))
    loader = ReferenceLoader(corpus, config)
    good = loader.state_dict()
    cases = [({"epoch": 0}, "format"), (dict(good, version=2), "version"), (dict(good, fingerprint="0" * 64), "fingerprint"),
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
