"""Arrow IPC stream files cut into units, one record batch each, found by scanning message headers (STREAM-18).

Why a unit kind of its own: HF ``datasets`` writes its data (``save_to_disk``
directories, ``load_dataset`` caches) as ``.arrow`` files in the Arrow IPC
*stream* format, which has no footer listing its record batches as the IPC
*file* format of STREAM-4 has. Each batch is still one message at a fixed
byte range, so one scan of the message headers finds every batch's range
and a batch is then read alone: the schema message plus that range.

The framing read here (stdlib only) is the stream's: each message is an
optional continuation marker ``0xFFFFFFFF``, a little-endian int32 metadata
length ``m``, ``m`` bytes of flatbuffer ``Message`` (field 1 its header type:
1 schema, 2 dictionary batch, 3 record batch; field 3 its ``bodyLength``
``n``), then ``n`` body bytes; a zero length or the end of the bytes ends
the stream. Decoding a batch's rows is modelled, as parquet and Arrow files
are in ``reference.units``: :class:`ArrowStreamFile` carries each batch's
decoded text rows beside the file's bytes.

Worked example (a stream of one column, batches of 2, 0 and 1 rows, as
``pyarrow.ipc.new_stream`` writes it: 648 bytes)::

    schema          bytes [0, 120)
    record batch 0  bytes [120, 304)  rows ("ab", "c")   -> unit (120, 304, 2)
    record batch 1  bytes [304, 464)  rows ()            -> unit (304, 464, 0)
    record batch 2  bytes [464, 640)  rows ("def",)      -> unit (464, 640, 1)
    end marker      bytes [640, 648)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from reference.errors import ConfigError, SourceError, is_int, require

FILE_MAGIC = b"ARROW1"
SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3
_CONTINUATION = b"\xff\xff\xff\xff"


@dataclass(frozen=True, kw_only=True, slots=True)
class ArrowStreamFile:
    """An Arrow IPC stream file: its bytes (for the framing) and each record batch's decoded text rows (STREAM-18).

    >>> ArrowStreamFile(path="a.arrow", data=b"ARROW1\\0\\0", groups=())
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: a.arrow: the bytes start with the Arrow file magic; an Arrow IPC file is RowFile(format='arrow') (STREAM-4)
    """

    path: str
    data: bytes
    groups: tuple[tuple[str, ...], ...]
    etag: str = ""

    def __post_init__(self) -> None:
        require(isinstance(self.data, bytes), ConfigError, f"{self.path}: data must be bytes")
        require(not self.data.startswith(FILE_MAGIC), ConfigError,
                f"{self.path}: the bytes start with the Arrow file magic; an Arrow IPC file is "
                "RowFile(format='arrow') (STREAM-4)")
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        require(all(isinstance(row, str) for g in self.groups for row in g), SourceError,
                f"{self.path}: every row must be a string (the text column); pass the text field's values")


def _u(fmt: str, data: bytes, at: int) -> int:
    value: int = struct.unpack_from(fmt, data, at)[0]
    return value


def message_header(meta: bytes) -> tuple[int, int]:
    """``(header type, bodyLength)`` of a flatbuffer ``Message``: fields 1 and 3 of its root table (0 when absent).

    >>> meta = bytes.fromhex("100000000c00100000000400000008000c000000030000002000000000000000")
    >>> message_header(meta)
    (3, 32)
    """
    root = _u("<I", meta, 0)
    vtable = root - _u("<i", meta, root)
    vt_size = _u("<H", meta, vtable)

    def field(k: int) -> int:
        at = 4 + 2 * k
        return _u("<H", meta, vtable + at) if at < vt_size else 0

    kind, body = field(1), field(3)
    return (meta[root + kind] if kind else 0), (_u("<q", meta, root + body) if body else 0)


def stream_batches(path: str, data: bytes) -> list[tuple[int, int]]:
    """The byte range ``[a_g, b_g)`` of each record batch message of an Arrow IPC stream, in order (STREAM-18).

    The first message must be the schema; a dictionary batch (its batches
    could not be read alone), any other message kind, or a message running
    past the end raises ``SourceError`` naming the file.

    >>> import struct
    >>> def msg(kind, body):
    ...     meta = struct.pack("<I6H", 16, 12, 16, 0, 4, 0, 8) + struct.pack("<iBxxxq", 12, kind, body)
    ...     return b"\\xff\\xff\\xff\\xff" + struct.pack("<i", len(meta)) + meta + bytes(body)
    >>> stream_batches("s.arrow", msg(1, 0) + msg(3, 8) + msg(3, 0) + bytes(8))
    [(40, 88), (88, 128)]
    """
    out: list[tuple[int, int]] = []
    at, size, first = 0, len(data), True
    while at + 4 <= size:
        start = at
        if data[at:at + 4] == _CONTINUATION:
            at += 4
        require(at + 4 <= size, SourceError, f"{path}: the message at byte {start} is cut short; the file is "
                "truncated: write it again")
        length = _u("<i", data, at)
        at += 4
        if length == 0:
            break
        require(0 < length and at + length <= size, SourceError,
                f"{path}: the message at byte {start} declares {length} metadata bytes, past the file's {size}; "
                "it is not an Arrow IPC stream or is truncated: write it again")
        try:
            kind, body = message_header(data[at:at + length])
        except struct.error:
            raise SourceError(f"{path}: the message at byte {start} has no readable header; it is not an Arrow IPC "
                              "stream or is damaged: write it again") from None
        at += length + body
        require(0 <= body and at <= size, SourceError, f"{path}: the message at byte {start} runs past the end of "
                "the file; the file is truncated: write it again")
        require(not first or kind == SCHEMA, SourceError,
                f"{path}: the stream does not start with a schema message; it is not an Arrow IPC stream")
        require(first or kind == RECORD_BATCH, SourceError,
                f"{path}: the message at byte {start} is " +
                ("a dictionary batch (a dictionary-encoded column)" if kind == DICTIONARY_BATCH else f"of kind {kind}")
                + ", not a record batch; cast the columns to plain types and write the file again")
        if not first:
            out.append((start, at))
        first = False
    require(not first, SourceError, f"{path}: holds no schema message; it is not an Arrow IPC stream")
    return out


def stream_units(file: ArrowStreamFile) -> list[tuple[int, int, int]]:
    """``(a_g, b_g, rows)`` per record batch g: the units of an Arrow stream file (STREAM-18)."""
    spans = stream_batches(file.path, file.data)
    require(len(spans) == len(file.groups), ConfigError,
            f"{file.path}: the stream holds {len(spans)} record batches but groups has {len(file.groups)}; pass one "
            "group of rows per record batch")
    return [(a, b, len(rows)) for (a, b), rows in zip(spans, file.groups, strict=True)]


def stream_rows(file: ArrowStreamFile, start: int) -> tuple[str, ...]:
    """The rows of the record batch whose message starts at byte ``start`` (STREAM-18)."""
    starts = [a for a, _ in stream_batches(file.path, file.data)]
    require(is_int(start) and start in starts, SourceError,
            f"{file.path}: no record batch starts at byte {start}; the file changed since its unit index was built: "
            "build the index again")
    return file.groups[starts.index(start)]
