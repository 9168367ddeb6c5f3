"""Meta tests: reference.packing obeys PACK-1..PACK-21.

The oracles here are written independently of the reference: the concatenated
stream is built token by token, chunk boundaries come from their closed form,
and bin placements are replayed by brute force from the samples' provenance.
Test corpora give every token a globally unique value (document k, offset j
holds 1000 * (k + 1) + j), so a label that equals the expected token is the
expected token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference import packing as pk
from reference.bins import best_fit_bins, first_fit_bins
from reference.errors import ConfigError
from reference.packing import IGNORE, PackingConfig, Piece, Sample

BOS, EOS, PAD = 1, 2, 0
I = IGNORE
MODES = pk.MODES
CHUNKING_MODES = ("greedy", "first_fit", "best_fit", "none")


# ------------------------------------------------------------------ strategies


@st.composite
def corpora(draw, max_docs: int = 8, max_len: int = 14) -> list[tuple[int, list[int]]]:
    """Documents (id 500 + k, unique tokens): empty ones, a single one, longer than L, many tiny ones."""
    shape = draw(st.sampled_from(["mixed", "mixed", "single", "tiny", "long", "empty"]))
    if shape == "single":
        lengths = [draw(st.integers(1, max_len))]
    elif shape == "tiny":
        lengths = draw(st.lists(st.integers(0, 2), min_size=1, max_size=3 * max_docs))
    elif shape == "long":
        lengths = draw(st.lists(st.integers(6, 3 * max_len), min_size=1, max_size=3))
    elif shape == "empty":
        lengths = draw(st.lists(st.just(0), max_size=3))
    else:
        lengths = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(0, max_len)), max_size=max_docs))
    return [(500 + k, [1000 * (k + 1) + j for j in range(m)]) for k, m in enumerate(lengths)]


@st.composite
def configs(draw, modes: Sequence[str] = MODES, *, overflow: str | None = None, stride: str = "any",
            bos_on_continuation: bool | None = None, options: bool = True) -> PackingConfig:
    """Valid configs; ``stride`` is "any", "zero" or "positive"."""
    mode = draw(st.sampled_from(list(modes)))
    lowest = 1 + (bos_on_continuation is True) + (stride == "positive")
    L = draw(st.integers(lowest, 6))
    if bos_on_continuation is None:
        bos_cont = L >= lowest + 1 and draw(st.booleans())
    else:
        bos_cont = bos_on_continuation
    room = L - bos_cont
    chosen_stride = {"zero": st.just(0), "positive": st.integers(1, room - 1), "any": st.integers(0, room - 1)}[stride]
    return PackingConfig(
        seq_len=L, mode=mode, window=draw(st.integers(1, 4)),
        overflow=overflow or draw(st.sampled_from(pk.OVERFLOWS)), stride=draw(chosen_stride),
        bos_on_continuation=bos_cont, bos_id=BOS, eos_id=EOS, pad_id=PAD,
        add_bos=options and draw(st.booleans()), add_eos=options and draw(st.booleans()),
        min_len=draw(st.integers(0, 3)) if options else 0,
    )


# ------------------------------------------------------------------ independent oracles


def prepared(tokens: Sequence[int], cfg: PackingConfig) -> list[int]:
    return ([BOS] if cfg.add_bos else []) + list(tokens) + ([EOS] if cfg.add_eos else [])


class Kept(NamedTuple):
    position: int
    doc_id: int
    tokens: list[int]


def kept_documents(docs, cfg: PackingConfig) -> list[Kept]:
    out = [Kept(i, doc_id, prepared(t, cfg)) for i, (doc_id, t) in enumerate(docs)]
    return [k for k in out if len(k.tokens) > 0 and len(k.tokens) >= cfg.min_len]


def oracle_spans(m: int, cfg: PackingConfig) -> list[tuple[int, int]]:
    """Chunk boundaries in closed form: b_c = min(m, L + c*step), a_c = b_(c-1) - stride."""
    L = cfg.seq_len
    if m <= L:
        return [(0, m)]
    if cfg.overflow == "truncate":
        return [(0, L)]
    step = L - int(cfg.bos_on_continuation) - cfg.stride
    count = 1 + -(-(m - L) // step)
    return [(0, L)] + [(L + (c - 1) * step - cfg.stride, min(m, L + c * step)) for c in range(1, count)]


class Tok(NamedTuple):
    occurrence: int
    doc_id: int
    offset: int
    token: int


def stream(docs, cfg: PackingConfig) -> list[Tok]:
    return [Tok(k, d.doc_id, p, t) for k, d in enumerate(kept_documents(docs, cfg)) for p, t in enumerate(d.tokens)]


class Seg(NamedTuple):
    doc_id: int
    start: int
    stop: int
    bos: bool
    first: int
    end: int


def segments(sample: Sample) -> list[Seg]:
    """The sample's segments read back from provenance: what came in as one piece."""
    used = sum(d != -1 for d in sample.doc_ids)
    bounds = list(sample.document_starts) + [used]
    out = []
    for s, e in itertools.pairwise(bounds):
        bos = sample.token_offsets[s] == -1
        offsets = sample.token_offsets[s + bos:e]
        out.append(Seg(sample.doc_ids[s], offsets[0], offsets[-1] + 1, bos, s, e))
    return out


def within_pairs(docs, cfg) -> list[tuple[int, int]]:
    return [(d.doc_id, p) for d in kept_documents(docs, cfg) for p in range(len(d.tokens) - 1)]


def S(ids, labels, pos, doc_ids, offsets, starts) -> Sample:
    return Sample(tuple(ids), tuple(labels), tuple(pos), tuple(doc_ids), tuple(offsets), tuple(starts))


def repro(docs, cfg) -> dict:
    return {"documents": docs, "config": cfg}


# ------------------------------------------------------------------ hand-computed examples (L = 4)

