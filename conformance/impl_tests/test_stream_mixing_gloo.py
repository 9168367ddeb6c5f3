"""A mixture of a streaming source and a store in real gloo jobs: 2 ranks → checkpoint → 1 rank (MIX-24).

Why real processes: ``StreamMixture.state_dict()`` gathers every rank's
lanes with ``all_gather_object`` only inside a process group. Each rank is a
job of the shared harness (``conformance.distributed``: its own interpreter
joining a gloo group through a ``file://`` rendezvous under the test's
directory), builds ``build_dataloader(MixedDataset([stream, store],
weights=...), batch_size=1)`` (:func:`rank_loader`), logs each trained row,
and after ``stop_at`` steps every rank calls ``state_dict()``
(``gather_state``); rank 0 writes it. A second job of one rank resumes from it. What is checked: the checkpoint equals the
reference's merged state after the same steps, and the rows trained by both
jobs equal the reference's, each ``(source, lane, source_index)`` at most once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, check
from conformance.distributed import Job, read_logs, run_job
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


def rank_loader(job: Job) -> Any:
    """Each rank's loader (``Job.build``): the stream and the store mixed, batches of one."""
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.mixed_dataset import MixedDataset
    from impl.streaming import StreamingDataset

    stream = StreamingDataset(job.params["files"], tokenizer=job.params["tokenizer"], **STREAM)
    store = PackedDataset.from_config(job.params["store"], _store_config(stream.config.packing.pad_id), cache_dir=False)
    return build_dataloader(MixedDataset([stream, store], **MIX), batch_size=job.batch_size)


def rank_record(batch: Any) -> dict[str, Any]:
    """Each step's log line (``Job.record``): the batch's rows."""
    return {"rows": _rows([batch])[0]}


def _trained(log_dir: Path, rank: int) -> list[list[Any]]:
    return [row for rec in read_logs(log_dir)[rank] if "rows" in rec for row in rec["rows"]]


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

    job = Job(build=f"{__name__}:rank_loader", record=f"{__name__}:rank_record", gather_state=True,
              params={"files": names, "tokenizer": str(path), "store": store_path}, batch_size=1, stop_at=3,
              checkpoint_every=1000, log_dir=str(tmp_path / "a"), checkpoint=str(tmp_path / "ckpt.json"))
    assert_equal(run_job(job, 2, tmp_path).returncodes, [0, 0], clause="MIX-24", what="exit codes of the 2-rank job")
    saved = json.loads(Path(job.checkpoint).read_text())["state"]
    assert_equal(saved, json.loads(json.dumps(expected_state)), clause="MIX-24", what="the gathered checkpoint")
    first = [row for r in (0, 1) for row in _trained(tmp_path / "a", r)]
    assert_equal(sorted(first), sorted(json.loads(json.dumps(expected_first))), clause="MIX-24",
                 what="rows the 2-rank job trained")
    job = dataclasses.replace(job, stop_at=None, resume_from=job.checkpoint, log_dir=str(tmp_path / "b"),
                              checkpoint=str(tmp_path / "ckpt-b.json"))
    assert_equal(run_job(job, 1, tmp_path).returncodes, [0], clause="MIX-24", what="exit code of the resumed job")
    rest = _trained(tmp_path / "b", 0)
    assert_equal(rest, json.loads(json.dumps(expected_rest)), clause="MIX-24", what="rows the resumed job trained")
    trained = [(r[3], r[1], r[4]) for r in first + rest if r[0] == 0]     # a stream's index counts in its lane
    check(len(trained) == len(set(trained)), clause="MIX-24", what="a (source, lane, source_index) trained twice")
