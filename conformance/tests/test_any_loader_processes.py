"""The any-loader properties with every rank in its own process (``conformance.ranks``): for any adapter.

Why beside the in-process suite: a loader that needs one process per rank
(it reads ``RANK``/``WORLD_SIZE`` or the process group, shares memory between
local ranks) can only be graded this way, and a real job is where ranks that
disagree hang. Each test launches the adapter's loader in 2 or 3 processes
that join through a file rendezvous, train in lockstep, checkpoint and are
restarted as new processes; the parent grades what they logged across ranks
(provenance, equal steps, at most once, fewer than one global batch lost,
exact resume, refusal or exactness after a change of world size, of workers,
or of both). A hang is a :class:`conformance.ranks.RankTimeout` naming the
rank that waited.

Every test here runs one process per rank: for a loader whose ranks cannot
share a process (``process_group``, ``limits["max_world_size"] == 1``:
MosaicML, LitData) these are the only tests that grade more than one rank,
among them the lockstep skew in both directions (rank 0, or another rank, one
batch ahead at the checkpoint), which catches a state counted on one rank and
scaled by the number of ranks, and the resizes of ranks and workers together
and of workers alone, each its own test so the matrix reports it as its own row.

The corpus and the steps are fixed (a seeded corpus, one config the adapter
declares), so every run is the same and short.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from conformance.adapter import required_capabilities
from conformance.plugin import load_adapter
from conformance.provenance import declared_coverage
from conformance.ranks import RankJob, grade_epoch, grade_resume, grade_topology_change, launch, universe
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, Topology

pytestmark = pytest.mark.loadspec_processes

SEED = 20240917
TIMEOUT = 120.0
"""Seconds one job may take: a hang costs this much, never more (a job here takes a few seconds)."""


def _corpus() -> list[list[list[int]]]:
    rng = random.Random(SEED)
    return [[[rng.randrange(1, 1000) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(10, 14))]
            for _ in range(3)]


def _candidates() -> list[PipelineConfig]:
    return [PipelineConfig(packing=PackingConfig(seq_len=8, mode=mode, pad_id=0),
                           ordering=OrderingConfig(kind=kind, seed=11))
            for mode in ("concat", "chunk", "greedy", "none") for kind in ("global", "sequential")]


class Kit:
    """The loader under test, the config it is driven with, and the runs shared by this module's tests."""

    def __init__(self, spec: str, workdir: Path) -> None:
        self.spec, self.workdir = spec, workdir
        self.adapter = load_adapter(spec)
        caps = self.adapter.capabilities
        self.config = next((c for c in _candidates()
                            if required_capabilities(c, Topology(world_size=2), caps) <= caps), None)
        self.corpus = _corpus()
        self._whole: dict[tuple[int, int, int], object] = {}
        self._universe = None
        self._launches = 0

    def job(self, world_size: int, batch_size: int, **kw) -> RankJob:
        assert self.config is not None
        return RankJob(loader=self.spec, corpus=self.corpus, config=self.config.to_json(), world_size=world_size,
                       batch_size=batch_size, node_dir=str(self.workdir / "node"), wait_timeout=60.0,
                       global_state="state:global" in self.adapter.capabilities, **kw)

    def launch(self, job: RankJob):
        self._launches += 1
        return launch(job, self.workdir / f"job{self._launches}-w{job.world_size}", timeout=TIMEOUT)

    def whole(self, world_size: int, batch_size: int, num_workers: int = 0):
        """The uninterrupted epoch on ``world_size`` processes (launched once per module)."""
        key = (world_size, batch_size, num_workers)
        if key not in self._whole:
            self._whole[key] = self.launch(self.job(world_size, batch_size, num_workers=num_workers))
        return self._whole[key]

    def coverage(self, world_size: int, batch_size: int, num_workers: int = 0, state=None):
        """The account the adapter declares for its own end rule (``declared_coverage``), of epoch 0 or from ``state``."""
        assert self.config is not None
        return declared_coverage(self.adapter, self.corpus, self.config,
                                 Topology(world_size=world_size, batch_size=batch_size, num_workers=num_workers),
                                 state=state)

    def universe(self):
        if self._universe is None:
            self._universe = universe(self.adapter, self.corpus, self.config, self.workdir / "universe")
        return self._universe


@pytest.fixture(scope="module")
def kit(loadspec_loader_spec, tmp_path_factory) -> Kit:
    return Kit(loadspec_loader_spec, tmp_path_factory.mktemp("ranks"))


@pytest.fixture
def driven(kit, loadspec_adapter) -> Kit:
    if kit.config is None:
        pytest.skip(f"loader {kit.adapter.name!r} declares none of the packing/ordering pairs the process harness "
                    "drives (concat, chunk, greedy or none; global or sequential)")
    return kit


