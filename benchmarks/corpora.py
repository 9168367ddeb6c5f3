"""Benchmark corpora: generated once per machine into a cache directory, never timed.

One corpus per size, the same documents in every format:

* ``lengths``: a realistic document-length distribution, log-normal with a
  median of 400 tokens (``sigma = 1``, mean ~660), clipped to ``[2, 20000]``
  (the tail reaches 20k tokens). Every document ends with the GPT-2 EOS id.
* tokens: slices of the tokenized KJV fixture at random offsets (real token
  statistics, no tokenizer in the loop), so a 1M-document corpus is generated
  in seconds.
* text (for the cold-build benchmark only, at most ``TEXT_DOCS_MAX``
  documents): runs of KJV words whose length in words follows the same
  distribution (KJV averages ~1.26 GPT-2 tokens per word).

Formats (each built into a temporary sibling and renamed into place, under a
lock, so concurrent runs never see half a corpus):

=================  =======================================================
``store``          impl TokenStore (``TokenStore.from_token_files``)
``parquet``        pre-tokenized parquet shards, ``input_ids: list<uint16>``
``hf_disk``        HF ``save_to_disk`` of the same rows (per datasets version)
``hf_cache``       HF ``load_dataset("parquet")`` cache (per datasets version)
``mds``            MosaicML MDS shards (``ndarray:uint16``, no compression)
``litdata``        LitData ``optimize()`` chunks (one numpy array per document)
``text``           text parquet shards (``text``, ``id``) for the build benchmark
=================  =======================================================

Deterministic: ``numpy.random.Generator(PCG64(seed))`` (benchmarks are not
semantics, so numpy is fine here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

CORPUS_VERSION = "v1"
SEED = 20240611
MEDIAN_TOKENS = 400
SIGMA = 1.0
MIN_TOKENS = 2
MAX_TOKENS = 20_000
EOS_ID = 50256
VOCAB_SIZE = 50257
DOCS_PER_SHARD = 65_536          # the store's DEFAULT_DOCS_PER_FILE: one shard = one store file
TEXT_DOCS_MAX = 100_000          # text corpora are capped: build throughput does not need 1M texts
TOKENS_PER_WORD = 1.26           # GPT-2 tokens per whitespace word of the KJV fixture

SIZES = {"S": 10_000, "M": 100_000, "L": 1_000_000}


def cache_root() -> Path:
    """``$LOADSPEC_BENCH_CACHE`` or ``~/.cache/loadspec-bench``."""
    env = os.environ.get("LOADSPEC_BENCH_CACHE")
    base = Path(env) if env else Path(os.path.expanduser("~")) / ".cache" / "loadspec-bench"
    return base / CORPUS_VERSION


def store_dir_name() -> str:
    """Cache directory of the impl store: ``store`` for format 1, ``store-v<N>-b<block KiB>k-buffers`` after.

    Why the block size and ``buffers`` in the name: a format-2 store built
    before the records carried their buffer layout (or with other blocks)
    still opens, but is not what this checkout measures.
    """
    from impl.store_format import BLOCK_BYTES, FORMAT_VERSION

    return "store" if FORMAT_VERSION == 1 else f"store-v{FORMAT_VERSION}-b{BLOCK_BYTES // 1024}k-buffers"


def size_from_env() -> str:
    size = os.environ.get("LOADSPEC_BENCH_SIZE", "S").upper()
    if size not in SIZES:
        raise ValueError(f"LOADSPEC_BENCH_SIZE={size!r}: choose one of {', '.join(SIZES)}")
    return size


def sizes_up_to(size: str) -> list[str]:
    order = list(SIZES)
    return order[: order.index(size) + 1]


# --------------------------------------------------------------------------- locking / atomic dirs


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_dir(path: Path, make: Callable[[Path], None]) -> Path:
    """``path`` if complete, else ``make(tmp)`` into a sibling temporary directory renamed to ``path``."""
    done = path / ".complete"
    if done.exists():
        return path
    with _locked(path):
        if done.exists():
            return path
        if path.exists():
            shutil.rmtree(path)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        t0 = time.perf_counter()
        try:
            make(tmp)
            (tmp / ".complete").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 2)}))
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return path


# --------------------------------------------------------------------------- the corpus


def kjv_tokens() -> np.ndarray:
    """The KJV fixture tokenized once with the fixture tokenizer (uint16), cached."""
    root = cache_root()

    def make(tmp: Path) -> None:
        from fixtures.generators import load_corpus, load_tokenizer

        tok = load_tokenizer()
        ids = tok(load_corpus(), add_special_tokens=False)["input_ids"]
        np.save(tmp / "tokens.npy", np.concatenate([np.asarray(x, dtype=np.uint16) for x in ids]))

    return np.load(ensure_dir(root / "kjv-tokens", make) / "tokens.npy")


def make_lengths(n: int, seed: int = SEED) -> np.ndarray:
    """``n`` document lengths (int64): log-normal, median 400, clipped to [2, 20000]."""
    rng = np.random.Generator(np.random.PCG64(seed))
    raw = rng.lognormal(mean=np.log(MEDIAN_TOKENS), sigma=SIGMA, size=n)
    return np.clip(np.rint(raw), MIN_TOKENS, MAX_TOKENS).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One size's corpus: where each format lives (built on first use)."""

    size: str

    @property
    def num_docs(self) -> int:
        return SIZES[self.size]

    @property
    def root(self) -> Path:
        return cache_root() / self.size

    @property
    def lengths(self) -> np.ndarray:
        return make_lengths(self.num_docs)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    # ---- token generation, one shard (= one store file) at a time
    def shard_bounds(self) -> list[tuple[int, int]]:
        n = self.num_docs
        return [(s, min(s + DOCS_PER_SHARD, n)) for s in range(0, n, DOCS_PER_SHARD)]

    def shard_tokens(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """``(values uint16, offsets int64)`` of shard ``shard``: deterministic per shard."""
        start, stop = self.shard_bounds()[shard]
        lens = self.lengths[start:stop]
        src = kjv_tokens()
        rng = np.random.Generator(np.random.PCG64([SEED, shard]))
        begins = rng.integers(0, len(src) - MAX_TOKENS, size=len(lens))
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        pos = np.arange(offsets[-1], dtype=np.int64) + np.repeat(begins - offsets[:-1], lens)
        values = src[pos]
        values[offsets[1:] - 1] = EOS_ID
        return values, offsets

    def iter_shards(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for shard in range(len(self.shard_bounds())):
            values, offsets = self.shard_tokens(shard)
            yield shard, values, offsets

    # ---- formats
    def store(self) -> Path:
        """The corpus as a TokenStore of this loadspec's format (one directory per format version).

        Why per version: a store of another format is refused (newer) or
        lacks what this version checks (older), and other checkouts may share
        the cache; format 1 keeps the historical ``store`` directory.
        """

        def make(tmp: Path) -> None:
            from impl.store import TokenStore

            files = []
            for _, values, offsets in self.iter_shards():
                mv = memoryview(values)   # iterating a memoryview yields ints ~2x faster than numpy scalars
                files.append([mv[offsets[j]:offsets[j + 1]] for j in range(len(offsets) - 1)])
            writer = getattr(TokenStore, "from_documents", None) or TokenStore.from_token_files
            writer(files, tmp / "store", vocab_size=VOCAB_SIZE, eos_id=EOS_ID)

        return ensure_dir(self.root / store_dir_name(), make) / "store"

    def parquet(self) -> Path:
        """Pre-tokenized parquet shards (``input_ids: list<uint16>``, ``id: int64``)."""
        def make(tmp: Path) -> None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            nshards = len(self.shard_bounds())
            for shard, values, offsets in self.iter_shards():
                start = self.shard_bounds()[shard][0]
                col = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
                ids = pa.array(np.arange(start, start + len(offsets) - 1, dtype=np.int64))
                pq.write_table(pa.table({"input_ids": col, "id": ids}),
                               tmp / f"shard-{shard:05d}-of-{nshards:05d}.parquet", row_group_size=4096)

        return ensure_dir(self.root / "parquet", make)

    def parquet_files(self) -> list[str]:
        return sorted(str(p) for p in self.parquet().glob("*.parquet"))

    def hf_cache_dir(self) -> Path:
        import datasets

        return self.root / f"hf-cache-{datasets.__version__}"

    def hf_load_dataset(self):
        """``load_dataset("parquet", ...)`` on the pre-tokenized shards; the first call fills the cache."""
        import datasets

        files = self.parquet_files()
        cache = self.hf_cache_dir()
        with _locked(cache):
            return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(cache))

    def hf_disk(self) -> Path:
        import datasets

        def make(tmp: Path) -> None:
            self.hf_load_dataset().save_to_disk(str(tmp / "ds"), max_shard_size="256MB")

        return ensure_dir(self.root / f"hf-disk-{datasets.__version__}", make) / "ds"

    def mds(self) -> Path:
        def make(tmp: Path) -> None:
            from benchmarks.peers import import_streaming

            streaming = import_streaming()
            with streaming.MDSWriter(out=str(tmp / "mds"), columns={"input_ids": "ndarray:uint16"},
                                     compression=None, hashes=[], size_limit="64mb", progress_bar=False) as out:
                for _, values, offsets in self.iter_shards():
                    for j in range(len(offsets) - 1):
                        out.write({"input_ids": values[offsets[j]:offsets[j + 1]]})

        return ensure_dir(self.root / "mds", make) / "mds"

    def litdata(self) -> Path:
        def make(tmp: Path) -> None:
            import litdata

            # One input per store shard; each worker regenerates its shard deterministically.
            litdata.optimize(fn=_litdata_shard, inputs=[(self.size, s) for s in range(len(self.shard_bounds()))],
                             output_dir=str(tmp / "litdata"), chunk_bytes="64MB", num_workers=1,
                             mode="overwrite", start_method="fork")

        return ensure_dir(self.root / "litdata", make) / "litdata"

    def text(self) -> Path:
        """Text parquet shards (``text``, ``id``) of at most ``TEXT_DOCS_MAX`` documents."""
        def make(tmp: Path) -> None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            texts = make_texts(min(self.num_docs, TEXT_DOCS_MAX))
            n = len(texts)
            bounds = [(s, min(s + DOCS_PER_SHARD, n)) for s in range(0, n, DOCS_PER_SHARD)]
            for k, (a, b) in enumerate(bounds):
                pq.write_table(pa.table({"text": texts[a:b], "id": np.arange(a, b, dtype=np.int64)}),
                               tmp / f"shard-{k:05d}-of-{len(bounds):05d}.parquet", row_group_size=4096)

        key = "S" if self.num_docs <= SIZES["S"] else "M"
        return ensure_dir(cache_root() / key / "text", make)


def _litdata_shard(item):
    size, shard = item
    values, offsets = Corpus(size).shard_tokens(shard)
    for j in range(len(offsets) - 1):
        yield np.array(values[offsets[j]:offsets[j + 1]])


def make_texts(n: int, seed: int = SEED) -> list[str]:
    """``n`` texts of KJV words; word counts follow the token-length distribution / ``TOKENS_PER_WORD``."""
    from fixtures.generators import load_corpus

    words = " ".join(load_corpus()).split()
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    counts = np.maximum(1, np.rint(make_lengths(n, seed) / TOKENS_PER_WORD)).astype(np.int64)
    begins = rng.integers(0, len(words) - int(counts.max()) - 1, size=n)
    return [" ".join(words[b:b + c]) for b, c in zip(begins.tolist(), counts.tolist())]


def describe() -> dict[str, object]:
    return {"median_tokens": MEDIAN_TOKENS, "sigma": SIGMA, "clip": [MIN_TOKENS, MAX_TOKENS], "seed": SEED,
            "version": CORPUS_VERSION}


FORMATS = ("store", "parquet", "hf_disk", "mds", "litdata", "text")


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.corpora --size M [--formats store,parquet]``: generate ahead of a run."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--size", default=None, help="S | M | L (default: $LOADSPEC_BENCH_SIZE or S)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    args = ap.parse_args(argv)
    corpus = Corpus((args.size or size_from_env()).upper())
    print(f"cache: {cache_root()}  size {corpus.size}: {corpus.num_docs} documents, {corpus.num_tokens} tokens")
    for fmt in args.formats.split(","):
        t0 = time.perf_counter()
        try:
            path = getattr(corpus, fmt)()
        except ImportError as exc:
            print(f"  {fmt}: skipped ({exc})")
            continue
        print(f"  {fmt}: {path} ({time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
