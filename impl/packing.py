"""Vectorised packing: ``reference.packing``'s plan as flat integer arrays, and the fill from mapped tokens.

Conforms to PACK-1 .. PACK-20 of docs/clauses/packing.md (PACK-21, config
validation, is ``reference.packing.PackingConfig``'s own): ``pack_plan``
returns the same pieces as ``reference.packing.pack_plan`` for every mode and
option, and ``materialize`` returns for one sample exactly what
``reference.packing.fill`` returns for it.

Why a plan of arrays: the plan is the single source of truth (PACK-20). A
loader that counts samples, resumes, or hands sample ``i`` to a DataLoader
worker needs to find sample ``i``'s pieces without touching the samples
before it, in time that does not grow with ``i``. Two shapes do that:

* ``concat`` / ``chunk`` (a *stream plan*, implicit): the kept documents'
  positions ``kept[K]`` and the cumulative prepared lengths ``cum[K + 1]``.
  Sample ``i`` covers stream tokens ``[i*hop, i*hop + L)`` (hop = L for
  concat, L + 1 for chunk, PACK-6 / PACK-8); two ``np.searchsorted`` calls on
  ``cum`` give its first and last document. O(documents) integers, built with
  a cumsum, no loop over samples.
* bin modes and ``none`` (a *bin plan*, explicit, CSR-like): every chunk
  ``(piece_pos, piece_start, piece_stop)`` of every kept document, in sample
  order, and ``sample_ptr[S + 1]``: sample ``i`` holds pieces
  ``sample_ptr[i] : sample_ptr[i + 1]``. Chunk spans come from their closed
  form with numpy (PACK-10, PACK-11); only the bin packers (PACK-15..17) run
  a Python loop, one window at a time, over the chunk widths. ``none``
  (PACK-19) is ``sample_ptr = arange(P + 1)``.

Everything else a sample needs is derived, never stored: whether a piece
starts with an inserted BOS (a continuation chunk under
``bos_on_continuation``), which offsets carry labels (``trained_offsets``,
PACK-4/7/9/12/13), where BOS/EOS are added (PACK-1).

Samples: ``materialize_batch(plan, indices, ...)`` returns ``[B, L]`` arrays,
row r being the reference's sample ``indices[r]`` (``-1``: the padding
sample), in a number of numpy calls that does not grow with ``B``:
``PackPlan.batch_pieces`` finds every row's pieces with one
``searchsorted`` (stream plans) or one gather of ``sample_ptr`` (bin
plans), and ``fill_batch`` lays all pieces end to end on one flat grid, with
the tokens copied one slice per piece (batches spanning files) or gathered
with one fancy index, and every per-piece event (BOS/EOS, continuation BOS,
untrained runs) written at piece-level positions. ``materialize`` is the
batch of one index: there is one fill, and the reference is its readable
statement.

Worked example (L = 4, lengths 3, 6, 1; the reference's doctest)::

    >>> from reference.packing import PackingConfig
    >>> plan = pack_plan([3, 6, 1], PackingConfig(seq_len=4))
    >>> plan.num_samples, plan.arrays["cum"].tolist()
    (2, [0, 3, 9, 10])
    >>> [p.tolist() for p in plan.pieces(1)]          # positions, starts, stops
    [[1], [1], [5]]
    >>> docs = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]])
    >>> materialize(plan, 0, PackingConfig(seq_len=4), docs)["labels"].tolist()
    [2, 3, -100, 5]
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from impl.collation import batch_cu_seqlens
from impl.errors import ConfigError, is_integer, require
from reference.packing import IGNORE, NO_DOC, NO_OFFSET, STREAM_MODES, PackingConfig, Piece

__all__ = [
    "PackPlan",
    "TokenSource",
    "pack_plan",
    "num_samples",
    "kept_lengths",
    "chunk_arrays",
    "materialize",
    "materialize_batch",
    "fill_batch",
    "greedy_bins",
    "first_fit_bins",
    "best_fit_bins",
    "PACKERS",
]

_I64 = np.int64
SLICE_MIN_WIDTH = 16
"""``fill_batch`` copies tokens one slice per piece when the batch spans files and its pieces average at least this
many positions; otherwise it fancy-indexes every position at once (faster for many tiny pieces, and for a batch
whose pieces all sit in one file)."""
STREAM_FIELDS = ("cum", "kept")
BIN_FIELDS = ("sample_ptr", "piece_pos", "piece_start", "piece_stop")


# ------------------------------------------------------------------ documents


def kept_lengths(lengths: np.ndarray | Sequence[int], config: PackingConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(kept positions, their prepared lengths)`` of raw lengths in input order (PACK-1, PACK-2).

    >>> [a.tolist() for a in kept_lengths([2, 0, 5], PackingConfig(seq_len=4, min_len=3))]
    [[2], [5]]
    """
    raw = np.asarray(lengths, dtype=_I64).reshape(-1)
    if raw.size and int(raw.min()) < 0:
        raise ConfigError(f"lengths hold a negative value ({int(raw.min())}); pass token counts of documents")
    prepared = raw + (int(config.add_bos) + int(config.add_eos))
    kept = np.flatnonzero((prepared > 0) & (prepared >= config.min_len))
    return kept.astype(_I64, copy=False), prepared[kept]


