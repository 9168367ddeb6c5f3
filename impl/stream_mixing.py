"""StreamMixture: streaming sources and token stores mixed in lanes, with an exact, elastic state (MIX-22 .. MIX-25).

Conforms to MIX-22 .. MIX-25 (docs/SEMANTICS.md, "Mixing") and, for its
lanes, batches and state, to STREAM-10 .. STREAM-14; its model is
``reference.stream_mixing.StreamMixReferenceLoader``: for the same sources,
config and topology the batches are the reference's, sample for sample, and
``state_dict()`` is the reference's JSON.

Why a dataset of its own: a planned mixture (``impl.mixed_dataset``) needs
every source's sample count per epoch, which a streaming source learns only
by tokenizing all of it. This mixture is itself a streaming source of N
lanes: lane l draws, per attempt, which source's lane l gives its next
sample (a store's samples ``l, l + N, ...`` of its epoch, a
:class:`~impl.streaming.StreamingDataset`'s lane l). ``MixedDataset`` builds
one when any of its sources is a ``StreamingDataset``, so one constructor
covers both; :func:`impl.loader.build_dataloader` hands it to
:class:`impl.stream_loader.StreamingLoader`, as a streaming dataset.

Each batch is a dict of int64 tensors ``input_ids``, ``labels``,
``position_ids``, ``doc_ids``, ``token_offsets`` ``[B, seq_len]`` (doc ids
are each source's own), ``epoch``, ``lane``, ``sample_index`` (the sample's
index in its mixture lane), ``source``, ``source_index`` (a store's sample
index, a stream's index in its lane) ``[B]``, plus ``cu_seqlens`` /
``max_seqlen``.

    mixed = MixedDataset([web_store_ds, code_stream_ds], weights=(0.7, 0.3), stopping="all_exhausted", seed=1)
    loader = build_dataloader(mixed, batch_size=8, rank=rank, world_size=2, num_workers=2)
    for batch in loader:
        train(batch)
    saved = json.dumps(merge_states(gather(mixed.state_dict())))   # loads on any W dividing the lanes
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from impl.collation import batch_cu_seqlens
from impl.errors import ConfigError, StateError, is_int, require
from impl.mixing import check_distinct_sources
from impl.partition import distributed_topology
from impl.rng import Stream, derive_key, subkey, unit
from impl.schema import BATCH_FIELDS
from impl.stream_lanes import (
    FRESH,
    STATE_KEY,
    LaneBatches,
    LaneCursor,
    LaneSnapshot,
    buffer_key,
    lane_rows,
    participant_lanes,
    remaining_samples,
    schedule,
)
from impl.stream_steps import steps_fields
from impl.streaming import StreamingDataset
from reference.stream_mixing import (
    STATE_FORMAT,
    STATE_KEYS,
    STATE_VERSION,
    V1_KEYS,
    StreamMixConfig,
    mismatches,
    planned_options_refused,
)

__all__ = ["StreamMixture"]

LANE_KEYS = frozenset({"attempts", "exhausted", "samples", "sources"})
_DRAWS = 256
MixSnapshot = tuple[int, tuple[bool, ...], int, tuple[Any, ...]]
"""``(attempts, exhausted, samples, positions)``; a store's position an int, a stream's a ``LaneSnapshot``."""


def _choose(weights: Sequence[float], u: float) -> int:
    """MIX-3: the first i with ``u < c_i / c_last``, c summed left to right; the last positive weight otherwise."""
    running, cumulative = 0.0, []
    for w in weights:
        running += w
        cumulative.append(running)
    for i, c in enumerate(cumulative):
        if u < c / running:
            return i
    return max(i for i, w in enumerate(weights) if w > 0)


class _Draws:
    """A lane's unit draws ``unit(key, t)``, computed a block at a time."""

    def __init__(self, key: int) -> None:
        self.key, self.first, self.values = key, 0, np.empty(0)

    def __call__(self, t: int) -> float:
        i = t - self.first
        if not 0 <= i < len(self.values):
            self.first, self.values, i = t, unit(self.key, np.arange(t, t + _DRAWS, dtype=np.uint64)), 0
        return float(self.values[i])


