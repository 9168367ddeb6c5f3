"""Mixing: several sources interleaved into one stream (MIX-*).

Why a specification: pre-training mixes corpora (web, code, books) by weight,
and the classic bugs are a mixture that silently changes on resume (the
sampler's generator state was not saved, or was replayed wrongly), a stream
that ends earlier or later than the user thought (``first_exhausted`` versus
``all_exhausted`` mean different things in different libraries), and an
exhausted source that keeps its weight. Here the source chosen at step ``t``
is a pure function of ``(seed, epoch, t)`` and of a small cursor
(``MixState``), so a loader resumes in O(1) by restoring the cursor, and a
vectorised implementation reproduces the choices bit for bit: one counter
draw per step, float cumulative sums accumulated left to right.

Sources are represented by their sizes; an item is ``(source, index within
the source)``. Three stopping strategies:

- ``first_exhausted`` (HF's and Forgather's default): undersample; the stream
  ends at the first step that chooses a source with nothing left (MIX-6);
- ``all_exhausted`` (Forgather's meaning): sources that run out drop out; every
  item of every source exactly once (MIX-7);
- ``all_exhausted_oversample`` (HF's meaning): a chosen exhausted source
  restarts at its item 0; the stream ends once every non-empty source has
  been exhausted at least once (MIX-8).

What a mixture refuses (MIX-17, MIX-18) ends this module; MosaicML-style
streams, with fixed per-source counts and batching methods, build on
``mix`` in ``reference.streams`` (MIX-15, MIX-16, MIX-20, MIX-21).

Worked example (round robin over sizes [1, 3])::

    >>> mix([1, 3], MixConfig(), epoch=0)
    [(0, 0), (1, 0)]
    >>> mix([1, 3], MixConfig(stopping="all_exhausted"), epoch=0)
    [(0, 0), (1, 0), (1, 1), (1, 2)]
    >>> mix([1, 3], MixConfig(stopping="all_exhausted_oversample"), epoch=0)
    [(0, 0), (1, 0), (0, 0), (1, 1), (0, 0), (1, 2)]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from reference.errors import ConfigError, StateError, is_int, require
from reference.rng import MASK64, Stream, derive_key, unit

Stopping = Literal["first_exhausted", "all_exhausted", "all_exhausted_oversample"]
STOPPING_STRATEGIES = ("first_exhausted", "all_exhausted", "all_exhausted_oversample")

WeightFn = Callable[[int, Sequence[int], Sequence[int], Sequence[bool]], Sequence[float]]
"""``(step, source_sizes, taken, exhausted) -> weights``: Forgather's dynamic-probability signature."""

Item = tuple[int, int]


def is_weight(value: object) -> bool:
    """A relative weight: a finite real number >= 0, not a bool (MIX-3's weights, MIX-15's shares).

    >>> [is_weight(v) for v in (0, 0.5, -1.0, float("inf"), True)]
    [True, True, False, False, False]
    """
    return isinstance(value, (int, float, numbers.Real)) and not isinstance(value, bool) and math.isfinite(value) \
        and float(value) >= 0


@dataclass(frozen=True, kw_only=True, slots=True)
class MixConfig:
    """How sources are interleaved (MIX-2, MIX-3, MIX-5..MIX-8, MIX-12).

    ``weights=None`` means round robin; otherwise each step draws a source
    with probability proportional to its weight (the weights need not sum to
    1). A ``weight_fn`` passed to ``mix``/``next_item`` overrides ``weights``.
    Lists are accepted and stored as tuples of floats.

    >>> MixConfig(weights=(1.0, -0.5))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: weights[1]=-0.5 must be a finite number >= 0; pass non-negative relative weights such as (0.7, 0.3)
    """

    weights: tuple[float, ...] | None = None
    stopping: Stopping = "first_exhausted"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.weights is not None:
            require(isinstance(self.weights, (tuple, list)) and len(self.weights) >= 1, ConfigError,
                    f"weights={self.weights!r} must be a non-empty tuple of numbers, one per source; "
                    "or pass weights=None for round robin")
            for i, w in enumerate(self.weights):
                require(is_weight(w), ConfigError,
                        f"weights[{i}]={w!r} must be a finite number >= 0; pass non-negative relative weights such as (0.7, 0.3)")
            require(any(w > 0 for w in self.weights), ConfigError,
                    f"weights={tuple(self.weights)!r} are all zero; give at least one source a positive weight")
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        require(self.stopping in STOPPING_STRATEGIES, ConfigError,
                f"stopping={self.stopping!r} is not a stopping strategy; choose one of {STOPPING_STRATEGIES}")
        require(is_int(self.seed) and 0 <= self.seed <= MASK64, ConfigError,
                f"seed={self.seed!r} must be an integer in [0, 2**64); pass a non-negative seed")