ABC = [(7, [1, 2, 3]), (8, [4, 5, 6, 7, 8, 9]), (9, [10])]
A_ = S((1, 2, 3, 0), (2, 3, I, I), (0, 1, 2, 0), (7, 7, 7, -1), (0, 1, 2, -1), (0,))
B0 = S((4, 5, 6, 7), (5, 6, 7, I), (0, 1, 2, 3), (8, 8, 8, 8), (0, 1, 2, 3), (0,))
B1 = S((8, 9, 0, 0), (9, I, I, I), (0, 1, 0, 0), (8, 8, -1, -1), (4, 5, -1, -1), (0,))
AC = S((1, 2, 3, 10), (2, 3, I, I), (0, 1, 2, 0), (7, 7, 7, 9), (0, 1, 2, 0), (0, 3))
C_ = S((10, 0, 0, 0), (I, I, I, I), (0, 0, 0, 0), (9, -1, -1, -1), (0, -1, -1, -1), (0,))
HEAD = S((1, 2, 3, 4), (2, 3, I, 5), (0, 1, 2, 0), (7, 7, 7, 8), (0, 1, 2, 0), (0, 3))
WORKED = {
    "concat": [HEAD, S((5, 6, 7, 8), (6, 7, 8, 9), (0, 1, 2, 3), (8, 8, 8, 8), (1, 2, 3, 4), (0,))],
    "chunk": [HEAD, S((6, 7, 8, 9), (7, 8, 9, I), (0, 1, 2, 3), (8, 8, 8, 8), (2, 3, 4, 5), (0,))],
    "greedy": [A_, B0, S((8, 9, 10, 0), (9, I, I, I), (0, 1, 0, 0), (8, 8, 9, -1), (4, 5, 0, -1), (0, 2))],
    "first_fit": [AC, B0, B1],
    "best_fit": [B0, AC, B1],
    "none": [A_, B0, B1, C_],
}
WORKED_CLAUSE = {"concat": "PACK-6", "chunk": "PACK-8", "greedy": "PACK-15", "first_fit": "PACK-16",
                 "best_fit": "PACK-17", "none": "PACK-19"}


@pytest.mark.clause("PACK-6", "PACK-8", "PACK-15", "PACK-16", "PACK-17", "PACK-19")
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_packs_the_hand_computed_worked_example_exactly(mode):
    cfg = PackingConfig(seq_len=4, mode=mode)
    assert_equal(pk.pack(ABC, cfg), WORKED[mode], clause=WORKED_CLAUSE[mode], what="samples", repro=repro(ABC, cfg))


@pytest.mark.clause("PACK-1", "PACK-4")
def test_concat_with_bos_and_eos_masks_the_eos_to_next_bos_pair():
    docs = [(7, [1, 2]), (8, [3])]
    cfg = PackingConfig(seq_len=4, add_bos=True, bos_id=90, add_eos=True, eos_id=91)
    expected = [S((90, 1, 2, 91), (1, 2, 91, I), (0, 1, 2, 3), (7, 7, 7, 7), (0, 1, 2, 3), (0,))]
    assert_equal(pk.pack(docs, cfg), expected, clause="PACK-1", what="samples", repro=repro(docs, cfg))
    assert_equal(pk.prepare([5, 6], cfg), (90, 5, 6, 91), clause="PACK-1", what="prepare([5, 6])")


@pytest.mark.clause("PACK-4", "PACK-5")
def test_concat_masks_the_pair_between_two_occurrences_of_the_same_document():
    docs = [(5, [1, 2]), (5, [1, 2])]
    cfg = PackingConfig(seq_len=3)
    expected = [S((1, 2, 1), (2, I, 2), (0, 1, 0), (5, 5, 5), (0, 1, 0), (0, 2))]
    assert_equal(pk.pack(docs, cfg), expected, clause="PACK-4", what="samples", repro=repro(docs, cfg))


@pytest.mark.clause("PACK-12", "PACK-13")
def test_stride_one_rereads_one_token_and_trains_the_boundary_pair_in_the_continuation():
    cfg = PackingConfig(seq_len=4, mode="none", stride=1)
    cont = S((7, 8, 9, 0), (8, 9, I, I), (0, 1, 2, 0), (8, 8, 8, -1), (3, 4, 5, -1), (0,))
    assert_equal(pk.pack(ABC, cfg), [A_, B0, cont, C_], clause="PACK-12", what="samples", repro=repro(ABC, cfg))


@pytest.mark.clause("PACK-10", "PACK-12")
def test_a_continuation_bos_is_inserted_with_offset_minus_one_and_masked():
    cfg = PackingConfig(seq_len=4, mode="none", bos_on_continuation=True, bos_id=90)
    cont = S((90, 8, 9, 0), (I, 9, I, I), (0, 1, 2, 0), (8, 8, 8, -1), (-1, 4, 5, -1), (0,))
    assert_equal(pk.pack(ABC, cfg), [A_, B0, cont, C_], clause="PACK-10", what="samples", repro=repro(ABC, cfg))


@pytest.mark.clause("PACK-11")
def test_truncate_keeps_the_first_four_tokens_of_the_long_document():
    cfg = PackingConfig(seq_len=4, mode="none", overflow="truncate")
    assert_equal(pk.pack(ABC, cfg), [A_, B0, C_], clause="PACK-11", what="samples", repro=repro(ABC, cfg))


@pytest.mark.clause("PACK-17", "PACK-16")
def test_best_fit_chooses_the_tightest_bin_where_first_fit_chooses_the_lowest():
    lengths = [6, 4, 4, 1]
    best = pk.pack_plan(lengths, PackingConfig(seq_len=9, mode="best_fit"))
    first = pk.pack_plan(lengths, PackingConfig(seq_len=9, mode="first_fit"))
    assert_equal(best, [(Piece(0, 0, 6),), (Piece(1, 0, 4), Piece(2, 0, 4), Piece(3, 0, 1))], clause="PACK-17",
                 what="best_fit plan of widths 6, 4, 4, 1 into 9")
    assert_equal(first, [(Piece(0, 0, 6), Piece(3, 0, 1)), (Piece(1, 0, 4), Piece(2, 0, 4))], clause="PACK-16",
                 what="first_fit plan of widths 6, 4, 4, 1 into 9")


