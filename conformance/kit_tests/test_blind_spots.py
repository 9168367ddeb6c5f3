"""The kit catches the bugs of ``conformance.examples.broken``, each of which its in-process suites once passed.

Each test runs every test of the in-process any-loader suites
(``conformance/tests/test_any_loader.py`` and ``test_loader.py``) that the
adapter's capabilities allow, on one broken variant of the worked example, with
the kit's budget (``LOADSPEC_HYPOTHESIS_PROFILE``, given with hypothesis's
public ``@settings`` decorator as the plugin gives it to collected kit tests,
so there is no deadline to miss on a loaded machine), and checks that a test
fails with a message that names the bug. The intact worked example passes the same tests,
so each failure is the bug's. And each variant is caught by the matrix's own
run (``conformance.matrix.run_loader``) under the profile the matrix is
generated with (``conformance.matrix.PROFILE``), so no row of MATRIX.md is a
pass that the kit's budget could not have failed.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

pytest.importorskip("hypothesis")

from conformance import matrix
from conformance.assertions import ClauseViolation
from conformance.budget import apply_kit_budget
from conformance.examples import broken, third_party
from conformance.tests import test_any_loader, test_loader

SUITES = (test_any_loader, test_loader)
CATCHES = {
    "forgets_epoch": ("test_resuming_in_a_later_epoch_continues_that_epochs_stream_also_when_resumed_twice", "RES-1"),
    "loses_last_sample": ("test_fewer_than_one_global_batch_is_left_untrained", "PART-4"),
    "holds_back_even_batch": ("test_fewer_than_one_global_batch_is_left_untrained", "PART-4"),
    "counts_furthest_rank": (
        "test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology",
        "RES-6"),
    "global_state_of_its_own_rank": (
        "test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology",
        "RES-6"),
    "global_state_copied_from_rank_0": (
        "test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology",
        "RES-6"),
    "global_state_of_the_furthest_rank": (
        "test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology",
        "RES-6"),
    "declares_one_sample_more_kept": ("test_fewer_than_one_global_batch_is_left_untrained", "PART-4"),
    "declares_one_sample_fewer_kept": ("test_fewer_than_one_global_batch_is_left_untrained", "PART-4"),
}
"""Each broken variant of ``conformance.examples.broken``: the kit test that catches it, and the clause it names."""


def _capabilities(fn: Any) -> set[str]:
    return {c for mark in getattr(fn, "pytestmark", []) if mark.name == "loadspec_capability" for c in mark.args}


def _run_suites(adapter: Any, select: tuple[str, ...] | None = None) -> dict[str, str]:
    """Each in-process kit test the adapter declares enough for (``select``: of those named), run on it: test name ->
    failure message."""
    failures: dict[str, str] = {}
    for suite in SUITES:
        for name, fn in inspect.getmembers(suite, inspect.isfunction):
            if not name.startswith("test_") or not _capabilities(fn) <= adapter.capabilities:
                continue
            if select is not None and name not in select:
                continue
            try:
                apply_kit_budget(fn)(loadspec_adapter=adapter)
            except ClauseViolation as exc:
                failures[name] = str(exc)
    return failures


def test_the_intact_worked_example_passes_every_in_process_test():
    assert _run_suites(third_party.adapter()) == {}


def test_a_sampler_that_forgets_its_epoch_on_resume_fails_the_later_epoch_resume_test():
    failures = _run_suites(broken.forgets_epoch())
    message = failures.get("test_resuming_in_a_later_epoch_continues_that_epochs_stream_also_when_resumed_twice", "")
    assert message.startswith("[RES-1] epoch 1 resumed"), failures
    assert "first differing sample is row" in message and "but the uninterrupted run has CanonicalRow(" in message
    assert "resumed from the state saved after" in message and "{'ep': " in message


def test_a_loader_that_loses_one_sample_per_epoch_fails_the_exact_loss_account():
    failures = _run_suites(broken.loses_last_sample())
    message = failures.get("test_fewer_than_one_global_batch_is_left_untrained", "")
    assert message.startswith("[PART-4] epoch 0 trained"), failures
    assert "1 sample lost" in message
    assert "never trained, by place in the packed stream's store order" in message
    assert "(the stream's last window among them)" in message


def test_a_loader_that_holds_back_the_last_batch_of_an_even_epoch_fails_the_exact_loss_account():
    failures = _run_suites(broken.holds_back_even_batch())
    message = failures.get("test_fewer_than_one_global_batch_is_left_untrained", "")
    assert message.startswith("[PART-4] epoch 0 trained"), failures
    assert "is a multiple of G" in message
    assert "the epoch's last global batch" in message and "never served" in message


def test_a_rank_0_that_checkpoints_the_furthest_rank_fails_only_when_the_last_rank_is_ahead():
    failures = _run_suites(broken.counts_furthest_rank())
    test, _ = CATCHES["counts_furthest_rank"]
    assert set(failures) == {test}, failures   # rank 0 ahead (the test before it) is exact, and passes
    message = failures[test]
    assert message.startswith("[RES-6] rank 0 wrote its state after "), message
    assert "was one batch ahead" in message and "the state counts another rank's batches, not rank 0's" in message


def test_a_global_state_that_is_each_ranks_own_fails_when_a_rank_is_ahead():
    """Only the test that skews every example (the last rank ahead) is run: the variants' tests take seconds."""
    test, _ = CATCHES["global_state_of_its_own_rank"]
    failures = _run_suites(broken.global_state_of_its_own_rank(), (test,))
    message = failures.get(test, "")
    assert message.startswith("[RES-6] the adapter declares state:global, but rank(s) ["), failures
    assert "returned a state other than rank 0's" in message


