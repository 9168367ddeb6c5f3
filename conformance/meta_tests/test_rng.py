"""Meta tests: the reference generator obeys RNG-1..RNG-6, and impl.rng reproduces it bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
from impl import rng as fast
from reference import rng
from reference.errors import ConfigError

u64 = st.integers(min_value=0, max_value=rng.MASK64)
small = st.integers(min_value=0, max_value=10_000)


def _sequential_splitmix64(seed: int, count: int) -> list[int]:
    """The textbook stateful SplitMix64, written independently of reference.rng."""
    out, state = [], seed
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.clause("RNG-2")
def test_draws_equal_the_published_splitmix64_sequence():
    assert_equal(rng.draw(0, 0), 0xE220A8397B1DCDAF, clause="RNG-2", what="draw(0, 0)")
    assert_equal([rng.draw(1234567, c) for c in range(50)], _sequential_splitmix64(1234567, 50),
                 clause="RNG-2", what="draws of key 1234567")


@pytest.mark.clause("RNG-1")
@given(seed=u64, epoch=small, stream=st.sampled_from(list(rng.Stream)))
def test_keys_are_pure_and_change_with_each_component(seed, epoch, stream):
    key = rng.derive_key(seed, epoch, stream)
    repro = {"seed": seed, "epoch": epoch, "stream": stream}
    assert_equal(rng.derive_key(seed, epoch, stream), key, clause="RNG-1", what="second derivation", repro=repro)
    check(rng.derive_key(seed, epoch + 1, stream) != key, clause="RNG-1", what="next epoch gives the same key", repro=repro)
    check(rng.derive_key(seed ^ 1, epoch, stream) != key, clause="RNG-1", what="another seed gives the same key", repro=repro)
    other = rng.Stream.MIX if stream != rng.Stream.MIX else rng.Stream.ORDER
    check(rng.derive_key(seed, epoch, other) != key, clause="RNG-1", what="another stream gives the same key", repro=repro)


@pytest.mark.clause("RNG-1")
def test_negative_seed_is_refused_with_the_fix():
    assert_raises_typed(ConfigError, rng.derive_key, -1, 0, rng.Stream.ORDER, clause="RNG-1",
                        what="derive_key(-1, ...)", mentions=["seed", "non-negative"])


@pytest.mark.clause("RNG-3")
@given(key=u64, counter=small, n=st.integers(min_value=1, max_value=2**40))
def test_bounded_draws_are_the_draw_modulo_n(key, counter, n):
    value = rng.below(key, counter, n)
    check(0 <= value < n, clause="RNG-3", what=f"below(...)={value} outside [0, {n})")
    assert_equal(value, rng.draw(key, counter) % n, clause="RNG-3", what="below")


@pytest.mark.clause("RNG-3")
def test_bounded_draw_of_zero_is_refused():
    assert_raises_typed(ConfigError, rng.below, 1, 0, 0, clause="RNG-3", what="below(n=0)", mentions=["n=0"])


@pytest.mark.clause("RNG-4")
@given(key=u64, counter=small)
def test_unit_floats_lie_in_the_half_open_interval_with_53_bits(key, counter):
    value = rng.unit(key, counter)
    check(0.0 <= value < 1.0, clause="RNG-4", what=f"unit={value} outside [0, 1)")
    assert_equal(value * 2**53, float(rng.draw(key, counter) >> 11), clause="RNG-4", what="unit * 2**53")


@pytest.mark.clause("RNG-4")
def test_unit_floats_are_roughly_uniform():
    key = rng.derive_key(7, 0, rng.Stream.MIX)
    values = [rng.unit(key, c) for c in range(20_000)]
    deciles = [0] * 10
    for v in values:
        deciles[int(v * 10)] += 1
    check(all(1800 < d < 2200 for d in deciles), clause="RNG-4", what=f"decile counts {deciles} far from 2000")


@pytest.mark.clause("RNG-5")
@given(n=st.integers(min_value=0, max_value=3000), key=u64)
def test_feistel_permutation_is_a_bijection_with_an_inverse(n, key):
    perm = rng.FeistelPermutation(n, key)
    image = perm.to_list()
    repro = {"n": n, "key": key}
    assert_equal(sorted(image), list(range(n)), clause="RNG-5", what="sorted image", repro=repro)
    assert_equal([perm.inverse(y) for y in image], list(range(n)), clause="RNG-5", what="inverse of image", repro=repro)


@pytest.mark.clause("RNG-5")
def test_feistel_permutation_golden_value_is_pinned():
    key = rng.derive_key(0, 0, rng.Stream.ORDER)
    assert_equal(rng.permutation(10, key), [4, 3, 8, 9, 7, 0, 1, 6, 2, 5], clause="RNG-5",
                 what="permutation(10, derive_key(0, 0, ORDER))")


@pytest.mark.clause("RNG-5")
def test_feistel_permutation_moves_items_like_a_random_permutation():
    n = 5000
    image = rng.permutation(n, rng.derive_key(11, 3, rng.Stream.ORDER))
    displacement = sum(abs(image[i] - i) for i in range(n)) / n / n
    fixed = sum(image[i] == i for i in range(n))
    check(0.30 < displacement < 0.37, clause="RNG-5", what=f"mean displacement {displacement:.3f}·n, expected about n/3")
    check(fixed < 10, clause="RNG-5", what=f"{fixed} fixed points, expected about 1")


@pytest.mark.clause("RNG-5")
def test_feistel_permutation_rejects_indices_outside_its_domain():
    perm = rng.FeistelPermutation(5, 1)
    with pytest.raises(IndexError):
        perm(5)
    with pytest.raises(IndexError):
        perm.inverse(-1)


@pytest.mark.clause("RNG-6")
@given(key=u64, index=small)
def test_subkeys_are_distinct_per_index_and_from_the_parent(key, index):
    child = rng.subkey(key, index)
    check(child != key, clause="RNG-6", what="sub-key equals its parent", repro={"key": key, "index": index})
    check(child != rng.subkey(key, index + 1), clause="RNG-6", what="neighbouring sub-keys collide",
          repro={"key": key, "index": index})


@pytest.mark.clause("RNG-2", "RNG-3", "RNG-4", "RNG-5")
@given(key=u64, n=st.integers(min_value=0, max_value=5000), bound=st.integers(min_value=1, max_value=2**63))
def test_impl_rng_reproduces_the_reference_bit_for_bit(key, n, bound):
    counters = np.arange(min(n, 300))
    repro = {"key": key, "n": n, "bound": bound}
    assert_equal(fast.draw(key, counters).tolist(), [rng.draw(key, int(c)) for c in counters], clause="RNG-2",
                 what="impl draws", repro=repro)
    assert_equal(fast.below(key, counters, bound).tolist(), [rng.below(key, int(c), bound) for c in counters],
                 clause="RNG-3", what="impl below", repro=repro)
    assert_equal(fast.unit(key, counters).tolist(), [rng.unit(key, int(c)) for c in counters], clause="RNG-4",
                 what="impl unit", repro=repro)
    assert_equal(fast.FeistelPermutation(n, key).to_array().tolist(), rng.permutation(n, key), clause="RNG-5",
                 what="impl permutation", repro=repro)


@pytest.mark.clause("RNG-1", "RNG-5", "RNG-6")
@given(seed=u64, epoch=u64, stream=st.sampled_from(list(rng.Stream)), index=st.integers(0, 2**40),
       n=st.integers(min_value=0, max_value=3000))
def test_impl_key_derivation_and_scalar_feistel_are_impl_code_equal_to_the_reference(seed, epoch, stream, index, n):
    repro = {"seed": seed, "epoch": epoch, "stream": stream, "index": index, "n": n}
    key = fast.derive_key(seed, epoch, stream)
    assert_equal(key, rng.derive_key(seed, epoch, stream), clause="RNG-1", what="impl derive_key", repro=repro)
    assert_equal(fast.subkey(key, index), rng.subkey(key, index), clause="RNG-6", what="impl subkey", repro=repro)
    assert_equal(fast.feistel_half_bits(n), rng.feistel_half_bits(n), clause="RNG-5", what="impl feistel_half_bits",
                 repro=repro)
    check(fast.derive_key is not rng.derive_key and fast.subkey is not rng.subkey, clause="RNG-1",
          what="impl.rng re-exports the reference's functions instead of computing the keys itself")
    scalar = fast.ScalarFeistel(n, key)
    probe = sorted({0, n // 3, n // 2, n - 1} & set(range(n)))
    assert_equal([scalar(i) for i in probe], [rng.FeistelPermutation(n, key)(i) for i in probe], clause="RNG-5",
                 what="impl ScalarFeistel at a few positions", repro=repro)
