"""impl.packing against reference.packing: the same plan and the same samples, for every mode and option.

The reference is the oracle: ``impl.packing.pack_plan(lengths, config)`` as
pieces equals ``reference.packing.pack_plan``; ``materialize`` of every sample
equals ``reference.packing.fill`` field for field (document starts included);
the vectorised chunk spans and the tuned bin packers equal the reference's.
Corpora give every token a globally unique value (document k, offset j holds
1000 * (k + 1) + j), so a label that equals the expected token is the
expected token.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.budget import kit_settings
from impl import bins as ib
from impl import fill as fl
from impl import packing as ip
from impl.errors import ConfigError
from reference import bins as rb
from reference import packing as rp
from reference.packing import PackingConfig

SAMPLE_FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets", "document_starts")


def unique_tokens(corpus) -> list[list[int]]:
    """The corpus's shapes with unique token values: document k, offset j holds 1000 * (k + 1) + j."""
    docs = [doc for f in corpus for doc in f]
    return [[1000 * (k + 1) + j for j in range(len(doc))] for k, doc in enumerate(docs)]


def check_against_reference(documents: list[list[int]], config: PackingConfig, clause: str) -> None:
    __tracebackhide__ = True
    lengths = [len(d) for d in documents]
    rep = {"lengths": lengths, "config": config}
    expected_plan = rp.pack_plan(lengths, config)
    plan = ip.pack_plan(np.array(lengths, dtype=np.int64), config)
    assert_equal(plan.to_reference(), expected_plan, clause="PACK-20", what="impl plan", repro=rep)
    assert_equal(plan.num_samples, rp.num_samples(lengths, config), clause="PACK-20", what="plan.num_samples", repro=rep)
    assert_equal(ip.num_samples(lengths, config), rp.num_samples(lengths, config), clause="PACK-20",
                 what="impl num_samples", repro=rep)
    ids = [7000 + k for k in range(len(documents))]
    expected = rp.fill(expected_plan, list(zip(ids, documents)), config)
    source = fl.TokenSource.from_documents(documents)
    id_of = np.array(ids, dtype=np.int64)
    for i, sample in enumerate(expected):
        got = fl.materialize(plan, i, config, source)
        doc_ids = got["doc_ids"]
        got["doc_ids"] = np.where(doc_ids >= 0, id_of[np.maximum(doc_ids, 0)] if len(id_of) else doc_ids, -1)
        for name in SAMPLE_FIELDS:
            assert_equal(tuple(got[name].tolist()), getattr(sample, name), clause=clause, what=f"sample {i} {name}",
                         repro=rep)
            check(got[name].dtype == np.int64, clause=clause, what=f"{name} dtype {got[name].dtype} is not int64", repro=rep)


@pytest.mark.clause("PACK-1", "PACK-2", "PACK-3", "PACK-4", "PACK-5", "PACK-20")
@given(corpus=ls.corpora(), config=ls.packing_configs())
def test_impl_plan_and_samples_equal_the_reference_for_every_mode_and_option(corpus, config):
    check_against_reference(unique_tokens(corpus), config, "PACK-3")


@pytest.mark.clause("PACK-6", "PACK-7", "PACK-8", "PACK-9")
@given(corpus=ls.corpora(max_len=60), config=ls.packing_configs(("concat", "chunk"), max_seq_len=12))
def test_stream_plans_cut_the_concatenated_stream_exactly_like_the_reference(corpus, config):
    check_against_reference(unique_tokens(corpus), config, "PACK-6")


@pytest.mark.clause("PACK-10", "PACK-11", "PACK-12", "PACK-13", "PACK-14", "PACK-19")
@given(corpus=ls.corpora(max_len=60), config=ls.packing_configs(("greedy", "first_fit", "best_fit", "none"), max_seq_len=10))
def test_bin_plans_with_long_documents_equal_the_reference(corpus, config):
    check_against_reference(unique_tokens(corpus), config, "PACK-14")


