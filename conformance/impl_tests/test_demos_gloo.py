"""Small runs of the checkout's demos (``demos/``): one corpus resumed on another world size, and a mixture.

Why here: the demos are not shipped (they run on the repository's
``fixtures/``), yet each promises exactly-once training across a resume on
real gloo ranks; these runs keep that promise checked at a size a CI core
finishes quickly.
"""

from __future__ import annotations

import json

import pytest

from conformance.assertions import assert_equal, check
from demos import mixture, train_resume


@pytest.mark.loadspec_gloo
@pytest.mark.clause("RES-4", "RES-1")
def test_demo_resumes_two_ranks_on_three_with_no_sample_missing_or_repeated_gloo(tmp_path):
    cfg = train_resume.DemoConfig(documents=10, seq_len=32, global_batch=6, checkpoint_step=4,
                                  steps_after_checkpoint=2, join_timeout_s=240)
    report = train_resume.run(tmp_path, cfg)
    assert_equal((report["duplicates"], report["missing"]), (0, 0), clause="RES-4", what="duplicates, missing")
    check(report["samples_trained"] == report["samples_in_epoch"] - report["dropped_by_drop_last"], clause="PART-4",
          what=f"trained {report['samples_trained']} samples")
    check(report["loss_after_resume"] < report["loss_of_an_untrained_model"], clause="RES-1",
          what=f"loss after resume {report['loss_after_resume']:.3f} looks like an untrained model")
    check(json.loads((tmp_path / "report.json").read_text()) == report, clause="RES-2", what="report.json")


@pytest.mark.loadspec_gloo
@pytest.mark.clause("MIX-13", "RES-4")
def test_the_mixture_demo_trains_resumes_on_three_ranks_and_validates_with_no_sample_lost_or_repeated_gloo(tmp_path):
    report = mixture.run(tmp_path / "demo")
    assert (report["duplicates"], report["missing"]) == (0, 0), report
    assert set(report["validation_loss"]) == {"web", "code"}, report
    assert all(0 < loss < 20 for loss in report["validation_loss"].values()), report["validation_loss"]
