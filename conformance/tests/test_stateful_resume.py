"""The loader under test (``--loader``) driven through random sequences of checkpoints, crashes, resizes and epochs.

See ``conformance.stateful.LoaderMachine`` for the rules and the invariant; the
model is the reference. Bounded for CI (2 cores): at most 15 examples of at
most 12 rules each, whatever the hypothesis profile asks for.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.stateful import machine_for

MAX_EXAMPLES = 15
STEPS = 12


@pytest.mark.clause("RES-1", "RES-2", "RES-4", "RES-5", "RES-6", "RES-7", "PART-3", "PART-8")
@pytest.mark.capability("resume")
def test_any_sequence_of_steps_checkpoints_crashes_resizes_and_epochs_keeps_the_stream_exact(loader):
    bounded = settings(settings.default, max_examples=min(settings.default.max_examples, MAX_EXAMPLES),
                       stateful_step_count=STEPS)
    run_state_machine_as_test(machine_for(loader), settings=bounded)
