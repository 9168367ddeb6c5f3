"""A build split into N tasks (torchrun, a Slurm array, or by hand) and a commit that publishes their files.

Why: a corpus too large for one machine is tokenized by tasks an existing
engine starts; no server of loadspec's own coordinates them. The published
store is byte-identical (token files, CRC tables, fingerprint) for every
task count and to a local :func:`impl.build.build_store` of the same source,
because tasks cut the document stream exactly as the local build does:
store file ``f`` holds documents ``[f * docs_per_file, (f + 1) * docs_per_file)``
and is written, whole, by task ``f % N``. A task reads the source's
documents in order and tokenizes only the files it owns (reading is cheap
next to tokenizing), so no file is split between tasks and nothing is
copied at commit.

Layout: each task writes ``<out>/.loadspec-staging/tokens-NNNNN.arrow`` for
its files and then, atomically, its fragment
``task-IIIII-of-NNNNN.json`` (the build key, the records with sizes, sha256
and CRCs, the number of files of the whole source). :func:`commit_build`
(under the ``<out>.lock`` lock) validates every fragment, renames the token
files into ``<out>``, writes the CRC tables and publishes ``meta.json`` last
and atomically: its existence is the commit point. An fsspec URL output
(``s3://bucket/store``) has no rename and no lock: its tasks upload the
token files under their final names and the commit creates ``meta.json``
conditionally (:mod:`impl.build_remote`).

Worked example (7 documents, ``docs_per_file=2``, 2 tasks): files 0..3 hold
documents [0,2) [2,4) [4,6) [6,7); task 0 writes files 0 and 2, task 1
writes 1 and 3; the commit renames the four files into place; a build with
3 tasks or a local build writes the same four files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from impl._atomic import atomic_write_json, file_lock, fsync_dir, lock_path_for
from impl.build import prepare_build
from impl.build_files import WriteBehind, meta_with_files
from impl.build_fragments import (
    FRAGMENT_FORMAT,
    FRAGMENT_PATTERN,
    FRAGMENT_VERSION,
    STAGING_DIR,
    TaskResult,
    check_build_keys,
    check_coverage,
    fragment_document,
    fragment_name,
    fragments_task_count,
    owned_files,
    progress_name,
    sum_reports,
    task_encoder,
)
from impl.build_progress import progress_bar
from impl.build_publish import LOCK_TIMEOUT_S, check_output_path, source_paths, with_block_table
from impl.errors import BuildCommitError, BuildTaskError, ConfigError, StoreError
from impl.store_format import FILE_TEMPLATE, META_FILE, hash_file_blocks

if TYPE_CHECKING:
    from impl.build_remote import RemoteCommit
    from impl.store import TokenStore

__all__ = ["FRAGMENT_FORMAT", "STAGING_DIR", "TaskResult", "build_task", "commit_build", "task_from_env",
           "tasks_progress"]

def task_from_env(task: int | None = None, tasks: int | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(task, tasks)``: given explicitly, else torchrun's ``RANK``/``WORLD_SIZE``, else a Slurm array's ids.

    A Slurm array's ids need not start at 0 (``--array=1-7``): the task is
    ``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN``.

    >>> task_from_env(environ={"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "7"})
    (2, 7)
    """
    env = os.environ if environ is None else environ
    if task is None and tasks is None:
        if "RANK" in env and "WORLD_SIZE" in env:
            task, tasks = int(env["RANK"]), int(env["WORLD_SIZE"])
        elif "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
            task = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
            tasks = int(env["SLURM_ARRAY_TASK_COUNT"])
    if task is None or tasks is None:
        raise ConfigError(
            "which task is this? pass task= and tasks= (--task I --tasks N), or run under torchrun (RANK, "
            "WORLD_SIZE) or a Slurm array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT)")
    if isinstance(tasks, bool) or tasks < 1 or isinstance(task, bool) or not 0 <= task < tasks:
        raise ConfigError(f"task={task!r} of tasks={tasks!r}: need tasks >= 1 and 0 <= task < tasks")
    return task, tasks


