"""(8) Streaming from raw jsonl: tokens/s tokenized on the fly, and resume at 90 %, against HF and a KempnerForge loop.

Files: ``make_texts`` (KJV words, the corpus's length distribution) written
as 4 jsonl files (S: 400 documents; otherwise 10,000), page cache warm.
Tokenizer: the fixture GPT-2 (``tokenizers``, ``encode_batch_fast``).

Throughput (group ``stream``), one epoch, tokens = non-padding positions
handed out (EOS included); building the loader object is untimed (impl's
first build in a process imports ``transformers`` to resolve the tokenizer:
seconds, once), the timer covers iterating (worker start included):

* ``impl-0w`` / ``impl-2w``: ``build_dataloader(StreamingDataset(files,
  seq_len=2048, num_lanes=2), batch_size=8, num_workers=0 | 2)``. ``ratio`` in
  ``extra_info`` is its rate over the raw rate measured in the same run:
  ``Tokenizer.encode_batch_fast`` over the same texts in batches of 1000
  (the encoder's own thread pool; target >= 0.8). The epoch's first batch
  carries fixed costs (worker start, each process building its tokenizer,
  the first units read and encoded before a sample exists): ``first_batch_s``
  is its latency, and ``steady_tokens_per_s`` / ``steady_ratio`` count only
  the tokens after it over the time after it (the rate a long epoch runs at).
* ``hf-map``: ``load_dataset("json", streaming=True).map(tokenize + EOS,
  batched=True)`` (batches of 1000, ``encode_batch_fast``), unpacked.
* ``kempner``: KempnerForge's loop: stream the jsonl, tokenize each document
  (``encode``), keep ``doc_idx % world == rank`` (world 1), pack into 2048.

A batched map and a stream+store mixture (group ``stream-map``), one epoch
of the same files, ``seq_len=2048``, ``num_lanes=2``, batches of 8, no
workers, tokens counted as above; ``ratio`` in ``extra_info`` is the rate
over ``plain``'s measured in the same run:

* ``plain``: the stream as ``impl-0w``;
* ``blocks``: ``plain.map(BlockTokenize(2048), batched=True,
  batch_size=1000)`` with ``add_eos=False`` (Forgather's block tokenizer:
  the batch's texts tokenized, each ended by EOS, joined, cut into blocks of
  2048, STREAM-20);
* ``mix``: ``MixedDataset([plain, PackedDataset(TokenStore.build(files))],
  weights=(1, 1), stopping="all_exhausted")`` (MIX-22), the store built from
  the same files (untimed).

Each is checked against the tokenizer run outside the loader: lane l's
samples, in ``sample_index`` order, hold the tokens of its rows (its blocks,
for ``blocks``) in order, each at its offset in its row (block), and the mixture's store samples are the store's,
each once.

Resume at 90 % (group ``stream-resume``): the time from a fresh loader
object to the first batch after the position (construction untimed), with
the first item checked against an uninterrupted pass: impl
``load_state_dict`` (at most one unit per lane re-read, STREAM-15), HF
``IterableDataset.load_state_dict`` and ``.skip(n)``, and KempnerForge's
fast-forward (read and tokenize document by document to ``n``).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import numpy as np
import pytest

from benchmarks.corpora import EOS_ID, Corpus, make_texts
from benchmarks.peers import require_datasets

SEQ_LEN = 2048
BATCH = 8
ENCODE_BATCH = 1000
FILES = 4


@pytest.fixture(scope="module")
def jsonl(corpus: Corpus, smoke: bool, tmp_path_factory) -> dict[str, Any]:
    texts = make_texts(400 if corpus.size == "S" else 10_000)
    root = tmp_path_factory.mktemp("stream-bench")
    per = -(-len(texts) // FILES)
    files = []
    for i in range(FILES):
        path = root / f"part{i}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[i * per:(i + 1) * per]))
        files.append(str(path))
    return {"texts": texts, "files": files, "index": str(root / "index")}


def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    from fixtures.generators import tokenizer_path

    return Tokenizer.from_file(str(tokenizer_path() / "tokenizer.json"))


@functools.cache
def _shared_tokenizer() -> Any:
    """One tokenizer per process for :class:`BlockTokenize` (a map is called once per input batch)."""
    return _tokenizer()


class BlockTokenize:
    """Forgather's block tokenizer as a batched map: texts tokenized, each ended by EOS, joined, cut into blocks.

    A module-level class, so it pickles for DataLoader workers; the tail
    shorter than a block is dropped, as Forgather drops it.
    """

    def __init__(self, block: int) -> None:
        self.block = block

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        encoded = _shared_tokenizer().encode_batch_fast(batch["text"], add_special_tokens=False)
        ids = [t for e in encoded for t in (*e.ids, EOS_ID)]
        n = self.block
        return {"input_ids": [ids[i:i + n] for i in range(0, len(ids) - n + 1, n)]}


@pytest.fixture(scope="module")
def raw_rate(jsonl: dict[str, Any]) -> float:
    """Raw ``encode_batch_fast`` tokens/s over the same texts (EOS counted per document, as the loaders do)."""
    tok, texts = _tokenizer(), jsonl["texts"]
    tok.encode_batch_fast(texts[:ENCODE_BATCH], add_special_tokens=False)      # thread pool warm
    start = time.perf_counter()
    tokens = sum(len(e.ids) + 1 for b in range(0, len(texts), ENCODE_BATCH)
                 for e in tok.encode_batch_fast(texts[b:b + ENCODE_BATCH], add_special_tokens=False))
    return tokens / (time.perf_counter() - start)


def _impl(jsonl: dict[str, Any], num_workers: int) -> Any:
    from fixtures.generators import tokenizer_path
    from impl.loader import build_dataloader
    from impl.streaming import StreamingDataset

    ds = StreamingDataset(jsonl["files"], tokenizer=tokenizer_path(), seq_len=SEQ_LEN, num_lanes=2,
                          index_dir=jsonl["index"])
    return build_dataloader(ds, batch_size=BATCH, num_workers=num_workers)


def _hf(jsonl: dict[str, Any]) -> Any:
    datasets = require_datasets()
    tok = _tokenizer()

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        return {"input_ids": [e.ids + [EOS_ID] for e in tok.encode_batch_fast(batch["text"],
                                                                              add_special_tokens=False)]}

    ds = datasets.load_dataset("json", data_files=jsonl["files"], split="train", streaming=True)
    return ds.map(tokenize, batched=True, batch_size=ENCODE_BATCH, remove_columns=["text"])


def _kempner(files: list[str], world: int = 1, rank: int = 0) -> Any:
    """KempnerForge's ``StreamingHuggingFaceDataset`` loop: every rank decodes everything, keeps its documents."""
    tok = _tokenizer()
    buf: list[int] = []
    doc_idx = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids + [EOS_ID]
                keep = doc_idx % world == rank
                doc_idx += 1
                if keep:
                    buf.extend(ids)
                    while len(buf) >= SEQ_LEN:
                        yield buf[:SEQ_LEN]
                        buf = buf[SEQ_LEN:]


