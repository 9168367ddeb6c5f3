"""A remote store (``file://`` through :class:`impl.remote.RemoteFiles`) in real gloo jobs sharing one node cache.

Each rank is its own process (``conformance.distributed``) opening the store
by URL with one shared ``local`` cache directory whose ``cache_limit`` holds
what every reader of the node needs (``LOCAL_WORLD_SIZE`` ranks x DataLoader
workers, three token files each) but fewer token files than the store has,
so files are evicted and downloaded again within every epoch, while 2 ranks
x 2 DataLoader workers read concurrently (each worker predownloading its own
next samples' files). The jobs checkpoint, resume on another world size, or
die by SIGKILL in the middle of a download and restart from the last
checkpoint; in every case the union
of what the ranks trained is the epoch exactly once (RES-4, PART-8), each
sample's tokens are the reference's (RES-1), and the cache ends within its
limit with no partial file and only copies equal to the remote objects.
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
from impl.cache import STATE_DIR
from reference.loader import ReferenceLoader
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, Topology

pytestmark = [pytest.mark.loadspec_gloo,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]

SEED = 20261126
CONFIG = PipelineConfig(packing=PackingConfig(seq_len=64, mode="concat", pad_id=0),
                        ordering=OrderingConfig(kind="window", window=1, seed=5))
"""Files in a shuffled order, each read through before the next: what a bounded cache is for."""


def _corpus() -> list[list[list[int]]]:
    rng = random.Random(SEED)
    return [[[rng.randrange(1, 1000) for _ in range(rng.randrange(100, 300))] for _ in range(8)] for _ in range(30)]


@pytest.fixture(scope="module")
def corpus() -> list[list[list[int]]]:
    return _corpus()


@pytest.fixture(scope="module")
def remote(corpus, tmp_path_factory) -> Path:
    return Path(build_store(corpus, tmp_path_factory.mktemp("remote-gloo")).path)


def _limit(remote: Path, readers: int) -> int:
    """What ``readers`` readers of the node need: the tables and each reader's three files (the largest), no more.

    Checked to hold fewer token files than the store has, so files are evicted.
    """
    sizes = {p.name: p.stat().st_size for p in remote.iterdir() if p.is_file()}
    tables = sum(s for n, s in sizes.items() if not n.endswith(".arrow"))
    tokens = sorted((s for n, s in sizes.items() if n.endswith(".arrow")), reverse=True)
    assert 3 * readers < len(tokens), (readers, len(tokens))
    return tables + sum(tokens[:3 * readers])


def _job(remote: Path, tmp: Path, run: str, readers: int, **kw) -> Job:
    return Job(store=f"file://{remote}", config=CONFIG.to_json(), log_dir=str(tmp / run),
               checkpoint=str(tmp / "checkpoint.json"), plans_dir=str(tmp / "plans"),
               open_kwargs={"local": str(tmp / "cache"), "cache_limit": _limit(remote, readers),
                            "download_timeout": 20},
               **kw)


def _check_cache(remote: Path, cache: Path, readers: int) -> None:
    """Within the limit, no partial left, fewer token files than the store's (so some were evicted), all intact."""
    check(not list((cache / STATE_DIR / "partial").iterdir()), clause="RES-4",
          what=f"partial files left in the cache: {list((cache / STATE_DIR / 'partial').iterdir())}")
    cached = [p for p in cache.iterdir() if p.is_file()]
    check(sum(p.stat().st_size for p in cached) <= _limit(remote, readers), clause="RES-4",
          what=f"cache holds {sum(p.stat().st_size for p in cached)} bytes, limit {_limit(remote, readers)}")
    tokens = [p for p in cached if p.name.endswith(".arrow")]
    check(0 < len(tokens) < len(list(remote.glob("*.arrow"))), clause="RES-4",
          what=f"{len(tokens)} token files cached after reading all {len(list(remote.glob('*.arrow')))}")
    for p in cached:
        check(p.read_bytes() == (remote / p.name).read_bytes(), clause="RES-1", what=f"cached copy of {p.name}")