def build_task(source: Any, tokenizer: Any, out_dir: str | os.PathLike[str], *, task: int | None = None,
               tasks: int | None = None, text_field: str = "text", add_bos: bool = False, add_eos: bool = True,
               batch_size: int = 1000, docs_per_file: int | None = None, split: str | None = None,
               progress: bool = False, commit_when_done: bool = False,
               storage_options: Mapping[str, Any] | None = None) -> TaskResult:
    """Tokenize this task's files of ``source`` into ``out_dir``'s staging area and write its fragment.

    Arguments as :func:`impl.build.build_store`; ``task``/``tasks`` as
    :func:`task_from_env`. A fragment already there that validates (same
    build key, files intact) is kept and the task returns ``skipped=True``.
    A write that fails (full disk) raises :class:`BuildTaskError` naming the
    path; other tasks' fragments stay valid.

    ``commit_when_done``: once this task's fragment is written (or skipped),
    the task that finds every fragment present commits (:func:`commit_build`,
    under its lock); a task that finds the store already committed by another
    returns ``committed=False``. A torchrun or Slurm job then needs no
    separate commit step.

    Progress: after each file the task writes its counts to
    ``progress-IIIII-of-NNNNN.json`` in the staging area; :func:`tasks_progress`
    sums them, and the task's bar shows the tokens/s of all tasks together.

    ``out_dir`` may be an fsspec URL (``s3://bucket/store``; ``storage_options``
    go to fsspec): the task encodes into a local temp directory and uploads
    its token files under their final names, then its fragment
    (:mod:`impl.build_remote`). A ``file://`` URL is the local path.
    """
    index, count = task_from_env(task, tasks)
    url, out_dir = _out_of(out_dir, storage_options)
    if url is None:
        check_output_path(out_dir, source_paths(source))
    plan = prepare_build(source, tokenizer, text_field=text_field, add_bos=add_bos, add_eos=add_eos,
                         batch_size=batch_size, docs_per_file=docs_per_file, split=split)
    if plan.build_key is None:
        raise ConfigError(f"a multi-task build needs a source it can fingerprint (a path or a datasets.Dataset), "
                          f"not {plan.src.describe()}: pass files, or build locally with TokenStore.build")
    if url is not None:
        from impl.build_remote import run_remote_task

        return run_remote_task(plan, url, index, count, storage_options=storage_options, progress=progress,
                               commit_when_done=commit_when_done)
    out = Path(os.path.abspath(os.fspath(out_dir)))
    staging = out / STAGING_DIR
    fragment = staging / fragment_name(index, count)
    if (out / META_FILE).exists():
        raise BuildCommitError(f"{out} is already a committed store: open it with TokenStore.open, or build into "
                               "another out_dir")
    with contextlib.suppress(BuildCommitError):
        done = _validated(fragment, staging, out, plan.build_key)
        return TaskResult(task=index, tasks=count, skipped=True, files=tuple(f for f, _ in done),
                          committed=commit_when_done and _commit_if_last(out, count))
    enc = task_encoder(plan)
    files: list[dict[str, Any]] = []
    bar = progress_bar(progress, None)
    started = time.time()
    tokens = 0
    try:
        staging.mkdir(parents=True, exist_ok=True)
        seen, owned = owned_files(plan, index, count)

        def written(f: int, record: dict[str, Any]) -> None:
            nonlocal tokens
            files.append({"index": f, "record": record})
            tokens += record["num_tokens"]
            atomic_write_json(staging / progress_name(index, count),
                              {"tokens": tokens, "files": len(files), "started": started, "now": time.time()},
                              indent=None)
            bar.update(record["num_documents"])
            if progress and hasattr(bar, "set_postfix_str"):
                total, rate = tasks_progress(out, count)
                bar.set_postfix_str(f"all tasks: {total} tokens, {rate / 1e6:.2f}M tokens/s", refresh=False)

        # Reading, encoding and writing overlap: the tokenizer encodes while this thread reads the next file's
        # texts and another writes, fsyncs and hashes the last file.
        with WriteBehind(written) as writer:
            for f, values, offsets, num_empty in enc.encode_ranges(owned):
                writer.submit(str(staging / FILE_TEMPLATE.format(f)), [(values, offsets, num_empty)], tag=f)
            writer.finish()
        atomic_write_json(fragment, fragment_document(plan, index, count, seen[0], files), indent=None)
    except OSError as exc:
        where = exc.filename or staging
        raise BuildTaskError(
            f"task {index} of {count} failed writing {os.fspath(where)!r}: {exc.strerror or exc} (errno "
            f"{exc.errno}); its fragment was not written, other tasks' fragments are untouched: free space (or fix "
            "the cause) and relaunch this task"
        ) from exc
    finally:
        bar.close()
    return TaskResult(task=index, tasks=count, skipped=False, files=tuple(f["index"] for f in files),
                      committed=commit_when_done and _commit_if_last(out, count))


