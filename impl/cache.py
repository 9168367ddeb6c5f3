"""The node-local cache of remote files: one download per file per node, bounded, crash-safe, evicted under held locks.

Why: every rank and DataLoader worker of a node reads the same remote files.
Downloading each in every process multiplies the traffic; letting them share
a directory without rules corrupts it (a reader trusting a half-written file,
an eviction removing a file another process still maps, a crashed download
mistaken for a complete one). :class:`NodeCache` is those rules, all on
``fcntl.flock`` (released by the kernel when its holder dies, so a crash
never leaves a lock behind):

* a cached file is ``<local>/<name>``, beside a *record*
  ``<local>/.loadspec/records/<name, quoted>`` (the remote version and size,
  and the inode it describes); a data file without a matching record is not
  trusted;
* a download holds ``.loadspec/locks/<name>.lock`` exclusively (the file
  names the holder: host, pid, since, its partial file) and writes to its own
  partial ``.loadspec/partial/partial,<host>,<pid>,<token>,<size>,<name>``,
  renamed into place only once checked; a partial is never read, and one whose
  holder is dead (same host, pid gone) is removed;
* a reader holds a *shared* flock on the cached file for as long as its
  mapping lives; eviction (least recently used first, under
  ``.loadspec/evict.lock``) removes only files it can lock *exclusively*, so a
  held file is never evicted;
* every wait is bounded: a download that made no progress for ``wait_s``, or
  room that held files did not free in ``wait_s``, is a typed error naming the
  holder or the bytes.

Worked example (``limit=300``, files of 120 bytes)::

    cache.reserve("a", 120)   # used 0   -> partial reserved (120 of 300)
    cache.reserve("b", 120)   # used 120 -> 240
    cache.reserve("c", 120)   # used 240 -> evicts "a" if no reader holds it, else waits for a release
    cache.reserve("d", 301)   # CacheLimitError: needs 301 bytes, cache_limit is 300
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote, unquote

from impl.errors import CacheLimitError, CacheWaitError

__all__ = ["CachedCopy", "NodeCache", "parse_bytes"]

STATE_DIR = ".loadspec"
PARTIAL_PREFIX = "partial,"
_POLL_S = 0.02

_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_bytes(value: int | str | None, *, what: str = "cache_limit") -> int | None:
    """``None``, a byte count, or a size with a unit as MosaicML writes it (``"10gb"``: 1024-based).

    >>> parse_bytes("1.5kb"), parse_bytes(2048), parse_bytes(None)
    (1536, 2048, None)
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise CacheLimitError(f"{what} must be a byte count or a size such as '10gb', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits):] or "b"
        try:
            n = int(float(digits) * _UNITS[unit])
        except (KeyError, ValueError):
            raise CacheLimitError(
                f"{what} {value!r} is not a size: give bytes (an int) or a number with one of "
                f"{', '.join(sorted(_UNITS))} (e.g. '10gb')") from None
    else:
        raise CacheLimitError(f"{what} must be a byte count or a size such as '10gb', got {type(value).__name__}")
    if n <= 0:
        raise CacheLimitError(f"{what} must be positive, got {value!r} ({n} bytes); pass None for no limit")
    return n


@dataclass(frozen=True, kw_only=True)
class CachedCopy:
    """What the record of a cached file says: the remote version and size it was downloaded at, and its inode."""

    version: str
    size: int
    inode: int


class _HeldMap(mmap.mmap):
    """A read-only mapping of a cached file; the reader's shared flock lives exactly as long as it (on its own fd)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NodeCache:
    """The rules of one cache directory shared by the processes of a node (see the module docstring)."""

    def __init__(self, local: str | os.PathLike[str], *, limit: int | None, wait_s: float) -> None:
        self.local = os.path.abspath(os.fspath(local))
        self.limit = limit
        self.wait_s = wait_s
        self.host = socket.gethostname()
        #: When set, ``next_use(name)`` is how many reads ahead ``name`` is needed (``math.inf``: not foreseen), and
        #: eviction removes the file needed furthest in the future (else the least recently used).
        self.next_use: Callable[[str], float] | None = None
        for sub in ("records", "locks", "partial"):
            os.makedirs(os.path.join(self.local, STATE_DIR, sub), exist_ok=True)
        self.clean_dead_partials()

    # ------------------------------------------------------------------ paths
    def data_path(self, name: str) -> str:
        return os.path.join(self.local, *name.split("/"))

    def _state(self, sub: str, name: str) -> str:
        return os.path.join(self.local, STATE_DIR, sub, quote(name, safe=""))

    # ------------------------------------------------------------------ records
    def record(self, name: str) -> CachedCopy | None:
        try:
            with open(self._state("records", name), encoding="utf-8") as f:
                obj = json.load(f)
            return CachedCopy(version=str(obj["version"]), size=int(obj["size"]), inode=int(obj["inode"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _write_record(self, name: str, copy: CachedCopy) -> None:
        path = self._state("records", name)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": copy.version, "size": copy.size, "inode": copy.inode}, f)
        os.replace(tmp, path)

    # ------------------------------------------------------------------ readers
    def open_held(self, name: str, version: str, size: int) -> int | None:
        """An fd of ``name``'s cached copy at ``version``/``size`` under a shared flock, or ``None`` if not cached.

        The copy is trusted only when its record names this version, size and
        the very inode locked (a copy renamed in after the record was read,
        or evicted while waiting for the lock, is not).
        """
        path = self.data_path(name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            self._flock(fd, fcntl.LOCK_SH, f"a shared lock on {path} (an eviction holds it)")
            st = os.fstat(fd)
            try:
                same = os.stat(path).st_ino == st.st_ino
            except FileNotFoundError:
                same = False
            rec = self.record(name)
            if (same and rec is not None and rec.inode == st.st_ino and rec.version == version
                    and rec.size == size == st.st_size):
                with contextlib.suppress(OSError):
                    os.utime(self._state("records", name))   # recently used: evicted last
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def map_held(self, fd: int) -> mmap.mmap | bytes:
        """The whole file of ``fd`` (held shared) mapped read-only; ``fd`` is closed, the lock lives with the map."""
        try:
            if os.fstat(fd).st_size == 0:
                return b""
            return _HeldMap(fd, 0, access=mmap.ACCESS_READ)   # dups fd: the flock's description stays open with it
        finally:
            os.close(fd)

    @staticmethod
    def stream_held(fd: int) -> BinaryIO:
        """The file of ``fd`` (held shared) as a binary stream; closing it releases the lock."""
        return os.fdopen(fd, "rb")

    # ------------------------------------------------------------------ downloads
    @contextlib.contextmanager
    def download_lock(self, name: str) -> Iterator[int]:
        """Hold ``name``'s download lock; waiting is bounded by ``wait_s`` without progress of the holder's partial."""
        path = self._state("locks", name) + ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            last: tuple[object, ...] = ()
            since = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                holder = self._holder(path)
                progress = (holder.get("pid"), holder.get("partial"), self._size(holder.get("partial")))
                if progress != last:
                    last, since = progress, time.monotonic()
                elif time.monotonic() - since > self.wait_s:
                    raise CacheWaitError(
                        f"{self.data_path(name)}: the download held by host {holder.get('host')!r} pid "
                        f"{holder.get('pid')} (since {holder.get('since')}) made no progress for {self.wait_s:.0f} s; "
                        f"if that process is hung, stop it (its lock is then released) or raise download_timeout")
                time.sleep(_POLL_S)
            self.set_holder(fd, None)
            yield fd
        finally:
            os.close(fd)   # releases the flock

    def set_holder(self, fd: int, partial: str | None) -> None:
        info = {"host": self.host, "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"), "partial": partial}
        data = json.dumps(info).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    @staticmethod
    def _holder(path: str) -> dict[str, object]:
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
            return obj if isinstance(obj, dict) else {}
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _size(path: object) -> int | None:
        if not isinstance(path, str):
            return None
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def reserve(self, name: str, size: int, where: str, *, ahead_of: float | None = None) -> str | None:
        """A new partial file for ``name`` (``size`` bytes reserved), evicting unheld files to make room.

        Raises :class:`CacheLimitError` when ``size`` alone exceeds the limit,
        or when files held by readers of the node did not free enough room
        within ``wait_s``. ``ahead_of`` (a download ahead of its read, needed
        that many reads ahead: ``next_use(name)``) evicts only files needed
        later than that (or not foreseen) and never waits: ``None`` when that
        leaves no room, so a predownload never evicts a file needed sooner.
        """
        if self.limit is not None and size > self.limit:
            raise CacheLimitError(
                f"cache_limit is {self.limit} bytes but {where} is {size} bytes, and a read maps a file whole: "
                f"raise cache_limit to at least {size} bytes (or pass cache_limit=None)")
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._evict_lock():
                if self.limit is None or self._make_room(name, size, ahead_of):
                    partial = os.path.join(
                        self.local, STATE_DIR, "partial",
                        f"{PARTIAL_PREFIX}{quote(self.host, safe='')},{os.getpid()},{secrets.token_hex(6)},{size},"
                        f"{quote(name, safe='')}")
                    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    return partial
                if ahead_of is not None:
                    return None
                used, held = self._usage()
            if time.monotonic() > deadline:
                raise CacheLimitError(
                    f"cache_limit is {self.limit} bytes; {where} needs {size} bytes but {used} are in use, {held} of "
                    f"them held by readers of this node, for {self.wait_s:.0f} s: raise cache_limit to at least "
                    f"{held + size} bytes, or read fewer files at once")
            time.sleep(_POLL_S * 5)

    def install(self, name: str, partial: str, version: str, size: int) -> None:
        """Rename the checked ``partial`` into place as ``name`` at ``version`` (the caller holds the download lock)."""
        path = self.data_path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        inode = os.stat(partial).st_ino
        # Under the eviction lock: between the rename (its reservation gone) and the record (its bytes counted)
        # another process making room would count neither and could fill the cache past its limit.
        with self._evict_lock():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._state("records", name))   # a stale copy is untrusted from here on
            os.replace(partial, path)
            self._write_record(name, CachedCopy(version=version, size=size, inode=inode))

    def drop(self, name: str, version: str, size: int) -> bool:
        """Remove ``name``'s cached copy at ``version``/``size`` (one a reader's checks refused); ``True`` if removed.

        Only the cache's own copy goes: its record must name this version,
        size and the inode in place (never a file the cache did not
        download, nor a newer copy another process installed meanwhile).
        Readers that map it keep their mapping; the next open downloads it
        again. Taken under the download lock, so no install races it.
        """
        with self.download_lock(name):
            rec = self.record(name)
            path = self.data_path(name)
            try:
                inode = os.stat(path).st_ino
            except FileNotFoundError:
                return False
            if rec is None or (rec.version, rec.size, rec.inode) != (version, size, inode):
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._state("records", name))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True

    def discard(self, partial: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)

    # ------------------------------------------------------------------ eviction
    @contextlib.contextmanager
    def _evict_lock(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.local, STATE_DIR, "evict.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._flock(fd, fcntl.LOCK_EX, "the cache's eviction lock")
            yield
        finally:
            os.close(fd)

    def _flock(self, fd: int, op: int, what: str) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CacheWaitError(f"{self.local}: waited {self.wait_s:.0f} s for {what}") from None
                time.sleep(_POLL_S)

    def _cached(self) -> list[tuple[float, str, int]]:
        """``(last use, name, size)`` of every recorded copy, least recently used first."""
        out = []
        records = os.path.join(self.local, STATE_DIR, "records")
        for entry in os.scandir(records):
            if entry.name.endswith(".tmp"):
                continue
            name = unquote(entry.name)
            rec = self.record(name)
            if rec is None:
                continue
            try:
                out.append((entry.stat().st_mtime, name, os.stat(self.data_path(name)).st_size))
            except FileNotFoundError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        return sorted(out)

    def _reserved(self) -> int:
        total = 0
        for entry in os.scandir(os.path.join(self.local, STATE_DIR, "partial")):
            parts = entry.name.split(",")
            if entry.name.startswith(PARTIAL_PREFIX) and len(parts) == 6 and parts[4].isdigit():
                total += int(parts[4])
        return total

    def _usage(self) -> tuple[int, int]:
        """(bytes in use: copies and reservations, bytes of copies a reader holds)."""
        used = self._reserved()
        held = 0
        for _, name, size in self._cached():
            used += size
            if not self._lockable(name):
                held += size
        return used, held

    def _lockable(self, name: str) -> bool:
        try:
            fd = os.open(self.data_path(name), os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def _make_room(self, name: str, size: int, ahead_of: float | None = None) -> bool:
        """Evict unheld copies, least recently used first, until ``size`` more bytes fit (under the evict lock).

        With ``ahead_of``, only copies whose ``next_use`` is later than it (see :meth:`reserve`).
        """
        assert self.limit is not None
        self.clean_dead_partials()
        cached = self._cached()
        used = self._reserved() + sum(s for _, _, s in cached)
        key = self.next_use
        if key is not None:   # the reader said its future order: the file needed furthest ahead goes first
            cached = sorted(cached, key=lambda c: -key(c[1]))
        for _, other, osize in cached:
            if used + size <= self.limit:
                break
            if ahead_of is not None and (key is None or not key(other) > ahead_of):
                continue   # a download ahead of its read never evicts a file needed sooner
            if other != name and self._evict(other):
                used -= osize
        return used + size <= self.limit

    def _evict(self, name: str) -> bool:
        path = self.data_path(name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False   # a reader of the node holds it
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._state("records", name))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        finally:
            os.close(fd)

    def clean_dead_partials(self) -> list[str]:
        """Remove the partial files whose holder (this host, its pid) is dead; returns their paths."""
        removed = []
        for entry in os.scandir(os.path.join(self.local, STATE_DIR, "partial")):
            parts = entry.name.split(",")
            if not entry.name.startswith(PARTIAL_PREFIX) or len(parts) != 6:
                continue
            if unquote(parts[1]) == self.host and parts[2].isdigit() and not _pid_alive(int(parts[2])):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                removed.append(entry.path)
        return removed
