"""Streaming sources cut into units of random access, and the unit index (STREAM-1 .. STREAM-5).

Why units: a corpus held as raw text (jsonl, txt, parquet, Arrow) is too large
to tokenize before training, so a streaming loader reads it in pieces. A
*unit* is the smallest piece it can open without reading what comes before
it: a newline-aligned byte range of a jsonl / txt file (STREAM-1), a whole
compressed file (STREAM-3), a parquet row group or an Arrow record batch
(STREAM-4), an Arrow IPC stream's record batch (STREAM-18, in
``reference.arrow_stream``). Every row of the source belongs to exactly one unit, so a row is
named by ``(unit, row)`` and a resume re-reads a row by opening one unit.

The model: a source is a list of files. A text file holds its (decompressed)
bytes, so the line-range rule is checkable on bytes; a row file holds its
groups of already decoded text rows. The unit index records, per file, what
identifies it (path, size, mtime or ETag as the caller's ``etag`` string) and
its units with their row counts; its fingerprint is the sha256 of its
canonical JSON (STREAM-5).

Worked example (a txt file of three lines cut at a target of 4 bytes)::

    >>> f = TextFile(path="a.txt", data=b"ab\\ncdef\\ng")
    >>> line_ranges(f.data, 4)
    [(0, 8), (8, 9)]
    >>> index = build_index([f], unit_bytes=4)
    >>> [(u.start, u.stop, u.rows) for u in index.units]
    [(0, 8, 2), (8, 9, 1)]
    >>> read_unit([f], index, 0)
    ['ab', 'cdef']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reference.arrow_stream import ArrowStreamFile, stream_rows, stream_units
from reference.errors import ConfigError, SourceError, is_int, require

TEXT_FORMATS = ("txt", "jsonl")
ROW_FORMATS = ("parquet", "arrow")
INDEX_FORMAT = "loadspec.unit_index"
INDEX_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class TextFile:
    """A jsonl or txt file: its decompressed bytes, and what identifies it on storage (STREAM-1 .. STREAM-3).

    ``size`` is the byte size on storage; None means ``len(data)``, which only
    an uncompressed file may use (a compressed file's stored size is not the
    length of its decompressed bytes). ``etag`` is the mtime or ETag, as a string.

    >>> TextFile(path="a.jsonl.gz", data=b"{}\\n", compressed=True)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: a.jsonl.gz: compressed=True needs size=<bytes on storage>; pass the compressed file's size
    """

    path: str
    data: bytes
    format: Literal["txt", "jsonl"] = "txt"
    etag: str = ""
    compressed: bool = False
    size: int | None = None

    def __post_init__(self) -> None:
        require(self.format in TEXT_FORMATS, ConfigError,
                f"{self.path}: format={self.format!r} is not a text format; choose one of {TEXT_FORMATS}")
        require(isinstance(self.data, bytes), ConfigError, f"{self.path}: data must be bytes")
        require(not self.compressed or self.size is not None, ConfigError,
                f"{self.path}: compressed=True needs size=<bytes on storage>; pass the compressed file's size")
        require(self.size is None or (is_int(self.size) and self.size >= 0), ConfigError,
                f"{self.path}: size={self.size!r} must be a non-negative integer (bytes on storage)")


@dataclass(frozen=True, kw_only=True, slots=True)
class RowFile:
    """A parquet file (groups = row groups) or an Arrow file (groups = record batches), rows already decoded (STREAM-4).

    >>> RowFile(path="a.parquet", groups=(("x", "y"), ("z",)), size=100).groups[1]
    ('z',)
    """

    path: str
    groups: tuple[tuple[str, ...], ...]
    format: Literal["parquet", "arrow"] = "parquet"
    size: int = 0
    etag: str = ""

    def __post_init__(self) -> None:
        require(self.format in ROW_FORMATS, ConfigError,
                f"{self.path}: format={self.format!r} is not a row format; choose one of {ROW_FORMATS}")
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        require(all(isinstance(row, str) for g in self.groups for row in g), SourceError,
                f"{self.path}: every row must be a string (the text column); pass the text field's values")
        require(is_int(self.size) and self.size >= 0, ConfigError,
                f"{self.path}: size={self.size!r} must be a non-negative integer (bytes on storage)")


SourceFile = TextFile | RowFile | ArrowStreamFile


def line_ranges(data: bytes, target: int) -> list[tuple[int, int]]:
    """Cut ``data`` into newline-aligned byte ranges of at least ``target`` bytes (STREAM-1).

    Range k is ``[a_k, b_k)`` with ``a_0 = 0``, ``a_{k+1} = b_k``, and ``b_k``
    one past the first newline at or after byte ``a_k + target - 1``, or the
    file size S when there is none; the cut stops when ``a_k = S``. So every
    range starts at 0 or just after a newline and ends just after a newline
    or at S, every range but the last holds at least ``target`` bytes, and a
    line (the bytes up to and including its newline, or up to S) never
    straddles two ranges. An empty file has no range.

    >>> line_ranges(b"a\\nbb\\nccc\\n", 3)
    [(0, 5), (5, 9)]
    >>> line_ranges(b"a\\nbb\\nccc\\n", 1)
    [(0, 2), (2, 5), (5, 9)]
    >>> line_ranges(b"", 4)
    []
    """
    require(is_int(target) and target >= 1, ConfigError, f"unit_bytes={target!r} must be an integer >= 1")
    ranges, start, size = [], 0, len(data)
    while start < size:
        newline = data.find(b"\n", start + target - 1)
        stop = size if newline < 0 else newline + 1
        ranges.append((start, stop))
        start = stop
    return ranges


def range_lines(data: bytes, start: int, stop: int) -> list[bytes]:
    """The lines of ``data[start:stop]`` without their newline; a final newline opens no empty line (STREAM-2).

    >>> range_lines(b"a\\n\\nb", 0, 5)
    [b'a', b'', b'b']
    """
    chunk = data[start:stop]
    lines = chunk.split(b"\n")
    return lines[:-1] if chunk.endswith(b"\n") else lines


UTF8_BOM = b"\xef\xbb\xbf"
"""A UTF-8 byte order mark: at a text file's first byte it marks the encoding and is not text (STREAM-2)."""


