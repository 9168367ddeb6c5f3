"""The reference's streaming steps across a checkpoint (STREAM-22): a rank ahead resumes to the epoch's S."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed
from conformance.meta_tests.test_streaming import configs, files, make
from reference.errors import StateError
from reference.packing import PackingConfig
from reference.streaming import StreamingConfig, merge_states
from reference.units import RowFile

EXAMPLE = [RowFile(path="p", groups=(("abcd",), ("ab",), ("abc",), ("a",)))]
EXAMPLE_CONFIG = StreamingConfig(packing=PackingConfig(seq_len=1), num_lanes=2)


def ids(batches):
    return [[(row.epoch, row.lane, row.index, row.sample) for row in b] for b in batches]


def skewed_checkpoint(fs, config, world, workers, batch, k, ahead, cross):
    """Each rank takes ``k`` steps of epoch 0, rank ``ahead`` one more (and, with ``cross``, ends its pass)."""
    loaders = [make(fs, config, world, r, workers, batch) for r in range(world)]
    taken = []
    for r, ld in enumerate(loaders):
        it = iter(ld)
        taken.append(len(list(itertools.islice(it, k + (r == ahead)))))
        if r == ahead and cross:
            taken[-1] += len(list(it))
    return taken, merge_states([json.loads(json.dumps(ld.state_dict())) for ld in loaders])


@pytest.mark.clause("STREAM-22", "STREAM-12")
@given(fs=files(), config=configs(lanes=4), workers=st.sampled_from([0, 2]), batch=st.integers(1, 2),
       ahead=st.integers(0, 1), cross=st.booleans(), data=st.data())
def test_a_rank_a_batch_ahead_at_the_checkpoint_resumes_each_rank_to_the_epochs_steps_on_the_same_topology(
        fs, config, workers, batch, ahead, cross, data):
    world = 2
    whole = [[ids(list(ld)) for _ in range(2)] for ld in (make(fs, config, world, r, workers, batch)
                                                          for r in range(world))]
    steps = len(whole[0][0])
    k = data.draw(st.integers(0, max(0, steps - 1)))
    taken, state = skewed_checkpoint(fs, config, world, workers, batch, k, ahead, cross)
    for r in range(world):
        resumed = make(fs, config, world, r, workers, batch)
        resumed.load_state_dict(state)
        got = [ids(list(resumed)) for _ in range(2)]
        assert_equal(got, [whole[r][0][taken[r]:], whole[r][1]], clause="STREAM-22",
                     what=f"rank {r} resumed from a checkpoint where it had taken {taken[r]} of {steps} steps "
                          f"(rank {ahead} one ahead)",
                     repro={"files": fs, "config": config, "workers": workers, "batch": batch, "k": k,
                            "ahead": ahead, "cross": cross, "state": state})


@pytest.mark.clause("STREAM-22")
def test_lanes_straddling_two_epochs_resume_on_the_same_topology_and_are_refused_on_another_naming_each_ranks_epoch():
    taken, state = skewed_checkpoint(EXAMPLE, EXAMPLE_CONFIG, 2, 0, 1, 1, 1, True)
    assert_equal((taken, state["epoch"], state["ranks"]),
                 ([1, 2], 0, {"0": {"epoch": 0, "steps": 2, "taken": 1}, "1": {"epoch": 1, "steps": 2, "taken": 0}}),
                 clause="STREAM-22", what="the merged state of the clause's example")
    rank0, rank1 = make(EXAMPLE, EXAMPLE_CONFIG, 2, 0), make(EXAMPLE, EXAMPLE_CONFIG, 2, 1)
    for ld in (rank0, rank1):
        ld.load_state_dict(state)
    assert_equal([[[(row.lane, row.index) for row in b] for b in ld] for ld in (rank0, rank1)],
                 [[[(0, 1)]], []], clause="STREAM-22", what="the rest of epoch 0 on each rank")
    assert_equal([ld.state_dict()["ranks"] for ld in (rank0, rank1)],
                 [{"0": {"epoch": 1, "steps": 2, "taken": 0}}, {"1": {"epoch": 1, "steps": 2, "taken": 0}}],
                 clause="STREAM-22", what="both ranks in epoch 1 after the pass")
    for world in (1,):
        assert_raises_typed(StateError, make(EXAMPLE, EXAMPLE_CONFIG, world, 0).load_state_dict, state,
                            clause="STREAM-22", what="lanes in two epochs on another topology",
                            mentions=["rank 0 in epoch 0", "rank 1 in epoch 1", "world_size=2", "same step"])
    assert_raises_typed(StateError, make(EXAMPLE, EXAMPLE_CONFIG, 2, 0, batch=2).load_state_dict, state,
                        clause="STREAM-22", what="lanes in two epochs with another batch size",
                        mentions=["straddle", "batch_size=1"])


@pytest.mark.clause("STREAM-22", "STREAM-13")
def test_a_version_1_state_still_loads_and_recomputes_the_steps_from_the_lane_states():
    whole = ids(list(make(EXAMPLE, EXAMPLE_CONFIG, 2, 0)))
    lockstep = [make(EXAMPLE, EXAMPLE_CONFIG, 2, r) for r in range(2)]
    for ld in lockstep:
        next(iter(ld))
    v2 = merge_states([ld.state_dict() for ld in lockstep])
    v1 = dict({k: v for k, v in v2.items() if k not in ("topology", "ranks")}, version=1)
    resumed = make(EXAMPLE, EXAMPLE_CONFIG, 2, 0)
    resumed.load_state_dict(v1)
    assert_equal(ids(list(resumed)), whole[1:], clause="STREAM-22", what="rank 0 resumed from a version-1 state")
    assert_equal(resumed.state_dict()["version"], 2, clause="STREAM-13", what="the version saved")
