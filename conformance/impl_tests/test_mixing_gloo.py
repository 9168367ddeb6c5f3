"""A two-corpus mixture in real gloo jobs: 2 ranks → checkpoint → 3 ranks, and a kill -9 mid-epoch (MIX-13).

Why its own rank body: ``conformance.distributed.run_rank`` trains one
``PackedDataset``; a mixture needs two stores and the mixing options. The
rank body here is the same loop (log every step, all_reduce in lockstep,
rank 0 checkpoints atomically); each rank is a fresh interpreter (as under
``spawn``) joining a ``file://`` rendezvous under ``tmp_path``, every wait has
a timeout and every rank still running is killed when one fails,
and the logs are read with ``conformance.distributed.read_logs``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, assert_exactly_once, check
from conformance.distributed import JOIN_TIMEOUT, REPO_ROOT, read_logs

pytestmark = [pytest.mark.loadspec_gloo,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]

SEQ_LEN = 8
WEIGHTS = (0.75, 0.25)


def _corpora() -> list[list[list[list[int]]]]:
    web = [[[1 + (d * 7 + t) % 900 for t in range(3 + d % 11)] for d in range(f * 40, f * 40 + 40)] for f in range(3)]
    code = [[[1000 + (d * 5 + t) % 900 for t in range(2 + d % 13)] for d in range(60)]]
    return [web, code]


def _mixture(stores: list[str]) -> Any:
    from impl.dataset import PackedDataset
    from impl.mixed_dataset import MixedDataset

    sources = [PackedDataset(path, seq_len=SEQ_LEN, packing="concat", shuffle="global", seed=3 + i, cache_dir=False,
                             split="train[:90%]" if i == 0 else None)
               for i, path in enumerate(stores)]
    return MixedDataset(sources, weights=WEIGHTS, stopping="all_exhausted", seed=9)


def rank_main(job_path: str, rank: int) -> None:
    """One rank: join the group, resume if asked, train the mixture, log and checkpoint (as conformance.distributed)."""
    import torch

    from impl._atomic import atomic_write_json
    from impl.loader import build_dataloader

    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=job["init_method"], rank=rank, world_size=job["world_size"],
                            timeout=timedelta(seconds=60))
    try:
        loader = build_dataloader(_mixture(job["stores"]), batch_size=job["batch_size"])
        step = 0
        if job["resume_from"]:
            saved = json.loads(Path(job["resume_from"]).read_text())
            loader.load_state_dict(saved["state"])
            step = saved["step"]
        log_path = Path(job["log_dir"]) / f"rank{rank}.jsonl"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            for batch in loader:
                step += 1
                log.write(json.dumps({"step": step, "indices": batch["sample_index"].tolist(),
                                      "source": batch["source"].tolist(),
                                      "source_index": batch["source_index"].tolist()}) + "\n")
                log.flush()
                if job["die_at"] is not None and tuple(job["die_at"]) == (rank, step):
                    os.kill(os.getpid(), signal.SIGKILL)
                dist.all_reduce(torch.tensor([1.0]))
                if step % job["checkpoint_every"] == 0:
                    dist.barrier()
                    if rank == 0:
                        atomic_write_json(job["checkpoint"], {"step": step, "state": loader.state_dict()})
                if job["stop_at"] is not None and step >= job["stop_at"]:
                    break
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _launch(job: dict[str, Any], world_size: int, workdir: Path, name: str) -> list[int]:
    """Every rank as its own process; all killed when one fails or JOIN_TIMEOUT passes. Returns exit codes."""
    job = dict(job, world_size=world_size, init_method=f"file://{workdir / ('rendezvous-' + name)}")
    job_file = workdir / f"job-{name}.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    code = "import sys; from conformance.impl_tests.test_mixing_gloo import rank_main; rank_main(sys.argv[1], int(sys.argv[2]))"
    with contextlib.ExitStack() as files:
        errs = [files.enter_context(open(workdir / f"stderr-{name}-{r}.txt", "w+b")) for r in range(world_size)]
        procs = [subprocess.Popen([sys.executable, "-c", code, str(job_file), str(r)], cwd=REPO_ROOT, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errs[r])
                 for r in range(world_size)]
        deadline = time.monotonic() + JOIN_TIMEOUT
        try:
            while time.monotonic() < deadline:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(timeout=30)
    return [p.returncode for p in procs]


def _stderr(workdir: Path, name: str) -> str:
    return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(workdir.glob(f"stderr-{name}-*.txt")))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("mix-gloo")
    return [str(build_store(c, root).path) for c in _corpora()]


def _trained(log_dir: Path, upto: int | None = None) -> list[tuple[int, int, int]]:
    rows = []
    for records in read_logs(log_dir).values():
        for rec in records:
            if upto is None or rec["step"] <= upto:
                rows.extend(zip(rec["indices"], rec["source"], rec["source_index"]))
    return rows


def _check_epoch(stores: list[str], rows: list[tuple[int, int, int]], covered: int, what: str) -> None:
    mixed = _mixture(stores)
    plan = mixed.plan(0)
    assert_exactly_once([i for i, _, _ in rows], range(covered), clause="MIX-13", what=what)
    assert_equal(sorted(rows), sorted((i, int(plan.source[i]), int(plan.item[i])) for i in range(covered)),
                 clause="MIX-13", what="source and source sample of every trained row")
    counts = Counter(s for _, s, _ in rows)
    sizes = mixed.source_sizes(0)
    check(all(counts[s] <= sizes[s] for s in range(2)), clause="MIX-7", what=f"per-source counts {counts} vs {sizes}")
    last_items = [int(np.flatnonzero(plan.source == s)[sizes[s] - 1]) for s in range(2)]
    prefix = plan.source[:min(last_items)]   # both sources still drawn with their weights (MIX-7)
    share, p = float((prefix == 0).mean()), WEIGHTS[0] / sum(WEIGHTS)
    check(abs(share - p) <= 4 * math.sqrt(p * (1 - p) / len(prefix)), clause="MIX-3",
          what=f"source 0 holds {share:.3f} of the {len(prefix)} samples drawn before a source ran out, weight {p}")


def _job(stores: list[str], tmp: Path, name: str, **kwargs: Any) -> dict[str, Any]:
    return {"stores": stores, "batch_size": 2, "log_dir": str(tmp / name), "checkpoint": str(tmp / "ckpt.json"),
            "checkpoint_every": 1, "stop_at": None, "resume_from": None, "die_at": None} | kwargs


def test_mixture_resumed_from_2_to_3_ranks_trains_every_mixed_sample_once_gloo(stores, tmp_path):
    first = _launch(_job(stores, tmp_path, "run1", stop_at=4), 2, tmp_path, "run1")
    assert first == [0, 0], _stderr(tmp_path, "run1")
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    assert_equal((saved["step"], saved["state"]["consumed"]), (4, 16), clause="MIX-13", what="checkpoint after 4 steps")
    second = _launch(_job(stores, tmp_path, "run2", resume_from=str(tmp_path / "ckpt.json"),
                          checkpoint=str(tmp_path / "ckpt2.json")), 3, tmp_path, "run2")
    assert second == [0, 0, 0], _stderr(tmp_path, "run2")
    total = _mixture(stores).num_samples(0)
    covered = 16 + (total - 16) - (total - 16) % 6
    _check_epoch(stores, _trained(tmp_path / "run1") + _trained(tmp_path / "run2"), covered, "2 ranks, then 3")


def test_mixture_survives_a_kill_9_and_resumes_on_3_ranks_gloo(stores, tmp_path):
    codes = _launch(_job(stores, tmp_path, "run1", checkpoint_every=3, die_at=(1, 5)), 2, tmp_path, "run1")
    check(codes[1] == -signal.SIGKILL, clause="MIX-13", what=f"rank 1 should die by SIGKILL, exit codes {codes}")
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    assert_equal(saved["step"], 3, clause="MIX-13", what="last checkpoint before the kill")
    second = _launch(_job(stores, tmp_path, "run2", resume_from=str(tmp_path / "ckpt.json"),
                          checkpoint=str(tmp_path / "ckpt2.json")), 3, tmp_path, "run2")
    assert second == [0, 0, 0], _stderr(tmp_path, "run2")
    total = _mixture(stores).num_samples(0)
    consumed = saved["state"]["consumed"]
    covered = consumed + (total - consumed) - (total - consumed) % 6
    _check_epoch(stores, _trained(tmp_path / "run1", upto=3) + _trained(tmp_path / "run2"), covered,
                 "2 ranks to the checkpoint before the kill, then 3")
