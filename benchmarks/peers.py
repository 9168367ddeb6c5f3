"""Importing the peer loaders, each skipped with a reason when it is not installed.

The peers live in the benchmark venv (``make bench-env`` -> ``.venv-bench``),
never in the core install. MosaicML ``streaming`` is imported through
``conformance.adapters.peers._streaming`` (a stub ``torchvision`` first), which
the installed kit's MosaicML adapter uses too.
"""

from __future__ import annotations

import pytest

from conformance.adapters.peers._streaming import import_streaming

BENCH_ENV_HINT = "peer loaders live in the benchmark venv: run `make bench` (creates .venv-bench)"


def require_streaming():
    try:
        return import_streaming()
    except ImportError as exc:
        pytest.skip(f"MosaicML streaming not installed ({exc}); {BENCH_ENV_HINT}")


def require_litdata():
    try:
        import litdata
    except ImportError as exc:
        pytest.skip(f"LitData not installed ({exc}); {BENCH_ENV_HINT}")
    return litdata


def require_datasets():
    try:
        import datasets
    except ImportError as exc:
        pytest.skip(f"HF datasets not installed ({exc})")
    return datasets


def version(name: str) -> str | None:
    try:
        from importlib.metadata import version as v

        return v(name)
    except Exception:  # noqa: BLE001
        return None


PEER_DISTS = ("torch", "numpy", "pyarrow", "datasets", "transformers", "tokenizers", "mosaicml-streaming",
              "litdata", "pytest-benchmark")
