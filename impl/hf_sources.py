"""HF ``datasets`` sources as files: ``save_to_disk`` directories, ``load_dataset`` caches, datasets given directly.

Conforms to STREAM-19 (the directory rules; its model is
``reference.hf_sources.hf_data_files``) and reads every file it names as
STREAM-18 (Arrow IPC stream) or STREAM-1 .. STREAM-4 say, so an HF source
streams, resumes and is fingerprinted exactly as the same files named in
``paths`` would be: the unit index holds each file's path, size and mtime,
which is the source's identity (nothing is hashed or pickled).

Why a dataset object is turned into files, and which ones are accepted:
exact resume re-reads one row by opening one unit, so the rows must live in
files whose bytes stay put. A map-style ``datasets.Dataset`` qualifies when
its table is exactly its cache files (memory-mapped, no indices mapping from
``select`` / ``shuffle`` / ``filter`` / ``sort``, no column operation or
in-memory part kept beside them); an ``IterableDataset`` qualifies when it is
``load_dataset(..., streaming=True)`` over local data files, or
``Dataset.to_iterable_dataset()`` of a Dataset that qualifies (its shards,
joined in order, are whole cache files), with nothing applied after (no
``map``, ``filter``, ``shuffle``, ``take``, ``skip``,
``split_dataset_by_node``): its rows are then those files' rows, which this
loader reads itself. Anything else raises ``SourceError`` naming the fix
(``save_to_disk`` it and pass the directory, or pass the data files).

Why a few private attributes, each read in one accessor: ``datasets`` has
no public way to ask whether a ``Dataset`` has an indices mapping
(``_indices``), what an ``IterableDataset`` is built on (``_ex_iterable``) or
whether ``split_dataset_by_node`` split it (``_distributed``); the table is
read through the public ``Dataset.data``. :func:`_internal` reads each, so a
``datasets`` release that drops or renames one raises
``DatasetsVersionError`` naming the version and the fix (pass the data files
or a ``save_to_disk`` directory, which need none of them), instead of an
``AttributeError`` from inside the loader or a split source taken as unsplit.

Worked example::

    ds = datasets.load_dataset("json", data_files="corpus/*.jsonl", cache_dir="hf_cache")
    StreamingDataset(ds["train"], tokenizer=tok, seq_len=2048)        # its cache files, arrow streams
    ds.save_to_disk("saved")
    StreamingDataset("saved", split="train", tokenizer=tok, seq_len=2048)   # the same files' copies, same order
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from impl.errors import ConfigError, DatasetsVersionError, SourceError, require

__all__ = ["hf_paths"]

_CACHE_FILE = re.compile(r"^(?P<builder>.+?)-(?P<split>[^-/]+?)(?:-(?P<k>\d{5})-of-(?P<n>\d{5}))?\.arrow$")


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path} cannot be read as JSON ({exc}); the directory is damaged: save it again") from None


def _cache_split(directory: str, split: str | None) -> list[str]:
    """One split's ``<builder>-<split>[-k-of-n].arrow`` files of a ``load_dataset`` cache, in shard order."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name in sorted(os.listdir(directory)):
        m = _CACHE_FILE.match(name)
        if m is not None and os.path.isfile(os.path.join(directory, name)):
            k, n = (int(m["k"]), int(m["n"])) if m["k"] is not None else (0, 1)
            found.setdefault(m["split"], []).append((k, n, name))
    require(bool(found), SourceError, f"{directory}: the load_dataset cache directory holds no <builder>-<split>.arrow "
            "file; run load_dataset to completion, or pass the data files themselves")
    if split is None:
        require(len(found) == 1, SourceError,
                f"{directory}: the load_dataset cache holds splits {sorted(found)}; pass split=<one of them>")
        split = next(iter(found))
    require(split in found, SourceError, f"{directory}: split={split!r} is not in the load_dataset cache, which holds "
            f"splits {sorted(found)}; pass one of them")
    shards = sorted(found[split])
    total = shards[0][1]
    require([(k, n) for k, n, _ in shards] == [(k, total) for k in range(total)], SourceError,
            f"{directory}: split {split!r} holds shards {[s for *_, s in shards]}, not all {total} of its shards once: "
            "a load_dataset run was cut short; run load_dataset again with download_mode='force_redownload'")
    return [os.path.join(directory, name) for *_, name in shards]


