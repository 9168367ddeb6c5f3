"""(3) Resume latency: a fresh loader object, ``load_state_dict`` (or ``.skip(n)``) -> first batch.

For ``impl`` construction of the loader object is untimed (it is measured by
test_open and test_construct) and the timer covers restoring the position and
producing the first batch; ``impl-fresh`` times the whole path a restarted
job takes: ``TokenStore.open`` -> ``PackedDataset`` (epoch plan cached on
disk) -> ``build_dataloader`` -> ``load_state_dict`` -> first batch. Batches
hold ``RESUME_BATCH`` items: packed ``seq_len=2048`` samples for impl (concat
packing, global shuffle), documents for the peers (they do not pack).
Positions are fractions of the epoch (impl: packed samples; peers:
documents). Page cache: warm (a warmup round runs first). Every loader's
first item is checked against the store, so a resume that lands elsewhere
fails instead of looking fast.

States: impl's is built from its documented format (no iteration); HF's are
taken once by iterating to the position (cached on disk per datasets
version); MosaicML's is ``{"epoch": 0, "sample_in_epoch": n, ...}``;
LitData's is its loader's state after one batch, moved to ``n``.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.corpora import Corpus
from benchmarks.peers import require_datasets, require_litdata, require_streaming
from benchmarks.workloads import POSITIONS, RESUME_BATCH, RESUMES, Resume


def _doc_position(corpus: Corpus, position: float) -> int:
    return int(position * corpus.num_docs) // RESUME_BATCH * RESUME_BATCH


@pytest.fixture(scope="module")
def hf_base(corpus):
    require_datasets()
    return harness.hf_from_disk(corpus)


def _check_doc(item, store, n: int, loader: str) -> None:
    tokens = np.asarray(item["input_ids"] if isinstance(item, dict) else item)
    assert np.array_equal(tokens, store[n]), f"{loader} resumed at document {n} but yielded another document"


@pytest.mark.parametrize("w", RESUMES, ids=str)
def test_resume(benchmark, w: Resume, corpus: Corpus, store, smoke: bool, request):
    benchmark.group = "resume"
    held: dict = {}
    rounds, warmup = (1, 0) if smoke else (5, 1)

    if w.loader in ("impl", "impl-fresh"):
        ds0 = harness.impl_dataset(corpus)
        total = ds0.num_samples(0)
        ds0.plan(0)                     # the plan cache is warm, as after any earlier run of the job
        n = int(w.position * total) // RESUME_BATCH * RESUME_BATCH
        state = harness.impl_state(harness.impl_loader(ds0, batch_size=RESUME_BATCH), n)
        del ds0

        if w.loader == "impl":
            def setup():
                held.clear()
                held["loader"] = harness.impl_loader(harness.impl_dataset(corpus), batch_size=RESUME_BATCH)
                return (held["loader"],), {}

            def target(loader):
                loader.load_state_dict(state)
                held["batch"] = next(iter(loader))
        else:
            def setup():
                held.clear()
                return (), {}

            def target():
                loader = harness.impl_loader(harness.impl_dataset(corpus), batch_size=RESUME_BATCH)
                loader.load_state_dict(state)
                held["batch"] = next(iter(loader))

        def check():
            assert int(held["batch"]["sample_index"][0]) == n, "impl resumed at the wrong sample"
        unit = "packed samples"
    else:
        n = _doc_position(corpus, w.position)
        total = corpus.num_docs
        unit = "documents"

        if w.loader == "hf-iterable":
            base = request.getfixturevalue("hf_base")
            state = harness.hf_state_at(corpus, "hf-iterable", lambda: harness.hf_iterable(corpus, base), n)

            def setup():
                held.clear()
                return (harness.hf_iterable(corpus, base),), {}

            def target(ids):
                ids.load_state_dict(state)
                held["items"] = harness.take(iter(ids), RESUME_BATCH)
        elif w.loader == "hf-streaming":
            require_datasets()
            state = harness.hf_state_at(corpus, "hf-streaming", lambda: harness.hf_streaming(corpus), n)

            def setup():
                held.clear()
                return (harness.hf_streaming(corpus),), {}

            def target(ids):
                ids.load_state_dict(state)
                held["items"] = harness.take(iter(ids), RESUME_BATCH)
        elif w.loader == "hf-skip":
            require_datasets()
            if not smoke and n > 0:
                rounds, warmup = 1, 0  # tens of seconds at 90% of L

            def setup():
                held.clear()
                return (harness.hf_streaming(corpus),), {}

            def target(ids):
                held["items"] = harness.take(iter(ids.skip(n)), RESUME_BATCH)
        elif w.loader == "mosaicml":
            require_streaming()
            state = harness.mosaic_state(n)

            def setup():
                held.clear()
                return (harness.mosaic_dataset(corpus, RESUME_BATCH),), {}

            def target(ds):
                ds.load_state_dict(state)
                it = iter(ds)
                held["items"] = harness.take(it, RESUME_BATCH)
                held["it"] = it
        elif w.loader == "litdata":
            require_litdata()
            state = harness.litdata_state(corpus, RESUME_BATCH, n)

            def setup():
                held.clear()
                return (harness.litdata_loader(corpus, RESUME_BATCH),), {}

            def target(loader):
                loader.load_state_dict(state)
                held["items"] = next(iter(loader))
        else:
            raise AssertionError(w)

        def check():
            _check_doc(held["items"][0], store, n, w.loader)

    benchmark.extra_info.update(kind="resume", loader=w.loader, position=w.position, size=corpus.size,
                                index=n, total=total, unit=unit, batch=RESUME_BATCH, cache="warm")
    benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=warmup)
    check()
    held.clear()
    if w.loader == "mosaicml":
        harness.mosaic_cleanup()


def test_resume_in_a_new_process(benchmark, corpus: Corpus, smoke: bool):
    """``benchmarks/fresh_process.py``: the first resume of a new interpreter (imports untimed), and its second.

    The timed figure is the whole measurement's wall time (new processes and
    their imports included); the resume figures, which the in-process rounds
    above cannot show, are in extra_info (milliseconds, per position).
    """
    from benchmarks.fresh_process import measure

    benchmark.group = "resume-process"
    runs, positions = (1, (0.5,)) if smoke else (9, POSITIONS)
    out: dict = {}
    benchmark.pedantic(lambda: out.update(measure(corpus.size, runs, positions)), rounds=1, warmup_rounds=0)
    assert sorted(out) == sorted(positions)
    for position, row in out.items():
        assert 0 < row["first_min_ms"] <= row["first_median_ms"] and 0 < row["second_min_ms"] <= row["second_median_ms"]
        benchmark.extra_info.update({f"p{round(position * 100):02d}_{k}": round(v, 3) for k, v in row.items()})
    benchmark.extra_info.update(kind="resume-process", size=corpus.size, runs=runs, batch=RESUME_BATCH)