@dataclass(frozen=True, kw_only=True, slots=True)
class MixState:
    """The cursor of a mixed stream: everything the next step depends on besides the config (MIX-10).

    Why these fields: the draw at step ``t`` needs only ``t``; the choice needs
    the per-source counters (``taken`` feeds ``weight_fn``, ``exhausted``
    masks sources, ``next_source`` is the round-robin pointer); the emitted
    item needs ``cursor``; the stopping rules need ``exhausted_once`` and
    ``done``. All fields are ints, bools and tuples of them, so
    ``MixState(**json.loads(json.dumps(dataclasses.asdict(s))))`` restores
    ``s`` (lists are stored as tuples).

    - ``step``: draws attempted so far, including one that ended the stream;
    - ``taken[i]``: items emitted from source i, restarts included;
    - ``cursor[i]``: the next item index of source i in its current pass;
    - ``exhausted[i]``: source i has no item left in its current pass;
    - ``exhausted_once[i]``: source i has been exhausted at least once;
    - ``next_source``: where the round-robin search starts (0 when weighted);
    - ``done``: the stream has ended; further steps return nothing.
    """

    step: int
    taken: tuple[int, ...]
    cursor: tuple[int, ...]
    exhausted: tuple[bool, ...]
    exhausted_once: tuple[bool, ...]
    next_source: int
    done: bool

    def __post_init__(self) -> None:
        for name in ("taken", "cursor", "exhausted", "exhausted_once"):
            value = getattr(self, name)
            require(isinstance(value, (tuple, list)), StateError,
                    f"{name}={value!r} must be a sequence with one entry per source")
            object.__setattr__(self, name, tuple(value))
        k = len(self.taken)
        for name in ("cursor", "exhausted", "exhausted_once"):
            require(len(getattr(self, name)) == k, StateError,
                    f"{name} has {len(getattr(self, name))} entries but taken has {k}; the state is corrupt")
        require(is_int(self.step) and self.step >= 0, StateError, f"step={self.step!r} must be an integer >= 0")
        require(all(is_int(v) and v >= 0 for v in self.taken + self.cursor), StateError,
                f"taken={self.taken!r} and cursor={self.cursor!r} must hold integers >= 0")
        require(all(isinstance(v, bool) for v in self.exhausted + self.exhausted_once) and isinstance(self.done, bool),
                StateError, "exhausted, exhausted_once and done must be booleans")
        require(is_int(self.next_source) and 0 <= self.next_source < max(k, 1), StateError,
                f"next_source={self.next_source!r} must be a source index in [0, {k})")


def initial_state(num_sources: int) -> MixState:
    """The cursor before the first step: nothing taken, every source at item 0 (MIX-10).

    >>> initial_state(2)
    MixState(step=0, taken=(0, 0), cursor=(0, 0), exhausted=(False, False), exhausted_once=(False, False), next_source=0, done=False)

    Clauses: MIX-10.
    """
    require(is_int(num_sources) and num_sources >= 0, ConfigError,
            f"num_sources={num_sources!r} must be an integer >= 0")
    zeros, falses = (0,) * num_sources, (False,) * num_sources
    return MixState(step=0, taken=zeros, cursor=zeros, exhausted=falses, exhausted_once=falses, next_source=0, done=False)


def balance_remaining(step: int, source_sizes: Sequence[int], taken: Sequence[int],
                      exhausted: Sequence[bool]) -> list[float]:
    """Forgather's ``balance_remaining_examples``: weight each source by its items left (MIX-11).

    Why: with weights proportional to what remains, all sources run out at
    about the same time, so no corpus is concentrated at the end of training.
    An exhausted source gets 0; if every weight would be 0, all get 1.0 (the
    stopping rule then ends the stream). ``step`` is unused.

    >>> balance_remaining(5, [3, 5, 4], [1, 5, 0], [False, True, False])
    [2.0, 0.0, 4.0]
    >>> balance_remaining(9, [2, 2], [2, 2], [True, True])
    [1.0, 1.0]

    Clauses: MIX-11.
    """
    weights = [0.0 if gone else float(max(0, size - count))
               for size, count, gone in zip(source_sizes, taken, exhausted, strict=True)]
    if not any(weights):
        return [1.0] * len(weights)
    return weights


