"""Resume latency in a new process: what a restarted training job pays, which in-process rounds cannot show.

``test_resume.py``'s ``impl-fresh`` rounds build a fresh store, dataset and
loader in a process that has already resumed: numpy's and torch's first-use
work, the ABC caches torch's ``DataLoader`` consults and the allocator's
pages are warm there. Here each measurement is a new interpreter: it imports
impl, torch and numpy first (untimed, as a job does before it loads a
checkpoint), then times ``TokenStore.open`` -> ``PackedDataset`` (plan cached)
-> ``build_dataloader`` -> ``load_state_dict`` -> first batch once, then the
same path again in the same process (what the in-process benchmark sees).

Run::

    LOADSPEC_BENCH_SIZE=L .venv/bin/python -m benchmarks.fresh_process --runs 9

and it prints, per position, the median (and min) of the first resume in a new
process and of the second. Every first batch is checked to start at the
resumed sample.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import harness
from benchmarks.corpora import Corpus, size_from_env
from benchmarks.workloads import POSITIONS, RESUME_BATCH


def _resume(corpus: Corpus, state: dict[str, Any]) -> float:
    """Seconds from ``TokenStore.open`` to the first batch; refuses a batch that starts elsewhere."""
    start = time.perf_counter()
    loader = harness.impl_loader(harness.impl_dataset(corpus), batch_size=RESUME_BATCH)
    loader.load_state_dict(state)
    batch = next(iter(loader))
    elapsed = time.perf_counter() - start
    if int(batch["sample_index"][0]) != state["consumed"]:
        raise AssertionError(f"resumed at sample {int(batch['sample_index'][0])}, not {state['consumed']}")
    return elapsed


def _child(size: str, state_json: str) -> None:
    """In the new process: imports first (untimed), then the first and the second resume, as JSON seconds."""
    for module in ("numpy", "torch", "impl.store", "impl.dataset", "impl.loader"):
        importlib.import_module(module)
    corpus = Corpus(size)
    corpus.store()
    state = json.loads(state_json)
    print(json.dumps([_resume(corpus, state), _resume(corpus, state)]))


def measure(size: str, runs: int, positions: tuple[float, ...] = POSITIONS) -> dict[float, dict[str, float]]:
    """Per position: medians and minima (ms) of the first resume in ``runs`` new processes, and of the second."""
    corpus = Corpus(size)
    dataset = harness.impl_dataset(corpus)
    total = dataset.num_samples(0)
    dataset.plan(0)                      # the plan cache is warm, as after any earlier run of the job
    loader = harness.impl_loader(dataset, batch_size=RESUME_BATCH)
    out: dict[float, dict[str, float]] = {}
    for position in positions:
        state = harness.impl_state(loader, int(position * total) // RESUME_BATCH * RESUME_BATCH)
        first, second = [], []
        for _ in range(runs):
            done = subprocess.run([sys.executable, "-m", "benchmarks.fresh_process", "--child", size, json.dumps(state)],
                                  capture_output=True, text=True, check=True, timeout=120)
            a, b = json.loads(done.stdout.strip().splitlines()[-1])
            first.append(a * 1e3)
            second.append(b * 1e3)
        out[position] = {"first_median_ms": statistics.median(first), "first_min_ms": min(first),
                         "second_median_ms": statistics.median(second), "second_min_ms": min(second)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="resume latency in a new process (see the module docstring)")
    ap.add_argument("--size", default=None, help="S | M | L (default: $LOADSPEC_BENCH_SIZE or S)")
    ap.add_argument("--runs", type=int, default=9, help="new processes per position")
    ap.add_argument("--child", nargs=2, metavar=("SIZE", "STATE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(*args.child)
        return
    size = (args.size or size_from_env()).upper()
    for position, row in measure(size, args.runs).items():
        print(f"{size} at {position:.0%}: first resume in a new process {row['first_median_ms']:.2f} ms "
              f"(min {row['first_min_ms']:.2f}), the second in it {row['second_median_ms']:.2f} ms "
              f"(min {row['second_min_ms']:.2f}), medians of {args.runs} processes")


if __name__ == "__main__":
    main()
