"""What the integrity checks add over a long first read: thousands of batches, where the benchmark times 512.

``test_integrity.py``'s ``impl-first-vs-verified`` rounds time the first 512
batches after a resume, where nearly every document is read for the first
time. How the checks' cost falls as a first epoch goes on (documents whose
file is verified whole skip their check; blocks read ahead serve the next
batches) needs a longer window, too long for a pytest-benchmark round. Here
each run iterates ``--batches`` batches of 8 x 2048 packed tokens twice, in
alternation: on a new store object whose blocks and documents are all
unverified (``first``), and on one whose files carry no checks at all
(``unchecked``: ``TokenStore._new_blocks`` returns None, and the fill makes no
check call). The overhead is first / unchecked - 1, as ``check_overhead`` is
in the benchmark.

Run::

    LOADSPEC_BENCH_SIZE=L .venv/bin/python -m benchmarks.first_epoch --batches 20000 --runs 2

(20,000 batches are about half an epoch at L). It prints, per shuffle, the
median seconds of both arms and the median overhead over the runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any
from unittest import mock

from benchmarks import harness
from benchmarks.corpora import Corpus, size_from_env
from benchmarks.workloads import SEQ_LEN, TPUT_BATCH


def _store(corpus: Corpus, checked: bool) -> Any:
    """A new store object: every check to do (``checked``), or none (no block or document table consulted)."""
    from impl.store import TokenStore

    if checked:
        return TokenStore.open(corpus.store())
    with mock.patch.object(TokenStore, "_new_blocks", lambda self, *args: None):
        store = TokenStore.open(corpus.store())
        for f in range(store.num_files):
            store._map(f)
    return store


def _iterate(corpus: Corpus, shuffle: str, batches: int, checked: bool) -> float:
    """Seconds for ``batches`` batches after the first (untimed), from sample 0 of epoch 0."""
    from impl.dataset import PackedDataset

    store = _store(corpus, checked)
    dataset = PackedDataset(store, seq_len=SEQ_LEN, packing="concat", shuffle=shuffle, seed=0)
    loader = harness.impl_loader(dataset, batch_size=TPUT_BATCH)
    loader.load_state_dict(harness.impl_state(loader, 0))
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return time.perf_counter() - start


def measure(size: str, shuffle: str, batches: int, runs: int) -> dict[str, float]:
    """Medians over ``runs`` of both arms (seconds) and of the overhead first / unchecked - 1."""
    corpus = Corpus(size)
    usable = harness.impl_dataset(corpus, shuffle=shuffle).num_samples(0) // TPUT_BATCH - 1
    if batches > usable:
        raise SystemExit(f"--batches {batches}: the {size} corpus has {usable} batches of {TPUT_BATCH} after the first")
    first, unchecked = [], []
    for _ in range(runs):
        first.append(_iterate(corpus, shuffle, batches, checked=True))
        unchecked.append(_iterate(corpus, shuffle, batches, checked=False))
    return {"first_s": statistics.median(first), "unchecked_s": statistics.median(unchecked),
            "overhead": statistics.median(a / b - 1 for a, b in zip(first, unchecked))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the integrity checks over a long first read (see the module docstring)")
    ap.add_argument("--size", default=None, help="S | M | L (default: $LOADSPEC_BENCH_SIZE or S)")
    ap.add_argument("--batches", type=int, default=4096, help="batches timed per arm (after an untimed first)")
    ap.add_argument("--runs", type=int, default=3, help="runs of both arms, alternating")
    ap.add_argument("--shuffle", default="global,none", help="comma-separated: global, none")
    args = ap.parse_args(argv)
    size = (args.size or size_from_env()).upper()
    for shuffle in args.shuffle.split(","):
        row = measure(size, shuffle, args.batches, args.runs)
        print(f"{size} shuffle={shuffle}, {args.batches} batches of {TPUT_BATCH} x {SEQ_LEN}: first read "
              f"{row['first_s']:.2f} s, unchecked {row['unchecked_s']:.2f} s, checks {row['overhead']:+.1%} "
              f"(medians of {args.runs} runs)")


if __name__ == "__main__":
    main()
