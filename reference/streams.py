"""MosaicML-style streams: how many samples each source gives an epoch, and how batches are composed (MIX-15, MIX-16, MIX-20, MIX-21).

Why apart from ``reference.mixing``: a weighted mix (MIX-1..MIX-12) says
how likely each source is at every step, so a source's share of an epoch
is a random count; MosaicML's ``Stream`` instead fixes every source's count
per epoch (``proportion``, ``repeat`` or ``choose``, MIX-15), and its
batching methods say which stream fills which slot of every global batch
(``stratified``: fixed counts per batch, MIX-20; ``per_stream`` and
``device_per_stream``: a whole batch or device batch from one stream,
MIX-21), which only a batch size can say (MIX-16). The streams build on
the mix: ``random`` batching is a weighted ``all_exhausted`` mix of the
counts, and the block methods mix whole blocks the same way.

Worked example (a source of 3 samples twice, one sample of a source of 2)::

    >>> stream_counts([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)])
    [6, 1]
    >>> sorted(mix_streams([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], seed=0, epoch=0))
    [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2), (1, 0)]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from reference.errors import ConfigError, TopologyError, is_int, require
from reference.mixing import Item, MixConfig, check_source_sizes, is_weight, mix
from reference.rng import FeistelPermutation, Stream, derive_key, subkey

BATCHING_METHODS = ("random", "stratified", "per_stream", "device_per_stream")


def _positive(value: object) -> bool:
    return is_weight(value) and float(value) > 0  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamConfig:
    """How many samples one source contributes to every epoch, as MosaicML's ``Stream`` says it (MIX-15).

    At most one of ``proportion`` (a share of the epoch, relative to the other
    streams' proportions), ``repeat`` (a multiple of the source's size, e.g.
    0.5 or 2.0) and ``choose`` (an exact count); none means ``repeat=1``.

    >>> StreamConfig(proportion=0.3, repeat=2.0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: a stream sets proportion=0.3 and repeat=2.0; set at most one of proportion, repeat and choose
    """

    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None

    def __post_init__(self) -> None:
        given = {k: v for k, v in (("proportion", self.proportion), ("repeat", self.repeat), ("choose", self.choose))
                 if v is not None}
        require(len(given) <= 1, ConfigError,
                "a stream sets " + " and ".join(f"{k}={v!r}" for k, v in given.items())
                + "; set at most one of proportion, repeat and choose")
        for name in ("proportion", "repeat"):
            value = getattr(self, name)
            require(value is None or _positive(value), ConfigError,
                    f"{name}={value!r} must be a finite number > 0")
        require(self.choose is None or (is_int(self.choose) and self.choose >= 0), ConfigError,
                f"choose={self.choose!r} must be an integer >= 0 (samples per epoch)")


def _fraction(value: float) -> Fraction:
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _apportion(total: int, shares: Sequence[Fraction]) -> list[int]:
    """``total`` split by ``shares`` with cumulative boundaries rounded half to even (as SPLIT-7), summing exactly."""
    whole = sum(shares, Fraction(0))
    bounds, running = [0], Fraction(0)
    for share in shares:
        running += share
        bounds.append(round(running * total / whole))
    return [b - a for a, b in itertools.pairwise(bounds)]


def stream_counts(source_sizes: Sequence[int], streams: Sequence[StreamConfig], epoch_size: int | None = None) -> list[int]:
    """Samples each stream contributes to one epoch (MIX-15).

    With proportions (every stream must then have one, as in MosaicML), the
    epoch of ``epoch_size`` samples (default: the sum of the sizes) is
    apportioned by them; otherwise stream i contributes ``choose``,
    ``round(repeat * n_i)`` (exact, half to even) or ``n_i``, and an
    ``epoch_size`` rescales those counts to sum to it. Apportioning rounds
    cumulative boundaries, so the counts sum to ``epoch_size`` exactly.

    >>> stream_counts([100, 40], [StreamConfig(repeat=0.5), StreamConfig(choose=10)])
    [50, 10]
    >>> stream_counts([100, 40], [StreamConfig(proportion=0.7), StreamConfig(proportion=0.3)], epoch_size=9)
    [6, 3]
    >>> stream_counts([100, 40], [StreamConfig(), StreamConfig()], epoch_size=0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: epoch_size=0 must be an integer >= 1 (samples per epoch), or None for the streams' own counts

    Clauses: MIX-15.
    """
    sizes = check_source_sizes(source_sizes)
    require(len(streams) == len(sizes), ConfigError,
            f"{len(streams)} streams for {len(sizes)} sources; pass one StreamConfig per source")
    require(epoch_size is None or (is_int(epoch_size) and epoch_size >= 1), ConfigError,
            f"epoch_size={epoch_size!r} must be an integer >= 1 (samples per epoch), or None for the streams' own counts")
    with_proportion = [s.proportion is not None for s in streams]
    if any(with_proportion):
        require(all(with_proportion), ConfigError,
                "some streams set proportion and others do not; give every stream a proportion, or none")
        total = sum(sizes) if epoch_size is None else epoch_size
        counts = _apportion(total, [_fraction(s.proportion) for s in streams])  # type: ignore[arg-type]
    else:
        counts = [s.choose if s.choose is not None else
                  round(_fraction(s.repeat) * n) if s.repeat is not None else n
                  for s, n in zip(streams, sizes)]
        if epoch_size is not None:
            require(sum(counts) > 0, ConfigError, f"the streams contribute no sample, so epoch_size={epoch_size} cannot be "
                    "apportioned; give a stream a positive count")
            counts = _apportion(epoch_size, [Fraction(c) for c in counts])
    for i, (c, n) in enumerate(zip(counts, sizes)):
        require(c == 0 or n > 0, ConfigError, f"stream {i} should contribute {c} samples but its source is empty")
    return counts


def stream_item(size: int, count: int, j: int, key: int) -> int:
    """The source sample behind virtual item j of a stream of ``count`` items over ``size`` samples (MIX-15).

    Whole passes first (item j is sample ``j % size`` while ``j < (count // size) * size``),
    then a keyed sample without replacement for the remainder: ``FeistelPermutation(size, key)``
    of the position within it, so a fresh subset every epoch.

    >>> [stream_item(4, 10, j, key=1) for j in range(8)]
    [0, 1, 2, 3, 0, 1, 2, 3]

    Clauses: MIX-15.
    """
    whole = (count // size) * size
    return j % size if j < whole else FeistelPermutation(size, key)(j - whole)


def check_batching(batching_method: str, global_batch_size: int | None, device_batch_size: int | None) -> None:
    """A batching method with the batch sizes it needs, and no other (MIX-16).

    ``random`` needs none; ``stratified`` and ``per_stream`` the global batch
    size ``G`` (samples per optimizer step over every rank); ``device_per_stream``
    also the device batch size ``B`` (one data-parallel group's samples per
    step), a divisor of ``G``.

    >>> check_batching("per_stream", None, None)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: batching_method='per_stream' composes every global batch, so it needs global_batch_size= (samples per step over all ranks: world_size // replication x batch_size); pass it with the streams

    Clauses: MIX-16.
    """
    require(batching_method in BATCHING_METHODS, ConfigError,
            f"batching_method={batching_method!r} is not one of {BATCHING_METHODS}")
    for name, value in (("global_batch_size", global_batch_size), ("device_batch_size", device_batch_size)):
        require(value is None or (is_int(value) and value >= 1), ConfigError,
                f"{name}={value!r} must be an integer >= 1, or None")
    if batching_method == "random":
        require(global_batch_size is None and device_batch_size is None, ConfigError,
                "batching_method='random' does not depend on the batch size; pass global_batch_size=None and "
                "device_batch_size=None, or choose 'stratified', 'per_stream' or 'device_per_stream'")
        return
    require(global_batch_size is not None, ConfigError,
            f"batching_method={batching_method!r} composes every global batch, so it needs global_batch_size= "
            "(samples per step over all ranks: world_size // replication x batch_size); pass it with the streams")
    if batching_method != "device_per_stream":
        require(device_batch_size is None, ConfigError,
                f"device_batch_size={device_batch_size} applies to batching_method='device_per_stream' only; "
                "pass device_batch_size=None")
        return
    require(device_batch_size is not None, ConfigError,
            "batching_method='device_per_stream' draws every device batch from one stream, so it needs "
            "device_batch_size= (one rank's batch_size); pass it with global_batch_size")
    assert global_batch_size is not None and device_batch_size is not None
    require(global_batch_size % device_batch_size == 0, ConfigError,
            f"device_batch_size={device_batch_size} must divide global_batch_size={global_batch_size} (a global "
            "batch is world_size // replication device batches)")


def check_batch_topology(batching_method: str, global_batch_size: int | None, device_batch_size: int | None,
                         groups: int, batch_size: int) -> None:
    """A loader's step must be the batch the method composed: ``groups x batch_size == G`` (and ``batch_size == B``) (MIX-16).

    ``groups`` is ``world_size // replication`` and ``batch_size`` a rank's.
    Why refuse: PART-2 cuts the mixed stream into steps of ``groups x
    batch_size`` samples, so another size would train halves of two composed
    batches in one step (and under ``device_per_stream`` hand a rank samples
    of two streams). Another world size with the same sizes is fine.

    >>> check_batch_topology("per_stream", 8, None, 2, 4)
    >>> check_batch_topology("per_stream", 8, None, 4, 4)
    Traceback (most recent call last):
    ...
    reference.errors.TopologyError: this topology's global batch is world_size // replication x batch_size = 4 x 4 = 16, but the mixture composes global batches of global_batch_size=8 (batching_method='per_stream'); pass batch_size=2 on these 4 data-parallel groups, or build the mixture with global_batch_size=16 (another fingerprint: its checkpoints do not load here)

    Clauses: MIX-16.
    """
    if batching_method == "random" or global_batch_size is None:
        return
    step = groups * batch_size
    fits = global_batch_size % groups == 0
    hint = f"pass batch_size={global_batch_size // groups} on these {groups} data-parallel groups, or " if fits \
        else ""
    require(step == global_batch_size, TopologyError,
            f"this topology's global batch is world_size // replication x batch_size = {groups} x {batch_size} = "
            f"{step}, but the mixture composes global batches of global_batch_size={global_batch_size} "
            f"(batching_method={batching_method!r}); {hint}build the mixture with global_batch_size={step} (another "
            "fingerprint: its checkpoints do not load here)")
    if device_batch_size is None:
        return
    require(batch_size == device_batch_size, TopologyError,
            f"batch_size={batch_size} but the mixture composes device batches of device_batch_size={device_batch_size} "
            f"(batching_method={batching_method!r}); pass batch_size={device_batch_size} on "
            f"{global_batch_size // device_batch_size} data-parallel groups (world_size // replication), or build "
            f"the mixture with device_batch_size={batch_size} (another fingerprint)")


def stratified_counts(counts: Sequence[int], global_batch_size: int) -> list[int]:
    """Samples of each stream in every global batch under ``stratified`` (MIX-20).

    Stream i's exact share ``G * c_i / sum(c)`` rounded down, and one more
    for the ``G - sum(floors)`` streams with the largest fractional parts
    (ties: the lower stream index), so the counts sum to ``G``; a stream
    with samples but no place in a batch is refused.

    >>> stratified_counts([50, 30, 20], 8)
    [4, 2, 2]
    >>> stratified_counts([1, 99], 8)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: stream 0 contributes 1 samples per epoch but its share 1/100 of a global batch of 8 rounds to 0, so stratified batches would never train it; raise global_batch_size to at least 100, or give stream 0 a larger share

    Clauses: MIX-20.
    """
    total = sum(counts)
    if total == 0:
        return [0] * len(counts)
    exact = [Fraction(c * global_batch_size, total) for c in counts]
    out = [math.floor(q) for q in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[:global_batch_size - sum(out)]:
        out[i] += 1
    for i, (c, b) in enumerate(zip(counts, out)):
        if c == 0:
            continue
        require(b > 0, ConfigError,
                f"stream {i} contributes {c} samples per epoch but its share {Fraction(c, total)} of a global batch "
                f"of {global_batch_size} rounds to 0, so stratified batches would never train it; raise "
                f"global_batch_size to at least {-(-total // c)}, or give stream {i} a larger share")
    return out


def batch_key(key: int, num_streams: int) -> int:
    """The key of the batch-level draws of an epoch of ``num_streams`` streams: the sub-key after the streams' own.

    Streams use ``subkey(key, i)`` for ``i < K`` (MIX-15); the next index is free.
    """
    return subkey(key, num_streams)


def _stratified(sizes: tuple[int, ...], counts: list[int], key: int, global_batch_size: int) -> list[Item]:
    per_batch = stratified_counts(counts, global_batch_size)
    steps = min((c // b for c, b in zip(counts, per_batch) if b > 0), default=0)
    owner = [i for i, b in enumerate(per_batch) for _ in range(b)]
    first = list(itertools.accumulate(per_batch, initial=0))
    bkey = batch_key(key, len(sizes))
    out: list[Item] = []
    for t in range(steps):
        order = FeistelPermutation(global_batch_size, subkey(bkey, t))
        for p in range(global_batch_size):
            slot = order(p)
            i = owner[slot]
            j = t * per_batch[i] + slot - first[i]
            out.append((i, stream_item(sizes[i], counts[i], j, subkey(key, i))))
    return out


def _blocks(sizes: tuple[int, ...], counts: list[int], seed: int, epoch: int, key: int, block: int,
            per_step: int) -> list[Item]:
    """Blocks of ``block`` consecutive items of one stream, mixed like MIX-15's items, cut to whole steps (MIX-21)."""
    blocks = [c // block for c in counts]
    if not any(blocks):
        return []
    order = mix(blocks, MixConfig(weights=tuple(float(b) for b in blocks), stopping="all_exhausted", seed=seed), epoch)
    order = order[:len(order) // per_step * per_step]
    return [(i, stream_item(sizes[i], counts[i], u * block + o, subkey(key, i))) for i, u in order for o in range(block)]


def mix_streams(source_sizes: Sequence[int], streams: Sequence[StreamConfig], seed: int, epoch: int, *,
                epoch_size: int | None = None, batching_method: str = "random", global_batch_size: int | None = None,
                device_batch_size: int | None = None) -> list[Item]:
    """An epoch of MosaicML-style streams: exact per-stream counts, batched by ``batching_method`` (MIX-15, MIX-16).

    ``random``: the counts of ``stream_counts`` become the sizes of a weighted
    ``all_exhausted`` mix with the counts as weights (so every stream's items
    appear exactly ``count`` times, spread through the epoch, and the
    interleaving is fresh every epoch); virtual item j of stream i maps to
    source sample ``stream_item(n_i, count_i, j, subkey(key, i))`` with
    ``key = derive_key(seed, epoch, MIX)``. The other methods compose each
    global batch of ``global_batch_size`` consecutive samples (PART-2's
    layout): ``stratified`` gives every batch ``stratified_counts`` samples
    of each stream in a keyed order (MIX-20); ``per_stream`` fills each batch
    from one stream and ``device_per_stream`` each device batch of
    ``device_batch_size`` (MIX-21). They use each stream's items in the
    order ``j = 0, 1, ...`` and drop the items that do not fill a batch.

    >>> items = mix_streams([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], seed=0, epoch=0)
    >>> sorted(items)
    [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2), (1, 0)]
    >>> mix_streams([4, 2], [StreamConfig(), StreamConfig()], seed=0, epoch=0, batching_method="per_stream",
    ...             global_batch_size=2)
    [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (0, 3)]

    Clauses: MIX-15, MIX-16, MIX-20, MIX-21.
    """
    check_batching(batching_method, global_batch_size, device_batch_size)
    sizes = check_source_sizes(source_sizes)
    counts = stream_counts(sizes, streams, epoch_size)
    key = derive_key(seed, epoch, Stream.MIX)
    if not any(counts):
        return []
    if batching_method == "stratified":
        assert global_batch_size is not None
        return _stratified(sizes, counts, key, global_batch_size)
    if batching_method == "per_stream":
        assert global_batch_size is not None
        return _blocks(sizes, counts, seed, epoch, key, global_batch_size, 1)
    if batching_method == "device_per_stream":
        assert global_batch_size is not None and device_batch_size is not None
        return _blocks(sizes, counts, seed, epoch, key, device_batch_size, global_batch_size // device_batch_size)
    items = mix(counts, MixConfig(weights=tuple(float(c) for c in counts), stopping="all_exhausted", seed=seed), epoch)
    return [(s, stream_item(sizes[s], counts[s], j, subkey(key, s))) for s, j in items]
