"""The unit index of a streaming source, read through the file seam (STREAM-1 .. STREAM-5).

Conforms to STREAM-1 .. STREAM-5 and STREAM-18 (Arrow IPC streams, through
``impl.arrow_stream``); its model is ``reference.units``:
``build_unit_index(...)`` equals ``reference.units.build_index`` over the
same files (same units, same fingerprint), and ``read_unit`` equals
``reference.units.read_unit``.

Why through :class:`impl.files.FileAccess`: the same source may sit on a
local disk or behind a remote cache; this module asks the access for a
file's size and version (``stat``) and its bytes (``map`` / ``open``) and
nothing else, so a cache can stand behind it unchanged.

Why a cached index: cutting a text file into units scans it for newlines,
and a parquet file's row groups are in its footer; both are paid once. The
index is cached under ``index_dir`` as ``<key>.json`` where the key hashes
what identifies the files (name, format, size, version) and ``unit_bytes``,
written atomically, and checked against its own fingerprint when read back.

Worked example::

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_bytes(b"ab\\ncdef\\ng")
    >>> index = build_unit_index(["a.txt"], files=LocalFiles(d), unit_bytes=4)
    >>> [(u.start, u.stop, u.rows) for u in index.units]
    [(0, 8, 2), (8, 9, 1)]
    >>> read_unit(LocalFiles(d), index, 1)
    ['g']
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from impl._atomic import atomic_write_bytes
from impl.arrow_stream import is_arrow_stream, read_stream_batch, stream_units
from impl.errors import ConfigError, SourceError, is_int, require
from impl.files import FileAccess, LocalFiles

__all__ = [
    "INDEX_FORMAT",
    "INDEX_VERSION",
    "Unit",
    "UnitIndex",
    "build_unit_index",
    "file_format",
    "read_unit",
    "resolve_paths",
    "source_files",
    "split_urls",
]

INDEX_FORMAT = "loadspec.unit_index"
INDEX_VERSION = 1
_SUFFIXES = ((".jsonl.gz", "jsonl", "gz"), (".jsonl.zst", "jsonl", "zst"), (".txt.gz", "txt", "gz"),
             (".txt.zst", "txt", "zst"), (".jsonl", "jsonl", ""), (".txt", "txt", ""), (".parquet", "parquet", ""),
             (".arrow", "arrow", ""))
KNOWN = ", ".join(s for s, _, _ in _SUFFIXES)


def file_format(name: str) -> tuple[str, str]:
    """``(format, compression)`` of a file by its name: ``("jsonl", "gz")`` for ``x.jsonl.gz``.

    >>> file_format("a/b.jsonl.zst"), file_format("c.parquet")
    (('jsonl', 'zst'), ('parquet', ''))
    """
    for suffix, fmt, comp in _SUFFIXES:
        if name.endswith(suffix):
            return fmt, comp
    raise SourceError(f"{name}: unknown file kind; a streaming source reads {KNOWN} files (rename the file or "
                      "leave it out of paths)")


def split_urls(paths: str | Sequence[str]) -> tuple[str, list[str]] | None:
    """``(root, names)`` for fsspec URLs (``s3://b/data/*.jsonl``): the common folder and the names under it; None for local paths.

    The root is the deepest folder holding every URL's part before its first
    glob character, so one :class:`impl.remote.RemoteFiles` serves them all.

    >>> split_urls("s3://b/data/*.jsonl")
    ('s3://b/data', ['*.jsonl'])
    >>> split_urls(["gs://b/x/a.parquet", "gs://b/y/*.txt"])
    ('gs://b', ['x/a.parquet', 'y/*.txt'])
    >>> split_urls("data/*.jsonl") is None
    True
    """
    items = [paths] if isinstance(paths, str) else list(paths)
    urls = [p for p in items if isinstance(p, str) and "://" in p]
    if not urls:
        return None
    require(len(urls) == len(items), SourceError,
            "paths mixes URLs and local paths: pass only URLs (one remote root) or only local paths")
    heads = []
    for url in urls:
        fixed = url[:min([url.index(c) for c in "*?[" if c in url] or [len(url)])]
        heads.append(fixed.rsplit("/", 1)[0].split("/"))
    common = heads[0]
    for h in heads[1:]:
        n = 0
        while n < min(len(common), len(h)) and common[n] == h[n]:
            n += 1
        common = common[:n]
    root = "/".join(common)
    require(len(common) >= 3 and root.split("://", 1)[1] != "", SourceError,
            f"the URLs {urls} share no bucket or folder: pass URLs under one remote root")
    return root, [url[len(root) + 1:] for url in urls]


def resolve_paths(paths: str | Sequence[str], files: FileAccess) -> list[str]:
    """The names ``paths`` (names or globs, in the order given, each glob sorted) name; a glob matching nothing raises.

    Globs need an access that lists (``files.glob``: :class:`LocalFiles`,
    :class:`impl.remote.RemoteFiles`).

    A name without glob characters must exist; a file named twice is refused
    (its rows would be read twice an epoch).
    """
    items = [paths] if isinstance(paths, str) else list(paths)
    require(len(items) > 0, SourceError, "paths is empty: pass the files (or globs) of the source")
    out: list[str] = []
    for item in items:
        require(isinstance(item, str), SourceError, f"paths holds {item!r}, not a string path or glob")
        if any(c in item for c in "*?["):
            lister = getattr(files, "glob", None)
            require(lister is not None, SourceError, f"{files.where(item)!r} is a glob and {files!r} cannot list "
                    "files: pass the files' names")
            assert lister is not None
            hits = lister(item)
            require(bool(hits), SourceError, f"the glob {files.where(item)!r} matches no file: check the pattern and "
                    "the directory, or pass the files' paths")
            out.extend(hits)
        else:
            require(files.stat(item) is not None, SourceError,
                    f"{files.where(item)} does not exist: check the path, or pass a glob")
            out.append(item)
    seen: set[str] = set()
    for name in out:
        require(name not in seen, SourceError, f"{files.where(name)} is named twice in paths: pass each file once")
        seen.add(name)
    return out


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit: a byte range of a text file, ``(0, decompressed length)`` of a compressed one, ``(g, g + 1)`` of a row group."""

    file: int
    start: int
    stop: int
    rows: int


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitIndex:
    """``reference.units.UnitIndex`` with the same JSON and fingerprint (STREAM-5), plus each file's compression."""

    unit_bytes: int
    files: tuple[tuple[str, str, bool, int, str], ...]
    units: tuple[Unit, ...]
    compression: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "unit_bytes": self.unit_bytes,
                "files": [list(f) for f in self.files], "units": [[u.file, u.start, u.stop, u.rows] for u in self.units]}

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of ``to_json()`` (STREAM-5)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def row_starts(self) -> list[int]:
        """The global row number of each unit's first row (STREAM-9)."""
        starts, total = [], 0
        for u in self.units:
            starts.append(total)
            total += u.rows
        return starts


