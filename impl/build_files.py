"""A store's token files and the meta that lists them: encode a range of documents, write it, describe it.

Why apart from :mod:`impl.build`: every way of building a store (in this
process, in spawned workers, in tasks of a multi-machine build) writes the
same files the same way, and the meta is a pure function of their records,
so two builds that cut the same documents into the same files publish the
same bytes and the same fingerprint.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Self

import numpy as np
import pyarrow as pa

from impl.encoding import TokenizerInfo
from impl.store_format import (
    BLOCK_BYTES,
    COLUMN,
    FORMAT_NAME,
    FORMAT_VERSION,
    QUICK_SIGNATURE_BYTES,
    FileRecord,
    arrow_buffer_layout,
    arrow_type,
    content_fingerprint,
    hash_documents,
    hash_file_blocks,
    quick_signature,
)

__all__ = ["WriteBehind", "file_record", "join_parts", "make_meta", "meta_with_files", "write_parts", "write_token_file"]


# --------------------------------------------------------------------------- token files


def write_token_file(path: str, values: np.ndarray, offsets: np.ndarray) -> None:
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


def join_parts(parts: Sequence[tuple[np.ndarray, np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """One range's ``(values, offsets, num_empty)`` from the :meth:`Encoder.encode` results of its consecutive pieces.

    Why: encoding is per document, so a range encoded in pieces (by several
    workers) and joined here is the range encoded whole, array for array.

    >>> a = (np.array([5, 0], np.uint16), np.array([0, 2]), 0)
    >>> b = (np.array([0, 7, 8, 0], np.uint16), np.array([0, 1, 4]), 1)
    >>> values, offsets, num_empty = join_parts([a, b])
    >>> values.tolist(), offsets.tolist(), num_empty
    ([5, 0, 0, 7, 8, 0], [0, 2, 3, 6], 1)
    """
    if len(parts) == 1:
        return parts[0]
    values = np.concatenate([p[0] for p in parts])
    offsets = np.empty(sum(len(p[1]) - 1 for p in parts) + 1, dtype=np.int64)
    offsets[0] = 0
    at, base = 1, 0
    for _, part_offsets, _ in parts:
        n = len(part_offsets) - 1
        np.add(part_offsets[1:], base, out=offsets[at : at + n])
        at, base = at + n, base + int(part_offsets[-1])
    return values, offsets, sum(p[2] for p in parts)


def write_parts(path: str, parts: Sequence[tuple[np.ndarray, np.ndarray, int]]) -> dict[str, Any]:
    """Write one token file from its range's encoded pieces, in order (:func:`join_parts`); return its record.

    The same file, byte for byte, whatever pieces the range was encoded in.
    """
    values, offsets, num_empty = join_parts(parts)
    write_token_file(path, values, offsets)
    return file_record(path, offsets, num_empty)


class WriteBehind:
    """Writes token files (:func:`write_parts`) in one thread while the caller encodes the next file.

    Why: writing a file, its fsync and hashing it for its record need no
    tokenizer; done in line, the tokenizer would stop for each file. At most
    one file is being written: :meth:`submit` first waits for the previous
    one, so memory holds the tokens of two files, and ``on_written(tag,
    record)`` runs in the caller's thread, in file order, before the next
    file starts writing. A write's error (a full disk) is raised by the
    next :meth:`submit` or by :meth:`finish`. Used by the spawned-worker
    build (:func:`impl.build_pool.run_pool`) and by a build task
    (:mod:`impl.build_tasks`).

    >>> import tempfile
    >>> done = []
    >>> with tempfile.TemporaryDirectory() as d, WriteBehind(lambda tag, rec: done.append((tag, rec["num_tokens"]))) as w:
    ...     w.submit(f"{d}/tokens-00000.arrow", [(np.array([5, 0], np.uint16), np.array([0, 2]), 0)], tag=0)
    ...     records = w.finish()
    >>> done, [r["name"] for r in records]
    ([(0, 2)], ['tokens-00000.arrow'])
    """

    def __init__(self, on_written: Callable[[Any, dict[str, Any]], Any] | None = None) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadspec-write")
        self._on_written = on_written
        self._pending: tuple[Any, concurrent.futures.Future[dict[str, Any]]] | None = None
        self.records: list[dict[str, Any]] = []

    def submit(self, path: str, parts: Sequence[tuple[np.ndarray, np.ndarray, int]], tag: Any = None) -> None:
        """Wait for the previous file, then start writing ``path`` from its range's encoded ``parts``."""
        self._wait()
        self._pending = (tag, self._pool.submit(write_parts, path, parts))

    def finish(self) -> list[dict[str, Any]]:
        """Wait for the last file; the records of every file, in the order submitted."""
        self._wait()
        return self.records

    def _wait(self) -> None:
        if self._pending is not None:
            tag, fut = self._pending
            self._pending = None
            record = fut.result()
            self.records.append(record)
            if self._on_written is not None:
                self._on_written(tag, record)

    def close(self) -> None:
        """Stop the thread (after the file being written, if any; its error, if any, is dropped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- helpers



def _version_of(module: str) -> str | None:
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None)


def file_record(path: str, offsets: np.ndarray, num_empty: int) -> dict[str, Any]:
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


def make_meta(records: list[dict[str, Any]], *, dtype: str, tinfo: TokenizerInfo, options: dict[str, Any],
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



def meta_with_files(template: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``template`` (a :func:`make_meta` result) describing ``records`` instead: counts, files and fingerprint.

    Why: a multi-task build's tasks each know the build's dtype, tokenizer and
    options but only their own files; the committer fills in the rest, with
    the same rule as :func:`make_meta`, so the fingerprint equals a local build's.
    """
    options = template["options"]
    return {
        **template,
        "num_documents": sum(r["num_documents"] for r in records),
        "num_tokens": sum(r["num_tokens"] for r in records),
        "num_empty_documents": sum(r["num_empty_documents"] for r in records),
        "files": records,
        "fingerprint": content_fingerprint([r["sha256"] for r in records], template["dtype"],
                                           template["tokenizer"]["sha256"], options["add_bos"], options["add_eos"]),
        "build_id": uuid.uuid4().hex,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
    }
