"""Counter-based randomness: the only source of randomness in loadspec.

Why counter-based: a loader that resumes in O(1) must be able to produce the
k-th random draw without producing the k-1 before it, and impl (numpy,
vectorised) must produce the same bits as this pure-Python reference. A
stateful generator (``random.Random``, ``np.random.default_rng``) gives
neither. Here every draw is a pure function of ``(key, counter)``, and every
key is a pure function of ``(seed, epoch, stream)`` (RNG-1, RNG-2).

Clauses: RNG-1 (key derivation), RNG-2 (draws), RNG-3 (bounded integers),
RNG-4 (unit floats), RNG-5 (keyed bijection), RNG-6 (sub-keys).

Worked example::

    >>> k = derive_key(seed=0, epoch=0, stream=Stream.ORDER)
    >>> draw(k, 0) == draw(k, 0)            # pure
    True
    >>> derive_key(0, 1, Stream.ORDER) != k  # the epoch is part of the key
    True
    >>> p = FeistelPermutation(10, k)
    >>> sorted(p(i) for i in range(10)) == list(range(10))
    True
    >>> all(p.inverse(p(i)) == i for i in range(10))
    True
"""

from __future__ import annotations

import enum

from reference.errors import ConfigError, require

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
FEISTEL_ROUNDS = 6


class Stream(enum.IntEnum):
    """Named, fixed stream ids: each consumer of randomness draws from its own stream.

    Values are part of the format: changing one changes every order that uses it.
    """

    ORDER = 1
    FILE_ORDER = 2
    WINDOW = 3
    BUFFER = 4
    MIX = 5
    BUCKET = 6
    SAMPLE_ORDER = 7
    BIN_ORDER = 8
    STREAMING = 9


def mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijective avalanche of one 64-bit word (RNG-2)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def derive_key(seed: int, epoch: int, stream: int) -> int:
    """The 64-bit key of one (seed, epoch, stream) (RNG-1).

    Each component is folded in through ``mix64`` so that neighbouring seeds,
    epochs or streams give unrelated keys.
    """
    require(0 <= seed <= MASK64, ConfigError, f"seed={seed} must be an integer in [0, 2**64); pass a non-negative seed")
    require(0 <= epoch <= MASK64, ConfigError, f"epoch={epoch} must be a non-negative integer")
    require(0 <= stream <= MASK64, ConfigError, f"stream={stream} must be a non-negative integer")
    k = mix64(seed + GOLDEN_GAMMA)
    k = mix64(k ^ ((epoch + GOLDEN_GAMMA) & MASK64))
    return mix64(k ^ ((int(stream) * GOLDEN_GAMMA) & MASK64))


def subkey(key: int, index: int) -> int:
    """The key of the ``index``-th sub-problem of ``key`` (a window, a buffer, a pack) (RNG-6)."""
    require(index >= 0, ConfigError, f"sub-key index={index} must be non-negative")
    return mix64(key ^ mix64((index + 1) * GOLDEN_GAMMA & MASK64))


def draw(key: int, counter: int) -> int:
    """The ``counter``-th 64-bit output of SplitMix64 started at ``key`` (RNG-2).

    Equal to the sequential generator's output number ``counter`` (0-based),
    computed without producing the ones before it.
    """
    return mix64((key + (counter + 1) * GOLDEN_GAMMA) & MASK64)


def below(key: int, counter: int, n: int) -> int:
    """A draw reduced to ``[0, n)`` by modulo (RNG-3).

    Modulo keeps impl's vectorised uint64 arithmetic bit-identical; its bias is
    below ``n / 2**64``, negligible for every n a loader sees.
    """
    require(n >= 1, ConfigError, f"cannot draw below n={n}; n must be >= 1")
    return draw(key, counter) % n


def unit(key: int, counter: int) -> float:
    """A draw as a float in ``[0, 1)`` with 53 random bits (RNG-4)."""
    return (draw(key, counter) >> 11) * (1.0 / (1 << 53))


def feistel_half_bits(n: int) -> int:
    """Bits per Feistel half for a domain of ``n``: the smallest ``h >= 1`` with ``2**(2h) >= n`` (RNG-5)."""
    require(n >= 0, ConfigError, f"permutation size n={n} must be >= 0")
    bits = max(2, (max(n, 1) - 1).bit_length())
    return (bits + (bits & 1)) // 2


class FeistelPermutation:
    """A keyed bijection of ``[0, n)`` computable at any single index (RNG-5).

    Why: a global shuffle of a billion documents should not need a billion-entry
    permutation array, and position ``i`` of the order must be computable
    without positions ``0..i-1`` (O(1) resume). A balanced Feistel network is a
    bijection of ``[0, 2**(2h))`` for any round function; cycle-walking (apply
    again while the result is ``>= n``) restricts it to ``[0, n)`` and stays a
    bijection, with fewer than 4 applications expected since ``2**(2h) < 4n``.

    Worked example (n = 5, so h = 2 and the network permutes [0, 16)): an
    index ``x`` whose encryption is 13 is encrypted again, and again, until the
    value falls below 5; the walk never leaves the cycle containing ``x``, so no
    two inputs in ``[0, 5)`` meet.

    Round ``r`` maps ``(L, R)`` to ``(R, L ^ F_r(R))`` with
    ``F_r(R) = mix64(key ^ mix64(r << 32 | R)) & (2**h - 1)``.
    """

    __slots__ = ("half_bits", "half_mask", "key", "n")

    def __init__(self, n: int, key: int) -> None:
        self.half_bits = feistel_half_bits(n)
        self.n = n
        self.key = key & MASK64
        self.half_mask = (1 << self.half_bits) - 1

    def _round(self, r: int, right: int) -> int:
        return mix64(self.key ^ mix64((r << 32) | right)) & self.half_mask

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for r in range(FEISTEL_ROUNDS):
            left, right = right, left ^ self._round(r, right)
        return (left << self.half_bits) | right

    def _decrypt(self, y: int) -> int:
        left, right = y >> self.half_bits, y & self.half_mask
        for r in reversed(range(FEISTEL_ROUNDS)):
            left, right = right ^ self._round(r, left), left
        return (left << self.half_bits) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside the permutation of size {self.n}")
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def inverse(self, y: int) -> int:
        if not 0 <= y < self.n:
            raise IndexError(f"value {y} outside the permutation of size {self.n}")
        x = self._decrypt(y)
        while x >= self.n:
            x = self._decrypt(x)
        return x

    def __len__(self) -> int:
        return self.n

    def to_list(self) -> list[int]:
        return [self(i) for i in range(self.n)]


def permutation(n: int, key: int) -> list[int]:
    """The whole keyed permutation of ``[0, n)`` as a list (RNG-5)."""
    return FeistelPermutation(n, key).to_list()
