"""Meta test: the worked examples in reference, impl and demos docstrings are true (they are doctests)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import demos
import impl
import reference

MODULES = sorted(f"{pkg.__name__}.{m.name}" for pkg in (reference, impl, demos)
                 for m in pkgutil.iter_modules(pkg.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_worked_examples_in_docstrings_hold(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed"
