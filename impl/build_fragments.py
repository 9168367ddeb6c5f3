"""What a build's tasks share, locally and on object storage: fragment names and documents, the files a task owns, progress reports.

Why a module of its own: :mod:`impl.build_tasks` (a local output) and
:mod:`impl.build_remote` (an fsspec URL) both write and read fragments and
reports; each imports these from here, so neither imports the other back.

Worked example: task 2 of 7 writes ``.loadspec-staging/task-00002-of-00007.json``
(:func:`fragment_name`) and reports progress in ``progress-00002-of-00007.json``;
with ``docs_per_file=2`` over 7 documents it owns files 2 (documents 4, 5)
and nothing else (:func:`owned_files`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from impl.build_shares import owned_ranges
from impl.encoding import Encoder
from impl.errors import BuildCommitError
from impl.sources import rechunk

if TYPE_CHECKING:
    from impl.build import PreparedBuild

__all__ = [
    "FRAGMENT_FORMAT",
    "FRAGMENT_PATTERN",
    "FRAGMENT_VERSION",
    "STAGING_DIR",
    "TaskResult",
    "fragment_document",
    "fragment_name",
    "owned_files",
    "parse_fragment_name",
    "progress_name",
    "sum_reports",
    "task_encoder",
]

STAGING_DIR = ".loadspec-staging"
"""Where tasks write their token files and fragments, inside the output directory."""

FRAGMENT_FORMAT = "loadspec.build_fragment"
FRAGMENT_VERSION = 1
FRAGMENT_PATTERN = re.compile(r"^task-(\d{5,})-of-(\d{5,})\.json$")
_TIMES = ("build_id", "created")


def fragment_name(task: int, tasks: int) -> str:
    """``task-00002-of-00007.json``: the fragment of task 2 of 7."""
    return f"task-{task:05d}-of-{tasks:05d}.json"


def parse_fragment_name(name: str) -> tuple[int, int] | None:
    """``(task, tasks)`` of a fragment's file name, None for another name.

    >>> parse_fragment_name("task-00002-of-00007.json"), parse_fragment_name("tokens-00002.arrow")
    ((2, 7), None)
    """
    m = FRAGMENT_PATTERN.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What one task did: ``skipped`` when its fragment already validated (a relaunch), ``files`` it owns."""

    task: int
    tasks: int
    skipped: bool
    files: tuple[int, ...]
    committed: bool = False


def task_encoder(plan: PreparedBuild) -> Encoder:
    """The encoder every task of ``plan`` uses (the local build's: same special tokens, dtype and batch size)."""
    opts = plan.options
    return Encoder(plan.tok_json, dtype=plan.dtype, bos_id=plan.tinfo.bos_id if opts.add_bos else None,
                   eos_id=plan.tinfo.eos_id if opts.add_eos else None, batch_size=opts.batch_size)


def owned_files(plan: PreparedBuild, index: int, count: int) -> tuple[list[int], Iterator[tuple[int, list[str]]]]:
    """``(box, (file index, texts) of the files task ``index`` owns)``; once iterated, ``box[0]`` is the file count.

    A files source is counted first and only this task's documents are read
    (:func:`impl.build_shares.owned_ranges`); one that cannot be counted
    cheaply (compressed text, datasets) is read whole.
    """
    opts = plan.options
    share = None if not plan.src.files or plan.src.text_field is None else owned_ranges(
        plan.src.files, plan.src.text_field, opts.docs_per_file, index, count)
    if share is not None:
        return [share[0]], share[1]
    seen = [0]

    def every_file() -> Iterator[tuple[int, list[str]]]:
        for f, texts in enumerate(rechunk(plan.src.batches(), opts.docs_per_file)):
            seen[0] = f + 1
            if f % count == index:
                yield f, texts

    return seen, every_file()


def fragment_document(plan: PreparedBuild, index: int, count: int, num_files: int,
                      files: list[dict[str, Any]]) -> dict[str, Any]:
    """Task ``index``'s fragment: the build key, its files' records and the meta template; EmptyDataError if none."""
    if num_files == 0:
        raise plan.empty_error()
    return {"format": FRAGMENT_FORMAT, "version": FRAGMENT_VERSION, "task": index, "tasks": count,
            "build_key": plan.build_key, "num_files": num_files, "files": files,
            "template": {k: v for k, v in plan.meta([]).items() if k not in _TIMES}}


def progress_name(task: int, tasks: int) -> str:
    """``progress-00002-of-00007.json``: where task 2 of 7 reports its counts, in the staging area."""
    return f"progress-{task:05d}-of-{tasks:05d}.json"


def sum_reports(reports: list[bytes]) -> tuple[int, float]:
    """``(tokens, tokens/s)`` of the tasks' progress reports (a report that does not parse counts zero)."""
    total, first, last = 0, float("inf"), 0.0
    for raw in reports:
        try:
            rep = json.loads(raw)
        except ValueError:
            continue
        total += int(rep["tokens"])
        first, last = min(first, float(rep["started"])), max(last, float(rep["now"]))
    return total, (total / (last - first) if last > first else 0.0)


def fragments_task_count(staging: str, found: Mapping[tuple[int, int], Any], tasks: int | None, out: str) -> int:
    """The task count of the build whose fragments ``found`` holds (``(task, tasks)`` keys); ``BuildCommitError`` else.

    Refused: no fragment, fragments of several task counts (unless ``tasks``
    names one), and tasks of that count without a fragment.
    """
    counts = {n for _, n in found} if tasks is None else {tasks}
    if not counts:
        raise BuildCommitError(
            f"{staging} holds no build fragment: run the build's tasks first (loadspec build SRC {out} "
            "--tokenizer T --task I --tasks N, or --task-from-env), then commit")
    if len(counts) != 1:
        raise BuildCommitError(
            f"{staging} holds fragments of builds with different task counts {sorted(counts)}: "
            "pass tasks= (--tasks N) to commit the one you ran")
    (count,) = counts
    missing = [i for i in range(count) if (i, count) not in found]
    if missing:
        raise BuildCommitError(f"tasks {missing} of {count} have no fragment in {staging}: run (or relaunch) them, "
                               "then commit again")
    return count


def check_build_keys(frags: Sequence[Mapping[str, Any]]) -> None:
    """Refuse fragments of different build keys: the tasks read different sources or options."""
    keys = {f["build_key"] for f in frags}
    if len(keys) > 1:
        groups = {k: [f["task"] for f in frags if f["build_key"] == k] for k in keys}
        raise BuildCommitError(
            f"the tasks read different sources or options (the source changed between tasks?): tasks "
            f"{sorted(groups.values())} have different build keys; relaunch them all on the unchanged source")


def check_coverage(staging: str, frags: Sequence[Mapping[str, Any]], records: Mapping[int, Any]) -> None:
    """Refuse fragments whose files' records do not cover the source's files exactly once."""
    num_files = {f["num_files"] for f in frags}
    if len(num_files) != 1 or sorted(records) != list(range(num_files.pop())):
        raise BuildCommitError(f"the fragments in {staging} do not cover the source's files exactly: relaunch "
                               "every task")