def check_source_sizes(source_sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes of the sources, each an integer >= 0, as a tuple; else ConfigError naming the bad entry."""
    sizes = tuple(source_sizes)
    for i, n in enumerate(sizes):
        require(is_int(n) and n >= 0, ConfigError,
                f"source_sizes[{i}]={n!r} must be an integer >= 0 (the number of items in source {i})")
    return sizes


def _check_state(state: MixState, sizes: tuple[int, ...]) -> None:
    require(isinstance(state, MixState), StateError, f"state={state!r} must be a MixState; start from initial_state")
    require(len(state.taken) == len(sizes), StateError,
            f"the state has {len(state.taken)} sources but source_sizes has {len(sizes)}; "
            "resume with the sources the state was made for")
    for i, (c, n, gone, once) in enumerate(zip(state.cursor, sizes, state.exhausted, state.exhausted_once)):
        require(c <= n, StateError, f"cursor[{i}]={c} exceeds source_sizes[{i}]={n}; the state is for other data")
        require(gone == (c == n) or n == 0, StateError,
                f"exhausted[{i}]={gone} contradicts cursor[{i}]={c} of source_sizes[{i}]={n}; the state is corrupt")
        require(once or not gone, StateError, f"exhausted[{i}] is set but exhausted_once[{i}] is not; the state is corrupt")


def _with_empty_sources_exhausted(state: MixState, sizes: tuple[int, ...]) -> MixState:
    """``initial_state`` does not know the sizes; an empty source is exhausted from step 0 (MIX-9)."""
    if all(n > 0 or (gone and once) for n, gone, once in zip(sizes, state.exhausted, state.exhausted_once)):
        return state
    return replace(state,
                   exhausted=tuple(gone or n == 0 for gone, n in zip(state.exhausted, sizes)),
                   exhausted_once=tuple(once or n == 0 for once, n in zip(state.exhausted_once, sizes)))


def _eligible(state: MixState, sizes: tuple[int, ...], stopping: str) -> list[bool]:
    """Which sources a step may choose (MIX-4, MIX-9)."""
    if stopping == "first_exhausted":
        return [True] * len(sizes)
    if stopping == "all_exhausted":
        return [not gone for gone in state.exhausted]
    return [n > 0 for n in sizes]


def _round_robin_choice(state: MixState, eligible: list[bool]) -> int:
    """The first eligible source at or cyclically after the pointer (MIX-2)."""
    k = len(eligible)
    return next(s for s in ((state.next_source + d) % k for d in range(k)) if eligible[s])


def _step_weights(state: MixState, sizes: tuple[int, ...], config: MixConfig, weight_fn: WeightFn | None) -> list[float]:
    """The raw weights of step ``state.step``: ``weight_fn``'s if given, else the config's (MIX-4, MIX-5)."""
    t, k = state.step, len(sizes)
    if weight_fn is None:
        require(config.weights is not None, ConfigError,
                "the mixture has neither weights nor a weight_fn; pass weights=(...) or weight_fn=...")
        assert config.weights is not None
        require(len(config.weights) == k, ConfigError,
                f"weights has {len(config.weights)} entries but there are {k} sources; pass one weight per source")
        return list(config.weights)
    raw = list(weight_fn(t, sizes, state.taken, state.exhausted))
    require(len(raw) == k, ConfigError,
            f"weight_fn returned {len(raw)} weights at step {t} but there are {k} sources; return one weight per source")
    for i, w in enumerate(raw):
        require(is_weight(w), ConfigError,
                f"weight_fn returned weights[{i}]={w!r} at step {t}; weights must be finite numbers >= 0")
    return [float(w) for w in raw]


def choose_weighted(weights: Sequence[float], u: float) -> int:
    """The source whose cumulative-weight interval contains ``u`` (MIX-3).

    The first ``i`` with ``u < cumulative_i / total``, where ``cumulative_i``
    is the float sum of ``weights[0..i]`` accumulated left to right and
    ``total`` is the last cumulative sum (the same sum ``numpy.cumsum``
    computes). Zero weights own empty intervals and are never chosen. If no
    ``i`` matches (impossible here since ``cumulative_{K-1} / total == 1.0``,
    but an implementation that normalises differently must not fall off the
    end) the last source with positive weight is chosen.

    >>> [choose_weighted([1.0, 0.0, 3.0], u) for u in (0.0, 0.24, 0.25, 0.999)]
    [0, 0, 2, 2]

    Clauses: MIX-3.
    """
    cumulative, running = [], 0.0
    for w in weights:
        running += w
        cumulative.append(running)
    total = running
    for i, c in enumerate(cumulative):
        if u < c / total:
            return i
    return max(i for i, w in enumerate(weights) if w > 0)


def _weighted_choice(state: MixState, sizes: tuple[int, ...], config: MixConfig, epoch: int,
                     weight_fn: WeightFn | None, eligible: list[bool]) -> int:
    """Draw the source of step t with ``u = unit(derive_key(seed, epoch, MIX), t)`` (MIX-3, MIX-4, MIX-5)."""
    t = state.step
    raw = _step_weights(state, sizes, config, weight_fn)
    if weight_fn is None and config.stopping != "first_exhausted":
        for i, (w, n) in enumerate(zip(raw, sizes)):
            require(w > 0 or n == 0, ConfigError,
                    f"weights[{i}]=0 but source {i} holds {n} items, and stopping={config.stopping!r} ends only when "
                    f"every non-empty source is exhausted, which source {i} never is; give it a positive weight or "
                    "use stopping='first_exhausted'")
    weights = [w if ok else 0.0 for w, ok in zip(raw, eligible)]
    require(any(w > 0 for w in weights), ConfigError,
            f"all weights of the sources that can still be chosen are zero at step {t} (weights={raw}, "
            f"exhausted={list(state.exhausted)}); a weight_fn must give a positive weight to a source with items left")
    return choose_weighted(weights, unit(derive_key(config.seed, epoch, Stream.MIX), t))


def _ended(state: MixState, stopping: str) -> bool:
    """Whether the all_exhausted variants have ended (MIX-7, MIX-8); first_exhausted ends only on a draw."""
    if not state.taken:
        return True
    if stopping == "all_exhausted":
        return all(state.exhausted)
    if stopping == "all_exhausted_oversample":
        return all(state.exhausted_once)
    return False


def next_item(state: MixState, source_sizes: Sequence[int], config: MixConfig, epoch: int,
              weight_fn: WeightFn | None = None) -> tuple[Item | None, MixState]:
    """One step of the mixed stream: the item it emits (or ``None`` at the end) and the next cursor.

    Why a step function: resuming must not replay the stream. The step reads
    only ``state`` and the draw ``unit(key, state.step)``, so restoring a saved
    state continues exactly where the uninterrupted stream would (MIX-10).

    A step at time ``t``: choose a source (round robin, MIX-2, or weighted,
    MIX-3/MIX-4); if it has no item left, ``first_exhausted`` ends the stream
    (``step`` becomes t + 1, nothing is emitted, MIX-6) and
    ``all_exhausted_oversample`` restarts it at item 0 (MIX-8); emit its next
    item. The all_exhausted variants set ``done`` in the state returned with
    the stream's last item (MIX-7, MIX-8). A done state is returned unchanged.

    >>> s = initial_state(2)
    >>> item, s = next_item(s, [3, 2], MixConfig(), 0); item
    (0, 0)
    >>> s.step, s.taken, s.cursor, s.next_source
    (1, (1, 0), (1, 0), 1)

    Clauses: MIX-1, MIX-2, MIX-3, MIX-4, MIX-5, MIX-6, MIX-7, MIX-8, MIX-9, MIX-10, MIX-12.
    """
    sizes = check_source_sizes(source_sizes)
    require(isinstance(config, MixConfig), ConfigError, f"config={config!r} must be a MixConfig")
    require(is_int(epoch) and 0 <= epoch <= MASK64, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
    _check_state(state, sizes)
    if state.done:
        return None, state
    state = _with_empty_sources_exhausted(state, sizes)
    if _ended(state, config.stopping):
        return None, replace(state, done=True)
    k, t = len(sizes), state.step
    eligible = _eligible(state, sizes, config.stopping)
    if config.weights is None and weight_fn is None:
        s = _round_robin_choice(state, eligible)
    else:
        s = _weighted_choice(state, sizes, config, epoch, weight_fn, eligible)
    pointer = (s + 1) % k
    start = state.cursor[s]
    if start == sizes[s]:
        if config.stopping == "first_exhausted":
            return None, replace(state, step=t + 1, next_source=pointer, done=True)
        start = 0
    gone = start + 1 == sizes[s]
    after = replace(
        state,
        step=t + 1,
        taken=_set(state.taken, s, state.taken[s] + 1),
        cursor=_set(state.cursor, s, start + 1),
        exhausted=_set(state.exhausted, s, gone),
        exhausted_once=_set(state.exhausted_once, s, state.exhausted_once[s] or gone),
        next_source=pointer,
    )
    return (s, start), replace(after, done=_ended(after, config.stopping))


def _set(values: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return values[:index] + (value,) + values[index + 1:]


def mix(source_sizes: Sequence[int], config: MixConfig, epoch: int, *,
        weight_fn: WeightFn | None = None) -> list[Item]:
    """The whole mixed stream: ``next_item`` from ``initial_state`` until it returns ``None`` (MIX-1).

    Worked example (sizes [3, 2]): round robin under ``first_exhausted``
    emits A0 B0 A1 B1 A2, then step 5 chooses B, which is exhausted, and the
    stream ends with 5 items (MIX-6). Weighted streams depend on the seed and
    the epoch (MIX-3) and, under ``all_exhausted``, still emit every item once::

        >>> mix([3, 2], MixConfig(), epoch=0)
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
        >>> stream = mix([3, 2], MixConfig(weights=(0.5, 0.5), stopping="all_exhausted", seed=1), epoch=0)
        >>> sorted(stream)
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]

    Under ``all_exhausted_oversample`` with a weight_fn, ending is the
    weight_fn's responsibility: one that never picks some non-empty source
    yields an endless stream.

    What a weight is (MIX-19): its source's share of the draws among the
    sources a step may choose. Under ``first_exhausted`` and
    ``all_exhausted_oversample`` every source stays choosable, so the
    weights are the epoch's expected shares; under ``all_exhausted`` the
    epoch holds every item once, so its shares are the sizes' and the
    weights only set the interleaving until a source runs out::

        >>> stream = mix([400, 100], MixConfig(weights=(0.5, 0.5), stopping="all_exhausted", seed=0), epoch=0)
        >>> sum(s == 0 for s, _ in stream) / len(stream)
        0.8

    Clauses: MIX-1, MIX-6, MIX-7, MIX-8, MIX-9, MIX-12, MIX-19.
    """
    state = initial_state(len(source_sizes))
    out: list[Item] = []
    while True:
        item, state = next_item(state, source_sizes, config, epoch, weight_fn)
        if item is None:
            return out
        out.append(item)


# ---------------------------------------------------------------- what a mixture refuses (MIX-17, MIX-18)

SourceRows = tuple[str, range]
"""A mixture source's identity (MIX-17): the fingerprint of the data it reads and the document rows of that data."""


