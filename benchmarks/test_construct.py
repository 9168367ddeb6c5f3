"""(1b) Dataset construction: ``PackedDataset(store, ...)`` and ``len(ds)`` on an opened store, the plan cached on disk.

What a fresh process (a restarted job, a spawned DataLoader worker) pays
for a dataset before its first batch. The store is opened in the untimed
setup (``test_open`` times that), fresh each round, so nothing the store
caches (its mapped files, its lengths) carries over; the epoch's plan was
written to the cache before the first round, as by any earlier run. The
dataset must read no token file (``conformance/impl_tests/test_lazy.py``
counts that), so this should not grow with the corpus.
"""

from __future__ import annotations

import pytest

from benchmarks.corpora import Corpus
from benchmarks.workloads import CONSTRUCTS, SEQ_LEN, Construct


@pytest.mark.parametrize("w", CONSTRUCTS, ids=str)
def test_construct(benchmark, w: Construct, corpus: Corpus, smoke: bool):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    path = corpus.store()
    kwargs = {"seq_len": SEQ_LEN, "packing": w.packing, "shuffle": w.shuffle, "seed": 0}
    warm = PackedDataset(TokenStore.open(path), **kwargs)
    samples = len(warm)
    warm.plan(0)
    held: dict = {}

    def setup():
        held.clear()
        return (TokenStore.open(path),), {}

    def target(store):
        ds = PackedDataset(store, **kwargs)
        held["len"] = len(ds)

    benchmark.group = "construct"
    benchmark.extra_info.update(kind="construct", loader="impl", packing=w.packing, shuffle=w.shuffle,
                                size=corpus.size, documents=corpus.num_docs, samples=samples, cache="warm plan")
    benchmark.pedantic(target, setup=setup, rounds=1 if smoke else 20, warmup_rounds=0 if smoke else 1)
    assert held["len"] == samples, "a constructed dataset disagrees with the warm one about its size"
