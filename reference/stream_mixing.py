"""Mixtures over streaming sources and token stores together, in lanes (MIX-22 .. MIX-25).

Clauses: MIX-22 .. MIX-25; the lanes, their batching and their state are
STREAM-6 .. STREAM-15's (``reference.streaming``), the draw is MIX-3's.

Why lanes and not a plan: MIX-13 plans an epoch from every source's sample
count, which a streaming source learns only by tokenizing all of it. Here
the mixture is itself a streaming source of N lanes (the streaming sources'
``num_lanes``): lane l of a token store reads its epoch's samples
``l, l + N, l + 2N, ...`` (its own order and packing, RES-1), lane l of a
streaming source is its STREAM-9 lane l, and lane l of the mixture draws,
for each attempt, which source's lane gives its next sample (MIX-23). A
lane's position is a few integers per source, so the state is small JSON
and a lane resumes on any world size whose ranks × workers divide N.

Worked example (a store of four samples and a streaming source of one unit, two lanes, L = 2)::

    >>> from reference.packing import PackingConfig
    >>> from reference.resume import PipelineConfig
    >>> from reference.units import RowFile
    >>> p = PackingConfig(seq_len=2)
    >>> store = StoreSource(corpus=[[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], config=PipelineConfig(packing=p))
    >>> text = StreamSource(files=[RowFile(path="t", groups=(("a a a", "b b b"),))],
    ...                     config=StreamingConfig(packing=p, num_lanes=2),
    ...                     tokenizer=lambda s: [ord(c) for c in s.split()], tokenizer_id="ord")
    >>> loader = StreamMixReferenceLoader([store, text], StreamMixConfig(weights=(1.0, 1.0), stopping="all_exhausted"))
    >>> [[(r.lane, r.source, r.source_index, r.sample.input_ids) for r in b] for b in loader]
    [[(0, 1, 0, (97, 97))], [(1, 0, 1, (3, 4))], [(0, 1, 1, (97, 98))], [(1, 0, 3, (7, 8))], [(0, 0, 0, (1, 2))], [(0, 0, 2, (5, 6))]]

The store's samples 0, 2 fall in lane 0 and 1, 3 in lane 1; the stream's one
unit falls in lane 0, so lane 1's stream is empty and, under
``all_exhausted``, lane 1 serves only the store; every sample of both
sources comes once.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reference.errors import ConfigError, StateError, is_int, require
from reference.mixing import choose_weighted
from reference.packing import Sample
from reference.resume import Corpus, PipelineConfig, corpus_fingerprint, epoch_samples, pipeline_fingerprint
from reference.rng import MASK64, Stream, derive_key, subkey, unit
from reference.stream_steps import STEPS_KEYS, STEPS_VERSION, EpochSteps, Resumed, resume_steps
from reference.streaming import (
    LaneReader,
    LaneState,
    StreamingConfig,
    Tokenizer,
    _lane_from_json,
    _lane_json,
    epoch_steps,
    lane_next,
    rank_lanes,
)
from reference.units import SourceFile, build_index

STATE_FORMAT = "loadspec.stream_mix_state"
STATE_VERSION = STEPS_VERSION
V1_KEYS = frozenset({"format", "version", "parts", "epoch", "lanes"})
STATE_KEYS = V1_KEYS | STEPS_KEYS     # version 2 carries the epoch's steps and each rank's (STREAM-22)
LANE_KEYS = frozenset({"attempts", "exhausted", "samples", "sources"})
STOPPING = ("first_exhausted", "all_exhausted")


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamMixConfig:
    """The mixture's draw: a positive weight per source, the stopping rule and the seed (MIX-23, MIX-25).

    >>> StreamMixConfig(weights=(1.0, 0.0))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: weights[1]=0.0: source 1 is never drawn, so it trains nothing; drop it from the mixture, or give it a positive weight to train it
    """

    weights: tuple[float, ...]
    stopping: str = "first_exhausted"
    seed: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.weights, tuple) and len(self.weights) >= 1, ConfigError,
                f"weights={self.weights!r} must be a non-empty tuple with one weight per source: a mixture with "
                "streaming sources draws every sample by weight (equal weights for an even mix)")
        for i, w in enumerate(self.weights):
            require(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0,
                    ConfigError, f"weights[{i}]={w!r} must be a finite number >= 0")
            require(w > 0, ConfigError, f"weights[{i}]={w!r}: source {i} is never drawn, so it trains nothing; "
                    "drop it from the mixture, or give it a positive weight to train it")
        require(self.stopping in STOPPING, ConfigError,
                f"stopping={self.stopping!r} is not a stopping rule of a mixture with streaming sources; choose one "
                f"of {STOPPING} (a lane cannot restart a streaming source mid-epoch, so all_exhausted_oversample "
                "is not offered)")
        require(is_int(self.seed) and 0 <= self.seed <= MASK64, ConfigError,
                f"seed={self.seed!r} must be an integer in [0, 2**64)")


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreSource:
    """A token store's pipeline as a mixture source; ``fingerprint`` names its data (default: RES-3's, of the corpus)."""

    corpus: Corpus
    config: PipelineConfig
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint",
                               pipeline_fingerprint(corpus_fingerprint(self.corpus), self.config))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class StreamSource:
    """A streaming source (STREAM-1 .. STREAM-17) as a mixture source."""

    files: Sequence[SourceFile]
    config: StreamingConfig
    tokenizer: Tokenizer
    tokenizer_id: str

    @property
    def fingerprint(self) -> str:
        """sha256 of ``[unit index fingerprint, tokenizer id, options]`` (JSON, sorted keys): what its lanes depend on."""
        index = build_index(self.files, self.config.unit_bytes).fingerprint
        text = json.dumps([index, self.tokenizer_id, self.config.to_json()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


Source = StoreSource | StreamSource


def mixture_lanes(sources: Sequence[Source], config: StreamMixConfig) -> int:
    """The mixture's lane count N, after checking the sources fit together (MIX-22, MIX-25).

    >>> from reference.packing import PackingConfig
    >>> mixture_lanes([StoreSource(corpus=[[[1, 2, 3]]], config=PipelineConfig(packing=PackingConfig(seq_len=2)))],
    ...               StreamMixConfig(weights=(1.0,)))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: no source is a streaming source: a mixture takes its lanes from its streaming sources; mix token stores alone with a planned mixture (MIX-13)
    """
    require(len(sources) == len(config.weights), ConfigError,
            f"weights has {len(config.weights)} entries but there are {len(sources)} sources; pass one weight per "
            "source")
    streams = [(i, s) for i, s in enumerate(sources) if isinstance(s, StreamSource)]
    require(bool(streams), ConfigError, "no source is a streaming source: a mixture takes its lanes from its "
            "streaming sources; mix token stores alone with a planned mixture (MIX-13)")
    first, lanes = streams[0][0], streams[0][1].config.num_lanes
    for i, s in streams:
        require(s.config.num_lanes == lanes, ConfigError,
                f"sources[{i}] has num_lanes={s.config.num_lanes} but sources[{first}] has {lanes}: lane l of the "
                "mixture reads lane l of every streaming source; give them all the same num_lanes")
    packings = [s.config.packing for s in sources]
    for i, p in enumerate(packings):
        require((p.seq_len, p.pad_id) == (packings[0].seq_len, packings[0].pad_id), ConfigError,
                f"sources[{i}] packs seq_len={p.seq_len}, pad_id={p.pad_id} but sources[0] packs "
                f"seq_len={packings[0].seq_len}, pad_id={packings[0].pad_id}: every source must pack to one shape")
    return lanes


def planned_options_refused(*, weight_fn: Any = None, streams: Any = None, epoch_size: Any = None,
                            batching_method: str = "random", global_batch_size: Any = None,
                            device_batch_size: Any = None, end: str = "drop_last") -> None:
    """Refuse the options of a planned mixture (MIX-13 .. MIX-21) that lanes cannot honour, naming the fix (MIX-25).

    >>> planned_options_refused(end="pad")
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: end='pad': a mixture with a streaming source ends its epoch by equal-step truncation (STREAM-12), so it takes no end policy; leave end='drop_last'
    """
    require(weight_fn is None, ConfigError,
            "weight_fn reads every source's size at every step (MIX-4), which a streaming source does not know; "
            "pass static weights=[...]")
    require(batching_method == "random", ConfigError,
            f"batching_method={batching_method!r} composes global batches from the epoch's plan, which a mixture "
            "with a streaming source does not have (its lanes are drawn as they stream, MIX-23); use "
            "batching_method='random', or build token stores of the streaming sources and mix them with MixedDataset")
    for name, value in (("streams", streams), ("epoch_size", epoch_size), ("global_batch_size", global_batch_size),
                        ("device_batch_size", device_batch_size)):
        require(value is None, ConfigError,
                f"{name}={value!r} sets per-epoch sample counts or batch composition from the epoch's plan (MIX-15, "
                "MIX-16), which a mixture with a streaming source does not have; leave it out and set each source's "
                "share with weights=[...], or build token stores of the streaming sources and mix them with "
                "MixedDataset")
    require(end == "drop_last", ConfigError,
            f"end={end!r}: a mixture with a streaming source ends its epoch by equal-step truncation (STREAM-12), so "
            "it takes no end policy; leave end='drop_last'")


@dataclass(frozen=True, slots=True)
class MixLaneState:
    """Where a mixture lane stands between two samples (MIX-24).

    ``attempts`` counts the lane's draws so far (those that found their source
    exhausted included), ``exhausted`` marks sources found empty in this lane,
    ``samples`` counts the lane's samples consumed this epoch, and
    ``positions`` holds each source's lane position: for a store the number of
    its lane samples taken, for a streaming source its ``LaneState``.
    """

    attempts: int
    exhausted: tuple[bool, ...]
    samples: int
    positions: tuple[int | LaneState, ...]


def fresh_lane(sources: Sequence[Source]) -> MixLaneState:
    return MixLaneState(0, (False,) * len(sources),
                        0, tuple(0 if isinstance(s, StoreSource) else LaneState() for s in sources))


@dataclass(frozen=True, slots=True)
class MixRow:
    """One sample handed out: epoch, mixture lane, index in the lane, source, index in that source's lane stream."""

    epoch: int
    lane: int
    index: int
    source: int
    source_index: int
    sample: Sample