def repeated_rows(sources: Sequence[SourceRows]) -> list[tuple[int, int, range]]:
    """Pairs of sources that read the same documents: ``(i, j, rows)``, ``i < j``, rows read by both (MIX-17).

    Two sources repeat documents when they read the same data (equal data
    fingerprints: the same store, or a split of it) and their row ranges
    intersect; their orderings and packings do not matter, since each
    document is trained once per source whatever its order or packing.

    >>> repeated_rows([("web", range(0, 60)), ("code", range(0, 10)), ("web", range(50, 100))])
    [(0, 2, range(50, 60))]
    >>> repeated_rows([("web", range(0, 50)), ("web", range(50, 100))])
    []

    Clauses: MIX-17.
    """
    out: list[tuple[int, int, range]] = []
    for j, (data_j, rows_j) in enumerate(sources):
        for i, (data_i, rows_i) in enumerate(sources[:j]):
            both = range(max(rows_i.start, rows_j.start), min(rows_i.stop, rows_j.stop))
            if data_i == data_j and len(both):
                out.append((i, j, both))
    return sorted(out, key=lambda pair: (pair[0], pair[1]))


def repeat_message(data: str, i: int, rows_i: range, j: int, rows_j: range) -> str:
    """The ConfigError text of MIX-17: sources ``i`` and ``j`` read rows of ``data`` that intersect (impl's too)."""
    rows = range(max(rows_i.start, rows_j.start), min(rows_i.stop, rows_j.stop))
    fix = ("pass allow_repeat=True if training them twice is intended (to train a source more than once per "
           "epoch on purpose, streams=[StreamConfig(repeat=2.0), ...] says so)")
    if rows_i == rows_j:
        return (f"sources[{i}] and sources[{j}] are the same source (data {data[:12]}..., rows [{rows.start}, "
                f"{rows.stop}): {len(rows)} documents), so each of its documents is trained twice per epoch; drop "
                f"sources[{j}], or {fix} (MIX-17)")
    return (f"sources[{i}] (rows [{rows_i.start}, {rows_i.stop})) and sources[{j}] (rows [{rows_j.start}, "
            f"{rows_j.stop})) read the same data {data[:12]}... and overlap in rows [{rows.start}, {rows.stop}) "
            f"({len(rows)} documents), which are trained twice per epoch; make the splits disjoint (e.g. "
            f"\"train[:50%]\" and \"train[50%:]\"), or {fix} (MIX-17)")


