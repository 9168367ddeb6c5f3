"""(7) Mixtures: plan build, resume latency by position, and throughput against one PackedDataset.

The K sources of a K-source mixture are K contiguous splits of the size's
store (``"train[0%:50%]"``, ``"train[50%:100%]"`` for K = 2), each its own
``PackedDataset`` (concat, ``seq_len=2048``, global shuffle with its own
seed), mixed with weights ``1, 2, ..., K`` under ``all_exhausted`` by
``impl.mixed_dataset.MixedDataset``. So the mixture holds exactly the samples of the
splits, and the comparison with one ``PackedDataset`` over the whole store
isolates the cost of mixing.

- plan: a fresh ``MixedDataset`` (sources' sizes known) -> ``plan(0)``;
- resume: ``TokenStore.open`` -> the K split ``PackedDataset``s (their plans
  cached on disk) -> ``MixedDataset`` -> ``build_dataloader`` (which builds
  the mixture's plan) -> ``load_state_dict`` at a position -> first batch of
  ``RESUME_BATCH``, all inside the timer: what a restarted job pays after its
  imports. It must not grow with the position
  (it does vary with how many sources the batch at that position draws from:
  near the end of an ``all_exhausted`` epoch the heavier sources have run out;
  ``sources_in_batch`` in ``extra_info``);
- resume against one source: the same path at 90 % of the epoch for one
  ``PackedDataset`` over the whole store (``single``), the 2-source mixture
  with its plan cached on disk (``mix-2src``, warm as after the job's first
  run) and with ``cache_dir=False`` (``mix-2src-nocache``: the plan built by
  every resume); the mixture's extra over ``single`` is its splits and its
  plan;
- throughput: ``TPUT_TOKENS`` tokens of batches of ``TPUT_BATCH`` from
  position 0 (no workers), mixture and single dataset alike; tokens/s in
  ``extra_info`` (the 10 % target is read from the report, never asserted).
"""

from __future__ import annotations

import pytest

from benchmarks import harness
from benchmarks.corpora import Corpus
from benchmarks.workloads import POSITIONS, RESUME_BATCH, SEQ_LEN, TPUT_BATCH, TPUT_TOKENS

SOURCES = (2, 4)


def _mixture(corpus: Corpus, k: int, *, cache: bool = True):
    from impl.dataset import PackedDataset
    from impl.mixed_dataset import MixedDataset
    from impl.store import TokenStore

    store = TokenStore.open(corpus.store())
    cuts = [f"{round(100 * i / k)}%" for i in range(k + 1)]
    sources = [PackedDataset(store, seq_len=SEQ_LEN, packing="concat", shuffle="global", seed=i,
                             split=(cuts[i], cuts[i + 1]))
               for i in range(k)]
    return MixedDataset(sources, weights=tuple(float(i + 1) for i in range(k)), stopping="all_exhausted", seed=7,
                        cache_dir=None if cache else False)


@pytest.mark.parametrize("k", SOURCES, ids=lambda k: f"mix-plan-{k}src")
def test_mixing_plan_build(benchmark, k: int, corpus: Corpus, smoke: bool):
    benchmark.group = "mixing-plan"
    held: dict = {}

    def setup():
        mixed = _mixture(corpus, k, cache=False)   # the build itself, not a read of the cached plan
        mixed.source_sizes(0)
        return (mixed,), {}

    def target(mixed):
        held["plan"] = mixed.plan(0)

    benchmark.pedantic(target, setup=setup, rounds=1 if smoke else 5, warmup_rounds=0 if smoke else 1)
    plan = held["plan"]
    benchmark.extra_info.update(kind="mixing-plan", sources=k, size=corpus.size, samples=len(plan.source))
    sizes = _mixture(corpus, k).source_sizes(0)
    assert [int((plan.source == s).sum()) for s in range(k)] == sizes, "all_exhausted must take every sample once"