@pytest.mark.parametrize("loader", ["impl-0w", "impl-2w", "hf-map", "kempner"])
def test_stream_throughput(benchmark, loader: str, jsonl: dict[str, Any], raw_rate: float, corpus: Corpus):
    benchmark.group = "stream"
    out: dict[str, float] = {}
    if loader == "hf-map":
        require_datasets()

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        if loader.startswith("impl"):
            return (_impl(jsonl, 2 if loader == "impl-2w" else 0),), {}
        return (_hf(jsonl) if loader == "hf-map" else _kempner(jsonl["files"]),), {}

    def target(source: Any) -> None:
        start, tokens = time.perf_counter(), 0
        if loader.startswith("impl"):
            for batch in source:
                tokens += int((batch["doc_ids"] >= 0).sum())
                if "first" not in out:
                    out["first"], out["first_tokens"] = time.perf_counter() - start, tokens
        elif loader == "hf-map":
            for row in source:
                tokens += len(row["input_ids"])
        else:
            for sample in source:
                tokens += len(sample)
        out["tokens"], out["s"] = tokens, time.perf_counter() - start

    benchmark.pedantic(target, setup=setup, rounds=1, warmup_rounds=0)
    assert out["tokens"] > 0.5 * sum(len(t.split()) for t in jsonl["texts"]), f"{loader} handed out too few tokens"
    rate = out["tokens"] / out["s"]
    benchmark.extra_info.update(kind="stream", loader=loader, size=corpus.size, documents=len(jsonl["texts"]),
                                tokens=out["tokens"], tokens_per_s=round(rate), raw_tokens_per_s=round(raw_rate),
                                ratio=round(rate / raw_rate, 3))
    if "first" in out and out["s"] > out["first"]:
        steady = (out["tokens"] - out["first_tokens"]) / (out["s"] - out["first"])
        benchmark.extra_info.update(first_batch_s=round(out["first"], 3), steady_tokens_per_s=round(steady),
                                    steady_ratio=round(steady / raw_rate, 3))


