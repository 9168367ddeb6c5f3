"""Typed errors of the production loaders: the shared hierarchy plus store errors.

Why: a token store on disk can be missing, half-written, edited, truncated or
written by a newer loadspec. Each of those must stop training with a message
that says what is wrong *and* what to do, never turn into silently wrong
batches. The types let callers (and the conformance kit) tell them apart::

    try:
        store = TokenStore.open(path)
    except StoreNotFoundError:      # also a FileNotFoundError
        store = TokenStore.build(source, tokenizer, path)

Everything here derives from :class:`reference.errors.LoadspecError`, so
``except LoadspecError`` still catches every deliberate refusal.
"""

from __future__ import annotations

import numpy as np

from reference.errors import (
    ConfigError,
    EmptyDataError,
    LoadspecError,
    MapError,
    SplitError,
    StateError,
    TopologyError,
    is_int,
    require,
)

__all__ = [
    "REBUILD_HINT",
    "BuildCommitError",
    "BuildTaskError",
    "CacheLimitError",
    "CacheWaitError",
    "ConfigError",
    "DatasetsVersionError",
    "DownloadError",
    "EmptyDataError",
    "EvalBroadcastError",
    "EvalBuildError",
    "FixturesNotFoundError",
    "LoadspecError",
    "LockTimeoutError",
    "MapError",
    "RemoteChangedError",
    "RemoteError",
    "SharedEpochError",
    "SourceError",
    "SplitError",
    "StateError",
    "StoreCorruptError",
    "StoreError",
    "StoreNotFoundError",
    "StoreVersionError",
    "TokenizerError",
    "TopologyError",
    "UnguardedMainError",
    "UnsafeOutputError",
    "is_int",
    "is_integer",
    "require",
]

def is_integer(value: object) -> bool:
    """``is_int`` that also accepts numpy integer scalars (values read from arrays), never booleans."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


#: The fix every store error points to; kept in one place so messages agree.
REBUILD_HINT = (
    "rebuild it with `TokenStore.build(source, tokenizer, out_dir, overwrite=True)` "
    "(CLI: `loadspec build ...`)"
)


class StoreError(LoadspecError):
    """A token store cannot be built, opened or used as asked (names the store and the fix)."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No token store at the given path (no directory, or no ``meta.json`` in it).

    Also a :class:`FileNotFoundError` so generic "does it exist yet?" code works.
    """


class StoreCorruptError(StoreError):
    """A store file is missing, truncated or changed since the store was built."""


class StoreVersionError(StoreError):
    """The store's format version is unknown to this loadspec (for example, a newer one)."""


class TokenizerError(ConfigError):
    """The tokenizer cannot do what the build options ask (e.g. no EOS token with add_eos=True)."""


class SourceError(ConfigError):
    """A build source cannot be read as documents (missing path, unknown file kind, bad text field)."""


class DatasetsVersionError(SourceError):
    """The installed ``datasets`` lacks an internal attribute loadspec reads to find an HF object's files (STREAM-19)."""


class EvalBuildError(LoadspecError):
    """The source rank failed to build an eval set with an error loadspec does not type (EVAL-3; names it)."""


class EvalBroadcastError(LoadspecError):
    """The ranks of an eval broadcast disagree on src or the set, or one did not arrive in time (EVAL-4, EVAL-5).

    Raised with one message on every rank that reached the call; the message
    names the values and ranks involved and the fix.
    """


class LockTimeoutError(StoreError, TimeoutError):
    """A lock was not free within its timeout; the message names the holder (pid, host, since) and the fix.

    Also a :class:`TimeoutError`, so code that waited with a timeout before keeps catching it.
    """


class UnsafeOutputError(StoreError):
    """The output path would destroy or mix with something loadspec did not create (a user directory, the source)."""


class BuildCommitError(StoreError):
    """A multi-task build cannot be committed: a fragment is missing, corrupt or from another source, or another
    committer already published the store; the message names the task or file and the fix."""


class BuildTaskError(StoreError):
    """A task of a multi-task build failed writing its files (full disk, read-only output); names the path."""


class UnguardedMainError(ConfigError):
    """A build was started while a spawned child re-imported ``__main__``: the script lacks its ``__main__`` guard."""


class SharedEpochError(LoadspecError, RuntimeError):
    """``set_epoch`` cannot reach forked workers: the epoch's shared-memory cell could not be allocated before a fork."""


class FixturesNotFoundError(LoadspecError, FileNotFoundError):
    """The demos' data (the checkout's ``fixtures/``) is not beside this loadspec: it was installed from a wheel."""


class RemoteError(LoadspecError):
    """Files on remote storage (``s3://``, ``gs://``, ... through fsspec) cannot be read as asked.

    Messages name the object by its URL without credentials (no user info, no
    query string) and say what to do; the subclasses say which part failed.
    """


class DownloadError(RemoteError):
    """A download failed after its retries (``download_retry``): names the URL, the attempts and the last cause.

    Transient causes (HTTP 5xx, resets, a body stalled past ``download_timeout``,
    a truncated or mis-hashed body) are retried first; a download that never
    completed leaves nothing in the cache that is later trusted.
    """


class RemoteChangedError(RemoteError):
    """A remote object's version (ETag, else size and mtime) moved since this reader first saw it: never mixed."""


class CacheLimitError(RemoteError, ConfigError):
    """``cache_limit`` cannot hold what a read needs (names the bytes needed), or held files did not free room in time."""


class CacheWaitError(RemoteError, TimeoutError):
    """Waiting on another process of the node (a download, an eviction) made no progress in time; names the holder."""
