"""Splits of a token store: virtual, zero-copy views of a contiguous range of its documents (SPLIT-1..SPLIT-8).

Conforms to SPLIT-8 (docs/SEMANTICS.md) and, for the bounds, SPLIT-1..SPLIT-6:
``PackedDataset(store, split="train[:80%]", ...)`` reads exactly the
documents ``reference.resume.epoch_samples`` reads for a ``PipelineConfig``
with that split, and its fingerprint is ``pipeline_fingerprint(
store.fingerprint, config)`` with the split in the config, as the reference's.

Why a view over the store and not a copied store: a validation split of a
100 GB corpus must cost nothing. ``SplitStore`` answers what the packer and
``PackedDataset`` read (per-file document and token counts, lengths,
document offsets, ``read(start, stop)``) by offsetting into the base store's
memory maps, so tokens are never copied; only the offsets of the split's
documents are rebased (one int64 per document).

Bounds resolve as ``reference.splits`` specifies (ints as Python slicing,
floats as fractions of n, ``"NN%"`` percents, rounding half to even on the
exact product), implemented here again so conformance compares two
implementations; parsing the notation is the configuration format, shared.

Worked example::

    >>> view = split_store(store, "train[:80%]")             # doctest: +SKIP
    >>> view.rows, len(view.lengths)                         # doctest: +SKIP
    (range(0, 800), 800)
    >>> PackedDataset(store, seq_len=2048, split="train[80%:]")   # the validation split, by config  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from impl.errors import SplitError, require
from reference.resume import PipelineConfig, canonical_json
from reference.splits import STORE_SPLIT, Bound, parse_bounds

_PERCENT = re.compile(r"(-?)(\d+(?:\.\d+)?)%", re.ASCII)


def _bound(bound: Bound, n: int, default: int) -> int:
    if bound is None:
        return default
    require(not isinstance(bound, bool), SplitError, f"bound={bound!r} is a bool; pass an int, a fraction or \"NN%\"")
    if isinstance(bound, int):
        return min(max(bound + n if bound < 0 else bound, 0), n)
    if isinstance(bound, float):
        require(math.isfinite(bound) and 0.0 <= bound <= 1.0, SplitError,
                f"bound={bound!r} is a fraction outside [0, 1]; pass a fraction in [0, 1], a percent string like "
                "\"-10%\" to count from the end, or an int row index")
        return round(Fraction(repr(bound)) * n)
    match = _PERCENT.fullmatch(bound) if isinstance(bound, str) else None
    require(match is not None, SplitError,
            f"bound={bound!r} is not a slice bound; pass None, an int row index, a float fraction in [0, 1] or a "
            "percent string like \"10%\"")
    assert match is not None
    percent = Fraction(match[2])
    require(percent <= 100, SplitError, f"bound={bound!r} is a percent outside [-100%, 100%]; pass at most 100%")
    count = round(percent * n / 100)
    return n - count if match[1] else count


def resolve_rows(start: Bound, stop: Bound, n: int) -> range:
    """The documents ``[start, stop)`` of n; refuses an empty selection (SPLIT-1..SPLIT-5).

    >>> resolve_rows(None, "80%", 10), resolve_rows("80%", None, 10), resolve_rows(0.25, -1, 8)
    (range(0, 8), range(8, 10), range(2, 7))
    """
    require(n > 0, SplitError, f"the store has no document: there is nothing to split (split [{start!r}:{stop!r}])")
    first, last = _bound(start, n, 0), _bound(stop, n, n)
    require(first < last, SplitError,
            f"split [start={start!r} : stop={stop!r}] of n={n} documents resolves to rows [{first}, {last}), which is "
            "empty; pick a start below the stop")
    return range(first, last)

__all__ = ["SplitStore", "resolve_rows", "select", "slice_store", "split_pipeline", "split_store"]


class SplitStore:
    """Documents ``rows`` of a token store, as a store: file boundaries clipped, empty files dropped (SPLIT-8).

    ``bounds`` are the split's bounds as written (they enter the pipeline
    config); ``data_fingerprint`` is the base store's (the data), and
    ``fingerprint`` names the view (base fingerprint and rows), so plan
    caches of different splits never collide.
    """

    def __init__(self, base: Any, bounds: tuple[Bound, Bound]) -> None:
        require(not isinstance(base, SplitStore), SplitError,
                "a split of a split is not supported; split the base store once with the combined bounds")
        self.base = base
        self.bounds = (bounds[0], bounds[1])
        self.rows = resolve_rows(bounds[0], bounds[1], int(base.num_documents))   # base.lengths would diff every offset
        a, b = self.rows.start, self.rows.stop
        starts = np.asarray(base.file_document_starts, dtype=np.int64)
        first = np.clip(starts[:-1], a, b)
        last = np.clip(starts[1:], a, b)
        keep = last > first
        self._files = np.flatnonzero(keep)
        offsets = base.doc_offsets
        self._token_start = int(offsets[a])
        self._doc_offsets = np.asarray(offsets[a:b + 1], dtype=np.int64) - self._token_start
        self._doc_offsets.setflags(write=False)
        self.file_document_counts = (last - first)[keep].astype(int).tolist()
        doc_bounds = np.concatenate([first[keep], last[keep][-1:]]) - a
        self.file_token_counts = np.diff(self._doc_offsets[doc_bounds]).astype(int).tolist()
        self.file_document_starts = np.concatenate([[0], np.cumsum(self.file_document_counts)]).astype(int).tolist()
        base_starts = starts[self._files]
        #: Split file f is documents ``_first_local[f]`` to ``_first_local[f] + _counts[f]`` of base file ``_files[f]``.
        self._first_local = (first[keep] - base_starts).astype(np.int64)
        self._counts = (last - first)[keep].astype(np.int64)

    # ------------------------------------------------------------ identity

    @property
    def path(self) -> Path:
        return Path(self.base.path)

    @property
    def notation(self) -> str:
        """The split as the user wrote it: ``"train[99%:]"`` where the bounds fit the notation, else the pair.

        Why: an error about a split must name the split, not only its store.

        >>> slice_store(store, "99%", None).notation, slice_store(store, 0.5, None).notation   # doctest: +SKIP
        ('train[99%:]', '(0.5, None)')
        """
        if all(b is None or (isinstance(b, int) and not isinstance(b, bool)) or isinstance(b, str) for b in self.bounds):
            return f"{STORE_SPLIT}[{'' if self.bounds[0] is None else self.bounds[0]}:" \
                   f"{'' if self.bounds[1] is None else self.bounds[1]}]"
        return repr(self.bounds)

    @property
    def data_fingerprint(self) -> str:
        return str(self.base.fingerprint)

    @property
    def fingerprint(self) -> str:
        payload = canonical_json({"store": self.base.fingerprint, "rows": [self.rows.start, self.rows.stop]})
        return hashlib.sha256(payload.encode()).hexdigest()

    @property
    def bos_id(self) -> int | None:
        return self.base.bos_id  # type: ignore[no-any-return]

    @property
    def eos_id(self) -> int | None:
        return self.base.eos_id  # type: ignore[no-any-return]

    @property
    def vocab_size(self) -> int:
        return int(self.base.vocab_size)

    @property
    def pad_id(self) -> int | None:
        return self.base.pad_id  # type: ignore[no-any-return]

    @property
    def meta(self) -> dict[str, Any]:
        """The base store's ``meta.json`` (build options, tokenizer): a split changes which documents, not how."""
        return self.base.meta  # type: ignore[no-any-return]

    @property
    def num_documents(self) -> int:
        return len(self.rows)

    @property
    def num_empty_documents(self) -> int:
        return int(np.count_nonzero(self._doc_offsets[1:] == self._doc_offsets[:-1]))   # the split's rows only

    # ------------------------------------------------------------ documents and tokens

    def read_runs(self, files: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, docs: np.ndarray | None = None,
                  out: np.ndarray | None = None, dest: np.ndarray | None = None, tail: np.ndarray | None = None
                  ) -> np.ndarray:
        """The base store's checked :meth:`TokenStore.read_runs` of split files ``files`` (same file-local tokens).

        Token positions stay the base file's (a split's document bounds are
        the base store's), so only the file and document numbers move.
        """
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        if fl.size and (int(fl.min()) < 0 or int(fl.max()) >= len(self._files)):
            raise IndexError(f"file out of range for a split of {len(self._files)} files")
        base_docs = None if docs is None else np.asarray(docs, dtype=np.int64).reshape(-1) + self._first_local[fl]
        return self.base.read_runs(self._files[fl], starts, stops, docs=base_docs,  # type: ignore[no-any-return]
                                   out=out, dest=dest, tail=tail)

    def document_bounds_batch(self, files: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` of document ``docs[i]`` of split file ``files[i]``, in the base file's token positions.

        The base store's :meth:`TokenStore.document_bounds_batch` of the same
        documents, so a split reads and checks exactly as its store does
        (format 4: each document by its own CRC on its first read).

        >>> split.document_bounds_batch(np.array([0]), np.array([2]))      # doctest: +SKIP
        (array([17]), array([5]))
        """
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        dl = np.asarray(docs, dtype=np.int64).reshape(-1)
        if fl.shape != dl.shape:
            raise ValueError(f"files and docs differ in length ({fl.size} and {dl.size})")
        if fl.size:
            if int(fl.min()) < 0 or int(fl.max()) >= len(self._files):
                raise IndexError(f"file out of range for a split of {len(self._files)} files")
            if int(dl.min()) < 0 or bool((dl >= self._counts[fl]).any()):
                raise IndexError("document out of range for its file of the split")
        return self.base.document_bounds_batch(self._files[fl], dl + self._first_local[fl])  # type: ignore[no-any-return]

    @property
    def document_checks(self) -> bool:
        """Whether the base store's bounds check every document they return (format 4; see ``TokenStore``)."""
        return bool(getattr(self.base, "document_checks", False))


    @property
    def doc_offsets(self) -> np.ndarray:
        return self._doc_offsets

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.base.lengths[self.rows.start:self.rows.stop])

    @property
    def num_tokens(self) -> int:
        return int(self._doc_offsets[-1])

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the split's documents, concatenated: the base store's read, offset (zero-copy)."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) out of bounds for a split of {self.num_tokens} tokens")
        return self.base.read(self._token_start + start, self._token_start + stop)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"SplitStore({str(self.base.path)!r}, rows={self.rows})"


def split_store(store: Any, spec: str) -> SplitStore:
    """The view of split notation ``"train[start:stop]"`` (SPLIT-6); a store holds one split, ``train`` (SPLIT-8).

    >>> split_store(store, "train[100]")                     # doctest: +SKIP
    Traceback (most recent call last):
    ...
    reference.errors.SplitError: split spec 'train[100]' is malformed; accepted forms: ...
    """
    name, start, stop = parse_bounds(spec)
    require(name == STORE_SPLIT, SplitError,
            f"split {spec!r} names the split {name!r}, but a token store holds one split, {STORE_SPLIT!r} (SPLIT-8): "
            f"carve held-out rows out of it (e.g. \"train[99%:]\"), or build a store of the {name!r} data")
    return SplitStore(store, (start, stop))


def slice_store(store: Any, start: Bound = None, stop: Bound = None) -> SplitStore:
    """The view of documents ``[start, stop)``: ints, fractions in [0, 1] or percent strings (SPLIT-1..SPLIT-5)."""
    return SplitStore(store, (start, stop))


def select(store: Any, rows: range | Sequence[int]) -> SplitStore:
    """Hugging Face's ``select(range(a, b))`` as a view: only contiguous, increasing ranges (a view cannot reorder)."""
    require(isinstance(rows, range) and rows.step == 1, SplitError,
            f"select({rows!r}): only a contiguous range(start, stop) is a zero-copy view; pass range(a, b), "
            "or use a shuffle in the pipeline config to reorder")
    assert isinstance(rows, range)
    require(0 <= rows.start < rows.stop <= len(store.lengths), SplitError,
            f"select({rows!r}) is empty or outside the store's {len(store.lengths)} documents; pass range(a, b) "
            f"with 0 <= a < b <= {len(store.lengths)}")
    return SplitStore(store, (rows.start, rows.stop))


def split_pipeline(store: Any, config: PipelineConfig) -> tuple[str, Any, PipelineConfig]:
    """``(data fingerprint, store to read, config)`` of a pipeline over ``store``: the hook ``PackedDataset`` calls.

    A ``SplitStore`` passed as the store moves its bounds into the config (so
    ``PackedDataset(split_store(s, "train[:80%]"), ...)`` and
    ``PackedDataset(s, split="train[:80%]", ...)`` are one pipeline with one
    fingerprint); a config with a split gets the view of its rows.
    """
    if isinstance(store, SplitStore):
        require(config.split is None or tuple(config.split) == store.bounds, SplitError,
                f"the store is already the split {store.bounds} but the config asks for split={config.split!r}; "
                "pass the base store with the split, or the split store without one")
        config = PipelineConfig(packing=config.packing, ordering=config.ordering, end=config.end, split=store.bounds)
        store = store.base
    if config.split is None:
        return str(store.fingerprint), store, config
    assert isinstance(config.split, tuple)
    return str(store.fingerprint), SplitStore(store, (config.split[0], config.split[1])), config
