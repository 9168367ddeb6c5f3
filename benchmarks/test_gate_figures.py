"""The gate and the report read the build's ratio to raw encode (issue 20) from a benchmark JSON."""

from __future__ import annotations

from benchmarks import compare, figures, report


def _run(ratio: float) -> dict:
    extra = {"kind": "build-vs-raw", "num_proc": 2, "documents": 10_000, "build_tokens_per_s": 900_000,
             "raw_tokens_per_s": round(900_000 / ratio), "ratio": ratio}
    bench = {"name": "test_build_vs_raw_encode[2]", "extra_info": extra,
             "stats": {"median": 1.0, "min": 1.0, "mean": 1.0, "rounds": 1}}
    return {"benchmarks": [bench], "machine_info": {"loadspec": {"size": "S"}}}


def test_the_build_ratio_to_raw_encode_is_a_gate_figure_that_fails_when_it_drops():
    name = "build impl/raw encode tokens/s (2 proc)"
    assert figures.ratios(_run(0.9))[name] == (0.9, "higher")
    failures, _ = compare.compare(figures.ratios(_run(0.5)), {name: {"value": 0.9}})
    assert failures == [name]
    assert compare.compare(figures.ratios(_run(0.85)), {name: {"value": 0.9}})[0] == []


def test_the_report_has_a_row_for_the_build_against_raw_encode():
    text = report.markdown(_run(0.9), None, [], [])
    assert "Build against the raw tokenizer" in text and "| 2 | 10000 | 900.00 k | 1.00 M | 0.900 |" in text


def _tasks_run(ratio: float) -> dict:
    extra = {"kind": "build-tasks-vs-raw", "tasks": 2, "documents": 20_000, "build_tokens_per_s": 450_000,
             "raw_tokens_per_s": round(450_000 / ratio), "ratio": ratio, "cpu_ratio": 0.95}
    bench = {"name": "test_build_tasks_vs_raw_encode[2]", "extra_info": extra,
             "stats": {"median": 1.0, "min": 1.0, "mean": 1.0, "rounds": 1}}
    return {"benchmarks": [bench], "machine_info": {"loadspec": {"size": "M"}}}


def test_the_multi_task_build_ratio_to_raw_encode_is_a_gate_figure_that_fails_when_it_drops():
    name = "build tasks/raw encode tokens/s (2 tasks)"
    assert figures.ratios(_tasks_run(0.9))[name] == (0.9, "higher")
    failures, _ = compare.compare(figures.ratios(_tasks_run(0.5)), {name: {"value": 0.9}})
    assert failures == [name]


def test_the_report_has_a_row_for_the_multi_task_build_against_raw_encode():
    text = report.markdown(_tasks_run(0.9), None, [], [])
    assert "A multi-task build against the raw tokenizer" in text
    assert "| 2 | 20000 | 450.00 k | 500.00 k | 0.900 | 0.950 |" in text
