"""ElasticLoader: a torch DataLoader whose state resumes exactly, on any topology.

Conforms to RES-1 .. RES-8 (docs/SEMANTICS.md, "Resume") and PART-1 .. PART-12
(docs/SEMANTICS.md, through ``impl.partition.ElasticSampler``); its
model is ``reference.loader.ReferenceLoader``.

Why a wrapper around the DataLoader: a DataLoader with workers iterates its
batch sampler ahead of the training loop (``prefetch_factor * num_workers``
batches), so the sampler's position says what was *computed*, not what was
*trained*. ``ElasticLoader`` counts the batches it hands to the training loop
and advances ``consumed`` with ``impl.partition.advance`` per handed-out
step (RES-6). The loader is the one owner of the position ``(epoch,
consumed)``: its sampler holds none and asks ``loader.position()`` where to
start each pass. The state is the reference's: ``{"format", "version",
"fingerprint", "parts", "epoch", "consumed"}`` (RES-2, RES-8), with ``consumed`` counting the
epoch's *global* stream, so it loads on another world size, per-rank batch
size or worker count (RES-4, RES-5).

Epochs: iterating yields the rest of the current epoch; when the pass ends
(the training loop asks for the batch after the last one, as a ``for`` loop
does) the state becomes ``(epoch + 1, 0)`` and the next ``iter()`` continues
with the next epoch (RES-7), exactly when ``ReferenceLoader``'s does. A state
taken inside the loop body after the last step still reads ``(epoch, c)``
with no step left from ``c``: loaded on the same topology it continues with
the next epoch too (on a smaller global batch it first trains the tail the
larger one dropped, as PART-8 allows).
``set_epoch(e)`` starts epoch ``e`` from its beginning unless the state is
already inside it (so a resumed state survives the usual
``loader.set_epoch(epoch)`` at the top of the training loop).

Settings: the dataset's config owns every setting that changes the data
(``end`` included, since it is part of the fingerprint in every state); the
loader reads ``end`` from the dataset and refuses a contradicting ``end=``.
A topology under which the epoch has no step at all is refused at build time
(``TopologyError`` naming the sample count and the global batch).

Abandoned iterators: ``set_epoch`` to another epoch, ``load_state_dict`` and a
new ``iter()`` take over from the live iterator, which is closed (its workers
released) and yields nothing more.

Workers: each key carries its epoch (``SampleKey``), so workers, persistent or
not, never depend on ``set_epoch`` reaching their dataset copy. An exception
raised in a worker (in the dataset or the collate function) reaches the
training loop as the same exception, type and message (torch would re-raise
it with a rewritten message, or lose it as "worker exited unexpectedly"),
with the worker's traceback attached as a note. The default
``multiprocessing_context=None`` keeps torch's default (``fork`` on Linux):
the dataset is numpy over memory-mapped files, which fork shares for free,
while ``spawn`` would pay a fresh interpreter plus ``import torch`` per worker
per epoch. Pass ``"spawn"`` or ``"forkserver"`` when the process holds
threads a fork can deadlock on (a tokenizer's thread pool, CUDA).

Worked example (a training loop that checkpoints, and a restart on 3 ranks)::

    loader = build_dataloader(dataset, batch_size=4, rank=rank, world_size=2)
    for epoch in range(epochs):
        loader.set_epoch(epoch)              # a no-op for a resumed epoch (RES-7)
        for batch in loader:
            train(batch)
            if step % 100 == 0:
                save(json.dumps(loader.state_dict()))   # rank 0; it is the same on every rank

    # later, on 3 ranks with another batch size:
    loader = build_dataloader(dataset, batch_size=2, rank=rank, world_size=3)
    loader.load_state_dict(json.loads(saved))  # continues at the same global sample
"""

from __future__ import annotations

import contextlib
import pickle
import traceback
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any, Self

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from impl.collation import collate
from impl.errors import ConfigError, EmptyDataError, StateError, TopologyError, is_int, require
from impl.partition import ElasticSampler, advance, steps_in_epoch
from impl.predownload import Reader
from reference.partition import PartitionConfig
from reference.resume import make_state, validate_state

with contextlib.suppress(ImportError):
    # torch's DataLoader imports this on its first batch: a restarted job's first batch should not pay the import.
    import torch.profiler._cupti_monitor

__all__ = ["ElasticLoader", "build_dataloader"]


