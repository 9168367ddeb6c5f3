"""A task's share of a files source: count each file's documents cheaply, then read only the rows it owns.

Why: in a multi-task build (:mod:`impl.build_tasks`) store file ``f`` holds
the source's documents ``[f * docs_per_file, (f + 1) * docs_per_file)`` and
belongs to task ``f % N``; parsing the whole source in every task costs N
times the reading. Counting is far cheaper than parsing: a parquet file's
row groups are in its footer, an Arrow file's record batches carry their
row counts, and a JSON Lines / txt file is one pass over its bytes that
notes where each document starts (no JSON is parsed). A task then reads
only the row groups, record batches or byte ranges of its own documents,
with the same decoding rules as :mod:`impl.sources`, so its token files are
the ones a full read gives. Compressed text (``.gz``) cannot be entered in
the middle: such a source is read whole, as before.

Worked example: two jsonl files of 4 and 3 documents, ``docs_per_file=2``,
2 tasks: store files hold documents [0,2) [2,4) [4,6) [6,7); task 1 owns
files 1 and 3, reads bytes of documents 2..3 of the first file and
document 2 of the second, and parses 3 records instead of 7.
"""

from __future__ import annotations

import io
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from impl import sources
from impl.errors import SourceError

__all__ = ["FileDocs", "count_documents", "owned_ranges"]

_BOM = b"\xef\xbb\xbf"
_ASCII_WS = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"   # what str.strip() strips among ASCII bytes


@dataclass(frozen=True, kw_only=True)
class FileDocs:
    """One source file's documents: their count and, for text, where each starts (byte) and its line number."""

    path: Path
    kind: str
    count: int
    offsets: array[int] | None = None
    linenos: array[int] | None = None
    groups: tuple[int, ...] = ()


def _blank(body: bytes) -> bool:
    stripped = body.strip(_ASCII_WS)
    if not stripped:
        return True
    if stripped.isascii():
        return False
    return not body.decode("utf-8", "replace").strip()


def _text_docs(path: Path, kind: str) -> FileDocs:
    offsets, linenos = array("q"), array("q")
    pos = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            body = line[len(_BOM):] if lineno == 1 and line.startswith(_BOM) else line
            if body and (kind == "txt" or not _blank(body)):
                offsets.append(pos)
                linenos.append(lineno)
            pos += len(line)
    return FileDocs(path=path, kind=kind, count=len(offsets), offsets=offsets, linenos=linenos)


def _arrow_batches(path: Path) -> tuple[Any, list[Any]]:
    mm = pa.memory_map(str(path), "r")
    try:
        reader = pa.ipc.open_file(mm)
        return mm, [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except pa.ArrowInvalid:
        mm.seek(0)
        return mm, list(pa.ipc.open_stream(mm))


def count_documents(path: Path) -> FileDocs | None:
    """``path``'s documents as :mod:`impl.sources` reads them, counted without parsing; None for compressed text."""
    kind = sources._suffix_kind(path)
    if kind in ("jsonl", "txt"):
        return None if path.name.lower().endswith(".gz") else _text_docs(path, kind)
    if kind == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
        groups = tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
        return FileDocs(path=path, kind=kind, count=sum(groups), groups=groups)
    if kind == "arrow":
        mm, batches = _arrow_batches(path)
        with mm:
            groups = tuple(b.num_rows for b in batches)
        return FileDocs(path=path, kind=kind, count=sum(groups), groups=groups)
    return None


def _column_rows(where: str, table_or_batch: Any, text_field: str, start: int, stop: int) -> list[str]:
    names = table_or_batch.schema.names
    if text_field not in names:
        raise sources._missing_field(where, text_field, names)
    col = table_or_batch.column(names.index(text_field)).slice(start, stop - start)
    sources._check_arrow_column(col, where, text_field)
    rows: list[str] = col.to_pylist()
    return rows


def _grouped(docs: FileDocs, start: int, stop: int, text_field: str) -> list[str]:
    where = str(docs.path)
    out: list[str] = []
    if docs.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(docs.path)
        batches = None
        mm = None
    else:
        mm, batches = _arrow_batches(docs.path)
    try:
        first = 0
        for g, rows in enumerate(docs.groups):
            lo, hi = max(start, first), min(stop, first + rows)
            if lo < hi:
                part = pf.read_row_group(g, columns=[text_field]) if batches is None else batches[g]
                out += _column_rows(where, part, text_field, lo - first, hi - first)
            first += rows
    finally:
        if mm is not None:
            mm.close()
    return out


def _text_rows(docs: FileDocs, start: int, stop: int, text_field: str) -> list[str]:
    assert docs.offsets is not None and docs.linenos is not None
    begin = docs.offsets[start]
    with open(docs.path, "rb") as f:
        f.seek(begin)
        raw = f.read(docs.offsets[stop] - begin) if stop < docs.count else f.read()
    text = raw.decode("utf-8-sig" if begin == 0 else "utf-8")
    lines = io.StringIO(text, newline="\n")
    where = str(docs.path)
    if docs.kind == "jsonl":
        return list(sources._jsonl_texts(lines, where, text_field, first_lineno=docs.linenos[start]))
    return list(sources._txt_lines(lines))


def read_rows(docs: FileDocs, start: int, stop: int, text_field: str) -> list[str]:
    """Documents ``[start, stop)`` of one file, as a full read of the source gives them (its errors too)."""
    try:
        if docs.kind in ("parquet", "arrow"):
            return _grouped(docs, start, stop, text_field)
        return _text_rows(docs, start, stop, text_field)
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"{docs.path}{sources._first_bad_utf8_line(docs.path)}: not valid UTF-8 (byte "
            f"{exc.object[exc.start:exc.start + 1]!r}: {exc.reason}): re-encode the file as UTF-8 (e.g. `iconv -f "
            "latin1 -t utf-8`)") from exc
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise SourceError(f"{docs.path}: disappeared during the build ({exc})") from exc
        raise SourceError(f"{docs.path}: cannot be read as {docs.kind} ({type(exc).__name__}: {exc})") from exc


def owned_ranges(files: tuple[Path, ...], text_field: str, docs_per_file: int, task: int,
                 tasks: int) -> tuple[int, Iterator[tuple[int, list[str]]]] | None:
    """``(number of store files, (file index, texts) of the files task ``task`` owns)``; None: read the source whole."""
    counted = []
    for p in files:
        docs = count_documents(p)
        if docs is None:
            return None
        counted.append(docs)
    total = sum(d.count for d in counted)
    num_files = math.ceil(total / docs_per_file)

    def gen() -> Iterator[tuple[int, list[str]]]:
        starts, at = [], 0
        for d in counted:
            starts.append(at)
            at += d.count
        for f in range(task, num_files, tasks):
            lo, hi = f * docs_per_file, min((f + 1) * docs_per_file, total)
            texts: list[str] = []
            for d, first in zip(counted, starts):
                a, b = max(lo, first), min(hi, first + d.count)
                if a < b:
                    texts += read_rows(d, a - first, b - first, text_field)
            yield f, texts

    return num_files, gen()
