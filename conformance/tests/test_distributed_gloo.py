"""impl's loader in real multi-process gloo jobs: elastic resume (2 → 3, 3 → 2) and a kill -9 mid-epoch.

Each test launches every rank as its own process (``conformance.distributed``),
lets them train in lockstep and checkpoint, then restarts the job from the
last checkpoint, and compares what every rank trained with the reference:
the union over ranks is every sample of the epoch's covered range exactly
once (RES-4, PART-8), and each rank's sequence is the reference's for its
topology (RES-1, PART-9). The store (a few hundred documents) is built once
per module; the kill step is drawn from a fixed seed, so every run is the same.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
import torch.distributed as dist

from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, assert_exactly_once, check
from conformance.distributed import Job, check_token_sums, read_logs, reference_batches, run_job
from reference.loader import ReferenceLoader
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, Topology

pytestmark = [pytest.mark.loadspec_gloo,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]

SEED = 20240611
CONFIG = PipelineConfig(packing=PackingConfig(seq_len=16, mode="concat", pad_id=0),
                        ordering=OrderingConfig(kind="global", seed=11))


@pytest.fixture(autouse=True)
def _only_for_impl(loadspec_adapter):
    """These jobs run impl's loader in every rank; under another ``--loadspec-loader`` they would test nothing new."""
    if loadspec_adapter.name != "impl":
        pytest.skip(f"gloo jobs exercise impl's loader; --loadspec-loader selects {loadspec_adapter.name!r}")


def _corpus() -> list[list[list[int]]]:
    rng = random.Random(SEED)
    return [[[rng.randrange(1, 1000) for _ in range(rng.randrange(0, 40))] for _ in range(rng.randrange(80, 120))]
            for _ in range(3)]


@pytest.fixture(scope="module")
def corpus() -> list[list[list[int]]]:
    return _corpus()


@pytest.fixture(scope="module")
def store_path(corpus, tmp_path_factory) -> str:
    return str(build_store(corpus, tmp_path_factory.mktemp("gloo-store")).path)


def _job(store: str, tmp: Path, run: str, **kw) -> Job:
    return Job(store=store, config=CONFIG.to_json(), log_dir=str(tmp / run), checkpoint=str(tmp / "checkpoint.json"), **kw)


def _elastic(corpus, store_path, tmp: Path, before: tuple[int, int], after: tuple[int, int], k: int) -> None:
    (w1, b1), (w2, b2) = before, after
    first = run_job(_job(store_path, tmp, "run1", batch_size=b1, stop_at=k, checkpoint_every=k), w1, tmp)
    first.check_ok(f"{w1} ranks for {k} steps")
    saved = json.loads((tmp / "checkpoint.json").read_text())
    check(saved["step"] == k and saved["state"]["consumed"] == k * w1 * b1, clause="PART-3",
          what=f"checkpoint {saved} after {k} steps of {w1} ranks x {b1}")
    second = run_job(_job(store_path, tmp, "run2", batch_size=b2, resume_from=str(tmp / "checkpoint.json")), w2, tmp)
    second.check_ok(f"resume on {w2} ranks")
    logs1, logs2 = read_logs(tmp / "run1"), read_logs(tmp / "run2")
    check(sorted(logs1) == list(range(w1)) and sorted(logs2) == list(range(w2)), clause="RES-4",
          what=f"logs of ranks {sorted(logs1)} then {sorted(logs2)}")
    consumed = saved["state"]["consumed"]
    for r in range(w1):
        assert_equal([rec["indices"] for rec in logs1[r]], reference_batches(corpus, CONFIG, Topology(world_size=w1, rank=r, batch_size=b1), steps=k),
                     clause="PART-9", what=f"rank {r} of {w1} before the checkpoint")
    for r in range(w2):
        assert_equal([rec["indices"] for rec in logs2[r]],
                     reference_batches(corpus, CONFIG, Topology(world_size=w2, rank=r, batch_size=b2), consumed=consumed),
                     clause="RES-4", what=f"rank {r} of {w2} after resuming at consumed={consumed}")
    check_token_sums(corpus, CONFIG, logs1, epoch=0)
    check_token_sums(corpus, CONFIG, logs2, epoch=0)
    total = len(ReferenceLoader(corpus, CONFIG).samples(0))
    g2 = w2 * b2
    covered = consumed + (total - consumed) - (total - consumed) % g2
    seen = [i for logs in (logs1, logs2) for records in logs.values() for rec in records for i in rec["indices"]]
    assert_exactly_once(seen, range(covered), clause="RES-4",
                        what=f"samples trained on {w1} ranks then {w2} ranks (epoch of {total})")


