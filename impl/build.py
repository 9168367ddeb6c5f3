"""Building a token store: tokenize a source (in this process or in spawned workers) and publish it atomically.

Why apart from :mod:`impl.store`: the store module owns what is on disk and
how it is read; this one owns how it gets there, which is where the hard
failure modes live (parallel workers, locks, a crash half way, replacing an
existing store). :meth:`TokenStore.build` and
:meth:`TokenStore.from_token_files` are the public entry points and delegate
here, passing ``TokenStore.open`` as ``open_store``: the writer opens the
store it publishes (and any store already at ``out_dir``) through it, so this
module imports the format (:mod:`impl.store_format`) but not the reader,
which imports this one.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import ctypes
import datetime
import errno
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from impl._atomic import atomic_write_bytes, atomic_write_json, exchange_dirs, file_lock, fsync_dir, lock_path_for
from impl.encoding import Encoder, TokenizerInfo, eos_suggestion, resolve_tokenizer
from impl.errors import (
    ConfigError,
    EmptyDataError,
    LoadspecError,
    StoreError,
    TokenizerError,
    UnguardedMainError,
    UnsafeOutputError,
)
from impl.sources import Source, rechunk, resolve_source
from impl.store_format import (
    BLOCK_BYTES,
    COLUMN,
    DEFAULT_DOCS_PER_FILE,
    FILE_TEMPLATE,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FILE,
    QUICK_SIGNATURE_BYTES,
    BuildOptions,
    FileRecord,
    arrow_buffer_layout,
    arrow_type,
    content_fingerprint,
    hash_documents,
    hash_file_blocks,
    quick_signature,
    take_crc_tables,
)

__all__ = ["build_store", "check_output_path", "store_from_token_files"]

_UINT16_LIMIT = 1 << 16


class OpenedStore(Protocol):
    """What the writer reads of an opened store (a :class:`~impl.store.TokenStore`): its meta and fingerprint."""

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def fingerprint(self) -> str: ...


StoreT = TypeVar("StoreT", bound=OpenedStore)
OpenStore = Callable[[Path], StoreT]
"""Opens the store at a path, refusing with :class:`StoreError` one it cannot read (``TokenStore.open``)."""

LOCK_TIMEOUT_S = 3600.0
"""How long a build waits for another builder of the same out_dir (``LOADSPEC_LOCK_TIMEOUT_S`` overrides)."""


# --------------------------------------------------------------------------- entry points


def build_store(
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
    open_store: OpenStore[StoreT],
) -> StoreT:
    """Tokenize ``source`` into a new store at ``out_dir`` and return it opened with ``open_store``.

    ``open_store``: opens a store at a path (:meth:`TokenStore.open
    <impl.store.TokenStore.open>`, which :meth:`TokenStore.build
    <impl.store.TokenStore.build>` passes); used for the published store and
    for a store already at ``out_dir``.

    ``source``: a ``datasets.Dataset`` / ``IterableDataset``; a
    ``DatasetDict`` with ``split=``; a parquet, arrow (IPC file or stream),
    JSON Lines or txt (one document a line; ``\\n`` separated, a trailing
    ``\\r`` dropped; UTF-8, a leading byte order mark dropped) file, or a directory of them (recursively, sorted by
    relative path, hidden entries skipped); a ``save_to_disk`` directory; a
    ``load_dataset`` cache directory (with ``split=`` if it has several); a
    list of ``pathlib.Path`` files; or an iterable of strings (or of dicts
    holding ``text_field``). A ``str`` source is a path; strings *inside* an
    iterable are documents.

    ``tokenizer``: a directory loadable by ``AutoTokenizer.from_pretrained``,
    a ``tokenizer.json`` file, or a fast tokenizer object. Text is encoded
    with ``add_special_tokens=False``; then ``bos_token_id`` is prepended
    if ``add_bos`` and ``eos_token_id`` appended if ``add_eos``.

    ``num_proc``: worker processes (spawned; ``None`` = CPUs, ``1`` = in this
    process). Ranges of ``docs_per_file`` documents (default
    :data:`DEFAULT_DOCS_PER_FILE`) become files ``tokens-NNNNN.arrow``; the
    output is identical for every ``num_proc``. When ``num_proc > 1`` the
    calling script needs the usual ``if __name__ == "__main__":`` guard;
    without it the build fails at once (:class:`UnguardedMainError` in the
    re-importing worker, :class:`StoreError` naming the guard in the parent)
    instead of hanging. Workers exit with their parent (a killed build leaves
    no process behind) and every wait on them is bounded
    (:data:`WORKER_TIMEOUT_S`).

    Concurrency: the whole build holds ``file_lock(out_dir + ".lock")`` (waiting
    at most :data:`LOCK_TIMEOUT_S`, then :class:`LockTimeoutError` naming the
    holder's pid and host) and
    writes into a temporary sibling directory that is renamed into place
    only when complete (``meta.json`` last). If ``out_dir`` already holds a
    store built from the same source with the same tokenizer and options
    (e.g. by a concurrent builder), that store is returned; a different
    store raises :class:`StoreError` unless ``overwrite=True``. ``overwrite``
    only ever replaces a loadspec store (or fills an empty directory): any
    other directory, a file, or an ``out_dir`` equal to, inside or containing
    a source path raises :class:`UnsafeOutputError` and nothing is deleted.

    Raises :class:`EmptyDataError` for a source with no documents (a
    source whose documents are all empty is stored: they are counted in
    ``num_empty_documents``), :class:`TokenizerError` if a needed special token is
    missing, :class:`SourceError`/:class:`ConfigError` for unreadable input.
    """
    _refuse_unguarded_spawn()
    options = BuildOptions(
        text_field=text_field,
        add_bos=add_bos,
        add_eos=add_eos,
        batch_size=batch_size,
        docs_per_file=DEFAULT_DOCS_PER_FILE if docs_per_file is None else docs_per_file,
    )
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ConfigError(f"num_proc={num_proc!r}: must be None (all CPUs) or an integer >= 1")
    check_output_path(out_dir, _source_paths(source))
    tok_json, tinfo = resolve_tokenizer(tokenizer)
    if add_eos and tinfo.eos_id is None:
        from tokenizers import Tokenizer

        tokens = eos_suggestion(Tokenizer.from_str(tok_json).get_vocab(with_added_tokens=True),
                                rejected=tinfo.eos_token)
        named = "" if tinfo.eos_token is None else (
            f" (it names eos_token={tinfo.eos_token!r}, which is not in its vocabulary, so it has no id)")
        raise TokenizerError(
            f"tokenizer {tinfo.class_name} has no eos_token but add_eos=True{named}: set add_eos=False or set the "
            f"tokenizer's eos_token to a token of its vocabulary (tokenizer.eos_token = ...; it holds {tokens})"
        )
    if add_bos and tinfo.bos_id is None:
        raise TokenizerError(
            f"tokenizer {tinfo.class_name} has no bos_token but add_bos=True: set add_bos=False or use a "
            "tokenizer with a bos_token"
        )
    dtype = "uint16" if tinfo.vocab_size <= _UINT16_LIMIT else "uint32"
    src = resolve_source(source, text_field=options.text_field, split=split)
    build_key = None
    if src.fingerprint is not None:
        build_key = hashlib.sha256(json.dumps({
            "format_version": FORMAT_VERSION,
            "options": options.to_json(),
            "tokenizer": tinfo.to_json(),
            "dtype": dtype,
            "source": src.fingerprint,
        }, sort_keys=True).encode()).hexdigest()
    if src.num_documents == 0:
        raise EmptyDataError(
            f"source has no documents: {src.describe()}; nothing to store (check the path, split or filter "
            "that produced it)"
        )

    def produce(tmp: Path) -> dict[str, Any]:
        records = _tokenize_into(tmp, src, tok_json, tinfo, options, dtype, num_proc, progress)
        if not records:
            raise EmptyDataError(
                f"source has no documents: {src.describe()}; nothing to store (check the path, split "
                "or filter that produced it)"
            )
        return _make_meta(
            records, dtype=dtype, tinfo=tinfo, options=options.to_json(), add_bos=add_bos, add_eos=add_eos,
            source={"kind": src.kind, "description": src.description, "fingerprint": src.fingerprint},
            build_key=build_key,
        )

    return _publish(out_dir, build_key, overwrite, produce, open_store)

def store_from_token_files(
    files: Sequence[Sequence[Sequence[int]]],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    pad_id: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    open_store: OpenStore[StoreT],
) -> StoreT:
    """Write already-tokenized documents as a store: ``files[f][j]`` is document j of store file f.

    Why: tests, the conformance kit and pipelines that tokenize elsewhere
    need stores whose file structure they choose (one store file per input
    file, files with zero documents, documents with zero tokens). Tokens
    are stored as given (no bos/eos added); ids must lie in
    ``[0, vocab_size)`` (``vocab_size`` defaults to the largest id + 1) and
    choose uint16 or uint32 as in :meth:`build`. Unlike :meth:`build`, an
    empty corpus is written (``num_documents == 0``): refusing it is the
    loaders' job (EmptyDataError). Same lock/temp-dir/rename protocol and
    the same "return the identical existing store" rule as :meth:`build`.
    """
    _refuse_unguarded_spawn()
    prepared: list[tuple[np.ndarray, np.ndarray]] = []
    digest = hashlib.sha256(b"loadspec-token-files-v1\0")
    max_id = -1
    for f, docs in enumerate(files):
        docs = list(docs)
        lens = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        total = int(lens.sum())
        try:
            flat = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int64, count=total)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"file {f}: documents must be sequences of integer token ids ({exc})") from exc
        if total and int(flat.min()) < 0:
            raise ConfigError(f"file {f}: negative token id {int(flat.min())}; token ids are >= 0")
        if total:
            max_id = max(max_id, int(flat.max()))
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        digest.update(len(docs).to_bytes(8, "little"))
        digest.update(offsets.tobytes())
        digest.update(flat.tobytes())
        prepared.append((flat, offsets))
    specials = [i for i in (eos_id, bos_id, pad_id) if i is not None]
    bound = max([max_id, *specials]) + 1
    if vocab_size is None:
        vocab_size = max(bound, 1)
    elif isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < bound:
        raise ConfigError(
            f"vocab_size={vocab_size!r} but the documents/special ids use id {bound - 1}: pass a vocab_size "
            "larger than every token id (or leave it None)"
        )
    if vocab_size > 1 << 32:
        raise ConfigError(f"vocab_size={vocab_size} does not fit uint32 token ids")
    dtype = "uint16" if vocab_size <= _UINT16_LIMIT else "uint32"
    ident = json.dumps({"pretokenized": True, "vocab_size": vocab_size, "eos": eos_id, "bos": bos_id,
                        "pad": pad_id}, sort_keys=True)
    tinfo = TokenizerInfo(
        sha256=hashlib.sha256(ident.encode()).hexdigest(), class_name="pretokenized", vocab_size=vocab_size,
        eos_id=eos_id, bos_id=bos_id, pad_id=pad_id, eos_token=None, bos_token=None, pad_token=None,
    )
    source_fp = digest.hexdigest()
    build_key = hashlib.sha256(json.dumps(
        {"format_version": FORMAT_VERSION, "tokenizer": tinfo.to_json(), "dtype": dtype, "source": source_fp},
        sort_keys=True).encode()).hexdigest()

    def produce(tmp: Path) -> dict[str, Any]:
        records = []
        bar = _progress_bar(progress, len(prepared))
        try:
            for index, (flat, offsets) in enumerate(prepared):
                path = str(tmp / FILE_TEMPLATE.format(index))
                _write_token_file(path, flat.astype(dtype), offsets)
                records.append(_file_record(path, offsets, int(np.count_nonzero(np.diff(offsets) == 0))))
                bar.update(1)
        finally:
            bar.close()
        options = {"pretokenized": True, "add_bos": False, "add_eos": False, "text_field": None,
                   "batch_size": None, "docs_per_file": None}
        return _make_meta(records, dtype=dtype, tinfo=tinfo, options=options, add_bos=False, add_eos=False,
                          source={"kind": "token_files", "description": f"{len(prepared)} files",
                                  "fingerprint": source_fp},
                          build_key=build_key)

    return _publish(out_dir, build_key, overwrite, produce, open_store)


# --------------------------------------------------------------------------- token files


def _write_token_file(path: str, values: np.ndarray, offsets: np.ndarray) -> None:
    arr = pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), pa.array(values))
    schema = pa.schema(
        [pa.field(COLUMN, arr.type, nullable=False)],
        metadata={"loadspec.format": FORMAT_NAME, "loadspec.format_version": str(FORMAT_VERSION)},
    )
    batch = pa.record_batch([arr], schema=schema)
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:  # arrow's errors name no file: add it
            raise OSError(exc.errno, os.strerror(exc.errno), path) from exc
        raise
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- build workers


def _write_encoded(enc: Encoder, path: str, texts: Sequence[str],
                   on_batch: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Tokenize one contiguous range of documents and write it as one token file; return its record.

    This is a worker's whole unit of work (``_worker_write``): workers write
    and hash finished files, so only the small record travels back to the
    parent, never the tokens.
    """
    values, offsets, num_empty = enc.encode(texts, on_batch)
    _write_token_file(path, values, offsets)
    return _file_record(path, offsets, num_empty)


_WORKER_ENCODER: Encoder | None = None


def _worker_init(tok_json_path: str, dtype: str, bos_id: int | None, eos_id: int | None, batch_size: int,
                 threads: int, parent_pid: int | None = None) -> None:
    # The tokenizer travels as a file path: spawn writes a child's arguments
    # into a pipe before the child runs, and a multi-MB argument (GPT-2's JSON)
    # blocks that write forever if the child dies first (e.g. an unguarded
    # script), and the build would hang.
    # Each worker is one of num_proc processes: cap the tokenizer's own thread
    # pool (read by rayon at first use) so processes x threads <= cores.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    global _WORKER_ENCODER
    tok_json = Path(tok_json_path).read_text(encoding="utf-8")
    _WORKER_ENCODER = Encoder(tok_json, dtype=dtype, bos_id=bos_id, eos_id=eos_id, batch_size=batch_size)


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, *, poll_s: float = 1.0) -> None:
    """Make this (worker) process exit when ``parent_pid`` dies, so a killed build leaves no workers behind.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (the kernel kills us with the
    parent), re-checked against a parent that died before the call. Everywhere:
    a daemon thread that exits the process once ``os.getppid()`` is no longer
    ``parent_pid`` (the orphan was re-parented), within ``poll_s`` seconds.
    """
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="loadspec-parent-watchdog", daemon=True).start()


