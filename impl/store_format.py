"""The token store's on-disk format, described once: what the writer (:mod:`impl.build`) writes and the reader checks.

Why a module of its own: the writer and the reader (:mod:`impl.store`) must
agree on every file name, every ``meta.json`` key, the format versions, the
CRC tables and the content fingerprint. Kept here, each fact has one owner
that both import, and neither imports the other's internals.

On-disk layout of ``out_dir``::

    meta.json            format name/version, counts, per-file records,
                         fingerprint, tokenizer identity, build options
    blocks.crc32         format 3: every block's CRC-32, big-endian uint32
    documents.crc32      format 4: every document's CRC-32, big-endian uint32
    tokens-00000.arrow   Arrow IPC file: one record batch, one column
    tokens-00001.arrow   ``tokens: large_list<uint16 | uint32>``; row = document,
    ...                  the list offsets (int64) are the document boundaries

Format 4 (:data:`FORMAT_VERSION`, what the builder writes) is format 3 plus per-document checksums:

* ``documents.crc32`` (:data:`DOCUMENT_TABLE`): the CRC-32 of each
  document's token bytes (its values as stored, little-endian), big-endian,
  in store order (file ``f``'s documents are entries
  ``file_document_starts[f]:file_document_starts[f + 1]``); an empty
  document's is 0. ``layout.document_table`` records its name, size and
  sha256 (``open`` checks the size, :meth:`TokenStore.verify` the sha256
  and every entry). :meth:`TokenStore.document_bounds` and
  :meth:`TokenStore.document_bounds_batch` check each document they return
  on its first read, unless its file's blocks are all verified, so the
  packing fill path, which copies only tokens of documents it located
  there, needs no block check (:attr:`TokenStore.document_checks`).
* Why: under a global shuffle, or in a resumed process's first batch, each
  document lies in its own 16 KiB block that no reader has verified yet;
  for a 1.3 KB document (the benchmark corpus's mean) a block check reads
  12x the bytes served, from cold memory. A document's CRC reads exactly the bytes the copy then reads,
  and also covers the offsets it was read at: a changed offsets entry moves
  the range of the two documents it bounds, whose CRCs then fail. Readers
  of token ranges (``read``, ``gather``, ``__getitem__``, iteration) and
  documents close together in a file (file order) keep the block checks
  and their read-ahead.

Format 3:

* block checksums: the CRC-32 (``zlib.crc32``'s checksum, computed with
  ISA-L's: :mod:`impl._crc`) of each ``layout.block_bytes``
  block of each file's bytes (16 KiB; ``layout.block_checksum`` is
  ``"crc32"``), big-endian, in :data:`BLOCK_TABLE`, file after file in the
  order of ``files`` (file ``f`` holds ``ceil(size / block_bytes)``
  entries). ``layout.block_table`` records the table's name, size and
  sha256: ``open`` checks its size, :meth:`TokenStore.verify` its sha256,
  and a reader maps it on first use and reads only the entries of the
  blocks it checks. Why a table and 16 KiB: format 2 keeps the CRCs as hex in
  ``meta.json`` (8 characters per 64 KiB block, all parsed by every
  ``open``, so ``open`` grows with the store), and a fresh resume's first
  batch CRCs a block of offsets and one of tokens for each of its few dozen
  documents: 16 KiB blocks cut those bytes by 4 while ``open`` parses a
  small ``meta.json``.
* ``buffers`` per file record: ``{"offsets": [byte, length], "values":
  [byte, length]}``, where the document offsets (little-endian int64) and
  the token values lie in the file (:func:`arrow_buffer_layout`, read with
  pyarrow at build). A file is mapped with one ``mmap`` and two
  ``np.frombuffer`` views, without parsing its Arrow footer or reading a
  quick signature: every byte used is block-checked first, the Arrow
  metadata is not used, and :meth:`TokenStore.verify` compares the recorded
  layout with the one Arrow reads. A record outside the file's bounds, of
  the wrong length or misaligned is refused as corrupt.

Format 3 stores open and read with the block checks alone (every
run the fill path copies goes through :meth:`TokenStore.check_blocks`);
rebuilding one adds the per-document checks. Format 2 stores open
and read with the same checks: each record
carries its block CRCs as one hex string (``block_crc32``, 8 digits a block,
parsed per block when it is checked; 64 KiB or 1 MiB blocks, as recorded), a
record without ``buffers`` is mapped through Arrow after its quick
signature. Format 1 stores (no block checksums) open and read,
checked by their quick signatures at map time and by a full
:meth:`TokenStore.verify`; rebuilding one adds the per-block check of every
read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from impl._crc import crc32
from impl.errors import REBUILD_HINT, ConfigError, StoreCorruptError, StoreVersionError
from impl.files import FileAccess, map_read_only

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_TABLE",
    "COLUMN",
    "CRC_TABLES",
    "DEFAULT_DOCS_PER_FILE",
    "DOCUMENT_TABLE",
    "FILE_TEMPLATE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_FILE",
    "OFFSET_BYTES",
    "QUICK_SIGNATURE_BYTES",
    "READABLE_FORMAT_VERSIONS",
    "BuildOptions",
    "CrcTable",
    "FileRecord",
    "arrow_buffer_layout",
    "arrow_type",
    "buffer_layout",
    "check_crc_table_size",
    "content_fingerprint",
    "crc_table_where",
    "hash_documents",
    "hash_file_blocks",
    "open_arrow",
    "open_arrow_buffer",
    "quick_signature",
    "quick_signature_of",
    "sha256_file",
    "sha256_of",
    "take_crc_tables",
    "validate_meta",
]

FORMAT_NAME = "loadspec.tokenstore"
FORMAT_VERSION = 4
#: Versions this loadspec opens: 1 (no block checksums), 2 (block CRCs as hex in meta.json), 3 (a binary table)
#: and 4 (the block table plus one CRC-32 per document).
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)
META_FILE = "meta.json"
COLUMN = "tokens"
FILE_TEMPLATE = "tokens-{:05d}.arrow"
#: Documents per token file unless ``docs_per_file`` says otherwise. Fixed (not
#: derived from the CPU count) so a build is reproducible on any machine.
DEFAULT_DOCS_PER_FILE = 65536
#: Bytes hashed at each end of a file by the open-time quick signature.
QUICK_SIGNATURE_BYTES = 64 * 1024
#: Bytes of a token file covered by one CRC-32 in the stores the builder writes (the last block may be shorter).
BLOCK_BYTES = 16 * 1024
#: Format 3: the file holding every token file's block CRC-32s, big-endian uint32, file after file.
BLOCK_TABLE = "blocks.crc32"
#: Format 4: the file holding every document's CRC-32 (of its token bytes), big-endian uint32, in store order.
DOCUMENT_TABLE = "documents.crc32"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrcTable:
    """One binary table of CRC-32s: the first format with it, its ``layout`` key, file, entry and record field.

    ``field`` is the hex string a file's writer returns in its record
    (:func:`take_crc_tables` moves it into the table before ``meta.json`` is written).
    """

    since: int
    key: str
    name: str
    entry: str
    field: str


#: The store's CRC tables, in the order they are checked (open, ``verify``) and written (build).
CRC_TABLES = (CrcTable(since=3, key="block_table", name=BLOCK_TABLE, entry="block", field="block_crc32"),
              CrcTable(since=4, key="document_table", name=DOCUMENT_TABLE, entry="document", field="document_crc32"))
#: Bytes of one document offset (little-endian int64, as Arrow's large_list stores them).
OFFSET_BYTES = 8
_READ_CHUNK = 1 << 20


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Options that determine a store's content (recorded in ``meta.json``).

    ``num_proc`` and ``progress`` are deliberately absent: they change how fast
    a store is built, never what it contains.
    """

    text_field: str = "text"
    add_bos: bool = False
    add_eos: bool = True
    batch_size: int = 1000
    docs_per_file: int = DEFAULT_DOCS_PER_FILE

    def __post_init__(self) -> None:
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ConfigError(f"text_field={self.text_field!r}: must be a non-empty column name such as 'text'")
        for name in ("add_bos", "add_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be True or False")
        for name in ("batch_size", "docs_per_file"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: must be an integer >= 1")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileRecord:
    """One token file as recorded at build time (what :meth:`TokenStore.open` checks)."""

    name: str
    num_documents: int
    num_tokens: int
    num_empty_documents: int
    size: int
    sha256: str
    quick_signature: str
    #: Format 2: big-endian CRC-32 of each :data:`BLOCK_BYTES` block of the file, as hex (8 digits a block).
    block_crc32: str | None = None
    #: Format 2: where the Arrow buffers lie in the file, ``{"offsets": [byte, length], "values": [byte, length]}``
    #: (see :func:`arrow_buffer_layout`); lets the first map skip the Arrow footer parse.
    buffers: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in _OPTIONAL_FIELDS:
            if out[name] is None:
                del out[name]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FileRecord:
        return cls(**{name: obj[name] for name in _RECORD_FIELDS}, block_crc32=obj.get("block_crc32"),
                   buffers=obj.get("buffers"))


_OPTIONAL_FIELDS = ("block_crc32", "buffers")
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(FileRecord) if f.name not in _OPTIONAL_FIELDS)


