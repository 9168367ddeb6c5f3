"""impl's coverage audit and trained_end (used by `loadspec check` and the demo) equal the reference's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from impl.partition import trained_end
from impl.resume import audit_coverage
from reference.partition import END_POLICIES, PartitionConfig
from reference.partition import trained_end as reference_trained_end
from reference.resume import audit_coverage as reference_audit_coverage


@pytest.mark.clause("PART-8")
@given(num_samples=st.integers(0, 200), world=st.integers(1, 6), batch=st.integers(1, 5),
       end=st.sampled_from(END_POLICIES), data=st.data())
def test_trained_end_equals_the_reference_for_every_start_and_end_policy(num_samples, world, batch, end, data):
    start = data.draw(st.integers(0, num_samples))
    cfg = PartitionConfig(world_size=world, batch_size=batch, end=end)
    assert trained_end(start, num_samples, cfg) == reference_trained_end(start, num_samples, cfg)


@pytest.mark.clause("RES-4")
@given(trained=st.lists(st.integers(-1, 40), max_size=80), end=st.integers(0, 45))
def test_audit_coverage_counts_equal_the_reference(trained, end):
    got, want = audit_coverage(trained, end), reference_audit_coverage(trained, end)
    assert (got.trained, got.duplicates, got.missing, got.beyond_end, got.exact) == (
        want.trained, want.duplicates, want.missing, want.beyond_end, want.exact)
