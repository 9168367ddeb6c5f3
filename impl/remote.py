"""Files on object storage (any fsspec URL) read through a node-local cache: :class:`RemoteFiles`.

Why: at scale the training data sits in S3 / GCS / Azure, not on the node.
:class:`RemoteFiles` is a :class:`~impl.files.FileAccess` over a remote
root, so the token store reads it exactly as it reads a local directory:
``map(name)`` downloads the object once per node into ``local`` (see
:mod:`impl.cache` for the sharing, locking and eviction rules) and maps the
cached copy. The option names are MosaicML Streaming's where the meaning is
the same: ``remote``, ``local``, ``cache_limit`` (bytes or ``"10gb"``),
``download_retry`` (retries after the first attempt), ``download_timeout``
(seconds *without progress*), ``validate_hash``; a dataset's ``predownload``
drives :meth:`RemoteFiles.schedule` and :meth:`RemoteFiles.predownload`
(:mod:`impl.predownload`).

What a download promises (:mod:`impl.download`): the bytes land in a partial file of their own;
the object's version (ETag, else size and mtime) is read before and after,
and must equal the version this reader first saw (else
:class:`~impl.errors.RemoteChangedError`: never mixed); the partial must hold
exactly the object's size (and, with ``validate_hash``, its hash); only then
is it renamed into place. Transient failures (HTTP 5xx, resets, a stall, a
truncated body) are retried with backoff ``download_retry`` times, then
:class:`~impl.errors.DownloadError` names the URL, the attempts and the
cause. The token store's CRC tables then check every block or document on
its first read, as they do locally.

Credentials come from the environment or fsspec's configuration (or
``storage_options``); no message, repr or state shows them: URLs are shown
without user info or query string.

Worked example::

    files = RemoteFiles("s3://bucket/store", "/local_disk/cache", cache_limit="50gb")
    store = TokenStore.open("s3://bucket/store", files=files)
    # or, equivalently (also checks cache_limit against the store's files, and sets validate_hash's digests):
    store = TokenStore.open("s3://bucket/store", local="/local_disk/cache", cache_limit="50gb")
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from impl.cache import NodeCache, parse_bytes
from impl.download import (
    BACKOFF_S,
    CHUNK,
    Permanent,
    download_to,
    object_version,
    redact_url,
    scrub,
    with_retries,
)
from impl.errors import CacheLimitError, ConfigError, RemoteError
from impl.files import FileStat

__all__ = ["RemoteConfig", "RemoteFiles", "node_ranks", "redact_url", "scrub"]

_HASHES = ("md5", "sha256")



def node_ranks() -> int:
    """The ranks of this node, which share its cache: ``LOCAL_WORLD_SIZE`` (what torchrun sets), else 1.

    >>> os.environ["LOCAL_WORLD_SIZE"] = "8"; node_ranks()   # doctest: +SKIP
    8
    """
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"LOCAL_WORLD_SIZE={raw!r} must be a positive integer (the ranks of this node), as "
                          "torchrun sets it; unset it for one rank")
    return int(raw)


@dataclass(frozen=True, kw_only=True)
class RemoteConfig:
    """What :class:`RemoteFiles` needs to rebuild itself in another process (what a DataLoader worker receives).

    ``storage_options`` go to ``fsspec.url_to_fs`` (endpoint, profile, ...);
    they never appear in a message or a repr.
    """

    remote: str
    local: str
    cache_limit: int | None = None
    download_retry: int = 2
    download_timeout: float = 60.0
    validate_hash: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)


class RemoteFiles:
    """:class:`~impl.files.FileAccess` over ``remote`` (any fsspec URL), cached in ``local`` (one download per node).

    ``cache_limit``: bytes (int) or a size such as ``"10gb"``; ``None``: no
    limit. ``download_retry``: retries after the first attempt.
    ``download_timeout``: seconds a download (or a wait on another process's
    download) may go without progress. ``validate_hash``: ``None``, ``"md5"``
    (the download must hash to the object's ETag / md5Hash; for a multipart
    S3 upload, whose ETag is no MD5, refused) or ``"sha256"`` (against the
    digests given to :meth:`expect_sha256`, e.g. a store's ``meta.json``
    records). Pickles as its configuration: a DataLoader worker opens its own
    filesystem and shares the node's cache.
    """

    def __init__(self, remote: str, local: str | os.PathLike[str], *, cache_limit: int | str | None = None,
                 download_retry: int = 2, download_timeout: float = 60.0, validate_hash: str | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(remote, str) or not remote:
            raise ConfigError(f"remote must be a URL string such as 's3://bucket/store', got {remote!r}")
        if isinstance(download_retry, bool) or not isinstance(download_retry, int) or download_retry < 0:
            raise ConfigError(f"download_retry must be an int >= 0 (retries after the first try), got {download_retry!r}")
        if isinstance(download_timeout, bool) or not isinstance(download_timeout, (int, float)) or download_timeout <= 0:
            raise ConfigError(f"download_timeout must be a positive number of seconds, got {download_timeout!r}")
        if validate_hash is not None and validate_hash not in _HASHES:
            raise ConfigError(f"validate_hash must be None or one of {', '.join(_HASHES)}, got {validate_hash!r}")
        self._config = RemoteConfig(
            remote=remote.rstrip("/"), local=os.path.abspath(os.fspath(local)),
            cache_limit=parse_bytes(cache_limit), download_retry=download_retry,
            download_timeout=float(download_timeout), validate_hash=validate_hash,
            storage_options=dict(storage_options or {}))
        self._setup()

    def _setup(self) -> None:
        import fsspec  # a core dependency; imported here so `import impl` stays light

        c = self._config
        options = dict(c.storage_options)
        protocol = urlsplit(c.remote).scheme or "file"
        if protocol in ("s3", "s3a") and "config_kwargs" not in options:
            # One retry policy (download_retry) and one stall bound (download_timeout) instead of botocore's own.
            options["config_kwargs"] = {"retries": {"total_max_attempts": 1}, "read_timeout": c.download_timeout,
                                        "connect_timeout": c.download_timeout}
        try:
            self._fs, self._root = fsspec.core.url_to_fs(c.remote, **options)
        except ImportError as exc:
            extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}.get(protocol)
            hint = f"pip install 'loadspec[{extra}]'" if extra else "install the fsspec implementation for it"
            raise RemoteError(f"{redact_url(c.remote)}: no filesystem for {protocol}:// ({exc}); {hint}") from None
        except ValueError as exc:
            raise ConfigError(f"{redact_url(c.remote)}: no filesystem for {protocol}:// ({scrub(str(exc))}); use a "
                              "protocol fsspec knows (s3://, gs://, az://, file://, ...)") from None
        # A wait on another process of the node is bounded by what its download may take without progress.
        wait_s = c.download_timeout * (c.download_retry + 1) + BACKOFF_S * 2 ** c.download_retry + 1.0
        self._cache = NodeCache(c.local, limit=c.cache_limit, wait_s=wait_s)
        self._pins: dict[str, FileStat | None] = {}
        self._sha256: dict[str, str] = {}
        self._schedule: list[str] = []
        self._cursor = 0
        self._after_fork()
        _LIVE.add(self)
        self.downloads = 0   # completed by this object (tests and benchmarks count them)
        self.downloaded_bytes = 0

    def _after_fork(self) -> None:
        """Fresh locks and no background thread: what a forked DataLoader worker's copy starts with.

        Why: a fork copies a lock another thread of the parent held, and
        none of the parent's threads; a worker re-creates both.
        """
        self._lock = threading.Lock()
        self._ahead: list[str] = []
        self._ahead_given: list[str] = []
        self._ahead_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ pickling: the config, never the handles
    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._config, dict(self._sha256)))

    @property
    def keep_mapped(self) -> int | None:
        """How many files a store reading through this access keeps mapped: 2 under a ``cache_limit``, else all.

        A mapped file is held in the node's cache (never evicted), so a
        bounded cache needs readers that let go of the files they are done
        with; two covers a read spanning a file boundary.
        """
        return None if self._config.cache_limit is None else 2

    @property
    def config(self) -> RemoteConfig:
        return self._config

    @property
    def cache(self) -> NodeCache:
        return self._cache

    def __repr__(self) -> str:
        c = self._config
        return (f"RemoteFiles({redact_url(c.remote)!r}, {c.local!r}, cache_limit={c.cache_limit}, "
                f"download_retry={c.download_retry}, download_timeout={c.download_timeout})")

    # ------------------------------------------------------------------ FileAccess
    def where(self, name: str) -> str:
        return f"{redact_url(self._config.remote)}/{name}"

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}" if self._root else name

    def stat(self, name: str) -> FileStat | None:
        """The object's size and version, read once per object and name and pinned from then on."""
        with self._lock:
            if name in self._pins:
                return self._pins[name]
        st = self._with_retries(name, "stat", lambda: self._stat_now(name))
        with self._lock:
            return self._pins.setdefault(name, st)

    def _stat_now(self, name: str) -> FileStat | None:
        path = self._path(name)
        try:
            self._fs.invalidate_cache(path)
            info = self._fs.info(path)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise Permanent(RemoteError(f"{self.where(name)}: permission denied ({scrub(str(exc))}); check the "
                                         "credentials in the environment or storage_options")) from None
        if info.get("type") == "directory":
            return None
        return FileStat(size=int(info["size"]), version=object_version(info))

    def map(self, name: str) -> mmap.mmap | bytes:
        """The cached copy of ``name`` mapped read-only, downloaded first if this node has no current copy.

        The mapping holds a shared lock on the copy for as long as it (or any
        view of it) lives, so no process of the node evicts it meanwhile.
        """
        return self._cache.map_held(self._held(name))

    def open(self, name: str) -> BinaryIO:
        return self._cache.stream_held(self._held(name))

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``name``: from this node's cached copy if current, else one ranged read.

        Why: a plan needs a few KiB of each token file (its document
        offsets); downloading every file whole for them would download the
        store twice on a fresh job. A ranged read is not cached and holds no
        room in the cache; it counts in :attr:`downloaded_bytes`. Its bytes
        are the object's at the time of the read: the caller checks them
        (the store by the CRC-32s of the blocks read, :meth:`impl.store_files.StoreFiles.offsets_of`).
        """
        st = self.stat(name)
        if st is None:
            raise FileNotFoundError(f"{self.where(name)} does not exist")
        if not 0 <= start <= stop <= st.size:
            raise ValueError(f"{self.where(name)}: bytes [{start}, {stop}) are not inside its {st.size} bytes")
        fd = self._cache.open_held(name, st.version, st.size)
        if fd is not None:
            try:
                return os.pread(fd, stop - start, start)
            finally:
                os.close(fd)

        def attempt() -> bytes:
            data = bytes(self._fs.cat_file(self._path(name), start=start, end=stop))
            if len(data) != stop - start:
                raise OSError(f"the ranged read was truncated: {len(data)} of {stop - start} bytes")
            return data

        data: bytes = self._with_retries(name, "ranged read", attempt)
        with self._lock:
            self.downloaded_bytes += len(data)
        return data

    def glob(self, pattern: str) -> list[str]:
        """Names of the objects under the root matching ``pattern`` (fsspec's glob; ``**`` recurses), sorted.

        A listing, not a read: nothing is downloaded, and each hit is stat'ed
        (and pinned) only when a reader asks for it.
        """
        def listing() -> list[str]:
            try:
                hits = self._fs.glob(self._path(pattern), detail=True)
            except FileNotFoundError:
                return []
            except PermissionError as exc:
                raise Permanent(RemoteError(f"{self.where(pattern)}: permission denied ({scrub(str(exc))}); check "
                                             "the credentials in the environment or storage_options")) from None
            root = self._root.rstrip("/")
            return sorted(path[len(root) + 1:] if root else path for path, info in hits.items()
                          if info.get("type") != "directory")

        names: list[str] = self._with_retries(pattern, "list", listing)
        return names

    def check_room(self, token_files: Mapping[str, int], tables: tuple[str, ...] = ("meta.json", "blocks.crc32",
                                                                                     "documents.crc32"),
                   *, readers: int = 1, why: str = "one reader") -> None:
        """Refuse a ``cache_limit`` that cannot hold what the node's ``readers`` map at once, naming the bytes needed.

        A store maps its ``tables`` for its lifetime (one copy for the
        node) and up to :attr:`keep_mapped` token files (``token_files``:
        name -> size) besides, and downloads the next file while it still
        holds those (one more file): three files a reader. ``readers``
        processes of the node share the cache (ranks x DataLoader workers;
        ``why`` says how they were counted), so the node needs the tables
        plus the ``3 x readers`` largest token files (at worst they read
        distinct files). ``TokenStore.open(url, local=...)`` calls this with
        the node's ranks (``LOCAL_WORLD_SIZE``) before any token file is
        downloaded, and ``build_dataloader`` again with its workers.

        >>> files.check_room({"tokens-00000.arrow": 900, "tokens-00001.arrow": 800}, readers=2)  # doctest: +SKIP
        """
        limit = self._config.cache_limit
        if limit is None:
            return
        fixed = sum(st.size for name in tables if (st := self.stat(name)) is not None)
        each = (self.keep_mapped or 1) + 1
        largest = sorted(token_files.values(), reverse=True)[: each * readers]
        needed = fixed + sum(largest)
        if needed > limit:
            raise CacheLimitError(
                f"cache_limit is {limit} bytes but reading {redact_url(self._config.remote)} maps up to {needed} "
                f"bytes at once: {', '.join(tables)} ({fixed} bytes, shared by the node) and {each} token files for "
                f"each of {readers} reader{'s' if readers > 1 else ''} ({why}), the {len(largest)} largest: "
                f"{sum(largest)} bytes; raise cache_limit to at least {needed} bytes (or pass cache_limit=None)"
                + ("" if readers == 1 else ", or use fewer DataLoader workers"))

    def refused(self, name: str) -> str:
        """Drop this node's cached copy of ``name``, which the store's checks refused, and say what to do.

        Why: a copy that arrived corrupted (flipped bytes no transport check
        caught) would otherwise stay cached and be refused by every reader
        of the node until evicted. The store calls this when a CRC check
        refuses the file; the next open of the store downloads it again.

        >>> files.refused("tokens-00003.arrow")   # doctest: +SKIP
        'its cached copy /local/tokens-00003.arrow was dropped: reopen the store to download s3://b/s/tokens-... again; ...'
        """
        st = self._pins.get(name)
        path = self._cache.data_path(name)
        if st is not None and self._cache.drop(name, st.version, st.size):
            done = f"its cached copy {path} was dropped: reopen the store to download {self.where(name)} again"
        else:
            done = f"its cached copy {path} was already replaced or removed: reopen the store to read it again"
        return (f"{done}; if the new copy is refused too, the object {self.where(name)} itself differs from what "
                "was built: restore it from a good copy")

    def schedule(self, names: Sequence[str]) -> None:
        """Say the files this reader will read next, in order: eviction then removes the one needed furthest ahead.

        Why: the read order is a pure function of the state, so a reader
        knows it; evicting the file needed furthest in the future (instead
        of the least recently used) downloads the fewest bytes. Each read
        of a scheduled file moves the schedule past it; a new call replaces
        the schedule.

        >>> files.schedule(["tokens-00003.arrow", "tokens-00004.arrow", "tokens-00003.arrow"])   # doctest: +SKIP
        """
        with self._lock:
            self._schedule = list(names)
            self._cursor = 0
        self._cache.next_use = self._next_use

    def _next_use(self, name: str) -> float:
        with self._lock:
            for i in range(self._cursor, len(self._schedule)):
                if self._schedule[i] == name:
                    return float(i - self._cursor)
        return math.inf

    def _advance(self, name: str) -> None:
        with self._lock:
            if name in self._schedule[self._cursor:]:
                self._cursor = self._schedule.index(name, self._cursor) + 1

    def prefetch(self, names: Sequence[str]) -> threading.Thread:
        """Download ``names`` (those not cached yet) in a background thread of this process; returns the thread.

        What ``predownload`` asks for: the files the next samples need are in
        the node's cache before the reader asks, and the reader's read then
        only maps them. A failure ends the prefetch quietly: the reader's
        own read of that file retries and raises the typed error.
        """
        def run() -> None:
            for name in names:
                try:
                    st = self.stat(name)
                    if st is not None:
                        rec = self._cache.record(name)
                        if rec is None or (rec.version, rec.size) != (st.version, st.size):
                            self._fetch(name, st)
                except Exception:  # noqa: BLE001 - the reader's own read raises it, typed
                    return

        thread = threading.Thread(target=run, name="loadspec-prefetch", daemon=True)
        thread.start()
        return thread

    def predownload(self, names: Sequence[str]) -> None:
        """Download ``names`` ahead of their reads, in order, in this process's one background thread.

        What a dataset's ``predownload`` does for a remote store: it calls
        :meth:`schedule` with the files its next samples read, then this with
        those beyond the current batch. A new call replaces the list the
        thread works on (one naming the same files as the last does
        nothing). A file already cached is skipped; a file is
        downloaded only if the cache has room for it without evicting a
        file this reader needs sooner (:meth:`NodeCache.reserve` with
        ``ahead_of``), else the thread stops until a call names other files; so a
        predownload never costs a read a download it would not have paid.
        A failure ends it quietly: the reader's own read retries and raises
        the typed error.

        >>> files.schedule(["tokens-00003.arrow", "tokens-00004.arrow"])     # doctest: +SKIP
        >>> files.predownload(["tokens-00004.arrow"])                         # doctest: +SKIP
        """
        with self._lock:
            if list(names) == self._ahead_given:
                return   # the same files as the last call (a reader inside one file): nothing new to fetch
            self._ahead_given = list(names)
            self._ahead = list(names)
            if self._ahead and (self._ahead_thread is None or not self._ahead_thread.is_alive()):
                self._ahead_thread = threading.Thread(target=self._run_ahead, name="loadspec-predownload",
                                                      daemon=True)
                self._ahead_thread.start()

    def wait_predownload(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the background predownload to finish; ``True`` when none runs."""
        thread = self._ahead_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _run_ahead(self) -> None:
        while True:
            with self._lock:
                if not self._ahead:
                    return
                name = self._ahead.pop(0)
            try:
                st = self.stat(name)
                if st is None:
                    continue
                rec = self._cache.record(name)
                if rec is not None and (rec.version, rec.size) == (st.version, st.size):
                    continue
                if not self._fetch(name, st, ahead_of=self._next_use(name)):
                    with self._lock:
                        self._ahead = []
                    return
            except Exception:  # noqa: BLE001 - the reader's own read raises it, typed
                with self._lock:
                    self._ahead = []
                return

    def expect_sha256(self, digests: Mapping[str, str]) -> None:
        """Record the sha256 each named file must have (checked when ``validate_hash="sha256"``)."""
        self._sha256.update(digests)

    def _held(self, name: str) -> int:
        st = self.stat(name)
        if st is None:
            raise FileNotFoundError(f"{self.where(name)} does not exist")
        self._advance(name)
        for _ in range(100):
            fd = self._cache.open_held(name, st.version, st.size)
            if fd is not None:
                return fd
            self._fetch(name, st)
        raise RemoteError(f"{self.where(name)}: its cached copy kept disappearing (evicted before it could be read); "
                          "raise cache_limit")

    def _fetch(self, name: str, st: FileStat, *, ahead_of: float | None = None) -> bool:
        """Download ``name`` into the cache unless another process of the node did while this one waited.

        ``ahead_of``: a predownload (:meth:`NodeCache.reserve`); ``False`` when the cache had no room for it.
        """
        cache = self._cache
        with cache.download_lock(name) as lock_fd:
            rec = cache.record(name)
            if rec is not None and rec.version == st.version and rec.size == st.size:
                try:
                    if os.stat(cache.data_path(name)).st_ino == rec.inode:
                        return True
                except FileNotFoundError:
                    pass
            partial = cache.reserve(name, st.size, self.where(name), ahead_of=ahead_of)
            if partial is None:
                return False
            try:
                cache.set_holder(lock_fd, partial)
                self._with_retries(name, "download", lambda: self._download_once(name, st, partial))
                cache.install(name, partial, st.version, st.size)
                with self._lock:
                    self.downloads += 1
                    self.downloaded_bytes += st.size
            finally:
                cache.discard(partial)
        return True

    def _with_retries(self, name: str, what: str, attempt: Any) -> Any:
        return with_retries(self.where(name), what, self._config.download_retry, attempt)

    def _download_once(self, name: str, st: FileStat, partial: str) -> None:
        c = self._config
        download_to(partial, lambda: self._fs.open(self._path(name), "rb", block_size=CHUNK, cache_type="none"), st,
                    lambda: self._stat_now(name), where=self.where(name), timeout=c.download_timeout,
                    validate_hash=c.validate_hash, sha256=self._sha256.get(name))


_LIVE: weakref.WeakSet[RemoteFiles] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for files in list(_LIVE):
        files._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _rebuild(config: RemoteConfig, sha256: dict[str, str]) -> RemoteFiles:
    files = RemoteFiles.__new__(RemoteFiles)
    files._config = config
    files._setup()
    files._sha256 = dict(sha256)
    return files

