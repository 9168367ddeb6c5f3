"""(6) Peak RSS across an epoch (M corpus for M/L runs, S for the smoke), each loader in a subprocess.

The timed figure is the subprocess's wall time (imports included); the
memory figures are in extra_info (see ``benchmarks/rss.py``).
"""

from __future__ import annotations

import pytest

from benchmarks.peers import require_datasets, require_litdata, require_streaming
from benchmarks.rss import run_subprocess
from benchmarks.workloads import RSSES, Rss

REQUIRE = {"hf-iterable": require_datasets, "mosaicml": require_streaming, "litdata": require_litdata}


@pytest.mark.parametrize("w", RSSES, ids=str)
def test_rss(benchmark, w: Rss, size: str, smoke: bool):
    if w.loader in REQUIRE:
        REQUIRE[w.loader]()
    if smoke and w.loader != "impl":
        pytest.skip("smoke mode (--benchmark-disable): peer RSS runs only in `make bench`")
    rss_size = "S" if size == "S" else "M"
    out = {}

    def target():
        out.update(run_subprocess(w.loader, rss_size, w.workers))

    benchmark.group = "rss"
    benchmark.pedantic(target, rounds=1, warmup_rounds=0)
    benchmark.extra_info.update(kind="rss", **out)
    assert out["items"] > 0
