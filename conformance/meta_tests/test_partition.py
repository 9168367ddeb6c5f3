"""Meta tests: reference.partition obeys PART-1..PART-12.

The oracles do not reuse the reference's arithmetic: the layout oracle walks a
cursor over the global stream, and the resume tests check what was trained
(a prefix, each index once, a bounded tail) rather than how.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import ConfigError, StateError, TopologyError
from reference.partition import (
    END_POLICIES,
    PADDING,
    PartitionConfig,
    advance,
    data_parallel_group,
    dataloader_order,
    epoch_steps,
    rank_batch,
    step_slice,
    steps_in_epoch,
    worker_batches,
    worker_of_batch,
)


@st.composite
def configs(draw, end=None):
    groups = draw(st.integers(min_value=1, max_value=4))
    replication = draw(st.integers(min_value=1, max_value=3))
    return PartitionConfig(world_size=groups * replication, batch_size=draw(st.integers(min_value=1, max_value=5)),
                           replication=replication, end=draw(st.sampled_from(END_POLICIES) if end is None else end))


samples = st.integers(min_value=0, max_value=120)


def _trained(steps: list[list[list[int]]]) -> list[int]:
    return [i for step in steps for group in step for i in group if i != PADDING]


def _run(num_samples: int, config: PartitionConfig, start: int, max_steps: int | None = None):
    """Drive the public step/advance API like a training loop; returns (steps, final position).

    The loop advances after every ``step_slice``, the empty one included, so the
    final position records that the epoch is over (PART-7).
    """
    steps, consumed = [], start
    while max_steps is None or len(steps) < max_steps:
        step = step_slice(consumed, num_samples, config)
        consumed = advance(consumed, num_samples, config)
        if not step:
            break
        steps.append(step)
    return steps, consumed


@pytest.mark.clause("PART-1")
@given(config=configs(), num_samples=samples, data=st.data())
def test_ranks_of_a_data_parallel_group_receive_the_same_batch_and_groups_differ(config, num_samples, data):
    consumed = data.draw(st.integers(min_value=0, max_value=num_samples))
    repro = {"config": config, "num_samples": num_samples, "consumed": consumed}
    batches = [rank_batch(consumed, num_samples, config, r) for r in range(config.world_size)]
    step = step_slice(consumed, num_samples, config)
    for r, batch in enumerate(batches):
        assert_equal(data_parallel_group(r, config), r // config.replication, clause="PART-1", what=f"group of rank {r}",
                     repro=repro)
        assert_equal(batch, batches[(r // config.replication) * config.replication], clause="PART-1",
                     what=f"batch of rank {r} vs the first rank of its group", repro=repro)
        if step:
            assert_equal(batch, step[r // config.replication], clause="PART-1", what=f"batch of rank {r}", repro=repro)
    real = [i for g in range(0, config.world_size, config.replication) for i in batches[g] if i != PADDING]
    check(len(real) == len(set(real)), clause="PART-1", what=f"two groups share a sample: {real}", repro=repro)


@pytest.mark.clause("PART-1", "PART-2")
def test_hand_computed_replicated_layout():
    cfg = PartitionConfig(world_size=4, batch_size=2, replication=2)
    assert_equal([rank_batch(0, 8, cfg, r) for r in range(4)], [[0, 1], [0, 1], [2, 3], [2, 3]], clause="PART-1",
                 what="ranks 0..3 with replication 2")
    assert_equal(step_slice(8, 20, PartitionConfig(world_size=3, batch_size=2)), [[8, 9], [10, 11], [12, 13]],
                 clause="PART-2", what="step at consumed=8, D=3, B=2")


@pytest.mark.clause("PART-2", "PART-3")
@given(config=configs(), num_samples=samples, data=st.data())
def test_a_full_step_takes_the_next_global_batch_in_contiguous_group_blocks(config, num_samples, data):
    consumed = data.draw(st.integers(min_value=0, max_value=num_samples))
    repro = {"config": config, "num_samples": num_samples, "consumed": consumed}
    if num_samples - consumed < config.global_batch_size:
        return
    cursor, expected = consumed, []
    for _ in range(config.data_parallel_size):
        block = []
        for _ in range(config.batch_size):
            block.append(cursor)
            cursor += 1
        expected.append(block)
    assert_equal(step_slice(consumed, num_samples, config), expected, clause="PART-2", what="full step", repro=repro)
    assert_equal(advance(consumed, num_samples, config), cursor, clause="PART-3", what="position after a full step",
                 repro=repro)


@pytest.mark.clause("PART-3")
@given(a=configs(end=st.just("drop_last")), b=configs(end=st.just("drop_last")), t=st.integers(min_value=0, max_value=5))
def test_the_position_depends_only_on_samples_covered_not_on_the_topology(a, b, t):
    num_samples = 1000
    _, consumed = _run(num_samples, a, 0, max_steps=t)
    assert_equal(consumed, t * a.global_batch_size, clause="PART-3", what="position after t full steps",
                 repro={"config": a, "t": t})
    first = step_slice(consumed, num_samples, b)
    assert_equal(min(first[0]), consumed, clause="PART-3", what="first sample after resuming under another config",
                 repro={"config_a": a, "config_b": b, "t": t})


@pytest.mark.clause("PART-4", "PART-5", "PART-6", "PART-7")
@given(config=configs(), num_samples=samples, data=st.data())
def test_a_short_final_batch_follows_the_end_policy_and_ends_the_epoch(config, num_samples, data):
    remaining = data.draw(st.integers(min_value=0, max_value=min(num_samples, config.global_batch_size - 1)))
    consumed = num_samples - remaining
    repro = {"config": config, "num_samples": num_samples, "consumed": consumed}
    step = step_slice(consumed, num_samples, config)
    groups, size = config.data_parallel_size, config.batch_size
    if config.end == "drop_last" or remaining == 0:
        assert_equal(step, [], clause="PART-4", what="short final step", repro=repro)
    elif config.end == "pad":
        stream = list(range(consumed, num_samples)) + [PADDING] * (groups * size - remaining)
        assert_equal(step, [stream[g * size:(g + 1) * size] for g in range(groups)], clause="PART-5",
                     what="padded final step", repro=repro)
    else:
        share = remaining // groups
        expected = [list(range(consumed + g * share, consumed + (g + 1) * share)) for g in range(groups)] if share else []
        assert_equal(step, expected, clause="PART-6", what="even final step", repro=repro)
        check(all(len(b) == len(step[0]) for b in step), clause="PART-6", what="even step has unequal batches",
              repro=repro)
    assert_equal(advance(consumed, num_samples, config), num_samples, clause="PART-7",
                 what="position after the final step", repro=repro)
    assert_equal(step_slice(num_samples, num_samples, config), [], clause="PART-7", what="step at the end", repro=repro)
    assert_equal(advance(num_samples, num_samples, config), num_samples, clause="PART-7", what="advance at the end",
                 repro=repro)


@pytest.mark.clause("PART-4", "PART-5", "PART-6")
def test_hand_computed_end_policies():
    base = dict(world_size=2, batch_size=2)
    assert_equal(epoch_steps(10, PartitionConfig(**base)), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], clause="PART-4",
                 what="drop_last S=10 G=4")
    assert_equal(step_slice(4, 7, PartitionConfig(**base, end="pad")), [[4, 5], [6, -1]], clause="PART-5",
                 what="pad S=7 at 4")
    assert_equal(step_slice(4, 11, PartitionConfig(world_size=3, batch_size=3, end="even")), [[4, 5], [6, 7], [8, 9]],
                 clause="PART-6", what="even S=11 at 4, D=3, B=3")
    assert_equal(step_slice(8, 10, PartitionConfig(world_size=4, end="even")), [], clause="PART-6",
                 what="even with fewer samples left than groups")


@pytest.mark.clause("PART-8")
@given(a=configs(), b=configs(), num_samples=samples, t=st.integers(min_value=0, max_value=30))
def test_elastic_resume_trains_a_prefix_exactly_once_and_drops_only_a_short_tail(a, b, num_samples, t):
    first, consumed = _run(num_samples, a, 0, max_steps=t)
    second, final = _run(num_samples, b, consumed)
    repro = {"config_a": a, "config_b": b, "num_samples": num_samples, "t": t, "resumed_at": consumed}
    trained = _trained(first) + _trained(second)
    covered = max(trained, default=-1) + 1
    assert_exactly_once(trained, range(covered), clause="PART-8", what="samples trained over both runs", repro=repro)
    ender = a if consumed == num_samples else b
    tail = num_samples - covered
    limit = {"pad": 1, "even": ender.data_parallel_size, "drop_last": ender.global_batch_size}[ender.end]
    check(tail < limit, clause="PART-8",
          what=f"{tail} samples left untrained, but end={ender.end!r} allows fewer than {limit}", repro=repro)
    assert_equal(final, num_samples, clause="PART-8", what="position at the end of the epoch", repro=repro)


@pytest.mark.clause("PART-8")
def test_hand_computed_elastic_resume_from_two_ranks_to_three():
    a, b = PartitionConfig(world_size=2, batch_size=2), PartitionConfig(world_size=3)
    first, consumed = _run(10, a, 0, max_steps=1)
    second, _ = _run(10, b, consumed)
    assert_equal(first + second, [[[0, 1], [2, 3]], [[4], [5], [6]], [[7], [8], [9]]], clause="PART-8",
                 what="steps of the resumed epoch")


@pytest.mark.clause("PART-9")
@given(config=configs(), num_samples=samples, t=st.integers(min_value=0, max_value=30))
def test_resuming_under_the_same_config_reproduces_every_rank_sequence(config, num_samples, t):
    uninterrupted = epoch_steps(num_samples, config)
    _, consumed = _run(num_samples, config, 0, max_steps=t)
    resumed = epoch_steps(num_samples, config, start=consumed)
    repro = {"config": config, "num_samples": num_samples, "t": t}
    assert_equal(resumed, uninterrupted[t:], clause="PART-9", what="steps after resuming", repro=repro)
    for r in range(config.world_size):
        per_rank, c = [], consumed
        while batch := rank_batch(c, num_samples, config, r):
            per_rank.append(batch)
            c = advance(c, num_samples, config)
        assert_equal(per_rank, [s[r // config.replication] for s in uninterrupted[t:]], clause="PART-9",
                     what=f"rank {r}'s batches after resuming", repro=repro)


@pytest.mark.clause("PART-10")
@given(config=configs(), num_samples=samples, data=st.data())
def test_steps_in_epoch_counts_the_steps_the_epoch_yields(config, num_samples, data):
    start = data.draw(st.integers(min_value=0, max_value=num_samples))
    assert_equal(steps_in_epoch(num_samples, config, start), len(_run(num_samples, config, start)[0]),
                 clause="PART-10", what="steps_in_epoch", repro={"config": config, "num_samples": num_samples,
                                                                  "start": start})


@pytest.mark.clause("PART-10")
def test_hand_computed_step_counts():
    got = [steps_in_epoch(10, PartitionConfig(world_size=4, end=e)) for e in ("drop_last", "pad", "even")]
    assert_equal(got, [2, 3, 2], clause="PART-10", what="steps for S=10, D=4, B=1")


@pytest.mark.clause("PART-11")
@given(config=configs(), num_samples=samples, workers=st.integers(min_value=1, max_value=5), data=st.data())
def test_the_rank_batch_sequence_is_the_same_for_every_number_of_workers(config, num_samples, workers, data):
    rank = data.draw(st.integers(min_value=0, max_value=config.world_size - 1))
    start = data.draw(st.integers(min_value=0, max_value=num_samples))
    expected = [s[rank // config.replication] for s in _run(num_samples, config, start)[0]]
    per_worker = [worker_batches(num_samples, config, rank, num_workers=workers, worker=w, start=start)
                  for w in range(workers)]
    repro = {"config": config, "num_samples": num_samples, "rank": rank, "num_workers": workers, "start": start}
    for w, batches in enumerate(per_worker):
        assert_equal(batches, [b for t, b in enumerate(expected) if t % workers == w], clause="PART-11",
                     what=f"batches of worker {w}", repro=repro)
    merged, queues = [], [list(b) for b in per_worker]
    while any(queues):
        for queue in queues:
            if queue:
                merged.append(queue.pop(0))
    assert_equal(merged, expected, clause="PART-11", what="round-robin merge of the workers' outputs", repro=repro)
    assert_equal(dataloader_order(per_worker), expected, clause="PART-11", what="dataloader_order", repro=repro)
    assert_equal([worker_of_batch(t, workers) for t in range(len(expected))],
                 [t % workers for t in range(len(expected))], clause="PART-11", what="worker_of_batch", repro=repro)


@pytest.mark.clause("PART-12")
def test_impossible_topologies_and_positions_are_refused_with_the_fix():
    cases = [
        (TopologyError, PartitionConfig, dict(world_size=0), ["world_size=0"]),
        (ConfigError, PartitionConfig, dict(batch_size=0), ["batch_size=0"]),
        (TopologyError, PartitionConfig, dict(world_size=4, replication=0), ["replication=0"]),
        (TopologyError, PartitionConfig, dict(world_size=6, replication=4), ["replication=4", "world_size=6", "divisor"]),
        (ConfigError, PartitionConfig, dict(end="wrap"), ["end='wrap'", "drop_last"]),
    ]
    for error, fn, kwargs, mentions in cases:
        assert_raises_typed(error, fn, **kwargs, clause="PART-12", what=f"PartitionConfig({kwargs})", mentions=mentions)
    cfg = PartitionConfig(world_size=2)
    assert_raises_typed(TopologyError, rank_batch, 0, 10, cfg, 2, clause="PART-12", what="rank=2 of 2",
                        mentions=["rank=2", "world_size=2"])
    assert_raises_typed(StateError, step_slice, 11, 10, cfg, clause="PART-12", what="consumed past the epoch",
                        mentions=["consumed=11", "num_samples=10"])
    assert_raises_typed(StateError, advance, -1, 10, cfg, clause="PART-12", what="negative consumed",
                        mentions=["consumed=-1"])
    assert_raises_typed(ConfigError, step_slice, 0, -1, cfg, clause="PART-12", what="negative S",
                        mentions=["num_samples=-1"])
    assert_raises_typed(TopologyError, worker_of_batch, 0, 0, clause="PART-12", what="num_workers=0",
                        mentions=["num_workers=0", "num_workers=1"])


@pytest.mark.clause("PART-8")
@given(total=st.integers(0, 60), start=st.integers(0, 60), world=st.integers(1, 4), batch=st.integers(1, 4),
       end=st.sampled_from(["drop_last", "pad", "even"]))
def test_trained_end_is_where_the_real_samples_of_the_remaining_steps_stop(total, start, world, batch, end):
    from reference.partition import trained_end

    start = min(start, total)
    config = PartitionConfig(world_size=world, batch_size=batch, end=end)
    real = [i for step in epoch_steps(total, config, start) for group in step for i in group if i != PADDING]
    assert_equal(sorted(real), list(range(start, start + len(real))), clause="PART-8", what="samples the rest trains")
    assert_equal(trained_end(start, total, config), start + len(real), clause="PART-8",
                 what=f"trained_end({start}, {total}, {config})")
