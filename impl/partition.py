"""Partition: one rank's batches of an epoch, as ``SampleKey``s a torch DataLoader hands to its workers.

Conforms to PART-1 .. PART-12 (docs/SEMANTICS.md, "Partition across ranks")
and, through the loader that owns the position, RES-4 / RES-5 / RES-7
("Resume"). The arithmetic (``group_batch``, ``advance``,
``steps_in_epoch``, ``padding_rows``) is impl's own, in O(B) per step and
O(1) per count; conformance compares it with ``reference.partition`` on
generated inputs.

Why a batch sampler of keys: torch's DataLoader computes batches in worker
processes that hold their own copy of the dataset, and persistent workers
never see ``set_epoch`` called in the main process. A key ``SampleKey(epoch,
index)`` carries everything a worker needs, so workers stay stateless and the
epoch cannot go stale.

Why the sampler holds no position: the loader (``impl.loader.ElasticLoader``)
is the one owner of ``(epoch, consumed)``, because only it knows which
batches reached the training loop (RES-6); a DataLoader iterates its batch
sampler ahead whenever workers prefetch. ``ElasticSampler`` is a pure
function of (position, config, topology): ``batches(epoch, consumed)``, and
``iter(sampler)`` asks its ``position`` source (the loader) where to start.

Worked example (S = 10 samples, 2 ranks, B = 2, so G = 4)::

    >>> class Ten:                      # any dataset with num_samples(epoch) works
    ...     epoch = 0
    ...     def num_samples(self, epoch): return 10
    >>> s = ElasticSampler(Ten(), batch_size=2, rank=1, world_size=2)
    >>> [[k.index for k in batch] for batch in s]
    [[2, 3], [6, 7]]
    >>> [[k.index for k in batch] for batch in s.batches(0, 4)]   # resumed after one step
    [[6, 7]]
    >>> list(ElasticSampler(Ten(), batch_size=2, rank=1, world_size=2, end="pad").batches(0, 8))
    [[SampleKey(epoch=0, index=-1), SampleKey(epoch=0, index=-1)]]
"""

from __future__ import annotations

import operator
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Self, SupportsIndex

import numpy as np
import torch

from impl._arrays import distinct_ints
from impl.errors import ConfigError, SharedEpochError, StateError, TopologyError, is_int, is_integer, require
from reference.packing import IGNORE, NO_DOC, NO_OFFSET, PackingConfig
from reference.partition import END_POLICIES, PADDING, PartitionConfig

__all__ = ["PADDING_FIELDS", "ElasticSampler", "SampleKey", "SharedEpoch", "advance", "distributed_topology", "group_batch",
           "padding_rows", "resolve_end", "resolve_key", "resolve_keys", "steps_in_epoch", "trained_end"]


class SampleKey(NamedTuple):
    """Which sample to compute: ``index`` of epoch ``epoch``'s global stream; ``index == -1`` (PADDING) is padding.

    Defined here, where keys are made; ``impl.dataset`` re-exports it.
    """

    epoch: int
    index: int  # type: ignore[assignment]  # shadows tuple.index; the field name is the public API


PADDING_FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")
"""The token fields of a sample, in the order ``padding_rows`` returns them."""


def padding_rows(rows: int, config: PackingConfig) -> dict[str, np.ndarray]:
    """``rows`` padding samples (PART-5), int64 ``[rows, seq_len]`` per field: fully masked, of no document.

    What a ``pad`` end policy hands out in a slot past the epoch's last
    sample: ``pad_id`` inputs, ``IGNORE`` labels, position 0 (every position
    starts a segment), doc id and token offset -1.

    >>> from reference.packing import PackingConfig
    >>> out = padding_rows(2, PackingConfig(seq_len=3, pad_id=9))
    >>> out["input_ids"].tolist(), out["labels"][0].tolist(), out["doc_ids"].shape
    ([[9, 9, 9], [9, 9, 9]], [-100, -100, -100], (2, 3))
    """
    require(is_int(rows) and rows >= 0, ConfigError, f"rows={rows!r} must be an integer >= 0")
    shape = (rows, config.seq_len)
    fills = (config.pad_id, IGNORE, 0, NO_DOC, NO_OFFSET)
    return {name: np.full(shape, fill, dtype=np.int64) for name, fill in zip(PADDING_FIELDS, fills)}


