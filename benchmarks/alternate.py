"""Old and new code side by side: the impl resume, open and throughput benchmarks, alternating, one corpus cache.

Why alternating: on a shared machine the load drifts over minutes, so two
runs one after the other compare the machine at two times as much as the
code. Running old, new, old, new ... and taking each benchmark's median over
its runs in each tree puts the drift on both sides alike.

Usage (from the new tree's root; the old tree is any checkout, e.g.
``git worktree add /tmp/old17 7eb6329``)::

    LOADSPEC_BENCH_SIZE=L python -m benchmarks.alternate /tmp/old17 . --runs 2

Both trees read the same corpus cache (``~/.cache/loadspec-bench``), so the
store must be one both formats open (the benchmarks' ``store_dir_name``).
``open`` benchmarks of other sizes than ``LOADSPEC_BENCH_SIZE`` are left out
(they would build those corpora).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ("benchmarks/test_resume.py", "benchmarks/test_open.py", "benchmarks/test_throughput.py")
SIZES = ("S", "M", "L", "XL")


def node_ids(tree: Path, size: str) -> list[str]:
    """The impl benchmarks of ``FILES`` in ``tree``, ``open`` ones only at ``size``."""
    out = subprocess.run([sys.executable, "-m", "pytest", *FILES, "-k", "impl", "--collect-only", "-q",
                          "-p", "no:cacheprovider"], cwd=tree, capture_output=True, text=True, check=True).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    return [i for i in ids if "test_open" not in i or i.rstrip("]").rsplit("-", 1)[-1] == size
            or i.rstrip("]").rsplit("-", 1)[-1] not in SIZES]


def run_once(tree: Path, ids: list[str], out: Path) -> dict[str, float]:
    """One pytest run of ``ids`` in ``tree``: each benchmark's median seconds."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-m", "pytest", *ids, "-q", "-p", "no:cacheprovider",
                    f"--benchmark-json={out}"], cwd=tree, env=env, check=True)
    return {b["name"]: b["stats"]["median"] for b in json.loads(out.read_text())["benchmarks"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the old tree")
    parser.add_argument("new", type=Path, help="the new tree")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (alternating old, new)")
    parser.add_argument("--only", default="", help="keep only benchmarks whose id contains this (e.g. resume-impl-fresh)")
    args = parser.parse_args(argv)
    size = os.environ.get("LOADSPEC_BENCH_SIZE", "S")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    ids = [i for i in node_ids(trees["new"], size) if args.only in i]
    got: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            for side, tree in trees.items():
                medians = run_once(tree, ids, Path(tmp) / f"{side}-{r}.json")
                for name, seconds in medians.items():
                    got[side].setdefault(name, []).append(seconds)
    print(f"size {size}, {args.runs} alternating runs per tree; median of the per-run medians (ms)")
    print(f"{'benchmark':42} {'old':>9} {'new':>9} {'new/old':>7}  per-run medians old | new")
    for name in sorted(got["new"]):
        runs = {side: got[side].get(name, [float("nan")]) for side in got}
        old, new = (statistics.median(runs[side]) * 1e3 for side in ("old", "new"))
        digits = 3 if max(old, new) < 10 else 1     # sub-10 ms figures (open, resume) need their microseconds
        spread = " | ".join(" ".join(f"{v * 1e3:.{digits}f}" for v in runs[side]) for side in ("old", "new"))
        print(f"{name:42} {old:9.{digits}f} {new:9.{digits}f} {new / old:7.2f}  {spread}")


if __name__ == "__main__":
    main()
