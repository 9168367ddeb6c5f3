"""Crash-safe file writes and inter-process locks.

Why: stores, epoch-plan caches and checkpoints are read by other processes
(other ranks, a restarted job). A reader must see either the old file or the
complete new one, never a torn write, and two processes preparing the same
artefact must not both write it. The tools:

* :func:`atomic_write_bytes` / :func:`atomic_write_json` write to a temporary
  file in the *same directory* (so the final ``os.replace`` is a same-filesystem
  rename, which POSIX makes atomic), fsync it, rename it over the target and
  fsync the directory so the rename itself survives a power cut.
* :func:`file_lock` holds an ``fcntl.flock`` on a sidecar lock file. flock
  locks belong to the open file description, are released by the kernel when
  the holder dies, and so cannot be left stale by a crash (the lock *file*
  stays, which is harmless).

Example::

    with file_lock(lock_path_for(cache_path)):
        if not os.path.exists(cache_path):
            atomic_write_json(cache_path, plan)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "exchange_dirs",
    "file_lock",
    "fsync_dir",
    "lock_path_for",
]

PathLike = str | os.PathLike[str]


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so entries created or renamed in it are durable.

    Some filesystems refuse to fsync a directory; that only weakens durability
    after a power cut (not atomicity), so such refusals are ignored.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old content or all of the new.

    The temporary file lives beside ``path`` (named ``.<name>.<random>.tmp``) and
    is removed if anything fails before the rename.
    """
    target = Path(path)
    directory = target.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write_json(path: PathLike, obj: object, *, indent: int | None = 2) -> None:
    """Atomically write ``obj`` as UTF-8 JSON (sorted keys, no NaN: readers in any language agree)."""
    text = json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False, ensure_ascii=False)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def lock_path_for(path: PathLike) -> str:
    """The sidecar lock file conventionally used for ``path``: ``<path>.lock``."""
    return os.fspath(path).rstrip(os.sep) + ".lock"


DEFAULT_LOCK_TIMEOUT_S = float(os.environ.get("LOADSPEC_LOCK_TIMEOUT_S", "3600"))
"""How long :func:`file_lock` waits by default (``LOADSPEC_LOCK_TIMEOUT_S`` overrides): no wait is unbounded."""


def _holder_of(fd: int) -> str:
    """What the current holder wrote into the lock file (pid, host, since), for the timeout message."""
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        return "an unknown process (the lock file names no holder)"
    return f"pid {info.get('pid')} on host {info.get('host')!r} (since {info.get('since')})"


def _record_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with contextlib.suppress(OSError):
        data = json.dumps(info).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


@contextlib.contextmanager
def file_lock(
    lock_path: PathLike,
    *,
    shared: bool = False,
    timeout: float | None = DEFAULT_LOCK_TIMEOUT_S,
    poll_interval: float = 0.05,
) -> Iterator[str]:
    """Hold an ``fcntl.flock`` on ``lock_path`` (created if missing) for the ``with`` body.

    ``lock_path`` is the lock file itself (use :func:`lock_path_for` to derive
    ``<artefact>.lock``); the artefact is never locked directly, so it can be
    replaced by rename while locked. ``shared=True`` takes a reader lock.
    An exclusive holder writes ``{"pid", "host", "since"}`` into the lock file,
    so a waiter that gives up after ``timeout`` seconds raises
    :class:`~impl.errors.LockTimeoutError` (also a ``TimeoutError``) naming
    who holds it. ``timeout=None`` waits forever (only for callers with their
    own bound). Not re-entrant across separate ``open`` calls in one process:
    do not nest two locks on the same file.
    """
    lock_path = os.fspath(lock_path)
    parent = os.path.dirname(lock_path) or "."
    os.makedirs(parent, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if timeout is None:
            fcntl.flock(fd, op)  # blocks; EINTR is retried by Python (PEP 475)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        from impl.errors import LockTimeoutError

                        raise LockTimeoutError(
                            f"could not lock {lock_path!r} within {timeout} s: it is held by {_holder_of(fd)}; "
                            "wait for that process to finish (or stop it if it hangs) and retry, or raise the "
                            "timeout with LOADSPEC_LOCK_TIMEOUT_S"
                        ) from None
                    time.sleep(poll_interval)
        if not shared:
            _record_holder(fd)
        try:
            yield lock_path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2


def exchange_dirs(a: PathLike, b: PathLike) -> bool:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported.

    Why: replacing a store directory with two renames leaves a moment with no
    store at the path; an exchange never does (readers see the old or the new).
    """
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(os.fspath(a)), at_fdcwd, os.fsencode(os.fspath(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a))