def directory_files(directory: str, split: str | None) -> list[str]:
    """The data files of a ``save_to_disk`` directory or a ``load_dataset`` cache, in row order (STREAM-19)."""
    def has(name: str) -> bool:
        return os.path.isfile(os.path.join(directory, name))

    if has("dataset_dict.json"):
        splits = _read_json(os.path.join(directory, "dataset_dict.json")).get("splits", [])
        require(split is not None and split in splits, SourceError,
                f"{directory} is a DatasetDict of splits {splits}; pass split=<one of them>" if split is None else
                f"{directory}: split={split!r} is not among the DatasetDict's splits {splits}; pass one of them")
        assert split is not None
        return directory_files(os.path.join(directory, split), None)
    if has("state.json"):
        state = _read_json(os.path.join(directory, "state.json"))
        require(split is None or split == state.get("_split"), SourceError,
                f"{directory}: split={split!r} but the directory holds one Dataset (split {state.get('_split')!r}), "
                "not a DatasetDict; leave split out")
        entries = state.get("_data_files")
        require(isinstance(entries, list) and bool(entries), SourceError,
                f"{directory}/state.json lists no _data_files; the directory is damaged: save it again")
        out = []
        for e in entries:
            name = e.get("filename") if isinstance(e, dict) else None
            require(isinstance(name, str) and has(name), SourceError,
                    f"{directory}/state.json names the data file {name!r}, which is not in the directory; it is "
                    "incomplete: save it again")
            out.append(os.path.join(directory, str(name)))
        return out
    require(has("dataset_info.json"), SourceError,
            f"{directory} holds no dataset_dict.json, state.json or dataset_info.json: it is neither a save_to_disk "
            "directory nor a load_dataset cache; pass such a directory, or the data files themselves (a glob such as "
            f"{os.path.join(directory, '*.jsonl')!r})")
    return _cache_split(directory, split)


def _internal(obj: Any, name: str, purpose: str) -> Any:
    """``obj.<name>``, an attribute ``datasets`` does not publish, read to learn ``purpose``; named if missing.

    >>> _internal(object(), "_indices", "whether it has an indices mapping")
    Traceback (most recent call last):
    ...
    impl.errors.DatasetsVersionError: datasets ... has no object._indices, which loadspec reads to learn whether it has an indices mapping (datasets publishes no such API): pass the data files themselves (the paths or glob the dataset was loaded from), or write the rows with ds.save_to_disk(<dir>) and pass that directory
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        version = getattr(sys.modules.get("datasets"), "__version__", "(not imported)")
        raise DatasetsVersionError(
            f"datasets {version} has no {type(obj).__name__}.{name}, which loadspec reads to learn {purpose} "
            "(datasets publishes no such API): pass the data files themselves (the paths or glob the dataset was "
            "loaded from), or write the rows with ds.save_to_disk(<dir>) and pass that directory") from None


def _indices_mapping(ds: Any) -> Any:
    """A Dataset's indices mapping (``select`` / ``shuffle`` / ``filter`` / ``sort``), or None."""
    return _internal(ds, "_indices", "whether its rows are reordered by an indices mapping")


def _examples_iterable(ds: Any) -> Any:
    """What an IterableDataset is built on: the ``ExamplesIterable`` whose type and kwargs name its files."""
    return _internal(ds, "_ex_iterable", "what it is built on (its data files, or a generator, map, shuffle ...)")


def _node_split(ds: Any) -> Any:
    """``split_dataset_by_node``'s record on an IterableDataset, or None when it is unsplit."""
    return _internal(ds, "_distributed", "whether it was split with split_dataset_by_node")


def _file_rows(path: str) -> int:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))


def _spans(ds: Any) -> list[tuple[str, int, int]]:
    """``(file, first row, stop row)`` of each part of a Dataset's table, in row order; refused if a part is not a file's rows."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    indices = _indices_mapping(ds)          # first: the public num_rows and cache_files read it too
    what = f"the Dataset ({ds.num_rows} rows, columns {ds.column_names})"
    require(bool(ds.cache_files), SourceError,
            f"{what} is held in memory (it has no cache files), so no row can be re-read at resume: write it with "
            "ds.save_to_disk(<dir>) and pass that directory")
    require(indices is None, SourceError,
            f"{what} has an indices mapping (from select, shuffle, filter, sort, shard or train_test_split), so its "
            "rows are not its cache files' rows in order: call ds = ds.flatten_indices(), or ds.save_to_disk(<dir>) "
            "and pass that directory")
    beside = (f"{what} holds columns or rows beside its cache files (add_column, rename / remove / cast, a slice, or "
              "an in-memory part), so the files do not hold its rows as it shows them: write it with "
              "ds.save_to_disk(<dir>) and pass that directory")
    table = ds.data
    blocks = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    spans = []
    for block in blocks:
        require(len(block) == 1 and isinstance(block[0], MemoryMappedTable), SourceError, beside)
        leaf = block[0]
        start, length = 0, _file_rows(str(leaf.path))
        for op, args, kwargs in leaf.replays:     # a slice keeps rows start .. start + length of the file
            require(op in ("replace_schema_metadata", "slice"), SourceError, beside)
            if op == "slice":
                offset = min(int(args[0] if args else kwargs.get("offset", 0)), length)
                stop = args[1] if len(args) > 1 else kwargs.get("length")
                start, length = start + offset, length - offset if stop is None else min(int(stop), length - offset)
        require(length == leaf.num_rows, SourceError, beside)
        spans.append((str(leaf.path), start, start + length))
    return spans


def _whole_files(spans: list[tuple[str, int, int]], what: str) -> list[str]:
    """The files the spans cover when, joined in order, they are whole files; refused otherwise."""
    merged: list[list[Any]] = []
    for path, start, stop in spans:
        if merged and merged[-1][0] == path and merged[-1][2] == start:
            merged[-1][2] = stop
        elif start < stop:                      # an empty part holds no row
            merged.append([path, start, stop])
    for path, start, stop in merged:
        if (start, stop) != (0, _file_rows(path)):
            raise SourceError(f"{what} holds only rows {start} .. {stop} of {path} (a slice, select or shard), so "
                              "its rows are not its files' rows: write it with ds.save_to_disk(<dir>) and pass that "
                              "directory")
    return [p for p, _, _ in merged]


def _dataset_files(ds: Any) -> list[str]:
    """A map-style Dataset's cache files when its rows are exactly theirs, in row order; refused otherwise."""
    return _whole_files(_spans(ds), f"the Dataset ({ds.num_rows} rows, columns {ds.column_names})")


