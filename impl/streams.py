"""MosaicML-style streams as arrays: each source's count per epoch, batched by the batching method.

Conforms to MIX-15, MIX-16, MIX-20, MIX-21 (docs/SEMANTICS.md, "Mixing"):
``stream_plan(sizes, streams, seed, e, ...)`` is ``reference.streams.mix_streams``
as an ``impl.mixing.MixPlan``. Like ``mix_plan``, the plan is a pure function of
the sizes, the streams and the epoch, built once per epoch: ``random`` and the
block methods are ``mix_plan`` over the streams' counts or whole blocks, and
``stratified`` permutes every global batch's slots in one Feistel call.

Worked example (``per_stream``: every global batch of 2 from one stream)::

    >>> plan = stream_plan([4, 2], [StreamConfig(), StreamConfig()], 0, 0, batching_method="per_stream",
    ...                    global_batch_size=2)
    >>> plan.source.tolist()
    [1, 1, 0, 0, 0, 0]
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from impl import rng
from impl._arrays import exclusive_cumsum
from impl.errors import ConfigError, is_integer, require
from impl.mixing import MixPlan, mix_plan
from reference.mixing import MixConfig
from reference.rng import GOLDEN_GAMMA, MASK64, Stream
from reference.streams import StreamConfig
from reference.streams import check_batching as reference_check_batching

__all__ = ["StreamConfig", "check_batching", "stratified_counts", "stream_counts", "stream_plan"]

_I64 = np.int64


def _apportion(total: int, shares: Sequence[Fraction]) -> list[int]:
    whole = sum(shares, Fraction(0))
    out, before, running = [], 0, Fraction(0)
    for share in shares:
        running += share
        bound = round(running * total / whole)
        out.append(bound - before)
        before = bound
    return out


def _exact(value: float) -> Fraction:
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def stream_counts(source_sizes: Sequence[int], streams: Sequence[StreamConfig], epoch_size: int | None = None) -> list[int]:
    """Samples each MosaicML-style stream contributes per epoch (MIX-15): proportions apportion ``epoch_size``.

    >>> stream_counts([100, 40], [StreamConfig(proportion=0.7), StreamConfig(proportion=0.3)], epoch_size=9)
    [6, 3]
    """
    sizes = [int(n) for n in source_sizes]
    require(len(streams) == len(sizes), ConfigError,
            f"{len(streams)} streams for {len(sizes)} sources; pass one StreamConfig per source")
    require(epoch_size is None or (is_integer(epoch_size) and epoch_size >= 1), ConfigError,
            f"epoch_size={epoch_size!r} must be an integer >= 1 (samples per epoch), or None for the streams' own counts")
    proportions = [s.proportion for s in streams]
    if any(p is not None for p in proportions):
        require(all(p is not None for p in proportions), ConfigError,
                "some streams set proportion and others do not; give every stream a proportion, or none")
        counts = _apportion(sum(sizes) if epoch_size is None else epoch_size,
                            [_exact(p) for p in proportions if p is not None])
    else:
        counts = [s.choose if s.choose is not None else round(_exact(s.repeat) * n) if s.repeat is not None else n
                  for s, n in zip(streams, sizes)]
        if epoch_size is not None:
            require(sum(counts) > 0, ConfigError, f"the streams contribute no sample, so epoch_size={epoch_size} cannot "
                    "be apportioned; give a stream a positive count")
            counts = _apportion(epoch_size, [Fraction(c) for c in counts])
    for i, (c, n) in enumerate(zip(counts, sizes)):
        require(c == 0 or n > 0, ConfigError, f"stream {i} should contribute {c} samples but its source is empty")
    return counts


def check_batching(batching_method: str, global_batch_size: int | None,
                   device_batch_size: int | None) -> tuple[int | None, int | None]:
    """``reference.streams.check_batching`` (MIX-16) after numpy integers become ints; the sizes as ints.

    Why one owner: the rule (each batching method with exactly the batch
    sizes it composes) and its messages are the reference's; impl only
    accepts the numpy integer scalars that sizes read from arrays are, which
    would otherwise reach the fingerprint's JSON.

    >>> check_batching("device_per_stream", np.int64(8), np.int64(2))
    (8, 2)
    """
    g, d = (int(v) if v is not None and is_integer(v) else v for v in (global_batch_size, device_batch_size))
    reference_check_batching(batching_method, g, d)
    return g, d


def stratified_counts(counts: Sequence[int], global_batch_size: int) -> list[int]:
    """MIX-20: each stream's samples per global batch, floors plus largest remainders (ties: lower index).

    >>> stratified_counts([50, 30, 20], 8)
    [4, 2, 2]
    """
    total = sum(counts)
    if total == 0:
        return [0] * len(counts)
    floors = [c * global_batch_size // total for c in counts]
    remainders = [c * global_batch_size - f * total for c, f in zip(counts, floors)]   # numerators over total
    for i in sorted(range(len(counts)), key=lambda i: (-remainders[i], i))[:global_batch_size - sum(floors)]:
        floors[i] += 1
    for i, (c, b) in enumerate(zip(counts, floors)):
        if c == 0:
            continue
        require(b > 0, ConfigError,
                f"stream {i} contributes {c} samples per epoch but its share {Fraction(c, total)} of a global batch "
                f"of {global_batch_size} rounds to 0, so stratified batches would never train it; raise "
                f"global_batch_size to at least {-(-total // c)}, or give stream {i} a larger share")
    return floors


def _subkeys(key: int, indices: np.ndarray) -> np.ndarray:
    """``rng.subkey(key, i)`` for every i, as uint64 (RNG-6)."""
    with np.errstate(over="ignore"):
        salt = rng.mix64((indices.astype(np.uint64) + np.uint64(1)) * np.uint64(GOLDEN_GAMMA))
    return rng.mix64(np.uint64(key & MASK64) ^ salt)


def _stratified(counts: list[int], key: int, global_batch_size: int) -> MixPlan:
    """MIX-20 as arrays: every batch's slots, permuted by the batch's own Feistel key, all batches at once."""
    per_batch = stratified_counts(counts, global_batch_size)
    steps = min((c // b for c, b in zip(counts, per_batch) if b > 0), default=0)
    g = global_batch_size
    owner = np.repeat(np.arange(len(counts), dtype=_I64), per_batch)
    first = exclusive_cumsum(np.asarray(per_batch, dtype=_I64))
    t = np.repeat(np.arange(steps, dtype=_I64), g)
    p = np.tile(np.arange(g, dtype=_I64), steps)
    keys = np.repeat(_subkeys(rng.subkey(key, len(counts)), np.arange(steps, dtype=_I64)), g)
    slot = rng.feistel(g, keys, p) if steps else p
    source = owner[slot]
    return MixPlan(source, t * np.asarray(per_batch, dtype=_I64)[source] + slot - first[source])


def _blocks(counts: list[int], seed: int, epoch: int, block: int, per_step: int) -> MixPlan:
    """MIX-21 as arrays: MIX-15's weighted mix over whole blocks, cut to whole steps, each block's items in order."""
    blocks = [c // block for c in counts]
    if not any(blocks):
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    plan = mix_plan(blocks, MixConfig(weights=tuple(float(b) for b in blocks), stopping="all_exhausted", seed=seed),
                    epoch)
    kept = len(plan.source) // per_step * per_step
    source = np.repeat(plan.source[:kept], block)
    item = (np.repeat(plan.item[:kept], block) * block + np.tile(np.arange(block, dtype=_I64), kept))
    return MixPlan(source, item)


def stream_plan(source_sizes: Sequence[int], streams: Sequence[StreamConfig], seed: int, epoch: int, *,
                epoch_size: int | None = None, batching_method: str = "random", global_batch_size: int | None = None,
                device_batch_size: int | None = None) -> MixPlan:
    """``reference.streams.mix_streams`` as arrays (MIX-15, MIX-16, MIX-20, MIX-21).

    Exact counts; each stream's virtual items in order, whole passes, then a
    keyed subset; interleaved by ``batching_method``.

    >>> plan = stream_plan([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], 0, 0)
    >>> sorted(zip(plan.source.tolist(), plan.item.tolist()))
    [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2), (1, 0)]
    >>> plan = stream_plan([4, 2], [StreamConfig(), StreamConfig()], 0, 0, batching_method="per_stream",
    ...                    global_batch_size=2)
    >>> list(zip(plan.source.tolist(), plan.item.tolist()))
    [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (0, 3)]
    """
    global_batch_size, device_batch_size = check_batching(batching_method, global_batch_size, device_batch_size)
    sizes = [int(n) for n in source_sizes]
    counts = stream_counts(sizes, streams, epoch_size)
    if not any(counts):
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    if batching_method == "stratified":
        assert global_batch_size is not None
        plan = _stratified(counts, rng.derive_key(seed, int(epoch), Stream.MIX), global_batch_size)
    elif batching_method == "per_stream":
        assert global_batch_size is not None
        plan = _blocks(counts, seed, epoch, global_batch_size, 1)
    elif batching_method == "device_per_stream":
        assert global_batch_size is not None and device_batch_size is not None
        plan = _blocks(counts, seed, epoch, device_batch_size, global_batch_size // device_batch_size)
    else:
        plan = mix_plan(counts, MixConfig(weights=tuple(float(c) for c in counts), stopping="all_exhausted",
                                          seed=seed), epoch)
    key = rng.derive_key(seed, int(epoch), Stream.MIX)
    item = plan.item.copy()
    for s, (n, c) in enumerate(zip(sizes, counts)):
        rows = np.flatnonzero(plan.source == s)
        if not len(rows):
            continue
        whole = (c // n) * n
        j = plan.item[rows]
        tail = j >= whole
        item[rows] = j % n
        if tail.any():
            item[rows[tail]] = rng.FeistelPermutation(n, rng.subkey(key, s))(j[tail] - whole)
    return MixPlan(plan.source, item)
