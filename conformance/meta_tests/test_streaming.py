"""Meta tests: reference.units and reference.streaming obey STREAM-1..STREAM-17.

The oracles are written from the clause text: lines are found by scanning the
bytes, the lane's documents are packed by ``reference.packing.pack`` and the
buffer is ``reference.ordering.buffer_shuffle``, never by the code under test.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import SourceError, StateError, TopologyError
from reference.ordering import buffer_shuffle
from reference.packing import PackingConfig, pack
from reference.resume import PipelineConfig, epoch_samples
from reference.rng import Stream, derive_key, subkey
from reference.streaming import (
    StreamingConfig,
    StreamingReferenceLoader,
    buffered_rows,
    lane_rows,
    lane_samples,
    lane_units,
    lane_windows,
    merge_states,
    participant_lanes,
    token_corpus,
    unit_order,
    valid_world_sizes,
)
from reference.units import RowFile, TextFile, build_index, line_ranges, read_unit

words = st.text(alphabet="abcd ", max_size=7)


def tok(text):
    """A character tokenizer: every character is one token."""
    return [1 + "abcd ".index(c) for c in text]


@st.composite
def files(draw, max_files=3):
    out = []
    for i in range(draw(st.integers(1, max_files))):
        rows = draw(st.lists(words, max_size=7))
        kind = draw(st.sampled_from(["txt", "jsonl", "parquet", "gz"]))
        if kind == "parquet":
            cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=3)))
            bounds = [0, *cuts, len(rows)]
            out.append(RowFile(path=f"f{i}.parquet", groups=tuple(tuple(rows[a:b]) for a, b in itertools.pairwise(bounds)),
                               size=len(rows), etag="1"))
            continue
        lines = [json.dumps({"text": r}) for r in rows] if kind == "jsonl" else rows
        data = "".join(line + "\n" for line in lines).encode()
        out.append(TextFile(path=f"f{i}.{kind}", data=data, format="jsonl" if kind == "jsonl" else "txt",
                            compressed=kind == "gz", size=len(data) // 2 if kind == "gz" else None, etag="1"))
    return out


@st.composite
def configs(draw, eos=None, lanes=None, shuffled=None):
    add_eos = draw(st.booleans()) if eos is None else eos
    packing = PackingConfig(seq_len=draw(st.integers(1, 5)), mode=draw(st.sampled_from(["concat", "chunk"])),
                            add_eos=add_eos, eos_id=9 if add_eos else None)
    shuffle = draw(st.booleans()) if shuffled is None else shuffled
    return StreamingConfig(packing=packing, num_lanes=draw(st.sampled_from([1, 2, 4])) if lanes is None else lanes,
                           seed=draw(st.integers(0, 2**32)), shuffle=shuffle, unit_window=draw(st.integers(1, 3)),
                           shuffle_buffer_size=draw(st.integers(0, 4)) if shuffle else 0,
                           unit_bytes=draw(st.integers(1, 12)))


def oracle_lines(data):
    """(start, stop) of every line, stop one past its newline or at the end: scanning byte by byte."""
    spans, start = [], 0
    for i, byte in enumerate(data):
        if byte == ord("\n"):
            spans.append((start, i + 1))
            start = i + 1
    if start < len(data):
        spans.append((start, len(data)))
    return spans


def run(loader, steps):
    """The next ``steps`` batches across epochs; a pass that ends a resumed epoch may yield nothing (as RES-7)."""
    out, empty = [], 0
    while len(out) < steps and empty < 2:
        before = len(out)
        for batch in loader:
            out.append(batch)
            if len(out) == steps:
                break
        empty = empty + 1 if len(out) == before else 0
    return out


def make(fs, config, world=1, rank=0, workers=0, batch=1, tokenizer_id="chars"):
    return StreamingReferenceLoader(fs, config, tok, tokenizer_id=tokenizer_id, world_size=world, rank=rank,
                                    num_workers=workers, batch_size=batch)


@pytest.mark.clause("STREAM-1")
@given(data=st.lists(st.text(alphabet="ab\n", max_size=6), max_size=6).map(lambda p: "".join(p).encode()),
       target=st.integers(1, 10))
def test_every_line_of_a_text_file_lies_in_exactly_one_newline_aligned_unit(data, target):
    ranges = line_ranges(data, target)
    check([a for a, _ in ranges] + [len(data)] == [0, *[b for _, b in ranges]] if data else ranges == [],
          clause="STREAM-1", what=f"ranges {ranges} do not tile [0, {len(data)})", repro={"data": data})
    for k, (a, b) in enumerate(ranges):
        check(a == 0 or data[a - 1] == ord("\n"), clause="STREAM-1", what=f"range {k} starts mid-line")
        check(b == len(data) or data[b - 1] == ord("\n"), clause="STREAM-1", what=f"range {k} ends mid-line")
        check(k == len(ranges) - 1 or b - a >= target, clause="STREAM-1", what=f"range {k} shorter than {target}")
    owner = [[k for k, (a, b) in enumerate(ranges) if a <= s and e <= b] for s, e in oracle_lines(data)]
    check(all(len(o) == 1 for o in owner), clause="STREAM-1", what=f"lines not in exactly one range: {owner}",
          repro={"data": data, "target": target})


@pytest.mark.clause("STREAM-2")
@given(fs=files(), unit_bytes=st.integers(1, 12))
def test_the_rows_of_a_sources_units_are_its_lines_and_groups_in_order(fs, unit_bytes):
    index = build_index(fs, unit_bytes)
    for i, f in enumerate(fs):
        rows = [row for u, unit in enumerate(index.units) if unit.file == i for row in read_unit(fs, index, u)]
        if isinstance(f, RowFile):
            expected = [row for group in f.groups for row in group]
        else:
            lines = [f.data[a:b].rstrip(b"\n").decode() for a, b in oracle_lines(f.data)]
            expected = [json.loads(line)["text"] for line in lines] if f.format == "jsonl" else lines
        assert_equal(rows, expected, clause="STREAM-2", what=f"rows of {f.path}")


@pytest.mark.clause("STREAM-2")
def test_a_malformed_jsonl_line_is_refused_naming_the_file_and_its_byte_offset():
    f = TextFile(path="web.jsonl", data=b'{"text": "ok"}\nnot json\n', format="jsonl")
    assert_raises_typed(SourceError, read_unit, [f], build_index([f]), 0, clause="STREAM-2",
                        what="a line that is not JSON", mentions=["web.jsonl", "byte 15"])
    g = TextFile(path="t.txt", data=b"\xff\n")
    assert_raises_typed(SourceError, read_unit, [g], build_index([g]), 0, clause="STREAM-2",
                        what="bytes that are not UTF-8", mentions=["t.txt", "UTF-8"])


@pytest.mark.clause("STREAM-2")
def test_a_byte_order_mark_at_a_files_first_byte_is_not_text_in_txt_jsonl_or_gzip():
    import gzip

    bom = b"\xef\xbb\xbf"
    cases = [TextFile(path="a.txt", data=bom + b"hi\n\xef\xbb\xbfkept\n"),
             TextFile(path="b.jsonl", data=bom + b'{"text": "hi"}\n{"text": "\xef\xbb\xbfkept"}\n', format="jsonl"),
             TextFile(path="c.txt.gz", data=bom + b"hi\n\xef\xbb\xbfkept\n", compressed=True,
                      size=len(gzip.compress(bom + b"hi\n")))]
    for f in cases:
        for unit_bytes in (1, 1 << 20):
            index = build_index([f], unit_bytes)
            rows = [row for u in range(len(index.units)) for row in read_unit([f], index, u)]
            assert_equal(rows, ["hi", "\ufeffkept"], clause="STREAM-2",
                         what=f"rows of {f.path} behind a BOM (unit_bytes={unit_bytes}): only the file's first "
                              "bytes are a mark, a BOM inside the text is text")
    bad = TextFile(path="d.jsonl", data=bom + b"not json\n", format="jsonl")
    assert_raises_typed(SourceError, read_unit, [bad], build_index([bad]), 0, clause="STREAM-2",
                        what="a bad first line behind a BOM", mentions=["d.jsonl", "byte 3"])


@pytest.mark.clause("STREAM-3", "STREAM-4")
def test_a_compressed_file_is_one_unit_and_each_row_group_is_one():
    gz = TextFile(path="a.txt.gz", data=b"p\nq\nr\n", compressed=True, size=5)
    pq = RowFile(path="b.parquet", groups=(("x", "y"), (), ("z",)), size=9)
    index = build_index([gz, pq], unit_bytes=1)
    assert_equal([(u.file, u.start, u.stop, u.rows) for u in index.units],
                 [(0, 0, 6, 3), (1, 0, 1, 2), (1, 1, 2, 0), (1, 2, 3, 1)], clause="STREAM-3", what="units")
    assert_equal(index.files[0][3], 5, clause="STREAM-3", what="the compressed file's indexed size")
    assert_equal(len(build_index([TextFile(path="a.txt", data=gz.data)], unit_bytes=1).units), 3,
                 clause="STREAM-3", what="units of the same bytes uncompressed")


@pytest.mark.clause("STREAM-5")
def test_the_index_fingerprint_is_the_sha256_of_its_canonical_json_and_covers_each_files_identity():
    base = [TextFile(path="a.txt", data=b"x\ny\n", etag="1"), RowFile(path="b.parquet", groups=(("z",),), size=3)]
    index = build_index(base, 2)
    expected = hashlib.sha256(json.dumps(index.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert_equal(index.fingerprint, expected, clause="STREAM-5", what="fingerprint")
    variants = {"etag": [TextFile(path="a.txt", data=b"x\ny\n", etag="2"), base[1]],
                "size": [base[0], RowFile(path="b.parquet", groups=(("z",),), size=4)],
                "order": [base[1], base[0]], "removed": [base[0]]}
    for name, fs in variants.items():
        check(build_index(fs, 2).fingerprint != index.fingerprint, clause="STREAM-5", what=f"{name} not covered")
    check(build_index(base, 1).fingerprint != index.fingerprint, clause="STREAM-5", what="unit_bytes not covered")


@pytest.mark.clause("STREAM-6")
@given(n=st.integers(8, 40), seed=st.integers(0, 2**32), epoch=st.integers(0, 100), lanes=st.integers(1, 5))
def test_the_unit_order_is_a_permutation_dealt_to_lanes_that_changes_with_seed_and_epoch(n, seed, epoch, lanes):
    config = StreamingConfig(packing=PackingConfig(seq_len=2), shuffle=True, seed=seed, num_lanes=lanes)
    order = unit_order(n, config, epoch)
    assert_exactly_once(order, range(n), clause="STREAM-6", what="unit order")
    other_seed = StreamingConfig(packing=PackingConfig(seq_len=2), shuffle=True, seed=seed + 1, num_lanes=lanes)
    check(order != unit_order(n, config, epoch + 1), clause="STREAM-6", what="the epoch does not change the order")
    check(order != unit_order(n, other_seed, epoch), clause="STREAM-6", what="the seed does not change the order")
    dealt = [lane_units(n, config, epoch, lane) for lane in range(lanes)]
    for lane, units in enumerate(dealt):
        assert_equal(units, [order[p] for p in range(lane, n, lanes)], clause="STREAM-6", what=f"lane {lane}")


@pytest.mark.clause("STREAM-7")
@given(fs=files(), config=configs(shuffled=True))
def test_a_lane_reads_each_window_of_units_whole_and_shuffled(fs, config):
    index = build_index(fs, config.unit_bytes)
    for lane in range(config.num_lanes):
        units = lane_units(len(index.units), config, 0, lane)
        windows = lane_windows(index, config, 0, lane)
        for j, window in enumerate(windows):
            mine = units[j * config.unit_window:(j + 1) * config.unit_window]
            assert_exactly_once(window, [(u, r) for u in mine for r in range(index.units[u].rows)],
                                clause="STREAM-7", what=f"lane {lane} window {j}")


@pytest.mark.clause("STREAM-7")
def test_rows_of_a_unit_come_in_a_keyed_order_when_shuffling():
    index = build_index([RowFile(path="p", groups=(tuple("abcdefghij"),))])
    orders = {tuple(lane_rows(index, StreamingConfig(packing=PackingConfig(seq_len=2), shuffle=s, seed=3), e, 0))
              for s, e in ((True, 0), (True, 1))}
    plain = lane_rows(index, StreamingConfig(packing=PackingConfig(seq_len=2)), 0, 0)
    check(len(orders) == 2 and tuple(plain) not in orders, clause="STREAM-7", what=f"rows not shuffled: {orders}")


@pytest.mark.clause("STREAM-8")
@given(n=st.integers(0, 30), size=st.integers(0, 8), seed=st.integers(0, 2**32))
def test_the_buffered_shuffle_emits_each_row_once_never_before_it_arrives_as_ord_6(n, size, seed):
    rows = [(r // 3, r % 3) for r in range(n)]
    key = subkey(derive_key(seed, 0, Stream.STREAMING), 2)
    out = buffered_rows(rows, size, key)
    assert_exactly_once(out, rows, clause="STREAM-8", what="buffered rows")
    assert_equal(out, buffer_shuffle(rows, size, key), clause="STREAM-8", what="buffered rows vs ORD-6/ORD-7")
    for p, row in enumerate(out):
        check(rows.index(row) <= p + max(size, 1) - 1, clause="STREAM-8", what=f"row {row} emitted at {p} too early")


@pytest.mark.clause("STREAM-9")
@given(fs=files(), config=configs())
def test_a_lanes_samples_are_its_buffered_rows_tokenized_and_packed(fs, config):
    index = build_index(fs, config.unit_bytes)
    starts = index.row_starts()
    for lane in range(config.num_lanes):
        key = subkey(subkey(derive_key(config.seed, 0, Stream.STREAMING), 2), lane)
        rows = buffer_shuffle(lane_rows(index, config, 0, lane), config.shuffle_buffer_size, key)
        docs = [(starts[u] + r, tok(read_unit(fs, index, u)[r])) for u, r in rows]
        assert_equal(lane_samples(fs, config, tok, 0, lane), pack(docs, config.packing), clause="STREAM-9",
                     what=f"lane {lane} samples", repro={"files": fs, "config": config})


@pytest.mark.clause("STREAM-10")
@given(lanes=st.sampled_from([1, 2, 3, 4, 6, 8, 12]), world=st.integers(1, 12), workers=st.integers(0, 3))
def test_ranks_and_workers_own_whole_lanes_and_other_world_sizes_are_refused_listing_the_valid(lanes, world, workers):
    owners = world * max(1, workers)
    if lanes % owners:
        err = assert_raises_typed(TopologyError, participant_lanes, lanes, world, workers, 0, 0, clause="STREAM-10",
                                  what="an invalid world size", mentions=[f"world_size={world}"])
        check(str(valid_world_sizes(lanes, workers)) in str(err), clause="STREAM-10", what="valid sizes not listed")
        check(world not in valid_world_sizes(lanes, workers), clause="STREAM-10", what="refused a listed size")
        return
    owned = [lane for r in range(world) for w in range(max(1, workers))
             for lane in participant_lanes(lanes, world, workers, r, w)]
    assert_exactly_once(owned, range(lanes), clause="STREAM-10", what="lanes over ranks and workers")


def all_ranks(fs, config, world, workers, batch, state=None, steps=None):
    loaders = [make(fs, config, world, r, workers, batch) for r in range(world)]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
    iterators = [iter(ld) for ld in loaders]
    batches = []
    while steps is None or len(batches) < steps:
        step = [next(it, None) for it in iterators]
        check(all(b is None for b in step) or all(b is not None for b in step), clause="STREAM-12",
              what="ranks took different numbers of steps")
        if step[0] is None:
            break
        batches.append(step)
    return batches, merge_states([ld.state_dict() for ld in loaders])


@pytest.mark.clause("STREAM-11", "STREAM-12")
@given(fs=files(), config=configs(), world=st.sampled_from([1, 2, 4]), batch=st.integers(1, 3))
def test_all_ranks_take_the_same_steps_and_together_see_each_lane_sample_at_most_once(fs, config, world, batch):
    assume(config.num_lanes % world == 0)
    batches, _ = all_ranks(fs, config, world, 0, batch)
    seen = [(row.lane, row.index) for step in batches for b in step for row in b]
    check(len(seen) == len(set(seen)), clause="STREAM-11", what="a sample seen twice")
    per_lane = [lane_samples(fs, config, tok, 0, lane) for lane in range(config.num_lanes)]
    expected_steps = min(sum(len(per_lane[lane]) for lane in participant_lanes(config.num_lanes, world, 0, r, 0))
                         // batch for r in range(world))
    assert_equal(len(batches), expected_steps, clause="STREAM-12", what="steps of the epoch")
    for step in batches:
        for b in step:
            for row in b:
                assert_equal(row.sample, per_lane[row.lane][row.index], clause="STREAM-11", what="a sample's content")
    for lane in range(config.num_lanes):
        indices = [i for ln, i in seen if ln == lane]
        assert_equal(sorted(indices), list(range(len(indices))), clause="STREAM-11", what=f"lane {lane} prefix")


@pytest.mark.clause("STREAM-13", "STREAM-15")
@given(fs=files(), config=configs(), workers=st.integers(0, 2), batch=st.integers(1, 2), data=st.data())
def test_resume_at_any_step_equals_the_uninterrupted_stream_twice_in_a_row_and_across_epochs(fs, config, workers,
                                                                                           batch, data):
    assume(config.num_lanes % max(1, workers) == 0)
    horizon = 2 * len(list(make(fs, config, workers=workers, batch=batch))) + 2
    full = run(make(fs, config, workers=workers, batch=batch), horizon)
    k1 = data.draw(st.integers(0, len(full)))
    k2 = data.draw(st.integers(k1, len(full)))
    first = make(fs, config, workers=workers, batch=batch)
    head = run(first, k1)
    state = json.loads(json.dumps(first.state_dict()))
    check(len(json.dumps(state)) < 2000 + 200 * config.num_lanes * (1 + config.shuffle_buffer_size),
          clause="STREAM-13", what="state is not small")
    second = make(fs, config, workers=workers, batch=batch)
    second.load_state_dict(state)
    middle = run(second, k2 - k1)
    third = make(fs, config, workers=workers, batch=batch)
    third.load_state_dict(json.loads(json.dumps(second.state_dict())))
    rest = run(third, len(full) - k2)
    assert_equal(head + middle + rest, full, clause="STREAM-15", what=f"batches resumed at {k1} then {k2}",
                 repro={"files": fs, "config": config, "workers": workers, "batch": batch})


@pytest.mark.clause("STREAM-15")
@given(fs=files(), config=configs(eos=True, lanes=1), batch=st.integers(1, 3), data=st.data())
def test_a_resume_reads_only_the_rows_of_its_next_batch_not_the_rows_before_it(fs, config, batch, data):
    full = list(make(fs, config, batch=batch))
    assume(full)
    k = data.draw(st.integers(0, len(full) - 1))
    first = make(fs, config, batch=batch)
    run(first, k)
    resumed = make(fs, config, batch=batch)
    resumed.load_state_dict(first.state_dict())
    (nxt,) = run(resumed, 1)
    docs = {d for row in nxt for d in row.sample.doc_ids if d >= 0}
    check(resumed.reader.reads <= len(docs) + batch, clause="STREAM-15",
          what=f"resume read {resumed.reader.reads} rows for a batch of {len(docs)} documents")


@pytest.mark.clause("STREAM-14", "STREAM-15")
@given(fs=files(), config=configs(lanes=4), worlds=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
       batch=st.integers(1, 2), data=st.data())
def test_merged_rank_states_resume_exactly_on_the_same_and_on_another_world_size(fs, config, worlds, batch, data):
    a, b = worlds
    full, _ = all_ranks(fs, config, a, 0, batch)
    k = data.draw(st.integers(0, len(full)))
    head, state = all_ranks(fs, config, a, 0, batch, steps=k)
    same, _ = all_ranks(fs, config, a, 0, batch, state=json.loads(json.dumps(state)))
    assert_equal(head + same, full, clause="STREAM-14", what=f"steps after resuming merged states at {k}")
    if state["epoch"] != 0:
        return
    other, _ = all_ranks(fs, config, b, 0, batch, state=state)
    seen = [(row.lane, row.index, row.sample) for step in head + other for bt in step for row in bt]
    for lane in range(4):
        mine = [(i, s) for ln, i, s in seen if ln == lane]
        expected = lane_samples(fs, config, tok, 0, lane)
        assert_equal(mine, list(enumerate(expected))[:len(mine)], clause="STREAM-15",
                     what=f"lane {lane} across {a} -> {b} ranks")


@pytest.mark.clause("STREAM-14")
def test_merge_states_refuses_states_of_different_steps_and_a_partial_state_is_refused():
    fs = [RowFile(path="p", groups=(("ab", "cd"), ("abcd",)))]
    config = StreamingConfig(packing=PackingConfig(seq_len=1), num_lanes=2)
    r0, r1 = make(fs, config, world=2, rank=0), make(fs, config, world=2, rank=1)
    s0 = r0.state_dict()
    next(iter(r0))
    assert_raises_typed(StateError, merge_states, [r0.state_dict(), r0.state_dict()], clause="STREAM-14",
                        what="the same lane twice", mentions=["lane 0", "two states"])
    assert_raises_typed(StateError, make(fs, config).load_state_dict, s0, clause="STREAM-14",
                        what="a rank's state alone", mentions=["merge_states"])
    merged = merge_states([s0, r1.state_dict()])
    assert_equal(sorted(merged["lanes"]), ["0", "1"], clause="STREAM-14", what="merged lanes")


@pytest.mark.clause("STREAM-15")
def test_a_state_from_another_tokenizer_options_or_data_is_refused_naming_what_differs():
    fs = [TextFile(path="a.txt", data=b"abc\nd\n", etag="1")]
    config = StreamingConfig(packing=PackingConfig(seq_len=2))
    state = make(fs, config).state_dict()
    cases = [(make(fs, config, tokenizer_id="bpe-v2"), ["tokenizer", "'chars'", "'bpe-v2'"]),
             (make(fs, StreamingConfig(packing=PackingConfig(seq_len=3))), ["options", "packing"]),
             (make([TextFile(path="a.txt", data=b"abc\nd\n", etag="2")], config), ["unit index"])]
    for loader, mentions in cases:
        assert_raises_typed(StateError, loader.load_state_dict, state, clause="STREAM-15", what="a foreign state",
                            mentions=mentions)


@pytest.mark.clause("STREAM-16")
@given(fs=files(), config=configs(lanes=1, shuffled=False))
def test_without_shuffling_one_lane_streams_the_token_stores_epoch(fs, config):
    expected = epoch_samples(token_corpus(fs, config, tok), PipelineConfig(packing=config.packing), 0)
    assert_equal(lane_samples(fs, config, tok, 0, 0), expected, clause="STREAM-16", what="samples")
    got = [row.sample for b in make(fs, config) for row in b]
    assert_equal(got, expected, clause="STREAM-16", what="loader samples")
    check(Counter(d for s in got for d in s.doc_ids if d >= 0).keys() <= set(range(10**6)), clause="STREAM-16",
          what="document ids")


BAD_LINES = (b"{oops", b'{"body": "x"}', b'{"text": 3}', b"\xff\xfe")


@st.composite
def dirty_jsonl(draw):
    """One jsonl file whose lines are good rows or bad lines of every kind STREAM-2 refuses; which are bad."""
    lines, bad = [], []
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(BAD_LINES)))
            bad.append(i)
        else:
            lines.append(json.dumps({"text": draw(words)}).encode())
    return TextFile(path="s.jsonl", data=b"".join(line + b"\n" for line in lines), format="jsonl", etag="1"), bad


@pytest.mark.clause("STREAM-17")
@given(source=dirty_jsonl(), config=configs(), data=st.data())
def test_skip_drops_each_bad_line_in_its_place_counts_it_and_resumes_at_the_same_places(source, config, data):
    file, bad = source
    skip = StreamingConfig(**{**{k: getattr(config, k) for k in config.__dataclass_fields__}, "on_error": "skip"})
    if bad:
        assert_raises_typed(SourceError, lambda: list(make([file], config)), clause="STREAM-17",
                            what="the default on_error", mentions=["s.jsonl"])
    index = build_index([file], skip.unit_bytes)
    starts = index.row_starts()
    for lane in range(skip.num_lanes):
        key = subkey(subkey(derive_key(skip.seed, 0, Stream.STREAMING), 2), lane)
        rows = buffer_shuffle(lane_rows(index, skip, 0, lane), skip.shuffle_buffer_size, key)
        docs = [(starts[u] + r, tok(json.loads(file.data.split(b"\n")[starts[u] + r])["text"])) for u, r in rows
                if starts[u] + r not in bad]
        assert_equal(lane_samples([file], skip, tok, 0, lane), pack(docs, skip.packing), clause="STREAM-17",
                     what=f"lane {lane} samples with bad lines skipped", repro={"file": file, "config": skip})
    loader = make([file], skip)
    full = list(loader)
    bad_ids = {(u, r) for u, unit in enumerate(index.units) for r in range(unit.rows) if starts[u] + r in bad}
    check(loader.reader.skipped <= bad_ids and loader._census.skipped == bad_ids, clause="STREAM-17",
          what=f"skipped {loader._census.skipped} in the census, bad rows {bad_ids}", repro={"file": file})
    k = data.draw(st.integers(0, len(full)))
    first = make([file], skip)
    run(first, k)
    resumed = make([file], skip)
    resumed.load_state_dict(first.state_dict())
    assert_equal(run(resumed, len(full) - k), full[k:], clause="STREAM-17", what="resume past skipped lines",
                 repro={"file": file, "config": skip, "k": k})
