"""impl.dataset.PackedDataset against reference.resume.epoch_samples: every sample of every epoch, bit for bit.

A corpus (files of pre-tokenized documents) is written as a real token store,
one store file per corpus file, so that file-level ordering sees the same
files as the reference. The dataset's samples must equal
``reference.resume.epoch_samples(corpus, config, epoch)`` field for field, for
several epochs; its plan cache must be reused and must never trust a
corrupted file; keys carry their epoch; bad input raises typed errors that
name the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import mmap
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.budget import kit_settings
from impl.dataset import PackedDataset, SampleKey
from impl.errors import ConfigError, EmptyDataError
from impl.plan_cache import PLAN_BLOCK
from impl.store import TokenStore
from reference.collation import cu_seqlens as reference_cu_seqlens
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, epoch_samples, padding_sample, pipeline_fingerprint

FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")
EPOCHS = (0, 1, 2)
CAPABILITIES = {f"ordering:{k}" for k in ("sequential", "global", "window")} | {
    f"packing:{m}" for m in ("concat", "chunk", "greedy", "first_fit", "best_fit", "none")} | {
    "packing:options", "end:drop_last", "end:pad", "end:even"}


# ------------------------------------------------------------------ stores from token lists


def _write_store_by_hand(files, out_dir, *, vocab_size, bos_id=None, eos_id=None, pad_id=None) -> TokenStore:
    """A store written the way impl/store.py writes one (used only if TokenStore has no writer of token lists)."""
    from impl import store as sm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    records = []
    for f, docs in enumerate(files):
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in docs], out=offsets[1:])
        values = np.array([t for d in docs for t in d], dtype=dtype)
        path = out / sm.FILE_TEMPLATE.format(f)
        sm._write_token_file(str(path), values, offsets)
        size = os.path.getsize(path)
        records.append(sm.FileRecord(name=path.name, num_documents=len(docs), num_tokens=int(offsets[-1]),
                                     num_empty_documents=sum(1 for d in docs if not d), size=size,
                                     sha256=sm.sha256_file(path), quick_signature=sm.quick_signature(path, size)).to_json())
    tok = {"sha256": hashlib.sha256(b"test-pretokenized").hexdigest(), "class_name": "pretokenized",
           "vocab_size": vocab_size, "eos_id": eos_id, "bos_id": bos_id, "pad_id": pad_id,
           "eos_token": None, "bos_token": None, "pad_token": None}
    meta = {"format": sm.FORMAT_NAME, "format_version": sm.FORMAT_VERSION, "dtype": dtype,
            "num_documents": sum(r["num_documents"] for r in records), "num_tokens": sum(r["num_tokens"] for r in records),
            "num_empty_documents": sum(r["num_empty_documents"] for r in records), "files": records,
            "fingerprint": sm._content_fingerprint([r["sha256"] for r in records], dtype, tok["sha256"], False, False),
            "tokenizer": tok, "options": {"add_bos": False, "add_eos": False}}
    (out / sm.META_FILE).write_text(json.dumps(meta))
    return TokenStore.open(out)


def make_store(files, out_dir, *, vocab_size=ls.VOCAB, bos_id=ls.BOS, eos_id=ls.EOS, pad_id=ls.PAD) -> TokenStore:
    """``TokenStore.from_documents`` (or the store's other writer of token lists), one store file per corpus file."""
    files = [[list(d) for d in f] for f in files]
    writer = getattr(TokenStore, "from_documents", None) or getattr(TokenStore, "from_token_files", None)
    if writer is None:
        return _write_store_by_hand(files, out_dir, vocab_size=vocab_size, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    return writer(files, out_dir, vocab_size=vocab_size, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)


def document_starts(sample: dict[str, np.ndarray]) -> tuple[int, ...]:
    """Piece starts: positions that restart at 0 and hold a document token or an inserted BOS (not padding)."""
    return tuple(np.flatnonzero((sample["position_ids"] == 0) & (sample["doc_ids"] != -1)).tolist())


def assert_sample_equals(got: dict[str, np.ndarray], expected, *, clause: str, what: str, repro) -> None:
    __tracebackhide__ = True
    for name in FIELDS:
        assert_equal(tuple(got[name].tolist()), tuple(getattr(expected, name)), clause=clause, what=f"{what} {name}",
                     repro=repro)
    assert_equal(document_starts(got), tuple(expected.document_starts), clause="PACK-5", what=f"{what} document starts",
                 repro=repro)
    cu = got["cu_seqlens"].tolist()
    ref = reference_cu_seqlens(list(expected.position_ids), list(expected.doc_ids))
    assert_equal(cu[:len(ref)], ref, clause="COLL-8", what=f"{what} cu_seqlens", repro=repro)
    check(all(v == len(expected.input_ids) for v in cu[len(ref):]), clause="COLL-8",
          what=f"{what} cu_seqlens tail {cu[len(ref):]} should repeat seq_len", repro=repro)


def check_all_epochs(ds: PackedDataset, corpus, config: PipelineConfig, epochs=EPOCHS, most: int | None = None) -> None:
    """Every sample of each epoch equals the reference's (or ``most`` of them, evenly spread, first and last included)."""
    __tracebackhide__ = True
    for epoch in epochs:
        expected = epoch_samples(corpus, config, epoch)
        rep = {"corpus": corpus, "config": config, "epoch": epoch}
        assert_equal(ds.num_samples(epoch), len(expected), clause="PACK-20", what=f"num_samples({epoch})", repro=rep)
        indices = range(len(expected))
        if most is not None and len(expected) > most:
            indices = sorted(set(np.linspace(0, len(expected) - 1, most).astype(int).tolist()))
        for i in indices:
            assert_sample_equals(ds.sample(epoch, i), expected[i], clause="RES-1", what=f"epoch {epoch} sample {i}",
                                 repro=rep)


def has_samples(corpus, config: PipelineConfig) -> bool:
    """Does the dataset accept this corpus: samples, and a kept document of two prepared tokens (a label)?"""
    p = config.packing
    prepared = [len(d) + p.add_bos + p.add_eos for f in corpus for d in f]
    trainable = any(m >= 2 for m in prepared if m > 0 and m >= p.min_len)
    return trainable and len(epoch_samples(corpus, config, 0)) > 0


@pytest.fixture
def workdir():
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


CORPUS = [[[11, 12, 13], [], [14, 15, 16, 17, 18, 19]], [], [[20], [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]],
          [[32, 33]]]


# ------------------------------------------------------------------ equality with the reference


@pytest.mark.clause("RES-1", "PACK-1", "PACK-3", "PACK-4", "PACK-5", "ORD-1", "ORD-11")
@given(corpus=ls.corpora(), config=ls.pipeline_configs(CAPABILITIES))
def test_every_sample_of_several_epochs_equals_the_reference_field_for_field(corpus, config):
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(corpus, Path(tmp) / "store")
        if not has_samples(corpus, config):
            with pytest.raises(EmptyDataError):
                PackedDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
            return
        ds = PackedDataset.from_config(store, config, cache_dir=Path(tmp) / "cache")
        assert_equal(ds.config, config, clause="RES-3", what="dataset config")
        assert_equal(ds.fingerprint, pipeline_fingerprint(store.fingerprint, config), clause="RES-3", what="fingerprint")
        check_all_epochs(ds, corpus, config)


@pytest.mark.clause("RES-1", "PACK-14", "ORD-5")
@kit_settings(max_examples=6)
@given(seed=ls.seeds, data=st.data())
def test_samples_of_a_store_of_a_thousand_documents_equal_the_reference_in_every_mode(seed, data):
    rng = np.random.default_rng(seed)
    corpus = [[rng.integers(1, 500, size=int(n)).tolist() for n in rng.integers(0, 40, size=int(k))]
              for k in rng.integers(0, 400, size=5)]
    corpus.append([[1, 2, 3] * 20])
    config = PipelineConfig(packing=data.draw(ls.packing_configs(max_seq_len=32)),
                            ordering=data.draw(ls.ordering_configs(("sequential", "global", "window"))))
    with tempfile.TemporaryDirectory() as tmp:
        ds = PackedDataset.from_config(make_store(corpus, Path(tmp) / "store"), config, cache_dir=Path(tmp) / "c")
        check_all_epochs(ds, corpus, config, epochs=(0, 3), most=250)


@pytest.mark.clause("RES-3", "PACK-21", "ORD-13")
def test_keyword_constructor_builds_the_reference_pipeline_config_and_fingerprint(workdir):
    store = make_store(CORPUS, workdir / "store")
    ds = PackedDataset(store, seq_len=5, packing="best_fit", shuffle="window", window=3, seed=9, pack_window=2,
                       overflow="split", stride=1, bos_on_continuation=True, add_bos=True, add_eos=True, min_len=2,
                       cache_dir=workdir / "cache", end="pad")
    expected = PipelineConfig(
        packing=PackingConfig(seq_len=5, mode="best_fit", window=2, overflow="split", stride=1, bos_on_continuation=True,
                              add_bos=True, add_eos=True, bos_id=ls.BOS, eos_id=ls.EOS, pad_id=ls.PAD, min_len=2),
        ordering=OrderingConfig(kind="window", seed=9, window=3), end="pad")
    assert_equal(ds.config, expected, clause="RES-3", what="config from keywords")
    assert_equal(ds.fingerprint, pipeline_fingerprint(store.fingerprint, expected), clause="RES-3", what="fingerprint")
    check_all_epochs(ds, CORPUS, expected)
    plain = PackedDataset(str(workdir / "store"), seq_len=4, cache_dir=workdir / "cache")
    assert_equal((plain.config.ordering.kind, plain.config.packing.mode, plain.config.end),
                 ("sequential", "concat", "drop_last"), clause="ORD-2", what="defaults: shuffle='none' is sequential")


@pytest.mark.clause("PACK-3")
def test_pad_id_defaults_to_the_store_pad_id_then_its_eos_id_then_zero(workdir):
    files = [[[5, 6, 7]]]
    cases = [({"pad_id": 3, "eos_id": 4}, 3), ({"pad_id": None, "eos_id": 4}, 4), ({"pad_id": None, "eos_id": None}, 0)]
    for k, (ids, expected) in enumerate(cases):
        store = make_store(files, workdir / f"s{k}", vocab_size=100, bos_id=None, **ids)
        ds = PackedDataset(store, seq_len=4, packing="none", cache_dir=False)
        assert_equal(ds.config.packing.pad_id, expected, clause="PACK-3", what=f"default pad_id for {ids}")
        assert_equal(ds.sample(0, 0)["input_ids"].tolist(), [5, 6, 7, expected], clause="PACK-3", what="padded input")


# ------------------------------------------------------------------ keys, epochs, tensors


@pytest.mark.clause("RES-5", "ORD-11")
def test_sample_key_with_an_explicit_epoch_ignores_the_dataset_epoch(workdir):
    config = PipelineConfig(packing=PackingConfig(seq_len=3, mode="greedy", window=2),
                            ordering=OrderingConfig(kind="global", seed=4))
    ds = PackedDataset.from_config(make_store(CORPUS, workdir / "store"), config, cache_dir=workdir / "cache")
    ds.set_epoch(3)
    for epoch in (1, 2):
        expected = epoch_samples(CORPUS, config, epoch)
        for i, sample in enumerate(expected):
            got = {k: v.numpy() for k, v in ds[SampleKey(epoch, i)].items()}
            assert_sample_equals(got, sample, clause="RES-5", what=f"ds[SampleKey({epoch}, {i})]", repro={})
            assert_equal((int(got["epoch"]), int(got["sample_index"])), (epoch, i), clause="RES-5", what="key fields")
    current = epoch_samples(CORPUS, config, 3)
    assert_equal(len(ds), len(current), clause="RES-7", what="len(ds) in epoch 3")
    assert_sample_equals(ds.sample(3, 0), current[0], clause="RES-7", what="ds[0] in epoch 3", repro={})
    assert_equal(ds[0]["input_ids"].tolist(), list(current[0].input_ids), clause="RES-7", what="plain int uses ds.epoch")
    assert_equal(int(ds[(1, 0)]["epoch"]), 1, clause="RES-5", what="a plain (epoch, index) tuple is a key too")


@pytest.mark.clause("PART-5", "PACK-3", "COLL-11")
def test_padding_key_gives_a_fully_masked_sample_attributed_to_no_document(workdir):
    config = PipelineConfig(packing=PackingConfig(seq_len=4, pad_id=0), end="pad")
    ds = PackedDataset.from_config(make_store(CORPUS, workdir / "store"), config, cache_dir=workdir / "cache")
    got = {k: v.numpy() for k, v in ds[SampleKey(2, -1)].items()}
    assert_sample_equals(got, padding_sample(config.packing), clause="PART-5", what="padding sample", repro={})
    assert_equal((int(got["epoch"]), int(got["sample_index"])), (2, -1), clause="PART-5", what="padding key fields")
    assert_equal(got["cu_seqlens"].tolist(), [0, 4, 4, 4, 4], clause="COLL-11", what="padding cu_seqlens: one segment")


@pytest.mark.clause("PACK-3", "COLL-8")
def test_getitem_returns_int64_tensors_of_seq_len_and_int32_cu_seqlens(workdir):
    ds = PackedDataset(make_store(CORPUS, workdir / "store"), seq_len=4, packing="first_fit", cache_dir=workdir / "c")
    item = ds[0]
    assert_equal(sorted(item), sorted([*FIELDS, "epoch", "sample_index", "cu_seqlens"]), clause="PACK-3", what="keys")
    for name in FIELDS:
        assert_equal((item[name].dtype, tuple(item[name].shape)), (torch.int64, (4,)), clause="PACK-3", what=name)
    for name in ("epoch", "sample_index"):
        assert_equal((item[name].dtype, tuple(item[name].shape)), (torch.int64, ()), clause="PACK-3", what=name)
    assert_equal((item["cu_seqlens"].dtype, tuple(item["cu_seqlens"].shape)), (torch.int32, (5,)), clause="COLL-8",
                 what="cu_seqlens")


@pytest.mark.clause("PACK-20")
def test_negative_plain_ints_count_from_the_end_but_keys_and_bools_do_not(workdir):
    ds = PackedDataset(make_store(CORPUS, workdir / "store"), seq_len=3, packing="none", cache_dir=workdir / "c")
    n = len(ds)
    assert_equal(ds[-1]["input_ids"].tolist(), ds[n - 1]["input_ids"].tolist(), clause="PACK-20", what="ds[-1]")
    assert_equal(int(ds[-n]["sample_index"]), 0, clause="PACK-20", what="ds[-len(ds)] sample_index")
    for key in (n, -n - 1, SampleKey(0, n), SampleKey(0, -2)):
        assert_raises_typed(IndexError, ds.__getitem__, key, clause="PACK-20", what=f"ds[{key!r}]", mentions=[str(n)])
    assert_raises_typed(TypeError, ds.__getitem__, True, clause="PACK-20", what="ds[True]", mentions=["bool"])
    assert_raises_typed(TypeError, ds.__getitem__, "0", clause="PACK-20", what="ds['0']", mentions=["SampleKey"])
    assert_raises_typed(ConfigError, ds.__getitem__, SampleKey(-1, 0), clause="PACK-20", what="negative epoch",
                        mentions=["epoch=-1"])
    assert_raises_typed(ConfigError, ds.set_epoch, -2, clause="RES-7", what="set_epoch(-2)", mentions=["epoch=-2"])


@pytest.mark.clause("PACK-14", "PACK-20")
def test_bin_mode_sample_counts_follow_each_epoch_order(workdir):
    corpus = [[[1] * n for n in (1, 3, 2, 4, 1, 3, 2, 2, 1, 4)]]
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="greedy", window=10),
                            ordering=OrderingConfig(kind="global", seed=1))
    ds = PackedDataset.from_config(make_store(corpus, workdir / "store"), config, cache_dir=workdir / "cache")
    counts = [ds.num_samples(e) for e in range(6)]
    assert_equal(counts, [len(epoch_samples(corpus, config, e)) for e in range(6)], clause="PACK-20",
                 what="greedy sample counts per epoch")


