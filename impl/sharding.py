"""Per-rank sharding views over any map-style dataset: d9d's ``ShardedDataset`` made exact (SHARD-1..SHARD-15).

Conforms to SHARD-1..SHARD-15 of docs/SEMANTICS.md ("Sharding"), mirroring
``reference.sharding`` bit for bit with numpy index arithmetic. The views are
for teams that want rank-local pipelines (fine-tuning, evaluation, a dataset
already in memory): rank ``r`` of ``W`` wraps its dataset once and never
talks to the other ranks.

What they fix in the usual wrappers: a chunked layout with ceil-sized blocks
(negative or zero lengths for some ``(N, W)``); ``__getitem__`` clamping an
index instead of raising ``IndexError`` (so ``for x in view`` never ends);
padding that repeats the dataset's last item, which belongs to one rank, on
every other short rank (SHARD-15's ``repeat_own_last`` pads each shard with
its own last item; ``pad_to_equal_size_across_shards=True`` means that).

**Not elastic, on purpose.** A view is a pure function of ``(N, W, r)``: on
another world size every rank holds other items, so a position inside a
rank's view means nothing after a restart on ``W' != W`` (the ``state_dict``
refuses it). For resumable pretraining use the global partition instead,
``impl.loader.build_dataloader`` (PART-*, RES-4): it splits one global sample
stream per step, so its state is a global position that loads on any world
size.

Worked example (14 items over 4 ranks)::

    >>> view = ShardedDataset(list(range(100, 114)), total_shards=4, current_shard=2,
    ...                       indexing_mode="chunked", pad_to_equal_size_across_shards=True)
    >>> [view[i] for i in range(len(view))]
    [108, 109, 110, 110]
    >>> view[4]
    Traceback (most recent call last):
    ...
    IndexError: index 4 is out of range for shard 2 of 4, which holds 4 items (valid: -4..3)
    >>> shard_indices(14, ShardConfig(num_shards=4), 3).tolist()
    [3, 7, 11]
"""

from __future__ import annotations

import enum
import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, SupportsIndex, cast

import numpy as np
from torch.utils.data import Dataset

from impl.errors import ConfigError, StateError, TopologyError, is_int, is_integer, require
from reference.resume import canonical_json
from reference.sharding import FILE_MODES, MODES, UNEVEN_POLICIES, ShardConfig

__all__ = [
    "ShardConfig",
    "ShardIndexingMode",
    "ShardedDataset",
    "file_shard_sizes",
    "resolve_file_mode",
    "shard_dataset_data_parallel",
    "shard_files",
    "shard_indices",
    "shard_sizes",
    "shard_token_store",
]

STATE_FORMAT = "loadspec.sharded_view"
STATE_VERSION = 1


class ShardIndexingMode(enum.StrEnum):
    """d9d's names for the layouts: round robin (SHARD-1) or balanced contiguous blocks (SHARD-2)."""

    sequential = "sequential"
    chunked = "chunked"


def _as_int(value: object) -> int | None:
    """``value`` as a Python int when it is an integer (numpy integers included, booleans not)."""
    return operator.index(cast(SupportsIndex, value)) if is_integer(value) else None


def _count(name: str, value: object, minimum: int) -> int:
    number = _as_int(value)
    if number is None or number < minimum:
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}")
    return number


def _index(name: str, value: object, bound: int, bound_name: str) -> int:
    number = _as_int(value)
    if number is None or not 0 <= number < bound:
        raise TopologyError(
            f"{name}={value!r} must be an integer in [0, {bound_name}={bound}); pass one of 0..{bound - 1}")
    return number


def _positions(length: int, num_shards: int, mode: str, shard: int) -> np.ndarray:
    if mode == "sequential":
        return np.arange(shard, length, num_shards, dtype=np.int64)
    base, extra = divmod(length, num_shards)
    start = shard * base + min(shard, extra)
    return np.arange(start, start + base + (1 if shard < extra else 0), dtype=np.int64)


