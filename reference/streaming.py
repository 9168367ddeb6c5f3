"""Streaming sources tokenized on the fly, in lanes, with exact, elastic resume (STREAM-6 .. STREAM-17).

Clauses: STREAM-6 .. STREAM-17; the units and their index are ``reference.units`` (STREAM-1 .. STREAM-5).

Why lanes: a loader that streams raw text cannot index samples globally (a
sample's tokens are known only once its documents are tokenized), so its
resume state must be a *position in a stream*. loadspec splits the stream
into a fixed number of lanes (MosaicML's ``num_canonical_nodes``): each lane
is a deterministic pipeline of its own units (rows in a keyed order, the
buffered shuffle, tokenize + EOS, pack), its state is a few integers and row
ids, and ranks × workers own whole lanes. A world size changes which process
runs a lane, never what the lane yields, so a checkpoint taken on 2 ranks
resumes on 4 or on 1 (STREAM-10, STREAM-15).

A row is named by ``(unit, row)`` (``RowId``): unit ``u`` of the unit index
(``reference.units``), row ``r`` of that unit in stored order; its document
id is its global row number (STREAM-9). State never holds text or tokens.

Worked example (one file of four lines, two lanes, L = 2, concat)::

    >>> from reference.packing import PackingConfig
    >>> from reference.units import TextFile
    >>> files = [TextFile(path="a.txt", data=b"a b\\nc\\nd e f\\ng\\n")]
    >>> config = StreamingConfig(packing=PackingConfig(seq_len=2), num_lanes=2, unit_bytes=2)
    >>> tok = lambda text: [ord(c) for c in text.split()[0]] * len(text.split())
    >>> [lane_units(4, config, 0, lane) for lane in (0, 1)]
    [[0, 2], [1, 3]]
    >>> [[s.input_ids for s in lane_samples(files, config, tok, 0, lane)] for lane in (0, 1)]
    [[(97, 97), (100, 100)], []]
    >>> loader = StreamingReferenceLoader(files, config, tok, tokenizer_id="chars")
    >>> [[(row.lane, row.index) for row in batch] for batch in loader]   # lane 1's 2 tokens make no sample
    [[(0, 0)], [(0, 1)]]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from reference.errors import ConfigError, StateError, TopologyError, is_int, require
from reference.packing import STREAM_MODES, PackingConfig, Piece, Sample, fill, is_kept, prepare
from reference.rng import MASK64, FeistelPermutation, Stream, below, derive_key, subkey
from reference.stream_steps import (
    STEPS_KEYS,
    STEPS_VERSION,
    EpochSteps,
    Resumed,
    merge_states,  # noqa: F401  (STREAM-14: re-exported, beside the steps it unites)
    resume_steps,
)
from reference.units import ON_ERROR, SourceFile, UnitIndex, build_index, read_unit

RowId = tuple[int, int]
Tokenizer = Callable[[str], Sequence[int]]
STATE_FORMAT = "loadspec.stream_state"
STATE_VERSION = STEPS_VERSION
V1_KEYS = frozenset({"format", "version", "index", "tokenizer", "options", "epoch", "lanes"})
STATE_KEYS = V1_KEYS | STEPS_KEYS     # version 2 carries the epoch's steps and each rank's (STREAM-22)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamingConfig:
    """Everything that decides a streaming epoch's samples: all of it enters the state (STREAM-13).

    ``shuffle`` permutes the units per (seed, epoch) (STREAM-6) and the rows of
    each window of ``unit_window`` consecutive lane units (STREAM-7);
    ``shuffle_buffer_size`` (0 or 1: off) runs the buffered shuffle over each
    lane's rows (STREAM-8); ``unit_bytes`` is the target size of a text unit
    (STREAM-1). Packing is ``concat`` or ``chunk``: the modes that need no view
    beyond the lane (STREAM-9). ``on_error="skip"`` drops the text lines
    STREAM-2 would refuse, keeping their places (STREAM-17); the default raises.

    >>> StreamingConfig(packing=PackingConfig(seq_len=4, mode="best_fit"))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: packing.mode='best_fit' is not a streaming mode; choose one of ('concat', 'chunk')
    """

    packing: PackingConfig
    num_lanes: int = 1
    seed: int = 0
    shuffle: bool = False
    unit_window: int = 1
    shuffle_buffer_size: int = 0
    unit_bytes: int = 1 << 20
    text_field: str = "text"
    on_error: str = "raise"

    def __post_init__(self) -> None:
        require(isinstance(self.packing, PackingConfig), ConfigError, f"packing={self.packing!r} must be a PackingConfig")
        require(self.packing.mode in STREAM_MODES, ConfigError,
                f"packing.mode={self.packing.mode!r} is not a streaming mode; choose one of {STREAM_MODES}")
        for name, low in (("num_lanes", 1), ("unit_window", 1), ("shuffle_buffer_size", 0), ("unit_bytes", 1)):
            value = getattr(self, name)
            require(is_int(value) and value >= low, ConfigError, f"{name}={value!r} must be an integer >= {low}")
        require(is_int(self.seed) and 0 <= self.seed <= MASK64, ConfigError,
                f"seed={self.seed!r} must be an integer in [0, 2**64)")
        require(isinstance(self.shuffle, bool), ConfigError, f"shuffle={self.shuffle!r} must be True or False")
        require(isinstance(self.text_field, str), ConfigError, f"text_field={self.text_field!r} must be a string")
        require(self.on_error in ON_ERROR, ConfigError,
                f"on_error={self.on_error!r} must be one of {ON_ERROR}: 'raise' refuses a bad line, 'skip' drops "
                "and counts it")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ order


def _key(config: StreamingConfig, epoch: int, part: int, lane: int | None = None) -> int:
    """Sub-key ``part`` (0: units, 1: row windows, 2: buffer) of the epoch's streaming key, per lane (STREAM-6)."""
    key = subkey(derive_key(config.seed, epoch, Stream.STREAMING), part)
    return key if lane is None else subkey(key, lane)


