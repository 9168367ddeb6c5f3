"""The fill: a plan's samples from the tokens of the files they touch (``impl.packing`` is the plan).

Conforms to PACK-3, PACK-4, PACK-5 and PACK-20 of docs/SEMANTICS.md:
``materialize(plan, i, ...)`` returns exactly what ``reference.packing.fill``
returns for sample ``i``, and ``materialize_batch`` the same samples stacked.

Why a module apart from the plan: the plan is integers about documents
(where each sample's pieces begin and end) and never touches a token; the
fill is the only code that reads tokens. Keeping them apart keeps the one
reader of tokens in one place: :class:`TokenSource` addresses documents as
``(file, file-local offset, length)`` and copies token ranges out of the
file that holds them. No token is copied unchecked, and the fill does not
decide what must be checked: a store-backed source locates documents by the
store's checked bounds (``TokenStore.document_bounds_batch``) and copies a
batch's runs with the store's one checked read (``TokenStore.read_runs``),
which verifies whatever the runs touch (their documents' CRCs, or their
blocks) before copying them; the fill never holds a store's mappings.

Samples: ``materialize_batch(plan, indices, ...)`` returns ``[B, L]`` arrays,
row r being the reference's sample ``indices[r]`` (``-1``: the padding
sample), in a number of numpy calls that does not grow with ``B``:
``PackPlan.batch_pieces`` finds every row's pieces, ``TokenSource.locate``
finds their documents, and ``fill_batch`` lays all pieces end to end on one
flat grid, with the tokens copied by ``TokenSource.gather`` and every
per-piece event (BOS/EOS, continuation BOS, untrained runs) written at
piece-level positions. ``materialize`` is the batch of one index: there is
one fill, and the reference is its readable statement.

Worked example (L = 4, lengths 3, 6, 1; the reference's doctest)::

    >>> from reference.packing import PackingConfig
    >>> from impl.packing import pack_plan
    >>> docs = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]])
    >>> materialize(pack_plan([3, 6, 1], PackingConfig(seq_len=4)), 0, PackingConfig(seq_len=4), docs)["labels"].tolist()
    [2, 3, -100, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, cast

import numpy as np

from impl._arrays import SLICE_MIN_WIDTH, copy_runs, demand_zero_rows, distinct_ints, exclusive_cumsum, ranges
from impl._arrays import groups as _groups
from impl.collation import batch_cu_seqlens
from impl.errors import ConfigError, require
from impl.packing import PackPlan
from impl.schema import BATCH_DTYPE, BATCH_FIELDS, padding_values
from reference.packing import IGNORE, NO_DOC, NO_OFFSET, STREAM_MODES, PackingConfig

__all__ = [
    "SLICE_MIN_WIDTH",
    "TokenSource",
    "fill_batch",
    "materialize",
    "materialize_batch",
]

_I64 = np.int64
_NO_TOKENS = np.zeros(0, dtype=_I64)
Loader = Callable[[int], tuple[np.ndarray, np.ndarray]]
Checker = Callable[[int, np.ndarray, np.ndarray], None]
Bounds = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
RunsChecker = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
Reader = Callable[..., Any]
"""``read(files, starts, stops, docs=, out=, dest=, tail=)``: a store's checked copy of runs (``TokenStore.read_runs``)."""


# ------------------------------------------------------------------ tokens