@pytest.mark.clause("PACK-14", "PACK-20")
@kit_settings(max_examples=8)
@given(seed=ls.seeds, n=st.integers(500, 3000), config=ls.packing_configs(max_seq_len=64),
       window=st.sampled_from([1, 3, 50, 1000]))
@pytest.mark.parametrize("mode", rp.MODES)
def test_impl_plan_equals_the_reference_for_thousands_of_documents(mode, seed, n, config, window):
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n) < 0.1, 0, rng.integers(1, 90, n)).tolist()   # a tenth are empty
    config = PackingConfig(**{**{f: getattr(config, f) for f in config.__slots__}, "mode": mode, "window": window})
    assert_equal(ip.pack_plan(lengths, config).to_reference(), rp.pack_plan(lengths, config), clause="PACK-20",
                 what="impl plan", repro={"lengths": lengths, "config": config})


@pytest.mark.clause("PACK-10", "PACK-11")
@given(lengths=st.lists(st.integers(0, 80), max_size=30), config=ls.packing_configs(("none",), max_seq_len=12))
def test_vectorised_chunk_spans_equal_the_reference_chunk_spans(lengths, config):
    doc, start, stop = ip.chunk_arrays(np.array(lengths, dtype=np.int64), config)
    expected = [(d, a, b) for d, m in enumerate(lengths) for a, b in rp.chunk_spans(m, config)]
    assert_equal(list(zip(doc.tolist(), start.tolist(), stop.tolist())), expected, clause="PACK-10",
                 what="chunk spans", repro={"lengths": lengths, "config": config})


@pytest.mark.clause("PACK-15", "PACK-16", "PACK-17")
@given(widths=st.lists(st.integers(1, 9), max_size=60), capacity=st.integers(9, 12))
@pytest.mark.parametrize("mode", rp.BIN_MODES)
def test_tuned_bin_packers_place_every_item_like_the_reference_packers(mode, widths, capacity):
    assert_equal(ib.PACKERS[mode](widths, capacity), rb.PACKERS[mode](widths, capacity), clause="PACK-15",
                 what=f"{mode} bins", repro={"widths": widths, "capacity": capacity})


@pytest.mark.clause("PACK-17")
def test_best_fit_sends_the_one_to_the_tightest_bin_as_in_the_clause_example():
    assert_equal(ib.best_fit_bins([6, 4, 4, 1], 9), [[0], [1, 2, 3]], clause="PACK-17", what="best_fit bins")
    assert_equal(ib.first_fit_bins([3, 4, 2, 1], 4), [[0, 3], [1], [2]], clause="PACK-16", what="first_fit bins")
    assert_equal(ib.greedy_bins([3, 4, 2, 1], 4), [[0], [1], [2, 3]], clause="PACK-15", what="greedy bins")


@pytest.mark.clause("PACK-20")
def test_the_module_worked_example_reproduces_the_reference_doctest():
    docs = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    source = fl.TokenSource.from_documents(docs)
    expected = {"concat": [(1, 2, 3, 4), (5, 6, 7, 8)], "chunk": [(1, 2, 3, 4), (6, 7, 8, 9)],
                "greedy": [(1, 2, 3, 0), (4, 5, 6, 7), (8, 9, 10, 0)],
                "first_fit": [(1, 2, 3, 10), (4, 5, 6, 7), (8, 9, 0, 0)],
                "best_fit": [(4, 5, 6, 7), (1, 2, 3, 10), (8, 9, 0, 0)],
                "none": [(1, 2, 3, 0), (4, 5, 6, 7), (8, 9, 0, 0), (10, 0, 0, 0)]}
    for mode, inputs in expected.items():
        config = PackingConfig(seq_len=4, mode=mode)
        plan = ip.pack_plan([3, 6, 1], config)
        got = [tuple(fl.materialize(plan, i, config, source)["input_ids"].tolist()) for i in range(plan.num_samples)]
        assert_equal(got, inputs, clause="PACK-20", what=f"{mode} inputs")


