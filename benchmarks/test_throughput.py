"""(4) Iteration throughput, one process and 2 DataLoader workers, against the raw-gather limit.

impl: packed ``seq_len=2048`` samples (concat packing; shuffle none/global),
batches of 8, through ``build_dataloader``. The limit, measured in the same
run on the same bytes: ``raw`` copies exactly the token runs those batches'
``input_ids`` came from out of the store's memory-mapped Arrow files (mapped
with pyarrow here, not through impl) into a ``[8, 2048]`` buffer; no
labels/positions/collation. ``floor`` does the same copies into int64 and
writes the other three int64 fields once each without computing them
(``harness.floor_gather``): the memory traffic of the output the issue
specifies, a bound no loader producing it can beat. Peers yield documents (batches of 32): ``hf-numpy``
is map-style ``ds[i]`` with numpy format, ``hf-arrow`` batched Arrow slices of
1000 rows (values copied, so the bytes are read), ``mosaicml`` and ``litdata``
their datasets through a DataLoader / StreamingDataLoader.

Each round iterates a fixed token budget (``TPUT_TOKENS``) from the epoch
start, after an untimed first batch (workers started, plan loaded) and an
untimed warmup round over the same bytes, so the figures are page-cache warm
(the report prints how much of the store was resident before the run).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.corpora import Corpus
from benchmarks.peers import require_datasets, require_litdata, require_streaming
from benchmarks.workloads import PEER_TPUT_BATCH, SEQ_LEN, THROUGHPUTS, TPUT_BATCH, TPUT_TOKENS, Throughput


def _docs_for(corpus: Corpus, budget: int) -> int:
    cum = np.cumsum(corpus.lengths)
    return min(int(np.searchsorted(cum, budget)) + 1, corpus.num_docs)


@pytest.fixture(scope="module")
def raw_batches(corpus, impl_datasets, size):
    """The token runs of the batches impl iterates in a round (after its untimed first batch)."""
    n_batches = max(1, TPUT_TOKENS[size] // (TPUT_BATCH * SEQ_LEN))
    files = harness.mapped_token_files(corpus.store())
    cache: dict = {}

    def get(shuffle: str):
        if shuffle not in cache:
            ds = impl_datasets(shuffle)
            n_here = min(n_batches, ds.num_samples(0) // TPUT_BATCH - 1)
            runs = harness.sample_runs(ds, 0, range(TPUT_BATCH, TPUT_BATCH * (n_here + 1)),
                                       _file_token_starts(ds.store))
            cache[shuffle] = [runs[k:k + TPUT_BATCH] for k in range(0, len(runs), TPUT_BATCH)]
        return files, cache[shuffle]
    return get


def _file_token_starts(store) -> list[int]:
    starts = [0]
    for n in store.file_token_counts:
        starts.append(starts[-1] + n)
    return starts


@pytest.mark.parametrize("w", THROUGHPUTS, ids=str)
def test_throughput(benchmark, w: Throughput, corpus: Corpus, size: str, smoke: bool, request):
    benchmark.group = "throughput"
    budget = TPUT_TOKENS[size]
    held: dict = {}
    counted: dict = {"tokens": 0, "samples": 0}
    rounds, warmup = (1, 0) if smoke else (3, 1)

    def finish():
        it = held.pop("it", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        held.clear()

    if w.loader in ("raw", "floor"):
        files, batches = request.getfixturevalue("raw_batches")(w.shuffle)
        gather = harness.raw_gather if w.loader == "raw" else harness.floor_gather

        def setup():
            return (), {}

        def target():
            counted["tokens"] = gather(files, batches, SEQ_LEN)
            counted["samples"] = sum(len(b) for b in batches)
        unit = "packed samples"
    elif w.loader == "impl":
        ds = request.getfixturevalue("impl_datasets")(w.shuffle)
        n_batches = max(1, min(budget // (TPUT_BATCH * SEQ_LEN), ds.num_samples(0) // TPUT_BATCH - 1))
        loader = harness.impl_loader(ds, batch_size=TPUT_BATCH, num_workers=w.workers)
        state0 = harness.impl_state(loader, 0)

        def setup():
            finish()
            loader.load_state_dict(state0)
            it = iter(loader)
            next(it)  # untimed: workers started, plan loaded
            held["gen"] = it
            return (it,), {}

        def target(it):
            tokens = samples = 0
            for _ in range(n_batches):
                batch = next(it)
                tokens += harness.batch_tokens(batch)
                samples += len(batch["input_ids"])
            counted.update(tokens=tokens, samples=samples)
        unit = "packed samples"
    else:
        n_docs = _docs_for(corpus, budget)
        unit = "documents"
        if w.loader in ("hf-numpy", "hf-arrow"):
            require_datasets()
            base = harness.hf_from_disk(corpus)
        if w.loader == "hf-numpy" and w.workers == 0:
            ds = base.with_format("numpy")

            def setup():
                ds[0]
                return (), {}

            def target():
                tokens = 0
                for i in range(n_docs):
                    tokens += len(ds[i]["input_ids"])
                counted.update(tokens=tokens, samples=n_docs)
        elif w.loader == "hf-arrow":
            ds = base.with_format("arrow")

            def setup():
                return (), {}

            def target():
                tokens = 0
                for a in range(0, n_docs, 1000):
                    col = ds[a:min(a + 1000, n_docs)].column("input_ids").combine_chunks()
                    tokens += len(np.array(col.values.to_numpy(zero_copy_only=False), copy=True))
                counted.update(tokens=tokens, samples=n_docs)
        else:
            if w.loader == "hf-numpy":
                from torch.utils.data import DataLoader

                def make():
                    return DataLoader(base.with_format("numpy"), batch_size=PEER_TPUT_BATCH,
                                      num_workers=w.workers, collate_fn=harness.list_collate)
            elif w.loader == "mosaicml":
                require_streaming()
                from torch.utils.data import DataLoader

                def make():
                    held.pop("ds", None)
                    held["ds"] = ds = harness.mosaic_dataset(corpus, PEER_TPUT_BATCH)
                    return DataLoader(ds, batch_size=PEER_TPUT_BATCH, num_workers=w.workers,
                                      collate_fn=harness.list_collate)
            elif w.loader == "litdata":
                require_litdata()

                def make():
                    return harness.litdata_loader(corpus, PEER_TPUT_BATCH, num_workers=w.workers)
            else:
                raise AssertionError(w)
            n_batches = math.ceil(n_docs / PEER_TPUT_BATCH)
            n_batches = min(n_batches, corpus.num_docs // PEER_TPUT_BATCH - 1)

            def setup():
                finish()
                held["loader"] = make()
                it = iter(held["loader"])
                held["it"] = it
                next(it)
                return (it,), {}

            def target(it):
                tokens = samples = 0
                for _ in range(n_batches):
                    batch = next(it)
                    tokens += sum(harness.doc_tokens(x) for x in batch)
                    samples += len(batch)
                counted.update(tokens=tokens, samples=samples)

    benchmark.extra_info.update(kind="throughput", loader=w.loader, workers=w.workers, shuffle=w.shuffle,
                                size=corpus.size, unit=unit, seq_len=SEQ_LEN,
                                cache="warm (a warmup round reads the same bytes first)")
    try:
        benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=warmup)
    finally:
        gen = held.pop("gen", None)
        finish()
        if gen is not None:
            gen.close()
        if w.loader == "mosaicml":
            harness.mosaic_cleanup()
    assert counted["tokens"] > 0
    benchmark.extra_info.update(tokens=counted["tokens"], samples=counted["samples"])