def tasks_progress(out_dir: str | os.PathLike[str], tasks: int,
                   storage_options: Mapping[str, Any] | None = None) -> tuple[int, float]:
    """``(tokens written, tokens/s)`` of all ``tasks`` tasks together, from their progress files.

    The rate is the total over the time from the earliest task's start to the
    latest report; a task that has not reported yet counts zero. ``out_dir``
    may be an fsspec URL (the reports are objects in its staging area).
    """
    url, out_dir = _out_of(out_dir, storage_options)
    if url is not None:
        from impl.build_remote import read_reports

        return sum_reports(read_reports(url, tasks, storage_options))
    staging = Path(os.fspath(out_dir)) / STAGING_DIR
    reports = []
    for i in range(tasks):
        with contextlib.suppress(OSError):
            reports.append((staging / progress_name(i, tasks)).read_bytes())
    return sum_reports(reports)


def _commit_if_last(out: Path, count: int) -> bool:
    """Commit when every fragment of ``count`` tasks is present; False when some are missing or another committed."""
    staging = out / STAGING_DIR
    if not all((staging / fragment_name(i, count)).exists() for i in range(count)):
        return False
    try:
        commit_build(out, tasks=count)
    except BuildCommitError:
        if (out / META_FILE).exists():
            return False
        raise
    return True


def _read_fragment(path: Path) -> dict[str, Any]:
    try:
        frag = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BuildCommitError(f"fragment {path} cannot be read ({exc}): relaunch its task") from exc
    if not isinstance(frag, dict) or frag.get("format") != FRAGMENT_FORMAT or frag.get("version") != FRAGMENT_VERSION:
        raise BuildCommitError(f"{path} is not a loadspec build fragment (version {FRAGMENT_VERSION}): relaunch its "
                               "task")
    return frag


def _validated(path: Path, staging: Path, out: Path, build_key: str | None) -> list[tuple[int, dict[str, Any]]]:
    """The fragment's ``(file index, record)`` pairs once every file's size and CRCs check; else BuildCommitError.

    A file is looked for in the staging area, then in ``out`` (a commit that
    was interrupted after renaming it).
    """
    frag = _read_fragment(path)
    if build_key is not None and frag.get("build_key") != build_key:
        raise BuildCommitError(f"fragment {path} was built from another source, tokenizer or options")
    block = int(frag["template"]["layout"]["block_bytes"])
    pairs = []
    for entry in frag["files"]:
        rec = entry["record"]
        name = rec["name"]
        where = staging / name if (staging / name).exists() else out / name
        try:
            size = where.stat().st_size
        except OSError:
            raise BuildCommitError(
                f"fragment {path.name}: token file {name} is missing: relaunch task {frag['task']}") from None
        sha256, crcs = hash_file_blocks(str(where), block) if size == rec["size"] else (None, None)
        if size != rec["size"] or sha256 != rec["sha256"] or crcs != rec["block_crc32"]:
            raise BuildCommitError(
                f"fragment {path.name}: token file {where} does not match its record (size {size}, expected "
                f"{rec['size']}, or its CRCs differ): it changed after task {frag['task']} wrote it; relaunch that "
                "task (delete the fragment first)")
        pairs.append((int(entry["index"]), rec))
    return pairs


