"""The mixture demo (``make demo-mix``): two corpora by weight, a validation split, a resume on 3 ranks.

Why: ``demos.train_resume`` shows one corpus; pretraining mixes several.
This trains the same tiny model with DDP on a 70/30 mixture of two real
corpora, each cut into a training split (``"train[:90%]"``) and a held-out
validation split (``"train[90%:]"``): King James Bible chapters (the shipped
fixture) and the opening of loadspec's reference modules, both tokenized with the committed
GPT-2 tokenizer. Phase 1 runs 2 gloo ranks and checkpoints at step K, runs a
few steps more and stops (that work is lost); phase 2 resumes the checkpoint
on 3 ranks and finishes the epoch. The audit counts, per source, the samples
and tokens trained against the source's training split, and over the mixed
stream duplicates and missing samples (both must be 0), then reports the
validation loss on each corpus's held-out split.

Worked example::

    $ python -m demos.mixture /tmp/demo-mix        # doctest: +SKIP
    [demo-mix] OK: duplicates 0, missing 0; web 70.2 % / code 29.8 % of the samples before a source ran out
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from demos.train_resume import (
    TinyLM,
    check_world_sizes,
    read_logs,
    run_in_workdir,
    save_checkpoint,
    spawn_phase,
    train_on_rank,
)
from fixtures import generators
from impl._atomic import atomic_write_json
from impl.collation import collate
from impl.partition import trained_end
from impl.resume import audit_coverage
from reference.partition import PartitionConfig

LOG = "[demo-mix]"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class MixDemoConfig:
    """Sizes chosen so the whole job finishes in a few minutes on 2 CPU cores."""

    documents: int = 40
    seq_len: int = 128
    seed: int = 1234
    weights: tuple[float, float] = (0.7, 0.3)
    stopping: str = "all_exhausted"
    train_split: str = "train[:90%]"
    validation_split: str = "train[90%:]"
    global_batch: int = 12
    first_world: int = 2
    second_world: int = 3
    checkpoint_step: int = 8
    steps_after_checkpoint: int = 3
    lr: float = 1.0
    dim: int = 32
    join_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_world_sizes(self.global_batch, self.first_world, self.second_world)


NAMES = ("web", "code")


def _sources(work: Path, cfg: MixDemoConfig, split: str) -> list[Any]:
    from impl.dataset import PackedDataset

    return [PackedDataset(work / f"store-{name}", seq_len=cfg.seq_len, packing="concat", shuffle="global",
                          seed=cfg.seed + i, split=split)
            for i, name in enumerate(NAMES)]


def mixture(work: Path, cfg: MixDemoConfig) -> Any:
    """The training mixture: each corpus's training split, mixed by ``cfg.weights`` (MIX-13)."""
    from impl.mixed_dataset import MixedDataset

    return MixedDataset(_sources(work, cfg, cfg.train_split), weights=cfg.weights, stopping=cfg.stopping, seed=cfg.seed)


def _rank_main(rank: int, world: int, phase: int, workdir: str, config: dict[str, Any]) -> None:
    import torch.distributed as dist

    from impl.loader import build_dataloader

    values: dict[str, Any] = {k: tuple(v) if k == "weights" else v for k, v in config.items()}
    cfg = MixDemoConfig(**values)
    work = Path(workdir)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work / f'rendezvous-{phase}'}", rank=rank, world_size=world)
    dataset = mixture(work, cfg)
    loader = build_dataloader(dataset, batch_size=cfg.global_batch // world, rank=rank, world_size=world)
    model = TinyLM(dataset.sources[0].store.base.vocab_size, cfg.dim)
    train_on_rank(loader, model, rank=rank, world=world, phase=phase, work=work, lr=cfg.lr,
                  checkpoint_step=cfg.checkpoint_step, steps_after_checkpoint=cfg.steps_after_checkpoint,
                  describe=_describe)
    if phase == 2 and rank == 0:
        save_checkpoint(work / "final", model, {"step": -1})


def _describe(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"samples": batch["sample_index"].tolist(), "source": batch["source"].tolist(),
            "source_index": batch["source_index"].tolist(), "tokens": (batch["doc_ids"] >= 0).sum(dim=1).tolist()}


def _validation_loss(workdir: Path, cfg: MixDemoConfig) -> dict[str, float]:
    import safetensors.torch as st

    out = {}
    for name, ds in zip(NAMES, _sources(workdir, cfg, cfg.validation_split)):
        model = TinyLM(ds.store.base.vocab_size, cfg.dim)
        model.load_state_dict(st.load_file(str(workdir / "final" / "model.safetensors")))
        batch = collate(ds.__getitems__(list(range(min(ds.num_samples(0), 32)))))
        with torch.no_grad():
            logits = model(batch["input_ids"])
            out[name] = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                                 ignore_index=-100))
    return out