class MixReader:
    """Reads each source's lanes: a store's epoch samples (computed once per epoch), a stream's ``LaneReader``."""

    def __init__(self, sources: Sequence[Source], config: StreamMixConfig, num_lanes: int) -> None:
        self.sources, self.config, self.num_lanes = list(sources), config, num_lanes
        self.readers = {i: LaneReader(s.files, build_index(s.files, s.config.unit_bytes), s.config, s.tokenizer)
                        for i, s in enumerate(sources) if isinstance(s, StreamSource)}
        self._samples: dict[tuple[int, int], list[Sample]] = {}

    def store_samples(self, i: int, epoch: int) -> list[Sample]:
        source = self.sources[i]
        assert isinstance(source, StoreSource)
        if (i, epoch) not in self._samples:
            self._samples[(i, epoch)] = epoch_samples(source.corpus, source.config, epoch)
        return self._samples[(i, epoch)]

    def store_lane_size(self, i: int, epoch: int, lane: int) -> int:
        """Samples ``lane, lane + N, ...`` of the store's epoch: ``ceil((S - lane) / N)`` of them (MIX-22)."""
        return len(self.store_samples(i, epoch)[lane::self.num_lanes])

    def next(self, i: int, epoch: int, lane: int,
             position: int | LaneState) -> tuple[int, Sample, int | LaneState] | None:
        """Source ``i``'s next sample in ``lane``: (its index in the source's lane stream, sample, next position) (MIX-22)."""
        if isinstance(position, int):
            index = lane + position * self.num_lanes
            samples = self.store_samples(i, epoch)
            return None if index >= len(samples) else (index, samples[index], position + 1)
        step = lane_next(self.readers[i], epoch, lane, position)
        return None if step is None else (position.samples, step[0], step[1])


