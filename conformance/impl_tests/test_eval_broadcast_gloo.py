"""Real gloo jobs: the eval broadcast, the data-parallel shard helper and bucketed loading resumed on 3 ranks.

Three launches share the work (each spawned rank imports torch, datasets and
transformers, which dominates the cost on 2 cores): a 2-rank job and a
3-rank job. In each, every rank builds the eval set with
``build_eval_dataset`` (only rank 0 is given real paths: the others get
paths that do not exist, so any filesystem access off rank 0 would fail),
then an eval split too short for one sample, then its
``shard_dataset_data_parallel`` view; then it loads bucketed batches with
``build_dataloader``: the 2-rank job stops after 3 steps and saves the
state, the 3-rank job resumes from it. A third, 3-rank job calls
``build_eval_dataset`` wrongly on purpose, with a short ``timeout``: ranks
disagreeing on ``src``, then on ``seq_len``, then rank 2 skipping a call
(and making it late, once the others have raised), then one correct call.
Ranks run as ``spawn`` processes
joined through a ``file://`` rendezvous in the test's directory, with a
timeout on every join; the launcher kills every rank on timeout.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.distributed import JOIN_TIMEOUT

GPT2 = Path(__file__).resolve().parents[2] / "fixtures" / "tokenizer" / "gpt2"
TEXTS = [f"Evaluation document number {i} says {'many words ' * (i % 5)}and ends." for i in range(30)]
LENGTHS = [(i * 37) % 23 + 1 for i in range(90)]
BUCKET = {"buffer_size": 12, "pack_size": 4, "init_seed": 7}
MISSING = "/nonexistent/loadspec-eval"
SHORT_TIMEOUT = 5
"""Seconds ``build_eval_dataset`` waits for the other ranks in the fault job (the default is minutes)."""


class Rows:
    """A plain map-style dataset of token rows with ``sort_key`` (lengths ``LENGTHS``)."""

    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, index: int):
        import torch

        return torch.full((LENGTHS[index],), index, dtype=torch.int64)

    def sort_key(self, index: int) -> int:
        return LENGTHS[index]


def _first_ids(rows):
    return {"first": [int(r[0]) for r in rows]}


def _eval_kwargs(workdir: Path, rank: int, name: str) -> dict:
    real = rank == 0
    data = str(workdir / f"{name}.jsonl") if real else MISSING
    return {"dataset": "json", "tokenizer": str(GPT2) if real else MISSING, "split": "train", "seq_len": 8,
            "cache_dir": str(workdir / "cache") if real else MISSING,
            "load_kwargs": {"data_files": data, "cache_dir": str(workdir / "hf") if real else MISSING}}


def _rank_main(rank: int, world: int, init: str, workdir: str, tag: str, resume: bool, steps: int | None) -> None:
    import torch
    import torch.distributed as dist

    from impl.bucketing import BufferSortedDataset
    from impl.evaluation import build_eval_dataset
    from impl.loader import build_dataloader
    from impl.sharding import shard_dataset_data_parallel

    torch.set_num_threads(1)
    work = Path(workdir)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    out: dict = {}
    try:
        eval_set = build_eval_dataset(**_eval_kwargs(work, rank, "eval"))
        stacked = torch.stack([eval_set.tensors[k] for k in ("input_ids", "labels", "doc_ids")])
        out["eval"] = {"shape": list(stacked.shape), "sha": hashlib.sha256(stacked.numpy().tobytes()).hexdigest()}
        try:
            build_eval_dataset(**_eval_kwargs(work, rank, "short"))
            out["short"] = None
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to compare across ranks
            out["short"] = {"type": type(exc).__name__, "message": str(exc)}
        view = shard_dataset_data_parallel(list(range(11)), indexing_mode="chunked")
        out["shard"] = [view[i] for i in range(len(view))]
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        mesh_view = shard_dataset_data_parallel(list(range(11)), mesh, indexing_mode="chunked")
        out["mesh_shard"] = [mesh_view[i] for i in range(len(mesh_view))]
        loader = build_dataloader(BufferSortedDataset(Rows(), **BUCKET), batch_size=4, collate_fn=_first_ids)
        if resume:
            loader.load_state_dict(json.loads((work / "bucket-state.json").read_text()))
        out["steps"] = []
        for batch in loader:
            out["steps"].append(batch["first"])
            dist.all_reduce(torch.ones(1))
            if steps is not None and len(out["steps"]) == steps:
                break
        if rank == 0 and not resume:
            (work / "bucket-state.json").write_text(json.dumps(loader.state_dict()))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (work / f"{tag}-rank{rank}.json").write_text(json.dumps(out))


def _outcome(call) -> dict | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - recorded for the parent to compare across ranks
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def _faults_main(rank: int, world: int, init: str, workdir: str, tag: str) -> None:
    import torch
    import torch.distributed as dist

    from impl.evaluation import build_eval_dataset

    torch.set_num_threads(1)
    work = Path(workdir)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    sync = dist.FileStore(str(work / f"sync-{tag}"), world)
    base = dict(_eval_kwargs(work, rank, "eval"), timeout=SHORT_TIMEOUT)
    out: dict = {}
    try:
        out["src"] = _outcome(lambda: build_eval_dataset(**dict(base, src=1 if rank == 1 else 0)))
        out["seq_len"] = _outcome(lambda: build_eval_dataset(**dict(base, seq_len=16 if rank == 2 else 8)))
        if rank == 2:  # skips the call, then makes it once the others have raised
            sync.wait(["skipped-0", "skipped-1"], timedelta(seconds=JOIN_TIMEOUT))
        out["skipped"] = _outcome(lambda: build_eval_dataset(**base))
        sync.set(f"skipped-{rank}", "done")
        eval_set = build_eval_dataset(**base)
        stacked = torch.stack([eval_set.tensors[k] for k in ("input_ids", "labels", "doc_ids")])
        out["eval"] = {"shape": list(stacked.shape), "sha": hashlib.sha256(stacked.numpy().tobytes()).hexdigest()}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (work / f"{tag}-rank{rank}.json").write_text(json.dumps(out))


def _launch(world: int, workdir: Path, tag: str, *, resume: bool = False, steps: int | None = None,
            target=_rank_main) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    init = f"file://{workdir / f'rendezvous-{tag}'}"
    args = (str(workdir), tag, resume, steps) if target is _rank_main else (str(workdir), tag)
    procs = [ctx.Process(target=target, args=(r, world, init, *args)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    try:
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
            p.join(timeout=30)
    assert not alive, f"{tag}: ranks {[procs.index(p) for p in alive]} still running after {JOIN_TIMEOUT}s (killed)"
    assert [p.exitcode for p in procs] == [0] * world, f"{tag}: exit codes {[p.exitcode for p in procs]}"
    return [json.loads((workdir / f"{tag}-rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gloo")
    (workdir / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (workdir / "short.jsonl").write_text(json.dumps({"text": "Too short."}) + "\n")
    two = _launch(2, workdir, "two", resume=False, steps=3)
    three = _launch(3, workdir, "three", resume=True, steps=None)
    return {"two": two, "three": three, "workdir": workdir}


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gloo-faults")
    (workdir / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return {"ranks": _launch(3, workdir, "faults", target=_faults_main), "workdir": workdir}


def _local_eval(workdir: Path) -> dict:
    import torch

    from impl.evaluation import build_eval_dataset

    eval_set = build_eval_dataset(**_eval_kwargs(workdir, 0, "eval"))
    stacked = torch.stack([eval_set.tensors[k] for k in ("input_ids", "labels", "doc_ids")])
    return {"shape": list(stacked.shape), "sha": hashlib.sha256(stacked.numpy().tobytes()).hexdigest()}


@pytest.mark.clause("EVAL-1")
def test_the_eval_set_built_without_a_process_group_equals_the_reference_eval_set(tmp_path):
    from transformers import AutoTokenizer

    from impl.evaluation import build_eval_dataset
    from reference.evaluation import eval_set

    tok = AutoTokenizer.from_pretrained(str(GPT2), local_files_only=True)
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    got = build_eval_dataset(**_eval_kwargs(tmp_path, 0, "eval"))
    documents = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in TEXTS]
    expected = eval_set(documents, seq_len=8)
    for field in ("input_ids", "labels", "doc_ids", "position_ids"):
        assert_equal(got.tensors[field].tolist(), [list(getattr(s, field)) for s in expected], clause="EVAL-1",
                     what=field)


@pytest.mark.clause("EVAL-1")
def test_an_eval_split_too_short_for_one_sample_is_refused_offering_only_options_build_eval_dataset_has(tmp_path):
    from impl.errors import EmptyDataError
    from impl.evaluation import build_eval_dataset

    (tmp_path / "short.jsonl").write_text(json.dumps({"text": "Too short."}) + "\n")
    error = assert_raises_typed(EmptyDataError, build_eval_dataset, **_eval_kwargs(tmp_path, 0, "short"),
                                clause="EVAL-1", what="split shorter than one window",
                                mentions=["seq_len=8", "lower seq_len", "longer split"])
    assert "packing" not in str(error), f"build_eval_dataset has no packing= option, yet: {error}"


@pytest.mark.clause("EVAL-2")
def test_every_rank_receives_the_eval_set_rank_zero_built_on_2_and_3_ranks_gloo(jobs):
    expected = _local_eval(jobs["workdir"])
    check(expected["shape"][1] > 0, clause="EVAL-2", what="the eval set has samples")
    for name in ("two", "three"):
        assert_equal([r["eval"] for r in jobs[name]], [expected] * len(jobs[name]), clause="EVAL-2",
                     what=f"eval tensors on the {name}-rank job")


@pytest.mark.clause("EVAL-3")
def test_an_eval_split_too_short_for_one_sample_raises_the_same_typed_error_on_every_rank_gloo(jobs):
    for name in ("two", "three"):
        errors = [r["short"] for r in jobs[name]]
        assert errors[0] is not None and errors[0]["type"] == "EmptyDataError", errors
        assert "seq_len=8" in errors[0]["message"]
        assert "packing" not in errors[0]["message"], errors[0]["message"]
        assert errors == [errors[0]] * len(errors), errors


@pytest.mark.clause("SHARD-2", "SHARD-15")
def test_the_data_parallel_helper_takes_rank_and_world_size_from_the_process_group_or_a_device_mesh_gloo(jobs):
    assert_equal([r["shard"] for r in jobs["two"]], [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 10]], clause="SHARD-15",
                 what="2-rank padded chunked views")
    assert_equal([r["shard"] for r in jobs["three"]], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 10]],
                 clause="SHARD-15", what="3-rank padded chunked views")
    for name in ("two", "three"):
        assert_equal([r["mesh_shard"] for r in jobs[name]], [r["shard"] for r in jobs[name]], clause="SHARD-15",
                     what=f"DeviceMesh 'dp' views on the {name}-rank job")


@pytest.mark.clause("BUCK-7")
def test_bucketed_loading_resumed_on_three_ranks_continues_the_two_rank_stream_gloo(jobs):
    from reference.bucketing import BucketConfig, bucket_order

    order = bucket_order(LENGTHS, BucketConfig(buffer_size=12, pack_size=4, seed=7), 0)
    two = [[rank["steps"][s] for rank in jobs["two"]] for s in range(3)]
    three = [[rank["steps"][s] for rank in jobs["three"]] for s in range(len(jobs["three"][0]["steps"]))]
    flat = [i for step in two + three for batch in step for i in batch]
    assert_equal(flat, order[:len(flat)], clause="BUCK-7", what="2-rank head + 3-rank resume")
    check(len(flat) > 80, clause="BUCK-7", what=f"only {len(flat)} of {len(order)} items trained")


def _same_error_everywhere(outcomes: list, clause: str, what: str) -> dict:
    check(outcomes[0] is not None and outcomes[0]["type"] == "EvalBroadcastError", clause=clause,
          what=f"{what}: rank 0 ended with {outcomes[0]}")
    assert_equal(outcomes, [outcomes[0]] * len(outcomes), clause=clause, what=f"{what}: every rank's error")
    return outcomes[0]


@pytest.mark.clause("EVAL-4")
def test_ranks_that_disagree_on_src_raise_the_same_error_naming_both_values_on_every_rank_gloo(faults):
    error = _same_error_everywhere([r["src"] for r in faults["ranks"]], "EVAL-4", "src 0 on ranks 0 and 2, 1 on 1")
    for part in ("src=0 on ranks [0, 2]", "src=1 on rank [1]", "pass the same src"):
        check(part in error["message"], clause="EVAL-4", what=f"{part!r} not in {error['message']!r}")


@pytest.mark.clause("EVAL-4")
def test_ranks_that_disagree_on_seq_len_raise_the_same_error_naming_both_values_on_every_rank_gloo(faults):
    error = _same_error_everywhere([r["seq_len"] for r in faults["ranks"]], "EVAL-4", "seq_len 16 on rank 2")
    for part in ("seq_len=8 on ranks [0, 1]", "seq_len=16 on rank [2]"):
        check(part in error["message"], clause="EVAL-4", what=f"{part!r} not in {error['message']!r}")
    check("src=" not in error["message"], clause="EVAL-4", what=f"src named though agreed: {error['message']!r}")


@pytest.mark.clause("EVAL-5")
def test_a_rank_that_skips_the_call_makes_the_others_raise_within_the_timeout_and_raises_the_same_when_late_gloo(
        faults):
    error = _same_error_everywhere([r["skipped"] for r in faults["ranks"]], "EVAL-5", "rank 2 skipped, then late")
    for part in (f"rank [2] did not reach build_eval_dataset within timeout={SHORT_TIMEOUT}s",
                 "did not call build_eval_dataset", "crashed", "timeout="):
        check(part in error["message"], clause="EVAL-5", what=f"{part!r} not in {error['message']!r}")


@pytest.mark.clause("EVAL-2", "EVAL-5")
def test_the_group_still_broadcasts_the_eval_set_after_refused_calls_gloo(faults):
    expected = _local_eval(faults["workdir"])
    assert_equal([r["eval"] for r in faults["ranks"]], [expected] * 3, clause="EVAL-2",
                 what="eval tensors after the refused calls")


records = st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 2), st.sampled_from(["f1", "f2"]))),
                   min_size=1, max_size=4)


@pytest.mark.clause("EVAL-4", "EVAL-5")
@given(records=records)
def test_impl_decides_agreement_as_the_reference_does(records):
    from impl.errors import EvalBroadcastError, TopologyError
    from impl.evaluation import agreed_source
    from reference import evaluation as ref
    from reference.errors import TopologyError as RefTopologyError

    def outcome(fn, rows, errors):
        try:
            return fn(rows)
        except errors as exc:
            return type(exc).__name__

    rows = [None if r is None else {"src": r[0], "fingerprint": r[1], "config": {"fp": r[1]}} for r in records]
    got = outcome(lambda x: agreed_source(x, list(range(len(x)))), rows, (EvalBroadcastError, TopologyError))
    expected = outcome(ref.agreed_source, records, (ref.EvalBroadcastError, RefTopologyError))
    assert_equal(got, expected, clause="EVAL-4", what="agreed src or error", repro={"records": records})


@pytest.mark.clause("EVAL-5")
@pytest.mark.parametrize("bad", [0, -1.0, "5", float("nan"), timedelta(0)])
def test_a_timeout_that_is_not_a_positive_duration_is_refused_naming_it(bad):
    from impl.errors import ConfigError
    from impl.evaluation import build_eval_dataset

    for name in ("timeout", "build_timeout"):
        assert_raises_typed(ConfigError, build_eval_dataset, "json", MISSING, seq_len=8, cache_dir=MISSING,
                            split="train", clause="EVAL-5", what=f"{name}={bad!r}", mentions=[f"{name}=", "timedelta"],
                            **{name: bad})


@pytest.mark.clause("EVAL-4")
def test_the_fingerprinted_options_and_defaults_are_those_of_hugging_face_dataset():
    import inspect

    from impl.evaluation import FINGERPRINTED, eval_config
    from impl.hf import HuggingFaceDataset

    params = inspect.signature(HuggingFaceDataset.__init__).parameters
    assert_equal({k: params[k].default for k in FINGERPRINTED}, dict(FINGERPRINTED), clause="EVAL-4",
                 what="defaults compared across ranks")
    explicit = eval_config(seq_len=8, split="train", text_field="text", shuffle="none", num_proc=4,
                           load_kwargs={"data_files": MISSING})
    assert_equal(explicit, eval_config(seq_len=8, split="train"), clause="EVAL-4",
                 what="config with defaults spelled out and source-only options")
    check(eval_config(seq_len=8, split="train", seed=1) != eval_config(seq_len=8, split="train"), clause="EVAL-4",
          what="seed changes the config")
