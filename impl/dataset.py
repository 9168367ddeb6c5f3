"""PackedDataset: a token store, ordered and packed into fixed-length samples, any sample of any epoch in O(1).

Conforms to ORD-1..ORD-5, ORD-9, ORD-11 (through ``impl.ordering``),
PACK-1..PACK-20 (through ``impl.packing`` and ``impl.fill``) and, as the dataset behind
``impl.loader``, RES-1 and RES-3 (the fingerprint): ``ds.sample(e, i)`` is
field for field ``reference.resume.epoch_samples(corpus, ds.config, e)[i]``,
and ``ds.fingerprint`` is ``reference.resume.pipeline_fingerprint(
store.fingerprint, ds.config)``.

Why keys carry the epoch: a torch DataLoader computes samples in worker
processes holding their own copy of the dataset, and persistent workers never
see ``set_epoch``. ``ds[SampleKey(epoch, index)]`` needs no state, so any
worker computes any sample of any epoch; a plain int means "of the current
epoch" for interactive use.

Why a cached plan: the epoch plan (document order + sample boundaries,
``impl.packing.PackPlan``) is computed once per (store, config, epoch) with
numpy, written to ``<store>/.plans`` (or a user cache directory when the
store is read-only) and mapped by every other process, checked block by
block as it is read (``impl.plan_cache``). The plan holds O(documents)
integers: for the global shuffle it stores epoch *positions*, and the
document at a position is computed at access with
``impl.rng.FeistelPermutation`` on the few positions a sample needs
(``impl.ordering.EpochOrder``), so no permutation array exists anywhere.
Two epochs' plans stay in memory (LRU).

Why lazy: a restarted job or a spawned worker builds a dataset before its
first batch. Construction reads ``meta.json`` only (sample counts of
concat/chunk come from its totals, and are checked against the first plan);
a token file is mapped, and signed, when a batch first touches one of its
documents (``impl.fill.TokenSource``).

Why ``__getitems__``: torch's DataLoader (>= 2.1) asks a dataset that has
it for a whole batch of keys at once; ``PackedDataset`` answers with the
collated batch computed by ``impl.fill.materialize_batch`` (a fixed number
of numpy calls per batch instead of ~20 per sample), and
``impl.collation.collate`` passes it through unchanged.

Worked example::

    >>> ds = PackedDataset("/data/store", seq_len=2048, packing="concat", shuffle="global", seed=1)  # doctest: +SKIP
    >>> ds.num_samples(0), ds.config.ordering.kind                                # doctest: +SKIP
    (195312, 'global')
    >>> batch = ds[SampleKey(epoch=3, index=17)]      # the same in every process    # doctest: +SKIP
    >>> batch["input_ids"].shape, batch["labels"][:4]                             # doctest: +SKIP
    (torch.Size([2048]), tensor([  464, 3290,  -100,   318]))
    >>> ds[SampleKey(3, -1)]["doc_ids"].unique()      # a padding sample (PART-5)  # doctest: +SKIP
    tensor([-1])
"""

from __future__ import annotations

import collections
import functools
import os
import weakref
from pathlib import Path
from typing import Any, Self, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from impl._arrays import distinct_ints
from impl.collation import SampleBatch, batch_cu_seqlens, sample_cu_seqlens
from impl.dataset_checks import MAX_SEQ_LEN, check_bounded, check_not_empty
from impl.epoch_cell import SharedEpoch
from impl.errors import REBUILD_HINT, ConfigError, StoreCorruptError, StoreError, is_integer, require
from impl.fill import TokenSource, materialize, materialize_batch
from impl.keys import SampleKey, resolve_key, resolve_keys
from impl.ordering import BUFFER_MESSAGE, EpochOrder
from impl.packing import PackPlan, bin_key, pack_plan
from impl.plan_cache import PlanCache, PlanEntry, plan_cache_dir, plan_key
from impl.predownload import Reader, check_predownload, check_readers, run_ahead, store_reads
from impl.schema import BATCH_FIELDS, padding_rows
from impl.splits import SplitStore, split_pipeline
from impl.store import TokenStore
from impl.store_format import META_FILE
from reference.ordering import Kind, OrderingConfig
from reference.packing import MODES, Mode, Overflow, PackingConfig
from reference.partition import PADDING, End
from reference.resume import PipelineConfig, pipeline_fingerprint, pipeline_parts