def resolve_end(dataset: Any, end: str | None) -> str:
    """The end-of-epoch policy: the dataset's config decides it; ``end`` may only repeat it.

    Why one owner: ``end`` is part of the pipeline config and so of the
    fingerprint in every state (RES-3). A loader that dropped the tail while
    the state said ``pad`` would resume into different data than it records.
    A dataset without a ``config.end`` (a duck-typed test dataset) takes
    ``end`` as given, ``"drop_last"`` by default.

    >>> class Padded:
    ...     class config: end = "pad"
    >>> resolve_end(Padded(), None), resolve_end(Padded(), "pad")
    ('pad', 'pad')
    >>> resolve_end(Padded(), "drop_last")
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: end='drop_last' contradicts the dataset's end='pad' (part of its config and fingerprint); leave end unset (the loader reads it from the dataset) or build the dataset with end='drop_last'
    """
    owned = getattr(getattr(dataset, "config", None), "end", None)
    require(end is None or end in END_POLICIES, ConfigError,
            f"end={end!r} is not an end-of-epoch policy; choose one of {END_POLICIES}")
    if owned is None:
        return end or "drop_last"
    require(end is None or end == owned, ConfigError,
            f"end={end!r} contradicts the dataset's end={owned!r} (part of its config and fingerprint); leave end "
            f"unset (the loader reads it from the dataset) or build the dataset with end={end!r}")
    return str(owned)


def distributed_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments when given, else ``torch.distributed``'s, else ``(0, 1)``.

    Why both or the process group: a rank given without its world size (or
    the other way round) mixed with the process group's other half is the
    classic way to build a loader for the wrong job; refuse it.

    >>> distributed_topology(None, None)     # no process group initialised
    (0, 1)
    >>> distributed_topology(2, 4)
    (2, 4)
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size)
    require(rank is None and world_size is None, TopologyError,
            f"rank={rank!r}, world_size={world_size!r}: pass both, or neither with torch.distributed initialised "
            "(then they come from the process group)")
    return 0, 1


def group_batch(consumed: int, num_samples: int, config: PartitionConfig, group: int) -> list[int]:
    """Group ``group``'s global sample indices of the step at ``consumed`` (PART-2, PART-4..PART-7).

    ``[]`` when the epoch has no further step. O(B): the other groups' lists
    are never built, so a step costs the same on 2 ranks as on 2048.
    Conformance: equal to ``reference.partition.step_slice(...)[group]``.

    >>> cfg = PartitionConfig(world_size=2, batch_size=2, end="even")
    >>> group_batch(4, 7, cfg, 1), group_batch(0, 7, cfg, 1)
    ([5], [2, 3])

    Clauses: PART-2, PART-4, PART-5, PART-6, PART-7.
    """
    require(is_int(consumed) and 0 <= consumed <= num_samples, StateError,
            f"consumed={consumed!r} must be an integer in [0, num_samples={num_samples}]; "
            "the position belongs to another epoch or other data: restart the epoch at consumed=0")
    groups, size = config.data_parallel_size, config.batch_size
    remaining = num_samples - consumed
    if remaining >= groups * size:
        first = consumed + group * size
        return list(range(first, first + size))
    if remaining == 0 or config.end == "drop_last":
        return []
    if config.end == "pad":
        first = consumed + group * size
        return [i if i < num_samples else PADDING for i in range(first, first + size)]
    share = remaining // groups
    if share == 0:
        return []
    first = consumed + group * share
    return list(range(first, first + share))


