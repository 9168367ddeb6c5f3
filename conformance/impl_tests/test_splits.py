"""impl.splits against reference.splits / reference.resume: the same rows, samples and fingerprints (SPLIT-*)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.adapters.impl import build_store
from conformance.assertions import assert_equal, assert_raises_typed, check
from impl.dataset import PackedDataset, SampleKey
from impl.errors import EmptyDataError, SplitError
from impl.mixed_dataset import MixedDataset
from impl.splits import resolve_rows, select, slice_store, split_store
from reference.loader import ReferenceLoader
from reference.mixing import MixConfig
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import MixtureConfig, PipelineConfig, epoch_samples, mixture_samples, pipeline_fingerprint
from reference.splits import resolve_slice

FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")

bounds = st.one_of(st.none(), st.integers(-30, 30), st.floats(-0.5, 1.5, allow_nan=False),
                   st.builds(lambda p, neg: f"{'-' if neg else ''}{p}%", st.sampled_from([0, 5, 12.5, 50, 99.9, 100, 150]),
                             st.booleans()),
                   st.sampled_from(["10", "abc", "%"]))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("splits")


def _outcome(fn, *args):
    try:
        return fn(*args)
    except SplitError:
        return SplitError


@pytest.mark.clause("SPLIT-1")
@pytest.mark.clause("SPLIT-2")
@pytest.mark.clause("SPLIT-3")
@pytest.mark.clause("SPLIT-4")
@pytest.mark.clause("SPLIT-5")
@given(start=bounds, stop=bounds, n=st.integers(0, 40))
def test_impl_resolves_split_bounds_exactly_as_the_reference(start, stop, n):
    assert_equal(_outcome(resolve_rows, start, stop, n), _outcome(resolve_slice, start, stop, n), clause="SPLIT-5",
                 what="rows or refusal", repro={"start": start, "stop": stop, "n": n})


@st.composite
def split_pipelines(draw):
    corpus = draw(ls.corpora(max_docs=8, max_len=30, min_documents=2))
    n = sum(len(f) for f in corpus)
    split = draw(st.sampled_from([f"train[:{draw(st.integers(1, n))}]", f"train[{draw(st.integers(0, n - 1))}:]",
                                  "train[:50%]", "train[50%:]", "train[-1:]"]))
    config = PipelineConfig(packing=draw(ls.packing_configs()), split=split,
                            ordering=draw(ls.ordering_configs(("sequential", "global", "window"))))
    return corpus, config


@pytest.mark.clause("SPLIT-8")
@given(pipeline=split_pipelines(), epoch=st.integers(0, 2))
def test_packed_dataset_with_a_split_equals_the_reference_pipeline_with_that_split(pipeline, epoch, workdir):
    corpus, config = pipeline
    store = build_store(corpus, workdir)
    try:
        config.rows(sum(len(f) for f in corpus))
    except SplitError:
        assert_raises_typed(SplitError, PackedDataset.from_config, store, config, cache_dir=False, clause="SPLIT-8",
                            what="an empty split")
        return
    try:
        ds = PackedDataset.from_config(store, config, cache_dir=False)
    except EmptyDataError:
        return   # the split keeps no sample: refused like an empty store
    assert_equal(ds.fingerprint, pipeline_fingerprint(store.fingerprint, config), clause="SPLIT-8", what="fingerprint")
    assert_equal(ds.fingerprint, ReferenceLoader(corpus, config, data_fingerprint=store.fingerprint).fingerprint,
                 clause="SPLIT-8", what="fingerprint against the reference loader")
    expected = epoch_samples(corpus, config, epoch)
    assert_equal(ds.num_samples(epoch), len(expected), clause="SPLIT-8", what="samples", repro={"pipeline": pipeline})
    if expected:
        batch = ds.samples(epoch, range(len(expected)))
        got = [{name: tuple(batch[name][i].tolist()) for name in FIELDS} for i in range(len(expected))]
        want = [{name: tuple(getattr(s, name)) for name in FIELDS} for s in expected]
        assert_equal(got, want, clause="SPLIT-8", what="samples of the split", repro={"pipeline": pipeline, "epoch": epoch})


@pytest.mark.clause("SPLIT-8")
def test_split_views_are_zero_copy_one_pipeline_and_refuse_bad_splits(workdir):
    corpus = [[[d * 10 + t for t in range(1, 6)] for d in range(f * 4, f * 4 + 4)] for f in range(5)]
    store = build_store(corpus, workdir)
    view = split_store(store, "train[:80%]")
    assert_equal((view.rows, view.file_document_counts), (range(16), [4, 4, 4, 4]), clause="SPLIT-8", what="80% of 20")
    tokens = view.read(0, 5)
    check(np.shares_memory(tokens, store.read(0, 5)), clause="SPLIT-8", what="a view's tokens are the store's memory")
    middle = slice_store(store, 6, 13)
    assert_equal((middle.file_document_counts, middle.read(0, 5).tolist()), ([2, 4, 1], corpus[1][2]),
                 clause="SPLIT-8", what="clipped files and the first document of slice(6, 13)")
    assert_equal(select(store, range(6, 13)).rows, middle.rows, clause="SPLIT-8", what="select(range) is slice")
    by_view = PackedDataset(view, seq_len=4, packing="chunk")
    by_kwarg = PackedDataset(store, seq_len=4, packing="chunk", split="train[:80%]")
    assert_equal(by_view.fingerprint, by_kwarg.fingerprint, clause="SPLIT-8", what="a view and split= are one pipeline")
    check(by_kwarg.fingerprint != PackedDataset(store, seq_len=4, packing="chunk").fingerprint, clause="SPLIT-8",
          what="the split must enter the fingerprint")
    val = PackedDataset(store, seq_len=4, packing="chunk", split="train[80%:]")
    train_docs = {(int(d)) for d in by_kwarg.samples(0, range(by_kwarg.num_samples(0)))["input_ids"][:, 0] // 10}
    val_docs = {(int(d)) for d in val.samples(0, range(val.num_samples(0)))["input_ids"][:, 0] // 10}
    check(not train_docs & val_docs and train_docs | val_docs == set(range(20)), clause="SPLIT-8",
          what=f"train {sorted(train_docs)} and validation {sorted(val_docs)} must tile the 20 documents")
    for bad in ("train[100]", "train[a:b]"):
        assert_raises_typed(SplitError, split_store, store, bad, clause="SPLIT-6", what=bad, mentions=[bad, "accepted forms"])
    assert_raises_typed(SplitError, slice_store, store, 30, 40, clause="SPLIT-5", what="bounds beyond the store",
                        mentions=["empty"])
    assert_raises_typed(SplitError, slice_store, store, "90%", "10%", clause="SPLIT-5", what="start after stop",
                        mentions=["empty"])
    assert_raises_typed(SplitError, select, store, [3, 1, 2], clause="SPLIT-8", what="a non-contiguous select",
                        mentions=["range(a, b)"])


@pytest.mark.clause("SPLIT-8")
@pytest.mark.parametrize("spec", ["validation[:10]", "test"])
def test_a_split_naming_another_split_than_train_is_refused_by_the_view_and_the_dataset(spec, workdir):
    store = build_store([[[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]], workdir)
    assert_raises_typed(SplitError, split_store, store, spec, clause="SPLIT-8", what=spec, mentions=[spec, "train[99%:]"])
    assert_raises_typed(SplitError, PackedDataset, store, seq_len=2, split=spec, clause="SPLIT-8", what=spec,
                        mentions=[spec, "train[99%:]"])


@pytest.mark.clause("MIX-13")
@pytest.mark.clause("SPLIT-8")
@given(seed=ls.seeds, epoch=st.integers(0, 2), stopping=st.sampled_from(["first_exhausted", "all_exhausted"]))
def test_a_mixture_of_two_training_splits_equals_the_reference_composition(seed, epoch, stopping, workdir):
    web = [[[100 + d * 10 + t for t in range(1 + d % 7)] for d in range(f * 6, f * 6 + 6)] for f in range(3)]
    code = [[[5000 + d * 10 + t for t in range(3 + d % 5)] for d in range(14)]]
    packing = PackingConfig(seq_len=4, mode="concat")
    configs = (PipelineConfig(packing=packing, split="train[:90%]", ordering=OrderingConfig(kind="global", seed=seed)),
               PipelineConfig(packing=packing, split="train[2:]"))
    mixture = MixtureConfig(sources=configs, mixing=MixConfig(weights=(0.6, 0.4), stopping=stopping, seed=seed))
    sources = [PackedDataset.from_config(build_store(c, workdir), cfg, cache_dir=False) for c, cfg in zip((web, code), configs)]
    mixed = MixedDataset(sources, weights=(0.6, 0.4), stopping=stopping, seed=seed)
    expected = mixture_samples([web, code], mixture, epoch)
    batch = mixed.samples(epoch, range(mixed.num_samples(epoch)))
    got = [(int(batch["source"][i]), tuple(batch["input_ids"][i].tolist())) for i in range(len(batch["source"]))]
    assert_equal(got, [(s, x.input_ids) for s, x in expected], clause="MIX-13", what="mixed samples of two splits",
                 repro={"seed": seed, "epoch": epoch, "stopping": stopping})


@pytest.mark.clause("SPLIT-8")
@pytest.mark.parametrize(("split", "shown"), [("train[99%:]", "split='train[99%:]'"), ((99, None), "split='train[99:]'"),
                                              ((0.99, None), "split='(0.99, None)'")])
def test_a_split_too_small_for_one_sample_is_named_in_the_error_not_only_its_store(split, shown, workdir):
    store = build_store([[[d * 10 + t for t in range(1, 6)] for d in range(100)]], workdir)
    assert_raises_typed(EmptyDataError, PackedDataset, store, seq_len=8, split=split, cache_dir=False, clause="SPLIT-8",
                        what=f"split={split!r} holding one document of 5 tokens",
                        mentions=[shown, "1 of its 100 documents", "widen the split"])
    PackedDataset(store, seq_len=8, split="train[90%:]", cache_dir=False)


@pytest.mark.clause("SPLIT-9")
@pytest.mark.parametrize("packing", ["chunk", "best_fit"])
def test_train_and_eval_splits_report_store_document_indices_that_never_overlap(packing, workdir):
    corpus = [[[d * 10 + t for t in range(1, 2 + d % 4)] for d in range(f * 4, f * 4 + 4)] for f in range(5)]
    flat = [d for file in corpus for d in file]
    store = build_store(corpus, workdir)
    seen = []
    for split in ("train[:80%]", "train[80%:]"):
        ds = PackedDataset(store, seq_len=4, packing=packing, shuffle="global", seed=5, split=split, cache_dir=False)
        rows = ds.store.rows
        assert_equal(ds.first_document, rows.start, clause="SPLIT-9", what=f"{split} first_document")
        batch = ds.samples(0, range(ds.num_samples(0)))
        one = [ds[i]["doc_ids"].tolist() for i in range(ds.num_samples(0))]
        assert_equal(one, batch["doc_ids"].tolist(), clause="SPLIT-9", what=f"{split}: ds[i] against samples()")
        ids = {int(d) for d in batch["doc_ids"].reshape(-1) if d >= 0}
        check(ids <= set(rows), clause="SPLIT-9", what=f"{split} ids {sorted(ids)} outside the store rows {rows}")
        for tokens, docs, offsets in zip(batch["input_ids"], batch["doc_ids"], batch["token_offsets"]):
            for token, doc, offset in zip(tokens.tolist(), docs.tolist(), offsets.tolist()):
                check(doc < 0 or flat[doc][offset] == token, clause="SPLIT-9",
                      what=f"{split}: token {token} is not store document {doc}'s token {offset}")
        seen.append(ids)
    check(not seen[0] & seen[1] and min(seen[1]) == 16, clause="SPLIT-9",
          what=f"train ids {sorted(seen[0])} and eval ids {sorted(seen[1])} (store rows 16..19) must not overlap")


@pytest.mark.clause("SPLIT-9", "MIX-13")
@given(seed=ls.seeds, epoch=st.integers(0, 1))
def test_a_mixture_of_splits_reports_each_source_stores_own_document_indices_like_the_reference(seed, epoch, workdir):
    web = [[[100 + d * 10 + t for t in range(1 + d % 7)] for d in range(f * 6, f * 6 + 6)] for f in range(3)]
    code = [[[5000 + d * 10 + t for t in range(3 + d % 5)] for d in range(14)]]
    packing = PackingConfig(seq_len=4, mode="best_fit")
    configs = (PipelineConfig(packing=packing, split="train[50%:]", ordering=OrderingConfig(kind="global", seed=seed)),
               PipelineConfig(packing=packing, split="train[2:]"))
    mixture = MixtureConfig(sources=configs, mixing=MixConfig(weights=(0.6, 0.4), stopping="all_exhausted", seed=seed))
    sources = [PackedDataset.from_config(build_store(c, workdir), cfg, cache_dir=False) for c, cfg in zip((web, code), configs)]
    mixed = MixedDataset(sources, weights=(0.6, 0.4), stopping="all_exhausted", seed=seed)
    expected = mixture_samples([web, code], mixture, epoch)
    batch = mixed.samples(epoch, range(mixed.num_samples(epoch)))
    got = [(int(s), tuple(d.tolist())) for s, d in zip(batch["source"], batch["doc_ids"])]
    assert_equal(got, [(s, x.doc_ids) for s, x in expected], clause="SPLIT-9", what="source and doc_ids of mixed samples",
                 repro={"seed": seed, "epoch": epoch})
    items = [mixed[SampleKey(epoch, i)] for i in range(mixed.num_samples(epoch))]
    one = [(int(item["source"]), tuple(item["doc_ids"].tolist())) for item in items]
    assert_equal(one, got, clause="SPLIT-9", what="mixed[i] against samples()", repro={"seed": seed, "epoch": epoch})
    web_ids = {d for s, ids in got if s == 0 for d in ids if d >= 0}
    check(bool(web_ids) and min(web_ids) >= 9, clause="SPLIT-9",
          what=f"web ids {sorted(web_ids)}: the split starts at store row 9, so its ids are store rows 9..17")


@pytest.mark.clause("SPLIT-8")
def test_a_split_dataset_counts_its_empty_documents_without_reading_every_length_of_the_store(workdir, monkeypatch):
    from impl.store import TokenStore

    corpus = [[[1, 2], [], [3, 4, 5]], [[], [], [6]], [[7, 8], []]]
    store = TokenStore.open(build_store(corpus, workdir).path)
    monkeypatch.setattr(TokenStore, "lengths", property(lambda self: pytest.fail("the whole store's lengths were read")))
    for a, b in ((0, 3), (2, 6), (4, 8)):
        view = slice_store(store, a, b)
        expected = [len(d) for f in corpus for d in f][a:b].count(0)
        assert_equal(view.num_empty_documents, expected, clause="SPLIT-8", what=f"empty documents of rows {a}:{b}")
        PackedDataset(view, seq_len=2, packing="concat")
