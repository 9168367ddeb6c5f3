"""TokenStore: every source kind round-trips, the store is exact, zero-copy, crash- and race-safe.

Why these tests: the store fixes "document i" for every loader, checkpoint and
fingerprint. A wrong token, a dropped empty document, a result that depends
on ``num_proc``, or a half-written store that ``open()`` trusts would all turn
into silently wrong training data, so each of those is pinned here against an
independent oracle (the tokenizer's own ``__call__``, plain Python
concatenation, the file bytes on disk).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import pickle
import random
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conformance.impl_tests.test_store_integrity import _as_format_3
from fixtures import generators
from impl import build as build_module
from impl import store as store_module
from impl import store_files as files_module
from impl._atomic import atomic_write_bytes, atomic_write_json, file_lock, lock_path_for
from impl.errors import (
    ConfigError,
    EmptyDataError,
    LoadspecError,
    SourceError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
    TokenizerError,
)
from impl.store import FORMAT_VERSION, QUICK_SIGNATURE_BYTES, BuildOptions, TokenStore

WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
    "phi", "chi", "psi", "omega", "hello", "world", "the", "quick", "brown", "fox",
]
SPECIALS = ["[UNK]", "<pad>", "<bos>", "<eos>"]
GPT2_DIR = generators.TOKENIZER_DIR


# --------------------------------------------------------------------------- helpers


def word_tokenizer(*, eos: bool = True, bos: bool = True, vocab_size: int | None = None):
    """A tiny WordLevel fast tokenizer built in memory (no files, no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    if vocab_size is not None:
        for i in range(len(vocab), vocab_size):
            vocab[f"w{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs = {"unk_token": "[UNK]", "pad_token": "<pad>"}
    if eos:
        kwargs["eos_token"] = "<eos>"
    if bos:
        kwargs["bos_token"] = "<bos>"
    return PreTrainedTokenizerFast(tokenizer_object=tk, **kwargs)


def make_docs(n: int = 40, seed: int = 0) -> list[str]:
    """Documents of 0..12 words, with empty, whitespace-only and unknown-word documents mixed in."""
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS + ["unknownword"]) for _ in range(rng.randint(0, 12))) for _ in range(n)]
    docs[3] = ""
    docs[10] = "   "
    docs[n - 1] = ""
    return docs


def expected_tokens(tokenizer, docs, *, add_eos: bool = True, add_bos: bool = False) -> list[list[int]]:
    """The oracle: the tokenizer's own __call__ (not the backend path the store uses) plus bos/eos."""
    out = []
    for text in docs:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if add_bos:
            ids = [tokenizer.bos_token_id] + ids
        if add_eos:
            ids = ids + [tokenizer.eos_token_id]
        out.append(ids)
    return out


def assert_store_holds(store: TokenStore, expected: list[list[int]]) -> None:
    assert len(store) == store.num_documents == len(expected)
    assert store.num_tokens == sum(map(len, expected))
    got = [store[i].tolist() for i in range(len(store))]
    assert got == expected
    assert store.lengths.tolist() == [len(d) for d in expected]


def token_files(store: TokenStore) -> list[Path]:
    return [store.path / r["name"] for r in store.meta["files"]]


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def write_arrow(path: Path, docs: list[str], *, stream: bool) -> Path:
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream(sink, table.schema) if stream else pa.ipc.new_file(sink, table.schema)
        with writer:
            for batch in table.to_batches(max_chunksize=7):
                writer.write_batch(batch)
    return path


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("tok") / "word-tokenizer"
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def docs():
    return make_docs()


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, tok, docs):
    """A store of 40 documents in 6 files (docs_per_file=7), built once for read-only tests."""
    return TokenStore.build(docs, tok, tmp_path_factory.mktemp("small") / "store", num_proc=1,
                            docs_per_file=7, progress=False)


@pytest.fixture(scope="module")
def big_store_dir(tmp_path_factory, tok):
    """One ~1.2 MB token file: large compared to the 2 x 64 KiB an open may read."""
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(6000)) for _ in range(100)]
    store = TokenStore.build(texts, tok, tmp_path_factory.mktemp("big") / "store", num_proc=1,
                             progress=False)
    assert store.meta["files"][0]["size"] > 8 * QUICK_SIGNATURE_BYTES
    return store.path


@pytest.fixture
def big_store_copy(tmp_path, big_store_dir):
    dst = tmp_path / "store"
    shutil.copytree(big_store_dir, dst)
    return dst


# --------------------------------------------------------------------------- sources