def unit_order(num_units: int, config: StreamingConfig, epoch: int) -> list[int]:
    """Position p of the epoch's unit order holds unit ``π(p)``; index order when not shuffling (STREAM-6).

    >>> cfg = StreamingConfig(packing=PackingConfig(seq_len=2), shuffle=True)
    >>> unit_order(5, cfg, 0) != unit_order(5, cfg, 1)
    True
    """
    if not config.shuffle:
        return list(range(num_units))
    return FeistelPermutation(num_units, _key(config, epoch, 0)).to_list()


def lane_units(num_units: int, config: StreamingConfig, epoch: int, lane: int) -> list[int]:
    """The units lane ``lane`` reads, in order: positions ``lane, lane + N, ...`` of the unit order (STREAM-6).

    >>> lane_units(5, StreamingConfig(packing=PackingConfig(seq_len=2), num_lanes=2), 0, 1)
    [1, 3]
    """
    return unit_order(num_units, config, epoch)[lane::config.num_lanes]


def lane_windows(index: UnitIndex, config: StreamingConfig, epoch: int, lane: int) -> list[list[RowId]]:
    """The lane's rows cut into windows of ``unit_window`` lane units, each window in its read order (STREAM-7).

    Window j holds the rows of lane units ``j*w .. j*w + w - 1`` (each unit's
    rows in stored order, unit after unit); with ``shuffle`` its n rows are
    read as ``rows[FeistelPermutation(n, subkey(K_lane, j))(i)]``, K_lane the
    lane's window key, so a window's rows need only that window's units.

    >>> from reference.units import RowFile
    >>> index = build_index([RowFile(path="p", groups=(("a", "b"), ("c",)))])
    >>> lane_windows(index, StreamingConfig(packing=PackingConfig(seq_len=2), unit_window=2), 0, 0)
    [[(0, 0), (0, 1), (1, 0)]]
    """
    units = lane_units(len(index.units), config, epoch, lane)
    key = _key(config, epoch, 1, lane)
    windows = []
    for j, first in enumerate(range(0, len(units), config.unit_window)):
        rows = [(u, r) for u in units[first:first + config.unit_window] for r in range(index.units[u].rows)]
        if config.shuffle:
            perm = FeistelPermutation(len(rows), subkey(key, j))
            rows = [rows[perm(i)] for i in range(len(rows))]
        windows.append(rows)
    return windows


