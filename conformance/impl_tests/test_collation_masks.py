"""impl.collation's padding, pooling masks and varlen segments against reference.collation (COLL-1..COLL-11).

Generated batches of rows, padded on either side (and to a multiple), must
give the reference's padded rows, attention masks and pooling masks bit for
bit; pooling must read the same *tokens* whichever side the batch was padded
on; varlen boundaries must equal the reference's and give, fed to attention
segment by segment as a varlen kernel runs it, what block-diagonal causal
attention over the documents gives; bad input gets a typed error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed, check
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


# --------------------------------------------------------------------------- varlen segments (COLL-8, COLL-11)


@st.composite
def packed_batches(draw):
    """``[B, L]`` position and doc ids: each row pieces of distinct documents (the first maybe continued) and padding runs.

    Document ids are distinct across the batch, so "same doc id" is "same
    piece" and a block-diagonal mask built from ``doc_ids`` is the truth.
    """
    width = draw(st.integers(1, 12))
    positions, docs = [], []
    next_doc = itertools.count()
    for _ in range(draw(st.integers(1, 4))):
        pos: list[int] = []
        doc: list[int] = []
        while len(pos) < width:
            n = draw(st.integers(1, width - len(pos)))
            if draw(st.booleans()):
                pos += [0] * n
                doc += [-1] * n
            else:
                first = draw(st.integers(0, 3)) if not pos else 0
                pos += [first + j for j in range(n)]
                doc += [next(next_doc)] * n
        positions.append(pos)
        docs.append(doc)
    return positions, docs


def reference_batch_cu_seqlens(positions, docs):
    """The reference's row boundaries, offset by row, over the flattened batch."""
    expected = [0]
    for r, (pos, doc) in enumerate(zip(positions, docs)):
        expected = expected[:-1] + [b + r * len(pos) for b in rc.cu_seqlens(pos, doc)]
    return expected


@pytest.mark.clause("COLL-8", "COLL-11")
@given(batch=packed_batches())
def test_cu_seqlens_with_doc_ids_equals_the_reference_bit_for_bit(batch):
    positions, docs = batch
    repro = {"position_ids": positions, "doc_ids": docs}
    expected = reference_batch_cu_seqlens(positions, docs)
    cu, longest = ic.cu_seqlens(torch.tensor(positions), torch.tensor(docs))
    assert_equal(cu.tolist(), expected, clause="COLL-11", what="cu_seqlens", repro=repro)
    check(cu.dtype == torch.int32, clause="COLL-11", what=f"dtype {cu.dtype}", repro=repro)
    assert_equal(longest, max(b - a for a, b in itertools.pairwise(expected)), clause="COLL-11", what="max_seqlen",
                 repro=repro)
    for pos, doc in zip(positions, docs):
        got = ic.sample_cu_seqlens(np.array(pos), np.array(doc)).tolist()
        ref = rc.cu_seqlens(pos, doc)
        assert_equal(got, ref + [len(pos)] * (len(pos) + 1 - len(ref)), clause="COLL-11", what="sample_cu_seqlens",
                     repro=repro)
    samples = [{"position_ids": torch.tensor(p), "doc_ids": torch.tensor(d)} for p, d in zip(positions, docs)]
    assert_equal(ic.collate(samples)["cu_seqlens"].tolist(), expected, clause="COLL-11", what="collate's cu_seqlens",
                 repro=repro)


def varlen_attention(q, k, v, cu):
    """Causal attention run on each segment alone, as ``flash_attn_varlen_func`` runs it: ``[T, H, D]`` in and out."""
    out = torch.full_like(q, float("nan"))
    for a, b in itertools.pairwise(cu.tolist()):
        seg = [t[a:b].transpose(0, 1) for t in (q, k, v)]
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(*seg, is_causal=True).transpose(0, 1)
    return out


