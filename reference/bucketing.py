"""Bucketing: length-sorted packs shuffled within buffers (BUCK-*), d9d's BufferSortedDataset made exact.

Why: batches of sequences of similar length waste little padding, but fully
sorting a corpus by length makes every batch homogeneous in a way that
biases training (all short documents first). d9d's compromise sorts only
within a buffer of ``buffer_size`` consecutive items, cuts the sorted buffer
into packs of ``pack_size`` similar lengths, and shuffles the packs and the
items inside each pack. Making it a pure function of ``(seed, epoch,
buffer index)`` adds what a stateful buffer lacks: any position is
computable from its own buffer alone (O(1) resume, random access), and a
vectorised implementation reproduces it bit for bit (integer sort keys
with a counter-draw tie-breaker, Feistel permutations).

Worked example (8 items, buffers of 4, packs of 2). Buffer 0 holds
positions 0..3 with lengths 5, 1, 4, 1; sorted by length it is
``[1, 3, 2, 0]`` (the two length-1 items ordered by their random draws), cut
into packs ``{1, 3}`` and ``{2, 0}``, which are then shuffled (here the
packs keep their order and pack ``{1, 3}`` is reversed); epoch 1 shuffles
differently::

    >>> lengths = [5, 1, 4, 1, 9, 2, 6, 5]
    >>> config = BucketConfig(buffer_size=4, pack_size=2, seed=0)
    >>> bucket_packs(lengths, config, 0, 0)
    [[3, 1], [2, 0]]
    >>> bucket_order(lengths, config, 0)
    [3, 1, 2, 0, 7, 5, 4, 6]
    >>> [sorted(lengths[i] for i in pack) for pack in bucket_packs(lengths, config, 0, 1)]
    [[2, 5], [6, 9]]
    >>> bucket_order(lengths, config, 1)
    [2, 0, 1, 3, 5, 7, 4, 6]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reference.errors import ConfigError, is_int, require
from reference.rng import MASK64, FeistelPermutation, Stream, derive_key, draw, subkey


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketConfig:
    """Buffer and pack sizes of smart bucketing (BUCK-8).

    ``buffer_size`` bounds how far an item can move (and the memory a
    streaming loader needs); ``pack_size`` is the group of similar lengths,
    normally the batch size.

    >>> BucketConfig(buffer_size=4, pack_size=8)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: pack_size=8 must be an integer in [1, buffer_size=4]; a pack is cut from one buffer, so use pack_size <= buffer_size
    """

    buffer_size: int
    pack_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        require(is_int(self.buffer_size) and self.buffer_size >= 1, ConfigError,
                f"buffer_size={self.buffer_size!r} must be an integer >= 1; use buffer_size=1 for no bucketing")
        require(is_int(self.pack_size) and 1 <= self.pack_size <= self.buffer_size, ConfigError,
                f"pack_size={self.pack_size!r} must be an integer in [1, buffer_size={self.buffer_size}]; "
                "a pack is cut from one buffer, so use pack_size <= buffer_size")
        require(is_int(self.seed) and 0 <= self.seed <= MASK64, ConfigError,
                f"seed={self.seed!r} must be an integer in [0, 2**64); pass a non-negative seed")


def num_buffers(n: int, config: BucketConfig) -> int:
    """How many buffers ``n`` items fill: ``ceil(n / buffer_size)`` (BUCK-1).

    >>> num_buffers(10, BucketConfig(buffer_size=4, pack_size=2)), num_buffers(0, BucketConfig(buffer_size=4, pack_size=2))
    (3, 0)

    Clauses: BUCK-1.
    """
    require(is_int(n) and n >= 0, ConfigError, f"n={n!r} must be an integer >= 0")
    return -(-n // config.buffer_size)


def buffer_range(n: int, config: BucketConfig, buffer_index: int) -> range:
    """The input positions of buffer ``b``: ``[b * B, min(n, (b + 1) * B))`` (BUCK-1).

    >>> buffer_range(10, BucketConfig(buffer_size=4, pack_size=2), 2)
    range(8, 10)

    Clauses: BUCK-1, BUCK-8.
    """
    count = num_buffers(n, config)
    require(is_int(buffer_index) and 0 <= buffer_index < count, ConfigError,
            f"buffer_index={buffer_index!r} must be an integer in [0, num_buffers={count}) for n={n} items")
    start = buffer_index * config.buffer_size
    return range(start, min(n, start + config.buffer_size))


def buffer_key(config: BucketConfig, epoch: int, buffer_index: int) -> int:
    """``Kb = subkey(derive_key(seed, epoch, Stream.BUCKET), b)``: all of buffer b's randomness (BUCK-2).

    Clauses: BUCK-2.
    """
    return subkey(derive_key(config.seed, epoch, Stream.BUCKET), buffer_index)


def bucket_packs(lengths: Sequence[int], config: BucketConfig, epoch: int, buffer_index: int) -> list[list[int]]:
    """Buffer b's packs in output order, each pack's positions in output order (BUCK-3..BUCK-6).

    1. Sort the buffer's positions ``i`` by ``(lengths[i], draw(Kb, i - b*B), i)``,
       a total order whose middle term puts equal lengths in random order (BUCK-3).
    2. Cut the sorted list into packs of ``pack_size``; the last may be
       shorter. Pack p is sorted ranks ``[p*P, (p+1)*P)`` (BUCK-4).
    3. Output pack q is sorted pack ``FeistelPermutation(num_packs, subkey(Kb, 0))(q)`` (BUCK-5).
    4. Output item j of sorted pack p is its member
       ``FeistelPermutation(len(pack), subkey(Kb, 1 + p))(j)`` (BUCK-6).

    Only the buffer's own lengths are read (BUCK-2).

    >>> config = BucketConfig(buffer_size=6, pack_size=3)
    >>> packs = bucket_packs([30, 10, 20, 60, 50, 40], config, epoch=0, buffer_index=0)
    >>> sorted(sorted(pack) for pack in packs)
    [[0, 1, 2], [3, 4, 5]]

    Clauses: BUCK-2, BUCK-3, BUCK-4, BUCK-5, BUCK-6, BUCK-8.
    """
    positions = buffer_range(len(lengths), config, buffer_index)
    for i in positions:
        require(is_int(lengths[i]) and lengths[i] >= 0, ConfigError,
                f"lengths[{i}]={lengths[i]!r} must be an integer >= 0 (a token count)")
    kb = buffer_key(config, epoch, buffer_index)
    start, size = positions.start, config.pack_size
    ranked = sorted(positions, key=lambda i: (lengths[i], draw(kb, i - start), i))
    packs = [ranked[p:p + size] for p in range(0, len(ranked), size)]
    inter = FeistelPermutation(len(packs), subkey(kb, 0))
    out = []
    for q in range(len(packs)):
        p = inter(q)
        intra = FeistelPermutation(len(packs[p]), subkey(kb, 1 + p))
        out.append([packs[p][intra(j)] for j in range(len(packs[p]))])
    return out


def bucket_buffer(lengths: Sequence[int], config: BucketConfig, epoch: int, buffer_index: int) -> list[int]:
    """Buffer b's input positions in output order: its packs, flattened (BUCK-1..BUCK-6).

    >>> bucket_buffer([5, 1, 4, 1, 9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2), 0, 1)
    [7, 5, 4, 6]

    Clauses: BUCK-1, BUCK-2, BUCK-3, BUCK-4, BUCK-5, BUCK-6.
    """
    return [i for pack in bucket_packs(lengths, config, epoch, buffer_index) for i in pack]


def bucket_order(lengths: Sequence[int], config: BucketConfig, epoch: int) -> list[int]:
    """The whole epoch's order: buffers 0, 1, ... concatenated, a permutation of ``[0, n)`` (BUCK-1).

    >>> bucket_order([], BucketConfig(buffer_size=4, pack_size=2), 0)
    []

    Clauses: BUCK-1, BUCK-7.
    """
    return [i for b in range(num_buffers(len(lengths), config)) for i in bucket_buffer(lengths, config, epoch, b)]


def bucket_at(lengths: Sequence[int], config: BucketConfig, epoch: int, position: int) -> int:
    """``bucket_order(lengths, config, epoch)[position]``, computed from its own buffer only (BUCK-7).

    Why: a resumed or re-sharded loader jumps to any position; the cost is
    O(B log B) for the one buffer, independent of n and of what was read before.

    >>> bucket_at([5, 1, 4, 1, 9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2), 0, 5)
    5

    Clauses: BUCK-7, BUCK-8.
    """
    n = len(lengths)
    require(is_int(position) and 0 <= position < n, ConfigError,
            f"position={position!r} must be an integer in [0, n={n})")
    b = position // config.buffer_size
    return bucket_buffer(lengths, config, epoch, b)[position - b * config.buffer_size]