def mix_key(config: StreamMixConfig, epoch: int, lane: int) -> int:
    """Lane ``lane``'s draw key: ``subkey(derive_key(seed, epoch, MIX), lane)`` (MIX-23)."""
    return subkey(derive_key(config.seed, epoch, Stream.MIX), lane)


def mix_lane_next(reader: MixReader, epoch: int, lane: int,
                  state: MixLaneState) -> tuple[tuple[int, int, Sample], MixLaneState] | None:
    """The lane's next ``(source, source_index, sample)`` and the state after it; None at the lane's end (MIX-23).

    Attempt t draws ``u = unit(mix_key, t)`` and chooses by MIX-3's walk over
    the weights, those of sources already found exhausted in this lane set
    to 0; a chosen source with no sample left in the lane ends the lane under
    ``first_exhausted`` and, under ``all_exhausted``, is marked exhausted and
    the next attempt draws again; the lane ends when every source is exhausted.
    """
    config = reader.config
    key = mix_key(config, epoch, lane)
    attempts, exhausted = state.attempts, list(state.exhausted)
    while True:
        weights = [0.0 if exhausted[i] else float(w) for i, w in enumerate(config.weights)]
        if not any(weights):
            return None
        i = choose_weighted(weights, unit(key, attempts))
        attempts += 1
        got = reader.next(i, epoch, lane, state.positions[i])
        if got is None:
            if config.stopping == "first_exhausted":
                return None
            exhausted[i] = True
            continue
        index, sample, position = got
        positions = state.positions[:i] + (position,) + state.positions[i + 1:]
        return (i, index, sample), MixLaneState(attempts, tuple(exhausted), state.samples + 1, positions)