@pytest.mark.parametrize("loader", ["impl", "hf-state", "hf-skip", "kempner"])
def test_stream_resume_at_90_percent(benchmark, loader: str, jsonl: dict[str, Any], corpus: Corpus):
    benchmark.group = "stream-resume"
    held: dict[str, Any] = {}
    if loader == "impl":
        whole = [b["doc_ids"][0].tolist() for b in _impl(jsonl, 0)]
        n = int(0.9 * len(whole))
        first = _impl(jsonl, 0)
        it = iter(first)
        for _ in range(n):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        expected: Any = whole[n]

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (_impl(jsonl, 0),), {}

        def target(fresh: Any) -> None:
            fresh.load_state_dict(state)
            held["first"] = next(iter(fresh))["doc_ids"][0].tolist()
    else:
        n = int(0.9 * len(jsonl["texts"]))
        if loader == "kempner":
            def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
                return (), {}

            def target() -> None:     # fast-forward: decode and tokenize n documents, then the next one
                tok, seen = _tokenizer(), 0
                for path in jsonl["files"]:
                    with open(path, encoding="utf-8") as f:
                        for line in f:
                            ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
                            if seen == n:
                                held["first"] = ids
                                return
                            seen += 1
            expected = _tokenizer().encode(jsonl["texts"][n], add_special_tokens=False).ids
        else:
            expected = _tokenizer().encode(jsonl["texts"][n], add_special_tokens=False).ids + [EOS_ID]
            if loader == "hf-state":
                base = _hf(jsonl)
                hf_state = None
                for i, _ in enumerate(base):
                    if i + 1 == n:
                        hf_state = base.state_dict()
                        break

            def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
                return (_hf(jsonl),), {}

            def target(fresh: Any) -> None:
                if loader == "hf-state":
                    fresh.load_state_dict(hf_state)
                    held["first"] = next(iter(fresh))["input_ids"]
                else:
                    held["first"] = next(iter(fresh.skip(n)))["input_ids"]

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        target(*args)
        held["s"] = time.perf_counter() - start

    benchmark.pedantic(timed, setup=setup, rounds=1, warmup_rounds=0)
    assert held["first"] == expected, f"{loader} resumed at 90 % but handed out another item"
    benchmark.extra_info.update(kind="stream-resume", loader=loader, size=corpus.size, position=0.9,
                                seconds=round(held["s"], 4))


# --------------------------------------------------------------------------- a batched map, and a stream+store mixture


@pytest.fixture(scope="module")
def jsonl_store(jsonl: dict[str, Any], tmp_path_factory) -> str:
    """The same files as a TokenStore (EOS ended documents, as the stream's), built once, untimed."""
    from pathlib import Path

    from fixtures.generators import tokenizer_path
    from impl.store import TokenStore

    out = tmp_path_factory.mktemp("stream-bench-store") / "store"
    TokenStore.build([Path(f) for f in jsonl["files"]], tokenizer_path(), out, num_proc=1, progress=False)
    return str(out)


def _map_source(kind: str, jsonl: dict[str, Any], store: str) -> Any:
    """The loader of ``kind`` (``plain``, ``blocks``, ``mix``) and the StreamingDataset whose lanes it reads."""
    from fixtures.generators import tokenizer_path
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.mixed_dataset import MixedDataset
    from impl.streaming import StreamingDataset

    stream = StreamingDataset(jsonl["files"], tokenizer=tokenizer_path(), seq_len=SEQ_LEN, num_lanes=2,
                              index_dir=jsonl["index"], add_eos=kind != "blocks")
    ds: Any = stream
    if kind == "blocks":
        ds = stream.map(BlockTokenize(SEQ_LEN), batched=True, batch_size=ENCODE_BATCH, name=f"blocks-{SEQ_LEN}-v1")
    elif kind == "mix":
        ds = MixedDataset([stream, PackedDataset(store, seq_len=SEQ_LEN, packing="concat")], weights=(1.0, 1.0),
                          stopping="all_exhausted", seed=3)
    return build_dataloader(ds, batch_size=BATCH, num_workers=0), stream


