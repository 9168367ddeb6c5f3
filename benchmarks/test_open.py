"""(1) Warm open: an already-converted corpus opened/constructed again (imports and conversion excluded).

Page cache: warm (the same files were opened just before, in the warmup round).
impl's ``TokenStore.open`` reads ``meta.json`` and O(1) bytes per token file,
so it should not grow with the token count: it runs on every size up to
``LOADSPEC_BENCH_SIZE``. ``impl-dataset`` adds ``PackedDataset(...)`` (which
reads the document lengths: O(documents)).
"""

from __future__ import annotations

import pytest

from benchmarks import harness
from benchmarks.corpora import Corpus, size_from_env, sizes_up_to
from benchmarks.peers import require_datasets, require_litdata, require_streaming
from benchmarks.workloads import OPEN_LOADERS, RESUME_BATCH, SEQ_LEN, Open

WORKLOADS = [Open(loader, s) for loader in OPEN_LOADERS for s in sizes_up_to(size_from_env())]


def _opener(w: Open, corpus: Corpus, held: list):
    """``(setup, open)`` for one loader; conversion happens here, untimed. Opened objects go to ``held``."""

    def setup():
        held.clear()
        if w.loader == "mosaicml":
            harness.mosaic_cleanup()
        return (), {}

    if w.loader == "impl":
        from impl.store import TokenStore

        path = corpus.store()
        return setup, lambda: held.append(TokenStore.open(path))
    if w.loader == "impl-dataset":
        from impl.dataset import PackedDataset
        from impl.store import TokenStore

        path = corpus.store()
        return setup, lambda: held.append(PackedDataset(TokenStore.open(path), seq_len=SEQ_LEN, shuffle="global"))
    if w.loader == "hf-load_from_disk":
        datasets = require_datasets()
        path = str(corpus.hf_disk())
        return setup, lambda: held.append(datasets.load_from_disk(path))
    if w.loader == "hf-load_dataset":
        require_datasets()
        corpus.hf_load_dataset()  # fills the cache: the timed call is a cache hit
        return setup, lambda: held.append(corpus.hf_load_dataset())
    if w.loader == "mosaicml":
        require_streaming()
        corpus.mds()  # setup runs mosaic_cleanup (untimed); the timer covers the constructor only
        return setup, lambda: held.append(harness.mosaic_dataset(corpus, RESUME_BATCH, cleanup=False))
    if w.loader == "litdata":
        litdata = require_litdata()
        path = str(corpus.litdata())
        return setup, lambda: held.append(litdata.StreamingDataset(path))
    raise AssertionError(w)


@pytest.mark.parametrize("w", WORKLOADS, ids=str)
def test_open(benchmark, w: Open, smoke: bool):
    corpus = Corpus(w.size)
    held: list = []
    setup, target = _opener(w, corpus, held)
    benchmark.group = "open"
    benchmark.extra_info.update(kind="open", loader=w.loader, size=w.size, documents=corpus.num_docs,
                                tokens=corpus.num_tokens, cache="warm")
    rounds = 1 if smoke else (5 if w.loader == "hf-load_dataset" else 20)
    benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=0 if smoke else 1)
    held.clear()
    if w.loader == "mosaicml":
        harness.mosaic_cleanup()
