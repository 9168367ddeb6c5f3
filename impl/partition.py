"""ElasticSampler: one rank's batches of an epoch, as keys a torch DataLoader hands to its workers.

Conforms to PART-1 .. PART-12 (docs/SEMANTICS.md, "Partition across ranks")
and, through the loader that moves it, RES-4 / RES-5 / RES-7 ("Resume").

Why a batch sampler of keys: torch's DataLoader computes batches in worker
processes that hold their own copy of the dataset, and persistent workers
never see ``set_epoch`` called in the main process. A key ``SampleKey(epoch,
index)`` carries everything a worker needs, so workers stay stateless and the
epoch cannot go stale. The sampler itself is a pure description of
"epoch ``e`` from position ``consumed``": iterating it never moves it. The
loader (``impl.loader.ElasticLoader``) moves it, counting only batches handed
to the training loop (RES-6), because a DataLoader iterates its batch sampler
ahead of the training loop whenever workers prefetch.

The arithmetic is ``reference.partition``'s, specialised to one group: the
batch of group ``g`` at position ``c`` is found in O(B) without building the
other groups' lists, so a step costs the same on 2 ranks as on 2048.

Worked example (S = 10 samples, 2 ranks, B = 2, so G = 4)::

    >>> class Ten:                      # any dataset with num_samples(epoch) works
    ...     epoch = 0
    ...     def num_samples(self, epoch): return 10
    >>> s = ElasticSampler(Ten(), batch_size=2, rank=1, world_size=2)
    >>> [[k.index for k in batch] for batch in s]
    [[2, 3], [6, 7]]
    >>> s.set_position(0, 4)            # resume after one step ...
    >>> [[k.index for k in batch] for batch in s]
    [[6, 7]]
    >>> ElasticSampler(Ten(), batch_size=2, rank=1, world_size=2, end="pad").batch_at(0, 8)
    [SampleKey(epoch=0, index=-1), SampleKey(epoch=0, index=-1)]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from impl.dataset import SampleKey  # the key type PackedDataset.__getitem__ accepts
from impl.errors import ConfigError, StateError, TopologyError, is_int, require
from reference.partition import PADDING, PartitionConfig, advance, steps_in_epoch

__all__ = ["ElasticSampler", "SampleKey", "group_batch", "distributed_topology"]


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
    """Group ``group``'s global sample indices of the step at ``consumed``: ``reference.partition.step_slice(...)[group]``.

    ``[]`` when the epoch has no further step. O(B), bit for bit the reference.

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


