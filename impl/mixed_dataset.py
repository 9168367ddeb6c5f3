"""MixedDataset: several sources mixed at sample level, any sample of any epoch by random access.

Conforms to MIX-13, MIX-14, MIX-16 (a loader's topology) and MIX-19, to MIX-17
and MIX-18 through ``impl.mixing``'s checks (docs/SEMANTICS.md, "Mixing"), and,
as the dataset behind ``impl.loader``, to RES-1..RES-7: ``MixedDataset.samples(e,
i)`` is field for field ``reference.resume.mixture_samples(corpora, config, e)[i]``.
Which sample of which source is mixed sample ``i`` is the epoch's plan
(``impl.mixing.mix_plan``, or ``impl.streams.stream_plan`` for streams); this
module reads those samples from the sources and fills batches.
``interleave_datasets`` (:mod:`impl.interleave`) builds one from Hugging Face /
Forgather arguments.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import torch
from torch.utils.data import Dataset

from impl._arrays import distinct_ints
from impl.collation import SampleBatch, batch_cu_seqlens
from impl.dataset import PackedDataset
from impl.epoch_cell import SharedEpoch
from impl.errors import ConfigError, TopologyError, is_integer, require
from impl.fill import fill_batch
from impl.keys import SampleKey, resolve_key, resolve_keys
from impl.mixed_pieces import PIECE_BLOCK, MixedPieces
from impl.mixing import MixPlan, balance_remaining, check_distinct_sources, check_mixture_weights, mix_plan
from impl.plan_cache import PlanCache, mix_plan_key, plan_cache_dir
from impl.predownload import Reader, check_predownload, check_readers, mixture_reads, run_ahead
from impl.schema import BATCH_FIELDS as FIELDS
from impl.schema import padding_rows
from impl.streams import check_batching, stream_plan
from reference.mixing import STOPPING_STRATEGIES, MixConfig, WeightFn
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
from reference.streams import StreamConfig

__all__ = ["MixedDataset", "SampleKey"]

_I64 = np.int64


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
    kept in memory, and each is cached on disk as a ``PackedDataset``'s is:
    ``impl.plan_cache``, keyed by ``plan_key``, so a resuming process or a
    worker reads it instead of computing it). ``cache_dir`` as
    ``PackedDataset``'s: ``None`` caches in the first source's store's
    ``.plans`` (else the user cache), a path caches there, ``False`` keeps
    plans in memory only. ``predownload`` as ``PackedDataset``'s, counted
    in the mixture's samples (each read from its source's remote store).

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

    Files: the mixture holds its sources; :meth:`close` (or the end of a
    ``with`` block) unmaps its cached plans and closes every source that
    has a ``close()`` (a ``PackedDataset`` opened from a path closes its
    store), so a mixture rebuilt at a resume leaves no file open. A source
    shared with another dataset that outlives the mixture: close the
    mixture only when that one is done too.

    >>> mixed = MixedDataset([web, code], weights=(0.7, 0.3), stopping="all_exhausted", seed=1)   # doctest: +SKIP
    >>> loader = build_dataloader(mixed, batch_size=8, rank=rank, world_size=world)              # doctest: +SKIP
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """A ``StreamMixture`` when a source is a ``StreamingDataset``: lanes, not a plan (MIX-22, ``impl.stream_mixing``)."""
        from impl.streaming import StreamingDataset

        sources = args[0] if args else kwargs.get("sources")
        if isinstance(sources, (list, tuple)) and any(isinstance(s, StreamingDataset) for s in sources):
            from impl.stream_mixing import StreamMixture

            return StreamMixture.from_mixed_dataset_args(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                 stopping: str = "first_exhausted", seed: int = 0, weight_fn: WeightFn | None = None,
                 end: str = "drop_last", epoch: int = 0, streams: Sequence[StreamConfig] | None = None,
                 epoch_size: int | None = None, batching_method: str = "random", global_batch_size: int | None = None,
                 device_batch_size: int | None = None, allow_repeat: bool = False,
                 cache_dir: str | os.PathLike[str] | None | bool = None, predownload: int | None = None) -> None:
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
        require(streams is not None or (epoch_size is None and batching_method == "random" and global_batch_size is None
                                        and device_batch_size is None), ConfigError,
                "epoch_size, batching_method and the batch sizes apply to streams; pass "
                "streams=[StreamConfig(...), ...] with them")
        if streams is not None:
            global_batch_size, device_batch_size = check_batching(batching_method, global_batch_size,
                                                                  device_batch_size)
        self.global_batch_size = global_batch_size
        self.device_batch_size = device_batch_size
        sizes = {k: v for k, v in (("global_batch_size", global_batch_size), ("device_batch_size", device_batch_size))
                 if v is not None}
        if weight_fn is None:
            check_mixture_weights(self.mix_config)
        self.end = end
        self.epoch = int(epoch)
        #: Samples each reader downloads ahead from remote stores (:mod:`impl.predownload`): the mixture's own
        #: samples, each read from its source's store; not in the config (it changes no sample).
        self.predownload = check_predownload(predownload)
        self.reader: Reader | None = None
        prints = [_fingerprint_of(s, i) for i, s in enumerate(self.sources)]
        require(isinstance(allow_repeat, bool), ConfigError, f"allow_repeat={allow_repeat!r} must be True or False")
        self.allow_repeat = allow_repeat
        if not allow_repeat:
            check_distinct_sources(self.sources)
        configs = [getattr(s, "config", None) for s in self.sources]
        if all(c is not None and hasattr(c, "packing") for c in configs):
            self.config: MixtureConfig | None = MixtureConfig(
                sources=tuple(configs), mixing=self.mix_config, end=end, weight_fn=weight_fn,  # type: ignore[arg-type]
                streams=self.streams, epoch_size=epoch_size, batching_method=batching_method,
                global_batch_size=global_batch_size, device_batch_size=device_batch_size, allow_repeat=allow_repeat)
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
                                                   "epoch_size": epoch_size, "batching_method": batching_method,
                                                   **sizes}}
            self.fingerprint = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
            self.fingerprint_parts = {f"source_{i}_data": part_hash(p) for i, p in enumerate(prints)}
            self.fingerprint_parts.update(mixture_level_parts(
                {"weights": self.mix_config.weights, "stopping": stopping, "seed": seed}, end, _name(weight_fn),
                None if streams is None else {"streams": [dataclasses.asdict(x) for x in streams],
                                              "epoch_size": epoch_size, "batching_method": batching_method, **sizes}))
            self._pad = None
        self._source_prints = prints
        self._plan_cache = PlanCache(plan_cache_dir(cache_dir, _first_store_path(self.sources)))
        self._plans: collections.OrderedDict[int, MixPlan] = collections.OrderedDict()
        self._shape = self._check_shapes()
        self._packing = _shared_packing(self.sources)
        self._pieces = MixedPieces(self.sources, PIECE_BLOCK)
        self._ahead_memo: collections.OrderedDict[tuple[int, int], list[tuple[Any, str]]] = collections.OrderedDict()

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
        state["_ahead_memo"] = collections.OrderedDict()
        return state

    # ------------------------------------------------------------ files

    def close(self) -> None:
        """Unmap the cached plans and close every source that has a ``close()`` (idempotent if theirs are)."""
        self._plans = collections.OrderedDict()
        self._ahead_memo = collections.OrderedDict()
        self._pieces = MixedPieces(self.sources, PIECE_BLOCK)   # drops the sources' concatenated token source
        for source in self.sources:
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            sizes = self.source_sizes(epoch)
            key = self.plan_key(epoch, sizes)
            if key is None:
                plan = self.compute_plan(epoch, sizes)
            else:
                plan = self._plan_cache.load_or_compute_mix(
                    key, sizes, lambda: self.compute_plan(epoch, sizes),
                    {"epoch": epoch, "source_sizes": sizes, "mixture_fingerprint": self.fingerprint})
            self._plans[epoch] = plan
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(epoch)
        return plan

    def compute_plan(self, epoch: int, sizes: Sequence[int]) -> MixPlan:
        """Epoch ``epoch``'s plan computed now (no cache): ``stream_plan`` for streams, else ``mix_plan``."""
        if self.streams is not None:
            return stream_plan(sizes, self.streams, self.mix_config.seed, epoch, epoch_size=self.epoch_size,
                               batching_method=self.batching_method, global_batch_size=self.global_batch_size,
                               device_batch_size=self.device_batch_size)
        return mix_plan(sizes, self.mix_config, epoch, weight_fn=self.weight_fn)

    def plan_key(self, epoch: int, sizes: Sequence[int]) -> str | None:
        """sha256 naming epoch ``epoch``'s cached plan (``impl.plan_cache.mix_plan_key``); None: not cached.

        A ``weight_fn`` other than ``balance_remaining`` is arbitrary code
        (its name does not say what it computes), so its plans are never
        cached.
        """
        if self.weight_fn is not None and self.weight_fn is not balance_remaining:
            return None
        m = self.mix_config
        return mix_plan_key(source_fingerprints=self._source_prints, source_sizes=sizes, epoch=epoch,
                            weights=m.weights, stopping=m.stopping, seed=m.seed,
                            weight_fn=None if self.weight_fn is None else "impl.mixing.balance_remaining",
                            streams=None if self.streams is None else [dataclasses.asdict(x) for x in self.streams],
                            epoch_size=self.epoch_size, batching_method=self.batching_method,
                            global_batch_size=self.global_batch_size, device_batch_size=self.device_batch_size)

    def num_samples(self, epoch: int) -> int:
        return len(self.plan(epoch).source)

    def check_partition(self, groups: int, batch_size: int) -> None:
        """Refuse a loader whose step is not the batch the batching method composed (MIX-16; TopologyError).

        ``groups`` is ``world_size // replication``, ``batch_size`` a rank's;
        ``impl.loader.build_dataloader`` asks. Another world size with the same
        global (and device) batch size resumes exactly.
        """
        g, b = self.global_batch_size, self.device_batch_size
        if self.batching_method == "random" or g is None:
            return
        step = groups * batch_size
        hint = f"pass batch_size={g // groups} on these {groups} data-parallel groups, or " if g % groups == 0 else ""
        require(step == g, TopologyError,
                f"this topology's global batch is world_size // replication x batch_size = {groups} x {batch_size} = "
                f"{step}, but the mixture composes global batches of global_batch_size={g} "
                f"(batching_method={self.batching_method!r}); {hint}build the mixture with global_batch_size={step} "
                "(another fingerprint: its checkpoints do not load here)")
        if b is None:
            return
        require(batch_size == b, TopologyError,
                f"batch_size={batch_size} but the mixture composes device batches of device_batch_size={b} "
                f"(batching_method={self.batching_method!r}); pass batch_size={b} on {g // b} data-parallel groups "
                f"(world_size // replication), or build the mixture with device_batch_size={batch_size} "
                "(another fingerprint)")

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

    # ------------------------------------------------------------ predownload (remote stores)

    def set_reader(self, reader: Reader | None) -> None:
        """Say who reads this mixture (``build_dataloader`` does): its next samples follow from each batch's keys."""
        self.reader = reader

    def check_readers(self, workers: int) -> None:
        """Refuse a remote source store's ``cache_limit`` too small for the node's ranks x ``workers`` readers."""
        check_readers([s.store for s in self.sources if hasattr(s, "store")], workers)

    def sample_reads(self, epoch: int, indices: np.ndarray) -> list[list[tuple[Any, str]]]:
        """The files each mixed sample of ``indices`` reads, in read order (:func:`impl.predownload.mixture_reads`)."""
        return mixture_reads(self, epoch, indices)

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

    def _packed_batch(self, epochs: np.ndarray, indices: np.ndarray, packing: PackingConfig) -> dict[str, Any]:
        """The batch of sources that are ``PackedDataset``s packing alike: one ``fill_batch`` for all its rows.

        Why: a batch of B mixed samples touches up to K sources; filling
        each source's rows apart costs K fills, each a fixed number of numpy
        calls however few rows it has. Here the batch's pieces are found
        (:class:`impl.mixed_pieces.MixedPieces`) and one fill reads every
        row from ``TokenSource.concat`` of the sources, reporting each
        source's own document ids.
        """
        pieces = self._pieces.batch(epochs, indices, self.plan)
        out: dict[str, Any] = fill_batch(pieces.counts, pieces.docs, pieces.starts, pieces.stops, packing,
                                         self._pieces.tokens, segments=True, reported=pieces.reported)
        out["epoch"], out["sample_index"] = epochs, indices
        out["source"], out["source_index"] = pieces.source, pieces.item
        return out

    def _batch(self, keys: Sequence[Any]) -> dict[str, Any]:
        resolved = resolve_keys(keys, self._resolve, self.num_samples)
        if resolved is None:
            raise ConfigError(f"keys {keys!r} do not fit int64; pass SampleKey(epoch, index) of int64 values")
        epochs, indices = resolved
        if self.predownload != 0 and any(getattr(s, "remote", False) for s in self.sources):
            present = distinct_ints(epochs[indices != PADDING])     # a remote mixture's batch only: not a local one's
            if len(present) == 1:
                run_ahead(self.sample_reads, self._ahead_memo, self.reader, self.predownload, present[0], indices,
                          self.num_samples(present[0]))
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


def _first_store_path(sources: Sequence[Any]) -> Any:
    """The path of the first source's store (the mixture's plans go to its ``.plans``, as its own do), or None."""
    for src in sources:
        path = getattr(getattr(src, "store", None), "path", None)
        if isinstance(path, (str, os.PathLike)):
            return path
    return None


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