def resolve_keys(keys: Sequence[Any], resolve: Callable[[Any], tuple[int, int]],
                 num_samples: Callable[[int], int]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(epochs, indices)`` int64 of a batch of keys, each checked as ``resolve`` checks one key (same errors).

    One rule for every keyed dataset's batch path (``PackedDataset``,
    ``MixedDataset``): ``SampleKey``s of plain ints (what ``ElasticSampler``
    yields) are checked together (epochs >= 0, indices in ``[-1,
    num_samples(epoch))``), any other key goes through ``resolve``. On a bad
    key the keys are resolved one by one, so the error is the one
    ``ds[key]`` raises for the first bad key. None when a value does not fit
    int64 (every key resolved alone first; the caller decides).

    >>> resolve_keys([SampleKey(0, 3), SampleKey(0, -1)], lambda k: k, lambda e: 10)
    (array([0, 0]), array([ 3, -1]))
    """
    pairs = [k if type(k) is SampleKey and type(k[0]) is int and type(k[1]) is int else resolve(k) for k in keys]
    try:
        arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    except OverflowError:
        for key in keys:
            resolve(key)
        return None
    epochs, indices = arr[:, 0], arr[:, 1]
    if len(arr) and not _keys_in_range(epochs, indices, num_samples):
        for key in keys:
            resolve(key)
        raise AssertionError(f"keys {keys!r} failed the batch check but none fails alone")  # pragma: no cover
    return epochs, indices


def _keys_in_range(epochs: np.ndarray, indices: np.ndarray, num_samples: Callable[[int], int]) -> bool:
    if int(epochs.min()) < 0 or int(indices.min()) < PADDING:
        return False
    real = indices != PADDING
    return all(int(indices[real & (epochs == e)].max()) < num_samples(e) for e in distinct_ints(epochs[real]))


class SharedEpoch:
    """The epoch a plain int index refers to, held in one shared-memory int64: a mixin of the keyed datasets.

    Why shared memory: a plain ``DataLoader(ds, num_workers=2,
    persistent_workers=True)`` keeps the copies of the dataset its workers got
    when they started, so an attribute set by ``ds.set_epoch(1)`` in the
    training process never reaches them and epoch 0 repeats. The cell is
    shared with forked workers (inherited mapping) and spawned ones (torch's
    pickler shares the storage); plain ``pickle`` copies the value. Keys that
    carry their epoch (``SampleKey``, what ``build_dataloader`` uses) do not
    need it.

    Why the cell is allocated late: allocating it (a shared-memory file)
    costs ~0.1 ms, a twentieth of a fresh resume, and a process without
    workers never needs it. Until a copy of the dataset can leave the
    process the epoch is a plain attribute; the cell is made, holding that
    epoch, just before any ``os.fork`` (``os.register_at_fork``: forked
    workers inherit it) and when the dataset is pickled or copied
    (``__reduce_ex__``: spawned workers share it).

    If the cell cannot be allocated before a fork, the fork goes ahead (a
    fork hook cannot refuse) with a ``RuntimeWarning``, and every later
    ``set_epoch`` raises ``SharedEpochError``: forked workers would not see it.

    >>> class Keyed(SharedEpoch): pass
    >>> ds = Keyed(); ds.set_epoch(3); ds.epoch
    3
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = super().__new__(cls)
        _UNSHARED[id(self)] = self     # every instance, so a fork shares even an epoch that was never set
        return self

    def set_epoch(self, epoch: int) -> None:
        """The epoch a plain int index refers to (keys carry their own), in this process and in DataLoader workers."""
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self.epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch of plain int indices (0 until ``set_epoch``)."""
        state = self.__dict__
        cell = state.get("_epoch_cell")
        return int(state.get("_epoch_value", 0)) if cell is None else int(cell.item())

    @epoch.setter
    def epoch(self, value: int) -> None:
        cell = self.__dict__.get("_epoch_cell")
        if cell is None:
            failure = self.__dict__.get("_share_failure")
            if failure is not None:
                raise SharedEpochError(
                    f"set_epoch({value}) cannot reach this dataset's forked workers: its epoch could not be put in "
                    f"shared memory before the fork ({failure}); free shared memory (/dev/shm) and restart the "
                    "workers, or use build_dataloader, whose keys carry their epoch")
            self._epoch_value = int(value)   # shared before a fork: __new__ registered every instance
        else:
            cell.fill_(int(value))

    def _share_epoch(self) -> torch.Tensor:
        """The shared-memory cell of the epoch, allocated now if it was not yet (holding the current epoch)."""
        cell: torch.Tensor | None = self.__dict__.get("_epoch_cell")
        if cell is None:
            cell = torch.tensor(self.epoch, dtype=torch.int64).share_memory_()
            self._epoch_cell = cell
            self.__dict__.pop("_epoch_value", None)
            _UNSHARED.pop(id(self), None)
        return cell

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        self._share_epoch()
        return super().__reduce_ex__(protocol)


_UNSHARED: weakref.WeakValueDictionary[int, SharedEpoch] = weakref.WeakValueDictionary()
"""The live ``SharedEpoch`` objects whose epoch is not in shared memory yet (keyed by ``id``: datasets need not hash)."""


def _share_before_fork() -> None:
    for dataset in list(_UNSHARED.values()):
        try:
            dataset._share_epoch()
        except (OSError, RuntimeError) as exc:   # a fork hook cannot refuse the fork: so set_epoch refuses later
            dataset.__dict__["_share_failure"] = f"{type(exc).__name__}: {exc}"
            _UNSHARED.pop(id(dataset), None)
            warnings.warn(f"{type(dataset).__name__}'s epoch could not be put in shared memory before os.fork "
                          f"({type(exc).__name__}: {exc}); set_epoch will refuse, as forked workers would not see it",
                          RuntimeWarning, stacklevel=2)


os.register_at_fork(before=_share_before_fork)


def resolve_key(key: Any, epoch: int, num_samples: Callable[[int], int], what: str = "") -> tuple[int, int]:
    """``(epoch, index)`` of a dataset key: a ``SampleKey(epoch, index)`` or an int index into ``epoch``.

    One rule for every dataset that takes keys (``PackedDataset``,
    ``MixedDataset``): a key's index is in ``[0, num_samples(epoch))`` or
    ``PADDING``; an int counts from the end when negative, like a list.
    ``what`` names the dataset in errors (e.g. ``" of the mixture"``).

    >>> resolve_key(SampleKey(1, 3), 0, lambda e: 10), resolve_key(-1, 2, lambda e: 10)
    ((1, 3), (2, 9))
    """
    if isinstance(key, tuple):
        require(len(key) == 2, ConfigError, f"key={key!r} must be SampleKey(epoch, index) or an int index")
        key_epoch, index = key
        require(is_integer(key_epoch) and key_epoch >= 0, ConfigError, f"key epoch={key_epoch!r} must be an integer >= 0")
        require(is_integer(index), ConfigError, f"key index={index!r} must be an integer (-1 for padding)")
        key_epoch, index = int(key_epoch), int(index)
        if index != PADDING:
            total = num_samples(key_epoch)
            if not 0 <= index < total:
                raise IndexError(f"SampleKey({key_epoch}, {index}): epoch {key_epoch}{what} has {total} samples "
                                 f"(indices 0..{total - 1}; -1 is the padding sample)")
        return key_epoch, index
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"index {key!r} is a bool; pass an int or a SampleKey(epoch, index)")
    try:
        index = operator.index(key)
    except TypeError:
        raise TypeError(f"index must be an int or a SampleKey(epoch, index), not {type(key).__name__}") from None
    total = num_samples(epoch)
    if index < 0:
        index += total
    if not 0 <= index < total:
        raise IndexError(f"index {key} out of range: epoch {epoch}{what} has {total} samples")
    return epoch, index


def _check_position(consumed: int, num_samples: int) -> None:
    require(is_int(consumed) and 0 <= consumed <= num_samples, StateError,
            f"consumed={consumed!r} must be an integer in [0, num_samples={num_samples}]; "
            "the position belongs to another epoch or other data: restart the epoch at consumed=0")


def advance(consumed: int, num_samples: int, config: PartitionConfig) -> int:
    """The position after the step at ``consumed`` (PART-3, PART-7): ``+G`` for a full step, else the epoch's end.

    A partial or absent step is the epoch's last, so the position jumps to
    ``num_samples`` and stays there; a state taken after it never trains the
    dropped tail (PART-8).

    >>> cfg = PartitionConfig(world_size=2, batch_size=2)
    >>> advance(0, 7, cfg), advance(4, 7, cfg), advance(7, 7, cfg)
    (4, 7, 7)
    """
    _check_position(consumed, num_samples)
    step = config.global_batch_size
    return consumed + step if num_samples - consumed >= step else num_samples


def steps_in_epoch(num_samples: int, config: PartitionConfig, start: int = 0) -> int:
    """Steps from position ``start`` to the epoch's end, in O(1) (PART-10).

    ``floor(R / G)`` full steps for ``R = S - start``, plus one last step when
    ``pad`` leaves a remainder or ``even`` leaves at least one sample per group.

    >>> [steps_in_epoch(10, PartitionConfig(world_size=4, end=e)) for e in ("drop_last", "pad", "even")]
    [2, 3, 2]
    """
    _check_position(start, num_samples)
    full, rest = divmod(num_samples - start, config.global_batch_size)
    if config.end == "pad":
        return full + (rest > 0)
    if config.end == "even":
        return full + (rest >= config.data_parallel_size)
    return full


def trained_end(start: int, num_samples: int, config: PartitionConfig) -> int:
    """Where the trained prefix of the epoch ends when its rest, from ``start``, runs under ``config`` (PART-8).

    Full steps cover ``G`` each; the last partial step covers all of the rest
    under ``pad``, ``D * floor(R / D)`` of it under ``even`` and none under
    ``drop_last``. The coverage audit needs it: samples past it are the
    tail the end policy lets go, not losses.

    >>> [trained_end(4, 11, PartitionConfig(world_size=3, end=e)) for e in ("drop_last", "pad", "even")]
    [10, 11, 10]
    """
    _check_position(start, num_samples)
    if config.end == "pad":
        return num_samples
    full, rest = divmod(num_samples - start, config.global_batch_size)
    end = start + full * config.global_batch_size
    if config.end == "even":
        return end + rest - rest % config.data_parallel_size
    return end


Position = Callable[[], tuple[int, int]]
"""Where iteration starts: ``() -> (epoch, consumed)``; the loader's ``position`` method."""


