"""MixedDataset: several sources mixed at sample level, any sample of any epoch by random access.

Conforms to MIX-1..MIX-9, MIX-11, MIX-13, MIX-14 (docs/SEMANTICS.md, "Mixing")
and, as the dataset behind ``impl.loader``, RES-1..RES-7: ``mix_plan(sizes,
config, e)`` is ``reference.mixing.mix(sizes, config, e)`` as two int64 arrays,
and ``MixedDataset.samples(e, i)`` is field for field
``reference.resume.mixture_samples(corpora, config, e)[i]``.

Why a plan and not a cursor: the reference defines the mixed stream by a step
function whose cursor (``MixState``) a loader could save, but a cursor forces
the loader to walk the stream in order, so DataLoader workers would have to
share it. The whole epoch's choices are instead computed once per epoch,
vectorised (one counter draw per step, ``numpy.cumsum`` of the weights, one
``searchsorted``), into ``plan.source[i]`` / ``plan.item[i]``. Any process
then computes any mixed sample from ``(epoch, i)`` alone, and the loader's
state stays RES-2's ``(epoch, consumed)``: resuming costs one plan build, the
same at sample 10 and at sample 10 million (no replay).

How each strategy vectorises:

- round robin: closed forms (``first_exhausted``: step t is source ``t % K``,
  item ``t // K``; ``all_exhausted``: all ``(source, item)`` sorted by item,
  then source; ``all_exhausted_oversample``: cycle the non-empty sources);
- static weights: the draws of a whole phase at once; a phase ends when a
  source runs out, which changes the eligible set (at most K phases);
- a ``weight_fn``: the weights may change every step, so the plan is built by
  a plain loop (one call per step), still once per epoch.

Worked example (round robin over two sources of 3 and 2 samples)::

    >>> from reference.mixing import MixConfig
    >>> plan = mix_plan([3, 2], MixConfig(), 0)
    >>> plan.source.tolist(), plan.item.tolist()
    ([0, 1, 0, 1, 0], [0, 0, 1, 1, 2])
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import math
import numbers
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from impl import rng
from impl._arrays import distinct_ints, exclusive_cumsum, ranges
from impl.collation import SampleBatch, batch_cu_seqlens
from impl.dataset import PackedDataset
from impl.epoch_cell import SharedEpoch
from impl.errors import ConfigError, is_integer, require
from impl.fill import TokenSource, fill_batch
from impl.keys import SampleKey, resolve_key, resolve_keys
from impl.schema import BATCH_FIELDS as FIELDS
from impl.schema import padding_rows
from reference.mixing import (
    BATCHING_METHODS,
    STOPPING_STRATEGIES,
    MixConfig,
    StreamConfig,
    WeightFn,
    repeat_message,
    zero_weight_message,
)
from reference.packing import PackingConfig
from reference.partition import PADDING
from reference.resume import (
    MixtureConfig,
    canonical_json,
    mixture_fingerprint,
    mixture_level_parts,
    mixture_parts,
    part_hash,
)
from reference.rng import Stream

__all__ = ["MixPlan", "MixedDataset", "SampleKey", "StreamConfig", "balance_remaining", "interleave_datasets", "mix_plan",
           "stream_counts", "stream_plan"]

_I64 = np.int64
_BLOCK = 1 << 18


PIECE_BLOCK = 1024
"""Mixed samples per cached block of pieces (``MixedDataset._block_pieces``)."""
PIECE_BLOCKS_KEPT = 2


class _Pieces(NamedTuple):
    """Rows' pieces for ``fill_batch``: row r holds the next ``counts[r]``; ``docs`` in the concatenated sources."""

    counts: np.ndarray
    docs: np.ndarray
    reported: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    source: np.ndarray
    item: np.ndarray


class MixPlan(NamedTuple):
    """One epoch of a mixed stream: sample ``i`` is sample ``item[i]`` of source ``source[i]``."""

    source: np.ndarray
    item: np.ndarray


def _is_weight(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)) \
        and float(value) >= 0