def _worker_write(path: str, texts: list[str]) -> dict[str, Any]:
    assert _WORKER_ENCODER is not None, "worker not initialised"
    return _write_encoded(_WORKER_ENCODER, path, texts)


def _on_file_written(tmp_dir: Path, record: Mapping[str, Any]) -> None:
    """Test seam called after each token file of an in-process build (no-op)."""


# --------------------------------------------------------------------------- helpers



def _version_of(module: str) -> str | None:
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None)


def _file_record(path: str, offsets: np.ndarray, num_empty: int) -> dict[str, Any]:
    """The file's record: counts, size, sha256, quick signature, a CRC-32 per block and the Arrow buffer layout."""
    size = os.path.getsize(path)
    sha256, block_crc32 = hash_file_blocks(path, BLOCK_BYTES)
    buffers = arrow_buffer_layout(path)
    num_tokens = int(offsets[-1])
    itemsize = buffers["values"][1] // num_tokens if num_tokens else 1
    document_crc32 = hash_documents(path, buffers["values"][0], offsets, itemsize)
    record = FileRecord(
        name=os.path.basename(path),
        num_documents=len(offsets) - 1,
        num_tokens=int(offsets[-1]),
        num_empty_documents=num_empty,
        size=size,
        sha256=sha256,
        quick_signature=quick_signature(path, size),
        block_crc32=block_crc32,
        buffers=buffers,
    ).to_json()
    record["document_crc32"] = document_crc32
    return record


