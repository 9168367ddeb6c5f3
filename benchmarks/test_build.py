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


TASK_FILES = 8
"""Store files of the task benchmark's build: tasks own whole files, so a build needs several to share out."""

TASK_SCRIPT = ("import sys; from impl.build_tasks import build_task; "
               "build_task(sys.argv[1], sys.argv[2], sys.argv[3], task=int(sys.argv[4]), tasks=int(sys.argv[5]), "
               "docs_per_file=int(sys.argv[6]))")


@pytest.mark.parametrize("tasks", [1, 2])
def test_build_tasks_vs_raw_encode(benchmark, tasks: int, corpus: Corpus, smoke: bool, tmp_path: Path):
    """A multi-task build's tokens/s, ``tasks`` processes at once then the commit, against raw encode in one run.

    The texts of :func:`test_build_vs_raw_encode`, written as two parquet
    files (row groups of 1000), are built by ``tasks`` concurrent Python
    processes, each ``build_task(src, tok, out, task=i, tasks=N,
    docs_per_file=D)`` (what ``loadspec build --task i --tasks N`` runs,
    with ``D`` = documents / :data:`TASK_FILES`, so each task owns whole
    files), then :func:`impl.build_tasks.commit_build` in this process. The
    timed span is from starting the processes to the committed store, so
    process start, tokenizer loading, reading parquet, writing, hashing,
    fsync and the commit all count. Raw: ``encode_batch_fast`` over the
    same texts, batches of 1000, before and after (ratio over their mean
    time, as :func:`test_build_vs_raw_encode`). CPU figures (robust to a
    shared machine's load): the tasks' CPU seconds (``RUSAGE_CHILDREN``)
    plus the commit's, against raw encode's ``process_time``.
    """
    import os
    import resource
    import subprocess
    import sys
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from fixtures.generators import tokenizer_path
    from impl.build_tasks import commit_build

    benchmark.group = "build-tasks-vs-raw"
    files = sorted(corpus.text().glob("*.parquet"))
    limit = SMOKE_DOCS if smoke else 20_000
    texts = pq.read_table(files[0], columns=["text"]).column("text").to_pylist()[:limit]
    src = tmp_path / "src"
    src.mkdir()
    half = len(texts) // 2
    for k, part in enumerate((texts[:half], texts[half:])):
        pq.write_table(pa.table({"text": part}), src / f"part-{k}.parquet", row_group_size=1000)
    docs_per_file = -(-len(texts) // TASK_FILES)
    tok = Tokenizer.from_file(str(tokenizer_path() / "tokenizer.json"))

    def raw() -> tuple[int, float, float]:
        cpu, start = time.process_time(), time.perf_counter()
        n = sum(len(e.ids) for b in range(0, len(texts), 1000)
                for e in tok.encode_batch_fast(texts[b:b + 1000], add_special_tokens=False))
        return n, time.perf_counter() - start, time.process_time() - cpu

    raw_tokens, raw_before_s, raw_before_cpu = raw()
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out: dict = {}

    def setup():
        return (Path(tempfile.mkdtemp(dir=tmp_path)) / "store",), {}

    def target(dest):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, started = time.process_time(), time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", TASK_SCRIPT, str(src), str(tokenizer_path()), str(dest), str(i),
                                   str(tasks), str(docs_per_file)], cwd=root, env=env) for i in range(tasks)]
        codes = [p.wait(timeout=900) for p in procs]
        out["tasks_s"] = time.perf_counter() - started
        assert codes == [0] * tasks, codes
        out["store"] = commit_build(dest)
        out["s"] = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["cpu_s"] = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
                        + time.process_time() - cpu)

    benchmark.pedantic(target, setup=setup, rounds=1, warmup_rounds=0)
    _, raw_after_s, raw_after_cpu = raw()
    store = out["store"]
    assert (store.num_documents, store.num_tokens, len(store.meta["files"])) == (
        len(texts), raw_tokens + len(texts), -(-len(texts) // docs_per_file))
    build_tps = raw_tokens / out["s"]
    raw_tps = raw_tokens / ((raw_before_s + raw_after_s) / 2)
    raw_cpu = (raw_before_cpu + raw_after_cpu) / 2
    benchmark.extra_info.update(kind="build-tasks-vs-raw", tasks=tasks, documents=len(texts),
                                docs_per_file=docs_per_file, raw_tokens=raw_tokens,
                                build_tokens_per_s=round(build_tps), raw_tokens_per_s=round(raw_tps),
                                raw_before_tokens_per_s=round(raw_tokens / raw_before_s),
                                raw_after_tokens_per_s=round(raw_tokens / raw_after_s),
                                tasks_s=round(out["tasks_s"], 3), commit_s=round(out["s"] - out["tasks_s"], 3),
                                build_cpu_s=round(out["cpu_s"], 3), raw_cpu_s=round(raw_cpu, 3),
                                cpu_ratio=round(raw_cpu / out["cpu_s"], 3), ratio=round(build_tps / raw_tps, 3))
    out.clear()
    shutil.rmtree(tmp_path, ignore_errors=True)