# ------------------------------------------------------------------ the plan cache


@pytest.mark.clause("PACK-20", "RES-1")
def test_a_second_dataset_loads_the_cached_plan_instead_of_computing_it(workdir, monkeypatch):
    store = make_store(CORPUS, workdir / "store")
    config = PipelineConfig(packing=PackingConfig(seq_len=3, mode="best_fit", window=3),
                            ordering=OrderingConfig(kind="window", window=2, seed=3))
    first = PackedDataset.from_config(store, config, cache_dir=workdir / "cache")
    first.num_samples(1)
    npy, sidecar = first.plan_paths(1)
    check(npy.exists() and sidecar.exists(), clause="PACK-20", what=f"cache files {npy.name} and {sidecar.name} exist")
    sidecar_meta = json.loads(sidecar.read_text())
    flat = np.load(npy, allow_pickle=False)
    assert_equal(sidecar_meta["block_crc32"], [zlib.crc32(flat[i:i + PLAN_BLOCK]) for i in range(0, len(flat), PLAN_BLOCK)],
                 clause="PACK-20", what="sidecar checksums, one per block")

    def refuse(self, epoch):
        raise AssertionError(f"plan of epoch {epoch} recomputed although it is cached")

    monkeypatch.setattr(PackedDataset, "compute_plan", refuse)
    second = PackedDataset.from_config(store, config, cache_dir=workdir / "cache")
    check_all_epochs(second, CORPUS, config, epochs=(1,))
    check(is_memory_mapped(second.plan(1).arrays["piece_pos"]), clause="PACK-20",
          what="the cached plan is memory-mapped, not read into memory")


