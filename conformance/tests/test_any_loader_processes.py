"""The any-loader properties with every rank in its own process (``conformance.ranks``): for any adapter.

Why beside the in-process suite: a loader that needs one process per rank
(it reads ``RANK``/``WORLD_SIZE`` or the process group, shares memory between
local ranks) can only be graded this way, and a real job is where ranks that
disagree hang. Each test launches the adapter's loader in 2 or 3 processes
that join through a file rendezvous, train in lockstep, checkpoint and are
restarted as new processes; the parent grades what they logged across ranks
(provenance, equal steps, at most once, fewer than one global batch lost,
exact resume, refusal or exactness after a change of world size). A hang is
a :class:`conformance.ranks.RankTimeout` naming the rank that waited.

The corpus and the steps are fixed (a seeded corpus, one config the adapter
declares), so every run is the same and short.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from conformance.adapter import required_capabilities
from conformance.plugin import load_adapter
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
        self._whole: dict[tuple[int, int], object] = {}
        self._universe = None
        self._launches = 0

    def job(self, world_size: int, batch_size: int, **kw) -> RankJob:
        assert self.config is not None
        return RankJob(loader=self.spec, corpus=self.corpus, config=self.config.to_json(), world_size=world_size,
                       batch_size=batch_size, node_dir=str(self.workdir / "node"), wait_timeout=60.0, **kw)

    def launch(self, job: RankJob):
        self._launches += 1
        return launch(job, self.workdir / f"job{self._launches}-w{job.world_size}", timeout=TIMEOUT)

    def whole(self, world_size: int, batch_size: int):
        """The uninterrupted epoch on ``world_size`` processes (launched once per module)."""
        key = (world_size, batch_size)
        if key not in self._whole:
            self._whole[key] = self.launch(self.job(world_size, batch_size))
        return self._whole[key]

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
    grade_epoch(driven.whole(world, batch), universe=driven.universe())


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


@pytest.mark.clause("RES-4", "PART-3", "PART-8")
@pytest.mark.loadspec_capability("resume")
@pytest.mark.parametrize(("before", "after", "restore"), [((2, 2), (3, 1), "own"), ((3, 1), (2, 3), "rank0")])
def test_a_checkpoint_loaded_by_another_number_of_processes_is_refused_or_continues_exactly_once(
        driven, before, after, restore):
    whole = driven.whole(*before)
    head = driven.launch(driven.job(*before, stop_at=max(1, min(whole.steps) // 2)))
    resumed = driven.launch(dataclasses.replace(driven.job(*after, restore=restore),
                                                resume_from=str(head.checkpoint_dir)))
    grade_topology_change(head, resumed, universe=driven.universe())