def _source(kind: str, tmp_path: Path, docs: list[str], tok, tok_dir: Path):
    """(source, tokenizer, extra build kwargs) for one source kind; tokenizer given in varied forms."""
    import datasets

    if kind == "dataset":
        return datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))}), tok, {}
    if kind == "dataset_dict_split":
        dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                                   "test": datasets.Dataset.from_dict({"text": ["alpha"]})})
        return dd, tok_dir, {"split": "train"}
    if kind == "parquet_dir":
        generators.write_parquet_shards(docs, tmp_path / "pq", num_shards=3, row_group_size=5)
        return tmp_path / "pq", tok_dir, {}
    if kind == "jsonl_files":
        paths = generators.write_jsonl_shards(docs, tmp_path / "jl", num_shards=4, text_field="body")
        return paths, str(tok_dir / "tokenizer.json"), {"text_field": "body"}
    if kind == "txt_file":
        (path,) = generators.write_txt_files(docs, tmp_path / "txt", num_files=1)
        return str(path), tok, {}
    if kind == "arrow_ipc_file":
        return write_arrow(tmp_path / "docs.arrow", docs, stream=False), tok, {}
    if kind == "arrow_ipc_stream":
        return write_arrow(tmp_path / "docs.arrow", docs, stream=True), tok, {}
    if kind == "save_to_disk_dir":
        return generators.write_save_to_disk(docs, tmp_path, num_shards=2), tok, {}
    if kind == "save_to_disk_dict_split":
        path = generators.write_save_to_disk_dict(docs + ["alpha beta"], tmp_path, num_validation=1, num_shards=2)
        return path, tok, {"split": "train"}
    if kind == "load_dataset_cache_dir":
        _, cache_files = generators.write_load_dataset_cache(docs, tmp_path, num_shards=2)
        return cache_files[0].parent, tok, {}
    if kind == "iterable_of_strings":
        return (d for d in docs), tok, {}
    if kind == "list_of_dicts":
        return [{"text": d, "id": i} for i, d in enumerate(docs)], tok, {}
    raise AssertionError(kind)


SOURCE_KINDS = [
    "dataset", "dataset_dict_split", "parquet_dir", "jsonl_files", "txt_file", "arrow_ipc_file",
    "arrow_ipc_stream", "save_to_disk_dir", "save_to_disk_dict_split", "load_dataset_cache_dir",
    "iterable_of_strings", "list_of_dicts",
]


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_every_source_kind_round_trips_to_the_tokenizers_own_encoding_plus_eos(kind, tmp_path, docs, tok, tok_dir):
    source, tokenizer, kwargs = _source(kind, tmp_path, docs, tok, tok_dir)
    store = TokenStore.build(source, tokenizer, tmp_path / "store", num_proc=1, docs_per_file=7,
                             progress=False, **kwargs)
    assert_store_holds(store, expected_tokens(tok, docs))
    # "", "   " and zero-word documents encode to no tokens but are kept (just eos)
    assert store.num_empty_documents == sum(d == [tok.eos_token_id] for d in expected_tokens(tok, docs)) >= 3
    assert store.file_document_counts == [7, 7, 7, 7, 7, 5]
    assert store.eos_id == tok.eos_token_id == 3
    assert store.dtype == np.uint16
    reopened = TokenStore.open(tmp_path / "store", verify=True)
    assert reopened.fingerprint == store.fingerprint


def test_the_same_documents_give_the_same_fingerprint_whatever_the_source_kind(tmp_path, docs, tok):
    import datasets

    a = TokenStore.build(docs, tok, tmp_path / "a", num_proc=1, docs_per_file=7, progress=False)
    b = TokenStore.build(datasets.Dataset.from_dict({"text": docs}), tok, tmp_path / "b", num_proc=1,
                         docs_per_file=7, progress=False)
    c = TokenStore.build(docs, tok, tmp_path / "c", num_proc=1, docs_per_file=8, progress=False)
    assert a.fingerprint == b.fingerprint
    assert c.fingerprint != a.fingerprint  # the file layout is part of the content


def test_a_datasetdict_without_split_is_refused_listing_its_splits(tmp_path, tok):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["alpha"]}),
                               "validation": datasets.Dataset.from_dict({"text": ["beta"]})})
    with pytest.raises(ConfigError, match=r"split=.*") as info:
        TokenStore.build(dd, tok, tmp_path / "store", progress=False)
    assert "train" in str(info.value) and "validation" in str(info.value)
    with pytest.raises(ConfigError, match="no split 'test'"):
        TokenStore.build(dd, tok, tmp_path / "store", split="test", progress=False)
    assert not (tmp_path / "store").exists()


def test_directory_sources_are_read_recursively_in_sorted_path_order_skipping_hidden_files(tmp_path, tok):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "b.jsonl").write_text(json.dumps({"text": "beta"}) + "\n")
    (d / "a.jsonl").write_text(json.dumps({"text": "alpha"}) + "\n" + json.dumps({"text": "gamma"}) + "\n")
    (d / "sub" / "c.txt").write_text("delta\nepsilon\n")
    (d / ".hidden.jsonl").write_text(json.dumps({"text": "omega"}) + "\n")
    (d / "README.md").write_text("not data")
    store = TokenStore.build(d, tok, tmp_path / "store", progress=False)
    order = ["alpha", "gamma", "beta", "delta", "epsilon"]
    assert_store_holds(store, expected_tokens(tok, order))
    assert store.meta["source"]["description"]["files"] == ["a.jsonl", "b.jsonl", "sub/c.txt"]