def _iterable_files(ds: Any) -> list[str]:
    """The local files of an unmodified ``load_dataset(..., streaming=True)`` or ``Dataset.to_iterable_dataset()``."""
    ex = _examples_iterable(ds)
    arrow = type(ex).__name__ == "ArrowExamplesIterable"
    kwargs = (_internal(ex, "kwargs", "the files it reads") if arrow else None) or {}
    shards = kwargs.get("shards")
    hf = sys.modules["datasets"]
    if arrow and isinstance(shards, list) and shards and all(
            isinstance(s, hf.Dataset) for s in shards):        # Dataset.to_iterable_dataset(): its shards in order
        require(_node_split(ds) is None, SourceError,
                "the IterableDataset was split with split_dataset_by_node; pass the unsplit one: StreamingDataset "
                "deals lanes to ranks itself (STREAM-10)")
        return _whole_files([span for s in shards for span in _spans(s)], "the IterableDataset (its shards joined)")
    found = next((kwargs[k] for k in ("original_files", "base_files", "files") if k in kwargs), None)
    files: list[Any] = found if isinstance(found, list) else []
    fix = ("an IterableDataset is resumed exactly only when it is load_dataset(..., streaming=True) over local data "
           "files, or Dataset.to_iterable_dataset() of a Dataset whose rows are its cache files, with nothing applied "
           "after: pass those data files or that IterableDataset, or write the rows with "
           "datasets.Dataset.from_generator(...) / ds.save_to_disk(<dir>) and pass the directory")
    require(arrow and bool(files), SourceError,
            f"the IterableDataset is built on {type(ex).__name__} (a generator, or a map / filter / shuffle / take / "
            f"skip), whose rows this loader cannot re-read by position; {fix}")
    require(_node_split(ds) is None, SourceError,
            "the IterableDataset was split with split_dataset_by_node; pass the unsplit one: StreamingDataset deals "
            "lanes to ranks itself (STREAM-10)")
    bad = [f for f in files if not (isinstance(f, str) and "://" not in f and os.path.isfile(f))]
    require(not bad, SourceError, f"the IterableDataset reads {bad[:3]}, not local files; {fix}")
    return [str(f) for f in files]


def hf_paths(source: Any, split: str | None) -> list[str] | None:
    """The local files an HF source stands for, in row order; None when ``source`` is plain paths (STREAM-19).

    ``source`` may be a ``save_to_disk`` directory, a ``load_dataset`` cache
    directory, a ``datasets.Dataset`` / ``IterableDataset``, or a
    ``DatasetDict`` / ``IterableDatasetDict`` with ``split``.
    """
    require(split is None or isinstance(split, str), ConfigError, f"split={split!r} must be a split name or None")
    hf = sys.modules.get("datasets")      # an HF object exists only if its package is imported: never import it here
    if hf is not None and isinstance(source, (hf.DatasetDict, hf.IterableDatasetDict)):
        require(split is not None and split in source, SourceError,
                f"the {type(source).__name__} holds splits {list(source)}; pass split=<one of them> (or ds[<split>])")
        source, split = source[split], None
    if hf is not None and isinstance(source, (hf.Dataset, hf.IterableDataset)):
        require(split is None or split == str(source.split), SourceError,
                f"split={split!r} but the {type(source).__name__} is split {str(source.split)!r}; leave split out")
        return _dataset_files(source) if isinstance(source, hf.Dataset) else _iterable_files(source)
    if isinstance(source, (str, os.PathLike)) and "://" not in os.fspath(source) and os.path.isdir(source):
        return directory_files(os.fspath(source), split)
    require(split is None, ConfigError, f"split={split!r} is for an HF source (a save_to_disk directory, a load_dataset "
            "cache directory or a DatasetDict); with file paths leave it out")
    return None
