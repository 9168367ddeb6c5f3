"""The kit's hypothesis budget, as settings objects handed to the kit's own tests (never a global profile).

Why not ``settings.load_profile``: the plugin runs in every project of the
environment, and loading a profile would change the host project's own
hypothesis tests. Instead the plugin decorates each hypothesis test of the
``conformance`` package with :func:`kit_settings` (hypothesis's public
``@settings`` decorator); a test that needs its own values is decorated with
``@kit_settings(max_examples=...)``, which keeps the rest of the budget.

Profiles, chosen by ``LOADSPEC_HYPOTHESIS_PROFILE``: ``ci`` (default: 30
examples, derandomised, so every run sees the same examples), ``thorough``
(600 examples) and ``dev`` (10).
"""

from __future__ import annotations

import os
from typing import Any

PROFILE_ENV = "LOADSPEC_HYPOTHESIS_PROFILE"
PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 30, "derandomize": True, "print_blob": True},
    "thorough": {"max_examples": 600, "print_blob": True},
    "dev": {"max_examples": 10, "derandomize": True},
}


def profile_name() -> str:
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in PROFILES:
        import pytest

        raise pytest.UsageError(f"{PROFILE_ENV}={name!r}: choose one of {', '.join(PROFILES)}")
    return name


def kit_settings(**overrides: Any) -> Any:
    """The kit's ``hypothesis.settings`` for the chosen profile, with ``overrides`` on top.

    >>> kit_settings(max_examples=3).max_examples
    3
    """
    from hypothesis import HealthCheck, settings

    base = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture]}
    base.update(PROFILES[profile_name()])
    base.update(overrides)
    return settings(parent=settings.get_profile("default"), **base)


def apply_kit_budget(fn: Any) -> Any:
    """Give ``fn``, a kit hypothesis test without its own ``@settings``, the kit's budget; return it.

    With hypothesis's public decorator, once per function. A test that has its
    own ``@settings`` keeps it: hypothesis refuses a second decorator
    (``InvalidArgument``), and the kit's own such tests build theirs with
    :func:`kit_settings`, so they carry the budget already. The plugin applies
    it to every collected kit test; ``kit_tests`` that call a suite's test
    directly apply it first.
    """
    if fn is None or not getattr(fn, "is_hypothesis_test", False) or getattr(fn, "_loadspec_budget", False):
        return fn
    import contextlib

    from hypothesis.errors import InvalidArgument

    fn._loadspec_budget = True
    with contextlib.suppress(InvalidArgument):
        kit_settings()(fn)
    return fn
