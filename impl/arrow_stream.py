"""Arrow IPC stream files (HF ``datasets``' ``.arrow``) read a record batch at a time (STREAM-18).

Conforms to STREAM-18; its model is ``reference.arrow_stream``: the units
:func:`stream_units` finds are the reference's byte ranges, and
:func:`read_stream_batch` yields the batch's rows as the reference does.

Why pyarrow's message reader: it walks the same framing (continuation
marker, metadata length, flatbuffer ``Message``, body) the reference parses
by hand, so the byte position after each message is the end of its range;
reading batch g alone is then ``read_message`` on that range of the mapped
file and ``read_record_batch`` against the schema (the stream's first
message), without touching the batches before it.

Worked example::

    >>> import pyarrow as pa, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); sink = pa.BufferOutputStream()
    >>> with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as w:
    ...     for rows in (["ab", "c"], [], ["def"]):
    ...         w.write_batch(pa.record_batch([pa.array(rows, pa.string())], names=["text"]))
    >>> _ = (d / "s.arrow").write_bytes(sink.getvalue().to_pybytes())
    >>> from impl.files import LocalFiles
    >>> stream_units(LocalFiles(d), "s.arrow", "text")
    [(120, 304, 2), (304, 464, 0), (464, 640, 1)]
    >>> read_stream_batch(LocalFiles(d), "s.arrow", 464, 640, "text")
    ['def']
"""

from __future__ import annotations

from typing import Any

from impl.errors import SourceError, require
from impl.files import FileAccess

__all__ = ["FILE_MAGIC", "is_arrow_stream", "read_stream_batch", "stream_units"]

FILE_MAGIC = b"ARROW1"


def is_arrow_stream(files: FileAccess, name: str) -> bool:
    """Whether an ``.arrow`` file is an IPC stream (STREAM-18) rather than an IPC file (STREAM-4): no file magic."""
    with files.open(name) as f:
        return f.read(len(FILE_MAGIC)) != FILE_MAGIC


def _unreadable(files: FileAccess, name: str, exc: BaseException) -> SourceError:
    return SourceError(f"{files.where(name)} cannot be read as an Arrow IPC stream ({exc}); it is damaged or "
                       "truncated: write it again (save_to_disk) or leave it out of paths")


def stream_units(files: FileAccess, name: str, text_field: str) -> list[tuple[int, int, int]]:
    """One ``(a_g, b_g, rows)`` per record batch, ``[a_g, b_g)`` its message's bytes, after checking the text column (STREAM-18)."""
    import pyarrow as pa

    src = pa.BufferReader(pa.py_buffer(files.map(name)))
    units: list[tuple[int, int, int]] = []
    try:
        reader = pa.ipc.MessageReader.open_stream(src)
        first = reader.read_next_message()
        require(first.type == "schema", SourceError,
                f"{files.where(name)}: the stream does not start with a schema message; it is not an Arrow IPC stream")
        schema = pa.ipc.read_schema(first)
        require(text_field in schema.names, SourceError,
                f"{files.where(name)} has no column {text_field!r} (its columns: {schema.names}); pass "
                "text_field=<the name of the text column>")
        start = src.tell()
        for msg in reader:
            require(msg.type == "record batch", SourceError,
                    f"{files.where(name)}: the message at byte {start} is "
                    f"{'a dictionary batch (a dictionary-encoded column)' if 'dictionary' in msg.type else msg.type}"
                    ", not a record batch; cast the columns to plain types and write the file again")
            units.append((start, src.tell(), pa.ipc.read_record_batch(msg, schema).num_rows))
            start = src.tell()
    except StopIteration:
        raise SourceError(f"{files.where(name)}: holds no schema message; it is not an Arrow IPC stream") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(files, name, exc) from None
    return units


def read_stream_batch(files: FileAccess, name: str, start: int, stop: int, text_field: str) -> list[str]:
    """The text column of the record batch at bytes ``[start, stop)``, read alone (STREAM-18)."""
    import pyarrow as pa

    buf = pa.py_buffer(files.map(name))
    try:
        schema = pa.ipc.open_stream(buf).schema
        msg: Any = pa.ipc.read_message(buf.slice(start, stop - start))
        batch = pa.ipc.read_record_batch(msg, schema)
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        raise _unreadable(files, name, exc) from None
    require(text_field in batch.schema.names, SourceError,
            f"{files.where(name)} has no column {text_field!r} (its columns: {batch.schema.names}); pass "
            "text_field=<the name of the text column>")
    values: list[str] = batch.column(batch.schema.get_field_index(text_field)).to_pylist()
    for r, v in enumerate(values):
        require(isinstance(v, str), SourceError,
                f"{files.where(name)}: row {r} of the record batch at byte {start} has {type(v).__name__} {v!r:.40} "
                f"in column {text_field!r}, not a string; fix the data or pass text_field=<a string column>")
    return values