class ElasticSampler:
    """A batch sampler (for ``DataLoader(batch_sampler=...)``) of one rank's ``SampleKey`` batches.

    ``dataset`` needs ``num_samples(epoch)``; its ``config.end`` (when it has
    one) is the end-of-epoch policy, and ``end`` may only repeat it
    (``resolve_end``). ``rank``/``world_size`` default to
    ``torch.distributed``'s when a process group is initialised, else
    ``0``/``1``. ``replication`` consecutive ranks (a tensor/sequence-parallel
    group) receive identical batches (PART-1).

    The sampler keeps no position: ``iter(sampler)`` yields
    ``batches(*position())``, where ``position`` is the loader's (by default
    the dataset's current epoch from its start). ``len(sampler)`` is the
    number of batches that iteration yields (PART-10).

    Refuses impossible topologies with the fix (PART-12): ``rank >= world_size``,
    a replication that does not divide the world size (``TopologyError``), a
    batch size below 1 or an unknown ``end`` (``ConfigError``, as in the
    reference).

    >>> class Seven:
    ...     epoch = 0
    ...     def num_samples(self, epoch): return 7
    >>> s = ElasticSampler(Seven(), batch_size=2, world_size=2, rank=0, end="pad")
    >>> len(s), [[k.index for k in b] for b in s]
    (2, [[0, 1], [4, 5]])
    """

    def __init__(self, dataset: Any, *, batch_size: int, rank: int | None = None, world_size: int | None = None,
                 replication: int = 1, end: str | None = None, position: Position | None = None) -> None:
        rank, world_size = distributed_topology(rank, world_size)
        require(callable(getattr(dataset, "num_samples", None)), ConfigError,
                f"{type(dataset).__name__} has no num_samples(epoch); pass an impl.dataset.PackedDataset")
        self.config = PartitionConfig(world_size=world_size, batch_size=batch_size, replication=replication,
                                      end=resolve_end(dataset, end))  # type: ignore[arg-type]
        require(is_int(rank) and 0 <= rank < world_size, TopologyError,
                f"rank={rank!r} must be an integer in [0, world_size={world_size}); pass one of 0..{world_size - 1}")
        self.dataset = dataset
        self.rank = rank
        self.group = rank // replication
        self.position: Position = position or self._dataset_epoch

    def _dataset_epoch(self) -> tuple[int, int]:
        epoch = getattr(self.dataset, "epoch", 0)
        return (int(epoch) if is_int(epoch) and epoch >= 0 else 0), 0

    def num_samples(self, epoch: int) -> int:
        return int(self.dataset.num_samples(epoch))

    def batches(self, epoch: int, consumed: int) -> Iterator[list[SampleKey]]:
        """This rank's batches of ``epoch`` from position ``consumed`` to the epoch's end (PART-2..PART-9).

        The sample count and the position are checked now, not at the first
        ``next()``: the DataLoader creates this iterator when its own iterator
        is created.
        """
        require(is_int(epoch) and epoch >= 0, StateError, f"epoch={epoch!r} must be an integer >= 0")
        total = self.num_samples(epoch)
        _check_position(consumed, total)
        return self._batches(epoch, consumed, total)

    def _batches(self, epoch: int, consumed: int, total: int) -> Iterator[list[SampleKey]]:
        config, group = self.config, self.group
        while batch := group_batch(consumed, total, config, group):
            yield [SampleKey(epoch, i) for i in batch]
            consumed = advance(consumed, total, config)

    def __iter__(self) -> Iterator[list[SampleKey]]:
        return self.batches(*self.position())

    def __len__(self) -> int:
        """Batches ``iter(self)`` yields from the current position (PART-10)."""
        epoch, consumed = self.position()
        return steps_in_epoch(self.num_samples(epoch), self.config, consumed)

    def __repr__(self) -> str:
        c = self.config
        return (f"ElasticSampler(rank={self.rank}, world_size={c.world_size}, replication={c.replication}, "
                f"batch_size={c.batch_size}, end={c.end!r})")
