"""Meta tests: reference.mixing obeys MIX-1..MIX-12 and MIX-15..MIX-21.

The oracles here are written independently of the reference: round robin
as closed forms and sorted index tuples, weighted streams as a plain
simulation that chooses sources with ``bisect`` over normalised
``itertools.accumulate`` sums.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference import rng
from reference.errors import ConfigError, StateError, TopologyError
from reference.loader import MixtureReferenceLoader
from reference.mixing import (
    STOPPING_STRATEGIES,
    MixConfig,
    MixState,
    balance_remaining,
    check_distinct_sources,
    choose_weighted,
    initial_state,
    mix,
    next_item,
    repeated_rows,
)
from reference.packing import PackingConfig
from reference.resume import MixtureConfig, PipelineConfig, Topology, corpus_fingerprint, mixture_fingerprint
from reference.streams import StreamConfig, check_batch_topology, mix_streams, stratified_counts, stream_counts

sizes_st = st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=4)
nonempty_sizes_st = st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=4)
seed_st = st.integers(min_value=0, max_value=2**64 - 1)
epoch_st = st.integers(min_value=0, max_value=1000)
stopping_st = st.sampled_from(STOPPING_STRATEGIES)
weight_st = st.floats(min_value=0.05, max_value=20.0)


def _states(sizes, config, epoch, weight_fn=None):
    """The stream and the state before each item plus the final state."""
    state, items, states = initial_state(len(sizes)), [], []
    while True:
        states.append(state)
        item, state = next_item(state, sizes, config, epoch, weight_fn)
        if item is None:
            return items, states, state
        items.append(item)


def _oracle_weighted(sizes, weights, stopping, seed, epoch):
    """An independent simulation of a weighted stream: (items, steps attempted)."""
    key = rng.derive_key(seed, epoch, rng.Stream.MIX)
    used = [0] * len(sizes)
    finished = [n == 0 for n in sizes]
    out, t = [], 0
    while True:
        if stopping == "all_exhausted" and all(u == n for u, n in zip(used, sizes)):
            return out, t
        if stopping == "all_exhausted_oversample" and all(finished):
            return out, t
        if stopping == "first_exhausted":
            live = list(weights)
        elif stopping == "all_exhausted":
            live = [w if u < n else 0.0 for w, u, n in zip(weights, used, sizes)]
        else:
            live = [w if n > 0 else 0.0 for w, n in zip(weights, sizes)]
        bounds = list(itertools.accumulate(live))
        i = bisect.bisect_right([b / bounds[-1] for b in bounds], rng.unit(key, t))
        t += 1
        if used[i] == sizes[i]:
            if stopping == "first_exhausted":
                return out, t
            used[i] = 0
        out.append((i, used[i]))
        used[i] += 1
        finished[i] = finished[i] or used[i] == sizes[i]


# --- MIX-1: stream, steps and per-source order -------------------------------------------------


@pytest.mark.clause("MIX-1", "MIX-7", "MIX-8")
@given(sizes=sizes_st, stopping=stopping_st, weighted=st.booleans(), seed=seed_st)
def test_each_source_emits_its_items_in_order_and_steps_count_every_draw(sizes, stopping, weighted, seed):
    config = MixConfig(weights=(1.0,) * len(sizes) if weighted else None, stopping=stopping, seed=seed)
    repro = {"sizes": sizes, "config": config}
    items, states, final = _states(sizes, config, 0)
    for s, n in enumerate(sizes):
        mine = [j for src, j in items if src == s]
        assert_equal(mine, [k % n for k in range(len(mine))] if n else [], clause="MIX-1",
                     what=f"items of source {s}", repro=repro)
    ending_draw = 1 if stopping == "first_exhausted" else 0
    assert_equal(final.step, len(items) + ending_draw, clause="MIX-1", what="final step", repro=repro)
    if items and stopping != "first_exhausted":
        check(states[-1].done, clause="MIX-7" if stopping == "all_exhausted" else "MIX-8",
              what="the state returned with the last item is not done", repro=repro)
    assert_equal(mix(sizes, config, 0), items, clause="MIX-1", what="mix() vs next_item loop", repro=repro)


@pytest.mark.clause("MIX-1")
def test_round_robin_over_three_and_two_takes_six_steps_for_five_items():
    items, _, final = _states([3, 2], MixConfig(), 0)
    assert_equal(items, [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)], clause="MIX-1", what="stream")
    assert_equal((final.step, final.done), (6, True), clause="MIX-1", what="(step, done) at the end")


# --- MIX-2, MIX-6, MIX-7, MIX-8: round robin against closed forms --------------------------------


@pytest.mark.clause("MIX-2", "MIX-6")
@given(sizes=sizes_st)
def test_round_robin_first_exhausted_has_min_times_sources_plus_first_smallest_index_items(sizes):
    smallest = min(sizes)
    expected = [(t % len(sizes), t // len(sizes)) for t in range(smallest * len(sizes) + sizes.index(smallest))]
    assert_equal(mix(sizes, MixConfig(), 0), expected, clause="MIX-6", what="round robin first_exhausted",
                 repro={"sizes": sizes})


@pytest.mark.clause("MIX-6")
def test_round_robin_first_exhausted_hand_examples():
    assert_equal(len(mix([2, 3], MixConfig(), 0)), 4, clause="MIX-6", what="items of sizes [2, 3]")
    assert_equal(len(mix([3, 2], MixConfig(), 0)), 5, clause="MIX-6", what="items of sizes [3, 2]")
    assert_equal(mix([2, 0, 3], MixConfig(), 0), [(0, 0)], clause="MIX-9", what="sizes [2, 0, 3]")


@pytest.mark.clause("MIX-2", "MIX-7")
@given(sizes=sizes_st)
def test_round_robin_all_exhausted_equals_items_sorted_by_index_then_source(sizes):
    expected = [(s, j) for j, s in sorted((j, s) for s, n in enumerate(sizes) for j in range(n))]
    assert_equal(mix(sizes, MixConfig(stopping="all_exhausted"), 0), expected, clause="MIX-7",
                 what="round robin all_exhausted", repro={"sizes": sizes})


@pytest.mark.clause("MIX-2")
def test_round_robin_pointer_moves_past_the_chosen_source_not_past_the_step():
    assert_equal(mix([1, 3, 2], MixConfig(stopping="all_exhausted"), 0),
                 [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (1, 2)], clause="MIX-2", what="sizes [1, 3, 2]")


@pytest.mark.clause("MIX-2", "MIX-8")
@given(sizes=sizes_st)
def test_round_robin_oversample_cycles_nonempty_sources_until_the_largest_last_one_runs_out(sizes):
    live = [s for s, n in enumerate(sizes) if n > 0]
    if live:
        largest = max(sizes)
        rank = max(r for r, s in enumerate(live) if sizes[s] == largest)
        length = (largest - 1) * len(live) + rank + 1
    else:
        length = 0
    expected = [(live[t % len(live)], (t // len(live)) % sizes[live[t % len(live)]]) for t in range(length)]
    assert_equal(mix(sizes, MixConfig(stopping="all_exhausted_oversample"), 0), expected, clause="MIX-8",
                 what="round robin oversample", repro={"sizes": sizes})


@pytest.mark.clause("MIX-2")
@given(sizes=sizes_st, stopping=stopping_st, epoch=epoch_st, seed=seed_st)
def test_round_robin_ignores_seed_and_epoch(sizes, stopping, epoch, seed):
    assert_equal(mix(sizes, MixConfig(stopping=stopping, seed=seed), epoch), mix(sizes, MixConfig(stopping=stopping), 0),
                 clause="MIX-2", what="round robin with another seed/epoch", repro={"sizes": sizes, "epoch": epoch})


# --- MIX-3: weighted draws ------------------------------------------------------------------------


@pytest.mark.clause("MIX-3")
def test_weighted_choice_uses_left_to_right_cumulative_intervals():
    cases = [([1.0, 0.0, 3.0], 0.0, 0), ([1.0, 0.0, 3.0], 0.24, 0), ([1.0, 0.0, 3.0], 0.25, 2),
             ([1.0, 0.0, 3.0], 0.999, 2), ([0.0, 2.0], 0.0, 1), ([1.0, 1.0], 0.5, 1),
             ([1.0, 1.0], 0.5 - 2**-53, 0), ([0.1, 0.2, 0.7], 1 - 2**-53, 2), ([2.0, 0.0], 0.9, 0)]
    for weights, u, expected in cases:
        assert_equal(choose_weighted(weights, u), expected, clause="MIX-3", what=f"choose_weighted({weights}, {u})")


@pytest.mark.clause("MIX-3", "MIX-6", "MIX-7", "MIX-8")
@given(sizes=sizes_st, data=st.data(), stopping=stopping_st, seed=seed_st, epoch=epoch_st)
def test_weighted_stream_equals_an_independent_simulation(sizes, data, stopping, seed, epoch):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes))))
    config = MixConfig(weights=weights, stopping=stopping, seed=seed)
    expected, steps = _oracle_weighted(sizes, weights, stopping, seed, epoch)
    items, _, final = _states(sizes, config, epoch)
    repro = {"sizes": sizes, "config": config, "epoch": epoch}
    assert_equal(items, expected, clause="MIX-3", what="weighted stream", repro=repro)
    assert_equal(final.step, steps, clause="MIX-1", what="steps attempted", repro=repro)


@pytest.mark.clause("MIX-3")
def test_weighted_frequencies_approach_the_normalised_weights():
    weights = (5.0, 3.0, 2.0)
    config, sizes = MixConfig(weights=weights, seed=11), [10**9] * 3
    state, counts = initial_state(3), Counter()
    for _ in range(20_000):
        (s, _), state = next_item(state, sizes, config, 0)
        counts[s] += 1
    expected = [20_000 * w / sum(weights) for w in weights]
    chi2 = sum((counts[s] - e) ** 2 / e for s, e in enumerate(expected))
    check(chi2 < 13.8, clause="MIX-3", what=f"chi-square {chi2:.2f} >= 13.8 (df=2, p=0.001) for counts {dict(counts)}",
          repro={"config": config, "draws": 20_000})


@pytest.mark.clause("MIX-3")
def test_zero_weight_sources_are_never_chosen():
    stream = mix([50, 50, 50], MixConfig(weights=(1.0, 0.0, 1.0), seed=3), 0)
    check(all(s != 1 for s, _ in stream), clause="MIX-3", what="a zero-weight source was chosen")
    check(len(stream) >= 50, clause="MIX-3", what=f"stream of {len(stream)} items is too short")


@pytest.mark.clause("MIX-3")
@given(seed=seed_st, epoch=epoch_st)
def test_another_epoch_or_seed_gives_another_weighted_stream(seed, epoch):
    config = MixConfig(weights=(1.0, 1.0), stopping="all_exhausted", seed=seed)
    base = mix([40, 40], config, epoch)
    repro = {"config": config, "epoch": epoch}
    check(mix([40, 40], config, epoch + 1) != base, clause="MIX-3", what="epoch + 1 gave the same stream", repro=repro)
    other = dataclasses.replace(config, seed=seed ^ 1)
    check(mix([40, 40], other, epoch) != base, clause="MIX-3", what="seed ^ 1 gave the same stream", repro=repro)
    assert_equal(mix([40, 40], config, epoch), base, clause="MIX-1", what="second run", repro=repro)


# --- MIX-4: weight_fn and eligibility --------------------------------------------------------------


@pytest.mark.clause("MIX-4")
@given(sizes=sizes_st, stopping=stopping_st, seed=seed_st)
def test_weight_fn_is_called_once_per_step_with_step_sizes_taken_and_exhausted(sizes, stopping, seed):
    calls = []

    def recording(step, source_sizes, taken, exhausted):
        calls.append((step, tuple(source_sizes), tuple(taken), tuple(exhausted)))
        return [1.0] * len(source_sizes)

    config = MixConfig(stopping=stopping, seed=seed)
    items, _, final = _states(sizes, config, 0, recording)
    repro = {"sizes": sizes, "config": config}
    assert_equal([c[0] for c in calls], list(range(final.step)), clause="MIX-4", what="steps weight_fn saw", repro=repro)
    for step, seen_sizes, taken, exhausted in calls:
        before = items[:step]
        counts = tuple(sum(1 for s, _ in before if s == i) for i in range(len(sizes)))
        assert_equal(seen_sizes, tuple(sizes), clause="MIX-4", what=f"sizes at step {step}", repro=repro)
        assert_equal(taken, counts, clause="MIX-4", what=f"taken at step {step}", repro=repro)
        no_item_left = tuple(n == 0 or (c > 0 and c % n == 0) for c, n in zip(counts, sizes))
        assert_equal(exhausted, no_item_left, clause="MIX-4", what=f"exhausted at step {step}", repro=repro)


@pytest.mark.clause("MIX-4")
def test_weight_fn_overrides_the_configured_weights():
    stream = mix([5, 5], MixConfig(weights=(1.0, 0.0)), 0, weight_fn=lambda *args: [0.0, 1.0])
    assert_equal(stream, [(1, j) for j in range(5)], clause="MIX-4", what="stream with weight_fn favouring source 1")


@pytest.mark.clause("MIX-4")
def test_a_curriculum_weight_fn_shifts_the_proportions_over_steps():
    def curriculum(step, sizes, taken, exhausted):
        return [max(0.0, 1000.0 - step), float(step)]

    state, stream = initial_state(2), []
    for _ in range(1000):
        item, state = next_item(state, [10**6, 10**6], MixConfig(seed=5), 0, curriculum)
        stream.append(item)
    early = sum(1 for s, _ in stream[:200] if s == 0) / 200
    late = sum(1 for s, _ in stream[800:] if s == 0) / 200
    check(early > 0.75 and late < 0.25, clause="MIX-4",
          what=f"share of source 0 early={early:.2f} (should be > 0.75) and late={late:.2f} (should be < 0.25)")


@pytest.mark.clause("MIX-4", "MIX-7")
def test_exhausted_sources_are_masked_under_all_exhausted_whatever_weight_fn_says():
    stream = mix([1, 5], MixConfig(stopping="all_exhausted", seed=2), 0, weight_fn=lambda *args: [1e9, 1.0])
    assert_equal(stream, [(0, 0)] + [(1, j) for j in range(5)], clause="MIX-4", what="stream")


# --- MIX-5: invalid weights -------------------------------------------------------------------------


@pytest.mark.clause("MIX-5")
@pytest.mark.parametrize("weights, mention", [((1.0, -0.5), "weights[1]=-0.5"), ((math.nan, 1.0), "weights[0]=nan"),
                                              ((1.0, math.inf), "weights[1]=inf"), ((0.0, 0.0), "all zero"),
                                              ((), "non-empty")])
def test_invalid_configured_weights_are_refused(weights, mention):
    assert_raises_typed(ConfigError, MixConfig, weights=weights, clause="MIX-5", what=f"MixConfig(weights={weights})",
                        mentions=[mention])


@pytest.mark.clause("MIX-5")
def test_configured_weights_of_the_wrong_length_are_refused():
    assert_raises_typed(ConfigError, mix, [3, 3, 3], MixConfig(weights=(1.0, 1.0)), 0, clause="MIX-5",
                        what="two weights for three sources", mentions=["weights", "3 sources"])


@pytest.mark.clause("MIX-5")
@pytest.mark.parametrize("returned, mention", [([1.0], "1 weights"), ([1.0, -1.0], "weights[1]=-1.0"),
                                               ([math.nan, 1.0], "weights[0]=nan"), ([0.0, 0.0], "all weights")])
def test_invalid_weight_fn_results_are_refused_naming_the_step(returned, mention):
    def late_failure(step, *args):
        return [1.0, 1.0] if step < 3 else returned

    assert_raises_typed(ConfigError, mix, [9, 9], MixConfig(), 0, weight_fn=late_failure, clause="MIX-5",
                        what=f"weight_fn returning {returned} at step 3", mentions=[mention, "step 3"])


@pytest.mark.clause("MIX-5")
@pytest.mark.parametrize("stopping", ["all_exhausted", "all_exhausted_oversample"])
def test_a_static_zero_weight_on_a_nonempty_source_is_refused_when_every_source_must_run_out(stopping):
    assert_raises_typed(ConfigError, mix, [3, 3], MixConfig(weights=(1.0, 0.0), stopping=stopping), 0, clause="MIX-5",
                        what=f"weights (1, 0) under {stopping}", mentions=["weights[1]=0", "never"])
    check(mix([3, 0], MixConfig(weights=(1.0, 0.0), stopping=stopping), 0)[:3] == [(0, 0), (0, 1), (0, 2)],
          clause="MIX-5", what="a zero weight on an empty source was refused")


@pytest.mark.clause("MIX-5")
def test_a_weight_fn_that_zeroes_every_remaining_source_is_refused_naming_the_step():
    def only_source_zero(step, sizes, taken, exhausted):
        return [1.0, 0.0]

    assert_raises_typed(ConfigError, mix, [2, 3], MixConfig(stopping="all_exhausted"), 0, weight_fn=only_source_zero,
                        clause="MIX-5", what="weight 0 for the only source left", mentions=["step 2"])


# --- MIX-6, MIX-7, MIX-8: weighted stopping invariants -----------------------------------------------


@pytest.mark.clause("MIX-6")
@given(sizes=nonempty_sizes_st, data=st.data(), seed=seed_st)
def test_weighted_first_exhausted_ends_on_a_draw_of_a_source_that_has_run_out(sizes, data, seed):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes))))
    config = MixConfig(weights=weights, seed=seed)
    items, _, final = _states(sizes, config, 0)
    counts = Counter(s for s, _ in items)
    last = choose_weighted(weights, rng.unit(rng.derive_key(seed, 0, rng.Stream.MIX), final.step - 1))
    repro = {"sizes": sizes, "config": config}
    check(all(counts[s] <= n for s, n in enumerate(sizes)), clause="MIX-6", what=f"a source was oversampled: {counts}",
          repro=repro)
    assert_equal(counts[last], sizes[last], clause="MIX-6", what=f"items taken from source {last} chosen at the end",
                 repro=repro)


@pytest.mark.clause("MIX-7")
@given(sizes=sizes_st, data=st.data(), seed=seed_st, epoch=epoch_st)
def test_weighted_all_exhausted_emits_every_item_exactly_once(sizes, data, seed, epoch):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes))))
    config = MixConfig(weights=weights, stopping="all_exhausted", seed=seed)
    items, _, final = _states(sizes, config, epoch)
    repro = {"sizes": sizes, "config": config, "epoch": epoch}
    assert_exactly_once(items, [(s, j) for s, n in enumerate(sizes) for j in range(n)], clause="MIX-7",
                        what="weighted all_exhausted stream", repro=repro)
    assert_equal(final.step, sum(sizes), clause="MIX-7", what="steps (no ending draw)", repro=repro)


@pytest.mark.clause("MIX-8")
@given(sizes=sizes_st, data=st.data(), seed=seed_st, weighted=st.booleans())
def test_oversample_covers_every_item_and_stops_right_after_the_last_first_exhaustion(sizes, data, seed, weighted):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes)))) if weighted else None
    config = MixConfig(weights=weights, stopping="all_exhausted_oversample", seed=seed)
    items = mix(sizes, config, 0)
    universe = {(s, j) for s, n in enumerate(sizes) for j in range(n)}
    repro = {"sizes": sizes, "config": config}
    check(set(items) == universe, clause="MIX-8", what=f"items {sorted(set(items))} do not cover {sorted(universe)}",
          repro=repro)
    if items:
        s, j = items[-1]
        check(j == sizes[s] - 1 and (s, j) not in items[:-1], clause="MIX-8",
              what=f"the last item {(s, j)} is not the first exhaustion of source {s}", repro=repro)


@pytest.mark.clause("MIX-8")
def test_oversample_hand_example_restarts_the_small_source():
    assert_equal(mix([1, 3], MixConfig(stopping="all_exhausted_oversample"), 0),
                 [(0, 0), (1, 0), (0, 0), (1, 1), (0, 0), (1, 2)], clause="MIX-8", what="sizes [1, 3]")


# --- MIX-9: empty sources ---------------------------------------------------------------------------


@pytest.mark.clause("MIX-9")
@given(sizes=sizes_st, data=st.data(), seed=seed_st, weighted=st.booleans(),
       stopping=st.sampled_from(["all_exhausted", "all_exhausted_oversample"]))
def test_empty_sources_are_invisible_to_the_all_exhausted_variants(sizes, data, seed, weighted, stopping):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes)))) if weighted else None
    live = [s for s, n in enumerate(sizes) if n > 0]
    config = MixConfig(weights=weights, stopping=stopping, seed=seed)
    repro = {"sizes": sizes, "config": config}
    if not live:
        assert_equal(mix(sizes, config, 0), [], clause="MIX-9", what="stream of empty sources", repro=repro)
        return
    compact = MixConfig(weights=tuple(weights[s] for s in live) if weighted else None, stopping=stopping, seed=seed)
    expected = [(live[s], j) for s, j in mix([sizes[s] for s in live], compact, 0)]
    assert_equal(mix(sizes, config, 0), expected, clause="MIX-9", what="stream with empty sources", repro=repro)


@pytest.mark.clause("MIX-9")
@pytest.mark.parametrize("stopping", STOPPING_STRATEGIES)
@pytest.mark.parametrize("sizes", [[], [0], [0, 0, 0]])
def test_only_empty_sources_give_an_empty_stream(stopping, sizes):
    for weights in (None, (1.0,) * len(sizes) or None):
        assert_equal(mix(sizes, MixConfig(weights=weights, stopping=stopping), 0), [], clause="MIX-9",
                     what=f"stream of sizes {sizes}", repro={"weights": weights})


@pytest.mark.clause("MIX-9")
def test_an_empty_source_ends_a_weighted_first_exhausted_stream_when_drawn():
    config = MixConfig(weights=(1.0, 1.0), seed=0)
    items, _, final = _states([0, 10**6], config, 0)
    key = rng.derive_key(0, 0, rng.Stream.MIX)
    first_zero = next(t for t in itertools.count() if rng.unit(key, t) < 0.5)
    assert_equal(len(items), first_zero, clause="MIX-9", what="items before source 0 is drawn")
    assert_equal(final.step, first_zero + 1, clause="MIX-9", what="steps")


# --- MIX-10: resume -------------------------------------------------------------------------------


@pytest.mark.clause("MIX-10")
@given(sizes=sizes_st, data=st.data(), stopping=stopping_st, seed=seed_st, epoch=epoch_st,
       kind=st.sampled_from(["round_robin", "weights", "weight_fn"]))
def test_resuming_from_the_state_after_any_prefix_yields_the_rest_of_the_stream(sizes, data, stopping, seed, epoch, kind):
    weights = tuple(data.draw(st.lists(weight_st, min_size=len(sizes), max_size=len(sizes)))) if kind == "weights" else None
    weight_fn = balance_remaining if kind == "weight_fn" else None
    config = MixConfig(weights=weights, stopping=stopping, seed=seed)
    items, states, final = _states(sizes, config, epoch, weight_fn)
    repro = {"sizes": sizes, "config": config, "epoch": epoch, "weight_fn": kind}
    for k, state in enumerate(states):
        restored = MixState(**json.loads(json.dumps(dataclasses.asdict(state))))
        assert_equal(restored, state, clause="MIX-10", what=f"state after {k} items through JSON", repro=repro)
        rest, current = [], restored
        while True:
            item, current = next_item(current, sizes, config, epoch, weight_fn)
            if item is None:
                break
            rest.append(item)
        assert_equal(rest, items[k:], clause="MIX-10", what=f"stream resumed after {k} items", repro=repro)
        assert_equal(current, final, clause="MIX-10", what=f"final state resumed after {k} items", repro=repro)
    assert_equal(next_item(final, sizes, config, epoch, weight_fn), (None, final), clause="MIX-10",
                 what="next_item on a done state", repro=repro)


@pytest.mark.clause("MIX-10")
def test_the_state_after_two_round_robin_items_is_the_documented_cursor():
    _, states, _ = _states([3, 2], MixConfig(), 0)
    assert_equal(states[2], MixState(step=2, taken=(1, 1), cursor=(1, 1), exhausted=(False, False),
                                     exhausted_once=(False, False), next_source=0, done=False),
                 clause="MIX-10", what="state after 2 items")


# --- MIX-11: balance_remaining ---------------------------------------------------------------------


@pytest.mark.clause("MIX-11")
def test_balance_remaining_weights_by_items_left_with_forgathers_fallback():
    assert_equal(balance_remaining(5, [3, 5, 4], [1, 5, 0], [False, True, False]), [2.0, 0.0, 4.0], clause="MIX-11",
                 what="weights")
    assert_equal(balance_remaining(0, [3, 2], [7, 2], [False, True]), [1.0, 1.0], clause="MIX-11",
                 what="weights when nothing is left (oversampled source, exhausted source)")


@pytest.mark.clause("MIX-11")
def test_balance_remaining_makes_a_small_source_last_until_near_the_end():
    stream = mix([100, 900], MixConfig(stopping="all_exhausted", seed=4), 0, weight_fn=balance_remaining)
    last_small = max(t for t, (s, _) in enumerate(stream) if s == 0)
    check(last_small > 0.9 * len(stream), clause="MIX-11",
          what=f"source 0 ran out at item {last_small} of {len(stream)}, long before the end")


# --- MIX-12: validation ----------------------------------------------------------------------------


@pytest.mark.clause("MIX-12")
def test_bad_configuration_sizes_epochs_and_states_are_refused_with_typed_errors():
    assert_raises_typed(ConfigError, MixConfig, stopping="longest", clause="MIX-12", what="stopping='longest'",
                        mentions=["stopping='longest'", "first_exhausted"])
    assert_raises_typed(ConfigError, MixConfig, seed=-1, clause="MIX-12", what="seed=-1", mentions=["seed=-1"])
    assert_raises_typed(ConfigError, mix, [3, -1], MixConfig(), 0, clause="MIX-12", what="size -1",
                        mentions=["source_sizes[1]=-1"])
    assert_raises_typed(ConfigError, mix, [3, 1], MixConfig(), -2, clause="MIX-12", what="epoch -2", mentions=["epoch=-2"])
    assert_raises_typed(StateError, next_item, initial_state(3), [2, 2], MixConfig(), 0, clause="MIX-12",
                        what="a 3-source state for 2 sources", mentions=["3 sources"])
    corrupt = dataclasses.replace(initial_state(2), cursor=(5, 0))
    assert_raises_typed(StateError, next_item, corrupt, [2, 2], MixConfig(), 0, clause="MIX-12",
                        what="cursor beyond the source", mentions=["cursor[0]=5"])
    inconsistent = dataclasses.replace(initial_state(2), cursor=(2, 0))
    assert_raises_typed(StateError, next_item, inconsistent, [2, 2], MixConfig(), 0, clause="MIX-12",
                        what="a used-up source not flagged exhausted", mentions=["exhausted[0]"])


# ---------------------------------------------------------------- MosaicML-style streams (MIX-15, MIX-16)


@st.composite
def stream_setups(draw):
    k = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 12), min_size=k, max_size=k))
    if draw(st.booleans()):
        streams = [StreamConfig(proportion=draw(st.sampled_from([0.1, 0.25, 0.5, 1.0, 3.0]))) for _ in range(k)]
    else:
        streams = [draw(st.sampled_from([StreamConfig(), StreamConfig(repeat=0.5), StreamConfig(repeat=2.5),
                                         StreamConfig(choose=draw(st.integers(0, 15)))])) for _ in range(k)]
    epoch_size = draw(st.one_of(st.none(), st.integers(1, 40)))
    return sizes, streams, epoch_size


@pytest.mark.clause("MIX-15")
@given(setup=stream_setups(), seed=seed_st, epoch=epoch_st)
def test_streams_emit_exact_counts_with_whole_passes_first(setup, seed, epoch):
    sizes, streams, epoch_size = setup
    try:
        counts = stream_counts(sizes, streams, epoch_size)
    except ConfigError:
        assume(False)
    if epoch_size is not None:
        assert_equal(sum(counts), epoch_size, clause="MIX-15", what="counts sum to epoch_size", repro={"setup": setup})
    items = mix_streams(sizes, streams, seed, epoch, epoch_size=epoch_size)
    per = Counter(s for s, _ in items)
    assert_equal([per[i] for i in range(len(sizes))], counts, clause="MIX-15", what="items per stream",
                 repro={"setup": setup, "seed": seed})
    for i, (n, c) in enumerate(zip(sizes, counts)):
        seen = Counter(j for s, j in items if s == i)
        check(all(c // n <= seen[j] <= c // n + 1 for j in range(n)) and sum(seen.values()) == c, clause="MIX-15",
              what=f"stream {i}: each sample {c // n} or {c // n + 1} times in {c} items, got {dict(seen)}",
              repro={"setup": setup, "seed": seed})


@pytest.mark.clause("MIX-15")
def test_stream_counts_follow_the_documented_examples_and_refuse_bad_streams():
    assert_equal(stream_counts([100, 40], [StreamConfig(repeat=0.5), StreamConfig(choose=10)]), [50, 10],
                 clause="MIX-15", what="repeat and choose")
    assert_equal(stream_counts([100, 40], [StreamConfig(proportion=0.7), StreamConfig(proportion=0.3)], epoch_size=9),
                 [6, 3], clause="MIX-15", what="proportions of 9")
    assert_raises_typed(ConfigError, StreamConfig, proportion=0.3, repeat=2.0, clause="MIX-15",
                        what="proportion with repeat", mentions=["at most one"])
    for bad in (0, -3):
        assert_raises_typed(ConfigError, stream_counts, [5], [StreamConfig()], bad, clause="MIX-15",
                            what=f"epoch_size={bad}", mentions=[f"epoch_size={bad}"])
    assert_raises_typed(ConfigError, stream_counts, [5, 5], [StreamConfig(proportion=0.5), StreamConfig()],
                        clause="MIX-15", what="proportion on some streams only", mentions=["every stream a proportion"])
    assert_raises_typed(ConfigError, stream_counts, [5, 0], [StreamConfig(), StreamConfig(choose=2)],
                        clause="MIX-15", what="a count for an empty source", mentions=["empty"])
    a = mix_streams([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], seed=0, epoch=0)
    b = mix_streams([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], seed=0, epoch=1)
    check(sorted(a) == sorted(x for x in a) and len(a) == len(b) == 7, clause="MIX-15", what="epoch of 7 items")


# ---------------------------------------------------------------- what a mixture refuses (MIX-17, MIX-18), shares (MIX-19)


@pytest.mark.clause("MIX-17")
@given(sources=st.lists(st.tuples(st.sampled_from(["web", "code"]), st.integers(0, 12), st.integers(0, 12)),
                        min_size=1, max_size=4))
def test_repeated_rows_are_exactly_the_pairs_of_sources_sharing_a_document(sources):
    identities = [(data, range(a, b)) for data, a, b in sources]
    oracle = [(i, j, sorted(set(identities[i][1]) & set(identities[j][1])))
              for i, j in itertools.combinations(range(len(identities)), 2)
              if identities[i][0] == identities[j][0] and set(identities[i][1]) & set(identities[j][1])]
    got = [(i, j, list(rows)) for i, j, rows in repeated_rows(identities)]
    assert_equal(got, oracle, clause="MIX-17", what="pairs reading a document twice", repro={"sources": sources})
    if oracle:
        i, j, shared = oracle[0]
        assert_raises_typed(ConfigError, check_distinct_sources, identities, clause="MIX-17", what="repeated rows",
                            mentions=[f"sources[{i}]", f"sources[{j}]", "allow_repeat=True", f"{len(shared)} documents"])
    else:
        check_distinct_sources(identities)
    check_distinct_sources(identities, allow_repeat=True)


@pytest.mark.clause("MIX-17")
def test_a_reference_mixture_refuses_a_corpus_twice_and_overlapping_splits_unless_allow_repeat():
    corpus = [[[d, d + 1] for d in range(1, 14)]]
    other = [[[d, d + 2] for d in range(100, 104)]]
    p = PackingConfig(seq_len=2)
    whole = PipelineConfig(packing=p)
    head, tail = PipelineConfig(packing=p, split="train[:60%]"), PipelineConfig(packing=p, split="train[50%:]")
    assert_raises_typed(ConfigError, MixtureReferenceLoader, [corpus, corpus], MixtureConfig(sources=(whole, whole)),
                        clause="MIX-17", what="one corpus twice", mentions=["same source", "13 documents", "sources[1]"])
    assert_raises_typed(ConfigError, MixtureReferenceLoader, [other, corpus, corpus],
                        MixtureConfig(sources=(whole, head, tail)), clause="MIX-17", what="overlapping splits",
                        mentions=["sources[1] (rows [0, 8))", "sources[2] (rows [6, 13))", "rows [6, 8) (2 documents)"])
    disjoint = MixtureReferenceLoader([corpus, corpus], MixtureConfig(sources=(head, PipelineConfig(packing=p,
                                      split="train[60%:]"))))
    check(len(disjoint.samples(0)) > 0, clause="MIX-17", what="disjoint splits of one corpus are a mixture")
    allowed = MixtureConfig(sources=(head, tail), allow_repeat=True)
    loader = MixtureReferenceLoader([corpus, corpus], allowed)
    assert_equal(loader.fingerprint, mixture_fingerprint([corpus_fingerprint(corpus)] * 2,
                                                         MixtureConfig(sources=(head, tail))),
                 clause="MIX-17", what="allow_repeat=True leaves the fingerprint as it was")
    assert_raises_typed(ConfigError, MixtureConfig, sources=(head, tail), allow_repeat=1, clause="MIX-17",
                        what="allow_repeat=1", mentions=["True or False"])


@pytest.mark.clause("MIX-18")
@given(sizes=st.lists(st.integers(0, 9), min_size=2, max_size=4), data=st.data(), seed=st.integers(0, 2**64 - 1),
       epoch=st.integers(0, 3))
def test_a_zero_weight_source_leaves_the_first_exhausted_stream_of_the_others_unchanged(sizes, data, seed, epoch):
    weights = data.draw(st.lists(st.sampled_from([0.25, 1.0, 3.0]), min_size=len(sizes), max_size=len(sizes)))
    z = data.draw(st.integers(0, len(sizes) - 1))
    zeroed = tuple(0.0 if i == z else w for i, w in enumerate(weights))
    assume(any(zeroed))
    rest = tuple(w for i, w in enumerate(weights) if i != z)
    with_zero = mix(sizes, MixConfig(weights=zeroed, seed=seed), epoch)
    without = mix([n for i, n in enumerate(sizes) if i != z], MixConfig(weights=rest, seed=seed), epoch)
    assert_equal(with_zero, [(s + (s >= z), j) for s, j in without], clause="MIX-18",
                 what=f"stream with source {z} at weight 0 against the stream without it",
                 repro={"sizes": sizes, "weights": zeroed, "seed": seed, "epoch": epoch})
    p = PipelineConfig(packing=PackingConfig(seq_len=2))
    assert_raises_typed(ConfigError, MixtureConfig, sources=(p,) * len(sizes), mixing=MixConfig(weights=zeroed, seed=seed),
                        clause="MIX-18", what=f"weights={zeroed}",
                        mentions=[f"weights[{z}]=0", f"drop sources[{z}]", "sample for sample"])


@pytest.mark.clause("MIX-18")
@pytest.mark.parametrize("stopping", STOPPING_STRATEGIES)
def test_a_reference_mixture_refuses_a_zero_weight_under_every_stopping_strategy(stopping):
    p = PipelineConfig(packing=PackingConfig(seq_len=2))
    error = assert_raises_typed(ConfigError, MixtureConfig, sources=(p, p),
                                mixing=MixConfig(weights=(1.0, 0.0), stopping=stopping), clause="MIX-18",
                                what=f"weights=(1, 0) under {stopping}", mentions=["weights[1]=0", "drop sources[1]"])
    check("all_exhausted'" not in str(error).split("drop")[1], clause="MIX-18",
          what="the message offers stopping='all_exhausted', which refuses a zero weight too")
    MixtureConfig(sources=(p, p), mixing=MixConfig(weights=(1.0, 0.0), stopping=stopping), weight_fn=balance_remaining)


@pytest.mark.clause("MIX-19")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_weight_is_the_epoch_share_under_first_exhausted_but_the_size_share_under_all_exhausted(seed):
    sizes, weights = [400, 100], (0.5, 0.5)
    first = mix(sizes, MixConfig(weights=weights, stopping="first_exhausted", seed=seed), 0)
    every = mix(sizes, MixConfig(weights=weights, stopping="all_exhausted", seed=seed), 0)
    share = sum(s == 0 for s, _ in first) / len(first)
    check(abs(share - 0.5) <= 4 * math.sqrt(0.25 / len(first)), clause="MIX-19",
          what=f"first_exhausted: source 0 holds {share:.3f} of {len(first)} samples, weight share 0.5")
    assert_equal(sum(s == 0 for s, _ in every) / len(every), 0.8, clause="MIX-19",
                 what="all_exhausted: source 0's share is its size share 400/500, whatever the weights")
    ran_out = max(t for t, (s, _) in enumerate(every) if s == 1) + 1
    assert_equal(every[:ran_out], first[:ran_out], clause="MIX-19",
                 what="all_exhausted draws as first_exhausted until source 1 runs out")
    check(all(s == 0 for s, _ in every[ran_out:]), clause="MIX-19", what="after source 1 ran out, source 0 alone")


# ---------------------------------------------------------------- batching methods (MIX-16, MIX-20, MIX-21)
#
# Oracle: the random method's per-stream subsequences. Under every method stream i's items are its virtual
# items j = 0, 1, ... (MIX-15), so the random epoch lists them in order, and a composed epoch must use a prefix.


def _per_stream(items, k):
    return [[x for s, x in items if s == i] for i in range(k)]


def _largest_remainder(counts, g):
    total = sum(counts)
    exact = [Fraction(c * g, total) for c in counts]
    base = [int(q) for q in exact]
    extra = sorted(range(len(counts)), key=lambda i: (base[i] - exact[i], i))[:g - sum(base)]
    return [b + (i in extra) for i, b in enumerate(base)]


@st.composite
def batching_setups(draw):
    sizes, streams, epoch_size = draw(stream_setups())
    block = draw(st.integers(1, 4))
    return sizes, streams, epoch_size, block, block * draw(st.integers(1, 3))


def _composed(setup, seed, epoch, method):
    sizes, streams, epoch_size, device, glob = setup
    try:
        counts = stream_counts(sizes, streams, epoch_size)
        items = mix_streams(sizes, streams, seed, epoch, epoch_size=epoch_size, batching_method=method,
                            global_batch_size=glob, device_batch_size=device if method == "device_per_stream" else None)
    except ConfigError:
        assume(False)
    random = mix_streams(sizes, streams, seed, epoch, epoch_size=epoch_size)
    return counts, items, _per_stream(random, len(sizes))


@pytest.mark.clause("MIX-20")
@given(setup=batching_setups(), seed=seed_st, epoch=epoch_st)
def test_stratified_batches_hold_each_streams_largest_remainder_count_of_its_next_items(setup, seed, epoch):
    counts, items, random = _composed(setup, seed, epoch, "stratified")
    g, k = setup[4], len(counts)
    if not sum(counts):
        return assert_equal(items, [], clause="MIX-20", what="empty epoch")
    b = _largest_remainder(counts, g)
    steps = min(c // x for c, x in zip(counts, b) if x)
    assert_equal(len(items), steps * g, clause="MIX-20", what="whole batches while every stream can fill its part",
                 repro={"setup": setup, "seed": seed})
    for t in range(steps):
        batch = items[t * g:(t + 1) * g]
        for i in range(k):
            assert_equal(sorted(x for s, x in batch if s == i), sorted(random[i][t * b[i]:(t + 1) * b[i]]),
                         clause="MIX-20", what=f"batch {t}: stream {i}'s items {t * b[i]}..{(t + 1) * b[i] - 1}",
                         repro={"setup": setup, "seed": seed, "epoch": epoch})


@pytest.mark.clause("MIX-21")
@pytest.mark.parametrize("method", ["per_stream", "device_per_stream"])
@given(setup=batching_setups(), seed=seed_st, epoch=epoch_st)
def test_per_stream_blocks_hold_one_stream_and_each_stream_trains_a_prefix_of_its_items(method, setup, seed, epoch):
    counts, items, random = _composed(setup, seed, epoch, method)
    device, g = setup[3], setup[4]
    block = g if method == "per_stream" else device
    blocks = sum(c // block for c in counts)
    assert_equal(len(items), blocks // (g // block) * g, clause="MIX-21", what="whole steps of whole blocks",
                 repro={"setup": setup, "seed": seed})
    for start in range(0, len(items), block):
        check(len({s for s, _ in items[start:start + block]}) == 1, clause="MIX-21",
              what=f"the block at {start} mixes streams: {items[start:start + block]}", repro={"setup": setup})
    for i, mine in enumerate(_per_stream(items, len(counts))):
        assert_equal(mine, random[i][:len(mine)], clause="MIX-21", what=f"stream {i} trains its items in order",
                     repro={"setup": setup, "seed": seed, "epoch": epoch})
        check(len(mine) % block == 0 and (method == "device_per_stream" or counts[i] - len(mine) < block),
              clause="MIX-21", what=f"stream {i} trains {len(mine)} of its {counts[i]} items", repro={"setup": setup})


@pytest.mark.clause("MIX-20", "MIX-21")
@pytest.mark.parametrize("method", ["stratified", "per_stream", "device_per_stream"])
def test_a_composed_epoch_changes_with_the_seed_and_the_epoch(method):
    streams = [StreamConfig(), StreamConfig()]
    kw = dict(batching_method=method, global_batch_size=4, device_batch_size=2 if method == "device_per_stream" else None)
    by_seed = {tuple(mix_streams([40, 40], streams, seed, 0, **kw)) for seed in range(4)}
    by_epoch = {tuple(mix_streams([40, 40], streams, 0, epoch, **kw)) for epoch in range(4)}
    check(len(by_seed) == 4 and len(by_epoch) == 4, clause=method, what=f"{len(by_seed)} orders over 4 seeds, "
          f"{len(by_epoch)} over 4 epochs")


@pytest.mark.clause("MIX-20", "MIX-21")
def test_batching_methods_follow_the_documented_examples():
    two = [StreamConfig(), StreamConfig()]
    assert_equal(stratified_counts([50, 30, 20], 8), [4, 2, 2], clause="MIX-20", what="largest remainder")
    assert_raises_typed(ConfigError, stratified_counts, [1, 99], 8, clause="MIX-20", what="a stream with no place",
                        mentions=["stream 0", "at least 100"])
    strat = mix_streams([6, 4], two, 0, 0, batching_method="stratified", global_batch_size=4)
    assert_equal(strat, [(1, 0), (0, 1), (1, 1), (0, 0), (1, 2), (1, 3), (0, 3), (0, 2)], clause="MIX-20",
                 what="stratified example")
    per = mix_streams([4, 3], two, 0, 0, batching_method="per_stream", global_batch_size=2)
    assert_equal(per, [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (0, 3)], clause="MIX-21", what="per_stream example")
    dev = mix_streams([4, 4], two, 0, 0, batching_method="device_per_stream", global_batch_size=4, device_batch_size=2)
    assert_equal(dev, [(1, 0), (1, 1), (1, 2), (1, 3), (0, 0), (0, 1), (0, 2), (0, 3)], clause="MIX-21",
                 what="device_per_stream example")


@pytest.mark.clause("MIX-16")
def test_a_batching_method_takes_exactly_the_batch_sizes_it_composes():
    two = [StreamConfig(), StreamConfig()]
    bad = [({"batching_method": "balanced"}, "'balanced'"),
           ({"batching_method": "per_stream"}, "needs global_batch_size="),
           ({"batching_method": "random", "global_batch_size": 4}, "global_batch_size=None"),
           ({"batching_method": "stratified", "global_batch_size": 4, "device_batch_size": 2}, "device_batch_size=None"),
           ({"batching_method": "device_per_stream", "global_batch_size": 4}, "needs device_batch_size="),
           ({"batching_method": "device_per_stream", "global_batch_size": 6, "device_batch_size": 4}, "must divide"),
           ({"batching_method": "per_stream", "global_batch_size": 0}, "global_batch_size=0")]
    for kwargs, mention in bad:
        assert_raises_typed(ConfigError, mix_streams, [3, 2], two, 0, 0, clause="MIX-16", what=str(kwargs),
                            mentions=[mention], **kwargs)
    p = PipelineConfig(packing=PackingConfig(seq_len=2))
    assert_raises_typed(ConfigError, MixtureConfig, sources=(p, p), batching_method="per_stream", clause="MIX-16",
                        what="a batching method without streams", mentions=["apply to streams"])
    plain = MixtureConfig(sources=(p, p), streams=tuple(two))
    eight = MixtureConfig(sources=(p, p), streams=tuple(two), batching_method="per_stream", global_batch_size=8)
    four = dataclasses.replace(eight, global_batch_size=4)
    prints = {mixture_fingerprint(["a", "b"], c) for c in (plain, eight, four)}
    check(len(prints) == 3, clause="MIX-16", what="the global batch size is part of the fingerprint")
    assert_equal("global_batch_size" in plain.to_json(), False, clause="MIX-16",
                 what="a random mixture's JSON (and fingerprint) is unchanged by the new fields")


@pytest.mark.clause("MIX-16")
def test_a_reference_loader_on_another_global_batch_size_is_refused_naming_both_sizes():
    p = PipelineConfig(packing=PackingConfig(seq_len=2))
    corpus = [[[1, 2, 3], [4, 5]]]
    config = MixtureConfig(sources=(p, p), streams=(StreamConfig(), StreamConfig()), batching_method="per_stream",
                           global_batch_size=4, allow_repeat=True)
    MixtureReferenceLoader([corpus, corpus], config, Topology(world_size=2, rank=1, batch_size=2))
    MixtureReferenceLoader([corpus, corpus], config, Topology(world_size=4, rank=3, batch_size=2, replication=2))
    assert_raises_typed(TopologyError, MixtureReferenceLoader, [corpus, corpus], config,
                        Topology(world_size=4, rank=0, batch_size=2), clause="MIX-16", what="8 per step, composed 4",
                        mentions=["= 8", "global_batch_size=4", "batch_size=1 on these 4"])
    assert_raises_typed(TopologyError, check_batch_topology, "device_per_stream", 4, 2, 4, 1, clause="MIX-16",
                        what="device batch 1, composed 2", mentions=["batch_size=1", "device_batch_size=2"])

