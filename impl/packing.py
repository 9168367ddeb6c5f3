"""Vectorised packing plans: ``reference.packing``'s plan as flat integer arrays (the fill is ``impl.fill``).

Conforms to PACK-1, PACK-2, PACK-6, PACK-8, PACK-10, PACK-11, PACK-14 ..
PACK-20 and PACK-22 of docs/SEMANTICS.md (PACK-21, config validation, is
``reference.packing.PackingConfig``'s own): ``pack_plan`` returns the same
pieces as ``reference.packing.pack_plan`` for every mode and option.

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

Everything else a sample needs is derived, never stored, and lives in the
fill (``impl.fill``): whether a piece starts with an inserted BOS, which
offsets carry labels, where BOS/EOS are added. The plan never reads a
token, so computing, caching and loading it touches no token file.

Why two modules: a plan is integers about documents, the fill is the one
reader of tokens (which imports this module, never the other way).

Worked example (L = 4, lengths 3, 6, 1; the reference's doctest)::

    >>> from reference.packing import PackingConfig
    >>> plan = pack_plan([3, 6, 1], PackingConfig(seq_len=4))
    >>> plan.num_samples, plan.arrays["cum"].tolist()
    (2, [0, 3, 9, 10])
    >>> [p.tolist() for p in plan.pieces(1)]          # positions, starts, stops
    [[1], [1], [5]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from impl._arrays import ranges
from impl.bins import PACKERS, best_fit_bins, first_fit_bins, greedy_bins
from impl.errors import ConfigError, LoadspecError, is_integer, require
from impl.rng import FeistelPermutation, Stream, derive_key, subkey
from reference.packing import STREAM_MODES, PackingConfig, Piece

__all__ = [
    "PACKERS",
    "PackPlan",
    "PlanCorruptError",
    "best_fit_bins",
    "bin_key",
    "chunk_arrays",
    "closed_form_samples",
    "first_fit_bins",
    "greedy_bins",
    "kept_lengths",
    "num_samples",
    "pack_plan",
    "stream_samples",
]

_I64 = np.int64
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


def _continuation_bos(start: np.ndarray, config: PackingConfig) -> np.ndarray:
    """Per piece: is ``bos_id`` inserted before it (``reference.packing.has_continuation_bos``)?"""
    if config.splits and config.bos_on_continuation:
        return np.asarray(start) > 0
    return np.zeros(np.shape(start), dtype=bool)


# ------------------------------------------------------------------ the plan


class PlanCorruptError(LoadspecError):
    """A cached plan's block failed its checksum, or its values contradict each other: recompute, never trust it."""


Verifier = Callable[[str, int, int], None]
"""``verify(field, first, last)`` raises :class:`PlanCorruptError` unless ``arrays[field][first:last + 1]`` are as
written (a range, not a list: a batch reads a few runs of neighbouring values, and a range checks in O(1) once its
blocks are known good)."""


