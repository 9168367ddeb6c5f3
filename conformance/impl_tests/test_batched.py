"""The batched sample path: ``materialize_batch``, ``PackedDataset.__getitems__`` / ``samples``, ``collate``'s pass-through.

``materialize_batch`` of any index list must equal the reference's samples
at those indices, stacked, bit for bit (every mode and option, token sources
of one file or several, files cut anywhere between documents, both ways of
reading tokens); ``materialize`` and ``PackedDataset.__getitem__`` (a batch
of one) are checked against the reference in ``test_packing.py`` and
``test_dataset.py``. ``__getitems__`` of any key list (random order, repeats, mixed epochs,
padding keys, plain ints) equals ``collate`` of ``__getitem__`` of each key
(same keys, dtypes, shapes, values), and a loader built with the fast path
yields the same batches as one without it.
"""

from __future__ import annotations

import tempfile
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.budget import kit_settings
from conformance.impl_tests.test_dataset import CAPABILITIES, make_store
from impl import fill as fl
from impl import packing as ip
from impl.collation import batch_cu_seqlens, collate
from impl.dataset import PackedDataset, SampleKey
from impl.errors import ConfigError, EmptyDataError
from impl.loader import build_dataloader
from reference import packing as rp
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, padding_sample

FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")
BATCH_KEYS = (*FIELDS, "epoch", "sample_index", "cu_seqlens", "max_seqlen")


class PerSampleDataset(PackedDataset):
    """The same dataset without the batched path: the DataLoader falls back to ``[ds[k] for k in keys]``."""

    __getitems__ = None


def unique_tokens(corpus) -> list[list[int]]:
    docs = [doc for f in corpus for doc in f]
    return [[1000 * (k + 1) + j for j in range(len(doc))] for k, doc in enumerate(docs)]


def split_source(documents: list[list[int]], cuts: list[int], dtype=np.uint32) -> fl.TokenSource:
    """The documents as a ``TokenSource`` of several files, cut before the given document indices (files may be empty)."""
    bounds = sorted([0, len(documents), *(c % (len(documents) + 1) for c in cuts)])
    return fl.TokenSource.from_files([documents[x:y] for x, y in pairwise(bounds)], dtype=dtype)


def reference_rows(documents: list[list[int]], config: PackingConfig, indices: list[int]) -> dict[str, np.ndarray]:
    """The reference's samples ``indices`` (``-1``: padding) stacked as int64 ``[len(indices), seq_len]`` arrays."""
    samples = rp.fill(rp.pack_plan([len(d) for d in documents], config), list(enumerate(documents)), config)
    rows = [samples[i] if i >= 0 else padding_sample(config) for i in indices]
    return {name: np.array([getattr(r, name) for r in rows], dtype=np.int64).reshape(len(rows), config.seq_len)
            for name in FIELDS}


def assert_same_batch(got, expected, *, clause: str, what: str, repro) -> None:
    """Same keys in the same order, and per key the same type, dtype, shape and values."""
    __tracebackhide__ = True
    assert_equal(list(got), list(expected), clause=clause, what=f"{what} keys", repro=repro)
    for key in expected:
        g, e = got[key], expected[key]
        if isinstance(e, torch.Tensor):
            check(isinstance(g, torch.Tensor), clause=clause, what=f"{what} {key} is a {type(g).__name__}", repro=repro)
            assert_equal((g.dtype, tuple(g.shape)), (e.dtype, tuple(e.shape)), clause=clause, what=f"{what} {key} dtype/shape",
                         repro=repro)
            check(bool(torch.equal(g, e)), clause=clause, what=f"{what} {key}: {g.tolist()} != {e.tolist()}", repro=repro)
        else:
            assert_equal((type(g), g), (type(e), e), clause=clause, what=f"{what} {key}", repro=repro)


# ------------------------------------------------------------------ materialize_batch == the reference


