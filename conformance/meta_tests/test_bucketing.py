"""Meta tests: reference.bucketing obeys BUCK-1..BUCK-8.

The oracles sort lengths themselves and check pack contiguity by trying
every layout of the short pack, so they do not reuse the reference's
sorting or pack cutting; the exact-order tests rebuild the keyed
permutations from reference.rng primitives as the clauses state them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference import rng
from reference.bucketing import (
    BucketConfig,
    bucket_at,
    bucket_buffer,
    bucket_order,
    bucket_packs,
    buffer_range,
    num_buffers,
)
from reference.errors import ConfigError

seed_st = st.integers(min_value=0, max_value=2**64 - 1)
epoch_st = st.integers(min_value=0, max_value=1000)
lengths_st = st.lists(st.integers(min_value=0, max_value=12), max_size=70)


@st.composite
def configs(draw, max_buffer=16):
    buffer_size = draw(st.integers(min_value=1, max_value=max_buffer))
    pack_size = draw(st.integers(min_value=1, max_value=buffer_size))
    return BucketConfig(buffer_size=buffer_size, pack_size=pack_size, seed=draw(seed_st))


def _key(config, epoch, b):
    return rng.subkey(rng.derive_key(config.seed, epoch, rng.Stream.BUCKET), b)


def _windows_ok(segments, lengths, pack_size):
    """Whether the segments are consecutive runs of the buffer's sorted lengths, the short one (if any) last."""
    runs = [sorted(lengths[i] for i in seg) for seg in segments]
    full = sorted(r for r in runs if len(r) == pack_size)
    short = [r for r in runs if len(r) != pack_size]
    if len(short) > 1:
        return False
    concatenated = [x for r in full + short for x in r]
    return concatenated == sorted(x for r in runs for x in r)


