"""Sources: turn whatever the user points a build at into ordered batches of document texts.

Why a module of its own: a token store's contract is "document ``i`` is the
``i``-th document of the source". Deciding what the documents of a source
*are*, and in which order, is independent of how they are tokenized and
stored, and it is where most user mistakes surface (a wrong column, a
``DatasetDict`` without ``split=``, a null value, a non-UTF-8 file). Every
accepted kind of source is reduced here to one :class:`Source`:

* ``batches()`` yields lists of ``str`` in source order, re-readable (each
  call starts again from the first document), never dropping or reordering a
  document (empty ones are kept; blank JSON Lines are not records);
* ``fingerprint`` identifies the content cheaply when that is possible (file
  paths, sizes and mtimes; a ``datasets`` fingerprint; the hash of an
  in-memory list of strings) and is ``None`` for one-shot iterators, so a
  build can tell "the same source again" from "a different one";
* ``num_documents`` is known up front when it is cheap (datasets, parquet
  metadata, lists) and ``None`` otherwise (progress bars and worker counts
  use it, nothing else relies on it);
* ``num_bytes`` is the size of the files read (a stat per file) and
  ``batches_with_bytes()`` yields each batch with the bytes of those files
  read so far, so a build whose document count is unknown (JSON Lines, txt)
  can still show a total, a rate and an ETA; both are ``None`` for sources
  that are not files.

Accepted sources: ``datasets.Dataset`` / ``IterableDataset``; a
``DatasetDict`` with ``split=``; a parquet, arrow (IPC file or stream), JSON
Lines (``.jsonl``/``.ndjson``/``.json``) or txt file (one document a line,
UTF-8; a leading byte order mark is dropped), optionally gzipped for the text formats, or a directory of them (recursive,
sorted by relative path, hidden entries skipped); a ``save_to_disk``
directory; a ``load_dataset`` cache directory; a list of ``pathlib.Path``
files; an iterable of strings or of dicts holding ``text_field``. A ``str``
source is a path; strings *inside* an iterable are documents.

Worked example::

    >>> src = resolve_source(["Hello world", "", "Bye"], text_field="text", split=None)
    >>> src.kind, src.num_documents, list(src.batches())
    ('iterable', 3, [['Hello world', '', 'Bye']])
    >>> src.fingerprint == resolve_source(("Hello world", "", "Bye"), text_field="text", split=None).fingerprint
    True
    >>> rows = resolve_source([{"text": "a"}, {"text": "b", "id": 7}], text_field="text", split=None)
    >>> list(rows.batches()), rows.fingerprint       # dicts are not fingerprinted
    ([['a', 'b']], None)
    >>> list(resolve_source([{"body": "a"}], text_field="text", split=None).batches())
    Traceback (most recent call last):
    ...
    impl.errors.SourceError: document 0 has no column 'text' (columns: ['body']): pass text_field=<one of them>
    >>> list(rechunk(iter([["a", "b", "c"], ["d", "e"]]), 2))   # a build's per-file ranges
    [['a', 'b'], ['c', 'd'], ['e']]
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import itertools
import json
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from impl.errors import ConfigError, EmptyDataError, SourceError

__all__ = ["Source", "rechunk", "resolve_source"]

_TEXT_BATCH = 8192

_DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".txt", ".txt.gz")
_FILE_SUFFIXES = _DATA_SUFFIXES + (".json", ".json.gz")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """A resolved source: what it is, how to recognise it again, and its documents in order.

    ``kind`` and ``description`` are recorded in a store's ``meta.json``
    (``description`` is JSON: a name, or the directory and files read);
    ``fingerprint`` is ``None`` when the source cannot be recognised again (an
    iterator); ``batches()`` re-reads the source from its first document.
    """

    kind: str
    description: Any
    fingerprint: str | None
    num_documents: int | None
    batches: Callable[[], Iterator[list[str]]]
    num_bytes: int | None = None
    batches_with_bytes: Callable[[], Iterator[tuple[list[str], int]]] | None = None
    files: tuple[Path, ...] = ()
    text_field: str | None = None

    def describe(self) -> str:
        """Short human-readable identification for error messages."""
        return f"{self.kind} {json.dumps(self.description)[:200]}"


def _check_texts(texts: list[Any], where: str, start: int) -> list[str]:
    for j, t in enumerate(texts):
        if not isinstance(t, str):
            raise SourceError(
                f"document {start + j} ({where}) is {type(t).__name__} {t!r:.60}, not a string: fix the source "
                "(documents must be text; use '' for an empty document) or choose another text_field"
            )
    return texts


def _check_arrow_column(col: Any, where: str, text_field: str) -> None:
    t = col.type
    ok = pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t)
    if not ok:
        raise SourceError(f"{where}: column {text_field!r} has type {t}, not string: choose a text column with text_field=")
    if col.null_count:
        raise SourceError(
            f"{where}: column {text_field!r} holds {col.null_count} null value(s): fill them (e.g. with '') or drop "
            "those rows before building; documents are never dropped silently"
        )


def _missing_field(where: str, text_field: str, columns: Iterable[str]) -> SourceError:
    return SourceError(f"{where} has no column {text_field!r} (columns: {sorted(columns)}): pass text_field=<one of them>")


def _batches_from_dataset(ds: Any, text_field: str, where: str) -> Callable[[], Iterator[list[str]]]:
    if text_field not in ds.column_names:
        raise _missing_field(where, text_field, ds.column_names)

    def gen() -> Iterator[list[str]]:
        col_ds = ds.select_columns([text_field]).with_format("arrow")
        n = len(col_ds)
        for start in range(0, n, _TEXT_BATCH):
            table = col_ds[start : min(n, start + _TEXT_BATCH)]
            col = table.column(text_field)
            _check_arrow_column(col, f"{where} rows {start}..", text_field)
            yield col.to_pylist()

    return gen


def _batches_from_iterable_dataset(ds: Any, text_field: str, where: str) -> Callable[[], Iterator[list[str]]]:
    def gen() -> Iterator[list[str]]:
        count = 0
        for rows in _batched(iter(ds), _TEXT_BATCH):
            texts = []
            for row in rows:
                if text_field not in row:
                    raise _missing_field(where, text_field, row.keys())
                texts.append(row[text_field])
            yield _check_texts(texts, where, count)
            count += len(texts)

    return gen


def _batched(it: Iterator[Any], n: int) -> Iterator[list[Any]]:
    while True:
        chunk = list(itertools.islice(it, n))
        if not chunk:
            return
        yield chunk


def _jsonl_texts(lines: Iterator[str], where: str, text_field: str, first_lineno: int = 1) -> Iterator[str]:
    """Field ``text_field`` of each JSON Lines record, in order; a bad record is a SourceError naming its line."""
    for lineno, line in enumerate(lines, first_lineno):
        if not line.strip():
            continue  # a blank line is not a JSON record (not an empty document)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{where}:{lineno}: not valid JSON ({exc}): fix the line; one JSON object a line") from exc
        if not isinstance(obj, dict) or text_field not in obj:
            keys = obj.keys() if isinstance(obj, dict) else []
            raise SourceError(
                f"{where}:{lineno}: record has no field {text_field!r} (fields: {sorted(keys)}): "
                "pass text_field=<one of them>"
            )
        value = obj[text_field]
        if not isinstance(value, str):
            raise SourceError(
                f"{where}:{lineno}: field {text_field!r} is {type(value).__name__}, not a string: fix the "
                "record (use '' for an empty document)"
            )
        yield value


def _txt_lines(lines: Iterator[str]) -> Iterator[str]:
    """Each line without its line ending (``\n`` or ``\r\n``): one document a line."""
    for line in lines:
        line = line.removesuffix("\n")
        line = line.removesuffix("\r")
        yield line


def _open_text(path: Path) -> Any:
    """Open a text source; ``utf-8-sig`` drops a UTF-8 byte order mark (editors on Windows write one).

    Without that the first document would start with U+FEFF (and a JSON Lines
    file's first line would not parse); a BOM anywhere else is kept as text.
    """
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="\n")
    return open(path, encoding="utf-8-sig", newline="\n")


def _suffix_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, kind in (
        (".parquet", "parquet"),
        (".arrow", "arrow"),
        (".jsonl", "jsonl"),
        (".jsonl.gz", "jsonl"),
        (".ndjson", "jsonl"),
        (".ndjson.gz", "jsonl"),
        (".json", "jsonl"),
        (".json.gz", "jsonl"),
        (".txt", "txt"),
        (".txt.gz", "txt"),
    ):
        if name.endswith(suffix):
            return kind
    return None


def _iter_file(path: Path, text_field: str) -> Iterator[tuple[list[str], int | None]]:
    """The file's batches, each with the bytes of the file read so far (``None`` for binary formats: unknown)."""
    kind = _suffix_kind(path)
    where = str(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        if text_field not in names:
            raise _missing_field(where, text_field, names)
        for batch in pf.iter_batches(batch_size=_TEXT_BATCH, columns=[text_field]):
            col = batch.column(0)
            _check_arrow_column(col, where, text_field)
            yield col.to_pylist(), None
    elif kind == "arrow":
        with pa.memory_map(str(path), "r") as mm:
            try:
                reader = pa.ipc.open_file(mm)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                schema = reader.schema
            except pa.ArrowInvalid:
                mm.seek(0)
                reader = pa.ipc.open_stream(mm)  # datasets' cache files are IPC streams
                batches = iter(reader)
                schema = reader.schema
            if text_field not in schema.names:
                raise _missing_field(where, text_field, schema.names)
            for batch in batches:
                col = batch.column(batch.schema.get_field_index(text_field))
                _check_arrow_column(col, where, text_field)
                for s in range(0, len(col), _TEXT_BATCH):
                    yield col.slice(s, _TEXT_BATCH).to_pylist(), None
    elif kind == "jsonl":
        with _open_text(path) as f:
            for texts in _batched(_jsonl_texts(f, where, text_field), _TEXT_BATCH):
                yield texts, _bytes_read(f)
    elif kind == "txt":
        with _open_text(path) as f:
            for texts in _batched(_txt_lines(f), _TEXT_BATCH):
                yield texts, _bytes_read(f)
    else:
        raise SourceError(
            f"{where}: unknown file kind; supported: .parquet, .arrow, .jsonl/.ndjson/.json (JSON Lines), .txt "
            "(one document a line), optionally .gz for text formats"
        )


def _bytes_read(f: Any) -> int:
    """Bytes of the file on disk consumed by the text reader ``f`` (compressed bytes for gzip), to within a buffer."""
    raw = f.buffer
    raw = getattr(raw, "fileobj", raw)   # a GzipFile reads its compressed bytes from .fileobj
    return int(raw.tell())


def _first_bad_utf8_line(path: Path) -> str:
    """``":<line>"`` of the first line that is not UTF-8 (read again only after a decode error), or ``""``."""
    try:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    return f":{lineno}"
    except (OSError, EOFError, zlib.error):
        pass
    return ""


def _file_stats_fingerprint(kind: str, files: Sequence[Path], extra: Any = None) -> str:
    rows = []
    for p in files:
        st = p.stat()
        rows.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    payload = {"kind": kind, "files": rows, "extra": extra}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _files_source(kind: str, files: list[Path], text_field: str, description: Any) -> Source:
    sizes = [p.stat().st_size for p in files]

    def gen_with_bytes() -> Iterator[tuple[list[str], int]]:
        done = 0
        for p, size in zip(files, sizes):
            try:
                for texts, read in _iter_file(p, text_field):
                    yield texts, done + (0 if read is None else min(read, size))
            except UnicodeDecodeError as exc:
                raise SourceError(
                    f"{p}{_first_bad_utf8_line(p)}: not valid UTF-8 (byte {exc.object[exc.start:exc.start + 1]!r}: "
                    f"{exc.reason}): re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                ) from exc
            except (zlib.error, EOFError, gzip.BadGzipFile) as exc:
                raise SourceError(
                    f"{p}: corrupt or truncated gzip data ({type(exc).__name__}: {exc}): re-download or re-compress "
                    "the file (check it with `gzip -t`), or remove it from the source"
                ) from exc
            except (pa.ArrowInvalid, OSError) as exc:
                if isinstance(exc, FileNotFoundError):
                    raise SourceError(f"{p}: disappeared during the build ({exc})") from exc
                raise SourceError(f"{p}: cannot be read as {_suffix_kind(p)} ({type(exc).__name__}: {exc})") from exc
            done += size
            yield [], done   # the whole file is read (binary formats report only this)

    def gen() -> Iterator[list[str]]:
        for texts, _ in gen_with_bytes():
            if texts:
                yield texts

    num_docs: int | None = None
    if all(_suffix_kind(p) == "parquet" for p in files):
        import pyarrow.parquet as pq

        num_docs = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    return Source(
        kind=kind,
        description=description,
        fingerprint=_file_stats_fingerprint(kind, files, text_field),
        num_documents=num_docs,
        batches=gen,
        num_bytes=sum(sizes),
        batches_with_bytes=gen_with_bytes,
        files=tuple(files),
        text_field=text_field,
    )


def _datasets_module() -> Any:
    return sys.modules.get("datasets")


def _is_instance(obj: Any, module: Any, *names: str) -> bool:
    if module is None:
        return False
    types = tuple(t for t in (getattr(module, n, None) for n in names) if isinstance(t, type))
    return bool(types) and isinstance(obj, types)


def _dataset_source(ds: Any, text_field: str, where: str, kind: str) -> Source:
    datasets = _datasets_module()
    if _is_instance(ds, datasets, "IterableDataset"):
        return Source(
            kind=kind, description=where, fingerprint=None, num_documents=None,
            batches=_batches_from_iterable_dataset(ds, text_field, where),
        )
    fp = getattr(ds, "_fingerprint", None)
    return Source(
        kind=kind,
        description=where,
        fingerprint=(hashlib.sha256(f"datasets:{fp}:{text_field}".encode()).hexdigest() if fp else None),
        num_documents=len(ds),
        batches=_batches_from_dataset(ds, text_field, where),
    )


def _pick_split(dsdict: Mapping[str, Any], split: str | None, where: str) -> tuple[str, Any]:
    splits = list(dsdict.keys())
    if split is None:
        raise ConfigError(
            f"{where} is a DatasetDict with splits {splits}: pass split=<one of them> to build a store from one split"
        )
    if split not in dsdict:
        raise ConfigError(f"{where} has no split {split!r} (splits: {splits}): pass split=<one of them>")
    return split, dsdict[split]


_CACHE_SPLIT_RE = r"-{split}(-\d{{5}}-of-\d{{5}})?\.arrow$"


def _builder_cache_files(root: Path, split: str | None) -> tuple[list[Path], str | None]:
    """Arrow files of one split in a ``load_dataset`` cache directory (holds dataset_info.json)."""
    try:
        info = json.loads((root / "dataset_info.json").read_text())
    except (OSError, json.JSONDecodeError):
        info = {}
    splits = list((info.get("splits") or {}).keys()) if isinstance(info, dict) else []
    arrows = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(".arrow")
                    and not p.name.startswith(("cache-", ".")))
    if split is None:
        if len(splits) > 1:
            raise ConfigError(
                f"{root} is a load_dataset cache with splits {splits}: pass split=<one of them>"
            )
        return arrows, (splits[0] if splits else None)
    pattern = re.compile(_CACHE_SPLIT_RE.format(split=re.escape(split)))
    chosen = [p for p in arrows if pattern.search(p.name)]
    if not chosen:
        raise ConfigError(f"{root} has no arrow files for split {split!r} (splits: {splits}): pass split=<one of them>")
    return chosen, split


def _walk_data_files(root: Path) -> list[Path]:
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            p = Path(dirpath) / name
            if p.name.lower().endswith(_DATA_SUFFIXES):
                found.append((p.relative_to(root).as_posix(), p))
    return [p for _, p in sorted(found)]


def resolve_source(source: Any, *, text_field: str = "text", split: str | None = None) -> Source:
    """Recognise ``source`` (see the module docstring for the accepted kinds) and return it as a :class:`Source`.

    Documents are read only when ``batches()`` is consumed, which is where
    unreadable content (a null, a non-string, invalid JSON or UTF-8) raises
    :class:`~impl.errors.SourceError`. Raised here: ``SourceError`` for a
    missing path, an unknown file kind, an unsupported type or a dataset
    without ``text_field``; :class:`~impl.errors.ConfigError` for a missing,
    unknown or superfluous ``split``; :class:`~impl.errors.EmptyDataError` for
    a directory holding no data files.
    """
    datasets = _datasets_module()

    def _no_split(kind: str) -> None:
        if split is not None:
            raise ConfigError(
                f"split={split!r} was given but the source ({kind}) has no splits: drop split= "
                "(it applies to DatasetDict sources, save_to_disk DatasetDicts and load_dataset cache dirs)"
            )

    if _is_instance(source, datasets, "DatasetDict", "IterableDatasetDict"):
        name, ds = _pick_split(source, split, "source")
        return _dataset_source(ds, text_field, f"DatasetDict[{name!r}]", "datasets.DatasetDict")
    if _is_instance(source, datasets, "Dataset", "IterableDataset"):
        _no_split(type(source).__name__)
        return _dataset_source(source, text_field, f"{type(source).__name__}", f"datasets.{type(source).__name__}")

    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise SourceError(
                f"source path {str(path)!r} does not exist: pass an existing file or directory (to tokenize text "
                "directly, pass a list of strings)"
            )
        if path.is_dir():
            if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
                import datasets as _ds

                loaded = _ds.load_from_disk(str(path))
                if isinstance(loaded, _ds.DatasetDict):
                    name, ds = _pick_split(loaded, split, str(path))
                    return _dataset_source(ds, text_field, f"{path}[{name!r}]", "save_to_disk")
                _no_split("save_to_disk Dataset")
                return _dataset_source(loaded, text_field, str(path), "save_to_disk")
            if (path / "dataset_info.json").exists() and any(path.glob("*.arrow")):
                files, used = _builder_cache_files(path, split)
                if not files:
                    raise EmptyDataError(f"source has no documents: {path} holds no .arrow files")
                return _files_source("load_dataset_cache", files, text_field,
                                     {"dir": str(path), "split": used, "files": [p.name for p in files]})
            _no_split("directory")
            files = _walk_data_files(path)
            if not files:
                raise EmptyDataError(
                    f"source has no documents: directory {path} holds no data files "
                    f"({', '.join(_DATA_SUFFIXES)}); point at the directory that holds them"
                )
            return _files_source("directory", files, text_field,
                                 {"dir": str(path), "files": [p.relative_to(path).as_posix() for p in files]})
        _no_split("file")
        if _suffix_kind(path) is None:
            raise SourceError(
                f"{path}: unknown file kind; supported: {', '.join(_FILE_SUFFIXES)}"
            )
        return _files_source("file", [path], text_field, {"files": [str(path)]})

    if isinstance(source, (bytes, bytearray)):
        raise SourceError("source is bytes: decode it to str, and pass a list of documents (strings)")
    if isinstance(source, Mapping):
        raise SourceError(
            f"source is a {type(source).__name__}: pass a datasets.Dataset/DatasetDict, a path, or an iterable "
            "of strings"
        )
    if not isinstance(source, Iterable):
        raise SourceError(
            f"source of type {type(source).__name__} is not supported: pass a datasets.Dataset/DatasetDict, a "
            "parquet/jsonl/txt/arrow file or directory, a save_to_disk directory, or an iterable of strings"
        )
    _no_split(type(source).__name__)

    # A sequence of Path objects is a list of files; strings are always documents.
    if isinstance(source, Sequence) and source and all(isinstance(p, os.PathLike) for p in source):
        files = [Path(p) for p in source]
        for p in files:
            if not p.is_file():
                raise SourceError(f"source file {str(p)!r} does not exist or is not a file")
            if _suffix_kind(p) is None:
                raise SourceError(f"{p}: unknown file kind; supported: {', '.join(_FILE_SUFFIXES)}")
        return _files_source("files", files, text_field, {"files": [str(p) for p in files]})

    fingerprint = None
    num_docs = None
    if isinstance(source, (list, tuple)):
        num_docs = len(source)
        if all(type(t) is str for t in source):
            h = hashlib.sha256(b"loadspec-texts-v1\0")
            for t in source:
                b = t.encode("utf-8", "surrogatepass")
                h.update(len(b).to_bytes(8, "little"))
                h.update(b)
            fingerprint = h.hexdigest()

    def gen() -> Iterator[list[str]]:
        count = 0
        for items in _batched(iter(source), _TEXT_BATCH):
            texts: list[Any] = []
            for item in items:
                if isinstance(item, Mapping):
                    if text_field not in item:
                        raise _missing_field(f"document {count + len(texts)}", text_field, item.keys())
                    item = item[text_field]
                texts.append(item)
            yield _check_texts(texts, "iterable source", count)
            count += len(texts)

    return Source(
        kind="iterable", description=type(source).__name__, fingerprint=fingerprint,
        num_documents=num_docs, batches=gen,
    )


def rechunk(batches: Iterator[list[str]], size: int) -> Iterator[list[str]]:
    """Regroup text batches into consecutive ranges of exactly ``size`` documents (last one fewer)."""
    buf: list[str] = []
    for texts in batches:
        pos = 0
        while pos < len(texts):
            take = min(size - len(buf), len(texts) - pos)
            buf.extend(texts[pos : pos + take])
            pos += take
            if len(buf) == size:
                yield buf
                buf = []
    if buf:
        yield buf