def _out_of(out_dir: str | os.PathLike[str],
            storage_options: Mapping[str, Any] | None) -> tuple[str | None, str | os.PathLike[str]]:
    """``(object store URL or None, local out_dir)``; storage options without a URL are refused (they would be lost)."""
    from impl.build_remote import local_out, remote_url

    url = remote_url(out_dir)
    if url is None and storage_options:
        raise ConfigError(f"storage_options were given but out_dir {os.fspath(out_dir)!r} is a local path: pass an "
                          "fsspec URL (s3://bucket/store) or drop the storage options")
    return url, local_out(out_dir)


def commit_build(out_dir: str | os.PathLike[str], *, tasks: int | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> TokenStore | RemoteCommit:
    """Validate every task's fragment, rename the token files into ``out_dir`` and publish ``meta.json`` last.

    Under the ``<out_dir>.lock`` lock: a second committer waits, then finds
    ``meta.json`` and raises :class:`BuildCommitError` saying the store was
    already committed. Refused, naming the task or file: a missing
    fragment, a token file whose size or CRCs changed, fragments built from
    different sources (a source file changed between tasks) or options.

    An fsspec URL ``out_dir`` (``s3://bucket/store``) is committed by
    :func:`impl.build_remote.commit_remote`, which returns a
    :class:`~impl.build_remote.RemoteCommit` (a conditional create of
    ``meta.json`` instead of the lock decides between two committers).
    """
    url, out_dir = _out_of(out_dir, storage_options)
    if url is not None:
        from impl.build_remote import commit_remote

        return commit_remote(url, tasks=tasks, storage_options=storage_options)
    out = Path(os.path.abspath(os.fspath(out_dir)))
    staging = out / STAGING_DIR
    timeout = float(os.environ.get("LOADSPEC_LOCK_TIMEOUT_S", str(LOCK_TIMEOUT_S)))
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path_for(out), timeout=timeout):
        if (out / META_FILE).exists():
            raise BuildCommitError(f"{out} was already committed by another committer: open it with "
                                   "TokenStore.open (nothing to do)")
        found = {}
        if staging.is_dir():
            for p in staging.iterdir():
                m = FRAGMENT_PATTERN.match(p.name)
                if m:
                    found[(int(m.group(1)), int(m.group(2)))] = p
        count = fragments_task_count(str(staging), found, tasks, str(out))
        frags = [_read_fragment(found[(i, count)]) for i in range(count)]
        check_build_keys(frags)
        records: dict[int, dict[str, Any]] = {}
        for i in range(count):
            records.update(_validated(found[(i, count)], staging, out, None))
        check_coverage(str(staging), frags, records)
        try:
            for f in sorted(records):
                name = records[f]["name"]
                if (staging / name).exists():
                    os.rename(staging / name, out / name)
            meta = meta_with_files(frags[0]["template"], [records[f] for f in sorted(records)])
            with_block_table(out, meta)
            atomic_write_json(out / META_FILE, meta)
            fsync_dir(out)
        except OSError as exc:
            raise StoreError(f"committing {out} failed at {exc.filename or out!r}: {exc.strerror or exc}; fix the "
                             "cause and commit again (the fragments are kept)") from exc
        shutil.rmtree(staging, ignore_errors=True)
    from impl.store import TokenStore

    return TokenStore.open(out)