@pytest.mark.clause("PACK-20", "PACK-3", "PACK-4", "PACK-5")
@kit_settings(max_examples=120)
@given(corpus=ls.corpora(), config=ls.packing_configs(), data=st.data())
def test_materialize_batch_equals_the_reference_samples_for_every_mode_option_and_token_source(corpus, config, data):
    docs = unique_tokens(corpus)
    plan = ip.pack_plan([len(d) for d in docs], config)
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    kind = data.draw(st.sampled_from(["one file", "several files"]), label="source")
    if kind == "one file":
        source = fl.TokenSource.from_documents(docs)
    else:
        source = split_source(docs, data.draw(st.lists(st.integers(0, 400), max_size=4), label="cuts"))
    indices = data.draw(st.lists(st.integers(-1, plan.num_samples - 1), max_size=12), label="indices")
    mapping = data.draw(st.sampled_from([None, "array", "callable"]), label="doc ids")
    ids = np.arange(len(docs), dtype=np.int64)
    doc_ids = {None: None, "array": ids, "callable": lambda pos: ids[pos]}[mapping]
    path = data.draw(st.sampled_from(["slices", "fancy index"]), label="token path")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fl, "SLICE_MIN_WIDTH", 0 if path == "slices" else 10**9)
        got = fl.materialize_batch(plan, np.array(indices, dtype=np.int64), config, source, doc_ids)
    expected = reference_rows(docs, config, indices)
    rep = {"corpus": corpus, "config": config, "source": kind, "indices": indices, "path": path}
    assert_equal(list(got), list(FIELDS), clause="PACK-20", what="materialize_batch keys", repro=rep)
    for name in FIELDS:
        assert_equal((got[name].dtype, got[name].shape), (np.dtype(np.int64), (len(indices), config.seq_len)),
                     clause="PACK-20", what=f"{name} dtype/shape", repro=rep)
        assert_equal(got[name].tolist(), expected[name].tolist(), clause="PACK-20", what=f"batched {name}",
                     repro=rep)


@pytest.mark.clause("PACK-20", "PACK-3")
@pytest.mark.parametrize("mode", ["concat", "chunk", "greedy", "none"])
@pytest.mark.parametrize("path", ["slices", "fancy index"])
def test_bos_and_eos_at_the_edges_of_every_file_come_out_as_in_the_reference(mode, path, monkeypatch):
    docs = [[10 + i * 10 + k for k in range(n)] for i, n in enumerate([5, 1, 0, 7, 3, 9])]
    source = split_source(docs, list(range(1, len(docs))))   # every document in its own file: batches span files
    config = PackingConfig(seq_len=6, mode=mode, add_bos=True, add_eos=True, bos_id=1, eos_id=2)
    plan = ip.pack_plan([len(d) for d in docs], config)
    monkeypatch.setattr(fl, "SLICE_MIN_WIDTH", 0 if path == "slices" else 10**9)
    indices = list(range(plan.num_samples))
    got = fl.materialize_batch(plan, indices, config, source)
    expected = reference_rows(docs, config, indices)
    for name in FIELDS:
        assert_equal(got[name].tolist(), expected[name].tolist(), clause="PACK-20", what=f"{mode} {name} via {path}")


@pytest.mark.clause("PACK-20", "COLL-8", "COLL-11")
@kit_settings(max_examples=40)
@given(corpus=ls.corpora(), config=ls.packing_configs(), data=st.data())
def test_segments_from_the_pieces_equal_cu_seqlens_of_the_position_ids(corpus, config, data):
    docs = unique_tokens(corpus)
    plan = ip.pack_plan([len(d) for d in docs], config)
    indices = data.draw(st.lists(st.integers(-1, plan.num_samples - 1), max_size=12), label="indices")
    source = fl.TokenSource.from_documents(docs)
    got = fl.materialize_batch(plan, np.array(indices, dtype=np.int64), config, source, segments=True)
    cu, max_seqlen = batch_cu_seqlens(got["position_ids"], got["doc_ids"])
    rep = {"corpus": corpus, "config": config, "indices": indices}
    assert_equal(got["cu_seqlens"].dtype, np.dtype(np.int32), clause="COLL-8", what="cu_seqlens dtype", repro=rep)
    assert_equal((got["cu_seqlens"].tolist(), got["max_seqlen"]), (cu.tolist(), max_seqlen), clause="COLL-8",
                 what="segments of the batch", repro=rep)
    plain = fl.materialize_batch(plan, np.array(indices, dtype=np.int64), config, source)
    assert_equal(list(plain), list(FIELDS), clause="PACK-20", what="keys without segments", repro=rep)


