"""Remote reads beside the peers: loadspec, MosaicML Streaming and LitData from one S3 server, the same bytes counted.

What it measures: the same documents (the same uint16 token bytes) written
as a loadspec store, a MosaicML MDS dataset (no compression) and LitData
chunks, uploaded to one moto S3 server on 127.0.0.1. Every loader reads
through ``FaultProxy`` with no fault rule (``conformance.impl_tests.remote_servers``:
a stdlib HTTP proxy before the server that counts the body bytes of every
response), so "bytes downloaded" is measured
the same way for all three, on the wire, not by each loader's own counters.
Each loader gets the same ``cache_limit`` (a third of the loadspec store)
and a cold local cache, in this one process, no workers:

* ``epoch``: a sequential first epoch (loadspec ``kind="window", window=1``:
  files in a shuffled order, each read through; MosaicML ``shuffle=False``
  with one canonical node: shards in order; LitData ``shuffle=False``):
  tokens/s from construction to the last sample, and the bytes downloaded
  over the format's bytes (a sequential reader downloads each byte once
  even with eviction: 1.0 plus the index). loadspec twice: *fresh* (no
  plan on disk: building it reads every file's document offsets) and
  *cold* (the plan on disk, as a restarted job finds it).
* ``resume90``: a restarted job at 90 % of the epoch with a cold cache:
  seconds from construction to the first sample (MosaicML: its
  ``StreamingDataLoader`` and ``load_state_dict``; LitData the same;
  loadspec ``ds[i]``), then the rest of the epoch; the bytes downloaded
  over a tenth of the format's bytes.

loadspec yields packed 512-token samples; the peers yield documents. The
peers need the benchmark venv (``make bench-env``: MosaicML and LitData from
``requirements-bench.txt``, moto and s3fs from the ``test`` extra); where
one is missing its benchmarks skip with the reason.

Run: ``.venv-bench/bin/python -m pytest benchmarks/test_remote_peers.py -q -s -p no:cacheprovider --benchmark-disable``
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.peers import BENCH_ENV_HINT, require_litdata, require_streaming

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None,
        reason="moto and s3fs (pip install 'loadspec[test,s3]') are needed to start the S3 server and read from it"),
    # loadspec alone from S3 is benchmarks/test_remote.py: without a peer this file would only repeat it.
    pytest.mark.skipif(
        importlib.util.find_spec("streaming") is None and importlib.util.find_spec("litdata") is None,
        reason=f"neither MosaicML streaming nor LitData is installed; {BENCH_ENV_HINT}"),
]

BUCKET = "peers"
FILES, DOCS, SEQ_LEN, VOCAB = 24, 200, 512, 50_000


def _documents() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [[rng.integers(0, VOCAB, size=int(rng.integers(100, 900))).astype(np.uint16) for _ in range(DOCS)]
            for _ in range(FILES)]


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _litdata_file(index: int) -> Iterator[np.ndarray]:
    yield from _documents()[index]


@pytest.fixture(scope="module")
def remote(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The three copies written and uploaded, the server and the proxy running; ``sizes``: each copy's bytes."""
    from conformance.impl_tests.remote_servers import FaultProxy, S3Server
    from impl.store import TokenStore

    root = tmp_path_factory.mktemp("remote-peers")
    docs = _documents()
    TokenStore.from_token_files([[d.tolist() for d in f] for f in docs], root / "store", vocab_size=VOCAB)
    store_bytes = _size(root / "store")
    sizes = {"loadspec": store_bytes}
    formats = ["store"]
    if importlib.util.find_spec("streaming") is not None:
        streaming = require_streaming()
        # One shard per store file: the size limit is a file's token bytes and a little.
        limit = max(sum(d.nbytes for d in f) for f in docs) + 8 * DOCS + 1024
        with streaming.MDSWriter(out=str(root / "mds"), columns={"input_ids": "ndarray:uint16"}, compression=None,
                                 hashes=[], size_limit=limit, progress_bar=False) as out:
            for f in docs:
                for d in f:
                    out.write({"input_ids": d})
        sizes["mosaicml"] = _size(root / "mds")
        formats.append("mds")
    if importlib.util.find_spec("litdata") is not None:
        litdata = require_litdata()
        litdata.optimize(fn=_litdata_file, inputs=list(range(FILES)), output_dir=str(root / "litdata"),
                         chunk_bytes=max(sum(d.nbytes for d in f) for f in docs) + 1024, num_workers=1,
                         mode="overwrite", start_method="fork")
        sizes["litdata"] = _size(root / "litdata")
        formats.append("litdata")
        # LitData downloads chunks through obstore, whose client options it fixes without ``allow_http``
        # (obstore refuses http:// endpoints otherwise, and reads no environment variable for it here).
        from litdata.streaming import downloader
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]
    saved = {k: os.environ.get(k) for k in ("S3_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
    with S3Server() as s3, FaultProxy(s3.url, upstream_timeout=60.0) as proxy:   # no rule: it only counts
        for name in formats:
            s3.upload_dir(root / name, BUCKET, name)
        os.environ["S3_ENDPOINT_URL"] = proxy.url        # MosaicML reads its endpoint from here
        os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
        try:
            yield {"proxy": proxy, "sizes": sizes, "cache_limit": store_bytes // 3, "root": root,
                   "tokens": sum(int(d.size) for f in docs for d in f), "docs": [d for f in docs for d in f]}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# --------------------------------------------------------------------------- the loaders, each (open, read)


def _loadspec(remote: dict[str, Any], cache: Path, plans: Path):
    from conformance.impl_tests.remote_servers import s3_options
    from impl.dataset import PackedDataset
    from impl.store import TokenStore
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig
    from reference.resume import PipelineConfig

    store = TokenStore.open(f"s3://{BUCKET}/store", local=cache, cache_limit=remote["cache_limit"],
                            storage_options=s3_options(remote["proxy"].url))
    config = PipelineConfig(packing=PackingConfig(seq_len=SEQ_LEN, mode="concat", pad_id=0),
                            ordering=OrderingConfig(kind="window", window=1, seed=3))
    return PackedDataset.from_config(store, config, cache_dir=plans)


def _plan(remote: dict[str, Any], cache: Path, plans: Path) -> int:
    """Build and cache loadspec's epoch plan under ``plans`` (the first sample builds it); the sample count."""
    ds = _loadspec(remote, cache, plans)
    ds[0]
    assert any(plans.iterdir())
    return len(ds)


def _mosaic(remote: dict[str, Any], cache: Path):
    import weakref

    from benchmarks import harness

    streaming = require_streaming()
    ds = streaming.StreamingDataset(remote=f"s3://{BUCKET}/mds", local=str(cache), cache_limit=remote["cache_limit"],
                                    shuffle=False, num_canonical_nodes=1, batch_size=1)
    harness._MOSAIC_LIVE.append((weakref.ref(ds), int(getattr(ds, "_shm_prefix_int", -1))))
    return ds


def _litdata(remote: dict[str, Any], cache: Path):
    from conformance.impl_tests.remote_servers import CREDENTIALS

    litdata = require_litdata()
    options = {"endpoint_url": remote["proxy"].url, "aws_access_key_id": CREDENTIALS["key"],
               "aws_secret_access_key": CREDENTIALS["secret"], "region_name": "us-east-1"}
    return litdata.StreamingDataset(f"s3://{BUCKET}/litdata", cache_dir=str(cache), shuffle=False,
                                    max_cache_size=remote["cache_limit"], storage_options=options)


def _tokens(item: Any) -> int:
    if isinstance(item, dict):
        item = item["input_ids"]
    return int(item.numel() if hasattr(item, "numel") else len(item))


# --------------------------------------------------------------------------- the benchmarks

LOADERS = ["loadspec-fresh", "loadspec-cold", "litdata", "mosaicml"]


def _require(loader: str) -> None:
    if loader == "mosaicml":
        require_streaming()
    elif loader == "litdata":
        require_litdata()


@pytest.mark.bench_group("remote")
@pytest.mark.parametrize("loader", LOADERS)
def test_a_cold_first_epoch_from_s3_under_a_third_of_the_data(benchmark, remote, loader, tmp_path):
    _require(loader)
    proxy = remote["proxy"]
    plans = tmp_path / "plans"
    if loader == "loadspec-cold":   # the plan on disk, as a restarted job finds it (untimed, uncounted)
        _plan(remote, tmp_path / "probe", plans)

    def epoch() -> tuple[int, int]:
        tokens = samples = 0
        if loader.startswith("loadspec"):
            ds = _loadspec(remote, tmp_path / "cache", plans)
            for i in range(len(ds)):
                tokens += int(ds[i]["input_ids"].numel())
                samples += 1
        else:
            ds = _mosaic(remote, tmp_path / "cache") if loader == "mosaicml" else _litdata(remote, tmp_path / "cache")
            for item in ds:
                tokens += _tokens(item)
                samples += 1
        return tokens, samples

    def setup():
        proxy.reset()
        return (), {}

    start = time.perf_counter()
    tokens, samples = benchmark.pedantic(epoch, setup=setup, rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    data = remote["sizes"][loader.split("-")[0]]
    assert tokens >= remote["tokens"] * 0.99          # the whole epoch was read
    figures = {"loader": loader, "seconds": round(seconds, 3), "tokens": tokens, "samples": samples,
               "tokens_per_s": round(tokens / seconds), "format_bytes": data, "cache_limit": remote["cache_limit"],
               "bytes_downloaded": proxy.body_bytes, "requests": proxy.requests,
               "downloaded_over_format_bytes": round(proxy.body_bytes / data, 3)}
    benchmark.extra_info.update(figures)
    print("\nremote peers epoch:", json.dumps(figures))


@pytest.mark.bench_group("remote")
@pytest.mark.parametrize("loader", ["loadspec-cold", "litdata", "mosaicml"])
def test_a_resume_at_90_percent_from_s3_with_a_cold_cache(benchmark, remote, loader, tmp_path):
    _require(loader)
    proxy = remote["proxy"]
    plans = tmp_path / "plans"
    # Untimed, uncounted: loadspec's plan on disk (as a restarted job finds it), LitData's state from a probe.
    total = _plan(remote, tmp_path / "probe", plans) if loader == "loadspec-cold" else FILES * DOCS
    at = int(total * 0.9)
    state = _litdata_state(remote, tmp_path / "cache", at) if loader == "litdata" else None
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)   # LitData's state names its cache dir: same dir, emptied
    held: dict[str, Any] = {}

    def setup():
        proxy.reset()
        return (), {}

    def first() -> Any:
        if loader == "loadspec-cold":
            ds = _loadspec(remote, tmp_path / "cache", plans)
            held["rest"] = (ds[i] for i in range(at + 1, len(ds)))
            return ds[at]["input_ids"]
        if loader == "mosaicml":
            from benchmarks.harness import list_collate, mosaic_state

            streaming = require_streaming()
            ds = _mosaic(remote, tmp_path / "cache")
            dl = streaming.StreamingDataLoader(ds, batch_size=1, num_workers=0, collate_fn=list_collate)
            dl.load_state_dict({**mosaic_state(at), "shuffle_seed": ds.shuffle_seed})
        else:
            from litdata import StreamingDataLoader

            from benchmarks.harness import list_collate

            ds = _litdata(remote, tmp_path / "cache")
            dl = StreamingDataLoader(ds, batch_size=1, num_workers=0, collate_fn=list_collate)
            dl.load_state_dict(state)
        it = iter(dl)
        held["rest"] = (item for batch in it for item in batch)
        return next(it)[0]

    start = time.perf_counter()
    item = benchmark.pedantic(first, setup=setup, rounds=1, iterations=1)
    first_s = time.perf_counter() - start
    rest = sum(1 for _ in held["rest"])
    data = remote["sizes"][loader.split("-")[0]]
    assert _tokens(item) > 0
    if loader != "loadspec-cold":                     # the peers read the documents in order: the one at ``at``
        assert np.array_equal(np.asarray(item["input_ids"] if isinstance(item, dict) else item), remote["docs"][at])
    assert rest >= 1                                  # the epoch went on after the first sample
    figures = {"loader": loader, "resume_at": at, "of": total, "first_sample_s": round(first_s, 3),
               "samples_after": rest, "bytes_downloaded": proxy.body_bytes,
               "downloaded_over_tenth_of_format_bytes": round(proxy.body_bytes / (data / 10), 3),
               "cache_limit": remote["cache_limit"]}
    benchmark.extra_info.update(figures)
    print("\nremote peers resume:", json.dumps(figures))


def _litdata_state(remote: dict[str, Any], cache: Path, n: int) -> dict[str, Any]:
    """LitData's loader state at ``n`` samples: taken after one batch (untimed, uncounted), then moved to ``n``."""
    from litdata import StreamingDataLoader

    from benchmarks.harness import list_collate

    loader = StreamingDataLoader(_litdata(remote, cache), batch_size=1, num_workers=0, collate_fn=list_collate)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    state["num_samples_yielded"] = n
    state["dataset"]["num_samples_yielded"] = n
    state["dataset"]["sample_in_epoch"] = n
    return state
