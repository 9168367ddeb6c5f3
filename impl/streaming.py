"""StreamingDataset: raw jsonl / txt / parquet / Arrow files tokenized on the fly, in lanes, with exact, elastic resume.

Conforms to STREAM-1 .. STREAM-15, STREAM-17 .. STREAM-21 (docs/SEMANTICS.md, "Streaming"; units
through ``impl.units``, HF sources through ``impl.hf_sources``, lanes through ``impl.stream_lanes``,
batched maps through ``impl.stream_maps``, row tokens through ``impl.stream_tokens``); its model is
``reference.streaming.StreamingReferenceLoader``: for the same files,
config, tokenizer and topology, the batches are the reference's, sample for
sample, and ``state_dict()`` is the reference's JSON (STREAM-13).

Why batches come out of the dataset: STREAM-11 makes a batch the samples of
*one* worker's lanes, so a worker must compose whole batches; the dataset is
a torch ``IterableDataset`` of batches (use ``batch_size=None`` with torch's
own ``DataLoader``). Each batch carries, under ``STATE_KEY``, its worker
and the post-batch snapshots of the lanes it drew from: the process
that hands a batch to the training loop applies them, so the state counts
consumed batches, never prefetched ones. :func:`impl.loader.build_dataloader`
does that (and puts workers' batches in STREAM-11's order); without workers,
iterating the dataset applies them itself.

Why the tokenizer is loaded lazily (:mod:`impl.stream_tokens`): the dataset holds the tokenizer's JSON
(a string: it pickles cheaply under ``spawn``) and each process builds its
``tokenizers.Tokenizer`` on first use, so a forked worker never inherits a
tokenizer's thread pool. Rows are encoded a unit at a time
(``encode_batch_fast``, ``add_special_tokens=False``); BOS / EOS are added by
the packing config (PACK-1).

Why several ranks count every lane: equal-step truncation (STREAM-12) needs
each rank's full batches, so with ``world_size > 1`` a worker computes every
lane's remaining samples from the token lengths of the rows still ahead
(tokenizing the whole source once per (index, tokenizer); the lengths are
cached under ``index_dir``). One rank keeps every full batch, so it streams
with no such pass.

Worked example (a training loop that checkpoints, resumed on another world size)::

    ds = StreamingDataset("data/*.jsonl", tokenizer="fixtures/tokenizer/gpt2", seq_len=2048,
                          num_lanes=8, shuffle=True, shuffle_buffer_size=10_000, index_dir="data/.index")
    loader = build_dataloader(ds, batch_size=8, rank=rank, world_size=2, num_workers=2)
    for batch in loader:
        train(batch)
        states = gather(ds.state_dict())            # one per rank without a process group
    saved = json.dumps(merge_states(states))
    # later, on 4 ranks: ds.load_state_dict(json.loads(saved)) continues every lane where it stood
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from impl.collation import batch_cu_seqlens
from impl.errors import ConfigError, StateError, TokenizerError, is_int, require
from impl.files import FileAccess
from impl.hf_sources import hf_paths
from impl.partition import distributed_topology
from impl.stream_lanes import (
    FRESH,
    STATE_KEY,
    LaneBatches,
    LaneCursor,
    LaneSnapshot,
    buffer_key,
    follow_lanes,
    lane_json,
    lane_rows,
    lane_windows,
    participant_lanes,
    remaining_samples,
    schedule,
    snapshot_from_json,
    valid_world_sizes,
)
from impl.stream_maps import (
    MAP_FRESH,
    MapCursor,
    census_key,
    census_totals,
    check_picklable,
    count_samples,
    map_lane_json,
    map_snapshots,
    unmap_state,
    with_map,
)
from impl.stream_steps import merge_states, steps_fields
from impl.stream_tokens import RowTokens, resolve_once
from impl.units import UnitIndex, build_unit_index, describe_change, read_unit, source_files
from reference.packing import PackingConfig
from reference.stream_maps import BatchedMap
from reference.streaming import STATE_FORMAT, STATE_KEYS, STATE_VERSION, V1_KEYS, StreamingConfig

__all__ = ["STATE_KEY", "SkippedRowsWarning", "StreamingDataset", "merge_states", "valid_world_sizes"]

SKIPPED_KEY = "_loadspec_skipped"
"""A batch entry ``{unit: bad lines}`` a worker sends to ``impl.stream_loader`` (STREAM-17), popped before use."""
_MODES = ("concat", "chunk")


class SkippedRowsWarning(UserWarning):
    """Lines ``on_error="skip"`` dropped from a streaming source, named by file and counted (STREAM-17)."""


_Batch = tuple[list[tuple[int, int, dict[str, np.ndarray]]], tuple[tuple[int, LaneSnapshot], ...]]


class StreamingDataset(LaneBatches):
    """Batches of packed samples from raw files, equal to ``reference.streaming``'s (STREAM-1 .. STREAM-15).

    ``paths``: names or globs under ``files`` (default: the local
    filesystem), or fsspec URLs (``s3://bucket/data/*.jsonl``) under one root
    read through :class:`impl.remote.RemoteFiles` with ``local`` (a node-local
    cache directory), ``cache_limit`` and ``storage_options``, or an HF source
    (:mod:`impl.hf_sources`: a ``save_to_disk`` or ``load_dataset`` cache
    directory, with ``split`` for a DatasetDict; a ``datasets.Dataset`` or
    ``IterableDataset``); ``tokenizer``: a tokenizer directory, ``tokenizer.json``, or
    a (fast) tokenizer object; ``packing``: ``concat`` or ``chunk``;
    ``num_lanes`` fixes the lanes (world size × workers must divide it);
    ``shuffle`` permutes units and rows of ``unit_window`` units per epoch;
    ``shuffle_buffer_size`` runs the buffered shuffle in each lane;
    ``add_eos`` (default True) ends every document with the tokenizer's EOS.
    ``on_error="skip"`` drops a jsonl / txt line that is not UTF-8, not JSON
    or lacks the string ``text_field`` in its place, counts it in
    :attr:`skipped` and warns (:class:`SkippedRowsWarning`) naming the file;
    the default ``"raise"`` raises ``SourceError`` (STREAM-17).
    ``batch_size`` is per rank; ``rank``/``world_size`` default to the process
    group's. Each batch is a dict of int64 tensors ``input_ids``, ``labels``,
    ``position_ids``, ``doc_ids`` (the row's global number), ``token_offsets``
    ``[B, seq_len]``, ``epoch``, ``lane``, ``sample_index`` (the sample's index
    in its lane's epoch) ``[B]``, plus ``cu_seqlens`` / ``max_seqlen``.
    """

    def __init__(self, paths: Any, *, tokenizer: Any, seq_len: int, packing: str = "concat",
                 num_lanes: int = 1, seed: int = 0, shuffle: bool = False, unit_window: int = 1,
                 shuffle_buffer_size: int = 0, unit_bytes: int = 1 << 20, text_field: str = "text",
                 add_bos: bool = False, add_eos: bool = True, min_len: int = 0, pad_id: int | None = None,
                 on_error: str = "raise", local: str | os.PathLike[str] | None = None,
                 cache_limit: int | str | None = None, storage_options: Mapping[str, Any] | None = None,
                 files: FileAccess | None = None, index_dir: str | os.PathLike[str] | None = None,
                 batch_size: int = 1, rank: int | None = None, world_size: int | None = None,
                 num_workers: int = 0, epoch: int = 0, split: str | None = None) -> None:
        super().__init__()
        hf_files = hf_paths(paths, split) if files is None else None     # an HF source names its files (STREAM-19)
        require(files is None or split is None, ConfigError,
                "split= is for an HF source read from the local filesystem; with files= leave it out")
        paths = paths if hf_files is None else hf_files
        require(packing in _MODES, ConfigError,
                f"packing={packing!r} is not a streaming mode; choose one of {_MODES} (the bin modes need a view "
                "beyond one lane: build a TokenStore and use PackedDataset)")
        require(is_int(batch_size) and batch_size >= 1, ConfigError, f"batch_size={batch_size!r} must be >= 1")
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self._tok_json, info = resolve_once(tokenizer)
        for name, wanted, ident in (("add_bos", add_bos, info.bos_id), ("add_eos", add_eos, info.eos_id)):
            require(not wanted or ident is not None, TokenizerError,
                    f"{name}=True but the tokenizer defines no {name[4:]} token; set {name}=False or use a tokenizer "
                    f"that has one")
        if pad_id is None:
            pad_id = next((i for i in (info.pad_id, info.eos_id) if i is not None), 0)
        self.config = StreamingConfig(
            packing=PackingConfig(seq_len=seq_len, mode=packing, add_bos=add_bos, add_eos=add_eos,  # type: ignore[arg-type]
                                  bos_id=info.bos_id if add_bos else None, eos_id=info.eos_id if add_eos else None,
                                  pad_id=pad_id, min_len=min_len),
            num_lanes=num_lanes, seed=seed, shuffle=shuffle, unit_window=unit_window,
            shuffle_buffer_size=shuffle_buffer_size, unit_bytes=unit_bytes, text_field=text_field, on_error=on_error)
        self.tokenizer_id = info.sha256
        self.files, paths = source_files(paths, files, local, cache_limit, storage_options)
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        self.index: UnitIndex = build_unit_index(paths, files=self.files, unit_bytes=unit_bytes,
                                                 text_field=text_field, index_dir=self.index_dir)
        self._starts = np.array(self.index.row_starts(), dtype=np.int64)
        self._counts = np.array([u.rows for u in self.index.units], dtype=np.int64)
        self.batch_size = batch_size
        self.rank, self.world_size = distributed_topology(rank, world_size)
        self.set_topology(self.rank, self.world_size, num_workers)
        self.epoch = int(epoch)
        #: A LaneSnapshot per lane, or a MapSnapshot (``impl.stream_maps``) when mapped; samples at [6] either way.
        self.lanes: dict[int, Any] = {lane: FRESH for lane in range(num_lanes)}
        #: S of this epoch once fixed, the steps this rank took of it, and a straddling state's epoch + 1 (STREAM-22).
        self._total: int | None = None
        self._taken = 0
        self._next: tuple[dict[int, Any], int | None, int] | None = None
        self._loaded: tuple[Mapping[str, Any], dict[int, Any]] | None = None     # re-resolved by set_topology
        self._pass_total: int | None = None     # S of the pass this process runs, sent with its batches
        self.batched_map: BatchedMap | None = None     # set by map() (STREAM-20)
        self._lengths: np.ndarray | None = None
        self._census: dict[str, int] = {}     # mapped lanes' counts (impl.stream_maps.census_totals)
        self._markers = False     # set by impl.stream_loader: its workers end their pass with a marker
        #: Units this process read to make samples (not the STREAM-12 census): the cost of a resume (STREAM-15).
        self.unit_reads = 0
        self._skipped_units: dict[int, int] = {}

    # ------------------------------------------------------------ bad lines (STREAM-17)

    @property
    def skipped(self) -> dict[str, int]:
        """Bad lines ``on_error="skip"`` dropped, per file, among the units this process has read (STREAM-17).

        Each unit counts once however often it is read; the units read
        include the census of ``world_size > 1`` (every unit) when it reads
        them, so there the count is the whole source's; a census already
        counted (lengths under ``index_dir``, a map's counts) reads none. A DataLoader worker counts in its own
        process and warns there; under ``build_dataloader`` (``impl.stream_loader``)
        its counts also come with its batches, so this count in the training
        process is the total over its workers.
        """
        out: dict[str, int] = {}
        for u, n in sorted(self._skipped_units.items()):
            where = self.files.where(self.index.files[self.index.units[u].file][0])
            out[where] = out.get(where, 0) + n
        return out

    def add_worker_skipped(self, units: Mapping[int, int]) -> None:
        """Count the skipped lines a DataLoader worker sent with a batch (``SKIPPED_KEY``), each unit once."""
        for u, n in units.items():
            self._skipped_units.setdefault(int(u), int(n))

    def _note_skipped(self, u: int, texts: Sequence[str | None]) -> None:
        """Count and report a unit's skipped lines once per process (never silently, STREAM-17)."""
        n = sum(t is None for t in texts)
        if n and u not in self._skipped_units:
            self._skipped_units[u] = n
            unit = self.index.units[u]
            where = self.files.where(self.index.files[unit.file][0])
            warnings.warn(f"{where}: skipped {n} bad line(s) in bytes [{unit.start}, {unit.stop}) "
                          f"({self.skipped[where]} in this file so far, on_error='skip'); pass on_error='raise' to "
                          "see the first one's error", SkippedRowsWarning, stacklevel=2)

    # ------------------------------------------------------------ topology

    def set_topology(self, rank: int, world_size: int, num_workers: int) -> None:
        """Who runs which lanes (STREAM-10); a world size whose ranks × workers do not divide the lanes is refused."""
        require(is_int(num_workers) and num_workers >= 0, ConfigError, f"num_workers={num_workers!r} must be >= 0")
        participant_lanes(self.config.num_lanes, world_size, num_workers, rank, 0)
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        loaded = getattr(self, "_loaded", None)
        if loaded is not None:     # a state loaded before: resumed on this topology (STREAM-22)
            self._resume(*loaded)

    def row_tokens(self) -> RowTokens:
        """A fresh cache of prepared token arrays by global row number (``LaneCursor.next_sample``'s ``tokens``)."""
        return RowTokens(self._tok_json, self.config.packing, self._starts, self.unit_texts,
                         keep=4 * self.config.num_lanes + 16, read=self.read_texts, account=self.count_read)

    def unit_texts(self, u: int, *, census: bool = False) -> list[str | None]:
        """Unit ``u``'s rows (None for a line ``on_error="skip"`` dropped), counted unless read for the census."""
        if not census:
            self.unit_reads += 1
        texts = self.read_texts(u)
        self._note_skipped(u, texts)
        return texts

    def read_texts(self, u: int) -> list[str | None]:
        """Unit ``u``'s rows, neither counted nor reported: ``RowTokens`` reads ahead with it, then :meth:`count_read`."""
        return read_unit(self.files, self.index, u, self.config.text_field, self.config.on_error)

    def count_read(self, u: int, texts: list[str | None]) -> None:
        """Count unit ``u`` as read to make samples and report its skipped lines, when a lane needs it (STREAM-17)."""
        self.unit_reads += 1
        self._note_skipped(u, texts)

    def lane_entry(self, epoch: int, lane: int, snap: LaneSnapshot) -> dict[str, Any]:
        """Lane ``lane``'s snapshot as STREAM-13's JSON entry (``impl.stream_mixing`` nests it in its state)."""
        return lane_json(snap, self.windows(epoch, lane), self._starts, self.config.unit_window)

    def lane_snapshot(self, epoch: int, lane: int, value: Any) -> LaneSnapshot:
        """STREAM-13's JSON entry of lane ``lane`` back to a snapshot; ``StateError`` for a corrupt or foreign one."""
        windows = self.windows(epoch, lane)
        return snapshot_from_json(value, lane, epoch, windows, self._starts, self._counts, self.config.unit_window,
                                  lane_rows(windows))

    def lane_samples(self, lane: int) -> int:
        """Samples lane ``lane`` handed out this epoch (STREAM-11's count; ``impl.stream_loader`` orders workers by it)."""
        return int(self.lanes[lane][6])

    def worker_lanes(self, num_workers: int) -> list[list[int]]:
        return [participant_lanes(self.config.num_lanes, self.world_size, num_workers, self.rank, k)
                for k in range(max(1, num_workers))]

    @property
    def fingerprint(self) -> str:
        """sha256 of the unit index, the tokenizer and every option: what a state must match (STREAM-15)."""
        text = json.dumps([self.index.fingerprint, self.tokenizer_id, self._options()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (as RES-7)."""
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        if epoch != self.epoch:
            ahead = self._next if epoch == self.epoch + 1 else None
            self.epoch, self.lanes = int(epoch), {lane: self._fresh() for lane in self.lanes}
            self._total, self._taken, self._next, self._loaded = None, 0, None, None
            if ahead is not None:      # lanes a straddling state had in this epoch already (STREAM-22)
                self.lanes.update(ahead[0])
                self._total, self._taken = ahead[1], ahead[2]

    def _fresh(self) -> Any:
        return FRESH if self.batched_map is None else MAP_FRESH

    def lane_count(self) -> int:
        return self.config.num_lanes

    def _options(self) -> dict[str, Any]:
        """Every option that decides the samples: the config, and the map's identity when mapped (STREAM-21)."""
        options = self.config.to_json()
        return options if self.batched_map is None else dict(options, map=self.batched_map.to_json())

    # ------------------------------------------------------------ maps (STREAM-20, STREAM-21: impl.stream_maps)

    def map(self, function: Any, *, batched: bool = True, batch_size: int = 1000,
            name: str | None = None) -> StreamingDataset:
        """A new dataset whose lanes pass their rows through ``function`` in input batches (STREAM-20, STREAM-21).

        ``function({text_field: [text, ...]})`` returns a dict of equal-length
        column lists, ``input_ids`` or else ``text_field``, any number of
        outputs; the state resumes inside a batch. See :mod:`impl.stream_maps`
        (a block tokenizer as the worked example).
        """
        mapped: StreamingDataset = with_map(self, function, batched=batched, batch_size=batch_size, name=name)
        return mapped

    def __getstate__(self) -> dict[str, Any]:
        if self.batched_map is not None:
            check_picklable(self.batched_map)
        return dict(self.__dict__)

    def _cursor(self, epoch: int, lane: int, *, census: bool = False, snap: Any = None) -> Any:
        """Lane ``lane``'s cursor from its state (or ``snap``): a ``LaneCursor``, or a ``MapCursor`` when mapped."""
        rows, key = lane_rows(self.windows(epoch, lane)), buffer_key(self.config, epoch, lane)
        snap = self.lanes[lane] if snap is None else snap
        if self.batched_map is None:
            return LaneCursor(rows, key, self.config.shuffle_buffer_size, snap)
        return MapCursor(rows, key, self.config.shuffle_buffer_size, snap, lane=lane,
                         num_lanes=self.config.num_lanes, fmap=self.batched_map, text_field=self.config.text_field,
                         starts=self._starts, census=census)

    # ------------------------------------------------------------ lanes

    def windows(self, epoch: int, lane: int) -> list[np.ndarray]:
        return lane_windows(self.index, self._starts, self.config, epoch, lane)

    def lengths(self, tokens: RowTokens) -> np.ndarray:
        """Prepared length of every row (the census of STREAM-12), cached under ``index_dir`` when there is one."""
        if self._lengths is not None:
            return self._lengths
        path = None
        if self.index_dir is not None:
            name = (f"{self.index.fingerprint[:32]}-{self.tokenizer_id[:32]}-{self.config.text_field}"
                    f"{'-skip' if self.config.on_error == 'skip' else ''}.lengths.npy")
            path = os.path.join(self.index_dir, hashlib.sha256(name.encode()).hexdigest()[:40] + ".lengths.npy")
            try:
                cached = np.load(path)
                if cached.shape == (int(self._counts.sum()),):
                    self._lengths = cached.astype(np.int64)
                    return self._lengths
            except (OSError, ValueError):
                pass
        raw = np.empty(int(self._counts.sum()), np.int64)
        for u in range(len(self.index.units)):
            ids = tokens.encode(tokens.unit_texts(u, census=True))
            first = int(self._starts[u])
            raw[first:first + len(ids)] = [-1 if t is None else len(t) for t in ids]
        self._lengths = raw
        if path is not None:
            import io

            from impl._atomic import atomic_write_bytes

            buf = io.BytesIO()
            np.save(buf, raw)
            os.makedirs(self.index_dir or ".", exist_ok=True)
            atomic_write_bytes(path, buf.getvalue())
        return self._lengths

    def _remaining(self, tokens: RowTokens, epoch: int, lanes: Mapping[int, Any]) -> dict[int, int]:
        """Every lane's samples left from ``lanes`` (the census of STREAM-12)."""
        p = self.config.packing
        if self.batched_map is None:
            extra = int(p.add_bos) + int(p.add_eos)
            raw = self.lengths(tokens)
            lengths = np.where(raw < 0, 0, raw + extra)     # -1: a skipped row, dropped (STREAM-17)
            return {lane: remaining_samples(self._cursor(epoch, lane, snap=snap), lambda g: int(lengths[g]), p)
                    for lane, snap in lanes.items()}
        # A mapped lane's outputs are known only by mapping it: its total in the epoch order is counted once and
        # remembered (impl.stream_maps.census_totals); a lane resumes exactly (STREAM-21), so what is left after a
        # snapshot is that total less the snapshot's samples.
        fp, size = self.fingerprint, self.config.shuffle_buffer_size
        keys = {lane: census_key(fp, self.batched_map, lane_rows(self.windows(epoch, lane)),
                                 buffer_key(self.config, epoch, lane), size) for lane in lanes}
        totals = census_totals(keys, self._census, self.index_dir, lambda lane: (
            int(lanes[lane][6]), count_samples(self._cursor(epoch, lane, census=True, snap=lanes[lane]), tokens, p)))
        return {lane: totals[lane] - int(snap[6]) for lane, snap in lanes.items()}

    def count_lanes(self) -> None:
        """A mapped stream's census (STREAM-12) now, before DataLoader workers start: each receives the counts."""
        if self.batched_map is not None and self.world_size > 1:
            self._remaining(self.row_tokens(), self.epoch, self.lanes)

    def _steps_of(self, remaining: Mapping[int, int], num_workers: int) -> int:
        """STREAM-12: the minimum over ranks of the sum over workers of full batches."""
        B, N, W = self.batch_size, self.config.num_lanes, self.world_size
        return min(sum(sum(remaining[lane] for lane in lanes) // B
                       for lanes in (participant_lanes(N, W, num_workers, r, k) for k in range(max(1, num_workers))))
                   for r in range(W))

    def _plan(self, tokens: RowTokens, num_workers: int) -> tuple[int, dict[int, Any], list[tuple[int, list[int]]]]:
        """This pass's S (STREAM-12, fixed once per epoch, STREAM-22), a cursor per lane and the rank's schedule.

        The rank runs ``S - taken`` steps: S travels in the state, so a rank
        that was a batch ahead at a checkpoint takes one step fewer.
        """
        epoch = self.epoch
        cursors = {lane: self._cursor(epoch, lane) for lane in self.lanes}
        remaining = self._remaining(tokens, epoch, self.lanes)
        total = self._steps_of(remaining, num_workers) if self._total is None else self._total
        samples = {lane: snap[6] for lane, snap in self.lanes.items()}
        plan = schedule(self.worker_lanes(num_workers), samples, remaining, max(0, total - self._taken),
                        self.batch_size)
        return total, cursors, plan

    # ------------------------------------------------------------ iteration

    def _lazy(self, tokens: RowTokens, lanes: list[int]) -> Iterator[_Batch]:
        """One rank alone: a worker's batches, no census (STREAM-11, STREAM-12 with W = 1).

        With one rank, equal-step truncation keeps every full batch of every
        worker, so a worker fills batches until its lanes hold fewer than B
        samples; a lane leaves the rotation when it yields none (its cursor is
        then spent, and no batch carries its snapshot).
        """
        epoch, p, B = self.epoch, self.config.packing, self.batch_size
        cursors = {lane: self._cursor(epoch, lane) for lane in lanes}
        follow_lanes(tokens, cursors.values())
        alive = set(lanes)
        while True:
            rows: list[tuple[int, int, dict[str, np.ndarray]]] = []
            snaps: dict[int, Any] = {}      # each lane's state after its last sample of the batch, not after it ran dry
            while len(rows) < B and alive:
                lane = min(alive, key=lambda lane: (cursors[lane].samples, lane))
                index = cursors[lane].samples
                sample = cursors[lane].next_sample(tokens, p)
                if sample is None:
                    alive.discard(lane)
                else:
                    rows.append((lane, index, sample))
                    snaps[lane] = cursors[lane].snapshot()
            if len(rows) < B:
                return
            yield rows, tuple(sorted(snaps.items()))

    def _scheduled(self, tokens: RowTokens, num_workers: int,
                   worker: int) -> Iterator[_Batch]:
        """Several ranks: the worker's batches among the census's equal steps (STREAM-11, STREAM-12, STREAM-22)."""
        self._pass_total, cursors, plan = self._plan(tokens, num_workers)
        follow_lanes(tokens, (cursors[lane] for lane in sorted({lane for k, lanes in plan if k == worker for lane in lanes})))
        for k, lanes in plan:
            if k == worker:
                rows = []
                for lane in lanes:
                    index = cursors[lane].samples
                    sample = cursors[lane].next_sample(tokens, self.config.packing)
                    assert sample is not None, "the census counted a sample the lane does not hold"
                    rows.append((lane, index, sample))
                yield rows, tuple((lane, cursors[lane].snapshot()) for lane in sorted(set(lanes)))

    def _batches(self, num_workers: int, worker: int, *, markers: bool) -> Iterator[dict[str, Any]]:
        """Worker ``worker``'s batches of this pass, each tagged with its lanes' snapshots, then an end marker.

        ``batch[STATE_KEY]`` is ``(epoch, worker, snapshots, S)`` (S: the
        epoch's steps with several ranks, STREAM-22, else None); the marker
        is a dict holding only ``(epoch, worker, None, S)``, sent only to a
        loader that asked for it (``impl.stream_loader``), never to torch's own DataLoader.
        """
        tokens = self.row_tokens()
        self._pass_total = None
        lanes = self.worker_lanes(num_workers)[worker]
        source = (self._lazy(tokens, lanes) if self.world_size == 1 else
                  self._scheduled(tokens, num_workers, worker))
        sent: set[int] = set()
        for rows, snaps in source:
            batch: dict[str, Any] = {name: torch.from_numpy(np.stack([s[name] for _, _, s in rows]))
                                     for name in ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")}
            batch["epoch"] = torch.full((len(rows),), self.epoch, dtype=torch.int64)
            batch["lane"] = torch.tensor([lane for lane, _, _ in rows], dtype=torch.int64)
            batch["sample_index"] = torch.tensor([i for _, i, _ in rows], dtype=torch.int64)
            cu, max_seqlen = batch_cu_seqlens(batch["position_ids"].numpy(), batch["doc_ids"].numpy())
            batch["cu_seqlens"], batch["max_seqlen"] = torch.from_numpy(cu), max_seqlen
            batch[STATE_KEY] = (self.epoch, worker, snaps, self._pass_total)
            if markers:
                self._send_skipped(batch, sent)
            yield batch
        if markers:
            yield self._send_skipped({STATE_KEY: (self.epoch, worker, None, self._pass_total)}, sent)

    def _send_skipped(self, batch: dict[str, Any], sent: set[int]) -> dict[str, Any]:
        """Put the units with skipped lines this process found since the last batch under ``SKIPPED_KEY``.

        Why: a DataLoader worker counts in its own process; the loader that
        hands its batches out merges these into the dataset it holds, so
        ``skipped`` in the training process is the total over its workers.
        """
        new = {u: n for u, n in self._skipped_units.items() if u not in sent}
        if new and get_worker_info() is not None:
            batch[SKIPPED_KEY] = new
            sent.update(new)
        return batch

    def apply(self, meta: Any) -> None:
        """Record a handed-out batch: its lanes' snapshots become the state (STREAM-13), one more step of S (STREAM-22)."""
        epoch, _worker, snaps, total = meta
        if epoch == self.epoch and snaps is not None:
            for lane, snap in snaps:
                self.lanes[lane] = snap
            self._taken, self._loaded = self._taken + 1, None
            if self._total is None:
                self._total = total

    # ------------------------------------------------------------ state

    def _my_lanes(self) -> list[int]:
        return sorted(lane for lanes in self.worker_lanes(self.num_workers) for lane in lanes)

    def state_dict(self) -> dict[str, Any]:
        """The state (STREAM-13): this rank's lanes, or every lane when a process group gathers them (STREAM-14).

        With the epoch's S and this rank's steps taken (STREAM-22); with
        several ranks an S not yet fixed (no step taken) is fixed now, from
        the lane states where the epoch starts.
        """
        mine, W = self._my_lanes(), self.world_size
        epoch, lanes, total, taken = self.epoch, self.lanes, self._total, self._taken
        if self._next is not None and set(mine) <= set(self._next[0]):     # this rank is in the next epoch already
            epoch, lanes = epoch + 1, {**{lane: self._fresh() for lane in self.lanes}, **self._next[0]}
            total, taken = self._next[1], self._next[2]
            if total is None and W > 1:
                total = self._steps_of(self._remaining(self.row_tokens(), epoch, lanes), self.num_workers)
                self._next = (self._next[0], total, taken)
        elif total is None and W > 1:
            total = self._total = self._steps_of(self._remaining(self.row_tokens(), epoch, lanes), self.num_workers)
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "index": self.index.fingerprint,
                 "tokenizer": self.tokenizer_id, "options": self._options(), "epoch": epoch,
                 "lanes": {str(lane): (lane_json if self.batched_map is None else map_lane_json)(
                     lanes[lane], self.windows(epoch, lane), self._starts, self.config.unit_window)
                     for lane in mine},
                 **steps_fields((W, self.num_workers, self.batch_size), self.rank, epoch, total, taken)}
        return self.gathered(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a global state; refuse one that does not fit, naming what differs (STREAM-15, STREAM-21)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"not a streaming state (format {state.get('format') if isinstance(state, Mapping) else state!r}); "
                "pass the dict a StreamingDataset's state_dict() or merge_states returned")
        outputs = None
        if self.batched_map is not None:     # checked, and read as STREAM-13's state plus (output, made) per lane
            state, outputs = unmap_state(state, self.batched_map)
        version = state.get("version")
        require(version in (1, STATE_VERSION) and set(state) == (V1_KEYS if version == 1 else STATE_KEYS),
                StateError, f"state version {version!r} with keys {sorted(state)} is not version {STATE_VERSION} with "
                f"{sorted(STATE_KEYS)} (or 1 without 'topology' and 'ranks'); pass the dict state_dict() returned, "
                "unchanged")
        differs = []
        if state["index"] != self.index.fingerprint:
            differs.append(describe_change(self.index_dir, state["index"], self.index))
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
        epoch, lanes = state["epoch"], state["lanes"]
        require(is_int(epoch) and epoch >= 0, StateError, f"epoch={epoch!r} must be an integer >= 0")
        wanted = [str(lane) for lane in range(self.config.num_lanes)]
        require(isinstance(lanes, Mapping) and sorted(lanes, key=str) == sorted(wanted), StateError,
                f"state holds lanes {sorted(lanes) if isinstance(lanes, Mapping) else lanes!r} of "
                f"{self.config.num_lanes}: a rank's state holds its own lanes; combine every rank's state_dict() "
                "with merge_states and load the result")
        header = {"epoch": int(epoch)} if version == 1 else {k: state[k] for k in ("epoch", "topology", "ranks")}
        lane_epochs = self._resume(header, None)
        loaded = {}
        for key, value in lanes.items():
            lane = int(key)
            windows = self.windows(lane_epochs[lane], lane)
            loaded[lane] = snapshot_from_json(value, lane, lane_epochs[lane], windows, self._starts, self._counts,
                                              self.config.unit_window, lane_rows(windows))
        self._resume(header, loaded if outputs is None else map_snapshots(loaded, outputs))

    def __repr__(self) -> str:
        mapped = "" if self.batched_map is None else f", map={self.batched_map.identity!r}"
        return (f"StreamingDataset({len(self.index.files)} files, {len(self.index.units)} units, "
                f"seq_len={self.config.packing.seq_len}, num_lanes={self.config.num_lanes}{mapped}, epoch={self.epoch})")

