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

On-disk layout of ``out_dir``::

    meta.json            format name/version, counts, per-file records,
                         fingerprint, tokenizer identity, build options
    blocks.crc32         format 3: every block's CRC-32, big-endian uint32
    documents.crc32      format 4: every document's CRC-32, big-endian uint32
    tokens-00000.arrow   Arrow IPC file: one record batch, one column
    tokens-00001.arrow   ``tokens: large_list<uint16 | uint32>``; row = document,
    ...                  the list offsets (int64) are the document boundaries

Format 4 (this version) is format 3 plus per-document checksums:

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
  ~1.3 KB document lies in its own 16 KiB block that no reader has
  verified yet; a block check reads 12x the bytes served, from cold
  memory. A document's CRC reads exactly the bytes the copy then reads,
  and also covers the offsets it was read at: a changed offsets entry moves
  the range of the two documents it bounds, whose CRCs then fail. Readers
  of token ranges (``read``, ``gather``, ``__getitem__``, iteration) and
  documents close together in a file (file order) keep the block checks
  and their read-ahead.

Format 3:

* block checksums: the CRC-32 (``zlib.crc32``'s checksum, computed at
  ~10 GB/s with ISA-L's: :mod:`impl._crc`) of each ``layout.block_bytes``
  block of each file's bytes (16 KiB; ``layout.block_checksum`` is
  ``"crc32"``), big-endian, in :data:`BLOCK_TABLE`, file after file in the
  order of ``files`` (file ``f`` holds ``ceil(size / block_bytes)``
  entries). ``layout.block_table`` records the table's name, size and
  sha256: ``open`` checks its size, :meth:`TokenStore.verify` its sha256,
  and a reader maps it on first use and reads only the entries of the
  blocks it checks. Why a table and 16 KiB: format 2 kept the CRCs as hex in
  ``meta.json`` (170 KB to parse on every ``open`` of a 1.3 GB store at
  64 KiB blocks), and a fresh resume's first batch CRCs a block of offsets
  and one of tokens for each of its ~40 documents: 16 KiB blocks cut those
  bytes by 4 while ``open`` parses a small ``meta.json``.
* ``buffers`` per file record: ``{"offsets": [byte, length], "values":
  [byte, length]}``, where the document offsets (little-endian int64) and
  the token values lie in the file (:func:`arrow_buffer_layout`, read with
  pyarrow at build). A file is mapped with one ``mmap`` and two
  ``np.frombuffer`` views, without parsing its Arrow footer or reading a
  quick signature: every byte used is block-checked first, the Arrow
  metadata is not used, and :meth:`TokenStore.verify` compares the recorded
  layout with the one Arrow reads. A record outside the file's bounds, of
  the wrong length or misaligned is refused as corrupt.