def _decompress(files: FileAccess, name: str, comp: str) -> bytes:
    with files.open(name) as f:
        raw = f.read()
    try:
        if comp == "gz":
            return gzip.decompress(raw)
        try:
            import zstandard
        except ImportError:
            raise SourceError(f"{files.where(name)} is zstd-compressed and the zstandard package is not installed: "
                              "pip install zstandard, or decompress the file") from None
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as r:
            return bytes(r.read())
    except (OSError, EOFError) as exc:
        raise SourceError(f"{files.where(name)} cannot be decompressed ({exc}): the file is damaged or not "
                          f"{comp}; replace it or leave it out of paths") from None


def text_bytes(files: FileAccess, name: str, comp: str) -> Any:
    """The (decompressed) bytes of a text file: mapped when uncompressed."""
    return _decompress(files, name, comp) if comp else files.map(name)


def _line_units(data: Any, target: int, file: int) -> list[Unit]:
    """STREAM-1's ranges with each range's line count (STREAM-2): newlines in it, plus one for an unterminated tail."""
    units, start, size = [], 0, len(data)
    while start < size:
        newline = data.find(b"\n", start + target - 1)
        stop = size if newline < 0 else newline + 1
        chunk = bytes(data[start:stop])
        units.append(Unit(file, start, stop, chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)))
        start = stop
    return units


