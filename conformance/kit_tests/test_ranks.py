"""The per-rank harness reports what a real job would hit: a hang names the rank that waited, a crash its rank.

Also: the worked third-party example passes the harness's any-loader
checks, and a loader that reads ``torch.distributed`` finds a process group
matching its topology.
"""

from __future__ import annotations

import dataclasses

import pytest

from conformance.assertions import ClauseViolation
from conformance.kit_tests.rank_faults import CONFIG, small_corpus, small_job
from conformance.plugin import load_adapter
from conformance.ranks import (
    RankFailed,
    RankTimeout,
    grade_epoch,
    grade_resume,
    grade_topology_change,
    launch,
    universe,
)

pytestmark = pytest.mark.loadspec_processes






def test_a_rank_that_hangs_is_reported_as_a_timeout_naming_the_rank_that_waited_and_what_it_waited_for(tmp_path):
    with pytest.raises(RankTimeout) as info:
        launch(small_job("conformance.kit_tests.rank_faults:hang", wait_timeout=3), tmp_path / "job", timeout=120)
    text = str(info.value)
    assert "rank 0 waited" in text and "at the join after step 2 for rank(s) [1]" in text, text
    assert "rank 1 was 'next batch (step 2)'" in text, text


def test_a_job_past_its_deadline_is_killed_and_reported_with_every_rank_still_running(tmp_path):
    with pytest.raises(RankTimeout) as info:
        launch(small_job("conformance.kit_tests.rank_faults:hang", wait_timeout=600), tmp_path / "job", timeout=8)
    text = str(info.value)
    assert "did not finish within 8s" in text and "rank 1 was 'next batch (step 2)'" in text, text


def test_a_rank_that_raises_fails_the_job_with_its_traceback_and_the_other_ranks_phases(tmp_path):
    with pytest.raises(RankFailed) as info:
        launch(small_job("conformance.kit_tests.rank_faults:crash"), tmp_path / "job", timeout=120)
    text = str(info.value)
    assert "rank(s) [1] of 2 failed" in text and "crashed on purpose at step 2" in text, text


def test_a_rank_with_one_batch_more_than_the_others_is_reported_as_a_collective_that_would_hang(tmp_path):
    run = launch(small_job("conformance.kit_tests.rank_faults:extra"), tmp_path / "job", timeout=120)
    assert list(run.unmatched()) == [0] and run.steps[0] == run.steps[1] + 1
    with pytest.raises(ClauseViolation, match=r"\[PART-1\].*rank 0 has a batch for step \d+ but rank\(s\) 1 finished"):
        grade_epoch(run)


def test_a_loader_that_reads_torch_distributed_finds_a_process_group_matching_its_rank_gloo(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    run = launch(small_job("conformance.kit_tests.rank_faults:process_group"), tmp_path / "job", timeout=180)
    grade_epoch(run)


def test_the_worked_third_party_example_passes_the_per_rank_harness(tmp_path):
    spec = "conformance.examples.third_party:adapter"
    seen = universe(load_adapter(spec), small_corpus(), CONFIG, tmp_path / "universe")
    whole = launch(small_job(spec), tmp_path / "whole")
    grade_epoch(whole, universe=seen)
    head = launch(small_job(spec, stop_at=2), tmp_path / "head")
    rest = launch(small_job(spec, resume_from=str(head.checkpoint_dir)), tmp_path / "rest")
    grade_resume(whole, [head, rest])
    grown = launch(dataclasses.replace(small_job(spec, world_size=3, batch_size=1), resume_from=str(head.checkpoint_dir)),
                   tmp_path / "grown")
    assert grade_topology_change(head, grown, universe=seen) == "continued"