class ElasticSampler:
    """A batch sampler (for ``DataLoader(batch_sampler=...)``) of one rank's ``SampleKey`` batches.

    ``dataset`` needs ``num_samples(epoch)`` (and ``epoch``, the starting
    epoch). ``rank``/``world_size`` default to ``torch.distributed``'s when a
    process group is initialised, else ``0``/``1``. ``replication`` consecutive
    ranks (a tensor/sequence-parallel group) receive identical batches
    (PART-1). ``end`` is the end-of-epoch policy (PART-4..6).

    Refuses impossible topologies with the fix (PART-12): ``rank >= world_size``,
    a replication that does not divide the world size (``TopologyError``), a
    batch size below 1 or an unknown ``end`` (``ConfigError``, as in the
    reference).

    ``len(sampler)`` is the number of steps of the current epoch from its
    start (PART-10), as with ``DistributedSampler``; ``steps_remaining`` counts
    from the current position.

    >>> class Seven:
    ...     epoch = 0
    ...     def num_samples(self, epoch): return 7
    >>> s = ElasticSampler(Seven(), batch_size=2, world_size=2, rank=0, end="pad")
    >>> len(s), s.steps_remaining, [[k.index for k in b] for b in s]
    (2, 2, [[0, 1], [4, 5]])
    """

    def __init__(self, dataset: Any, *, batch_size: int, rank: int | None = None, world_size: int | None = None,
                 replication: int = 1, end: str = "drop_last") -> None:
        rank, world_size = distributed_topology(rank, world_size)
        self.config = PartitionConfig(world_size=world_size, batch_size=batch_size, replication=replication, end=end)
        require(is_int(rank) and 0 <= rank < world_size, TopologyError,
                f"rank={rank!r} must be an integer in [0, world_size={world_size}); pass one of 0..{world_size - 1}")
        require(callable(getattr(dataset, "num_samples", None)), ConfigError,
                f"{type(dataset).__name__} has no num_samples(epoch); pass an impl.dataset.PackedDataset")
        self.dataset = dataset
        self.rank = rank
        self.group = rank // replication
        epoch = getattr(dataset, "epoch", 0)
        self._epoch = epoch if is_int(epoch) and epoch >= 0 else 0
        self._consumed = 0

    # ------------------------------------------------------------ position

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Samples of the epoch's global stream before the position this sampler iterates from (PART-3)."""
        return self._consumed

    @property
    def state(self) -> dict[str, int]:
        """The position as a small dict; the loader wraps it into the full resume state (RES-2)."""
        return {"epoch": self._epoch, "consumed": self._consumed}

    def num_samples(self, epoch: int | None = None) -> int:
        return int(self.dataset.num_samples(self._epoch if epoch is None else epoch))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the position already sits inside it (RES-7)."""
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        if epoch != self._epoch:
            self._epoch, self._consumed = epoch, 0

    def set_position(self, epoch: int, consumed: int) -> None:
        """Iterate from sample ``consumed`` of epoch ``epoch`` (a position reached on any topology, PART-3)."""
        require(is_int(epoch) and epoch >= 0, StateError, f"epoch={epoch!r} must be an integer >= 0")
        total = self.num_samples(epoch)
        require(is_int(consumed) and 0 <= consumed <= total, StateError,
                f"consumed={consumed!r} must be an integer in [0, {total}] (the samples of epoch {epoch}); "
                "the position belongs to other data or another config: restart the epoch at consumed=0")
        self._epoch, self._consumed = epoch, consumed

    # ------------------------------------------------------------ steps

    def batch_at(self, epoch: int, consumed: int) -> list[SampleKey]:
        """This rank's keys of the step at position ``consumed`` of ``epoch`` (``[]``: no such step)."""
        total = self.num_samples(epoch)
        return [SampleKey(epoch, i) for i in group_batch(consumed, total, self.config, self.group)]

    def advance(self, consumed: int, epoch: int | None = None) -> int:
        """The position after the step at ``consumed`` (``reference.partition.advance``, PART-3/PART-7)."""
        return advance(consumed, self.num_samples(epoch), self.config)

    def __len__(self) -> int:
        """Steps in the current epoch, from its start (PART-10)."""
        return steps_in_epoch(self.num_samples(), self.config)

    @property
    def steps_remaining(self) -> int:
        """Steps left in the current epoch from the current position (PART-10)."""
        return steps_in_epoch(self.num_samples(), self.config, self._consumed)

    def __iter__(self) -> Iterator[list[SampleKey]]:
        # Capture the position now, not at the first next(): the DataLoader creates
        # this iterator when its own iterator is created, and the position may move after.
        return self._batches(self._epoch, self._consumed, self.num_samples())

    def _batches(self, epoch: int, consumed: int, total: int) -> Iterator[list[SampleKey]]:
        config, group = self.config, self.group
        while batch := group_batch(consumed, total, config, group):
            yield [SampleKey(epoch, i) for i in batch]
            consumed = advance(consumed, total, config)

    def __repr__(self) -> str:
        c = self.config
        return (f"ElasticSampler(rank={self.rank}, world_size={c.world_size}, replication={c.replication}, "
                f"batch_size={c.batch_size}, end={c.end!r}, epoch={self._epoch}, consumed={self._consumed})")
