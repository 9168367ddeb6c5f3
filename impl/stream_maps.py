"""Batched maps over a StreamingDataset's lanes, with exact resume inside a partly consumed batch (STREAM-20, STREAM-21).

Conforms to STREAM-20 and STREAM-21 (docs/SEMANTICS.md); its model is
``reference.stream_maps.MappedReferenceLoader``: for the same files, config,
tokenizer, map and topology the batches and ``state_dict()`` are the
reference's, sample for sample.

Why a map runs inside the lane: a function that turns a batch of N texts into
M outputs (a block tokenizer, a filter, a splitter) leaves no row to name an
output by, so each lane cuts the rows its buffer emits into input batches of
``batch_size`` rows and remembers, per lane, the buffer at the current
batch's start and the outputs consumed. A resume re-reads that one batch by
row id and maps it again: exact, O(one batch) per lane, and the state holds
no text or token.

Worked example (Forgather's block tokenizer: each batch's texts tokenized,
joined and cut into blocks of 512 tokens; ``add_eos=False`` as the blocks
carry no document ends)::

    tok = Tokenizer.from_file("fixtures/tokenizer/gpt2/tokenizer.json")

    def block_tokenize(batch):                  # module level: workers under spawn pickle it
        ids = [t for enc in tok.encode_batch(batch["text"]) for t in enc.ids + [EOS]]
        return {"input_ids": [ids[i:i + 512] for i in range(0, len(ids) - 511, 512)]}

    ds = StreamingDataset("data/*.jsonl", tokenizer="fixtures/tokenizer/gpt2", seq_len=512, add_eos=False,
                          num_lanes=8, shuffle=True, shuffle_buffer_size=10_000)
    blocks = ds.map(block_tokenize, batched=True, batch_size=1000, name="blocks-512-v1")
    loader = build_dataloader(blocks, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    # blocks.state_dict() resumes inside a batch of 1000 texts, re-tokenizing only that batch per lane
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from impl.errors import ConfigError, MapError, StateError, is_int, require
from impl.stream_lanes import LaneCursor, LaneSnapshot, is_kept_len, lane_json
from reference.packing import IGNORE, PackingConfig
from reference.stream_maps import MAP_LANE_KEYS, TOKENS, BatchedMap

__all__ = [
    "MAP_FRESH",
    "BatchedMap",
    "MapCursor",
    "RowMap",
    "census_totals",
    "check_picklable",
    "count_samples",
    "make_map",
    "map_ids",
    "map_lane_json",
    "map_snapshots",
    "unmap_state",
    "with_map",
]

MapSnapshot = tuple[int, tuple[int, ...], int, int, int, int, int, int]
"""``(read, slots, counter, flushed)`` at the current input batch's start, then ``output, offset, samples, made``."""
MAP_FRESH: MapSnapshot = (0, (), 0, 0, 0, 0, 0, 0)
_Pos = tuple[int, tuple[int, ...], int, int]


class TokenSource(Protocol):
    """What a cursor reads through: ``impl.streaming``'s per-pass row reader and encoder."""

    def encode(self, texts: Sequence[str | None]) -> list[list[int] | None]: ...

    def prepare(self, ids: list[int] | None) -> np.ndarray: ...

    def unit_texts(self, u: int, *, census: bool = False) -> list[str | None]: ...


class RowMap:
    """``batched=False``: a function of one example dict returning one example dict, as a batched map of 1:1.

    A module-level class, so it pickles whenever ``function`` does.
    """

    def __init__(self, function: Callable[[dict[str, Any]], Any], text_field: str) -> None:
        self.function, self.text_field = function, text_field
        self.__qualname__ = getattr(function, "__qualname__", type(function).__qualname__)
        self.__module__ = getattr(function, "__module__", None) or type(self).__module__

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        columns: dict[str, list[Any]] = {}
        for text in batch[self.text_field]:
            out = self.function({self.text_field: text})
            require(isinstance(out, Mapping), MapError,
                    f"the map {self.__qualname__!r} (batched=False) returned {type(out).__name__}, not a dict: "
                    f"return one example, e.g. {{{TOKENS!r}: [id, ...]}}; for N inputs to M outputs use batched=True")
            for key, value in out.items():
                columns.setdefault(str(key), []).append(value)
        return columns


