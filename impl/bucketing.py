"""Length bucketing over any map-style dataset: d9d's ``BufferSortedDataset`` made exact (BUCK-1..BUCK-8).

Conforms to BUCK-1..BUCK-8 of docs/SEMANTICS.md ("Bucketing"), mirroring
``reference.bucketing`` bit for bit with numpy: one ``lexsort`` per buffer
(length, counter draw, position), one vectorised Feistel call for the pack
order and one for the order inside all full packs.

Why a pure function instead of a stateful buffer: d9d fills a buffer as items
are requested, so the order depends on access history: DataLoader workers
(each with its own buffer) or random access duplicate and drop items, and its
state is restored with ``pickle.loads``. Here output position ``i`` of epoch
``e`` is a function of ``(seed, e, i)`` and the sort keys of ``i``'s own
buffer only (BUCK-2, BUCK-7): any worker, any access order, any restart
computes the same item, and the dataset has no position to save.

Resume: give the dataset to ``impl.loader.build_dataloader`` (it has
``num_samples(epoch)``, ``fingerprint`` and takes ``SampleKey``s). The
loader's state is a global position in the bucketed stream (RES-2), JSON, and
loads on another world size (RES-4). With ``batch_size == pack_size`` and
``buffer_size`` a multiple of ``pack_size``, every rank's batch is exactly one
pack of similar lengths, on any world size.

Worked example (8 items, buffers of 4, packs of 2; BUCK's reference example)::

    >>> class Texts(list):
    ...     def sort_key(self, index): return len(self[index])
    >>> data = Texts(["aaaaa", "a", "aaaa", "a", "aaaaaaaaa", "aa", "aaaaaa", "aaaaa"])
    >>> ds = BufferSortedDataset(data, buffer_size=4, pack_size=2, init_seed=0)
    >>> [len(ds[i]) for i in range(len(ds))]
    [1, 1, 4, 5, 5, 2, 9, 6]
    >>> ds.indices(0).tolist()
    [3, 1, 2, 0, 7, 5, 4, 6]
    >>> ds.set_epoch(1); ds.indices(1).tolist()
    [2, 0, 1, 3, 5, 7, 4, 6]
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from impl._arrays import distinct_ints
from impl.errors import ConfigError, StateError, is_int, is_integer, require
from impl.rng import derive_key, draw, feistel, mix64, subkey
from reference.bucketing import BucketConfig
from reference.resume import canonical_json
from reference.rng import GOLDEN_GAMMA, MASK64, Stream

__all__ = ["BucketConfig", "BufferSortedDataset", "bucket_at", "bucket_buffer", "bucket_order", "num_buffers"]

STATE_FORMAT = "loadspec.buffer_sorted_dataset"
STATE_VERSION = 1
_U = np.uint64


def num_buffers(n: int, config: BucketConfig) -> int:
    """``ceil(n / buffer_size)`` (BUCK-1)."""
    require(is_int(n) and n >= 0, ConfigError, f"n={n!r} must be an integer >= 0")
    return -(-n // config.buffer_size)


def _subkeys(key: int, indices: np.ndarray) -> np.ndarray:
    """``subkey(key, i)`` for every i (RNG-6), as uint64."""
    with np.errstate(over="ignore"):
        folded = mix64((indices.astype(_U) + _U(1)) * _U(GOLDEN_GAMMA & MASK64))
    return mix64(_U(key) ^ folded)


def _check_lengths(lengths: np.ndarray, start: int) -> np.ndarray:
    if lengths.dtype.kind not in "iu":
        bad = next((i for i, v in enumerate(lengths.tolist()) if not is_integer(v)), 0)
        raise ConfigError(f"sort_key of item {start + bad} is {lengths.tolist()[bad]!r}; bucketing needs an integer "
                          ">= 0 (a token count): return len(tokens) from sort_key")
    if lengths.size and int(lengths.min()) < 0:
        bad = int(np.argmin(lengths))
        raise ConfigError(f"sort_key of item {start + bad} is {int(lengths[bad])}; bucketing needs an integer >= 0 "
                          "(a token count)")
    return lengths.astype(np.int64, copy=False)


def bucket_buffer(lengths: Any, config: BucketConfig, epoch: int, buffer_index: int) -> np.ndarray:
    """Buffer ``b``'s *local* positions (0 = its first item) in output order, from its own lengths (BUCK-2..BUCK-6).

    ``lengths`` holds only the buffer's ``m`` lengths. Add ``b * buffer_size``
    for dataset positions.

    >>> bucket_buffer([9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2), 0, 1).tolist()
    [3, 1, 0, 2]
    """
    lens = _check_lengths(np.asarray(lengths), buffer_index * config.buffer_size)
    m, size = len(lens), config.pack_size
    require(m <= config.buffer_size, ConfigError,
            f"a buffer holds at most buffer_size={config.buffer_size} lengths, got {m}")
    kb = subkey(derive_key(config.seed, epoch, Stream.BUCKET), buffer_index)
    local = np.arange(m, dtype=np.int64)
    ranked = np.lexsort((local, draw(kb, local), lens))
    num_packs = -(-m // size)
    if num_packs == 0:
        return ranked
    pack_of_q = feistel(num_packs, subkey(kb, 0), np.arange(num_packs, dtype=np.int64))
    sizes = np.minimum(size, m - pack_of_q * size)
    keys = _subkeys(kb, pack_of_q + 1)
    out = np.empty(m, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    for pack_size in distinct_ints(sizes):
        qs = np.flatnonzero(sizes == pack_size)
        j = np.tile(np.arange(pack_size, dtype=np.int64), len(qs))
        q = np.repeat(qs, pack_size)
        member = feistel(pack_size, keys[q], j)
        out[starts[q] + j] = ranked[pack_of_q[q] * size + member]
    return out


def bucket_order(lengths: Any, config: BucketConfig, epoch: int) -> np.ndarray:
    """The whole epoch's order, a permutation of ``[0, n)`` (BUCK-1).

    >>> bucket_order([5, 1, 4, 1, 9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2), 0).tolist()
    [3, 1, 2, 0, 7, 5, 4, 6]
    """
    lens = np.asarray(lengths)
    b = config.buffer_size
    parts = [bucket_buffer(lens[k * b:(k + 1) * b], config, epoch, k) + k * b
             for k in range(num_buffers(len(lens), config))]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def bucket_at(lengths: Any, config: BucketConfig, epoch: int, position: int) -> int:
    """``bucket_order(...)[position]`` from its own buffer only (BUCK-7).

    >>> bucket_at([5, 1, 4, 1, 9, 2, 6, 5], BucketConfig(buffer_size=4, pack_size=2), 0, 5)
    5
    """
    lens = np.asarray(lengths)
    n = len(lens)
    require(is_int(position) and 0 <= position < n, ConfigError,
            f"position={position!r} must be an integer in [0, n={n})")
    k, b = position // config.buffer_size, config.buffer_size
    return int(bucket_buffer(lens[k * b:(k + 1) * b], config, epoch, k)[position - k * b]) + k * b


def _identity(dataset: Any) -> str:
    fingerprint = getattr(dataset, "fingerprint", None)
    return fingerprint if isinstance(fingerprint, str) else f"{type(dataset).__module__}.{type(dataset).__qualname__}"


class BufferSortedDataset(Dataset):  # type: ignore[type-arg]
    """Smart bucketing of a map-style dataset with ``sort_key(index)`` (BUCK-1..BUCK-8), d9d's names.

    ``base_dataset`` needs ``__len__``, ``__getitem__`` and ``sort_key(index)``
    returning the item's length (an integer >= 0). ``buffer_size``
    consecutive items are sorted by length (a keyed random tie-breaker),
    cut into packs of ``pack_size`` (normally the batch size) and the packs
    and the items inside each pack are shuffled by keyed permutations.
    ``init_seed`` is an integer (default 0): an unseeded order could not be
    reproduced or resumed, so ``None`` is refused.

    ``ds[i]`` is position ``i`` of the epoch set by :meth:`set_epoch`;
    ``ds[SampleKey(epoch, i)]`` (or ``ds[(epoch, i)]``) names the epoch, which
    is what ``impl.loader.build_dataloader`` sends, so workers never depend on
    ``set_epoch`` reaching their copy. Only the sort keys of the buffers asked
    for are read, once per buffer and process (a small cache of
    ``cache_buffers`` buffers).

    ``fingerprint`` covers the configuration, the dataset's length and the
    dataset's own ``fingerprint`` attribute when it has one (else its type):
    a plain torch dataset's *content* cannot be checked, so give the base
    dataset a ``fingerprint`` string if resumes must refuse changed data.
    """

    def __init__(self, base_dataset: Any, buffer_size: int, pack_size: int, init_seed: int | None = 0, *,
                 epoch: int = 0, cache_buffers: int = 8) -> None:
        require(callable(getattr(base_dataset, "sort_key", None)), ConfigError,
                f"{type(base_dataset).__name__} has no sort_key(index) method; bucketing needs each item's length "
                "without loading it: add `def sort_key(self, index): return <length of item index>`")
        require(init_seed is not None, ConfigError,
                "init_seed=None is refused: an unseeded bucketing order can be neither reproduced nor resumed; "
                "pass an integer seed (e.g. init_seed=0)")
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        require(is_int(cache_buffers) and cache_buffers >= 1, ConfigError,
                f"cache_buffers={cache_buffers!r} must be an integer >= 1")
        self.base_dataset = base_dataset
        self.config = BucketConfig(buffer_size=buffer_size, pack_size=pack_size, seed=init_seed)  # type: ignore[arg-type]
        self.epoch = epoch
        self._cache_size = cache_buffers
        self._cache: collections.OrderedDict[tuple[int, int], np.ndarray] = collections.OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = collections.OrderedDict()
        return state

    # ------------------------------------------------------------ order

    def num_samples(self, epoch: int | None = None) -> int:
        """Items per epoch: every item once (BUCK-1)."""
        return len(self.base_dataset)

    def __len__(self) -> int:
        return len(self.base_dataset)

    def set_epoch(self, epoch: int) -> None:
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self.epoch = epoch

    def _buffer(self, epoch: int, k: int) -> np.ndarray:
        cached = self._cache.get((epoch, k))
        if cached is not None:
            self._cache.move_to_end((epoch, k))
            return cached
        b, n = self.config.buffer_size, len(self.base_dataset)
        stop = min(n, (k + 1) * b)
        keys = [self.base_dataset.sort_key(i) for i in range(k * b, stop)]
        lengths = np.asarray(keys) if all(is_integer(v) for v in keys) else np.asarray(keys, dtype=object)
        order = bucket_buffer(lengths, self.config, epoch, k) + k * b
        self._cache[(epoch, k)] = order
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return order

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The whole epoch's order of base indices (reads every sort key once)."""
        e = self.epoch if epoch is None else epoch
        parts = [self._buffer(e, k) for k in range(num_buffers(len(self), self.config))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def index_at(self, epoch: int, position: int) -> int:
        """The base index at ``position`` of ``epoch`` (BUCK-7); ``IndexError`` outside ``[-n, n)``."""
        n = len(self)
        require(is_int(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        if not is_integer(position):
            raise TypeError(f"BufferSortedDataset positions are integers, got {type(position).__name__} {position!r}")
        p = int(position)
        if not -n <= p < n:
            raise IndexError(f"position {p} is out of range for {n} items (valid: {-n}..{n - 1})")
        p %= n
        k = p // self.config.buffer_size
        return int(self._buffer(epoch, k)[p - k * self.config.buffer_size])

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            require(len(key) == 2, ConfigError, f"key={key!r} must be an index or an (epoch, index) pair")
            epoch, position = key
        else:
            epoch, position = self.epoch, key
        return self.base_dataset[self.index_at(int(epoch), position)]

    def sort_key(self, position: int) -> Any:
        """The sort key of the item at ``position`` of the current epoch (so wrappers can stack)."""
        return self.base_dataset.sort_key(self.index_at(self.epoch, position))

    # ------------------------------------------------------------ state

    @property
    def fingerprint(self) -> str:
        c = self.config
        return hashlib.sha256(canonical_json({
            "kind": STATE_FORMAT, "data": _identity(self.base_dataset), "n": len(self.base_dataset),
            "buffer_size": c.buffer_size, "pack_size": c.pack_size, "seed": c.seed,
        }).encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """JSON primitives: the epoch and what the order depends on (no pickle, no buffer contents)."""
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": self.fingerprint, "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the epoch; refuse a state of another dataset, configuration or format (``StateError``)."""
        require(isinstance(state, Mapping) and state.get("format") == STATE_FORMAT, StateError,
                f"state is not a {STATE_FORMAT} state; pass the dict BufferSortedDataset.state_dict() returned")
        require(state.get("version") == STATE_VERSION, StateError,
                f"state version {state.get('version')!r} is not {STATE_VERSION}; save it again with this loadspec")
        require(state.get("fingerprint") == self.fingerprint, StateError,
                "state fingerprint differs: it was taken with another buffer_size, pack_size, seed or dataset; "
                "rebuild the dataset as it was, or start from a fresh state")
        epoch = state.get("epoch")
        if not (isinstance(epoch, int) and is_int(epoch) and epoch >= 0):
            raise StateError(f"state epoch={epoch!r} must be an integer >= 0")
        self.epoch = epoch

    def __repr__(self) -> str:
        c = self.config
        return (f"BufferSortedDataset({type(self.base_dataset).__name__} of {len(self)} items, "
                f"buffer_size={c.buffer_size}, pack_size={c.pack_size}, init_seed={c.seed}, epoch={self.epoch})")