def lane_rows(index: UnitIndex, config: StreamingConfig, epoch: int, lane: int) -> list[RowId]:
    """The lane's row stream R: its windows' rows, window after window (STREAM-7)."""
    return [row for window in lane_windows(index, config, epoch, lane) for row in window]


@dataclass(frozen=True, slots=True)
class BufferState:
    """The buffered shuffle between two emissions: rows read, slots as row ids, the draw counter, rows flushed (STREAM-8)."""

    read: int = 0
    slots: tuple[RowId, ...] = ()
    counter: int = 0
    flushed: int = 0


def buffer_step(rows: Sequence[RowId], size: int, key: int, state: BufferState) -> tuple[RowId | None, BufferState]:
    """The next row the buffered shuffle emits and the state after it; ``None`` at the end (STREAM-8).

    The same algorithm as ORD-6 / ORD-7, one emission at a time: fill the
    first ``size`` slots; then for each arriving row emit slot
    ``below(key, counter, size)`` and put the row there; at the end emit the
    slots in the order ``FeistelPermutation(len(slots), subkey(key, 0))``.
    ``size <= 1`` passes the rows through. The state names rows, never their
    contents, so a resumed loader re-reads a slot's row when it is emitted.

    >>> key = derive_key(0, 0, Stream.BUFFER)
    >>> row, state = buffer_step([(0, 0), (0, 1), (0, 2)], 2, key, BufferState())
    >>> row, state
    ((0, 1), BufferState(read=3, slots=((0, 0), (0, 2)), counter=1, flushed=0))
    """
    if size <= 1:
        if state.read >= len(rows):
            return None, state
        return rows[state.read], replace(state, read=state.read + 1)
    slots, read = list(state.slots), state.read
    while read < len(rows) and len(slots) < size:
        slots.append(rows[read])
        read += 1
    if read < len(rows):
        j = below(key, state.counter, size)
        out, slots[j] = slots[j], rows[read]
        return out, BufferState(read + 1, tuple(slots), state.counter + 1, 0)
    if state.flushed >= len(slots):
        return None, BufferState(read, tuple(slots), state.counter, state.flushed)
    out = slots[FeistelPermutation(len(slots), subkey(key, 0))(state.flushed)]
    return out, BufferState(read, tuple(slots), state.counter, state.flushed + 1)


def buffered_rows(rows: Sequence[RowId], size: int, key: int) -> list[RowId]:
    """All of ``buffer_step``'s emissions: equal to ``reference.ordering.buffer_shuffle`` (STREAM-8, ORD-6, ORD-7).

    >>> from reference.ordering import buffer_shuffle
    >>> rows = [(0, r) for r in range(5)]
    >>> key = derive_key(0, 0, Stream.BUFFER)
    >>> buffered_rows(rows, 2, key) == buffer_shuffle(rows, 2, key)
    True
    """
    out: list[RowId] = []
    state = BufferState()
    while True:
        row, state = buffer_step(rows, size, key, state)
        if row is None:
            return out
        out.append(row)


# ------------------------------------------------------------------ lanes


@dataclass(frozen=True, slots=True)
class LaneState:
    """Where a lane stands between two samples (STREAM-13).

    The next sample begins at token ``offset`` of the prepared document of row
    ``current`` (None: at the first token of the next kept row the buffer
    emits); ``buffer`` is the buffered shuffle after ``current`` was emitted;
    ``samples`` counts the lane's samples already consumed this epoch.
    """

    buffer: BufferState = field(default_factory=BufferState)
    current: RowId | None = None
    offset: int = 0
    samples: int = 0


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One sample handed out: its epoch, lane, index in the lane's stream and content (STREAM-9)."""

    epoch: int
    lane: int
    index: int
    sample: Sample


