"""Importing the peer loaders, each skipped with a reason when it is not installed.

The peers live in the benchmark venv (``make bench-env`` -> ``.venv-bench``),
never in the core install. ``mosaicml-streaming`` imports ``torchvision`` at
import time; PyPI's torchvision (a CUDA build) does not load beside the CPU
torch 2.13.0 wheel, and streaming's text/ndarray paths never use it, so we
register a stub module first (the alternative is a 6.6 GB environment).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

BENCH_ENV_HINT = "peer loaders live in the benchmark venv: run `make bench` (creates .venv-bench)"


def _stub_torchvision() -> None:
    if "torchvision" in sys.modules:
        return
    try:
        if importlib.util.find_spec("torchvision") is not None:
            importlib.import_module("torchvision")
            return
    except Exception:  # noqa: BLE001 - a torchvision that fails to load is why the stub exists
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

    class _Unavailable:
        """Stands for any torchvision name streaming imports; using it fails loudly."""

        def __init__(self, *args, **kwargs) -> None:
            raise RuntimeError("torchvision is a stub in the loadspec benchmark venv (text benchmarks never use it)")

    def _stub_attr(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)  # inspect/pickle probe dunders; they must stay absent
        return _Unavailable

    def module(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        mod.__getattr__ = _stub_attr  # any imported name resolves to a failing placeholder
        sys.modules[name] = mod
        return mod

    tv = module("torchvision")
    tv.__version__ = "0.0.0+loadspec-bench-stub"
    for sub in ("datasets", "datasets.utils", "datasets.vision", "transforms", "transforms.functional", "io",
                "models", "ops", "utils"):
        mod = module(f"torchvision.{sub}")
        parent, _, leaf = f"torchvision.{sub}".rpartition(".")
        setattr(sys.modules[parent], leaf, mod)


def import_streaming():
    """MosaicML ``streaming`` (with the torchvision stub), or ImportError."""
    os.environ.setdefault("STREAMING_DISABLE_TELEMETRY", "1")
    _stub_torchvision()
    import streaming

    return streaming


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