Format 3 stores still open and read with the block checks alone (every
run the fill path copies goes through :meth:`TokenStore.check_blocks`);
rebuilding one adds the per-document checks. Format 2 stores still open
and read with the same checks: each record
carries its block CRCs as one hex string (``block_crc32``, 8 digits a block,
parsed per block when it is checked; 64 KiB or 1 MiB blocks, as recorded), a
record without ``buffers`` is mapped through Arrow after its quick
signature. Format 1 stores (no block checksums) still open and read,
checked by their quick signatures at map time and by a full
:meth:`TokenStore.verify`; rebuilding one adds the per-block check of every
read.

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
tokenizer down and turns texts into token ids. This module owns what is on
disk (the layout above, ``meta.json``, signatures, the fingerprint and their
validation) and reading it; :mod:`impl.build` owns writing it (in this process
or in spawned workers) and publishing it atomically.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import json
import mmap
import operator
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from impl._arrays import demand_zero, distinct, distinct_ints
from impl._crc import crc32
from impl.encoding import TokenizerInfo
from impl.errors import (
    REBUILD_HINT,
    ConfigError,
    SourceError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_TABLE",
    "DEFAULT_DOCS_PER_FILE",
    "DOCUMENT_TABLE",
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
#: Bytes of a token file covered by one CRC-32 in the stores this version writes (the last block may be shorter).
BLOCK_BYTES = 16 * 1024
#: Format 3: the file holding every token file's block CRC-32s, big-endian uint32, file after file.
BLOCK_TABLE = "blocks.crc32"
#: Format 4: the file holding every document's CRC-32 (of its token bytes), big-endian uint32, in store order.
DOCUMENT_TABLE = "documents.crc32"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _CrcTable:
    """One binary table of CRC-32s: the first format with it, its ``layout`` key, file, entry and record field.

    ``field`` is the hex string a file's writer returns in its record
    (``impl.build`` moves it into the table before ``meta.json`` is written).
    """

    since: int
    key: str
    name: str
    entry: str
    field: str


#: The store's CRC tables, in the order they are checked (open, ``verify``) and written (build).
_CRC_TABLES = (_CrcTable(since=3, key="block_table", name=BLOCK_TABLE, entry="block", field="block_crc32"),
              _CrcTable(since=4, key="document_table", name=DOCUMENT_TABLE, entry="document", field="document_crc32"))
_UINT16_LIMIT = 1 << 16
_READ_CHUNK = 1 << 20
_OFFSET_BYTES = 8
#: Up to this many ranges, block checks loop in Python over ``bytearray.find`` (numpy's per-call cost is more).
_SMALL = 64
#: A first read continuing a sequential streak of at least ``_READ_AHEAD_AFTER`` bytes (a reader in file order)
#: also verifies as many blocks past it as the streak holds, up to ``_READ_AHEAD_BYTES``, so the next batches find
#: them verified and pay one ``find`` each (``TokenStore._first_read``).
_READ_AHEAD_BYTES = 512 * 1024
_READ_AHEAD_AFTER = 64 * 1024


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
    format 2 on the first read of its block (format 1: only by ``verify``).
    """
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        if size is None:
            size = os.fstat(fd).st_size
        h = hashlib.sha256()
        h.update(b"loadspec-quick-signature-v1\0")
        h.update(int(size).to_bytes(8, "little"))
        if size <= 2 * QUICK_SIGNATURE_BYTES:
            h.update(_pread_all(fd, size, 0))
        else:
            h.update(_pread_all(fd, QUICK_SIGNATURE_BYTES, 0))
            h.update(_pread_all(fd, QUICK_SIGNATURE_BYTES, size - QUICK_SIGNATURE_BYTES))
        return h.hexdigest()
    finally:
        os.close(fd)


def _content_fingerprint(file_sha256s: Sequence[str], dtype: str, tokenizer_sha256: str,
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


def _arrow_type(dtype: np.dtype) -> pa.DataType:
    return pa.large_list(pa.from_numpy_dtype(dtype))


def _open_arrow(path: str | os.PathLike[str]) -> tuple[pa.LargeListArray, pa.Buffer]:
    """The token column of a one-batch Arrow IPC file and the whole file as one mapped buffer."""
    with pa.memory_map(os.fspath(path), "r") as mm:
        reader = pa.ipc.open_file(mm)
        if reader.num_record_batches != 1:
            raise StoreCorruptError(f"{path}: {reader.num_record_batches} record batches, expected 1; {REBUILD_HINT}")
        batch = reader.get_batch(0)
        if batch.num_columns != 1 or not pa.types.is_large_list(batch.column(0).type):
            raise StoreCorruptError(f"{path}: schema {batch.schema} is not one large_list column; {REBUILD_HINT}")
        mm.seek(0)
        whole = mm.read_buffer(mm.size())
    # The mapping outlives the closed file: Arrow buffers keep the region alive.
    return batch.column(0), whole


def _buffer_layout(path: str | os.PathLike[str], col: pa.LargeListArray, whole: pa.Buffer) -> dict[str, list[int]]:
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
        "offsets": span(offsets_buf, 0 if offsets_buf is None else (len(col) + 1) * _OFFSET_BYTES),
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
    col, whole = _open_arrow(path)
    return _buffer_layout(path, col, whole)


# --------------------------------------------------------------------------- meta validation


_META_INT_KEYS = ("num_documents", "num_tokens", "num_empty_documents")


def _validate_meta(root: Path, meta: Any) -> None:
    if not isinstance(meta, dict):
        raise StoreCorruptError(f"{root / META_FILE}: not a JSON object; {REBUILD_HINT}")
    if meta.get("format") != FORMAT_NAME:
        raise StoreCorruptError(
            f"{root / META_FILE}: format is {meta.get('format')!r}, not {FORMAT_NAME!r}: this directory is not a "
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
    for spec in _CRC_TABLES:
        table = layout.get(spec.key)
        if version >= spec.since and not (
                isinstance(table, dict) and table.get("name") == spec.name and isinstance(table.get("sha256"), str)
                and isinstance(table.get("size"), int) and not isinstance(table.get("size"), bool)):
            problems.append(f"layout.{spec.key} {table!r}")
    if problems:
        raise StoreCorruptError(f"{root / META_FILE}: invalid {', '.join(problems)}; {REBUILD_HINT}")


# --------------------------------------------------------------------------- the store



def _map_read_only(path: str, where: str, size: int) -> mmap.mmap | bytes:
    """``path`` mapped read-only, refused with ``StoreCorruptError`` unless it exists and holds ``size`` bytes.

    ``where`` names the file in the messages. An expected size of 0 gives
    ``b""`` (an empty file cannot be mapped) once the file is known to exist.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            mm: mmap.mmap | bytes = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
            actual = os.fstat(fd).st_size if not size else len(mm)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise StoreCorruptError(f"{where} is missing; {REBUILD_HINT}") from None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"{where} could not be mapped ({exc}); {REBUILD_HINT}") from exc
    if actual != size:
        raise StoreCorruptError(f"{where} changed since it was built ({actual} bytes, {size} when built); {REBUILD_HINT}")
    return mm