@pytest.mark.clause("PACK-14")
def test_a_bin_never_takes_items_from_the_next_window():
    cfg = PackingConfig(seq_len=4, mode="first_fit", window=2)
    got = pk.pack_plan([1, 1, 1], cfg)
    assert_equal(got, [(Piece(0, 0, 1), Piece(1, 0, 1)), (Piece(2, 0, 1),)], clause="PACK-14", what="plan, window 2")
    one_window = pk.pack_plan([1, 1, 1], PackingConfig(seq_len=4, mode="first_fit", window=3))
    assert_equal(one_window, [(Piece(0, 0, 1), Piece(1, 0, 1), Piece(2, 0, 1))], clause="PACK-14", what="plan, window 3")


@pytest.mark.clause("PACK-20")
def test_the_concat_plan_of_the_worked_example_is_pinned():
    cfg = PackingConfig(seq_len=4)
    assert_equal(pk.pack_plan([3, 6, 1], cfg), [((0, 0, 3), (1, 0, 1)), ((1, 1, 5),)], clause="PACK-20", what="plan")
    assert_equal(pk.num_samples([3, 6, 1], cfg), 2, clause="PACK-20", what="num_samples")


@pytest.mark.clause("PACK-7", "PACK-9")
def test_accounting_helpers_count_trained_pairs_and_inputs_of_the_worked_example():
    concat = pk.pack(ABC, PackingConfig(seq_len=4))
    assert_equal(sum(pk.trained_pairs(concat).values()), 7, clause="PACK-7", what="trained pairs of concat")
    chunk = pk.pack(ABC, PackingConfig(seq_len=4, mode="chunk"))
    check((8, 1) not in pk.trained_pairs(chunk), clause="PACK-9", what="pair (5, 6) spanning chunk windows is trained")
    check((8, 1) not in pk.input_tokens(chunk), clause="PACK-9", what="token 5, the first window's last token, is an input")


# ------------------------------------------------------------------ every mode


@pytest.mark.clause("PACK-3")
@pytest.mark.parametrize("mode", MODES)
@given(docs=corpora(), data=st.data())
def test_every_sample_has_exactly_seq_len_positions_and_padding_is_an_inert_suffix(mode, docs, data):
    cfg = data.draw(configs([mode]))
    L = cfg.seq_len
    for k, s in enumerate(pk.pack(docs, cfg)):
        r = {**repro(docs, cfg), "sample": k}
        for field in ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets"):
            assert_equal(len(getattr(s, field)), L, clause="PACK-3", what=f"len({field})", repro=r)
        used = sum(d != -1 for d in s.doc_ids)
        check(used >= 1, clause="PACK-3", what="an all-padding sample was emitted", repro=r)
        assert_equal(s.doc_ids[used:], (-1,) * (L - used), clause="PACK-3", what="padding is not a suffix: doc_ids", repro=r)
        assert_equal(s.input_ids[used:], (PAD,) * (L - used), clause="PACK-3", what="padding input_ids", repro=r)
        assert_equal(s.labels[used:], (I,) * (L - used), clause="PACK-3", what="padding labels", repro=r)
        assert_equal(s.position_ids[used:], (0,) * (L - used), clause="PACK-3", what="padding position_ids", repro=r)
        assert_equal(s.token_offsets[used:], (-1,) * (L - used), clause="PACK-3", what="padding token_offsets", repro=r)


@pytest.mark.clause("PACK-4")
@pytest.mark.parametrize("mode", MODES)
@given(docs=corpora(), data=st.data())
def test_every_label_is_ignore_or_the_next_token_of_the_same_prepared_document(mode, docs, data):
    cfg = data.draw(configs([mode]))
    source = {d.doc_id: d.tokens for d in kept_documents(docs, cfg)}
    for k, s in enumerate(pk.pack(docs, cfg)):
        r = {**repro(docs, cfg), "sample": k}
        for j, (doc_id, p) in enumerate(zip(s.doc_ids, s.token_offsets)):
            if doc_id == -1:
                continue
            check(doc_id in source, clause="PACK-4", what=f"input {j} comes from dropped or unknown document {doc_id}", repro=r)
            d = source[doc_id]
            if p == -1:
                check(cfg.splits and cfg.bos_on_continuation and s.input_ids[j] == BOS, clause="PACK-4",
                      what=f"input {j} has offset -1 but is not an inserted continuation BOS", repro=r)
                assert_equal(s.labels[j], I, clause="PACK-4", what=f"label of inserted BOS at {j}", repro=r)
                continue
            assert_equal(s.input_ids[j], d[p], clause="PACK-4", what=f"input {j} vs its provenance ({doc_id}, {p})", repro=r)
            if s.labels[j] != I:
                check(p + 1 < len(d), clause="PACK-4", what=f"input {j} is its document's last token but has a label", repro=r)
                assert_equal(s.labels[j], d[p + 1], clause="PACK-4", what=f"label {j} of ({doc_id}, {p})", repro=r)


@pytest.mark.clause("PACK-5")
@pytest.mark.parametrize("mode", MODES)
@given(docs=corpora(), data=st.data())
def test_positions_restart_exactly_at_document_starts_and_count_up_within_a_segment(mode, docs, data):
    cfg = data.draw(configs([mode]))
    for k, s in enumerate(pk.pack(docs, cfg)):
        r = {**repro(docs, cfg), "sample": k}
        used = sum(d != -1 for d in s.doc_ids)
        breaks = [j for j in range(used)
                  if j == 0 or s.token_offsets[j] == -1 or s.doc_ids[j] != s.doc_ids[j - 1]
                  or (s.token_offsets[j - 1] != -1 and s.token_offsets[j] != s.token_offsets[j - 1] + 1)]
        assert_equal(s.document_starts, tuple(breaks), clause="PACK-5",
                     what="document_starts (vs where provenance stops being one consecutive run)", repro=r)
        last = 0
        for j in range(used):
            last = j if j in s.document_starts else last
            assert_equal(s.position_ids[j], j - last, clause="PACK-5", what=f"position_ids[{j}]", repro=r)