def _lane_tokens(kind: str, stream: Any, texts: list[str]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each lane's tokens computed outside the loader, its rows' ids + EOS or their blocks (STREAM-7, 20), and each
    token's offset in its document (its row, or its block).

    A lane's rows are ``lane_rows(stream.windows(0, lane))`` (no shuffle);
    a row's global number is its text's position, the files being written
    in order.
    """
    from impl.stream_lanes import lane_rows

    tok, out = _shared_tokenizer(), {}
    for lane in range(stream.config.num_lanes):
        rows = [texts[g] for g in lane_rows(stream.windows(0, lane)).tolist()]
        if kind == "blocks":
            blocks = BlockTokenize(SEQ_LEN)
            docs = [block for b in range(0, len(rows), ENCODE_BATCH)
                    for block in blocks({"text": rows[b:b + ENCODE_BATCH]})["input_ids"]]
        else:
            docs = [[*e.ids, EOS_ID] for e in tok.encode_batch_fast(rows, add_special_tokens=False)]
        out[lane] = (np.array([t for d in docs for t in d], dtype=np.int64),
                     np.concatenate([np.arange(len(d)) for d in docs]) if docs else np.empty(0, np.int64))
    return out


def _check_map_output(kind: str, held: list[dict[str, Any]], stream: Any, texts: list[str], store: str) -> None:
    """The samples hold the tokens computed outside the loader (see the module docstring), each sample once."""
    from impl.dataset import PackedDataset

    cat = {k: np.concatenate([b[k].numpy() for b in held]) for k in held[0]}
    streamed = cat["source"] == 0 if kind == "mix" else np.ones(len(cat["lane"]), bool)
    for lane, (expected, offsets) in _lane_tokens(kind, stream, texts).items():
        mine = streamed & (cat["lane"] == lane)
        index = cat["source_index" if kind == "mix" else "sample_index"][mine]
        order = np.argsort(index)
        assert np.array_equal(index[order], np.arange(len(index))), f"{kind}: lane {lane}'s samples are not 0, 1, ..."
        got = cat["input_ids"][mine][order].reshape(-1)
        assert len(got) >= len(expected) - (SEQ_LEN + 1) * (BATCH + 1), f"{kind}: lane {lane} lost samples"
        assert np.array_equal(got, expected[:len(got)]), f"{kind}: lane {lane}'s tokens differ from its rows'"
        at = cat["token_offsets"][mine][order].reshape(-1)
        assert np.array_equal(at, offsets[:len(at)]), f"{kind}: lane {lane}'s token offsets differ from its documents'"
    if kind == "mix":
        ds = PackedDataset(store, seq_len=SEQ_LEN, packing="concat")
        taken = cat["source_index"][~streamed]
        assert len(set(taken.tolist())) == len(taken) >= ds.num_samples(0) - BATCH, "mix: a store sample twice or lost"
        for j in np.flatnonzero(~streamed):
            assert np.array_equal(cat["input_ids"][j], ds.sample(0, int(cat["source_index"][j]))["input_ids"]), \
                f"mix: store sample {int(cat['source_index'][j])} differs from the store's"


@pytest.mark.parametrize("kind", ["plain", "blocks", "mix"])
def test_stream_map_and_mixture_throughput(benchmark, kind: str, jsonl: dict[str, Any], jsonl_store: str,
                                           corpus: Corpus):
    benchmark.group = "stream-map"
    out: dict[str, Any] = {}
    fields = ("lane", "sample_index", "input_ids", "token_offsets") + (("source", "source_index") if kind == "mix" else ())

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        loader, out["stream"] = _map_source(kind, jsonl, jsonl_store)
        return (loader,), {}

    def target(loader: Any) -> None:
        start, tokens, held = time.perf_counter(), 0, []
        for batch in loader:
            tokens += int((batch["doc_ids"] >= 0).sum())
            held.append({k: batch[k] for k in fields})
        out["tokens"], out["s"], out["held"] = tokens, time.perf_counter() - start, held

    benchmark.pedantic(target, setup=setup, rounds=1, warmup_rounds=0)
    _check_map_output(kind, out["held"], out["stream"], jsonl["texts"], jsonl_store)
    rate = out["tokens"] / out["s"]
    _MAP_RATES[kind] = rate
    benchmark.extra_info.update(kind="stream-map", loader=kind, size=corpus.size, documents=len(jsonl["texts"]),
                                tokens=out["tokens"], tokens_per_s=round(rate),
                                ratio=round(rate / _MAP_RATES["plain"], 3) if "plain" in _MAP_RATES else None)


_MAP_RATES: dict[str, float] = {}
"""tokens/s of each ``stream-map`` loader in this run (``plain`` runs first: the others' ``ratio`` is over it)."""