def mixed_lane(sources: Sequence[Source], config: StreamMixConfig, epoch: int, lane: int) -> list[tuple[int, int]]:
    """Every ``(source, source_index)`` lane ``lane`` yields in ``epoch``, from its start (MIX-23).

    >>> from reference.packing import PackingConfig
    >>> from reference.units import RowFile
    >>> p = PackingConfig(seq_len=2)
    >>> store = StoreSource(corpus=[[[1, 2, 3]] * 4], config=PipelineConfig(packing=p))
    >>> text = StreamSource(files=[RowFile(path="t", groups=(("a a a",) * 3,))], config=StreamingConfig(packing=p),
    ...                     tokenizer=lambda s: [ord(c) for c in s.split()], tokenizer_id="ord")
    >>> mixed_lane([store, text], StreamMixConfig(weights=(1.0, 1.0), stopping="all_exhausted"), 0, 0)
    [(1, 0), (1, 1), (0, 0), (1, 2), (0, 1), (0, 2), (1, 3), (0, 3), (0, 4)]
    """
    reader = MixReader(sources, config, mixture_lanes(sources, config))
    out, state = [], fresh_lane(sources)
    while (step := mix_lane_next(reader, epoch, lane, state)) is not None:
        out.append(step[0][:2])
        state = step[1]
    return out


def lane_remaining(reader: MixReader, epoch: int, lane: int, state: MixLaneState) -> int:
    """How many samples the mixture lane still yields from ``state`` (the count MIX-24's equal steps use)."""
    count = 0
    while (step := mix_lane_next(reader, epoch, lane, state)) is not None:
        count, state = count + 1, step[1]
    return count


# ------------------------------------------------------------------ state


def state_parts(sources: Sequence[Source], config: StreamMixConfig, num_lanes: int) -> dict[str, Any]:
    """What a state must match (MIX-24): each source's fingerprint, the weights, the stopping rule, seed and lanes."""
    return {"sources": [s.fingerprint for s in sources], "weights": [float(w) for w in config.weights],
            "stopping": config.stopping, "seed": config.seed, "num_lanes": num_lanes}


def mismatches(saved: Any, parts: Mapping[str, Any]) -> list[str]:
    """The parts of ``saved`` that differ from ``parts``, each named (a source by its index) (MIX-24)."""
    saved = saved if isinstance(saved, Mapping) else {}
    out = []
    theirs, ours = saved.get("sources"), parts["sources"]
    if not isinstance(theirs, list) or len(theirs) != len(ours):
        out.append(f"the number of sources ({len(theirs) if isinstance(theirs, list) else theirs!r} in the "
                   f"checkpoint, {len(ours)} here)")
    else:
        out += [f"sources[{i}] (its data, tokenizer, order or packing)" for i, (a, b) in
                enumerate(zip(theirs, ours, strict=True)) if a != b]
    out += [f"{name} ({saved.get(name)!r} in the checkpoint, {parts[name]!r} here)"
            for name in ("weights", "stopping", "seed", "num_lanes") if saved.get(name) != parts[name]]
    return out