class LaneReader:
    """Reads and tokenizes rows by id, one unit per read, counting reads (the cost of STREAM-15).

    ``skipped`` holds the rows ``on_error="skip"`` dropped among those read (STREAM-17).
    """

    def __init__(self, files: Sequence[SourceFile], index: UnitIndex, config: StreamingConfig,
                 tokenizer: Tokenizer) -> None:
        self.files, self.index, self.config, self.tokenizer = files, index, config, tokenizer
        self.starts = index.row_starts()
        self.reads = 0
        self._tokens: dict[RowId, tuple[int, ...] | None] = {}
        self.skipped: set[RowId] = set()
        self._rows: dict[tuple[int, int], list[RowId]] = {}

    def rows(self, epoch: int, lane: int) -> list[RowId]:
        if (epoch, lane) not in self._rows:
            self._rows[(epoch, lane)] = lane_rows(self.index, self.config, epoch, lane)
        return self._rows[(epoch, lane)]

    def tokens(self, row: RowId) -> tuple[int, ...] | None:
        """The row's token ids; None for a row ``on_error="skip"`` dropped (STREAM-17)."""
        if row not in self._tokens:
            self.reads += 1
            text = read_unit(self.files, self.index, row[0], self.config.text_field, self.config.on_error)[row[1]]
            if text is None:
                self.skipped.add(row)
            self._tokens[row] = None if text is None else tuple(self.tokenizer(text))
        return self._tokens[row]

    def doc_id(self, row: RowId) -> int:
        return self.starts[row[0]] + row[1]


def lane_next(reader: LaneReader, epoch: int, lane: int, state: LaneState) -> tuple[Sample, LaneState] | None:
    """The lane's next sample and the state after it, or None when fewer than L + 1 tokens remain (STREAM-9).

    The lane's documents are its rows in buffered order, each tokenized and
    prepared (PACK-1), dropped when PACK-2 drops it; concat cuts the token
    stream T into inputs ``T[iL : iL + L]`` (PACK-6), chunk into windows of
    L + 1 (PACK-8), and the sample is filled by ``reference.packing.fill``, so
    labels, positions and provenance are PACK's.
    """
    config = reader.config.packing
    rows, key, size = reader.rows(epoch, lane), _key(reader.config, epoch, 2, lane), reader.config.shuffle_buffer_size
    L, hop = config.seq_len, config.seq_len if config.mode == "concat" else config.seq_len + 1
    buffer, current, offset = state.buffer, state.current, state.offset
    docs: list[tuple[int, tuple[int, ...]]] = []
    tokens: list[tuple[int, int]] = []      # (position in docs, offset) of T[0..L]
    cut: LaneState | None = None
    while len(tokens) < L + 1:
        if current is None:
            current, buffer = buffer_step(rows, size, key, buffer)
            if current is None:
                return None
            offset = 0
            ids = reader.tokens(current)
            if ids is None or not is_kept(len(prepare(ids, config)), config):    # STREAM-17, PACK-2
                current = None
                continue
        ids = reader.tokens(current)
        assert ids is not None
        prepared = prepare(ids, config)
        if offset == 0 or not docs:
            docs.append((reader.doc_id(current), ids))
        while offset < len(prepared) and len(tokens) < L + 1:
            if len(tokens) == hop:
                cut = LaneState(buffer, current, offset, state.samples + 1)
            tokens.append((len(docs) - 1, offset))
            offset += 1
        if offset == len(prepared):
            current, offset = None, 0
    if cut is None:    # chunk: the next sample starts after the L + 1 tokens read
        cut = LaneState(buffer, current, offset, state.samples + 1)
    pieces: list[Piece] = []
    for doc, off in tokens[:L]:
        if pieces and pieces[-1].doc == doc:
            pieces[-1] = Piece(doc, pieces[-1].start, off + 1)
        else:
            pieces.append(Piece(doc, off, off + 1))
    return fill([tuple(pieces)], docs, config)[0], cut


