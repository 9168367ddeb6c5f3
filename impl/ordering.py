"""Vectorised epoch orders: ``reference.ordering`` on numpy arrays, bit for bit.

Conforms to ORD-1, ORD-2, ORD-3, ORD-4, ORD-5, ORD-9, ORD-11 and ORD-13 of
docs/SEMANTICS.md, for the random-access kinds ``sequential``,
``global`` and ``window``. ORD-6..ORD-8 and ORD-10 (the buffered shuffle)
are deliberately not implemented: see below.

Why these kinds only: the buffered shuffle of HF datasets / Forgather is
sequential by nature (output p depends on every draw before it), so it cannot
resume in O(1) and cannot be computed for a few positions at a time. It lives
in the reference so that such loaders can be put under test; impl offers the
global shuffle (uniform, random access) and the window shuffle (random access
with bounded I/O locality), both of which resume in O(1) and give any rank or
DataLoader worker the document at any position without the positions before
it. ``kind="buffer"`` raises ``NotImplementedError`` naming those two.

Why no permutation array for ``global``: :class:`EpochOrder` computes the
document at a position with ``impl.rng.FeistelPermutation`` on just the
positions asked for, so a billion-document epoch needs no billion-entry array
(ORD-3, ORD-9). ``window`` needs only the file order (O(files)), and its
per-window Feistel permutations are evaluated for all windows at once with one
key per element (``impl.rng.feistel``; the same network as
``impl.rng.FeistelPermutation``). For a handful of positions (a sample's
documents) ``EpochOrder`` uses impl's scalar network (``impl.rng.ScalarFeistel``)
instead, which is bit-identical and several times faster than numpy on tiny arrays;
from ``FEW`` positions on (a batch's documents), a global order is evaluated in one
array pass (``impl.rng.feistel``, its last cycle-walks finished by the scalar network);
a sequential reader (a loader) gets whole blocks of ``BLOCK`` positions evaluated at once and cached (a few blocks, never the whole order).

Worked example (files of 3, 0 and 2 documents; the reference's own example)::

    >>> import numpy as np
    >>> from reference.ordering import OrderingConfig
    >>> epoch_order([3, 0, 2], OrderingConfig(kind="global"), 0).tolist()
    [4, 3, 2, 0, 1]
    >>> epoch_order([3, 0, 2], OrderingConfig(kind="window", window=2), 0).tolist()
    [1, 0, 3, 2, 4]
    >>> order_at([3, 0, 2], OrderingConfig(kind="window", window=2), 0, np.array([3, 0])).tolist()
    [2, 1]
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence

import numpy as np

from impl.errors import ConfigError, is_integer, require
from impl.rng import GOLDEN_GAMMA, MASK64, FeistelPermutation, ScalarFeistel, Stream, derive_key, feistel, mix64, subkey
from reference.ordering import OrderingConfig

__all__ = ["BUFFER_MESSAGE", "SUPPORTED_KINDS", "EpochOrder", "epoch_order", "file_order", "order_at"]

SUPPORTED_KINDS = ("sequential", "global", "window")

BUFFER_MESSAGE = (
    "ordering kind 'buffer' is not implemented in impl: the buffered (HF datasets / Forgather style) shuffle is "
    "sequential by nature, so it cannot give the document at a position without replaying the epoch from its start, "
    "and it cannot resume in O(1). It exists in reference.ordering to put such loaders under test. Use "
    "kind='global' (a uniform shuffle) or kind='window' (a shuffle with bounded I/O locality); both resume in O(1)"
)

_U = np.uint64
SCALAR_LIMIT = 32
"""Up to this many positions ``EpochOrder`` evaluates a window order with Python ints: its numpy evaluation
(``impl.rng.feistel``, per-window keys) has a fixed cost per cycle-walking pass whatever its size, a scalar one a cost
per position, and the scalar one is the faster up to about this many positions (benchmarks/README.md, "Design
figures"). A global order switches at ``FEW``."""

FEW = 16
"""From this many positions on, a global order is one in-place numpy pass over all of them (``impl.rng.feistel``, whose
cost barely grows from a dozen positions to a hundred) rather than ``ScalarFeistel`` (a cost per position). A fresh
resume's first batch asks a few dozen positions at once."""

BLOCK = 2048
"""Positions per cached block of an epoch's order: a loader reads consecutive positions, so once two lookups fall in
one block ``EpochOrder`` evaluates the whole block in one vectorised pass and answers the next several hundred
samples' lookups from it."""
BLOCKS_KEPT = 4


def _checked_sizes(file_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """The file sizes as int64, each a non-negative integer (ORD-1, ORD-13)."""
    sizes = list(file_sizes.tolist() if isinstance(file_sizes, np.ndarray) else file_sizes)
    for i, size in enumerate(sizes):
        if not (is_integer(size) and size >= 0):   # the message only on failure: a resume checks every file's size
            raise ConfigError(f"file_sizes[{i}]={size!r} must be a non-negative integer (the number of documents in "
                              f"file {i})")
    return np.asarray(sizes, dtype=np.int64).reshape(-1)


def _check_epoch(epoch: int) -> int:
    require(is_integer(epoch) and 0 <= epoch <= MASK64, ConfigError,
            f"epoch={epoch!r} must be an integer in [0, 2**64); epochs count from 0")
    return int(epoch)


def _check_kind(config: OrderingConfig) -> None:
    require(isinstance(config, OrderingConfig), ConfigError,
            f"config={config!r} must be a reference.ordering.OrderingConfig; build one with OrderingConfig(kind=...)")
    if config.kind == "buffer":
        raise NotImplementedError(BUFFER_MESSAGE)


def _subkeys(key: int, index: np.ndarray) -> np.ndarray:
    """``reference.rng.subkey(key, k)`` for every k in ``index`` (RNG-6), as uint64."""
    k = np.asarray(index, dtype=_U)
    with np.errstate(over="ignore"):
        return mix64(_U(key & MASK64) ^ mix64((k + _U(1)) * _U(GOLDEN_GAMMA)))


def _window_source(n: int, window: int, key: int, positions: np.ndarray) -> np.ndarray:
    """The file-order position each output position takes under the window shuffle (ORD-5)."""
    positions = np.asarray(positions, dtype=np.int64)
    out = np.empty_like(positions)
    k, j = np.divmod(positions, window)
    last = n // window                      # index of the partial window, if any
    tail = n - last * window                # its size (0: no partial window)
    full = k < last
    if full.any():
        out[full] = k[full] * window + feistel(window, _subkeys(key, k[full]), j[full])
    if tail and not full.all():
        part = ~full
        out[part] = last * window + FeistelPermutation(tail, _subkeys(key, np.array([last]))[0].item())(j[part])
    return out


def file_order(file_sizes: Sequence[int] | np.ndarray, config: OrderingConfig, epoch: int) -> np.ndarray:
    """The epoch's order of files (ORD-4): ``reference.ordering.file_order`` as int64.

    >>> file_order([5, 5, 5, 5], OrderingConfig(kind="window"), 0).tolist()
    [1, 3, 2, 0]
    """
    sizes = _checked_sizes(file_sizes)
    epoch = _check_epoch(epoch)
    return FeistelPermutation(len(sizes), derive_key(config.seed, epoch, Stream.FILE_ORDER)).to_array()


class EpochOrder:
    """Random access to one epoch's order: ``order(positions)`` → document ids, no permutation array (ORD-9).

    Why an object: the per-epoch setup (keys; for ``window`` the file order
    and its cumulative sizes, O(files)) is done once, then every lookup costs
    O(positions × Feistel rounds + positions × log files), whatever the
    position. This is what a dataset keeps per epoch to turn plan positions
    into document ids.

    >>> order = EpochOrder([3, 0, 2], OrderingConfig(kind="global"), 0)
    >>> order(np.array([0, 4])).tolist(), len(order)
    ([4, 1], 5)
    """

    __slots__ = (
        "_blocks",
        "_file_base",
        "_file_cum",
        "_key",
        "_last_block",
        "_perm",
        "_window",
        "kind",
        "n",
    )

    def __init__(self, file_sizes: Sequence[int] | np.ndarray, config: OrderingConfig, epoch: int) -> None:
        _check_kind(config)
        sizes = _checked_sizes(file_sizes)
        epoch = _check_epoch(epoch)
        self.kind = config.kind
        self.n = int(sizes.sum())
        self._perm: FeistelPermutation | None = None
        self._blocks: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._last_block: int | None = None
        if config.kind == "global":
            self._perm = FeistelPermutation(self.n, derive_key(config.seed, epoch, Stream.ORDER))
        elif config.kind == "window":
            self._window = config.window
            self._key = derive_key(config.seed, epoch, Stream.WINDOW)
            files = FeistelPermutation(len(sizes), derive_key(config.seed, epoch, Stream.FILE_ORDER)).to_array()
            starts = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, out=starts[1:])
            ordered = sizes[files]
            # _file_cum[j]: file-order position where the j-th file of the file order begins;
            # _file_base[j]: what to add to a file-order position inside it to get the global id.
            self._file_cum = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(ordered, out=self._file_cum[1:])
            self._file_base = starts[:-1][files] - self._file_cum[:-1]

    def __len__(self) -> int:
        return self.n

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Document ids at ``positions`` (int array, values in ``[0, N)``), as int64 of the same shape."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= self.n):
            bad = int(pos.min()) if int(pos.min()) < 0 else int(pos.max())
            raise ConfigError(f"position={bad} must be an integer in [0, N={self.n}) (the epoch has {self.n} documents)")
        if self.kind == "sequential":
            return pos.copy()
        if pos.size:
            cached = self._from_blocks(pos)
            if cached is not None:
                return cached
        if pos.size <= (FEW - 1 if self._perm is not None else SCALAR_LIMIT):
            return self._scalar(pos)
        return self._vector(pos)

    def _vector(self, pos: np.ndarray) -> np.ndarray:
        if self._perm is not None:
            return feistel(self.n, self._perm.key, pos, finish=self._perm.scalar)   # positions checked above
        flat = pos.reshape(-1)
        s = _window_source(self.n, self._window, self._key, flat)
        j = np.searchsorted(self._file_cum, s, side="right") - 1
        out: np.ndarray = (s + self._file_base[j]).reshape(pos.shape)
        return out

    def _from_blocks(self, pos: np.ndarray) -> np.ndarray | None:
        """The ids from cached blocks of ``BLOCK`` positions, or None (then the caller evaluates the positions).

        Why: the positions of a loader's batch are a short run of consecutive
        positions, the next batch's the run after it. Evaluating a batch's
        few dozen positions costs about as much as one vectorised pass over
        a whole block (a pass's cost is mostly fixed), and the block then
        serves the batches after it. A block is evaluated when a lookup
        falls in at most two adjacent blocks and the previous lookup did too
        (a sequential reader); isolated random lookups (``ds[i]`` for
        arbitrary ``i``) keep the cheaper scalar path. At most
        ``BLOCKS_KEPT`` blocks are kept (least recently used dropped), so
        memory stays O(BLOCK), never O(N) (ORD-9).
        """
        lo, hi = int(pos.min()) // BLOCK, int(pos.max()) // BLOCK
        if hi - lo > 1:
            return None
        streak = self._last_block in (lo, lo - 1, hi)
        self._last_block = hi
        wanted = (lo,) if lo == hi else (lo, hi)
        if not streak and not all(b in self._blocks for b in wanted):
            return None
        tables = []
        for b in wanted:   # local references only: another thread may evict a block meanwhile
            table = self._blocks.get(b)
            if table is None:
                start = b * BLOCK
                table = self._vector(np.arange(start, min(start + BLOCK, self.n), dtype=np.int64))
                self._blocks[b] = table
                while len(self._blocks) > BLOCKS_KEPT:
                    try:
                        self._blocks.popitem(last=False)
                    except KeyError:
                        break
            else:
                with contextlib.suppress(KeyError):
                    self._blocks.move_to_end(b)
            tables.append(table)
        table = tables[0] if lo == hi else np.concatenate(tables)
        found: np.ndarray = table[pos - lo * BLOCK]
        return found

    def _scalar(self, pos: np.ndarray) -> np.ndarray:
        """Few positions: ``impl.rng.ScalarFeistel``, the same network on Python integers.

        Why: a numpy call has a fixed cost per Feistel evaluation, many
        times what a scalar evaluation of one position costs; a sample of a
        packed dataset needs only a handful of positions.
        """
        flat = pos.reshape(-1).tolist()
        if self._perm is not None:
            perm = self._perm.scalar
            out = [perm(p) for p in flat]
        else:
            w, n = self._window, self.n
            sources = []
            for p in flat:
                k, j = divmod(p, w)
                start = k * w
                sources.append(start + ScalarFeistel(min(w, n - start), subkey(self._key, k))(j))
            s = np.asarray(sources, dtype=np.int64)
            j = np.searchsorted(self._file_cum, s, side="right") - 1
            ids: np.ndarray = (s + self._file_base[j]).reshape(pos.shape)
            return ids
        return np.asarray(out, dtype=np.int64).reshape(pos.shape)

    def to_array(self) -> np.ndarray:
        """The whole order, ``epoch_order``'s result (O(N) memory: only for building plans and tests)."""
        return self(np.arange(self.n, dtype=np.int64))


def epoch_order(file_sizes: Sequence[int] | np.ndarray, config: OrderingConfig, epoch: int) -> np.ndarray:
    """The permutation of ``[0, N)`` for this epoch as int64: ``reference.ordering.epoch_order``, vectorised.

    Clauses: ORD-1, ORD-2, ORD-3, ORD-4, ORD-5, ORD-11; ``kind="buffer"``
    raises NotImplementedError (see the module docstring).

    >>> epoch_order([3, 0, 2], OrderingConfig(), 0).tolist()
    [0, 1, 2, 3, 4]
    >>> epoch_order([], OrderingConfig(kind="global"), 0).tolist()
    []
    """
    return EpochOrder(file_sizes, config, epoch).to_array()


def order_at(file_sizes: Sequence[int] | np.ndarray, config: OrderingConfig, epoch: int,
             positions: np.ndarray | int) -> np.ndarray:
    """``epoch_order(file_sizes, config, epoch)[positions]`` without the order (ORD-9).

    ``positions`` is an int or an int array; the result has its shape. Cost:
    O(positions × rounds) for global, plus O(files) setup for window. A
    position outside ``[0, N)`` raises ConfigError naming ``position``.

    >>> order_at([3, 0, 2], OrderingConfig(kind="global"), 0, 0).tolist()
    4
    """
    return EpochOrder(file_sizes, config, epoch)(np.asarray(positions, dtype=np.int64))
