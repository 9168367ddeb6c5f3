"""Loaders broken in the ways the kit used to miss (issue 22) are caught: each through the per-rank harness.

A state counted on rank 0 and scaled by the ranks, a state that loses
samples only when a rank other than 0 is ahead, a loader that duplicates
samples only when ranks and workers change together, a bare builtin declared
as a refusal, and a ``KeyError`` on load that the adapter calls a refusal.
The broken adapters are in ``conformance.kit_tests.rank_faults``; the harness
runs the reference under them, 2 or 3 ranks, a few steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.adapter import AdapterError, check_adapter
from conformance.assertions import ClauseViolation
from conformance.kit_tests.rank_faults import CONFIG, small_corpus, small_job
from conformance.plugin import load_adapter
from conformance.ranks import RankJob, RankTimeout, grade_resume, grade_topology_change, launch, universe
from reference.errors import ConfigError

pytestmark = pytest.mark.loadspec_processes

FAULTS = "conformance.kit_tests.rank_faults"



def _job(loader: str, **kw) -> RankJob:
    return small_job(f"{FAULTS}:{loader}", **kw)


def _skewed(loader: str, tmp: Path, *, ahead: int, restore: str) -> None:
    whole = launch(_job(loader), tmp / "whole")
    head = launch(_job(loader, stop_at=2, ahead=ahead), tmp / "head")
    rest = launch(_job(loader, resume_from=str(head.checkpoint_dir), restore=restore), tmp / "rest")
    grade_resume(whole, [head, rest])


@pytest.mark.clause("RES-6")
def test_a_state_counted_on_rank_0_and_scaled_by_the_ranks_repeats_the_batch_rank_1_took_ahead(tmp_path):
    with pytest.raises(ClauseViolation, match=r"\[RES-6\] rank 1's batches over 2 jobs"):
        _skewed("rank0_count", tmp_path / "rank1-ahead", ahead=1, restore="own")


@pytest.mark.clause("RES-6")
def test_a_state_that_counts_the_furthest_rank_on_rank_0_loses_rank_0s_batch_only_when_rank_1_is_ahead(tmp_path):
    _skewed("furthest_count", tmp_path / "rank0-ahead", ahead=0, restore="own")  # rank 0 is the furthest: exact
    with pytest.raises(ClauseViolation, match=r"\[RES-6\] rank 0's batches over 2 jobs"):
        _skewed("furthest_count", tmp_path / "rank1-ahead", ahead=1, restore="rank0")


@pytest.mark.clause("RES-4")
def test_a_loader_that_duplicates_samples_only_when_ranks_and_workers_change_together_is_caught(tmp_path):
    spec = f"{FAULTS}:rewind_on_joint_resize"
    seen = universe(load_adapter(spec), small_corpus(), CONFIG, tmp_path / "universe")
    head = launch(_job("rewind_on_joint_resize", num_workers=4, stop_at=3), tmp_path / "head")
    workers_only = launch(dataclasses.replace(_job("rewind_on_joint_resize", num_workers=2),
                                              resume_from=str(head.checkpoint_dir)), tmp_path / "workers")
    assert grade_topology_change(head, workers_only, universe=seen) == "continued"
    both = launch(dataclasses.replace(_job("rewind_on_joint_resize", world_size=3, batch_size=1, num_workers=2),
                                      resume_from=str(head.checkpoint_dir)), tmp_path / "both")
    with pytest.raises(ClauseViolation, match=r"\[RES-4\] after resuming on 3 processes x batch 1 x 2 workers, "
                                              r"\d+ pairs were trained twice"):
        grade_topology_change(head, both, universe=seen)


def test_an_adapter_declaring_a_bare_assertion_error_as_its_refusal_is_refused_before_any_test(tmp_path):
    with pytest.raises(AdapterError, match=r"'refusal_types' declares the bare builtin\(s\) AssertionError") as info:
        check_adapter(load_adapter(f"{FAULTS}:asserting"), workdir=tmp_path)
    assert "refusal_types = (mylib.StateMismatch,)" in str(info.value)


def test_an_adapter_still_deciding_refusals_with_is_refusal_is_refused_before_any_test(tmp_path):
    with pytest.raises(AdapterError, match=r"it defines is_refusal\(exc\), which the kit no longer reads"):
        check_adapter(load_adapter(f"{FAULTS}:keyerror_on_load"), workdir=tmp_path)


@pytest.mark.clause("RES-4")
def test_a_key_error_on_load_that_is_not_a_declared_refusal_type_fails_showing_the_key_error(tmp_path):
    spec = f"{FAULTS}:keyerror_on_load"
    seen = universe(load_adapter(spec), small_corpus(), CONFIG, tmp_path / "universe")
    head = launch(_job("keyerror_on_load", stop_at=2), tmp_path / "head")
    grown = launch(dataclasses.replace(_job("keyerror_on_load", world_size=3, batch_size=1),
                                       resume_from=str(head.checkpoint_dir)), tmp_path / "grown")
    with pytest.raises(ClauseViolation, match=r"\[RES-4\] loading the state raised an exception that is not one of "
                                              r"the adapter's declared refusal_types, a failure: rank 0 at "
                                              r"load_state_dict: KeyError: 'ex_iterable_idx'"):
        grade_topology_change(head, grown, universe=seen)


def test_the_per_rank_harness_limits_are_multiplied_by_loadspec_timeout_scale(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADSPEC_TIMEOUT_SCALE", "3")
    with pytest.raises(RankTimeout, match=r"did not finish within 6s"):
        launch(_job("hang", wait_timeout=600), tmp_path / "job", timeout=2)
    monkeypatch.setenv("LOADSPEC_TIMEOUT_SCALE", "0")
    with pytest.raises(ConfigError, match=r"LOADSPEC_TIMEOUT_SCALE='0' must be a finite number > 0"):
        launch(_job("hang"), tmp_path / "job2")