def _decode(file: TextFile, offset: int, line: bytes, text_field: str) -> str:
    """One line as text (STREAM-2): UTF-8; for jsonl the string at ``text_field`` of the line's JSON object."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{file.path}: the line at byte {offset} is not UTF-8 ({exc.reason}); "
                          "re-encode the file as UTF-8") from None
    if file.format == "txt":
        return text
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{file.path}: the line at byte {offset} is not JSON ({exc.msg}); fix or remove the line") from None
    value = record.get(text_field) if isinstance(record, dict) else None
    require(isinstance(value, str), SourceError,
            f"{file.path}: the line at byte {offset} has no string field {text_field!r}; "
            f"pass text_field=<the name of the text field> or fix the record")
    assert isinstance(value, str)
    return value


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of random access (STREAM-1, STREAM-3, STREAM-4).

    ``start``/``stop``: the byte range of an uncompressed text file; ``0`` and
    the decompressed length for a compressed file; ``g`` and ``g + 1`` for row
    group (record batch) ``g`` of a row file. ``rows``: how many rows it holds.
    """

    file: int
    start: int
    stop: int
    rows: int


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitIndex:
    """Every unit of a source, and what identifies each file (STREAM-5).

    The fingerprint covers the index's format and version, ``unit_bytes``,
    every file in order (path, format, compressed, size, etag) and every unit
    (file, start, stop, rows): a file changed on storage changes its size or
    etag and so the fingerprint. It does not cover the bytes themselves (the
    etag stands for them), the tokenizer or any loader option.
    """

    unit_bytes: int
    files: tuple[tuple[str, str, bool, int, str], ...]
    units: tuple[Unit, ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "unit_bytes": self.unit_bytes,
                "files": [list(f) for f in self.files], "units": [[u.file, u.start, u.stop, u.rows] for u in self.units]}

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON (sorted keys, no spaces) of ``to_json()`` (STREAM-5).

        >>> build_index([TextFile(path="a.txt", data=b"x\\n", etag="1")]).fingerprint != \\
        ...     build_index([TextFile(path="a.txt", data=b"x\\n", etag="2")]).fingerprint
        True
        """
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def row_starts(self) -> list[int]:
        """The global row number of each unit's first row: rows are numbered unit by unit in index order (STREAM-9)."""
        starts, total = [], 0
        for u in self.units:
            starts.append(total)
            total += u.rows
        return starts


