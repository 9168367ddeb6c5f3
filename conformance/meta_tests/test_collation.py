"""Meta tests: reference.collation obeys COLL-1..COLL-11.

Oracles are built position by position from the row lengths (which position is
real, which is padding), never by calling one reference function to check
another.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
from reference.collation import (
    IGNORE_INDEX,
    SIDES,
    attention_mask,
    collate_samples,
    cu_seqlens,
    pad_stack_1d,
    token_pooling_mask,
)
from reference.errors import ConfigError

rows = st.lists(st.lists(st.integers(min_value=1, max_value=99), max_size=9), min_size=1, max_size=6)
sides = st.sampled_from(SIDES)
multiples = st.one_of(st.none(), st.integers(min_value=1, max_value=8))


def _real_positions(length: int, width: int, side: str) -> list[int]:
    """Where a row of ``length`` real tokens sits in ``width`` slots: counted from the padded side."""
    offset = 0 if side == "right" else width - length
    return [offset + j for j in range(length)]


@pytest.mark.clause("COLL-1")
def test_d9d_documentation_example_pads_right_and_left():
    items = [[1, 2, 3], [4], [5, 6]]
    assert_equal(pad_stack_1d(items, 0), [[1, 2, 3], [4, 0, 0], [5, 6, 0]], clause="COLL-1", what="right padding")
    assert_equal(pad_stack_1d(items, 0, side="left"), [[1, 2, 3], [0, 0, 4], [0, 5, 6]], clause="COLL-1",
                 what="left padding")
    assert_equal(pad_stack_1d(items, -1, pad_to_multiple_of=4), [[1, 2, 3, -1], [4, -1, -1, -1], [5, 6, -1, -1]],
                 clause="COLL-1", what="right padding to a multiple of 4")
    assert_equal(pad_stack_1d([[1, 2, 3, 4]], 0, pad_to_multiple_of=4), [[1, 2, 3, 4]], clause="COLL-1",
                 what="a length already at the multiple is not padded further")


@pytest.mark.clause("COLL-1")
@given(items=rows, side=sides, multiple=multiples)
def test_padded_rows_keep_their_items_in_order_at_the_rounded_up_width(items, side, multiple):
    out = pad_stack_1d(items, 0, side=side, pad_to_multiple_of=multiple)
    longest, m = max(len(r) for r in items), multiple or 1
    repro = {"items": items, "side": side, "pad_to_multiple_of": multiple}
    width = longest
    while width % m:
        width += 1
    for i, (row, original) in enumerate(zip(out, items, strict=True)):
        assert_equal(len(row), width, clause="COLL-1", what=f"width of row {i}", repro=repro)
        real = _real_positions(len(original), width, side)
        assert_equal([row[p] for p in real], list(original), clause="COLL-1", what=f"real tokens of row {i}",
                     repro=repro)
        check(all(row[p] == 0 for p in range(width) if p not in real), clause="COLL-1",
              what=f"row {i}={row} has a non-pad value outside its tokens", repro=repro)


@pytest.mark.clause("COLL-2")
def test_padding_without_a_shape_is_refused():
    assert_raises_typed(ConfigError, pad_stack_1d, [], 0, clause="COLL-2", what="empty items", mentions=["items"])
    for bad in (0, -8):
        assert_raises_typed(ConfigError, pad_stack_1d, [[1]], 0, pad_to_multiple_of=bad, clause="COLL-2",
                            what=f"pad_to_multiple_of={bad}", mentions=[f"pad_to_multiple_of={bad}"])
    assert_raises_typed(ConfigError, pad_stack_1d, [[1]], 0, side="both", clause="COLL-2", what="side='both'",
                        mentions=["side", "left"])


lengths_lists = st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=6)


@pytest.mark.clause("COLL-3")
@given(lengths=lengths_lists, side=sides, extra=st.one_of(st.none(), st.integers(min_value=0, max_value=4)))
def test_attention_mask_is_one_exactly_at_the_real_positions(lengths, side, extra):
    total = None if extra is None else max(lengths) + extra
    mask = attention_mask(lengths, side=side, total=total)
    width = max(lengths) if total is None else total
    repro = {"lengths": lengths, "side": side, "total": total}
    for i, length in enumerate(lengths):
        real = set(_real_positions(length, width, side))
        assert_equal(mask[i], [1 if p in real else 0 for p in range(width)], clause="COLL-3", what=f"mask row {i}",
                     repro=repro)
    padded = pad_stack_1d([[7] * n for n in lengths], 0, side=side)
    if total is None:
        assert_equal(mask, [[1 if v == 7 else 0 for v in row] for row in padded], clause="COLL-3",
                     what="mask vs pad_stack_1d layout", repro=repro)


@pytest.mark.clause("COLL-3")
def test_attention_mask_narrower_than_the_longest_row_is_refused():
    assert_equal(attention_mask([2, 1], side="left", total=4), [[0, 0, 1, 1], [0, 0, 0, 1]], clause="COLL-3",
                 what="hand example")
    assert_raises_typed(ConfigError, attention_mask, [3, 1], total=2, clause="COLL-3", what="total=2 < 3",
                        mentions=["total=2"])


def _oracle_pooling(lengths: list[int], width: int, side: str, pooling: str) -> list[list[int]]:
    out = []
    for length in lengths:
        real = _real_positions(length, width, side)
        chosen = {"first": real[:1], "last": real[-1:], "all": real}[pooling]
        out.append([1 if p in chosen else 0 for p in range(width)])
    return out


@pytest.mark.clause("COLL-4", "COLL-5", "COLL-6", "COLL-7")
@given(lengths=lengths_lists, side=sides, pooling=st.sampled_from(["first", "last", "all"]))
def test_pooling_selects_exactly_the_intended_positions_under_left_and_right_padding(lengths, side, pooling):
    width = max(lengths)
    pooled = token_pooling_mask(attention_mask(lengths, side=side), pooling)
    clause = {"first": "COLL-4", "last": "COLL-5", "all": "COLL-6"}[pooling]
    repro = {"lengths": lengths, "side": side, "pooling": pooling}
    assert_equal(pooled, _oracle_pooling(lengths, width, side, pooling), clause=clause, what="pooling mask", repro=repro)
    for i, length in enumerate(lengths):
        if length == 0:
            assert_equal(pooled[i], [0] * width, clause="COLL-7", what=f"pooling of empty row {i}", repro=repro)


@pytest.mark.clause("COLL-4", "COLL-5")
def test_first_token_pooling_under_left_padding_does_not_pick_position_zero():
    mask = attention_mask([3, 1, 2], side="left")
    assert_equal(token_pooling_mask(mask, "first"), [[1, 0, 0], [0, 0, 1], [0, 1, 0]], clause="COLL-4",
                 what="first under left padding")
    assert_equal(token_pooling_mask(mask, "last"), [[0, 0, 1], [0, 0, 1], [0, 0, 1]], clause="COLL-5",
                 what="last under left padding")
    assert_equal(token_pooling_mask(attention_mask([3, 1, 2]), "last"), [[0, 0, 1], [1, 0, 0], [0, 1, 0]],
                 clause="COLL-5", what="last under right padding")


@pytest.mark.clause("COLL-7")
def test_rows_without_real_tokens_pool_nothing_and_non_binary_masks_are_refused():
    for pooling in ("first", "last", "all"):
        assert_equal(token_pooling_mask([[0, 0, 0]], pooling), [[0, 0, 0]], clause="COLL-7", what=f"{pooling} of zeros")
    assert_raises_typed(ConfigError, token_pooling_mask, [[0, 2, 1]], "first", clause="COLL-7", what="mask with 2",
                        mentions=["attention_mask[0]"])
    assert_raises_typed(ConfigError, token_pooling_mask, [[1]], "mean", clause="COLL-7", what="pooling='mean'",
                        mentions=["pooling='mean'"])


documents = st.lists(st.integers(min_value=1, max_value=6), max_size=6)


@pytest.mark.clause("COLL-8")
@given(doc_lengths=documents, carried=st.integers(min_value=0, max_value=5))
def test_cu_seqlens_recovers_the_packed_document_lengths(doc_lengths, carried):
    position_ids = [carried + j for j in range(doc_lengths[0])] if doc_lengths else []
    position_ids += [j for n in doc_lengths[1:] for j in range(n)]
    boundaries = cu_seqlens(position_ids)
    repro = {"doc_lengths": doc_lengths, "carried": carried, "position_ids": position_ids}
    expected = [0]
    for n in doc_lengths:
        expected.append(expected[-1] + n)
    assert_equal(boundaries, expected, clause="COLL-8", what="cu_seqlens", repro=repro)
    check(all(a < b for a, b in itertools.pairwise(boundaries)), clause="COLL-8",
          what="boundaries are not strictly increasing", repro=repro)
    assert_equal(boundaries[-1], len(position_ids), clause="COLL-8", what="last boundary", repro=repro)


@pytest.mark.clause("COLL-8")
def test_hand_computed_cu_seqlens():
    assert_equal(cu_seqlens([0, 1, 2, 0, 1, 0]), [0, 3, 5, 6], clause="COLL-8", what="three documents")
    assert_equal(cu_seqlens([7, 8, 0, 1]), [0, 2, 4], clause="COLL-8", what="a continued document first")
    assert_equal(cu_seqlens([]), [0], clause="COLL-8", what="empty row")
    assert_raises_typed(ConfigError, cu_seqlens, [0, -1], clause="COLL-8", what="negative position",
                        mentions=["position_ids[1]"])


@st.composite
def padded_rows(draw):
    """A row as parts: ``("doc", id, n)`` pieces with distinct ids and ``("pad", -1, n)`` runs, never two runs adjacent."""
    parts: list[tuple[str, int, int]] = []
    for doc_id in range(draw(st.integers(min_value=0, max_value=5))):
        if draw(st.booleans()) and (not parts or parts[-1][0] != "pad"):
            parts.append(("pad", -1, draw(st.integers(min_value=1, max_value=5))))
        parts.append(("doc", doc_id, draw(st.integers(min_value=1, max_value=5))))
    if draw(st.booleans()) and (not parts or parts[-1][0] != "pad"):
        parts.append(("pad", -1, draw(st.integers(min_value=1, max_value=7))))
    carried = draw(st.integers(min_value=0, max_value=4))
    return parts, carried


def row_fields(parts, carried):
    """``position_ids`` and ``doc_ids`` of the parts: a first document continued from ``carried``; padding at 0 / -1."""
    position_ids: list[int] = []
    doc_ids: list[int] = []
    for k, (kind, doc_id, n) in enumerate(parts):
        first = carried if k == 0 and kind == "doc" else 0
        position_ids += [first + j if kind == "doc" else 0 for j in range(n)]
        doc_ids += [doc_id] * n
    return position_ids, doc_ids


@pytest.mark.clause("COLL-11")
@given(row=padded_rows())
def test_each_document_and_each_padding_run_is_one_segment(row):
    parts, carried = row
    position_ids, doc_ids = row_fields(parts, carried)
    repro = {"parts": parts, "carried": carried}
    expected = [0]
    for _, _, n in parts:
        expected.append(expected[-1] + n)
    assert_equal(cu_seqlens(position_ids, doc_ids), expected, clause="COLL-11", what="cu_seqlens", repro=repro)
    documents = sum(1 for kind, _, _ in parts if kind == "doc")
    runs = sum(1 for kind, _, _ in parts if kind == "pad")
    assert_equal(len(expected) - 1, documents + runs, clause="COLL-11", what="segments", repro=repro)


@pytest.mark.clause("COLL-11")
def test_hand_computed_cu_seqlens_with_padding():
    assert_equal(cu_seqlens([0, 1, 0, 0, 0, 0], [4, 4, 5, -1, -1, -1]), [0, 2, 3, 6], clause="COLL-11",
                 what="two documents then one padding run")
    assert_equal(cu_seqlens([0, 1, 0, 0, 0, 0]), [0, 2, 3, 4, 5, 6], clause="COLL-11", what="without doc_ids")
    assert_equal(cu_seqlens([0, 0, 0], [-1, -1, -1]), [0, 3], clause="COLL-11", what="a row of padding")
    assert_equal(cu_seqlens([0, 0, 0, 1], [-1, -1, 2, 2]), [0, 2, 4], clause="COLL-11", what="left padding")
    assert_raises_typed(ConfigError, cu_seqlens, [0, 1], [3], clause="COLL-11", what="short doc_ids",
                        mentions=["doc_ids has 1", "position_ids has 2"])
    assert_raises_typed(ConfigError, cu_seqlens, [0, 1], [3, -2], clause="COLL-11", what="doc id -2",
                        mentions=["doc_ids[1]=-2"])


@st.composite
def sample_batches(draw):
    fields = ["input_ids"] + draw(st.lists(st.sampled_from(["labels", "position_ids", "doc_ids"]), unique=True))
    batch = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        n = draw(st.integers(min_value=0, max_value=7))
        batch.append({f: draw(st.lists(st.integers(min_value=0, max_value=50), min_size=n, max_size=n)) for f in fields})
    return batch


@pytest.mark.clause("COLL-9")
@given(samples=sample_batches(), pad_id=st.integers(min_value=0, max_value=3))
def test_collated_fields_are_right_padded_with_their_own_pad_values(samples, pad_id):
    out = collate_samples(samples, pad_id=pad_id)
    width = max(len(s["input_ids"]) for s in samples)
    pads = {"input_ids": pad_id, "labels": IGNORE_INDEX, "position_ids": 0, "doc_ids": -1}
    repro = {"samples": samples, "pad_id": pad_id}
    assert_equal(sorted(out), sorted(list(samples[0]) + ["attention_mask"]), clause="COLL-9", what="output fields",
                 repro=repro)
    for field in samples[0]:
        expected = [list(s[field]) + [pads[field]] * (width - len(s[field])) for s in samples]
        assert_equal(out[field], expected, clause="COLL-9", what=field, repro=repro)
    assert_equal(out["attention_mask"], [[1] * len(s["input_ids"]) + [0] * (width - len(s["input_ids"])) for s in samples],
                 clause="COLL-9", what="attention_mask", repro=repro)


@pytest.mark.clause("COLL-9")
def test_an_empty_sample_collates_to_a_fully_masked_padding_row():
    out = collate_samples([{"input_ids": [5, 6], "labels": [6, 7]}, {"input_ids": [], "labels": []}], pad_id=0)
    assert_equal(out, {"input_ids": [[5, 6], [0, 0]], "labels": [[6, 7], [-100, -100]],
                       "attention_mask": [[1, 1], [0, 0]]}, clause="COLL-9", what="batch with a padding sample")


@pytest.mark.clause("COLL-10")
def test_samples_that_would_be_silently_corrupted_are_refused():
    cases = [
        ([], ["samples"]),
        ([{"labels": [1]}], ["input_ids"]),
        ([{"input_ids": [1], "sample_id": [3]}], ["sample_id"]),
        ([{"input_ids": [1], "labels": [1]}, {"input_ids": [2]}], ["samples[1]", "fields"]),
        ([{"input_ids": [1, 2], "labels": [2]}], ["'input_ids': 2", "'labels': 1"]),
    ]
    for samples, mentions in cases:
        assert_raises_typed(ConfigError, collate_samples, samples, pad_id=0, clause="COLL-10", what=f"samples={samples}",
                            mentions=mentions)