@pytest.mark.clause("PACK-1")
@given(docs=corpora(), cfg=configs(["none"], overflow="split", stride="zero", options=True))
def test_a_documents_inputs_read_in_order_are_its_prepared_form(docs, cfg):
    got: dict[int, list[int]] = {}
    for s in pk.pack(docs, cfg):
        for tok, doc_id, p in zip(s.input_ids, s.doc_ids, s.token_offsets):
            if p != -1:
                got.setdefault(doc_id, []).append(tok)
    expected = {d.doc_id: d.tokens for d in kept_documents(docs, cfg)}
    assert_equal(got, expected, clause="PACK-1", what="inputs per document", repro=repro(docs, cfg))


@pytest.mark.clause("PACK-2")
@pytest.mark.parametrize("mode", MODES)
@given(docs=corpora(), data=st.data())
def test_dropped_documents_change_nothing_but_their_own_absence(mode, docs, data):
    cfg = data.draw(configs([mode]))
    kept_ids = {d.doc_id for d in kept_documents(docs, cfg)}
    survivors = [(doc_id, t) for doc_id, t in docs if doc_id in kept_ids]
    samples = pk.pack(docs, cfg)
    assert_equal(samples, pk.pack(survivors, cfg), clause="PACK-2", what="samples (vs the corpus without dropped documents)",
                 repro=repro(docs, cfg))
    seen = {doc_id for s in samples for doc_id in s.doc_ids if doc_id != -1}
    check(seen <= kept_ids, clause="PACK-2", what=f"dropped documents {sorted(seen - kept_ids)} appear", repro=repro(docs, cfg))


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("mode", MODES)
@given(docs=corpora(), data=st.data())
def test_pack_is_its_plan_filled_in_and_num_samples_counts_it(mode, docs, data):
    cfg = data.draw(configs([mode]))
    lengths = [len(t) for _, t in docs]
    plan = pk.pack_plan(lengths, cfg)
    samples = pk.pack(docs, cfg)
    r = repro(docs, cfg)
    assert_equal(pk.num_samples(lengths, cfg), len(samples), clause="PACK-20", what="num_samples(lengths)", repro=r)
    assert_equal(samples, pk.fill(plan, docs, cfg), clause="PACK-20", what="pack vs fill(pack_plan)", repro=r)
    position = {doc_id: i for i, (doc_id, _) in enumerate(docs)}
    read_back = [tuple((position[g.doc_id], g.start, g.stop) for g in segments(s)) for s in samples]
    assert_equal(read_back, [tuple(tuple(p) for p in pieces) for pieces in plan], clause="PACK-20",
                 what="pieces read back from the samples' provenance vs the plan", repro=r)


# ------------------------------------------------------------------ concat and chunk


def _stream_oracle(docs, cfg, hop: int, count: int) -> list[Sample]:
    T = stream(docs, cfg)
    L = cfg.seq_len
    out = []
    for i in range(count):
        w = T[i * hop: i * hop + L + 1]
        labels = [w[j + 1].token if w[j + 1].occurrence == w[j].occurrence else I for j in range(L)]
        starts = [j for j in range(L) if j == 0 or w[j].occurrence != w[j - 1].occurrence]
        pos = [j - max(s for s in starts if s <= j) for j in range(L)]
        out.append(S([t.token for t in w[:L]], labels, pos, [t.doc_id for t in w[:L]], [t.offset for t in w[:L]], starts))
    return out