# --------------------------------------------------------------------------- hashing


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Full sha256 of a file (reads all of it: used at build and by ``verify``)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_READ_CHUNK)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def hash_file_blocks(path: str | os.PathLike[str], block_bytes: int = BLOCK_BYTES) -> tuple[str, str]:
    """``(sha256, block_crc32)`` of a file in one read: the build's record of its content.

    ``block_crc32`` is the big-endian CRC-32 (``zlib.crc32``) of each
    ``block_bytes`` block of the file's bytes, as hex, 8 digits a block.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     _ = f.write(b"abc" * 3)
    ...     _ = f.flush()
    ...     crcs = hash_file_blocks(f.name, block_bytes=4)[1]
    >>> crcs                               # blocks b"abca", b"bcab", b"c"
    '9de8399e25a0cf7f06b9df6f'
    >>> import zlib                        # the same CRC-32 as zlib's (computed with ISA-L: impl._crc)
    >>> crcs[:8] == f"{zlib.crc32(b'abca'):08x}"
    True
    """
    h = hashlib.sha256()
    crcs = bytearray()
    chunk = max(block_bytes, _READ_CHUNK // block_bytes * block_bytes)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            while n and n < chunk:
                more = f.readinto(view[n:])
                if not more:
                    break
                n += more
            if not n:
                break
            h.update(view[:n])
            for a in range(0, n, block_bytes):
                crcs += crc32(view[a:min(a + block_bytes, n)]).to_bytes(4, "big")
            if n < chunk:
                break
    return h.hexdigest(), crcs.hex()


def hash_documents(path: str | os.PathLike[str], values_at: int, offsets: np.ndarray, itemsize: int) -> str:
    """The CRC-32 of each document's token bytes in a written file, big-endian, as hex (8 digits a document).

    ``values_at`` is the byte offset of the file's token values, ``offsets``
    its document offsets (``documents + 1`` entries, in tokens). Read from
    the file, not from the tokens in memory, so the record is of what is on
    disk, as :func:`hash_file_blocks`'s.

    >>> import tempfile, zlib
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     _ = f.write(b"HDR" + bytes([1, 0, 2, 0, 3, 0]))
    ...     _ = f.flush()
    ...     crcs = hash_documents(f.name, 3, np.array([0, 2, 2, 3]), 2)
    >>> crcs[:8] == f"{zlib.crc32(bytes([1, 0, 2, 0])):08x}", crcs[8:16], crcs[16:] == f"{zlib.crc32(bytes([3, 0])):08x}"
    (True, '00000000', True)
    """
    bounds = (values_at + np.asarray(offsets, dtype=np.int64) * itemsize).tolist()
    if len(bounds) < 2:
        return ""
    out = bytearray()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data, memoryview(data) as view:
        for a, b in itertools.pairwise(bounds):
            out += crc32(view[a:b]).to_bytes(4, "big")
    return out.hex()


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def quick_signature(path: str | os.PathLike[str], size: int | None = None) -> str:
    """sha256 of (size, first 64 KiB, last 64 KiB): an O(1) "unchanged since build" check.

    Reads at most ``2 * QUICK_SIGNATURE_BYTES`` bytes whatever the file size, so
    opening a 100M-token store costs what opening a 1k-token one does. It
    catches truncation, appends, rewrites and edits of the Arrow header/footer
    (where the schema, the record-batch layout and the file magic live); an
    edit in the middle of a large file is caught by the block checksums of
    formats 2 to 4 on the first read of its block (format 1: only by ``verify``).
    The writer signs a path; readers sign through their file access
    (:func:`quick_signature_of`), to the same value.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        if size is None:
            size = os.fstat(fd).st_size
        if size <= 2 * QUICK_SIGNATURE_BYTES:
            return _signature(size, _pread_all(fd, size, 0), b"")
        return _signature(size, _pread_all(fd, QUICK_SIGNATURE_BYTES, 0),
                          _pread_all(fd, QUICK_SIGNATURE_BYTES, size - QUICK_SIGNATURE_BYTES))
    finally:
        os.close(fd)


def quick_signature_of(files: FileAccess, name: str) -> str:
    """:func:`quick_signature` of file ``name`` read through ``files`` (its mapping: only the two windows are touched)."""
    data = files.map(name)
    size = len(data)
    if size <= 2 * QUICK_SIGNATURE_BYTES:
        return _signature(size, data[:], b"")
    return _signature(size, data[:QUICK_SIGNATURE_BYTES], data[size - QUICK_SIGNATURE_BYTES:])


def _signature(size: int, head: bytes, tail: bytes) -> str:
    h = hashlib.sha256()
    h.update(b"loadspec-quick-signature-v1\0")
    h.update(int(size).to_bytes(8, "little"))
    h.update(head)
    h.update(tail)
    return h.hexdigest()


def sha256_of(files: FileAccess, name: str) -> str:
    """Full sha256 of file ``name`` read through ``files`` (:meth:`TokenStore.verify`)."""
    return hashlib.sha256(files.map(name)).hexdigest()


def content_fingerprint(file_sha256s: Sequence[str], dtype: str, tokenizer_sha256: str,
                         add_bos: bool, add_eos: bool, format_version: int = FORMAT_VERSION) -> str:
    payload = {
        "format": FORMAT_NAME,
        "format_version": format_version,
        "files": list(file_sha256s),
        "dtype": dtype,
        "tokenizer": tokenizer_sha256,
        "add_bos": add_bos,
        "add_eos": add_eos,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- token files


def arrow_type(dtype: np.dtype) -> pa.DataType:
    return pa.large_list(pa.from_numpy_dtype(dtype))


def open_arrow(path: str | os.PathLike[str]) -> tuple[pa.LargeListArray, pa.Buffer]:
    """The token column of a one-batch Arrow IPC file and the whole file as one mapped buffer."""
    return open_arrow_buffer(map_read_only(os.fspath(path)), os.fspath(path))


def open_arrow_buffer(data: mmap.mmap | bytes, where: str) -> tuple[pa.LargeListArray, pa.Buffer]:
    """:func:`open_arrow` of a file already mapped (by a :class:`~impl.files.FileAccess`); ``where`` names it.

    Zero-copy: the column's buffers are slices of ``whole``, the mapping
    itself, which Arrow keeps alive while any of them is referenced.
    """
    whole = pa.py_buffer(data)
    reader = pa.ipc.open_file(pa.BufferReader(whole))
    if reader.num_record_batches != 1:
        raise StoreCorruptError(f"{where}: {reader.num_record_batches} record batches, expected 1; {REBUILD_HINT}")
    batch = reader.get_batch(0)
    if batch.num_columns != 1 or not pa.types.is_large_list(batch.column(0).type):
        raise StoreCorruptError(f"{where}: schema {batch.schema} is not one large_list column; {REBUILD_HINT}")
    return batch.column(0), whole


def buffer_layout(path: str | os.PathLike[str], col: pa.LargeListArray, whole: pa.Buffer) -> dict[str, list[int]]:
    """``{"offsets": [byte, length], "values": [byte, length]}`` of ``col``'s buffers inside ``whole``."""
    base, size = int(whole.address), whole.size

    def span(buf: pa.Buffer | None, nbytes: int) -> list[int]:
        if buf is None or nbytes == 0:
            return [0, 0]
        start = int(buf.address) - base
        if not 0 <= start <= start + nbytes <= size:
            raise StoreCorruptError(f"{path}: an Arrow buffer lies outside the file; {REBUILD_HINT}")
        return [start, nbytes]

    item = col.type.value_type.bit_width // 8
    offsets_buf = col.buffers()[1]
    return {
        "offsets": span(offsets_buf, 0 if offsets_buf is None else (len(col) + 1) * OFFSET_BYTES),
        "values": span(col.values.buffers()[1], len(col.values) * item),
    }


def arrow_buffer_layout(path: str | os.PathLike[str]) -> dict[str, list[int]]:
    """Where a token file's document offsets and token values lie: ``{"offsets": [byte, length], "values": [...]}``.

    Read once at build with pyarrow and recorded in the file's
    ``meta.json`` record (``buffers``), so the first map of a format-2 file
    is one ``mmap`` and two ``np.frombuffer`` views, with no Arrow footer
    parse; :meth:`TokenStore.verify` reads it again and compares. The file
    stays an ordinary Arrow IPC file. Offsets are int64 (``(documents + 1) *
    8`` bytes; ``[0, 0]`` when Arrow stored none for an empty file), values
    ``tokens * itemsize`` bytes; both little-endian, as Arrow writes them.

    >>> import tempfile
    >>> col = pa.array([[1, 2], [3]], type=pa.large_list(pa.uint16()))
    >>> with tempfile.NamedTemporaryFile(suffix=".arrow") as f:
    ...     with pa.ipc.new_file(f.name, pa.schema([("tokens", col.type)])) as w:
    ...         w.write_batch(pa.record_batch([col], names=["tokens"]))
    ...     layout = arrow_buffer_layout(f.name)
    ...     data = open(f.name, "rb").read()
    >>> at, n = layout["offsets"]
    >>> np.frombuffer(data[at:at + n], "<i8").tolist(), layout["values"][1]
    ([0, 2, 3], 6)
    """
    col, whole = open_arrow(path)
    return buffer_layout(path, col, whole)


# --------------------------------------------------------------------------- meta validation


_META_INT_KEYS = ("num_documents", "num_tokens", "num_empty_documents")


def validate_meta(root: str | os.PathLike[str], meta: Any) -> None:
    if not isinstance(meta, dict):
        raise StoreCorruptError(f"{root}/{META_FILE}: not a JSON object; {REBUILD_HINT}")
    if meta.get("format") != FORMAT_NAME:
        raise StoreCorruptError(
            f"{root}/{META_FILE}: format is {meta.get('format')!r}, not {FORMAT_NAME!r}: this directory is not a "
            f"loadspec token store; {REBUILD_HINT}"
        )
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreVersionError(
            f"{root}: format_version {version!r} is not an integer; this loadspec reads format version "
            f"{FORMAT_VERSION}: {REBUILD_HINT}"
        )
    if version > FORMAT_VERSION:
        raise StoreVersionError(
            f"{root}: token store format version {version} is newer than this loadspec supports (version "
            f"{FORMAT_VERSION}): upgrade loadspec, or {REBUILD_HINT}"
        )
    if version not in READABLE_FORMAT_VERSIONS:
        raise StoreVersionError(
            f"{root}: token store format version {version} is unknown (this loadspec reads versions "
            f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))}, writes version {FORMAT_VERSION}): {REBUILD_HINT}"
        )
    problems = []
    if meta.get("dtype") not in ("uint16", "uint32"):
        problems.append(f"dtype {meta.get('dtype')!r}")
    for key in _META_INT_KEYS:
        if isinstance(meta.get(key), bool) or not isinstance(meta.get(key), int) or meta[key] < 0:
            problems.append(f"{key} {meta.get(key)!r}")
    if not isinstance(meta.get("files"), list):
        problems.append("files")
    if not isinstance(meta.get("fingerprint"), str):
        problems.append("fingerprint")
    if not isinstance(meta.get("tokenizer"), dict):
        problems.append("tokenizer")
    layout: dict[str, Any] = meta["layout"] if isinstance(meta.get("layout"), dict) else {}
    if version >= 2:
        block = layout.get("block_bytes")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            problems.append(f"layout.block_bytes {block!r}")
    for spec in CRC_TABLES:
        table = layout.get(spec.key)
        if version >= spec.since and not (
                isinstance(table, dict) and table.get("name") == spec.name and isinstance(table.get("sha256"), str)
                and isinstance(table.get("size"), int) and not isinstance(table.get("size"), bool)):
            problems.append(f"layout.{spec.key} {table!r}")
    if problems:
        raise StoreCorruptError(f"{root}/{META_FILE}: invalid {', '.join(problems)}; {REBUILD_HINT}")