def is_memory_mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def _corruptions():
    def flip_a_byte(npy: Path, sidecar: Path) -> None:
        data = bytearray(npy.read_bytes())
        data[-3] ^= 0xFF
        npy.write_bytes(bytes(data))

    def truncate(npy: Path, sidecar: Path) -> None:
        npy.write_bytes(npy.read_bytes()[:-8])

    def garbage_sidecar(npy: Path, sidecar: Path) -> None:
        sidecar.write_text("{not json")

    def forged_key(npy: Path, sidecar: Path) -> None:
        meta = json.loads(sidecar.read_text())
        meta["key"] = "0" * 64
        sidecar.write_text(json.dumps(meta))

    def missing_npy(npy: Path, sidecar: Path) -> None:
        npy.unlink()

    def wrong_dtype(npy: Path, sidecar: Path) -> None:
        import io as _io
        buf = _io.BytesIO()
        np.save(buf, np.zeros(3, dtype=np.float32), allow_pickle=False)
        npy.write_bytes(buf.getvalue())
        meta = json.loads(sidecar.read_text())
        meta.update(npy_bytes=len(buf.getvalue()), values=3, block_crc32=[zlib.crc32(buf.getvalue())])
        sidecar.write_text(json.dumps(meta))

    return [flip_a_byte, truncate, garbage_sidecar, forged_key, missing_npy, wrong_dtype]