def _policy_length(n: int, config: ShardConfig) -> int:
    w = config.num_shards
    if config.uneven == "uneven":
        return n
    if config.uneven == "drop_last":
        return n - n % w
    require(config.uneven != "repeat_own_last" or n == 0 or n >= w, TopologyError,
            f"uneven='repeat_own_last' needs n >= num_shards (or n == 0), got n={n} < num_shards={w}: "
            f"{w - n} shard(s) would have no item of their own to repeat; use uneven='wrap' or 'repeat_last' "
            "(which borrow other shards' items) or fewer shards")
    return -(-n // w) * w


def shard_indices(n: int, config: ShardConfig, shard_index: int) -> np.ndarray:
    """The global item indices of shard ``shard_index`` as int64: ``reference.sharding.shard_indices``.

    >>> [shard_indices(5, ShardConfig(num_shards=2, mode="chunked", uneven="wrap"), r).tolist() for r in range(2)]
    [[0, 1, 2], [3, 4, 0]]
    """
    n = _count("n", n, 0)
    shard = _index("shard_index", shard_index, config.num_shards, "num_shards")
    length = _policy_length(n, config)
    if config.uneven == "repeat_own_last":
        own = _positions(n, config.num_shards, config.mode, shard)
        padding = np.repeat(own[-1:], length // config.num_shards - len(own))
        return np.concatenate([own, padding]).astype(np.int64)
    positions = _positions(length, config.num_shards, config.mode, shard)
    if config.uneven == "repeat_last":
        clamped: np.ndarray = np.minimum(positions, n - 1)
        return clamped
    if config.uneven == "wrap":
        wrapped: np.ndarray = positions % n if n else positions
        return wrapped
    return positions


def shard_sizes(n: int, config: ShardConfig) -> list[int]:
    """Every shard's size without materialising one (SHARD-8).

    >>> shard_sizes(14, ShardConfig(num_shards=4, mode="chunked"))
    [4, 4, 3, 3]
    """
    length = _policy_length(_count("n", n, 0), config)
    base, extra = divmod(length, config.num_shards)
    return [base + (1 if r < extra else 0) for r in range(config.num_shards)]


def resolve_file_mode(num_files: int, num_shards: int, mode: str = "auto") -> str:
    """``file`` or ``example``: ``auto`` is ``file`` exactly when every shard can get a file (SHARD-11).

    >>> resolve_file_mode(3, 4)
    'example'
    """
    require(mode in FILE_MODES, ConfigError, f"mode={mode!r} is not a file sharding mode; choose one of {FILE_MODES}")
    num_files = _count("num_files", num_files, 0)
    require(is_int(num_shards) and num_shards >= 1, ConfigError,
            f"num_shards={num_shards!r} must be an integer >= 1; use num_shards=1 for a single shard")
    if mode == "auto":
        return "file" if num_shards <= num_files else "example"
    require(mode == "example" or num_shards <= num_files, TopologyError,
            f"mode='file' needs num_shards <= number of files, got num_shards={num_shards} > num_files={num_files}; "
            "some shard would be silently empty: use mode='example' (or mode='auto')")
    return mode


def _file_offsets(file_sizes: Sequence[int]) -> np.ndarray:
    sizes = np.asarray(list(file_sizes), dtype=np.int64) if len(file_sizes) else np.zeros(0, dtype=np.int64)
    for i, size in enumerate(file_sizes):
        require(is_integer(size) and int(size) >= 0, ConfigError,
                f"file_sizes[{i}]={size!r} must be a non-negative integer number of examples")
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def shard_files(file_sizes: Sequence[int], num_shards: int, shard_index: int, mode: str = "auto") -> np.ndarray:
    """File-major example ids of shard ``shard_index``: whole files round robin, or balanced blocks (SHARD-9..11).

    >>> [shard_files([5, 1, 2, 4], 2, r, mode="file").tolist() for r in range(2)]
    [[0, 1, 2, 3, 4, 6, 7], [5, 8, 9, 10, 11]]
    """
    offsets = _file_offsets(file_sizes)
    resolved = resolve_file_mode(len(file_sizes), num_shards, mode)
    shard = _index("shard_index", shard_index, num_shards, "num_shards")
    if resolved == "example":
        return _positions(int(offsets[-1]), num_shards, "chunked", shard)
    files = range(shard, len(file_sizes), num_shards)
    parts = [np.arange(offsets[f], offsets[f + 1], dtype=np.int64) for f in files]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def file_shard_sizes(file_sizes: Sequence[int], num_shards: int, mode: str = "auto") -> list[int]:
    """Examples per shard under :func:`shard_files` (SHARD-9, SHARD-10).

    >>> file_shard_sizes([100, 1, 1, 1], 2, mode="file")
    [101, 2]
    """
    offsets = _file_offsets(file_sizes)
    resolved = resolve_file_mode(len(file_sizes), num_shards, mode)
    sizes = np.diff(offsets)
    if resolved == "example":
        base, extra = divmod(int(offsets[-1]), num_shards)
        return [base + (1 if r < extra else 0) for r in range(num_shards)]
    return [int(sizes[r::num_shards].sum()) for r in range(num_shards)]


def _data_identity(dataset: Any) -> str:
    fingerprint = getattr(dataset, "fingerprint", None)
    if isinstance(fingerprint, str):
        return fingerprint
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}"


class ShardedDataset(Dataset):  # type: ignore[type-arg]
    """Shard ``current_shard`` of ``total_shards`` of a map-style dataset, as a dataset (SHARD-1..SHARD-15).

    ``indexing_mode``: ``"sequential"`` (round robin) or ``"chunked"``
    (balanced contiguous blocks; sizes differ by at most one, SHARD-2).
    ``pad_to_equal_size_across_shards=True`` gives every shard ``ceil(N/W)``
    items by repeating the shard's *own* last item (SHARD-15), so ranks stay
    in lockstep without training another rank's item; ``uneven`` names any
    SHARD policy explicitly instead (``"uneven"``, ``"drop_last"``,
    ``"repeat_last"``, ``"wrap"``, ``"repeat_own_last"``).

    ``view[i]`` is ``dataset[indices[i]]``; ``i`` outside ``[-len, len)``
    raises ``IndexError`` (so iteration ends). ``sort_key`` is forwarded when
    the dataset has one (bucketing a view works), and so is ``set_epoch``
    (the view is recomputed if the length changes).
    """

    def __init__(self, dataset: Any, total_shards: int, current_shard: int,
                 indexing_mode: str | ShardIndexingMode = "sequential",
                 pad_to_equal_size_across_shards: bool = False, *, uneven: str | None = None) -> None:
        mode = indexing_mode.value if isinstance(indexing_mode, ShardIndexingMode) else indexing_mode
        require(mode in MODES, ConfigError,
                f"indexing_mode={indexing_mode!r} is not a sharding layout; choose one of {MODES}")
        require(isinstance(pad_to_equal_size_across_shards, bool), ConfigError,
                f"pad_to_equal_size_across_shards={pad_to_equal_size_across_shards!r} must be True or False")
        if uneven is None:
            uneven = "repeat_own_last" if pad_to_equal_size_across_shards else "uneven"
        else:
            require(uneven in UNEVEN_POLICIES, ConfigError,
                    f"uneven={uneven!r} is not a remainder policy; choose one of {UNEVEN_POLICIES}")
            require(not pad_to_equal_size_across_shards, ConfigError,
                    f"pass either uneven={uneven!r} or pad_to_equal_size_across_shards=True, not both "
                    "(pad_to_equal_size_across_shards=True means uneven='repeat_own_last')")
        shards = _as_int(total_shards)
        require(shards is not None and shards >= 1, TopologyError,
                f"total_shards={total_shards!r} must be an integer >= 1 (e.g. the data-parallel world size)")
        self.dataset = dataset
        self.config = ShardConfig(num_shards=cast(int, shards), mode=mode, uneven=uneven)  # type: ignore[arg-type]
        self.current_shard = _index("current_shard", current_shard, self.config.num_shards, "total_shards")
        self._files: tuple[tuple[int, ...], str] | None = None
        self._refresh()

    @classmethod
    def from_files(cls, dataset: Any, file_sizes: Sequence[int], total_shards: int, current_shard: int,
                   mode: str = "auto") -> ShardedDataset:
        """The view of whole files (``file``), balanced blocks of examples (``example``) or ``auto`` (SHARD-9..11).

        ``file_sizes[f]`` examples of the dataset come from file ``f``, in
        order (file-major). ``mode="file"`` with more shards than files is
        refused (``TopologyError``): some shard would be silently empty.
        """
        self = cls.__new__(cls)
        self.dataset = dataset
        self.config = ShardConfig(num_shards=_count("total_shards", total_shards, 1))
        self.current_shard = _index("current_shard", current_shard, self.config.num_shards, "total_shards")
        self._files = (tuple(int(s) for s in file_sizes), mode)
        require(sum(self._files[0]) == len(dataset), ConfigError,
                f"file_sizes sum to {sum(self._files[0])} but the dataset holds {len(dataset)} items; "
                "pass one entry per file, in the dataset's order")
        self._refresh()
        return self

    def _refresh(self) -> None:
        n = len(self.dataset)
        if self._files is not None:
            self.indices = shard_files(self._files[0], self.config.num_shards, self.current_shard, self._files[1])
        else:
            self.indices = shard_indices(n, self.config, self.current_shard)
        self._n = n

    # ------------------------------------------------------------ dataset protocol

    def __len__(self) -> int:
        return len(self.indices)

    def _physical(self, index: Any) -> int:
        if not is_integer(index):
            raise TypeError(f"ShardedDataset indices must be integers, got {type(index).__name__} {index!r}")
        size = len(self.indices)
        i = cast(int, _as_int(index))
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of range for shard {self.current_shard} of {self.config.num_shards}, "
                             f"which holds {size} items (valid: {-size}..{size - 1})")
        return int(self.indices[i])

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self._physical(index)]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """Forward a whole batch to the dataset's own ``__getitems__`` when it has one (e.g. ``PackedDataset``)."""
        physical = [self._physical(i) for i in indices]
        batched = getattr(self.dataset, "__getitems__", None)
        return batched(physical) if callable(batched) else [self.dataset[i] for i in physical]

    @property
    def sort_key(self) -> Callable[[int], Any]:
        """The dataset's ``sort_key`` through the view (``AttributeError`` when the dataset has none)."""
        inner = getattr(self.dataset, "sort_key", None)
        if not callable(inner):
            raise AttributeError(  # noqa: TRY004 - hasattr(view, "sort_key") must be False
                f"{type(self.dataset).__name__} has no sort_key(index), so neither has its view")
        return lambda index: inner(self._physical(index))

    def set_epoch(self, epoch: int) -> None:
        """Forward ``set_epoch`` and recompute the view if the dataset's length changed with it."""
        inner = getattr(self.dataset, "set_epoch", None)
        if callable(inner):
            inner(epoch)
        if len(self.dataset) != self._n:
            self._refresh()

    # ------------------------------------------------------------ state

    @property
    def fingerprint(self) -> str:
        """Identity of the data (the dataset's ``fingerprint``, else its type), its size and the view."""
        return hashlib.sha256(canonical_json({
            "data": _data_identity(self.dataset), "n": self._n, "num_shards": self.config.num_shards,
            "mode": self.config.mode, "uneven": self.config.uneven, "shard": self.current_shard,
            "files": list(self._files) if self._files is not None else None,
        }).encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """JSON primitives naming the view; a view has no position of its own (the loop or sampler owns it)."""
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": self.fingerprint,
                "num_shards": self.config.num_shards, "shard": self.current_shard}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Accept only the state of this very view: a view is not elastic (see the module docstring)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"state is not a {STATE_FORMAT} state (format={state.get('format') if isinstance(state, Mapping) else state!r})")
        require(state.get("version") == STATE_VERSION, StateError,
                f"state version {state.get('version')!r} is not {STATE_VERSION}; save it again with this loadspec")
        if state.get("num_shards") != self.config.num_shards or state.get("shard") != self.current_shard:
            raise StateError(
                f"state is for shard {state.get('shard')} of {state.get('num_shards')} but this view is shard "
                f"{self.current_shard} of {self.config.num_shards}: sharded views are not elastic (another world size "
                "gives every rank other items); resume on the original world size, or use "
                "impl.loader.build_dataloader, whose global position loads on any world size")
        require(state.get("fingerprint") == self.fingerprint, StateError,
                "state fingerprint differs from this view's: it was taken on other data or another sharding; "
                "restore the matching dataset or start fresh")

    def __repr__(self) -> str:
        return (f"ShardedDataset(shard {self.current_shard} of {self.config.num_shards}, mode={self.config.mode!r}, "
                f"uneven={self.config.uneven!r}, {len(self)} of {self._n} items)")