# --------------------------------------------------------------------------- CRC tables


def take_crc_tables(meta: dict[str, Any]) -> list[tuple[CrcTable, bytes]]:
    """The records' block CRCs and (format 4) document CRCs, hex as the file writers return them, moved into tables.

    Pops each record's ``spec.field`` and records each table's name, size and
    sha256 in ``meta["layout"]`` (the writer writes the returned bytes to
    ``spec.name`` before ``meta.json``). Why a table file: ``meta.json`` is
    parsed whole by every ``open``; as hex it carries 8 characters per block
    (so ``open`` grows with the store), while the table is mapped
    and only the entries of the blocks a process checks are read, so blocks
    can be small (cheap first reads) without slowing ``open``.

    >>> meta = {"files": [{"block_crc32": "0000000a", "document_crc32": "0000000b0000000c"}], "layout": {}}
    >>> [(spec.name, table.hex()) for spec, table in take_crc_tables(meta)]
    [('blocks.crc32', '0000000a'), ('documents.crc32', '0000000b0000000c')]
    >>> meta["files"], meta["layout"]["document_table"]["size"], meta["layout"]["document_checksum"]
    ([{}], 8, 'crc32')
    """
    out = []
    for spec in CRC_TABLES:
        table = b"".join(bytes.fromhex(record.pop(spec.field)) for record in meta["files"])
        out.append((spec, table))
        meta["layout"][spec.key] = {"name": spec.name, "size": len(table), "sha256": hashlib.sha256(table).hexdigest()}
    meta["layout"]["document_checksum"] = "crc32"
    return out


