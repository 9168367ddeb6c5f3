"""Figures a 2-core machine cannot give: build and streaming rates on many cores, and a GPU step fed by the loader.

Run from the repository root on the lent GPU machine (16 cores, one H100/H200)::

    PYTHONPATH=. python3 benchmarks/device/run.py --docs 100000 --out "$OUT"

Every part is independent (a part that fails prints its error and the others
still run) and prints one line of a table; the whole result goes to
``<out>/device.json``. Parts:

* ``encode``: the raw ``tokenizers`` rate, ``encode_batch_fast`` in batches of
  1,000 on all cores (the ceiling the build and the streaming path chase);
* ``build``: ``TokenStore.build(num_proc=cores)`` on the same texts, and its
  ratio to ``encode``; ``tasks``: the same build as N task processes and a commit
  (when ``impl`` has the task build);
* ``stream``: the streaming dataset's tokens/s over the same jsonl files (when
  ``impl`` has it), 0 and N workers;
* ``loader``: ``PackedDataset`` + ``build_dataloader`` tokens/s with no model;
* ``gpu``: a 125M-parameter GPT (12 layers, d=768, seq 1024, bf16 autocast)
  trained from random tokens already on the GPU, then fed by the loader; the
  loader-fed rate over the synthetic rate says whether the loader keeps up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "gpt2"
RESULTS: dict[str, Any] = {}


def part(name: str):
    def wrap(fn):
        def run(*args: Any, **kwargs: Any) -> None:
            t0 = time.perf_counter()
            try:
                RESULTS[name] = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a part that fails must not stop the others
                traceback.print_exc()
                RESULTS[name] = {"error": f"{type(exc).__name__}: {exc}"}
            RESULTS[name]["wall_s"] = round(time.perf_counter() - t0, 2)
            print(f"[{name}] {json.dumps(RESULTS[name])}", flush=True)
        return run
    return wrap


def make_texts(n: int, seed: int = 20240611) -> list[str]:
    """``n`` texts of KJV words, log-normal lengths (median ~320 words), as benchmarks/corpora.py makes them."""
    words: list[str] = []
    with open(ROOT / "fixtures" / "data" / "kjv_chapters.jsonl") as fh:
        for line in fh:
            words.extend(json.loads(line)["text"].split())
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    counts = np.clip(np.rint(rng.lognormal(np.log(400), 1.0, n) / 1.26), 1, 16000).astype(np.int64)
    begins = rng.integers(0, len(words) - int(counts.max()) - 1, size=n)
    return [" ".join(words[b:b + c]) for b, c in zip(begins.tolist(), counts.tolist())]


def write_jsonl(texts: list[str], out: Path, files: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // files)
    for k in range(files):
        with open(out / f"part-{k:03d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in texts[k * per:(k + 1) * per])


@part("encode")
def raw_encode(texts: list[str]) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    tok.encode_batch_fast(texts[:1000])  # warm
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 1000):
        n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + 1000]))
    dt = time.perf_counter() - t0
    return {"tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt)}


@part("build")
def build(data: Path, work: Path, cores: int, docs_per_file: int | None) -> dict[str, Any]:
    from impl import TokenStore

    out = work / ("store" if docs_per_file is None else "store-files")
    t0 = time.perf_counter()
    store = TokenStore.build(str(data), str(TOKENIZER), str(out), num_proc=cores, overwrite=True,
                             docs_per_file=docs_per_file)
    dt = time.perf_counter() - t0
    return {"tokens": store.num_tokens, "seconds": round(dt, 2), "tokens_per_s": round(store.num_tokens / dt),
            "num_proc": cores, "files": store.num_files}


@part("tasks")
def task_build(data: Path, work: Path, tasks: int, docs_per_file: int) -> dict[str, Any]:
    """``tasks`` processes of ``build_task`` (one token file each), the last to finish commits."""
    out = work / "store-tasks"
    code = ("import sys; from impl.build_tasks import build_task; "
            f"build_task({str(data)!r}, {str(TOKENIZER)!r}, {str(out)!r}, task=int(sys.argv[1]), tasks={tasks}, "
            f"docs_per_file={docs_per_file}, commit_when_done=True)")
    env = {**os.environ, "RAYON_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // tasks))}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], cwd=ROOT, env=env) for i in range(tasks)]
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        raise RuntimeError(f"task exit codes {codes}")
    dt = time.perf_counter() - t0
    meta = json.loads((out / "meta.json").read_text())
    local = work / "store-files" / "meta.json"
    same = local.exists() and meta.get("fingerprint") == json.loads(local.read_text()).get("fingerprint")
    return {"tokens": meta["num_tokens"], "seconds": round(dt, 2), "tokens_per_s": round(meta["num_tokens"] / dt),
            "tasks": tasks, "same_fingerprint_as_local_build": same}


@part("stream")
def stream(data: Path, work: Path, cores: int) -> dict[str, Any]:
    import impl

    if not hasattr(impl, "StreamingDataset"):
        raise NotImplementedError("this impl has no StreamingDataset")
    res: dict[str, Any] = {}
    for workers in (0, min(8, cores)):
        ds = impl.StreamingDataset(str(data / "*.jsonl"), tokenizer=str(TOKENIZER), seq_len=1024, num_lanes=16,
                                   index_dir=str(work / "stream-index"))
        loader = impl.build_dataloader(ds, batch_size=16, num_workers=workers)
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            n += int(batch["input_ids"].numel())
        dt = time.perf_counter() - t0
        res[f"workers_{workers}_tokens_per_s"] = round(n / dt)
    return res


def packed(work: Path):
    from impl import PackedDataset, TokenStore

    return PackedDataset(TokenStore.open(str(work / "store")), seq_len=1024, packing="best_fit",
                         shuffle="global", seed=0)


@part("loader")
def loader_only(work: Path, workers: int, steps: int) -> dict[str, Any]:
    from impl import build_dataloader

    res: dict[str, Any] = {}
    for w in (0, workers):
        loader = build_dataloader(packed(work), batch_size=16, num_workers=w)
        it = iter(loader)
        next(it)
        t0 = time.perf_counter()
        n = 0
        for _ in range(steps):
            n += int(next(it)["input_ids"].numel())
        res[f"workers_{w}_tokens_per_s"] = round(n / (time.perf_counter() - t0))
    return res


def gpt(vocab: int, layers: int = 12, d: int = 768, heads: int = 12, seq: int = 1024):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            x = self.tok(ids) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


@part("gpu")
def gpu_step(work: Path, workers: int, steps: int) -> dict[str, Any]:
    import torch

    from impl import build_dataloader

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = gpt(50257).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    def step(ids: torch.Tensor, labels: torch.Tensor, pos: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids, pos)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                     ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    b, t = 16, 1024
    ids = torch.randint(0, 50257, (b, t), device=dev)
    pos = torch.arange(t, device=dev).expand(b, t)
    for _ in range(5):
        step(ids, ids, pos)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(ids, ids, pos)
    torch.cuda.synchronize()
    synthetic = b * t * steps / (time.perf_counter() - t0)

    loader = build_dataloader(packed(work), batch_size=b, num_workers=workers, pin_memory=True)
    it = iter(loader)
    for _ in range(5):
        batch = next(it)
        step(batch["input_ids"].to(dev), batch["labels"].to(dev), batch["position_ids"].to(dev))
    torch.cuda.synchronize()
    wait = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        w0 = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - w0
        step(batch["input_ids"].to(dev, non_blocking=True), batch["labels"].to(dev, non_blocking=True),
             batch["position_ids"].to(dev, non_blocking=True))
    torch.cuda.synchronize()
    fed = b * t * steps / (time.perf_counter() - t0)
    return {"gpu": torch.cuda.get_device_name(), "params_m": round(params / 1e6, 1),
            "synthetic_tokens_per_s": round(synthetic), "loader_fed_tokens_per_s": round(fed),
            "fed_over_synthetic": round(fed / synthetic, 3), "host_wait_fraction": round(wait / (b * t * steps / fed), 4),
            "workers": workers}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/device-out"))
    ap.add_argument("--work", default="/tmp/loadspec-device")
    ap.add_argument("--parts", default="encode,build,tasks,stream,loader,gpu")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(args.work)
    data = work / "data"
    texts = make_texts(args.docs)
    write_jsonl(texts, data, files=16)
    parts = args.parts.split(",")
    RESULTS["machine"] = {"cores": cores, "docs": args.docs, "python": sys.version.split()[0]}
    if "encode" in parts:
        raw_encode(texts)
    per_file = -(-args.docs // cores)
    if "build" in parts:
        build(data, work, cores, None)
        RESULTS["build_default_files"] = RESULTS.pop("build")
        build(data, work, cores, per_file)
    if "tasks" in parts:
        task_build(data, work, cores, per_file)
    if "stream" in parts:
        stream(data, work, cores)
    if "loader" in parts:
        loader_only(work, min(8, cores), args.steps)
    if "gpu" in parts:
        gpu_step(work, min(8, cores), args.steps)
    enc = RESULTS.get("encode", {}).get("tokens_per_s")
    for name in ("build_default_files", "build", "tasks"):
        got = RESULTS.get(name, {}).get("tokens_per_s")
        if enc and got:
            RESULTS[name]["ratio_to_raw_encode"] = round(got / enc, 3)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "device.json").write_text(json.dumps(RESULTS, indent=2))
    print(json.dumps(RESULTS, indent=2))


if __name__ == "__main__":
    main()
