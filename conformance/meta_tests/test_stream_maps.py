"""Meta tests: reference.stream_maps obeys STREAM-20 and STREAM-21.

The oracle is written from the clause text: the lane's rows come from
``reference.ordering.buffer_shuffle``, are cut into batches here, the map is
called here and the documents are packed by ``reference.packing.pack``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
from conformance.meta_tests.test_streaming import configs, files, run, tok
from reference.errors import MapError, StateError
from reference.ordering import buffer_shuffle
from reference.packing import PackingConfig, pack
from reference.rng import Stream, derive_key, subkey
from reference.stream_maps import BatchedMap, MappedReferenceLoader, mapped_lane_samples
from reference.streaming import StreamingConfig, StreamingReferenceLoader, lane_rows, merge_states
from reference.units import TextFile, build_index, read_unit


@dataclass(frozen=True)
class Regroup:
    """Join a batch's texts and cut them into pieces of ``k`` characters: N rows to any M >= 0 outputs."""

    k: int
    ids: bool = False

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[object]]:
        joined = "".join(batch["text"])
        pieces = [joined[i:i + self.k] for i in range(0, len(joined), self.k)]
        if self.ids:
            return {"input_ids": [[10 + t for t in tok(p)] for p in pieces], "n": list(range(len(pieces)))}
        return {"text": pieces}


@dataclass(frozen=True)
class Repeat:
    """Each text ``r`` times (r = 0: no output)."""

    r: int

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        return {"text": [t for t in batch["text"] for _ in range(self.r)]}


@st.composite
def maps(draw):
    fn = draw(st.one_of(st.builds(Regroup, st.integers(1, 6), st.booleans()), st.builds(Repeat, st.integers(0, 3))))
    return BatchedMap(function=fn, batch_size=draw(st.integers(1, 4)), name=repr(fn))


def make(fs, config, fmap, world=1, rank=0, workers=0, batch=1):
    return MappedReferenceLoader(fs, config, tok, map=fmap, tokenizer_id="chars", world_size=world, rank=rank,
                                 num_workers=workers, batch_size=batch)


def oracle(fs, config, fmap, lane):
    """The lane's documents as STREAM-20 says, packed by PACK."""
    index = build_index(fs, config.unit_bytes)
    key = subkey(subkey(derive_key(config.seed, 0, Stream.STREAMING), 2), lane)
    rows = buffer_shuffle(lane_rows(index, config, 0, lane), config.shuffle_buffer_size, key)
    docs = []
    for first in range(0, len(rows), fmap.batch_size):
        texts = [read_unit(fs, index, u)[r] for u, r in rows[first:first + fmap.batch_size]]
        out = fmap.function({"text": texts})
        for ids in (out["input_ids"] if "input_ids" in out else [tok(t) for t in out["text"]]):
            docs.append((len(docs) * config.num_lanes + lane, list(ids)))
    return pack(docs, config.packing)


@pytest.mark.clause("STREAM-20")
@given(fs=files(), config=configs(), fmap=maps())
def test_a_mapped_lane_packs_the_outputs_of_its_input_batches_in_order(fs, config, fmap):
    for lane in range(config.num_lanes):
        assert_equal(mapped_lane_samples(fs, config, tok, fmap, 0, lane), oracle(fs, config, fmap, lane),
                     clause="STREAM-20", what=f"lane {lane} samples", repro={"files": fs, "config": config,
                                                                              "map": fmap})


@pytest.mark.clause("STREAM-20")
def test_the_worked_example_gives_blocks_across_input_batches():
    def blocks(batch):
        words = " ".join(batch["text"]).split()
        return {"text": [" ".join(words[i:i + 2]) for i in range(0, len(words), 2)]}

    fs = [TextFile(path="a.txt", data=b"a b\nc\nd e f\n")]
    got = mapped_lane_samples(fs, StreamingConfig(packing=PackingConfig(seq_len=2)),
                              lambda text: [ord(w) for w in text.split()], BatchedMap(function=blocks, batch_size=2,
                                                                                      name="blocks-v1"), 0, 0)
    assert_equal([(s.input_ids, s.doc_ids) for s in got], [((97, 98), (0, 0)), ((99, 100), (1, 2))],
                 clause="STREAM-20", what="samples of the worked example")