def _choose(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """MIX-3 for many draws of one weight vector: the first i with ``u < cumsum(w)[i] / total``."""
    cumulative = np.cumsum(weights)
    bounds = cumulative / cumulative[-1]
    chosen = np.searchsorted(bounds, u, side="right")
    if (chosen >= len(weights)).any():   # cannot happen (bounds[-1] == 1.0 > u); kept for the clause's fallback
        chosen[chosen >= len(weights)] = int(np.flatnonzero(weights > 0)[-1])
    return chosen.astype(_I64)


def _round_robin(sizes: np.ndarray, stopping: str) -> MixPlan:
    k = len(sizes)
    if stopping == "first_exhausted":
        total = int((sizes * k + np.arange(k)).min())
        t = np.arange(total, dtype=_I64)
        return MixPlan(t % k, t // k)
    if stopping == "all_exhausted":
        source = np.repeat(np.arange(k, dtype=_I64), sizes)
        index = np.arange(len(source), dtype=_I64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        order = np.lexsort((source, index))
        return MixPlan(source[order], index[order])
    live = np.flatnonzero(sizes > 0)
    m = len(live)
    if not m:
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    longest = int(sizes[live].max())
    last = int(np.flatnonzero(sizes[live] == longest)[-1])
    t = np.arange((longest - 1) * m + last + 1, dtype=_I64)
    source = live[t % m].astype(_I64)
    return MixPlan(source, (t // m) % sizes[source])


def _prior_counts(chosen: np.ndarray, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``count[j]``: items of source ``chosen[j]`` emitted before step ``j`` (``taken[s]`` before the block).

    Also ``per`` (steps per source), ``order`` (steps sorted by source,
    stable) and ``group`` (where each source's steps begin in ``order``).
    Why a stable sort and not a cumulative sum per source: a ``[steps, K]``
    table costs K passes over memory K times larger; a radix sort of small
    ints is one pass, whatever K.

    >>> count, per, order, group = _prior_counts(np.array([1, 0, 1, 1, 0]), np.array([5, 0]))
    >>> count.tolist(), per.tolist(), order.tolist(), group.tolist()
    ([0, 5, 1, 2, 6], [2, 3], [1, 4, 0, 2, 3], [0, 2])
    """
    k = len(taken)
    per = np.bincount(chosen, minlength=k)
    order = np.argsort(chosen.astype(np.uint16) if k <= 1 << 16 else chosen, kind="stable")
    group = exclusive_cumsum(per)[:-1]
    rank = np.empty(len(chosen), dtype=_I64)
    rank[order] = np.arange(len(chosen), dtype=_I64) - np.repeat(group, per)
    return rank + taken[chosen], per, order, group


def _static_weights(sizes: np.ndarray, weights: np.ndarray, stopping: str, key: int) -> MixPlan:
    k = len(sizes)
    if stopping != "first_exhausted":
        for i in range(k):
            require(weights[i] > 0 or sizes[i] == 0, ConfigError,
                    f"weights[{i}]=0 but source {i} holds {int(sizes[i])} items, and stopping={stopping!r} ends only "
                    f"when every non-empty source is exhausted, which source {i} never is; give it a positive weight "
                    "or use stopping='first_exhausted'")
    taken = np.zeros(k, dtype=_I64)
    sources: list[np.ndarray] = []
    indices: list[np.ndarray] = []
    t = 0
    while True:
        if stopping == "first_exhausted":
            eligible = np.ones(k, dtype=bool)
        elif stopping == "all_exhausted":
            eligible = taken < sizes
            if not eligible.any():
                break
        else:
            eligible = sizes > 0
            if (taken[eligible] >= sizes[eligible]).all():
                break
        masked = np.where(eligible, weights, 0.0)
        require(bool((masked > 0).any()), ConfigError,
                f"all weights of the sources that can still be chosen are zero at step {t} "
                f"(weights={weights.tolist()}); give a positive weight to a source with items left")
        horizon = int((sizes - np.minimum(taken, sizes)).sum()) + 1
        horizon = min(max(horizon, 1024) if stopping == "all_exhausted_oversample" else horizon, _BLOCK)
        chosen = _choose(masked, rng.unit(key, np.arange(t, t + horizon, dtype=np.uint64)))
        count, per, order, group = _prior_counts(chosen, taken)   # items of the chosen source emitted before each step
        if stopping == "first_exhausted":
            out = np.flatnonzero(count >= sizes[chosen])
            end = int(out[0]) if len(out) else horizon
            sources.append(chosen[:end])
            indices.append(count[:end])
            if len(out):
                break
            taken = taken + per
            t += end
            continue
        if stopping == "all_exhausted":
            hits = np.flatnonzero(count + 1 == sizes[chosen])   # a source emits its last item: eligibility changes
            stop = int(hits[0]) + 1 if len(hits) else horizon
            finished = False
        else:   # done once every non-empty source has emitted its last item: the latest of those steps
            steps = []
            for i in np.flatnonzero(eligible & (taken < sizes)).tolist():
                r = int(sizes[i] - 1 - taken[i])   # the source's emissions in this block before its last item
                steps.append(int(order[group[i] + r]) if r < per[i] else horizon)
            finished = max(steps) < horizon
            stop = max(steps) + 1 if finished else horizon
        sources.append(chosen[:stop])
        indices.append(count[:stop] % np.maximum(sizes[chosen[:stop]], 1))
        taken = taken + (per if stop == horizon else np.bincount(chosen[:stop], minlength=k))
        t += stop
        if finished:
            break
    if not sources:
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    return MixPlan(np.concatenate(sources).astype(_I64), np.concatenate(indices).astype(_I64))


def _dynamic_weights(sizes: np.ndarray, stopping: str, key: int, weight_fn: WeightFn) -> MixPlan:
    """A weight function may change every step's weights: one call per step, draws fetched in blocks."""
    k = len(sizes)
    size_list = tuple(int(n) for n in sizes)
    taken = [0] * k
    cursor = [0] * k
    once = [n == 0 for n in size_list]
    out_source: list[int] = []
    out_index: list[int] = []
    draws = np.zeros(0)
    t = 0
    while True:
        exhausted = tuple(n == 0 or c == n for c, n in zip(cursor, size_list))
        if stopping == "all_exhausted" and all(exhausted):
            break
        if stopping == "all_exhausted_oversample" and all(once):
            break
        raw = list(weight_fn(t, size_list, tuple(taken), exhausted))
        require(len(raw) == k, ConfigError,
                f"weight_fn returned {len(raw)} weights at step {t} but there are {k} sources; "
                "return one weight per source")
        for i, w in enumerate(raw):
            require(_is_weight(w), ConfigError,
                    f"weight_fn returned weights[{i}]={w!r} at step {t}; weights must be finite numbers >= 0")
        if stopping == "first_exhausted":
            weights = [float(w) for w in raw]
        elif stopping == "all_exhausted":
            weights = [0.0 if gone else float(w) for w, gone in zip(raw, exhausted)]
        else:
            weights = [float(w) if n > 0 else 0.0 for w, n in zip(raw, size_list)]
        require(any(w > 0 for w in weights), ConfigError,
                f"all weights of the sources that can still be chosen are zero at step {t} (weights={raw}, "
                f"exhausted={list(exhausted)}); a weight_fn must give a positive weight to a source with items left")
        if t % 4096 == 0:
            draws = rng.unit(key, np.arange(t, t + 4096, dtype=np.uint64))
        u = float(draws[t % 4096])
        running, total = 0.0, sum_left_to_right(weights)
        s = -1
        for i, w in enumerate(weights):
            running += w
            if u < running / total:
                s = i
                break
        if s < 0:
            s = max(i for i, w in enumerate(weights) if w > 0)
        t += 1
        start = cursor[s]
        if start == size_list[s]:
            if stopping == "first_exhausted":
                break
            start = 0
        out_source.append(s)
        out_index.append(start)
        taken[s] += 1
        cursor[s] = start + 1
        once[s] = once[s] or cursor[s] == size_list[s]
    return MixPlan(np.array(out_source, dtype=_I64), np.array(out_index, dtype=_I64))


def balance_remaining(step: int, source_sizes: Sequence[int], taken: Sequence[int],
                      exhausted: Sequence[bool]) -> list[float]:
    """Forgather's ``balance_remaining_examples`` as a weight function: each source weighted by its items left (MIX-11).

    >>> balance_remaining(5, [3, 5, 4], [1, 5, 0], [False, True, False])
    [2.0, 0.0, 4.0]
    """
    weights = [0.0 if gone else float(max(0, n - c)) for n, c, gone in zip(source_sizes, taken, exhausted, strict=True)]
    return weights if any(weights) else [1.0] * len(weights)


def sum_left_to_right(values: Sequence[float]) -> float:
    """The float sum accumulated left to right (MIX-3's ``total``), not ``math.fsum``'s exact one."""
    total = 0.0
    for v in values:
        total += v
    return total


def mix_plan(source_sizes: Sequence[int], config: MixConfig, epoch: int, *,
             weight_fn: WeightFn | None = None) -> MixPlan:
    """Epoch ``epoch``'s whole mixed stream as arrays (MIX-1..MIX-9, MIX-11).

    >>> plan = mix_plan([1, 3], MixConfig(stopping="all_exhausted_oversample"), 0)
    >>> list(zip(plan.source.tolist(), plan.item.tolist()))
    [(0, 0), (1, 0), (0, 0), (1, 1), (0, 0), (1, 2)]
    """
    require(isinstance(config, MixConfig), ConfigError, f"config={config!r} must be a reference.mixing.MixConfig")
    require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
    for i, n in enumerate(source_sizes):
        require(is_integer(n) and n >= 0, ConfigError,
                f"source_sizes[{i}]={n!r} must be an integer >= 0 (the number of items in source {i})")
    sizes = np.asarray([int(n) for n in source_sizes], dtype=_I64)
    if not len(sizes):
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    key = rng.derive_key(config.seed, int(epoch), Stream.MIX)
    if weight_fn is not None:
        require(callable(weight_fn), ConfigError, f"weight_fn={weight_fn!r} must be callable")
        return _dynamic_weights(sizes, config.stopping, key, weight_fn)
    if config.weights is None:
        return _round_robin(sizes, config.stopping)
    require(len(config.weights) == len(sizes), ConfigError,
            f"weights has {len(config.weights)} entries but there are {len(sizes)} sources; pass one weight per source")
    return _static_weights(sizes, np.asarray(config.weights, dtype=np.float64), config.stopping, key)


def _fingerprint_of(source: Any, i: int) -> str:
    fp = getattr(source, "fingerprint", None)
    require(isinstance(fp, str) and bool(fp), ConfigError,
            f"sources[{i}] ({type(source).__name__}) has no string fingerprint; give it a .fingerprint naming its data "
            "(a PackedDataset has one), so a checkpoint of this mixture is refused on other data")
    return str(fp)


def _source_size(source: Any, epoch: int) -> int:
    if hasattr(source, "num_samples"):
        return int(source.num_samples(epoch))
    return len(source)


def _numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


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


def stream_plan(source_sizes: Sequence[int], streams: Sequence[StreamConfig], seed: int, epoch: int, *,
                epoch_size: int | None = None, batching_method: str = "random") -> MixPlan:
    """``reference.mixing.mix_streams`` as arrays (MIX-15, MIX-16): exact counts, whole passes, then a keyed subset.

    >>> plan = stream_plan([3, 2], [StreamConfig(repeat=2.0), StreamConfig(choose=1)], 0, 0)
    >>> sorted(zip(plan.source.tolist(), plan.item.tolist()))
    [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2), (1, 0)]
    """
    require(batching_method in BATCHING_METHODS, ConfigError,
            f"batching_method={batching_method!r} is not one of {BATCHING_METHODS}")
    if batching_method != "random":
        raise NotImplementedError(
            f"batching_method={batching_method!r} makes each global batch's composition depend on the global batch "
            "size, which loadspec's elastic state leaves free (a resume may change it); use 'random' (exact "
            "per-stream counts per epoch), or fix the batch size in the config once loadspec defines it (MIX-16)")
    sizes = [int(n) for n in source_sizes]
    counts = stream_counts(sizes, streams, epoch_size)
    if not any(counts):
        return MixPlan(np.zeros(0, _I64), np.zeros(0, _I64))
    plan = mix_plan(counts, MixConfig(weights=tuple(float(c) for c in counts), stopping="all_exhausted", seed=seed),
                    epoch)
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


class MixedDataset(SharedEpoch, Dataset[dict[str, Any]]):
    """Samples of several sources, mixed at sample level, equal to the reference's mixture (MIX-13).

    ``sources``: ``impl.dataset.PackedDataset`` objects, or any map-style
    dataset with ``len`` whose items are dicts of equally shaped arrays and
    which has a ``fingerprint`` string. ``weights`` (``None``: round robin),
    ``stopping``, ``seed``: as ``reference.mixing.MixConfig``; ``weight_fn``:
    ``(step, sizes, taken, exhausted) -> weights`` (e.g. ``balance_remaining``).

    Used with ``impl.loader.build_dataloader`` exactly like ``PackedDataset``:
    ``num_samples(epoch)``, ``fingerprint`` and keys ``SampleKey(epoch,
    index)`` (``-1`` padding); ``__getitems__`` returns the batched dict with
    two more fields, ``source`` and ``source_index`` (int64 ``[B]``), so the
    training loop can count tokens per source. Sample ``i`` of source ``s``
    is that source's sample of the same epoch (each source keeps its own
    order and packing). Workers need no state: the epoch's plan is a pure
    function of the sources' sizes, the config and the epoch (two plans are
    kept in memory).

    What a weight is (MIX-19): each step draws a source with probability
    its weight over the weights of the sources it may still draw, so a
    weight is its source's share of the samples (and tokens) while every
    source can be drawn. Under ``first_exhausted`` (the epoch ends at the
    first draw of an exhausted source) and ``all_exhausted_oversample``
    (exhausted sources restart) that is the whole epoch; under
    ``all_exhausted`` every sample is trained once, so the epoch's shares
    are the sources' sizes and the weights set only the interleaving until
    a source runs out.

    Refused (ConfigError): a static weight of 0 (MIX-18: its source is never
    trained; drop it), and sources that read the same documents, the same
    dataset twice or overlapping splits of one store (MIX-17), unless
    ``allow_repeat=True`` says the repeat is intended (it does not enter
    the fingerprint: it changes no sample).

    >>> mixed = MixedDataset([web, code], weights=(0.7, 0.3), stopping="all_exhausted", seed=1)   # doctest: +SKIP
    >>> loader = build_dataloader(mixed, batch_size=8, rank=rank, world_size=world)              # doctest: +SKIP
    """

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                 stopping: str = "first_exhausted", seed: int = 0, weight_fn: WeightFn | None = None,
                 end: str = "drop_last", epoch: int = 0, streams: Sequence[StreamConfig] | None = None,
                 epoch_size: int | None = None, batching_method: str = "random", allow_repeat: bool = False) -> None:
        require(isinstance(sources, (list, tuple)) and len(sources) >= 1, ConfigError,
                f"sources={sources!r} must be a non-empty list of datasets")
        require(stopping in STOPPING_STRATEGIES, ConfigError,
                f"stopping={stopping!r} is not a stopping strategy; choose one of {STOPPING_STRATEGIES} "
                "(all_exhausted: every sample once, Forgather's meaning; all_exhausted_oversample: HF's)")
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self.sources = list(sources)
        self.mix_config = MixConfig(weights=None if weights is None else tuple(weights), stopping=stopping,  # type: ignore[arg-type]
                                    seed=seed)
        require(weights is None or len(self.mix_config.weights or ()) == len(self.sources), ConfigError,
                f"weights has {0 if weights is None else len(weights)} entries but there are {len(self.sources)} "
                "sources; pass one weight per source")
        self.weight_fn = weight_fn
        self.streams = None if streams is None else tuple(streams)
        self.epoch_size = epoch_size
        self.batching_method = batching_method
        require(streams is None or (weights is None and weight_fn is None), ConfigError,
                "streams set each source's share of the epoch; pass weights=None and weight_fn=None with them")
        require(streams is not None or (epoch_size is None and batching_method == "random"), ConfigError,
                "epoch_size and batching_method apply to streams; pass streams=[StreamConfig(...), ...] with them")
        if weight_fn is None:
            _check_weights_train_every_source(self.mix_config)
        self.end = end
        self.epoch = int(epoch)
        prints = [_fingerprint_of(s, i) for i, s in enumerate(self.sources)]
        require(isinstance(allow_repeat, bool), ConfigError, f"allow_repeat={allow_repeat!r} must be True or False")
        self.allow_repeat = allow_repeat
        if not allow_repeat:
            _check_distinct_sources(self.sources)
        configs = [getattr(s, "config", None) for s in self.sources]
        if all(c is not None and hasattr(c, "packing") for c in configs):
            self.config: MixtureConfig | None = MixtureConfig(
                sources=tuple(configs), mixing=self.mix_config, end=end, weight_fn=weight_fn,  # type: ignore[arg-type]
                streams=self.streams, epoch_size=epoch_size, batching_method=batching_method, allow_repeat=allow_repeat)
            data = _data_fingerprints(self.sources)
            self.fingerprint = mixture_fingerprint(data, self.config)
            #: The fingerprint's components (RES-8): a refused state names the ones that differ.
            self.fingerprint_parts = mixture_parts(data, self.config)
            packing = self.config.packing
            self._pad: dict[str, np.ndarray] | None = {name: row[0] for name, row in padding_rows(1, packing).items()}
        else:
            self.config = None
            payload = {"data": prints, "mixture": {"mixing": {"weights": self.mix_config.weights,
                                                              "stopping": stopping, "seed": seed},
                                                   "end": end, "weight_fn": _name(weight_fn),
                                                   "streams": None if streams is None else
                                                   [dataclasses.asdict(x) for x in streams],
                                                   "epoch_size": epoch_size, "batching_method": batching_method}}
            self.fingerprint = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
            self.fingerprint_parts = {f"source_{i}_data": part_hash(p) for i, p in enumerate(prints)}
            self.fingerprint_parts.update(mixture_level_parts(
                {"weights": self.mix_config.weights, "stopping": stopping, "seed": seed}, end, _name(weight_fn),
                None if streams is None else {"streams": [dataclasses.asdict(x) for x in streams],
                                              "epoch_size": epoch_size, "batching_method": batching_method}))
            self._pad = None
        self._plans: collections.OrderedDict[int, MixPlan] = collections.OrderedDict()
        self._shape = self._check_shapes()
        self._packing = _shared_packing(self.sources)
        self._tokens: TokenSource | None = None
        self._doc_base = np.zeros(len(self.sources), dtype=_I64)
        self._blocks: collections.OrderedDict[tuple[int, int], tuple[_Pieces, np.ndarray]] = collections.OrderedDict()
        self._last_block: tuple[int, int] | None = None
        self._piece_block = PIECE_BLOCK

    # ------------------------------------------------------------ construction checks

    def _first_sample(self, i: int) -> dict[str, np.ndarray]:
        """Source ``i``'s sample 0, or for a ``PackedDataset`` its fields' shapes alone.

        Why not read a packed sample: its fields are ``seq_len`` long by
        construction, and reading one here would read tokens (and leave the
        source's order looking like a sequential reader at position 0, so a
        resume at 0 would evaluate a whole block of the order).
        """
        src = self.sources[i]
        if type(src) is PackedDataset:
            return {name: np.empty(src.config.packing.seq_len, dtype=_I64) for name in FIELDS}
        if hasattr(src, "sample"):
            return {k: np.asarray(v) for k, v in src.sample(0, 0).items()}
        return {k: _numpy(v) for k, v in src[0].items()}

    def _check_shapes(self) -> dict[str, tuple[int, ...]]:
        """MIX-14: every source's samples have the same fields, each of the same shape."""
        shapes: dict[str, tuple[int, ...]] | None = None
        for i, src in enumerate(self.sources):
            if _source_size(src, 0) == 0:
                continue
            sample = self._first_sample(i)
            mine = {k: v.shape for k, v in sample.items() if k not in ("epoch", "sample_index", "cu_seqlens")}
            if shapes is None:
                shapes, first = mine, i
                continue
            require(mine == shapes, ConfigError,
                    f"sources[{i}] yields fields {mine} but sources[{first}] yields {shapes}; every source of a "
                    "mixture must yield the same fields with the same shapes (same seq_len and packing fields)")
        return shapes or {}

    # ------------------------------------------------------------ pickling (workers under spawn)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plans"] = collections.OrderedDict()
        state["_tokens"] = None
        state["_blocks"] = collections.OrderedDict()
        return state

    # ------------------------------------------------------------ plans and sizes

    def source_sizes(self, epoch: int) -> list[int]:
        """Samples of each source in epoch ``epoch`` (what MIX mixes)."""
        return [_source_size(s, epoch) for s in self.sources]

    def plan(self, epoch: int) -> MixPlan:
        """Epoch ``epoch``'s mixed stream (``mix_plan`` over the sources' sizes), built once and kept (LRU of 2)."""
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        epoch = int(epoch)
        plan = self._plans.get(epoch)
        if plan is None:
            if self.streams is not None:
                plan = stream_plan(self.source_sizes(epoch), self.streams, self.mix_config.seed, epoch,
                                   epoch_size=self.epoch_size, batching_method=self.batching_method)
            else:
                plan = mix_plan(self.source_sizes(epoch), self.mix_config, epoch, weight_fn=self.weight_fn)
            self._plans[epoch] = plan
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(epoch)
        return plan

    def num_samples(self, epoch: int) -> int:
        return len(self.plan(epoch).source)

    def explain_short_epoch(self, epoch: int) -> str | None:
        """Why epoch ``epoch`` is too short for a step, when an empty source cut it short (MIX-6, MIX-9); else None.

        Why: under ``first_exhausted`` an empty source ends the mixed stream
        the first time it is chosen, so the loader's "no step" error would
        otherwise blame the batch size. ``impl.loader.build_dataloader`` asks.
        """
        if self.streams is not None or self.mix_config.stopping != "first_exhausted":
            return None
        weights = self.mix_config.weights
        empty = [i for i, n in enumerate(self.source_sizes(epoch))
                 if n == 0 and (weights is None or self.weight_fn is not None or weights[i] > 0)]
        if not empty:
            return None
        i = empty[0]
        zero = ", make weight_fn give it weight 0" if self.weight_fn is not None else ""   # static 0s: MIX-18
        return (f"sources[{i}] ({_describe(self.sources[i])}) holds no sample in epoch {epoch}, and under "
                "stopping='first_exhausted' the mixed stream ends the first time an empty source is chosen (MIX-6, "
                f"MIX-9), so the epoch holds {self.num_samples(epoch)} samples; drop sources[{i}] from the mixture"
                f"{zero}, or use stopping='all_exhausted' (every sample of the other sources once) or "
                "'all_exhausted_oversample', which skip an empty source")

    def __len__(self) -> int:
        return self.num_samples(self.epoch)

    def __repr__(self) -> str:
        return (f"MixedDataset({len(self.sources)} sources, weights={self.mix_config.weights}, "
                f"stopping={self.mix_config.stopping!r}, epoch={self.epoch})")

    # ------------------------------------------------------------ samples

    def _resolve(self, key: Any) -> tuple[int, int]:
        return resolve_key(key, self.epoch, self.num_samples, " of the mixture")

    def _fetch(self, s: int, epoch: int, indices: np.ndarray) -> dict[str, np.ndarray]:
        src = self.sources[s]
        if hasattr(src, "samples"):
            return dict(src.samples(epoch, indices))
        rows = [src[int(i)] for i in indices]
        return {k: np.stack([_numpy(r[k]) for r in rows]) for k in self._shape}

    def _padding_rows(self, n: int) -> dict[str, np.ndarray]:
        require(self._pad is not None, ConfigError,
                "end='pad' needs a padding sample, which only a mixture of PackedDataset sources defines; "
                "use end='drop_last' or end='even' with these sources")
        assert self._pad is not None
        return {name: np.tile(value, (n, 1)) for name, value in self._pad.items()}

    def _token_source(self) -> TokenSource:
        if self._tokens is None:
            parts = [src.source for src in self.sources]
            self._doc_base = exclusive_cumsum(np.array([p.num_documents for p in parts], dtype=_I64))[:-1]
            self._tokens = TokenSource.concat(parts)
        return self._tokens

    def _pieces(self, epoch: int, indices: np.ndarray) -> _Pieces:
        """The pieces of mixed samples ``indices`` of epoch ``epoch`` (all real), in ``indices``' order.

        Each source present finds its rows' pieces (``PackPlan.batch_pieces``
        and its order) once; the pieces are laid out row by row, each
        document id moved into ``TokenSource.concat`` of the sources.
        """
        plan = self.plan(epoch)
        source, item = plan.source[indices], plan.item[indices]
        found = []
        counts = np.zeros(len(indices), dtype=_I64)
        for s in distinct_ints(source):
            rows = np.flatnonzero(source == s)
            dataset = self.sources[s]
            c, pos, a, b = dataset.plan(epoch).batch_pieces(item[rows])
            ids = dataset.order(epoch)(pos) if len(pos) else pos
            counts[rows] = c
            found.append((rows, c, ids, a, b, s))
        if len(found) == 1:   # one source: its pieces are already in row order
            _, _, ids, starts, stops, s = found[0]
            docs, reported = ids + self._doc_base[s], ids + self.sources[s].first_document
        else:
            ptr = exclusive_cumsum(counts)
            docs, reported, starts, stops = (np.empty(int(ptr[-1]), dtype=_I64) for _ in range(4))
            for rows, c, ids, a, b, s in found:
                at = ranges(ptr[rows], c)
                docs[at] = ids + self._doc_base[s]
                reported[at], starts[at], stops[at] = ids + self.sources[s].first_document, a, b
        return _Pieces(counts, docs, reported, starts, stops, source, item)

    def _block_pieces(self, epoch: int, indices: np.ndarray) -> _Pieces | None:
        """The pieces from cached blocks of ``PIECE_BLOCK`` mixed samples, or None (then the caller computes them).

        Why: a sequential reader (a loader on few ranks) asks for a short run
        of consecutive samples, the next batch the run after it. Finding the
        pieces source by source costs a fixed number of numpy calls per
        source present, for 8 rows as for 1024; a block's pieces, found once,
        serve each of its batches by one slice. A block is computed when a
        batch falls in one block and the previous batch fell in it or the
        one before (a sequential reader); isolated lookups and readers that
        skip blocks (many ranks, a resume's first batch) compute their own
        rows. At most ``PIECE_BLOCKS_KEPT`` blocks are kept, so memory stays
        O(block), never O(epoch).
        """
        size = self._piece_block
        block = int(indices.min()) // size
        if int(indices.max()) // size != block:
            return None
        key = (epoch, block)
        last, self._last_block = self._last_block, key
        table = self._blocks.get(key)
        if table is None:
            if last not in (key, (epoch, block - 1)):
                return None
            start = block * size
            whole = self._pieces(epoch, np.arange(start, min(start + size, self.num_samples(epoch)), dtype=_I64))
            table = (whole, exclusive_cumsum(whole.counts))
            self._blocks[key] = table
            while len(self._blocks) > PIECE_BLOCKS_KEPT:
                with contextlib.suppress(KeyError):
                    self._blocks.popitem(last=False)
        whole, ptr = table
        rows = indices - block * size
        counts = whole.counts[rows]
        at = ranges(ptr[rows], counts)
        return _Pieces(counts, whole.docs[at], whole.reported[at], whole.starts[at], whole.stops[at],
                       whole.source[rows], whole.item[rows])

    def _packed_batch(self, epochs: np.ndarray, indices: np.ndarray, packing: PackingConfig) -> dict[str, Any]:
        """The batch of sources that are ``PackedDataset``s packing alike: one ``fill_batch`` for all its rows.

        Why: a batch of B mixed samples touches up to K sources; filling
        each source's rows apart costs K fills, each a fixed number of numpy
        calls however few rows it has. Here the batch's pieces are found
        (``_pieces``, or a slice of a cached block) and one fill reads every
        row from ``TokenSource.concat`` of the sources, reporting each
        source's own document ids.
        """
        n = len(indices)
        tokens = self._token_source()
        real = indices != PADDING
        epoch_list = distinct_ints(epochs[real])
        pieces: _Pieces | None = None
        if len(epoch_list) == 1 and real.all():
            pieces = self._block_pieces(epoch_list[0], indices)
            if pieces is None:
                pieces = self._pieces(epoch_list[0], indices)
        else:
            parts = [(np.flatnonzero(real & (epochs == e)), e) for e in epoch_list]
            found = [(rows, self._pieces(e, indices[rows])) for rows, e in parts]
            counts = np.zeros(n, dtype=_I64)
            source = np.full(n, -1, dtype=_I64)
            item = np.full(n, -1, dtype=_I64)
            for rows, got in found:
                counts[rows], source[rows], item[rows] = got.counts, got.source, got.item
            ptr = exclusive_cumsum(counts)
            docs, reported, starts, stops = (np.empty(int(ptr[-1]), dtype=_I64) for _ in range(4))
            for rows, got in found:
                at = ranges(ptr[rows], got.counts)
                docs[at], reported[at], starts[at], stops[at] = got.docs, got.reported, got.starts, got.stops
            pieces = _Pieces(counts, docs, reported, starts, stops, source, item)
        out: dict[str, Any] = fill_batch(pieces.counts, pieces.docs, pieces.starts, pieces.stops, packing, tokens,
                                         segments=True, reported=pieces.reported)
        out["epoch"], out["sample_index"] = epochs, indices
        out["source"], out["source_index"] = pieces.source, pieces.item
        return out

    def _batch(self, keys: Sequence[Any]) -> dict[str, Any]:
        resolved = resolve_keys(keys, self._resolve, self.num_samples)
        if resolved is None:
            raise ConfigError(f"keys {keys!r} do not fit int64; pass SampleKey(epoch, index) of int64 values")
        epochs, indices = resolved
        if self._packing is not None:
            return self._packed_batch(epochs, indices, self._packing)
        n = len(indices)
        source = np.full(n, -1, dtype=_I64)
        local = np.full(n, -1, dtype=_I64)
        out: dict[str, Any] = {}
        pad = indices == PADDING
        for epoch in distinct_ints(epochs[~pad]):
            rows = np.flatnonzero(~pad & (epochs == epoch))
            plan = self.plan(epoch)
            source[rows] = plan.source[indices[rows]]
            local[rows] = plan.item[indices[rows]]
            for s in distinct_ints(source[rows]):
                mine = rows[source[rows] == s]
                part = self._fetch(s, epoch, local[mine])
                for name in self._shape:
                    if name not in out:
                        out[name] = np.empty((n, *self._shape[name]), dtype=np.asarray(part[name]).dtype)
                    out[name][mine] = part[name]
        if pad.any():
            rows = np.flatnonzero(pad)
            for name, value in self._padding_rows(len(rows)).items():
                if name not in out:
                    out[name] = np.empty((n, *value.shape[1:]), dtype=value.dtype)
                out[name][rows] = value
        if "position_ids" in out:
            out["cu_seqlens"], out["max_seqlen"] = batch_cu_seqlens(out["position_ids"], out.get("doc_ids"))
        out["epoch"], out["sample_index"] = epochs, indices
        out["source"], out["source_index"] = source, local
        return out

    def samples(self, epoch: int, indices: Any) -> dict[str, Any]:
        """Mixed samples ``indices`` of epoch ``epoch`` as numpy, stacked (``__getitems__``'s numpy form)."""
        values = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        return self._batch([SampleKey(int(epoch), int(i)) for i in values])

    def __getitems__(self, keys: list[Any]) -> SampleBatch:
        """A whole batch as a ``SampleBatch`` (``PackedDataset``'s fields plus ``source``/``source_index``).

        Why a ``SampleBatch``: torch's DataLoader hands this to its
        ``collate_fn``; ``default_collate`` (a plain ``DataLoader``, torchdata's
        ``StatefulDataLoader``) reads it as the list of samples, and
        ``impl.collation.collate`` takes the batch computed here as is.
        """
        return SampleBatch({name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                            for name, value in self._batch(keys).items()})

    def __getitem__(self, key: Any) -> dict[str, torch.Tensor]:
        sample: dict[str, torch.Tensor] = self.__getitems__([key])[0]
        return sample


def _check_weights_train_every_source(config: MixConfig) -> None:
    """MIX-18: a mixture's static weight of 0 names a source it never trains."""
    for i, w in enumerate(config.weights or ()):
        require(w > 0, ConfigError, zero_weight_message(i, config.stopping))


def _source_rows(source: Any) -> tuple[str, range | None]:
    """MIX-17's identity of a source: its store's data fingerprint and the store rows it reads.

    A split reads ``store.rows`` of its base store (``store.data_fingerprint``);
    an unsplit store all its documents. A source without a store is its own
    ``fingerprint``, whole (``None`` rows).
    """
    store: Any = getattr(source, "store", None)
    data = getattr(store, "data_fingerprint", None) or getattr(store, "fingerprint", None)
    if not isinstance(data, str):
        return str(source.fingerprint), None
    rows = getattr(store, "rows", None)
    return data, rows if isinstance(rows, range) else range(int(store.num_documents))


def _check_distinct_sources(sources: Sequence[Any]) -> None:
    """MIX-17: refuse two sources that read some document twice (the same dataset, or overlapping splits)."""
    seen = [_source_rows(src) for src in sources]
    for i, (data_i, rows_i) in enumerate(seen):
        for j in range(i + 1, len(seen)):
            data_j, rows_j = seen[j]
            if data_i != data_j:
                continue
            if rows_i is None or rows_j is None:
                raise ConfigError(f"sources[{i}] and sources[{j}] are the same source (fingerprint {data_i[:12]}...), "
                                  f"so each of its samples is trained twice per epoch; drop sources[{j}], or pass "
                                  "allow_repeat=True if training them twice is intended (MIX-17)")
            if max(rows_i.start, rows_j.start) < min(rows_i.stop, rows_j.stop):
                raise ConfigError(repeat_message(data_i, i, rows_i, j, rows_j))


def _shared_packing(sources: Sequence[Any]) -> PackingConfig | None:
    """The sources' one ``PackingConfig`` when every source is a ``PackedDataset`` (the one-fill batch path), else None."""
    if not all(type(src) is PackedDataset for src in sources):
        return None
    packings = {src.config.packing for src in sources}
    return packings.pop() if len(packings) == 1 else None


def _describe(source: Any) -> str:
    """A source in words: a ``PackedDataset``'s store (and split), else its type."""
    store = getattr(source, "store", None)
    if store is None or not hasattr(store, "path"):
        return type(source).__name__
    split = getattr(store, "notation", None)
    return f"{type(source).__name__} over " + (f"split={split!r} of " if split else "") + f"the store at {store.path}"


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))


def _data_fingerprints(sources: Sequence[Any]) -> list[str]:
    """Each source's data fingerprint (its store's, as the reference fingerprints the corpus), MIX-14."""
    out: list[str] = []
    for i, src in enumerate(sources):
        store = getattr(src, "store", None)
        data = getattr(store, "data_fingerprint", None) or getattr(store, "fingerprint", None)
        require(isinstance(data, str), ConfigError,
                f"sources[{i}] ({type(src).__name__}) has a config but no store fingerprint; pass a PackedDataset")
        out.append(str(data))
    return out


_INTERLEAVE_ALL_EXHAUSTED = (
    "stopping_strategy='all_exhausted' means different things in the systems loadspec replaces: Hugging Face "
    "datasets oversamples (restarts exhausted sources until every source has run out once), Forgather drops "
    "exhausted sources (every example exactly once); pass oversample=True for Hugging Face's meaning or "
    "oversample=False for Forgather's")


def interleave_datasets(datasets: Sequence[Any], probabilities: Sequence[float] | Callable[..., Sequence[float]] | None = None,
                        seed: int | None = None, stopping_strategy: str = "first_exhausted", *,
                        oversample: bool | None = None, balance_remaining_examples: bool = False,
                        end: str = "drop_last") -> MixedDataset:
    """A ``MixedDataset`` from Hugging Face / Forgather ``interleave_datasets`` arguments.

    ``probabilities``: ``None`` (round robin), one weight per dataset, or a
    callable ``(step, sizes, taken, exhausted) -> weights`` (Forgather's);
    ``balance_remaining_examples=True`` is ``weight_fn=balance_remaining``.
    ``seed=None`` means seed 0 (loadspec has no unseeded randomness).
    ``stopping_strategy="all_exhausted"`` is refused unless ``oversample``
    says which meaning is wanted (the two systems disagree).

    >>> interleave_datasets([a, b], stopping_strategy="all_exhausted")   # doctest: +SKIP
    Traceback (most recent call last):
    ...
    impl.errors.ConfigError: stopping_strategy='all_exhausted' means different things ...
    """
    if stopping_strategy == "all_exhausted":
        require(oversample is not None, ConfigError, _INTERLEAVE_ALL_EXHAUSTED)
        stopping = "all_exhausted_oversample" if oversample else "all_exhausted"
    else:
        require(stopping_strategy in ("first_exhausted", "all_exhausted_oversample"), ConfigError,
                f"stopping_strategy={stopping_strategy!r} is not one of 'first_exhausted', 'all_exhausted' "
                "(with oversample=True/False), 'all_exhausted_oversample'")
        stopping = stopping_strategy
    weight_fn: WeightFn | None = None
    weights: Sequence[float] | None = None
    if balance_remaining_examples:
        require(probabilities is None, ConfigError,
                "balance_remaining_examples=True sets the weights itself; pass probabilities=None with it")
        weight_fn = balance_remaining
    elif callable(probabilities):
        weight_fn = probabilities
    elif probabilities is not None:
        weights = list(probabilities)
    return MixedDataset(list(datasets), weights=weights, stopping=stopping, seed=0 if seed is None else seed,
                        weight_fn=weight_fn, end=end)