class PackPlan:
    """One epoch's packing plan as flat int64 arrays (see the module docstring for the two shapes).

    ``arrays`` is what gets cached (``STREAM_FIELDS`` or ``BIN_FIELDS``);
    the arrays may be read-only memory maps. ``pieces(i)`` returns sample
    ``i``'s ``(positions, starts, stops)`` in O(log documents + pieces).

    A plan loaded from a cache carries ``verify`` (see :data:`Verifier`):
    every value a lookup returns is verified first (a checksum per block,
    checked on a block's first use), and a stream plan's binary search is
    checked against the verified neighbours it lands between, so a corrupt
    file is caught however the search wandered. On :class:`PlanCorruptError`
    the plan calls ``recover()`` once for trusted arrays (the dataset
    recomputes the plan) and answers from those.

    Why lazy: checking a whole plan on every fresh loader would be the
    dominant cost of a resume (a plan grows with the epoch), while a batch
    reads only a few blocks.
    """

    __slots__ = ("_hop", "_recover", "_verify", "arrays", "mode", "num_samples", "seq_len")

    def __init__(self, mode: str, seq_len: int, arrays: Mapping[str, np.ndarray], *,
                 verify: Verifier | None = None,
                 recover: Callable[[], Mapping[str, np.ndarray]] | None = None) -> None:
        fields = STREAM_FIELDS if mode in STREAM_MODES else BIN_FIELDS
        require(set(arrays) == set(fields), ConfigError,
                f"a {mode!r} plan needs arrays {fields}, got {sorted(arrays)}; recompute the plan")
        self.mode = mode
        self.seq_len = seq_len
        self.arrays = dict(arrays)
        self._verify = verify
        self._recover = recover
        self._hop = 0 if mode not in STREAM_MODES else seq_len if mode == "concat" else seq_len + 1
        self.num_samples = self._count()

    def _count(self) -> int:
        if self.mode in STREAM_MODES:
            cum = self.arrays["cum"]
            if not len(cum):
                return 0
            self._checked("cum", 0, 0)
            self._checked("cum", len(cum) - 1, len(cum) - 1)
            n = int(cum[-1])
            if int(cum[0]) != 0 or n < 0 or len(self.arrays["kept"]) != len(cum) - 1:
                raise PlanCorruptError("a stream plan's cumulative lengths do not start at 0 or do not match kept")
            return stream_samples(self.mode, self.seq_len, n)
        ptr = self.arrays["sample_ptr"]
        if len(ptr):
            self._checked("sample_ptr", 0, 0)
            self._checked("sample_ptr", len(ptr) - 1, len(ptr) - 1)
            if int(ptr[0]) != 0 or int(ptr[-1]) != len(self.arrays["piece_pos"]):
                raise PlanCorruptError("a bin plan's sample pointers do not cover its pieces")
        return len(ptr) - 1

    def _checked(self, field: str, first: int, last: int) -> None:
        if self._verify is not None:
            self._verify(field, first, last)

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
        _, pos, start, stop = self.batch_pieces(np.array([i], dtype=_I64))
        return pos, start, stop

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
        bad = (idx < -1) | (idx >= self.num_samples)
        if bad.any():
            i = int(idx[int(np.argmax(bad))])
            raise ConfigError(f"sample index {i} outside the plan's {self.num_samples} samples (-1 is the padding sample)")
        try:
            return self._batch_pieces(idx)
        except PlanCorruptError:
            if self._recover is None:
                raise
            recover, self._recover, self._verify = self._recover, None, None
            self.arrays = dict(recover())
            if self._count() != self.num_samples:
                raise PlanCorruptError("the recomputed plan has another number of samples than the cached one "
                                       "claimed; reopen the dataset") from None
            return self._batch_pieces(idx)

    def _check_search(self, begin: np.ndarray, span: np.ndarray, counts: np.ndarray, lo: np.ndarray) -> None:
        """Did each row's searches (pieces ``begin``/``span`` in order, ``counts`` per row) land on the right documents?

        ``cum`` strictly increases (kept documents are non-empty), so a
        search result is right exactly when the verified values either side
        of it bracket the position: a row's first piece must hold its first
        stream position, its last piece its last, whatever a corrupt block
        made the binary search read on the way.
        """
        ends = np.cumsum(counts)
        at = np.concatenate((ends - counts, ends - 1))           # each row's first and last piece
        where = np.concatenate((lo, lo + (self.seq_len - 1)))   # and the stream positions they must hold
        left = begin[at]
        if not ((left <= where) & (where < left + span[at])).all():
            raise PlanCorruptError("a cached stream plan's search landed between the wrong documents")

    def _batch_pieces(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(idx)
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
            if self._verify is not None:
                found = k.reshape(2, n)[:, real]
                k_lo, k_hi = int(found.min()), int(found.max())
                if k_lo < 0 or k_hi >= len(kept) or (found[1] < found[0]).any():
                    raise PlanCorruptError("a cached stream plan's search left its range")
                self._checked("cum", k_lo, k_hi + 1)
                self._checked("kept", k_lo, k_hi)
            kk = ranges(k0, counts)
            begin = np.asarray(cum[kk], dtype=_I64)
            span = np.asarray(cum[kk + 1], dtype=_I64) - begin
            if self._verify is not None:
                self._check_search(begin, span, counts[real], lo[real])
            first = np.repeat(lo, counts) - begin                   # the row's first position, document-relative
            return (counts, np.asarray(kept[kk], dtype=_I64), np.maximum(first, 0),
                    np.minimum(span, first + self.seq_len))
        ptr = self.arrays["sample_ptr"]
        safe = np.where(real, idx, 0)
        where = np.concatenate((safe, safe + 1))
        if self._verify is not None:
            self._checked("sample_ptr", int(safe.min()), int(safe.max()) + 1)
        bounds = np.asarray(ptr[where], dtype=_I64)
        counts = np.where(real, bounds[n:] - bounds[:n], 0)
        if self._verify is not None and ((counts < 0).any() or int(bounds.max()) > len(self.arrays["piece_pos"])):
            raise PlanCorruptError("a cached bin plan's sample pointers leave its pieces")
        pi = ranges(bounds[:n], counts)
        if self._verify is not None and len(pi):
            for name in ("piece_pos", "piece_start", "piece_stop"):
                self._checked(name, int(pi.min()), int(pi.max()))
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


def bin_key(seed: int, epoch: int) -> int:
    """``reference.packing.bin_key``: the key of the bins' emission order under a shuffled order (PACK-22)."""
    return derive_key(seed, epoch, Stream.BIN_ORDER)


def _bin_plan(kept: np.ndarray, prepared: np.ndarray, config: PackingConfig, key: int | None) -> PackPlan:
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
    for w, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist())):
        bins = packer(all_widths[lo:hi], config.seq_len)
        if key is not None:      # PACK-22: sample j of the window is bin π(j)
            bins = [bins[b] for b in FeistelPermutation(len(bins), subkey(key, w)).to_array().tolist()]
        order_parts.append(np.fromiter(chain.from_iterable(bins), dtype=_I64, count=hi - lo) + lo)
        size_parts.append([len(b) for b in bins])
    order = np.concatenate(order_parts) if order_parts else np.zeros(0, dtype=_I64)
    sizes = np.fromiter(chain.from_iterable(size_parts), dtype=_I64)
    ptr = np.zeros(len(sizes) + 1, dtype=_I64)
    np.cumsum(sizes, out=ptr[1:])
    return PackPlan(config.mode, config.seq_len, {"sample_ptr": ptr, "piece_pos": pos[order],
                                                  "piece_start": start[order], "piece_stop": stop[order]})


