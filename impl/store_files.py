"""A store's token files: each mapped on first use through the file seam, with the tables that check it.

Why a layer of its own: :class:`~impl.store.TokenStore` answers for
documents and tokens; this answers for how a token file becomes its
``(values, offsets)`` views and its :class:`~impl.integrity.FileChecks`.
At open every file must exist with its recorded size (no file is opened);
at its first map a format-2+ file with a recorded buffer layout is viewed
at the recorded offsets (bounds, lengths and alignment checked), any other
after its quick signature and its Arrow footer, schema, document count and
end offsets; the CRC tables are mapped on first use; :meth:`StoreFiles.verify`
re-checks every byte. Every byte goes through the :mod:`impl.files` seam.

Worked example (a store of two files, document 5 in file 1)::

    maps = StoreFiles(path, meta, LocalFiles(path))   # stats both files, maps neither
    values, offsets = maps.map(1)                     # file 1 mapped, its FileChecks in maps.blocks[1]
    maps.part(1)                                      # and every block of its offsets CRC'd
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import mmap
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from impl._arrays import demand_zero
from impl._crc import crc32
from impl.errors import REBUILD_HINT, LoadspecError, StoreCorruptError, StoreError
from impl.file_checks import FileChecks
from impl.files import FileAccess
from impl.integrity import Integrity
from impl.store_format import (
    BLOCK_TABLE,
    COLUMN,
    CRC_TABLES,
    DOCUMENT_TABLE,
    META_FILE,
    OFFSET_BYTES,
    QUICK_SIGNATURE_BYTES,
    FileRecord,
    arrow_type,
    buffer_layout,
    check_crc_table_size,
    crc_table_where,
    quick_signature_of,
    sha256_of,
)

# Called under these module-level names, which tests replace to count or refuse Arrow parses
# (``impl.store_files._open_arrow``) and quick signatures (``impl.store_files.quick_signature_of``).
from impl.store_format import content_fingerprint as _content_fingerprint
from impl.store_format import open_arrow_buffer as _open_arrow

__all__ = ["FileViews", "StoreFiles", "file_where", "map_read_only"]


def file_where(path: Path | str, name: str) -> str:
    """How errors name a token file: the store and the file."""
    return f"token store {path}: file {name}"


def map_read_only(files: FileAccess, name: str, where: str, size: int) -> mmap.mmap | bytes:
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


class StoreFiles:
    """The token files of one store object: checked present at construction, mapped and checked on first use.

    ``path`` names the store in messages (the string it was opened with),
    ``files`` reads its bytes; ``mapped[f]`` is file ``f``'s ``(values,
    offsets)`` once mapped and ``blocks[f]`` its checks (shared with
    ``checks``, the store's :class:`~impl.integrity.Integrity`).
    """

    def __init__(self, path: Path | str, meta: dict[str, Any], files: FileAccess) -> None:
        self.path = str(path)
        self.files = files
        self.dtype: np.dtype[Any] = np.dtype(meta["dtype"])
        try:
            self.records = [FileRecord.from_json(r) for r in meta["files"]]
        except (KeyError, TypeError) as exc:
            raise StoreCorruptError(f"{path}/{META_FILE}: malformed file record ({exc}); {REBUILD_HINT}") from exc
        self.version: int = meta["format_version"]
        self.block_bytes: int = meta["layout"]["block_bytes"] if self.version >= 2 else 0
        self.file_index = {rec.name: f for f, rec in enumerate(self.records)}
        if len(self.file_index) != len(self.records):
            raise StoreCorruptError(f"{path}/{META_FILE}: two file records name the same file; {REBUILD_HINT}")
        for rec in self.records:
            self.check_file(rec, content=False)
            if self.version == 2:
                self.check_record_blocks(rec)
        #: Format 3: file f's CRCs are entries ``table_at[f]:table_at[f + 1]`` of the block table (mapped on first use).
        self.table_at: list[int] = []
        #: The CRC tables (``CRC_TABLES``) by file name, each mapped on first use (:meth:`crc_table`).
        self.tables: dict[str, np.ndarray] = {}
        if self.version >= 3:
            self.table_at = [0, *itertools.accumulate(-(-r.size // self.block_bytes) for r in self.records)]
            check_crc_table_size(files, path, meta, CRC_TABLES[0], self.table_at[-1],
                                 f"blocks of {self.block_bytes} bytes")
        #: Format 4: one byte per document of the store, 1 once its CRC passed (a demand-zero map, made on first use).
        self.documents_verified: mmap.mmap | None = None
        if self.version >= 4:
            check_crc_table_size(files, path, meta, CRC_TABLES[1], int(meta["num_documents"]), "documents")
        self.file_doc_starts = [0, *itertools.accumulate(r.num_documents for r in self.records)]
        self.n = int(meta["num_documents"])
        self.lock = threading.Lock()
        self.closed = False
        self.mapped: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self.records)
        #: Files mapped, least recently mapped first; an access with ``keep_mapped`` (a remote one under a
        #: ``cache_limit``, :mod:`impl.remote`) gets all but that many released again (:meth:`release_old`).
        self.order: list[int] = []
        self.checks = Integrity(self.records, self.file_doc_starts, functools.partial(file_where, path),
                                self.mapped, self.map, self.require_open,
                                getattr(files, "refused", None))   # a remote access drops a refused copy
        self.blocks = self.checks.files

    def where(self, name: str) -> str:
        return file_where(self.path, name)

    def require_open(self) -> None:
        if self.closed:
            raise StoreError(
                f"token store {self.path} is closed; open it again with TokenStore.open({str(self.path)!r}) "
                "(views of documents read before close() stay valid)"
            )

    def close(self) -> None:
        """Release every mapping; any later map raises :class:`StoreError`."""
        with self.lock:
            self.closed = True
            self.mapped[:] = [None] * len(self.records)
            self.checks.forget()
            self.order = []
            self.tables = {}
            self.documents_verified = None

    # ------------------------------------------------------------ mapping

    def map(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s (values, offsets) views, mapped on first use; the offsets' blocks are **not** checked yet.

        Readers read offsets only through :meth:`part` (all of them checked)
        or ``document_bounds`` (the entries asked for); values only after
        ``check_blocks``.
        """
        mapped = self.mapped[f]
        if mapped is None:
            with self.lock:
                self.require_open()
                mapped = self.mapped[f]
                if mapped is None:
                    mapped = self.mapped[f] = self.map_file(self.records[f])
                    self.release_old(f)
        return mapped

    def part(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s (values, offsets), mapped on first use, every block of its offsets checked."""
        mapped = self.mapped[f]
        if mapped is None:
            mapped = self.map(f)
        blocks = self.blocks[f]
        if blocks is not None and not blocks.offsets_done:
            self.checks.check_all_offsets(f, blocks, mapped[1])
        return mapped

    def offsets_of(self, f: int) -> np.ndarray:
        """File ``f``'s document offsets, every entry checked: read by range when the access can and ``f`` is unmapped.

        Why: a plan needs every file's offsets, and a remote store would
        otherwise download each token file whole to read a few KiB of it,
        then again in the epoch's own order (about twice the store). An
        access with ``read_range(name, start, stop)`` (:class:`impl.remote.RemoteFiles`)
        reads only the blocks holding the offsets of a format-2+ file with a
        recorded layout; each block is checked against its recorded CRC-32
        before an entry is used, and the entries must start at 0 and end at
        the recorded token count. Any other file is mapped (:meth:`part`).

        >>> maps.offsets_of(1)          # doctest: +SKIP
        array([0, 3, 4, 7])
        """
        read_range = getattr(self.files, "read_range", None)
        rec = self.records[f]
        if self.mapped[f] is not None or read_range is None or self.version < 2 or rec.buffers is None:
            return self.part(f)[1]
        docs = rec.num_documents
        if docs == 0 and isinstance(rec.buffers, Mapping) and rec.buffers.get("offsets") == [0, 0]:
            return _one_zero()
        nbytes = (docs + 1) * OFFSET_BYTES
        at = self.recorded_buffer(rec, "offsets", nbytes, OFFSET_BYTES)
        block = self.block_bytes
        first, last = at // block, (at + nbytes - 1) // block
        lo, hi = first * block, min((last + 1) * block, rec.size)
        raw = read_range(rec.name, lo, hi)
        where = self.where(rec.name)
        fix = (f"the object {self.files.where(rec.name)} differs from what was built: restore it from a good copy "
               f"or {REBUILD_HINT}")
        if len(raw) != hi - lo:
            raise StoreCorruptError(f"{where}: a read of bytes {lo}-{hi - 1} returned {len(raw)} bytes; {fix}")
        if self.version >= 3:
            table = self.crc_table(BLOCK_TABLE, self.table_at[-1])
            recorded = [int(table.item(self.table_at[f] + b)) for b in range(first, last + 1)]
        else:
            try:
                recorded = [int.from_bytes(bytes.fromhex((rec.block_crc32 or "")[8 * b:8 * b + 8]), "big")
                            for b in range(first, last + 1)]   # each 8 digits long: checked at open
            except ValueError:
                raise StoreCorruptError(f"{where}: its block_crc32 in {META_FILE} is not hexadecimal; "
                                        f"{REBUILD_HINT}") from None
        view = memoryview(raw)
        for b, want in zip(range(first, last + 1), recorded):
            got = crc32(view[b * block - lo:min((b + 1) * block, hi) - lo])
            if got != want:
                raise StoreCorruptError(
                    f"{where} changed since it was built: block {b} (bytes {b * block}-{min((b + 1) * block, hi) - 1} "
                    f"of {rec.size}, read by range for its document offsets) has CRC-32 {got:08x}, {want:08x} when "
                    f"built, so none of its offsets is used; {fix}")
        offsets = np.frombuffer(raw, dtype="<i8", count=docs + 1, offset=at - lo)
        if int(offsets[0]) != 0 or int(offsets[-1]) != rec.num_tokens:
            raise StoreCorruptError(
                f"{where}: document offsets do not match the {rec.num_tokens} tokens recorded; {REBUILD_HINT}")
        return offsets

    def release_old(self, f: int) -> None:
        """Drop the mappings of all but the ``keep_mapped`` files mapped last (under ``lock``).

        Why: a remote access evicts from its bounded node cache only files no
        reader maps, so a store that kept every file it ever read mapped
        would pin the whole store there. A released file is mapped (and CRC'd:
        its verified marks go with it, as the next copy may be a new download)
        again on its next use; views already handed out keep their own
        mapping. Meant for a store object read from one thread at a time.
        """
        keep = getattr(self.files, "keep_mapped", None)
        order = self.order
        order.append(f)
        if keep is None:
            return
        while len(order) > max(1, int(keep)):
            g = order.pop(0)
            blocks, self.mapped[g], self.blocks[g] = self.blocks[g], None, None   # in place: shared with checks
            self.checks.all_verified = False
            if blocks is not None:
                blocks.reset()

    def map_file(self, rec: FileRecord) -> tuple[np.ndarray, np.ndarray]:
        """Map one file: straight from its recorded buffer layout (format 2+), else through Arrow."""
        if self.version >= 2 and rec.buffers is not None:
            return self.map_direct(rec)
        values, offsets, whole, layout = self.map_arrow(rec, signature=True)
        if whole is not None:
            self.blocks[self.file_index[rec.name]] = self.new_blocks(
                rec, memoryview(whole), layout["values"][0], layout["offsets"][0])
        return values, offsets

    def new_blocks(self, rec: FileRecord, data: memoryview, values_at: int, offsets_at: int) -> FileChecks:
        """File ``rec``'s block checks; its offsets hold ``documents + 1`` entries (none when recorded at 0: empty)."""
        recorded = documents = verified = readable = None
        if self.version >= 3:
            f = self.file_index[rec.name]
            recorded = self.crc_table(BLOCK_TABLE, self.table_at[-1])[self.table_at[f]:self.table_at[f + 1]]
            if self.version >= 4:
                a, b = self.file_doc_starts[f], self.file_doc_starts[f + 1]
                documents = self.crc_table(DOCUMENT_TABLE, self.n)[a:b]
                if self.documents_verified is None:
                    self.documents_verified = demand_zero(self.n)
                verified = memoryview(self.documents_verified)[a:b]
                readable = self.checks.readable.rows(a, b)
        return FileChecks(data, values_at, self.dtype.itemsize, self.block_bytes, rec.block_crc32 or "", offsets_at,
                          recorded, 0 if rec.num_documents == 0 and offsets_at == 0 else (rec.num_documents + 1) * OFFSET_BYTES,
                          documents, verified, readable)

    def crc_table(self, name: str, entries: int) -> np.ndarray:
        """CRC table ``name``'s ``entries`` recorded CRC-32s (big-endian uint32), one read-only mapping made on first use."""
        table = self.tables.get(name)
        if table is None:
            mm = map_read_only(self.files, name, crc_table_where(self.path, name), 4 * entries)
            table = self.tables[name] = np.frombuffer(mm, dtype=">u4")
        return table

    def map_direct(self, rec: FileRecord) -> tuple[np.ndarray, np.ndarray]:
        """One ``mmap`` and two views at the recorded byte offsets: no Arrow footer parse, no quick signature.

        Why no quick signature: every byte used is block-checked before it is
        used (offsets by ``document_bounds``/:meth:`part`, values by
        ``check_blocks``), and the Arrow metadata is not used.
        """
        item = self.dtype.itemsize
        docs = rec.num_documents
        no_offsets = docs == 0 and isinstance(rec.buffers, Mapping) and rec.buffers.get("offsets") == [0, 0]
        offsets_at = self.recorded_buffer(rec, "offsets", 0 if no_offsets else (docs + 1) * OFFSET_BYTES, OFFSET_BYTES)
        values_at = self.recorded_buffer(rec, "values", rec.num_tokens * item, item)
        mm = map_read_only(self.files, rec.name, self.where(rec.name), rec.size)
        offsets = _one_zero() if no_offsets else np.frombuffer(mm, dtype="<i8", count=docs + 1, offset=offsets_at)
        values = np.frombuffer(mm, dtype=self.dtype, count=rec.num_tokens, offset=values_at)
        self.blocks[self.file_index[rec.name]] = self.new_blocks(rec, memoryview(mm), values_at, offsets_at)
        return values, offsets

    def map_arrow(self, rec: FileRecord, *, signature: bool
                  ) -> tuple[np.ndarray, np.ndarray, pa.Buffer | None, dict[str, list[int]]]:
        """Map through Arrow, checking footer, schema, counts and end offsets: ``(values, offsets, whole, layout)``.

        The path of format-1 files, of later files recorded without a buffer
        layout (``signature``: their quick signature first, since the Arrow
        metadata read here is not block-checked), and of :meth:`verify`.
        """
        where = self.where(rec.name)
        self.check_file(rec, content=signature)
        try:
            col, whole = _open_arrow(map_read_only(self.files, rec.name, where, rec.size), self.files.where(rec.name))
        except StoreCorruptError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise StoreCorruptError(f"{where} is not a readable Arrow file ({exc}); {REBUILD_HINT}") from exc
        expected = arrow_type(self.dtype)
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
        layout = buffer_layout(self.files.where(rec.name), col, whole)
        offsets = col.offsets.to_numpy(zero_copy_only=True)
        if len(offsets) == 0:  # Arrow may store a 0-length list array with no offsets at all
            offsets = _one_zero()
        values = col.values.to_numpy(zero_copy_only=True)
        if (len(offsets) != rec.num_documents + 1 or int(offsets[0]) != 0
                or int(offsets[-1]) != rec.num_tokens or len(values) != rec.num_tokens):
            raise StoreCorruptError(
                f"{where}: document offsets do not match the {rec.num_tokens} tokens recorded; {REBUILD_HINT}"
            )
        return values, offsets, (whole if self.version >= 2 else None), layout

    # ------------------------------------------------------------ what the record promises

    def check_record_blocks(self, rec: FileRecord) -> None:
        """A format-2 record carries one 8-hex-digit CRC per block of its recorded size."""
        blocks = -(-rec.size // self.block_bytes)
        crcs = rec.block_crc32
        if not isinstance(crcs, str) or len(crcs) != 8 * blocks:
            got = "none" if not isinstance(crcs, str) else f"{len(crcs) // 8} block checksums"
            raise StoreCorruptError(
                f"{self.where(rec.name)}: {META_FILE} records {got}, expected {blocks} ({rec.size} bytes in "
                f"blocks of {self.block_bytes}); {REBUILD_HINT}"
            )

    def check_file(self, rec: FileRecord, *, content: bool) -> None:
        """Present with the recorded size (open); with ``content``, also the recorded quick signature (first map).

        Why the signature waits for the first map: it reads 128 KiB per file,
        so checking every file at open would make open cost O(files). Checked
        at first map, before any of the file's tokens is returned, a changed
        file is refused just the same, and each process pays only for the
        files it reads.
        """
        name = rec.name
        if not name or "/" in name or name in (".", ".."):
            raise StoreCorruptError(f"{self.where(name)}: invalid file name in {META_FILE}; {REBUILD_HINT}")
        st = self.files.stat(name)
        if st is None:
            raise StoreCorruptError(f"{self.where(name)} is missing; {REBUILD_HINT}")
        if st.size == rec.size and not content:
            return
        where = self.where(name)
        if st.size < rec.size:
            raise StoreCorruptError(f"{where} is truncated ({st.size} bytes, {rec.size} when built); {REBUILD_HINT}")
        if st.size != rec.size:
            raise StoreCorruptError(
                f"{where} changed since it was built ({st.size} bytes, {rec.size} when built); {REBUILD_HINT}"
            )
        if content and quick_signature_of(self.files, name) != rec.quick_signature:
            raise StoreCorruptError(
                f"{where} changed since it was built (its first/last {QUICK_SIGNATURE_BYTES // 1024} KiB differ "
                f"from the recorded signature); {REBUILD_HINT}"
            )

    def recorded_buffer(self, rec: FileRecord, name: str, nbytes: int, align: int) -> int:
        """Byte offset of the recorded buffer ``name``, refused unless it has ``nbytes`` bytes inside the file."""
        span = rec.buffers.get(name) if isinstance(rec.buffers, Mapping) else None
        ok = (isinstance(span, list) and len(span) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in span))
        if ok:
            at, n = span  # type: ignore[misc]
            ok = n == nbytes and 0 <= at and at + n <= rec.size and at % align == 0
        if not ok:
            raise StoreCorruptError(
                f"{self.where(rec.name)}: {META_FILE} records its {name} buffer at {span!r}, not {nbytes} bytes "
                f"(aligned to {align}) inside its {rec.size} bytes; {REBUILD_HINT}"
            )
        return int(at)

    # ------------------------------------------------------------ the full check

    def verify(self, meta: dict[str, Any]) -> None:
        """Every check the store records, over every byte: see :meth:`impl.store.TokenStore.verify`."""
        self.require_open()
        t = meta["tokenizer"]
        options = meta.get("options") or {}
        expected = _content_fingerprint([r.sha256 for r in self.records], meta["dtype"], t.get("sha256", ""),
                                        options.get("add_bos", False), options.get("add_eos", True),
                                        format_version=self.version)
        recorded_fingerprint = str(meta["fingerprint"])
        if expected != recorded_fingerprint:
            raise StoreCorruptError(
                f"token store {self.path}: {META_FILE} fingerprint {recorded_fingerprint[:16]}... does not match "
                f"the one recomputed from its file records and options ({expected[:16]}...): {META_FILE} was "
                f"edited; {REBUILD_HINT}"
            )
        for spec in CRC_TABLES:
            if self.version < spec.since:
                continue
            recorded = meta["layout"][spec.key]["sha256"]
            digest = sha256_of(self.files, spec.name)
            if digest != recorded:
                raise StoreCorruptError(
                    f"{crc_table_where(self.path, spec.name)} changed since it was built (sha256 "
                    f"{digest[:16]}..., recorded {str(recorded)[:16]}...): the {spec.entry} checks cannot be "
                    f"trusted; {REBUILD_HINT}"
                )
        self.checks.all_verified = False
        for f, rec in enumerate(self.records):
            self.map(f)
            blocks = self.blocks[f]
            if blocks is None:
                digest = sha256_of(self.files, rec.name)
            else:
                blocks.reset()
                self.checks.verify_span(rec, blocks, 0, blocks.count - 1)
                digest = hashlib.sha256(blocks.data).hexdigest()
            if digest != rec.sha256:
                raise StoreCorruptError(
                    f"{self.where(rec.name)} changed since it was built (sha256 {digest[:16]}..., "
                    f"recorded {rec.sha256[:16]}...); {REBUILD_HINT}"
                )
            if self.version >= 2 and rec.buffers is not None:
                layout = self.map_arrow(rec, signature=True)[3]
                if dict(rec.buffers) != layout:
                    raise StoreCorruptError(
                        f"{self.where(rec.name)}: {META_FILE} records its buffers at {dict(rec.buffers)}, but the "
                        f"Arrow file holds them at {layout}; {META_FILE} was edited; {REBUILD_HINT}"
                    )
            offsets = self.part(f)[1]
            if len(offsets) > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
                raise StoreCorruptError(f"{self.where(rec.name)} has decreasing document offsets; {REBUILD_HINT}")
            if blocks is not None and blocks.documents is not None and rec.num_documents:
                bounds = offsets.tolist()
                self.checks.verify_documents([(f, d, bounds[d], bounds[d + 1]) for d in range(rec.num_documents)])


class FileViews:
    """A store's per-file token values (``which=0``) or offsets (``which=1``), each mapped on first use.

    Why lazy: opening a store should cost metadata and a few bytes per file, not
    an Arrow footer parse per file; a file is mapped and its layout validated
    the first time any of its tokens or offsets is needed.
    """

    __slots__ = ("_maps", "which")

    def __init__(self, maps: StoreFiles, which: int) -> None:
        self._maps = weakref.ref(maps)   # no cycle: a dropped store is freed, and its files unmapped, at once
        self.which = which

    @property
    def maps(self) -> StoreFiles:
        maps = self._maps()
        if maps is None:
            raise StoreError("the TokenStore these files belong to was dropped; keep a reference to it while reading")
        return maps

    def __getitem__(self, f: int) -> np.ndarray:
        return self.maps.part(f)[self.which]

    def __len__(self) -> int:
        return len(self.maps.mapped)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[f] for f in range(len(self)))


def _one_zero() -> np.ndarray:
    """The offsets of a file with no documents: ``[0]``, read-only."""
    offsets = np.zeros(1, dtype=np.int64)
    offsets.setflags(write=False)
    return offsets
