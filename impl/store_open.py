"""Opening a token store: its ``meta.json`` read through the file seam, anything that is not a store refused.

Why a module of its own: finding a store is a question about directories,
URLs and partial uploads (a missing directory, a file where a directory
should be, a remote prefix whose upload never finished), each refused with
the fix that applies; reading tokens (:mod:`impl.store`) starts after it.
A URL with a node-local cache directory opens through
:class:`impl.remote.RemoteFiles`, whose checks (each file's sha256, room
for one read in the cache) run before any token file is downloaded.

Worked example::

    store = open_store(TokenStore, "/data/store")            # LocalFiles("/data/store"), meta.json validated
    store = open_store(TokenStore, "s3://b/store", local="/local_disk/cache", cache_limit="20GB")
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impl.errors import REBUILD_HINT, ConfigError, StoreCorruptError, StoreNotFoundError
from impl.files import FileAccess, LocalFiles
from impl.store_format import META_FILE, validate_meta

if TYPE_CHECKING:
    from impl.store import TokenStore

__all__ = ["open_store", "reopen_store"]


def open_store(cls: type[TokenStore], path: str | os.PathLike[str], *, verify: bool = False,
               files: FileAccess | None = None, local: str | os.PathLike[str] | None = None,
               **remote: Any) -> TokenStore:
    """:meth:`TokenStore.open <impl.store.TokenStore.open>`: ``cls`` over the store at ``path`` (see there)."""
    if files is None and (local is not None or remote or "://" in str(path)):
        from impl.remote import RemoteFiles, node_ranks  # a remote store: fsspec and the node-local cache

        if local is None:
            raise ConfigError(f"{path} is a URL: pass a local cache directory, "
                              f"TokenStore.open({str(path)!r}, local='/local_disk/cache')")
        cached = RemoteFiles(str(path), local, **remote)
        store = cls.open(path, files=cached)   # meta.json first; no token file is downloaded yet
        cached.expect_sha256({rec.name: rec.sha256 for rec in store.file_records})
        ranks = node_ranks()
        cached.check_room({rec.name: rec.size for rec in store.file_records}, readers=ranks,
                          why="one reader" if ranks == 1 else f"LOCAL_WORLD_SIZE={ranks} ranks of this node")
        if verify:
            store.verify()
        return store
    root = Path(path)
    name = str(path) if "://" in str(path) else str(root)   # how messages name it: Path() would fold a URL's //
    access: FileAccess = LocalFiles(root) if files is None else files
    try:
        raw = bytes(access.map(META_FILE))   # the directory is looked at only when this fails (a resume opens a store)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        local = Path(access.root) if isinstance(access, LocalFiles) else None
        if local is not None and not local.exists():
            raise StoreNotFoundError(
                f"no token store at {root}: the directory does not exist; build it with "
                f"TokenStore.build(source, tokenizer, {str(root)!r}) (CLI: `loadspec build ...`)"
            ) from None
        if local is not None and not local.is_dir():
            raise StoreNotFoundError(
                f"{root} is a file, not a token store directory; pass the store's directory") from None
        if local is None:   # a remote store: built locally, then copied there
            raise StoreNotFoundError(
                f"{access.where('')} has no {META_FILE}: it is not a token store (or its upload never finished); "
                "build the store locally with TokenStore.build(source, tokenizer, out_dir) and copy every file "
                f"of out_dir there, {META_FILE} last"
            ) from None
        raise StoreNotFoundError(
            f"{root} has no {META_FILE}: it is not a token store (or its build never finished); build it with "
            f"TokenStore.build(source, tokenizer, {str(root)!r}) (CLI: `loadspec build ...`)"
        ) from None
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreCorruptError(f"{access.where(META_FILE)} is not valid JSON ({exc}); {REBUILD_HINT}") from exc
    validate_meta(name, meta)
    store = cls(root, meta, access, name=name)
    if verify:
        store.verify()
    return store


def reopen_store(cls: type[TokenStore], path: str, fingerprint: str, files: FileAccess | None = None) -> TokenStore:
    """A store unpickled in another process: opened again through the same file access, refused if it changed."""
    store = cls.open(path, files=files)
    if store.fingerprint != fingerprint:
        raise StoreCorruptError(
            f"token store {path} changed (fingerprint {store.fingerprint[:16]}..., expected {fingerprint[:16]}...) "
            f"between processes; {REBUILD_HINT}"
        )
    return store
