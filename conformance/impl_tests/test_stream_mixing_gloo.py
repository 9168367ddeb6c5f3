"""A mixture of a streaming source and a store in real gloo jobs: 2 ranks → checkpoint → 1 rank (MIX-24).

Why real processes: ``StreamMixture.state_dict()`` gathers every rank's
lanes with ``all_gather_object`` only inside a process group. Each rank is a
``spawn`` process joining a gloo group through a ``file://`` rendezvous under
the test's directory, builds ``build_dataloader(MixedDataset([stream, store],
weights=...), batch_size=1)``, logs each trained row, and after ``stop_at``
steps every rank calls ``state_dict()``; rank 0 writes it. A second job of
one rank resumes from it. What is checked: the checkpoint equals the
reference's merged state after the same steps, and the rows trained by both
jobs equal the reference's, each ``(source, lane, source_index)`` at most once.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, check
from conformance.distributed import JOIN_TIMEOUT
from conformance.impl_tests.streaming_corpus import FIELDS, take, tokenizer, write

pytestmark = [pytest.mark.loadspec_gloo,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]

STREAM = {"seq_len": 4, "packing": "concat", "num_lanes": 2, "seed": 3, "shuffle": True, "shuffle_buffer_size": 2,
          "unit_bytes": 40}
MIX = {"weights": (2.0, 1.0), "stopping": "all_exhausted", "seed": 11}
CORPUS = [[[100 + 7 * d + t for t in range(3 + d % 5)] for d in range(12)], [[300 + t for t in range(9)]]]
WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone")


def _specs() -> list[tuple[str, list[list[str]]]]:
    return [("jsonl", [[" ".join(WORDS[(i + k) % 6] for k in range(1 + i % 4)) for i in range(24)]])]


def _store_config(pad_id: int) -> Any:
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig
    from reference.resume import PipelineConfig

    return PipelineConfig(packing=PackingConfig(seq_len=4, pad_id=pad_id), ordering=OrderingConfig(kind="global"))


def _rows(batches: Any) -> list[list[Any]]:
    return [[[int(b[k][j]) for k in ("epoch", "lane", "sample_index", "source", "source_index")]
             + [b[f][j].tolist() for f in FIELDS] for j in range(len(b["lane"]))] for b in batches]


def _rank_main(rank: int, world: int, init: str, job: dict[str, Any]) -> None:
    import torch

    from impl._atomic import atomic_write_json
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.mixed_dataset import MixedDataset
    from impl.streaming import StreamingDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=job["gloo_timeout"]))
    try:
        stream = StreamingDataset(job["files"], tokenizer=job["tokenizer"], **STREAM)
        store = PackedDataset.from_config(job["store"], _store_config(stream.config.packing.pad_id), cache_dir=False)
        loader = build_dataloader(MixedDataset([stream, store], **MIX), batch_size=1)
        if job["resume_from"]:
            loader.load_state_dict(json.loads(Path(job["resume_from"]).read_text()))
        log = Path(job["log_dir"]) / f"rank{rank}.json"
        log.parent.mkdir(parents=True, exist_ok=True)
        rows = _rows(take(loader, job["stop_at"])) if job["stop_at"] else _rows(loader)
        state = loader.state_dict()                    # every rank: an all_gather of the lanes
        log.write_text(json.dumps(rows))
        if rank == 0:
            atomic_write_json(job["checkpoint"], state)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _launch(job: dict[str, Any], world: int, workdir: Path, tag: str) -> list[int | None]:
    """Every rank as a ``spawn`` process; all killed when one exits non-zero or the deadline passes."""
    from conformance.ranks import scaled

    ctx = multiprocessing.get_context("spawn")
    init = f"file://{workdir / f'rendezvous-{tag}'}"
    job = dict(job, gloo_timeout=scaled(30.0))
    procs = [ctx.Process(target=_rank_main, args=(r, world, init, job)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + scaled(JOIN_TIMEOUT)
    try:
        while time.monotonic() < deadline:
            codes = [p.exitcode for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=30)
    return [p.exitcode for p in procs]


@pytest.mark.clause("MIX-24")
def test_a_two_rank_mixture_checkpoint_resumes_on_one_rank_as_the_reference_does_gloo(tmp_path):
    from impl.streaming import StreamingDataset
    from reference.stream_mixing import StoreSource, StreamMixConfig, StreamMixReferenceLoader, StreamSource
    from reference.streaming import merge_states

    path, tok, tok_id = tokenizer()
    names, ref_files = write(tmp_path / "data", _specs())
    stream = StreamingDataset(names, tokenizer=path, **STREAM)
    config = _store_config(stream.config.packing.pad_id)
    store_path = str(build_store(CORPUS, tmp_path).path)
    from impl.dataset import PackedDataset

    fingerprint = PackedDataset.from_config(store_path, config, cache_dir=False).fingerprint
    sources = [StreamSource(files=ref_files, config=stream.config, tokenizer=tok, tokenizer_id=tok_id),
               StoreSource(corpus=CORPUS, config=config, fingerprint=fingerprint)]
    mix = StreamMixConfig(**MIX)

    def ref(world: int, rank: int) -> StreamMixReferenceLoader:
        return StreamMixReferenceLoader(sources, mix, world_size=world, rank=rank)

    def ref_rows(batches: Any) -> list[list[Any]]:
        return [[[r.epoch, r.lane, r.index, r.source, r.source_index] + [list(getattr(r.sample, f)) for f in FIELDS]
                 for r in b] for b in batches]

    ranks = [ref(2, r) for r in range(2)]
    expected_first = [row for lo in ranks for b in ref_rows(take(lo, 3)) for row in b]
    expected_state = merge_states([lo.state_dict() for lo in ranks])
    one = ref(1, 0)
    one.load_state_dict(expected_state)
    expected_rest = [row for b in ref_rows(one) for row in b]
    check(len(expected_rest) > 0, clause="MIX-24", what="the fixture leaves samples for the resumed job")

    job = {"files": names, "tokenizer": str(path), "store": store_path, "stop_at": 3, "resume_from": None,
           "log_dir": str(tmp_path / "a"), "checkpoint": str(tmp_path / "ckpt.json")}
    assert_equal(_launch(job, 2, tmp_path, "a"), [0, 0], clause="MIX-24", what="exit codes of the 2-rank job")
    saved = json.loads(Path(job["checkpoint"]).read_text())
    assert_equal(saved, json.loads(json.dumps(expected_state)), clause="MIX-24", what="the gathered checkpoint")
    first = [row for r in (0, 1) for b in json.loads((tmp_path / "a" / f"rank{r}.json").read_text()) for row in b]
    assert_equal(sorted(first), sorted(json.loads(json.dumps(expected_first))), clause="MIX-24",
                 what="rows the 2-rank job trained")
    job = dict(job, stop_at=None, resume_from=job["checkpoint"], log_dir=str(tmp_path / "b"),
               checkpoint=str(tmp_path / "ckpt-b.json"))
    assert_equal(_launch(job, 1, tmp_path, "b"), [0], clause="MIX-24", what="exit code of the resumed job")
    rest = [row for b in json.loads((tmp_path / "b" / "rank0.json").read_text()) for row in b]
    assert_equal(rest, json.loads(json.dumps(expected_rest)), clause="MIX-24", what="rows the resumed job trained")
    trained = [(r[3], r[1], r[4]) for r in first + rest if r[0] == 0]     # a stream's index counts in its lane
    check(len(trained) == len(set(trained)), clause="MIX-24", what="a (source, lane, source_index) trained twice")
