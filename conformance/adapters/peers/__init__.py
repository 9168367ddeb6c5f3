"""Adapters for peer loaders (HF datasets, torchdata, MosaicML Streaming, LitData): one file each.

Each module's ``adapter()`` raises ``pytest.skip`` (through :func:`require`)
when its peer is not installed, so the core install grades no peer and fails
nothing; ``make matrix`` runs them in the benchmarks' peer venv.
"""

from __future__ import annotations

import importlib
from typing import Any


def require(module: str, hint: str = "run `make matrix` (peers live in .venv-bench)") -> Any:
    """Import a peer or raise ``ImportError`` naming the fix (the plugin turns it into a usage error)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"peer {module!r} is not installed ({exc}); {hint}") from exc