def _code_texts(chars: int = 6000) -> list[str]:
    """The first ``chars`` characters of each of loadspec's reference modules: a small, real code corpus."""
    return [p.read_text()[:chars] for p in sorted((REPO / "reference").glob("*.py")) if p.stat().st_size > 0]


def run(workdir: Path, cfg: MixDemoConfig = MixDemoConfig()) -> dict[str, Any]:
    """Run the whole job in ``workdir`` and return the audit report (also printed)."""
    from impl.store import TokenStore

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    texts = {"web": generators.load_corpus(limit=cfg.documents), "code": _code_texts()}
    for name in NAMES:
        TokenStore.build(texts[name], generators.tokenizer_path(), workdir / f"store-{name}", num_proc=1, overwrite=True)
    mixed = mixture(workdir, cfg)
    sizes = mixed.source_sizes(0)
    total = mixed.num_samples(0)
    print(f"{LOG} web: {len(texts['web'])} KJV chapters, code: {len(texts['code'])} loadspec reference modules; "
          f"training splits {cfg.train_split} hold {sizes[0]} and {sizes[1]} samples of {cfg.seq_len} tokens; "
          f"mixed {cfg.weights[0]:.0%}/{cfg.weights[1]:.0%} ({cfg.stopping}): {total} samples")
    print(f"{LOG} phase 1: {cfg.first_world} gloo ranks, checkpoint after step {cfg.checkpoint_step}, stopped "
          f"{cfg.steps_after_checkpoint} steps later (that work is lost)")
    t1 = spawn_phase(_rank_main, 1, cfg.first_world, workdir, cfg, cfg.join_timeout_s)
    print(f"{LOG} phase 2: resume on {cfg.second_world} gloo ranks and finish the epoch")
    t2 = spawn_phase(_rank_main, 2, cfg.second_world, workdir, cfg, cfg.join_timeout_s)

    kept = [x for rank in read_logs(workdir, 1, cfg.first_world)[0] for x in rank if x["step"] < cfg.checkpoint_step]
    trained = kept + [x for rank in read_logs(workdir, 2, cfg.second_world)[0] for x in rank]
    resumed_at = json.loads((workdir / "checkpoint" / "meta.json").read_text())["loader"]["consumed"]
    end = trained_end(resumed_at, total, PartitionConfig(world_size=cfg.second_world,
                                                         batch_size=cfg.global_batch // cfg.second_world))
    audit = audit_coverage((s for x in trained for s in x["samples"]), end)
    rows = [(s, j, t) for x in trained for s, j, t in zip(x["source"], x["source_index"], x["tokens"])]
    per_source = {name: {"samples_in_split": sizes[i],
                         "samples_trained": sum(1 for s, _, _ in rows if s == i),
                         "distinct_samples_trained": len({j for s, j, _ in rows if s == i}),
                         "tokens_trained": sum(t for s, _, t in rows if s == i)} for i, name in enumerate(NAMES)}
    plan = mixed.plan(0)
    first_out = min(int((plan.source == s).nonzero()[0][sizes[s] - 1]) for s in range(2))
    early = Counter(plan.source[:first_out].tolist())
    report = {
        "samples_in_mixture": total,
        "samples_trained": audit.trained,
        "dropped_by_drop_last": total - end,
        "duplicates": audit.duplicates,
        "missing": audit.missing,
        "beyond_trained_range": audit.beyond_end,
        "per_source": per_source,
        "share_before_a_source_ran_out": {n: round(early[i] / max(1, first_out), 4) for i, n in enumerate(NAMES)},
        "validation_loss": _validation_loss(workdir, cfg),
        "seconds": {"phase1": round(t1, 2), "phase2": round(t2, 2)},
    }
    print(f"{LOG} report")
    print(json.dumps(report, indent=2))
    atomic_write_json(workdir / "report.json", report)
    ok = audit.exact and all(v["samples_trained"] == v["distinct_samples_trained"] for v in per_source.values())
    shares = report["share_before_a_source_ran_out"]
    print(f"{LOG} {'OK' if ok else 'FAILED'}: duplicates {audit.duplicates}, missing {audit.missing}; "
          f"web {shares['web']:.1%} / code {shares['code']:.1%} of the samples before a source ran out")
    if not ok:
        raise SystemExit(1)
    return report


def main(argv: list[str] | None = None) -> None:
    """``python -m demos.mixture [workdir]``."""
    run_in_workdir(run, "demos.mixture", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    main()
