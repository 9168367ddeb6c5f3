"""Remote reads: a cold first epoch and a resume at 90 % from an S3 server on 127.0.0.1, under a bounded cache.

What it measures (moto's S3 server, started here; the store uploaded once):
tokens/s of a sequential epoch (``kind="window", window=1``: files in a
shuffled order, each read through) with a cold node cache whose
``cache_limit`` is a third of the store, the bytes downloaded in that epoch
(a sequential reader should download each byte once even with eviction),
and a resume at 90 % with a cold cache: seconds from open to its first
sample, and the bytes it downloads to finish the epoch. Two first epochs:
*fresh* (no plan cached: building it reads every file's document offsets,
by ranged reads of the blocks holding them) and *cold* (the plan cached on
disk, as a restarted job finds it: only the epoch's own reads). The dataset
predownloads (its default, 8 samples ahead of a reader without a loader);
the cold epoch again with ``predownload=0`` shows what that changes.

Run: ``.venv/bin/python -m pytest benchmarks/test_remote.py -q -s -p no:cacheprovider`` (the main venv: it has
the ``test`` extra's moto and s3fs). MosaicML Streaming and LitData from the same server, through one byte-counting
proxy: ``benchmarks/test_remote_peers.py`` (the bench venv).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None,
    reason="moto and s3fs (pip install 'loadspec[test,s3]') are needed to start the S3 server and read from it")

BUCKET = "bench"
FILES, DOCS, SEQ_LEN = 24, 200, 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conformance.impl_tests.remote_servers import S3Server
    from impl.store import TokenStore

    rng = np.random.default_rng(0)
    built = tmp_path_factory.mktemp("remote-bench") / "store"
    TokenStore.from_token_files([[rng.integers(0, 50_000, size=int(rng.integers(100, 900))).tolist()
                                  for _ in range(DOCS)] for _ in range(FILES)], built, vocab_size=50_000)
    with S3Server() as s3:
        s3.upload_dir(built, BUCKET, "store")
        yield s3, built


def _dataset(s3, cache: Path, limit: int, predownload: int | None = None):
    from conformance.impl_tests.remote_servers import s3_options
    from impl.dataset import PackedDataset
    from impl.store import TokenStore
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig
    from reference.resume import PipelineConfig

    store = TokenStore.open(f"s3://{BUCKET}/store", local=cache, cache_limit=limit,
                            storage_options=s3_options(s3.url))
    config = PipelineConfig(packing=PackingConfig(seq_len=SEQ_LEN, mode="concat", pad_id=0),
                            ordering=OrderingConfig(kind="window", window=1, seed=3))
    return store, PackedDataset.from_config(store, config, cache_dir=cache.parent / "plans", predownload=predownload)


def _epoch(s3, cache: Path, limit: int, predownload: int | None = None) -> tuple[float, int, int]:
    """(seconds, tokens, bytes downloaded) of one sequential epoch from a cold ``cache``, open included."""
    start = time.perf_counter()
    store, ds = _dataset(s3, cache, limit, predownload)
    tokens = 0
    for i in range(len(ds)):
        tokens += int(ds[i]["input_ids"].numel())
    return time.perf_counter() - start, tokens, store._files.downloaded_bytes


def test_remote_cold_epoch_and_resume_at_90_percent_under_a_third_of_the_store(server, tmp_path):
    s3, built = server
    total = sum(p.stat().st_size for p in built.iterdir())
    tokens_bytes = sum(p.stat().st_size for p in built.glob("tokens-*"))
    limit = total // 3

    fresh_s, tokens, fresh_bytes = _epoch(s3, tmp_path / "fresh", limit)      # no plan cached: it is built
    cold_s, _, cold_bytes = _epoch(s3, tmp_path / "cold", limit)              # a restarted job: the plan cached
    plain_s, _, plain_bytes = _epoch(s3, tmp_path / "plain", limit, predownload=0)   # the same, no predownload
    assert cold_bytes >= tokens_bytes   # every token file was downloaded at least once

    resume_at = int(len(_dataset(s3, tmp_path / "probe", limit)[1]) * 0.9)
    start = time.perf_counter()
    store, ds = _dataset(s3, tmp_path / "resume", limit)
    ds[resume_at]
    first_s = time.perf_counter() - start
    for i in range(resume_at + 1, len(ds)):
        ds[i]

    figures = {"store_bytes": total, "token_file_bytes": tokens_bytes, "cache_limit": limit, "samples": len(ds),
               "fresh_epoch_s": round(fresh_s, 3), "fresh_tokens_per_s": round(tokens / fresh_s),
               "fresh_epoch_bytes_over_token_bytes": round(fresh_bytes / tokens_bytes, 3),
               "cold_epoch_s": round(cold_s, 3), "cold_tokens_per_s": round(tokens / cold_s),
               "cold_epoch_bytes_over_token_bytes": round(cold_bytes / tokens_bytes, 3),
               "cold_epoch_no_predownload_s": round(plain_s, 3),
               "cold_epoch_no_predownload_bytes_over_token_bytes": round(plain_bytes / tokens_bytes, 3),
               "resume_90_first_sample_s": round(first_s, 3),
               "resume_90_bytes_downloaded": store._files.downloaded_bytes,
               "resume_90_bytes_over_last_tenth": round(store._files.downloaded_bytes / (tokens_bytes / 10), 3)}
    print("\nremote benchmark:", json.dumps(figures))
