"""Partition: one epoch's global sample stream cut into per-rank batches, resumable on any topology (PART-*).

Why this shape: the only state is ``consumed``, the number of samples of the
epoch's global stream (sample indices ``0..S-1`` in the epoch's order) that
steps have covered so far. It mentions no world size, batch size or worker
count, so a job that stops after some steps can resume on a different number
of ranks, with a different batch size, and continue exactly where the global
stream stopped: nothing trained twice, nothing skipped (PART-3, PART-8).

Each step takes the next global batch of ``G = D * B`` samples, where
``D = world_size // replication`` is the number of data-parallel groups and
``B`` the per-rank micro-batch; group g takes the g-th contiguous block of
``B`` (Megatron's layout, PART-2). What happens to the last ``R < G``
samples is the ``end`` policy (PART-4..PART-6).

Worked example (S = 10, 2 ranks, B = 2, so G = 4)::

    >>> cfg = PartitionConfig(world_size=2, batch_size=2)
    >>> epoch_steps(10, cfg)
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    >>> epoch_steps(10, PartitionConfig(world_size=2, batch_size=2, end="pad"))[-1]
    [[8, 9], [-1, -1]]
    >>> resumed_at = advance(0, 10, cfg)           # stop after one step on 2 ranks ...
    >>> resumed_at
    4
    >>> epoch_steps(10, PartitionConfig(world_size=3), start=resumed_at)  # ... resume on 3 ranks, B = 1
    [[[4], [5], [6]], [[7], [8], [9]]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from reference.errors import ConfigError, StateError, TopologyError, is_int, require

End = Literal["drop_last", "pad", "even"]
END_POLICIES = ("drop_last", "pad", "even")
PADDING = -1
"""The sample index of a padding slot (PART-5): the collator masks such a sample entirely."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionConfig:
    """The topology and batch shape of one training run (PART-1, PART-12).

    ``replication`` consecutive ranks (a tensor- or sequence-parallel group)
    receive the same batch; ``world_size // replication`` data-parallel groups
    split the data.

    >>> cfg = PartitionConfig(world_size=8, batch_size=4, replication=2)
    >>> cfg.data_parallel_size, cfg.global_batch_size
    (4, 16)
    >>> PartitionConfig(world_size=6, replication=4)
    Traceback (most recent call last):
    ...
    reference.errors.TopologyError: replication=4 must divide world_size=6; choose a divisor of 6: one of [1, 2, 3, 6]
    """

    world_size: int = 1
    batch_size: int = 1
    replication: int = 1
    end: End = "drop_last"

    def __post_init__(self) -> None:
        require(is_int(self.world_size) and self.world_size >= 1, TopologyError,
                f"world_size={self.world_size!r} must be an integer >= 1; a job has at least one rank")
        require(is_int(self.batch_size) and self.batch_size >= 1, ConfigError,
                f"batch_size={self.batch_size!r} must be an integer >= 1 (samples per rank per step)")
        require(is_int(self.replication) and self.replication >= 1, TopologyError,
                f"replication={self.replication!r} must be an integer >= 1; use replication=1 for no replication")
        divisors = [d for d in range(1, self.world_size + 1) if self.world_size % d == 0]
        require(self.world_size % self.replication == 0, TopologyError,
                f"replication={self.replication} must divide world_size={self.world_size}; "
                f"choose a divisor of {self.world_size}: one of {divisors}")
        require(self.end in END_POLICIES, ConfigError,
                f"end={self.end!r} is not an end-of-epoch policy; choose one of {END_POLICIES}")

    @property
    def data_parallel_size(self) -> int:
        """D: the number of groups that receive distinct data (PART-1)."""
        return self.world_size // self.replication

    @property
    def global_batch_size(self) -> int:
        """G = D * B: the samples one full step takes from the global stream (PART-2)."""
        return self.data_parallel_size * self.batch_size


def _check_position(consumed: int, num_samples: int) -> None:
    require(is_int(num_samples) and num_samples >= 0, ConfigError,
            f"num_samples={num_samples!r} must be an integer >= 0 (the samples of the epoch)")
    require(is_int(consumed) and 0 <= consumed <= num_samples, StateError,
            f"consumed={consumed!r} must be an integer in [0, num_samples={num_samples}]; "
            "the position belongs to another epoch or other data: restart the epoch at consumed=0")


def _check_rank(rank: int, config: PartitionConfig) -> None:
    require(is_int(rank) and 0 <= rank < config.world_size, TopologyError,
            f"rank={rank!r} must be an integer in [0, world_size={config.world_size}); pass one of 0..{config.world_size - 1}")