def lane_samples(files: Sequence[SourceFile], config: StreamingConfig, tokenizer: Tokenizer, epoch: int,
                 lane: int) -> list[Sample]:
    """Every sample lane ``lane`` yields in ``epoch``, from its start: the uninterrupted lane (STREAM-9)."""
    reader = LaneReader(files, build_index(files, config.unit_bytes), config, tokenizer)
    out, state = [], LaneState()
    while (step := lane_next(reader, epoch, lane, state)) is not None:
        out.append(step[0])
        state = step[1]
    return out


def token_corpus(files: Sequence[SourceFile], config: StreamingConfig, tokenizer: Tokenizer) -> list[list[list[int]]]:
    """The source as a token store's corpus: per file, its rows tokenized, unit by unit (STREAM-16).

    With ``shuffle=False``, no buffer and one lane, ``lane_samples(..., lane=0)``
    equals ``reference.resume.epoch_samples`` over this corpus, packed the same way.

    >>> from reference.resume import PipelineConfig, epoch_samples
    >>> from reference.units import RowFile
    >>> files = [RowFile(path="p", groups=(("a b", "c"),)), RowFile(path="q", groups=(("d e f",),))]
    >>> tok = lambda text: [ord(text[0]) - 96] * len(text.split())
    >>> config = StreamingConfig(packing=PackingConfig(seq_len=2))
    >>> token_corpus(files, config, tok)
    [[[1, 1], [3]], [[4, 4, 4]]]
    >>> [(s.input_ids, s.doc_ids) for s in lane_samples(files, config, tok, 0, 0)]
    [((1, 1), (0, 0)), ((3, 4), (1, 2))]
    >>> epoch_samples(token_corpus(files, config, tok), PipelineConfig(packing=config.packing), 0) == \\
    ...     lane_samples(files, config, tok, 0, 0)
    True
    """
    index = build_index(files, config.unit_bytes)
    corpus: list[list[list[int]]] = [[] for _ in files]
    for u, unit in enumerate(index.units):
        texts = read_unit(files, index, u, config.text_field)
        corpus[unit.file].extend(list(tokenizer(text)) for text in texts if text is not None)
    return corpus


def lane_remaining(reader: LaneReader, epoch: int, lane: int, state: LaneState) -> int:
    """How many samples the lane still yields from ``state`` (STREAM-12)."""
    count = 0
    while (step := lane_next(reader, epoch, lane, state)) is not None:
        count, state = count + 1, step[1]
    return count


def valid_world_sizes(num_lanes: int, num_workers: int = 0) -> list[int]:
    """World sizes whose ranks × workers own whole lanes: W with ``W * max(1, num_workers)`` dividing N (STREAM-10).

    >>> valid_world_sizes(8), valid_world_sizes(8, num_workers=2), valid_world_sizes(6, num_workers=4)
    ([1, 2, 4, 8], [1, 2, 4], [])
    """
    workers = max(1, num_workers)
    return [w for w in range(1, num_lanes + 1) if num_lanes % (w * workers) == 0]