def lane_json(reader: MixReader, epoch: int, lane: int, state: MixLaneState) -> dict[str, Any]:
    """A mixture lane as JSON: attempts, exhausted, samples, and per source an int or STREAM-13's lane entry (MIX-24)."""
    return {"attempts": state.attempts, "exhausted": list(state.exhausted), "samples": state.samples,
            "sources": [p if isinstance(p, int) else _lane_json(reader.readers[i], epoch, lane, p)
                        for i, p in enumerate(state.positions)]}


def lane_from_json(reader: MixReader, epoch: int, lane: int, value: Any) -> MixLaneState:
    k = len(reader.sources)
    require(isinstance(value, Mapping) and set(value) == LANE_KEYS, StateError,
            f"lane {lane} state must hold exactly {sorted(LANE_KEYS)}; pass the dict state_dict() returned, unchanged")
    for name in ("attempts", "samples"):
        require(is_int(value[name]) and value[name] >= 0, StateError,
                f"lane {lane} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
    exhausted, sources = value["exhausted"], value["sources"]
    require(isinstance(exhausted, list) and len(exhausted) == k and all(isinstance(x, bool) for x in exhausted)
            and isinstance(sources, list) and len(sources) == k, StateError,
            f"lane {lane} must hold {k} exhausted flags and {k} source positions: the state is corrupt")
    positions: list[int | LaneState] = []
    for i, entry in enumerate(sources):
        if isinstance(reader.sources[i], StoreSource):
            size = reader.store_lane_size(i, epoch, lane)
            require(is_int(entry) and 0 <= entry <= size, StateError,
                    f"lane {lane} source {i} position {entry!r} is outside its {size} lane samples in epoch {epoch}: "
                    "the state belongs to other data; start from a fresh state")
            positions.append(int(entry))
        else:
            positions.append(_lane_from_json(reader.readers[i], epoch, lane, entry))
    return MixLaneState(value["attempts"], tuple(exhausted), value["samples"], tuple(positions))


# ------------------------------------------------------------------ the loader


class StreamMixReferenceLoader(EpochSteps):
    """One rank's view of a mixture of streaming sources and stores, with an exact, elastic state (MIX-22 .. MIX-25).

    Ranks × workers own whole mixture lanes (STREAM-10); a step's batch is
    ``batch_size`` samples of one worker, lanes fewest-consumed first
    (STREAM-11); every rank takes the same number of steps (STREAM-12, over
    the mixture lanes' remaining samples, S carried by the state, STREAM-22); ``state_dict`` holds this rank's
    lanes and ``reference.streaming.merge_states`` unites the ranks'.
    """

    def __init__(self, sources: Sequence[Source], config: StreamMixConfig, *, world_size: int = 1, rank: int = 0,
                 num_workers: int = 0, batch_size: int = 1) -> None:
        require(is_int(batch_size) and batch_size >= 1, ConfigError, f"batch_size={batch_size!r} must be >= 1")
        self.sources, self.config = list(sources), config
        self.num_lanes = mixture_lanes(self.sources, config)
        self.workers = rank_lanes(self.num_lanes, world_size, num_workers, rank)
        self.world_size, self.num_workers, self.rank, self.batch_size = world_size, num_workers, rank, batch_size
        self.reader = MixReader(self.sources, config, self.num_lanes)
        self._census = MixReader(self.sources, config, self.num_lanes)
        self.parts = state_parts(self.sources, config, self.num_lanes)
        self.epoch = 0
        self.lanes = {lane: fresh_lane(self.sources) for lane in range(self.num_lanes)}
        self._total, self._taken, self._next = None, 0, None     # S, t_r, epoch + 1's lanes (STREAM-22)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (as RES-7)."""
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be >= 0")
        self._enter_epoch(epoch)

    def _fresh(self) -> dict[int, Any]:
        return {lane: fresh_lane(self.sources) for lane in self.lanes}

    def _remaining(self, epoch: int, lanes: Mapping[int, Any]) -> dict[int, int]:
        return {lane: lane_remaining(self._census, epoch, lane, s) for lane, s in lanes.items()}

    def _steps_of(self, remaining: Mapping[int, int]) -> int:
        return epoch_steps(remaining, self.num_lanes, self.world_size, self.num_workers, self.batch_size)

    def __iter__(self) -> Iterator[list[MixRow]]:
        epoch = self.epoch
        remaining = self._remaining(epoch, self.lanes)
        left = self._steps_left(remaining)
        while left > 0:
            live = [w for w in self.workers if sum(remaining[lane] for lane in w) >= self.batch_size]
            worker = min(live, key=lambda w: (sum(self.lanes[lane].samples for lane in w), self.workers.index(w)))
            batch = []
            for _ in range(self.batch_size):
                lane = min((lane for lane in worker if remaining[lane] > 0),
                           key=lambda lane: (self.lanes[lane].samples, lane))
                step = mix_lane_next(self.reader, epoch, lane, self.lanes[lane])
                assert step is not None
                (source, index, sample), after = step
                batch.append(MixRow(epoch, lane, self.lanes[lane].samples, source, index, sample))
                self.lanes[lane], remaining[lane] = after, remaining[lane] - 1
            left, self._taken = left - 1, self._taken + 1
            yield batch
        self.set_epoch(epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """This rank's lanes and the parts they depend on, as JSON primitives (MIX-24)."""
        mine = sorted(lane for w in self.workers for lane in w)
        epoch, lanes, steps = self._steps_record(mine)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "parts": self.parts, "epoch": epoch,
                "lanes": {str(lane): lane_json(self.reader, epoch, lane, lanes[lane]) for lane in mine}, **steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a global state; refuse one of another mixture, naming each part that differs (MIX-24)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"not a stream mixture state (format {state.get('format') if isinstance(state, Mapping) else state!r});"
                " pass the dict state_dict() or merge_states returned")
        version = state.get("version")
        require(version in (1, STATE_VERSION) and set(state) == (V1_KEYS if version == 1 else STATE_KEYS),
                StateError, f"state version {version!r} with keys {sorted(state)} is not version {STATE_VERSION} with "
                f"{sorted(STATE_KEYS)} (or 1 without {sorted(STEPS_KEYS)}); pass the dict state_dict() returned, "
                "unchanged")
        differs = mismatches(state["parts"], self.parts)
        require(not differs, StateError, "the checkpoint differs from this mixture in " + "; ".join(differs) +
                ": resume with the sources, weights and options it was taken with, or start from a fresh state")
        epoch, lanes = state["epoch"], state["lanes"]
        require(is_int(epoch) and 0 <= epoch <= MASK64, StateError, f"epoch={epoch!r} must be an integer >= 0")
        wanted = sorted(str(lane) for lane in range(self.num_lanes))
        require(isinstance(lanes, Mapping) and sorted(lanes) == wanted, StateError,
                f"state holds lanes {sorted(lanes) if isinstance(lanes, Mapping) else lanes!r} of {self.num_lanes}: "
                "a rank's state holds its own lanes; combine every rank's state_dict() with merge_states and load "
                "the result")
        resumed = (Resumed(lane_epochs=dict.fromkeys(range(self.num_lanes), epoch)) if version == 1 else
                   resume_steps(state, num_lanes=self.num_lanes, world_size=self.world_size,
                                num_workers=self.num_workers, batch_size=self.batch_size, rank=self.rank))
        self._resume(epoch, resumed, {int(k): lane_from_json(self.reader, resumed.lane_epochs[int(k)], int(k), v)
                                      for k, v in lanes.items()})


__all__ = ["STATE_FORMAT", "MixLaneState", "MixReader", "MixRow", "StoreSource", "StreamMixConfig",
           "StreamMixReferenceLoader", "StreamSource", "lane_remaining", "mix_lane_next", "mixed_lane",
           "mixture_lanes", "planned_options_refused"]
