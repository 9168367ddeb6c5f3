"""(6) Peak RSS across one epoch, in a fresh process: ``python -m benchmarks.rss --loader impl --size M``.

Prints one JSON object: ``peak_rss_mb`` (``VmHWM`` of this process: anonymous
plus file-backed pages it touched, so memory-mapped token pages count; not
``ru_maxrss``, which Linux carries over from the parent across exec),
``peak_anon_mb`` (the largest ``RssAnon`` sampled every 32 batches: memory
the loader itself allocated), ``children_peak_rss_mb`` (largest worker's
``VmHWM``, sampled, for ``--workers 2``), ``baseline_rss_mb`` (after imports,
before opening the corpus), the epoch's wall time, items and tokens. ``--all`` runs every loader
(each in its own subprocess) and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LOADERS = ("impl", "hf-iterable", "mosaicml", "litdata")


def _status(pid: str = "self") -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(rest.split()[0]) // 1024
    except OSError:
        pass
    return out


def _children() -> list[str]:
    pids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += f.read().split()
        except OSError:
            pass
    return pids


def _children_hwm() -> int:
    return max([_status(pid).get("VmHWM", 0) for pid in _children()] or [0])


def run_one(loader: str, size: str, workers: int) -> dict:
    from benchmarks import harness
    from benchmarks.corpora import Corpus
    from benchmarks.workloads import PEER_TPUT_BATCH, TPUT_BATCH

    corpus = Corpus(size)
    if loader == "mosaicml":
        from benchmarks.peers import import_streaming

        import_streaming()
    if loader == "litdata":
        import litdata  # noqa: F401
    import datasets  # noqa: F401  (imports excluded from the baseline)
    import torch  # noqa: F401

    # Convert outside the measurement (a cached no-op after the first run).
    {"impl": corpus.store, "hf-iterable": corpus.hf_disk, "mosaicml": corpus.mds, "litdata": corpus.litdata}[loader]()
    base = _status()
    peak_anon = base.get("RssAnon", 0)
    child_peak = 0
    t0 = time.perf_counter()
    items = tokens = 0
    if loader == "impl":
        ds = harness.impl_dataset(corpus, shuffle="global")
        it = iter(harness.impl_loader(ds, batch_size=TPUT_BATCH, num_workers=workers))
        count = lambda b: (len(b["input_ids"]), int(b["input_ids"].numel()))
    elif loader == "hf-iterable":
        ids = harness.hf_iterable(corpus)
        it = iter(ids.iter(batch_size=PEER_TPUT_BATCH))
        count = lambda b: (len(b["input_ids"]), sum(len(x) for x in b["input_ids"]))
    elif loader == "mosaicml":
        from torch.utils.data import DataLoader

        it = iter(DataLoader(harness.mosaic_dataset(corpus, PEER_TPUT_BATCH), batch_size=PEER_TPUT_BATCH,
                             num_workers=workers, collate_fn=harness.list_collate))
        count = lambda b: (len(b), sum(harness.doc_tokens(x) for x in b))
    elif loader == "litdata":
        it = iter(harness.litdata_loader(corpus, PEER_TPUT_BATCH, num_workers=workers))
        count = lambda b: (len(b), sum(harness.doc_tokens(x) for x in b))
    else:
        raise SystemExit(f"unknown loader {loader!r}; choose from {', '.join(LOADERS)}")
    for k, batch in enumerate(it):
        n, t = count(batch)
        items += n
        tokens += t
        if k % 32 == 0:
            peak_anon = max(peak_anon, _status().get("RssAnon", 0))
            child_peak = max(child_peak, _children_hwm())
    seconds = time.perf_counter() - t0
    del it
    peak_anon = max(peak_anon, _status().get("RssAnon", 0))
    return {
        "loader": loader, "size": size, "workers": workers, "items": items, "tokens": tokens,
        "epoch_seconds": round(seconds, 3),
        "baseline_rss_mb": base.get("VmRSS"),
        "peak_rss_mb": _status().get("VmHWM"),
        "peak_anon_mb": peak_anon,
        "peak_anon_over_baseline_mb": peak_anon - base.get("RssAnon", 0),
        "children_peak_rss_mb": child_peak,
    }


def run_subprocess(loader: str, size: str, workers: int, timeout: float = 1800) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.rss", "--loader", loader, "--size", size, "--workers", str(workers)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loader", default="impl", choices=LOADERS)
    ap.add_argument("--size", default="M")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="every loader (impl also with 2 workers), each in a subprocess")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not args.all:
        print(json.dumps(run_one(args.loader, args.size.upper(), args.workers)))
        return
    results = []
    for loader, workers in [("impl", 0), ("impl", 2), ("hf-iterable", 0), ("mosaicml", 0), ("litdata", 0)]:
        try:
            results.append(run_subprocess(loader, args.size.upper(), workers))
        except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
            results.append({"loader": loader, "workers": workers, "error": str(exc).splitlines()[-1]})
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