def _make_meta(records: list[dict[str, Any]], *, dtype: str, tinfo: TokenizerInfo, options: dict[str, Any],
               add_bos: bool, add_eos: bool, source: dict[str, Any], build_key: str | None) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dtype": dtype,
        "num_documents": sum(r["num_documents"] for r in records),
        "num_tokens": sum(r["num_tokens"] for r in records),
        "num_empty_documents": sum(r["num_empty_documents"] for r in records),
        "files": records,
        "fingerprint": content_fingerprint([r["sha256"] for r in records], dtype, tinfo.sha256, add_bos, add_eos),
        "tokenizer": tinfo.to_json(),
        "options": options,
        "source": source,
        "build_key": build_key,
        "build_id": uuid.uuid4().hex,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "layout": {
            "file_format": "arrow-ipc-file",
            "column": COLUMN,
            "type": str(arrow_type(np.dtype(dtype))),
            "quick_signature_bytes": QUICK_SIGNATURE_BYTES,
            "block_bytes": BLOCK_BYTES,
            "block_checksum": "crc32",
        },
        "versions": {"pyarrow": pa.__version__, "numpy": np.__version__, "tokenizers": _version_of("tokenizers")},
    }


def _with_block_table(tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with its records' CRCs moved into the CRC table files (:func:`impl.store_format.take_crc_tables`).

    Written before ``meta.json``, which records each table's size and sha256.
    """
    for spec, table in take_crc_tables(meta):
        atomic_write_bytes(tmp / spec.name, table)
    return meta


_MARKER = ".loadspec-build"
"""File a builder writes into its temporary directory first: only directories carrying it are ever cleaned up."""

_TOKENIZER_FILE = ".loadspec-build.tokenizer.json"
_STORE_ENTRY = re.compile(
    r"^(meta\.json|blocks\.crc32|documents\.crc32|tokens-\d{5,}\.arrow|"
    r"\.(meta\.json|blocks\.crc32|documents\.crc32|\.loadspec-build)\..*\.tmp|"
    r"\.loadspec-build.*)$")


PLANS_DIR = ".plans"
"""Where ``PackedDataset`` caches epoch plans inside a store (loadspec's own; replaced with the store)."""
_PLAN_ENTRY = re.compile(r"^\.?plan-[0-9a-f]{16,}\.(npy|json)(\.lock)?(\..*\.tmp)?$")


def _is_plan_cache_dir(path: Path) -> bool:
    """True when ``path`` is a store's plan cache: a real directory of plan files, locks and their temp files only."""
    try:
        return path.is_dir() and not path.is_symlink() and all(
            _PLAN_ENTRY.match(e.name) and e.is_file() and not e.is_symlink() for e in path.iterdir())
    except OSError:
        return False


def _is_loadspec_store_dir(path: Path) -> bool:
    """True when ``path`` holds a loadspec store's ``meta.json`` and nothing but store files (safe to replace).

    Store files are the token files, ``meta.json``, the builder's marker and
    temp files, and the plan cache ``.plans`` that datasets write beside them.
    """
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        entries = list(path.iterdir())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME and all(
        _is_plan_cache_dir(e) if e.name == PLANS_DIR else bool(_STORE_ENTRY.match(e.name)) for e in entries)


def _is_own_temp_dir(path: Path, out: Path) -> bool:
    """A ``.<out>.tmp-*`` / ``.<out>.old-*`` directory this code created: it carries the marker or is a store.

    So does one that is empty or holds only the marker's own temp file (a
    builder killed between ``mkdir`` and the marker's rename leaves it).
    """
    try:
        info = json.loads((path / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        try:
            names = [e.name for e in path.iterdir()]
        except OSError:
            return False
        if all(n.startswith(f".{_MARKER}.") and n.endswith(".tmp") for n in names):
            return True  # empty, or killed while writing the marker
        return _is_loadspec_store_dir(path)
    return isinstance(info, dict) and info.get("out") == out.name and all(
        _STORE_ENTRY.match(e.name) for e in path.iterdir())


def check_output_path(out_dir: str | os.PathLike[str], source_paths: Sequence[str | os.PathLike[str]]) -> None:
    """Refuse an output path equal to, inside or containing a source path (a build must never touch its input).

    >>> check_output_path("/data/store", ["/data/corpus"])   # siblings: fine
    >>> check_output_path("/data/corpus/store", ["/data/corpus"])
    Traceback (most recent call last):
    ...
    impl.errors.UnsafeOutputError: out_dir '/data/corpus/store' is inside the source '/data/corpus': a build never writes over or next to its own input; choose an out_dir outside the source (e.g. a sibling directory)
    """
    out = Path(os.path.realpath(os.fspath(out_dir)))
    for sp in source_paths:
        src = Path(os.path.realpath(os.fspath(sp)))
        if out == src:
            how = "is the source"
        elif out.is_relative_to(src):
            how = "is inside the source"
        elif src.is_relative_to(out):
            how = "contains the source"
        else:
            continue
        raise UnsafeOutputError(
            f"out_dir {os.fspath(out_dir)!r} {how} {os.fspath(sp)!r}: a build never writes over or next to "
            "its own input; choose an out_dir outside the source (e.g. a sibling directory)"
        )


def _source_paths(source: Any) -> list[str | os.PathLike[str]]:
    if isinstance(source, (str, os.PathLike)):
        return [source]
    if isinstance(source, (list, tuple)) and source and all(isinstance(p, os.PathLike) for p in source):
        return list(source)
    return []


def _publish(out_dir: str | os.PathLike[str], build_key: str | None, overwrite: bool,
             produce: Callable[[Path], dict[str, Any]], open_store: OpenStore[StoreT]) -> StoreT:
    """Run ``produce(tmp_dir) -> meta`` under the out_dir lock and put the result in place atomically.

    The lock serialises builders of one ``out_dir``; the temporary sibling
    directory (``.<name>.tmp-<pid>-<random>``, carrying a ``.loadspec-build``
    marker) is never what ``open`` looks at, and ``meta.json`` is written last.
    A new store is renamed into place; a replaced one is swapped with the new
    one in a single ``renameat2(RENAME_EXCHANGE)`` (two renames where that is
    unsupported), so readers of ``out_dir`` see the old store or the new one.
    A crash leaves the previous state plus a marked temp dir, which the next
    builder removes (it holds the lock, so its creator is gone); nothing
    without the marker (or that is not a store) is ever removed. OS errors
    (read-only directory, full disk) become :class:`StoreError` naming the
    path, with no half-written store left.
    """
    out = Path(os.path.abspath(os.fspath(out_dir)))
    try:
        return _publish_locked(out, build_key, overwrite, produce, open_store)
    except OSError as exc:
        if isinstance(exc, (TimeoutError, LoadspecError)) or exc.errno is None:
            raise
        where = exc.filename or out
        hint = {errno.ENOSPC: "free space on that filesystem or choose an out_dir on another one",
                errno.EDQUOT: "free space within your quota or choose an out_dir on another filesystem",
                errno.EFBIG: "the file size limit (ulimit -f) or the disk was reached: raise it or free space",
                errno.EROFS: "the filesystem is read-only: choose a writable out_dir",
                errno.EACCES: "you may not write there: choose a writable out_dir or fix its permissions",
                errno.EPERM: "you may not write there: choose a writable out_dir or fix its permissions",
                }.get(exc.errno or 0, "fix the cause or choose another out_dir")
        raise StoreError(
            f"building the store at {out} failed writing {os.fspath(where)!r}: {exc.strerror or exc} "
            f"(errno {exc.errno}); no store was written there (any previous one is untouched): {hint}"
        ) from exc


def _publish_locked(out: Path, build_key: str | None, overwrite: bool,
                    produce: Callable[[Path], dict[str, Any]], open_store: OpenStore[StoreT]) -> StoreT:
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path_for(out), timeout=_lock_timeout()):
        _remove_stale_temp_dirs(out)
        existing = _existing_store(out, build_key, overwrite, open_store)
        if existing is not None:
            return existing
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        trash: Path | None = None
        try:
            atomic_write_json(tmp / _MARKER, {"out": out.name, "pid": os.getpid(), "host": socket.gethostname()})
            meta = _with_block_table(tmp, produce(tmp))
            atomic_write_json(tmp / META_FILE, meta)
            fsync_dir(tmp)
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()
            if out.exists():
                if exchange_dirs(tmp, out):
                    trash = tmp  # now holds the old store
                else:
                    trash = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                    os.rename(out, trash)
                    os.rename(tmp, out)
            else:
                os.rename(tmp, out)
            fsync_dir(out.parent)
        except BaseException:
            if trash is None and _is_own_temp_dir(tmp, out):
                _remove_own_dir(tmp, out)
            raise
        with contextlib.suppress(OSError):
            os.unlink(out / _MARKER)
        if trash is not None and _is_own_temp_dir(trash, out):
            _remove_own_dir(trash, out)
        return open_store(out)


def _lock_timeout() -> float:
    return float(os.environ.get("LOADSPEC_LOCK_TIMEOUT_S", LOCK_TIMEOUT_S))


def _remove_stale_temp_dirs(out: Path) -> None:
    """Remove temp/old directories left by crashed builders of ``out`` (caller holds the lock).

    Only directories this module made are removed: name ``.<out>.tmp-*`` or
    ``.<out>.old-*`` *and* the builder's marker file or a store's contents.
    A user's directory that happens to match the name is left alone.
    """
    prefixes = (f".{out.name}.tmp-", f".{out.name}.old-")
    for entry in out.parent.iterdir():
        if entry.name.startswith(prefixes) and entry.is_dir() and not entry.is_symlink() \
                and _is_own_temp_dir(entry, out):
            _remove_own_dir(entry, out)


def _remove_own_dir(path: Path, out: Path) -> None:
    """Delete a temp/old directory of ``out`` so that it stays recognisable until it is gone.

    The marker is written first and deleted last: a builder killed half way
    through leaves a directory the next builder still knows is its own.
    """
    with contextlib.suppress(OSError):
        if not (path / _MARKER).exists():
            atomic_write_json(path / _MARKER, {"out": out.name, "pid": os.getpid(), "host": socket.gethostname()})
        for entry in path.iterdir():
            if entry.name == PLANS_DIR and _is_plan_cache_dir(entry):
                for plan in entry.iterdir():
                    plan.unlink()
                entry.rmdir()
            elif entry.name != _MARKER:
                entry.unlink()
        (path / _MARKER).unlink(missing_ok=True)
        path.rmdir()


def _existing_store(out: Path, build_key: str | None, overwrite: bool,
                    open_store: OpenStore[StoreT]) -> StoreT | None:
    if not out.exists() and not out.is_symlink():
        return None
    if out.is_symlink() and out.is_dir() and _is_loadspec_store_dir(out) and not overwrite:
        with contextlib.suppress(StoreError):
            linked = open_store(out)
            if build_key is not None and linked.meta.get("build_key") == build_key:
                return linked  # the same store, reached through a link: nothing to replace
    if not out.is_dir() or out.is_symlink():
        if out.is_symlink():
            raise UnsafeOutputError(
                f"{out} is a symlink (to {os.path.realpath(out)!r}); loadspec never builds into or replaces a "
                "link: pass the directory it points to as out_dir, or choose another out_dir"
            )
        raise UnsafeOutputError(
            f"{out} exists and is {'a symlink' if out.is_symlink() else 'a file'}, not a token store directory; "
            "loadspec never replaces it (overwrite=True only replaces a loadspec store): choose another out_dir"
        )
    if not any(out.iterdir()):
        return None
    if not _is_loadspec_store_dir(out):
        shown = sorted(e.name for e in out.iterdir())[:5]
        raise UnsafeOutputError(
            f"{out} is a directory that is not a loadspec token store (it holds {shown}"
            f"{'...' if len(list(out.iterdir())) > 5 else ''}); loadspec never replaces a directory it did not "
            "create, with or without overwrite: choose another out_dir (e.g. a new subdirectory)"
        )
    try:
        store = open_store(out)
    except StoreError as exc:
        if overwrite:
            return None
        raise StoreError(
            f"{out} holds a token store that cannot be opened ({exc}); pass overwrite=True to replace that store "
            "or choose another out_dir"
        ) from exc
    if build_key is not None and store.meta.get("build_key") == build_key and not overwrite:
        return store
    if overwrite:
        return None
    why = ("its source cannot be fingerprinted (an iterator), so it cannot be matched to the existing store"
           if build_key is None else "it was built from a different source, tokenizer or options")
    raise StoreError(
        f"a token store already exists at {out} (fingerprint {store.fingerprint[:16]}...) and {why}: use "
        "TokenStore.open to read it, pass overwrite=True to replace that store, or choose another out_dir"
    )


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _refuse_unguarded_spawn() -> None:
    """Fail at once when called while a ``spawn`` child re-imports the parent's script.

    Why: a script that calls ``TokenStore.build(..., num_proc=8)`` at top level,
    without an ``if __name__ == "__main__":`` guard, runs that call again in
    every spawned worker; the worker then waits forever on the lock its parent
    holds. multiprocessing marks a child as "inheriting" until its bootstrap
    (the re-import) is over, so a build started then is exactly this mistake.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        main_file = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
        raise UnguardedMainError(
            f"TokenStore.build was called while a spawned worker process was re-importing {main_file}: the "
            "script builds at top level. Put the build under `if __name__ == \"__main__\":` (spawned worker "
            "processes re-import the script), or build with num_proc=1"
        )


def _spawn_can_start() -> bool:
    """False when spawned children could not re-import ``__main__`` (e.g. ``python - < script``).

    multiprocessing's spawn re-runs the parent's main file in each child; when
    that "file" is ``<stdin>`` the children die at start-up and a process pool
    waits forever, so such builds run in-process instead (same output).
    """
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file):
        import warnings

        warnings.warn(
            f"__main__ is {main_file!r}, which spawned worker processes cannot import; tokenizing in-process "
            "(run from a script file, with an `if __name__ == '__main__':` guard, to use num_proc > 1)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def _tokenize_into(tmp: Path, src: Source, tok_json: str, tinfo: TokenizerInfo, options: BuildOptions,
                   dtype: str, num_proc: int | None, progress: bool) -> list[dict[str, Any]]:
    bos_id = tinfo.bos_id if options.add_bos else None
    eos_id = tinfo.eos_id if options.add_eos else None
    bar: Any
    if progress and src.num_documents is None and src.num_bytes and src.batches_with_bytes is not None:
        bar = _BytesProgress(_progress_bar(True, src.num_bytes, unit="B"))
        batches = bar.track(src.batches_with_bytes())
    else:
        bar = _progress_bar(progress, src.num_documents)
        batches = src.batches()
    ranges = rechunk(batches, options.docs_per_file)
    wanted = _cpu_count() if num_proc is None else num_proc
    if src.num_documents is not None:
        wanted = min(wanted, max(1, math.ceil(src.num_documents / options.docs_per_file)))
    head: list[list[str]] = []
    if wanted > 1:
        # Peek far enough to know whether there is more than one range to share out.
        head = list(itertools.islice(ranges, wanted))
        wanted = min(wanted, len(head))
    ranges = itertools.chain(head, ranges)
    if wanted > 1 and not _spawn_can_start():
        wanted = 1
    records: list[dict[str, Any]] = []
    try:
        if wanted <= 1:
            enc = Encoder(tok_json, dtype=dtype, bos_id=bos_id, eos_id=eos_id, batch_size=options.batch_size)
            for index, texts in enumerate(ranges):
                rec = _write_encoded(enc, str(tmp / FILE_TEMPLATE.format(index)), texts, on_batch=bar.update)
                records.append(rec)
                _on_file_written(tmp, rec)
        else:
            threads = max(1, _cpu_count() // wanted)
            tok_file = tmp / _TOKENIZER_FILE
            tok_file.write_text(tok_json, encoding="utf-8")
            initargs = (str(tok_file), dtype, bos_id, eos_id, options.batch_size, threads, os.getpid())
            try:
                records = _run_pool(tmp, ranges, wanted, initargs, bar)
            finally:
                tok_file.unlink(missing_ok=True)
    finally:
        bar.close()
    return records


WORKER_TIMEOUT_S = 3600.0
"""Longest a build waits for one worker's file (``LOADSPEC_WORKER_TIMEOUT_S`` overrides): no wait is unbounded."""


def _run_pool(tmp: Path, ranges: Iterator[list[str]], workers: int, initargs: tuple[Any, ...],
              bar: Any) -> list[dict[str, Any]]:
    """Tokenize ``ranges`` in ``workers`` spawned processes, at most ``workers`` files in flight, in order.

    Every wait is bounded (:data:`WORKER_TIMEOUT_S` per file) and a worker
    that dies (start-up failure, OOM kill) ends the build with a
    :class:`StoreError` naming the likely cause and its fix; on any failure
    the workers are killed, not joined, so a stuck worker cannot hang the
    parent.
    """
    timeout = float(os.environ.get("LOADSPEC_WORKER_TIMEOUT_S", WORKER_TIMEOUT_S))
    ctx = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                                  initargs=initargs)
    records: list[dict[str, Any]] = []
    pending: collections.deque[tuple[int, str, concurrent.futures.Future[dict[str, Any]]]] = collections.deque()

    def collect() -> None:
        n, name, fut = pending.popleft()
        try:
            records.append(fut.result(timeout=timeout))
        except concurrent.futures.TimeoutError:
            raise StoreError(
                f"a build worker did not finish {name} ({n} documents) within {timeout:.0f} s; the build was "
                "stopped: check the machine's load and memory, or raise LOADSPEC_WORKER_TIMEOUT_S"
            ) from None
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise StoreError(
                f"a build worker process died while writing {name} ({exc}). If your script calls "
                "TokenStore.build at top level, put that call under `if __name__ == \"__main__\":` "
                "(spawned workers re-import the script; its error is printed above); otherwise the worker "
                "was killed (often out of memory): retry with a smaller num_proc, or num_proc=1"
            ) from exc
        bar.update(n)

    ok = False
    try:
        for index, texts in enumerate(ranges):
            name = FILE_TEMPLATE.format(index)
            pending.append((len(texts), name, pool.submit(_worker_write, str(tmp / name), texts)))
            while len(pending) > workers:
                collect()
        while pending:
            collect()
        ok = True
    finally:
        if ok:
            pool.shutdown(wait=True)
        else:
            _kill_pool(pool)
    return records


def _kill_pool(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop a pool without waiting on its workers (a hung or dead worker must not hang the build)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(10)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(enabled: bool, total: int | None, unit: str = "doc") -> Any:
    """A tqdm bar on stderr (total, rate and ETA when ``total`` is known), or a no-op when disabled.

    ``unit="B"`` counts bytes, scaled (``1.50MB/s``).
    """
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with datasets
        return _NoBar()
    scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, unit=unit, desc="tokenizing", file=sys.stderr, dynamic_ncols=True, **scaled)


class _BytesProgress:
    """Progress in bytes of the source's files, for sources whose document count is not known up front.

    Why bytes: a JSON Lines or txt directory's document count is known only
    after reading it all, but the sum of its file sizes costs a stat per
    file, and it gives the bar a total, a rate and an ETA. The reader records
    ``(documents read, bytes read)`` after each batch (:meth:`track`); the
    tokenizer reports documents done (:meth:`update`), and the bar moves to
    the bytes interpolated between the checkpoints around that count (reading
    runs at most a few ranges ahead of tokenizing).

    >>> bar = _BytesProgress(_NoBar())
    >>> list(bar.track(iter([(["a", "b"], 10), (["c", "d"], 30), ([], 40)])))
    [['a', 'b'], ['c', 'd']]
    >>> [bar.update(1) for _ in range(4)] and bar.shown
    40
    >>> bar._position(3), bar._position(1)
    (20, 5)
    """

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.docs, self.bytes = [0], [0]
        self.done = self.shown = 0

    def track(self, batches: Iterator[tuple[list[str], int]]) -> Iterator[list[str]]:
        for texts, read in batches:
            self.docs.append(self.docs[-1] + len(texts))
            self.bytes.append(max(read, self.bytes[-1]))
            if texts:
                yield texts

    def _position(self, done: int) -> int:
        i = bisect.bisect_right(self.docs, done) - 1
        if i + 1 >= len(self.docs):
            return self.bytes[i]
        d0, d1, b0, b1 = self.docs[i], self.docs[i + 1], self.bytes[i], self.bytes[i + 1]
        return b0 + (b1 - b0) * (done - d0) // max(1, d1 - d0)

    def update(self, n: int = 1) -> None:
        self.done += n
        position = self._position(self.done)
        if position > self.shown:
            self.bar.update(position - self.shown)
            self.shown = position

    def close(self) -> None:
        self.bar.close()
