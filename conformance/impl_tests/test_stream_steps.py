"""impl.stream_steps and impl.streaming against reference.stream_steps: a rank ahead at a checkpoint (STREAM-22)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.impl_tests.streaming_corpus import file_specs, impl_rows, ref_rows, take, write
from conformance.impl_tests.test_streaming import _pair, configs
from impl.errors import StateError
from impl.streaming import merge_states
from reference.streaming import merge_states as ref_merge_states

_counter = itertools.count()


def _skewed(loaders, rows, k, ahead, cross):
    """Each rank takes ``k`` steps, rank ``ahead`` one more (with ``cross`` it ends its pass); the rows and counts."""
    got, taken = [], []
    for r, ld in enumerate(loaders):
        it = iter(ld)
        part = rows(take(it, k + (r == ahead)))
        if r == ahead and cross:
            part += rows(list(it))
        got.append(part)
        taken.append(len(part))
    return got, taken


@pytest.mark.clause("STREAM-22", "STREAM-14")
@given(specs=file_specs(), cfg=configs(), ahead=st.integers(0, 1), cross=st.booleans(), data=st.data())
def test_a_rank_a_batch_ahead_resumes_each_rank_to_the_epochs_steps_with_the_references_state_and_batches(
        tmp_path, specs, cfg, ahead, cross, data):
    names, ref_files = write(tmp_path / f"c{next(_counter)}", specs)
    cfg = dict(cfg, num_lanes=4, world_size=2)
    whole = []
    for r in range(2):
        ds, _ = _pair(names, ref_files, cfg, rank=r)
        whole.append([impl_rows(ds), impl_rows(ds)])
    k = data.draw(st.integers(0, max(0, len(whole[0][0]) - 1)))
    pairs = [_pair(names, ref_files, cfg, rank=r) for r in range(2)]
    got, taken = _skewed([ds for ds, _ in pairs], impl_rows, k, ahead, cross)
    assert (got, taken) == _skewed([ref for _, ref in pairs], ref_rows, k, ahead, cross)
    states = [json.loads(json.dumps(ds.state_dict())) for ds, _ in pairs]
    assert states == [ref.state_dict() for _, ref in pairs]
    merged = merge_states(states)
    assert merged == ref_merge_states(states)
    for r in range(2):
        ds, ref = _pair(names, ref_files, cfg, rank=r)
        ds.load_state_dict(merged)
        ref.load_state_dict(merged)
        rest = [impl_rows(ds), impl_rows(ds)]
        assert rest == [ref_rows(ref), ref_rows(ref)]
        assert rest == [whole[r][0][taken[r]:], whole[r][1]], f"rank {r} resumed from {taken[r]} steps"


@pytest.mark.clause("STREAM-22")
@given(specs=file_specs(), cfg=configs())
def test_lanes_straddling_two_epochs_are_refused_on_another_topology_as_the_reference_refuses_them(
        tmp_path, specs, cfg):
    names, ref_files = write(tmp_path / f"c{next(_counter)}", specs)
    cfg = dict(cfg, num_lanes=4, world_size=2)
    pairs = [_pair(names, ref_files, cfg, rank=r) for r in range(2)]
    _skewed([ds for ds, _ in pairs], impl_rows, 0, 1, True)     # rank 1 runs its whole epoch, rank 0 none of it
    merged = merge_states([ds.state_dict() for ds, _ in pairs])
    assert merged["ranks"]["1"]["epoch"] == 1 and merged["ranks"]["0"]["epoch"] == 0
    for world, batch in ((1, cfg["batch_size"]), (4, cfg["batch_size"]), (2, cfg["batch_size"] + 1)):
        ds, ref = _pair(names, ref_files, cfg, world_size=world, rank=0, batch_size=batch)
        with pytest.raises(StateError, match="rank 0 in epoch 0, rank 1 in epoch 1") as raised:
            ds.load_state_dict(merged)
        with pytest.raises(StateError) as expected:
            ref.load_state_dict(merged)
        assert str(raised.value) == str(expected.value)


@pytest.mark.clause("STREAM-22")
@given(specs=file_specs(), cfg=configs(), data=st.data())
def test_a_state_loaded_before_the_loader_sets_the_batch_size_resumes_to_the_epochs_steps_on_that_topology(
        tmp_path, specs, cfg, data):
    from impl.loader import build_dataloader

    names, ref_files = write(tmp_path / f"c{next(_counter)}", specs)
    cfg = dict(cfg, num_lanes=4, world_size=2, batch_size=2)
    ds, _ = _pair(names, ref_files, cfg, rank=0)
    whole = impl_rows(ds)
    k = data.draw(st.integers(0, max(0, len(whole) - 1)))
    pairs = [_pair(names, ref_files, cfg, rank=r) for r in range(2)]
    _got, taken = _skewed([ds for ds, _ in pairs], impl_rows, k, 1, False)
    merged = merge_states([ds.state_dict() for ds, _ in pairs])
    if merged["ranks"]["1"]["epoch"] != merged["epoch"]:
        return      # a straddling state is refused at a load on another batch size (the loader's is set first)
    early, _ = _pair(names, ref_files, cfg, rank=0, batch_size=1)
    early.load_state_dict(merged)           # batch size 1 here: another topology, S recomputed ...
    loader = build_dataloader(early, batch_size=2, rank=0, world_size=2)     # ... until the loader's is set
    assert impl_rows(loader) == whole[taken[0]:]