@pytest.mark.clause("PACK-20")
@given(corpus=ls.corpora(), config=ls.packing_configs())
def test_plan_arrays_are_flat_int64_and_rebuild_the_same_plan(corpus, config):
    lengths = [len(d) for f in corpus for d in f]
    plan = ip.pack_plan(lengths, config)
    expected = ip.STREAM_FIELDS if config.mode in rp.STREAM_MODES else ip.BIN_FIELDS
    assert_equal(sorted(plan.arrays), sorted(expected), clause="PACK-20", what="plan array names")
    for name, arr in plan.arrays.items():
        check(arr.dtype == np.int64 and arr.ndim == 1, clause="PACK-20", what=f"{name} is {arr.dtype}[{arr.ndim}d]")
        check(len(arr) <= 2 * (sum(lengths) + len(lengths)) + 1, clause="PACK-20",
              what=f"{name} holds {len(arr)} entries: more than O(documents + chunks)")
    frozen = {name: np.frombuffer(arr.tobytes(), dtype=np.int64) for name, arr in plan.arrays.items()}  # read-only
    again = ip.PackPlan(config.mode, config.seq_len, frozen)
    assert_equal(again.to_reference(), plan.to_reference(), clause="PACK-20", what="plan rebuilt from its arrays")


@pytest.mark.clause("PACK-20")
def test_token_source_locates_documents_in_their_own_files_and_names_the_fix_for_a_foreign_plan():
    source = fl.TokenSource.from_files([[[5, 6, 7], []], [], [[8, 9]]], dtype=np.uint16)
    assert_equal([a.tolist() for a in source.locate(np.array([2, 0, 1]))], [[2, 0, 0], [0, 0, 3], [2, 3, 0]],
                 clause="PACK-20", what="locate across files")
    assert_equal((source.num_documents, source.num_files), (3, 3), clause="PACK-20", what="sizes")
    assert_raises_typed(ConfigError, source.locate, np.array([3]), clause="PACK-20", what="a document beyond the source",
                        mentions=["document 3", "3 documents", "plan is not for this store"])


def _bounded(source: fl.TokenSource) -> fl.TokenSource:
    """``source``'s files behind a ``bounds`` callable (how a store's source locates documents: batch by batch)."""
    starts = np.array([0, *np.cumsum([len(source.file(f)[1]) - 1 for f in range(source.num_files)])], dtype=np.int64)

    def bounds(files, docs):
        offsets = [np.asarray(source.file(int(f))[1]) for f in files]
        lo = np.array([o[d] for o, d in zip(offsets, docs.tolist())], dtype=np.int64)
        hi = np.array([o[d + 1] for o, d in zip(offsets, docs.tolist())], dtype=np.int64)
        return lo, hi - lo

    return fl.TokenSource(starts, source.file, None, bounds)


@pytest.mark.clause("PACK-20")
@given(files=st.lists(st.lists(st.lists(st.integers(0, 9), max_size=4), max_size=4), min_size=1, max_size=4),
       data=st.data())
def test_token_source_answers_every_locate_like_a_fresh_source_whatever_it_located_before(files, data):
    n = sum(len(f) for f in files)
    if n == 0:
        return
    calls = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=8), min_size=1, max_size=4))
    where = [(f, sum(len(d) for d in docs[:j]), len(docs[j])) for f, docs in enumerate(files) for j in range(len(docs))]
    for make in (lambda: fl.TokenSource.from_files(files), lambda: _bounded(fl.TokenSource.from_files(files))):
        used = make()
        for docs in calls:
            got = [a.tolist() for a in used.locate(np.array(docs))]
            expected = [[where[d][k] for d in docs] for k in range(3)]
            assert_equal(got, expected, clause="PACK-20", what=f"locate({docs}) after {calls}")


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("starts", [[0], [1, 2], [0, 3, 1]])
def test_token_source_refuses_file_starts_that_do_not_start_at_zero_or_decrease(starts):
    assert_raises_typed(ConfigError, fl.TokenSource, starts, lambda f: (np.zeros(0), np.zeros(1)), clause="PACK-20",
                        what=f"file_document_starts={starts}", mentions=[f"file_document_starts={starts!r}",
                                                                         "TokenStore.file_document_starts"])