@pytest.mark.clause("PACK-20", "RES-1")
@pytest.mark.parametrize("corrupt", _corruptions(), ids=lambda f: f.__name__)
def test_a_corrupted_cache_file_is_recomputed_never_trusted(workdir, corrupt):
    store = make_store(CORPUS, workdir / "store")
    config = PipelineConfig(packing=PackingConfig(seq_len=4, mode="concat"), ordering=OrderingConfig(kind="global"))
    PackedDataset.from_config(store, config, cache_dir=workdir / "cache").plan(2)
    npy, sidecar = PackedDataset.from_config(store, config, cache_dir=workdir / "cache").plan_paths(2)
    corrupt(npy, sidecar)
    calls = []
    ds = PackedDataset.from_config(store, config, cache_dir=workdir / "cache")
    original = ds.compute_plan
    ds.compute_plan = lambda epoch: calls.append(epoch) or original(epoch)
    check_all_epochs(ds, CORPUS, config, epochs=(2,))
    del ds.compute_plan   # the wrapper refers to ds (a cycle): ds and its files go when the test ends, not at a gc
    assert_equal(calls, [2], clause="PACK-20", what=f"recomputations after {corrupt.__name__}")
    fresh = PackedDataset.from_config(store, config, cache_dir=workdir / "cache")
    fresh.compute_plan = lambda epoch: pytest.fail("the rewritten cache should be valid")
    check_all_epochs(fresh, CORPUS, config, epochs=(2,))


