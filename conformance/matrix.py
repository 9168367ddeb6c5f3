"""The peer matrix: run the kit on every loader and write property × loader to ``conformance/report/MATRIX.md``.

Why generated: a row is only worth reading if the kit earned it. Each loader
runs the kit's suites in its own pytest process (``--loadspec-loader``,
JUnit XML out); this module reads the outcomes, the clause of every failure
and the repro the kit printed, and writes the table, the details and
``matrix.json`` (for the README's summary). A peer that is not installed is
listed as not run, never as passing.

``python -m conformance.matrix`` (``make matrix`` runs it in the peer venv)::

    python -m conformance.matrix --loader reference=conformance.adapters.reference:adapter --out /tmp/m

A new test (or a new check in one) needs only its cells rerun: ``--select``
runs the tests ``pytest -k`` picks and merges their cells into the earlier
rows (``--update``), keeping the others; ``--cells`` merges such a run made
elsewhere (``--out DIR``) afterwards::

    python -m conformance.matrix --update --loader impl=conformance.adapters.impl:adapter --select topology
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from impl._atomic import atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]
SUITES = ("conformance.tests.test_any_loader", "conformance.tests.test_any_loader_processes", "conformance.tests.test_loader",
          "conformance.tests.test_stateful_resume")
LOG_ENV = "LOADSPEC_MATRIX_LOG"
"""Where the reporting hooks below (``-p conformance.matrix``) append one JSON line per collected and finished test."""
LOADERS = {
    "reference": "conformance.adapters.reference:adapter",
    "impl": "conformance.adapters.impl:adapter",
    "impl streaming (jsonl, 12 lanes)": "conformance.adapters.streaming:adapter",
    "tiny-loader (worked example)": "conformance.examples.third_party:adapter",
    "torchdata map + DistributedSampler": "conformance.adapters.peers.torchdata_map:adapter",
    "torchdata map, 0-2 workers": "conformance.adapters.peers.torchdata_map:adapter_workers",
    "HF datasets": "conformance.adapters.peers.hf_datasets:adapter",
    "MosaicML Streaming": "conformance.adapters.peers.mosaicml:adapter",
    "LitData": "conformance.adapters.peers.litdata:adapter",
}
_CLAUSE = re.compile(r"\[([A-Z]+-\d+)\]")
_TIMEOUT = re.compile(r"(?:[\w.]+\.)?(?:RankTimeout|TimeoutError)\b")
"""A test that raised the harness's ``RankTimeout`` (or a ``TimeoutError``): a job that ran out of time, never a
defect caught (on a loaded machine it is the machine; ``LOADSPEC_TIMEOUT_SCALE`` gives the harness more time)."""
PROFILE = "dev"
"""The hypothesis profile the matrix is generated with (``--profile``'s default): ``kit_tests/test_blind_spots``
runs every broken variant of the worked example under it and checks each is caught."""
PER_RANK_MODULE = "test_any_loader_processes"
"""The suite whose tests run one process per rank: the only grading of several ranks for a loader whose ranks
cannot share a process (MosaicML, LitData); the matrix marks its rows."""


@dataclass
class Outcome:
    status: str
    """pass, fail, skip, error, timeout (a harness time limit ran out: not a defect caught), or "not run" (the run
    stopped first: ``message`` says why)."""
    clause: str = ""
    message: str = ""


@dataclass
class LoaderRun:
    label: str
    spec: str
    name: str = ""
    version: str = ""
    capabilities: list[str] = field(default_factory=list)
    status: str = "ran"
    """ran, not installed, timeout (the tests it did not reach are "not run"), or crashed (pytest stopped)."""
    detail: str = ""
    seconds: float = 0.0
    """Wall time of the runs that earned the row's cells (a ``--select`` run adds its own)."""
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    per_rank: list[str] = field(default_factory=list)
    """The tests of :data:`PER_RANK_MODULE` (one process per rank)."""


def describe(spec: str) -> dict[str, Any]:
    """Name, version and capabilities of an adapter (run in a child process so peers stay out of this one)."""
    from conformance.plugin import load_adapter

    adapter = load_adapter(spec)
    version = str(getattr(adapter, "version", "") or "")
    if not version and spec.startswith("conformance."):
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as package_version

        try:
            version = f"loadspec {package_version('loadspec')}"
        except PackageNotFoundError:
            version = "loadspec (not installed)"
    return {"name": adapter.name, "version": version,
            "capabilities": sorted(adapter.capabilities)}


def _env(profile: str) -> dict[str, str]:
    return dict(os.environ, LOADSPEC_HYPOTHESIS_PROFILE=profile,
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _message_text(text: str) -> tuple[str, str]:
    """The clause and the most telling line of a failure's text (the ClauseViolation with its repro, else the error)."""
    match = _CLAUSE.search(text)
    lines = text.splitlines()
    line = next((ln for ln in lines if "ClauseViolation: [" in ln), None)
    if line is None:  # no clause: the last ``E`` line names the exception (a traceback's first lines never do)
        line = next((ln for ln in reversed(lines) if ln.startswith("E ")), text.strip().splitlines()[-1] if text.strip() else "")
    line = re.sub(r"^E\s+", "", line.strip())
    line = line.replace("conformance.assertions.ClauseViolation: ", "")
    return (match.group(1) if match else ""), line[:1500]


def is_timeout(text: str, crash: str = "") -> bool:
    """Whether a failure is a time limit that ran out (``RankTimeout``/``TimeoutError`` raised), not a catch.

    ``crash`` is pytest's one line for the exception the test ended with (``reprcrash``), which decides when
    given; else the first ``E`` line of ``text`` that names an exception.

    >>> is_timeout("", "conformance.ranks.RankTimeout: rank 0 waited 61s at the join after step 2")
    True
    >>> is_timeout("E   conformance.assertions.ClauseViolation: [PART-1] ranks ran [3, 2] steps")
    False
    """
    if not crash:
        crash = next((re.sub(r"^E\s+", "", ln) for ln in text.splitlines() if re.match(r"^E\s+[\w.]+:", ln)), "")
    return bool(_TIMEOUT.match(crash))


def _message(node: ET.Element) -> tuple[str, str]:
    return _message_text((node.get("message") or "") + "\n" + (node.text or ""))


# --------------------------------------------------------------------------- reporting hooks (``-p conformance.matrix``)


def _log(record: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def pytest_collection_finish(session: Any) -> None:
    _log({"collected": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or report.outcome != "passed":
        text = report.longreprtext if report.outcome != "passed" else ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "") if report.failed else ""
        _log({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text[-20000:],
              "crash": crash[:2000]})


def _test_name(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def _read_log(path: Path, run: LoaderRun, *, stopped: str) -> None:
    """Fold the streamed records into ``run.outcomes``: a test's worst case wins; collected but unreached → not run."""
    rank = {"pass": 0, "skip": 1, "not run": 2, "timeout": 3, "fail": 4, "error": 5}
    collected: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "collected" in rec:
            collected = rec["collected"]
            continue
        name = _test_name(rec["nodeid"])
        if rec["outcome"] == "passed":
            outcome = Outcome("pass")
        elif rec["outcome"] == "skipped":
            outcome = Outcome("skip", "", rec["text"][:200])
        else:
            clause, message = _message_text(rec["text"])
            status = "timeout" if is_timeout(rec["text"], rec.get("crash", "")) else "fail" if rec["when"] == "call" else "error"
            outcome = Outcome(status, "" if status == "timeout" else clause, message)
        old = run.outcomes.get(name)
        if old is None or rank[outcome.status] > rank[old.status]:
            run.outcomes[name] = outcome
    for name in map(_test_name, collected):
        run.outcomes.setdefault(name, Outcome("not run", "", stopped))
    run.per_rank = sorted({_test_name(n) for n in collected if f"{PER_RANK_MODULE}.py::" in n})


def run_loader(label: str, spec: str, *, profile: str, timeout: float, python: str = sys.executable,
               suites: tuple[str, ...] = SUITES, select: str | None = None) -> LoaderRun:
    """Run the kit's ``suites`` on the adapter ``spec`` in a pytest process of its own (``select``: its ``-k``)."""
    run = LoaderRun(label, spec)
    described = subprocess.run([python, "-m", "conformance.matrix", "--describe", spec], capture_output=True,
                               text=True, env=_env(profile), cwd=REPO, timeout=300, check=False)
    if described.returncode != 0:
        run.status, run.detail = "not installed", (described.stderr.strip().splitlines() or ["?"])[-1][:300]
        return run
    info = json.loads(described.stdout.strip().splitlines()[-1])
    run.name, run.version, run.capabilities = info["name"], info["version"], info["capabilities"]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "outcomes.jsonl"
        cmd = [python, "-m", "pytest", "--pyargs", *suites, "--loadspec-loader", spec, "-p", "no:randomly",
               "-p", "no:cacheprovider", "-p", "conformance.matrix", "-q", *(["-k", select] if select else [])]
        start = time.monotonic()
        stopped = ""
        # its own session, so a timeout also stops the rank processes and workers it started
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                env=dict(_env(profile), **{LOG_ENV: str(log)}), start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            if proc.returncode not in (0, 1):  # 1: tests failed; anything else: pytest itself stopped
                tail = [ln for ln in output.splitlines() if ln.strip()][-3:]
                run.status = "crashed"
                run.detail = stopped = f"pytest exited {proc.returncode} before this test: " + " / ".join(tail)[-600:]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            run.status, run.detail = "timeout", f"the kit did not finish within {timeout:.0f}s"
            stopped = f"not reached: the loader's run was stopped at the {timeout:.0f}s budget"
        run.seconds = time.monotonic() - start
        _read_log(log, run, stopped=stopped or "not reached (pytest stopped early)")
    return run


def _load_run(data: dict[str, Any]) -> LoaderRun:
    outcomes = {t: Outcome(**o) for t, o in data.pop("outcomes").items()}
    return LoaderRun(**data, outcomes=outcomes)


def _cell(outcome: Outcome | None) -> str:
    if outcome is None:
        return "·"
    if outcome.status == "pass":
        return "pass"
    if outcome.status == "skip":
        return "n/a"
    if outcome.status == "not run":
        return "not run"
    if outcome.status == "timeout":
        return "timeout"
    return f"**FAIL** {outcome.clause}".strip()


def render(runs: list[LoaderRun], *, profile: str, command: str) -> str:
    tests: list[str] = []
    for run in runs:
        tests += [t for t in run.outcomes if t not in tests]
    ran = [r for r in runs if r.status != "not installed"]
    lines = ["# Conformance matrix: property × loader", "",
             (f"Generated by `{command}` (hypothesis profile `{profile}`); every cell is the outcome of running "
              "the kit, never typed by hand. `pass`: the property held on every example; `FAIL <clause>`: the kit "
              "found a counterexample (details below); `timeout`: a time limit of the per-rank harness ran out (the "
              "machine may be loaded: rerun with `LOADSPEC_TIMEOUT_SCALE`; never counted as a defect caught); "
              "`n/a`: the loader does not declare the capability the test "
              "needs (bit-exact tests need `bit_exact`); `not run`: the loader's run stopped before the test (the "
              "reason is below). Rows marked (per rank) run one process per rank: for loaders whose ranks cannot "
              "share a process (MosaicML, LitData) they are the only rows that grade more than one rank."), "",
             "| loader | version | seconds | run |", "|---|---|---|---|"]
    for r in runs:
        run = "complete" if r.status == "ran" else f"{r.status}: {r.detail}"
        lines.append(f"| {r.label} | {r.version or '-'} | {r.seconds:.0f} | {run} |")
    lines += ["", "| property | " + " | ".join(r.label for r in ran) + " |", "|---" * (len(ran) + 1) + "|"]
    per_rank = {t for r in runs for t in r.per_rank}
    for t in tests:
        mark = " (per rank)" if t in per_rank else ""
        lines.append(f"| `{t.removeprefix('test_')}`{mark} | " + " | ".join(_cell(r.outcomes.get(t)) for r in ran)
                     + " |")
    lines += ["", "## Failures, with the shortest repro the kit printed", ""]
    for r in ran:
        failed = {t: o for t, o in r.outcomes.items() if o.status in ("fail", "error", "timeout", "not run")}
        if not failed:
            continue
        lines += [f"### {r.label} ({r.name} {r.version})", ""]
        for t, o in failed.items():
            lines += [f"- `{t}` [{o.clause or o.status}]: {o.message}", ""]
    return "\n".join(lines) + "\n"


README = REPO / "README.md"
SUMMARY_BEGIN, SUMMARY_END = "<!-- matrix-summary: generated by python -m conformance.matrix -->", "<!-- /matrix-summary -->"
SUMMARY_TESTS = {
    "test_every_input_and_label_is_the_corpus_token_its_provenance_names": "inputs and labels from the right document (PACK-4)",
    "test_every_rank_runs_the_same_number_of_steps": "every rank runs the same number of steps (PART-1)",
    "test_no_within_document_pair_is_trained_twice_in_an_epoch": "no pair trained twice in an epoch (PART-1)",
    "test_fewer_than_one_global_batch_is_left_untrained": "less than one global batch left untrained (PART-1, PACK-7)",
    "test_resuming_after_k_steps_continues_the_uninterrupted_stream_also_when_resumed_twice":
        "resume continues the stream, also twice (RES-1)",
    "test_resuming_in_a_later_epoch_continues_that_epochs_stream_also_when_resumed_twice":
        "resume in epoch 1 continues that epoch, also twice (RES-1, RES-7)",
    "test_a_state_loaded_on_another_topology_is_refused_or_continues_exactly_once":
        "another world size / batch / workers: refused or exactly once (RES-4)",
    "test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology":
        "last rank a batch ahead at the checkpoint: continues from rank 0's count (RES-6)",
    "test_ranks_in_separate_processes_run_equal_steps_and_train_every_pair_at_most_once":
        "one process per rank: equal steps, each pair at most once (PART-1)",
    "test_ranks_restarted_as_new_processes_from_their_checkpoints_continue_the_stream_also_when_restarted_twice":
        "one process per rank: restarted processes continue the stream (RES-1)",
    "test_a_checkpoint_loaded_by_another_number_of_processes_is_refused_or_continues_exactly_once":
        "one process per rank: another number of processes refused or exactly once (RES-4)",
}


def summary(runs: list[LoaderRun]) -> str:
    """The README's table: the any-loader properties × the loaders that ran, from the same outcomes as MATRIX.md."""
    ran = [r for r in runs if r.status != "not installed"]
    lines = ["| property | " + " | ".join(f"{r.label} ({r.version})" for r in ran) + " |",
             "|---" * (len(ran) + 1) + "|"]
    for test, title in SUMMARY_TESTS.items():
        lines.append(f"| {title} | " + " | ".join(_cell(r.outcomes.get(test)) for r in ran) + " |")
    return "\n".join([SUMMARY_BEGIN, *lines, SUMMARY_END])


def readme_with_summary(text: str, runs: list[LoaderRun]) -> str:
    """``text`` with the block between the summary markers replaced by :func:`summary`."""
    begin, end = text.index(SUMMARY_BEGIN), text.index(SUMMARY_END) + len(SUMMARY_END)
    return text[:begin] + summary(runs) + text[end:]


def load_runs(path: Path) -> list[LoaderRun]:
    return [_load_run(data) for data in json.loads(path.read_text(encoding="utf-8"))]


def merge_cells(row: LoaderRun, partial: LoaderRun) -> LoaderRun:
    """``row`` with the cells of ``partial`` (a run of some of its tests, ``--select``) replacing or joining its own.

    Why: a new test, or a new check in one test, needs only that test rerun
    on every loader, not the whole kit (hours on a loaded machine). The
    other cells are kept as earned; a test new to the row is placed after
    the row's test that precedes it in the partial run (so it sits next to
    its neighbours in the table), else at the end. The name, version and
    capabilities are the partial run's (the loader that earned the new
    cells); ``seconds`` adds the partial run's; a partial run that did not
    finish gives the row its status and reason.

    >>> row = LoaderRun("p", "x:y", outcomes={"test_a": Outcome("pass"), "test_b": Outcome("pass")})
    >>> part = LoaderRun("p", "x:y", outcomes={"test_a": Outcome("fail", "RES-6"), "test_a2": Outcome("skip")})
    >>> [(t, o.status) for t, o in merge_cells(row, part).outcomes.items()]
    [('test_a', 'fail'), ('test_a2', 'skip'), ('test_b', 'pass')]
    """
    outcomes = dict(row.outcomes)
    order = list(row.outcomes)
    previous = ""
    for test, outcome in partial.outcomes.items():
        if test not in outcomes:
            order.insert(order.index(previous) + 1 if previous in order else len(order), test)
        outcomes[test] = outcome
        previous = test
    status, detail = (row.status, row.detail) if partial.status == "ran" else (partial.status, partial.detail)
    return LoaderRun(row.label, partial.spec or row.spec, name=partial.name or row.name,
                     version=partial.version or row.version, capabilities=partial.capabilities or row.capabilities,
                     status=status, detail=detail, seconds=row.seconds + partial.seconds,
                     outcomes={t: outcomes[t] for t in order}, per_rank=sorted({*row.per_rank, *partial.per_rank}))


def _with_cells(kept: list[LoaderRun], partials: list[LoaderRun]) -> list[LoaderRun]:
    """``kept`` with each partial run merged into the same loader's row (:func:`merge_cells`); a new loader is added."""
    rows = {r.label: r for r in kept}
    for p in partials:
        rows[p.label] = merge_cells(rows[p.label], p) if p.label in rows and p.status != "not installed" else \
            rows.get(p.label, p)
    return list(rows.values())


def _combined(runs: list[LoaderRun], kept: list[LoaderRun]) -> list[LoaderRun]:
    """This run's rows, then earlier rows of other loaders, in ``LOADERS`` order (written after every loader)."""
    labels = {r.label for r in runs}
    merged = list(runs)
    for r in kept:
        if r.label not in labels:
            labels.add(r.label)
            merged.append(r)
    order = list(LOADERS)
    return sorted(merged, key=lambda r: order.index(r.label) if r.label in order else len(order))


def _rows(runs: list[LoaderRun], kept: list[LoaderRun], select: str | None) -> list[LoaderRun]:
    """The rows to write: this run's, else (``select``: a partial run) its cells merged into the earlier rows."""
    return _combined(_with_cells(kept, runs), []) if select else _combined(runs, kept)


def _write(out: Path, runs: list[LoaderRun], *, profile: str, command: str) -> None:
    atomic_write_bytes(out / "MATRIX.md", render(runs, profile=profile, command=command).encode())
    atomic_write_bytes(out / "matrix.json", (json.dumps([asdict(r) for r in runs], indent=1) + "\n").encode())
    if out.resolve() == (REPO / "conformance" / "report").resolve() and SUMMARY_BEGIN in README.read_text("utf-8"):
        atomic_write_bytes(README, readme_with_summary(README.read_text("utf-8"), runs).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--describe", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--loader", action="append", metavar="LABEL=SPEC", help="loaders to run (default: all known)")
    ap.add_argument("--out", default=str(REPO / "conformance" / "report"), help="directory for MATRIX.md and matrix.json")
    ap.add_argument("--profile", default=PROFILE, help="hypothesis profile for the runs (ci, dev, thorough)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per loader")
    ap.add_argument("--merge", action="append", default=[], metavar="MATRIX_JSON",
                    help="rows of earlier runs to include (rows run now win); with no --loader, run nothing")
    ap.add_argument("--update", action="store_true",
                    help="keep the other loaders' rows of an existing matrix.json and rerun only the --loader ones")
    ap.add_argument("--select", metavar="EXPR",
                    help="run only the tests pytest -k EXPR selects; their cells replace or join the same loader's "
                         "cells of the earlier rows (--update, --merge), whose other cells are kept")
    ap.add_argument("--cells", action="append", default=[], metavar="MATRIX_JSON",
                    help="rows of earlier --select runs: their cells replace or join the same loader's cells of the "
                         "earlier rows, as --select's do")
    args = ap.parse_args(argv)
    if args.describe:
        print(json.dumps(describe(args.describe)))
        return 0
    loaders = (dict(item.split("=", 1) for item in args.loader) if args.loader
               else {} if args.merge or args.cells else LOADERS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = list(args.merge) + ([str(out / "matrix.json")] if args.update and (out / "matrix.json").exists() else [])
    kept_runs = [_load_run(data) for path in earlier for data in json.loads(Path(path).read_text(encoding="utf-8"))]
    kept_runs = _with_cells(_combined([], kept_runs), [run for path in args.cells for run in load_runs(Path(path))])
    command = "python -m conformance.matrix" + (f" --profile {args.profile}" if args.profile != PROFILE else "")
    runs: list[LoaderRun] = []
    for label, spec in loaders.items():
        print(f"[matrix] {label}: {spec}", flush=True)
        runs.append(run_loader(label, spec, profile=args.profile, timeout=args.timeout, select=args.select))
        print(f"[matrix]   {runs[-1].status} {runs[-1].version} in {runs[-1].seconds:.0f}s: "
              + ", ".join(f"{t}={o.status}" for t, o in runs[-1].outcomes.items() if o.status != "pass"), flush=True)
        _write(out, _rows(runs, kept_runs, args.select), profile=args.profile, command=command)
    _write(out, _rows(runs, kept_runs, args.select), profile=args.profile, command=command)
    print(f"[matrix] wrote {out / 'MATRIX.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
