"""The checkout's ``fixtures/`` (the KJV corpus, the GPT-2 tokenizer and their writers), found by path.

Why by path: loadspec installs no top-level ``fixtures`` package, since one
would shadow PyPI's widely used ``fixtures`` in every environment loadspec is
installed into. The walkthrough (``python -m conformance.walkthrough``, the
first half of ``make demo``) is shipped in ``conformance`` yet runs on the
repository's committed data, so it looks for ``fixtures/`` beside the ``impl``
package it was imported from (the root of a clone, also under ``pip install
-e``) and loads ``fixtures/generators.py`` under a private module name: a
``fixtures`` the user has installed is neither shadowed nor used. (The demos
in ``demos/`` are not shipped: they run from the checkout and import
``fixtures`` directly.) ::

    >>> gen = generators()
    >>> gen.tokenizer_path().relative_to(FIXTURES_DIR).as_posix()
    'tokenizer/gpt2'

Installed from a wheel, ``impl`` lives in site-packages with no ``fixtures/``
beside it, and :func:`generators` raises
:class:`~impl.errors.FixturesNotFoundError` naming where it looked.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

from impl.errors import FixturesNotFoundError

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
MODULE_NAME = "_loadspec_repo_fixtures_generators"


def generators(fixtures_dir: Path | None = None) -> ModuleType:
    """``fixtures/generators.py`` of the checkout as a module (``load_corpus``, ``tokenizer_path``, ...).

    Loaded once per directory and left out of ``sys.modules``, so no import of
    ``fixtures`` anywhere in the process finds or shadows it.
    """
    return _load(Path(FIXTURES_DIR if fixtures_dir is None else fixtures_dir).resolve())


@functools.cache
def _load(fixtures_dir: Path) -> ModuleType:
    path = fixtures_dir / "generators.py"
    if not path.is_file():
        raise FixturesNotFoundError(
            f"the walkthrough runs on the repository's fixtures/ (the KJV corpus and the GPT-2 tokenizer), and "
            f"there is no {path}: this loadspec was installed from a wheel, which does not ship them. Run it from a "
            "clone of the loadspec repository: `make demo` there (or `pip install -e .` from it)")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