@pytest.mark.clause("PART-1", "PACK-4", "PACK-7")
@pytest.mark.parametrize(("world", "batch"), [(2, 2), (3, 1)])
def test_ranks_in_separate_processes_run_equal_steps_and_train_every_pair_at_most_once(driven, world, batch):
    grade_epoch(driven.whole(world, batch), universe=driven.universe(), coverage=driven.coverage(world, batch))


@pytest.mark.clause("RES-1", "RES-6")
@pytest.mark.loadspec_capability("resume")
def test_ranks_restarted_as_new_processes_from_their_checkpoints_continue_the_stream_also_when_restarted_twice(driven):
    whole = driven.whole(2, 2)
    k = max(1, min(whole.steps) // 3)
    parts = [driven.launch(driven.job(2, 2, stop_at=k))]
    for stop_at in (k, None):
        if not parts[-1].checkpointed:  # the job ended before its checkpoint: its stream must be the whole rest
            break
        parts.append(driven.launch(driven.job(2, 2, stop_at=stop_at, resume_from=str(parts[-1].checkpoint_dir))))
    grade_resume(whole, parts)


@pytest.mark.clause("RES-1", "RES-6")
@pytest.mark.loadspec_capability("resume")
@pytest.mark.parametrize("ahead", [1, 0])
def test_a_rank_one_batch_ahead_at_the_checkpoint_resumes_from_its_own_state_exactly_where_it_stopped(driven, ahead):
    """Lockstep skew both ways, each rank restoring its own state: each state counts that rank's batches (RES-6).

    A state that is rank 0's count times the number of ranks on every rank repeats the batch rank 1 took ahead.
    """
    whole = driven.whole(2, 2)
    head = driven.launch(driven.job(2, 2, stop_at=max(1, min(whole.steps) // 3), ahead=ahead))
    rest = driven.launch(driven.job(2, 2, resume_from=str(head.checkpoint_dir)))
    grade_resume(whole, [head, rest])


@pytest.mark.clause("RES-1", "RES-6")
@pytest.mark.loadspec_capability("resume")
def test_ranks_restoring_rank_0s_state_while_rank_1_was_ahead_continue_from_rank_0s_count_exactly(driven):
    """The checkpoint is rank 0's cut: rank 1 redoes the batch it took past it, every other batch comes once.

    A state that counts the furthest rank (or rank 1's) on rank 0 skips rank 0's batches past its own count.
    """
    whole = driven.whole(2, 2)
    head = driven.launch(driven.job(2, 2, stop_at=max(1, min(whole.steps) // 3), ahead=1))
    rest = driven.launch(driven.job(2, 2, resume_from=str(head.checkpoint_dir), restore="rank0"))
    grade_resume(whole, [head, rest])


def _topology_change(driven, before, after, restore="own", ahead=None) -> None:
    whole = driven.whole(*before)
    head = driven.launch(driven.job(*before[:2], num_workers=before[2] if len(before) > 2 else 0,
                                    stop_at=max(1, min(whole.steps) // 2), ahead=ahead))
    resumed = driven.launch(dataclasses.replace(
        driven.job(*after[:2], num_workers=after[2] if len(after) > 2 else 0, restore=restore),
        resume_from=str(head.checkpoint_dir)))
    coverage = None
    if head.checkpointed and "state:global" in driven.adapter.capabilities:
        state = json.loads((head.checkpoint_dir / "rank0.json").read_text(encoding="utf-8"))["state"]
        coverage = driven.coverage(*after[:2], num_workers=after[2] if len(after) > 2 else 0, state=state)
    grade_topology_change(head, resumed, universe=driven.universe(), coverage=coverage)


@pytest.mark.clause("RES-4", "PART-3", "PART-8")
@pytest.mark.loadspec_capability("resume")
@pytest.mark.parametrize(("before", "after", "restore", "ahead"), [
    ((2, 2), (3, 1), "own", None), ((3, 1), (2, 3), "rank0", None), ((3, 1), (2, 2), "rank0", 2)])
def test_a_checkpoint_loaded_by_another_number_of_processes_is_refused_or_continues_exactly_once(
        driven, before, after, restore, ahead):
    _topology_change(driven, before, after, restore, ahead)


@pytest.mark.clause("RES-4", "RES-5", "PART-8")
@pytest.mark.loadspec_capability("resume", "workers")
def test_a_checkpoint_loaded_with_other_ranks_and_other_workers_is_refused_or_continues_exactly_once(driven):
    """2 ranks x 4 workers resumed on 3 ranks x 2 workers: both counts change at once."""
    _topology_change(driven, (2, 2, 4), (3, 1, 2))


@pytest.mark.clause("RES-4", "RES-5", "PART-8")
@pytest.mark.loadspec_capability("resume", "workers")
def test_a_checkpoint_loaded_with_another_number_of_workers_on_the_same_ranks_is_refused_or_continues_exactly_once(
        driven):
    """2 ranks with no worker resumed on 2 ranks with 2 workers each: only the worker count changes."""
    _topology_change(driven, (2, 2, 0), (2, 2, 2))