def test_txt_lines_split_on_newline_only_dropping_cr_and_keeping_empty_lines(tmp_path, tok):
    path = tmp_path / "docs.txt"
    path.write_bytes("alpha beta\r\n\ngamma\u2028delta\x0bpi\nomega".encode())
    store = TokenStore.build(path, tok, tmp_path / "store", progress=False)
    texts = ["alpha beta", "", "gamma\u2028delta\x0bpi", "omega"]
    assert_store_holds(store, expected_tokens(tok, texts))
    assert store.num_empty_documents == 1


def test_empty_documents_are_kept_with_their_eos_and_bos_and_counted(tmp_path, tok):
    texts = ["", "alpha", "", "   "]
    store = TokenStore.build(texts, tok, tmp_path / "store", add_bos=True, progress=False)
    assert [store[i].tolist() for i in range(4)] == [[2, 3], [2, 4, 3], [2, 3], [2, 3]]
    assert store.num_empty_documents == store.meta["num_empty_documents"] == 3
    bos_only = TokenStore.build(texts, tok, tmp_path / "bos_only", add_bos=True, add_eos=False, progress=False)
    assert [bos_only[i].tolist() for i in range(4)] == [[2], [2, 4], [2], [2]]
    bare = TokenStore.build(texts, tok, tmp_path / "bare", add_eos=False, progress=False)
    assert len(bare) == 4 and bare.lengths.tolist() == [0, 1, 0, 0] and bare.num_tokens == 1
    assert [r["num_documents"] for r in bare.meta["files"]] == [4]


def test_a_null_or_non_string_document_is_refused_not_dropped(tmp_path, tok):
    import datasets

    with pytest.raises(SourceError, match="null"):
        TokenStore.build(datasets.Dataset.from_dict({"text": ["alpha", None]}), tok, tmp_path / "a", progress=False)
    with pytest.raises(SourceError, match="document 1 .*int"):
        TokenStore.build(["alpha", 7], tok, tmp_path / "b", progress=False)
    with pytest.raises(SourceError, match="no column 'body'.*text"):
        TokenStore.build(datasets.Dataset.from_dict({"text": ["a"]}), tok, tmp_path / "c", text_field="body",
                         progress=False)
    assert not any((tmp_path / n).exists() for n in "abc")


def test_a_missing_source_path_is_refused_with_a_config_error(tmp_path, tok):
    with pytest.raises(SourceError, match="does not exist"):
        TokenStore.build(str(tmp_path / "nope.jsonl"), tok, tmp_path / "store", progress=False)


# --------------------------------------------------------------------------- tokenizer


def test_the_gpt2_fixture_tokenizer_stores_hello_world_as_15496_995_then_eos(tmp_path):
    tokenizer = generators.load_tokenizer()
    texts = ["Hello world", ""] + generators.load_corpus(limit=12) + generators.load_corpus("botchan", limit=30)
    store = TokenStore.build(texts, str(GPT2_DIR), tmp_path / "store", num_proc=1, docs_per_file=16,
                             progress=False)
    assert store[0].tolist() == [15496, 995, 50256]
    assert store[1].tolist() == [50256]
    assert (store.eos_id, store.bos_id, store.pad_id, store.vocab_size) == (50256, 50256, 50256, 50257)
    assert store.dtype == np.uint16
    assert_store_holds(store, expected_tokens(tokenizer, texts))
    # Tokenizer given as an object and as a directory have the same identity, hence the same fingerprint.
    again = TokenStore.build(texts, tokenizer, tmp_path / "again", num_proc=1, docs_per_file=16, progress=False)
    assert again.fingerprint == store.fingerprint
    assert store.meta["tokenizer"]["sha256"] == again.meta["tokenizer"]["sha256"]


def test_token_ids_are_uint16_up_to_65536_ids_and_uint32_beyond(tmp_path):
    fits = word_tokenizer(vocab_size=65536)
    store = TokenStore.build(["w65535 alpha"], fits, tmp_path / "u16", progress=False)
    assert store.dtype == np.uint16 and store.meta["dtype"] == "uint16"
    assert store[0].tolist() == [65535, fits.convert_tokens_to_ids("alpha"), 3]

    wide = word_tokenizer(vocab_size=65537)
    store = TokenStore.build(["w65536 alpha"], wide, tmp_path / "u32", progress=False)
    assert store.dtype == np.uint32 and store[0].dtype == np.uint32
    assert store[0].tolist() == [65536, wide.convert_tokens_to_ids("alpha"), 3]
    assert TokenStore.open(tmp_path / "u32").dtype == np.uint32


def test_an_eos_token_missing_from_the_vocabulary_is_refused_offering_a_token_the_vocabulary_has(tmp_path):
    from transformers import PreTrainedTokenizerFast

    # named, but not a token of the vocabulary: no id (without an unk_token, which transformers would hand out instead)
    tok = PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(eos=False, bos=False).backend_tokenizer)
    tok.eos_token = "<|endoftext|>"
    with pytest.raises(TokenizerError) as info:
        TokenStore.build(["alpha"], tok, tmp_path / "store", progress=False)
    message = str(info.value)
    assert "'<|endoftext|>', which is not in its vocabulary" in message and "add_eos=False" in message, message
    assert "'<eos>'" in message, f"the vocabulary's own '<eos>' is not offered: {message}"
    assert "eos_token='<|endoftext|>')" not in message and "holds '<|endoftext|>'" not in message, message
    tok.eos_token = "<eos>"
    assert TokenStore.build(["alpha"], tok, tmp_path / "store", progress=False)[0].tolist() == [4, 3]


