"""The mixed stream of an epoch as arrays: which source, and which of its samples, each step emits.

Conforms to MIX-1..MIX-9, MIX-11 (docs/SEMANTICS.md, "Mixing"): ``mix_plan(sizes,
config, e)`` is ``reference.mixing.mix(sizes, config, e)`` as two int64 arrays;
and, as ``reference.mixing`` ends, to what a mixture refuses (MIX-17, MIX-18).
MosaicML-style streams build on it in ``impl.streams`` (MIX-15, MIX-16, MIX-20,
MIX-21), and ``impl.mixed_dataset.MixedDataset`` serves the samples it names.

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

import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from impl import rng
from impl._arrays import exclusive_cumsum
from impl.errors import ConfigError, is_integer, require
from reference.mixing import MixConfig, WeightFn, repeat_message, zero_weight_message
from reference.rng import Stream

__all__ = ["MixPlan", "balance_remaining", "check_distinct_sources", "check_mixture_weights", "mix_plan"]

_I64 = np.int64
_BLOCK = 1 << 18


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


# ---------------------------------------------------------------- what a mixture refuses (MIX-17, MIX-18)

def check_mixture_weights(config: MixConfig) -> None:
    """MIX-18: a mixture's static weight of 0 names a source it never trains."""
    for i, w in enumerate(config.weights or ()):
        require(w > 0, ConfigError, zero_weight_message(i, config.stopping))


def source_rows(source: Any) -> tuple[str, range | None]:
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


def check_distinct_sources(sources: Sequence[Any]) -> None:
    """MIX-17: refuse two sources that read some document twice (the same dataset, or overlapping splits)."""
    seen = [source_rows(src) for src in sources]
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
