"""impl.collation's padding and pooling masks against reference.collation (COLL-1..COLL-7).

Generated batches of rows, padded on either side (and to a multiple), must
give the reference's padded rows, attention masks and pooling masks bit for
bit; pooling must read the same *tokens* whichever side the batch was padded
on; bad input gets a typed error.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed
from impl import collation as ic
from impl.errors import ConfigError
from reference import collation as rc

rows = st.lists(st.lists(st.integers(1, 50), max_size=9), min_size=1, max_size=6)
sides = st.sampled_from(rc.SIDES)
poolings = st.sampled_from(rc.POOLINGS)
multiples = st.one_of(st.none(), st.integers(1, 8))


@pytest.mark.clause("COLL-1")
@given(items=rows, side=sides, multiple=multiples)
def test_pad_stack_1d_equals_the_reference_on_both_sides_and_multiples(items, side, multiple):
    got = ic.pad_stack_1d([torch.tensor(r, dtype=torch.int64) for r in items], 0, side=side,
                          pad_to_multiple_of=multiple)
    assert_equal(got.tolist(), rc.pad_stack_1d(items, 0, side=side, pad_to_multiple_of=multiple), clause="COLL-1",
                 what="padded rows", repro={"items": items, "side": side, "multiple": multiple})


@pytest.mark.clause("COLL-3")
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6), side=sides, extra=st.integers(0, 3))
def test_attention_mask_equals_the_reference(lengths, side, extra):
    total = max(lengths) + extra
    assert_equal(ic.attention_mask(lengths, side=side, total=total).tolist(),
                 rc.attention_mask(lengths, side=side, total=total), clause="COLL-3", what="attention mask",
                 repro={"lengths": lengths, "side": side, "total": total})


@pytest.mark.clause("COLL-4", "COLL-5", "COLL-6", "COLL-7")
@given(items=rows, side=sides, pooling=poolings, multiple=multiples)
def test_pooling_masks_equal_the_reference_under_left_and_right_padding(items, side, pooling, multiple):
    padded = rc.pad_stack_1d(items, 0, side=side, pad_to_multiple_of=multiple)
    mask = rc.attention_mask([len(r) for r in items], side=side, total=len(padded[0]))
    got = ic.token_pooling_mask_from_attention_mask(torch.tensor(mask, dtype=torch.int64), pooling)
    clause = {"first": "COLL-4", "last": "COLL-5", "all": "COLL-6"}[pooling]
    assert_equal(got.tolist(), rc.token_pooling_mask(mask, pooling), clause=clause, what="pooling mask",
                 repro={"mask": mask, "pooling": pooling})


@pytest.mark.clause("COLL-4", "COLL-5")
@given(items=rows, pooling=poolings)
def test_pooling_reads_the_same_tokens_whichever_side_the_batch_is_padded_on(items, pooling):
    picked = {}
    for side in rc.SIDES:
        batch = ic.pad_stack_1d([torch.tensor(r, dtype=torch.int64) for r in items], 0, side=side)
        mask = ic.attention_mask([len(r) for r in items], side=side, total=batch.shape[1])
        pool = ic.token_pooling_mask_from_attention_mask(mask, pooling).bool()
        picked[side] = [batch[i][pool[i]].tolist() for i in range(len(items))]
    expected = [r[:1] if pooling == "first" else r[-1:] if pooling == "last" else r for r in items]
    assert_equal(picked["left"], picked["right"], clause="COLL-4", what="tokens pooled left vs right",
                 repro={"items": items, "pooling": pooling})
    assert_equal(picked["right"], expected, clause="COLL-5", what="tokens pooled", repro={"items": items})


@pytest.mark.clause("COLL-7")
def test_all_padding_rows_pool_nothing_and_boolean_masks_are_accepted():
    mask = torch.tensor([[False, False, False], [False, True, True]])
    for pooling in ic.TokenPoolingType:
        got = ic.token_pooling_mask_from_attention_mask(mask, pooling)
        assert_equal(got[0].tolist(), [0, 0, 0], clause="COLL-7", what=f"all-padding row, {pooling}")
        assert got.dtype == torch.int64
    assert_equal(ic.token_pooling_mask_from_attention_mask(torch.zeros(2, 0, dtype=torch.int64), "last").shape,
                 torch.Size([2, 0]), clause="COLL-7", what="zero-width mask")


@pytest.mark.clause("COLL-2", "COLL-7")
def test_bad_padding_and_mask_input_is_refused_with_typed_errors():
    assert_raises_typed(ConfigError, ic.pad_stack_1d, [], 0, clause="COLL-2", what="empty items", mentions=["empty"])
    assert_raises_typed(ConfigError, ic.pad_stack_1d, [torch.ones(2, 2)], 0, clause="COLL-2", what="a 2-d item",
                        mentions=["(2, 2)", "1-d"])
    for bad in (0, -8):
        assert_raises_typed(ConfigError, ic.pad_stack_1d, [[1]], 0, pad_to_multiple_of=bad, clause="COLL-2",
                            what=f"pad_to_multiple_of={bad}", mentions=[f"pad_to_multiple_of={bad}"])
    assert_raises_typed(ConfigError, ic.token_pooling_mask_from_attention_mask, torch.tensor([[1, 0], [2, 1]]),
                        "first", clause="COLL-7", what="a mask with a 2", mentions=["attention_mask[1]", "0 and 1"])
    assert_raises_typed(ConfigError, ic.token_pooling_mask_from_attention_mask, torch.tensor([[1, 0]]), "mean",
                        clause="COLL-7", what="unknown pooling", mentions=["mean", "first"])
    assert_raises_typed(ConfigError, ic.token_pooling_mask_from_attention_mask, torch.tensor([1, 0]), "first",
                        clause="COLL-7", what="a 1-d mask", mentions=["[batch, seq_len]"])