class ElasticLoader:
    """One rank's loader: a DataLoader over ``ElasticSampler`` keys plus the exact, elastic state.

    Implements ``torch.distributed.checkpoint.stateful.Stateful`` and
    torchdata's ``StatefulDataLoader`` state interface (``state_dict()``,
    ``load_state_dict()``). One live iterator at a time: starting a new
    ``iter()`` abandons the previous one.

    The loader holds its live iterator weakly: an iterator dropped mid-epoch
    (a ``break``, an exception, a test that takes ``k`` batches) is finished
    at once, and its DataLoader workers exit then, not whenever the garbage
    collector reaches a loader↔iterator cycle (a worker shut down from inside
    the collector, while another DataLoader forks its workers, can wait out
    torch's 5 s join timeout). :meth:`close` ends the live pass explicitly.

    Build it with :func:`build_dataloader`.
    """

    def __init__(self, dataset: Any, sampler: ElasticSampler, dataloader: DataLoader[Any], *, from_numpy: bool = False) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.dataloader = dataloader
        self._from_numpy = from_numpy
        self._epoch, self._consumed = sampler.position()
        self._generation = 0
        self._live: weakref.ref[Generator[Any, None, None]] | None = None
        sampler.position = _LoaderPosition(self)   # weak: the loader, its dataset and their files free at once

    # ------------------------------------------------------------ position

    def position(self) -> tuple[int, int]:
        """``(epoch, consumed)``: where the next pass starts; the sampler reads it here."""
        return self._epoch, self._consumed

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Samples of the epoch's global stream covered by the batches handed out so far (RES-2)."""
        return self._consumed

    @property
    def fingerprint(self) -> str:
        return str(self.dataset.fingerprint)

    @property
    def fingerprint_parts(self) -> dict[str, str]:
        """The dataset's fingerprint components (RES-8), ``{}`` for a dataset that offers none."""
        parts = getattr(self.dataset, "fingerprint_parts", None)
        return dict(parts) if isinstance(parts, dict) else {}

    @property
    def partition(self) -> PartitionConfig:
        return self.sampler.config

    def num_samples(self, epoch: int | None = None) -> int:
        return self.sampler.num_samples(self._epoch if epoch is None else epoch)

    def __len__(self) -> int:
        """Steps in the current epoch, from its start (PART-10)."""
        return steps_in_epoch(self.num_samples(), self.partition)

    @property
    def steps_remaining(self) -> int:
        """Steps left in the current epoch from the current position (PART-10)."""
        return steps_in_epoch(self.num_samples(), self.partition, self._consumed)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (RES-7)."""
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        if epoch != self._epoch:
            self._take_over()
            self._epoch, self._consumed = epoch, 0

    def close(self) -> None:
        """End the live iterator (its workers exit, their pipes and shared memory are released); idempotent.

        The position is kept: ``state_dict()`` is unchanged and the next
        ``iter()`` continues from it, with new workers (e.g. an evaluation
        loader cut short). The dataset is the caller's: close it too when
        done with it (:meth:`impl.dataset.PackedDataset.close`).
        """
        self._take_over()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_over(self) -> int:
        """A new position or pass: the live iterator (if any) is closed and will yield nothing more."""
        self._generation += 1
        live = self._live() if self._live is not None else None
        self._live = None
        if live is not None:
            try:
                live.close()
            except ValueError:  # pragma: no cover - closing from inside its own next() (a re-entrant call)
                pass
        return self._generation

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The resume state (RES-2): JSON primitives, counting only batches handed out (RES-6)."""
        return make_state(self.fingerprint, self._epoch, self._consumed, self.fingerprint_parts)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the state's position; refuse a state that does not fit (RES-3).

        Raises ``StateError`` naming the mismatch and the fix for a foreign
        format, an unsupported version, missing or extra keys, another
        fingerprint (other data or pipeline config; the message names the
        parts that differ, RES-8), integers out of bounds, or ``consumed``
        beyond the epoch's samples.
        """
        epoch, consumed = validate_state(state, self.fingerprint, self.fingerprint_parts)
        total = self.num_samples(epoch)
        require(consumed <= total, StateError,
                f"state has consumed={consumed} but epoch {epoch} holds {total} samples: it was taken on other data "
                "or config; start from a fresh state or restore the matching data")
        self._take_over()
        self._epoch, self._consumed = epoch, consumed

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        generation = self._take_over()
        live = self._run(generation)
        self._live = weakref.ref(live)
        return live

    def _run(self, generation: int) -> Generator[Any, None, None]:
        epoch, consumed = self._epoch, self._consumed
        total = self.num_samples(epoch)
        config = self.partition
        remaining = steps_in_epoch(total, config, consumed)
        if remaining and generation == self._generation:
            iterator = self._batches()  # the sampler starts at self.position(), read now
            try:
                # The generation is checked before every pull: an abandoned iterator never
                # takes a batch from a (persistent) DataLoader iterator that a newer pass reuses.
                while remaining and generation == self._generation:
                    batch: Any = next(iterator, _END)
                    if batch is _END:
                        break
                    if type(batch) is WorkerFailure:
                        raise batch.error
                    # Count the batch before handing it out: state_dict() in the loop
                    # body must already include it, and nothing the workers merely
                    # prefetched (RES-6).
                    consumed = advance(consumed, total, config)
                    remaining -= 1
                    self._consumed = consumed
                    yield tensors_from_numpy(batch) if self._from_numpy else batch
            finally:
                del iterator
            if generation != self._generation:
                return
            require(remaining == 0, StateError,
                    f"the DataLoader ended epoch {epoch} with {remaining} of its steps left: its batch sampler was "
                    "changed behind the loader's back; iterate the ElasticLoader and leave loader.sampler alone")
        if generation == self._generation:
            self._epoch, self._consumed = epoch + 1, 0  # the pass is over: the next one is the next epoch (RES-7)
            self._live = None

    def _batches(self) -> Iterator[Any]:
        """The DataLoader's batches: in this process, ``collate_fn(fetch(keys))`` per batch of its sampler's keys.

        That is all a single-process ``DataLoader`` without pinned memory
        does; running the loop here skips its iterator's setup and its
        per-batch profiler scope, a visible share of a fresh resume's first batch.
        Workers or pinned memory go through the DataLoader.
        """
        loader = self.dataloader
        fetch, batches = loader.dataset, loader.batch_sampler
        if (type(loader) is DataLoader and loader.num_workers == 0 and not loader.pin_memory and type(fetch) is _Fetch
                and batches is not None):
            collate_fn = loader.collate_fn
            return (collate_fn(fetch.__getitems__(keys)) for keys in batches)
        return iter(loader)

    def __repr__(self) -> str:
        return (f"ElasticLoader({self.sampler!r}, num_workers={self.dataloader.num_workers}, "
                f"epoch={self._epoch}, consumed={self._consumed})")


_END = object()


class _LoaderPosition:
    """The sampler's ``position``: its loader's, through a weak reference (a bound method would make a cycle)."""

    __slots__ = ("loader",)

    def __init__(self, loader: ElasticLoader) -> None:
        self.loader = weakref.ref(loader)

    def __call__(self) -> tuple[int, int]:
        loader = self.loader()
        if loader is None:
            raise StateError("the ElasticLoader this sampler belongs to was dropped; iterate the loader "
                             "(build_dataloader(...)), not loader.sampler")
        return loader.position()


class WorkerFailure:
    """An exception raised in a DataLoader worker, carried to the training process as the batch's place.

    Why: torch re-raises a worker's exception as ``type(exc)(rewritten
    message)`` (or, when that fails, as a different error), so an ``except
    StateError`` around the training loop sees another message, and a typed
    error whose constructor takes other arguments is lost. Here the worker
    pickles the exception itself; ``ElasticLoader`` raises it unchanged, with
    the worker's traceback as a note (``exc.__notes__``). An exception that
    does not survive pickling is left to torch.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @classmethod
    def capture(cls, exc: BaseException) -> WorkerFailure | None:
        info = torch.utils.data.get_worker_info()
        where = f"DataLoader worker {info.id}" if info is not None else "the DataLoader"
        try:
            copy = pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - any failure to round-trip means: leave the exception to torch
            return None
        if type(copy) is not type(exc) or str(copy) != str(exc):
            return None
        copy.add_note(f"raised in {where}:\n{''.join(traceback.format_exception(exc)).rstrip()}")
        return cls(copy)

    @classmethod
    def call(cls, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)``, or a ``WorkerFailure`` in its place when it raises an exception that can travel."""
        try:
            return fn(arg)
        except Exception as exc:
            failure = cls.capture(exc)
            if failure is None:
                raise
            return failure


class _Fetch(Dataset[Any]):
    """The dataset as the DataLoader fetches it: one call per batch of keys.

    ``batched``: hand the keys to the dataset's ``__getitems__`` (the batched
    path ``impl.collation.collate`` accepts); else a list of ``dataset[key]``
    (what a user's own ``collate_fn`` expects). ``guarded`` (in workers): an
    exception becomes a ``WorkerFailure`` returned in the batch's place.
    """

    def __init__(self, dataset: Any, *, batched: bool, guarded: bool) -> None:
        self.dataset = dataset
        self.batched = batched
        self.guarded = guarded

    def _fetch(self, keys: list[Any]) -> Any:
        if self.batched:
            return self.dataset.__getitems__(keys)
        return [self.dataset[key] for key in keys]

    def __getitems__(self, keys: list[Any]) -> Any:
        return WorkerFailure.call(self._fetch, keys) if self.guarded else self._fetch(keys)

    def __getitem__(self, key: Any) -> Any:
        return self.dataset[key]

    def __len__(self) -> int:
        return len(self.dataset)


class _GuardedCollate:
    """``collate_fn`` in a worker: passes a ``WorkerFailure`` through and turns its own exceptions into one."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Any) -> Any:
        if type(batch) is WorkerFailure:
            return batch
        return WorkerFailure.call(self.collate_fn, batch)


_WIRE_DTYPES = tuple((np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max))
                     for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32))
