"""Publishing a built store: the out_dir lock, the marked temp dir, the atomic rename, and what may be replaced.

Why apart from :mod:`impl.build`: this is where a build can destroy data
(replacing an existing directory) or publish half a store (a crash between
files), so the rules of what loadspec may delete and when a store becomes
visible live in one place, independent of how its files were tokenized.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from impl._atomic import atomic_write_bytes, atomic_write_json, exchange_dirs, file_lock, fsync_dir, lock_path_for
from impl.errors import LoadspecError, StoreError, UnsafeOutputError
from impl.store_format import FORMAT_NAME, META_FILE, take_crc_tables

__all__ = ["LOCK_TIMEOUT_S", "PLANS_DIR", "TOKENIZER_FILE", "OpenStore", "OpenedStore", "StoreT",
           "check_output_path", "publish", "source_paths", "with_block_table"]


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


def with_block_table(tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with its records' CRCs moved into the CRC table files (:func:`impl.store_format.take_crc_tables`).

    Written before ``meta.json``, which records each table's size and sha256.
    """
    for spec, table in take_crc_tables(meta):
        atomic_write_bytes(tmp / spec.name, table)
    return meta


_MARKER = ".loadspec-build"
"""File a builder writes into its temporary directory first: only directories carrying it are ever cleaned up."""

TOKENIZER_FILE = ".loadspec-build.tokenizer.json"
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


def source_paths(source: Any) -> list[str | os.PathLike[str]]:
    if isinstance(source, (str, os.PathLike)):
        return [source]
    if isinstance(source, (list, tuple)) and source and all(isinstance(p, os.PathLike) for p in source):
        return list(source)
    return []


def publish(out_dir: str | os.PathLike[str], build_key: str | None, overwrite: bool,
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
            meta = with_block_table(tmp, produce(tmp))
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