@pytest.mark.clause("PACK-20")
def test_batch_pieces_lists_each_rows_pieces_as_pieces_does_and_padding_rows_have_none():
    for mode in ("concat", "chunk", "greedy", "none"):
        config = PackingConfig(seq_len=4, mode=mode)
        plan = ip.pack_plan([3, 6, 1, 9], config)
        indices = [plan.num_samples - 1, -1, 0, 0]
        counts, pos, start, stop = plan.batch_pieces(indices)
        expected = [plan.pieces(i) if i >= 0 else (np.zeros(0),) * 3 for i in indices]
        assert_equal(counts.tolist(), [len(e[0]) for e in expected], clause="PACK-20", what=f"{mode} piece counts")
        for got, k in zip((pos, start, stop), range(3)):
            assert_equal(got.tolist(), [int(v) for e in expected for v in e[k]], clause="PACK-20", what=f"{mode} pieces")


@pytest.mark.clause("PACK-20")
def test_batched_requests_outside_the_plan_raise_config_errors_naming_the_index():
    config = PackingConfig(seq_len=4)
    plan = ip.pack_plan([3, 6, 1], config)
    source = fl.TokenSource.from_documents([[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]])
    for bad in (2, -2):
        assert_raises_typed(ConfigError, fl.materialize_batch, plan, [0, bad], config, source, clause="PACK-20",
                            what=f"index {bad}", mentions=[f"sample index {bad}", "2 samples"])
    assert_raises_typed(ConfigError, fl.materialize_batch, plan, [0], PackingConfig(seq_len=5), source,
                        clause="PACK-20", what="a plan for another seq_len", mentions=["seq_len=4", "seq_len=5"])
    empty = fl.materialize_batch(plan, np.zeros(0, dtype=np.int64), config, source)
    assert_equal({k: v.shape for k, v in empty.items()}, {k: (0, 4) for k in FIELDS}, clause="PACK-20",
                 what="an empty batch")


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("path", ["slices", "fancy index"])
def test_gather_copies_runs_of_several_files_into_their_places(path, monkeypatch):
    source = fl.TokenSource.from_files([[[5, 6, 7]], [], [[8, 9], [1, 2]]], dtype=np.uint16)
    monkeypatch.setattr(fl, "SLICE_MIN_WIDTH", 0 if path == "slices" else 10**9)
    out = np.full(7, -1, dtype=np.int64)
    source.gather(out, np.array([2, 0, 2]), np.array([1, 0, 2]), np.array([3, 2, 3]), np.array([0, 3, 6]))
    assert_equal(out.tolist(), [9, 1, -1, 5, 6, -1, 1], clause="PACK-20", what=f"gather via {path}")
    assert_equal([a.tolist() for a in source.locate(np.array([2, 0, 1]))], [[2, 0, 2], [2, 0, 0], [2, 3, 2]],
                 clause="PACK-20", what="locate: (file, file-local start, length)")


# ------------------------------------------------------------------ __getitems__ == collate of __getitem__


def keys_strategy(ds: PackedDataset, epochs=(0, 1, 2)):
    # Sizes, not the dataset, in the strategy: hypothesis caches strategies (and what their functions
    # refer to) across examples, which would keep every example's dataset and its mapped files.
    sizes = {e: ds.num_samples(e) for e in epochs}
    key = st.sampled_from(epochs).flatmap(lambda e: st.builds(SampleKey, st.just(e), st.integers(-1, sizes[e] - 1)))
    return st.lists(st.one_of(key, key, st.integers(-len(ds), len(ds) - 1)), min_size=1, max_size=10)