def test_an_eos_token_outside_the_vocabulary_of_a_tokenizer_with_an_unk_token_is_refused_not_read_as_unk(tmp_path):
    """transformers gives such a token unk_token's id: [UNK] would silently end every document."""
    tok = word_tokenizer(eos=False, bos=False)
    tok.eos_token = "<|endoftext|>"
    assert tok.eos_token_id == tok.unk_token_id, "the premise: transformers hands out [UNK]'s id"
    with pytest.raises(TokenizerError) as info:
        TokenStore.build(["alpha"], tok, tmp_path / "store", progress=False)
    assert "'<|endoftext|>', which is not in its vocabulary" in str(info.value), str(info.value)
    assert not (tmp_path / "store").exists()
    store = TokenStore.build(["alpha"], tok, tmp_path / "store", add_eos=False, progress=False)
    assert store.eos_id is None and store[0].tolist() == [4], (store.eos_id, store[0].tolist())


def test_a_tokenizer_without_eos_is_refused_when_add_eos_is_true(tmp_path):
    no_eos = word_tokenizer(eos=False, bos=False)
    with pytest.raises(TokenizerError, match="add_eos=False.*eos_token") as info:
        TokenStore.build(["alpha"], no_eos, tmp_path / "store", progress=False)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(TokenizerError, match="add_bos=False"):
        TokenStore.build(["alpha"], no_eos, tmp_path / "store", add_bos=True, add_eos=False, progress=False)
    assert not (tmp_path / "store").exists()
    store = TokenStore.build(["alpha"], no_eos, tmp_path / "store", add_eos=False, progress=False)
    assert store[0].tolist() == [4] and store.eos_id is None


def test_a_slow_or_missing_tokenizer_is_refused_with_a_tokenizer_error(tmp_path):
    with pytest.raises(TokenizerError, match="not a fast tokenizer"):
        TokenStore.build(["alpha"], object(), tmp_path / "store", progress=False)
    with pytest.raises(TokenizerError, match="does not exist"):
        TokenStore.build(["alpha"], str(tmp_path / "no-tokenizer"), tmp_path / "store", progress=False)


# --------------------------------------------------------------------------- determinism across num_proc