@pytest.mark.clause("STREAM-20")
@pytest.mark.parametrize(("result", "mentions"), [
    (["a"], ["list", "not a dict"]),
    ({"text": ["a"], "n": [1, 2]}, ["unequal length", "'text': 1", "'n': 2"]),
    ({"tokens": [[1]]}, ["neither 'input_ids'", "'text'"]),
    ({"input_ids": [[1, "x"]]}, ["input_ids[0]"]),
    ({"text": [3]}, ["text[0]=3", "string"]),
    ({"text": "abc"}, ["column 'text'", "str"]),
])
def test_a_map_result_that_cannot_be_packed_raises_map_error_naming_the_problem(result, mentions):
    fmap = BatchedMap(function=lambda batch: result, batch_size=2, name="bad-map")
    fs = [TextFile(path="a.txt", data=b"x\ny\n")]
    loader = make(fs, StreamingConfig(packing=PackingConfig(seq_len=1)), fmap)
    assert_raises_typed(MapError, lambda: list(loader), clause="STREAM-20", what=f"map result {result!r}",
                        mentions=["'bad-map'", *mentions])


@pytest.mark.clause("STREAM-20", "STREAM-17")
def test_a_batch_whose_rows_were_all_skipped_has_no_output_and_no_call():
    calls = []

    def echo(batch):
        calls.append(batch["text"])
        return {"text": batch["text"]}

    fs = [TextFile(path="s.jsonl", data=b'{oops\n{"text": "ab"}\n{"x": 1}\n{"text": "cd"}\n', format="jsonl")]
    config = StreamingConfig(packing=PackingConfig(seq_len=1), on_error="skip")
    got = mapped_lane_samples(fs, config, tok, BatchedMap(function=echo, batch_size=1, name="echo"), 0, 0)
    assert_equal(calls, [["ab"], ["cd"]], clause="STREAM-20", what="calls of the map")
    assert_equal([s.input_ids for s in got], [(1,), (2,), (3,)], clause="STREAM-20", what="samples")


@pytest.mark.clause("STREAM-21", "STREAM-15")
@given(fs=files(), config=configs(), fmap=maps(), workers=st.integers(0, 2), batch=st.integers(1, 2), data=st.data())
def test_a_mapped_stream_resumes_at_any_step_exactly_twice_in_a_row_and_across_epochs(fs, config, fmap, workers,
                                                                                     batch, data):
    assume(config.num_lanes % max(1, workers) == 0)
    horizon = 2 * len(list(make(fs, config, fmap, workers=workers, batch=batch))) + 2
    full = run(make(fs, config, fmap, workers=workers, batch=batch), horizon)
    k1 = data.draw(st.integers(0, len(full)))
    k2 = data.draw(st.integers(k1, len(full)))
    first = make(fs, config, fmap, workers=workers, batch=batch)
    head = run(first, k1)
    state = json.loads(json.dumps(first.state_dict()))
    check(len(json.dumps(state)) < 2000 + 200 * config.num_lanes * (1 + config.shuffle_buffer_size),
          clause="STREAM-21", what="state is not small")
    second = make(fs, config, fmap, workers=workers, batch=batch)
    second.load_state_dict(state)
    middle = run(second, k2 - k1)
    third = make(fs, config, fmap, workers=workers, batch=batch)
    third.load_state_dict(json.loads(json.dumps(second.state_dict())))
    rest = run(third, len(full) - k2)
    assert_equal(head + middle + rest, full, clause="STREAM-21", what=f"batches resumed at {k1} then {k2}",
                 repro={"files": fs, "config": config, "map": fmap, "workers": workers, "batch": batch})


@pytest.mark.clause("STREAM-21")
@given(fs=files(), config=configs(lanes=4), fmap=maps(), worlds=st.tuples(st.sampled_from([1, 2, 4]),
                                                                              st.sampled_from([1, 2, 4])),
       data=st.data())
def test_merged_mapped_states_resume_each_lane_where_it_stood_on_another_world_size(fs, config, fmap, worlds, data):
    a, b = worlds
    loaders = [make(fs, config, fmap, world=a, rank=r) for r in range(a)]
    steps = data.draw(st.integers(0, 3))
    iters = [iter(ld) for ld in loaders]
    head = [row for it in iters for _ in range(steps) for batch in [next(it, None)] if batch for row in batch]
    state = merge_states([ld.state_dict() for ld in loaders])
    assume(state["epoch"] == 0)
    seen = [(row.lane, row.index, row.sample) for row in head]
    for r in range(b):
        resumed = make(fs, config, fmap, world=b, rank=r)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        seen += [(row.lane, row.index, row.sample) for batch in resumed for row in batch]
    for lane in range(4):
        mine = sorted((i, s) for ln, i, s in seen if ln == lane)
        expected = mapped_lane_samples(fs, config, tok, fmap, 0, lane)
        assert_equal(mine, list(enumerate(expected))[:len(mine)], clause="STREAM-21",
                     what=f"lane {lane} across {a} -> {b} ranks")