def _walk(mix: StreamMixture, draws: _Draws, attempts: int, exhausted: list[bool],
          has_next: Any) -> tuple[int, int] | None:
    """MIX-23's attempts from ``attempts``: ``(source, attempts after)`` of the next source that gives a sample.

    ``has_next(i)`` takes source i's next sample (True) or says it has none
    (False); ``exhausted`` is updated in place.
    """
    weights = mix.config.weights
    while True:
        live = [0.0 if exhausted[i] else float(w) for i, w in enumerate(weights)]
        if not any(live):
            return None
        i = _choose(live, draws(attempts))
        attempts += 1
        if has_next(i):
            return i, attempts
        if mix.config.stopping == "first_exhausted":
            return None
        exhausted[i] = True


class _Lane:
    """A mixture lane's position: attempts, exhausted sources, samples, and a store int or a ``LaneCursor`` per source."""

    def __init__(self, mix: StreamMixture, epoch: int, lane: int, snap: MixSnapshot,
                 tokens: dict[int, Any]) -> None:
        self.mix, self.epoch, self.lane, self.tokens = mix, epoch, lane, tokens
        self.attempts, exhausted, self.samples, positions = snap
        self.exhausted = list(exhausted)
        self.draws = _Draws(subkey(derive_key(mix.config.seed, epoch, Stream.MIX), lane))
        self.positions: list[Any] = [mix.cursor(i, epoch, lane, p) if mix.is_stream[i] else p
                                     for i, p in enumerate(positions)]
        self._got: tuple[int, dict[str, np.ndarray]] | None = None

    def snapshot(self) -> MixSnapshot:
        return (self.attempts, tuple(self.exhausted), self.samples,
                tuple(p.snapshot() if isinstance(p, LaneCursor) else p for p in self.positions))

    def _take(self, i: int) -> bool:
        position, mix = self.positions[i], self.mix
        if isinstance(position, LaneCursor):
            index, before = position.samples, position.snapshot()
            sample = position.next_sample(self.tokens[i], mix.sources[i].config.packing)
            if sample is None:      # a spent cursor: keep the position after the source's last sample (MIX-24)
                self.positions[i] = mix.cursor(i, self.epoch, self.lane, before)
                return False
            self._got = (index, sample)
            return True
        index = self.lane + position * mix.num_lanes
        if index >= mix.sources[i].num_samples(self.epoch):
            return False
        self._got = (index, mix.sources[i].sample(self.epoch, index))
        self.positions[i] = position + 1
        return True

    def next(self) -> tuple[int, int, dict[str, np.ndarray]] | None:
        """The lane's next ``(source, source_index, sample)``; None at its end (the lane is then spent) (MIX-23)."""
        exhausted = list(self.exhausted)
        step = _walk(self.mix, self.draws, self.attempts, exhausted, self._take)
        if step is None:        # the lane's end: its state stays that after its last sample
            return None
        self.exhausted = exhausted
        self.attempts = step[1]
        self.samples += 1
        assert self._got is not None
        index, sample = self._got
        return step[0], index, sample


