"""A two-corpus mixture in real gloo jobs: 2 ranks → checkpoint → 3 ranks, and a kill -9 mid-epoch (MIX-13).

Each rank is a job of the shared harness (``conformance.distributed``: a
fresh interpreter joining a ``file://`` rendezvous under ``tmp_path``, logging
every step, in lockstep, rank 0 checkpointing atomically, every wait with a
timeout and every rank still running killed when one fails); what is this
test's own is the loader, a mixture of two stores with the mixing options
(:func:`rank_loader`), and what a step logs: each sample's global index,
source and index in its source (:func:`rank_record`).
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, assert_exactly_once, check
from conformance.distributed import Job, read_logs, run_job

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


def rank_loader(job: Job) -> Any:
    """Each rank's loader (``Job.build``): the two-store mixture."""
    from impl.loader import build_dataloader

    return build_dataloader(_mixture(job.params["stores"]), batch_size=job.batch_size)


def rank_record(batch: Any) -> dict[str, Any]:
    """Each step's log line (``Job.record``): every sample's global index, source and index in its source."""
    return {"indices": batch["sample_index"].tolist(), "source": batch["source"].tolist(),
            "source_index": batch["source_index"].tolist()}


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


def _job(stores: list[str], tmp: Path, name: str, **kwargs: Any) -> Job:
    fields: dict[str, Any] = {"checkpoint": str(tmp / "ckpt.json")} | kwargs
    return Job(build=f"{__name__}:rank_loader", record=f"{__name__}:rank_record", params={"stores": stores},
               batch_size=2, log_dir=str(tmp / name), **fields)


def test_mixture_resumed_from_2_to_3_ranks_trains_every_mixed_sample_once_gloo(stores, tmp_path):
    first = run_job(_job(stores, tmp_path, "run1", stop_at=4), 2, tmp_path)
    assert first.returncodes == [0, 0], first.describe()
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    assert_equal((saved["step"], saved["state"]["consumed"]), (4, 16), clause="MIX-13", what="checkpoint after 4 steps")
    second = run_job(_job(stores, tmp_path, "run2", resume_from=str(tmp_path / "ckpt.json"),
                          checkpoint=str(tmp_path / "ckpt2.json")), 3, tmp_path)
    assert second.returncodes == [0, 0, 0], second.describe()
    total = _mixture(stores).num_samples(0)
    covered = 16 + (total - 16) - (total - 16) % 6
    _check_epoch(stores, _trained(tmp_path / "run1") + _trained(tmp_path / "run2"), covered, "2 ranks, then 3")


def test_mixture_survives_a_kill_9_and_resumes_on_3_ranks_gloo(stores, tmp_path):
    codes = run_job(_job(stores, tmp_path, "run1", checkpoint_every=3, die_at=(1, 5)), 2, tmp_path).returncodes
    check(codes[1] == -signal.SIGKILL, clause="MIX-13", what=f"rank 1 should die by SIGKILL, exit codes {codes}")
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    assert_equal(saved["step"], 3, clause="MIX-13", what="last checkpoint before the kill")
    second = run_job(_job(stores, tmp_path, "run2", resume_from=str(tmp_path / "ckpt.json"),
                          checkpoint=str(tmp_path / "ckpt2.json")), 3, tmp_path)
    assert second.returncodes == [0, 0, 0], second.describe()
    total = _mixture(stores).num_samples(0)
    consumed = saved["state"]["consumed"]
    covered = consumed + (total - consumed) - (total - consumed) % 6
    _check_epoch(stores, _trained(tmp_path / "run1", upto=3) + _trained(tmp_path / "run2"), covered,
                 "2 ranks to the checkpoint before the kill, then 3")
