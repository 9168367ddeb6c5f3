"""Benchmark fixtures: the corpus of ``LOADSPEC_BENCH_SIZE`` (S by default), machine facts, versions.

Run: ``make bench`` (M, the bench venv with peers), ``LOADSPEC_BENCH_SIZE=L make bench``,
or the smoke ``LOADSPEC_BENCH_SIZE=S .venv/bin/python -m pytest benchmarks -q --benchmark-disable``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from benchmarks import harness, machine
from benchmarks.corpora import Corpus, describe, size_from_env, store_dir_name
from benchmarks.peers import PEER_DISTS, version


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bench_group(name): the figure family a benchmark belongs to")


def pytest_collection_modifyitems(session, config, items) -> None:
    """Run every MosaicML benchmark last, keeping the rest in their order.

    Why: a ``StreamingDataset`` leaves work running in the process after it
    is dropped; measured here, the raw gather and impl ran ~1.5x slower in
    any benchmark that came after MosaicML's resume benchmarks than in the
    same benchmark before them. Moving MosaicML to the end keeps its
    residue out of every other figure (its own figures are unaffected: they
    ran after each other before too).
    """
    items[:] = sorted(items, key=lambda item: "mosaicml" in item.nodeid)


_RESIDENT: dict[str, float | None] = {}


def pytest_sessionstart(session) -> None:
    """Page-cache residency of this size's token store before anything runs (None: not generated yet)."""
    store = Corpus(size_from_env()).root / store_dir_name() / "store"
    files = sorted(store.glob("tokens-*.arrow")) if store.exists() else []
    _RESIDENT["store_at_start"] = machine.resident_fraction(files) if files else None


def pytest_benchmark_update_machine_info(config, machine_info):  # pytest-benchmark hook
    machine_info["loadspec"] = {
        "page_cache_resident": dict(_RESIDENT),
        "size": size_from_env(),
        "corpus": describe(),
        "machine": machine.facts(),
        "machine_name": machine.name(),
        "versions": {d: version(d) for d in PEER_DISTS},
        "python": platform.python_version(),
        "env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS") if k in os.environ},
    }


@pytest.fixture(scope="session")
def size() -> str:
    return size_from_env()


@pytest.fixture(scope="session")
def corpus(size: str) -> Corpus:
    return Corpus(size)


@pytest.fixture(scope="session")
def smoke(request) -> bool:
    """``--benchmark-disable``: each benchmark runs once (make test); keep expensive extras off."""
    return bool(request.config.getoption("benchmark_disable", default=False))


@pytest.fixture(scope="module")
def impl_datasets(corpus: Corpus):
    """``get(shuffle)``: impl's ``PackedDataset`` over the corpus for that shuffle, built once per module."""
    cache: dict = {}

    def get(shuffle: str):
        if shuffle not in cache:
            cache[shuffle] = harness.impl_dataset(corpus, shuffle=shuffle)
        return cache[shuffle]
    return get


@pytest.fixture(scope="session")
def store(corpus: Corpus):
    from impl.store import TokenStore

    return TokenStore.open(corpus.store())


_SKIPPED: list[str] = []


def pytest_runtest_logreport(report) -> None:
    if report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append(f"{report.nodeid.split('::')[-1]}: {reason.removeprefix('Skipped: ')}")


def pytest_sessionfinish(session, exitstatus) -> None:
    """Next to ``--benchmark-json X.json``: ``X.skipped.txt`` (what was skipped and why) for the report."""
    target = session.config.getoption("benchmark_json", default=None)
    if target is None:
        return
    target = target if isinstance(target, (str, Path)) else getattr(target, "name", str(target))  # file or path
    path = Path(target).with_suffix(".skipped.txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(_SKIPPED) + ("\n" if _SKIPPED else ""))
