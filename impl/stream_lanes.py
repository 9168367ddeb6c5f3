"""One lane of a streaming source: its rows in order, the buffered shuffle, tokens and packing (STREAM-6 .. STREAM-9, 11 .. 13).

Conforms to STREAM-6 .. STREAM-9 and STREAM-11 .. STREAM-13; its model is
``reference.streaming`` (``lane_rows``, ``buffer_step``, ``lane_next``,
``epoch_steps``, ``next_lane``, the lane JSON). A row is named here by its
global row number ``g`` (rows numbered unit by unit in index order, STREAM-9),
which is also its document id; the state's JSON names it ``[unit, row]``.

Why a mutable cursor: the reference computes one immutable state per
sample; a lane here advances one :class:`LaneCursor` in place and snapshots
it (:meth:`LaneCursor.snapshot`, a tuple of ints) after each sample, which
is what travels from a worker to the training process.

Worked example (rows of one lane, no shuffle, a buffer of 2)::

    >>> import numpy as np
    >>> from reference.packing import PackingConfig
    >>> from reference.streaming import StreamingConfig
    >>> cfg = StreamingConfig(packing=PackingConfig(seq_len=2), shuffle_buffer_size=2)
    >>> c = LaneCursor(np.arange(4), buffer_key(cfg, 0, 0), 2, FRESH)
    >>> [c.emit() for _ in range(5)]
    [0, 2, 3, 1, None]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from impl.errors import StateError, TopologyError, is_int, require
from impl.rng import FeistelPermutation, Stream, below, derive_key, subkey
from impl.stream_steps import merge_states, resumed_steps
from impl.units import UnitIndex
from reference.packing import IGNORE, PackingConfig
from reference.streaming import StreamingConfig

__all__ = ["FRESH", "PIPE_KEY", "STATE_KEY", "LaneBatches", "LaneCursor", "LaneSnapshot", "buffer_key", "follow_lanes", "from_pipe",
           "lane_json", "lane_rows", "lane_units", "lane_windows", "participant_lanes", "remaining_samples", "schedule",
           "snapshot_from_json", "to_pipe", "valid_world_sizes"]

LaneSnapshot = tuple[int, tuple[int, ...], int, int, int, int, int]
"""``(read, slots, counter, flushed, current, offset, samples)``; ``current == -1``: none (STREAM-13)."""
FRESH: LaneSnapshot = (0, (), 0, 0, -1, 0, 0)
_DRAWS = 1024


def _key(config: StreamingConfig, epoch: int, part: int, lane: int) -> int:
    return subkey(subkey(derive_key(config.seed, epoch, Stream.STREAMING), part), lane)


def buffer_key(config: StreamingConfig, epoch: int, lane: int) -> int:
    """The lane's buffered-shuffle key ``K`` (STREAM-8)."""
    return _key(config, epoch, 2, lane)


def lane_units(num_units: int, config: StreamingConfig, epoch: int, lane: int) -> np.ndarray:
    """Positions ``lane, lane + N, ...`` of the epoch's unit order (STREAM-6)."""
    if config.shuffle:
        order = FeistelPermutation(num_units, subkey(derive_key(config.seed, epoch, Stream.STREAMING), 0)).to_array()
    else:
        order = np.arange(num_units, dtype=np.int64)
    return order[lane::config.num_lanes]


def lane_windows(index: UnitIndex, starts: np.ndarray, config: StreamingConfig, epoch: int,
                 lane: int) -> list[np.ndarray]:
    """The lane's windows of global row numbers, each in its read order (STREAM-7)."""
    units = lane_units(len(index.units), config, epoch, lane)
    key = subkey(subkey(derive_key(config.seed, epoch, Stream.STREAMING), 1), lane)
    counts = np.array([u.rows for u in index.units], dtype=np.int64)
    windows = []
    w = config.unit_window
    for j, first in enumerate(range(0, len(units), w)):
        chunk = units[first:first + w]
        if len(chunk):
            rows = np.concatenate([np.arange(starts[u], starts[u] + counts[u], dtype=np.int64) for u in chunk])
        else:
            rows = np.empty(0, np.int64)
        if config.shuffle and len(rows):
            rows = rows[FeistelPermutation(len(rows), subkey(key, j)).to_array()]
        windows.append(rows)
    return windows