def map_ids(fmap: BatchedMap, texts: Sequence[str | None], text_field: str,
            encode: Callable[[Sequence[str | None]], list[list[int] | None]]) -> list[list[int]]:
    """The token ids of one input batch's outputs, checked (STREAM-20); no call when no text is left."""
    kept = [t for t in texts if t is not None]
    if not kept:
        return []
    out = fmap.function({text_field: kept})
    name = fmap.identity
    wanted = f"return {{{TOKENS!r}: [[id, ...], ...]}} or {{{text_field!r}: [text, ...]}}"
    if not isinstance(out, Mapping):
        raise MapError(f"the map {name!r} returned {type(out).__name__}, not a dict of columns: {wanted}")
    for column, values in out.items():
        if not isinstance(values, (list, tuple, np.ndarray)):
            raise MapError(f"the map {name!r} returned column {column!r} as {type(values).__name__}: each column "
                           "must be a list with one entry per output")
    lengths = {str(column): len(values) for column, values in out.items()}
    if len(set(lengths.values())) > 1:
        raise MapError(f"the map {name!r} returned columns of unequal length {lengths}: every column holds one "
                       "entry per output")
    if TOKENS in out:
        ids = []
        for i, entry in enumerate(out[TOKENS]):
            arr = np.asarray(entry)
            if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or int(arr.min()) < 0)):
                raise MapError(f"the map {name!r} returned {TOKENS}[{i}]={entry!r}: each entry must be a list of "
                               "token ids (integers >= 0)")
            ids.append([int(t) for t in arr.tolist()])
        return ids
    if text_field not in out:
        raise MapError(f"the map {name!r} returned columns {sorted(map(str, out))} with neither {TOKENS!r} (token "
                       f"ids) nor {text_field!r} (text to tokenize): {wanted}")
    values = list(out[text_field])
    for i, text in enumerate(values):
        if not isinstance(text, str):
            raise MapError(f"the map {name!r} returned {text_field}[{i}]={text!r}: each entry must be a string")
    return [ids for ids in encode(values) if ids is not None]