def chunk_arrays(prepared: np.ndarray, config: PackingConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every chunk of every document, vectorised: ``(document index, start, stop)`` (PACK-10, PACK-11).

    ``prepared`` holds prepared lengths; chunk c >= 1 of a document starts at
    ``L - stride + (c - 1) * step`` with ``step = L - β - stride`` and stops
    ``room = L - β`` tokens later or at the document's end, exactly as
    ``reference.packing.chunk_spans`` walks it.

    >>> cfg = PackingConfig(seq_len=4, mode="none", stride=1)
    >>> [a.tolist() for a in chunk_arrays(np.array([10, 3]), cfg)]
    [[0, 0, 0, 1], [0, 3, 6, 0], [4, 7, 10, 3]]
    """
    m = np.asarray(prepared, dtype=_I64)
    L = config.seq_len
    if config.splits:
        step = config.continuation_room - config.stride
        counts = np.where(m <= L, 1, 1 + (m - L + step - 1) // step)
    else:
        counts = np.ones(len(m), dtype=_I64)
    doc = np.repeat(np.arange(len(m), dtype=_I64), counts)
    first = np.zeros(len(m), dtype=_I64)
    np.cumsum(counts[:-1], out=first[1:])
    c = np.arange(len(doc), dtype=_I64) - np.repeat(first, counts)
    md = m[doc]
    if config.splits:
        start = np.where(c == 0, 0, L - config.stride + (c - 1) * step)
        stop = np.where(c == 0, np.minimum(md, L), np.minimum(md, start + config.continuation_room))
    else:
        start = np.zeros(len(doc), dtype=_I64)
        stop = np.minimum(md, L)
    return doc, start.astype(_I64, copy=False), stop.astype(_I64, copy=False)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """``[0, v0, v0 + v1, ...]``: length ``len(values) + 1``, int64."""
    out = np.zeros(len(values) + 1, dtype=_I64)
    np.cumsum(values, out=out[1:])
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` in three numpy calls (lengths >= 0).

    >>> _ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
    [5, 6, 9, 10, 11]
    """
    lengths = np.asarray(lengths, dtype=_I64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    out = np.arange(total, dtype=_I64)
    if total:
        out += np.repeat(np.asarray(starts, dtype=_I64) - (ends - lengths), lengths)
    return out


def _continuation_bos(start: np.ndarray, config: PackingConfig) -> np.ndarray:
    """Per piece: is ``bos_id`` inserted before it (``reference.packing.has_continuation_bos``)?"""
    if config.splits and config.bos_on_continuation:
        return np.asarray(start) > 0
    return np.zeros(np.shape(start), dtype=bool)


# ------------------------------------------------------------------ packers


def greedy_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Next-fit (PACK-15): ``reference.packing.greedy_bins``.

    >>> greedy_bins([3, 4, 2, 1], 4)
    [[0], [1], [2, 3]]
    """
    bins: list[list[int]] = []
    room = 0
    current: list[int] = []
    for item, width in enumerate(widths):
        if not bins or width > room:
            current = []
            bins.append(current)
            room = capacity
        current.append(item)
        room -= width
    return bins


def first_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit (PACK-16): ``reference.packing.first_fit_bins`` with the max-tree inlined.

    The tree holds each bin's room (-1 for bins not yet opened); a lookup
    descends to the lowest leaf with room >= width, an update climbs only while
    a parent's maximum changes.

    >>> first_fit_bins([3, 4, 2, 1], 4)
    [[0, 3], [1], [2]]
    """
    size = 1 << max(0, len(widths) - 1).bit_length()
    tree = [-1] * (2 * size)
    bins: list[list[int]] = []
    for item, width in enumerate(widths):
        if tree[1] >= width:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= width else 2 * node + 1
            bins[node - size].append(item)
            tree[node] -= width
        else:
            node = len(bins) + size
            bins.append([item])
            tree[node] = capacity - width
        node >>= 1
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            best = left if left > right else right
            if tree[node] == best:
                break
            tree[node] = best
            node >>= 1
    return bins


def best_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing (PACK-17): ``reference.packing.best_fit_bins``.

    Open bins are one sorted list of ints ``room << 32 | bin`` (the
    reference's ``(room, bin)`` tuples, cheaper to compare); a full bin
    (room 0) can take no item (widths >= 1) and leaves the list.

    >>> best_fit_bins([3, 4, 2, 1], 4)
    [[1], [0, 3], [2]]
    >>> best_fit_bins([6, 4, 4, 1], 9)
    [[0], [1, 2, 3]]
    """
    w = np.asarray(widths, dtype=_I64)
    order = np.argsort(-w, kind="stable").tolist()
    bins: list[list[int]] = []
    rooms: list[int] = []
    for item in order:
        width = widths[item]
        at = bisect.bisect_left(rooms, width << 32)
        if at == len(rooms):
            target, room = len(bins), capacity
            bins.append([item])
        else:
            key = rooms.pop(at)
            target, room = key & 0xFFFFFFFF, key >> 32
            bins[target].append(item)
        room -= width
        if room:
            bisect.insort(rooms, room << 32 | target)
    return bins


PACKERS: dict[str, Callable[[Sequence[int], int], list[list[int]]]] = {
    "greedy": greedy_bins, "first_fit": first_fit_bins, "best_fit": best_fit_bins}


# ------------------------------------------------------------------ the plan


class PackPlan:
    """One epoch's packing plan as flat int64 arrays (see the module docstring for the two shapes).

    ``arrays`` is what gets cached (``STREAM_FIELDS`` or ``BIN_FIELDS``);
    the arrays may be read-only memory maps. ``pieces(i)`` returns sample
    ``i``'s ``(positions, starts, stops)`` in O(log documents + pieces).
    """

    __slots__ = ("mode", "seq_len", "arrays", "num_samples", "_hop")

    def __init__(self, mode: str, seq_len: int, arrays: Mapping[str, np.ndarray]) -> None:
        fields = STREAM_FIELDS if mode in STREAM_MODES else BIN_FIELDS
        require(set(arrays) == set(fields), ConfigError,
                f"a {mode!r} plan needs arrays {fields}, got {sorted(arrays)}; recompute the plan")
        self.mode = mode
        self.seq_len = seq_len
        self.arrays = dict(arrays)
        if mode in STREAM_MODES:
            n = int(self.arrays["cum"][-1]) if len(self.arrays["cum"]) else 0
            self._hop = seq_len if mode == "concat" else seq_len + 1
            self.num_samples = max(0, (n - 1) // seq_len) if mode == "concat" else n // (seq_len + 1)
        else:
            self._hop = 0
            self.num_samples = len(self.arrays["sample_ptr"]) - 1

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}[{len(v)}]" for k, v in self.arrays.items())
        return f"PackPlan(mode={self.mode!r}, seq_len={self.seq_len}, samples={self.num_samples}, {sizes})"

    def check_index(self, i: Any) -> None:
        """ConfigError unless ``i`` is an integer sample index of this plan."""
        if not (is_integer(i) and 0 <= i < self.num_samples):
            raise ConfigError(f"sample index {i} outside the plan's {self.num_samples} samples")

    def pieces(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample ``i``'s pieces as ``(input positions, starts, stops)``, int64, in input order."""
        self.check_index(i)
        if self.mode in STREAM_MODES:
            cum, kept = self.arrays["cum"], self.arrays["kept"]
            lo = i * self._hop
            hi = lo + self.seq_len
            k0 = int(np.searchsorted(cum, lo, side="right")) - 1
            k1 = int(np.searchsorted(cum, hi - 1, side="right")) - 1
            begins = np.asarray(cum[k0:k1 + 2], dtype=_I64)
            starts = np.maximum(0, lo - begins[:-1])
            stops = np.minimum(np.diff(begins), hi - begins[:-1])
            return np.asarray(kept[k0:k1 + 1], dtype=_I64), starts, stops
        ptr = self.arrays["sample_ptr"]
        a, b = int(ptr[i]), int(ptr[i + 1])
        return (np.asarray(self.arrays["piece_pos"][a:b], dtype=_I64),
                np.asarray(self.arrays["piece_start"][a:b], dtype=_I64),
                np.asarray(self.arrays["piece_stop"][a:b], dtype=_I64))

    def batch_pieces(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The pieces of samples ``indices`` (``-1``: padding, no pieces) as ``(counts, positions, starts, stops)``.

        ``counts[r]`` pieces belong to row ``r``; the other three arrays hold
        every row's pieces back to back, each row's as ``pieces(indices[r])``
        returns them. A fixed number of numpy calls whatever the batch size:
        stream plans do one ``searchsorted`` on all the rows' first and last
        positions, bin plans one gather of ``sample_ptr``.

        >>> plan = pack_plan([3, 6, 1], PackingConfig(seq_len=4))
        >>> [a.tolist() for a in plan.batch_pieces([1, -1, 0])]
        [[1, 0, 2], [1, 0, 1], [1, 0, 0], [5, 3, 1]]
        """
        idx = np.asarray(indices, dtype=_I64).reshape(-1)
        n = len(idx)
        bad = (idx < -1) | (idx >= self.num_samples)
        if bad.any():
            i = int(idx[int(np.argmax(bad))])
            raise ConfigError(f"sample index {i} outside the plan's {self.num_samples} samples (-1 is the padding sample)")
        real = idx >= 0
        if not real.any():
            empty = np.zeros(0, dtype=_I64)
            return np.zeros(n, dtype=_I64), empty, empty.copy(), empty.copy()
        if self.mode in STREAM_MODES:
            cum, kept = self.arrays["cum"], self.arrays["kept"]
            lo = idx * self._hop
            k = np.searchsorted(cum, np.concatenate((lo, lo + (self.seq_len - 1))), side="right") - 1
            k0 = k[:n]
            counts = np.where(real, k[n:] - k0 + 1, 0)
            kk = _ranges(k0, counts)
            begin = np.asarray(cum[kk], dtype=_I64)
            span = np.asarray(cum[kk + 1], dtype=_I64) - begin
            first = np.repeat(lo, counts) - begin                   # the row's first position, document-relative
            return (counts, np.asarray(kept[kk], dtype=_I64), np.maximum(first, 0),
                    np.minimum(span, first + self.seq_len))
        ptr = self.arrays["sample_ptr"]
        safe = np.where(real, idx, 0)
        bounds = np.asarray(ptr[np.concatenate((safe, safe + 1))], dtype=_I64)
        counts = np.where(real, bounds[n:] - bounds[:n], 0)
        pi = _ranges(bounds[:n], counts)
        return (counts, np.asarray(self.arrays["piece_pos"][pi], dtype=_I64),
                np.asarray(self.arrays["piece_start"][pi], dtype=_I64),
                np.asarray(self.arrays["piece_stop"][pi], dtype=_I64))

    def to_reference(self) -> list[tuple[Piece, ...]]:
        """The plan in ``reference.packing.pack_plan``'s form (for tests; O(samples) Python objects)."""
        out = []
        for i in range(self.num_samples):
            pos, start, stop = self.pieces(i)
            out.append(tuple(Piece(int(d), int(a), int(b)) for d, a, b in zip(pos, start, stop)))
        return out


def _stream_plan(kept: np.ndarray, prepared: np.ndarray, config: PackingConfig) -> PackPlan:
    cum = np.zeros(len(kept) + 1, dtype=_I64)
    np.cumsum(prepared, out=cum[1:])
    return PackPlan(config.mode, config.seq_len, {"cum": cum, "kept": kept})


def _bin_plan(kept: np.ndarray, prepared: np.ndarray, config: PackingConfig) -> PackPlan:
    doc, start, stop = chunk_arrays(prepared, config)
    pos = kept[doc]
    if config.mode == "none":
        ptr = np.arange(len(doc) + 1, dtype=_I64)
        return PackPlan("none", config.seq_len, {"sample_ptr": ptr, "piece_pos": pos, "piece_start": start,
                                                 "piece_stop": stop})
    widths = stop - start + _continuation_bos(start, config)
    packer = PACKERS[config.mode]
    # Items of window k are those of kept documents k*window .. (k+1)*window - 1: a contiguous run (PACK-14).
    windows = -(-len(kept) // config.window)
    bounds = np.minimum(np.arange(windows + 1, dtype=_I64) * config.window, len(kept))
    edges = np.searchsorted(doc, bounds, side="left")
    order_parts: list[np.ndarray] = []
    size_parts: list[list[int]] = []
    all_widths = widths.tolist()
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        bins = packer(all_widths[lo:hi], config.seq_len)
        order_parts.append(np.fromiter(chain.from_iterable(bins), dtype=_I64, count=hi - lo) + lo)
        size_parts.append([len(b) for b in bins])
    order = np.concatenate(order_parts) if order_parts else np.zeros(0, dtype=_I64)
    sizes = np.fromiter(chain.from_iterable(size_parts), dtype=_I64)
    ptr = np.zeros(len(sizes) + 1, dtype=_I64)
    np.cumsum(sizes, out=ptr[1:])
    return PackPlan(config.mode, config.seq_len, {"sample_ptr": ptr, "piece_pos": pos[order],
                                                  "piece_start": start[order], "piece_stop": stop[order]})


def pack_plan(lengths: np.ndarray | Sequence[int], config: PackingConfig) -> PackPlan:
    """Every sample's pieces from raw document lengths in input order: ``reference.packing.pack_plan`` (PACK-20).

    Clauses: PACK-2, PACK-6, PACK-8, PACK-10, PACK-11, PACK-14 .. PACK-20.

    >>> pack_plan([3, 0, 6, 1], PackingConfig(seq_len=4, mode="first_fit")).to_reference()
    [(Piece(doc=0, start=0, stop=3), Piece(doc=3, start=0, stop=1)), (Piece(doc=2, start=0, stop=4),), (Piece(doc=2, start=4, stop=6),)]
    """
    require(isinstance(config, PackingConfig), ConfigError,
            f"config={config!r} must be a reference.packing.PackingConfig")
    kept, prepared = kept_lengths(lengths, config)
    if config.mode in STREAM_MODES:
        return _stream_plan(kept, prepared, config)
    return _bin_plan(kept, prepared, config)


def num_samples(lengths: np.ndarray | Sequence[int], config: PackingConfig) -> int:
    """``reference.packing.num_samples``: closed forms for concat, chunk and none; the plan for bin modes.

    Independent of the document order for concat, chunk and none, so a
    dataset sizes every epoch of those modes from the lengths once.

    >>> num_samples([3, 6, 1], PackingConfig(seq_len=4)), num_samples([3, 6, 1], PackingConfig(seq_len=4, mode="none"))
    (2, 4)
    """
    _, prepared = kept_lengths(lengths, config)
    n, L = int(prepared.sum()), config.seq_len
    if config.mode == "concat":
        return max(0, (n - 1) // L)
    if config.mode == "chunk":
        return n // (L + 1)
    if config.mode == "none":
        if not config.splits:
            return len(prepared)
        step = config.continuation_room - config.stride
        return int(np.where(prepared <= L, 1, 1 + (prepared - L + step - 1) // step).sum())
    return pack_plan(lengths, config).num_samples


# ------------------------------------------------------------------ tokens


class TokenSource:
    """Raw (unprepared) document tokens, addressed by global token index: a store's mapped files or a list.

    ``doc_offsets[d]`` is where document d begins in the concatenation of all
    documents (store order) and ``take(indices)`` gathers tokens at global
    indices with one fancy index per file touched (zero-copy views of the
    mapped files, no per-document Python work).

    >>> src = TokenSource.from_documents([[5, 6], [], [7]])
    >>> src.lengths.tolist(), src.take(np.array([2, 0])).tolist()
    ([2, 0, 1], [7, 5])
    """

    __slots__ = ("doc_offsets", "lengths", "_parts", "_part_starts")

    def __init__(self, parts: Sequence[np.ndarray], doc_offsets: np.ndarray) -> None:
        self._parts = [p for p in parts if len(p)]
        starts = np.zeros(len(self._parts) + 1, dtype=_I64)
        np.cumsum([len(p) for p in self._parts], out=starts[1:])
        self._part_starts = starts
        self.doc_offsets = np.asarray(doc_offsets, dtype=_I64)
        self.lengths = np.diff(self.doc_offsets)
        require(int(self.doc_offsets[-1]) == int(starts[-1]), ConfigError,
                f"document offsets end at {int(self.doc_offsets[-1])} but the token parts hold {int(starts[-1])} tokens")

    @classmethod
    def from_store(cls, store: Any) -> TokenSource:
        """One zero-copy view per non-empty store file (``store.read`` of the file's token range)."""
        bounds = np.zeros(len(store.file_token_counts) + 1, dtype=_I64)
        np.cumsum(store.file_token_counts, out=bounds[1:])
        parts = [store.read(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        return cls(parts, store.doc_offsets)

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]]) -> TokenSource:
        lengths = np.fromiter((len(d) for d in documents), dtype=_I64, count=len(documents))
        offsets = np.zeros(len(documents) + 1, dtype=_I64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter(chain.from_iterable(documents), dtype=_I64, count=int(offsets[-1]))
        return cls([values], offsets)

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Tokens at global indices (each in ``[0, total)``), as int64."""
        idx = np.asarray(indices, dtype=_I64)
        if len(self._parts) == 1:
            return self._parts[0][idx].astype(_I64)
        if not idx.size or not self._parts:   # no tokens at all: callers only ask for BOS/EOS positions then
            return np.zeros(idx.shape, dtype=_I64)
        starts = self._part_starts
        first, last = (int(x) for x in np.searchsorted(starts, (idx.min(), idx.max()), side="right") - 1)
        if first == last:   # the usual case: a sample's documents sit in one file
            return self._parts[first][idx - starts[first]].astype(_I64)
        out = np.empty(idx.shape, dtype=_I64)
        part = np.searchsorted(starts, idx, side="right") - 1
        for f in range(first, last + 1):
            sel = part == f
            if sel.any():
                out[sel] = self._parts[f][idx[sel] - starts[f]]
        return out

    @property
    def num_parts(self) -> int:
        return len(self._parts)

    def copy_runs(self, out: np.ndarray, parts: np.ndarray, starts: np.ndarray, dest: np.ndarray, widths: np.ndarray,
                  lo: np.ndarray, hi: np.ndarray, after: np.ndarray) -> np.ndarray:
        """Copy run ``r`` (part ``parts[r]``, part-local ``starts[r]`` .. ``+ widths[r]``) to ``out[dest[r]:]``; return ``part[after]``.

        Only the part of each run inside ``[lo[r], hi[r])`` (its document) is
        copied; the positions outside it are left for the caller (they are
        BOS/EOS positions it overwrites). Returns the token at part-local
        ``after[r]`` of each run's part, int64. Why slices: a batch of packed
        samples is a few dozen long runs, and one ``memcpy``-like slice copy
        per run is several times faster than a fancy index over every
        position when the runs are scattered across files (the global
        shuffle).

        >>> src = TokenSource([np.array([5, 6, 7]), np.array([8, 9])], np.array([0, 2, 3, 5]))
        >>> out = np.full(4, -1)
        >>> src.copy_runs(out, np.array([1, 0]), np.array([0, -1]), np.array([0, 2]), np.array([2, 2]),
        ...               np.array([0, 0]), np.array([2, 2]), np.array([1, 2])).tolist(), out.tolist()
        ([9, 7], [8, 9, -1, 5])
        """
        c0 = np.maximum(starts, lo)
        c1 = np.minimum(starts + widths, hi)
        at = dest + (c0 - starts)
        got = []
        for q, x0, x1, d, k in zip(parts.tolist(), c0.tolist(), c1.tolist(), at.tolist(), after.tolist()):
            values = self._parts[q]
            if x1 > x0:
                out[d:d + x1 - x0] = values[x0:x1]
            got.append(values[k])
        return np.array(got, dtype=_I64)

    def document_parts(self, doc_start: np.ndarray,
                       length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(part, its first, its last global token index)`` of each document; None if one spans parts.

        Documents are given by their first global token index and length.

        A document lies in part ``q`` when its tokens ``[start, start + length)``
        fall inside the part's range; an empty document at a boundary belongs
        to the part that begins there (it has no token to read). None means
        some document spans parts (only a hand-built source can do that).

        >>> src = TokenSource([np.array([5, 6, 7]), np.array([8, 9])], np.array([0, 2, 3, 5]))
        >>> [a.tolist() for a in src.document_parts(np.array([3, 0, 5]), np.array([2, 2, 0]))]
        [[1, 0, 1], [3, 0, 3], [4, 2, 4]]
        >>> src.document_parts(np.array([2]), np.array([2])) is None   # tokens 2..3 straddle the parts
        True
        """
        starts = self._part_starts
        total = int(starts[-1])
        q = np.searchsorted(starts, np.minimum(doc_start, max(total - 1, 0)), side="right") - 1
        np.minimum(q, max(len(self._parts) - 1, 0), out=q)
        if (doc_start + length > starts[q + 1]).any():
            return None
        return q, starts[q], starts[q + 1] - 1

    def take_runs(self, indices: np.ndarray, run_starts: np.ndarray, run_lengths: np.ndarray,
                  run_parts: np.ndarray) -> np.ndarray:
        """Tokens at part-local ``indices``, cut into runs each inside one part: one fancy index per part touched.

        Run ``r`` is ``indices[run_starts[r] : run_starts[r] + run_lengths[r]]``,
        indices into part ``run_parts[r]`` (``document_parts`` gives where
        parts begin); the runs cover ``indices``. Returns the parts' dtype (callers
        cast once, into their own output). Why: ``take`` finds the part of
        every index with a ``searchsorted`` and one mask per part, while here
        the runs (a batch's pieces) are reordered by part with a stable
        argsort over runs, each part's indices gathered as one slice, and the
        result put back with one scatter: a fixed number of passes over the
        indices however many parts are touched, none when all runs share a part.

        >>> src = TokenSource([np.array([5, 6, 7]), np.array([8, 9])], np.array([0, 2, 3, 5]))
        >>> src.take_runs(np.array([0, 1, 0, 1]), np.array([0, 2]), np.array([2, 2]), np.array([1, 0])).tolist()
        [8, 9, 5, 6]
        """
        idx = np.asarray(indices, dtype=_I64)
        parts = np.asarray(run_parts, dtype=_I64)
        if not idx.size or not self._parts:
            return np.zeros(idx.shape, dtype=_I64)
        if len(self._parts) == 1 or not (parts != parts[0]).any():
            return self._parts[int(parts[0])][idx]
        order = np.argsort(parts, kind="stable")
        lengths = np.asarray(run_lengths, dtype=_I64)[order]
        perm = _ranges(np.asarray(run_starts, dtype=_I64)[order], lengths)
        grouped = idx[perm]
        bounds = _exclusive_cumsum(lengths)[np.searchsorted(parts[order], np.arange(len(self._parts) + 1), side="left")]
        gathered = np.empty(len(grouped), dtype=np.result_type(*self._parts))
        for q in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
            lo, hi = int(bounds[q]), int(bounds[q + 1])
            gathered[lo:hi] = self._parts[q][grouped[lo:hi]]
        out = np.empty(idx.shape, dtype=gathered.dtype)
        out[perm] = gathered
        return out


def _check_plan(plan: PackPlan, config: PackingConfig) -> None:
    if plan.mode != config.mode or plan.seq_len != config.seq_len:
        raise ConfigError(f"plan is for mode={plan.mode!r}, seq_len={plan.seq_len} but config has "
                          f"mode={config.mode!r}, seq_len={config.seq_len}; compute the plan with this config")


def materialize(plan: PackPlan, i: int, config: PackingConfig, source: TokenSource,
                doc_ids: Callable[[np.ndarray], np.ndarray] | np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Sample ``i`` of ``plan``: ``reference.packing.fill(plan, documents, config)[i]`` as numpy arrays.

    ``doc_ids`` maps the plan's input positions to global document ids (rows
    of ``source``): a callable such as ``impl.ordering.EpochOrder``, an array
    (``doc_ids[position]``), or None when positions are document ids. The
    output's ``doc_ids`` field holds those ids, as ``fill`` reports the
    document's id. Returns int64 arrays of length L (``input_ids``,
    ``labels``, ``position_ids``, ``doc_ids``, ``token_offsets``) and
    ``document_starts`` (where each piece begins). Cost O(log documents +
    pieces + L), independent of ``i``: it is ``materialize_batch`` of the one
    index, so the single-sample and the batched paths are one computation.

    Clauses: PACK-3, PACK-4, PACK-5 (and the plan's clauses through ``plan``).

    >>> src = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    >>> cfg = PackingConfig(seq_len=4, mode="greedy")
    >>> s = materialize(pack_plan([3, 6], cfg), 2, cfg, src)
    >>> s["input_ids"].tolist(), s["labels"].tolist(), s["position_ids"].tolist(), s["document_starts"].tolist()
    ([8, 9, 0, 0], [9, -100, -100, -100], [0, 1, 0, 0], [0])
    """
    _check_plan(plan, config)
    plan.check_index(i)
    rows = materialize_batch(plan, np.array([i], dtype=_I64), config, source, doc_ids)
    out = {name: values[0] for name, values in rows.items()}
    out["document_starts"] = np.flatnonzero((out["position_ids"] == 0) & (out["doc_ids"] != NO_DOC))
    return out


# ------------------------------------------------------------------ the batched fill


BATCH_FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")


def _rows_block(rows: int, config: PackingConfig, *, padded: bool) -> dict[str, np.ndarray]:
    """``[rows, seq_len]`` int64 arrays for ``BATCH_FIELDS``, views of one block (filled as padding if ``padded``).

    Why one block: one allocation instead of five (fewer page faults for
    fresh memory, which dominate when every batch is new memory).
    """
    block = np.empty((len(BATCH_FIELDS), rows, config.seq_len), dtype=_I64)
    if padded:
        for field, value in zip(block, (config.pad_id, IGNORE, 0, NO_DOC, NO_OFFSET)):
            field.fill(value)
    return dict(zip(BATCH_FIELDS, block))


_ARANGE = np.arange(0, dtype=_I64)


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` as a read-only view of a cached, growing array (saves a pass and an allocation per batch)."""
    global _ARANGE
    if len(_ARANGE) < n:
        grown = np.arange(max(n, 2 * len(_ARANGE)), dtype=_I64)
        grown.setflags(write=False)
        _ARANGE = grown
    return _ARANGE[:n]


def _with_segments(out: dict[str, Any], heads: np.ndarray | None = None, widths: np.ndarray | None = None) -> dict[str, Any]:
    """Add ``cu_seqlens`` / ``max_seqlen`` (``batch_cu_seqlens`` of ``position_ids``); from the pieces when rows are full.

    With every row full, the segments are exactly the pieces (a piece's
    positions count 0, 1, ... from its head, and each row starts with a
    piece), so no pass over the ``[B, L]`` positions is needed.
    """
    if heads is None:
        out["cu_seqlens"], out["max_seqlen"] = batch_cu_seqlens(out["position_ids"])
    else:
        cu = np.empty(len(heads) + 1, dtype=np.int32)
        cu[:-1] = heads
        cu[-1] = out["position_ids"].size
        out["cu_seqlens"], out["max_seqlen"] = cu, int(widths.max())
    return out


def fill_batch(counts: np.ndarray, doc_ids: np.ndarray, starts: np.ndarray, stops: np.ndarray, config: PackingConfig,
               source: TokenSource, *, segments: bool = False) -> dict[str, np.ndarray]:
    """Rows of samples from their pieces, as ``reference.packing.fill`` builds them, with no Python work per row or piece.

    Row ``r`` holds the next ``counts[r]`` pieces of ``(doc_ids, starts,
    stops)`` (``PackPlan.batch_pieces``'s layout; a row with no piece is the
    padding sample). Returns int64 ``[rows, seq_len]`` arrays ``input_ids``,
    ``labels``, ``position_ids``, ``doc_ids``, ``token_offsets``, equal to
    the reference's samples stacked (without ``document_starts``).
    With ``segments``, also ``cu_seqlens`` (int32) and ``max_seqlen``, as
    ``batch_cu_seqlens(position_ids)`` gives them.

    How: every piece's positions are laid end to end on one flat grid of
    ``T`` tokens (``seg``: exclusive cumsum of the widths); per-token values
    are a per-piece constant repeated over the piece (``np.repeat``) plus
    the position in it; the token ids and each piece's label after its stop
    come from one gather per part touched (``TokenSource.take_runs``);
    everything that happens at most once per piece (BOS/EOS at a
    document's edge, an inserted continuation BOS, the untrained head and
    tail runs of a piece) is written at piece-level positions. Full rows
    (concat, chunk) are computed in place in the output; shorter rows are
    scattered into padding rows.

    >>> src = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    >>> cfg = PackingConfig(seq_len=4, mode="greedy")
    >>> rows = fill_batch(np.array([2, 0]), np.array([0, 1]), np.array([2, 0]), np.array([3, 2]), cfg, src)
    >>> rows["input_ids"].tolist(), rows["labels"].tolist()
    ([[3, 4, 5, 0], [0, 0, 0, 0]], [[-100, 5, -100, -100], [-100, -100, -100, -100]])
    """
    L = config.seq_len
    counts = np.asarray(counts, dtype=_I64).reshape(-1)
    docs = np.asarray(doc_ids, dtype=_I64).reshape(-1)
    a = np.asarray(starts, dtype=_I64).reshape(-1)
    b = np.asarray(stops, dtype=_I64).reshape(-1)
    B, P = len(counts), len(docs)
    if not int(counts.sum()) == P == len(a) == len(b):
        raise ConfigError(f"counts sum to {int(counts.sum())} pieces but doc_ids/starts/stops hold "
                          f"{P}/{len(a)}/{len(b)}; pass PackPlan.batch_pieces's arrays")
    if P == 0:
        empty = _rows_block(B, config, padded=True)
        return _with_segments(empty) if segments else empty
    ab, ae = int(config.add_bos), int(config.add_eos)
    doc_start = source.doc_offsets[docs]
    length = source.lengths[docs]
    m = length + (ab + ae)                                      # prepared lengths
    inserts = config.splits and config.bos_on_continuation      # continuation BOS possible at all?
    bos = (a > 0).astype(_I64) if inserts else np.zeros(P, dtype=_I64)
    widths = b - a + bos
    require(bool((widths >= 1).all()), ConfigError, "a plan piece holds no position; the plan is not for this config")
    seg = _exclusive_cumsum(widths)                             # piece p: flat positions seg[p] .. seg[p + 1] - 1
    heads = seg[:-1]
    row_ptr = _exclusive_cumsum(counts)
    totals = seg[row_ptr[1:]] - seg[row_ptr[:-1]]
    if int(totals.max()) > L:
        raise ConfigError(f"a plan sample holds {int(totals.max())} positions but seq_len={L}; "
                          "the plan is not for this config")
    T = int(seg[-1])
    full = T == B * L                                           # every row full (concat, chunk): compute in place
    out = _rows_block(B, config, padded=not full)
    if full:
        tokens, labels, rel, out_docs, offset = (out[name].reshape(-1) for name in BATCH_FIELDS)
    else:
        tokens, labels, rel, out_docs, offset = (np.empty(T, dtype=_I64) for _ in BATCH_FIELDS)
    first_offset = a - bos                                      # prepared offset at a piece's first position

    np.subtract(_arange(T), np.repeat(heads, widths), out=rel)  # position in its piece = position_ids
    np.add(rel, np.repeat(first_offset, widths), out=offset)    # prepared offset (a - 1 at an inserted BOS)
    # Token indices: every position's raw token, then each piece's token after its stop (its last label),
    # local to the part (file) holding the piece's document.
    part, part_lo, part_hi, local = _piece_parts(source, doc_start, length)
    raw_base = doc_start - ab - part_lo                         # part-local index of prepared offset 0
    after_idx = np.minimum(np.maximum(raw_base + b, 0), part_hi - part_lo)  # past the document: never trained
    # Offsets 0 (add_bos) and m - 1 (add_eos), at most one position per piece each, lie outside the document;
    # their tokens are written below.
    edges = []
    for on, at_offset in ((ab, np.zeros(P, dtype=_I64)), (ae, m - 1)):
        if on:
            r = at_offset - first_offset
            hit = np.flatnonzero((r >= 0) & (r < widths))
            edges.append(heads[hit] + r[hit])
    spans_parts = source.num_parts > 1 and bool((part != part[0]).any())
    if local and spans_parts and T >= SLICE_MIN_WIDTH * P:
        doc_lo = doc_start - part_lo
        after = source.copy_runs(tokens, part, raw_base + first_offset, heads, widths, doc_lo, doc_lo + length, after_idx)
    else:
        values = _gather(source, part, local, spans_parts, offset, raw_base, after_idx, heads, widths, edges)
        tokens[:] = values[:T]
        after = values[T:].astype(_I64)
    if ab:
        tokens[edges[0]] = config.bos_id
        after[b == 0] = config.bos_id
    if ae:
        tokens[edges[-1]] = config.eos_id
        after[b == m - 1] = config.eos_id

    labels[:-1] = tokens[1:]                                    # the label of position j: the token at offset + 1
    labels[seg[1:] - 1] = after
    if config.mode in STREAM_MODES:
        first, last = a, np.minimum(b, m - 1)
    else:
        first, last = np.where(a > 0, a + max(0, config.stride - 1), 0), b - 1
    # Trained: first <= offset < last, i.e. lead <= rel < tail; the rest of a piece is a head and a tail run.
    lead = np.minimum(np.maximum(first - first_offset, 0), widths)
    tail = np.maximum(np.minimum(last - first_offset, widths), lead)
    cut = widths - tail
    if int(lead.max()) == 0 and int(cut.max()) <= 1:     # stream modes: at most a piece's last position is masked
        labels[(heads + tail)[cut > 0]] = IGNORE
    else:
        labels[_ranges(np.concatenate((heads, heads + tail)), np.concatenate((lead, cut)))] = IGNORE
    if inserts:
        at = heads[bos > 0]
        tokens[at] = config.bos_id
        offset[at] = NO_OFFSET
    out_docs[:] = np.repeat(docs, widths)
    if not full:
        if B == 1:      # one row (``materialize``): its positions are the row's first T
            for name, values in zip(BATCH_FIELDS, (tokens, labels, rel, out_docs, offset)):
                out[name][0, :T] = values
        else:
            dest = np.flatnonzero(_arange(L) < totals[:, None])
            for name, values in zip(BATCH_FIELDS, (tokens, labels, rel, out_docs, offset)):
                out[name].reshape(-1)[dest] = values
    if segments:
        return _with_segments(out, heads, widths) if full else _with_segments(out)
    return out


def _gather(source: TokenSource, part: np.ndarray, local: bool, spans_parts: bool, offset: np.ndarray,
            raw_base: np.ndarray, after_idx: np.ndarray, heads: np.ndarray, widths: np.ndarray,
            edges: list[np.ndarray]) -> np.ndarray:
    """Every position's raw token, then each piece's token after its stop, by fancy indexing (``fill_batch``'s short-piece path).

    Why a second way to read tokens: with short pieces (a few tokens each)
    one index array over the batch beats a Python-level copy per piece.
    """
    T, P = len(offset), len(heads)
    idx = np.empty(T + P, dtype=_I64)
    np.add(offset, np.repeat(raw_base, widths), out=idx[:T])
    idx[T:] = after_idx
    for at in edges:       # outside the document: any valid index will do, the value is replaced
        idx[at] = 0
    if not local:          # a document spans parts (hand-built sources only): global indices
        return source.take(idx)
    if spans_parts:
        return source.take_runs(idx, np.concatenate((heads, T + _arange(P))),
                                np.concatenate((widths, np.ones(P, dtype=_I64))), np.concatenate((part, part)))
    return source.take_runs(idx, heads[:1], np.array([T + P]), part[:1])   # one part holds the batch: one fancy index


def _piece_parts(source: TokenSource, doc_start: np.ndarray,
                 length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """``(part, first index, last index, local)`` per piece: the part (file) of its document, as global token indices.

    ``local`` is False when some document spans parts (possible only for a
    hand-built ``TokenSource``; a store's documents never span files): then
    the part is 0 and the bounds are the whole source's, so indices stay global.
    """
    P = len(doc_start)
    total = int(source.doc_offsets[-1])
    if source.num_parts > 1:
        found = source.document_parts(doc_start, length)
        if found is not None:
            return (*found, True)
    zeros = np.zeros(P, dtype=_I64)
    return zeros, zeros, np.full(P, max(total - 1, 0), dtype=_I64), source.num_parts <= 1


def materialize_batch(plan: PackPlan, indices: np.ndarray | Sequence[int], config: PackingConfig, source: TokenSource,
                      doc_ids: Callable[[np.ndarray], np.ndarray] | np.ndarray | None = None, *,
                      segments: bool = False) -> dict[str, np.ndarray]:
    """Samples ``indices`` of ``plan`` (``-1``: the padding sample) as int64 ``[len(indices), seq_len]`` arrays.

    Equal, field for field, to stacking the reference's samples ``i`` (the
    padding sample for ``-1``, ``reference.resume.padding_sample``), in a
    number of numpy calls that
    does not grow with the batch: one ``PackPlan.batch_pieces``, one
    ``doc_ids`` lookup of every piece's position, one ``fill_batch``.
    Keys: ``input_ids``, ``labels``, ``position_ids``, ``doc_ids``,
    ``token_offsets``; with ``segments``, also ``cu_seqlens`` and
    ``max_seqlen`` (``fill_batch``).

    Clauses: PACK-3, PACK-4, PACK-5, PACK-20 (and the plan's clauses through ``plan``).

    >>> from reference.packing import PackingConfig
    >>> docs = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]])
    >>> rows = materialize_batch(pack_plan([3, 6, 1], PackingConfig(seq_len=4)), [1, 0, -1], PackingConfig(seq_len=4), docs)
    >>> rows["input_ids"].tolist(), rows["labels"][1].tolist()
    ([[5, 6, 7, 8], [1, 2, 3, 4], [0, 0, 0, 0]], [2, 3, -100, 5])
    """
    _check_plan(plan, config)
    counts, pos, start, stop = plan.batch_pieces(indices)
    if not len(pos) or doc_ids is None:
        docs = pos
    elif callable(doc_ids):
        docs = np.asarray(doc_ids(pos), dtype=_I64)
    else:
        docs = np.asarray(doc_ids)[pos]
    return fill_batch(counts, docs, start, stop, config, source, segments=segments)
