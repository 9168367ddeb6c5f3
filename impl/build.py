"""Building a token store: tokenize a source (in this process or in spawned workers) and publish it atomically.

Why apart from :mod:`impl.store`: the store module owns what is on disk and
how it is read; this one owns how it gets there, which is where the hard
failure modes live (parallel workers, locks, a crash half way, replacing an
existing store). :meth:`TokenStore.build` and
:meth:`TokenStore.from_token_files` are the public entry points and delegate
here.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from impl._atomic import atomic_write_json, file_lock, fsync_dir, lock_path_for
from impl.encoding import Encoder, TokenizerInfo, resolve_tokenizer
from impl.errors import ConfigError, EmptyDataError, StoreError, TokenizerError
from impl.sources import Source, rechunk, resolve_source
from impl.store import (
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
    TokenStore,
    _arrow_type,
    _content_fingerprint,
    arrow_buffer_layout,
    hash_file_blocks,
    quick_signature,
)

__all__ = ["build_store", "store_from_token_files"]

_UINT16_LIMIT = 1 << 16


# --------------------------------------------------------------------------- entry points


def build_store(
    source: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike,
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
    """Tokenize ``source`` into a new store at ``out_dir`` and return it opened.

    ``source``: a ``datasets.Dataset`` / ``IterableDataset``; a
    ``DatasetDict`` with ``split=``; a parquet, arrow (IPC file or stream),
    JSON Lines or txt (one document a line; ``\\n`` separated, a trailing
    ``\\r`` dropped) file, or a directory of them (recursively, sorted by
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
    calling script needs the usual ``if __name__ == "__main__":`` guard.

    Concurrency: the whole build holds ``file_lock(out_dir + ".lock")`` and
    writes into a temporary sibling directory that is renamed into place
    only when complete (``meta.json`` last). If ``out_dir`` already holds a
    store built from the same source with the same tokenizer and options
    (e.g. by a concurrent builder), that store is returned; a different
    store raises :class:`StoreError` unless ``overwrite=True``.

    Raises :class:`EmptyDataError` for a source with no documents (a
    source whose documents are all empty is stored: they are counted in
    ``num_empty_documents``), :class:`TokenizerError` if a needed special token is
    missing, :class:`SourceError`/:class:`ConfigError` for unreadable input.
    """
    options = BuildOptions(
        text_field=text_field,
        add_bos=add_bos,
        add_eos=add_eos,
        batch_size=batch_size,
        docs_per_file=DEFAULT_DOCS_PER_FILE if docs_per_file is None else docs_per_file,
    )
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ConfigError(f"num_proc={num_proc!r}: must be None (all CPUs) or an integer >= 1")
    tok_json, tinfo = resolve_tokenizer(tokenizer)
    if add_eos and tinfo.eos_id is None:
        raise TokenizerError(
            f"tokenizer {tinfo.class_name} has no eos_token but add_eos=True: set add_eos=False or use a "
            "tokenizer with an eos_token (e.g. load it with eos_token='<|endoftext|>')"
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

    return _publish(out_dir, build_key, overwrite, produce)

def store_from_token_files(
    files: Sequence[Sequence[Sequence[int]]],
    out_dir: str | os.PathLike,
    *,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    pad_id: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> TokenStore:
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

    return _publish(out_dir, build_key, overwrite, produce)


# --------------------------------------------------------------------------- token files


def _write_token_file(path: str, values: np.ndarray, offsets: np.ndarray) -> None:
    arr = pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), pa.array(values))
    schema = pa.schema(
        [pa.field(COLUMN, arr.type, nullable=False)],
        metadata={"loadspec.format": FORMAT_NAME, "loadspec.format_version": str(FORMAT_VERSION)},
    )
    batch = pa.record_batch([arr], schema=schema)
    with pa.OSFile(path, "wb") as sink:
        with pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
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


def _worker_init(tok_json: str, dtype: str, bos_id: int | None, eos_id: int | None, batch_size: int,
                 threads: int) -> None:
    # Each worker is one of num_proc processes: cap the tokenizer's own thread
    # pool (read by rayon at first use) so processes x threads <= cores.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    global _WORKER_ENCODER
    _WORKER_ENCODER = Encoder(tok_json, dtype=dtype, bos_id=bos_id, eos_id=eos_id, batch_size=batch_size)


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
    return FileRecord(
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
        "fingerprint": _content_fingerprint([r["sha256"] for r in records], dtype, tinfo.sha256, add_bos, add_eos),
        "tokenizer": tinfo.to_json(),
        "options": options,
        "source": source,
        "build_key": build_key,
        "build_id": uuid.uuid4().hex,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "layout": {
            "file_format": "arrow-ipc-file",
            "column": COLUMN,
            "type": str(_arrow_type(np.dtype(dtype))),
            "quick_signature_bytes": QUICK_SIGNATURE_BYTES,
            "block_bytes": BLOCK_BYTES,
            "block_checksum": "crc32",
        },
        "versions": {"pyarrow": pa.__version__, "numpy": np.__version__, "tokenizers": _version_of("tokenizers")},
    }


def _publish(out_dir: str | os.PathLike, build_key: str | None, overwrite: bool,
             produce: Callable[[Path], dict[str, Any]]) -> TokenStore:
    """Run ``produce(tmp_dir) -> meta`` under the out_dir lock and rename the result into place.

    The lock serialises builders of one ``out_dir``; the temporary sibling
    directory (``.<name>.tmp-<pid>-<random>``) is never what ``open`` looks at,
    and ``meta.json`` is written last, so a crash at any point leaves either no
    store or the previous one. Leftovers of crashed builders are removed by the
    next builder (it holds the lock, so none of them is still running).
    """
    out = Path(os.path.abspath(os.fspath(out_dir)))
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path_for(out)):
        _remove_stale_temp_dirs(out)
        existing = _existing_store(out, build_key, overwrite)
        if existing is not None:
            return existing
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        trash: Path | None = None
        try:
            meta = produce(tmp)
            atomic_write_json(tmp / META_FILE, meta)
            fsync_dir(tmp)
            if out.exists():
                if out.is_dir() and not any(out.iterdir()):
                    out.rmdir()
                else:
                    trash = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                    os.rename(out, trash)
            os.rename(tmp, out)
            fsync_dir(out.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return TokenStore.open(out)


def _remove_stale_temp_dirs(out: Path) -> None:
    """Remove temp/old directories left by builders of ``out`` that crashed (caller holds the lock)."""
    prefixes = (f".{out.name}.tmp-", f".{out.name}.old-")
    for entry in out.parent.iterdir():
        if entry.name.startswith(prefixes) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def _existing_store(out: Path, build_key: str | None, overwrite: bool) -> TokenStore | None:
    if not out.exists():
        return None
    if not out.is_dir():
        if overwrite:
            raise StoreError(f"{out} is a file, not a store directory: remove it or choose another out_dir")
        raise StoreError(f"{out} exists and is a file: choose another out_dir or remove it")
    if not any(out.iterdir()):
        return None
    try:
        store = TokenStore.open(out)
    except StoreError as exc:
        if overwrite:
            return None
        raise StoreError(
            f"{out} exists but is not a valid token store ({exc}); pass overwrite=True to replace it or choose "
            "another out_dir"
        ) from exc
    if build_key is not None and store.meta.get("build_key") == build_key and not overwrite:
        return store
    if overwrite:
        return None
    why = ("its source cannot be fingerprinted (an iterator), so it cannot be matched to the existing store"
           if build_key is None else "it was built from a different source, tokenizer or options")
    raise StoreError(
        f"a token store already exists at {out} (fingerprint {store.fingerprint[:16]}...) and {why}: use "
        "TokenStore.open to read it, pass overwrite=True to replace it, or choose another out_dir"
    )


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


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
    ranges = rechunk(src.batches(), options.docs_per_file)
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
    bar = _progress_bar(progress, src.num_documents)
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
            ctx = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(
                max_workers=wanted, mp_context=ctx, initializer=_worker_init,
                initargs=(tok_json, dtype, bos_id, eos_id, options.batch_size, threads),
            ) as pool:
                pending: collections.deque = collections.deque()
                try:
                    for index, texts in enumerate(ranges):
                        pending.append((len(texts), pool.submit(_worker_write, str(tmp / FILE_TEMPLATE.format(index)), texts)))
                        while len(pending) > wanted:
                            n, fut = pending.popleft()
                            records.append(fut.result())
                            bar.update(n)
                    while pending:
                        n, fut = pending.popleft()
                        records.append(fut.result())
                        bar.update(n)
                except BaseException:
                    for _, fut in pending:
                        fut.cancel()
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()
    return records


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(enabled: bool, total: int | None) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with datasets
        return _NoBar()
    return tqdm(total=total, unit="doc", desc="tokenizing", file=sys.stderr, dynamic_ncols=True)