def test_a_global_state_copied_from_rank_0_fails_when_the_last_rank_was_ahead_and_redoes_its_batch():
    test, _ = CATCHES["global_state_copied_from_rank_0"]
    failures = _run_suites(broken.global_state_copied_from_rank_0(), (test,))
    message = failures.get(test, "")
    assert message.startswith("[RES-6] the adapter declares state:global, and every rank returned {'ep': "), failures
    assert "does not continue where it stood, so the state is not every rank's position" in message


def test_a_global_state_copied_from_the_furthest_rank_fails_when_a_rank_behind_it_would_skip_its_batch():
    test, _ = CATCHES["global_state_of_the_furthest_rank"]
    failures = _run_suites(broken.global_state_of_the_furthest_rank(), (test,))
    message = failures.get(test, "")
    assert message.startswith("[RES-6] the adapter declares state:global, and every rank returned {'ep': "), failures
    assert "was one batch ahead" in message and "does not continue where it stood" in message


def test_a_declared_epoch_account_one_sample_over_what_the_loader_trains_fails_the_exact_loss_account():
    test, _ = CATCHES["declares_one_sample_more_kept"]
    message = _run_suites(broken.declares_one_sample_more_kept(), (test,)).get(test, "")
    assert message.startswith("[PART-4] epoch 0 trained"), message
    assert "the loader's end rule (PART-4)" in message and "1 sample lost" in message


def test_a_declared_epoch_account_one_sample_under_what_the_loader_trains_fails_as_a_false_declaration():
    test, _ = CATCHES["declares_one_sample_fewer_kept"]
    message = _run_suites(broken.declares_one_sample_fewer_kept(), (test,)).get(test, "")
    assert message.startswith("[PART-4] epoch 0 trained"), message
    assert "but the adapter declares (epoch_coverage)" in message
    assert "the declared account is not the loader's (1 more trained than declared)" in message


def test_every_broken_variant_is_a_factory_of_the_examples_module_with_the_test_that_catches_it():
    factories = {name for name, fn in inspect.getmembers(broken, inspect.isfunction)
                 if fn.__module__ == broken.__name__}
    assert factories == set(CATCHES)


@pytest.mark.parametrize("variant", sorted(CATCHES))
def test_the_profile_the_matrix_is_generated_with_catches_every_broken_variant(variant):
    """The test that catches ``variant``, run as ``python -m conformance.matrix`` runs it, fails under its profile."""
    test, clause = CATCHES[variant]
    run = matrix.run_loader(variant, f"conformance.examples.broken:{variant}", profile=matrix.PROFILE, timeout=900,
                            suites=(test_any_loader.__name__,), select=test)
    assert run.status == "ran", (run.status, run.detail)
    assert (run.outcomes[test].status, run.outcomes[test].clause) == ("fail", clause), run.outcomes[test]