def pack_plan(lengths: np.ndarray | Sequence[int], config: PackingConfig, *, key: int | None = None) -> PackPlan:
    """Every sample's pieces from raw document lengths in input order: ``reference.packing.pack_plan`` (PACK-20).

    ``key``: ``bin_key(seed, epoch)`` when the lengths come in a shuffled
    order, which sets the order of each window's bins in the bin modes
    (PACK-22); None keeps creation order.
    Clauses: PACK-2, PACK-6, PACK-8, PACK-10, PACK-11, PACK-14 .. PACK-20, PACK-22.

    >>> pack_plan([3, 0, 6, 1], PackingConfig(seq_len=4, mode="first_fit")).to_reference()
    [(Piece(doc=0, start=0, stop=3), Piece(doc=3, start=0, stop=1)), (Piece(doc=2, start=0, stop=4),), (Piece(doc=2, start=4, stop=6),)]
    """
    require(isinstance(config, PackingConfig), ConfigError,
            f"config={config!r} must be a reference.packing.PackingConfig")
    kept, prepared = kept_lengths(lengths, config)
    if config.mode in STREAM_MODES:
        return _stream_plan(kept, prepared, config)
    return _bin_plan(kept, prepared, config, key)


def stream_samples(mode: str, seq_len: int, tokens: int) -> int:
    """Samples a stream mode cuts from ``tokens`` kept prepared tokens (PACK-20): the one formula impl uses.

    ``concat``: ``(n - 1) // L`` (each sample's labels reach one token past
    its inputs); ``chunk``: ``n // (L + 1)`` (disjoint windows of ``L + 1``).

    >>> stream_samples("concat", 4, 10), stream_samples("chunk", 4, 10), stream_samples("concat", 4, 0)
    (2, 2, 0)
    """
    return max(0, (tokens - 1) // seq_len) if mode == "concat" else tokens // (seq_len + 1)


def closed_form_samples(config: PackingConfig, documents: int, tokens: int) -> int | None:
    """Samples of an epoch from its kept ``documents`` and their prepared ``tokens`` alone; None when the plan decides.

    Stream modes count tokens (:func:`stream_samples`); ``none`` without
    splitting is one sample per kept document; the bin modes, and ``none``
    splitting long documents, need the lengths (None).

    >>> closed_form_samples(PackingConfig(seq_len=4), 3, 10), closed_form_samples(PackingConfig(seq_len=4, mode="greedy"), 3, 10)
    (2, None)
    """
    if config.mode in STREAM_MODES:
        return stream_samples(config.mode, config.seq_len, tokens)
    if config.mode == "none" and not config.splits:
        return documents
    return None


def num_samples(lengths: np.ndarray | Sequence[int], config: PackingConfig) -> int:
    """``reference.packing.num_samples``: closed forms for concat, chunk and none; the plan for bin modes.

    Independent of the document order for concat, chunk and none, so a
    dataset sizes every epoch of those modes from the lengths once.

    >>> num_samples([3, 6, 1], PackingConfig(seq_len=4)), num_samples([3, 6, 1], PackingConfig(seq_len=4, mode="none"))
    (2, 4)
    """
    _, prepared = kept_lengths(lengths, config)
    count = closed_form_samples(config, len(prepared), int(prepared.sum()))
    if count is not None:
        return count
    if config.mode == "none":
        L, step = config.seq_len, config.continuation_room - config.stride
        return int(np.where(prepared <= L, 1, 1 + (prepared - L + step - 1) // step).sum())
    return pack_plan(lengths, config).num_samples
