"""(2) Cold build: tokenize + index the text corpus with the fixture tokenizer, 2 processes.

``impl``: ``TokenStore.build(<text parquet dir>, <fixture tokenizer>, out, num_proc=2)``
(reads the parquet, tokenizes, appends EOS, writes the Arrow token files and
``meta.json``). ``hf-map``: ``load_dataset("parquet", ...)`` (untimed, into a
fresh cache) then ``Dataset.map(tokenize + EOS, batched=True, num_proc=2)``
writing a fresh Arrow cache file. Text corpora are capped at 100k documents
(S: 10k), so L runs use M's text. Every round starts from an empty output
directory; the text files are in the page cache (warm input, cold output).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from benchmarks.corpora import EOS_ID, Corpus
from benchmarks.peers import require_datasets
from benchmarks.workloads import BUILDS, Build

SMOKE_DOCS = 1000


def _tokenize_batch(batch, tokenizer):
    ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
    return {"input_ids": [x + [EOS_ID] for x in ids]}


@pytest.mark.parametrize("w", BUILDS, ids=str)
def test_build(benchmark, w: Build, corpus: Corpus, smoke: bool, tmp_path: Path):
    from fixtures.generators import tokenizer_path

    benchmark.group = "build"
    text = corpus.text()
    files = sorted(str(p) for p in text.glob("*.parquet"))
    out: dict = {}
    rounds = 1
    limit = SMOKE_DOCS if smoke else None  # make test: a small slice, so the smoke run stays short

    if w.loader == "impl":
        from impl.store import TokenStore

        source = text
        if limit is not None:
            import pyarrow.parquet as pq

            source = pq.read_table(files[0], columns=["text"]).column("text").to_pylist()[:limit]

        def setup():
            d = Path(tempfile.mkdtemp(dir=tmp_path))
            return (d / "store",), {}

        def target(dest):
            out["store"] = TokenStore.build(source, str(tokenizer_path()), dest, num_proc=w.num_proc, progress=False)

        def tokens():
            return out["store"].num_tokens
    elif w.loader == "hf-map":
        datasets = require_datasets()
        from fixtures.generators import load_tokenizer

        datasets.disable_progress_bars()
        tok = load_tokenizer()

        def setup():
            d = Path(tempfile.mkdtemp(dir=tmp_path))
            ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(d / "cache"))
            if limit is not None:
                ds = ds.select(range(limit))
            return (ds, d), {}

        def target(ds, d):
            out["ds"] = ds.map(_tokenize_batch, batched=True, num_proc=w.num_proc, fn_kwargs={"tokenizer": tok},
                               remove_columns=ds.column_names, load_from_cache_file=False,
                               cache_file_name=str(d / "tokenized.arrow"))

        def tokens():
            import pyarrow.compute as pc

            col = out["ds"].data.column("input_ids")
            return int(pc.sum(pc.list_value_length(col)).as_py())
    else:
        raise AssertionError(w)

    benchmark.extra_info.update(kind="build", loader=w.loader, num_proc=w.num_proc, size=corpus.size,
                                documents=limit or min(corpus.num_docs, 100_000))
    benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=0)
    benchmark.extra_info.update(tokens=tokens())
    out.clear()
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_build_vs_raw_encode(benchmark, num_proc: int, corpus: Corpus, smoke: bool, tmp_path: Path):
    """Build tokens/s against the raw ``tokenizers`` rate on the same texts, in one run (``ratio`` in extra_info).

    Raw: ``Tokenizer.encode_batch_fast`` (its own thread pool, all cores) over
    the same documents in the build's batches of 1000, ``add_special_tokens=False``,
    timed just before and just after the build; the ratio is over the mean of
    the two times, so a load that changes during the run moves both sides.
    The build's tokens include one EOS per document, the raw count does not:
    the ratio compares documents/s-weighted token rates on equal text.
    """
    import time

    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from fixtures.generators import tokenizer_path
    from impl.store import TokenStore

    benchmark.group = "build-vs-raw"
    files = sorted(corpus.text().glob("*.parquet"))
    limit = SMOKE_DOCS if smoke else 20_000
    texts = pq.read_table(files[0], columns=["text"]).column("text").to_pylist()[:limit]
    tok = Tokenizer.from_file(str(tokenizer_path() / "tokenizer.json"))

    def raw() -> tuple[int, float]:
        start = time.perf_counter()
        n = sum(len(e.ids) for b in range(0, len(texts), 1000)
                for e in tok.encode_batch_fast(texts[b:b + 1000], add_special_tokens=False))
        return n, time.perf_counter() - start

    raw_tokens, raw_before_s = raw()
    out: dict = {}

    def setup():
        return (Path(tempfile.mkdtemp(dir=tmp_path)) / "store",), {}

    def target(dest):
        started = time.perf_counter()
        out["store"] = TokenStore.build(texts, str(tokenizer_path()), dest, num_proc=num_proc, progress=False)
        out["s"] = time.perf_counter() - started

    benchmark.pedantic(target, setup=setup, rounds=1, warmup_rounds=0)
    _, raw_after_s = raw()
    build_tps = (out["store"].num_tokens - len(texts)) / out["s"]
    raw_tps = raw_tokens / ((raw_before_s + raw_after_s) / 2)
    benchmark.extra_info.update(kind="build-vs-raw", num_proc=num_proc, documents=len(texts), raw_tokens=raw_tokens,
                                build_tokens_per_s=round(build_tps), raw_tokens_per_s=round(raw_tps),
                                raw_before_tokens_per_s=round(raw_tokens / raw_before_s),
                                raw_after_tokens_per_s=round(raw_tokens / raw_after_s),
                                ratio=round(build_tps / raw_tps, 3))
    out.clear()
    shutil.rmtree(tmp_path, ignore_errors=True)