def _check_workers(num_workers: int) -> None:
    require(is_int(num_workers) and num_workers >= 1, TopologyError,
            f"num_workers={num_workers!r} must be an integer >= 1; torch's num_workers=0 (main process) is num_workers=1")


def data_parallel_group(rank: int, config: PartitionConfig) -> int:
    """The data-parallel group of ``rank``: ``rank // replication`` (PART-1).

    >>> [data_parallel_group(r, PartitionConfig(world_size=4, replication=2)) for r in range(4)]
    [0, 0, 1, 1]

    Clauses: PART-1, PART-12.
    """
    _check_rank(rank, config)
    return rank // config.replication


def step_slice(consumed: int, num_samples: int, config: PartitionConfig) -> list[list[int]]:
    """The next step from position ``consumed``: for each data-parallel group, its global sample indices.

    Why contiguous blocks per group: it is Megatron's layout, and it makes a
    step a pure function of ``consumed`` alone, so any topology can take the
    next step. An empty list means the epoch has no further step.

    Worked example (S = 7, D = 2, B = 2, so G = 4; from consumed = 4, R = 3 remain)::

        >>> step_slice(0, 7, PartitionConfig(world_size=2, batch_size=2))
        [[0, 1], [2, 3]]
        >>> step_slice(4, 7, PartitionConfig(world_size=2, batch_size=2))
        []
        >>> step_slice(4, 7, PartitionConfig(world_size=2, batch_size=2, end="pad"))
        [[4, 5], [6, -1]]
        >>> step_slice(4, 7, PartitionConfig(world_size=2, batch_size=2, end="even"))
        [[4], [5]]

    Clauses: PART-2, PART-4, PART-5, PART-6, PART-7, PART-12.
    """
    _check_position(consumed, num_samples)
    groups, size = config.data_parallel_size, config.batch_size
    remaining = num_samples - consumed
    if remaining >= groups * size:
        return [list(range(consumed + g * size, consumed + (g + 1) * size)) for g in range(groups)]
    if remaining == 0 or config.end == "drop_last":
        return []
    if config.end == "pad":
        return [[i if i < num_samples else PADDING for i in range(consumed + g * size, consumed + (g + 1) * size)]
                for g in range(groups)]
    share = remaining // groups
    if share == 0:
        return []
    return [list(range(consumed + g * share, consumed + (g + 1) * share)) for g in range(groups)]


def rank_batch(consumed: int, num_samples: int, config: PartitionConfig, rank: int) -> list[int]:
    """Rank ``rank``'s batch of the next step: its data-parallel group's list (``[]`` when the epoch is over).

    >>> cfg = PartitionConfig(world_size=4, batch_size=2, replication=2)
    >>> [rank_batch(0, 8, cfg, r) for r in range(4)]
    [[0, 1], [0, 1], [2, 3], [2, 3]]

    Clauses: PART-1, PART-2, PART-12.
    """
    group = data_parallel_group(rank, config)
    step = step_slice(consumed, num_samples, config)
    return step[group] if step else []


def advance(consumed: int, num_samples: int, config: PartitionConfig) -> int:
    """The position after the next step.

    Why this definition: a full step covers ``G`` samples, so ``consumed``
    grows by ``G``. A step that is partial (``pad``, ``even``) or absent
    (``drop_last``, or too few samples for ``even``) is the epoch's last: it
    covers or deliberately drops everything left, so ``consumed`` becomes S,
    where it stays. ``consumed`` therefore only ever takes the values
    ``start + t*G`` and S, and every loop over steps terminates. A training
    loop calls ``advance`` after every ``step_slice``, including the one that
    returns ``[]``, so that a checkpoint taken after the epoch records S and a
    resume under a smaller global batch cannot train the dropped tail.

    >>> cfg = PartitionConfig(world_size=2, batch_size=2)
    >>> advance(0, 7, cfg), advance(4, 7, cfg), advance(7, 7, cfg)
    (4, 7, 7)

    Clauses: PART-3, PART-7, PART-8.
    """
    _check_position(consumed, num_samples)
    step = config.global_batch_size
    return consumed + step if num_samples - consumed >= step else num_samples


def epoch_steps(num_samples: int, config: PartitionConfig, start: int = 0) -> list[list[list[int]]]:
    """Every step of the epoch from position ``start``: ``steps[t][g]`` is group g's batch at step t.

    >>> epoch_steps(5, PartitionConfig(world_size=2, end="even"), start=1)
    [[[1], [2]], [[3], [4]]]

    Clauses: PART-2, PART-3, PART-7, PART-8, PART-9.
    """
    steps, consumed = [], start
    while step := step_slice(consumed, num_samples, config):
        steps.append(step)
        consumed = advance(consumed, num_samples, config)
    return steps