_WIDENED = "__loadspec_widen__"


def _narrowest(values: np.ndarray) -> np.dtype:
    """The smallest integer dtype holding every value of an int64 array (int64 itself if none does)."""
    if not values.size:
        return values.dtype
    lo, hi = int(values.min()), int(values.max())
    for dtype, smallest, largest in _WIRE_DTYPES:
        if smallest <= lo and hi <= largest:
            return dtype
    return values.dtype


def collate_to_numpy(batch: Any) -> dict[str, Any]:
    """``collate`` in a worker, with tensors handed over as numpy arrays of the narrowest integer dtype.

    Why numpy: torch sends every tensor from a worker through its own
    shared-memory file descriptor (a socket connect and handshake per tensor),
    while numpy arrays travel inside the one pickled
    message on the worker's pipe. Why narrow: the pipe's bandwidth is the cost, so
    bytes count; token ids fit uint16 or uint32, positions and
    offsets int16, and a batch of five int64 ``[8, 2048]`` fields (655 KB)
    shrinks about 3x. ``tensors_from_numpy`` widens each back to its
    dtype in the training process, so the batch is value- and dtype-identical
    to ``collate``'s.
    """
    out: dict[str, Any] = {}
    widened = []
    for key, value in collate(batch).items():
        if isinstance(value, torch.Tensor):
            value = value.numpy()
            if value.dtype == np.int64:
                narrow = _narrowest(value)
                if narrow != value.dtype:
                    value = value.astype(narrow)
                    widened.append(key)
        out[key] = value
    out[_WIDENED] = tuple(widened)
    return out


