"""Importing MosaicML ``streaming`` beside the CPU torch wheel (a stub ``torchvision`` first).

Why here, in the shipped adapters: the MosaicML adapter needs it wherever the
kit is installed, and the benchmarks (which are not installed) import it from
here, never the other way round. ``mosaicml-streaming`` imports
``torchvision`` at import time; PyPI's torchvision (a CUDA build) does not load
beside the CPU torch 2.13.0 wheel, and streaming's text/ndarray paths never use
it, so a stub module is registered first (the alternative is a 6.6 GB
environment). A torchvision that imports cleanly is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any


def stub_torchvision() -> None:
    """Register a ``torchvision`` whose every name fails when used, unless a working one is importable."""
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

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("torchvision is a stub in the loadspec benchmark venv (text benchmarks never use it)")

    def _stub_attr(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)  # inspect/pickle probe dunders; they must stay absent
        return _Unavailable

    def module(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        mod.__getattr__ = _stub_attr  # type: ignore[method-assign]  # any imported name resolves to a placeholder
        sys.modules[name] = mod
        return mod

    tv = module("torchvision")
    tv.__version__ = "0.0.0+loadspec-bench-stub"  # type: ignore[attr-defined]
    for sub in ("datasets", "datasets.utils", "datasets.vision", "transforms", "transforms.functional", "io",
                "models", "ops", "utils"):
        mod = module(f"torchvision.{sub}")
        parent, _, leaf = f"torchvision.{sub}".rpartition(".")
        setattr(sys.modules[parent], leaf, mod)


def import_streaming() -> Any:
    """MosaicML ``streaming`` (with the torchvision stub, telemetry off), or ImportError naming the fix."""
    from conformance.adapters.peers import require

    os.environ.setdefault("STREAMING_DISABLE_TELEMETRY", "1")
    stub_torchvision()
    return require("streaming")
