"""The main job (``make demo``): train, checkpoint, stop, resume on another world size, audit.

Why: the promise of loadspec is that a job stopped and resumed on a different
number of ranks trains on every sample exactly once and continues as if never
interrupted. This shows it end to end on the shipped fixtures, with real
processes: it builds a token store from King James Bible chapters with the
committed GPT-2 tokenizer, trains a tiny language model with DDP on 2 gloo
processes (global batch 12 = 2 × 6) with a checkpoint at step K, lets them run
on a few steps past it and stops them (that work is lost, as in a real crash),
resumes from the checkpoint on 3 processes (3 × 4), finishes the epoch, and
audits what every rank trained on.

Checkpoints hold model weights as safetensors and the loader state as JSON:
no pickle anywhere.

Worked example (from the root of a clone, where ``fixtures/`` is importable)::

    $ python -m demos.train_resume /tmp/demo        # doctest: +SKIP
    [demo] OK: duplicates 0, missing 0; loss 10.31 at the checkpoint → 10.16 after resuming on 3 ranks (...)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fixtures import generators
from impl._atomic import atomic_write_json
from impl.partition import trained_end
from impl.resume import audit_coverage
from reference.partition import PartitionConfig

LOG = "[demo]"


def check_world_sizes(global_batch: int, *worlds: int) -> None:
    """A demo's global batch must split evenly over each phase's ranks (both demos resume on another world)."""
    for world in worlds:
        if global_batch % world:
            raise ValueError(f"global_batch={global_batch} must divide by world size {world}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoConfig:
    """Sizes chosen so the whole job finishes in a few minutes on 2 CPU cores."""

    documents: int = 40
    seq_len: int = 128
    packing: str = "concat"
    shuffle: str = "global"
    seed: int = 1234
    global_batch: int = 12
    first_world: int = 2
    second_world: int = 3
    checkpoint_step: int = 10
    steps_after_checkpoint: int = 3
    lr: float = 1.0
    dim: int = 32
    num_workers: int = 0
    join_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_world_sizes(self.global_batch, self.first_world, self.second_world)

    def dataset_kwargs(self) -> dict[str, Any]:
        return dict(seq_len=self.seq_len, packing=self.packing, shuffle=self.shuffle, seed=self.seed)


class TinyLM(torch.nn.Module):
    """An embedding, one mixing layer and an output projection: enough for the loss to fall visibly."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(torch.tanh(self.mix(self.embed(input_ids))))
        return logits


def _rank_main(rank: int, world: int, phase: int, workdir: str, config: dict[str, Any]) -> None:
    import torch.distributed as dist

    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader

    cfg = DemoConfig(**config)
    work = Path(workdir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work / f'rendezvous-{phase}'}", rank=rank, world_size=world)
    dataset = PackedDataset(work / "store", **cfg.dataset_kwargs())
    loader = build_dataloader(dataset, batch_size=cfg.global_batch // world, rank=rank, world_size=world,
                              num_workers=cfg.num_workers)
    model = TinyLM(dataset.store.vocab_size, cfg.dim)
    train_on_rank(loader, model, rank=rank, world=world, phase=phase, work=work, lr=cfg.lr,
                  checkpoint_step=cfg.checkpoint_step, steps_after_checkpoint=cfg.steps_after_checkpoint,
                  describe=_describe)


