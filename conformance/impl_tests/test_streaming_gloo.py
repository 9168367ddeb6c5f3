"""StreamingDataset in real gloo jobs: 2 ranks → checkpoint → 4 ranks and → 1, and a kill -9 mid-epoch (STREAM-14).

Why real processes: "every rank's ``state_dict()`` returns the same JSON"
and "resumes on another world size" are claims about a real process group
and separate address spaces. Each rank is a job of the shared harness
(``conformance.distributed``: its own interpreter joining a gloo group through
a ``file://`` rendezvous under the test's directory, a deadline on the job,
every rank killed when one exits non-zero); here it builds
``build_dataloader(StreamingDataset(...), batch_size=2)`` (:func:`rank_loader`)
and logs every sample's lane, index and provenance (``doc_ids`` /
``token_offsets``, :func:`rank_record`); with ``gather_state`` *every* rank
calls ``state_dict()`` at a checkpoint (an all_gather) and logs its JSON's
hash, and rank 0 writes it atomically.

What is checked: the checkpoint equals ``reference.streaming``'s merged
state after the same steps; the samples trained across the runs equal the
reference's (the same job simulated in-process), each ``(lane, index)`` and
each token ``(doc_id, token_offset)`` exactly once; and what is not trained
is only the tail of each lane that equal-step truncation drops (STREAM-12).

The 2 → 4 and → 1 job runs twice: on the raw rows, and through a batched
N → M map (Forgather's block tokenizer, ``stream_map_fns.block_tokenize``),
whose checkpoints fall inside an input batch (STREAM-21), so there each
block's tokens ``(doc_id, token_offset)`` are what is trained exactly once.
"""

from __future__ import annotations

import importlib
import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from conformance.assertions import assert_equal, assert_exactly_once, check
from conformance.distributed import Job, read_logs, run_job, state_hash
from conformance.impl_tests.stream_map_fns import block_tokenize
from conformance.impl_tests.streaming_corpus import impl_rows, ref_rows, take, tokenizer, write

pytestmark = [pytest.mark.loadspec_gloo,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]

OPTIONS = {"seq_len": 16, "packing": "concat", "num_lanes": 4, "seed": 5, "shuffle": True, "unit_window": 2,
           "shuffle_buffer_size": 3, "unit_bytes": 200}
BATCH = 2
WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "é", "north", "seven")


def _specs() -> list[tuple[str, list[list[str]]]]:
    def doc(i: int) -> str:
        return " ".join(WORDS[(i * 3 + k * 7) % len(WORDS)] for k in range(2 + (i * 5) % 13)) + f" {i}"

    return [("jsonl", [[doc(i) for i in range(40)]]), ("jsonl.gz", [[doc(i) for i in range(40, 64)]]),
            ("parquet", [[doc(i) for i in range(64, 84)], [doc(i) for i in range(84, 100)]]),
            ("jsonl", [[doc(i) for i in range(100, 130)]])]


# --------------------------------------------------------------------------- one rank


def rank_loader(job: Job) -> Any:
    """Each rank's loader (``Job.build``): the streaming dataset over the corpus, batches of ``BATCH``."""
    from impl.loader import build_dataloader
    from impl.streaming import StreamingDataset

    ds = StreamingDataset(job.params["files"], tokenizer=job.params["tokenizer"], index_dir=job.params["index_dir"],
                          **OPTIONS)
    fmap = job.params.get("map")
    if fmap is not None:            # a BatchedMap's fields, its module-level function named "module:function"
        module, _, name = fmap["function"].partition(":")
        ds = ds.map(getattr(importlib.import_module(module), name), batched=True, batch_size=fmap["batch_size"],
                    name=fmap["name"])
    return build_dataloader(ds, batch_size=job.batch_size, num_workers=job.num_workers)


def rank_record(batch: Any) -> dict[str, Any]:
    """Each step's log line (``Job.record``): the batch's rows with their provenance."""
    return {"rows": impl_rows([batch])[0]}


def _logs(log_dir: Path, upto: int | None = None) -> tuple[list[tuple[Any, ...]], dict[int, dict[int, str]]]:
    """Every trained row (as tuples) up to step ``upto``, and each checkpoint's state hash per rank."""
    rows: list[tuple[Any, ...]] = []
    shas: dict[int, dict[int, str]] = {}
    for rank, records in read_logs(log_dir).items():
        for rec in records:
            if "checkpoint" in rec:
                shas.setdefault(rec["checkpoint"], {})[rank] = rec["sha"]
            elif upto is None or rec["step"] <= upto:
                rows.extend(tuple(tuple(f) if isinstance(f, list) else f for f in r) for r in rec["rows"])
    return rows, shas


# --------------------------------------------------------------------------- the reference's job