@pytest.mark.clause("PACK-20")
def test_the_store_directory_hosts_the_cache_unless_it_cannot_then_the_user_cache_does(workdir, monkeypatch):
    store = make_store(CORPUS, workdir / "store")
    ds = PackedDataset(store, seq_len=4, shuffle="global")
    ds.plan(0)
    check(ds.plan_paths(0)[0].parent == store.path / ".plans" and ds.plan_paths(0)[0].exists(), clause="PACK-20",
          what=f"default cache at {ds.plan_paths(0)[0]}")
    blocked = make_store([[[1, 2, 3, 4, 5, 6]]], workdir / "blocked")
    (blocked.path / ".plans").write_text("a file where the cache directory would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(workdir / "xdg"))
    fallback = PackedDataset(blocked, seq_len=2, shuffle="global")
    fallback.plan(0)
    check(fallback.plan_paths(0)[0].is_relative_to(workdir / "xdg") and fallback.plan_paths(0)[0].exists(),
          clause="PACK-20", what=f"fallback cache at {fallback.plan_paths(0)[0]}")
    memory_only = PackedDataset(store, seq_len=4, shuffle="window", cache_dir=False)
    assert_equal(memory_only.plan_paths(0), None, clause="PACK-20", what="plan paths with cache_dir=False")
    assert_equal(memory_only.num_samples(0), len(epoch_samples(CORPUS, memory_only.config, 0)), clause="PACK-20",
                 what="num_samples without a disk cache")


@pytest.mark.clause("ORD-3", "ORD-9")
def test_global_shuffle_plans_hold_positions_and_no_permutation_array(workdir):
    ds = PackedDataset(make_store(CORPUS, workdir / "store"), seq_len=3, shuffle="global", cache_dir=workdir / "c")
    plan = ds.plan(1)
    assert_equal(sorted(plan.arrays), ["cum", "kept"], clause="ORD-3", what="stream plan arrays")
    kept_docs = sum(1 for f in CORPUS for d in f if d)
    assert_equal(plan.arrays["kept"].tolist(), [p for p, doc in enumerate(ds.order(1).to_array().tolist())
                                                if CORPUS_LENGTHS[doc] > 0], clause="ORD-3",
                 what="kept epoch positions")
    check(len(plan.arrays["kept"]) == kept_docs, clause="ORD-3", what="one entry per kept document")
    for e in (0, 1, 2):
        ds.plan(e)
    check(len(ds._plans) <= 2, clause="PACK-20", what=f"{len(ds._plans)} plans kept in memory; the LRU holds 2")


CORPUS_LENGTHS = [len(d) for f in CORPUS for d in f]


@pytest.mark.clause("RES-5")
def test_a_copy_for_another_process_drops_memory_caches_and_gives_the_same_samples(workdir):
    ds = PackedDataset(make_store(CORPUS, workdir / "store"), seq_len=3, packing="first_fit", shuffle="window",
                       window=2, cache_dir=workdir / "c")
    before = [ds.sample(1, i)["input_ids"].tolist() for i in range(ds.num_samples(1))]
    clone = copy.copy(ds)
    check(not clone._plans and clone._source is None, clause="RES-5", what="the copy starts without cached plans")
    assert_equal([clone.sample(1, i)["input_ids"].tolist() for i in range(clone.num_samples(1))], before,
                 clause="RES-5", what="samples of the copy")


@pytest.mark.clause("RES-5")
def test_dataloader_workers_compute_the_same_samples_as_the_main_process(workdir):
    ds = PackedDataset(make_store(CORPUS, workdir / "store"), seq_len=3, packing="best_fit", shuffle="global",
                       cache_dir=workdir / "c")
    keys = [SampleKey(e, i) for e in (0, 1) for i in range(ds.num_samples(e))] + [SampleKey(1, -1)]
    loader = torch.utils.data.DataLoader(ds, sampler=keys, batch_size=None, num_workers=1)
    got = [(int(s["epoch"]), int(s["sample_index"]), s["input_ids"].tolist(), s["labels"].tolist()) for s in loader]
    expected = [(k.epoch, k.index, ds[k]["input_ids"].tolist(), ds[k]["labels"].tolist()) for k in keys]
    assert_equal(got, expected, clause="RES-5", what="samples computed in a worker process")


# ------------------------------------------------------------------ typed errors


@pytest.mark.clause("PACK-21", "ORD-13")
def test_bad_configurations_raise_typed_errors_naming_the_fix(workdir):
    store = make_store(CORPUS, workdir / "store")
    no_bos = make_store(CORPUS, workdir / "no-bos", bos_id=None, eos_id=None)
    cases = [
        (ConfigError, dict(store=store, seq_len=0), ["seq_len=0", "seq_len=2048"]),
        (ConfigError, dict(store=store, seq_len=-3), ["seq_len=-3"]),
        (ConfigError, dict(store=store, seq_len=4, packing="pack"), ["packing='pack'", "best_fit"]),
        (ConfigError, dict(store=store, seq_len=4, shuffle="random"), ["shuffle='random'", "global", "window"]),
        (NotImplementedError, dict(store=store, seq_len=4, shuffle="buffer"), ["buffer", "global", "window"]),
        (ConfigError, dict(store=store, seq_len=4, pack_window=0), ["pack_window=0"]),
        (ConfigError, dict(store=store, seq_len=4, shuffle="window", window=0), ["window=0"]),
        (ConfigError, dict(store=store, seq_len=4, stride=4, packing="none"), ["stride=4", "lower stride"]),
        (ConfigError, dict(store=no_bos, seq_len=4, add_bos=True), ["add_bos=True", "bos_id", "add_bos=False"]),
        (ConfigError, dict(store=no_bos, seq_len=4, packing="none", bos_on_continuation=True),
         ["bos_on_continuation=True", "rebuild"]),
        (ConfigError, dict(store=no_bos, seq_len=4, add_eos=True), ["add_eos=True", "eos_id"]),
        (EmptyDataError, dict(store=store, seq_len=2048), ["seq_len=2048", "2049", "packing='none'"]),
        (EmptyDataError, dict(store=store, seq_len=2048, packing="chunk"), ["2049", "packing='none'"]),
        (EmptyDataError, dict(store=store, seq_len=4, packing="none", min_len=99), ["min_len=99", "lower min_len"]),
        (ConfigError, dict(store=store, seq_len=4, end="sometimes"), ["end='sometimes'"]),
        (ConfigError, dict(store=store, seq_len=4, epoch=-1), ["epoch=-1"]),
        (ConfigError, dict(store=store, seq_len=4, cache_dir=workdir / "store" / "meta.json" / "x"), ["cache_dir"]),
    ]
    for error, kwargs, mentions in cases:
        assert_raises_typed(error, PackedDataset, clause="PACK-21", what=f"PackedDataset({kwargs})", mentions=mentions,
                            **kwargs)
    empty = make_store([[[], []], []], workdir / "empty", vocab_size=10, bos_id=None, eos_id=None, pad_id=None)
    assert_raises_typed(EmptyDataError, PackedDataset, empty, seq_len=4, packing="none", clause="PACK-2",
                        what="a store of empty documents", mentions=["keeps no document", "add_eos=True"])
    buffered = PipelineConfig(packing=PackingConfig(seq_len=4), ordering=OrderingConfig(kind="buffer"))
    assert_raises_typed(NotImplementedError, PackedDataset.from_config, store, buffered, clause="ORD-10",
                        what="from_config with a buffer ordering", mentions=["buffer", "global"])
    assert_raises_typed(ConfigError, PackedDataset.from_config, store, PackingConfig(seq_len=4), clause="RES-3",
                        what="from_config with a PackingConfig", mentions=["PipelineConfig"])
    assert_raises_typed(ConfigError, PackedDataset, 42, seq_len=4, clause="PACK-21", what="a store that is a number",
                        mentions=["TokenStore"])


def test_a_cache_dir_that_is_a_file_is_refused_naming_the_path_and_that_it_is_a_file(workdir):
    store = make_store(CORPUS, workdir / "store")
    afile = workdir / "plans.txt"
    afile.write_text("not a directory")
    for cache_dir, mentions in ((afile, [repr(str(afile)), "is a file"]),
                                (afile / "plans", [repr(str(afile / "plans")), repr(str(afile)), "is a file"])):
        assert_raises_typed(ConfigError, PackedDataset, store, seq_len=4, cache_dir=cache_dir, clause="cache_dir",
                            what=f"cache_dir={cache_dir}", mentions=mentions)