def _describe(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    real = batch["doc_ids"] >= 0
    return {"epoch": int(batch["epoch"][0]), "samples": batch["sample_index"].tolist(),
            "documents": sorted(set(batch["doc_ids"][real].tolist())), "tokens": int(real.sum())}


def train_on_rank(loader: Any, model: torch.nn.Module, *, rank: int, world: int, phase: int, work: Path, lr: float,
                  checkpoint_step: int, steps_after_checkpoint: int,
                  describe: Callable[[dict[str, torch.Tensor]], dict[str, Any]]) -> None:
    """The training loop both demos run on every rank, from a fresh start (phase 1) or the checkpoint (phase 2).

    Phase 1 checkpoints after ``checkpoint_step`` steps (weights as safetensors,
    the loader state as JSON) and stops ``steps_after_checkpoint`` steps later;
    phase 2 loads the checkpoint, times ``load_state_dict`` → first batch, and
    finishes the epoch. Each step appends ``{"step", **describe(batch), "loss"}``
    to ``work/logs/phase{phase}-rank{rank}.jsonl``.

    The process group is torn down while the interpreter is fully alive: every
    rank passes a barrier, the DDP wrapper (whose reducer holds the group) is
    collected, then the group is destroyed. Left to interpreter exit, gloo's
    threads could be destroyed mid-teardown and abort the rank with
    "terminate called without an active exception" (a rare CI failure of the
    demo before this).
    """
    import gc

    import safetensors.torch as st
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ckpt = work / "checkpoint"
    start_step, resume_ms = 0, None
    if phase == 2:
        model.load_state_dict(st.load_file(str(ckpt / "model.safetensors")))
        meta = json.loads((ckpt / "meta.json").read_text())
        start_step = meta["step"]
        t0 = time.perf_counter()
        loader.load_state_dict(meta["loader"])
        iterator = iter(loader)
        first = next(iterator)
        resume_ms = (time.perf_counter() - t0) * 1e3
        batches = _chain(first, iterator)
    else:
        batches = iter(loader)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    stop_at = checkpoint_step + steps_after_checkpoint if phase == 1 else None
    with (work / "logs" / f"phase{phase}-rank{rank}.jsonl").open("w") as log:
        if resume_ms is not None:
            log.write(json.dumps({"resume_ms": resume_ms}) + "\n")
        for step, batch in enumerate(batches, start=start_step):
            if stop_at is not None and step >= stop_at:
                break
            logits = ddp(batch["input_ids"])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            log.write(json.dumps({"step": step, **describe(batch), "loss": float(reduced) / world}) + "\n")
            log.flush()
            if phase == 1 and step + 1 == checkpoint_step:
                dist.barrier()
                if rank == 0:
                    save_checkpoint(ckpt, model, {"step": step + 1, "loader": loader.state_dict()})
                dist.barrier()
    dist.barrier()
    del ddp, optimizer, batches
    gc.collect()
    dist.destroy_process_group()


def _chain(first: Any, rest: Any) -> Iterator[Any]:
    yield first
    yield from rest


def save_checkpoint(ckpt: Path, model: torch.nn.Module, meta: dict[str, Any]) -> None:
    import safetensors.torch as st

    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / "model.safetensors.tmp"
    st.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, ckpt / "model.safetensors")
    atomic_write_json(ckpt / "meta.json", meta)


