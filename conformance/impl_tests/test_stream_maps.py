"""impl.stream_maps against reference.stream_maps, bit for bit, in process and with DataLoader workers (STREAM-20, 19)."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.impl_tests.stream_map_fns import Regroup, Repeat, shout, shout_batch
from conformance.impl_tests.streaming_corpus import file_specs, impl_rows, ref_rows, take, tokenizer, write
from impl.errors import ConfigError, MapError, StateError
from impl.streaming import StreamingDataset, merge_states
from reference.stream_maps import BatchedMap, MappedReferenceLoader
from reference.streaming import valid_world_sizes

_counter = itertools.count()


def _dir(tmp_path):
    return tmp_path / f"m{next(_counter)}"


@st.composite
def configs(draw):
    lanes = draw(st.integers(1, 4))
    world = draw(st.sampled_from(valid_world_sizes(lanes)))
    fn = draw(st.one_of(st.builds(Regroup, st.integers(1, 7), st.booleans()), st.builds(Repeat, st.integers(0, 3))))
    return dict(seq_len=draw(st.integers(1, 6)), packing=draw(st.sampled_from(["concat", "chunk"])), num_lanes=lanes,
                seed=draw(st.integers(0, 3)), shuffle=draw(st.booleans()), unit_window=draw(st.integers(1, 3)),
                shuffle_buffer_size=draw(st.integers(0, 4)), unit_bytes=draw(st.integers(1, 40)),
                batch_size=draw(st.integers(1, 3)), world_size=world, rank=draw(st.integers(0, world - 1)),
                fn=fn, map_batch=draw(st.integers(1, 5)))


def _pair(names, ref_files, cfg, **over):
    """The mapped impl dataset and the mapped reference loader of one config."""
    path, tok, tok_id = tokenizer()
    c = dict(cfg, **over)
    base = StreamingDataset(names, tokenizer=path, seq_len=c["seq_len"], packing=c["packing"],
                            num_lanes=c["num_lanes"], seed=c["seed"], shuffle=c["shuffle"],
                            unit_window=c["unit_window"], shuffle_buffer_size=c["shuffle_buffer_size"],
                            unit_bytes=c["unit_bytes"], batch_size=c["batch_size"], rank=c["rank"],
                            world_size=c["world_size"])
    ds = base.map(c["fn"], batched=True, batch_size=c["map_batch"], name=repr(c["fn"]))
    fmap = BatchedMap(function=c["fn"], batch_size=c["map_batch"], name=repr(c["fn"]))
    ref = MappedReferenceLoader(ref_files, ds.config, tok, map=fmap, tokenizer_id=tok_id,
                                world_size=c["world_size"], rank=c["rank"], batch_size=c["batch_size"],
                                num_workers=c.get("num_workers", 0))
    return ds, ref


@pytest.mark.clause("STREAM-20")
@given(specs=file_specs(), cfg=configs())
def test_two_epochs_of_mapped_batches_equal_the_reference_s(tmp_path, specs, cfg):
    names, ref_files = write(_dir(tmp_path), specs)
    ds, ref = _pair(names, ref_files, cfg)
    for _ in range(2):
        assert impl_rows(ds) == ref_rows(ref)
        assert ds.epoch == ref.epoch


@pytest.mark.clause("STREAM-21")
@given(specs=file_specs(), cfg=configs(), cuts=st.lists(st.integers(0, 4), min_size=2, max_size=2))
def test_a_mapped_state_equals_the_reference_s_and_resumes_exactly_twice_in_a_row(tmp_path, specs, cfg, cuts):
    names, ref_files = write(_dir(tmp_path), specs)
    cfg = dict(cfg, world_size=1, rank=0)
    ds, _ = _pair(names, ref_files, cfg)
    whole = impl_rows(ds) + impl_rows(ds)
    got: list = []
    state = None
    for cut in cuts:
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


@pytest.mark.clause("STREAM-21")
@given(specs=file_specs(), cfg=configs(), steps=st.integers(0, 3), target=st.sampled_from([1, 2, 4]))
def test_a_merged_mapped_checkpoint_of_two_ranks_resumes_on_another_world_size_as_the_reference_does(
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


SPECS = [("jsonl", [["alpha beta", "gamma", "delta epsilon", "zeta"] * 3]), ("parquet", [["eta theta", "iota"],
                                                                                         ["kappa", "lambda mu nu"]])]


def test_two_spawned_dataloader_workers_give_the_reference_s_mapped_batches_and_resume_mid_batch(tmp_path):
    from impl.loader import build_dataloader

    names, ref_files = write(_dir(tmp_path), SPECS)
    cfg = dict(seq_len=3, packing="concat", num_lanes=4, seed=1, shuffle=True, unit_window=1, shuffle_buffer_size=2,
               unit_bytes=16, batch_size=2, world_size=1, rank=0, fn=Regroup(5, True), map_batch=3, num_workers=2)
    ds, ref = _pair(names, ref_files, cfg)
    loader = build_dataloader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    it = iter(loader)
    head = impl_rows(take(it, 3))
    assert head == ref_rows(take(iter(ref), 3))
    state = loader.state_dict()
    assert state == ref.state_dict()
    assert any(lane["output"] > 0 for lane in state["lanes"].values())      # a batch partly consumed
    resumed, _ = _pair(names, ref_files, cfg)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = impl_rows(build_dataloader(resumed, batch_size=2, num_workers=2, multiprocessing_context="spawn"))
    assert rest == ref_rows(ref)


def test_a_lambda_map_with_spawned_workers_raises_map_error_saying_to_define_it_at_module_level(tmp_path):
    from impl.loader import build_dataloader

    names, _ = write(_dir(tmp_path), SPECS)
    ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2, num_lanes=2).map(
        lambda batch: batch, batch_size=2, name="identity")
    loader = build_dataloader(ds, batch_size=1, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(MapError, match=r"'identity' cannot be pickled.*module level.*num_workers=0"):
        next(iter(loader))


@pytest.mark.parametrize(("result", "match"), [
    (["a"], r"returned list, not a dict"),
    ({"text": ["a"], "n": [1, 2]}, r"unequal length \{'text': 1, 'n': 2\}"),
    ({"tokens": [[1]]}, r"neither 'input_ids' \(token ids\) nor 'text'"),
    ({"input_ids": [[1, -2]]}, r"input_ids\[0\]=\[1, -2\]"),
    ({"text": [3]}, r"text\[0\]=3: each entry must be a string"),
])
def test_a_map_result_that_cannot_be_packed_raises_map_error_naming_the_problem(tmp_path, result, match):
    names, _ = write(_dir(tmp_path), SPECS)
    ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2).map(lambda b: result, name="bad-map")
    with pytest.raises(MapError, match=match):
        next(iter(ds))


def test_a_row_map_equals_the_same_function_batched_and_a_second_map_is_refused(tmp_path):
    names, _ = write(_dir(tmp_path), SPECS)
    base = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=3, num_lanes=2, shuffle=True)
    rows = impl_rows(base.map(shout, batched=False))
    assert rows == impl_rows(base.map(shout_batch, batch_size=1))
    assert rows != impl_rows(base)
    assert base.batched_map is None and base.map(shout, batched=False).batched_map.batch_size == 1
    with pytest.raises(ConfigError, match="already mapped .* compose the functions into one"):
        base.map(shout_batch).map(shout_batch)


def test_a_state_of_another_map_or_of_no_map_is_refused_naming_both(tmp_path):
    names, _ = write(_dir(tmp_path), SPECS)
    base = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2, num_lanes=2)
    v1 = base.map(Repeat(1), batch_size=2, name="rep-v1")
    take(iter(v1), 1)
    state = v1.state_dict()
    with pytest.raises(StateError, match=r'"name": "rep-v1".*in the checkpoint.*"name": "rep-v2".* here'):
        base.map(Repeat(1), batch_size=2, name="rep-v2").load_state_dict(state)
    with pytest.raises(StateError, match=r"options \['map'\]"):
        StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=2, num_lanes=2).load_state_dict(state)
    with pytest.raises(StateError, match=r"no map in the checkpoint"):
        base.map(Repeat(1), batch_size=2, name="rep-v1").load_state_dict(base.state_dict())


@pytest.mark.clause("STREAM-20", "STREAM-17")
def test_skipped_lines_are_left_out_of_the_map_s_batches_as_the_reference_leaves_them(tmp_path):
    import warnings

    from reference.units import TextFile

    d = _dir(tmp_path)
    d.mkdir(parents=True)
    data = b'{"text": "ab cd"}\n{oops\n{"x": 1}\n{"text": "ef"}\n{"text": "gh ij kl"}\n\xff\n{"text": "m"}\n'
    path = d / "s.jsonl"
    path.write_bytes(data)
    ref_file = TextFile(path=str(path), data=data, format="jsonl", etag=str(path.stat().st_mtime_ns),
                        size=len(data))
    tok_path, tok, tok_id = tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in (Repeat(2), Regroup(3, True)):
            ds = StreamingDataset([str(path)], tokenizer=tok_path, seq_len=2, num_lanes=1, shuffle=True,
                                  shuffle_buffer_size=2, on_error="skip").map(fn, batch_size=2, name="m")
            ref = MappedReferenceLoader([ref_file], ds.config, tok, map=BatchedMap(function=fn, batch_size=2,
                                                                                   name="m"), tokenizer_id=tok_id)
            got = impl_rows(ds)
            assert got and got == ref_rows(ref)
            assert ds.skipped == {str(path): 3}


def _census_corpus(tmp_path):
    names, _ = write(_dir(tmp_path), [("jsonl", [[f"row {i} " + "w " * (i % 9) for i in range(60)]]),
                                      ("jsonl", [[f"row {i} " + "v " * (i % 7) for i in range(60, 120)]])])
    return names


def _counted_pass(names, rank, world, index_dir=None):
    """The input batches one pass of rank ``rank`` of ``world`` mapped, each with how often."""
    from conformance.impl_tests import stream_map_fns

    stream_map_fns.CALLS.clear()
    ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=8, num_lanes=4, unit_bytes=300, batch_size=2,
                          rank=rank, world_size=world, index_dir=index_dir)
    mapped = ds.map(stream_map_fns.CountCalls(), batched=True, batch_size=4, name="count-v1")
    assert sum(1 for _ in mapped) > 0
    return dict(stream_map_fns.CALLS)


@pytest.mark.clause("STREAM-12")
@pytest.mark.clause("STREAM-20")
def test_a_second_pass_of_the_same_epoch_order_maps_only_the_rank_s_own_input_batches_once(tmp_path):
    """A mapped lane's census (STREAM-12) is counted once per epoch order, in the process and under ``index_dir``.

    A first pass maps the other ranks' input batches once (to count them) and
    its own at most twice (count, then serve); a second pass of the same
    epoch order, in the same process or in a new one that reads
    ``index_dir``, maps only the batches it serves, each once. Before: every
    pass mapped every lane again for its census.
    """
    from impl import stream_maps

    forget = getattr(stream_maps, "_CENSUS", {}).clear      # this process's counts
    names = _census_corpus(tmp_path)
    every = set(_counted_pass(names, 0, 1))       # one rank alone maps every lane's batches, each once
    for world in (2, 4):
        for rank in range(world):
            index_dir = tmp_path / f"index-{world}-{rank}"
            forget()          # this process has counted nothing yet
            first = _counted_pass(names, rank, world, index_dir)
            assert set(first) == every and max(first.values()) <= 2, f"rank {rank} of {world}: {first}"
            served = {b for b, n in first.items() if n == 2}
            for where in ("memory", "index_dir"):
                if where == "index_dir":
                    forget()      # as a new process: only the files under index_dir remain
                second = _counted_pass(names, rank, world, index_dir)
                assert set(second.values()) == {1}, f"rank {rank} of {world} ({where}) mapped a batch twice"
                assert served <= set(second) < every, f"rank {rank} of {world} ({where}) mapped another rank's lane"


@pytest.mark.clause("STREAM-12")
def test_two_spawned_workers_of_a_rank_get_the_census_from_their_loader_and_map_no_batch_more_than_twice(tmp_path):
    """``build_dataloader`` counts a mapped rank's lanes once, before its K workers start, and hands them the counts.

    Before: each of the K workers ran the census itself, so a batch of the
    rank's own lanes was mapped K + 1 times and another rank's K times.
    """
    from conformance.impl_tests.stream_map_fns import LogCalls
    from impl.loader import build_dataloader

    names = _census_corpus(tmp_path)
    every = set(_counted_pass(names, 0, 1))
    log = tmp_path / "calls.txt"
    ds = StreamingDataset(names, tokenizer=tokenizer()[0], seq_len=8, num_lanes=4, unit_bytes=300, batch_size=2,
                          rank=0, world_size=2)
    mapped = ds.map(LogCalls(str(log)), batched=True, batch_size=4, name="log-v1")
    loader = build_dataloader(mapped, batch_size=2, rank=0, world_size=2, num_workers=2,
                              multiprocessing_context="spawn")
    assert sum(1 for _ in loader) > 0
    counts = Counter(tuple(line.split("\t")) for line in log.read_text().splitlines())
    assert set(counts) == every
    assert max(counts.values()) <= 2, f"{sum(n > 2 for n in counts.values())} input batches mapped more than twice"
