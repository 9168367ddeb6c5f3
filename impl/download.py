"""One object downloaded into a partial file: retries with backoff, a no-progress timeout, versions and hashes checked.

Why apart from :mod:`impl.remote`: what a single download promises is a
rule of its own, independent of the cache it lands in. The bytes go to a
partial file; the object's version (ETag, else size and modification time)
is read before and after and must equal the version the reader first saw
(else :class:`~impl.errors.RemoteChangedError`, never retried); the partial
must hold exactly the object's size and, with ``validate_hash``, its hash.
Transient failures (HTTP 5xx, resets, a stall of ``download_timeout``
seconds without a byte, a truncated body) are retried with backoff; what is
left is a :class:`~impl.errors.DownloadError` naming the URL (without
credentials: :func:`redact_url`), the attempts and the cause.

Worked example: with ``download_retry=2`` a body that stalls twice and then
arrives whole is three attempts, sleeping 0.25 s and 0.5 s between them;
one that stalls three times raises ``DownloadError: s3://b/x: download
failed after 3 attempts (download_retry=2); last cause: stalled: ...``.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from impl.errors import ConfigError, DownloadError, RemoteChangedError, RemoteError
from impl.files import FileStat

__all__ = ["BACKOFF_S", "CHUNK", "Permanent", "Stalled", "check_hash", "download_to", "object_version", "redact_url",
           "same_version", "scrub", "with_retries"]

CHUNK = 4 * 1024 * 1024
"""Bytes read from the object per call (and the fsspec block size)."""

BACKOFF_S = 0.25
"""The first retry's sleep; each later one doubles it."""

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@]*@)?([^\s?#'\"]*)(\?[^\s#'\"]*)?(#[^\s'\"]*)?")


def redact_url(url: str) -> str:
    """``url`` without credentials: no user info, no query string or fragment (presigned signatures live there).

    >>> redact_url("s3://KEY:SECRET@bucket/store?X-Amz-Signature=abc")
    's3://bucket/store'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if not parts.scheme:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(text: str) -> str:
    """Every URL in ``text`` redacted (:func:`redact_url`): what error causes from client libraries pass through."""
    return _URL.sub(lambda m: m.group(1) + m.group(3), text)


def object_version(info: Mapping[str, Any]) -> str:
    """A remote object's version token: its ETag / generation / version id, else its size and modification time.

    >>> object_version({"ETag": '"abc"', "size": 3}), object_version({"size": 3, "mtime": 1.5})
    ('ETag:abc', 'size+mtime:3:1.5')
    """
    for key in ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash"):
        value = info.get(key)
        if value:
            return f"{key}:{str(value).strip(chr(34))}"
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is not None:
            return f"size+{key}:{info.get('size')}:{value}"
    return f"size:{info.get('size')}"


class Stalled(OSError):
    """No byte arrived for ``download_timeout`` seconds (retried like a reset)."""


class Permanent(Exception):
    """Wraps an error no retry can fix (missing object, no permission, the object changed)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def with_retries(where: str, what: str, retries: int, attempt: Callable[[], Any]) -> Any:
    """``attempt()``, retried ``retries`` times with backoff on a transient error; typed errors pass through.

    A :class:`Permanent` raises the error it wraps at once; what is left after
    the last attempt is a :class:`DownloadError` naming ``where``, the attempts and the cause.
    """
    tries = retries + 1
    for i in range(1, tries + 1):
        try:
            return attempt()
        except Permanent as exc:
            raise exc.error from None
        except (RemoteError, ConfigError):
            raise
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{where} does not exist ({scrub(str(exc))})") from None
        except Exception as exc:  # noqa: BLE001 - transient: 5xx, resets, stalls, truncation, client errors
            if i == tries:
                kind = "stalled" if isinstance(exc, Stalled) else type(exc).__name__
                raise DownloadError(
                    f"{where}: {what} failed after {tries} attempt{'s' if tries > 1 else ''} "
                    f"(download_retry={retries}); last cause: {kind}: "
                    f"{scrub(str(exc)) or 'no message'}; retry later or raise download_retry") from None
            time.sleep(BACKOFF_S * 2 ** (i - 1))
    raise AssertionError("unreachable")


def download_to(partial: str, open_object: Callable[[], Any], pinned: FileStat, stat_now: Callable[[], FileStat | None],
                *, where: str, timeout: float, validate_hash: str | None, sha256: str | None) -> None:
    """One attempt: copy the object into ``partial`` and check it (see module); raises on any failure.

    ``open_object()`` opens the object for reading; ``stat_now()`` reads its
    current size and version; ``sha256`` is the digest recorded for it
    (``validate_hash="sha256"``), None when none is recorded.
    """
    same_version(where, pinned, stat_now())
    digest = hashlib.new(validate_hash) if validate_hash else None
    progress = [0, time.monotonic()]
    box: list[BaseException | None] = []
    cancelled = threading.Event()

    def copy() -> None:
        try:
            with open(partial, "wb") as out, open_object() as src:
                while not cancelled.is_set():
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    progress[0] += len(chunk)
                    progress[1] = time.monotonic()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which re-raises it
            box.append(exc)

    worker = threading.Thread(target=copy, name=f"loadspec-download-{where}", daemon=True)
    worker.start()
    while True:
        worker.join(0.05)
        if not worker.is_alive():
            break
        if time.monotonic() - progress[1] > timeout:
            cancelled.set()
            raise Stalled(f"no byte for {timeout:g} s after {progress[0]} of {pinned.size} bytes (download_timeout)")
    if box and box[0] is not None:
        raise box[0]
    got = os.stat(partial).st_size
    if got != pinned.size:
        raise OSError(f"the body was truncated: {got} of {pinned.size} bytes")
    same_version(where, pinned, stat_now())
    if digest is not None:
        check_hash(where, validate_hash or "", pinned, digest.hexdigest(), sha256)


def same_version(where: str, pinned: FileStat, now: FileStat | None) -> None:
    """Refuse (never retried) an object removed or rewritten since the reader first saw it."""
    if now is None:
        raise Permanent(RemoteChangedError(f"{where} was removed since this reader first saw it; reopen the store"))
    if now != pinned:
        raise Permanent(RemoteChangedError(
            f"{where} changed since this reader first saw it (version {pinned.version}, "
            f"{pinned.size} bytes; now {now.version}, {now.size} bytes): it is not mixed with what was read; "
            "reopen the store (and rebuild if the rewrite was not meant)"))


def check_hash(where: str, algo: str, pinned: FileStat, got: str, sha256: str | None) -> None:
    """The body's ``algo`` digest ``got`` against the object's (md5: its ETag; sha256: the recorded one, if any)."""
    if algo == "md5":
        want = pinned.version.split(":", 1)[1] if ":" in pinned.version else ""
        if not re.fullmatch(r"[0-9a-f]{32}", want):
            raise Permanent(ConfigError(
                f"{where}: validate_hash='md5' needs the object's ETag to be its MD5, but it is "
                f"{want!r} (a multipart upload?); use validate_hash='sha256' with a store, or None"))
    else:
        want = sha256 or ""
        if not want:
            return   # no recorded digest for this file (meta.json, CRC tables): the store checks those itself
    if got != want:
        raise OSError(f"the body's {algo} is {got}, the object's is {want}")
