"""(5) Packing: utilisation and throughput of every packing mode on the realistic length distribution.

``pack-<mode>``: materialise ``PACK_SAMPLES`` samples spread over the epoch
(``PackedDataset.sample``, numpy, no collation), plan already computed.
``plan-<mode>``: compute epoch 0's plan from the document lengths (no cache).
Utilisation (extra_info): the fraction of the epoch's ``samples * seq_len``
positions holding document tokens (not padding), from the plan for bin modes
and ``none``, and ``1 - dropped tail`` for concat/chunk; plus the fraction of
the corpus's tokens the epoch trains on.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.corpora import Corpus
from benchmarks.workloads import PACK_SAMPLES, PACKINGS, PLANS, SEQ_LEN, Packing, PackPlan


def _utilisation(ds, corpus: Corpus) -> dict[str, float]:
    plan = ds.plan(0)
    S = plan.num_samples
    arrays = plan.arrays
    if "sample_ptr" in arrays:
        placed = int(np.sum(np.asarray(arrays["piece_stop"]) - np.asarray(arrays["piece_start"])))
    else:
        placed = S * SEQ_LEN  # stream modes fill every position (the tail that does not fill one is dropped)
    return {"samples": S, "utilisation": placed / (S * SEQ_LEN), "corpus_tokens_used": placed / corpus.num_tokens}


@pytest.mark.parametrize("w", PACKINGS, ids=str)
def test_packing(benchmark, w: Packing, corpus: Corpus, size: str, smoke: bool):
    benchmark.group = "packing"
    ds = harness.impl_dataset(corpus, shuffle="none", packing=w.mode)
    util = _utilisation(ds, corpus)
    k = min(PACK_SAMPLES[size], util["samples"])
    idx = np.linspace(0, util["samples"] - 1, k).astype(int).tolist()
    counted = {}

    def target():
        counted["tokens"] = sum(int(np.count_nonzero(ds.sample(0, i)["doc_ids"] >= 0)) for i in idx)

    benchmark.extra_info.update(kind="packing", mode=w.mode, size=corpus.size, seq_len=SEQ_LEN, count=k,
                                cache="warm", **util)
    benchmark.pedantic(target, rounds=1 if smoke else 5, warmup_rounds=0 if smoke else 1)
    benchmark.extra_info.update(tokens=counted["tokens"], samples=k)


@pytest.mark.parametrize("w", PLANS, ids=str)
def test_plan(benchmark, w: PackPlan, corpus: Corpus, smoke: bool):
    benchmark.group = "plan"
    ds = harness.impl_dataset(corpus, shuffle="none", packing=w.mode, cache=False)
    out = {}

    def target():
        out["plan"] = ds.compute_plan(0)

    benchmark.extra_info.update(kind="plan", mode=w.mode, size=corpus.size, documents=corpus.num_docs)
    benchmark.pedantic(target, rounds=1 if smoke else 2, warmup_rounds=0)
    benchmark.extra_info.update(samples=out["plan"].num_samples)