def document_attention(q, k, v, docs):
    """Causal attention of each row under a block-diagonal mask from ``doc_ids``; a pad attends to itself only."""
    rows, width = docs.shape
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    out = []
    for r in range(rows):
        d = docs[r]
        mask = (causal & (d[:, None] == d[None, :]) & (d[:, None] >= 0)) | torch.eye(width, dtype=torch.bool)
        span = slice(r * width, (r + 1) * width)
        seg = [t[span].transpose(0, 1) for t in (q, k, v)]
        out.append(torch.nn.functional.scaled_dot_product_attention(*seg, attn_mask=mask).transpose(0, 1))
    return torch.cat(out)


def assert_varlen_attention_matches_documents(positions, docs, *, repro) -> None:
    __tracebackhide__ = True
    docs = torch.as_tensor(docs)
    rows, width = docs.shape
    cu, longest = ic.cu_seqlens(torch.as_tensor(positions), docs)
    check(cu[-1].item() == rows * width, clause="COLL-11", what=f"cu_seqlens ends at {cu[-1].item()}", repro=repro)
    check(longest >= int(torch.diff(cu).max()), clause="COLL-11", what=f"max_seqlen={longest}", repro=repro)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows * width, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    got = varlen_attention(q, k, v, cu)
    expected = document_attention(q, k, v, docs)
    real = (docs >= 0).reshape(-1)
    check(bool(torch.isfinite(got).all()), clause="COLL-11", what="every position, padding too, covered by a segment",
          repro=repro)
    check(torch.allclose(got[real], expected[real], rtol=1e-12, atol=1e-12), clause="COLL-11",
          what="real positions' varlen attention against block-diagonal attention", repro=repro)


@pytest.mark.clause("COLL-11")
@given(batch=packed_batches())
def test_varlen_attention_over_cu_seqlens_equals_block_diagonal_attention_over_documents(batch):
    positions, docs = batch
    assert_varlen_attention_matches_documents(positions, docs, repro={"position_ids": positions, "doc_ids": docs})


@pytest.mark.clause("COLL-11")
def test_a_best_fit_batch_has_one_segment_per_document_and_at_most_one_per_row_of_padding(tmp_path):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    lengths = [3, 5, 2, 7, 1, 4, 6, 2, 3, 1, 5, 2]
    files = [[[100 + 10 * d + j for j in range(n)] for d, n in enumerate(lengths[:6])],
             [[300 + 10 * d + j for j in range(n)] for d, n in enumerate(lengths[6:])]]
    store = TokenStore.from_token_files(files, tmp_path / "store", vocab_size=1000, eos_id=999, pad_id=0)
    ds = PackedDataset(store, seq_len=8, packing="best_fit", shuffle="global", seed=3, cache_dir=tmp_path / "c")
    keys = list(range(ds.num_samples(0))) + [-1]
    batch = ds.samples(0, keys)
    docs = batch["doc_ids"]
    pieces = sum(len(set(row[row >= 0].tolist())) for row in docs)
    padded_rows = int((docs < 0).any(axis=1).sum())
    repro = {"doc_ids": docs.tolist(), "position_ids": batch["position_ids"].tolist()}
    check(padded_rows > 0, clause="COLL-11", what="the batch has padding to count", repro=repro)
    assert_equal(len(batch["cu_seqlens"]) - 1, pieces + padded_rows, clause="COLL-11",
                 what="segments (documents + one per padded row)", repro=repro)
    assert_equal(batch["cu_seqlens"].tolist(), reference_batch_cu_seqlens(batch["position_ids"].tolist(), docs.tolist()),
                 clause="COLL-11", what="cu_seqlens of the batch", repro=repro)
    for key in keys:
        sample = ds[key]
        ref = rc.cu_seqlens(sample["position_ids"].tolist(), sample["doc_ids"].tolist())
        assert_equal(sample["cu_seqlens"].tolist()[:len(ref)], ref, clause="COLL-11", what=f"sample {key}'s cu_seqlens",
                     repro=repro)
    assert_varlen_attention_matches_documents(batch["position_ids"], docs, repro=repro)
