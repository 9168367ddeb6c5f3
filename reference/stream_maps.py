"""Batched maps over a streaming lane, with exact resume inside a partly consumed batch (STREAM-20, STREAM-21).

Clauses: STREAM-20, STREAM-21; the lanes they extend are ``reference.streaming`` (STREAM-6 .. STREAM-17).

Why batches of the buffer's output: a map such as a block tokenizer turns N
texts into M outputs (M may be 0 or larger than N), so an output has no row
of its own to resume from. Each lane therefore groups the rows its buffered
shuffle emits (STREAM-8) into consecutive input batches of ``batch_size``
rows, and its state names the buffer *as of the start of the current batch*
plus how many of that batch's outputs were consumed: a resume re-reads the
batch's rows by id, applies the function again and skips what was consumed.
That costs one batch per lane and stores no text or token (STREAM-13).

Worked example (one lane of rows ``"a b"``, ``"c"``, ``"d e f"``; batches of 2;
the map joins a batch's texts and cuts them into blocks of 2 words, each
word one token, L = 2, concat, no EOS)::

    >>> from reference.packing import PackingConfig
    >>> from reference.streaming import StreamingConfig
    >>> from reference.units import TextFile
    >>> def blocks(batch):
    ...     words = " ".join(batch["text"]).split()
    ...     return {"text": [" ".join(words[i:i + 2]) for i in range(0, len(words), 2)]}
    >>> fmap = BatchedMap(function=blocks, batch_size=2, name="blocks-v1")
    >>> files = [TextFile(path="a.txt", data=b"a b\\nc\\nd e f\\n")]
    >>> config = StreamingConfig(packing=PackingConfig(seq_len=2))
    >>> tok = lambda text: [ord(w) for w in text.split()]
    >>> loader = MappedReferenceLoader(files, config, tok, map=fmap, tokenizer_id="words")
    >>> [[row.sample.input_ids for row in batch] for batch in loader]
    [[(97, 98)], [(99, 100)]]
    >>> loader.state_dict()["lanes"]["0"]["output"], loader.state_dict()["options"]["map"]
    (0, {'name': 'blocks-v1', 'batch_size': 2})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference.errors import ConfigError, MapError, StateError, is_int, require
from reference.packing import Piece, Sample, fill, is_kept, prepare
from reference.streaming import (
    STATE_FORMAT,
    STATE_VERSION,
    BufferState,
    LaneReader,
    LaneState,
    StreamingConfig,
    StreamingReferenceLoader,
    StreamRow,
    Tokenizer,
    _key,
    _lane_from_json,
    _lane_json,
    buffer_step,
    next_lane,
)
from reference.units import SourceFile, read_unit

TOKENS = "input_ids"
MAP_LANE_KEYS = frozenset({"unit", "row", "slots", "counter", "flushed", "output", "offset", "made", "samples"})
MapFunction = Callable[[dict[str, list[str]]], Any]
Batch = tuple[tuple[tuple[int, ...], ...], BufferState]


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchedMap:
    """A deterministic function from a batch of texts to M outputs, and its identity (STREAM-20).

    ``function`` takes ``{text_field: [text, ...]}`` (the batch's rows, a
    row ``on_error="skip"`` dropped left out) and returns a dict of equal-length
    column lists: an ``input_ids`` column (token id lists, used as they are)
    or else a ``text_field`` column (texts, tokenized by the loader's
    tokenizer); other columns are ignored. ``name`` is the map's identity in
    the state (default ``module.qualname`` of the function): a resume with a
    map of another name or batch size is refused, but a changed function body
    under the same name is not detected, so give a new ``name`` (a version)
    when the function changes. ``function`` must be deterministic.

    >>> BatchedMap(function=len, batch_size=2).to_json()
    {'name': 'builtins.len', 'batch_size': 2}
    >>> BatchedMap(function=len, batch_size=0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: batch_size=0 must be an integer >= 1 (rows per input batch of the map)
    """

    function: MapFunction
    batch_size: int = 1000
    name: str | None = None

    def __post_init__(self) -> None:
        require(callable(self.function), ConfigError, f"function={self.function!r} must be callable")
        require(is_int(self.batch_size) and self.batch_size >= 1, ConfigError,
                f"batch_size={self.batch_size!r} must be an integer >= 1 (rows per input batch of the map)")
        require(self.name is None or (isinstance(self.name, str) and self.name != ""), ConfigError,
                f"name={self.name!r} must be a non-empty string naming the map (with a version) or None")
        require(self.name is not None or isinstance(getattr(self.function, "__qualname__", None), str), ConfigError,
                f"function={self.function!r} has no __qualname__ to name it in the state: pass name='<map>-v1'")

    @property
    def identity(self) -> str:
        """``name``, else ``module.qualname``: never ``hash()`` or pickle, which change between processes."""
        if self.name is not None:
            return self.name
        return f"{getattr(self.function, '__module__', None) or '?'}.{self.function.__qualname__}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.identity, "batch_size": self.batch_size}


def map_outputs(fmap: BatchedMap, texts: Sequence[str | None], text_field: str,
                tokenizer: Tokenizer) -> tuple[tuple[int, ...], ...]:
    """The token ids of a batch's outputs: ``function`` on its kept texts, checked (STREAM-20).

    A batch whose every row was dropped (STREAM-17) has no output and the
    function is not called.

    >>> m = BatchedMap(function=lambda b: {"input_ids": [[1], [2, 3], []]}, name="m")
    >>> map_outputs(m, ["x", None], "text", len)
    ((1,), (2, 3), ())
    >>> map_outputs(BatchedMap(function=lambda b: {"text": ["a"], "n": [1, 2]}, name="m"), ["x"], "text", len)
    Traceback (most recent call last):
    ...
    reference.errors.MapError: the map 'm' returned columns of unequal length {'text': 1, 'n': 2}: every column holds one entry per output
    """
    kept = [t for t in texts if t is not None]
    if not kept:
        return ()
    out = fmap.function({text_field: kept})
    name = fmap.identity
    wanted = f"return {{{TOKENS!r}: [[id, ...], ...]}} or {{{text_field!r}: [text, ...]}}"
    require(isinstance(out, Mapping), MapError,
            f"the map {name!r} returned {type(out).__name__}, not a dict of columns: {wanted}")
    for column, values in out.items():
        require(isinstance(values, (list, tuple)), MapError,
                f"the map {name!r} returned column {column!r} as {type(values).__name__}: each column must be a "
                "list with one entry per output")
    lengths = {str(column): len(values) for column, values in out.items()}
    require(len(set(lengths.values())) <= 1, MapError,
            f"the map {name!r} returned columns of unequal length {lengths}: every column holds one entry per output")
    if TOKENS in out:
        for i, ids in enumerate(out[TOKENS]):
            require(isinstance(ids, (list, tuple)) and all(is_int(t) and t >= 0 for t in ids), MapError,
                    f"the map {name!r} returned {TOKENS}[{i}]={ids!r}: each entry must be a list of token ids "
                    "(integers >= 0)")
        return tuple(tuple(ids) for ids in out[TOKENS])
    require(text_field in out, MapError,
            f"the map {name!r} returned columns {sorted(map(str, out))} with neither {TOKENS!r} (token ids) nor "
            f"{text_field!r} (text to tokenize): {wanted}")
    for i, text in enumerate(out[text_field]):
        require(isinstance(text, str), MapError,
                f"the map {name!r} returned {text_field}[{i}]={text!r}: each entry must be a string")
    return tuple(tuple(tokenizer(text)) for text in out[text_field])


@dataclass(frozen=True, slots=True)
class MapLaneState:
    """A mapped lane between two samples (STREAM-21).

    ``batch`` is the buffered shuffle as of the start of the input batch that
    holds the next sample's first token; that token is token ``offset`` of the
    batch's output ``output``; ``made`` counts the lane's outputs of the
    batches before it this epoch and ``samples`` its samples consumed.
    """

    batch: BufferState = field(default_factory=BufferState)
    output: int = 0
    offset: int = 0
    made: int = 0
    samples: int = 0


class MapReader(LaneReader):
    """A lane reader that reads input batches by their start and maps them, one batch per read (STREAM-20)."""

    def __init__(self, files: Sequence[SourceFile], index: Any, config: StreamingConfig, tokenizer: Tokenizer,
                 fmap: BatchedMap) -> None:
        super().__init__(files, index, config, tokenizer)
        self.map = fmap
        self._texts: dict[tuple[int, int], str | None] = {}
        self._batches: dict[tuple[int, int, BufferState], Batch | None] = {}

    def text(self, row: tuple[int, int]) -> str | None:
        if row not in self._texts:
            self.reads += 1
            self._texts[row] = read_unit(self.files, self.index, row[0], self.config.text_field,
                                         self.config.on_error)[row[1]]
            if self._texts[row] is None:
                self.skipped.add(row)
        return self._texts[row]

    def batch(self, epoch: int, lane: int, start: BufferState) -> Batch | None:
        """The outputs of the input batch starting at ``start`` and the buffer after it; None at the lane's end."""
        key = (epoch, lane, start)
        if key not in self._batches:
            rows, k, size = self.rows(epoch, lane), _key(self.config, epoch, 2, lane), self.config.shuffle_buffer_size
            emitted: list[tuple[int, int]] = []
            state = start
            while len(emitted) < self.map.batch_size:
                row, state = buffer_step(rows, size, k, state)
                if row is None:
                    break
                emitted.append(row)
            self._batches[key] = None if not emitted else (
                map_outputs(self.map, [self.text(r) for r in emitted], self.config.text_field, self.tokenizer), state)
        return self._batches[key]


def output_doc_id(made: int, num_lanes: int, lane: int) -> int:
    """Output number ``made`` of lane ``lane`` this epoch is document ``made * N + lane`` (STREAM-20).

    >>> [output_doc_id(n, 2, 1) for n in range(3)]
    [1, 3, 5]
    """
    return made * num_lanes + lane


def map_lane_next(reader: MapReader, epoch: int, lane: int,
                  state: MapLaneState) -> tuple[Sample, MapLaneState] | None:
    """The mapped lane's next sample and the state after it; None when fewer than L + 1 tokens remain (STREAM-20).

    As ``reference.streaming.lane_next`` with the lane's documents being the
    outputs of its input batches, each prepared (PACK-1) and dropped when
    PACK-2 drops it.
    """
    config = reader.config.packing
    L, hop = config.seq_len, config.seq_len if config.mode == "concat" else config.seq_len + 1
    batch, j, offset, made = state.batch, state.output, state.offset, state.made
    docs: list[tuple[int, tuple[int, ...]]] = []
    tokens: list[tuple[int, int]] = []
    cut: MapLaneState | None = None
    loaded = reader.batch(epoch, lane, batch)
    while len(tokens) < L + 1:
        if loaded is None:
            return None
        outs, after = loaded
        if j >= len(outs):
            batch, j, offset, made = after, 0, 0, made + len(outs)
            loaded = reader.batch(epoch, lane, batch)
            continue
        prepared = prepare(outs[j], config)
        if not is_kept(len(prepared), config):
            j, offset = j + 1, 0
            continue
        if offset == 0 or not docs:
            docs.append((output_doc_id(made + j, reader.config.num_lanes, lane), outs[j]))
        while offset < len(prepared) and len(tokens) < L + 1:
            if len(tokens) == hop:
                cut = MapLaneState(batch, j, offset, made, state.samples + 1)
            tokens.append((len(docs) - 1, offset))
            offset += 1
        if offset == len(prepared):
            j, offset = j + 1, 0
    if cut is None:
        cut = MapLaneState(batch, j, offset, made, state.samples + 1)
    pieces: list[Piece] = []
    for doc, off in tokens[:L]:
        if pieces and pieces[-1].doc == doc:
            pieces[-1] = Piece(doc, pieces[-1].start, off + 1)
        else:
            pieces.append(Piece(doc, off, off + 1))
    return fill([tuple(pieces)], docs, config)[0], cut


def mapped_lane_samples(files: Sequence[SourceFile], config: StreamingConfig, tokenizer: Tokenizer, fmap: BatchedMap,
                        epoch: int, lane: int) -> list[Sample]:
    """Every sample the mapped lane yields in ``epoch``, from its start: the uninterrupted lane (STREAM-20)."""
    from reference.units import build_index

    reader = MapReader(files, build_index(files, config.unit_bytes), config, tokenizer, fmap)
    out, state = [], MapLaneState()
    while (step := map_lane_next(reader, epoch, lane, state)) is not None:
        out.append(step[0])
        state = step[1]
    return out


def map_lane_json(reader: MapReader, epoch: int, lane: int, state: MapLaneState) -> dict[str, Any]:
    """A mapped lane as JSON: STREAM-13's buffer position of the batch's start, ``output``, ``offset``, ``made``."""
    value = _lane_json(reader, epoch, lane, LaneState(state.batch, None, state.offset, state.samples))
    del value["current"]
    return dict(value, output=state.output, made=state.made)


def plain_lane(value: Mapping[str, Any]) -> dict[str, Any]:
    """A mapped lane's JSON as STREAM-13's lane (no current row): what its position checks read."""
    return dict({k: v for k, v in value.items() if k not in ("output", "made")}, current=None)


def map_lane_from_json(reader: MapReader, epoch: int, lane: int, value: Mapping[str, Any]) -> MapLaneState:
    """A mapped lane's JSON back to its state; a corrupt or foreign entry raises ``StateError`` naming the lane."""
    for name in ("output", "made"):
        require(is_int(value[name]) and value[name] >= 0, StateError,
                f"lane {lane} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
    base = _lane_from_json(reader, epoch, lane, plain_lane(value))
    return MapLaneState(base.buffer, value["output"], base.offset, value["made"], base.samples)


def describe_map(value: Any) -> str:
    if value is None:
        return "no map"
    return json.dumps(value, sort_keys=True)


class MappedReferenceLoader(StreamingReferenceLoader):
    """``StreamingReferenceLoader`` whose lanes pass their rows through a batched map (STREAM-20, STREAM-21).

    The state is STREAM-13's with ``options["map"]`` (the map's identity and
    batch size) and, per lane, the buffer as of the current input batch's
    start, ``output``, ``offset`` and ``made``; a resume re-reads and re-maps
    one batch per lane, and a state of another map is refused naming both.
    """

    def __init__(self, files: Sequence[SourceFile], config: StreamingConfig, tokenizer: Tokenizer, *,
                 map: BatchedMap, tokenizer_id: str, world_size: int = 1, rank: int = 0,
                 num_workers: int = 0, batch_size: int = 1) -> None:
        require(isinstance(map, BatchedMap), ConfigError, f"map={map!r} must be a BatchedMap")
        super().__init__(files, config, tokenizer, tokenizer_id=tokenizer_id, world_size=world_size, rank=rank,
                         num_workers=num_workers, batch_size=batch_size)
        self.map = map
        self.map_reader = MapReader(files, self.index, config, tokenizer, map)
        self.reader = self.map_reader
        self._map_census = MapReader(files, self.index, config, tokenizer, map)
        self.lanes = self._fresh()      # MapLaneState per lane

    def _fresh(self) -> dict[int, Any]:
        return {lane: MapLaneState() for lane in self.lanes}

    def _remaining(self, epoch: int, lanes: Mapping[int, Any]) -> dict[int, int]:
        out = {}
        for lane, state in lanes.items():
            count = 0
            while (step := map_lane_next(self._map_census, epoch, lane, state)) is not None:
                count, state = count + 1, step[1]
            out[lane] = count
        return out

    def __iter__(self) -> Any:
        epoch, lanes = self.epoch, self.lanes
        remaining = self._remaining(epoch, lanes)
        left = self._steps_left(remaining)
        while left > 0:
            live = [w for w in self.workers if sum(remaining[lane] for lane in w) >= self.batch_size]
            worker = min(live, key=lambda w: (sum(lanes[lane].samples for lane in w), self.workers.index(w)))
            batch = []
            for _ in range(self.batch_size):
                lane = next_lane(worker, lanes, remaining)
                step = map_lane_next(self.map_reader, epoch, lane, lanes[lane])
                assert step is not None
                batch.append(StreamRow(epoch, lane, lanes[lane].samples, step[0]))
                lanes[lane], remaining[lane] = step[1], remaining[lane] - 1
            left, self._taken = left - 1, self._taken + 1
            yield batch
        self.set_epoch(epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """STREAM-13's state with the map in ``options`` and mapped lanes (STREAM-21)."""
        mine = sorted(lane for w in self.workers for lane in w)
        epoch, lanes, steps = self._steps_record(mine)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "index": self.index.fingerprint,
                "tokenizer": self.tokenizer_id, "options": dict(self.config.to_json(), map=self.map.to_json()),
                "epoch": epoch, "lanes": {str(lane): map_lane_json(self.map_reader, epoch, lane, lanes[lane])
                                          for lane in mine}, **steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume mid-batch; refuse a state of another map (or of none) naming both (STREAM-21)."""
        options = state.get("options") if isinstance(state, Mapping) else None
        saved = options.get("map") if isinstance(options, Mapping) else None
        require(saved == self.map.to_json(), StateError,
                f"the checkpoint differs from this loader in the map ({describe_map(saved)} in the checkpoint, "
                f"{describe_map(self.map.to_json())} here): resume with the map it was taken with (the same name and "
                "batch_size), or start from a fresh state")
        assert isinstance(options, Mapping)
        lanes = state["lanes"]
        for key, value in (lanes.items() if isinstance(lanes, Mapping) else ()):
            require(isinstance(value, Mapping) and set(value) == MAP_LANE_KEYS, StateError,
                    f"lane {key} state of a mapped stream must hold exactly {sorted(MAP_LANE_KEYS)}; pass the dict "
                    "state_dict() returned, unchanged")
        plain = dict(state, options={k: v for k, v in options.items() if k != "map"},
                     lanes={k: plain_lane(v) for k, v in lanes.items()} if isinstance(lanes, Mapping) else lanes)
        super().load_state_dict(plain)      # the header, the index, tokenizer, options, epoch, lanes, positions, steps
        ahead = set() if self._next is None else set(self._next[0])       # lanes already in epoch + 1 (STREAM-22)
        parsed = {int(k): map_lane_from_json(self.map_reader, self.epoch + (int(k) in ahead), int(k), v)
                  for k, v in lanes.items()}
        self.lanes = {lane: MapLaneState() if lane in ahead else s for lane, s in parsed.items()}
        if self._next is not None:
            self._next = ({lane: parsed[lane] for lane in ahead}, self._next[1], self._next[2])
