"""The matrix is earned: outcomes come from running the kit, a missing peer is never a pass."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from conformance.matrix import LoaderRun, Outcome, _message, render, run_loader


def test_a_failure_cell_names_the_clause_and_the_details_carry_the_repro() -> None:
    node = ET.fromstring('<failure message="conformance.assertions.ClauseViolation: [RES-4] after resuming, 3 pairs '
                         'were trained twice | repro: corpus=[[[1, 2]]]">trace</failure>')
    clause, message = _message(node)
    assert clause == "RES-4"
    assert message.startswith("[RES-4] after resuming") and "repro: corpus=[[[1, 2]]]" in message
    run = LoaderRun("peer", "x:y", name="peer", version="1.2", outcomes={
        "test_a": Outcome("pass"), "test_b": Outcome("fail", clause, message), "test_c": Outcome("skip")})
    text = render([run], profile="dev", command="python -m conformance.matrix")
    assert "| `a` | pass |" in text and "| `b` | **FAIL** RES-4 |" in text and "| `c` | n/a |" in text
    assert "- `test_b` [RES-4]: [RES-4] after resuming" in text


def test_a_loader_that_cannot_be_imported_is_listed_as_not_installed_and_runs_no_test() -> None:
    run = run_loader("ghost", "conformance.adapters.peers.no_such_peer:adapter", profile="dev", timeout=60)
    assert run.status == "not installed" and not run.outcomes
    assert "no_such_peer" in run.detail
    assert "| ghost | - | 0 | not installed: " in render([run], profile="dev", command="m")


def test_the_readme_matrix_summary_is_the_one_generated_from_matrix_json():
    from pathlib import Path

    from conformance import matrix

    runs = matrix.load_runs(Path(matrix.REPO / "conformance" / "report" / "matrix.json"))
    text = matrix.README.read_text(encoding="utf-8")
    assert matrix.readme_with_summary(text, runs) == text, (
        "the README's matrix summary differs from conformance/report/matrix.json: regenerate it with "
        "python -m conformance.matrix (or edit neither by hand)")


def test_tests_a_stopped_run_did_not_reach_are_listed_as_not_run_with_the_reason(tmp_path):
    import json

    from conformance.matrix import _read_log

    log = tmp_path / "outcomes.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"collected": ["m.py::test_a[x]", "m.py::test_a[y]", "m.py::test_b"]},
        {"nodeid": "m.py::test_a[x]", "when": "call", "outcome": "passed", "text": ""},
        {"nodeid": "m.py::test_a[y]", "when": "call", "outcome": "failed",
         "text": "    except ClauseViolation:\nE   conformance.assertions.ClauseViolation: [RES-1] batches differ | repro: k=3"},
    ]) + "\n")
    run = LoaderRun("peer", "x:y")
    _read_log(log, run, stopped="not reached: stopped at the 60s budget")
    assert run.outcomes["test_a"] == Outcome("fail", "RES-1", "[RES-1] batches differ | repro: k=3")
    assert run.outcomes["test_b"] == Outcome("not run", "", "not reached: stopped at the 60s budget")
    assert "| `b` | not run |" in render([run], profile="dev", command="m")


def test_a_rank_timeout_is_reported_as_a_timeout_never_as_a_failure_and_per_rank_rows_are_marked(tmp_path):
    import json

    from conformance.matrix import _read_log

    log = tmp_path / "outcomes.jsonl"
    suite = "conformance/tests/test_any_loader_processes.py"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"collected": [f"{suite}::test_p[a]", f"{suite}::test_p[b]", "m.py::test_q"]},
        {"nodeid": f"{suite}::test_p[a]", "when": "call", "outcome": "failed",
         "text": "    raise RankTimeout(...)\nE   conformance.ranks.RankTimeout: rank 0 waited 61s at the join after "
                 "step 2 for rank(s) [1]", "crash": "conformance.ranks.RankTimeout: rank 0 waited 61s"},
        {"nodeid": f"{suite}::test_p[b]", "when": "call", "outcome": "passed", "text": ""},
        {"nodeid": "m.py::test_q", "when": "call", "outcome": "failed",
         "text": "E   TimeoutError: job did not finish within 120s; every rank was killed."},
    ]) + "\n")
    run = LoaderRun("peer", "x:y")
    _read_log(log, run, stopped="")
    assert run.outcomes["test_p"].status == "timeout" and run.outcomes["test_p"].clause == ""
    assert run.outcomes["test_q"].status == "timeout"
    text = render([run], profile="dev", command="m")
    assert "| `p` (per rank) | timeout |" in text and "| `q` | timeout |" in text and "**FAIL**" not in text


def test_a_partial_run_of_a_row_replaces_and_adds_only_its_own_cells_and_keeps_the_others(tmp_path):
    import json
    from dataclasses import asdict

    from conformance.matrix import load_runs, main

    full = [LoaderRun("peer", "x:y", name="peer", version="1", seconds=100.0, outcomes={
                "test_a": Outcome("pass"), "test_topology": Outcome("pass"), "test_z": Outcome("fail", "PART-1", "m")}),
            LoaderRun("other", "o:p", name="other", version="2", seconds=50.0, outcomes={"test_a": Outcome("pass")})]
    partial = [LoaderRun("peer", "x:y", name="peer", version="1.1", seconds=7.0, per_rank=[], outcomes={
        "test_topology": Outcome("fail", "RES-6", "[RES-6] rank 1 continues differently"),
        "test_topology_last_rank_ahead": Outcome("skip", "", "max_world_size 1")})]
    (tmp_path / "full.json").write_text(json.dumps([asdict(r) for r in full]))
    (tmp_path / "partial.json").write_text(json.dumps([asdict(r) for r in partial]))
    out = tmp_path / "out"
    assert main(["--merge", str(tmp_path / "full.json"), "--cells", str(tmp_path / "partial.json"),
                 "--out", str(out)]) == 0
    peer, other = load_runs(out / "matrix.json")
    assert list(peer.outcomes) == ["test_a", "test_topology", "test_topology_last_rank_ahead", "test_z"]
    assert peer.outcomes["test_a"] == Outcome("pass") and peer.outcomes["test_z"] == Outcome("fail", "PART-1", "m")
    assert peer.outcomes["test_topology"].clause == "RES-6"
    assert peer.version == "1.1" and peer.seconds == 107.0 and peer.status == "ran"
    assert other == full[1]
    text = (out / "MATRIX.md").read_text()
    assert "| `topology` | **FAIL** RES-6 | · |" in text and "| `topology_last_rank_ahead` | n/a | · |" in text
