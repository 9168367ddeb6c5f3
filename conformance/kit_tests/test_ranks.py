"""The per-rank harness reports what a real job would hit: a hang names the rank that waited, a crash its rank.

Also: the worked third-party example passes the harness's any-loader
checks, and a loader that reads ``torch.distributed`` finds a process group
matching its topology.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from conformance.assertions import ClauseViolation
from conformance.plugin import load_adapter
from conformance.ranks import (
    RankFailed,
    RankJob,
    RankTimeout,
    grade_epoch,
    grade_resume,
    grade_topology_change,
    launch,
    universe,
)
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig

pytestmark = pytest.mark.loadspec_processes

CONFIG = PipelineConfig(packing=PackingConfig(seq_len=4, mode="concat", pad_id=0),
                        ordering=OrderingConfig(kind="global", seed=3))


def _corpus() -> list[list[list[int]]]:
    rng = random.Random(7)
    return [[[rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))] for _ in range(8)] for _ in range(2)]


def _job(loader: str, **kw) -> RankJob:
    kw.setdefault("world_size", 2)
    kw.setdefault("batch_size", 2)
    return RankJob(loader=loader, corpus=_corpus(), config=CONFIG.to_json(), **kw)


def test_a_rank_that_hangs_is_reported_as_a_timeout_naming_the_rank_that_waited_and_what_it_waited_for(tmp_path):
    with pytest.raises(RankTimeout) as info:
        launch(_job("conformance.kit_tests.rank_faults:hang", wait_timeout=3), tmp_path / "job", timeout=120)
    text = str(info.value)
    assert "rank 0 waited" in text and "at the join after step 2 for rank(s) [1]" in text, text
    assert "rank 1 was 'next batch (step 2)'" in text, text


def test_a_job_past_its_deadline_is_killed_and_reported_with_every_rank_still_running(tmp_path):
    with pytest.raises(RankTimeout) as info:
        launch(_job("conformance.kit_tests.rank_faults:hang", wait_timeout=600), tmp_path / "job", timeout=8)
    text = str(info.value)
    assert "did not finish within 8s" in text and "rank 1 was 'next batch (step 2)'" in text, text


def test_a_rank_that_raises_fails_the_job_with_its_traceback_and_the_other_ranks_phases(tmp_path):
    with pytest.raises(RankFailed) as info:
        launch(_job("conformance.kit_tests.rank_faults:crash"), tmp_path / "job", timeout=120)
    text = str(info.value)
    assert "rank(s) [1] of 2 failed" in text and "crashed on purpose at step 2" in text, text


def test_a_rank_with_one_batch_more_than_the_others_is_reported_as_a_collective_that_would_hang(tmp_path):
    run = launch(_job("conformance.kit_tests.rank_faults:extra"), tmp_path / "job", timeout=120)
    assert list(run.unmatched()) == [0] and run.steps[0] == run.steps[1] + 1
    with pytest.raises(ClauseViolation, match=r"\[PART-1\].*rank 0 has a batch for step \d+ but rank\(s\) 1 finished"):
        grade_epoch(run)


def test_a_loader_that_reads_torch_distributed_finds_a_process_group_matching_its_rank_gloo(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    run = launch(_job("conformance.kit_tests.rank_faults:process_group"), tmp_path / "job", timeout=180)
    grade_epoch(run)


def test_the_worked_third_party_example_passes_the_per_rank_harness(tmp_path):
    spec = "conformance.examples.third_party:adapter"
    seen = universe(load_adapter(spec), _corpus(), CONFIG, tmp_path / "universe")
    whole = launch(_job(spec), tmp_path / "whole")
    grade_epoch(whole, universe=seen)
    head = launch(_job(spec, stop_at=2), tmp_path / "head")
    rest = launch(_job(spec, resume_from=str(head.checkpoint_dir)), tmp_path / "rest")
    grade_resume(whole, [head, rest])
    grown = launch(dataclasses.replace(_job(spec, world_size=3, batch_size=1), resume_from=str(head.checkpoint_dir)),
                   tmp_path / "grown")
    assert grade_topology_change(head, grown, universe=seen) == "continued"
