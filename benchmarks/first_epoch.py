"""What the integrity checks add over a long first read: thousands of batches, where the benchmark times 512.

``test_integrity.py``'s ``impl-first-vs-verified`` rounds time the first 512
batches after a resume, where nearly every document is read for the first
time. How the checks' cost falls as a first epoch goes on (documents whose
file is verified whole skip their check; blocks read ahead serve the next
batches) needs a longer window, too long for a pytest-benchmark round. Here
each run iterates ``--batches`` batches of 8 x 2048 packed tokens twice, in
alternation: on a new store object whose blocks and documents are all
unverified (``first``), and on one whose files carry no checks at all
(``unchecked``: ``StoreFiles.new_blocks`` returns None, and the fill makes no
check call). The overhead is first / unchecked - 1, as ``check_overhead`` is
in the benchmark.

Run::

    LOADSPEC_BENCH_SIZE=L .venv/bin/python -m benchmarks.first_epoch --batches 20000 --runs 2

(20,000 batches are about half an epoch at L). It prints, per shuffle, the
median seconds of both arms and the median overhead over the runs.
``--store PATH`` measures another store of the same corpus, e.g. the format-3
one an older checkout built (``~/.cache/loadspec-bench/v1/L/store-v3-b16k-buffers/store``).

``--floor`` measures instead what any per-document check must pay in this
process: on a new store object (cold mapping), the microseconds per document
of one CRC-32 call per random document straight from the mapping (the check,
without any bookkeeping), and of copying the same documents with one
``bytes.join`` (a C loop whose reads overlap: what a compiled check fused with
the copy would pay), over batches of 32 documents as a global shuffle reads
them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import harness
from benchmarks.corpora import Corpus, size_from_env
from benchmarks.workloads import SEQ_LEN, TPUT_BATCH


def measure(size: str, shuffle: str, batches: int, runs: int, store: str | None = None) -> dict[str, float]:
    """Medians over ``runs`` of both arms (seconds) and of the overhead first / unchecked - 1.

    ``store``: another store of the same corpus (e.g. one of an older
    format) instead of the corpus's current-format store.
    """
    from impl.store import TokenStore

    corpus = Corpus(size)
    path = store or str(corpus.store())
    usable = harness.impl_dataset(corpus, shuffle=shuffle).num_samples(0) // TPUT_BATCH - 1
    if batches > usable:
        raise SystemExit(f"--batches {batches}: the {size} corpus has {usable} batches of {TPUT_BATCH} after the first")
    first, unchecked = [], []
    for _ in range(runs):
        first.append(harness.time_packed_batches(TokenStore.open(path), shuffle=shuffle, batches=batches)[0])
        unchecked.append(harness.time_packed_batches(harness.unchecked_store(path), shuffle=shuffle, batches=batches,
                                                     check_calls=False)[0])
    return {"first_s": statistics.median(first), "unchecked_s": statistics.median(unchecked),
            "overhead": statistics.median(a / b - 1 for a, b in zip(first, unchecked))}


def floor(size: str, batches: int, runs: int) -> dict[str, float]:
    """Medians over ``runs`` (us per document): one CRC call per cold document, and one joined copy of them."""
    import numpy as np

    from impl._crc import crc32
    from impl.store import TokenStore

    corpus = Corpus(size)
    store = TokenStore.open(corpus.store())
    starts = np.asarray(store.file_document_starts)
    rng = np.random.default_rng(0)
    out: dict[str, list[float]] = {"crc_us": [], "copy_us": []}
    for run in range(2 * runs):
        docs = rng.choice(len(store), min(32 * batches, len(store)), replace=False)
        files = np.searchsorted(starts, docs, side="right") - 1
        first, length = store.document_bounds_batch(files, docs - starts[files])
        item = store.dtype.itemsize
        spans = list(zip(files.tolist(), (first * item).tolist(), (length * item).tolist()))
        views = [memoryview(v).cast("B") for v in harness.mapped_token_files(corpus.store())]   # a fresh mapping
        rows = [spans[k:k + 32] for k in range(0, len(spans), 32)]
        start = time.perf_counter()
        if run % 2 == 0:
            for row in rows:
                for f, at, n in row:
                    crc32(views[f][at:at + n])
        else:
            for row in rows:
                b"".join([views[f][at:at + n] for f, at, n in row])
        out["crc_us" if run % 2 == 0 else "copy_us"].append((time.perf_counter() - start) / len(spans) * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the integrity checks over a long first read (see the module docstring)")
    ap.add_argument("--size", default=None, help="S | M | L (default: $LOADSPEC_BENCH_SIZE or S)")
    ap.add_argument("--batches", type=int, default=4096, help="batches timed per arm (after an untimed first)")
    ap.add_argument("--runs", type=int, default=3, help="runs of both arms, alternating")
    ap.add_argument("--shuffle", default="global,none", help="comma-separated: global, none")
    ap.add_argument("--floor", action="store_true", help="the per-document floor instead (see the module docstring)")
    ap.add_argument("--store", default=None, help="another store of the corpus (e.g. an older format's) to measure")
    args = ap.parse_args(argv)
    size = (args.size or size_from_env()).upper()
    if args.floor:
        row = floor(size, min(args.batches, 512), args.runs)
        print(f"{size}, random documents in batches of 32 on a new store object: one CRC call each from the mapping "
              f"{row['crc_us']:.2f} us a document, one bytes.join copy of them {row['copy_us']:.2f} us a document "
              f"(medians of {args.runs} runs)")
        return
    for shuffle in args.shuffle.split(","):
        row = measure(size, shuffle, args.batches, args.runs, args.store)
        print(f"{size}{' ' + args.store if args.store else ''} shuffle={shuffle}, {args.batches} batches of {TPUT_BATCH} x {SEQ_LEN}: first read "
              f"{row['first_s']:.3f} s, unchecked {row['unchecked_s']:.3f} s, checks {row['overhead']:+.1%} "
              f"(medians of {args.runs} runs)")


if __name__ == "__main__":
    main()