@pytest.mark.clause("PACK-6")
@given(docs=corpora(), cfg=configs(["concat"]))
def test_concat_samples_are_the_overlapping_windows_of_the_concatenated_stream(docs, cfg):
    n, L = len(stream(docs, cfg)), cfg.seq_len
    count = max(0, (n - 1) // L)
    samples = pk.pack(docs, cfg)
    assert_equal(len(samples), count, clause="PACK-6", what=f"number of samples for n={n}", repro=repro(docs, cfg))
    assert_equal(samples, _stream_oracle(docs, cfg, L, count), clause="PACK-6", what="samples", repro=repro(docs, cfg))


@pytest.mark.clause("PACK-7")
@given(docs=corpora(), cfg=configs(["concat"]))
def test_concat_trains_every_covered_within_document_pair_exactly_once_and_drops_the_tail(docs, cfg):
    T, L = stream(docs, cfg), cfg.seq_len
    samples = pk.pack(docs, cfg)
    covered = len(samples) * L
    r = repro(docs, cfg)
    assert_exactly_once(pk.input_tokens(samples).elements(), [(t.doc_id, t.offset) for t in T[:covered]],
                        clause="PACK-7", what="inputs vs T[:count*L]", repro=r)
    pairs = [(T[t].doc_id, T[t].offset) for t in range(covered) if T[t + 1].occurrence == T[t].occurrence]
    assert_exactly_once(pk.trained_pairs(samples).elements(), pairs, clause="PACK-7",
                        what="trained pairs vs within-document pairs (t, t+1) with t < count*L", repro=r)
    if T:
        check(1 <= len(T) - covered <= L, clause="PACK-7", what=f"tail of {len(T) - covered} tokens is not in [1, L]", repro=r)


@pytest.mark.clause("PACK-8")
@given(docs=corpora(), cfg=configs(["chunk"]))
def test_chunk_samples_are_disjoint_windows_of_seq_len_plus_one_tokens(docs, cfg):
    n, L = len(stream(docs, cfg)), cfg.seq_len
    samples = pk.pack(docs, cfg)
    assert_equal(len(samples), n // (L + 1), clause="PACK-8", what=f"number of samples for n={n}", repro=repro(docs, cfg))
    assert_equal(samples, _stream_oracle(docs, cfg, L + 1, n // (L + 1)), clause="PACK-8", what="samples",
                 repro=repro(docs, cfg))


@pytest.mark.clause("PACK-9")
@given(docs=corpora(), cfg=configs(["chunk"]))
def test_chunk_trains_exactly_the_pairs_inside_a_window_and_never_the_pair_spanning_two(docs, cfg):
    T, L = stream(docs, cfg), cfg.seq_len
    samples = pk.pack(docs, cfg)
    r = repro(docs, cfg)
    inside = [(T[t].doc_id, T[t].offset) for i in range(len(samples)) for t in range(i * (L + 1), i * (L + 1) + L)
              if T[t + 1].occurrence == T[t].occurrence]
    assert_exactly_once(pk.trained_pairs(samples).elements(), inside, clause="PACK-9",
                        what="trained pairs vs within-document pairs inside one window", repro=r)
    inputs = pk.input_tokens(samples)
    for i in range(len(samples)):
        last = T[i * (L + 1) + L]
        check((last.doc_id, last.offset) not in inputs, clause="PACK-9",
              what=f"window {i}'s last token {last} is an input", repro=r)


# ------------------------------------------------------------------ chunks (bin modes and none)


@pytest.mark.clause("PACK-10")
@given(m=st.integers(0, 60), cfg=configs(CHUNKING_MODES, overflow="split"))
def test_split_chunks_follow_the_stride_recurrence_and_the_closed_form_count(m, cfg):
    spans = pk.chunk_spans(m, cfg)
    assert_equal(spans, oracle_spans(m, cfg), clause="PACK-10", what=f"chunk_spans({m})", repro={"config": cfg})
    assert_equal(pk.chunk_count(m, cfg), len(spans), clause="PACK-10", what=f"chunk_count({m})", repro={"config": cfg})
    for a, b in spans:
        width = pk.piece_width(Piece(0, a, b), cfg)
        check(width <= cfg.seq_len, clause="PACK-10", what=f"chunk [{a}, {b}) needs {width} > L positions", repro={"config": cfg})


@pytest.mark.clause("PACK-10")
@given(docs=corpora(), cfg=configs(CHUNKING_MODES, overflow="split"))
def test_the_samples_hold_each_documents_split_chunks_with_a_bos_exactly_on_continuations(docs, cfg):
    r = repro(docs, cfg)
    by_doc: dict[int, list[Seg]] = {}
    for s in pk.pack(docs, cfg):
        for g in segments(s):
            by_doc.setdefault(g.doc_id, []).append(g)
    for d in kept_documents(docs, cfg):
        got = sorted(by_doc.get(d.doc_id, []))
        assert_equal([(g.start, g.stop) for g in got], oracle_spans(len(d.tokens), cfg), clause="PACK-10",
                     what=f"chunks of document {d.doc_id} (m={len(d.tokens)})", repro=r)
        assert_equal([g.bos for g in got], [cfg.bos_on_continuation and g.start > 0 for g in got], clause="PACK-10",
                     what=f"inserted BOS per chunk of document {d.doc_id}", repro=r)


@pytest.mark.clause("PACK-11")
@given(docs=corpora(), cfg=configs(CHUNKING_MODES, overflow="truncate"))
def test_truncate_keeps_exactly_the_first_seq_len_tokens_of_each_document(docs, cfg):
    L = cfg.seq_len
    kept = kept_documents(docs, cfg)
    samples = pk.pack(docs, cfg)
    universe = [(d.doc_id, p) for d in kept for p in range(min(L, len(d.tokens)))]
    assert_exactly_once(pk.input_tokens(samples).elements(), universe, clause="PACK-11",
                        what="inputs vs offsets < L of every kept document", repro=repro(docs, cfg))
    dropped = sum(len(d.tokens) for d in kept) - sum(pk.input_tokens(samples).values())
    assert_equal(dropped, sum(max(0, len(d.tokens) - L) for d in kept), clause="PACK-11", what="dropped tokens",
                 repro=repro(docs, cfg))


@pytest.mark.clause("PACK-12")
@given(docs=corpora(), cfg=configs(CHUNKING_MODES))
def test_inside_a_chunk_only_pairs_no_earlier_chunk_trained_are_labelled(docs, cfg):
    source = {d.doc_id: d.tokens for d in kept_documents(docs, cfg)}
    for k, s in enumerate(pk.pack(docs, cfg)):
        expected = list(s.labels)
        for g in segments(s):
            d = source[g.doc_id]
            spans = oracle_spans(len(d), cfg)
            c = spans.index((g.start, g.stop))
            if g.bos:
                expected[g.first] = I
            for j, p in zip(range(g.first + g.bos, g.end), range(g.start, g.stop)):
                trained = p + 1 < g.stop and (c == 0 or p + 1 >= spans[c - 1][1])
                expected[j] = d[p + 1] if trained else I
        assert_equal(s.labels, tuple(expected), clause="PACK-12", what="labels", repro={**repro(docs, cfg), "sample": k})


@pytest.mark.clause("PACK-13")
@given(docs=corpora(), cfg=configs(CHUNKING_MODES, overflow="split", stride="zero"))
def test_with_stride_zero_each_token_is_an_input_once_and_only_chunk_boundary_pairs_are_lost(docs, cfg):
    kept = kept_documents(docs, cfg)
    samples = pk.pack(docs, cfg)
    r = repro(docs, cfg)
    assert_exactly_once(pk.input_tokens(samples).elements(), [(d.doc_id, p) for d in kept for p in range(len(d.tokens))],
                        clause="PACK-13", what="inputs vs every token of every kept document", repro=r)
    lost = {(d.doc_id, b - 1) for d in kept for _, b in oracle_spans(len(d.tokens), cfg)[:-1]}
    assert_exactly_once(pk.trained_pairs(samples).elements(), [q for q in within_pairs(docs, cfg) if q not in lost],
                        clause="PACK-13", what="trained pairs vs within-document pairs minus chunk boundaries", repro=r)


@pytest.mark.clause("PACK-13")
@given(docs=corpora(), cfg=configs(CHUNKING_MODES, overflow="split", stride="positive"))
def test_with_stride_at_least_one_every_within_document_pair_is_trained_exactly_once(docs, cfg):
    samples = pk.pack(docs, cfg)
    assert_exactly_once(pk.trained_pairs(samples).elements(), within_pairs(docs, cfg), clause="PACK-13",
                        what="trained pairs vs every within-document pair", repro=repro(docs, cfg))


# ------------------------------------------------------------------ bins


def _width(g: Seg) -> int:
    return g.end - g.first


def _windows(docs, samples, cfg) -> list[list[list[Seg]]]:
    """The samples grouped by packing window (from the kept documents' ranks), checking PACK-14 on the way."""
    rank = {d.doc_id: i for i, d in enumerate(kept_documents(docs, cfg))}
    groups: list[tuple[int, list[list[Seg]]]] = []
    for k, s in enumerate(samples):
        segs = segments(s)
        windows = {rank[g.doc_id] // cfg.window for g in segs}
        check(len(windows) == 1, clause="PACK-14", what=f"sample {k} mixes windows {sorted(windows)}", repro=repro(docs, cfg))
        w = windows.pop()
        if not groups or groups[-1][0] != w:
            check(not groups or groups[-1][0] < w, clause="PACK-14", what=f"window {w}'s bins are not contiguous and in order",
                  repro=repro(docs, cfg))
            groups.append((w, []))
        groups[-1][1].append(segs)
    return [bins for _, bins in groups]


def _arrival(docs, cfg):
    rank = {d.doc_id: i for i, d in enumerate(kept_documents(docs, cfg))}
    return lambda g: (rank[g.doc_id], g.start)


@pytest.mark.clause("PACK-14", "PACK-18")
@pytest.mark.parametrize("mode", CHUNKING_MODES)
@given(docs=corpora(), data=st.data())
def test_each_window_packs_exactly_its_documents_chunks_once_into_bins_of_seq_len(mode, docs, data):
    cfg = data.draw(configs([mode]))
    samples = pk.pack(docs, cfg)
    kept = kept_documents(docs, cfg)
    r = repro(docs, cfg)
    if mode != "none":
        groups = _windows(docs, samples, cfg)
        assert_equal(len(groups), -(-len(kept) // cfg.window), clause="PACK-14", what="number of windows with bins", repro=r)
        for w, bins in enumerate(groups):
            window_docs = kept[w * cfg.window:(w + 1) * cfg.window]
            seen = [(g.doc_id, g.start, g.stop) for segs in bins for g in segs]
            universe = [(d.doc_id, a, b) for d in window_docs for a, b in oracle_spans(len(d.tokens), cfg)]
            assert_exactly_once(seen, universe, clause="PACK-14", what=f"chunks in window {w}'s bins", repro=r)
    seen = [(g.doc_id, g.start, g.stop) for s in samples for g in segments(s)]
    universe = [(d.doc_id, a, b) for d in kept for a, b in oracle_spans(len(d.tokens), cfg)]
    assert_exactly_once(seen, universe, clause="PACK-18", what="chunks over all samples", repro=r)
    for k, s in enumerate(samples):
        check(sum(_width(g) for g in segments(s)) <= cfg.seq_len, clause="PACK-18", what=f"sample {k} overfull", repro=r)


@pytest.mark.clause("PACK-18")
@pytest.mark.parametrize("mode", ("greedy", "first_fit", "best_fit"))
@given(docs=corpora(), data=st.data())
def test_bin_packing_with_plain_split_puts_every_token_into_exactly_one_input_position(mode, docs, data):
    cfg = data.draw(configs([mode], overflow="split", stride="zero", bos_on_continuation=False))
    universe = [(d.doc_id, p) for d in kept_documents(docs, cfg) for p in range(len(d.tokens))]
    samples = pk.pack(docs, cfg)
    assert_exactly_once(pk.input_tokens(samples).elements(), universe, clause="PACK-18", what="inputs", repro=repro(docs, cfg))
    cross = [(s.doc_ids[g.end - 1], s.token_offsets[g.end - 1]) for s in samples for g in segments(s)
             if s.labels[g.end - 1] != I]
    check(not cross, clause="PACK-18", what=f"the last input of a chunk is labelled: {cross}", repro=repro(docs, cfg))


@pytest.mark.clause("PACK-15")
@given(docs=corpora(), cfg=configs(["greedy"]))
def test_greedy_opens_a_new_bin_exactly_when_the_next_chunk_does_not_fit_the_open_one(docs, cfg):
    L, arrival, r = cfg.seq_len, _arrival(docs, cfg), repro(docs, cfg)
    for bins in _windows(docs, pk.pack(docs, cfg), cfg):
        items = [g for segs in bins for g in segs]
        check(items == sorted(items, key=arrival), clause="PACK-15", what="greedy reordered chunks", repro=r)
        used = 0
        for b, segs in enumerate(bins):
            if b > 0:
                check(L - used < _width(segs[0]), clause="PACK-15",
                      what=f"bin {b} opened for width {_width(segs[0])} while the open bin had room {L - used}", repro=r)
            used = sum(_width(g) for g in segs)


@pytest.mark.clause("PACK-16")
@given(docs=corpora(), cfg=configs(["first_fit"]))
def test_first_fit_never_skips_or_opens_a_bin_while_a_lower_bin_had_room(docs, cfg):
    L, arrival, r = cfg.seq_len, _arrival(docs, cfg), repro(docs, cfg)
    for bins in _windows(docs, pk.pack(docs, cfg), cfg):
        where = {}
        for b, segs in enumerate(bins):
            check(segs == sorted(segs, key=arrival), clause="PACK-16", what=f"bin {b} not in arrival order", repro=r)
            where.update({g: b for g in segs})
        fill: list[int] = []
        for g in sorted(where, key=arrival):
            b, w = where[g], _width(g)
            check(b <= len(fill), clause="PACK-16", what=f"{g} is in bin {b} before that bin was opened", repro=r)
            roomy = [k for k in range(len(fill)) if L - fill[k] >= w]
            check(b == (roomy[0] if roomy else len(fill)), clause="PACK-16",
                  what=f"{g} (width {w}) went to bin {b}, but bins {roomy} had room (fills {fill})", repro=r)
            if b == len(fill):
                fill.append(0)
            fill[b] += w


@pytest.mark.clause("PACK-17")
@given(docs=corpora(), cfg=configs(["best_fit"]))
def test_best_fit_places_widest_first_into_the_tightest_bin_that_fits(docs, cfg):
    L, arrival, r = cfg.seq_len, _arrival(docs, cfg), repro(docs, cfg)
    for bins in _windows(docs, pk.pack(docs, cfg), cfg):
        order = lambda g: (-_width(g), arrival(g))
        where = {}
        for b, segs in enumerate(bins):
            check(segs == sorted(segs, key=order), clause="PACK-17", what=f"bin {b} not in (width desc, arrival) order", repro=r)
            where.update({g: b for g in segs})
        fill: list[int] = []
        for g in sorted(where, key=order):
            b, w = where[g], _width(g)
            fits = [(L - fill[k], k) for k in range(len(fill)) if L - fill[k] >= w]
            check(b == (min(fits)[1] if fits else len(fill)), clause="PACK-17",
                  what=f"{g} (width {w}) went to bin {b}, but the tightest fitting (room, bin) was {min(fits) if fits else None}",
                  repro=r)
            if b == len(fill):
                fill.append(0)
            fill[b] += w


def _naive_first_fit(widths, capacity):
    bins, rooms = [], []
    for i, w in enumerate(widths):
        k = next((k for k, room in enumerate(rooms) if room >= w), None)
        if k is None:
            bins.append([])
            rooms.append(capacity)
            k = len(bins) - 1
        bins[k].append(i)
        rooms[k] -= w
    return bins


def _naive_best_fit(widths, capacity):
    bins, rooms = [], []
    for i in sorted(range(len(widths)), key=lambda i: (-widths[i], i)):
        fits = [(room, k) for k, room in enumerate(rooms) if room >= widths[i]]
        if fits:
            k = min(fits)[1]
        else:
            bins.append([])
            rooms.append(capacity)
            k = len(bins) - 1
        bins[k].append(i)
        rooms[k] -= widths[i]
    return bins


@pytest.mark.clause("PACK-16", "PACK-17")
@given(capacity=st.integers(1, 12), data=st.data())
def test_the_fast_packers_equal_a_linear_scan_over_the_bins(capacity, data):
    widths = data.draw(st.lists(st.integers(1, capacity), max_size=60))
    assert_equal(first_fit_bins(widths, capacity), _naive_first_fit(widths, capacity), clause="PACK-16",
                 what="first_fit_bins", repro={"widths": widths, "capacity": capacity})
    assert_equal(best_fit_bins(widths, capacity), _naive_best_fit(widths, capacity), clause="PACK-17",
                 what="best_fit_bins", repro={"widths": widths, "capacity": capacity})


@pytest.mark.clause("PACK-19")
@given(docs=corpora(), cfg=configs(["none"]))
def test_none_gives_every_chunk_its_own_sample_in_document_then_chunk_order(docs, cfg):
    got = [[(g.doc_id, g.start, g.stop) for g in segments(s)] for s in pk.pack(docs, cfg)]
    expected = [[(d.doc_id, a, b)] for d in kept_documents(docs, cfg) for a, b in oracle_spans(len(d.tokens), cfg)]
    assert_equal(got, expected, clause="PACK-19", what="segments per sample", repro=repro(docs, cfg))


# ------------------------------------------------------------------ validation


INVALID = [
    (dict(seq_len=0), "seq_len"),
    (dict(seq_len=True), "seq_len"),
    (dict(seq_len=4, mode="packed"), "mode"),
    (dict(seq_len=4, window=0), "window"),
    (dict(seq_len=4, overflow="wrap"), "overflow"),
    (dict(seq_len=4, stride=-1), "stride"),
    (dict(seq_len=4, stride=4), "stride"),
    (dict(seq_len=4, stride=3, bos_on_continuation=True, bos_id=1), "stride"),
    (dict(seq_len=4, add_bos=True), "bos_id"),
    (dict(seq_len=4, add_eos=True), "eos_id"),
    (dict(seq_len=4, bos_on_continuation=True), "bos_id"),
    (dict(seq_len=1, bos_on_continuation=True, bos_id=1), "bos_on_continuation"),
    (dict(seq_len=4, min_len=-1), "min_len"),
    (dict(seq_len=4, bos_id="<s>"), "bos_id"),
    (dict(seq_len=4, pad_id=None), "pad_id"),
    (dict(seq_len=4, add_bos=1, bos_id=1), "add_bos"),
]


@pytest.mark.clause("PACK-21")
@pytest.mark.parametrize("kwargs, field", INVALID, ids=[f"{f}:{k}" for k, f in INVALID])
def test_an_invalid_packing_config_is_refused_naming_the_field(kwargs, field):
    assert_raises_typed(ConfigError, PackingConfig, clause="PACK-21", what=f"PackingConfig({kwargs})",
                        mentions=[field], **kwargs)


@pytest.mark.clause("PACK-21")
@pytest.mark.parametrize("mode", ("concat", "chunk"))
@given(docs=corpora())
def test_split_options_are_accepted_but_inert_in_the_stream_modes(mode, docs):
    plain = PackingConfig(seq_len=4, mode=mode)
    options = PackingConfig(seq_len=4, mode=mode, overflow="truncate", stride=2, bos_on_continuation=True, bos_id=BOS)
    assert_equal(pk.pack(docs, options), pk.pack(docs, plain), clause="PACK-21", what="samples with split options",
                 repro=repro(docs, options))


# ------------------------------------------------------------------ PACK-22: a shuffle shuffles samples


@pytest.mark.clause("PACK-22")
def test_best_fit_bins_of_the_worked_example_come_in_the_keyed_order_of_each_epoch_and_seed():
    cfg = PackingConfig(seq_len=4, mode="best_fit")
    lengths = [3, 4, 2, 1]
    bins = pk.pack_plan(lengths, cfg)                      # creation order: [4] [3, 1] [2]
    assert_equal(bins, [((1, 0, 4),), ((0, 0, 3), (3, 0, 1)), ((2, 0, 2),)], clause="PACK-17", what="creation order")
    for (seed, epoch), order in {(0, 0): [0, 2, 1], (0, 1): [1, 2, 0], (0, 2): [2, 0, 1], (1, 0): [2, 1, 0]}.items():
        keyed = pk.pack_plan(lengths, cfg, key=pk.bin_key(seed, epoch))
        assert_equal(keyed, [bins[b] for b in order], clause="PACK-22", what=f"bins of seed {seed}, epoch {epoch}",
                     repro={"lengths": lengths, "config": cfg})


@pytest.mark.clause("PACK-22")
@given(lengths=st.lists(st.integers(0, 20), max_size=40), window=st.integers(1, 12),
       mode=st.sampled_from(pk.BIN_MODES), seed=st.integers(0, 3), epoch=st.integers(0, 3))
def test_keyed_bins_are_a_permutation_of_each_windows_bins_and_the_stream_modes_ignore_the_key(
        lengths, window, mode, seed, epoch):
    cfg = PackingConfig(seq_len=8, mode=mode, window=window)
    rep = {"lengths": lengths, "config": cfg, "seed": seed, "epoch": epoch}
    plain = pk.pack_plan(lengths, cfg)
    keyed = pk.pack_plan(lengths, cfg, key=pk.bin_key(seed, epoch))
    window_of = {doc: k // window for k, doc in enumerate(d for d, m in enumerate(lengths) if m > 0)}

    def by_window(plan):
        out: dict[int, list] = {}
        for sample in plan:
            out.setdefault(window_of[sample[0].doc], []).append(sample)
        return out

    plain_w, keyed_w = by_window(plain), by_window(keyed)
    assert_equal(sorted(keyed_w), sorted(plain_w), clause="PACK-22", what="windows", repro=rep)
    assert_equal([w for s in keyed for w in [window_of[s[0].doc]]], sorted(window_of[s[0].doc] for s in keyed),
                 clause="PACK-22", what="windows stay in order", repro=rep)
    for w, samples in plain_w.items():
        assert_equal(sorted(keyed_w[w]), sorted(samples), clause="PACK-22", what=f"window {w}'s bins", repro=rep)
    for stream_mode in ("concat", "chunk", "none"):
        other = PackingConfig(seq_len=8, mode=stream_mode, window=window)
        assert_equal(pk.pack_plan(lengths, other, key=pk.bin_key(seed, epoch)), pk.pack_plan(lengths, other),
                     clause="PACK-22", what=f"{stream_mode} with a key", repro=rep)


def _shuffled_corpus() -> list[list[list[int]]]:
    """80 documents of 1..60 tokens (lengths from the counter-based generator), in 4 files."""
    from reference.rng import below, derive_key
    key = derive_key(12345, 0, 99)
    lengths = [1 + below(key, i, 60) for i in range(80)]
    docs = [[1000 * (k + 1) + j for j in range(m)] for k, m in enumerate(lengths)]
    return [docs[i:i + 20] for i in range(0, 80, 20)]


@pytest.mark.clause("PACK-22")
@pytest.mark.parametrize("kind", ["global", "window"])
@pytest.mark.parametrize("mode", pk.MODES)
def test_every_shuffle_changes_the_sample_order_with_seed_and_epoch_and_sorts_no_lengths(mode, kind):
    """What a user expects of shuffle="global" / "window" whatever the packing (the README's best_fit config).

    Before PACK-22, best_fit emitted one window's bins longest document first: with every document in one
    window, each seed and epoch gave the same samples in the same order, their first segments sorted by length.
    """
    from reference.ordering import OrderingConfig
    from reference.resume import PipelineConfig, epoch_samples
    corpus = _shuffled_corpus()

    def samples(seed: int, epoch: int):
        cfg = PipelineConfig(packing=PackingConfig(seq_len=64, mode=mode),
                             ordering=OrderingConfig(kind=kind, seed=seed, window=16))
        return epoch_samples(corpus, cfg, epoch)

    base = samples(0, 0)
    rep = {"mode": mode, "kind": kind}
    check(len(base) >= 20, clause="PACK-22", what=f"only {len(base)} samples", repro=rep)
    for seed, epoch in ((0, 1), (1, 0), (1, 1)):
        check([s.input_ids for s in samples(seed, epoch)] != [s.input_ids for s in base], clause="PACK-22",
              what=f"seed {seed}, epoch {epoch} gave the same sample order as seed 0, epoch 0", repro=rep)
    firsts = [s.document_starts[1] if len(s.document_starts) > 1 else 64 - s.doc_ids.count(-1) for s in base]
    descending = sum(a >= b for a, b in itertools.pairwise(firsts)) / (len(firsts) - 1)
    check(descending < 0.8, clause="PACK-22", repro=rep,
          what=f"{descending:.0%} of adjacent samples have non-increasing first segments: a length order")