@pytest.mark.clause("PACK-20")
def test_invalid_plan_requests_raise_config_errors_naming_the_fix():
    config = PackingConfig(seq_len=4)
    plan = ip.pack_plan([3, 6, 1], config)
    assert_raises_typed(ConfigError, plan.pieces, 2, clause="PACK-20", what="sample beyond the plan",
                        mentions=["sample index 2", "2 samples"])
    assert_raises_typed(ConfigError, fl.materialize, plan, 0, PackingConfig(seq_len=5), fl.TokenSource.from_documents([[1]]),
                        clause="PACK-20", what="a plan for another seq_len", mentions=["seq_len=4", "seq_len=5"])
    assert_raises_typed(ConfigError, ip.pack_plan, [3, -1], config, clause="PACK-20", what="negative length",
                        mentions=["negative"])
    assert_raises_typed(ConfigError, ip.PackPlan, "concat", 4, {"sample_ptr": np.zeros(1, dtype=np.int64)},
                        clause="PACK-20", what="bin arrays for a stream plan", mentions=["cum", "recompute"])


@pytest.mark.clause("PACK-22")
@given(corpus=ls.corpora(max_len=60), config=ls.packing_configs(("greedy", "first_fit", "best_fit"), max_seq_len=10),
       seed=ls.seeds, epoch=st.integers(0, 5))
def test_keyed_bin_plans_equal_the_reference_for_every_seed_and_epoch(corpus, config, seed, epoch):
    lengths = [len(d) for d in unique_tokens(corpus)]
    key = rp.bin_key(seed, epoch)
    check(ip.bin_key(seed, epoch) == key, clause="PACK-22", what="impl bin_key differs from the reference's")
    assert_equal(ip.pack_plan(lengths, config, key=key).to_reference(), rp.pack_plan(lengths, config, key=key),
                 clause="PACK-22", what="keyed impl plan", repro={"lengths": lengths, "config": config, "seed": seed,
                                                                  "epoch": epoch})


@pytest.mark.clause("PACK-22")
@pytest.mark.parametrize("shuffle", ["global", "window"])
def test_the_readmes_best_fit_global_shuffle_config_changes_order_with_seed_and_epoch(tmp_path, shuffle):
    """``PackedDataset(store, packing="best_fit", shuffle=...)``: one pack window holds every document, as in the
    README's config on a small store; before PACK-22 every seed and epoch gave the same, length-sorted samples."""
    from conformance.impl_tests.test_dataset import make_store
    from impl import PackedDataset
    from impl.rng import below, derive_key
    key = derive_key(7, 0, 99)
    lengths = [1 + int(below(key, np.arange(i, i + 1), 60)[0]) for i in range(120)]
    docs = [[10 + (k * 7 + j) % 200 for j in range(m)] for k, m in enumerate(lengths)]
    store = make_store([docs[i:i + 30] for i in range(0, 120, 30)], tmp_path / "store")

    def first_samples(seed: int, epoch: int) -> list[tuple[int, ...]]:
        ds = PackedDataset(store, seq_len=64, packing="best_fit", shuffle=shuffle, window=32, seed=seed,
                           cache_dir=tmp_path / "cache")
        return [tuple(ds.sample(epoch, i)["doc_ids"].tolist()) for i in range(min(16, ds.num_samples(epoch)))]

    base = first_samples(0, 0)
    for seed, epoch in ((0, 1), (1, 0)):
        check(first_samples(seed, epoch) != base, clause="PACK-22",
              what=f"seed {seed}, epoch {epoch}: the same first samples as seed 0, epoch 0")
    ds = PackedDataset(store, seq_len=64, packing="best_fit", shuffle=shuffle, window=32, seed=0)
    firsts = []
    for i in range(ds.num_samples(0)):
        doc_ids = ds.sample(0, i)["doc_ids"]
        firsts.append(int(np.count_nonzero(doc_ids == doc_ids[0])))
    descending = sum(a >= b for a, b in itertools.pairwise(firsts)) / (len(firsts) - 1)
    check(descending < 0.8, clause="PACK-22", what=f"{descending:.0%} of adjacent samples' first documents shrink")
