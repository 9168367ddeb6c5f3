"""TokenStore: tokenize a corpus once into memory-mapped Arrow files, then read it zero-copy.

Why a store: pretraining reads every document many times (epochs, resumes,
elastic restarts). Tokenizing on the fly repeats the most expensive step and
makes "document i" depend on whatever the text pipeline did that day. The
store fixes the tokens once: document ``i`` is the ``i``-th document of the
source, in source order (empty documents kept), its tokens a numpy view of
the page cache (uncompressed Arrow IPC files, ``docs_per_file`` consecutive
documents each, so the same inputs give byte-identical files).

Guarantee: no reader returns a token of a format-2+ file whose block
changed since the build, and document boundaries come only from checked
offsets (format 4 checks a document by its own CRC-32 instead). Each block
and document is CRC'd once per store object, on its first read;
:meth:`TokenStore.verify` checks every byte again. :meth:`TokenStore.read_runs`
is the one checked read that the store's own accessors, the fill, splits
and mixtures use.

Who owns what: :mod:`impl.store_format` what is on disk (the layout,
``meta.json``, the CRC tables, the fingerprint); :mod:`impl.store_open`
finding a store and refusing what is not one; :mod:`impl.store_files` how
a token file is mapped (through the seam of :mod:`impl.files`) and checked
against its record; :mod:`impl.integrity` the block and document checks;
:mod:`impl.build` writing and publishing a store; this module reading it.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np

from impl._arrays import SLICE_MIN_WIDTH, copy_runs, groups
from impl.encoding import TokenizerInfo
from impl.errors import (
    REBUILD_HINT,
    SourceError,
    StoreCorruptError,
)
from impl.files import FileAccess, LocalFiles
from impl.store_files import FileViews, StoreFiles
from impl.store_format import (
    BLOCK_BYTES,
    BLOCK_TABLE,
    DEFAULT_DOCS_PER_FILE,
    DOCUMENT_TABLE,
    FILE_TEMPLATE,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    QUICK_SIGNATURE_BYTES,
    READABLE_FORMAT_VERSIONS,
    BuildOptions,
    FileRecord,
    arrow_buffer_layout,
    hash_documents,
    hash_file_blocks,
    quick_signature,
    sha256_file,
)
from impl.store_open import open_store, reopen_store

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_TABLE",
    "DEFAULT_DOCS_PER_FILE",
    "DOCUMENT_TABLE",
    "FILE_TEMPLATE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_FILE",
    "QUICK_SIGNATURE_BYTES",
    "READABLE_FORMAT_VERSIONS",
    "BuildOptions",
    "FileRecord",
    "SourceError",
    "TokenStore",
    "TokenizerInfo",
    "arrow_buffer_layout",
    "hash_documents",
    "hash_file_blocks",
    "quick_signature",
    "sha256_file",
]



class TokenStore:
    """Documents tokenized once, stored as memory-mapped Arrow files, read as numpy views.

    Example::

        >>> store = TokenStore.build(["Hello world", "", "Bye"], "fixtures/tokenizer/gpt2",
        ...                          "/tmp/demo-store", progress=False)      # doctest: +SKIP
        >>> store = TokenStore.open("/tmp/demo-store")                      # doctest: +SKIP
        >>> len(store), store.dtype, store.eos_id                            # doctest: +SKIP
        (3, dtype('uint16'), 50256)
        >>> store[0]                      # "Hello world" + eos, a read-only view  # doctest: +SKIP
        array([15496,   995, 50256], dtype=uint16)
        >>> store[1]                      # the empty document is kept: just eos   # doctest: +SKIP
        array([50256], dtype=uint16)
        >>> store.lengths, store.doc_offsets                                 # doctest: +SKIP
        (array([3, 1, 3]), array([0, 3, 4, 7]))
        >>> store.read(2, 5)              # tokens [2, 5) of the concatenation      # doctest: +SKIP
        array([50256, 50256,  3886], dtype=uint16)
        >>> store.gather([2, 0])          # documents 2 then 0, concatenated        # doctest: +SKIP
        (array([ 3886,    68, 50256, 15496,   995, 50256], dtype=uint16), array([0, 3, 6]))

    Why the API looks like this: loaders only ever need "document d", "tokens
    [a, b) of document d" and "tokens [a, b) of all documents in store order",
    each a binary search over files and a slice of a mapped buffer. Opening
    reads ``meta.json`` and stats each file, so its cost does not grow with
    the number of tokens (:mod:`impl.store_files` maps a file on first use).

    Files: each mapped token file and CRC table holds a file descriptor
    until :meth:`close`, a ``with`` block's end or garbage collection; a job
    that opens stores repeatedly should close each (a deleted file keeps its
    disk space while mapped)::

        >>> with TokenStore.open("/tmp/demo-store") as store:             # doctest: +SKIP
        ...     first = store[0]
        >>> store.closed                                                 # doctest: +SKIP
        True
    """

    # ------------------------------------------------------------ construction

    def __init__(self, path: Path, meta: dict[str, Any], files: FileAccess | None = None, *, name: str | None = None):
        """Use :meth:`open` or :meth:`build`; this maps already validated metadata (``name``: how messages name it)."""
        self._path = path
        #: Every file this store reads, by name relative to the store's root (the file seam: :mod:`impl.files`).
        self._files: FileAccess = LocalFiles(path) if files is None else files
        self._meta = meta
        #: The token files, each mapped on first use (:mod:`impl.store_files`).
        self._maps = StoreFiles(str(path) if name is None else name, meta, self._files)
        self._records = self._maps.records
        self._dtype = self._maps.dtype
        self._version = self._maps.version
        self._mapped = self._maps.mapped
        self._map = self._maps.map
        self._part = self._maps.part
        self._values = FileViews(self._maps, 0)
        self._offsets = FileViews(self._maps, 1)
        self._file_doc_starts = self._maps.file_doc_starts
        self._file_token_starts = [0, *itertools.accumulate(r.num_tokens for r in self._records)]
        if self._file_doc_starts[-1] != meta["num_documents"] or self._file_token_starts[-1] != meta["num_tokens"]:
            raise StoreCorruptError(
                f"{self._maps.path}/{META_FILE}: per-file counts ({self._file_doc_starts[-1]} documents, "
                f"{self._file_token_starts[-1]} tokens) disagree with the totals ({meta['num_documents']}, "
                f"{meta['num_tokens']}); {REBUILD_HINT}"
            )
        self._n = int(meta["num_documents"])
        #: The checks every read asks first (:mod:`impl.integrity`); ``_blocks`` is its per-file list, filled as files map.
        self._checks = self._maps.checks
        self._blocks = self._maps.blocks
        self._doc_offsets: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        #: Unmaps the files when this object is collected without close() (the maps hold no reference back to it).
        self._finalizer = weakref.finalize(self, StoreFiles.close, self._maps)
        self._finalizer.atexit = False

    def _require_open(self) -> None:
        self._maps.require_open()

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = False, files: FileAccess | None = None,
             local: str | os.PathLike[str] | None = None, **remote: Any) -> TokenStore:
        """Open a built store, checking it cheaply; ``verify=True`` also re-hashes every file.

        ``files`` is where the store's files are read from, by name relative
        to its root (:mod:`impl.files`; default ``LocalFiles(path)``, the
        directory ``path``); ``path`` then only names the store (messages,
        plan cache keys). Every byte the store reads (``meta.json``, the CRC
        tables, the token files' sizes, signatures and mappings) goes
        through it.

        Checks at open (none opens a token file): ``meta.json`` exists and
        parses; format name and version are known (StoreVersionError for a
        newer or unknown version); every token file exists and has the
        recorded size (StoreCorruptError naming the file otherwise). A file
        changed since the build is refused at its first map or first read of
        a changed block (:mod:`impl.store_files`), with the same error type.

        A URL (``s3://bucket/store``, any fsspec protocol) with ``local``, a
        node-local cache directory, opens the store through
        :class:`impl.remote.RemoteFiles`; ``remote`` takes its options
        (``cache_limit``, ``download_retry``, ``download_timeout``,
        ``validate_hash``, ``storage_options``); a ``cache_limit`` that cannot
        hold one read is refused before any token file is downloaded.
        """
        return open_store(cls, path, verify=verify, files=files, local=local, **remote)

    @classmethod
    def build(
        cls,
        source: Any,
        tokenizer: Any,
        out_dir: str | os.PathLike[str],
        *,
        text_field: str = "text",
        num_proc: int | None = None,
        add_bos: bool = False,
        add_eos: bool = True,
        batch_size: int = 1000,
        docs_per_file: int | None = None,
        progress: bool = True,
        split: str | None = None,
        overwrite: bool = False,
    ) -> TokenStore:
        """Tokenize ``source`` into a new store at ``out_dir`` and return it opened (see :func:`impl.build.build_store`)."""
        from impl.build import build_store

        return build_store(
            source, tokenizer, out_dir, text_field=text_field, num_proc=num_proc, add_bos=add_bos,
            add_eos=add_eos, batch_size=batch_size, docs_per_file=docs_per_file, progress=progress, split=split,
            overwrite=overwrite, open_store=cls.open,
        )

    @classmethod
    def from_token_files(
        cls,
        files: Sequence[Sequence[Sequence[int]]],
        out_dir: str | os.PathLike[str],
        *,
        vocab_size: int | None = None,
        eos_id: int | None = None,
        bos_id: int | None = None,
        pad_id: int | None = None,
        overwrite: bool = False,
        progress: bool = False,
    ) -> TokenStore:
        """Write already-tokenized documents as a store (see :func:`impl.build.store_from_token_files`)."""
        from impl.build import store_from_token_files

        return store_from_token_files(
            files, out_dir, vocab_size=vocab_size, eos_id=eos_id, bos_id=bos_id, pad_id=pad_id,
            overwrite=overwrite, progress=progress, open_store=cls.open,
        )

    # ------------------------------------------------------------ properties

    @property
    def path(self) -> Path:
        return self._path

    @property
    def meta(self) -> dict[str, Any]:
        """The parsed ``meta.json`` (treat as read-only)."""
        return self._meta

    @property
    def fingerprint(self) -> str:
        """sha256 over the ordered file hashes, dtype, tokenizer identity and add_bos/add_eos."""
        return str(self._meta["fingerprint"])

    @property
    def num_documents(self) -> int:
        return self._n

    @property
    def num_tokens(self) -> int:
        return int(self._meta["num_tokens"])

    @property
    def num_empty_documents(self) -> int:
        """Documents whose text encoded to no tokens (kept, holding only bos/eos if enabled)."""
        return int(self._meta["num_empty_documents"])

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def tokenizer_info(self) -> TokenizerInfo:
        return TokenizerInfo(**self._meta["tokenizer"])

    @property
    def eos_id(self) -> int | None:
        return _optional_int(self._meta["tokenizer"].get("eos_id"))

    @property
    def bos_id(self) -> int | None:
        return _optional_int(self._meta["tokenizer"].get("bos_id"))

    @property
    def pad_id(self) -> int | None:
        return _optional_int(self._meta["tokenizer"].get("pad_id"))

    @property
    def vocab_size(self) -> int:
        return int(self._meta["tokenizer"]["vocab_size"])

    @property
    def num_files(self) -> int:
        return len(self._records)

    @property
    def file_records(self) -> list[FileRecord]:
        return list(self._records)

    @property
    def file_document_counts(self) -> list[int]:
        """Documents per token file, in order (files are the loaders' shards)."""
        return [r.num_documents for r in self._records]

    @property
    def file_token_counts(self) -> list[int]:
        return [r.num_tokens for r in self._records]

    @property
    def file_document_starts(self) -> list[int]:
        """Global index of each file's first document, plus the total (length files + 1)."""
        return list(self._file_doc_starts)

    @property
    def doc_offsets(self) -> np.ndarray:
        """Global token offset of each document, int64, length N+1 (read-only, cached).

        With one file this is the file's mapped offsets (zero-copy); otherwise
        one vectorised concatenation of the mapped per-file offsets.
        """
        if self._doc_offsets is None:
            self._require_open()
            offsets = [self._maps.offsets_of(f) for f in range(len(self._records))]   # a remote store: by range
            if len(offsets) == 1:
                out = offsets[0]
            else:
                parts = [off[:-1] + base for off, base in zip(offsets, self._file_token_starts)]
                parts.append(np.array([self.num_tokens], dtype=np.int64))
                out = np.concatenate(parts).astype(np.int64, copy=False)
                out.setflags(write=False)
            self._doc_offsets = out
        return self._doc_offsets

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per document (int64, read-only, cached): ``np.diff(doc_offsets)``."""
        if self._lengths is None:
            self._require_open()
            lengths = np.diff(self.doc_offsets).astype(np.int64, copy=False)
            lengths.setflags(write=False)
            self._lengths = lengths
        return self._lengths

    # ------------------------------------------------------------ access

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (f"TokenStore({self._maps.path!r}, documents={self._n}, tokens={self.num_tokens}, "
                f"dtype={self._dtype.name}, files={len(self._records)})")

    def __iter__(self) -> Iterator[np.ndarray]:
        self._require_open()
        for f in range(len(self._records)):
            values, offsets = self._part(f)
            bounds = offsets.tolist()
            for a, b in itertools.pairwise(bounds):
                self._checks.check_span(f, a, b)
                yield values[a:b]

    def locate(self, index: int) -> tuple[int, int]:
        """``(file, local index)`` of document ``index`` (negative counts from the end)."""
        i = self._normalise(index)
        f = bisect.bisect_right(self._file_doc_starts, i) - 1
        return f, i - self._file_doc_starts[f]

    def _normalise(self, index: int) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"document index must be an integer, not {type(index).__name__}") from None
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"document index {index} out of range for a store of {self._n} documents")
        return i

    def __getitem__(self, index: int) -> np.ndarray:
        """Document ``index`` as a read-only zero-copy view (dtype uint16/uint32)."""
        i = self._normalise(index)
        starts = self._file_doc_starts
        f = 0 if len(starts) == 2 else bisect.bisect_right(starts, i) - 1
        local = i - starts[f]
        values, off = self._map(f)
        blocks = self._blocks[f]
        if blocks is not None and not blocks.offsets_done:
            a, n = self.document_bounds(f, np.array([local]))
            a0, b0 = int(a[0]), int(a[0] + n[0])
        else:
            a0, b0 = int(off[local]), int(off[local + 1])
        self._checks.check_span(f, a0, b0)
        return values[a0:b0]

    def tokens_for(self, doc_index: int, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """Tokens ``[start:stop]`` of one document (slice semantics), a zero-copy view."""
        return self[doc_index][start:stop]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the concatenation of all documents in store order.

        A zero-copy view when the range lies in one file, else one concatenation
        (a loop over the files touched, never over documents). Raises IndexError
        unless ``0 <= start <= stop <= num_tokens``.
        """
        self._require_open()
        start = operator.index(start)
        stop = operator.index(stop)
        total = self.num_tokens
        if not 0 <= start <= stop <= total:
            raise IndexError(f"token range [{start}, {stop}) out of bounds for a store of {total} tokens")
        if start == stop:
            return np.empty(0, dtype=self._dtype)
        fts = self._file_token_starts
        f0 = bisect.bisect_right(fts, start) - 1
        f1 = bisect.bisect_right(fts, stop - 1) - 1
        parts = []
        for f in range(f0, f1 + 1):
            values = self._map(f)[0]
            a = max(start - fts[f], 0)
            b = min(stop - fts[f], len(values))
            self._checks.check_span(f, a, b)
            parts.append(values[a:b])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def gather(self, doc_indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Concatenate documents in the given order: ``(tokens, offsets)`` with ``offsets`` int64 of length k+1.

        Vectorised (loops over files only); negative indices count from the end.
        """
        self._require_open()
        docs = np.asarray(doc_indices, dtype=np.int64).reshape(-1)
        if docs.size and (docs.min() < -self._n or docs.max() >= self._n):
            raise IndexError(f"document index out of range for a store of {self._n} documents")
        docs = np.where(docs < 0, docs + self._n, docs)
        doc_offsets = self.doc_offsets
        starts = doc_offsets[docs]
        lens = doc_offsets[docs + 1] - starts
        out_offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lens, out=out_offsets[1:])
        fds = np.asarray(self._file_doc_starts, dtype=np.int64)
        doc_file = np.zeros(len(docs), dtype=np.int64) if len(self._records) == 1 else (
            np.searchsorted(fds, docs, side="right") - 1)
        local = starts - np.asarray(self._file_token_starts, dtype=np.int64)[doc_file]
        return self.read_runs(doc_file, local, local + lens), out_offsets   # block checks, as before read_runs

    def read_runs(self, files: np.ndarray, starts: np.ndarray, stops: np.ndarray, *, docs: np.ndarray | None = None,
                  out: np.ndarray | None = None, dest: np.ndarray | None = None, tail: np.ndarray | None = None
                  ) -> np.ndarray:
        """The store's one checked read of many runs: tokens ``[starts[r], stops[r])`` of file ``files[r]``, verified.

        Every token copied was verified first, whoever calls: runs inside
        a document ``docs[r]`` (file-local, format 4) this store object
        verified (its CRC-32, or its blocks) pass one numpy test a batch
        (:mod:`impl.readable`); other runs' documents are verified first,
        and runs outside them, or without ``docs``, have their blocks
        checked (:meth:`check_blocks_batch`). Without ``out`` the runs are returned
        concatenated (the store's dtype); with it, run ``r`` is copied to
        ``out[dest[r]:]`` and the call returns ``out``, where a ``dest`` at or
        past ``len(out)`` addresses ``tail`` instead (at ``dest - len(out)``):
        the fill writes a batch's token grid and each piece's next token in
        one call. Copies are one slice per run when runs average at least
        :data:`~impl._arrays.SLICE_MIN_WIDTH` tokens, else one fancy index per file.

        >>> store.read_runs(np.array([0, 0]), np.array([0, 7]), np.array([2, 8])).tolist()   # doctest: +SKIP
        [15496, 995, 3886]
        """
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        lo = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi = np.asarray(stops, dtype=np.int64).reshape(-1)
        if not fl.shape == lo.shape == hi.shape:
            raise ValueError(f"files, starts and stops differ in length ({fl.size}, {lo.size}, {hi.size})")
        widths = hi - lo
        if fl.size and int(widths.min()) < 0:
            r = int(np.argmin(widths))
            raise ValueError(f"run {r} stops before it starts ({int(lo[r])} > {int(hi[r])}); pass stops >= starts")
        if out is None:
            at = np.zeros(len(widths) + 1, dtype=np.int64)
            np.cumsum(widths, out=at[1:])
            out, dest = np.empty(int(at[-1]), dtype=self._dtype), at[:-1]
        elif dest is None:
            raise ValueError("read_runs with out= needs dest= (where each run goes in out)")
        if not fl.size:
            return out
        self._require_open()
        if int(fl.view(np.uint64).max()) >= len(self._records):   # a negative file reads as a huge one
            raise IndexError(f"file out of range for a store of {len(self._records)} files")
        checks = self._checks
        if docs is None or self._version < 4:
            self.check_blocks_batch(fl, lo, hi)
        elif not checks.all_verified:
            dl = np.asarray(docs, dtype=np.int64).reshape(-1)
            if dl.shape != fl.shape:
                raise ValueError(f"docs and files differ in length ({dl.size} and {fl.size})")
            if not checks.readable.allows(fl, lo, hi, dl):   # one numpy test; a run outside a verified document:
                checks.check_document_runs(fl, lo, hi, dl)  # its document verified, else its blocks
        values = [None if m is None else m[0] for m in self._mapped]
        slices = int(widths.sum()) >= SLICE_MIN_WIDTH * len(widths)
        by_file = [] if slices else groups(fl)   # one slice per run needs no grouping by file
        for f in set(fl.tolist()) if slices else (g for g, _ in by_file):
            if values[f] is None:
                values[f] = self._map(f)[0]
        return copy_runs(values, fl, lo, hi, by_file, out, dest, tail, slices=slices)  # type: ignore[arg-type]

    # ------------------------------------------------------------ integrity (impl.integrity)

    def check_blocks(self, file: int, starts: np.ndarray, stops: np.ndarray) -> None:
        """Refuse changed tokens before they are served: verify the blocks holding tokens ``[starts[i], stops[i])`` of ``file``.

        ``starts``/``stops`` are file-local token offsets (empty ranges are
        ignored); a changed block raises :class:`StoreCorruptError`
        (:meth:`impl.integrity.Integrity.check_blocks`). Format 1 has no
        checksums: this only maps the file.

        >>> store.check_blocks(0, np.array([0, 100]), np.array([10, 4096]))   # doctest: +SKIP
        """
        self._checks.check_blocks(file, starts, stops)

    def check_blocks_batch(self, files: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        """:meth:`check_blocks` of a whole batch: the blocks holding tokens ``[starts[i], stops[i])`` of ``files[i]``.

        >>> store.check_blocks_batch(np.array([0, 2]), np.array([0, 100]), np.array([10, 4096]))  # doctest: +SKIP
        """
        self._checks.check_blocks_batch(files, starts, stops)

    def document_bounds(self, file: int, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` (file-local tokens, int64) of file-local documents ``docs`` of ``file``, from checked offsets.

        The blocks holding each document's two offsets entries pass their
        CRC first; format 4 also checks each returned document's tokens
        (:attr:`document_checks`; :meth:`impl.integrity.Integrity.document_bounds`).

        >>> store.document_bounds(0, np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        return self._checks.document_bounds(file, docs)

    def document_bounds_batch(self, files: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`document_bounds` of many files at once: ``(start, length)`` of document ``docs[i]`` of ``files[i]``.

        >>> store.document_bounds_batch(np.array([0, 2]), np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        return self._checks.document_bounds_batch(files, docs)

    def verify(self) -> None:
        """The full check: meta's own fingerprint, then every file's every byte (sha256 and every block CRC).

        Raises :class:`StoreCorruptError` naming the first problem: an edited
        ``meta.json`` (its fingerprint recomputed), a changed CRC table, or a
        file whose sha256, block CRCs, Arrow footer, recorded buffer layout or
        offsets disagree with its record. Afterwards every block counts as
        verified. Use after copying a store between machines or when a silent
        edit is suspected; :meth:`open` alone only checks sizes.
        """
        self._maps.verify(self._meta)

    @property
    def format_version(self) -> int:
        """The store's on-disk format version (1: no checksums; 2, 3: a CRC-32 per block; 4: and per document)."""
        return self._version

    @property
    def document_checks(self) -> bool:
        """Format 4: :meth:`document_bounds` and :meth:`document_bounds_batch` verify every document they return.

        So a reader that copies only tokens inside documents whose bounds it got
        from them needs no :meth:`check_blocks` call; formats 1 to 3 need one
        for every run copied (:meth:`read_runs` does either).
        """
        return self._version >= 4

    @property
    def closed(self) -> bool:
        return self._maps.closed

    def close(self) -> None:
        """Release this object's mapped files; any later read raises :class:`StoreError` (idempotent).

        Views handed out before stay valid; metadata (``len``,
        ``fingerprint``, counts) stays readable; every accessor that needs a
        token file raises ``StoreError("token store ... is closed; open it
        again with TokenStore.open(...)")``. A pickled closed store reopens.
        The file descriptors go with the mappings: at once, unless a view
        handed out still holds its file's mapping (then with the last view).
        """
        self._finalizer()
        self._doc_offsets = None
        self._lengths = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[type[TokenStore], str, str, FileAccess]]:
        # Processes (e.g. DataLoader workers under spawn) get the path, fingerprint and file access,
        # never the tokens; the receiver re-opens through the same access and checks it sees the same store.
        return (reopen_store, (type(self), self._maps.path, self.fingerprint, self._files))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)