def lane_rows(windows: Sequence[np.ndarray]) -> np.ndarray:
    """The lane's row stream R: its windows' rows, window after window (STREAM-7)."""
    return np.concatenate(list(windows)) if windows else np.empty(0, np.int64)


class LaneCursor:
    """A lane's position: the buffered shuffle over its rows (STREAM-8) plus the next sample's first token (STREAM-9)."""

    __slots__ = (
        "_drawn_from",
        "_draws",
        "_perm",
        "counter",
        "current",
        "flushed",
        "key",
        "offset",
        "read",
        "rows",
        "samples",
        "size",
        "slots",
    )

    def __init__(self, rows: np.ndarray, key: int, size: int, snap: LaneSnapshot) -> None:
        self.rows, self.key, self.size = rows, key, size
        self.read, slots, self.counter, self.flushed, self.current, self.offset, self.samples = snap
        self.slots = list(slots)
        self._perm: np.ndarray | None = None
        self._draws = np.empty(0, np.int64)
        self._drawn_from = 0

    def snapshot(self) -> LaneSnapshot:
        return (self.read, tuple(self.slots), self.counter, self.flushed, self.current, self.offset, self.samples)

    def _below(self, counter: int) -> int:
        i = counter - self._drawn_from
        if not 0 <= i < len(self._draws):
            self._drawn_from = counter
            self._draws = below(self.key, np.arange(counter, counter + _DRAWS, dtype=np.uint64), self.size)
            i = 0
        return int(self._draws[i])

    def emit(self) -> int | None:
        """The next row the buffered shuffle emits, or None at the lane's end (``reference.streaming.buffer_step``)."""
        rows, n = self.rows, len(self.rows)
        if self.size <= 1:
            if self.read >= n:
                return None
            self.read += 1
            return int(rows[self.read - 1])
        slots = self.slots
        while self.read < n and len(slots) < self.size:
            slots.append(int(rows[self.read]))
            self.read += 1
        if self.read < n:
            j = self._below(self.counter)
            out, slots[j] = slots[j], int(rows[self.read])
            self.read += 1
            self.counter += 1
            self.flushed = 0
            return out
        if self.flushed >= len(slots):
            return None
        if self._perm is None or len(self._perm) != len(slots):
            self._perm = FeistelPermutation(len(slots), subkey(self.key, 0)).to_array()
        out = slots[int(self._perm[self.flushed])]
        self.flushed += 1
        return out

    def pending(self) -> list[int]:
        """Rows not yet emitted (slots still buffered, then rows unread), in no particular order."""
        if self.read >= len(self.rows) and self.flushed and self.size > 1:
            perm = FeistelPermutation(len(self.slots), subkey(self.key, 0)).to_array()
            left = [self.slots[int(p)] for p in perm[self.flushed:]]
        else:
            left = list(self.slots)
        rest: list[int] = self.rows[self.read:].tolist()
        return left + rest

    def next_sample(self, tokens: Callable[[int], np.ndarray], config: PackingConfig) -> dict[str, np.ndarray] | None:
        """The lane's next sample (PACK's fields, numpy), advancing the cursor past it; None when none is left (STREAM-9).

        On None the cursor is spent (the lane has ended); callers that know
        the remaining count never reach it.
        """
        L = config.seq_len
        hop = L if config.mode == "concat" else L + 1
        ids = np.empty(L + 1, np.int64)
        docs = np.empty(L + 1, np.int64)
        offs = np.empty(L + 1, np.int64)
        filled = 0
        cut: tuple[int, ...] | None = None
        while filled < L + 1:
            if self.current < 0:
                row = self.emit()
                if row is None:
                    return None
                self.current, self.offset = row, 0
                if not is_kept_len(len(tokens(row)), config):
                    self.current = -1
                    continue
            d = tokens(self.current)
            take = min(len(d) - self.offset, L + 1 - filled)
            if filled <= hop < filled + take:
                cut = (self.read, self.counter, self.flushed, self.current, self.offset + hop - filled)
                cut_slots = tuple(self.slots)
            ids[filled:filled + take] = d[self.offset:self.offset + take]
            docs[filled:filled + take] = self.current
            offs[filled:filled + take] = np.arange(self.offset, self.offset + take)
            filled += take
            self.offset += take
            if self.offset == len(d):
                self.current, self.offset = -1, 0
        if cut is not None:
            self.read, self.counter, self.flushed, self.current, self.offset = cut
            self.slots = list(cut_slots)
        self.samples += 1
        same = docs[1:] == docs[:-1]
        labels = np.where(same, ids[1:], IGNORE)
        starts = np.flatnonzero(np.concatenate(([True], ~same[:L - 1])))
        seg = np.repeat(starts, np.diff(np.append(starts, L)))
        return {"input_ids": ids[:L], "labels": labels, "position_ids": np.arange(L, dtype=np.int64) - seg,
                "doc_ids": docs[:L].copy(), "token_offsets": offs[:L].copy()}