def _segmentations(size, pack_size):
    """Every split of a buffer's output into packs: all full but one short pack in any slot."""
    count, short = -(-size // pack_size), size % pack_size
    for slot in range(count if short else 1):
        sizes = [pack_size] * count
        if short:
            sizes[slot] = short
        bounds = [sum(sizes[:q]) for q in range(count + 1)]
        yield [range(bounds[q], bounds[q + 1]) for q in range(count)]


def _lognormal_lengths(count, seed):
    """Token counts exp(N(5, 1)) from counter draws (Box-Muller), deterministic without a global generator."""
    key = rng.derive_key(seed, 0, rng.Stream.SAMPLE_ORDER)
    out = []
    for i in range(count):
        u1, u2 = 1.0 - rng.unit(key, 2 * i), rng.unit(key, 2 * i + 1)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        out.append(max(1, int(math.exp(5.0 + z))))
    return out


def _padding_waste(lengths, order, batch):
    waste = 0
    for start in range(0, len(order), batch):
        group = [lengths[i] for i in order[start:start + batch]]
        waste += max(group) * len(group) - sum(group)
    return waste


class _Guarded(Sequence):
    """Lengths that refuse reads outside one buffer, to prove random access touches only that buffer."""

    def __init__(self, values, allowed: range):
        self.values, self.allowed = values, allowed

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        if i not in self.allowed:
            raise AssertionError(f"read lengths[{i}] outside the buffer {self.allowed}")
        return self.values[i]


# --- BUCK-1: buffers tile the input -----------------------------------------------------------------


@pytest.mark.clause("BUCK-1")
@given(lengths=lengths_st, config=configs(), epoch=epoch_st)
def test_bucket_order_is_a_permutation_and_each_buffer_keeps_its_own_positions(lengths, config, epoch):
    order = bucket_order(lengths, config, epoch)
    repro = {"lengths": lengths, "config": config, "epoch": epoch}
    assert_exactly_once(order, range(len(lengths)), clause="BUCK-1", what="bucket_order", repro=repro)
    size = config.buffer_size
    for b in range(-(-len(lengths) // size)):
        own = range(b * size, min(len(lengths), (b + 1) * size))
        assert_exactly_once(order[own.start:own.stop], own, clause="BUCK-1", what=f"output slice of buffer {b}",
                            repro=repro)
        assert_equal(list(buffer_range(len(lengths), config, b)), list(own), clause="BUCK-1", what=f"buffer_range {b}",
                     repro=repro)
    assert_equal(num_buffers(len(lengths), config), -(-len(lengths) // size), clause="BUCK-1", what="num_buffers",
                 repro=repro)


@pytest.mark.clause("BUCK-1")
def test_bucketing_no_items_gives_an_empty_order():
    assert_equal(bucket_order([], BucketConfig(buffer_size=4, pack_size=2), 0), [], clause="BUCK-1", what="order of []")


# --- BUCK-2: purity, independence, epoch ------------------------------------------------------------


@pytest.mark.clause("BUCK-2")
@given(lengths=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=70), config=configs(),
       epoch=epoch_st, data=st.data())
def test_a_buffer_ignores_lengths_outside_it(lengths, config, epoch, data):
    b = data.draw(st.integers(min_value=0, max_value=num_buffers(len(lengths), config) - 1))
    own = range(b * config.buffer_size, min(len(lengths), (b + 1) * config.buffer_size))
    changed = [x if i in own else 1000 - x - i for i, x in enumerate(lengths)]
    assert_equal(bucket_buffer(changed, config, epoch, b), bucket_buffer(lengths, config, epoch, b), clause="BUCK-2",
                 what=f"buffer {b} after changing lengths outside it",
                 repro={"lengths": lengths, "config": config, "epoch": epoch})


@pytest.mark.clause("BUCK-2")
@given(seed=seed_st, epoch=epoch_st)
def test_another_epoch_or_seed_gives_another_order_and_the_same_inputs_the_same(seed, epoch):
    lengths = [(7 * i) % 13 for i in range(64)]
    config = BucketConfig(buffer_size=16, pack_size=4, seed=seed)
    base = bucket_order(lengths, config, epoch)
    repro = {"config": config, "epoch": epoch}
    assert_equal(bucket_order(list(lengths), BucketConfig(buffer_size=16, pack_size=4, seed=seed), epoch), base,
                 clause="BUCK-2", what="second computation", repro=repro)
    check(bucket_order(lengths, config, epoch + 1) != base, clause="BUCK-2", what="epoch + 1 gave the same order",
          repro=repro)
    other = BucketConfig(buffer_size=16, pack_size=4, seed=seed ^ 1)
    check(bucket_order(lengths, other, epoch) != base, clause="BUCK-2", what="seed ^ 1 gave the same order", repro=repro)


@pytest.mark.clause("BUCK-2")
def test_documented_small_example_for_two_epochs():
    lengths, config = [5, 1, 4, 1, 9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2, seed=0)
    assert_equal(bucket_order(lengths, config, 0), [3, 1, 2, 0, 7, 5, 4, 6], clause="BUCK-2", what="epoch 0")
    assert_equal(bucket_order(lengths, config, 1), [2, 0, 1, 3, 5, 7, 4, 6], clause="BUCK-2", what="epoch 1")


# --- BUCK-3, BUCK-5, BUCK-6: the exact order ----------------------------------------------------------


@pytest.mark.clause("BUCK-3", "BUCK-5")
@given(size=st.integers(min_value=1, max_value=40), config=configs(max_buffer=40), epoch=epoch_st)
def test_equal_lengths_are_ordered_by_the_buffer_local_draw(size, config, epoch):
    config = BucketConfig(buffer_size=config.buffer_size, pack_size=1, seed=config.seed)
    lengths = [7] * size
    repro = {"size": size, "config": config, "epoch": epoch}
    for b in range(num_buffers(size, config)):
        start, stop = b * config.buffer_size, min(size, (b + 1) * config.buffer_size)
        kb = _key(config, epoch, b)
        by_draw = sorted(range(start, stop), key=lambda i: (rng.draw(kb, i - start), i))
        inter = rng.FeistelPermutation(stop - start, rng.subkey(kb, 0))
        assert_equal(bucket_buffer(lengths, config, epoch, b), [by_draw[inter(q)] for q in range(stop - start)],
                     clause="BUCK-3", what=f"buffer {b} of equal lengths", repro=repro)


@pytest.mark.clause("BUCK-3")
def test_documented_tie_break_of_two_length_one_items():
    packs = bucket_packs([5, 1, 4, 1], BucketConfig(buffer_size=4, pack_size=4, seed=0), 0, 0)
    kb = _key(BucketConfig(buffer_size=4, pack_size=4, seed=0), 0, 0)
    check(rng.draw(kb, 1) < rng.draw(kb, 3), clause="BUCK-3", what="the documented draws are not ordered as stated")
    ranked = [1, 3, 2, 0]
    intra = rng.FeistelPermutation(4, rng.subkey(kb, 1))
    assert_equal(packs, [[ranked[intra(j)] for j in range(4)]], clause="BUCK-3", what="single pack of lengths [5, 1, 4, 1]")


@pytest.mark.clause("BUCK-5", "BUCK-6")
@given(data=st.data(), config=configs(), epoch=epoch_st)
def test_distinct_lengths_follow_the_inter_and_intra_pack_feistel_orders(data, config, epoch):
    n = data.draw(st.integers(min_value=0, max_value=50))
    lengths = data.draw(st.permutations(range(100, 100 + n)))
    expected = []
    for b in range(num_buffers(n, config)):
        start, stop = b * config.buffer_size, min(n, (b + 1) * config.buffer_size)
        kb = _key(config, epoch, b)
        ranked = sorted(range(start, stop), key=lambda i: lengths[i])
        packs = [ranked[p:p + config.pack_size] for p in range(0, len(ranked), config.pack_size)]
        inter = rng.FeistelPermutation(len(packs), rng.subkey(kb, 0))
        for q in range(len(packs)):
            pack = packs[inter(q)]
            intra = rng.FeistelPermutation(len(pack), rng.subkey(kb, 1 + inter(q)))
            expected.extend(pack[intra(j)] for j in range(len(pack)))
    assert_equal(bucket_order(lengths, config, epoch), expected, clause="BUCK-5", what="bucket_order",
                 repro={"lengths": lengths, "config": config, "epoch": epoch})


@pytest.mark.clause("BUCK-6")
@given(config=configs(max_buffer=32), epoch=epoch_st)
def test_a_single_full_pack_is_the_sorted_buffer_in_intra_pack_feistel_order(config, epoch):
    size = config.buffer_size
    config = BucketConfig(buffer_size=size, pack_size=size, seed=config.seed)
    lengths = [(5 * i + 3) % size + 10 * (i % 2) for i in range(size)]
    ranked = sorted(range(size), key=lambda i: (lengths[i], rng.draw(_key(config, epoch, 0), i), i))
    intra = rng.FeistelPermutation(size, rng.subkey(_key(config, epoch, 0), 1))
    assert_equal(bucket_buffer(lengths, config, epoch, 0), [ranked[intra(j)] for j in range(size)], clause="BUCK-6",
                 what="the one pack", repro={"config": config, "epoch": epoch})


@pytest.mark.clause("BUCK-3", "BUCK-4", "BUCK-5", "BUCK-6")
@given(lengths=lengths_st, config=configs(), epoch=epoch_st)
def test_bucket_packs_flatten_to_the_buffer_and_hold_full_packs_but_one(lengths, config, epoch):
    repro = {"lengths": lengths, "config": config, "epoch": epoch}
    for b in range(num_buffers(len(lengths), config)):
        packs = bucket_packs(lengths, config, epoch, b)
        assert_equal([i for p in packs for i in p], bucket_buffer(lengths, config, epoch, b), clause="BUCK-4",
                     what=f"flattened packs of buffer {b}", repro=repro)
        short = [p for p in packs if len(p) != config.pack_size]
        check(len(short) <= 1, clause="BUCK-4", what=f"buffer {b} has {len(short)} short packs", repro=repro)


# --- BUCK-4: contiguous packs, spread and padding ------------------------------------------------------


@pytest.mark.clause("BUCK-4")
@given(lengths=lengths_st, config=configs(), epoch=epoch_st)
def test_every_pack_is_a_consecutive_run_of_its_sorted_buffer(lengths, config, epoch):
    order = bucket_order(lengths, config, epoch)
    repro = {"lengths": lengths, "config": config, "epoch": epoch}
    size, pack = config.buffer_size, config.pack_size
    for b in range(num_buffers(len(lengths), config)):
        out = order[b * size:(b + 1) * size]
        layouts = [[[out[j] for j in seg] for seg in segs] for segs in _segmentations(len(out), pack)]
        good = [segs for segs in layouts if _windows_ok(segs, lengths, pack)]
        check(bool(good), clause="BUCK-4", what=f"buffer {b} output {out} splits into no consecutive runs of sorted lengths",
              repro=repro)
        ranked = sorted(lengths[i] for i in out)
        bound = max(ranked[min(i + pack, len(ranked)) - 1] - ranked[i] for i in range(len(ranked)))
        for seg in good[0]:
            spread = max(lengths[i] for i in seg) - min(lengths[i] for i in seg)
            check(spread <= bound, clause="BUCK-4", what=f"pack {seg} spread {spread} > bound {bound}", repro=repro)


@pytest.mark.clause("BUCK-4")
def test_documented_packs_never_mix_short_and_long_lengths():
    packs = bucket_packs([30, 10, 20, 60, 50, 40], BucketConfig(buffer_size=6, pack_size=3), 0, 0)
    assert_equal(sorted(sorted(p) for p in packs), [[0, 1, 2], [3, 4, 5]], clause="BUCK-4", what="packs")


@pytest.mark.clause("BUCK-4")
def test_bucketing_cuts_padding_on_a_lognormal_corpus():
    lengths = _lognormal_lengths(2000, seed=2024)
    config = BucketConfig(buffer_size=256, pack_size=16, seed=1)
    bucketed = _padding_waste(lengths, bucket_order(lengths, config, 0), 16)
    plain = _padding_waste(lengths, list(range(len(lengths))), 16)
    check(bucketed <= 0.25 * plain, clause="BUCK-4",
          what=f"padding waste bucketed={bucketed} is not at most a quarter of unbucketed={plain}",
          repro={"corpus": "lognormal(5, 1) x 2000, seed 2024", "config": config})


# --- BUCK-7: random access ------------------------------------------------------------------------------


@pytest.mark.clause("BUCK-7")
@given(lengths=lengths_st, config=configs(), epoch=epoch_st)
def test_bucket_at_equals_bucket_order_at_every_position(lengths, config, epoch):
    order = bucket_order(lengths, config, epoch)
    assert_equal([bucket_at(lengths, config, epoch, p) for p in range(len(lengths))], order, clause="BUCK-7",
                 what="bucket_at over all positions", repro={"lengths": lengths, "config": config, "epoch": epoch})


@pytest.mark.clause("BUCK-7")
@given(lengths=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=70), config=configs(),
       epoch=epoch_st, data=st.data())
def test_bucket_at_reads_only_the_lengths_of_its_own_buffer(lengths, config, epoch, data):
    position = data.draw(st.integers(min_value=0, max_value=len(lengths) - 1))
    b = position // config.buffer_size
    own = range(b * config.buffer_size, min(len(lengths), (b + 1) * config.buffer_size))
    assert_equal(bucket_at(_Guarded(lengths, own), config, epoch, position), bucket_order(lengths, config, epoch)[position],
                 clause="BUCK-7", what=f"bucket_at({position})",
                 repro={"lengths": lengths, "config": config, "epoch": epoch})


# --- BUCK-8: validation -----------------------------------------------------------------------------------


@pytest.mark.clause("BUCK-8")
@pytest.mark.parametrize("kwargs, mention", [
    ({"buffer_size": 0, "pack_size": 1}, "buffer_size=0"),
    ({"buffer_size": 4, "pack_size": 0}, "pack_size=0"),
    ({"buffer_size": 4, "pack_size": 8}, "pack_size=8"),
    ({"buffer_size": 4, "pack_size": 2, "seed": -1}, "seed=-1"),
    ({"buffer_size": 4.0, "pack_size": 2}, "buffer_size=4.0"),
])
def test_bad_bucket_configs_are_refused_naming_the_field(kwargs, mention):
    assert_raises_typed(ConfigError, BucketConfig, **kwargs, clause="BUCK-8", what=f"BucketConfig({kwargs})",
                        mentions=[mention])


@pytest.mark.clause("BUCK-8")
def test_bad_lengths_buffer_indices_and_positions_are_refused():
    config = BucketConfig(buffer_size=4, pack_size=2)
    assert_raises_typed(ConfigError, bucket_order, [3, -1, 2], config, 0, clause="BUCK-8", what="negative length",
                        mentions=["lengths[1]=-1"])
    assert_raises_typed(ConfigError, bucket_buffer, [1] * 10, config, 0, 3, clause="BUCK-8", what="buffer_index=3 of 3",
                        mentions=["buffer_index=3", "num_buffers=3"])
    assert_raises_typed(ConfigError, bucket_at, [1] * 10, config, 0, 10, clause="BUCK-8", what="position=10 of 10",
                        mentions=["position=10"])
    assert_raises_typed(ConfigError, bucket_order, [1, 2], config, -1, clause="BUCK-8", what="epoch=-1",
                        mentions=["epoch=-1"])
