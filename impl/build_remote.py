"""A multi-task build whose output is object storage (``s3://``, ``memory://``, any fsspec URL): tasks and commit.

Why apart from :mod:`impl.build_tasks`: an object store has no rename and no
lock, so the local protocol (stage, rename into place under a file lock)
does not carry over; what does is the rule that ``meta.json`` is written
last and its existence is the commit point.

Layout: a task encodes each of its files into a local temp directory,
uploads it under its final, deterministic name ``<out>/tokens-NNNNN.arrow``
(so the commit copies no token byte), deletes the local copy, and uploads
its fragment ``<out>/.loadspec-staging/task-IIIII-of-NNNNN.json`` last: a
fragment exists only once its files are complete. Until the commit there is
no ``meta.json``, so ``TokenStore.open(url, local=...)`` refuses the
half-built store (:class:`~impl.errors.StoreNotFoundError`).

The commit reads every fragment, streams every token file once (bounded
memory: one chunk at a time) and checks its size, sha256 and block CRCs
against its record, refusing a missing or changed one by name; writes the
CRC tables; then creates ``meta.json`` with a conditional create
(``If-None-Match: *`` on S3): of two concurrent committers exactly one
creates it, and the other is told the store is committed. A filesystem
that does not refuse a second conditional create is found by a probe
before anything is published, and refused (:class:`BuildCommitError`
naming the limitation) rather than risking two winners.

Worked example (7 documents, ``docs_per_file=2``, 2 tasks, out
``s3://b/store``): task 0 uploads ``tokens-00000.arrow`` and
``tokens-00002.arrow`` then ``.loadspec-staging/task-00000-of-00002.json``;
task 1 the files 1 and 3 then its fragment; the commit checks the four
files, writes ``blocks.crc32`` and ``documents.crc32``, creates
``meta.json`` and removes ``.loadspec-staging``. The four token files, the
two tables and the fingerprint equal a local build's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from impl._crc import crc32
from impl.build_files import meta_with_files, write_parts
from impl.build_fragments import (
    FRAGMENT_FORMAT,
    FRAGMENT_VERSION,
    STAGING_DIR,
    TaskResult,
    check_build_keys,
    check_coverage,
    fragment_document,
    fragment_name,
    fragments_task_count,
    owned_files,
    parse_fragment_name,
    progress_name,
    sum_reports,
    task_encoder,
)
from impl.build_progress import progress_bar
from impl.errors import BuildCommitError, BuildTaskError, ConfigError, LoadspecError, RemoteError
from impl.remote import redact_url, scrub
from impl.store_format import FILE_TEMPLATE, META_FILE, take_crc_tables

if TYPE_CHECKING:
    from impl.build import PreparedBuild

__all__ = ["RemoteCommit", "commit_remote", "local_out", "read_reports", "remote_url", "run_remote_task"]

_LOCAL_SCHEMES = ("file", "local")
_CHUNK = 4 * 1024 * 1024
_REPORT_EVERY_S = 10.0
_FOLDED_URL = re.compile(r"^[a-z][a-z0-9+.-]*:/[^/]")
_T = TypeVar("_T")


def remote_url(out: str | os.PathLike[str]) -> str | None:
    """``out`` when it is an fsspec URL of a store this module writes (not ``file://``), else None.

    >>> remote_url("s3://bucket/store"), remote_url("file:///data/store"), remote_url("/data/store")
    ('s3://bucket/store', None, None)
    """
    text = os.fspath(out)
    if not isinstance(text, str):
        return None
    if not isinstance(out, str) and _FOLDED_URL.match(text):
        raise ConfigError(f"out_dir {text!r} looks like a URL that pathlib folded ('s3://' became 's3:/'): pass the "
                          "URL as a str, e.g. build_task(..., 's3://bucket/store')")
    if "://" not in text:
        return None
    return None if urlsplit(text).scheme in _LOCAL_SCHEMES else text.rstrip("/")


def local_out(out: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A ``file://`` URL as its path (the local protocol, with its lock and renames, serves it); else ``out``.

    >>> local_out("file:///data/store"), local_out("/data/store")
    ('/data/store', '/data/store')
    """
    text = os.fspath(out)
    if isinstance(text, str) and "://" in text and urlsplit(text).scheme in _LOCAL_SCHEMES:
        return urlsplit(text).path
    return out


@dataclass(frozen=True, kw_only=True)
class RemoteCommit:
    """A store committed to object storage: where (``path``, without credentials) and what its ``meta.json`` says.

    Open it for reading with ``TokenStore.open(url, local=cache_dir, storage_options=...)``.
    """

    path: str
    meta: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return str(self.meta["fingerprint"])

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def dtype(self) -> str:
        return str(self.meta["dtype"])

    def __len__(self) -> int:
        return int(self.meta["num_documents"])


class _Out:
    """The output URL's filesystem and root, with reads that never trust a cached listing (other machines write)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None) -> None:
        import fsspec  # a core dependency; imported here so `import impl` stays light

        self.url = redact_url(url)
        protocol = urlsplit(url).scheme
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:
            extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}.get(protocol)
            hint = f"pip install 'loadspec[{extra}]'" if extra else "install the fsspec implementation for it"
            raise RemoteError(f"{self.url}: no filesystem for {protocol}:// ({scrub(str(exc))}); {hint}") from None
        except ValueError as exc:
            raise ConfigError(f"{self.url}: no filesystem for {protocol}:// ({scrub(str(exc))}); use a protocol "
                              "fsspec knows (s3://, gs://, az://, memory://, ...)") from None
        self.root = self.root.rstrip("/")
        self.protocol = protocol

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def size(self, name: str) -> int | None:
        """The object's size, None when it does not exist."""
        path = self.path(name)
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def read(self, name: str) -> bytes | None:
        path = self.path(name)
        self.fs.invalidate_cache(path)
        try:
            data: bytes = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data

    def names(self, folder: str) -> list[str]:
        """The names of the objects directly in ``folder`` (empty when there is none)."""
        path = self.path(folder)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def hash(self, name: str, block_bytes: int) -> tuple[int, str, str]:
        """``(size, sha256, block CRCs as hex)`` of the object, read once in chunks (one chunk in memory at a time).

        The same digests as :func:`impl.store_format.hash_file_blocks` gives for a local copy.
        """
        h = hashlib.sha256()
        crcs = bytearray()
        chunk = max(block_bytes, _CHUNK // block_bytes * block_bytes)
        size = 0
        with self.fs.open(self.path(name), "rb", block_size=chunk, cache_type="none") as f:
            while True:
                data = f.read(chunk)
                while data and len(data) < chunk:
                    more = f.read(chunk - len(data))
                    if not more:
                        break
                    data += more
                if not data:
                    break
                size += len(data)
                h.update(data)
                view = memoryview(data)
                for at in range(0, len(data), block_bytes):
                    crcs += crc32(view[at:at + block_bytes]).to_bytes(4, "big")
        return size, h.hexdigest(), crcs.hex()


def _calling(what: str, error: type[LoadspecError], hint: str, call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)``, with a failure of the filesystem as ``error`` naming ``what`` (URLs without credentials)."""
    try:
        return call(*args)
    except LoadspecError:
        raise
    except Exception as exc:  # noqa: BLE001 - s3fs/botocore/gcsfs errors: OSError and others, all reported typed
        raise error(f"{what} failed: {type(exc).__name__}: {scrub(str(exc)) or 'no message'}; {hint}") from None


def run_remote_task(plan: PreparedBuild, url: str, index: int, count: int, *,
                    storage_options: Mapping[str, Any] | None, progress: bool, commit_when_done: bool) -> TaskResult:
    """Task ``index`` of ``count`` of a build into ``url``: upload its token files, then its fragment (see module)."""

    out = _Out(url, storage_options)
    fragment = f"{STAGING_DIR}/{fragment_name(index, count)}"
    relaunch = f"relaunch task {index} of {count}"
    if _calling(f"reading {out.where(META_FILE)}", BuildTaskError, relaunch, lambda: out.size(META_FILE)) is not None:
        raise BuildCommitError(f"{out.url} is already a committed store: open it with TokenStore.open(url, local=...), "
                               "or build into another URL")
    with contextlib.suppress(BuildCommitError):
        done = _validated(out, fragment, plan.build_key)
        return TaskResult(task=index, tasks=count, skipped=True, files=tuple(f for f, _ in done),
                          committed=commit_when_done and _commit_if_last(out, count, storage_options, url))
    enc = task_encoder(plan)
    files: list[dict[str, Any]] = []
    bar = progress_bar(progress, None)
    started, tokens, shown = time.time(), 0, 0.0
    hint = f"its fragment was not written, other tasks' fragments are untouched: fix the cause and {relaunch}"
    try:
        # A fragment that does not validate is removed first: until the new one is uploaded, this task has none.
        _calling(f"task {index} of {count} removing its stale fragment {out.where(fragment)}", BuildTaskError, hint,
                 lambda: out.fs.rm(out.path(fragment)) if out.size(fragment) is not None else None)
        with tempfile.TemporaryDirectory(prefix="loadspec-task-") as tmp:
            seen, owned = owned_files(plan, index, count)
            # The tokenizer encodes the next batch while this thread writes and uploads a finished file.
            for f, values, offsets, num_empty in enc.encode_ranges(owned):
                name = FILE_TEMPLATE.format(f)
                local = os.path.join(tmp, name)
                try:
                    record = write_parts(local, [(values, offsets, num_empty)])
                except OSError as exc:
                    raise BuildTaskError(f"task {index} of {count} failed writing its local copy {local!r}: "
                                         f"{exc.strerror or exc} (errno {exc.errno}); {hint}") from exc
                _upload(out, local, name, record["size"], f"task {index} of {count}", hint)
                os.unlink(local)
                files.append({"index": f, "record": record})
                tokens += record["num_tokens"]
                report = json.dumps({"tokens": tokens, "files": len(files), "started": started, "now": time.time()})
                with contextlib.suppress(Exception):   # a report is advisory: a failed one never fails the task
                    out.fs.pipe_file(out.path(f"{STAGING_DIR}/{progress_name(index, count)}"), report.encode())
                bar.update(record["num_documents"])
                if progress and hasattr(bar, "set_postfix_str") and time.monotonic() - shown >= _REPORT_EVERY_S:
                    shown = time.monotonic()   # reading every task's report is one GET per task: not every file
                    total, rate = sum_reports(read_reports(url, count, storage_options))
                    bar.set_postfix_str(f"all tasks: {total} tokens, {rate / 1e6:.2f}M tokens/s", refresh=False)
        body = json.dumps(fragment_document(plan, index, count, seen[0], files), sort_keys=True, allow_nan=False,
                          ensure_ascii=False).encode("utf-8")
        _calling(f"task {index} of {count} uploading its fragment {out.where(fragment)}", BuildTaskError, hint,
                 lambda: out.fs.pipe_file(out.path(fragment), body))
    finally:
        bar.close()
    return TaskResult(task=index, tasks=count, skipped=False, files=tuple(f["index"] for f in files),
                      committed=commit_when_done and _commit_if_last(out, count, storage_options, url))


def read_reports(url: str, tasks: int, storage_options: Mapping[str, Any] | None) -> list[bytes]:
    """The progress reports of ``tasks`` tasks under ``url`` (one GET each; a missing or unreadable one is left out)."""

    out = _Out(url, storage_options)
    reports = []
    for i in range(tasks):
        with contextlib.suppress(Exception):
            raw = out.read(f"{STAGING_DIR}/{progress_name(i, tasks)}")
            if raw is not None:
                reports.append(raw)
    return reports


def _upload(out: _Out, local: str, name: str, size: int, who: str, hint: str) -> None:
    """Upload ``local`` as ``name`` (its final name; a rerun's upload replaces a partial one) and check its size."""
    def put() -> None:
        out.fs.put_file(local, out.path(name))
        got = out.size(name)
        if got != size:
            raise OSError(f"the uploaded object holds {got} bytes, the file {size}")

    _calling(f"{who} uploading {out.where(name)}", BuildTaskError, hint, put)


def _commit_if_last(out: _Out, count: int, storage_options: Mapping[str, Any] | None, url: str) -> bool:
    """Commit when every fragment of ``count`` tasks is present; False when some are missing or another committed."""

    present = set(out.names(STAGING_DIR))
    if not all(fragment_name(i, count) in present for i in range(count)):
        return False
    try:
        commit_remote(url, tasks=count, storage_options=storage_options)
    except BuildCommitError:
        if out.size(META_FILE) is not None:
            return False
        raise
    return True


def _read_fragment(out: _Out, name: str) -> dict[str, Any]:

    raw = _calling(f"reading the fragment {out.where(name)}", BuildCommitError, "retry, or relaunch its task",
                   lambda: out.read(name))
    if raw is None:
        raise BuildCommitError(f"fragment {out.where(name)} does not exist: run (or relaunch) its task")
    try:
        frag = json.loads(raw)
    except ValueError as exc:
        raise BuildCommitError(f"fragment {out.where(name)} cannot be read ({exc}): relaunch its task") from None
    if not isinstance(frag, dict) or frag.get("format") != FRAGMENT_FORMAT or frag.get("version") != FRAGMENT_VERSION:
        raise BuildCommitError(f"{out.where(name)} is not a loadspec build fragment (version {FRAGMENT_VERSION}): "
                               "relaunch its task")
    return frag


def _validated(out: _Out, fragment: str, build_key: str | None) -> list[tuple[int, dict[str, Any]]]:
    """The fragment's ``(file index, record)`` pairs once every token file's size, sha256 and CRCs check."""
    frag = _read_fragment(out, fragment)
    if build_key is not None and frag.get("build_key") != build_key:
        raise BuildCommitError(f"fragment {out.where(fragment)} was built from another source, tokenizer or options")
    block = int(frag["template"]["layout"]["block_bytes"])
    task = f"task {frag['task']} of {frag['tasks']}"
    pairs = []
    for entry in frag["files"]:
        rec = entry["record"]
        name = rec["name"]
        where = out.where(name)
        size = _calling(f"reading {where}", BuildCommitError, f"retry, or relaunch {task}", out.size, name)
        if size is None:
            raise BuildCommitError(f"fragment {fragment.rsplit('/', 1)[-1]}: token file {where} is missing: "
                                   f"relaunch {task}")
        got = (size, None, None) if size != rec["size"] else _calling(
            f"reading {where}", BuildCommitError, f"retry, or relaunch {task}", out.hash, name, block)
        if got != (rec["size"], rec["sha256"], rec["block_crc32"]):
            raise BuildCommitError(
                f"fragment {fragment.rsplit('/', 1)[-1]}: token file {where} does not match its record (size "
                f"{size}, expected {rec['size']}, or its sha256 or CRCs differ): it changed after {task} uploaded "
                f"it; relaunch that task (it replaces the file)")
        pairs.append((int(entry["index"]), rec))
    return pairs


def _before_meta() -> None:
    """Test seam: called after the CRC tables are written, just before ``meta.json`` is created (no-op)."""


def _already(out: _Out) -> BuildCommitError:
    return BuildCommitError(f"{out.url} was already committed by another committer: open it with "
                            "TokenStore.open(url, local=...) (nothing to do)")


def commit_remote(url: str, *, tasks: int | None = None,
                  storage_options: Mapping[str, Any] | None = None) -> RemoteCommit:
    """Validate every fragment under ``url`` and publish the store: CRC tables, then ``meta.json`` (conditional).

    Refused (:class:`BuildCommitError`, naming the task or object and
    touching nothing a reader sees): a missing fragment or token file, a
    token file whose size, sha256 or CRCs differ from its record, fragments
    of different builds, a filesystem with no conditional create; and, for
    the second of two committers, a store already committed.
    """

    out = _Out(url, storage_options)
    retry = "retry the commit"
    if _calling(f"reading {out.where(META_FILE)}", BuildCommitError, retry, lambda: out.size(META_FILE)) is not None:
        raise _already(out)
    try:
        found = {key: name for name in _calling(f"listing {out.where(STAGING_DIR)}", BuildCommitError, retry,
                                                lambda: out.names(STAGING_DIR))
                 if (key := parse_fragment_name(name)) is not None}
        staging = out.where(STAGING_DIR)
        count = fragments_task_count(staging, found, tasks, out.url)
        names = [f"{STAGING_DIR}/{fragment_name(i, count)}" for i in range(count)]
        frags = [_read_fragment(out, name) for name in names]
        check_build_keys(frags)
        records: dict[int, dict[str, Any]] = {}
        for name in names:
            records.update(_validated(out, name, None))
        check_coverage(staging, frags, records)
        _refuse_without_conditional_create(out)
        meta = meta_with_files(frags[0]["template"], [records[f] for f in sorted(records)])
        for spec, table in take_crc_tables(meta):
            # Equal bytes from a concurrent committer of the same build are left as they are (never rewritten).
            if _calling(f"reading {out.where(spec.name)}", BuildCommitError, retry, out.read, spec.name) \
                    != table:
                _calling(f"writing {out.where(spec.name)}", BuildCommitError, retry,
                         out.fs.pipe_file, out.path(spec.name), table)
        body = (json.dumps(meta, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n").encode()
        _before_meta()
        try:
            out.fs.pipe_file(out.path(META_FILE), body, mode="create")
        except FileExistsError:
            raise _already(out) from None
        except Exception as exc:  # noqa: BLE001 - reported typed, without credentials
            raise BuildCommitError(f"creating {out.where(META_FILE)} failed: {type(exc).__name__}: "
                                   f"{scrub(str(exc)) or 'no message'}; {retry} (the fragments are kept)") from None
    except BuildCommitError:
        published = False
        with contextlib.suppress(Exception):   # the refusal stands when the bucket cannot be asked
            published = out.size(META_FILE) is not None
        if published:   # another committer published meanwhile (and removed the fragments)
            raise _already(out) from None
        raise
    with contextlib.suppress(Exception):   # the store is published; a leftover fragment harms no reader
        out.fs.rm([out.path(f"{STAGING_DIR}/{n}") for n in out.names(STAGING_DIR)])
    return RemoteCommit(path=out.url, meta=meta)


def _refuse_without_conditional_create(out: _Out) -> None:
    """Refuse a filesystem whose create does not fail when the object exists: two committers could both win.

    Probed, not assumed from the protocol: an S3-compatible server that
    ignores ``If-None-Match`` answers the second create with success.
    """

    probe = out.path(f"{STAGING_DIR}/commit-probe-{uuid.uuid4().hex}")
    why = None
    try:
        out.fs.pipe_file(probe, b"1", mode="create")
        try:
            out.fs.pipe_file(probe, b"2", mode="create")
            why = "it accepted a second conditional create of the same object"
        except FileExistsError:
            pass
    except Exception as exc:  # noqa: BLE001 - no conditional create at all (TypeError, NotImplementedError, ...)
        why = f"its conditional create failed ({type(exc).__name__}: {scrub(str(exc)) or 'no message'})"
    finally:
        with contextlib.suppress(Exception):
            out.fs.rm(probe)
    if why is not None:
        raise BuildCommitError(
            f"cannot commit to {out.url}: {out.protocol}:// has no create-if-absent (S3's If-None-Match: *): {why}, "
            "so two concurrent committers could both publish; nothing was published. Commit where it is supported "
            "(AWS S3, memory://, a local path), or build into a local path and copy the store there, meta.json last")