def participant_lanes(num_lanes: int, world_size: int, num_workers: int, rank: int, worker: int) -> list[int]:
    """The lanes of worker ``worker`` of rank ``rank``: lanes l with ``l mod P = rank * workers + worker`` (STREAM-10).

    >>> participant_lanes(8, 2, 2, 1, 0)
    [2, 6]
    >>> participant_lanes(8, 3, 1, 0, 0)
    Traceback (most recent call last):
    ...
    reference.errors.TopologyError: world_size=3 with num_workers=1 gives 3 lane owners, which does not divide num_lanes=8: ranks and workers must own whole lanes; with num_workers=1 choose world_size in [1, 2, 4, 8]
    """
    workers = max(1, num_workers)
    require(is_int(world_size) and world_size >= 1 and is_int(num_workers) and num_workers >= 0, TopologyError,
            f"world_size={world_size!r} must be >= 1 and num_workers={num_workers!r} >= 0")
    require(num_lanes % (world_size * workers) == 0, TopologyError,
            f"world_size={world_size} with num_workers={num_workers} gives {world_size * workers} lane owners, which "
            f"does not divide num_lanes={num_lanes}: ranks and workers must own whole lanes; with "
            f"num_workers={num_workers} choose world_size in {valid_world_sizes(num_lanes, num_workers)}")
    require(0 <= rank < world_size and 0 <= worker < workers, TopologyError,
            f"rank={rank} must lie in [0, {world_size}) and worker={worker} in [0, {workers})")
    return list(range(rank * workers + worker, num_lanes, world_size * workers))


# ------------------------------------------------------------------ ranks and epoch end


def rank_lanes(num_lanes: int, world_size: int, num_workers: int, rank: int) -> list[list[int]]:
    """The lanes of each worker of ``rank`` (STREAM-10)."""
    return [participant_lanes(num_lanes, world_size, num_workers, rank, w) for w in range(max(1, num_workers))]


def epoch_steps(remaining: Mapping[int, int], num_lanes: int, world_size: int, num_workers: int,
                batch_size: int) -> int:
    """Equal-step truncation: the steps every rank takes = the minimum over ranks of its full batches (STREAM-12).

    A worker batches only its own lanes, so rank r has
    ``sum over its workers of floor(remaining samples of the worker's lanes / B)``
    full batches; every rank stops after the minimum of that over ranks, so no
    rank waits in a collective for a batch that another never makes.

    >>> epoch_steps({0: 5, 1: 2}, 2, 2, 0, 2)      # rank 0: 2 full batches, rank 1: 1
    1
    """
    return min(sum(sum(remaining[lane] for lane in lanes) // batch_size
                   for lanes in rank_lanes(num_lanes, world_size, num_workers, rank)) for rank in range(world_size))


def next_lane(candidates: Sequence[int], states: Mapping[int, LaneState], remaining: Mapping[int, int]) -> int:
    """Of lanes with a sample left, the one with the fewest samples consumed; ties: the lowest lane (STREAM-11).

    A pure function of the lane states: round-robin without a pointer to save,
    and it rebalances lanes left uneven by a resume on another world size.

    >>> next_lane([0, 2], {0: LaneState(samples=3), 2: LaneState(samples=1)}, {0: 4, 2: 0})
    0
    """
    live = [lane for lane in candidates if remaining[lane] > 0]
    return min(live, key=lambda lane: (states[lane].samples, lane))


# ------------------------------------------------------------------ state


def _lane_json(reader: LaneReader, epoch: int, lane: int, state: LaneState) -> dict[str, Any]:
    """A lane state as JSON; the read cursor as (unit position of its window, row of that window) (STREAM-13)."""
    unit, row = 0, state.buffer.read
    for j, window in enumerate(lane_windows(reader.index, reader.config, epoch, lane)):
        unit = j * reader.config.unit_window
        if row < len(window):
            break
        row -= len(window)
        unit += reader.config.unit_window
    b = state.buffer
    return {"unit": unit, "row": row, "offset": state.offset, "current": None if state.current is None else
            list(state.current), "slots": [list(s) for s in b.slots], "counter": b.counter, "flushed": b.flushed,
            "samples": state.samples}


