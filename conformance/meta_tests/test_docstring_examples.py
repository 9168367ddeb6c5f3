"""Meta test: the worked examples in reference docstrings are true (they are doctests)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import reference

MODULES = sorted(m.name for m in pkgutil.iter_modules(reference.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_worked_examples_in_reference_docstrings_hold(name):
    module = importlib.import_module(f"reference.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in reference.{name} failed"