class _Blocks:
    """One mapped file's recorded block checksums and the blocks this store object has verified.

    ``data`` is the whole file as a read-only memoryview of the same mapping
    the tokens are served from, so a block is checked in exactly the bytes a
    reader copies; ``base`` is the byte offset of the file's token values,
    ``offsets_at`` that of its document offsets and ``offsets_blocks`` the
    blocks holding them (first, last; ``(0, -1)`` when it has none);
    ``offsets_done`` says every one of them is verified and the end offsets
    were checked (then offsets are read unchecked). ``verified`` holds one
    byte per block (1: verified), a ``bytearray`` so that "is any block of
    ``[a, b]`` unverified" is one C-level ``verified.find(0, a, b + 1)``;
    ``verified_np`` is the same memory as a numpy bool array for the
    vectorised paths; ``left`` counts the unverified blocks (``complete``
    when 0). ``recorded`` is the file's slice of the block table (format 3);
    else ``hex`` is the file's ``block_crc32`` string (format 2), each
    block's 8 digits parsed when it is checked. ``frontier`` is the block
    after the last first read's last block (-1 before any), ``streak`` the
    blocks of the sequential run that read ended (``TokenStore._first_read``).
    ``documents`` is the file's slice of the document table (format 4, else
    None), ``documents_verified`` one byte per document whose CRC passed
    (``TokenStore._verify_documents``; the file's slice of the store's
    demand-zero map, so a fresh resume touches a page per document it
    checks, not 64 KiB per file) and ``documents_left`` about how many have
    not (a hint: ``complete`` is set only after a scan confirms it).
    """

    __slots__ = ("base", "block", "complete", "count", "data", "documents", "documents_left", "documents_verified",
                 "frontier", "hex",
                 "itemsize", "left", "lock", "offsets_at", "offsets_blocks", "offsets_done", "read_ahead", "recorded",
                 "size", "streak", "verified", "verified_np")

    def __init__(self, data: memoryview, base: int, itemsize: int, block: int, crc_hex: str, offsets_at: int,
                 recorded: np.ndarray | None = None, offsets_bytes: int = 0,
                 documents: np.ndarray | None = None, documents_verified: memoryview | None = None) -> None:
        self.data = data
        self.size = len(data)
        self.base = base
        self.itemsize = itemsize
        self.block = block
        self.hex = crc_hex
        self.recorded = recorded
        self.count = len(crc_hex) // 8 if recorded is None else len(recorded)
        self.offsets_at = offsets_at
        self.offsets_blocks = ((offsets_at // block, (offsets_at + offsets_bytes - 1) // block) if offsets_bytes
                               else (0, -1))
        self.verified = bytearray(self.count)
        self.verified_np = np.frombuffer(self.verified, dtype=np.bool_)
        self.left = self.count
        self.complete = self.count == 0
        self.offsets_done = self.complete
        self.frontier = -1
        self.streak = 0
        self.read_ahead = max(1, _READ_AHEAD_BYTES // block)
        self.lock = threading.Lock()
        self.documents = documents
        self.documents_verified = memoryview(bytearray()) if documents_verified is None else documents_verified
        self.documents_left = len(self.documents_verified)

    def reset(self) -> None:
        """Forget every verification (``verify`` checks every block again)."""
        with self.lock:
            self.verified_np[:] = False
            self.documents_verified[:] = bytes(len(self.documents_verified))
            self.documents_left = len(self.documents_verified)
            self.left = self.count
            self.complete = self.offsets_done = self.count == 0
            self.frontier = -1
            self.streak = 0


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

    #: Every file's every block is verified (then a batch's check is one attribute test); set by the block checks.
    _all_verified: bool = False

    # ------------------------------------------------------------ construction

    def __init__(self, path: Path, meta: dict[str, Any]):
        """Use :meth:`open` or :meth:`build`; this maps already validated metadata."""
        self._path = path
        self._root = str(path)
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
        #: The CRC tables (``_CRC_TABLES``) by file name, each mapped on first use (:meth:`_crc_table`).
        self._tables: dict[str, np.ndarray] = {}
        if self._version >= 3:
            self._table_at = [0, *itertools.accumulate(-(-r.size // self._block_bytes) for r in self._records)]
            self._check_table_size(_CRC_TABLES[0], self._table_at[-1], f"blocks of {self._block_bytes} bytes")
        #: Format 4: one byte per document of the store, 1 once its CRC passed (a demand-zero map, made on first use).
        self._documents_verified: mmap.mmap | None = None
        if self._version >= 4:
            self._check_table_size(_CRC_TABLES[1], int(meta["num_documents"]), "documents")
        self._map_lock = threading.Lock()
        self._closed = False
        self._mapped: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self._records)
        self._blocks: list[_Blocks | None] = [None] * len(self._records)
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
        return mapped

    def _part(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s (values, offsets), mapped on first use, every block of its offsets checked."""
        mapped = self._mapped[f]
        if mapped is None:
            mapped = self._map(f)
        blocks = self._blocks[f]
        if blocks is not None and not blocks.offsets_done:
            self._check_all_offsets(f, blocks, mapped[1])
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
        return f"token store {self._path}: file {name}"

    def _check_file(self, rec: FileRecord, *, content: bool) -> None:
        """Present with the recorded size (``open``); with ``content``, also the recorded quick signature (first map).

        Why the signature waits for the first map: it reads 128 KiB per
        file, so checking every file at ``open`` made open cost O(files),
        and files grow with the token count. Checked at first map, before
        any of the file's tokens is returned, a changed file is refused just
        the same, and each process pays only for the files it reads.
        """
        name = rec.name
        fp = f"{self._root}/{name}"
        if not name or "/" in name or name in (".", ".."):
            raise StoreCorruptError(f"{self._where(name)}: invalid file name in {META_FILE}; {REBUILD_HINT}")
        try:
            st = os.stat(fp)
        except FileNotFoundError:
            raise StoreCorruptError(f"{self._where(name)} is missing; {REBUILD_HINT}") from None
        if st.st_size == rec.size and not content:
            return
        where = self._where(name)
        if st.st_size < rec.size:
            raise StoreCorruptError(
                f"{where} is truncated ({st.st_size} bytes, {rec.size} when built); {REBUILD_HINT}"
            )
        if st.st_size != rec.size:
            raise StoreCorruptError(
                f"{where} changed since it was built ({st.st_size} bytes, {rec.size} when built); {REBUILD_HINT}"
            )
        if content and quick_signature(fp, st.st_size) != rec.quick_signature:
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

    def _new_blocks(self, rec: FileRecord, data: memoryview, values_at: int, offsets_at: int) -> _Blocks:
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
        return _Blocks(data, values_at, self._dtype.itemsize, self._block_bytes, rec.block_crc32 or "", offsets_at,
                       recorded, 0 if rec.num_documents == 0 and offsets_at == 0 else (rec.num_documents + 1) * _OFFSET_BYTES,
                       documents, verified)

    def _table_where(self, name: str) -> str:
        return f"token store {self._path}: {name}"

    def _check_table_size(self, spec: _CrcTable, entries: int, what: str) -> None:
        """At open (format 3, 4): table ``spec`` exists and holds one 4-byte CRC per entry (``entries`` ``what``)."""
        expected, name = 4 * entries, spec.name
        recorded = self._meta["layout"][spec.key]["size"]
        if recorded != expected:
            raise StoreCorruptError(
                f"{self._path / META_FILE}: layout.{spec.key} records {recorded} bytes, but the store's "
                f"{entries} {what} need {expected}; {REBUILD_HINT}"
            )
        try:
            size = os.stat(f"{self._root}/{name}").st_size
        except FileNotFoundError:
            raise StoreCorruptError(f"{self._table_where(name)} is missing; {REBUILD_HINT}") from None
        if size != expected:
            raise StoreCorruptError(
                f"{self._table_where(name)} {'is truncated' if size < expected else 'changed since it was built'} "
                f"({size} bytes, {expected} when built); {REBUILD_HINT}"
            )

    def _crc_table(self, name: str, entries: int) -> np.ndarray:
        """CRC table ``name``'s ``entries`` recorded CRC-32s (big-endian uint32), one read-only mapping made on first use."""
        table = self._tables.get(name)
        if table is None:
            mm = _map_read_only(f"{self._root}/{name}", self._table_where(name), 4 * entries)
            table = self._tables[name] = np.frombuffer(mm, dtype=">u4")
        return table

    def _recorded_crc(self, rec: FileRecord, blocks: _Blocks, b: int) -> int:
        """Block ``b``'s CRC-32 as recorded: from the block table (format 3), else its 8 hex digits parsed now."""
        if blocks.recorded is not None:
            return int(blocks.recorded.item(b))
        try:
            raw = bytes.fromhex(blocks.hex[8 * b:8 * b + 8])
        except ValueError:
            raw = b""
        if len(raw) != 4:
            raise StoreCorruptError(
                f"{self._where(rec.name)}: its block_crc32 in {META_FILE} is not hexadecimal; {REBUILD_HINT}"
            )
        return int.from_bytes(raw, "big")

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
        offsets_at = self._recorded_buffer(rec, "offsets", 0 if no_offsets else (docs + 1) * _OFFSET_BYTES,
                                           _OFFSET_BYTES)
        values_at = self._recorded_buffer(rec, "values", rec.num_tokens * item, item)
        mm = _map_read_only(f"{self._root}/{rec.name}", self._where(rec.name), rec.size)
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
        fp = self._path / rec.name
        where = self._where(rec.name)
        self._check_file(rec, content=signature)
        try:
            col, whole = _open_arrow(fp)
        except StoreCorruptError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise StoreCorruptError(f"{where} is not a readable Arrow file ({exc}); {REBUILD_HINT}") from exc
        expected = _arrow_type(self._dtype)
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
        layout = _buffer_layout(fp, col, whole)
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

    def _check_all_offsets(self, f: int, blocks: _Blocks, offsets: np.ndarray) -> None:
        """Verify every block holding file ``f``'s offsets, then its end offsets (before any whole-file use)."""
        rec = self._records[f]
        first, last = blocks.offsets_blocks
        if last >= first:
            self._verify_span(rec, blocks, first, last)
        if int(offsets[0]) != 0 or int(offsets[-1]) != rec.num_tokens:
            raise StoreCorruptError(
                f"{self._where(rec.name)}: document offsets do not match the {rec.num_tokens} tokens recorded; "
                f"{REBUILD_HINT}"
            )
        blocks.offsets_done = True

    def _offsets_read(self, f: int, blocks: _Blocks, offsets: np.ndarray) -> None:
        """After offsets blocks were verified: once all of the file's are, its offsets are read unchecked.

        Why: a global shuffle's batches verify every file's offsets blocks
        within the first few hundred batches, and from then on each
        document's bounds skip the per-entry test.
        """
        first, last = blocks.offsets_blocks
        if blocks.verified.find(0, first, last + 1) < 0:
            self._check_all_offsets(f, blocks, offsets)

    def document_bounds(self, file: int, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` (file-local tokens, int64) of file-local documents ``docs`` of ``file``.

        Reads only the offsets entries ``docs`` and ``docs + 1``, after the
        blocks holding them passed their CRC (format 2), so a batch's first
        read of a file checks a few small blocks, not the file's whole
        offsets region. A bound outside the file's tokens is refused as
        corrupt (an edited ``meta.json`` layout cannot yield wrong tokens).
        Format 4 also checks each returned document's tokens before
        returning (:attr:`document_checks`): documents spread over more than
        twice their count of ids (a shuffle) each by its own CRC-32, which
        covers its offsets entries too; documents closer together (file
        order) by the blocks of their offsets and of their tokens, read ahead.

        >>> store.document_bounds(0, np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        self._require_open()
        f = operator.index(file)
        if not 0 <= f < len(self._records):
            raise IndexError(f"file {file} out of range for a store of {len(self._records)} files")
        rec = self._records[f]
        local = np.asarray(docs, dtype=np.int64).reshape(-1)
        first_doc = last_doc = 0
        if local.size:
            if local.size <= _SMALL:  # Python's min/max beat numpy's call overhead on a batch's few documents
                listed = local.tolist()
                first_doc, last_doc = min(listed), max(listed)
            else:
                first_doc, last_doc = int(local.min()), int(local.max())
            if first_doc < 0 or last_doc >= rec.num_documents:
                raise IndexError(f"document out of range for file {f} of {rec.num_documents} documents")
        offsets = self._map(f)[1]
        blocks = self._blocks[f]
        check_offsets = check_tokens = by_document = False
        if blocks is not None and local.size:
            check_offsets = not blocks.offsets_done
            check_tokens = blocks.documents is not None and not blocks.complete
        if blocks is not None and (check_offsets or check_tokens):
            at0, block = blocks.offsets_at, blocks.block
            lo, hi = (at0 + first_doc * _OFFSET_BYTES) // block, (at0 + (last_doc + 2) * _OFFSET_BYTES - 1) // block
            dense = hi - lo <= local.size   # offsets entries close together: their blocks, in spans
            by_document = check_tokens and last_doc - first_doc + 1 > 2 * local.size  # not file order
        if blocks is not None and check_offsets and not by_document:
            if dense:
                self._verify_span(rec, blocks, lo, hi)
            elif local.size <= _SMALL:
                for d in local.tolist():
                    at = at0 + d * _OFFSET_BYTES
                    self._verify_span(rec, blocks, at // block, (at + 2 * _OFFSET_BYTES - 1) // block)
            else:
                at_np = at0 + local * _OFFSET_BYTES
                wanted = np.concatenate((at_np // block, (at_np + 2 * _OFFSET_BYTES - 1) // block))
                self._verify_blocks(rec, blocks, wanted[~blocks.verified_np[wanted]].tolist())
            self._offsets_read(f, blocks, offsets)
        starts = offsets[local]
        stops = offsets[local + 1]
        if local.size and not bool(((starts >= 0) & (starts <= stops) & (stops <= rec.num_tokens)).all()):
            raise StoreCorruptError(
                f"{self._where(rec.name)}: document offsets out of order or past its {rec.num_tokens} tokens; "
                f"{REBUILD_HINT}"
            )
        if blocks is not None and by_document:
            self._verify_documents([(f, d, a, b) for d, a, b in zip(local.tolist(), starts.tolist(), stops.tolist())])
        elif blocks is not None and check_tokens:  # dense: offsets checked above; skip when their span is verified
            item, block = blocks.itemsize, blocks.block
            first = (blocks.base + offsets.item(first_doc) * item) // block
            if blocks.verified.find(0, first, (blocks.base + offsets.item(last_doc + 1) * item - 1) // block + 1) >= 0:
                self.check_blocks(f, starts, stops)
        return starts.astype(np.int64, copy=False), stops - starts

    def document_bounds_batch(self, files: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`document_bounds` of many files at once: ``(start, length)`` of document ``docs[i]`` of ``files[i]``.

        Why: a fresh resume's first batch names ~40 documents in a dozen
        files; one call that maps each file on first use and reads each
        document's two offsets entries (after the blocks holding them passed
        their CRC) costs a few microseconds a document, where a numpy
        pipeline per file cost tens of microseconds a file. Many documents,
        or many per file touched (a batch in file order), go through
        :meth:`document_bounds` file by file.

        >>> store.document_bounds_batch(np.array([0, 2]), np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        self._require_open()
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        dl = np.asarray(docs, dtype=np.int64).reshape(-1)
        if fl.shape != dl.shape:
            raise ValueError(f"files and docs differ in length ({fl.size} and {dl.size})")
        touched = distinct(fl) if fl.size > 8 else None
        if touched is not None and (fl.size > _SMALL or fl.size >= 8 * len(touched)):
            if len(touched) == 1:  # many documents of one file (file order): one numpy pass
                return self.document_bounds(int(touched[0]), dl)
            starts = np.empty(fl.size, dtype=np.int64)
            lengths = np.empty(fl.size, dtype=np.int64)
            for f in touched.tolist():
                mine = fl == f
                starts[mine], lengths[mine] = self.document_bounds(f, dl[mine])
            return starts, lengths
        out_start: list[int] = []
        out_length: list[int] = []
        records, blocks_of, mapped = self._records, self._blocks, self._mapped
        pending: list[tuple[int, int, int, int]] = []
        for f, d in zip(fl.tolist(), dl.tolist()):
            if not 0 <= f < len(records):
                raise IndexError(f"file {f} out of range for a store of {len(records)} files")
            rec = records[f]
            if not 0 <= d < rec.num_documents:
                raise IndexError(f"document out of range for file {f} of {rec.num_documents} documents")
            offsets = (mapped[f] or self._map(f))[1]
            blocks = blocks_of[f]
            by_document = blocks is not None and blocks.documents is not None and not blocks.complete
            if blocks is not None and not blocks.offsets_done and not by_document:
                at = blocks.offsets_at + d * _OFFSET_BYTES
                lo, hi = at // blocks.block, (at + 2 * _OFFSET_BYTES - 1) // blocks.block
                if blocks.verified.find(0, lo, hi + 1) >= 0:
                    self._verify_span(rec, blocks, lo, hi)
                    self._offsets_read(f, blocks, offsets)
            a, b = offsets.item(d), offsets.item(d + 1)
            if not 0 <= a <= b <= rec.num_tokens:
                raise StoreCorruptError(
                    f"{self._where(rec.name)}: document offsets out of order or past its {rec.num_tokens} tokens; "
                    f"{REBUILD_HINT}"
                )
            if by_document and not blocks.documents_verified[d]:  # type: ignore[union-attr]
                pending.append((f, d, a, b))
            out_start.append(a)
            out_length.append(b - a)
        if pending:
            self._verify_documents(pending)
        return np.array(out_start, dtype=np.int64), np.array(out_length, dtype=np.int64)

    def _verify_span(self, rec: FileRecord, blocks: _Blocks, lo: int, hi: int) -> None:
        """CRC the unverified blocks among ``lo..hi`` (once each per store object); refuse the first that changed.

        The one loop every check ends in: a block costs a ``find``, a slice,
        a CRC and an int compare (its recorded CRC read from the table as a
        Python int). Under the file's lock, so concurrent readers CRC each
        block once; a span already verified returns without taking it (a
        block is marked only after its CRC passed, so an unlocked ``find``
        that sees no unverified block is final).
        """
        verified = blocks.verified
        if verified.find(0, lo, hi + 1) < 0:
            return
        with blocks.lock:
            b = verified.find(0, lo, hi + 1)
            if b < 0:
                return
            data, block, recorded, left = blocks.data, blocks.block, blocks.recorded, blocks.left
            while b >= 0:
                at = b * block
                crc = crc32(data[at:at + block])
                want = recorded.item(b) if recorded is not None else self._recorded_crc(rec, blocks, b)
                if crc != want:
                    blocks.left = left
                    raise self._changed_block(rec, blocks, b, crc, want)
                verified[b] = 1
                left -= 1
                b = verified.find(0, b + 1, hi + 1)
            blocks.left = left
            if not left:
                self._file_verified(blocks)

    def _verify_blocks(self, rec: FileRecord, blocks: _Blocks, todo: Iterable[int]) -> None:
        """:meth:`_verify_span` of each block of ``todo``, in order."""
        for b in sorted(set(todo)):
            self._verify_span(rec, blocks, b, b)

    def _changed_block(self, rec: FileRecord, blocks: _Blocks, b: int, crc: int, recorded: int) -> StoreCorruptError:
        """The refusal of a changed block: the store, the file, the block, its bytes, both CRCs and the fix."""
        at, size = b * blocks.block, blocks.size
        end = min(at + blocks.block, size)
        return StoreCorruptError(
            f"{self._where(rec.name)} changed since it was built: block {b} (bytes {at}-{end - 1} of {size}) has "
            f"CRC-32 {crc:08x}, {recorded:08x} when built, so none of its tokens is served; restore the file "
            f"from a good copy or {REBUILD_HINT}"
        )

    def _verify_documents(self, pending: Sequence[tuple[int, int, int, int]]) -> None:
        """Format 4: CRC documents ``(file, document, first token, stop token)`` against their recorded CRC-32s.

        Why per document: under a global shuffle (or a fresh resume's first
        batch) each document of a batch lies in a block no reader has
        verified yet, so a block check CRCs 16 KiB, from cold memory, to serve
        ~1.3 KB; the document's own CRC reads exactly the bytes served. Its
        token range comes from the offsets read unchecked: an offsets entry
        changed since the build moves the range of the two documents it
        bounds, whose CRCs then fail (barring a CRC collision), so a document
        that passes was read with its recorded bounds and tokens.

        Each document is CRC'd straight from the mapping: copying a batch's
        documents into one buffer first (``bytes.join``, whose C loop
        overlaps their cache misses) and CRC'ing them there cost as much at L
        (42.6 against 40.0 ms over 512 batches under a global shuffle). A
        file whose documents have all passed counts as verified whole (every
        token byte and offsets entry was checked), and its reads skip the
        checks.

        >>> store._verify_documents([(0, 3, 9, 13), (2, 0, 0, 4)])      # doctest: +SKIP
        """
        blocks_of = self._blocks
        for f, d, a, b in pending:
            blocks = blocks_of[f]
            if blocks is None or blocks.documents is None or blocks.documents_verified[d]:
                continue
            at = blocks.base + a * blocks.itemsize
            crc = crc32(blocks.data[at:at + (b - a) * blocks.itemsize])
            if crc != blocks.documents.item(d):
                raise self._changed_document(f, blocks, d, a, b, crc)
            blocks.documents_verified[d] = 1
            blocks.documents_left -= 1
            if blocks.documents_left <= 0 and blocks.documents_verified.tobytes().find(0) < 0:
                self._file_verified(blocks)  # every document passed (a scan confirms the unlocked count)

    def _file_verified(self, blocks: _Blocks) -> None:
        """Every byte of a file that readers use is verified: its reads skip every check from now on."""
        blocks.complete = True
        self._all_verified = all(other is not None and other.complete for other in self._blocks)

    def _changed_document(self, f: int, blocks: _Blocks, d: int, a: int, b: int, crc: int) -> StoreCorruptError:
        """The refusal of a changed document: the store, the file, the document, its bytes, both CRCs and the fix."""
        rec = self._records[f]
        at, end = blocks.base + a * blocks.itemsize, blocks.base + b * blocks.itemsize
        recorded = int(blocks.documents.item(d))  # type: ignore[union-attr]
        return StoreCorruptError(
            f"{self._where(rec.name)} changed since it was built: its document {d} (document "
            f"{self._file_doc_starts[f] + d} of the store; tokens {a}-{b - 1}, bytes {at}-{end - 1} of {blocks.size}, "
            f"as its offsets now say) has CRC-32 {crc:08x}, {recorded:08x} when built ({DOCUMENT_TABLE}), so none of "
            f"its tokens is served; restore the file from a good copy or {REBUILD_HINT}"
        )

    def _first_read(self, f: int, blocks: _Blocks, lo: int, hi: int) -> None:
        """A reader's first read of value blocks ``lo..hi`` (``lo`` unverified): verify them, reading ahead in a streak.

        A read whose first block is the file's frontier (the block after the
        previous first read) continues a sequential streak; once the streak
        holds :data:`_READ_AHEAD_AFTER` bytes, the read also verifies as many
        blocks past it as the streak holds, up to :data:`_READ_AHEAD_BYTES`
        (the window doubles as a reader in file order goes on). Why a streak
        and not "the block before is verified": under a global shuffle a
        random block's neighbour is verified more and more often as an epoch
        goes on (1 in 5 after 512 batches at L), and a long document read in
        two pieces continues the frontier once; reading ahead for those
        doubled the bytes a first pass CRC'd.
        """
        streak = hi - lo + 1 + (blocks.streak if lo == blocks.frontier else 0)
        if streak * blocks.block >= _READ_AHEAD_AFTER and hi + 1 < blocks.count:
            ahead = min(streak, blocks.read_ahead, blocks.count - 1 - hi)
            hi += ahead
            streak += ahead
        self._verify_span(self._records[f], blocks, lo, hi)
        blocks.frontier = hi + 1
        blocks.streak = streak

    def _check_span(self, f: int, start: int, stop: int) -> None:
        """The blocks of tokens ``[start, stop)`` of file ``f`` (already mapped): the one run check of every path.

        Single reads, :meth:`check_blocks`' runs that leave gaps and
        :meth:`check_blocks_batch`'s runs all end here: a ``find`` for the
        first unverified block, then :meth:`_first_read`.
        """
        blocks = self._blocks[f]
        if blocks is None or blocks.complete or stop <= start:
            return
        hi = (blocks.base + stop * blocks.itemsize - 1) // blocks.block
        lo = blocks.verified.find(0, (blocks.base + start * blocks.itemsize) // blocks.block, hi + 1)
        if lo >= 0:
            self._first_read(f, blocks, lo, hi)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = False) -> TokenStore:
        """Open a built store, checking it cheaply; ``verify=True`` also re-hashes every file.

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
        """
        root = Path(path)
        meta_path = root / META_FILE
        try:
            raw = meta_path.read_bytes()   # the directory is looked at only when this fails (a resume opens a store)
        except (FileNotFoundError, NotADirectoryError):
            if not root.exists():
                raise StoreNotFoundError(
                    f"no token store at {root}: the directory does not exist; build it with "
                    f"TokenStore.build(source, tokenizer, {str(root)!r}) (CLI: `loadspec build ...`)"
                ) from None
            if not root.is_dir():
                raise StoreNotFoundError(
                    f"{root} is a file, not a token store directory; pass the store's directory") from None
            raise StoreNotFoundError(
                f"{root} has no {META_FILE}: it is not a token store (or its build never finished); build it with "
                f"TokenStore.build(source, tokenizer, {str(root)!r}) (CLI: `loadspec build ...`)"
            ) from None
        try:
            meta = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreCorruptError(f"{meta_path} is not valid JSON ({exc}); {REBUILD_HINT}") from exc
        _validate_meta(root, meta)
        store = cls(root, meta)
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
            overwrite=overwrite,
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
            overwrite=overwrite, progress=progress,
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
                self._check_span(f, a, b)
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
        self._check_span(f, a0, b0)
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
            self._check_span(f, a, b)
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
        total = int(out_offsets[-1])
        positions = np.arange(total, dtype=np.int64) + np.repeat(starts - out_offsets[:-1], lens)
        if len(self._records) == 1:
            self.check_blocks(0, starts, starts + lens)
            return self._values[0][positions], out_offsets
        fds = np.asarray(self._file_doc_starts, dtype=np.int64)
        doc_file = np.searchsorted(fds, docs, side="right") - 1
        for f in distinct_ints(doc_file):
            mine = doc_file == f
            local = starts[mine] - self._file_token_starts[f]
            self.check_blocks(f, local, local + lens[mine])
        out = np.empty(total, dtype=self._dtype)
        fts = np.asarray(self._file_token_starts, dtype=np.int64)
        file_of = np.searchsorted(fts, positions, side="right") - 1
        for f in distinct(file_of):
            mask = file_of == f
            out[mask] = self._values[int(f)][positions[mask] - fts[f]]
        return out, out_offsets

    # ------------------------------------------------------------ integrity

    def check_blocks(self, file: int, starts: np.ndarray, stops: np.ndarray) -> None:
        """Refuse changed tokens before they are served: check the blocks holding tokens ``[starts[i], stops[i])`` of ``file``.

        ``starts``/``stops`` are file-local token offsets (int64 arrays of
        equal length; empty ranges are ignored). **Every reader of token
        values must call this first**, for the ranges it is about to copy:
        every reader of this class does, and a reader working on the raw
        mapped views (``store._part(f)``, the packing fill path) must too. A
        format-2/3 file's bytes are covered by one CRC-32 per block
        (:data:`BLOCK_BYTES`, 16 KiB, in stores this version writes); a
        block is CRC'd from the mapping on its first read by this store
        object and remembered in a per-file bitmap, so a range in verified
        blocks costs a ``bytearray.find``, and a file whose blocks are all
        verified costs one list index and one attribute test (the first lines
        below: keep that path short). A block that changed since the build
        raises :class:`StoreCorruptError` naming the store, the file, the
        block and its bytes, and the fix.

        Why blocks of the file's bytes (not of the token values): one scheme
        covers values, offsets and Arrow metadata alike, and the build
        computes it in the same read as the file's sha256. Why 16 KiB: a
        fresh resume's first batch reads ~40 documents in ~40 different
        blocks of values and ~40 of offsets; at 1 MiB (~0.25 ms of CRC each)
        that was most of its cost, at 64 KiB ~14 us each (CRC and first-touch
        page faults), at 16 KiB ~4 us; a sequential first read pays ~1 us of
        Python per block more than at 64 KiB. Up to :data:`_SMALL` ranges are
        walked in Python (a numpy pipeline costs more than it saves there).
        A first read continuing a sequential streak (a reader in file order)
        also verifies blocks ahead, up to 512 KiB (:meth:`_first_read`), still
        before any of their tokens is served: the batches after it find their
        blocks verified and pay one ``find`` each (a file-order first read cost
        ~6 % of the iteration without it, ~4 % with it); a random first read
        (a resume's first batch, a global shuffle) verifies only what it reads.
        A batch's runs in several files are checked in one call by
        :meth:`check_blocks_batch`.
        A document's offsets are checked per entry by
        :meth:`document_bounds`. Format-1 files have no block checksums: for
        them this only maps the file (quick signature).

        Thread-safe: concurrent readers may check the same block; each block
        is CRC'd once under its file's lock.

        >>> store.check_blocks(0, np.array([0, 100]), np.array([10, 4096]))   # doctest: +SKIP
        """
        try:
            done = file >= 0 and self._blocks[file].complete  # type: ignore[union-attr]
        except (AttributeError, IndexError, TypeError):
            done = False
        if done:
            return
        self._require_open()
        f = operator.index(file)
        if not 0 <= f < len(self._records):
            raise IndexError(f"file {file} out of range for a store of {len(self._records)} files")
        self._map(f)
        blocks = self._blocks[f]
        if blocks is None or blocks.complete:
            return
        lo_tok = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi_tok = np.asarray(stops, dtype=np.int64).reshape(-1)
        if lo_tok.shape != hi_tok.shape:
            raise ValueError(f"starts and stops differ in length ({lo_tok.size} and {hi_tok.size})")
        if not lo_tok.size:
            return
        small = lo_tok.size <= _SMALL
        if small:  # a batch's few runs per file: Python's min/max beat numpy's call overhead
            lo_list, hi_list = lo_tok.tolist(), hi_tok.tolist()
            first_tok, last_tok = min(lo_list), max(hi_list)
        else:
            first_tok, last_tok = int(lo_tok.min()), int(hi_tok.max())
        if first_tok < 0 or last_tok > self._records[f].num_tokens:
            raise IndexError(
                f"token range out of bounds for file {f} of {self._records[f].num_tokens} tokens "
                f"(starts from {first_tok}, stops up to {last_tok})"
            )
        if last_tok <= first_tok:
            return
        base, item, block = blocks.base, blocks.itemsize, blocks.block
        first = (base + first_tok * item) // block
        last = (base + last_tok * item - 1) // block
        verified = blocks.verified
        lo = verified.find(0, first, last + 1)
        if lo < 0:
            return
        if small and sum(hi_list) - sum(lo_list) >= last_tok - first_tok:
            self._first_read(f, blocks, lo, last)  # the runs cover the span (e.g. one sample's pieces in file order)
        elif small:
            for a, b in zip(lo_list, hi_list):
                self._check_span(f, a, b)
        else:
            keep = hi_tok > lo_tok
            if not keep.all():
                lo_tok, hi_tok = lo_tok[keep], hi_tok[keep]
            lo_np = (base + lo_tok * item) // block
            hi_np = (base + hi_tok * item - 1) // block
            n = blocks.count
            if np.array_equal(lo_np, hi_np):
                wanted = lo_np
            else:
                depth = np.cumsum(np.bincount(lo_np, minlength=n + 1) - np.bincount(hi_np + 1, minlength=n + 1))
                wanted = np.flatnonzero(depth[:n])
            todo = wanted[~blocks.verified_np[wanted]].tolist()
            if todo and todo[-1] - todo[0] + 1 == len(todo):  # one run of unverified blocks: may continue a streak
                self._first_read(f, blocks, todo[0], todo[-1])
            elif todo:
                self._verify_blocks(self._records[f], blocks, todo)

    def check_blocks_batch(self, files: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        """:meth:`check_blocks` of a whole batch: the blocks holding tokens ``[starts[i], stops[i])`` of ``files[i]``.

        Why one call a batch: under a global shuffle a batch of 8 x 2048
        tokens copies ~41 runs from ~13 files; one ``check_blocks`` call per
        file (array conversions, spans, its own CRC loop) and the caller's
        per-file selections cost ~25 us a batch even when every block was
        verified (the rest of a first epoch), against ~16 us here, and a
        first read ~30 us more. Here one pass over the runs finds each run's
        unverified blocks (a ``find``) and CRCs them there; once every block
        of the store is verified the call is one attribute test. All runs in
        one file (file order), or more than :data:`_SMALL` runs, go through
        :meth:`check_blocks` (its span and numpy paths). The same guarantee:
        every block holding a token of a run is verified before this
        returns, or :class:`StoreCorruptError` names the first changed one.

        >>> store.check_blocks_batch(np.array([0, 2]), np.array([0, 100]), np.array([10, 4096]))  # doctest: +SKIP
        """
        if self._all_verified:
            self._require_open()
            return
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        lo_tok = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi_tok = np.asarray(stops, dtype=np.int64).reshape(-1)
        if not fl.shape == lo_tok.shape == hi_tok.shape:
            raise ValueError(f"files, starts and stops differ in length ({fl.size}, {lo_tok.size}, {hi_tok.size})")
        file_list = fl.tolist()
        if not file_list:
            return
        if file_list.count(file_list[0]) == len(file_list):
            self.check_blocks(file_list[0], lo_tok, hi_tok)
            return
        if len(file_list) > _SMALL:
            for f in distinct_ints(fl):
                mine = fl == f
                self.check_blocks(f, lo_tok[mine], hi_tok[mine])
            return
        blocks_of, records = self._blocks, self._records
        for f, a, b in zip(file_list, lo_tok.tolist(), hi_tok.tolist()):
            if not 0 <= f < len(records):
                raise IndexError(f"file {f} out of range for a store of {len(records)} files")
            blocks = blocks_of[f]
            if blocks is None:
                self._require_open()
                self._map(f)
                blocks = blocks_of[f]
                if blocks is None:
                    continue
            if blocks.complete or b <= a:
                continue
            if a < 0 or b > records[f].num_tokens:
                raise IndexError(f"token range [{a}, {b}) out of bounds for file {f} of {records[f].num_tokens} tokens")
            self._check_span(f, a, b)

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
        for spec in _CRC_TABLES:
            if self._version < spec.since:
                continue
            recorded = self._meta["layout"][spec.key]["sha256"]
            digest = sha256_file(self._path / spec.name)
            if digest != recorded:
                raise StoreCorruptError(
                    f"{self._table_where(spec.name)} changed since it was built (sha256 {digest[:16]}..., recorded "
                    f"{str(recorded)[:16]}...): the {spec.entry} checks cannot be trusted; {REBUILD_HINT}"
                )
        self._all_verified = False
        for f, rec in enumerate(self._records):
            self._map(f)
            blocks = self._blocks[f]
            if blocks is None:
                digest = sha256_file(self._path / rec.name)
            else:
                blocks.reset()
                self._verify_span(rec, blocks, 0, blocks.count - 1)
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
                self._verify_documents([(f, d, bounds[d], bounds[d + 1]) for d in range(rec.num_documents)])

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
            self._mapped = [None] * len(self._records)
            self._blocks = [None] * len(self._records)
            self._doc_offsets = None
            self._lengths = None
            self._tables = {}
            self._documents_verified = None

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # Processes (e.g. DataLoader workers under spawn) get the path and fingerprint,
        # never the tokens; the receiver re-opens and checks it sees the same store.
        return (_reopen, (str(self._path), self.fingerprint))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _reopen(path: str, fingerprint: str) -> TokenStore:
    store = TokenStore.open(path)
    if store.fingerprint != fingerprint:
        raise StoreCorruptError(
            f"token store {path} changed (fingerprint {store.fingerprint[:16]}..., expected {fingerprint[:16]}...) "
            f"between processes; {REBUILD_HINT}"
        )
    return store