@pytest.mark.clause("STREAM-21")
def test_the_worked_example_s_lane_state_names_the_batch_start_and_the_outputs_consumed():
    def blocks(batch):
        words = " ".join(batch["text"]).split()
        return {"text": [" ".join(words[i:i + 2]) for i in range(0, len(words), 2)]}

    fs = [TextFile(path="a.txt", data=b"a b\nc\nd e f\n")]
    config = StreamingConfig(packing=PackingConfig(seq_len=2))
    loader = MappedReferenceLoader(fs, config, lambda text: [ord(w) for w in text.split()],
                                   map=BatchedMap(function=blocks, batch_size=2, name="blocks-v1"),
                                   tokenizer_id="words")
    it = iter(loader)
    entries = []
    for _ in range(2):
        next(it)
        entries.append(loader.state_dict()["lanes"]["0"])
    assert_equal(entries, [
        {"unit": 0, "row": 0, "slots": [], "counter": 0, "flushed": 0, "output": 1, "offset": 0, "made": 0,
         "samples": 1},
        {"unit": 0, "row": 2, "slots": [], "counter": 0, "flushed": 0, "output": 0, "offset": 1, "made": 2,
         "samples": 2}], clause="STREAM-21", what="lane entries after each sample")
    assert_equal(loader.state_dict()["options"]["map"], {"name": "blocks-v1", "batch_size": 2}, clause="STREAM-21",
                 what="the map in the options")
    assert "a b" not in json.dumps(loader.state_dict())


@pytest.mark.clause("STREAM-21")
def test_a_state_of_another_map_or_of_no_map_is_refused_naming_both():
    fs = [TextFile(path="a.txt", data=b"abc\nd\nab\n", etag="1")]
    config = StreamingConfig(packing=PackingConfig(seq_len=1))
    v1 = BatchedMap(function=Repeat(1), batch_size=2, name="rep-v1")
    taken = make(fs, config, v1)
    next(iter(taken))
    state = taken.state_dict()
    cases = [(make(fs, config, BatchedMap(function=Repeat(1), batch_size=2, name="rep-v2")), ['"rep-v1"', '"rep-v2"']),
             (make(fs, config, BatchedMap(function=Repeat(1), batch_size=3, name="rep-v1")),
              ['"batch_size": 2', '"batch_size": 3'])]
    for loader, mentions in cases:
        assert_raises_typed(StateError, loader.load_state_dict, state, clause="STREAM-21", what="another map",
                            mentions=["the map", *mentions])
    plain = StreamingReferenceLoader(fs, config, tok, tokenizer_id="chars")
    assert_raises_typed(StateError, plain.load_state_dict, state, clause="STREAM-21", what="a mapped state, no map",
                        mentions=["options", "map"])
    assert_raises_typed(StateError, make(fs, config, v1).load_state_dict, plain.state_dict(), clause="STREAM-21",
                        what="a plain state, a map", mentions=["no map in the checkpoint", "rep-v1"])


@pytest.mark.clause("STREAM-21", "STREAM-15")
@given(fs=files(), config=configs(eos=True, lanes=1), map_batch=st.integers(1, 4), batch=st.integers(1, 3),
       data=st.data())
def test_a_mapped_resume_reads_only_the_batches_of_its_next_step_not_the_rows_before_it(fs, config, map_batch, batch,
                                                                                       data):
    fmap = BatchedMap(function=Repeat(1), batch_size=map_batch, name="rep")
    full = list(make(fs, config, fmap, batch=batch))
    assume(full)
    k = data.draw(st.integers(0, len(full) - 1))
    first = make(fs, config, fmap, batch=batch)
    run(first, k)
    resumed = make(fs, config, fmap, batch=batch)
    resumed.load_state_dict(first.state_dict())
    (nxt,) = run(resumed, 1)
    docs = {d for row in nxt for d in row.sample.doc_ids if d >= 0}
    # every output holds its EOS, so each input batch the step touches gives one of its documents or the label of
    # one of its samples' last token
    check(resumed.map_reader.reads <= map_batch * (len(docs) + len(nxt)), clause="STREAM-21",
          what=f"resume read {resumed.map_reader.reads} rows for a step of {len(docs)} documents in batches of "
               f"{map_batch}")
