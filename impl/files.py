"""Where a reader's bytes come from: the file seam every reader of loadspec goes through.

Why a seam: the token store, the streaming sources and the build all read
files, and the same files may sit on a local disk, on a shared filesystem, or
in object storage behind a node-local cache. A reader asks a :class:`FileAccess`
for a file by its *name* (a ``/``-separated path relative to the access's
root) and gets read-only bytes; whether they were already on disk, fetched and
checked into a cache, or streamed is the access's business, not the reader's.
Integrity stays with the reader (the store's CRC tables, a source's unit
index): an access only promises that what it hands out is the whole object it
named, of the size it reports.

Worked example::

    files = LocalFiles("/data/store")
    files.stat("meta.json")          # FileStat(size=812, version='1732...') or None when missing
    buf = files.map("tokens-00000.arrow")   # mmap (or b"" for an empty file); FileNotFoundError if missing
    files.where("meta.json")         # '/data/store/meta.json' (what an error message shows)

A remote access (``s3://bucket/store`` with a local cache directory)
implements the same four methods; ``where`` never includes credentials.
"""

from __future__ import annotations

import glob as _glob
import mmap
import os
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

__all__ = ["FileAccess", "FileStat", "LocalFiles", "map_read_only"]


@dataclass(frozen=True, kw_only=True)
class FileStat:
    """A file's size and an opaque version token (local: mtime in ns; object storage: the ETag).

    Two stats with equal size and version name the same bytes as far as the
    access can tell; a reader that pinned a version (a checkpoint, a unit
    index) refuses a file whose version moved.
    """

    size: int
    version: str


@runtime_checkable
class FileAccess(Protocol):
    """Read-only access to the files under one root, by relative name."""

    def where(self, name: str) -> str:
        """The file as a message should name it (a path or a URL without credentials)."""
        ...

    def stat(self, name: str) -> FileStat | None:
        """The file's size and version, or ``None`` when it does not exist."""
        ...

    def map(self, name: str) -> mmap.mmap | bytes:
        """The whole file, read-only (``b""`` when empty); ``FileNotFoundError`` when it does not exist."""
        ...

    def open(self, name: str) -> BinaryIO:
        """The file as a binary stream, for sequential readers that need no random access."""
        ...


def map_read_only(path: str) -> mmap.mmap | bytes:
    """``path`` mapped read-only (``b""`` for an empty file, which cannot be mapped).

    Raises ``FileNotFoundError`` when it does not exist and ``OSError`` /
    ``ValueError`` when it cannot be mapped; callers turn these into their
    own typed errors, which name what the file is for.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size == 0:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


class LocalFiles:
    """:class:`FileAccess` over a local (or mounted shared) directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = os.fspath(root)
        self._prefix = os.path.join(self._root, "") if self._root else ""   # opening a store names ~files + 3 paths

    @property
    def root(self) -> str:
        return self._root

    def _path(self, name: str) -> str:
        """``os.path.join(root, name)`` (``name`` when there is no root or ``name`` is absolute)."""
        return self._prefix + name if self._root and not name.startswith(os.sep) else name

    def where(self, name: str) -> str:
        return self._path(name)

    def stat(self, name: str) -> FileStat | None:
        try:
            st = os.stat(self._path(name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileStat(size=st.st_size, version=str(st.st_mtime_ns))

    def map(self, name: str) -> mmap.mmap | bytes:
        return map_read_only(self._path(name))

    def open(self, name: str) -> BinaryIO:
        return open(self._path(name), "rb")

    def glob(self, pattern: str) -> list[str]:
        """Names under the root matching ``pattern`` (``**`` recurses), sorted by name."""
        base = self._path("")
        hits = _glob.glob(self._path(pattern), recursive=True)
        return sorted(os.path.relpath(h, base) if self._root else h for h in hits if os.path.isfile(h))

    def __repr__(self) -> str:
        return f"LocalFiles({self._root!r})"
