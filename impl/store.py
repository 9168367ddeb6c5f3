"""TokenStore: tokenize a corpus once into memory-mapped Arrow files, then read it zero-copy.

Why a store: pretraining reads every document many times (epochs, resumes,
elastic restarts). Tokenizing on the fly repeats the most expensive step,
makes throughput depend on the tokenizer, and makes "document i" depend on
whatever the text pipeline did that day. The store fixes the tokens once, and
gives every loader the same numbered documents:

* document ``i`` of the store is the ``i``-th document of the source, in source
  order (files in a directory sorted by name); empty documents are kept;
* tokens live in uncompressed Arrow IPC *file* format, so ``pa.memory_map``
  plus ``pa.ipc.open_file`` hands out numpy views of the page cache (no copy,
  no deserialisation, read-only);
* ``meta.json`` (written last, atomically) records sizes, hashes, where
  each file's buffers lie and a content fingerprint, ``blocks.crc32`` a
  CRC-32 per 16 KiB block of every file and ``documents.crc32`` one per
  document, so :meth:`TokenStore.open` can refuse a store that is
  incomplete, truncated, edited or from a newer format, in time independent
  of the store's size, and every reader refuses a changed block or document
  before serving any of its tokens or using any of its offsets
  (:meth:`TokenStore.check_blocks`, :meth:`TokenStore.document_bounds`).

What is on disk (the files of ``out_dir``, ``meta.json``, the CRC tables,
format versions 1 to 4 and what each adds) is described once in
:mod:`impl.store_format`, which the writer imports too.

Guarantee: no reader returns a token of a format-2, 3 or 4 file whose
block changed since the build, and document boundaries come only from
checked offsets: the blocks holding a document's two offsets entries are
checked before they are read (:meth:`TokenStore.document_bounds`,
:meth:`TokenStore.document_bounds_batch`), all of a file's offsets blocks
before whole-file uses (``doc_offsets``, ``lengths``, iteration). In a
format-4 file a document returned by those two is checked instead by its
own CRC-32, over the tokens its offsets entries name, which covers both.
Each block and each document is CRC'd once per store object (per
process), on its first read; one changed *after* this object verified it
is not seen again until the store is opened anew (or
:meth:`TokenStore.verify` runs). A changed entry of a table refuses its
block or document (never accepts a changed one, barring a CRC collision).

Files hold ``docs_per_file`` consecutive documents each (the last one fewer);
the split depends only on the document count, never on ``num_proc``, so the
same inputs always give byte-identical files and the same fingerprint.

What a store is made from lives next door: :mod:`impl.sources` turns the
user's source into ordered document texts, :mod:`impl.encoding` pins the
tokenizer down and turns texts into token ids. :mod:`impl.store_format` owns
what is on disk (the layout, ``meta.json`` and its validation, signatures,
the fingerprint); this module owns reading it, through the file seam of
:mod:`impl.files`; :mod:`impl.integrity` owns the block and document checks
every read asks first; :mod:`impl.build` owns writing it (in this process or
in spawned workers) and publishing it atomically.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import mmap
import operator
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from impl._arrays import demand_zero, exclusive_cumsum, groups, ranges
from impl.encoding import TokenizerInfo
from impl.errors import (
    REBUILD_HINT,
    ConfigError,
    LoadspecError,
    SourceError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
)
from impl.files import FileAccess, LocalFiles
from impl.integrity import FileChecks, Integrity
from impl.store_format import (
    BLOCK_BYTES,
    BLOCK_TABLE,
    COLUMN,
    CRC_TABLES,
    DEFAULT_DOCS_PER_FILE,
    DOCUMENT_TABLE,
    FILE_TEMPLATE,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    OFFSET_BYTES,
    QUICK_SIGNATURE_BYTES,
    READABLE_FORMAT_VERSIONS,
    BuildOptions,
    FileRecord,
    arrow_buffer_layout,
    arrow_type,
    buffer_layout,
    check_crc_table_size,
    crc_table_where,
    hash_documents,
    hash_file_blocks,
    quick_signature,
    quick_signature_of,
    sha256_file,
    sha256_of,
    validate_meta,
)

# Called by the reader under these module-level names, which tests replace to count or refuse Arrow parses and
# to recompute fingerprints (``impl.store._open_arrow``, ``impl.store._content_fingerprint``).
from impl.store_format import content_fingerprint as _content_fingerprint
from impl.store_format import open_arrow_buffer as _open_arrow

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

#: :meth:`TokenStore.read_runs` copies one slice per run when runs average at least this many tokens, else it
#: fancy-indexes every token at once (faster for many tiny runs).
SLICE_MIN_WIDTH = 16



# --------------------------------------------------------------------------- the store



def _map_read_only(files: FileAccess, name: str, where: str, size: int) -> mmap.mmap | bytes:
    """File ``name`` mapped read-only through ``files``, refused with ``StoreCorruptError`` unless it holds ``size`` bytes.

    ``where`` names the file in the messages.
    """
    try:
        mm = files.map(name)
    except LoadspecError:
        raise   # the access's own typed refusal (a remote download, a full cache) names its fix, not a rebuild
    except FileNotFoundError:
        raise StoreCorruptError(f"{where} is missing; {REBUILD_HINT}") from None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"{where} could not be mapped ({exc}); {REBUILD_HINT}") from exc
    if len(mm) != size:
        raise StoreCorruptError(f"{where} changed since it was built ({len(mm)} bytes, {size} when built); {REBUILD_HINT}")
    return mm


class _Parts:
    """A store's per-file token values (``which=0``) or offsets (``which=1``), each mapped on first use.

    Why lazy: opening a store should cost metadata and a few bytes per file, not
    an Arrow footer parse per file; a file is mapped and its layout validated
    the first time any of its tokens or offsets is needed.
    """

    __slots__ = ("_store", "which")

    def __init__(self, store: TokenStore, which: int) -> None:
        self._store = weakref.ref(store)   # no cycle: a dropped store is freed, and its files unmapped, at once
        self.which = which

    @property
    def store(self) -> TokenStore:
        store = self._store()
        if store is None:
            raise StoreError("the TokenStore these files belong to was dropped; keep a reference to it while reading")
        return store

    def __getitem__(self, f: int) -> np.ndarray:
        return self.store._part(f)[self.which]

    def __len__(self) -> int:
        return len(self.store._mapped)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[f] for f in range(len(self)))


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
    [a, b) of document d" and "tokens [a, b) of all documents in store order".
    Each is a binary search over files (``O(log files)``) and slicing of a
    mapped buffer, never a Python loop over documents. Opening reads
    ``meta.json`` and stats each file (no file is opened or read), so its
    cost does not grow with the number of tokens; a format-2 file is mapped
    from its recorded buffer layout on first use, and each block (of offsets
    or of tokens) is checked on its first read (:meth:`document_bounds`,
    :meth:`check_blocks`).
    """

    # ------------------------------------------------------------ construction

    def __init__(self, path: Path, meta: dict[str, Any], files: FileAccess | None = None):
        """Use :meth:`open` or :meth:`build`; this maps already validated metadata."""
        self._path = path
        #: Every file this store reads, by name relative to the store's root (the file seam: :mod:`impl.files`).
        self._files: FileAccess = LocalFiles(path) if files is None else files
        self._meta = meta
        self._dtype: np.dtype[Any] = np.dtype(meta["dtype"])
        try:
            self._records = [FileRecord.from_json(r) for r in meta["files"]]
        except (KeyError, TypeError) as exc:
            raise StoreCorruptError(f"{path / META_FILE}: malformed file record ({exc}); {REBUILD_HINT}") from exc
        self._version: int = meta["format_version"]
        self._block_bytes: int = meta["layout"]["block_bytes"] if self._version >= 2 else 0
        self._file_index = {rec.name: f for f, rec in enumerate(self._records)}
        if len(self._file_index) != len(self._records):
            raise StoreCorruptError(f"{path / META_FILE}: two file records name the same file; {REBUILD_HINT}")
        for rec in self._records:
            self._check_file(rec, content=False)
            if self._version == 2:
                self._check_record_blocks(rec)
        #: Format 3: file f's CRCs are entries ``_table_at[f]:_table_at[f + 1]`` of the block table (mapped on first use).
        self._table_at: list[int] = []
        #: The CRC tables (``CRC_TABLES``) by file name, each mapped on first use (:meth:`_crc_table`).
        self._tables: dict[str, np.ndarray] = {}
        if self._version >= 3:
            self._table_at = [0, *itertools.accumulate(-(-r.size // self._block_bytes) for r in self._records)]
            check_crc_table_size(self._files, path, meta, CRC_TABLES[0], self._table_at[-1], f"blocks of {self._block_bytes} bytes")
        #: Format 4: one byte per document of the store, 1 once its CRC passed (a demand-zero map, made on first use).
        self._documents_verified: mmap.mmap | None = None
        if self._version >= 4:
            check_crc_table_size(self._files, path, meta, CRC_TABLES[1], int(meta["num_documents"]), "documents")
        self._map_lock = threading.Lock()
        self._closed = False
        self._mapped: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self._records)
        #: Files mapped by this object, least recently mapped first; an access with ``keep_mapped`` (a remote one
        #: under a ``cache_limit``, :mod:`impl.remote`) gets all but that many released again (:meth:`_release_old`).
        self._map_order: list[int] = []
        self._values = _Parts(self, 0)
        self._offsets = _Parts(self, 1)
        counts = [r.num_documents for r in self._records]
        tokens = [r.num_tokens for r in self._records]
        self._file_doc_starts = [0, *itertools.accumulate(counts)]
        self._file_token_starts = [0, *itertools.accumulate(tokens)]
        if self._file_doc_starts[-1] != meta["num_documents"] or self._file_token_starts[-1] != meta["num_tokens"]:
            raise StoreCorruptError(
                f"{path / META_FILE}: per-file counts ({self._file_doc_starts[-1]} documents, "
                f"{self._file_token_starts[-1]} tokens) disagree with the totals ({meta['num_documents']}, "
                f"{meta['num_tokens']}); {REBUILD_HINT}"
            )
        self._n = int(meta["num_documents"])
        #: The checks every read asks first (:mod:`impl.integrity`); ``_blocks`` is its per-file list, filled as files map.
        self._checks = Integrity(self._records, self._file_doc_starts, functools.partial(_file_where, path),
                                 self._mapped, self._map, self._require_open,
                                 getattr(self._files, "refused", None))   # a remote access drops a refused copy
        self._blocks = self._checks.files
        self._doc_offsets: np.ndarray | None = None
        self._lengths: np.ndarray | None = None

    def _map(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s (values, offsets) views, mapped on first use; the offsets' blocks are **not** checked yet.

        Callers read offsets only through :meth:`_part` (all of them checked)
        or :meth:`document_bounds` (the entries asked for); values only after
        :meth:`check_blocks`.
        """
        mapped = self._mapped[f]
        if mapped is None:
            with self._map_lock:
                self._require_open()
                mapped = self._mapped[f]
                if mapped is None:
                    mapped = self._mapped[f] = self._map_file(self._records[f])
                    self._release_old(f)
        return mapped

    def _release_old(self, f: int) -> None:
        """Drop this object's mappings of all but the ``keep_mapped`` files mapped last (under ``_map_lock``).

        Why: a remote access evicts from its bounded node cache only files no
        reader maps, so a store that kept every file it ever read mapped
        would pin the whole store there. A released file is mapped (and CRC'd:
        its verified marks go with it, as the next copy may be a new download)
        again on its next use; views already handed out keep their own
        mapping. Meant for a store object read from one thread at a time.
        """
        keep = getattr(self._files, "keep_mapped", None)
        order = self._map_order
        order.append(f)
        if keep is None:
            return
        while len(order) > max(1, int(keep)):
            g = order.pop(0)
            blocks, self._mapped[g], self._blocks[g] = self._blocks[g], None, None   # in place: shared with _checks
            self._checks.all_verified = False
            if blocks is not None:
                blocks.reset()

    def _part(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s (values, offsets), mapped on first use, every block of its offsets checked."""
        mapped = self._mapped[f]
        if mapped is None:
            mapped = self._map(f)
        blocks = self._blocks[f]
        if blocks is not None and not blocks.offsets_done:
            self._checks.check_all_offsets(f, blocks, mapped[1])
        return mapped

    def _require_open(self) -> None:
        if self._closed:
            raise StoreError(
                f"token store {self._path} is closed; open it again with TokenStore.open({str(self._path)!r}) "
                "(views of documents read before close() stay valid)"
            )

    def _check_record_blocks(self, rec: FileRecord) -> None:
        """A format-2 record carries one 8-hex-digit CRC per block of its recorded size."""
        blocks = -(-rec.size // self._block_bytes)
        crcs = rec.block_crc32
        if not isinstance(crcs, str) or len(crcs) != 8 * blocks:
            got = "none" if not isinstance(crcs, str) else f"{len(crcs) // 8} block checksums"
            raise StoreCorruptError(
                f"{self._where(rec.name)}: {META_FILE} records {got}, expected {blocks} ({rec.size} bytes in "
                f"blocks of {self._block_bytes}); {REBUILD_HINT}"
            )

    def _where(self, name: str) -> str:
        """How errors name a token file: the store and the file."""
        return _file_where(self._path, name)

    def _check_file(self, rec: FileRecord, *, content: bool) -> None:
        """Present with the recorded size (``open``); with ``content``, also the recorded quick signature (first map).

        Why the signature waits for the first map: it reads 128 KiB per
        file, so checking every file at ``open`` would make open cost
        O(files), and files grow with the token count. Checked at first map,
        before any of the file's tokens is returned, a changed file is
        refused just the same, and each process pays only for the files it
        reads.
        """
        name = rec.name
        if not name or "/" in name or name in (".", ".."):
            raise StoreCorruptError(f"{self._where(name)}: invalid file name in {META_FILE}; {REBUILD_HINT}")
        st = self._files.stat(name)
        if st is None:
            raise StoreCorruptError(f"{self._where(name)} is missing; {REBUILD_HINT}")
        if st.size == rec.size and not content:
            return
        where = self._where(name)
        if st.size < rec.size:
            raise StoreCorruptError(
                f"{where} is truncated ({st.size} bytes, {rec.size} when built); {REBUILD_HINT}"
            )
        if st.size != rec.size:
            raise StoreCorruptError(
                f"{where} changed since it was built ({st.size} bytes, {rec.size} when built); {REBUILD_HINT}"
            )
        if content and quick_signature_of(self._files, name) != rec.quick_signature:
            raise StoreCorruptError(
                f"{where} changed since it was built (its first/last {QUICK_SIGNATURE_BYTES // 1024} KiB differ "
                f"from the recorded signature); {REBUILD_HINT}"
            )

    def _map_file(self, rec: FileRecord) -> tuple[np.ndarray, np.ndarray]:
        """Map one file: straight from its recorded buffer layout (format 2), else through Arrow."""
        if self._version >= 2 and rec.buffers is not None:
            return self._map_direct(rec)
        values, offsets, whole, layout = self._map_arrow(rec, signature=True)
        if whole is not None:
            self._blocks[self._file_index[rec.name]] = self._new_blocks(
                rec, memoryview(whole), layout["values"][0], layout["offsets"][0])
        return values, offsets

    def _new_blocks(self, rec: FileRecord, data: memoryview, values_at: int, offsets_at: int) -> FileChecks:
        """File ``rec``'s block checks; its offsets hold ``documents + 1`` entries (none when recorded at 0: empty)."""
        recorded = documents = verified = None
        if self._version >= 3:
            f = self._file_index[rec.name]
            recorded = self._crc_table(BLOCK_TABLE, self._table_at[-1])[self._table_at[f]:self._table_at[f + 1]]
            if self._version >= 4:
                a, b = self._file_doc_starts[f], self._file_doc_starts[f + 1]
                documents = self._crc_table(DOCUMENT_TABLE, self._n)[a:b]
                if self._documents_verified is None:
                    self._documents_verified = demand_zero(self._n)
                verified = memoryview(self._documents_verified)[a:b]
        return FileChecks(data, values_at, self._dtype.itemsize, self._block_bytes, rec.block_crc32 or "", offsets_at,
                       recorded, 0 if rec.num_documents == 0 and offsets_at == 0 else (rec.num_documents + 1) * OFFSET_BYTES,
                       documents, verified)

    def _table_where(self, name: str) -> str:
        return crc_table_where(self._path, name)

    def _crc_table(self, name: str, entries: int) -> np.ndarray:
        """CRC table ``name``'s ``entries`` recorded CRC-32s (big-endian uint32), one read-only mapping made on first use."""
        table = self._tables.get(name)
        if table is None:
            mm = _map_read_only(self._files, name, self._table_where(name), 4 * entries)
            table = self._tables[name] = np.frombuffer(mm, dtype=">u4")
        return table

    def _recorded_buffer(self, rec: FileRecord, name: str, nbytes: int, align: int) -> int:
        """Byte offset of the recorded buffer ``name``, refused unless it has ``nbytes`` bytes inside the file."""
        span = rec.buffers.get(name) if isinstance(rec.buffers, Mapping) else None
        ok = (isinstance(span, list) and len(span) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in span))
        if ok:
            at, n = span  # type: ignore[misc]
            ok = n == nbytes and 0 <= at and at + n <= rec.size and at % align == 0
        if not ok:
            raise StoreCorruptError(
                f"{self._where(rec.name)}: {META_FILE} records its {name} buffer at {span!r}, not {nbytes} bytes "
                f"(aligned to {align}) inside its {rec.size} bytes; {REBUILD_HINT}"
            )
        return int(at)

    def _map_direct(self, rec: FileRecord) -> tuple[np.ndarray, np.ndarray]:
        """One ``mmap`` and two views at the recorded byte offsets: no Arrow footer parse, no quick signature.

        Why no quick signature (format 2): every byte used is block-checked
        before it is used (offsets by :meth:`document_bounds`/:meth:`_part`,
        values by :meth:`check_blocks`), and the Arrow metadata is not used.
        """
        item = self._dtype.itemsize
        docs = rec.num_documents
        no_offsets = docs == 0 and isinstance(rec.buffers, Mapping) and rec.buffers.get("offsets") == [0, 0]
        offsets_at = self._recorded_buffer(rec, "offsets", 0 if no_offsets else (docs + 1) * OFFSET_BYTES,
                                           OFFSET_BYTES)
        values_at = self._recorded_buffer(rec, "values", rec.num_tokens * item, item)
        mm = _map_read_only(self._files, rec.name, self._where(rec.name), rec.size)
        if no_offsets:
            offsets = np.zeros(1, dtype=np.int64)
            offsets.setflags(write=False)
        else:
            offsets = np.frombuffer(mm, dtype="<i8", count=docs + 1, offset=offsets_at)
        values = np.frombuffer(mm, dtype=self._dtype, count=rec.num_tokens, offset=values_at)
        self._blocks[self._file_index[rec.name]] = self._new_blocks(rec, memoryview(mm), values_at, offsets_at)
        return values, offsets

    def _map_arrow(self, rec: FileRecord, *, signature: bool
                   ) -> tuple[np.ndarray, np.ndarray, pa.Buffer | None, dict[str, list[int]]]:
        """Map through Arrow, checking footer, schema, counts and end offsets: ``(values, offsets, whole, layout)``.

        The path of format-1 files, of format-2 files recorded without a
        buffer layout (``signature``: their quick signature first, since the
        Arrow metadata read here is not block-checked), and of :meth:`verify`.
        """
        where = self._where(rec.name)
        self._check_file(rec, content=signature)
        try:
            col, whole = _open_arrow(_map_read_only(self._files, rec.name, where, rec.size), self._files.where(rec.name))
        except StoreCorruptError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise StoreCorruptError(f"{where} is not a readable Arrow file ({exc}); {REBUILD_HINT}") from exc
        expected = arrow_type(self._dtype)
        if col.type != expected:
            raise StoreCorruptError(
                f"{where}: schema `{COLUMN}: {col.type}` is not `{COLUMN}: {expected}` as recorded; {REBUILD_HINT}"
            )
        if len(col) != rec.num_documents or col.null_count or col.offset:
            raise StoreCorruptError(
                f"{where} holds {len(col)} documents, {rec.num_documents} when built; {REBUILD_HINT}"
            )
        if whole.size != rec.size:
            raise StoreCorruptError(f"{where} changed size while being mapped; {REBUILD_HINT}")
        layout = buffer_layout(self._files.where(rec.name), col, whole)
        offsets = col.offsets.to_numpy(zero_copy_only=True)
        if len(offsets) == 0:  # Arrow may store a 0-length list array with no offsets at all
            offsets = np.zeros(1, dtype=np.int64)
            offsets.setflags(write=False)
        values = col.values.to_numpy(zero_copy_only=True)
        if (len(offsets) != rec.num_documents + 1 or int(offsets[0]) != 0
                or int(offsets[-1]) != rec.num_tokens or len(values) != rec.num_tokens):
            raise StoreCorruptError(
                f"{where}: document offsets do not match the {rec.num_tokens} tokens recorded; {REBUILD_HINT}"
            )
        return values, offsets, (whole if self._version >= 2 else None), layout

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
        recorded size (StoreCorruptError naming the file otherwise). A file is
        memory-mapped on first use: a format-2 file with a recorded buffer
        layout at the recorded offsets (bounds, lengths and alignment
        checked), any other after its quick signature (first and last 64 KiB),
        Arrow footer, schema, document count and last offset are checked
        against the record. Every format-2 block, of offsets or of tokens, is
        CRC'd before its first use. A file changed since the build is refused
        then, with the same error type.

        A URL (``s3://bucket/store``, any fsspec protocol) with ``local``, a
        node-local cache directory, opens the store through
        :class:`impl.remote.RemoteFiles`; ``remote`` takes its options
        (``cache_limit``, ``download_retry``, ``download_timeout``,
        ``validate_hash``, ``storage_options``); a ``cache_limit`` that cannot
        hold one read is refused before any token file is downloaded.
        """
        if files is None and (local is not None or remote or "://" in str(path)):
            from impl.remote import RemoteFiles  # a remote store: fsspec and the node-local cache

            if local is None:
                raise ConfigError(f"{path} is a URL: pass a local cache directory, "
                                  f"TokenStore.open({str(path)!r}, local='/local_disk/cache')")
            cached = RemoteFiles(str(path), local, **remote)
            store = cls.open(path, files=cached)   # meta.json first; no token file is downloaded yet
            cached.expect_sha256({rec.name: rec.sha256 for rec in store._records})
            cached.check_room({rec.name: rec.size for rec in store._records})
            if verify:
                store.verify()
            return store
        root = Path(path)
        access: FileAccess = LocalFiles(root) if files is None else files
        try:
            raw = bytes(access.map(META_FILE))   # the directory is looked at only when this fails (a resume opens a store)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            local = Path(access.root) if isinstance(access, LocalFiles) else None
            if local is not None and not local.exists():
                raise StoreNotFoundError(
                    f"no token store at {root}: the directory does not exist; build it with "
                    f"TokenStore.build(source, tokenizer, {str(root)!r}) (CLI: `loadspec build ...`)"
                ) from None
            if local is not None and not local.is_dir():
                raise StoreNotFoundError(
                    f"{root} is a file, not a token store directory; pass the store's directory") from None
            raise StoreNotFoundError(
                f"{root if local is not None else access.where('')} has no {META_FILE}: it is not a token store (or "
                f"its build never finished); build it with TokenStore.build(source, tokenizer, {str(root)!r}) "
                "(CLI: `loadspec build ...`)"
            ) from None
        try:
            meta = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreCorruptError(f"{access.where(META_FILE)} is not valid JSON ({exc}); {REBUILD_HINT}") from exc
        validate_meta(root, meta)
        store = cls(root, meta, access)
        if verify:
            store.verify()
        return store

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
            if len(self._offsets) == 1:
                out = self._offsets[0]
            else:
                parts = [off[:-1] + base for off, base in zip(self._offsets, self._file_token_starts)]
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
        return (f"TokenStore({str(self._path)!r}, documents={self._n}, tokens={self.num_tokens}, "
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

        Every token copied was verified first, whoever calls: runs whose
        document ``docs[r]`` (file-local, format 4) this store object has
        verified by its own CRC-32 and that lie inside that document's
        bounds need no further check; any other run has its blocks checked
        (:meth:`check_blocks_batch`). Without ``out`` the runs are returned
        concatenated (the store's dtype); with it, run ``r`` is copied to
        ``out[dest[r]:]`` and the call returns ``out``, where a ``dest`` at or
        past ``len(out)`` addresses ``tail`` instead (at ``dest - len(out)``):
        the fill writes a batch's token grid and each piece's next token in
        one call. Copies are one slice per run when runs average at least
        :data:`SLICE_MIN_WIDTH` tokens, else one fancy index per file.

        >>> store.read_runs(np.array([0, 0]), np.array([0, 7]), np.array([2, 8])).tolist()   # doctest: +SKIP
        [15496, 995, 3886]
        """
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        lo = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi = np.asarray(stops, dtype=np.int64).reshape(-1)
        if not fl.shape == lo.shape == hi.shape:
            raise ValueError(f"files, starts and stops differ in length ({fl.size}, {lo.size}, {hi.size})")
        widths = hi - lo
        if out is None:
            at = np.zeros(len(widths) + 1, dtype=np.int64)
            np.cumsum(widths, out=at[1:])
            out, dest = np.empty(int(at[-1]), dtype=self._dtype), at[:-1]
        elif dest is None:
            raise ValueError("read_runs with out= needs dest= (where each run goes in out)")
        if not fl.size:
            return out
        self._require_open()
        if fl.size and (int(fl.min()) < 0 or int(fl.max()) >= len(self._records)):
            raise IndexError(f"file out of range for a store of {len(self._records)} files")
        by_file = groups(fl)
        if docs is None or self._version < 4:
            self.check_blocks_batch(fl, lo, hi)
        elif not self._checks.all_verified:
            dl = np.asarray(docs, dtype=np.int64).reshape(-1)
            if fl.size <= 64:   # a batch's few runs: checked in Python
                self._checks.check_few_document_runs(fl, lo, hi, dl)
            else:
                self._checks.check_document_runs(by_file, lo, hi, dl)
        mapped = self._mapped
        values = [None if m is None else m[0] for m in mapped]
        for f, _ in by_file:
            if values[f] is None:
                values[f] = self._map(f)[0]
        T = len(out)
        if int(widths.sum()) >= SLICE_MIN_WIDTH * len(widths):
            for q, x0, x1, to in zip(fl.tolist(), lo.tolist(), hi.tolist(), dest.tolist()):
                part = values[q]
                if to < T:
                    out[to:to + x1 - x0] = part[x0:x1]  # type: ignore[index]
                elif tail is not None:
                    tail[to - T:to - T + x1 - x0] = part[x0:x1]  # type: ignore[index]
            return out
        into = ranges(dest, widths)
        got = np.empty(len(into), dtype=out.dtype)
        for f, sel in by_file:
            part = values[f]
            if sel is None:
                got[:] = part[ranges(lo, widths)]  # type: ignore[index]
            else:
                got[ranges(exclusive_cumsum(widths)[sel], widths[sel])] = part[ranges(lo[sel], widths[sel])]  # type: ignore[index]
        front = into < T
        if front.all():
            out[into] = got
        else:
            out[into[front]] = got[front]
            if tail is not None:
                tail[into[~front] - T] = got[~front]
        return out

    # ------------------------------------------------------------ integrity (impl.integrity)

    def check_blocks(self, file: int, starts: np.ndarray, stops: np.ndarray) -> None:
        """Refuse changed tokens before they are served: verify the blocks holding tokens ``[starts[i], stops[i])`` of ``file``.

        ``starts``/``stops`` are file-local token offsets (equal-length int64
        arrays; empty ranges are ignored). Every block is CRC'd once per
        store object, on its first read; a changed one raises
        :class:`StoreCorruptError` naming the store, the file, the block and
        the fix (:meth:`impl.integrity.Integrity.check_blocks`). Format-1
        files have no block checksums: for them this only maps the file.

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

        Raises :class:`StoreCorruptError` naming the first problem. The
        fingerprint is recomputed from the file records, dtype, tokenizer and
        options and compared with the recorded one (an edited ``meta.json``
        is refused); each file is then mapped, every block of a format-2 file
        is CRC'd again whether or not it was read before, the whole file is
        hashed against its recorded sha256, its Arrow footer, schema and
        document count are checked (with the quick signature) and the
        recorded buffer layout is compared with the one Arrow reads, and its
        offsets must start at 0, end at its token count and never decrease.
        Afterwards every block counts as verified, so reads cost no
        further CRC. Use after copying a store between machines or when a
        silent edit is suspected; :meth:`open` alone only checks sizes.
        """
        self._require_open()
        t = self._meta["tokenizer"]
        options = self._meta.get("options") or {}
        expected = _content_fingerprint([r.sha256 for r in self._records], self._meta["dtype"], t.get("sha256", ""),
                                        options.get("add_bos", False), options.get("add_eos", True),
                                        format_version=self._version)
        if expected != self.fingerprint:
            raise StoreCorruptError(
                f"token store {self._path}: {META_FILE} fingerprint {str(self.fingerprint)[:16]}... does not match "
                f"the one recomputed from its file records and options ({expected[:16]}...): {META_FILE} was "
                f"edited; {REBUILD_HINT}"
            )
        for spec in CRC_TABLES:
            if self._version < spec.since:
                continue
            recorded = self._meta["layout"][spec.key]["sha256"]
            digest = sha256_of(self._files, spec.name)
            if digest != recorded:
                raise StoreCorruptError(
                    f"{self._table_where(spec.name)} changed since it was built (sha256 {digest[:16]}..., recorded "
                    f"{str(recorded)[:16]}...): the {spec.entry} checks cannot be trusted; {REBUILD_HINT}"
                )
        self._checks.all_verified = False
        for f, rec in enumerate(self._records):
            self._map(f)
            blocks = self._blocks[f]
            if blocks is None:
                digest = sha256_of(self._files, rec.name)
            else:
                blocks.reset()
                self._checks.verify_span(rec, blocks, 0, blocks.count - 1)
                digest = hashlib.sha256(blocks.data).hexdigest()
            if digest != rec.sha256:
                raise StoreCorruptError(
                    f"{self._where(rec.name)} changed since it was built (sha256 {digest[:16]}..., "
                    f"recorded {rec.sha256[:16]}...); {REBUILD_HINT}"
                )
            if self._version >= 2 and rec.buffers is not None:
                layout = self._map_arrow(rec, signature=True)[3]
                if dict(rec.buffers) != layout:
                    raise StoreCorruptError(
                        f"{self._where(rec.name)}: {META_FILE} records its buffers at {dict(rec.buffers)}, but the "
                        f"Arrow file holds them at {layout}; {META_FILE} was edited; {REBUILD_HINT}"
                    )
            offsets = self._part(f)[1]
            if len(offsets) > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
                raise StoreCorruptError(
                    f"{self._where(rec.name)} has decreasing document offsets; {REBUILD_HINT}"
                )
            if blocks is not None and blocks.documents is not None and rec.num_documents:
                bounds = offsets.tolist()
                self._checks.verify_documents([(f, d, bounds[d], bounds[d + 1]) for d in range(rec.num_documents)])

    @property
    def format_version(self) -> int:
        """The store's on-disk format version (1: no checksums; 2, 3: a CRC-32 per block; 4: and per document)."""
        return self._version

    @property
    def document_checks(self) -> bool:
        """Format 4: :meth:`document_bounds` and :meth:`document_bounds_batch` verify every document they return.

        Each returned document's tokens, read at the returned bounds, passed
        its recorded CRC-32 (or every block of its file did) before the call
        returns, so a reader that copies only tokens inside documents whose
        bounds it got from them (the packing fill path, ``TokenSource``)
        needs no :meth:`check_blocks` call. False for formats 1 to 3, whose
        readers must call :meth:`check_blocks` for every run they copy.
        """
        return self._version >= 4

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release this object's mapped files; any later read raises :class:`StoreError` (idempotent).

        Views handed out before stay valid (Arrow keeps their mapping alive
        while they are referenced). Metadata (``len``, ``fingerprint``,
        ``meta``, counts) stays readable; every accessor that needs a token
        file (indexing, ``read``, ``gather``, iteration, ``doc_offsets``,
        ``lengths``, ``check_blocks``, ``verify``) raises
        ``StoreError("token store ... is closed; open it again with TokenStore.open(...)")``.
        Pickling a closed store still works: the receiver opens it again.
        """
        with self._map_lock:
            self._closed = True
            self._mapped[:] = [None] * len(self._records)
            self._checks.forget()
            self._map_order = []
            self._doc_offsets = None
            self._lengths = None
            self._tables = {}
            self._documents_verified = None

    def __reduce__(self) -> tuple[Any, tuple[str, str, FileAccess]]:
        # Processes (e.g. DataLoader workers under spawn) get the path, fingerprint and file access,
        # never the tokens; the receiver re-opens through the same access and checks it sees the same store.
        return (_reopen, (str(self._path), self.fingerprint, self._files))


def _file_where(path: Path, name: str) -> str:
    return f"token store {path}: file {name}"


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _reopen(path: str, fingerprint: str, files: FileAccess | None = None) -> TokenStore:
    store = TokenStore.open(path, files=files)
    if store.fingerprint != fingerprint:
        raise StoreCorruptError(
            f"token store {path} changed (fingerprint {store.fingerprint[:16]}..., expected {fingerprint[:16]}...) "
            f"between processes; {REBUILD_HINT}"
        )
    return store

