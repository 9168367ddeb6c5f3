"""The loadspec conformance kit as a pytest plugin (registered by the ``pytest11`` entry point).

What it adds:
- hypothesis profiles ``ci`` (bounded, derandomised: the same examples on every
  run) and ``thorough`` (deep local runs), chosen by ``LOADSPEC_HYPOTHESIS_PROFILE``
  (default ``ci``);
- markers ``clause(id, ...)``, ``capability(name, ...)`` and ``gloo``;
- ``--loader module:factory``, the loader under test; the ``loader`` fixture
  returns the adapter it builds, and a test marked with a capability the loader
  lacks is skipped with the reason.
"""

from __future__ import annotations

import importlib
import os

import pytest

PROFILE_ENV = "LOADSPEC_HYPOTHESIS_PROFILE"
DEFAULT_LOADER = "conformance.adapters.impl:adapter"


def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("ci", max_examples=30, derandomize=True, print_blob=True, **common)
    settings.register_profile("thorough", max_examples=600, print_blob=True, **common)
    settings.register_profile("dev", max_examples=10, derandomize=True, **common)
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in ("ci", "thorough", "dev"):
        raise pytest.UsageError(f"{PROFILE_ENV}={name!r}: choose one of ci, thorough, dev")
    settings.load_profile(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loadspec", "loadspec conformance kit")
    group.addoption("--loader", action="store", default=os.environ.get("LOADSPEC_LOADER", DEFAULT_LOADER),
                    help="the loader under test as module:factory; the factory returns a conformance.adapter.LoaderAdapter "
                         f"(default {DEFAULT_LOADER}; the reference is conformance.adapters.reference:adapter)")


def pytest_configure(config: pytest.Config) -> None:
    _register_hypothesis_profiles()
    config.addinivalue_line("markers", "clause(*ids): the docs/SEMANTICS.md clause(s) a test checks")
    config.addinivalue_line("markers", "capability(*names): adapter capabilities the test needs; skipped when absent")
    config.addinivalue_line("markers", "gloo: multi-process torch.distributed (gloo) test")


def load_adapter(spec: str):
    """Import ``module:factory`` and call the factory; errors name the fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise pytest.UsageError(f"--loader {spec!r}: write it as module:factory, e.g. conformance.adapters.reference:adapter")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"--loader {spec!r} could not be imported: {exc}") from exc
    return factory()


@pytest.fixture(scope="session")
def loader(request: pytest.FixtureRequest):
    """The adapter of the loader under test (``--loader``)."""
    return load_adapter(request.config.getoption("--loader"))


@pytest.fixture(autouse=True)
def _skip_missing_capabilities(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("capability")
    if marker is None or "loader" not in request.fixturenames:
        return
    adapter = request.getfixturevalue("loader")
    missing = [c for c in marker.args if c not in adapter.capabilities]
    if missing:
        pytest.skip(f"loader {adapter.name!r} lacks capabilities {missing}")
