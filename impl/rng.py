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
from reference.rng import FEISTEL_ROUNDS, GOLDEN_GAMMA, MASK64, Stream, derive_key, subkey  # noqa: F401

_U = np.uint64
_C1 = _U(0xBF58476D1CE4E5B9)
_C2 = _U(0x94D049BB133111EB)
_GAMMA = _U(GOLDEN_GAMMA)


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


class FeistelPermutation:
    """Vectorised ``reference.rng.FeistelPermutation`` (RNG-5): ``p(indices)`` is bit-identical."""

    __slots__ = ("n", "key", "half_bits", "half_mask", "_round_keys")

    def __init__(self, n: int, key: int) -> None:
        require(n >= 0, ConfigError, f"permutation size n={n} must be >= 0")
        self.n = n
        self.key = key & MASK64
        bits = max(2, (max(n, 1) - 1).bit_length())
        bits += bits & 1
        self.half_bits = bits // 2
        self.half_mask = _U((1 << self.half_bits) - 1)
        self._round_keys = [_U(r << 32) for r in range(FEISTEL_ROUNDS)]

    def _round(self, r: int, right: np.ndarray) -> np.ndarray:
        return mix64(_U(self.key) ^ mix64(self._round_keys[r] | right)) & self.half_mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h = _U(self.half_bits)
        left, right = x >> h, x & self.half_mask
        for r in range(FEISTEL_ROUNDS):
            left, right = right, left ^ self._round(r, right)
        return (left << h) | right

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """Images of ``indices`` (any int array with values in ``[0, n)``) as int64."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"indices outside the permutation of size {self.n}")
        x = self._encrypt(idx.astype(_U))
        bound = _U(self.n)
        pending = np.flatnonzero(x >= bound)
        while pending.size:
            x[pending] = self._encrypt(x[pending])
            pending = pending[x[pending] >= bound]
        return x.astype(np.int64)

    def to_array(self) -> np.ndarray:
        return self(np.arange(self.n, dtype=np.int64))