def test_num_proc_1_and_2_give_byte_identical_files_and_the_same_fingerprint(tmp_path, tok_dir, tok, monkeypatch):
    import concurrent.futures

    pools = []

    class RecordingPool(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", RecordingPool)
    texts = make_docs(60, seed=5)
    one = TokenStore.build(texts, tok_dir, tmp_path / "one", num_proc=1, docs_per_file=8, progress=False)
    assert pools == []  # num_proc=1 tokenizes in this process
    two = TokenStore.build(texts, tok_dir, tmp_path / "two", num_proc=2, docs_per_file=8, progress=False)
    assert [(p["max_workers"], p["mp_context"].get_start_method()) for p in pools] == [(1, "spawn")] * 2
    assert one.num_files == two.num_files == 8
    assert [r["sha256"] for r in one.meta["files"]] == [r["sha256"] for r in two.meta["files"]]
    assert [p.read_bytes() for p in token_files(one)] == [p.read_bytes() for p in token_files(two)]
    assert one.fingerprint == two.fingerprint
    assert_store_holds(two, expected_tokens(tok, texts))


# --------------------------------------------------------------------------- zero-copy access


def test_documents_are_read_only_zero_copy_views_of_the_mapped_file(small_store):
    doc = small_store[8]  # file 1, local document 1
    assert not doc.flags.writeable and not doc.flags.owndata
    with pytest.raises(ValueError):
        doc[0] = 1
    f, local = small_store.locate(8)
    assert (f, local) == (1, 1)
    start = int(small_store.doc_offsets[8])
    same_file = small_store.read(int(small_store.doc_offsets[7]), int(small_store.doc_offsets[13]))
    assert np.shares_memory(doc, same_file)  # both are views into one mapping
    assert np.shares_memory(small_store[7], small_store.tokens_for(7, 1))
    assert small_store.read(start, start + len(doc)).tolist() == doc.tolist()
    for arr in (small_store.lengths, small_store.doc_offsets):
        assert arr.dtype == np.int64 and not arr.flags.writeable


def test_lengths_offsets_and_file_counts_agree_with_the_documents(small_store, tok, docs):
    expected = expected_tokens(tok, docs)
    assert small_store.lengths.tolist() == [len(d) for d in expected]
    assert small_store.doc_offsets.tolist() == np.concatenate([[0], np.cumsum([len(d) for d in expected])]).tolist()
    assert small_store.file_document_counts == [7, 7, 7, 7, 7, 5]
    assert small_store.file_document_starts == [0, 7, 14, 21, 28, 35, 40]
    assert sum(small_store.file_token_counts) == small_store.num_tokens
    assert small_store.lengths is small_store.lengths  # cached


def test_indexing_follows_python_rules_for_negative_and_out_of_range_indices(small_store):
    n = len(small_store)
    assert small_store[-1].tolist() == small_store[n - 1].tolist()
    assert small_store[-n].tolist() == small_store[0].tolist()
    assert small_store[np.int64(5)].tolist() == small_store[5].tolist()
    for bad in (n, -n - 1, 10**9):
        with pytest.raises(IndexError):
            small_store[bad]
    with pytest.raises(TypeError):
        small_store[1.5]
    assert small_store.tokens_for(2, 1, 3).tolist() == small_store[2].tolist()[1:3]


def test_read_across_document_and_file_boundaries_equals_the_concatenation(tmp_path):
    rng = random.Random(7)
    files = [[[rng.randrange(1, 60000) for _ in range(rng.randrange(0, 9))] for _ in range(rng.randrange(0, 6))]
             for _ in range(7)]
    files[2] = []  # a file with no documents
    files[4] = [[], []]  # a file with no tokens
    store = TokenStore.from_token_files(files, tmp_path / "store", eos_id=60001)
    flat = [t for f in files for d in f for t in d]
    total = len(flat)
    assert store.num_tokens == total and store.file_document_counts == [len(f) for f in files]
    cuts = sorted({0, total, *store.doc_offsets.tolist(), *np.cumsum([0, *store.file_token_counts]).tolist()})
    pairs = [(a, b) for a in cuts for b in cuts if a <= b]
    pairs += [tuple(sorted((rng.randrange(total + 1), rng.randrange(total + 1)))) for _ in range(300)]
    for a, b in pairs:
        got = store.read(a, b)
        assert got.dtype == store.dtype
        assert got.tolist() == flat[a:b], (a, b)
    for a, b in ((-1, 3), (0, total + 1), (5, 4)):
        with pytest.raises(IndexError):
            store.read(a, b)
    documents = [d for f in files for d in f]
    picks = [rng.randrange(len(documents)) for _ in range(50)] + [-1, 0]
    tokens, offsets = store.gather(picks)
    assert tokens.tolist() == [t for i in picks for t in documents[i]]
    assert offsets.tolist() == np.concatenate([[0], np.cumsum([len(documents[i]) for i in picks])]).tolist()


def test_from_token_files_keeps_empty_files_and_empty_documents_and_allows_an_empty_corpus(tmp_path):
    store = TokenStore.from_token_files([[[5, 6], []], [], [[7]]], tmp_path / "a", eos_id=9, pad_id=0)
    assert [store[i].tolist() for i in range(len(store))] == [[5, 6], [], [7]]
    assert store.file_document_counts == [2, 0, 1] and store.num_empty_documents == 1
    assert (store.eos_id, store.pad_id, store.vocab_size) == (9, 0, 10)
    empty = TokenStore.from_token_files([], tmp_path / "b")
    assert empty.num_documents == 0 and empty.num_tokens == 0 and empty.lengths.tolist() == []
    assert TokenStore.open(tmp_path / "b", verify=True).num_documents == 0
    with pytest.raises(ConfigError, match="vocab_size"):
        TokenStore.from_token_files([[[70000]]], tmp_path / "c", vocab_size=65536)
    assert TokenStore.from_token_files([[[70000]]], tmp_path / "d").dtype == np.uint32


def test_a_store_pickles_as_its_path_and_reopens_to_the_same_tokens(small_store):
    blob = pickle.dumps(small_store)
    assert len(blob) < 2000  # the path and fingerprint, never the tokens
    clone = pickle.loads(blob)
    assert clone.fingerprint == small_store.fingerprint
    assert [clone[i].tolist() for i in range(len(clone))] == [small_store[i].tolist() for i in range(len(small_store))]


# --------------------------------------------------------------------------- open() checks


def test_open_reads_metadata_only_and_no_token_file(big_store_dir, monkeypatch):
    opened = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    def no_hash(*args, **kwargs):
        raise AssertionError("open() hashed a token file")

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(files_module, "sha256_of", no_hash)
    monkeypatch.setattr(files_module, "quick_signature_of", no_hash)
    store = TokenStore.open(big_store_dir)
    assert not [p for p in opened if p.endswith(".arrow")]
    assert store.num_files >= 1


@pytest.mark.parametrize("version", [3, 4])
def test_first_read_of_a_format_3_or_4_file_maps_its_recorded_buffers_without_signature_arrow_parse_or_full_hash(
        big_store_copy, monkeypatch, version):
    def refuse(what):
        return lambda *args, **kwargs: pytest.fail(f"the first read called {what}")

    if version == 3:
        _as_format_3(big_store_copy)
    expected = [TokenStore.open(big_store_copy)[d].tolist() for d in (0, 1, 57)]
    monkeypatch.setattr(files_module, "quick_signature_of", refuse("quick_signature_of"))
    monkeypatch.setattr(files_module, "_open_arrow", refuse("the Arrow footer parse"))
    monkeypatch.setattr(files_module, "sha256_of", refuse("sha256_of"))
    store = TokenStore.open(big_store_copy)
    assert [store[d].tolist() for d in (0, 1, 57)] == expected
    starts, lengths = store.document_bounds_batch(np.array([0, 0]), np.array([57, 1]))
    assert [store.read(a, a + n).tolist() for a, n in zip(starts.tolist(), lengths.tolist())] == expected[:0:-1]
    assert store[0].size > 0 and store.format_version == version


def test_a_mid_file_edit_passes_open_but_fails_verify(big_store_copy):
    path = token_files(TokenStore.open(big_store_copy))[0]
    size = path.stat().st_size
    with open(path, "r+b") as f:  # in the middle: outside both quick-signature windows
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    store = TokenStore.open(big_store_copy)  # the O(1) check cannot see it: that is the point of verify
    with pytest.raises(StoreCorruptError, match=rf"{path.name} changed since it was built.*rebuild"):
        store.verify()
    with pytest.raises(StoreCorruptError, match="changed since it was built"):
        TokenStore.open(big_store_copy, verify=True)


def test_a_truncated_token_file_is_refused_as_corrupt_naming_the_file_and_the_fix(big_store_copy):
    path = token_files(TokenStore.open(big_store_copy))[0]
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(StoreCorruptError, match=rf"{path.name} is truncated.*rebuild it with"):
        TokenStore.open(big_store_copy)


def test_a_same_size_edit_within_the_first_64_kib_is_refused_as_changed(big_store_copy):
    path = token_files(TokenStore.open(big_store_copy))[0]
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(QUICK_SIGNATURE_BYTES - 10)
        byte = f.read(1)
        f.seek(QUICK_SIGNATURE_BYTES - 10)
        f.write(bytes([byte[0] ^ 0x01]))
    assert path.stat().st_size == size
    store = TokenStore.open(big_store_copy)  # the size matches: open cannot tell, the first read does
    with pytest.raises(StoreCorruptError, match=rf"{path.name} changed since it was built.*rebuild"):
        store.read(0, store.num_tokens)
    with pytest.raises(StoreCorruptError, match=rf"{path.name} changed since it was built"):
        store.read(0, store.num_tokens)  # refused again: a failed check never counts as verified


def test_a_missing_token_file_is_refused_as_corrupt(tmp_path, small_store):
    dst = tmp_path / "store"
    shutil.copytree(small_store.path, dst)
    (dst / "tokens-00003.arrow").unlink()
    with pytest.raises(StoreCorruptError, match="tokens-00003.arrow is missing.*rebuild"):
        TokenStore.open(dst)


def test_a_grown_token_file_is_refused_as_changed(tmp_path, small_store):
    dst = tmp_path / "store"
    shutil.copytree(small_store.path, dst)
    with open(dst / "tokens-00000.arrow", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(StoreCorruptError, match="tokens-00000.arrow changed since it was built"):
        TokenStore.open(dst)


def _edit_meta(path: Path, **changes) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


def test_a_future_format_version_is_refused_naming_the_supported_version(tmp_path, small_store):
    dst = tmp_path / "store"
    shutil.copytree(small_store.path, dst)
    _edit_meta(dst, format_version=FORMAT_VERSION + 1)
    with pytest.raises(StoreVersionError, match=rf"version {FORMAT_VERSION + 1} is newer.*version {FORMAT_VERSION}"):
        TokenStore.open(dst)
    _edit_meta(dst, format_version="1")
    with pytest.raises(StoreVersionError, match="not an integer"):
        TokenStore.open(dst)


def test_a_foreign_or_unparseable_meta_json_is_refused_as_corrupt(tmp_path, small_store):
    dst = tmp_path / "store"
    shutil.copytree(small_store.path, dst)
    _edit_meta(dst, format="something.else")
    with pytest.raises(StoreCorruptError, match="not a loadspec token store"):
        TokenStore.open(dst)
    (dst / "meta.json").write_text('{"format": "loadspec.tok')
    with pytest.raises(StoreCorruptError, match="not valid JSON"):
        TokenStore.open(dst)


def test_a_missing_store_is_store_not_found_which_is_also_a_file_not_found_error(tmp_path):
    with pytest.raises(StoreNotFoundError, match="does not exist.*TokenStore.build") as info:
        TokenStore.open(tmp_path / "nothing")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, LoadspecError)
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreNotFoundError, match="no meta.json"):
        TokenStore.open(tmp_path / "plain")


