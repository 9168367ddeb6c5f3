"""The loader under test (``--loadspec-loader``, ``bit_exact`` only: the model is the reference's numbering) driven through random sequences of checkpoints, crashes, resizes and epochs.

See ``conformance.stateful.LoaderMachine`` for the rules and the invariant; the
model is the reference. Bounded for CI (2 cores): at most 15 examples of at
most 12 rules each, whatever the hypothesis profile asks for.
"""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis", reason="the loadspec conformance kit needs hypothesis: pip install 'loadspec[conformance]'")

from hypothesis.stateful import run_state_machine_as_test

from conformance.budget import kit_settings
from conformance.stateful import machine_for

MAX_EXAMPLES = 15
STEPS = 12


@pytest.mark.clause("RES-1", "RES-2", "RES-4", "RES-5", "RES-6", "RES-7", "PART-3", "PART-8")
@pytest.mark.loadspec_capability("bit_exact", "resume")
def test_any_sequence_of_steps_checkpoints_crashes_resizes_and_epochs_keeps_the_stream_exact(loadspec_adapter):
    bounded = kit_settings(max_examples=min(kit_settings().max_examples, MAX_EXAMPLES), stateful_step_count=STEPS)
    run_state_machine_as_test(machine_for(loadspec_adapter), settings=bounded)
