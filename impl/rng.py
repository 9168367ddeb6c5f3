"""impl's counter-based generator: the bits of ``reference.rng``, computed by impl's own code.

Conforms to RNG-1..RNG-6. Key derivation (``derive_key``, ``subkey``) and the
scalar Feistel network (``ScalarFeistel``, for the handful of positions a
sample needs) are Python integers; the per-index work of a whole array
(draws, Feistel rounds, cycle-walking) runs on uint64 arrays, whose
multiplication wraps modulo 2**64 exactly as Python's ``& MASK64`` does.

Why its own code and not the reference's functions: conformance compares
impl with the reference; if impl called the reference's arithmetic, that
comparison would compare a function with itself. Only the format's
constants (``MASK64``, ``GOLDEN_GAMMA``, ``FEISTEL_ROUNDS``, the ``Stream``
ids) are shared. ``conformance/meta_tests/test_rng.py`` checks every
function here against its reference counterpart on generated inputs.

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

from impl.errors import ConfigError, is_integer, require
from reference.rng import FEISTEL_ROUNDS, GOLDEN_GAMMA, MASK64, Stream

__all__ = [
    "FEISTEL_ROUNDS",
    "GOLDEN_GAMMA",
    "MASK64",
    "FeistelPermutation",
    "ScalarFeistel",
    "Stream",
    "below",
    "derive_key",
    "draw",
    "feistel",
    "feistel_half_bits",
    "mix64",
    "subkey",
    "unit",
]

_U = np.uint64
_C1 = _U(0xBF58476D1CE4E5B9)
_C2 = _U(0x94D049BB133111EB)
_GAMMA = _U(GOLDEN_GAMMA)
_ROUND_KEYS = [_U(r << 32) for r in range(FEISTEL_ROUNDS)]


def _mix(z: int) -> int:
    """SplitMix64's finaliser on one Python integer (RNG-2)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _check_u64(name: str, value: int) -> int:
    require(is_integer(value) and 0 <= value <= MASK64, ConfigError,
            f"{name}={value!r} must be an integer in [0, 2**64); pass a non-negative integer")
    return int(value)


def derive_key(seed: int, epoch: int, stream: int) -> int:
    """The 64-bit key of one ``(seed, epoch, stream)`` (RNG-1): each folded in through SplitMix64's finaliser.

    >>> derive_key(0, 0, Stream.ORDER) == derive_key(0, 0, Stream.ORDER) != derive_key(0, 1, Stream.ORDER)
    True
    """
    seed, epoch, stream = _check_u64("seed", seed), _check_u64("epoch", epoch), _check_u64("stream", stream)
    k = _mix(seed + GOLDEN_GAMMA)
    k = _mix(k ^ ((epoch + GOLDEN_GAMMA) & MASK64))
    return _mix(k ^ ((stream * GOLDEN_GAMMA) & MASK64))


def subkey(key: int, index: int) -> int:
    """The key of sub-problem ``index`` of ``key`` (a window, a pack) (RNG-6).

    >>> subkey(7, 0) != subkey(7, 1)
    True
    """
    require(is_integer(index) and index >= 0, ConfigError, f"sub-key index={index!r} must be an integer >= 0")
    return _mix((key & MASK64) ^ _mix(((int(index) + 1) * GOLDEN_GAMMA) & MASK64))


def feistel_half_bits(n: int) -> int:
    """Bits per Feistel half for a domain of ``n``: the smallest ``h >= 1`` with ``2**(2h) >= max(n, 4)`` (RNG-5).

    >>> [feistel_half_bits(n) for n in (0, 4, 5, 16, 17)]
    [1, 1, 2, 2, 3]
    """
    require(is_integer(n) and n >= 0, ConfigError, f"permutation size n={n!r} must be an integer >= 0")
    bits = max(2, (max(int(n), 1) - 1).bit_length())
    return (bits + 1) // 2


class ScalarFeistel:
    """The keyed bijection of ``[0, n)`` (RNG-5) on Python integers, one index at a time.

    Why a scalar twin of ``FeistelPermutation``: a numpy evaluation has a
    fixed cost per cycle-walking pass, many times what a scalar evaluation of
    one index costs, and a sample of a packed dataset needs only a handful of
    indices.

    >>> p = ScalarFeistel(5, 7)
    >>> sorted(p(i) for i in range(5))
    [0, 1, 2, 3, 4]
    >>> [p(i) for i in range(5)] == FeistelPermutation(5, 7)(np.arange(5)).tolist()
    True
    """

    __slots__ = ("_half", "_mask", "_round_bases", "key", "n")

    def __init__(self, n: int, key: int) -> None:
        self._half = feistel_half_bits(n)
        self.n = int(n)
        self.key = key & MASK64
        self._mask = (1 << self._half) - 1
        self._round_bases = tuple(r << 32 for r in range(FEISTEL_ROUNDS))

    def _encrypt(self, x: int) -> int:
        half, mask, key = self._half, self._mask, self.key
        left, right = x >> half, x & mask
        for base in self._round_bases:
            left, right = right, left ^ (_mix(key ^ _mix(base | right)) & mask)
        return (left << half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside the permutation of size {self.n}")
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x


def mix64(z: np.ndarray) -> np.ndarray:
    """Elementwise SplitMix64 finaliser on a uint64 array (RNG-2)."""
    z = np.asarray(z, dtype=_U)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U(30))) * _C1
        z = (z ^ (z >> _U(27))) * _C2
    mixed: np.ndarray = z ^ (z >> _U(31))
    return mixed


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