def crc_table_where(root: str | os.PathLike[str], name: str) -> str:
    """How messages name CRC table ``name`` of the store at ``root``."""
    return f"token store {root}: {name}"


def check_crc_table_size(files: FileAccess, root: str | os.PathLike[str], meta: Mapping[str, Any], spec: CrcTable, entries: int,
                         what: str) -> None:
    """At open (format 3, 4): table ``spec`` exists and holds one 4-byte CRC per entry (``entries`` ``what``).

    Reads no table byte: ``meta.json``'s recorded size and the file's size
    (``files.stat``) must both be ``4 * entries`` (the entries' content is
    checked when read).
    """
    expected, name = 4 * entries, spec.name
    recorded = meta["layout"][spec.key]["size"]
    if recorded != expected:
        raise StoreCorruptError(
            f"{root}/{META_FILE}: layout.{spec.key} records {recorded} bytes, but the store's "
            f"{entries} {what} need {expected}; {REBUILD_HINT}"
        )
    st = files.stat(name)
    if st is None:
        raise StoreCorruptError(f"{crc_table_where(root, name)} is missing; {REBUILD_HINT}")
    size = st.size
    if size != expected:
        raise StoreCorruptError(
            f"{crc_table_where(root, name)} {'is truncated' if size < expected else 'changed since it was built'} "
            f"({size} bytes, {expected} when built); {REBUILD_HINT}"
        )
