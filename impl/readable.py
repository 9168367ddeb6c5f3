"""Readable: per document of a format-4 store, the tokens a reader may copy without a further check.

Why a table of its own: ``TokenStore.read_runs`` is asked, once per batch,
whether every run lies inside a document this store object verified; a
loop over the runs, or over the files they touch, costs more than the rest
of the check. With one row per document of the store, the answer is one
numpy pass (:meth:`Readable.allows`). Row ``g`` (the store's document
``g``) holds file-local tokens ``[start, stop)``: the document's bounds
once it is verified (its CRC-32, ``Integrity.verify_documents``; or its
offsets' and tokens' blocks, ``Integrity.document_bounds``), the whole
file once the file is complete, ``(0, 0)`` before, which admits no token.
A file's rows are a view (``FileChecks.readable``) that its checks write
and that ``FileChecks.reset`` clears with its other marks. The table is a
demand-zero map, so a fresh resume's first batch touches a few pages of it.

Worked example (file 0 holds documents 0..2, file 1 documents 3 and 4)::

    >>> import numpy as np
    >>> readable = Readable([0, 3, 5])
    >>> readable.rows(0, 3)[1] = (9, 13)          # document 1 of file 0 verified: tokens 9..12
    >>> readable.allows(np.array([0]), np.array([10]), np.array([13]), np.array([1]))
    True
    >>> readable.allows(np.array([0]), np.array([10]), np.array([14]), np.array([1]))   # past its document
    False
    >>> readable.allows(np.array([1]), np.array([10]), np.array([13]), np.array([-2]))  # not a document of file 1
    False
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from impl._arrays import demand_zero_rows

__all__ = ["Readable"]


class Readable:
    """The store-wide table of what each document lets a reader copy unchecked (rows made on first use).

    ``file_doc_starts`` is each file's first document and the total
    (``TokenStore.file_document_starts``). Runs are given as int64 arrays:
    files ``fl``, file-local tokens ``[lo, hi)`` and file-local documents
    ``docs``.
    """

    __slots__ = ("_counts", "_file_doc_starts", "_starts", "table")

    def __init__(self, file_doc_starts: Sequence[int]) -> None:
        self._file_doc_starts = file_doc_starts   # as arrays when the table is made (opening a store stays cheap)
        self._starts = self._counts = np.zeros(0, dtype=np.int64)
        #: One ``(start, stop)`` row per document of the store; None until a file's checks ask for their rows.
        self.table: np.ndarray | None = None

    def rows(self, first: int, stop: int) -> np.ndarray:
        """Rows ``first .. stop - 1`` (a file's documents), a view written in place; the table is made on first use."""
        if self.table is None:
            starts = np.asarray(self._file_doc_starts, dtype=np.int64)
            self._starts = starts[:-1]
            self._counts = (starts[1:] - starts[:-1]).astype(np.uint64)
            self.table = demand_zero_rows(int(starts[-1]))
        return self.table[first:stop]

    def forget(self) -> None:
        """The store closed: drop the table (a file mapped again starts with rows of zeros)."""
        self.table = None

    def allows(self, fl: np.ndarray, lo: np.ndarray, hi: np.ndarray, docs: np.ndarray) -> bool:
        """Does every run lie inside its document's row? (False for a document outside its file.)"""
        table = self.table
        if table is None:
            return False
        rows = table.take(self._starts[fl] + docs, axis=0, mode="clip")   # a document out of range: masked
        return bool(((docs.view(np.uint64) < self._counts[fl]) & (rows[:, 0] <= lo) & (hi <= rows[:, 1])).all())

    def outside(self, fl: np.ndarray, lo: np.ndarray, hi: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Which runs their documents' rows do not admit (documents in their files' range)."""
        if self.table is None:
            return np.ones(fl.size, dtype=bool)
        rows = self.table[self._starts[fl] + docs]
        outside: np.ndarray = (rows[:, 0] > lo) | (hi > rows[:, 1])
        return outside

    def out_of_range(self, fl: np.ndarray, docs: np.ndarray) -> int | None:
        """The first run whose document is not one of its file's, or None."""
        starts = np.asarray(self._file_doc_starts, dtype=np.int64)
        bad = np.flatnonzero(docs.view(np.uint64) >= (starts[1:] - starts[:-1]).astype(np.uint64)[fl])
        return int(bad[0]) if bad.size else None
