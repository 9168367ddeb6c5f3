"""impl.units and impl.streaming against reference.units and reference.streaming, bit for bit (STREAM-1 .. STREAM-15)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.impl_tests.streaming_corpus import file_specs, impl_rows, ref_rows, take, tokenizer, write
from impl.files import LocalFiles
from impl.streaming import StreamingDataset, merge_states
from impl.units import build_unit_index, read_unit
from reference import units as ref_units
from reference.streaming import StreamingReferenceLoader, valid_world_sizes

_counter = itertools.count()


def _dir(tmp_path):
    return tmp_path / f"c{next(_counter)}"


@st.composite
def configs(draw):
    lanes = draw(st.integers(1, 4))
    world = draw(st.sampled_from(valid_world_sizes(lanes)))
    return dict(seq_len=draw(st.integers(1, 6)), packing=draw(st.sampled_from(["concat", "chunk"])), num_lanes=lanes,
                seed=draw(st.integers(0, 3)), shuffle=draw(st.booleans()), unit_window=draw(st.integers(1, 3)),
                shuffle_buffer_size=draw(st.integers(0, 4)), unit_bytes=draw(st.integers(1, 40)),
                batch_size=draw(st.integers(1, 3)), world_size=world, rank=draw(st.integers(0, world - 1)))


def _pair(names, ref_files, cfg, **over):
    """The impl dataset and the reference loader of one config (in-process: num_workers=0)."""
    path, tok, tok_id = tokenizer()
    c = dict(cfg, **over)
    ds = StreamingDataset(names, tokenizer=path, seq_len=c["seq_len"], packing=c["packing"], num_lanes=c["num_lanes"],
                          seed=c["seed"], shuffle=c["shuffle"], unit_window=c["unit_window"],
                          shuffle_buffer_size=c["shuffle_buffer_size"], unit_bytes=c["unit_bytes"],
                          batch_size=c["batch_size"], rank=c["rank"], world_size=c["world_size"])
    ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, world_size=c["world_size"],
                                   rank=c["rank"], batch_size=c["batch_size"])
    return ds, ref


@pytest.mark.clause("STREAM-1", "STREAM-2", "STREAM-3", "STREAM-4", "STREAM-5")
@given(specs=file_specs(), unit_bytes=st.integers(1, 40))
def test_the_unit_index_and_every_unit_s_rows_equal_the_reference_s(tmp_path, specs, unit_bytes):
    names, ref_files = write(_dir(tmp_path), specs)
    index = build_unit_index(names, unit_bytes=unit_bytes)
    expected = ref_units.build_index(ref_files, unit_bytes)
    assert index.to_json() == expected.to_json()
    assert index.fingerprint == expected.fingerprint
    for u in range(len(index.units)):
        assert read_unit(LocalFiles(""), index, u) == ref_units.read_unit(ref_files, expected, u)


@pytest.mark.clause("STREAM-6", "STREAM-7", "STREAM-8", "STREAM-9", "STREAM-10", "STREAM-11", "STREAM-12")
@given(specs=file_specs(), cfg=configs())
def test_two_epochs_of_batches_equal_the_reference_loader_s(tmp_path, specs, cfg):
    names, ref_files = write(_dir(tmp_path), specs)
    ds, ref = _pair(names, ref_files, cfg)
    for _ in range(2):
        assert impl_rows(ds) == ref_rows(ref)
        assert ds.epoch == ref.epoch


@pytest.mark.clause("STREAM-13", "STREAM-15")
@given(specs=file_specs(), cfg=configs(), cuts=st.lists(st.integers(0, 4), min_size=2, max_size=2))
def test_a_state_equals_the_reference_s_and_resumes_exactly_twice_in_a_row(tmp_path, specs, cfg, cuts):
    names, ref_files = write(_dir(tmp_path), specs)
    cfg = dict(cfg, world_size=1, rank=0)
    ds, _ = _pair(names, ref_files, cfg)
    whole = impl_rows(ds) + impl_rows(ds)          # two uninterrupted epochs
    got: list = []
    state = None
    for cut in cuts:                               # stop, checkpoint, restart in a fresh dataset: twice
        fresh, ref = _pair(names, ref_files, cfg)
        if state is not None:
            fresh.load_state_dict(json.loads(json.dumps(state)))
            ref.load_state_dict(state)
        part = impl_rows(take(iter(fresh), cut))
        assert part == ref_rows(take(iter(ref), cut))
        got += part
        state = fresh.state_dict()
        assert state == ref.state_dict()
    last, _ = _pair(names, ref_files, cfg)
    last.load_state_dict(state)
    while last.epoch < 2:
        got += impl_rows(last)
    assert got == whole


@pytest.mark.clause("STREAM-14", "STREAM-15")
@given(specs=file_specs(), cfg=configs(), steps=st.integers(0, 3), target=st.sampled_from([1, 2, 4]))
def test_a_merged_checkpoint_of_two_ranks_resumes_on_another_world_size_as_the_reference_does(
        tmp_path, specs, cfg, steps, target):
    names, ref_files = write(_dir(tmp_path), specs)
    cfg = dict(cfg, num_lanes=4, world_size=2)
    states = []
    for rank in (0, 1):
        ds, _ = _pair(names, ref_files, cfg, rank=rank)
        take(iter(ds), steps)
        states.append(ds.state_dict())
    merged = merge_states(states)
    for rank in range(target):
        ds, ref = _pair(names, ref_files, cfg, world_size=target, rank=rank)
        ds.load_state_dict(merged)
        ref.load_state_dict(merged)
        assert impl_rows(ds) == ref_rows(ref)


def test_a_world_size_that_does_not_divide_the_lanes_is_refused_listing_the_valid_ones(tmp_path):
    from impl.errors import TopologyError

    names, _ = write(_dir(tmp_path), [("jsonl", [["a b", "c"]])])
    with pytest.raises(TopologyError, match=r"choose world_size in \[1, 2, 4\]"):
        StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2, num_lanes=4, world_size=3, rank=0)
    with pytest.raises(TopologyError, match=r"choose world_size in \[1, 2\]"):
        from impl.loader import build_dataloader

        ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2, num_lanes=4)
        build_dataloader(ds, batch_size=1, rank=0, world_size=4, num_workers=2)


def test_the_state_is_small_json_naming_positions_never_text(tmp_path):
    names, _ = write(_dir(tmp_path), [("txt", [["alpha beta", "gamma", "delta epsilon zeta"] * 3])])
    ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=3, num_lanes=2, shuffle=True,
                          shuffle_buffer_size=2, unit_bytes=8)
    take(iter(ds), 2)
    state = ds.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert "alpha" not in json.dumps(state) and set(state["lanes"]) == {"0", "1"}


@pytest.mark.clause("STREAM-13")
def test_a_lane_that_runs_dry_inside_a_batch_others_fill_keeps_the_state_of_its_last_sample(tmp_path):
    # lane 0 yields a sample, is picked again in the same batch and has none left; lane 1 fills the batch
    names, ref_files = write(_dir(tmp_path), [("txt", [["", "aaa aa aaa", "aaa aa aaa aa aa aaa"]])])
    cfg = dict(seq_len=2, packing="concat", num_lanes=2, seed=0, shuffle=False, unit_window=1, shuffle_buffer_size=0,
               unit_bytes=1, batch_size=3, world_size=1, rank=0)
    ds, ref = _pair(names, ref_files, cfg)
    steps = len(impl_rows(ds))
    ds, ref = _pair(names, ref_files, cfg)
    assert impl_rows(take(iter(ds), steps)) == ref_rows(take(iter(ref), steps))
    assert ds.state_dict() == ref.state_dict()