def check_distinct_sources(sources: Sequence[SourceRows], *, allow_repeat: bool = False) -> None:
    """Refuse a mixture whose sources read some document twice, unless ``allow_repeat`` (MIX-17).

    Why refuse and not warn: a repeated source doubles the weight of its
    documents in every epoch, and nothing in the batches shows it (each row
    is tagged with a different source); a warning in the log of a long job
    is not read. ``allow_repeat=True`` says the repeat is intended.

    >>> check_distinct_sources([("web", range(0, 60)), ("web", range(50, 100))])
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: sources[0] (rows [0, 60)) and sources[1] (rows [50, 100)) read the same data web... and overlap in rows [50, 60) (10 documents), which are trained twice per epoch; make the splits disjoint (e.g. "train[:50%]" and "train[50%:]"), or pass allow_repeat=True if training them twice is intended (to train a source more than once per epoch on purpose, streams=[StreamConfig(repeat=2.0), ...] says so) (MIX-17)
    >>> check_distinct_sources([("web", range(0, 60)), ("web", range(50, 100))], allow_repeat=True)

    Clauses: MIX-17.
    """
    require(isinstance(allow_repeat, bool), ConfigError, f"allow_repeat={allow_repeat!r} must be True or False")
    if allow_repeat:
        return
    pairs = repeated_rows(sources)
    if pairs:
        i, j, _ = pairs[0]
        raise ConfigError(repeat_message(sources[i][0], i, sources[i][1], j, sources[j][1]))