def tensors_from_numpy(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Undo ``collate_to_numpy``: the same keys, dtypes and values as ``collate`` returns."""
    widened = batch.get(_WIDENED, ())
    out = {}
    for key, value in batch.items():
        if key == _WIDENED:
            continue
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.astype(np.int64) if key in widened else value)
        out[key] = value
    return out


def build_dataloader(dataset: Any, *, batch_size: int, rank: int | None = None, world_size: int | None = None,
                     replication: int = 1, end: str | None = None, num_workers: int = 0, pin_memory: bool = False,
                     prefetch_factor: int | None = None, persistent_workers: bool = False,
                     collate_fn: Callable[[Any], Any] = collate, multiprocessing_context: Any = None,
                     allow_empty_epoch: bool = False, **dataloader_kwargs: Any) -> ElasticLoader:
    """The loader of one rank: ``ElasticLoader`` over ``DataLoader(dataset, batch_sampler=ElasticSampler(...))``.

    ``dataset`` is an ``impl.dataset.PackedDataset`` (or anything with
    ``num_samples(epoch)``, ``fingerprint`` and ``__getitem__(SampleKey)``);
    an ``impl.streaming.StreamingDataset`` gets an ``impl.stream_loader.StreamingLoader``
    (same ``state_dict`` / ``load_state_dict`` / ``set_epoch`` interface).
    ``rank``/``world_size`` default to ``torch.distributed``'s process group
    when initialised, else ``0``/``1``. ``batch_size`` is per rank; the global
    batch is ``world_size // replication * batch_size``. ``end`` is read from
    the dataset's config; passing it is allowed only to repeat it. An epoch
    with no step for this topology is refused (``TopologyError``; ``EmptyDataError``
    naming the source when a dataset's ``explain_short_epoch(epoch)`` says an
    empty source cut the epoch short, as ``MixedDataset``'s does) unless
    ``allow_empty_epoch=True`` (a conformance kit comparing tiny corpora with
    the reference wants the empty loader). Extra keyword arguments go to the
    DataLoader (``timeout``, ``worker_init_fn``, ...). A dataset's
    ``check_partition(groups, batch_size)``, when it has one, may refuse the
    topology (``MixedDataset`` with a batch-composing ``batching_method``, MIX-16).
    A dataset's ``set_reader`` (``PackedDataset``, ``MixedDataset``) is
    told the partition and worker count, so each worker of a remote store
    predownloads the files of its own next samples (:mod:`impl.predownload`),
    and its ``check_readers(num_workers)`` refuses a ``cache_limit`` too
    small for the node's ``LOCAL_WORLD_SIZE`` ranks x workers readers
    (``CacheLimitError`` naming the bytes needed and how they were counted).

    >>> loader = build_dataloader(dataset, batch_size=8, num_workers=2)   # doctest: +SKIP
    >>> batch = next(iter(loader)); batch["input_ids"].shape              # doctest: +SKIP
    torch.Size([8, 2048])
    """
    require(is_int(num_workers) and num_workers >= 0, ConfigError,
            f"num_workers={num_workers!r} must be an integer >= 0 (0: load in the training process)")
    from impl.stream_loader import StreamingLoader
    from impl.stream_mixing import StreamMixture
    from impl.streaming import StreamingDataset

    if isinstance(dataset, (StreamingDataset, StreamMixture)):   # batches composed per worker (STREAM-11, MIX-24)

        require(replication == 1 and end is None and collate_fn is collate and not pin_memory, ConfigError,
                f"a {type(dataset).__name__} takes no replication, end, collate_fn or pin_memory: its batches are "
                "composed per worker and end with equal-step truncation (STREAM-12); leave them at their defaults")
        return StreamingLoader(dataset, batch_size=batch_size, rank=rank, world_size=world_size,  # type: ignore[return-value]
                               num_workers=num_workers, multiprocessing_context=multiprocessing_context,
                               persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
                               **dataloader_kwargs)
    require(num_workers > 0 or (prefetch_factor is None and not persistent_workers), ConfigError,
            f"prefetch_factor={prefetch_factor!r} and persistent_workers={persistent_workers!r} need worker processes; "
            "pass num_workers >= 1 or leave them at None/False")
    sampler = ElasticSampler(dataset, batch_size=batch_size, rank=rank, world_size=world_size,
                             replication=replication, end=end)
    set_reader = getattr(dataset, "set_reader", None)
    if callable(set_reader):   # predownload: each worker's next samples follow from its batch's keys
        set_reader(Reader(partition=sampler.config, group=sampler.group, workers=num_workers))
    check_readers = getattr(dataset, "check_readers", None)
    if callable(check_readers):   # a remote store's cache_limit must hold every reader of the node
        check_readers(num_workers)
    check_partition = getattr(dataset, "check_partition", None)
    if callable(check_partition):   # a mixture that composes batches (MIX-16) needs this step's size
        check_partition(sampler.config.data_parallel_size, sampler.config.batch_size)
    if not allow_empty_epoch:
        epoch = sampler.position()[0]
        total, config = sampler.num_samples(epoch), sampler.config
        explain = getattr(dataset, "explain_short_epoch", None)
        reason = explain(epoch) if callable(explain) and steps_in_epoch(total, config) == 0 else None
        require(reason is None, EmptyDataError, f"this loader would yield no batch in epoch {epoch}: {reason}")
        require(steps_in_epoch(total, config) > 0, TopologyError,
                f"epoch {epoch} holds {total} samples, but one step takes world_size // replication x batch_size = "
                f"{config.data_parallel_size} x {config.batch_size} = {config.global_batch_size} of them "
                f"(end={config.end!r}): this loader would yield no batch at all; lower batch_size or the number of "
                "ranks, use more data, or build the dataset with end='pad'")
    batched = collate_fn is collate and callable(getattr(dataset, "__getitems__", None))
    over_pipe = collate_fn is collate and num_workers > 0 and not pin_memory
    chosen: Callable[[Any], Any] = collate_to_numpy if over_pipe else collate_fn
    guarded = num_workers > 0
    fetched = _Fetch(dataset, batched=batched, guarded=guarded)
    if guarded:
        chosen = _GuardedCollate(chosen)
    dataloader = DataLoader(fetched, batch_sampler=sampler, num_workers=num_workers, collate_fn=chosen,
                            pin_memory=pin_memory, prefetch_factor=prefetch_factor,
                            persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context,
                            **dataloader_kwargs)
    return ElasticLoader(dataset, sampler, dataloader, from_numpy=over_pipe)