class MapCursor:
    """A mapped lane's position: the buffer over its rows, the current input batch's outputs and the next token."""

    __slots__ = ("buffer", "census", "fmap", "lane", "made", "num_lanes", "offset", "output", "outs", "samples",
                 "start", "starts", "text_field", "texts")

    def __init__(self, rows: np.ndarray, key: int, size: int, snap: MapSnapshot, *, lane: int, num_lanes: int,
                 fmap: BatchedMap, text_field: str, starts: np.ndarray, census: bool = False) -> None:
        read, slots, counter, flushed, self.output, self.offset, self.samples, self.made = snap
        self.buffer = LaneCursor(rows, key, size, (read, tuple(slots), counter, flushed, -1, 0, 0))
        self.start: _Pos = (read, tuple(slots), counter, flushed)
        self.outs: list[np.ndarray] | None = None
        self.lane, self.num_lanes, self.fmap, self.text_field = lane, num_lanes, fmap, text_field
        self.starts, self.census = starts, census
        self.texts: dict[int, dict[int, str | None]] = {}

    def snapshot(self) -> MapSnapshot:
        return (*self.start, self.output, self.offset, self.samples, self.made)

    def _pos(self) -> _Pos:
        b = self.buffer
        return (b.read, tuple(b.slots), b.counter, b.flushed)

    def _seek(self, pos: _Pos) -> None:
        b = self.buffer
        b.read, slots, b.counter, b.flushed = pos
        b.slots = list(slots)

    def _text(self, g: int, tokens: TokenSource) -> str | None:
        """Row ``g``'s text; a unit is read once and its rows handed out once (a lane emits each row once)."""
        starts = self.starts
        u = int(np.searchsorted(starts, g, side="right")) - 1
        unit = self.texts.get(u)
        if unit is None or g not in unit:
            first = int(starts[u])
            unit = self.texts[u] = {first + r: t for r, t in enumerate(tokens.unit_texts(u, census=self.census))}
        text = unit.pop(g)
        if not unit:
            del self.texts[u]
        return text

    def _load(self, tokens: TokenSource) -> bool:
        """Map the input batch starting at the buffer's position; False at the lane's end (STREAM-20)."""
        self.start = self._pos()
        emitted: list[int] = []
        while len(emitted) < self.fmap.batch_size:
            g = self.buffer.emit()
            if g is None:
                break
            emitted.append(g)
        if not emitted:
            return False
        ids = map_ids(self.fmap, [self._text(g, tokens) for g in emitted], self.text_field, tokens.encode)
        self.outs = [tokens.prepare(x) for x in ids]
        return True

    def next_sample(self, tokens: TokenSource, config: PackingConfig) -> dict[str, np.ndarray] | None:
        """The lane's next sample (PACK's fields), advancing past it; None when none is left (STREAM-20)."""
        L, N = config.seq_len, self.num_lanes
        hop = L if config.mode == "concat" else L + 1
        ids = np.empty(L + 1, np.int64)
        docs = np.empty(L + 1, np.int64)
        offs = np.empty(L + 1, np.int64)
        filled = 0
        cut: tuple[_Pos, list[np.ndarray] | None, _Pos, int, int, int] | None = None
        while filled < L + 1:
            if self.outs is None and not self._load(tokens):
                return None
            assert self.outs is not None
            if self.output >= len(self.outs):
                self.made, self.output, self.offset, self.outs = self.made + len(self.outs), 0, 0, None
                continue
            d = self.outs[self.output]
            if not is_kept_len(len(d), config):
                self.output, self.offset = self.output + 1, 0
                continue
            take = min(len(d) - self.offset, L + 1 - filled)
            if filled <= hop < filled + take:
                cut = (self.start, self.outs, self._pos(), self.output, self.offset + hop - filled, self.made)
            ids[filled:filled + take] = d[self.offset:self.offset + take]
            docs[filled:filled + take] = (self.made + self.output) * N + self.lane
            offs[filled:filled + take] = np.arange(self.offset, self.offset + take)
            filled += take
            self.offset += take
            if self.offset == len(d):
                self.output, self.offset = self.output + 1, 0
        if cut is not None:
            self.start, self.outs, pos, self.output, self.offset, self.made = cut
            self._seek(pos)
        self.samples += 1
        same = docs[1:] == docs[:-1]
        labels = np.where(same, ids[1:], IGNORE)
        starts = np.flatnonzero(np.concatenate(([True], ~same[:L - 1])))
        seg = np.repeat(starts, np.diff(np.append(starts, L)))
        return {"input_ids": ids[:L], "labels": labels, "position_ids": np.arange(L, dtype=np.int64) - seg,
                "doc_ids": docs[:L].copy(), "token_offsets": offs[:L].copy()}


def map_lane_json(snap: MapSnapshot, windows: Sequence[np.ndarray], starts: np.ndarray,
                  unit_window: int) -> dict[str, Any]:
    """A mapped lane as STREAM-21's JSON: the batch start's buffer position, ``output``, ``offset``, ``made``."""
    read, slots, counter, flushed, output, offset, samples, made = snap
    value = lane_json((read, slots, counter, flushed, -1, offset, samples), windows, starts, unit_window)
    del value["current"]
    return dict(value, output=output, made=made)