class StreamMixture(LaneBatches):
    """Batches of a mixture of ``StreamingDataset`` and ``PackedDataset`` sources, equal to the reference's (MIX-22..25).

    ``weights``: one positive weight per source (required: every sample is
    drawn by weight); ``stopping``: ``first_exhausted`` or ``all_exhausted``
    per lane (MIX-23); ``seed`` keys the draws. The lanes are the streaming
    sources' ``num_lanes`` (equal for all). ``batch_size``, ``rank``,
    ``world_size``, ``num_workers`` as :class:`~impl.streaming.StreamingDataset`'s
    (set by ``build_dataloader``). ``allow_repeat`` as ``MixedDataset``'s (MIX-17).
    """

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None, stopping: str = "first_exhausted",
                 seed: int = 0, epoch: int = 0, allow_repeat: bool = False, batch_size: int = 1,
                 rank: int | None = None, world_size: int | None = None, num_workers: int = 0) -> None:
        super().__init__()
        require(isinstance(sources, (list, tuple)) and len(sources) >= 1, ConfigError,
                f"sources={sources!r} must be a non-empty list of datasets")
        self.config = StreamMixConfig(weights=None if weights is None else tuple(weights),  # type: ignore[arg-type]
                                      stopping=stopping, seed=seed)
        self.sources = list(sources)
        require(len(self.config.weights) == len(self.sources), ConfigError,
                f"weights has {len(self.config.weights)} entries but there are {len(self.sources)} sources; pass one "
                "weight per source")
        self.is_stream = [isinstance(s, StreamingDataset) for s in self.sources]
        for i, s in enumerate(self.sources):
            require(self.is_stream[i] or all(hasattr(s, a) for a in ("num_samples", "sample", "config", "fingerprint")),
                    ConfigError, f"sources[{i}] ({type(s).__name__}) is neither a StreamingDataset nor a "
                    "PackedDataset; pass one of those")
        streams = [i for i, x in enumerate(self.is_stream) if x]
        require(bool(streams), ConfigError, "no source is a streaming source: a mixture takes its lanes from its "
                "streaming sources; mix token stores alone with a planned mixture (MIX-13)")
        self.num_lanes = int(self.sources[streams[0]].config.num_lanes)
        for i in streams:
            n = self.sources[i].config.num_lanes
            require(n == self.num_lanes, ConfigError,
                    f"sources[{i}] has num_lanes={n} but sources[{streams[0]}] has {self.num_lanes}: lane l of the "
                    "mixture reads lane l of every streaming source; give them all the same num_lanes")
        packings = [s.config.packing for s in self.sources]
        for i, p in enumerate(packings):
            require((p.seq_len, p.pad_id) == (packings[0].seq_len, packings[0].pad_id), ConfigError,
                    f"sources[{i}] packs seq_len={p.seq_len}, pad_id={p.pad_id} but sources[0] packs "
                    f"seq_len={packings[0].seq_len}, pad_id={packings[0].pad_id}: every source must pack to one shape")
        require(isinstance(allow_repeat, bool), ConfigError, f"allow_repeat={allow_repeat!r} must be True or False")
        if not allow_repeat:
            check_distinct_sources(self.sources)
        require(is_int(batch_size) and batch_size >= 1, ConfigError, f"batch_size={batch_size!r} must be >= 1")
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self.batch_size, self.epoch = batch_size, int(epoch)
        self.parts = {"sources": [str(s.fingerprint) for s in self.sources],
                      "weights": [float(w) for w in self.config.weights], "stopping": self.config.stopping,
                      "seed": self.config.seed, "num_lanes": self.num_lanes}
        self.rank, self.world_size = distributed_topology(rank, world_size)
        self.set_topology(self.rank, self.world_size, num_workers)
        self.lanes: dict[int, MixSnapshot] = {lane: self._fresh() for lane in range(self.num_lanes)}
        #: S of this epoch once fixed, the steps this rank took of it, and a straddling state's epoch + 1 (STREAM-22).
        self._total: int | None = None
        self._taken = 0
        self._next: tuple[dict[int, Any], int | None, int] | None = None
        self._loaded: tuple[Mapping[str, Any], dict[int, Any]] | None = None     # re-resolved by set_topology
        self._pass_total: int | None = None     # S of the pass this process runs, sent with its batches
        self._markers = False     # set by impl.stream_loader: its workers end their pass with a marker

    @classmethod
    def from_mixed_dataset_args(cls, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                                stopping: str = "first_exhausted", seed: int = 0, weight_fn: Any = None,
                                end: str = "drop_last", epoch: int = 0, streams: Any = None, epoch_size: Any = None,
                                batching_method: str = "random", global_batch_size: Any = None,
                                device_batch_size: Any = None, allow_repeat: bool = False,
                                cache_dir: Any = None) -> StreamMixture:
        """``MixedDataset``'s arguments, refusing those of a planned mixture with the fix (MIX-25)."""
        planned_options_refused(weight_fn=weight_fn, streams=streams, epoch_size=epoch_size,
                                batching_method=batching_method, global_batch_size=global_batch_size,
                                device_batch_size=device_batch_size, end=end)
        require(cache_dir is None, ConfigError,
                f"cache_dir={cache_dir!r} caches a planned mixture's plan; a mixture with a streaming source has none "
                "(its lanes are drawn as they stream); leave cache_dir out")
        return cls(sources, weights=weights, stopping=stopping, seed=seed, epoch=epoch, allow_repeat=allow_repeat)

    def lane_count(self) -> int:
        return self.num_lanes

    def _fresh(self) -> MixSnapshot:
        return (0, (False,) * len(self.sources), 0, tuple(FRESH if x else 0 for x in self.is_stream))

    # ------------------------------------------------------------ topology and lanes

    def set_topology(self, rank: int, world_size: int, num_workers: int) -> None:
        """Who runs which lanes (STREAM-10); a world size whose ranks × workers do not divide the lanes is refused."""
        require(is_int(num_workers) and num_workers >= 0, ConfigError, f"num_workers={num_workers!r} must be >= 0")
        participant_lanes(self.num_lanes, world_size, num_workers, rank, 0)
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        loaded = getattr(self, "_loaded", None)
        if loaded is not None:     # a state loaded before: resumed on this topology (STREAM-22)
            self._resume(*loaded)

    def worker_lanes(self, num_workers: int) -> list[list[int]]:
        return [participant_lanes(self.num_lanes, self.world_size, num_workers, self.rank, k)
                for k in range(max(1, num_workers))]

    def lane_samples(self, lane: int) -> int:
        """Samples lane ``lane`` handed out this epoch (STREAM-11's count)."""
        return self.lanes[lane][2]

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

    def cursor(self, i: int, epoch: int, lane: int, snap: LaneSnapshot) -> LaneCursor:
        ds = self.sources[i]
        return LaneCursor(lane_rows(ds.windows(epoch, lane)), buffer_key(ds.config, epoch, lane),
                          ds.config.shuffle_buffer_size, snap)

    def _store_lane_size(self, i: int, epoch: int, lane: int) -> int:
        return max(0, -(-(int(self.sources[i].num_samples(epoch)) - lane) // self.num_lanes))

    def _remaining(self, tokens: dict[int, Any], epoch: int | None = None,
                   lanes: Mapping[int, MixSnapshot] | None = None) -> dict[int, int]:
        """Each lane's samples left (STREAM-12's census): every source's lane count, then MIX-23's draws over counts."""
        epoch, out = self.epoch if epoch is None else epoch, {}
        lengths = {}
        for i in (i for i, x in enumerate(self.is_stream) if x):
            p = self.sources[i].config.packing
            raw = self.sources[i].lengths(tokens[i])
            lengths[i] = np.where(raw < 0, 0, raw + int(p.add_bos) + int(p.add_eos))
        for lane, (attempts, exhausted, _samples, positions) in (self.lanes if lanes is None else lanes).items():
            left = []
            for i, p in enumerate(positions):
                if self.is_stream[i]:
                    left.append(remaining_samples(self.cursor(i, epoch, lane, p), lengths[i].item,
                                                  self.sources[i].config.packing))
                else:
                    left.append(self._store_lane_size(i, epoch, lane) - p)
            draws = _Draws(subkey(derive_key(self.config.seed, epoch, Stream.MIX), lane))
            flags, count = list(exhausted), 0

            def take(i: int, left: list[int] = left) -> bool:
                if left[i] == 0:
                    return False
                left[i] -= 1
                return True

            while (step := _walk(self, draws, attempts, flags, take)) is not None:
                attempts, count = step[1], count + 1
            out[lane] = count
        return out

    # ------------------------------------------------------------ iteration

    def _rows(self, num_workers: int, worker: int, tokens: dict[int, Any]) -> Iterator[tuple[list[Any], Any]]:
        """The worker's batches of rows ``(lane, index, source, source_index, sample)`` and their lanes' snapshots."""
        B, epoch = self.batch_size, self.epoch
        lanes = self.worker_lanes(num_workers)[worker]
        cursors = {lane: _Lane(self, epoch, lane, self.lanes[lane], tokens) for lane in lanes}
        if self.world_size == 1:     # one rank keeps every full batch: no census (STREAM-12 with W = 1)
            alive = set(lanes)
            while True:
                rows: list[Any] = []
                while len(rows) < B and alive:
                    lane = min(alive, key=lambda lane: (cursors[lane].samples, lane))
                    index = cursors[lane].samples
                    got = cursors[lane].next()
                    if got is None:
                        alive.discard(lane)
                    else:
                        rows.append((lane, index, *got))
                if len(rows) < B:
                    return
                yield rows, tuple((lane, cursors[lane].snapshot()) for lane in sorted({r[0] for r in rows}))
        remaining = self._remaining(tokens)
        total = self._steps_of(remaining, num_workers) if self._total is None else self._total
        self._pass_total = total     # S travels in the state: a rank that was ahead takes fewer (STREAM-22)
        samples = {lane: snap[2] for lane, snap in self.lanes.items()}
        for k, picked in schedule(self.worker_lanes(num_workers), samples, remaining, max(0, total - self._taken), B):
            if k == worker:
                rows = []
                for lane in picked:
                    index = cursors[lane].samples
                    got = cursors[lane].next()
                    assert got is not None, "the census counted a sample the lane does not hold"
                    rows.append((lane, index, *got))
                yield rows, tuple((lane, cursors[lane].snapshot()) for lane in sorted(set(picked)))

    def _steps_of(self, remaining: Mapping[int, int], num_workers: int) -> int:
        """STREAM-12: the minimum over ranks of the sum over workers of full batches."""
        N, W, B = self.num_lanes, self.world_size, self.batch_size
        return min(sum(sum(remaining[lane] for lane in participant_lanes(N, W, num_workers, r, k)) // B
                       for k in range(max(1, num_workers))) for r in range(W))

    def _batches(self, num_workers: int, worker: int, *, markers: bool) -> Iterator[dict[str, Any]]:
        """Worker ``worker``'s batches of this pass, each tagged ``(epoch, worker, snapshots, S)``, then an end marker."""
        tokens = {i: s.row_tokens() for i, s in enumerate(self.sources) if self.is_stream[i]}
        self._pass_total = None
        for rows, snaps in self._rows(num_workers, worker, tokens):
            batch: dict[str, Any] = {name: torch.from_numpy(np.stack([np.asarray(r[4][name], np.int64) for r in rows]))
                                     for name in BATCH_FIELDS}
            batch["epoch"] = torch.full((len(rows),), self.epoch, dtype=torch.int64)
            for j, name in enumerate(("lane", "sample_index", "source", "source_index")):
                batch[name] = torch.tensor([r[j] for r in rows], dtype=torch.int64)
            cu, max_seqlen = batch_cu_seqlens(batch["position_ids"].numpy(), batch["doc_ids"].numpy())
            batch["cu_seqlens"], batch["max_seqlen"] = torch.from_numpy(cu), max_seqlen
            batch[STATE_KEY] = (self.epoch, worker, snaps, self._pass_total)
            yield batch
        if markers:
            yield {STATE_KEY: (self.epoch, worker, None, self._pass_total)}

    def apply(self, meta: Any) -> None:
        """Record a handed-out batch: its lanes' snapshots become the state (MIX-24), one more step of S (STREAM-22)."""
        epoch, _worker, snaps, total = meta
        if epoch == self.epoch and snaps is not None:
            for lane, snap in snaps:
                self.lanes[lane] = snap
            self._taken, self._loaded = self._taken + 1, None
            if self._total is None:
                self._total = total

    # ------------------------------------------------------------ state

    def _lane_json(self, lane: int, snap: MixSnapshot, epoch: int) -> dict[str, Any]:
        attempts, exhausted, samples, positions = snap
        sources = []
        for i, p in enumerate(positions):
            if self.is_stream[i]:
                sources.append(self.sources[i].lane_entry(epoch, lane, p))
            else:
                sources.append(p)
        return {"attempts": attempts, "exhausted": list(exhausted), "samples": samples, "sources": sources}

    def _lane_from_json(self, lane: int, epoch: int, value: Any) -> MixSnapshot:
        k = len(self.sources)
        require(isinstance(value, Mapping) and set(value) == LANE_KEYS, StateError,
                f"lane {lane} state must hold exactly {sorted(LANE_KEYS)}; pass the dict state_dict() returned, "
                "unchanged")
        for name in ("attempts", "samples"):
            require(is_int(value[name]) and value[name] >= 0, StateError,
                    f"lane {lane} {name}={value[name]!r} must be a non-negative integer: the state is corrupt")
        exhausted, entries = value["exhausted"], value["sources"]
        require(isinstance(exhausted, list) and len(exhausted) == k and all(isinstance(x, bool) for x in exhausted)
                and isinstance(entries, list) and len(entries) == k, StateError,
                f"lane {lane} must hold {k} exhausted flags and {k} source positions: the state is corrupt")
        positions: list[Any] = []
        for i, entry in enumerate(entries):
            ds = self.sources[i]
            if self.is_stream[i]:
                positions.append(ds.lane_snapshot(epoch, lane, entry))
            else:
                size = self._store_lane_size(i, epoch, lane)
                require(is_int(entry) and 0 <= entry <= size, StateError,
                        f"lane {lane} source {i} position {entry!r} is outside its {size} lane samples in epoch "
                        f"{epoch}: the state belongs to other data; start from a fresh state")
                positions.append(int(entry))
        return (value["attempts"], tuple(exhausted), value["samples"], tuple(positions))

    def state_dict(self) -> dict[str, Any]:
        """The state (MIX-24): this rank's lanes, or every lane when a process group gathers them (STREAM-14)."""
        mine = sorted(lane for lanes in self.worker_lanes(self.num_workers) for lane in lanes)
        epoch, lanes, total, taken, W = self.epoch, self.lanes, self._total, self._taken, self.world_size
        census = None
        if self._next is not None and set(mine) <= set(self._next[0]):     # this rank is in the next epoch already
            epoch, lanes = epoch + 1, {**{lane: self._fresh() for lane in self.lanes}, **self._next[0]}
            total, taken = self._next[1], self._next[2]
        if total is None and W > 1:     # S not fixed yet (no step taken): fixed now, from the lanes (STREAM-22)
            tokens = {i: s.row_tokens() for i, s in enumerate(self.sources) if self.is_stream[i]}
            census = total = self._steps_of(self._remaining(tokens, epoch, lanes), self.num_workers)
            if epoch == self.epoch:
                self._total = census
            elif self._next is not None:
                self._next = (self._next[0], census, taken)
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "parts": self.parts, "epoch": epoch,
                 "lanes": {str(lane): self._lane_json(lane, lanes[lane], epoch) for lane in mine},
                 **steps_fields((W, self.num_workers, self.batch_size), self.rank, epoch, total, taken)}
        return self.gathered(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a global state; refuse one of another mixture, naming each part that differs (MIX-24)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"not a stream mixture state (format {state.get('format') if isinstance(state, Mapping) else state!r});"
                " pass the dict state_dict() or merge_states returned")
        version = state.get("version")
        require(version in (1, STATE_VERSION) and set(state) == (V1_KEYS if version == 1 else STATE_KEYS),
                StateError, f"state version {version!r} with keys {sorted(state)} is not version {STATE_VERSION} with "
                f"{sorted(STATE_KEYS)} (or 1 without 'topology' and 'ranks'); pass the dict state_dict() returned, "
                "unchanged")
        differs = mismatches(state["parts"], self.parts)
        require(not differs, StateError, "the checkpoint differs from this mixture in " + "; ".join(differs) +
                ": resume with the sources, weights and options it was taken with, or start from a fresh state")
        epoch, lanes = state["epoch"], state["lanes"]
        require(is_int(epoch) and epoch >= 0, StateError, f"epoch={epoch!r} must be an integer >= 0")
        wanted = sorted(str(lane) for lane in range(self.num_lanes))
        require(isinstance(lanes, Mapping) and sorted(lanes) == wanted, StateError,
                f"state holds lanes {sorted(lanes) if isinstance(lanes, Mapping) else lanes!r} of {self.num_lanes}: "
                "a rank's state holds its own lanes; combine every rank's state_dict() with merge_states and load "
                "the result")
        header = {"epoch": int(epoch)} if version == 1 else {k: state[k] for k in ("epoch", "topology", "ranks")}
        lane_epochs = self._resume(header, None)
        self._resume(header, {int(k): self._lane_from_json(int(k), lane_epochs[int(k)], v) for k, v in lanes.items()})

    def __repr__(self) -> str:
        return (f"StreamMixture({len(self.sources)} sources, weights={self.config.weights}, "
                f"stopping={self.config.stopping!r}, num_lanes={self.num_lanes}, epoch={self.epoch})")