def trained_end(start: int, num_samples: int, config: PartitionConfig) -> int:
    """Where the trained prefix ``[0, S')`` of the epoch ends when its rest, from ``start``, runs under ``config`` (PART-8).

    Why: an audit of "every sample exactly once" must know which samples the
    end policy lets go untrained, and that depends only on the config that
    finishes the epoch. Full steps cover ``G`` each; the last partial step
    covers all of the rest under ``pad`` and ``D * floor(R / D)`` under ``even``.

    >>> [trained_end(4, 11, PartitionConfig(world_size=3, end=e)) for e in END_POLICIES]
    [10, 11, 10]

    Clauses: PART-4, PART-5, PART-6, PART-8.
    """
    _check_position(start, num_samples)
    full, rest = divmod(num_samples - start, config.global_batch_size)
    end = start + full * config.global_batch_size
    if config.end == "pad":
        return num_samples
    if config.end == "even":
        return end + rest - rest % config.data_parallel_size
    return end


def steps_in_epoch(num_samples: int, config: PartitionConfig, start: int = 0) -> int:
    """The number of steps ``epoch_steps`` yields, in O(1) (PART-10).

    Why: schedulers and progress bars need it before the epoch runs.
    ``floor(R / G)`` full steps for ``R = S - start``, plus one final step when
    ``pad`` leaves ``R mod G > 0`` samples, or ``even`` leaves at least D.

    >>> [steps_in_epoch(10, PartitionConfig(world_size=4, end=e)) for e in END_POLICIES]
    [2, 3, 2]

    Clauses: PART-10.
    """
    _check_position(start, num_samples)
    full, rest = divmod(num_samples - start, config.global_batch_size)
    if config.end == "pad":
        return full + (rest > 0)
    if config.end == "even":
        return full + (rest >= config.data_parallel_size)
    return full


def worker_of_batch(batch_number: int, num_workers: int) -> int:
    """The DataLoader worker that produces a rank's ``batch_number``-th batch: ``batch_number % num_workers`` (PART-11).

    Why: torch's DataLoader deals a rank's batches round robin over its
    workers and returns them in batch order, so workers only change who
    computes a batch, never which batch comes next.

    >>> [worker_of_batch(b, 3) for b in range(7)]
    [0, 1, 2, 0, 1, 2, 0]

    Clauses: PART-11, PART-12.
    """
    _check_workers(num_workers)
    require(is_int(batch_number) and batch_number >= 0, ConfigError,
            f"batch_number={batch_number!r} must be a non-negative integer")
    return batch_number % num_workers


def worker_batches(num_samples: int, config: PartitionConfig, rank: int, *, num_workers: int, worker: int,
                   start: int = 0) -> list[list[int]]:
    """The batches DataLoader worker ``worker`` of ``rank`` produces, in its own order (PART-11).

    Each worker finds its batches without the others: batch t is the step at
    position ``start + t*G`` (PART-3), and the worker takes every t with
    ``worker_of_batch(t, num_workers) == worker``.

    >>> cfg = PartitionConfig(world_size=1, batch_size=2)
    >>> [worker_batches(10, cfg, 0, num_workers=2, worker=w) for w in range(2)]
    [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7]]]

    Clauses: PART-11.
    """
    _check_workers(num_workers)
    require(is_int(worker) and 0 <= worker < num_workers, TopologyError,
            f"worker={worker!r} must be an integer in [0, num_workers={num_workers}); pass one of 0..{num_workers - 1}")
    _check_rank(rank, config)
    count = steps_in_epoch(num_samples, config, start)
    step = config.global_batch_size
    return [rank_batch(start + t * step, num_samples, config, rank)
            for t in range(count) if worker_of_batch(t, num_workers) == worker]


def dataloader_order(per_worker: Sequence[Sequence[T]]) -> list[T]:
    """What an in-order DataLoader returns: batch t is the next unreturned output of worker ``t % num_workers`` (PART-11).

    >>> dataloader_order([["a0", "a1"], ["b0"], ["c0"]])
    ['a0', 'b0', 'c0', 'a1']

    Clauses: PART-11.
    """
    num_workers = len(per_worker)
    total = sum(len(outputs) for outputs in per_worker)
    for w, outputs in enumerate(per_worker):
        expected = len(range(w, total, num_workers))
        require(len(outputs) == expected, ConfigError,
                f"per_worker[{w}] holds {len(outputs)} batches, but round robin over {num_workers} workers "
                f"with {total} batches gives it {expected}; pass each worker's batches from worker_batches")
    return [per_worker[t % num_workers][t // num_workers] for t in range(total)]