class TokenSource:
    """Documents held in files, each file mapped on first use: the fill's one reader of tokens.

    File ``f`` holds documents ``file_document_starts[f]`` ..
    ``file_document_starts[f + 1] - 1``; ``load(f)`` returns its
    ``(values, offsets)`` (tokens, and file-local document offsets of length
    documents + 1), and ``check(f, starts, stops)`` is called with the
    file-local token ranges about to be copied, before they are copied.
    ``bounds(files, local_docs)``, when given, returns ``(start, length)``
    of file-local document ``local_docs[i]`` of file ``files[i]`` from
    checked offsets: documents are then located as batches name them, all of
    a batch's in one call (the offsets returned by ``load`` are never read);
    without it, a file's offsets are copied whole at its first use.
    ``check_runs(files, starts, stops)``, when given, is called instead of
    ``check`` with all of a batch's runs at once when they lie in several
    files (one call a batch, not one a file touched); ``check`` serves a
    batch in one file and :meth:`concat`. ``read``, when given (with
    ``bounds``; :meth:`from_store` passes ``TokenStore.read_runs``), copies
    the runs itself, checked, and ``load``/``check`` are not used.

    Why per document: a fresh resume's first batch names a few documents in
    each of many files; checking and copying each file's whole offsets
    region costs more than the batch itself.

    >>> src = TokenSource.from_files([[[5, 6]], [[], [7]]])
    >>> [a.tolist() for a in src.locate(np.array([2, 0]))]       # (file, file-local start, length)
    [[1, 0], [0, 0], [1, 2]]
    >>> out = np.zeros(3, dtype=np.int64)
    >>> src.gather(out, np.array([1, 0]), np.array([0, 0]), np.array([1, 2]), np.array([0, 1]))
    >>> out.tolist()
    [7, 5, 6]
    """

    __slots__ = ("_bounds", "_check", "_check_runs", "_files", "_load", "_located", "_read", "_starts", "_untouched")

    def __init__(self, file_document_starts: Sequence[int] | np.ndarray, load: Loader | None,
                 check: Checker | None = None, bounds: Bounds | None = None, check_runs: RunsChecker | None = None,
                 read: Reader | None = None) -> None:
        starts = np.asarray(file_document_starts, dtype=_I64).reshape(-1)
        if not (len(starts) >= 2 and int(starts[0]) == 0 and bool((starts[1:] >= starts[:-1]).all())):
            raise ConfigError(f"file_document_starts={starts.tolist()!r} must start at 0, never decrease and name at "
                              "least one file; pass TokenStore.file_document_starts")
        self._starts = starts
        self._load = load
        self._check = check
        self._bounds = bounds
        self._check_runs = check_runs
        require(load is not None or (read is not None and bounds is not None), ConfigError,
                "a TokenSource needs load, or read and bounds (a store's read_runs and document_bounds_batch)")
        self._read = read
        self._files: list[tuple[np.ndarray, np.ndarray] | None] = [None] * (len(starts) - 1)
        self._located = demand_zero_rows(int(starts[-1]))  # row d: (start, length + 1); 0 = not located yet
        self._untouched = True                               # no locate yet: the first is answered without the table

    @classmethod
    def from_store(cls, store: Any) -> TokenSource:
        """The store's documents, located by its checked bounds and copied by its checked read; nothing read now.

        ``store`` is a :class:`~impl.store.TokenStore` or anything with its
        ``file_document_starts``, ``document_bounds_batch`` and ``read_runs``
        (a split): the store, never the fill, decides what must be verified
        before a token is copied (its documents' CRCs, its blocks).
        """
        return cls(store.file_document_starts, None, bounds=store.document_bounds_batch, read=store.read_runs)

    @classmethod
    def from_files(cls, files: Sequence[Sequence[Sequence[int]]], dtype: Any = np.int64) -> TokenSource:
        """Files of documents held in memory (tests and small inputs): ``files[f][j]`` is document j of file f."""
        parts = []
        for docs in files:
            lengths = np.fromiter((len(d) for d in docs), dtype=_I64, count=len(docs))
            values = np.fromiter(chain.from_iterable(docs), dtype=dtype, count=int(lengths.sum()))
            parts.append((values, exclusive_cumsum(lengths)))
        starts = exclusive_cumsum(np.array([len(docs) for docs in files], dtype=_I64))
        return cls(starts, parts.__getitem__)

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]]) -> TokenSource:
        """One file holding ``documents``."""
        return cls.from_files([documents])

    @classmethod
    def concat(cls, parts: Sequence[TokenSource]) -> TokenSource:
        """The files of ``parts`` one after another: document ``d`` of part ``k`` is ``sum(part sizes before k) + d``.

        Why: a mixture's batch holds samples of several sources; with their
        sources concatenated, ``fill_batch`` fills the whole batch in one
        call instead of one per source. Each part keeps loading, checking
        and bounding its own files (``load`` is the part's :meth:`file`, so
        a file is mapped once whichever source reads it); a part without
        ``bounds`` gives its documents' bounds from the offsets its ``load``
        checked.

        >>> src = TokenSource.concat([TokenSource.from_documents([[5, 6]]), TokenSource.from_files([[[7]], [[8, 9]]])])
        >>> [a.tolist() for a in src.locate(np.array([2, 0, 1]))]      # (file, file-local start, length)
        [[2, 0, 1], [0, 0, 0], [2, 2, 1]]
        """
        require(len(parts) >= 1, ConfigError, "concat needs at least one TokenSource")
        file_counts = np.array([part.num_files for part in parts], dtype=_I64)
        doc_base = exclusive_cumsum(np.array([part.num_documents for part in parts], dtype=_I64))
        owners = np.repeat(np.arange(len(parts), dtype=_I64), file_counts)
        locals_ = np.arange(int(file_counts.sum()), dtype=_I64) - np.repeat(exclusive_cumsum(file_counts)[:-1],
                                                                            file_counts)
        owner, local = owners.tolist(), locals_.tolist()
        starts = np.concatenate([[0], *(part._starts[1:] + base for part, base in zip(parts, doc_base.tolist()))])

        def load(f: int) -> tuple[np.ndarray, np.ndarray]:
            return parts[owner[f]].file(local[f])

        def read(files: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, docs: np.ndarray | None = None,
                 out: np.ndarray, dest: np.ndarray, tail: np.ndarray | None = None) -> np.ndarray:
            whose = owners[files]
            for k, rows in _groups(whose):
                pick = slice(None) if rows is None else rows
                part_files = locals_[files[pick]]   # docs are file-local: the part's own ids for its gather
                part_docs = None if docs is None else docs[pick] + parts[k]._starts[part_files]
                parts[k].gather(out, part_files, starts[pick], stops[pick], dest[pick], tail, part_docs)
            return out

        def check(f: int, a: np.ndarray, b: np.ndarray) -> None:
            part_check = parts[owner[f]]._check
            if part_check is not None:
                part_check(local[f], a, b)

        def bounds(files: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            start, length = np.empty(len(files), dtype=_I64), np.empty(len(files), dtype=_I64)
            whose = owners[files]
            for k in distinct_ints(whose):
                rows = np.flatnonzero(whose == k)
                part, part_files, part_docs = parts[k], locals_[files[rows]], docs[rows]
                if part._bounds is not None:
                    start[rows], length[rows] = part._bounds(part_files, part_docs)
                    continue
                for f in distinct_ints(part_files):
                    mine = part_files == f
                    offsets = np.asarray(part.file(f)[1], dtype=_I64)
                    d = part_docs[mine]
                    start[rows[mine]], length[rows[mine]] = offsets[d], offsets[d + 1] - offsets[d]
            return start, length

        checked = any(part._check is not None for part in parts)
        if any(part._read is not None for part in parts):
            return cls(starts, load, None, bounds, read=read)
        return cls(starts, load, check if checked else None, bounds)

    @property
    def num_documents(self) -> int:
        return int(self._starts[-1])

    @property
    def num_files(self) -> int:
        return len(self._starts) - 1

    def file(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s ``(values, offsets)``, loaded on first use (without ``bounds``, its documents' bounds recorded then)."""
        got = self._files[f]
        if got is None:
            require(self._load is not None, ConfigError, "this TokenSource reads through its store: it loads no file")
            got = self._load(f)  # type: ignore[misc]
            lo, hi = int(self._starts[f]), int(self._starts[f + 1])
            require(len(got[1]) == hi - lo + 1, ConfigError,
                    f"file {f} holds {len(got[1]) - 1} documents where {hi - lo} were announced")
            if self._bounds is None:
                offsets = np.asarray(got[1], dtype=_I64)
                self._located[lo:hi, 0] = offsets[:-1]
                np.subtract(offsets[1:], offsets[:-1] - 1, out=self._located[lo:hi, 1])
            self._files[f] = got
        return got

    def locate(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(file, file-local start, length)`` of each document id in ``docs`` (int64; loads only their files)."""
        docs = np.asarray(docs, dtype=_I64).reshape(-1)
        if not len(docs):
            return docs, docs, docs
        if int(docs.min()) < 0 or int(docs.max()) >= self.num_documents:
            bad = int(docs[(docs < 0) | (docs >= self.num_documents)][0])
            raise ConfigError(f"document {bad} is outside the source's {self.num_documents} documents; "
                              "the plan is not for this store")
        if self.num_files == 1:
            file = np.zeros(len(docs), dtype=_I64)
        else:
            file = np.searchsorted(self._starts, docs, side="right") - 1
        if self._untouched:   # a first batch: its rows would each fault in a page of the table, to be read back once
            self._untouched = False
            if self._bounds is not None:
                start, length = self._bounds(file, docs - self._starts[file])
                return file, start, length
            self._learn(docs, file)
            rows = self._located[docs]
        else:
            rows = self._located[docs]
            if not rows[:, 1].all():
                unknown = rows[:, 1] == 0
                self._learn(docs[unknown], file[unknown])
                rows = self._located[docs]
        return file, rows[:, 0], rows[:, 1] - 1

    def _learn(self, docs: np.ndarray, files: np.ndarray) -> None:
        """Record the bounds of ``docs`` (in ``files``): one ``bounds`` call for all, or each file's whole offsets."""
        if self._bounds is not None:
            lo, length = self._bounds(files, docs - self._starts[files])
            rows = self._located
            rows[docs, 0] = lo
            rows[docs, 1] = length + 1
            return
        for f, _ in _groups(files):
            self.file(f)

    def gather(self, out: np.ndarray, files: np.ndarray, starts: np.ndarray, stops: np.ndarray, dest: np.ndarray,
               tail: np.ndarray | None = None, docs: np.ndarray | None = None) -> None:
        """Copy run ``r`` (tokens ``starts[r]:stops[r]`` of file ``files[r]``, non-empty) to ``out[dest[r]:]``.

        A ``dest`` at or past ``len(out)`` addresses ``tail`` instead (at
        ``dest - len(out)``): the fill reads a batch's token grid and each
        piece's token after it in one pass. First one ``check_runs`` of all
        the runs when they lie in several files (else, per file touched, one
        ``check(file, starts, stops)`` of its runs); then one slice copy
        per run (long runs: a packed sample is a few long pieces) or one
        fancy index over all the tokens (many short runs).
        """
        if not len(files):
            return
        if self._read is not None:   # a store's checked read: docs (file-local) let it skip runs in verified documents
            local = None if docs is None else docs - self._starts[files]
            self._read(files, starts, stops, docs=local, out=out, dest=dest, tail=tail)
            return
        groups = _groups(files)
        check = self._check
        if self._check_runs is not None and len(groups) > 1:
            self._check_runs(files, starts, stops)
            check = None
        for f, sel in groups:
            if check is not None:
                check(f, starts if sel is None else starts[sel], stops if sel is None else stops[sel])
            self.file(f)
        values = [_NO_TOKENS if got is None else got[0] for got in self._files]
        copy_runs(values, files, starts, stops, groups, out, dest, tail,
                  slices=int((stops - starts).sum()) >= SLICE_MIN_WIDTH * len(files))

# ------------------------------------------------------------------ the fill


def _check_plan(plan: PackPlan, config: PackingConfig) -> None:
    if plan.mode != config.mode or plan.seq_len != config.seq_len:
        raise ConfigError(f"plan is for mode={plan.mode!r}, seq_len={plan.seq_len} but config has "
                          f"mode={config.mode!r}, seq_len={config.seq_len}; compute the plan with this config")


def materialize(plan: PackPlan, i: int, config: PackingConfig, source: TokenSource,
                doc_ids: Callable[[np.ndarray], np.ndarray] | np.ndarray | None = None, *,
                first_document: int = 0) -> dict[str, np.ndarray]:
    """Sample ``i`` of ``plan``: ``reference.packing.fill(plan, documents, config)[i]`` as numpy arrays.

    ``doc_ids`` maps the plan's input positions to global document ids (rows
    of ``source``): a callable such as ``impl.ordering.EpochOrder``, an array
    (``doc_ids[position]``), or None when positions are document ids. The
    output's ``doc_ids`` field holds those ids plus ``first_document`` (the
    store index of ``source``'s row 0 when ``source`` is a split: SPLIT-9), as
    ``fill`` reports the document's id. Returns int64 arrays of length L (``input_ids``,
    ``labels``, ``position_ids``, ``doc_ids``, ``token_offsets``) and
    ``document_starts`` (where each piece begins). Cost O(log documents +
    pieces + L), independent of ``i``: it is ``materialize_batch`` of the one
    index, so the single-sample and the batched paths are one computation.

    Clauses: PACK-3, PACK-4, PACK-5 (and the plan's clauses through ``plan``).

    >>> from impl.packing import pack_plan
    >>> src = TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    >>> cfg = PackingConfig(seq_len=4, mode="greedy")
    >>> s = materialize(pack_plan([3, 6], cfg), 2, cfg, src)
    >>> s["input_ids"].tolist(), s["labels"].tolist(), s["position_ids"].tolist(), s["document_starts"].tolist()
    ([8, 9, 0, 0], [9, -100, -100, -100], [0, 1, 0, 0], [0])
    """
    _check_plan(plan, config)
    plan.check_index(i)
    rows = materialize_batch(plan, np.array([i], dtype=_I64), config, source, doc_ids, first_document=first_document)
    out = {name: values[0] for name, values in rows.items()}
    out["document_starts"] = np.flatnonzero((out["position_ids"] == 0) & (out["doc_ids"] != NO_DOC))
    return out


def _rows_block(rows: int, config: PackingConfig, *, padded: bool) -> dict[str, np.ndarray]:
    """``[rows, seq_len]`` int64 arrays for ``BATCH_FIELDS``, views of one block (filled as padding if ``padded``).

    Why one block: one allocation instead of five (fewer page faults for
    fresh memory, which dominate when every batch is new memory).
    """
    block = np.empty((len(BATCH_FIELDS), rows, config.seq_len), dtype=BATCH_DTYPE)
    if padded:
        for field, value in zip(block, padding_values(config)):
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


def _with_segments(out: dict[str, Any], heads: np.ndarray | None = None,
                   widths: np.ndarray | None = None) -> dict[str, Any]:
    """Add ``cu_seqlens`` / ``max_seqlen`` (``batch_cu_seqlens`` of ``position_ids``, ``doc_ids``); from the pieces when rows are full.

    With every row full, the segments are exactly the pieces (a piece's
    positions count 0, 1, ... from its head, each row starts with a piece,
    and no padding run exists to be one segment, COLL-11), so no pass over
    the ``[B, L]`` positions is needed.
    """
    if heads is None or widths is None:
        out["cu_seqlens"], out["max_seqlen"] = batch_cu_seqlens(out["position_ids"], out["doc_ids"])
    else:
        cu = np.empty(len(heads) + 1, dtype=np.int32)
        cu[:-1] = heads
        cu[-1] = out["position_ids"].size
        out["cu_seqlens"], out["max_seqlen"] = cu, int(widths.max())
    return out


def fill_batch(counts: np.ndarray, doc_ids: np.ndarray, starts: np.ndarray, stops: np.ndarray, config: PackingConfig,
               source: TokenSource, *, segments: bool = False, reported: np.ndarray | None = None
               ) -> dict[str, np.ndarray]:
    """Rows of samples from their pieces, as ``reference.packing.fill`` builds them, with no Python work per row or piece.

    Row ``r`` holds the next ``counts[r]`` pieces of ``(doc_ids, starts,
    stops)`` (``PackPlan.batch_pieces``'s layout; a row with no piece is the
    padding sample). Returns int64 ``[rows, seq_len]`` arrays ``input_ids``,
    ``labels``, ``position_ids``, ``doc_ids``, ``token_offsets``, equal to
    the reference's samples stacked (without ``document_starts``).
    With ``segments``, also ``cu_seqlens`` (int32) and ``max_seqlen``, as
    ``batch_cu_seqlens(position_ids, doc_ids)`` gives them. ``reported`` (one id per
    piece): the ids written to ``doc_ids`` instead of ``doc_ids`` (a
    mixture reads documents of ``TokenSource.concat`` but reports each
    source's own ids).

    How: every piece's positions are laid end to end on one flat grid of
    ``T`` tokens (``seg``: exclusive cumsum of the widths); per-token values
    are a per-piece constant repeated over the piece (``np.repeat``) plus
    the position in it; the tokens of each piece inside its document, and
    each piece's token after its stop when that is in the document (its
    last label), are copied by one ``TokenSource.gather``; everything that
    happens at most once per piece (BOS/EOS at a document's edge, an
    inserted continuation BOS, the untrained head and tail runs of a piece)
    is written at piece-level positions. Full rows (concat, chunk) are
    computed in place in the output; shorter rows are scattered into
    padding rows.

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
    file, doc_lo, length = source.locate(docs)
    m = length + (ab + ae)                                      # prepared lengths
    inserts = config.splits and config.bos_on_continuation      # continuation BOS possible at all?
    bos = (a > 0).astype(_I64) if inserts else np.zeros(P, dtype=_I64)
    widths = b - a + bos
    require(bool(((widths >= 1) & (b <= m)).all()), ConfigError,
            "a plan piece holds no position or ends past its document; the plan is not for this config and store")
    seg = exclusive_cumsum(widths)                             # piece p: flat positions seg[p] .. seg[p + 1] - 1
    heads = seg[:-1]
    row_ptr = exclusive_cumsum(counts)
    totals = seg[row_ptr[1:]] - seg[row_ptr[:-1]]
    if int(totals.max()) > L:
        raise ConfigError(f"a plan sample holds {int(totals.max())} positions but seq_len={L}; "
                          "the plan is not for this config")
    T = int(seg[-1])
    full = T == B * L                                           # every row full (concat, chunk): compute in place
    out = _rows_block(B, config, padded=not full)
    fields = [out[name].reshape(-1) if full else np.empty(T, dtype=_I64) for name in BATCH_FIELDS]
    _, labels, rel, out_docs, offset = fields
    first_offset = a - bos                                      # prepared offset at a piece's first position

    np.subtract(_arange(T), np.repeat(heads, widths), out=rel)  # position in its piece = position_ids
    np.add(rel, np.repeat(first_offset, widths), out=offset)    # prepared offset (a - 1 at an inserted BOS)
    # Tokens: flat grid positions 0..T-1, then slot T + p for piece p's token after its stop.
    raw_base = doc_lo - ab                                      # file-local index of prepared offset 0
    doc_hi = doc_lo + length
    r0 = raw_base + first_offset
    c0, c1 = np.maximum(r0, doc_lo), np.minimum(r0 + widths, doc_hi)
    after_raw = raw_base + b
    after_in = (after_raw >= doc_lo) & (after_raw < doc_hi)    # outside: replaced (BOS/EOS) or never trained
    run = c1 > c0
    pick = np.flatnonzero(after_in)
    tokens = fields[0]
    after = np.zeros(P, dtype=_I64)
    source.gather(tokens, np.concatenate((file[run], file[pick])), np.concatenate((c0[run], after_raw[pick])),
                  np.concatenate((c1[run], after_raw[pick] + 1)),
                  np.concatenate(((heads + c0 - r0)[run], T + pick)), after, np.concatenate((docs[run], docs[pick])))
    # Offsets 0 (add_bos) and m - 1 (add_eos), at most one position per piece each, lie outside the document.
    for on, at_offset, token in ((ab, np.zeros(P, dtype=_I64), config.bos_id), (ae, m - 1, config.eos_id)):
        if on:
            r = at_offset - first_offset
            hit = np.flatnonzero((r >= 0) & (r < widths))
            tokens[heads[hit] + r[hit]] = cast(int, token)
            after[b == at_offset] = cast(int, token)

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
        labels[ranges(np.concatenate((heads, heads + tail)), np.concatenate((lead, cut)))] = IGNORE
    if inserts:
        at = heads[bos > 0]
        tokens[at] = cast(int, config.bos_id)
        offset[at] = NO_OFFSET
    out_docs[:] = np.repeat(docs if reported is None else np.asarray(reported, dtype=_I64).reshape(-1), widths)
    if not full:
        if B == 1:      # one row (``materialize``): its positions are the row's first T
            for name, values in zip(BATCH_FIELDS, fields):
                out[name][0, :T] = values
        else:
            dest = np.flatnonzero(_arange(L) < totals[:, None])
            for name, values in zip(BATCH_FIELDS, fields):
                out[name].reshape(-1)[dest] = values
    if segments:
        return _with_segments(out, heads, widths) if full else _with_segments(out)
    return out


def materialize_batch(plan: PackPlan, indices: np.ndarray | Sequence[int], config: PackingConfig, source: TokenSource,
                      doc_ids: Callable[[np.ndarray], np.ndarray] | np.ndarray | None = None, *,
                      segments: bool = False, first_document: int = 0) -> dict[str, np.ndarray]:
    """Samples ``indices`` of ``plan`` (``-1``: the padding sample) as int64 ``[len(indices), seq_len]`` arrays.

    Equal, field for field, to stacking the reference's samples ``i`` (the
    padding sample for ``-1``), in a number of numpy calls that does not
    grow with the batch: one ``PackPlan.batch_pieces``, one ``doc_ids``
    lookup of every piece's position, one ``fill_batch``. Keys:
    ``input_ids``, ``labels``, ``position_ids``, ``doc_ids``,
    ``token_offsets``; with ``segments``, also ``cu_seqlens`` and
    ``max_seqlen`` (``fill_batch``). ``doc_ids`` reports each document's
    row of ``source`` plus ``first_document`` (SPLIT-9, as ``materialize``).

    Clauses: PACK-3, PACK-4, PACK-5, PACK-20 (and the plan's clauses through ``plan``).

    >>> from impl.packing import pack_plan
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
    reported = docs + first_document if first_document else None
    return fill_batch(counts, docs, start, stop, config, source, segments=segments, reported=reported)
