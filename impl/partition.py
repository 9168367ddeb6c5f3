"""Partition: one rank's batches of an epoch, as ``SampleKey``s a torch DataLoader hands to its workers.

Conforms to PART-1 .. PART-12 (docs/SEMANTICS.md, "Partition across ranks")
and, through the loader that owns the position, RES-4 / RES-5 / RES-7
("Resume"). The arithmetic (``group_batch``, ``advance``,
``steps_in_epoch``, ``trained_end``) is impl's own, in O(B) per step and
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

import functools
from collections.abc import Callable, Iterator
from typing import Any

from impl.errors import ConfigError, StateError, TopologyError, is_int, require
from impl.keys import SampleKey
from reference.partition import END_POLICIES, PADDING, PartitionConfig

__all__ = ["ElasticSampler", "advance", "distributed_topology", "group_batch", "resolve_end", "steps_in_epoch",
           "trained_end"]


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


def _dataset_epoch(dataset: Any) -> tuple[int, int]:
    """``(dataset.epoch, 0)``: where a sampler without a loader starts (epoch 0 when the dataset has none)."""
    epoch = getattr(dataset, "epoch", 0)
    return (int(epoch) if is_int(epoch) and epoch >= 0 else 0), 0


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
        # Not a bound method of self: a sampler that referred to itself would be freed (with its dataset's
        # mapped files) only by the cyclic garbage collector.
        self.position: Position = position or functools.partial(_dataset_epoch, dataset)

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
