"""The build's worker pool: spawned processes that each tokenize whole files, with bounded waits.

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

from impl.build_files import write_encoded
from impl.encoding import Encoder
from impl.errors import StoreError
from impl.store_format import FILE_TEMPLATE

__all__ = ["WORKER_TIMEOUT_S", "cpu_count", "die_with_parent", "run_pool", "spawn_can_start"]


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
    return write_encoded(_WORKER_ENCODER, path, texts)


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
"""Longest a build waits for one worker's file (``LOADSPEC_WORKER_TIMEOUT_S`` overrides): no wait is unbounded."""


def run_pool(tmp: Path, ranges: Iterator[list[str]], workers: int, initargs: tuple[Any, ...],
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