def spawn_phase(rank_main: Callable[..., None], phase: int, world: int, workdir: Path, cfg: Any,
                timeout_s: float) -> float:
    """Run ``rank_main(rank, world, phase, workdir, asdict(cfg))`` on ``world`` spawned ranks; seconds taken.

    Both demos' phases start this way; a phase that outlives ``timeout_s`` is
    killed and raises ``TimeoutError``.
    """
    from torch.multiprocessing.spawn import start_processes

    t0 = time.perf_counter()
    context = start_processes(rank_main, args=(world, phase, str(workdir), asdict(cfg)), nprocs=world,
                              join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            raise TimeoutError(f"phase {phase} did not finish within {timeout_s:.0f} s")
    return time.perf_counter() - t0


def read_logs(workdir: Path, phase: int, world: int) -> tuple[list[list[dict[str, Any]]], list[float]]:
    ranks, resume = [], []
    for r in range(world):
        lines = [json.loads(x) for x in (workdir / "logs" / f"phase{phase}-rank{r}.jsonl").read_text().splitlines()]
        resume += [x["resume_ms"] for x in lines if "resume_ms" in x]
        ranks.append([x for x in lines if "step" in x])
    return ranks, resume


def run(workdir: Path, cfg: DemoConfig = DemoConfig()) -> dict[str, Any]:
    """Run the whole job in ``workdir`` and return the audit report (also printed)."""
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    print(f"{LOG} building a token store from {cfg.documents} KJV chapters with the committed GPT-2 tokenizer")
    t0 = time.perf_counter()
    texts = generators.load_corpus(limit=cfg.documents)
    store = TokenStore.build(texts, generators.tokenizer_path(), workdir / "store", num_proc=2, overwrite=True)
    build_s = time.perf_counter() - t0
    dataset = PackedDataset(store, **cfg.dataset_kwargs())
    total = dataset.num_samples(0)
    print(f"{LOG} store: {len(store)} documents, {store.num_tokens} tokens ({build_s:.1f} s); epoch 0 holds {total} "
          f"packed samples of {cfg.seq_len} tokens ({cfg.packing}, {cfg.shuffle} shuffle)")

    print(f"{LOG} phase 1: {cfg.first_world} gloo ranks × batch {cfg.global_batch // cfg.first_world}, checkpoint after "
          f"step {cfg.checkpoint_step}, stopped {cfg.steps_after_checkpoint} steps later (that work is lost)")
    t1 = spawn_phase(_rank_main, 1, cfg.first_world, workdir, cfg, cfg.join_timeout_s)
    print(f"{LOG} phase 2: resume the checkpoint on {cfg.second_world} gloo ranks × batch "
          f"{cfg.global_batch // cfg.second_world} and finish the epoch")
    t2 = spawn_phase(_rank_main, 2, cfg.second_world, workdir, cfg, cfg.join_timeout_s)

    first, _ = read_logs(workdir, 1, cfg.first_world)
    second, resume_ms = read_logs(workdir, 2, cfg.second_world)
    kept = [[x for x in rank if x["step"] < cfg.checkpoint_step] for rank in first]
    trained = [x for rank in kept + second for x in rank]
    resumed_at = json.loads((workdir / "checkpoint" / "meta.json").read_text())["loader"]["consumed"]
    end = trained_end(resumed_at, total, PartitionConfig(world_size=cfg.second_world,
                                                         batch_size=cfg.global_batch // cfg.second_world))
    audit = audit_coverage((s for x in trained for s in x["samples"]), end)
    report = {
        "documents_in_store": len(store),
        "documents_seen": len({d for x in trained for d in x["documents"]}),
        "tokens_seen": sum(x["tokens"] for x in trained),
        "samples_in_epoch": total,
        "samples_trained": audit.trained,
        "dropped_by_drop_last": total - end,
        "duplicates": audit.duplicates,
        "missing": audit.missing,
        "beyond_trained_range": audit.beyond_end,
        "steps_lost_after_checkpoint": cfg.steps_after_checkpoint,
        "loss_first_step": first[0][0]["loss"],
        "loss_at_checkpoint": kept[0][-1]["loss"],
        "loss_after_resume": second[0][0]["loss"],
        "loss_final": second[0][-1]["loss"],
        "loss_of_an_untrained_model": math.log(store.vocab_size),
        "resume_ms_max_over_ranks": max(resume_ms),
        "seconds": {"build": round(build_s, 2), "phase1": round(t1, 2), "phase2": round(t2, 2)},
    }
    print(f"{LOG} report")
    width = max(map(len, report))
    for key, value in report.items():
        print(f"  {key:<{width}}  {value:.3f}" if isinstance(value, float) else f"  {key:<{width}}  {value}")
    atomic_write_json(workdir / "report.json", report)
    ok = audit.exact
    print(f"{LOG} {'OK' if ok else 'FAILED'}: duplicates {report['duplicates']}, missing {report['missing']}; "
          f"loss {report['loss_at_checkpoint']:.2f} at the checkpoint → {report['loss_after_resume']:.2f} after resuming "
          f"on {cfg.second_world} ranks (an untrained model scores {report['loss_of_an_untrained_model']:.2f})")
    if not ok:
        raise SystemExit(1)
    return report


def run_in_workdir(run_at: Callable[[Path], Any], module: str, description: str, argv: list[str] | None) -> None:
    """``python -m <module> [workdir]`` for a demo: without a workdir, the run lives in a temporary directory."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("workdir", type=Path, nargs="?", default=None, help="keep the stores, logs and report here")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        run_at(args.workdir)
        return
    with tempfile.TemporaryDirectory(prefix=f"loadspec-{module.rsplit('.', 1)[-1]}-") as tmp:
        run_at(Path(tmp))


def main(argv: list[str] | None = None) -> None:
    """``python -m demos.train_resume [workdir]``."""
    run_in_workdir(run, "demos.train_resume", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    main()