@pytest.mark.clause("PACK-20", "RES-1", "RES-5", "PART-5", "COLL-8")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(CAPABILITIES), data=st.data())
def test_getitems_of_any_key_list_equals_collate_of_getitem_of_each_key(corpus, config, data):
    with tempfile.TemporaryDirectory() as tmp, make_store(corpus, Path(tmp) / "store") as store:
        try:
            ds = PackedDataset.from_config(store, config, cache_dir=Path(tmp) / "cache", epoch=1)
        except EmptyDataError:
            return
        keys = data.draw(keys_strategy(ds), label="keys")
        rep = {"corpus": corpus, "config": config, "keys": keys}
        got = ds.__getitems__(keys).batch
        expected = collate([ds[k] for k in keys])
        assert_same_batch(got, expected, clause="PACK-20", what="__getitems__", repro=rep)
        assert_same_batch(collate(got), expected, clause="COLL-8", what="collate(__getitems__)", repro=rep)
        epoch = data.draw(st.sampled_from([0, 2]), label="epoch")
        indices = data.draw(st.lists(st.integers(-1, ds.num_samples(epoch) - 1), min_size=1, max_size=6),
                            label="indices")
        arrays = ds.samples(epoch, np.array(indices))
        by_key = ds.__getitems__([SampleKey(epoch, i) for i in indices]).batch
        for name, value in by_key.items():
            got_value = arrays[name]
            same = got_value == value if name == "max_seqlen" else np.array_equal(got_value, value.numpy())
            check(bool(same) and (name == "max_seqlen" or got_value.dtype == value.numpy().dtype), clause="PACK-20",
                  what=f"samples({epoch}, {indices})[{name!r}]", repro=rep)


@pytest.mark.clause("PACK-20", "PART-5")
def test_getitems_of_only_padding_keys_needs_no_plan_and_gives_padding_rows(monkeypatch):
    corpus = [[[11, 12, 13], [14, 15, 16, 17, 18, 19]], [[20, 21, 22, 23, 24]]]
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="best_fit", eos_id=50256, pad_id=7),
                            ordering=OrderingConfig(kind="global", seed=3))
    with tempfile.TemporaryDirectory() as tmp:
        ds = PackedDataset.from_config(make_store(corpus, Path(tmp) / "store"), config, cache_dir=False)
        expected = collate([ds[SampleKey(5, -1)], ds[SampleKey(6, -1)]])

        def refuse(epoch):
            raise AssertionError(f"padding keys computed the plan of epoch {epoch}")

        monkeypatch.setattr(ds, "plan", refuse)
        got = ds.__getitems__([SampleKey(5, -1), SampleKey(6, -1)]).batch
        assert_same_batch(got, expected, clause="PART-5", what="padding-only batch", repro={})
        assert_equal(got["input_ids"].tolist(), [[7] * 4] * 2, clause="PART-5", what="padding inputs")


@pytest.mark.clause("PACK-20", "RES-5")
def test_getitems_refuses_bad_keys_with_the_error_getitem_raises_for_the_first_bad_key():
    corpus = [[[11, 12, 13], [14, 15, 16, 17, 18, 19]], [[20, 21, 22, 23, 24]]]
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="concat"), ordering=OrderingConfig(kind="global"))
    with tempfile.TemporaryDirectory() as tmp:
        ds = PackedDataset.from_config(make_store(corpus, Path(tmp) / "store"), config, cache_dir=False)
        n = ds.num_samples(0)
        cases = [([SampleKey(0, 0), SampleKey(0, n)], IndexError, [f"SampleKey(0, {n})", str(n)]),
                 ([SampleKey(0, 0), SampleKey(1, -2)], IndexError, ["SampleKey(1, -2)"]),
                 ([SampleKey(-1, 0)], ConfigError, ["epoch=-1"]),
                 ([0, True], TypeError, ["bool"]),
                 ([SampleKey(0, 0), "0"], TypeError, ["SampleKey"]),
                 ([n], IndexError, [str(n)])]
        for keys, error, mentions in cases:
            assert_raises_typed(error, ds.__getitems__, keys, clause="RES-5", what=f"__getitems__({keys!r})",
                                mentions=mentions)
        assert_raises_typed(IndexError, ds.samples, 0, [0, n], clause="RES-5", what="samples out of range",
                            mentions=[str(n)])