def _pyarrow_groups(files: FileAccess, name: str, fmt: str, text_field: str) -> list[int]:
    """Rows per parquet row group / Arrow record batch, after checking the text column exists."""
    table_schema, counts = _row_reader(files, name, fmt)
    require(text_field in table_schema.names, SourceError,
            f"{files.where(name)} has no column {text_field!r} (its columns: {table_schema.names}); pass "
            "text_field=<the name of the text column>")
    return counts


def _row_reader(files: FileAccess, name: str, fmt: str) -> tuple[Any, list[int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            meta = pq.ParquetFile(pa.py_buffer(files.map(name))).metadata
            return meta.schema.to_arrow_schema(), [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        reader = _arrow_reader(files, name)
        return reader.schema, [reader.get_batch(b).num_rows for b in range(reader.num_record_batches)]
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"{files.where(name)} cannot be read as {fmt} ({exc}); replace the file or leave it out "
                          "of paths") from None


def _arrow_reader(files: FileAccess, name: str) -> Any:
    import pyarrow as pa

    return pa.ipc.open_file(pa.py_buffer(files.map(name)))


def _index_key(names: Sequence[str], stats: Sequence[tuple[str, str, bool, int, str]], unit_bytes: int,
               text_field: str) -> str:
    text = json.dumps([INDEX_FORMAT, INDEX_VERSION, unit_bytes, text_field, list(names), [list(s) for s in stats]])
    return hashlib.sha256(text.encode()).hexdigest()


def build_unit_index(paths: str | Sequence[str], *, files: FileAccess | None = None, unit_bytes: int = 1 << 20,
                     text_field: str = "text", index_dir: str | os.PathLike[str] | None = None) -> UnitIndex:
    """The unit index of ``paths`` (names or globs under ``files``, default the local filesystem) (STREAM-1 .. 5).

    Each file is named in the index as given (or as its glob found it); its
    version is ``files.stat(name).version`` (mtime in ns, or an ETag). An
    empty file, a file of unknown kind, or a parquet / Arrow file without the
    ``text_field`` column raises ``SourceError`` naming the file and the fix.
    With ``index_dir``, the index is read from (or written atomically to)
    ``index_dir/<key>.json``.
    """
    require(is_int(unit_bytes) and unit_bytes >= 1, ConfigError,
            f"unit_bytes={unit_bytes!r} must be an integer >= 1 (the target byte size of a text unit)")
    access: FileAccess = LocalFiles("") if files is None else files
    names = resolve_paths(paths, access)
    entries: list[tuple[str, str, bool, int, str]] = []
    comps: list[str] = []
    for name in names:
        st = access.stat(name)
        require(st is not None, SourceError, f"{access.where(name)} does not exist: check the path")
        assert st is not None
        fmt, comp = file_format(name)
        require(st.size > 0, SourceError, f"{access.where(name)} is empty (0 bytes): it holds no row; remove it or "
                "leave it out of paths")
        if fmt == "arrow" and is_arrow_stream(access, name):
            fmt = "arrow_stream"        # HF datasets' .arrow: an IPC stream, batches found by scanning (STREAM-18)
        entries.append((name, fmt, bool(comp), st.size, st.version))
        comps.append(comp)
    cache = None
    if index_dir is not None:
        cache = os.path.join(os.fspath(index_dir), _index_key(names, entries, unit_bytes, text_field) + ".json")
        cached = _load_cached(cache, entries, unit_bytes, tuple(comps))
        if cached is not None:
            return cached
    units: list[Unit] = []
    for i, (name, fmt, compressed, _, _) in enumerate(entries):
        if fmt in ("txt", "jsonl"):
            data = text_bytes(access, name, comps[i])
            require(len(data) > 0, SourceError, f"{access.where(name)} decompresses to no bytes: it holds no row; "
                    "remove it or leave it out of paths")
            if compressed:
                units.append(Unit(i, 0, len(data), _line_units(data, len(data), i)[0].rows))
            else:
                units.extend(_line_units(data, unit_bytes, i))
        elif fmt == "arrow_stream":
            units.extend(Unit(i, a, b, rows) for a, b, rows in stream_units(access, name, text_field))
        else:
            units.extend(Unit(i, g, g + 1, n) for g, n in enumerate(_pyarrow_groups(access, name, fmt, text_field)))
    index = UnitIndex(unit_bytes=unit_bytes, files=tuple(entries), units=tuple(units), compression=tuple(comps))
    if cache is not None:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        body = dict(index.to_json(), fingerprint=index.fingerprint)
        atomic_write_bytes(cache, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    return index


def _load_cached(path: str, entries: list[tuple[str, str, bool, int, str]], unit_bytes: int,
                 comps: tuple[str, ...]) -> UnitIndex | None:
    """The cached index at ``path`` when it is whole and describes exactly these files; None otherwise (rebuilt)."""
    try:
        with open(path, "rb") as f:
            body = json.loads(f.read())
        index = UnitIndex(unit_bytes=unit_bytes, files=tuple(tuple(f) for f in body["files"]),
                          units=tuple(Unit(*u) for u in body["units"]), compression=comps)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if index.files != tuple(entries) or body.get("fingerprint") != index.fingerprint:
        return None
    return index


def describe_change(index_dir: str | None, fingerprint: str, index: UnitIndex) -> str:
    """What differs between the index a state was taken on and ``index``, naming files when ``index_dir`` holds the old one.

    The state holds only the old index's fingerprint (STREAM-13); its files
    are known only if that index was cached under ``index_dir``.
    """
    what = "the unit index (a file was changed, added, removed or reordered, or unit_bytes differs"
    body: Any = None
    try:
        for name in sorted(os.listdir(index_dir)) if index_dir is not None else []:
            if name.endswith(".json"):
                with open(os.path.join(index_dir, name), "rb") as f:    # type: ignore[arg-type]
                    candidate = json.loads(f.read())
                if isinstance(candidate, dict) and candidate.get("fingerprint") == fingerprint:
                    body = candidate
                    break
    except (OSError, ValueError):
        body = None
    if body is None:
        return what + ("; with the same index_dir at checkpoint and resume the changed file is named)"
                       if index_dir is None else ")")
    before = {str(f[0]): f for f in body.get("files", [])}
    now = {f[0]: list(f) for f in index.files}
    parts = [f"{n} changed (size {before[n][3]}, version {before[n][4]} at the checkpoint; size {f[3]}, version "
             f"{f[4]} now)" for n, f in now.items() if n in before and list(before[n]) != f]
    parts += [f"{n} was added" for n in now if n not in before] + [f"{n} was removed" for n in before if n not in now]
    if not parts and list(before) != list(now):
        parts.append("the files were reordered")
    return what.split(" (")[0] + " (" + ("; ".join(parts) or f"unit_bytes {body.get('unit_bytes')} then") + ")"


def check_unchanged(files: FileAccess, entry: tuple[str, str, bool, int, str]) -> None:
    """Refuse a file whose size or version moved since the index was built: its units' byte ranges no longer hold."""
    name, _, _, size, version = entry
    st = files.stat(name)
    require(st is not None and (st.size, st.version) == (size, version), SourceError,
            f"{files.where(name)} changed since its unit index was built (size {size}, version {version} then; "
            f"{'missing' if st is None else f'size {st.size}, version {st.version}'} now), so neither this dataset "
            "nor a state taken on it can read its units: restore the file as it was, or build a new "
            "StreamingDataset and start from a fresh state")


def decode_line(where: str, fmt: str, offset: int, line: bytes, text_field: str) -> str:
    """One line as text (STREAM-2), with the reference's errors: not UTF-8, not JSON, no string ``text_field``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{where}: the line at byte {offset} is not UTF-8 ({exc.reason}); "
                          "re-encode the file as UTF-8") from None
    if fmt == "txt":
        return text
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: the line at byte {offset} is not JSON ({exc.msg}); fix or remove the line") from None
    value = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        raise SourceError(f"{where}: the line at byte {offset} has no string field {text_field!r}; "
                          f"pass text_field=<the name of the text field> or fix the record")
    return value


ON_ERROR = ("raise", "skip")
UTF8_BOM = b"\xef\xbb\xbf"


def read_unit(files: FileAccess, index: UnitIndex, unit: int, text_field: str = "text",
              on_error: str = "raise") -> list[str | None]:
    """The rows of one unit as text, in stored order (STREAM-2 .. STREAM-4); a compressed file is read whole (STREAM-3).

    With ``on_error="skip"`` a line :func:`decode_line` refuses is ``None`` in
    its place (STREAM-17); the caller counts and reports it.
    """
    require(on_error in ON_ERROR, ConfigError, f"on_error={on_error!r} must be one of {ON_ERROR}")
    u = index.units[unit]
    name, fmt = index.files[u.file][0], index.files[u.file][1]
    where = files.where(name)
    if fmt in ("parquet", "arrow"):
        return list[str | None](_read_group(files, name, fmt, u.start, text_field))
    if fmt == "arrow_stream":
        check_unchanged(files, index.files[u.file])
        return list[str | None](read_stream_batch(files, name, u.start, u.stop, text_field))
    comp = index.compression[u.file] if index.compression else ("gz" if index.files[u.file][2] else "")
    data = text_bytes(files, name, comp)
    chunk = bytes(data[u.start:u.stop])
    lines = chunk.split(b"\n")
    if chunk.endswith(b"\n"):
        lines.pop()
    if u.start == 0 and lines and lines[0].startswith(UTF8_BOM):    # a file's leading BOM is not text (STREAM-2)
        lines[0] = lines[0][len(UTF8_BOM):]
        offset = len(UTF8_BOM)
    else:
        offset = u.start
    out: list[str | None] = []
    for line in lines:
        try:
            out.append(decode_line(where, fmt, offset, line, text_field))
        except SourceError:
            if on_error == "raise":
                raise
            out.append(None)
        offset += len(line) + 1
    return out


def _read_group(files: FileAccess, name: str, fmt: str, group: int, text_field: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt == "parquet":
        table = pq.ParquetFile(pa.py_buffer(files.map(name))).read_row_group(group, columns=[text_field])
        column = table.column(0)
    else:
        batch = _arrow_reader(files, name).get_batch(group)
        require(text_field in batch.schema.names, SourceError,
                f"{files.where(name)} has no column {text_field!r}; pass text_field=<the name of the text column>")
        column = batch.column(batch.schema.get_field_index(text_field))
    values: list[str] = column.to_pylist()
    for r, v in enumerate(values):
        require(isinstance(v, str), SourceError,
                f"{files.where(name)}: row {r} of {'row group' if fmt == 'parquet' else 'record batch'} {group} has "
                f"{type(v).__name__} {v!r:.40} in column {text_field!r}, not a string; fix the data or pass "
                "text_field=<a string column>")
    return values


def source_files(paths: str | Sequence[str], files: FileAccess | None, local: str | os.PathLike[str] | None,
                 cache_limit: int | str | None, storage_options: Mapping[str, Any] | None,
                 ) -> tuple[FileAccess, str | Sequence[str]]:
    """The file seam for ``paths``: ``files`` as given, a node-local cache of a remote root for URLs, or local files."""
    urls = split_urls(paths)
    if files is not None or urls is None:
        require(local is None and cache_limit is None and storage_options is None, ConfigError,
                "local, cache_limit and storage_options are for URL paths (s3://..., gs://..., file://...); with "
                "local paths or files= leave them out")
        return (LocalFiles("") if files is None else files), paths
    from impl.remote import redact_url

    require(local is not None, ConfigError,
            f"paths are URLs under {redact_url(urls[0])}: pass local=<a node-local cache directory> (each file is "
            "downloaded there once per node)")
    from impl.remote import RemoteFiles  # fsspec and the node cache only for a remote source

    assert local is not None
    return RemoteFiles(urls[0], local, cache_limit=cache_limit, storage_options=storage_options), urls[1]
