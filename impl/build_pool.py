"""The build's worker pool: spawned processes that encode pieces of files, with bounded waits.

Why apart from :mod:`impl.build`: process start, a dead or hung worker and a
killed parent are failure modes of their own; the pool turns each into a
bounded wait and a :class:`StoreError` naming the fix, and workers never
outlive the build (:func:`die_with_parent`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from impl.build_files import WriteBehind
from impl.encoding import Encoder
from impl.errors import StoreError
from impl.store_format import FILE_TEMPLATE

__all__ = ["PIECES_PER_WORKER", "WORKER_TIMEOUT_S", "cpu_count", "die_with_parent", "file_pieces", "piece_docs",
           "run_pool", "spawn_can_start"]


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


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1



def spawn_can_start() -> bool:
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



WORKER_TIMEOUT_S = 3600.0
"""Longest a build waits for one worker's piece (``LOADSPEC_WORKER_TIMEOUT_S`` overrides): no wait is unbounded."""

PIECES_PER_WORKER = 4
"""A file's documents are cut into about this many pieces per worker (at least ``batch_size`` documents each)."""


def piece_docs(*, docs_per_file: int, batch_size: int, workers: int, num_documents: int | None) -> int:
    """Documents per piece that a worker encodes: a file is shared out in pieces of this size.

    Why pieces, not files: with the default ``docs_per_file`` a corpus of a
    few files would keep most workers idle; pieces split every file into
    about :data:`PIECES_PER_WORKER` per worker (the largest file the source
    can fill, when its size is known), each at least one ``batch_size`` (so
    a small build starts few processes) and at most a file. The pieces never
    change the output: the parent joins a file's pieces in order
    (:func:`impl.build_files.write_parts`).

    >>> piece_docs(docs_per_file=65536, batch_size=1000, workers=2, num_documents=10_000)
    1250
    >>> piece_docs(docs_per_file=65536, batch_size=1000, workers=16, num_documents=None)
    1024
    >>> piece_docs(docs_per_file=8, batch_size=1000, workers=2, num_documents=60)
    8
    """
    span = docs_per_file if num_documents is None else max(1, min(docs_per_file, num_documents))
    return min(docs_per_file, max(batch_size, -(-span // (PIECES_PER_WORKER * workers))))


def file_pieces(batches: Iterator[list[str]], docs_per_file: int, piece: int) -> Iterator[tuple[int, list[str]]]:
    """``(file index, documents)``: the stream cut into files of ``docs_per_file`` and each file into ``piece``s.

    >>> list(file_pieces(iter([["a", "b", "c"], ["d", "e"]]), 3, 2))
    [(0, ['a', 'b']), (0, ['c']), (1, ['d', 'e'])]
    """
    f, in_file = 0, 0
    buf: list[str] = []
    for texts in batches:
        pos = 0
        while pos < len(texts):
            take = min(piece - len(buf), docs_per_file - in_file - len(buf), len(texts) - pos)
            buf.extend(texts[pos : pos + take])
            pos += take
            if len(buf) == piece or in_file + len(buf) == docs_per_file:
                yield f, buf
                in_file += len(buf)
                buf = []
                if in_file == docs_per_file:
                    f, in_file = f + 1, 0
    if buf:
        yield f, buf


def _worker_encode(texts: list[str]) -> tuple[int, np.ndarray, np.ndarray, int]:
    assert _WORKER_ENCODER is not None, "worker not initialised"
    return (os.getpid(), *_WORKER_ENCODER.encode(texts))


def _on_piece_encoded(worker_pid: int, file_index: int, documents: int) -> None:
    """Test seam called in the parent for each piece a worker returns, in order (no-op)."""


def run_pool(tmp: Path, pieces: Iterator[tuple[int, list[str]]], workers: int, initargs: tuple[Any, ...],
             bar: Any) -> list[dict[str, Any]]:
    """Encode ``pieces`` in ``workers`` spawned processes and write each file from its pieces, in order.

    Piece ``i`` goes to worker ``i % workers`` (each its own one-process
    pool, so every worker gets its share whatever the start-up order), at
    most two pieces a worker in flight; a writer thread writes and hashes
    file ``f`` while the workers encode file ``f + 1``. Memory: the texts of
    the pieces in flight, the tokens of the file being joined and of the one
    being written. Every wait on a worker is bounded
    (:data:`WORKER_TIMEOUT_S` per piece) and a worker that dies (start-up
    failure, OOM kill) ends the build with a :class:`StoreError` naming the
    likely cause and its fix; on any failure the workers are killed, not
    joined, so a stuck worker cannot hang the parent.
    """
    timeout = float(os.environ.get("LOADSPEC_WORKER_TIMEOUT_S", WORKER_TIMEOUT_S))
    ctx = multiprocessing.get_context("spawn")
    pools = [concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_worker_init,
                                                    initargs=initargs) for _ in range(workers)]
    writer = WriteBehind()
    records: list[dict[str, Any]] = []
    pending: collections.deque[tuple[int, int, concurrent.futures.Future[Any]]] = collections.deque()
    parts: list[tuple[np.ndarray, np.ndarray, int]] = []
    state = {"file": 0}

    def finish_file() -> None:
        writer.submit(str(tmp / FILE_TEMPLATE.format(state["file"])), list(parts))
        parts.clear()

    def collect() -> None:
        f, n, fut = pending.popleft()
        name = FILE_TEMPLATE.format(f)
        try:
            pid, values, offsets, num_empty = fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise StoreError(
                f"a build worker did not finish its {n} documents of {name} within {timeout:.0f} s; the build was "
                "stopped: check the machine's load and memory, or raise LOADSPEC_WORKER_TIMEOUT_S"
            ) from None
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise StoreError(
                f"a build worker process died while encoding documents of {name} ({exc}). If your script calls "
                "TokenStore.build at top level, put that call under `if __name__ == \"__main__\":` "
                "(spawned workers re-import the script; its error is printed above); otherwise the worker "
                "was killed (often out of memory): retry with a smaller num_proc, or num_proc=1"
            ) from exc
        _on_piece_encoded(pid, f, n)
        if f != state["file"]:
            finish_file()
            state["file"] = f
        parts.append((values, offsets, num_empty))
        bar.update(n)

    ok = False
    try:
        for i, (f, texts) in enumerate(pieces):
            pending.append((f, len(texts), pools[i % workers].submit(_worker_encode, texts)))
            while len(pending) > 2 * workers:
                collect()
        while pending:
            collect()
        if parts:
            finish_file()
        records = writer.finish()
        ok = True
    finally:
        writer.close()
        for pool in pools:
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