@pytest.mark.clause("RES-4", "PART-3", "PART-8")
def test_two_ranks_with_two_workers_sharing_an_evicting_cache_resume_on_three_and_train_every_sample_once_gloo(
        corpus, remote, tmp_path, monkeypatch):
    (w1, b1), (w2, b2), k = (2, 4), (3, 3), 10
    readers = w2 * 2                                     # the most that share the cache: 3 ranks x 2 workers
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(w1))      # every rank on this node: its readers count
    first = run_job(_job(remote, tmp_path, "run1", readers, batch_size=b1, stop_at=k, checkpoint_every=5,
                         num_workers=2), w1, tmp_path)
    first.check_ok(f"{w1} ranks x 2 workers for {k} steps")
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    check(saved["step"] == k and saved["state"]["consumed"] == k * w1 * b1, clause="PART-3", what=f"checkpoint {saved}")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(w2))
    second = run_job(_job(remote, tmp_path, "run2", readers, batch_size=b2, checkpoint_every=1000, num_workers=2,
                          resume_from=str(tmp_path / "checkpoint.json")), w2, tmp_path)
    second.check_ok(f"resume on {w2} ranks x 2 workers")
    logs1, logs2 = read_logs(tmp_path / "run1"), read_logs(tmp_path / "run2")
    consumed = saved["state"]["consumed"]
    for r in range(w1):
        assert_equal([rec["indices"] for rec in logs1[r]],
                     reference_batches(corpus, CONFIG, Topology(world_size=w1, rank=r, batch_size=b1), steps=k),
                     clause="PART-9", what=f"rank {r} of {w1} before the checkpoint")
    for r in range(w2):
        assert_equal([rec["indices"] for rec in logs2[r]],
                     reference_batches(corpus, CONFIG, Topology(world_size=w2, rank=r, batch_size=b2), consumed=consumed),
                     clause="RES-4", what=f"rank {r} of {w2} after resuming at consumed={consumed}")
    check_token_sums(corpus, CONFIG, logs1)
    check_token_sums(corpus, CONFIG, logs2)
    total = len(ReferenceLoader(corpus, CONFIG).samples(0))
    covered = total - (total - consumed) % (w2 * b2)
    seen = [i for logs in (logs1, logs2) for records in logs.values() for rec in records for i in rec["indices"]]
    assert_exactly_once(seen, range(covered), clause="RES-4", what=f"samples of an epoch of {total}, 2 then 3 ranks")
    _check_cache(remote, tmp_path / "cache", readers)


@pytest.mark.clause("RES-1", "RES-6", "PART-8")
def test_a_rank_killed_mid_download_leaves_a_partial_the_restart_removes_and_the_epoch_is_trained_once_gloo(
        corpus, remote, tmp_path, monkeypatch):
    world, batch, every, after = 2, 4, 2, 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    crashed = run_job(_job(remote, tmp_path, "run1", world, batch_size=batch, checkpoint_every=every,
                           die_downloading_after=after), world, tmp_path)
    check(-signal.SIGKILL in crashed.returncodes, clause="RES-1",
          what=f"a rank was to die by SIGKILL mid-download after step {after}: {crashed.describe()}")
    partials = list((tmp_path / "cache" / STATE_DIR / "partial").iterdir())
    sizes = {p.name: p.stat().st_size for p in partials}
    check(len(partials) >= 1 and all(0 < s < int(n.split(",")[4]) for n, s in sizes.items()), clause="RES-1",
          what=f"the killed download's partial (half its bytes) is in the cache: {sizes}")
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    last = saved["step"]
    check(last >= every and last % every == 0, clause="RES-6", what=f"last checkpoint at step {last}")
    resumed = run_job(_job(remote, tmp_path, "run2", world, batch_size=batch, checkpoint_every=1000,
                           resume_from=str(tmp_path / "checkpoint.json")), world, tmp_path)
    resumed.check_ok("restart from the last checkpoint")
    logs1, logs2 = read_logs(tmp_path / "run1"), read_logs(tmp_path / "run2")
    kept = {r: [rec for rec in records if rec["step"] <= last] for r, records in logs1.items()}
    for r in range(world):
        assert_equal([rec["indices"] for rec in kept[r] + logs2[r]],
                     reference_batches(corpus, CONFIG, Topology(world_size=world, rank=r, batch_size=batch)),
                     clause="RES-1", what=f"rank {r}'s batches up to the checkpoint plus after the restart")
    check_token_sums(corpus, CONFIG, kept)
    check_token_sums(corpus, CONFIG, logs2)
    total = len(ReferenceLoader(corpus, CONFIG).samples(0))
    seen = [i for logs in (kept, logs2) for records in logs.values() for rec in records for i in rec["indices"]]
    assert_exactly_once(seen, range(total - total % (world * batch)), clause="PART-8",
                        what="samples trained before the crash (up to the checkpoint) and after the restart")
    _check_cache(remote, tmp_path / "cache", world)
