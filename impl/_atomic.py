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
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "file_lock",
    "fsync_dir",
    "lock_path_for",
]

PathLike = str | os.PathLike


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


@contextlib.contextmanager
def file_lock(
    lock_path: PathLike,
    *,
    shared: bool = False,
    timeout: float | None = None,
    poll_interval: float = 0.05,
) -> Iterator[str]:
    """Hold an ``fcntl.flock`` on ``lock_path`` (created if missing) for the ``with`` body.

    ``lock_path`` is the lock file itself (use :func:`lock_path_for` to derive
    ``<artefact>.lock``); the artefact is never locked directly, so it can be
    replaced by rename while locked. ``shared=True`` takes a reader lock.
    ``timeout=None`` waits forever; otherwise :class:`TimeoutError` is raised
    after ``timeout`` seconds. Not re-entrant across separate ``open`` calls in
    one process: do not nest two locks on the same file.
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
                        raise TimeoutError(
                            f"could not lock {lock_path!r} within {timeout} s: another process "
                            "holds it; wait for it to finish or remove a lock held by a hung process"
                        ) from None
                    time.sleep(poll_interval)
        try:
            yield lock_path
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
