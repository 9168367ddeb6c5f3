"""Sharding: which of N items each of W shards holds (SHARD-*).

Why a specification: every distributed loader splits an item sequence over
ranks and workers, and the classic bugs are off-by-one coverage (an item
trained twice or never), shards of unequal length (a rank leaves the
collective early and the job hangs), and layouts that silently change with
the world size. Here each shard is a pure function of ``(n, config,
shard_index)``: no randomness, no state, integer arithmetic only, so a
vectorised implementation reproduces it exactly.

The procedure has two steps. First the *policy* (``uneven``) fixes the
sequence to share out: the items ``0..n-1`` as they are, truncated to a
multiple of W, or padded to a multiple of W (SHARD-3..SHARD-7). Then the
*layout* (``mode``) deals that sequence's positions to shards: round robin
or in contiguous balanced blocks (SHARD-1, SHARD-2). ``repeat_own_last``
(SHARD-15) reverses the steps: the ``uneven`` shards are dealt first and each
short one repeats its own last item, so padding never hands a rank an item
that another rank also trains (d9d's padding repeats the dataset's last item,
which belongs to one rank, on every other short rank).

Worked example (n = 14, W = 4)::

    >>> [shard_indices(14, ShardConfig(num_shards=4), r) for r in range(4)]
    [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10], [3, 7, 11]]
    >>> [shard_indices(14, ShardConfig(num_shards=4, mode="chunked"), r) for r in range(4)]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11, 12, 13]]
    >>> shard_sizes(14, ShardConfig(num_shards=4, uneven="repeat_last"))
    [4, 4, 4, 4]
    >>> [shard_indices(14, ShardConfig(num_shards=4, uneven="repeat_own_last"), r) for r in range(4)]
    [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 10], [3, 7, 11, 11]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from reference.errors import ConfigError, TopologyError, is_int, require

Mode = Literal["sequential", "chunked"]
Uneven = Literal["uneven", "drop_last", "repeat_last", "wrap", "repeat_own_last"]
FileMode = Literal["auto", "file", "example"]

MODES = ("sequential", "chunked")
UNEVEN_POLICIES = ("uneven", "drop_last", "repeat_last", "wrap", "repeat_own_last")
FILE_MODES = ("auto", "file", "example")


def _require_count(name: str, value: object, minimum: int, error: type[ConfigError] = ConfigError, fix: str = "") -> None:
    require(is_int(value) and isinstance(value, int) and value >= minimum, error,
            f"{name}={value!r} must be an integer >= {minimum}" + (f"; {fix}" if fix else ""))


def _require_index(name: str, value: object, bound: int, bound_name: str) -> None:
    require(is_int(value) and isinstance(value, int) and 0 <= value < bound, TopologyError,
            f"{name}={value!r} must be an integer in [0, {bound_name}={bound}); pass one of 0..{bound - 1}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardConfig:
    """How N items are dealt to ``num_shards`` shards (SHARD-1..SHARD-7, SHARD-14).

    ``mode`` is the layout (round robin or contiguous blocks); ``uneven`` is
    what happens when W does not divide N: keep the remainder (shard sizes
    differ by one), drop it, or pad every shard to ``ceil(N / W)`` items.

    >>> ShardConfig(num_shards=0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: num_shards=0 must be an integer >= 1; use num_shards=1 for a single shard
    """

    num_shards: int
    mode: Mode = "sequential"
    uneven: Uneven = "uneven"

    def __post_init__(self) -> None:
        _require_count("num_shards", self.num_shards, 1, fix="use num_shards=1 for a single shard")
        require(self.mode in MODES, ConfigError, f"mode={self.mode!r} is not a sharding layout; choose one of {MODES}")
        require(self.uneven in UNEVEN_POLICIES, ConfigError,
                f"uneven={self.uneven!r} is not a remainder policy; choose one of {UNEVEN_POLICIES}")


def policy_length(n: int, config: ShardConfig) -> int:
    """The length L of the sequence the shards split, after the remainder policy (SHARD-3..SHARD-7).

    Why separate: every shard's size follows from L alone, so callers can size
    collectives before touching any item.

    >>> [policy_length(14, ShardConfig(num_shards=4, uneven=u)) for u in UNEVEN_POLICIES]
    [14, 12, 16, 16, 16]
    >>> policy_length(0, ShardConfig(num_shards=4, uneven="wrap"))
    0

    ``repeat_own_last`` refuses ``0 < n < W``: some shard would have no item
    of its own to repeat (SHARD-15).

    Clauses: SHARD-3, SHARD-4, SHARD-5, SHARD-6, SHARD-7, SHARD-15.
    """
    _require_count("n", n, 0, fix="pass the number of items (0 or more)")
    w = config.num_shards
    if config.uneven == "uneven":
        return n
    if config.uneven == "drop_last":
        return n - n % w
    if config.uneven == "repeat_own_last":
        require(n == 0 or n >= w, TopologyError,
                f"uneven='repeat_own_last' needs n >= num_shards (or n == 0), got n={n} < num_shards={w}: "
                f"{w - n} shard(s) would have no item of their own to repeat; use uneven='wrap' or 'repeat_last' "
                "(which borrow other shards' items) or fewer shards")
    return -(-n // w) * w


def policy_item(position: int, n: int, config: ShardConfig) -> int:
    """The global item at ``position`` of the policy-adjusted sequence (SHARD-5, SHARD-6).

    Positions below n are the items themselves; padding positions repeat item
    n - 1 (``repeat_last``) or wrap around to item ``position % n`` (``wrap``).

    >>> [policy_item(p, 3, ShardConfig(num_shards=4, uneven="wrap")) for p in range(4)]
    [0, 1, 2, 0]
    >>> [policy_item(p, 3, ShardConfig(num_shards=4, uneven="repeat_last")) for p in range(4)]
    [0, 1, 2, 2]

    ``repeat_own_last`` pads each shard after dealing (SHARD-15), so it has no
    global padded sequence and is refused here; use ``shard_indices``.

    Clauses: SHARD-5, SHARD-6.
    """
    require(config.uneven != "repeat_own_last", ConfigError,
            "uneven='repeat_own_last' pads each shard after dealing, so it has no policy-adjusted sequence; "
            "call shard_indices(n, config, shard_index) instead")
    if position < n:
        return position
    if config.uneven == "repeat_last":
        return n - 1
    return position % n


def _shard_positions(length: int, num_shards: int, mode: str, shard_index: int) -> range:
    if mode == "sequential":
        return range(shard_index, length, num_shards)
    base, extra = divmod(length, num_shards)
    start = shard_index * base + min(shard_index, extra)
    return range(start, start + base + (1 if shard_index < extra else 0))


def shard_indices(n: int, config: ShardConfig, shard_index: int) -> list[int]:
    """The global item indices shard ``shard_index`` holds, in order.

    Why both layouts: round robin (``sequential``) keeps every shard's items
    spread over the whole sequence, which suits an already-shuffled order;
    ``chunked`` keeps each shard's items contiguous, which suits reading
    ranges of a file. Both are balanced: shard sizes differ by at most one.

    Worked example (n = 5, W = 2)::

        >>> [shard_indices(5, ShardConfig(num_shards=2, uneven="drop_last"), r) for r in range(2)]
        [[0, 2], [1, 3]]
        >>> [shard_indices(5, ShardConfig(num_shards=2, mode="chunked", uneven="wrap"), r) for r in range(2)]
        [[0, 1, 2], [3, 4, 0]]
        >>> [shard_indices(1, ShardConfig(num_shards=3, uneven="repeat_last"), r) for r in range(3)]
        [[0], [0], [0]]
        >>> [shard_indices(5, ShardConfig(num_shards=2, mode="chunked", uneven="repeat_own_last"), r) for r in range(2)]
        [[0, 1, 2], [3, 4, 4]]

    Clauses: SHARD-1, SHARD-2, SHARD-3, SHARD-4, SHARD-5, SHARD-6, SHARD-7, SHARD-14, SHARD-15.
    """
    _require_index("shard_index", shard_index, config.num_shards, "num_shards")
    length = policy_length(n, config)
    if config.uneven == "repeat_own_last":
        own = list(_shard_positions(n, config.num_shards, config.mode, shard_index))
        return own + own[-1:] * (length // config.num_shards - len(own))
    return [policy_item(p, n, config) for p in _shard_positions(length, config.num_shards, config.mode, shard_index)]


def shard_sizes(n: int, config: ShardConfig) -> list[int]:
    """The number of items of every shard, without materialising any (SHARD-8).

    >>> shard_sizes(14, ShardConfig(num_shards=4, mode="chunked"))
    [4, 4, 3, 3]
    >>> shard_sizes(2, ShardConfig(num_shards=4, uneven="drop_last"))
    [0, 0, 0, 0]

    Clauses: SHARD-8.
    """
    length = policy_length(n, config)
    w = config.num_shards
    return [len(_shard_positions(length, w, config.mode, r)) for r in range(w)]


def resolve_file_mode(num_files: int, num_shards: int, mode: FileMode = "auto") -> Literal["file", "example"]:
    """The sharding granularity ``mode`` stands for: ``auto`` is ``file`` when W <= number of files (SHARD-11).

    Why: whole files are cheaper to read (no seeking inside a file), but when
    there are fewer files than shards some shard would get nothing.

    >>> resolve_file_mode(4, 4), resolve_file_mode(3, 4)
    ('file', 'example')

    Clauses: SHARD-9, SHARD-11.
    """
    require(mode in FILE_MODES, ConfigError, f"mode={mode!r} is not a file sharding mode; choose one of {FILE_MODES}")
    _require_count("num_files", num_files, 0)
    _require_count("num_shards", num_shards, 1, fix="use num_shards=1 for a single shard")
    if mode == "auto":
        return "file" if num_shards <= num_files else "example"
    require(mode == "example" or num_shards <= num_files, TopologyError,
            f"mode='file' needs num_shards <= number of files, got num_shards={num_shards} > num_files={num_files}; "
            "use mode='example' (or mode='auto')")
    return mode


def _file_offsets(file_sizes: Sequence[int]) -> list[int]:
    offsets = [0]
    for i, size in enumerate(file_sizes):
        require(is_int(size) and size >= 0, ConfigError,
                f"file_sizes[{i}]={size!r} must be a non-negative integer number of examples")
        offsets.append(offsets[-1] + size)
    return offsets


def shard_files(file_sizes: Sequence[int], num_shards: int, shard_index: int, mode: FileMode = "auto") -> list[int]:
    """The global example indices shard ``shard_index`` holds when the data comes as files.

    Global example ids are file-major: file 0's examples are ``0..file_sizes[0]-1``,
    then file 1's, and so on. ``file``: shard r takes whole files r, r+W, ...
    (cheap to read; sizes follow the files and can be very unequal). ``example``:
    the global examples are dealt in balanced contiguous blocks (SHARD-2).

    Worked example (files of 5, 1, 2 and 4 examples, W = 2)::

        >>> [shard_files([5, 1, 2, 4], 2, r, mode="file") for r in range(2)]
        [[0, 1, 2, 3, 4, 6, 7], [5, 8, 9, 10, 11]]
        >>> [shard_files([5, 1, 2, 4], 2, r, mode="example") for r in range(2)]
        [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
        >>> shard_files([3], 2, 1)     # auto: one file, two shards -> example level
        [2]

    Clauses: SHARD-9, SHARD-10, SHARD-11.
    """
    offsets = _file_offsets(file_sizes)
    resolved = resolve_file_mode(len(file_sizes), num_shards, mode)
    _require_index("shard_index", shard_index, num_shards, "num_shards")
    if resolved == "example":
        return list(_shard_positions(offsets[-1], num_shards, "chunked", shard_index))
    return [e for f in range(shard_index, len(file_sizes), num_shards) for e in range(offsets[f], offsets[f + 1])]


def file_shard_sizes(file_sizes: Sequence[int], num_shards: int, mode: FileMode = "auto") -> list[int]:
    """The number of examples each shard gets under ``shard_files`` (SHARD-9, SHARD-10).

    Why: file-level shards are as unequal as the files; a job must know the
    sizes up front to cap every rank at the minimum (or pad), or ranks that
    finish early leave a collective waiting forever.

    >>> file_shard_sizes([100, 1, 1, 1], 2, mode="file")
    [101, 2]
    >>> file_shard_sizes([100, 1, 1, 1], 2, mode="example")
    [52, 51]

    Clauses: SHARD-9, SHARD-10.
    """
    offsets = _file_offsets(file_sizes)
    resolved = resolve_file_mode(len(file_sizes), num_shards, mode)
    if resolved == "example":
        return [len(_shard_positions(offsets[-1], num_shards, "chunked", r)) for r in range(num_shards)]
    return [sum(file_sizes[f] for f in range(r, len(file_sizes), num_shards)) for r in range(num_shards)]


def rank_worker_indices(n: int, *, world_size: int, rank: int, num_workers: int, worker: int,
                        mode: Mode = "sequential", uneven: Uneven = "uneven") -> list[int]:
    """The items DataLoader worker ``worker`` of rank ``rank`` holds (SHARD-12).

    Why composed this way: the rank split must not depend on how many workers
    each rank runs (a resume may change ``num_workers``), so ranks are sharded
    first with ``ShardConfig(num_shards=world_size, mode, uneven)`` and the
    rank's own list is then dealt round robin to its workers.

    ``num_workers`` counts loading processes; torch's ``num_workers=0`` (load
    in the main process) is ``num_workers=1, worker=0`` here.

    Worked example (n = 10, 2 ranks, 2 workers each)::

        >>> [[rank_worker_indices(10, world_size=2, rank=r, num_workers=2, worker=w) for w in range(2)] for r in range(2)]
        [[[0, 4, 8], [2, 6]], [[1, 5, 9], [3, 7]]]

    Clauses: SHARD-12, SHARD-14.
    """
    _require_count("world_size", world_size, 1, TopologyError, fix="a job has at least one rank")
    _require_index("rank", rank, world_size, "world_size")
    config = ShardConfig(num_shards=world_size, mode=mode, uneven=uneven)
    _require_count("num_workers", num_workers, 1, TopologyError,
                   fix="torch's num_workers=0 (main process) is num_workers=1, worker=0")
    _require_index("worker", worker, num_workers, "num_workers")
    return shard_indices(n, config, rank)[worker::num_workers]


def replicated_shard_index(rank: int, world_size: int, replication: int) -> int:
    """The shard a rank reads when ``replication`` consecutive ranks share data (SHARD-13).

    Why: tensor- or sequence-parallel groups of k ranks must all see the same
    samples; only the W / k data-parallel groups split the data.

    >>> [replicated_shard_index(r, 6, 2) for r in range(6)]
    [0, 0, 1, 1, 2, 2]

    Clauses: SHARD-13, SHARD-14.
    """
    _require_count("world_size", world_size, 1, TopologyError, fix="a job has at least one rank")
    _require_count("replication", replication, 1, TopologyError, fix="use replication=1 for no replication")
    require(world_size % replication == 0, TopologyError,
            f"replication={replication} must divide world_size={world_size}; "
            f"choose a divisor of {world_size} (ranks are grouped in blocks of replication)")
    _require_index("rank", rank, world_size, "world_size")
    return rank // replication


def replicated_indices(n: int, config_for_world: ShardConfig, rank: int, world_size: int, replication: int) -> list[int]:
    """The items ``rank`` reads when ``replication`` consecutive ranks share data (SHARD-13).

    ``config_for_world`` is the sharding one would use without replication
    (``num_shards == world_size``); its layout and remainder policy are applied
    over the ``world_size // replication`` effective shards.

    >>> cfg = ShardConfig(num_shards=4)
    >>> [replicated_indices(6, cfg, r, 4, 2) for r in range(4)]
    [[0, 2, 4], [0, 2, 4], [1, 3, 5], [1, 3, 5]]

    Clauses: SHARD-13, SHARD-14.
    """
    shard = replicated_shard_index(rank, world_size, replication)
    require(config_for_world.num_shards == world_size, TopologyError,
            f"config_for_world.num_shards={config_for_world.num_shards} must equal world_size={world_size}; "
            f"pass ShardConfig(num_shards={world_size}, ...) and let replication={replication} "
            f"reduce it to {world_size // replication} effective shards")
    return shard_indices(n, replace(config_for_world, num_shards=world_size // replication), shard)