class Ref:
    """The same job on ``reference.streaming`` (``reference.stream_maps`` with a map), in-process: the rows each
    topology trains and the states."""

    def __init__(self, ref_files: list[Any], config: Any, fmap: Any = None) -> None:
        self.files, self.config, self.fmap = ref_files, config, fmap

    def run(self, world: int, steps: int | None, state: dict[str, Any] | None = None, num_workers: int = 0
            ) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
        from reference.stream_maps import MappedReferenceLoader
        from reference.streaming import StreamingReferenceLoader, merge_states

        _, tok, tok_id = tokenizer()
        rows, states = [], []
        for rank in range(world):
            common = {"tokenizer_id": tok_id, "world_size": world, "rank": rank, "batch_size": BATCH,
                      "num_workers": num_workers}     # a worker's batches hold its own lanes (STREAM-11, 12)
            ref = (StreamingReferenceLoader(self.files, self.config, tok, **common) if self.fmap is None else
                   MappedReferenceLoader(self.files, self.config, tok, map=self.fmap, **common))
            if state is not None:
                ref.load_state_dict(state)
            for batch in ref_rows(take(ref, steps) if steps is not None else list(ref)):
                rows.extend(batch)
            states.append(ref.state_dict())
        return rows, merge_states(states)


def _corpus(root: Path, fmap: Any = None) -> dict[str, Any]:
    """The files, the reference's whole one-rank epoch and every document id it could train (mapped by ``fmap``)."""
    from impl.streaming import StreamingDataset

    names, ref_files = write(root / "data", _specs())
    path = str(tokenizer()[0])
    ds = StreamingDataset(names, tokenizer=path, index_dir=str(root / "index"), **OPTIONS)
    ref = Ref(ref_files, ds.config, fmap)
    whole, _ = ref.run(1, None)      # one rank, batches of 2: every lane to its end (at most one sample left)
    # A row's document id is its global row number; a map output's is (made + output) * N + lane (STREAM-20),
    # so a mapped epoch's documents are those its samples hold (an output too short for a sample holds no token).
    docs = (set(range(sum(len(g) for _, gs in _specs() for g in gs))) if fmap is None else
            {d for r in whole for d in r[6] if d >= 0})
    job_map = None if fmap is None else {"function": f"{fmap.function.__module__}:{fmap.function.__name__}",
                                         "batch_size": fmap.batch_size, "name": fmap.name}
    return {"files": names, "tokenizer": path, "index_dir": str(root / "index"), "ref": ref, "whole": whole,
            "docs": docs, "map": job_map}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Any]:
    return _corpus(tmp_path_factory.mktemp("stream-gloo"))


@pytest.fixture(scope="module")
def blocks_corpus(tmp_path_factory) -> dict[str, Any]:
    """The corpus through Forgather's block tokenizer: batches of 3 texts, each ended by EOS, cut into blocks of 5."""
    from reference.stream_maps import BatchedMap

    fmap = BatchedMap(function=block_tokenize, batch_size=3, name="blocks-5-v1")
    return _corpus(tmp_path_factory.mktemp("stream-gloo-blocks"), fmap)


def _job(corpus: dict[str, Any], tmp: Path, name: str, **kw: Any) -> Job:
    return Job(build=f"{__name__}:rank_loader", record=f"{__name__}:rank_record", gather_state=True,
               params={"files": corpus["files"], "tokenizer": corpus["tokenizer"], "index_dir": corpus["index_dir"],
                       "map": corpus["map"]},
               batch_size=BATCH, log_dir=str(tmp / name), checkpoint=str(tmp / f"ckpt-{name}.json"), **kw)


def _launch(job: Job, world: int, workdir: Path) -> list[int]:
    return run_job(job, world, workdir).returncodes


def _check_trained(corpus: dict[str, Any], trained: list[tuple[Any, ...]], expected: list[tuple[Any, ...]],
                   what: str) -> None:
    """Trained rows equal the reference's; each sample and token once; only lane tails left untrained."""
    assert_equal(sorted(trained), sorted(expected), clause="STREAM-14", what=f"{what}: the samples trained")
    assert_exactly_once([(r[1], r[2]) for r in trained], [(r[1], r[2]) for r in expected], clause="STREAM-14",
                        what=f"{what}: (lane, index) of each trained sample")
    tokens = [(d, o) for r in trained for d, o in zip(r[6], r[7]) if d >= 0]
    every = [(d, o) for r in corpus["whole"] for d, o in zip(r[6], r[7]) if d >= 0]
    assert_exactly_once(tokens, [t for t in every if t in set(tokens)], clause="STREAM-14",
                        what=f"{what}: (doc_id, token_offset) of each trained token")
    check(set(tokens) <= set(every), clause="STREAM-14", what=f"{what}: trained tokens outside the reference epoch")
    last = Counter()
    for r in trained:
        last[r[1]] = max(last[r[1]], r[2] + 1)
    tail = [r for r in corpus["whole"] if (r[1], r[2]) not in {(t[1], t[2]) for t in trained}]
    check(all(r[2] >= last[r[1]] for r in tail), clause="STREAM-12",
          what=f"{what}: untrained samples {[(r[1], r[2]) for r in tail]} are not all lane tails")
    missing = corpus["docs"] - {d for d, _ in tokens}
    dropped = {d for r in tail for d in r[6]} | (corpus["docs"] - {d for r in corpus["whole"] for d in r[6]})
    check(missing <= dropped, clause="STREAM-14",
          what=f"{what}: documents {sorted(missing - dropped)} never trained though no dropped sample holds them")