def _lane_from_json(reader: LaneReader, epoch: int, lane: int, value: Any) -> LaneState:
    keys = {"unit", "row", "offset", "current", "slots", "counter", "flushed", "samples"}
    require(isinstance(value, Mapping) and set(value) == keys, StateError,
            f"lane {lane} state must hold exactly {sorted(keys)}; pass the dict state_dict() returned, unchanged")
    windows = lane_windows(reader.index, reader.config, epoch, lane)
    w = reader.config.unit_window
    unit, row = value["unit"], value["row"]
    require(is_int(unit) and is_int(row) and unit % w == 0 and 0 <= unit // w <= len(windows)
            and 0 <= row <= (len(windows[unit // w]) if unit // w < len(windows) else 0), StateError,
            f"lane {lane} position unit={unit!r}, row={row!r} is outside the lane's rows in epoch {epoch}: the "
            "state belongs to other data; start from a fresh state")
    read = sum(len(win) for win in windows[:unit // w]) + row
    rows = set(reader.rows(epoch, lane))

    def row_id(v: Any) -> RowId:
        require(isinstance(v, list) and len(v) == 2 and tuple(v) in rows, StateError,
                f"lane {lane} names row {v!r}, which is not one of its rows in epoch {epoch}: the state is corrupt")
        return (v[0], v[1])

    for name in ("offset", "counter", "flushed", "samples"):
        require(is_int(value[name]) and value[name] >= 0, StateError,
                f"lane {lane} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
    current = None if value["current"] is None else row_id(value["current"])
    buffer = BufferState(read, tuple(row_id(s) for s in value["slots"]), value["counter"], value["flushed"])
    return LaneState(buffer, current, value["offset"], value["samples"])


# ------------------------------------------------------------------ the loader


class StreamingReferenceLoader(EpochSteps):
    """One rank's view of a streaming source, with an exact, elastic state (STREAM-10 .. STREAM-15).

    Iterating yields this rank's batches (lists of ``StreamRow``) for the rest
    of the epoch: ``epoch_steps`` of them (STREAM-12), each the next
    ``batch_size`` samples of one worker (the worker with the fewest samples
    consumed, STREAM-11), then the state moves to the next epoch.
    ``state_dict`` holds this rank's lanes; ``merge_states`` unites the ranks'.
    The step count is a definition, computed by running every lane to its end
    on a reader of its own; ``reader.reads`` counts the rows the samples cost.
    """

    def __init__(self, files: Sequence[SourceFile], config: StreamingConfig, tokenizer: Tokenizer, *,
                 tokenizer_id: str, world_size: int = 1, rank: int = 0, num_workers: int = 0,
                 batch_size: int = 1) -> None:
        require(isinstance(tokenizer_id, str) and tokenizer_id != "", ConfigError,
                "tokenizer_id must be a non-empty string naming the tokenizer (e.g. its content hash)")
        require(is_int(batch_size) and batch_size >= 1, ConfigError, f"batch_size={batch_size!r} must be >= 1")
        self.workers = rank_lanes(config.num_lanes, world_size, num_workers, rank)
        self.config, self.tokenizer_id, self.batch_size = config, tokenizer_id, batch_size
        self.world_size, self.num_workers, self.rank = world_size, num_workers, rank
        self.index = build_index(files, config.unit_bytes)
        self.reader = LaneReader(files, self.index, config, tokenizer)
        self._census = LaneReader(files, self.index, config, tokenizer)   # counts steps; not the cost of a read
        self.epoch = 0
        self.lanes = {lane: LaneState() for lane in range(config.num_lanes)}
        self._total, self._taken, self._next = None, 0, None     # S, t_r, epoch + 1's lanes (STREAM-22)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (as RES-7)."""
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be >= 0")
        self._enter_epoch(epoch)

    def _fresh(self) -> dict[int, Any]:
        return {lane: LaneState() for lane in self.lanes}

    def _remaining(self, epoch: int, lanes: Mapping[int, Any]) -> dict[int, int]:
        return {lane: lane_remaining(self._census, epoch, lane, s) for lane, s in lanes.items()}

    def _steps_of(self, remaining: Mapping[int, int]) -> int:
        return epoch_steps(remaining, self.config.num_lanes, self.world_size, self.num_workers, self.batch_size)

    def __iter__(self) -> Any:
        epoch = self.epoch
        remaining = self._remaining(epoch, self.lanes)
        left = self._steps_left(remaining)
        while left > 0:
            live = [w for w in self.workers if sum(remaining[lane] for lane in w) >= self.batch_size]
            worker = min(live, key=lambda w: (sum(self.lanes[lane].samples for lane in w), self.workers.index(w)))
            batch = []
            for _ in range(self.batch_size):
                lane = next_lane(worker, self.lanes, remaining)
                step = lane_next(self.reader, epoch, lane, self.lanes[lane])
                assert step is not None
                batch.append(StreamRow(epoch, lane, self.lanes[lane].samples, step[0]))
                self.lanes[lane], remaining[lane] = step[1], remaining[lane] - 1
            left, self._taken = left - 1, self._taken + 1
            yield batch
        self.set_epoch(epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """This rank's lanes and everything they depend on, as JSON primitives (STREAM-13)."""
        mine = sorted(lane for w in self.workers for lane in w)
        epoch, lanes, steps = self._steps_record(mine)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "index": self.index.fingerprint,
                "tokenizer": self.tokenizer_id, "options": self.config.to_json(), "epoch": epoch,
                "lanes": {str(lane): _lane_json(self.reader, epoch, lane, lanes[lane]) for lane in mine}, **steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a global state; refuse one that does not fit, naming what differs (STREAM-15)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"not a streaming state (format {state.get('format') if isinstance(state, Mapping) else state!r}); "
                "pass the dict a StreamingReferenceLoader's state_dict() or merge_states returned")
        version = state.get("version")
        require(version in (1, STATE_VERSION) and set(state) == (V1_KEYS if version == 1 else STATE_KEYS),
                StateError, f"state version {version!r} with keys {sorted(state)} is not version {STATE_VERSION} with "
                f"{sorted(STATE_KEYS)} (or 1 without {sorted(STEPS_KEYS)}); pass the dict state_dict() returned, "
                "unchanged")
        differs = []
        if state["index"] != self.index.fingerprint:
            differs.append("the unit index (a file was changed, added, removed or reordered, or unit_bytes differs)")
        if state["tokenizer"] != self.tokenizer_id:
            differs.append(f"the tokenizer ({state['tokenizer']!r} in the checkpoint, {self.tokenizer_id!r} here)")
        options = self.config.to_json()
        saved = state["options"] if isinstance(state["options"], Mapping) else {}
        changed = sorted(k for k in set(options) | set(saved)
                         if json.dumps(saved.get(k), sort_keys=True) != json.dumps(options.get(k), sort_keys=True))
        if changed:
            differs.append(f"the options {changed}")
        require(not differs, StateError, "the checkpoint differs from this loader in " + "; ".join(differs) +
                ": resume with the data, tokenizer and options it was taken with, or start from a fresh state")
        epoch = state["epoch"]
        require(is_int(epoch) and 0 <= epoch <= MASK64, StateError, f"epoch={epoch!r} must be an integer >= 0")
        lanes = state["lanes"]
        wanted = [str(lane) for lane in range(self.config.num_lanes)]
        require(isinstance(lanes, Mapping) and sorted(lanes, key=str) == sorted(wanted), StateError,
                f"state holds lanes {sorted(lanes) if isinstance(lanes, Mapping) else lanes!r} of "
                f"{self.config.num_lanes}: a rank's state holds its own lanes; combine every rank's state_dict() "
                "with merge_states and load the result")
        resumed = (Resumed(lane_epochs=dict.fromkeys(range(self.config.num_lanes), epoch)) if version == 1 else
                   resume_steps(state, num_lanes=self.config.num_lanes, world_size=self.world_size,
                                num_workers=self.num_workers, batch_size=self.batch_size, rank=self.rank))
        self._resume(epoch, resumed, {int(k): _lane_from_json(self.reader, resumed.lane_epochs[int(k)], int(k), v)
                                      for k, v in lanes.items()})