def build_index(files: Sequence[SourceFile], unit_bytes: int = 1 << 20) -> UnitIndex:
    """The unit index of a source: its files' identities and units, in file order (STREAM-1, STREAM-3 .. STREAM-5).

    >>> rows = RowFile(path="b.parquet", groups=(("x", "y"), (), ("z",)), size=10, etag="7")
    >>> gz = TextFile(path="c.txt.gz", data=b"p\\nq\\n", compressed=True, size=3)
    >>> [(u.file, u.start, u.stop, u.rows) for u in build_index([rows, gz], unit_bytes=1).units]
    [(0, 0, 1, 2), (0, 1, 2, 0), (0, 2, 3, 1), (1, 0, 4, 2)]
    """
    require(is_int(unit_bytes) and unit_bytes >= 1, ConfigError,
            f"unit_bytes={unit_bytes!r} must be an integer >= 1 (the target byte size of a text unit)")
    entries: list[tuple[str, str, bool, int, str]] = []
    units: list[Unit] = []
    for i, f in enumerate(files):
        if isinstance(f, TextFile):
            entries.append((f.path, f.format, f.compressed, len(f.data) if f.size is None else f.size, f.etag))
            spans = [(0, len(f.data))] if f.compressed and f.data else line_ranges(f.data, unit_bytes)
            units.extend(Unit(i, a, b, len(range_lines(f.data, a, b))) for a, b in spans)
        elif isinstance(f, ArrowStreamFile):    # record batch g is its message's byte range (STREAM-18)
            entries.append((f.path, "arrow_stream", False, len(f.data), f.etag))
            units.extend(Unit(i, a, b, n) for a, b, n in stream_units(f))
        else:
            require(isinstance(f, RowFile), ConfigError,
                    f"files[{i}]={f!r} must be a TextFile, a RowFile or an ArrowStreamFile")
            entries.append((f.path, f.format, False, f.size, f.etag))
            units.extend(Unit(i, g, g + 1, len(rows)) for g, rows in enumerate(f.groups))
    return UnitIndex(unit_bytes=unit_bytes, files=tuple(entries), units=tuple(units))


ON_ERROR = ("raise", "skip")


def read_unit(files: Sequence[SourceFile], index: UnitIndex, unit: int, text_field: str = "text",
              on_error: str = "raise") -> list[str | None]:
    """The rows of one unit, as text, in stored order: what opening that unit alone yields (STREAM-2 .. STREAM-4).

    A compressed file is one unit, so reading any of its rows decompresses it
    from its start (STREAM-3). With ``on_error="skip"`` a line STREAM-2 would
    refuse is ``None`` in its place, so rows keep their numbers (STREAM-17).

    >>> f = TextFile(path="s.jsonl", data=b'{"text": "a"}\\n{oops\\n{"text": "b"}\\n', format="jsonl")
    >>> read_unit([f], build_index([f]), 0, on_error="skip")
    ['a', None, 'b']

    >>> f = TextFile(path="a.jsonl", data=b'{"text": "hi"}\\n{"text": ""}\\n', format="jsonl")
    >>> read_unit([f], build_index([f]), 0)
    ['hi', '']
    >>> bad = TextFile(path="b.jsonl", data=b'{"body": "hi"}\\n', format="jsonl")
    >>> read_unit([bad], build_index([bad]), 0)
    Traceback (most recent call last):
    ...
    reference.errors.SourceError: b.jsonl: the line at byte 0 has no string field 'text'; pass text_field=<the name of the text field> or fix the record
    """
    u = index.units[unit]
    f = files[u.file]
    if isinstance(f, RowFile):
        return list[str | None](f.groups[u.start])
    if isinstance(f, ArrowStreamFile):
        return list[str | None](stream_rows(f, u.start))
    require(on_error in ON_ERROR, ConfigError, f"on_error={on_error!r} must be one of {ON_ERROR}")
    lines, offset = range_lines(f.data, u.start, u.stop), u.start
    if u.start == 0 and lines and lines[0].startswith(UTF8_BOM):    # a file's leading BOM is not text (STREAM-2)
        lines[0], offset = lines[0][len(UTF8_BOM):], len(UTF8_BOM)
    out: list[str | None] = []
    for line in lines:
        try:
            out.append(_decode(f, offset, line, text_field))
        except SourceError:
            if on_error == "raise":
                raise
            out.append(None)
        offset += len(line) + 1
    return out