_SHIFTS = (_U(30), _U(27), _U(31))

WALK_SCALAR = 8
"""With a ``ScalarFeistel`` to finish them, up to this many positions still outside ``[0, n)`` after a pass are
evaluated by it (cycle-walking sends ~5 % of positions round again when ``n`` is just below a power of 4; another
array pass over a few of them costs about ten scalar evaluations)."""


def _mix_in_place(z: np.ndarray, scratch: np.ndarray) -> None:
    """SplitMix64's finaliser (RNG-2) on uint64 ``z`` in place (``scratch``: a buffer of its shape)."""
    for shift, factor in zip(_SHIFTS, (_C1, _C2)):
        np.right_shift(z, shift, out=scratch)
        np.bitwise_xor(z, scratch, out=z)
        np.multiply(z, factor, out=z)
    np.right_shift(z, _SHIFTS[2], out=scratch)
    np.bitwise_xor(z, scratch, out=z)


def _encrypt(x: np.ndarray, half: int, keys: np.uint64 | np.ndarray) -> np.ndarray:
    """One application of RNG-5's Feistel network (no cycle-walking) to uint64 ``x``: a new uint64 array.

    Why four buffers written in place: no temporary per operation and no
    ``np.errstate`` around each multiplication (uint64 arrays wrap
    silently) halves the fixed cost of a pass, which is all there is for the
    few dozen positions of a resumed loader's first batch.
    """
    mask = _U((1 << half) - 1)
    left: np.ndarray = np.right_shift(x, _U(half))
    right: np.ndarray = np.bitwise_and(x, mask)
    f, scratch = np.empty_like(x), np.empty_like(x)
    for base in _ROUND_KEYS:          # (L, R) -> (R, L ^ F_r(R)), F_r(R) = mix64(key ^ mix64(r << 32 | R)) & mask
        np.bitwise_or(right, base, out=f)
        _mix_in_place(f, scratch)
        np.bitwise_xor(f, keys, out=f)
        _mix_in_place(f, scratch)
        np.bitwise_and(f, mask, out=f)
        np.bitwise_xor(f, left, out=f)
        left, right, f = right, f, left
    np.left_shift(left, _U(half), out=left)
    np.bitwise_or(left, right, out=left)
    return left


def feistel(n: int, keys: int | np.ndarray, x: np.ndarray, *, finish: ScalarFeistel | None = None) -> np.ndarray:
    """``reference.rng.FeistelPermutation(n, keys[j])(x[j])`` for every j, as int64 (RNG-5).

    ``keys`` is one key for all elements or one per element: the window shuffle
    permutes every window with its own sub-key, and evaluating all windows of
    one size together turns a Python loop over windows into a few array passes.
    ``finish`` (``ScalarFeistel(n, key)`` of the one key) evaluates the last
    ``WALK_SCALAR`` or fewer cycle-walking positions from the start, which walks
    the same cycle for less than another array pass.

    >>> from reference.rng import FeistelPermutation as Ref
    >>> feistel(5, np.array([7, 9, 7], dtype=np.uint64), np.array([1, 1, 4])).tolist() == [Ref(5, 7)(1), Ref(5, 9)(1), Ref(5, 7)(4)]
    True
    >>> pos = np.arange(0, 1000, 7)
    >>> feistel(1000, 9, pos, finish=ScalarFeistel(1000, 9)).tolist() == [Ref(1000, 9)(p) for p in pos.tolist()]
    True
    """
    half = feistel_half_bits(n)
    flat = np.asarray(x, dtype=_U).reshape(-1)
    key_array = np.broadcast_to(np.asarray(keys, dtype=_U), np.shape(x)).reshape(-1) if np.ndim(keys) else None
    out = _encrypt(flat, half, _U(keys) if key_array is None else key_array)
    bound = _U(n)
    pending = np.flatnonzero(out >= bound)
    while pending.size > (0 if finish is None else WALK_SCALAR):
        out[pending] = _encrypt(out[pending], half, _U(keys) if key_array is None else key_array[pending])
        pending = pending[out[pending] >= bound]
    images = out.astype(np.int64)
    if finish is not None:
        for j in pending.tolist():
            images[j] = finish(int(flat[j]))
    return images.reshape(np.shape(x))


class FeistelPermutation:
    """Vectorised ``reference.rng.FeistelPermutation`` (RNG-5): ``p(indices)`` is bit-identical."""

    __slots__ = ("_scalar", "key", "n")

    def __init__(self, n: int, key: int) -> None:
        require(n >= 0, ConfigError, f"permutation size n={n} must be >= 0")
        self.n = n
        self.key = key & MASK64
        self._scalar: ScalarFeistel | None = None

    @property
    def scalar(self) -> ScalarFeistel:
        """The same permutation on Python ints (made on first use): a handful of indices, and the last cycle-walks."""
        if self._scalar is None:
            self._scalar = ScalarFeistel(self.n, self.key)
        return self._scalar

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """Images of ``indices`` (any int array with values in ``[0, n)``) as int64."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"indices outside the permutation of size {self.n}")
        return feistel(self.n, self.key, idx, finish=self.scalar)

    def to_array(self) -> np.ndarray:
        return self(np.arange(self.n, dtype=np.int64))