def is_kept_len(raw: int, config: PackingConfig) -> bool:
    """PACK-2 on a prepared length."""
    return raw > 0 and raw >= config.min_len


def remaining_samples(cursor: LaneCursor, plen: Callable[[int], int], config: PackingConfig) -> int:
    """Samples the lane still yields (STREAM-12): from the tokens left, ``(n - 1) // L`` (concat) or ``n // (L + 1)`` (chunk)."""
    n = plen(cursor.current) - cursor.offset if cursor.current >= 0 else 0
    for row in cursor.pending():
        m = plen(row)
        if is_kept_len(m, config):
            n += m
    L = config.seq_len
    return max(0, (n - 1) // L) if config.mode == "concat" else n // (L + 1)


def schedule(lanes_of_workers: Sequence[Sequence[int]], samples: Mapping[int, int], remaining: Mapping[int, int],
             steps: int, batch_size: int) -> list[tuple[int, list[int]]]:
    """The rank's next ``steps`` batches as ``(worker, lanes in sample order)`` (STREAM-11), from counts alone."""
    s, r = dict(samples), dict(remaining)
    out = []
    for _ in range(steps):
        live = [k for k, lanes in enumerate(lanes_of_workers) if sum(r[lane] for lane in lanes) >= batch_size]
        k = min(live, key=lambda k: (sum(s[lane] for lane in lanes_of_workers[k]), k))
        picked = []
        for _ in range(batch_size):
            lane = min((lane for lane in lanes_of_workers[k] if r[lane] > 0), key=lambda lane: (s[lane], lane))
            s[lane] += 1
            r[lane] -= 1
            picked.append(lane)
        out.append((k, picked))
    return out


def valid_world_sizes(num_lanes: int, num_workers: int = 0) -> list[int]:
    """World sizes W with ``W * max(1, num_workers)`` dividing ``num_lanes`` (STREAM-10).

    >>> valid_world_sizes(8, num_workers=2)
    [1, 2, 4]
    """
    workers = max(1, num_workers)
    return [w for w in range(1, num_lanes + 1) if num_lanes % (w * workers) == 0]


def participant_lanes(num_lanes: int, world_size: int, num_workers: int, rank: int, worker: int) -> list[int]:
    """Lanes ``l`` with ``l mod (W * K) = rank * K + worker`` (STREAM-10); ``TopologyError`` listing the valid W otherwise.

    >>> participant_lanes(8, 2, 2, 1, 0)
    [2, 6]
    """
    workers = max(1, num_workers)
    require(is_int(world_size) and world_size >= 1 and is_int(num_workers) and num_workers >= 0, TopologyError,
            f"world_size={world_size!r} must be >= 1 and num_workers={num_workers!r} >= 0")
    require(num_lanes % (world_size * workers) == 0, TopologyError,
            f"world_size={world_size} with num_workers={num_workers} gives {world_size * workers} lane owners, which "
            f"does not divide num_lanes={num_lanes}: ranks and workers must own whole lanes; with "
            f"num_workers={num_workers} choose world_size in {valid_world_sizes(num_lanes, num_workers)}")
    require(is_int(rank) and 0 <= rank < world_size and 0 <= worker < workers, TopologyError,
            f"rank={rank!r} must lie in [0, {world_size}) and worker={worker!r} in [0, {workers})")
    return list(range(rank * workers + worker, num_lanes, world_size * workers))


def _row_id(g: int, starts: np.ndarray) -> list[int]:
    u = int(np.searchsorted(starts, g, side="right")) - 1
    return [u, int(g - starts[u])]


def lane_json(snap: LaneSnapshot, windows: Sequence[np.ndarray], starts: np.ndarray, unit_window: int) -> dict[str, Any]:
    """A lane snapshot as STREAM-13's JSON (the read cursor as window unit position and row)."""
    read, slots, counter, flushed, current, offset, samples = snap
    cum = np.cumsum([len(w) for w in windows]) if windows else np.empty(0, np.int64)
    j = int(np.searchsorted(cum, read, side="right"))
    row = read - (int(cum[j - 1]) if j else 0)
    return {"unit": j * unit_window, "row": row, "offset": offset,
            "current": None if current < 0 else _row_id(current, starts),
            "slots": [_row_id(g, starts) for g in slots], "counter": counter, "flushed": flushed, "samples": samples}


def snapshot_from_json(value: Any, lane: int, epoch: int, windows: Sequence[np.ndarray], starts: np.ndarray,
                       counts: np.ndarray, unit_window: int, rows: np.ndarray) -> LaneSnapshot:
    """STREAM-13's lane JSON back to a snapshot; a corrupt or foreign entry raises ``StateError`` naming the lane."""
    keys = {"unit", "row", "offset", "current", "slots", "counter", "flushed", "samples"}
    require(isinstance(value, Mapping) and set(value) == keys, StateError,
            f"lane {lane} state must hold exactly {sorted(keys)}; pass the dict state_dict() returned, unchanged")
    w, unit, row = unit_window, value["unit"], value["row"]
    require(is_int(unit) and is_int(row) and unit % w == 0 and 0 <= unit // w <= len(windows)
            and 0 <= row <= (len(windows[unit // w]) if unit // w < len(windows) else 0), StateError,
            f"lane {lane} position unit={unit!r}, row={row!r} is outside the lane's rows in epoch {epoch}: the "
            "state belongs to other data; start from a fresh state")
    read = sum(len(win) for win in windows[:unit // w]) + row
    mine = set(rows.tolist())

    def global_row(v: Any) -> int:
        ok = (isinstance(v, list) and len(v) == 2 and all(is_int(x) for x in v) and 0 <= v[0] < len(starts)
              and 0 <= v[1] < counts[v[0]])
        g = int(starts[v[0]] + v[1]) if ok else -1
        require(ok and g in mine, StateError,
                f"lane {lane} names row {v!r}, which is not one of its rows in epoch {epoch}: the state is corrupt")
        return g

    for name in ("offset", "counter", "flushed", "samples"):
        require(is_int(value[name]) and value[name] >= 0, StateError,
                f"lane {lane} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
    current = -1 if value["current"] is None else global_row(value["current"])
    slots = tuple(global_row(s) for s in value["slots"])
    return (read, slots, value["counter"], value["flushed"], current, value["offset"], value["samples"])


STATE_KEY = "_loadspec_stream"
"""The batch entry ``(epoch, worker, ((lane, snapshot), ...))`` the handing-out process applies (None: the end marker)."""

PIPE_KEY = "_loadspec_numpy"
"""The batch entry naming the fields a worker sent as numpy arrays (:func:`to_pipe`), popped by :func:`from_pipe`."""


def to_pipe(batch: dict[str, Any]) -> dict[str, Any]:
    """A worker's batch with its tensors as numpy arrays (the same memory), to cross the worker's pipe by value.

    Why: torch's DataLoader moves each tensor of a worker's batch into a
    shared-memory segment of its own (one allocation, file descriptor and
    mapping per tensor, nine per streaming batch), which costs more than
    copying a batch's ~0.7 MB through the pipe; a numpy array is pickled as
    its bytes. :func:`from_pipe` makes them tensors again in the training
    process, without a copy.

    >>> import torch
    >>> b = to_pipe({"input_ids": torch.arange(3), "max_seqlen": 3})
    >>> type(b["input_ids"]).__name__, b[PIPE_KEY]
    ('ndarray', ('input_ids',))
    >>> out = from_pipe(b); out["input_ids"].tolist(), sorted(out)
    ([0, 1, 2], ['input_ids', 'max_seqlen'])
    """
    names = tuple(k for k, v in batch.items() if isinstance(v, torch.Tensor))
    if names:
        batch = {k: (v.numpy() if k in names else v) for k, v in batch.items()}
        batch[PIPE_KEY] = names
    return batch


def from_pipe(batch: dict[str, Any]) -> dict[str, Any]:
    """:func:`to_pipe` undone: the named numpy arrays as tensors again (sharing their memory)."""
    for k in batch.pop(PIPE_KEY, ()):
        batch[k] = torch.from_numpy(batch[k])
    return batch


class LaneBatches(IterableDataset[dict[str, Any]]):
    """A dataset of lane batches that hands out consumed ones: ``StreamingDataset`` and ``StreamMixture``.

    In a DataLoader worker it yields its batches with their ``STATE_KEY``
    entries (``impl.stream_loader`` applies them as it hands each out); in
    one process it applies each entry itself as the batch is handed out, so
    the state counts consumed batches, never prefetched ones (STREAM-13),
    and an exhausted pass moves to the next epoch.
    """

    epoch: int
    world_size: int
    rank: int
    num_workers: int
    batch_size: int
    lanes: dict[int, Any]
    _total: int | None
    _taken: int
    _next: tuple[dict[int, Any], int | None, int] | None
    _loaded: tuple[Mapping[str, Any], dict[int, Any]] | None
    _markers: bool      # set by impl.stream_loader: its workers end their pass with a marker

    @staticmethod
    def merge(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The merge hook of :meth:`gathered`: how per-rank states unite (STREAM-14, STREAM-22)."""
        return merge_states(states)

    def gathered(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (this rank's lanes), or with a process group every rank's merged: a collective (STREAM-14).

        Every rank must call it at the same step of its loop, as any
        collective; each gets the same global state.
        """
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            states: list[Any] = [None] * self.world_size
            dist.all_gather_object(states, state)
            return self.merge(states)
        return state

    def lane_count(self) -> int:
        """How many lanes the stream is split into (STREAM-10)."""
        raise NotImplementedError

    def _fresh(self) -> Any:
        raise NotImplementedError

    def _resume(self, header: Mapping[str, Any], lanes: dict[int, Any] | None) -> dict[int, int]:
        """This rank's steps of a loaded state on the current topology, its lanes by epoch; each lane's epoch (STREAM-22).

        Without ``lanes`` only checks the steps (a refusal raises) and returns the lane epochs.
        """
        epoch, N = header["epoch"], self.lane_count()
        if "ranks" in header:
            total, taken, nxt, lane_epochs = resumed_steps(header, num_lanes=N, rank=self.rank,
                                                           topology=(self.world_size, self.num_workers, self.batch_size))
        else:       # version 1: S is recomputed from the lane states, as STREAM-12 alone says
            total, taken, nxt, lane_epochs = None, 0, None, dict.fromkeys(range(N), epoch)
        if lanes is not None:
            self._loaded = (header, lanes)
            self.epoch, self._total, self._taken = epoch, total, taken
            self.lanes = {lane: snap if lane_epochs[lane] == epoch else self._fresh() for lane, snap in lanes.items()}
            self._next = None if nxt is None else (
                {lane: snap for lane, snap in lanes.items() if lane_epochs[lane] != epoch}, nxt[0], nxt[1])
        return lane_epochs

    def _batches(self, num_workers: int, worker: int, *, markers: bool) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def apply(self, meta: Any) -> None:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is None:
            return self._run_in_process()
        batches = self._batches(info.num_workers, info.id, markers=self._markers)
        # impl.stream_loader's workers send numpy (from_pipe there); torch's own DataLoader gets the tensors
        return map(to_pipe, batches) if self._markers else batches

    def _run_in_process(self) -> Iterator[dict[str, Any]]:
        epoch = self.epoch
        for batch in self._batches(0, 0, markers=True):
            meta = batch.pop(STATE_KEY)
            if meta[2] is None:     # the pass's end marker
                break
            self.apply(meta)
            yield batch
        if self.epoch == epoch:
            self.set_epoch(epoch + 1)


def follow_lanes(tokens: Any, cursors: Iterable[Any]) -> None:
    """Tell ``tokens`` the rows each lane cursor will read, so their units are encoded ahead (``impl.stream_tokens``)."""
    for c in cursors:
        if isinstance(c, LaneCursor):
            tokens.follow(c.rows[c.read:])