def zero_weight_message(i: int, stopping: str) -> str:
    """The ConfigError text of MIX-18 for source ``i`` (impl words it the same way)."""
    why = ("under stopping='first_exhausted' the other sources are drawn exactly as without it and the stream still "
           "ends when one of them runs out, so the stream is, sample for sample, the mixture without it" if stopping == "first_exhausted"
           else f"under stopping={stopping!r} an epoch ends only once every non-empty source has run out, which a "
           f"non-empty source {i} never would (MIX-5)")
    return (f"weights[{i}]=0: source {i} is never drawn, so it trains nothing; {why}; drop sources[{i}] from the "
            f"mixture, or give it a positive weight to train it (MIX-18)")


def check_mixture_weights(config: MixConfig) -> None:
    """Refuse a mixture's static weight of 0, which names a source the mixture never trains (MIX-18).

    Why refuse: a zero weight owns an empty interval of the draw (MIX-3),
    so its source is never chosen. Under ``first_exhausted`` the stream
    then equals, sample for sample, the mixture without that source (the
    other sources' cumulative weights are unchanged, and the stream still
    ends at the first draw of an exhausted source), so the user who wrote
    the source believes it is trained and it is not; dropping it is the
    exact fix. Under the ``all_exhausted`` variants MIX-5 already refuses
    it (the source would never run out); this says so before any epoch.
    ``all_exhausted`` is therefore no fix for a zero weight.

    >>> check_mixture_weights(MixConfig(weights=(0.0, 1.0)))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: weights[0]=0: source 0 is never drawn, so it trains nothing; under stopping='first_exhausted' the other sources are drawn exactly as without it and the stream still ends when one of them runs out, so the stream is, sample for sample, the mixture without it; drop sources[0] from the mixture, or give it a positive weight to train it (MIX-18)

    Clauses: MIX-18.
    """
    for i, w in enumerate(config.weights or ()):
        require(w > 0, ConfigError, zero_weight_message(i, config.stopping))