# --------------------------------------------------------------------------- build safety


def test_an_empty_source_raises_empty_data_error_and_writes_nothing(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty_dir").mkdir()
    for i, source in enumerate([[], iter([]), tmp_path / "empty.jsonl", tmp_path / "empty_dir"]):
        out = tmp_path / f"store{i}"
        with pytest.raises(EmptyDataError, match="source has no documents"):
            TokenStore.build(source, tok, out, progress=False)
        assert not out.exists() and leftovers(out) == []


def test_a_crash_mid_build_leaves_nothing_open_trusts_and_a_rebuild_succeeds(tmp_path, tok, docs, monkeypatch):
    out = tmp_path / "store"
    written = []

    def crash_after_first_file(tmp_dir, record):
        written.append(tmp_dir / record["name"])
        raise RuntimeError("simulated crash mid-build")

    monkeypatch.setattr(build_module, "_on_file_written", crash_after_first_file)
    with pytest.raises(RuntimeError, match="simulated crash"):
        TokenStore.build(docs, tok, out, num_proc=1, docs_per_file=7, progress=False)
    assert written and not out.exists() and leftovers(out) == []
    with pytest.raises(StoreNotFoundError):
        TokenStore.open(out)
    monkeypatch.undo()

    def source_failing_midway():  # the source breaks while worker processes are writing files
        yield from docs[:30]
        raise OSError("simulated read error mid-build")

    with pytest.raises(OSError, match="simulated read error"):
        TokenStore.build(source_failing_midway(), tok, out, num_proc=2, docs_per_file=7, progress=False)
    assert not out.exists() and leftovers(out) == []
    store = TokenStore.build(docs, tok, out, num_proc=1, docs_per_file=7, progress=False)
    assert_store_holds(store, expected_tokens(tok, docs))


def _killed_build_child(source: str, tokenizer_dir: str, out_dir: str) -> None:
    import impl.build as st

    def die(tmp_dir, record):
        os._exit(17)  # no cleanup runs: like a SIGKILL or a power cut

    st._on_file_written = die
    TokenStore.build(Path(source), tokenizer_dir, out_dir, num_proc=1, docs_per_file=5, progress=False)


def test_a_killed_builder_leaves_only_an_untrusted_temp_dir_that_the_next_build_removes(tmp_path, tok_dir, tok, docs):
    (source,) = generators.write_jsonl_shards(docs, tmp_path / "src", num_shards=1)
    out = tmp_path / "store"
    proc = multiprocessing.get_context("spawn").Process(
        target=_killed_build_child, args=(str(source), str(tok_dir), str(out)))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 17
    assert not out.exists()
    (temp,) = [out.parent / n for n in leftovers(out)]
    assert (temp / "tokens-00000.arrow").exists() and not (temp / "meta.json").exists()
    for path in (out, temp):
        with pytest.raises(StoreNotFoundError):
            TokenStore.open(path)
    store = TokenStore.build(source, tok_dir, out, num_proc=1, docs_per_file=5, progress=False)
    assert_store_holds(store, expected_tokens(tok, docs))
    assert leftovers(out) == []


def _concurrent_build_child(source: str, tokenizer_dir: str, out_dir: str, result: str) -> None:
    import impl.build as st

    st._on_file_written = lambda tmp_dir, record: time.sleep(0.2)  # widen the race window
    store = TokenStore.build(Path(source), tokenizer_dir, out_dir, num_proc=1, docs_per_file=10,
                             progress=False)
    Path(result).write_text(json.dumps({"fingerprint": store.fingerprint, "build_id": store.meta["build_id"],
                                        "path": str(store.path), "n": len(store)}))


def test_two_concurrent_builders_leave_one_valid_store_and_both_return_it(tmp_path, tok_dir, tok, docs):
    (source,) = generators.write_jsonl_shards(docs, tmp_path / "src", num_shards=1)
    out = tmp_path / "store"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_concurrent_build_child, args=(str(source), str(tok_dir), str(out),
                                                               str(tmp_path / f"result{i}.json")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(2)]
    assert results[0] == results[1]  # same store: same path, fingerprint and build_id (built once)
    assert results[0]["path"] == str(out)
    assert leftovers(out) == []
    store = TokenStore.open(out, verify=True)
    assert store.meta["build_id"] == results[0]["build_id"]
    assert_store_holds(store, expected_tokens(tok, docs))


def test_building_again_returns_the_same_store_and_refuses_a_different_one_unless_overwrite(tmp_path, tok, docs):
    out = tmp_path / "store"
    first = TokenStore.build(docs, tok, out, progress=False)
    again = TokenStore.build(list(docs), tok, out, progress=False)
    assert again.meta["build_id"] == first.meta["build_id"]
    with pytest.raises(StoreError, match="already exists.*overwrite=True"):
        TokenStore.build(docs[:5], tok, out, progress=False)
    with pytest.raises(StoreError, match="cannot be fingerprinted"):
        TokenStore.build(iter(docs), tok, out, progress=False)
    replaced = TokenStore.build(docs[:5], tok, out, overwrite=True, progress=False)
    assert len(replaced) == 5 and replaced.fingerprint != first.fingerprint
    assert len(TokenStore.open(out)) == 5 and leftovers(out) == []


def test_a_non_store_directory_in_the_way_is_refused_even_with_overwrite(tmp_path, tok):
    out = tmp_path / "store"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(StoreError, match="not a loadspec token store.*choose another out_dir"):
            TokenStore.build(["alpha"], tok, out, overwrite=overwrite, progress=False)
    assert (out / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty directory is simply filled
    assert len(TokenStore.build(["alpha"], tok, empty, progress=False)) == 1


def test_meta_json_records_counts_hashes_and_tokenizer_identity(small_store, tok, docs):
    meta = small_store.meta
    assert meta["format"] == "loadspec.tokenstore" and meta["format_version"] == 4
    assert meta["layout"]["block_bytes"] == store_module.BLOCK_BYTES and meta["layout"]["block_checksum"] == "crc32"
    assert meta["layout"]["document_checksum"] == "crc32"
    table, documents = ((small_store.path / name).read_bytes() for name in ("blocks.crc32", "documents.crc32"))
    for key, name, data in (("block_table", "blocks.crc32", table), ("document_table", "documents.crc32", documents)):
        assert meta["layout"][key] == {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    crcs, document_crcs = [], []
    assert meta["num_documents"] == 40
    assert meta["num_empty_documents"] == sum(not d.split() for d in docs) >= 3
    assert meta["options"] == {"text_field": "text", "add_bos": False, "add_eos": True, "batch_size": 1000,
                               "docs_per_file": 7}
    assert meta["tokenizer"]["eos_id"] == 3 and meta["tokenizer"]["vocab_size"] == len(tok)
    assert meta["tokenizer"]["class_name"] == type(tok).__name__
    for record, path in zip(meta["files"], token_files(small_store)):
        assert record["size"] == path.stat().st_size
        assert record["sha256"] == store_module.sha256_file(path)
        assert record["quick_signature"] == store_module.quick_signature(path)
        data = path.read_bytes()  # an independent oracle: zlib over plain slices of the file
        block = store_module.BLOCK_BYTES
        crcs += [zlib.crc32(data[a:a + block]).to_bytes(4, "big") for a in range(0, len(data), block)]
        assert "block_crc32" not in record
        with pa.memory_map(str(path)) as mm:  # uncompressed Arrow IPC *file* with one list column
            column = pa.ipc.open_file(mm).get_batch(0).column(0)
            assert column.type == pa.large_list(pa.uint16()) and len(column) == record["num_documents"]
            document_crcs += [zlib.crc32(column[d].values.to_numpy().astype("<u2").tobytes()).to_bytes(4, "big")
                              for d in range(len(column))]
    assert table == b"".join(crcs)  # the block table: every file's CRCs, file after file
    assert documents == b"".join(document_crcs)  # the document table: every document's CRC, in store order


def test_build_options_are_a_frozen_keyword_only_dataclass_that_validates(tmp_path, tok):
    opts = BuildOptions(docs_per_file=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.docs_per_file = 4  # frozen
    with pytest.raises(TypeError):
        BuildOptions("text")  # keyword-only
    with pytest.raises(ConfigError, match="docs_per_file"):
        TokenStore.build(["alpha"], tok, tmp_path / "s", docs_per_file=0, progress=False)
    with pytest.raises(ConfigError, match="num_proc"):
        TokenStore.build(["alpha"], tok, tmp_path / "s", num_proc=0, progress=False)


# --------------------------------------------------------------------------- _atomic helpers


def test_atomic_writes_replace_the_target_and_leave_no_temp_files(tmp_path):
    target = tmp_path / "plan.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    with pytest.raises(ValueError):
        atomic_write_json(target, {"x": float("nan")})
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_file_lock_excludes_a_second_holder_until_released(tmp_path):
    lock = lock_path_for(tmp_path / "cache")
    assert lock.endswith("cache.lock")
    with file_lock(lock), pytest.raises(TimeoutError, match="could not lock"), file_lock(lock, timeout=0.1):
        pass
    with file_lock(lock, timeout=0.1):
        pass


@pytest.mark.parametrize("name", ["../tokens-00000.arrow", "sub/tokens-00000.arrow", "", ".."])
def test_a_file_name_outside_the_store_directory_is_refused_at_open(tmp_path, small_store, name):
    dst = tmp_path / "store"
    shutil.copytree(small_store.path, dst)
    meta = json.loads((dst / "meta.json").read_text())
    meta["files"][0]["name"] = name
    (dst / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreCorruptError, match="invalid file name in meta.json"):
        TokenStore.open(dst)


def test_a_dropped_store_and_dataset_are_freed_at_once_without_the_garbage_collector(tmp_path):
    """No reference cycle keeps a store (and its file mappings) alive after the last reference is dropped."""
    import gc
    import weakref

    from impl.dataset import PackedDataset

    docs = [[list(range(1 + 10 * f, 8 + 10 * f))] * 3 for f in range(2)]
    TokenStore.from_token_files(docs, tmp_path / "store", vocab_size=100)
    gc.disable()
    try:
        store = TokenStore.open(tmp_path / "store")
        dataset = PackedDataset(store, seq_len=4, shuffle="global", cache_dir=False)
        dataset[0]                                   # maps files and checks blocks
        gone = weakref.ref(store)
        del store, dataset
        assert gone() is None, "the store outlived its last reference (a reference cycle holds it)"
    finally:
        gc.enable()