@pytest.mark.clause("RES-4", "PART-3", "PART-8")
def test_two_ranks_checkpointed_mid_epoch_resume_on_three_and_train_every_sample_once_gloo(corpus, store_path, tmp_path):
    _elastic(corpus, store_path, tmp_path, before=(2, 4), after=(3, 3), k=6)


@pytest.mark.clause("RES-4", "PART-3", "PART-8")
def test_three_ranks_checkpointed_mid_epoch_resume_on_two_and_train_every_sample_once_gloo(corpus, store_path, tmp_path):
    _elastic(corpus, store_path, tmp_path, before=(3, 2), after=(2, 5), k=5)


KILLS = [(2, 4, 4, 1, 0), (3, 2, 3, 2, 1)]
"""(world size, batch size, checkpoint every, workers, seed offset): the victim and kill step are drawn from SEED."""


@pytest.mark.clause("RES-1", "RES-6", "PART-9")
@pytest.mark.parametrize(("world", "batch", "every", "workers", "offset"), KILLS)
def test_a_rank_killed_with_sigkill_mid_epoch_and_a_restart_from_the_last_checkpoint_reproduce_the_epoch_gloo(
        corpus, store_path, tmp_path, world, batch, every, workers, offset):
    draw = random.Random(SEED + 100 * offset)
    victim, die_at = draw.randrange(world), draw.randrange(every + 1, 6 * every)
    if offset == 0:  # the original draws, kept so the first case is the one this test always ran
        victim, die_at = random.Random(SEED).randrange(world), random.Random(SEED + 1).randrange(every + 1, 6 * every)
    crashed = run_job(_job(store_path, tmp_path, "run1", batch_size=batch, checkpoint_every=every,
                           die_at=(victim, die_at), num_workers=workers), world, tmp_path)
    check(crashed.returncodes[victim] == -signal.SIGKILL, clause="RES-1",
          what=f"rank {victim} was to die by SIGKILL at step {die_at}: {crashed.describe()}")
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    last = (die_at - 1) // every * every
    check(saved["step"] == last, clause="RES-6", what=f"last checkpoint at step {saved['step']}, expected {last}")
    resumed = run_job(_job(store_path, tmp_path, "run2", batch_size=batch, checkpoint_every=every,
                           resume_from=str(tmp_path / "checkpoint.json")), world, tmp_path)
    resumed.check_ok("restart from the last checkpoint")
    logs1, logs2 = read_logs(tmp_path / "run1"), read_logs(tmp_path / "run2")
    check(max(rec["step"] for rec in logs1[victim]) == die_at, clause="RES-1",
          what=f"rank {victim} logged up to step {max(rec['step'] for rec in logs1[victim])}, died at {die_at}")
    kept = {r: [rec for rec in records if rec["step"] <= last] for r, records in logs1.items()}
    for r in range(world):
        trained = [rec["indices"] for rec in kept[r] + logs2[r]]
        assert_equal(trained, reference_batches(corpus, CONFIG, Topology(world_size=world, rank=r, batch_size=batch)),
                     clause="RES-1", what=f"rank {r}'s batches up to the checkpoint plus after the restart")
        check([rec["step"] for rec in logs2[r]][:1] == [last + 1], clause="RES-1",
              what=f"rank {r} restarted at step {[rec['step'] for rec in logs2[r]][:1]}, expected {last + 1}")
    check_token_sums(corpus, CONFIG, kept, epoch=0)
    check_token_sums(corpus, CONFIG, logs2, epoch=0)
    total = len(ReferenceLoader(corpus, CONFIG).samples(0))
    seen = [i for logs in (kept, logs2) for records in logs.values() for rec in records for i in rec["indices"]]
    assert_exactly_once(seen, range(total - total % (world * batch)), clause="PART-8",
                        what="samples trained before the crash (up to the checkpoint) and after the restart")