def _checkpoint(path: Path, shas: dict[int, dict[int, str]], step: int, world: int) -> dict[str, Any]:
    saved = json.loads(path.read_text())
    assert_equal(shas.get(step), {r: state_hash(saved["state"]) for r in range(world)},
                 clause="STREAM-14", what=f"the hash of every rank's state_dict() at step {step}")
    return saved


def _two_ranks_then_four_and_one(corpus: dict[str, Any], tmp_path: Path) -> None:
    """2 ranks for 3 steps (checkpoint at each), then resumed on 4 ranks and on 1 with 2 workers."""
    codes = _launch(_job(corpus, tmp_path, "two", stop_at=3), 2, tmp_path)
    assert codes == [0, 0], f"2-rank run: exit codes {codes}"
    first, shas = _logs(tmp_path / "two")
    saved = _checkpoint(tmp_path / "ckpt-two.json", shas, 3, 2)
    assert_equal(saved["step"], 3, clause="STREAM-14", what="the step of the last checkpoint")
    ref = corpus["ref"]
    ref_first, ref_state = ref.run(2, 3)
    assert_equal(saved["state"], ref_state, clause="STREAM-14", what="the gathered state after 3 steps on 2 ranks")
    assert_equal(sorted(first), sorted(ref_first), clause="STREAM-14", what="the samples of the 2-rank run")
    for world, workers in ((4, 0), (1, 2)):
        name = f"resume{world}"
        codes = _launch(_job(corpus, tmp_path, name, resume_from=str(tmp_path / "ckpt-two.json"),
                             num_workers=workers, checkpoint_every=1000), world, tmp_path)
        assert codes == [0] * world, f"resume on {world} ranks: exit codes {codes}"
        rest, _ = _logs(tmp_path / name)
        ref_rest, _ = ref.run(world, None, saved["state"], workers)
        _check_trained(corpus, first + rest, ref_first + ref_rest, f"2 ranks for 3 steps, then {world}")


@pytest.mark.clause("STREAM-14", "STREAM-15")
def test_a_2_rank_checkpoint_resumes_on_4_ranks_and_on_1_training_every_sample_once_gloo(corpus, tmp_path):
    _two_ranks_then_four_and_one(corpus, tmp_path)


@pytest.mark.clause("STREAM-14", "STREAM-21")
def test_a_2_rank_checkpoint_of_a_block_tokenized_stream_resumes_on_4_ranks_and_on_1_training_every_block_once_gloo(
        blocks_corpus, tmp_path):
    _two_ranks_then_four_and_one(blocks_corpus, tmp_path)


@pytest.mark.clause("STREAM-14", "STREAM-15")
def test_a_rank_killed_mid_epoch_restarts_from_the_last_checkpoint_training_every_sample_once_gloo(corpus, tmp_path):
    codes = _launch(_job(corpus, tmp_path, "killed", checkpoint_every=2, die_at=(1, 5)), 2, tmp_path)
    check(codes[1] == -signal.SIGKILL, clause="STREAM-14", what=f"rank 1 should die by SIGKILL: exit codes {codes}")
    _, shas = _logs(tmp_path / "killed")
    saved = _checkpoint(tmp_path / "ckpt-killed.json", shas, 4, 2)
    assert_equal(saved["step"], 4, clause="STREAM-14", what="the last checkpoint before the kill")
    before, _ = _logs(tmp_path / "killed", upto=4)
    codes = _launch(_job(corpus, tmp_path, "restart", resume_from=str(tmp_path / "ckpt-killed.json")), 2, tmp_path)
    assert codes == [0, 0], f"restart: exit codes {codes}"
    after, _ = _logs(tmp_path / "restart")
    uninterrupted, _ = corpus["ref"].run(2, None)
    _check_trained(corpus, before + after, uninterrupted, "2 ranks killed at step 5, restarted from step 4")