__all__ = ["MAX_SEQ_LEN", "SHUFFLES", "PackedDataset", "SampleKey", "batch_cu_seqlens", "check_bounded"]

SHUFFLES = {"none": "sequential", "sequential": "sequential", "global": "global", "window": "window"}
"""``shuffle=`` names and the ``reference.ordering`` kind each selects (``buffer`` is refused)."""

PLAN_LRU = 2
"""Epochs whose plan and order stay in memory (the disk cache, ``impl.plan_cache``, holds the rest)."""


def _open_store(store: TokenStore | SplitStore | str | os.PathLike[str]) -> TokenStore | SplitStore:
    if isinstance(store, (TokenStore, SplitStore)):
        return store
    require(isinstance(store, (str, os.PathLike)), ConfigError,
            f"store={store!r} must be a TokenStore or the path of one; build it with TokenStore.build(...)")
    return TokenStore.open(store)


class PackedDataset(SharedEpoch, Dataset[dict[str, Any]]):
    """Samples of ``seq_len`` tokens from a :class:`~impl.store.TokenStore`, equal to the reference pipeline's.

    ``packing``: ``concat`` | ``chunk`` | ``greedy`` | ``first_fit`` |
    ``best_fit`` | ``none`` (PACK-6..PACK-19); ``shuffle``: ``none`` |
    ``global`` | ``window`` (ORD-2..ORD-5; ``window`` documents per shuffle
    window); ``pack_window``: documents per bin-packing window (PACK-14);
    ``overflow``, ``stride``, ``bos_on_continuation``, ``add_bos``,
    ``add_eos``, ``min_len``: as in ``reference.packing.PackingConfig``, with
    BOS/EOS ids taken from the store. ``pad_id`` defaults to the store's pad
    id, else its eos id, else 0. ``end`` is not used by the dataset (the
    sampler and loader own the end-of-epoch policy) but is part of
    :attr:`config` and so of the fingerprint, as in the reference.
    ``split`` (``"train[:80%]"`` or a ``(start, stop)`` pair) reads only those
    documents through a zero-copy ``impl.splits.SplitStore`` (SPLIT-8).
    ``predownload`` (MosaicML Streaming's name): for a store read through
    a remote access, the samples each reader downloads ahead of its reads
    (``None``: 8 x the per-rank batch size, 8 samples without a loader;
    ``0``: off; :mod:`impl.predownload`); a local store ignores it. It is
    not part of :attr:`config`: it changes no sample.

    ``ds[i]`` / ``ds[SampleKey(epoch, i)]`` return a dict of torch tensors:
    ``input_ids``, ``labels`` (IGNORE = -100), ``position_ids``, ``doc_ids``
    (the document's index in the store's file-major order, under a split too,
    so a train and an eval split never share one: SPLIT-9; the split's first
    store row is ``first_document``; -1 padding), ``token_offsets`` (-1 padding / inserted BOS), all int64
    ``[seq_len]``; ``epoch`` and ``sample_index`` (0-d int64); and
    ``cu_seqlens`` (int32 ``[seq_len + 1]``): ``reference.collation.cu_seqlens
    (position_ids, doc_ids)`` (a segment starts at every piece, and the
    padding at the row's end is one segment: COLL-11), followed by repeats of ``seq_len`` so every sample has the same
    shape and stacks in a batch (``cu[:k]`` with k the first index holding
    ``seq_len``, plus one, is the reference's list).

    Build from a ``PipelineConfig`` with :meth:`from_config`.

    Files: :meth:`close` (or the end of a ``with`` block) unmaps the
    dataset's cached plans and closes the store when the dataset opened it
    itself (``store`` given as a path); a :class:`~impl.store.TokenStore`
    passed in stays open, its owner closes it. A dataset dropped without
    ``close()`` releases the same when it is garbage-collected. A DataLoader
    worker maps its own copy's files; they go with the worker::

        >>> with PackedDataset("/data/store", seq_len=2048) as ds:            # doctest: +SKIP
        ...     batch = ds.samples(0, [0, 1])
        >>> ds.store.closed                                                  # doctest: +SKIP
        True
    """

    # ------------------------------------------------------------ construction

    def __init__(self, store: TokenStore | SplitStore | str | os.PathLike[str], *, seq_len: int, packing: str = "concat",
                 shuffle: str = "none", window: int = 1024, seed: int = 0, pack_window: int = 1000,
                 overflow: str = "split", stride: int = 0, bos_on_continuation: bool = False, add_bos: bool = False,
                 add_eos: bool = False, min_len: int = 0, pad_id: int | None = None,
                 cache_dir: str | os.PathLike[str] | None | bool = None, epoch: int = 0, end: str = "drop_last",
                 split: str | tuple[Any, Any] | None = None, predownload: int | None = None) -> None:
        opened = _open_store(store)
        check_predownload(predownload)
        for name, value in (("seq_len", seq_len), ("seed", seed), ("window", window), ("pack_window", pack_window),
                            ("stride", stride), ("min_len", min_len), ("epoch", epoch)):
            check_bounded(name, value)   # before the configs exist: their own checks would name the bounds less well
        if pad_id is None:   # the store's pad id, else its eos id, else 0 (the tokenizer's ids, set at build)
            pad_id = next((i for i in (opened.pad_id, opened.eos_id) if i is not None), 0)
        check_bounded("pad_id", pad_id)
        require(packing in MODES, ConfigError,
                f"packing={packing!r} is not a packing mode; choose one of {', '.join(MODES)}")
        if shuffle == "buffer":
            raise NotImplementedError(f"shuffle='buffer': {BUFFER_MESSAGE}")
        require(shuffle in SHUFFLES, ConfigError,
                f"shuffle={shuffle!r} is not a shuffle; choose one of none, global, window")
        for name, wanted, ident, token in (("add_bos", add_bos, opened.bos_id, "BOS"),
                                           ("bos_on_continuation", bos_on_continuation, opened.bos_id, "BOS"),
                                           ("add_eos", add_eos, opened.eos_id, "EOS")):
            require(wanted is not True or ident is not None, ConfigError,
                    f"{name}=True but the store at {opened.path} has no {token.lower()}_id (its tokenizer defines no "
                    f"{token} token); set {name}=False, or rebuild the store with a tokenizer that has a {token} token")
        config = PipelineConfig(
            packing=PackingConfig(seq_len=seq_len, mode=cast(Mode, packing), window=pack_window,
                                  overflow=cast(Overflow, overflow), stride=stride,
                                  bos_on_continuation=bos_on_continuation, add_bos=add_bos, add_eos=add_eos,
                                  bos_id=opened.bos_id, eos_id=opened.eos_id, pad_id=pad_id, min_len=min_len),
            ordering=OrderingConfig(kind=cast(Kind, SHUFFLES[shuffle]), seed=seed, window=window),
            end=cast(End, end),
            split=split,
        )
        self._setup(opened, config, cache_dir, epoch, predownload)
        self._own(opened if opened is not store else None)

    @classmethod
    def from_config(cls, store: TokenStore | SplitStore | str | os.PathLike[str], config: PipelineConfig, *,
                    cache_dir: str | os.PathLike[str] | None | bool = None, epoch: int = 0,
                    predownload: int | None = None) -> PackedDataset:
        """The dataset of an explicit ``reference.resume.PipelineConfig`` (its BOS/EOS/pad ids used as given).

        Why: the conformance kit and resume checks state pipelines as
        ``PipelineConfig``; ``ds.config == config`` holds afterwards.
        """
        require(isinstance(config, PipelineConfig), ConfigError,
                f"config={config!r} must be a reference.resume.PipelineConfig")
        if config.ordering.kind == "buffer":
            raise NotImplementedError(f"ordering kind 'buffer': {BUFFER_MESSAGE}")
        opened = _open_store(store)
        check_predownload(predownload)
        p, o = config.packing, config.ordering
        for name, value in (("epoch", epoch), ("seq_len", p.seq_len), ("pack_window", p.window), ("stride", p.stride),
                            ("min_len", p.min_len), ("pad_id", p.pad_id), ("seed", o.seed), ("window", o.window)):
            check_bounded(name, value)
        self = cls.__new__(cls)
        self._setup(opened, config, cache_dir, epoch, predownload)
        self._own(opened if opened is not store else None)
        return self

    def _setup(self, store: TokenStore | SplitStore, config: PipelineConfig, cache_dir: Any, epoch: int,
               predownload: int | None = None) -> None:
        """Everything construction does, none of it reading a token file (sizes come from ``meta.json``).

        Why: a fresh process (a resume, a DataLoader worker) pays for a
        dataset before its first batch; what the first batch needs (its
        plan's blocks, the files its documents sit in) is read then.
        """
        data_fingerprint, store, config = split_pipeline(store, config)   # SPLIT-8: a split reads a view of the store
        p = config.packing
        options = store.meta.get("options") or {}
        for name, token in (("add_bos", "BOS"), ("add_eos", "EOS")):
            require(not (getattr(p, name) and options.get(name)), ConfigError,
                    f"{name}=True but the store at {store.path} was built with {name}=True: every document already "
                    f"{'starts' if token == 'BOS' else 'ends'} with {token}, so each would be doubled; set "
                    f"{name}=False (or rebuild the store with {name}=False)")
        self.store = store
        self.first_document = store.rows.start if isinstance(store, SplitStore) else 0
        self.config = config
        self.epoch = int(epoch)
        self.fingerprint = pipeline_fingerprint(data_fingerprint, config)
        #: The fingerprint's components (RES-8): a refused state names the ones that differ.
        self.fingerprint_parts = pipeline_parts(data_fingerprint, config)
        self._cache_arg = cache_dir
        self._plan_cache = PlanCache(plan_cache_dir(cache_dir, store.path))
        self._file_sizes = list(store.file_document_counts)
        self._counts: dict[int, int] = {}
        #: Samples each reader downloads ahead from a remote store (:mod:`impl.predownload`); not in the config:
        #: it changes no sample.
        self.predownload = predownload
        self.reader: Reader | None = None
        self._reset_memory()
        self._fixed_samples: int | None = None        # set below; plan() reads it while the check runs
        self._fixed_samples = check_not_empty(self.store, self.config, self.plan, self.epoch)

    def _reset_memory(self) -> None:
        self._source: TokenSource | None = None
        self._plan_keys: dict[int, str] = {}
        self._plans: collections.OrderedDict[int, PackPlan] = collections.OrderedDict()
        self._orders: collections.OrderedDict[int, EpochOrder] = collections.OrderedDict()
        self._doc_files: Any = False   # the remote store's row -> file lookup, found on first use (None: local)
        self._ahead_memo: collections.OrderedDict[tuple[int, int], list[tuple[Any, str]]] = collections.OrderedDict()

    # ------------------------------------------------------------ pickling (DataLoader workers under spawn)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_source", "_plans", "_orders", "_doc_files", "_ahead_memo", "_finalizer"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_memory()
        self._own(self.__dict__.get("_owned_store"))   # the copy owns the store it reopened

    # ------------------------------------------------------------ files

    def _own(self, store: Any) -> None:
        """Close ``store`` (one this dataset opened, or None) in :meth:`close`, or when the dataset is collected."""
        self._owned_store = store
        if store is not None:
            self._finalizer = weakref.finalize(self, store.close)
            self._finalizer.atexit = False

    def close(self) -> None:
        """Unmap this dataset's cached plans and close the store it opened itself (idempotent).

        A store passed in as a :class:`~impl.store.TokenStore` (or a split
        of one) is left open: whoever opened it closes it, and the dataset
        reads on, mapping its plans again when asked. Reading from a dataset
        whose own store is closed raises :class:`~impl.errors.StoreError`.
        """
        self._reset_memory()
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ epochs and sizes

    def num_samples(self, epoch: int) -> int:
        """Samples of epoch ``epoch`` (closed form for concat/chunk/none: the same every epoch; bin modes: the plan's)."""
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        if self._fixed_samples is not None:
            return self._fixed_samples
        epoch = int(epoch)
        if epoch not in self._counts:
            if len(self._counts) >= 64:
                self._counts.clear()
            self._counts[epoch] = self.plan(epoch).num_samples
        return self._counts[epoch]

    def __len__(self) -> int:
        return self.num_samples(self.epoch)

    def __repr__(self) -> str:
        p, o = self.config.packing, self.config.ordering
        return (f"PackedDataset({str(self.store.path)!r}, seq_len={p.seq_len}, packing={p.mode!r}, "
                f"shuffle={'none' if o.kind == 'sequential' else o.kind!r}, epoch={self.epoch})")

    # ------------------------------------------------------------ the plan

    def _plan_epoch(self, epoch: int) -> int:
        """Epochs with the same plan share it: a sequential order is the same every epoch."""
        return 0 if self.config.ordering.kind == "sequential" else int(epoch)

    def plan_key(self, epoch: int) -> str:
        """sha256 naming epoch ``epoch``'s plan (``impl.plan_cache.plan_key``), kept for the last 64 plan epochs."""
        plan_epoch = self._plan_epoch(epoch)
        key = self._plan_keys.get(plan_epoch)
        if key is None:
            key = self._plan_keys[plan_epoch] = plan_key(self.store.fingerprint, self.config, plan_epoch)
            if len(self._plan_keys) > 64:
                self._plan_keys.clear()
        return key

    def plan_paths(self, epoch: int) -> tuple[Path, Path] | None:
        """``(npy, json sidecar)`` of epoch ``epoch``'s cached plan, or None without a cache directory."""
        return self._plan_cache.paths(self.plan_key(epoch))

    def order(self, epoch: int) -> EpochOrder:
        """Epoch ``epoch``'s document order as random access (kept for the last two epochs)."""
        epoch = self._plan_epoch(epoch)
        order = self._orders.get(epoch)
        if order is None:
            order = EpochOrder(self._file_sizes, self.config.ordering, epoch)
            self._orders[epoch] = order
            while len(self._orders) > PLAN_LRU:
                self._orders.popitem(last=False)
        else:
            self._orders.move_to_end(epoch)
        return order

    def plan(self, epoch: int) -> PackPlan:
        """Epoch ``epoch``'s plan: from memory, else the disk cache, else computed (and cached)."""
        epoch = self._plan_epoch(epoch)
        plan = self._plans.get(epoch)
        if plan is not None:
            self._plans.move_to_end(epoch)
            return plan
        # The plan keeps ``compute`` (to recover from a corrupt cached block): a weak reference, so the dataset,
        # its plans and its store's mapped files are freed when the last user reference goes, not at the next gc.
        compute = functools.partial(_compute_plan, weakref.ref(self), epoch)
        plan = self._plan_cache.load_or_compute(self._plan_entry(epoch), compute)
        if self._fixed_samples is not None and plan.num_samples != self._fixed_samples:
            raise StoreCorruptError(
                f"token store {self.store.path}: {META_FILE} counts ({self.store.num_documents} documents, "
                f"{self.store.num_tokens} tokens, {self.store.num_empty_documents} empty) give "
                f"{self._fixed_samples} samples but the documents' lengths give {plan.num_samples}; {REBUILD_HINT}")
        self._plans[epoch] = plan
        while len(self._plans) > PLAN_LRU:
            self._plans.popitem(last=False)
        return plan

    def compute_plan(self, epoch: int) -> PackPlan:
        """Epoch ``epoch``'s plan computed now (no cache): lengths in epoch order, then ``impl.packing.pack_plan``."""
        lengths, key = self.store.lengths, None
        if self.config.ordering.kind != "sequential":
            lengths = lengths[self.order(epoch).to_array()]
            key = bin_key(self.config.ordering.seed, self._plan_epoch(epoch))
        return pack_plan(lengths, self.config.packing, key=key)

    def _plan_entry(self, epoch: int) -> PlanEntry:
        p = self.config.packing
        return PlanEntry(key=self.plan_key(epoch), mode=p.mode, seq_len=p.seq_len,
                         provenance={"epoch": self._plan_epoch(epoch), "store_fingerprint": self.store.fingerprint,
                                     "config": self.config.to_json()})

    # ------------------------------------------------------------ predownload (remote stores)

    def set_reader(self, reader: Reader | None) -> None:
        """Say who reads this dataset (``build_dataloader`` does): its next samples follow from each batch's keys."""
        self.reader = reader

    def check_readers(self, workers: int) -> None:
        """Refuse a remote store's ``cache_limit`` too small for the node's ranks x ``workers`` readers."""
        check_readers([self.store], workers)

    @property
    def remote(self) -> bool:
        """Whether the store is read through a remote access (so predownload has files to fetch)."""
        if self._doc_files is False:
            self._doc_files = store_reads(self.store)
        return self._doc_files is not None

    def reads(self, epoch: int, indices: np.ndarray) -> list[tuple[Any, str]]:
        """``[(access, file name), ...]``: the files samples ``indices`` of epoch ``epoch`` read, in read order.

        Empty for a local store. One entry per piece of each sample, in the
        order the fill copies them.
        """
        return [read for row in self.sample_reads(epoch, indices) for read in row]

    def sample_reads(self, epoch: int, indices: np.ndarray) -> list[list[tuple[Any, str]]]:
        """:meth:`reads` of each sample of ``indices`` apart (a mixture interleaves its sources' samples)."""
        if not self.remote or not len(indices):
            return [[] for _ in range(len(indices))]
        counts, pos, _, _ = self.plan(epoch).batch_pieces(indices)
        docs = self.order(epoch)(pos) if len(pos) else pos
        found = self._doc_files(docs)
        ends = np.cumsum(counts).tolist()
        return [found[a:b] for a, b in zip([0, *ends[:-1]], ends)]

    def _ahead(self, epoch: int, indices: np.ndarray) -> None:
        """Predownload for the batch ``indices`` of ``epoch`` (:func:`impl.predownload.run_ahead`); local: nothing."""
        if self.predownload != 0 and self.remote:
            run_ahead(self.sample_reads, self._ahead_memo, self.reader, self.predownload, epoch, indices,
                      self.num_samples(epoch))

    # ------------------------------------------------------------ samples

    @property
    def source(self) -> TokenSource:
        if self._source is None:
            self._source = TokenSource.from_store(self.store)
        return self._source

    def _resolve(self, key: Any) -> tuple[int, int]:
        return resolve_key(key, self.epoch, self.num_samples)

    def sample(self, epoch: int, index: int) -> dict[str, np.ndarray]:
        """Sample ``index`` of epoch ``epoch`` (``-1``: the padding sample) as numpy arrays, keys as ``__getitem__``."""
        epoch, index = self._resolve(SampleKey(epoch, index))
        p = self.config.packing
        if index == PADDING:
            out = {name: row[0] for name, row in padding_rows(1, p).items()}
        else:
            self._ahead(epoch, np.array([index], dtype=np.int64))
            out = materialize(self.plan(epoch), index, p, self.source, self.order(epoch),
                              first_document=self.first_document)
            del out["document_starts"]
        out["epoch"] = np.array(epoch, dtype=np.int64)
        out["sample_index"] = np.array(index, dtype=np.int64)
        out["cu_seqlens"] = sample_cu_seqlens(out["position_ids"], out["doc_ids"])
        return out

    def __getitem__(self, key: int | SampleKey) -> dict[str, torch.Tensor]:
        epoch, index = self._resolve(key)
        return {name: torch.from_numpy(value) for name, value in self.sample(epoch, index).items()}

    # ------------------------------------------------------------ batches

    def _rows(self, epochs: np.ndarray, indices: np.ndarray) -> dict[str, Any]:
        """The batch of resolved keys, numpy, in ``__getitems__``'s layout (one ``materialize_batch`` per epoch)."""
        p = self.config.packing
        real = indices != PADDING
        groups = distinct_ints(epochs[real])
        out: dict[str, Any]
        if len(groups) == 1:
            self._ahead(groups[0], indices)
        if len(groups) <= 1:
            if groups:
                epoch = groups[0]
                out = materialize_batch(self.plan(epoch), indices, p, self.source, self.order(epoch), segments=True,
                                        first_document=self.first_document)
            else:   # only padding keys: no plan needed
                out = padding_rows(len(indices), p)
        else:
            out = padding_rows(len(indices), p)
            for epoch in groups:
                rows = np.flatnonzero(real & (epochs == epoch))
                part = materialize_batch(self.plan(epoch), indices[rows], p, self.source, self.order(epoch),
                                         first_document=self.first_document)
                for name in BATCH_FIELDS:
                    out[name][rows] = part[name]
        cu: Any = out.pop("cu_seqlens", None)
        max_seqlen: Any = out.pop("max_seqlen", None)
        if cu is None:
            cu, max_seqlen = batch_cu_seqlens(out["position_ids"], out["doc_ids"])
        out["epoch"] = np.array(epochs, dtype=np.int64)
        out["sample_index"] = np.array(indices, dtype=np.int64)
        out["cu_seqlens"], out["max_seqlen"] = cu, max_seqlen
        return out

    def samples(self, epoch: int, indices: Any) -> dict[str, Any]:
        """Samples ``indices`` of epoch ``epoch`` (``-1``: padding) as numpy, stacked: ``__getitems__``'s numpy form.

        ``indices`` is a sequence or array of ints; each is checked as
        ``sample(epoch, index)`` checks it (a negative index other than -1
        is an error, as for a ``SampleKey``).
        """
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        values = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        return self._batch([SampleKey(int(epoch), i) for i in values])

    def _batch(self, keys: Any) -> dict[str, Any]:
        resolved = resolve_keys(keys, self._resolve, self.num_samples)
        if resolved is None:   # a key beyond int64: stack the rows one by one
            rows = [self.sample(*self._resolve(k)) for k in keys]
            out: dict[str, Any] = {name: np.stack([r[name] for r in rows]) for name in (*BATCH_FIELDS, "epoch", "sample_index")}
            out["cu_seqlens"], out["max_seqlen"] = batch_cu_seqlens(out["position_ids"], out["doc_ids"])
            return out
        return self._rows(*resolved)

    def __getitems__(self, keys: list[Any]) -> SampleBatch:
        """A whole batch at once, as a ``SampleBatch``: reads as ``[ds[k] for k in keys]``, computed batched.

        torch's DataLoader (>= 2.1) calls ``dataset.__getitems__(batch_of_keys)``
        when it exists and hands the result to ``collate_fn``: torch's
        ``default_collate`` (a plain ``DataLoader``, torchdata's
        ``StatefulDataLoader``) sees the list of samples and stacks them;
        ``impl.collation.collate`` takes the batch computed here
        (``result.batch``) as is. Keys as ``__getitem__`` takes them
        (``SampleKey``, ``(epoch, index)`` or a plain int of the current
        epoch; epochs may mix, ``index == -1`` is padding). Its batch holds
        ``input_ids``, ``labels``, ``position_ids``, ``doc_ids``,
        ``token_offsets`` (int64 ``[B, seq_len]``), ``epoch``,
        ``sample_index`` (int64 ``[B]``), ``cu_seqlens`` (int32, over the
        flattened batch: ``impl.collation.cu_seqlens``) and ``max_seqlen``
        (int). Tensors wrap the numpy results (``torch.from_numpy``, no copy).

        Why: one ``impl.fill.materialize_batch`` per epoch in the batch
        costs a fixed number of numpy calls, where ``B`` calls of
        ``__getitem__`` plus ``collate`` pay ~20 numpy calls per sample.
        """
        return SampleBatch({name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                            for name, value in self._batch(keys).items()})


def _compute_plan(dataset: weakref.ref[PackedDataset], epoch: int) -> PackPlan:
    """``dataset().compute_plan(epoch)``: how a plan recomputes itself without keeping its dataset alive."""
    ds = dataset()
    if ds is None:
        raise StoreError("the PackedDataset this epoch plan belongs to was dropped; keep a reference to the dataset "
                         "while reading its plans")
    return ds.compute_plan(epoch)