def _mesh_topology(device_mesh: Any, mesh_dim: str | int) -> tuple[int, int]:
    """``(rank, size)`` along one dimension of a ``torch.distributed.DeviceMesh`` (``size`` takes its index)."""
    names = tuple(getattr(device_mesh, "mesh_dim_names", None) or ())
    if isinstance(mesh_dim, str):
        require(mesh_dim in names, TopologyError,
                f"device_mesh has no data-parallel dimension {mesh_dim!r} (dimensions: {names}); "
                "pass mesh_dim= naming it (or its index)")
        index = names.index(mesh_dim)
    else:
        ndim = int(getattr(device_mesh, "ndim", 1))
        require(is_int(mesh_dim) and 0 <= mesh_dim < ndim, TopologyError,
                f"mesh_dim={mesh_dim!r} is not a dimension of a {ndim}-d device_mesh; pass its name or an index")
        index = mesh_dim
    return int(device_mesh.get_local_rank(index)), int(device_mesh.size(index))


def shard_dataset_data_parallel(dataset: Any, device_mesh: Any = None,
                                indexing_mode: str | ShardIndexingMode = "sequential",
                                pad_to_equal_size_across_shards: bool = True, *, mesh_dim: str | int = "dp",
                                group: Any = None) -> ShardedDataset:
    """This rank's :class:`ShardedDataset`, rank and world size from the data-parallel dimension.

    Topology, first that applies: ``device_mesh`` (a ``DeviceMesh``; its
    ``mesh_dim`` dimension, ``"dp"`` by default, as d9d's batch mesh), the
    process ``group`` of ``torch.distributed`` (default group when ``None``),
    or a single rank when no process group is initialised. Padding is on by
    default, as in d9d, because unequal shards hang the collectives.

    >>> len(shard_dataset_data_parallel(list(range(10))))   # no process group: one shard holds everything
    10
    """
    if device_mesh is not None:
        rank, world = _mesh_topology(device_mesh, mesh_dim)
    else:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            require(rank >= 0, TopologyError, "this process is not a member of the given group; pass its own group")
        else:
            rank, world = 0, 1
    return ShardedDataset(dataset, world, rank, indexing_mode, pad_to_equal_size_across_shards)


def shard_token_store(store: Any, total_shards: int, current_shard: int, mode: str = "auto") -> ShardedDataset:
    """A view of a ``TokenStore``'s documents by whole token files or balanced blocks (SHARD-9..SHARD-11).

    ``view[i]`` is the document's token array. ``mode="file"`` reads whole
    files (cheap, shard sizes as unequal as the files) and is refused when
    there are more shards than files; ``"example"`` splits the documents in
    balanced blocks; ``"auto"`` picks ``file`` when every shard can get one.
    """
    return ShardedDataset.from_files(store, list(store.file_document_counts), total_shards, current_shard, mode)