def unmap_state(state: Any, fmap: BatchedMap) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """A mapped state as STREAM-13's (for its checks) and each lane's ``(output, made)``; another map is refused.

    A state of another map (name or batch size), or of none, raises
    ``StateError`` naming both (STREAM-21).
    """
    options = state.get("options") if isinstance(state, Mapping) else None
    saved = options.get("map") if isinstance(options, Mapping) else None
    here = fmap.to_json()
    if saved != here:
        def describe(v: Any) -> str:
            return "no map" if v is None else json.dumps(v, sort_keys=True)

        raise StateError(f"the checkpoint differs from this loader in the map ({describe(saved)} in the checkpoint, "
                         f"{describe(here)} here): resume with the map it was taken with (the same name and "
                         "batch_size), or start from a fresh state")
    assert isinstance(state, Mapping) and isinstance(options, Mapping)
    lanes = state.get("lanes")
    extra: dict[str, tuple[int, int]] = {}
    for key, value in (lanes.items() if isinstance(lanes, Mapping) else ()):
        require(isinstance(value, Mapping) and set(value) == MAP_LANE_KEYS, StateError,
                f"lane {key} state of a mapped stream must hold exactly {sorted(MAP_LANE_KEYS)}; pass the dict "
                "state_dict() returned, unchanged")
        for name in ("output", "made"):
            require(is_int(value[name]) and value[name] >= 0, StateError,
                    f"lane {key} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
        extra[str(key)] = (value["output"], value["made"])
    plain = dict(state, options={k: v for k, v in options.items() if k != "map"},
                 lanes={k: dict({n: x for n, x in v.items() if n not in ("output", "made")}, current=None)
                        for k, v in lanes.items()} if isinstance(lanes, Mapping) else lanes)
    return plain, extra


def map_snapshots(plain: Mapping[int, LaneSnapshot], extra: Mapping[str, tuple[int, int]]) -> dict[int, MapSnapshot]:
    """STREAM-13 snapshots (no current row) and each lane's ``(output, made)`` as mapped snapshots."""
    out: dict[int, MapSnapshot] = {}
    for lane, (read, slots, counter, flushed, _current, offset, samples) in plain.items():
        output, made = extra[str(lane)]
        out[lane] = (read, slots, counter, flushed, output, offset, samples, made)
    return out


def check_picklable(fmap: BatchedMap) -> None:
    """Refuse, naming the fix, a map function that cannot travel to a DataLoader worker."""
    try:
        pickle.dumps(fmap.function)
    except Exception as exc:  # pickle raises several types (PicklingError, AttributeError, TypeError)
        raise MapError(f"the map {fmap.identity!r} cannot be pickled ({type(exc).__name__}: {exc}), and DataLoader "
                       "workers receive the dataset pickled: define the function at module level (not a lambda or a "
                       "nested function) or as an instance of a module-level class, or use num_workers=0") from exc


def make_map(function: Any, *, batched: bool, batch_size: int, name: str | None, text_field: str) -> BatchedMap:
    """The map ``StreamingDataset.map`` applies (STREAM-20).

    ``batched=True``: ``function({text_field: [text, ...]})`` returns a dict
    of equal-length column lists, ``input_ids`` (token ids) or else
    ``text_field`` (texts to tokenize), any number of outputs. ``batched=False``:
    ``function({text_field: text})`` returns one example dict (one output per
    row). ``name`` identifies the map in the state (default the function's
    ``module.qualname``); a changed function body under the same name is not
    detected, so version the name.
    """
    require(isinstance(batched, bool), ConfigError, f"batched={batched!r} must be True or False")
    require(callable(function), ConfigError, f"function={function!r} must be callable")
    if not batched:
        require(batch_size in (1, 1000), ConfigError,
                f"batch_size={batch_size} with batched=False: a row map sees one row at a time; leave batch_size "
                "out, or pass batched=True to map batches")
        fn = RowMap(function, text_field)
        return BatchedMap(function=fn, batch_size=1, name=name or f"{fn.__module__}.{fn.__qualname__}")
    return BatchedMap(function=function, batch_size=batch_size, name=name)


def with_map(ds: Any, function: Any, *, batched: bool, batch_size: int, name: str | None) -> Any:
    """A copy of the StreamingDataset ``ds`` with fresh mapped lanes (``StreamingDataset.map``, STREAM-20)."""
    require(ds.batched_map is None, ConfigError,
            f"this stream is already mapped by {ds.batched_map.identity if ds.batched_map else None!r}: a stream "
            "takes one map; compose the functions into one and map the unmapped dataset")
    fmap = make_map(function, batched=batched, batch_size=batch_size, name=name, text_field=ds.config.text_field)
    new = object.__new__(type(ds))
    new.__dict__.update(ds.__dict__)
    new.batched_map, new.lanes = fmap, {lane: MAP_FRESH for lane in ds.lanes}
    return new


def count_samples(cursor: MapCursor, tokens: TokenSource, config: PackingConfig) -> int:
    """The samples a mapped lane still yields (STREAM-12's census): its outputs are known only by mapping them."""
    n = 0
    while cursor.next_sample(tokens, config) is not None:
        n += 1
    return n


_CENSUS: dict[str, int] = {}
"""This process's census: a mapped lane's samples in one epoch order, by :func:`census_key` (STREAM-12)."""


def _code_digest(function: Any) -> str:
    """The map's code as far as it can be seen: the function's (or its class's ``__call__``) bytecode and constants.

    Nested code (a comprehension, a lambda) is digested by its own bytecode,
    not its repr, which holds a memory address that differs per process; a
    set constant by its sorted items, as its order follows the hash seed.
    """
    def walk(code: Any) -> bytes:
        consts = [walk(c) if hasattr(c, "co_code") else
                  repr(sorted(map(repr, c)) if isinstance(c, frozenset) else c).encode() for c in code.co_consts]
        return hashlib.sha256(b"\0".join([code.co_code, *consts])).digest()

    target = function if hasattr(function, "__code__") else type(function).__call__
    code = getattr(target, "__code__", None)
    return "" if code is None else walk(code).hex()


def census_key(fingerprint: str, fmap: BatchedMap, rows: np.ndarray, key: int, size: int) -> str:
    """What a lane's mapped sample count depends on: the dataset (index, tokenizer, options with the map's name and
    batch size), the map's code and pickled fields, and the lane's epoch order (its rows, buffer key and size)."""
    try:
        fields = hashlib.sha256(pickle.dumps(fmap.function)).hexdigest()
    except (pickle.PicklingError, AttributeError, TypeError):     # such a map runs in-process only (check_picklable)
        fields = ""
    order = hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()
    text = json.dumps([fingerprint, _code_digest(fmap.function), fields, order, int(key), int(size)])
    return hashlib.sha256(text.encode()).hexdigest()


def census_totals(keys: Mapping[int, str], known: dict[str, int], index_dir: str | None,
                  count: Callable[[int], tuple[int, int]]) -> dict[int, int]:
    """Each lane's samples in its epoch order (STREAM-12's census), mapping a lane only when no one has counted it.

    Why: a mapped lane's outputs are known only by mapping it, and that is
    the whole corpus per rank. A count is looked up in ``known`` (the
    dataset's, which DataLoader workers receive with it), then this
    process's, then ``index_dir`` (``<key>.census.json``, written
    atomically); else ``count(lane)`` gives ``(samples before the lane's
    snapshot, samples after it)``, mapping only the rest. Example: a second
    epoch with the same order, or a second rank of the same corpus in one
    process, maps no lane for its census.
    """
    out = {}
    for lane, key in keys.items():
        total = known.get(key, _CENSUS.get(key))
        path = None if index_dir is None else os.path.join(index_dir, key[:40] + ".census.json")
        if total is None and path is not None:
            try:
                with open(path) as f:
                    saved = json.load(f)
                if isinstance(saved, dict) and saved.get("key") == key and is_int(saved.get("samples")):
                    total = int(saved["samples"])
            except (OSError, ValueError):
                pass
        if total is None:
            before, after = count(lane)
            total = before + after
            if path is not None:
                from impl._atomic import atomic_write_json

                os.makedirs(index_dir or ".", exist_ok=True)
                atomic_write_json(path, {"key": key, "samples": total})
        known[key] = _CENSUS[key] = out[lane] = total
    return out