@pytest.mark.parametrize("position", POSITIONS, ids=lambda p: f"p{round(p * 100):02d}")
@pytest.mark.parametrize("k", SOURCES, ids=lambda k: f"mix-resume-{k}src")
def test_mixing_resume(benchmark, k: int, position: float, corpus: Corpus, smoke: bool):
    benchmark.group = "mixing-resume"
    held: dict = {}
    probe = _mixture(corpus, k)
    total = probe.num_samples(0)
    n = int(position * total) // RESUME_BATCH * RESUME_BATCH
    state = harness.impl_state(harness.impl_loader(probe, batch_size=RESUME_BATCH), n)
    expected = (int(probe.plan(0).source[n]), int(probe.plan(0).item[n]))
    del probe

    def setup():
        held.clear()
        return (), {}

    def target():
        loader = harness.impl_loader(_mixture(corpus, k), batch_size=RESUME_BATCH)
        loader.load_state_dict(state)
        held["batch"] = next(iter(loader))

    benchmark.extra_info.update(kind="mixing-resume", sources=k, position=position, size=corpus.size, index=n,
                                total=total, batch=RESUME_BATCH,
                                timed="TokenStore.open -> K PackedDataset splits (plans cached on disk) -> MixedDataset "
                                      "-> build_dataloader (the mixture's plan) -> load_state_dict -> first batch")
    benchmark.pedantic(target, setup=setup, rounds=1 if smoke else 9, warmup_rounds=0 if smoke else 1)
    batch = held["batch"]
    benchmark.extra_info["sources_in_batch"] = len(set(batch["source"].tolist()))
    got = (int(batch["source"][0]), int(batch["source_index"][0]))
    assert int(batch["sample_index"][0]) == n and got == expected, f"resumed at {got}, expected {expected}"


@pytest.mark.parametrize("case", ("single", "mix-2src", "mix-2src-nocache"), ids=lambda c: f"resume-vs-{c}")
def test_mixing_resume_against_one_source(benchmark, case: str, corpus: Corpus, smoke: bool):
    benchmark.group = "mixing-resume-vs-single"
    held: dict = {}

    def dataset():
        return harness.impl_dataset(corpus) if case == "single" else _mixture(corpus, 2, cache=case == "mix-2src")

    probe = dataset()
    total = probe.num_samples(0)   # builds (and for mix-2src caches) the epoch's plan, as the job's first run did
    n = int(0.9 * total) // RESUME_BATCH * RESUME_BATCH
    state = harness.impl_state(harness.impl_loader(probe, batch_size=RESUME_BATCH), n)
    del probe

    def setup():
        held.clear()
        return (), {}

    def target():
        loader = harness.impl_loader(dataset(), batch_size=RESUME_BATCH)
        loader.load_state_dict(state)
        held["batch"] = next(iter(loader))

    benchmark.extra_info.update(kind="mixing-resume-vs-single", case=case, position=0.9, size=corpus.size, index=n,
                                total=total, batch=RESUME_BATCH,
                                timed="TokenStore.open -> PackedDataset(s) -> [MixedDataset] -> build_dataloader -> "
                                      "load_state_dict -> first batch")
    benchmark.pedantic(target, setup=setup, rounds=1 if smoke else 9, warmup_rounds=0 if smoke else 1)
    assert int(held["batch"]["sample_index"][0]) == n


@pytest.mark.parametrize("k", (1, *SOURCES), ids=lambda k: "mix-tput-single" if k == 1 else f"mix-tput-{k}src")
def test_mixing_throughput(benchmark, k: int, corpus: Corpus, size: str, smoke: bool):
    benchmark.group = "mixing-throughput"
    dataset = harness.impl_dataset(corpus) if k == 1 else _mixture(corpus, k)
    tokens = TPUT_TOKENS[size] // (8 if smoke else 1)
    steps = max(1, tokens // (TPUT_BATCH * SEQ_LEN))
    held: dict = {}

    def setup():
        loader = harness.impl_loader(dataset, batch_size=TPUT_BATCH)
        it = iter(loader)
        next(it)   # untimed first batch (the plan, the first pages)
        return (it,), {}

    def target(it):
        count = 0
        for _ in range(steps):
            count += harness.batch_tokens(next(it))
        held["tokens"] = count

    benchmark.pedantic(target, setup=setup, rounds=1 if smoke else 7, warmup_rounds=0)
    seconds = benchmark.stats.stats.min if benchmark.stats else float("nan")
    benchmark.extra_info.update(kind="mixing-throughput", sources=k, size=corpus.size, tokens=held["tokens"],
                                tokens_per_s=held["tokens"] / seconds if seconds else None, batch=TPUT_BATCH)
    assert held["tokens"] == steps * TPUT_BATCH * SEQ_LEN