@pytest.mark.clause("COLL-8")
def test_collate_passes_a_batched_dict_through_and_adds_missing_varlen_fields():
    batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]]), "position_ids": torch.tensor([[0, 1, 0], [2, 0, 1]])}
    got = collate(batch)
    assert_equal(list(got), ["input_ids", "position_ids", "cu_seqlens", "max_seqlen"], clause="COLL-8", what="keys")
    assert_equal((got["cu_seqlens"].tolist(), got["cu_seqlens"].dtype, got["max_seqlen"]),
                 ([0, 2, 3, 4, 6], torch.int32, 2), clause="COLL-8", what="added cu_seqlens/max_seqlen")
    complete = dict(got)
    check(collate(complete) is complete, clause="COLL-8", what="a complete batched dict is returned unchanged")
    rows = [{"input_ids": batch["input_ids"][r], "position_ids": batch["position_ids"][r]} for r in range(2)]
    assert_same_batch(collate(rows), got, clause="COLL-8", what="list path equals the pass-through", repro={})


# ------------------------------------------------------------------ the loader with and without the fast path


@pytest.mark.clause("PACK-20", "RES-1", "PART-5")
@kit_settings(max_examples=15)
@given(corpus=ls.corpora(), config=ls.pipeline_configs(CAPABILITIES), batch_size=st.integers(1, 5),
       world=st.sampled_from([(0, 1), (1, 2), (2, 3)]))
def test_loader_batches_with_and_without_the_batched_path_are_identical(corpus, config, batch_size, world):
    rank, world_size = world
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(corpus, Path(tmp) / "store")
        try:
            fast = PackedDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
        except EmptyDataError:
            return
        slow = PerSampleDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
        rep = {"corpus": corpus, "config": config, "batch_size": batch_size, "rank": rank, "world_size": world_size}
        loaders = [build_dataloader(ds, batch_size=batch_size, rank=rank, world_size=world_size, end=config.end,
                                    allow_empty_epoch=True)
                   for ds in (fast, slow)]
        for epoch in range(2):
            for loader in loaders:
                loader.set_epoch(epoch)
            got, expected = list(loaders[0]), list(loaders[1])
            assert_equal(len(got), len(expected), clause="RES-1", what=f"epoch {epoch} batches", repro=rep)
            for step, (g, e) in enumerate(zip(got, expected)):
                assert_same_batch(g, e, clause="RES-1", what=f"epoch {epoch} step {step}", repro=rep)
            assert_equal(loaders[0].state_dict(), loaders[1].state_dict(), clause="RES-1", what="state", repro=rep)


@pytest.mark.clause("PACK-20", "RES-1")
def test_loader_with_worker_processes_yields_the_same_batches_through_the_batched_path():
    rng = np.random.default_rng(4)
    corpus = [[rng.integers(1, 500, size=int(n)).tolist() for n in rng.integers(0, 30, size=40)] for _ in range(3)]
    config = PipelineConfig(packing=PackingConfig(seq_len=16, mode="first_fit", eos_id=ls.EOS, pad_id=ls.PAD,
                                                  add_eos=True), ordering=OrderingConfig(kind="window", window=7, seed=2),
                            end="pad")
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(corpus, Path(tmp) / "store")
        fast = PackedDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
        slow = PerSampleDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
        got = list(build_dataloader(fast, batch_size=3, rank=1, world_size=2, end="pad", num_workers=2))
        expected = list(build_dataloader(slow, batch_size=3, rank=1, world_size=2, end="pad"))
        assert_equal(len(got), len(expected), clause="RES-1", what="batches")
        for step, (g, e) in enumerate(zip(got, expected)):
            assert_same_batch(g, e, clause="RES-1", what=f"step {step}", repro={})
