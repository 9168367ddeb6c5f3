"""Vectorised numpy mirror of ``reference.rng``: the same bits, a whole array at a time.

Conforms to RNG-1..RNG-6. Key derivation stays in Python (one key per
epoch); the per-index work (draws, Feistel rounds, cycle-walking) runs on
uint64 arrays, whose multiplication wraps modulo 2**64 exactly as the
reference's ``& MASK64`` does.

Worked example::

    >>> import numpy as np
    >>> from reference import rng as ref
    >>> k = ref.derive_key(0, 0, ref.Stream.ORDER)
    >>> p = FeistelPermutation(10, k)
    >>> p(np.arange(10)).tolist() == ref.permutation(10, k)
    True
"""

from __future__ import annotations

import numpy as np

from reference.errors import ConfigError, require
from reference.rng import FEISTEL_ROUNDS, GOLDEN_GAMMA, MASK64, Stream, derive_key, feistel_half_bits, subkey  # noqa: F401

_U = np.uint64
_C1 = _U(0xBF58476D1CE4E5B9)
_C2 = _U(0x94D049BB133111EB)
_GAMMA = _U(GOLDEN_GAMMA)
_ROUND_KEYS = [_U(r << 32) for r in range(FEISTEL_ROUNDS)]


def mix64(z: np.ndarray) -> np.ndarray:
    """Elementwise SplitMix64 finaliser on a uint64 array (RNG-2)."""
    z = np.asarray(z, dtype=_U)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U(30))) * _C1
        z = (z ^ (z >> _U(27))) * _C2
    return z ^ (z >> _U(31))


def draw(key: int, counters: np.ndarray) -> np.ndarray:
    """``reference.rng.draw(key, c)`` for every ``c`` in ``counters`` (RNG-2)."""
    c = np.asarray(counters, dtype=_U)
    with np.errstate(over="ignore"):
        return mix64(_U(key & MASK64) + (c + _U(1)) * _GAMMA)


def below(key: int, counters: np.ndarray, n: int) -> np.ndarray:
    """``reference.rng.below`` elementwise, as int64 (RNG-3)."""
    require(n >= 1, ConfigError, f"cannot draw below n={n}; n must be >= 1")
    return (draw(key, counters) % _U(n)).astype(np.int64)


def unit(key: int, counters: np.ndarray) -> np.ndarray:
    """``reference.rng.unit`` elementwise (RNG-4): exact, since 53-bit integers are exact doubles."""
    return (draw(key, counters) >> _U(11)).astype(np.float64) * (1.0 / (1 << 53))


def feistel(n: int, keys: int | np.ndarray, x: np.ndarray) -> np.ndarray:
    """``reference.rng.FeistelPermutation(n, keys[j])(x[j])`` for every j, as int64 (RNG-5).

    ``keys`` is one key for all elements or one per element: the window shuffle
    permutes every window with its own sub-key, and evaluating all windows of
    one size together turns a Python loop over windows into a few array passes.

    >>> from reference.rng import FeistelPermutation as Ref
    >>> feistel(5, np.array([7, 9, 7], dtype=np.uint64), np.array([1, 1, 4])).tolist() == [Ref(5, 7)(1), Ref(5, 9)(1), Ref(5, 7)(4)]
    True
    """
    half = feistel_half_bits(n)
    h, mask = _U(half), _U((1 << half) - 1)
    x = np.asarray(x, dtype=_U)
    keys = np.broadcast_to(np.asarray(keys, dtype=_U), x.shape)

    def encrypt(v: np.ndarray, k: np.ndarray) -> np.ndarray:
        left, right = v >> h, v & mask
        for r in range(FEISTEL_ROUNDS):
            left, right = right, left ^ (mix64(k ^ mix64(_ROUND_KEYS[r] | right)) & mask)
        return (left << h) | right

    out = encrypt(x, keys)
    bound = _U(n)
    pending = np.flatnonzero(out >= bound)
    while pending.size:
        out[pending] = encrypt(out[pending], keys[pending])
        pending = pending[out[pending] >= bound]
    return out.astype(np.int64)


class FeistelPermutation:
    """Vectorised ``reference.rng.FeistelPermutation`` (RNG-5): ``p(indices)`` is bit-identical."""

    __slots__ = ("n", "key")

    def __init__(self, n: int, key: int) -> None:
        require(n >= 0, ConfigError, f"permutation size n={n} must be >= 0")
        self.n = n
        self.key = key & MASK64

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """Images of ``indices`` (any int array with values in ``[0, n)``) as int64."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"indices outside the permutation of size {self.n}")
        return feistel(self.n, self.key, idx)

    def to_array(self) -> np.ndarray:
        return self(np.arange(self.n, dtype=np.int64))
