"""Meta tests: reference.splits obeys SPLIT-1..SPLIT-7.

Oracles: Python list slicing for integer bounds, an integer-only
round-half-to-even written here (no ``round``, no ``Fraction``) for fractions
and percents, and, when installed, Hugging Face datasets' own resolver for
the split notation they share.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance import strategies as _ls
from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import SplitError
from reference.loader import ReferenceLoader
from reference.packing import NO_OFFSET, PackingConfig, prepare
from reference.resume import PipelineConfig, epoch_samples
from reference.splits import (
    SplitSpec,
    parse_bounds,
    parse_split,
    resolve_bound,
    resolve_slice,
    split_corpus,
    split_points,
)

sizes = st.integers(1, 60)
int_bounds = st.one_of(st.none(), st.integers(-80, 80))


def half_even(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded to the nearest integer, ties to the even one (integers only)."""
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def decimal_ratio(text: str) -> tuple[int, int]:
    """'12.5' -> (125, 10), by hand."""
    whole, _, frac = text.partition(".")
    return int(whole + frac), 10 ** len(frac)


def bound_text(bound) -> str:
    return "" if bound is None else str(bound)


@pytest.mark.clause("SPLIT-1", "SPLIT-5")
@given(n=sizes, start=int_bounds, stop=int_bounds)
def test_integer_bounds_select_what_python_list_slicing_selects(n, start, stop):
    expected = list(range(n))[start:stop]
    spec = f"train[{bound_text(start)}:{bound_text(stop)}]"
    repro = {"n": n, "start": start, "stop": stop}
    if not expected:
        assert_raises_typed(SplitError, resolve_slice, start, stop, n, clause="SPLIT-5", what="empty int slice", repro=repro)
        assert_raises_typed(SplitError, parse_split, spec, n, clause="SPLIT-5", what=f"parse_split({spec!r})", repro=repro)
        return
    assert_equal(list(resolve_slice(start, stop, n)), expected, clause="SPLIT-1", what="resolve_slice rows", repro=repro)
    assert_equal(list(parse_split(spec, n).rows), expected, clause="SPLIT-1", what=f"parse_split({spec!r}) rows", repro=repro)


@pytest.mark.clause("SPLIT-1")
@given(n=st.integers(0, 60), bound=st.integers(-80, 80))
def test_one_integer_bound_is_the_length_of_the_python_prefix_it_cuts(n, bound):
    assert_equal(resolve_bound(bound, n), len(list(range(n))[:bound]), clause="SPLIT-1", what=f"resolve_bound({bound}, {n})")


@pytest.mark.clause("SPLIT-2")
@pytest.mark.parametrize("n, fraction, expected", [
    (5, 0.7, 4), (5, 0.3, 2), (5, 0.5, 2), (10, 0.25, 2), (10, 0.35, 4), (10, 0.45, 4), (10, 0.15, 2),
    (3, 0.5, 2), (1, 0.5, 0), (7, 0.0, 0), (7, 1.0, 7), (0, 0.5, 0), (10**17, 0.7, 7 * 10**16),
])
def test_fraction_bounds_round_the_exact_decimal_product_half_to_even(n, fraction, expected):
    assert_equal(resolve_bound(fraction, n), expected, clause="SPLIT-2", what=f"resolve_bound({fraction}, n={n})")


@pytest.mark.clause("SPLIT-2")
@given(n=st.integers(0, 10**6), hundredths=st.integers(0, 100))
def test_two_digit_fractions_match_integer_half_even_rounding(n, hundredths):
    assert_equal(resolve_bound(hundredths / 100, n), half_even(hundredths * n, 100), clause="SPLIT-2",
                 what=f"resolve_bound({hundredths / 100}, n={n})")


@pytest.mark.clause("SPLIT-2")
@pytest.mark.parametrize("fraction", [-0.1, 1.5, -0.0000001, float("nan"), float("inf"), float("-inf")])
def test_fractions_outside_zero_to_one_are_refused(fraction):
    assert_raises_typed(SplitError, resolve_bound, fraction, 100, clause="SPLIT-2", what=f"resolve_bound({fraction})",
                        mentions=["fraction", "[0, 1]"])


@pytest.mark.clause("SPLIT-3")
def test_hugging_face_documented_percent_slice_of_999_rows_is_rows_500_to_519():
    assert_equal(parse_split("train[50%:52%]", 999), SplitSpec("train", range(500, 519)), clause="SPLIT-3",
                 what="train[50%:52%] of 999 rows")


@pytest.mark.clause("SPLIT-3")
@pytest.mark.parametrize("n, percent, expected", [
    (5, "10%", 0), (5, "30%", 2), (5, "50%", 2), (5, "-50%", 3), (5, "12.5%", 1), (4, "12.5%", 0), (12, "12.5%", 2),
    (100, "-0.4%", 100), (100, "-0%", 100), (100, "0%", 0), (100, "100%", 100), (100, "-100%", 0), (999, "-10%", 899),
])
def test_percent_bounds_round_half_to_even_and_negative_percents_count_from_the_end(n, percent, expected):
    assert_equal(resolve_bound(percent, n), expected, clause="SPLIT-3", what=f"resolve_bound({percent!r}, n={n})")


@pytest.mark.clause("SPLIT-3")
@given(n=st.integers(0, 10**6), whole=st.integers(0, 100), frac=st.one_of(st.just(""), st.from_regex(r"[0-9]{1,3}", fullmatch=True)))
def test_percents_match_integer_half_even_rounding_of_the_exact_decimal(n, whole, frac):
    text = f"{whole}.{frac}" if frac else str(whole)
    numerator, denominator = decimal_ratio(text)
    assume(numerator <= 100 * denominator)
    count = half_even(numerator * n, 100 * denominator)
    assert_equal(resolve_bound(f"{text}%", n), count, clause="SPLIT-3", what=f"resolve_bound('{text}%', n={n})")
    assert_equal(resolve_bound(f"-{text}%", n), n - count, clause="SPLIT-3", what=f"resolve_bound('-{text}%', n={n})")


@pytest.mark.clause("SPLIT-3")
@given(n=st.integers(1, 10**5), percent=st.integers(1, 99))
def test_first_and_last_p_percent_have_the_same_size_and_their_complements_tile(n, percent):
    head, tail = f"{percent}%", f"-{percent}%"
    count = resolve_bound(head, n)
    assume(0 < count < n)
    first, last = resolve_slice(None, head, n), resolve_slice(tail, None, n)
    repro = {"n": n, "percent": percent}
    assert_equal(len(first), len(last), clause="SPLIT-3", what="size of [-P%:] vs size of [:P%]", repro=repro)
    assert_exactly_once([*resolve_slice(None, tail, n), *last], range(n), clause="SPLIT-3", what="[:-P%] + [-P%:]", repro=repro)


@pytest.mark.clause("SPLIT-3")
@given(n=st.integers(20, 10**5))
def test_ten_fold_percent_slices_tile_the_dataset(n):
    folds = [parse_split(f"train[{k}%:{k + 10}%]", n).rows for k in range(0, 100, 10)]
    assert_exactly_once([row for fold in folds for row in fold], range(n), clause="SPLIT-3", what="10 folds", repro={"n": n})
    check(all(a.stop == b.start for a, b in itertools.pairwise(folds)), clause="SPLIT-3", what="folds are not contiguous",
          repro={"n": n, "folds": folds})


@pytest.mark.clause("SPLIT-3")
@pytest.mark.parametrize("percent", ["101%", "-101%", "100.5%", "1000%"])
def test_percents_beyond_one_hundred_are_refused(percent):
    assert_raises_typed(SplitError, resolve_bound, percent, 100, clause="SPLIT-3", what=f"resolve_bound({percent!r})",
                        mentions=[percent, "100%"])


@pytest.mark.clause("SPLIT-4")
@pytest.mark.parametrize("bound", [True, False, "10", "abc", "10 %", " 10%", "10%%", "+10%", "%", "1e2%", "10.%", ".5%",
                                   "١٠%", Fraction(1, 2), Decimal("0.5"), 1j, [1]])
def test_bounds_of_any_other_type_or_shape_are_refused(bound):
    assert_raises_typed(SplitError, resolve_bound, bound, 100, clause="SPLIT-4", what=f"resolve_bound({bound!r})",
                        mentions=[f"bound={bound!r}"])


@pytest.mark.clause("SPLIT-4")
def test_none_resolves_to_the_callers_default():
    assert_equal((resolve_bound(None, 7), resolve_bound(None, 7, default=7)), (0, 7), clause="SPLIT-4",
                 what="resolve_bound(None, 7) with default 0 and 7")


@pytest.mark.clause("SPLIT-5")
@pytest.mark.parametrize("start, stop", [(5, 5), (7, 3), ("90%", "10%"), (-1, -2), (None, 0), (10, None), (0.5, "50%"),
                                         ("-0.4%", None), (None, "0.4%")])
def test_slices_that_select_nothing_are_refused_naming_both_bounds_and_n(start, stop):
    assert_raises_typed(SplitError, resolve_slice, start, stop, 10, clause="SPLIT-5", what=f"resolve_slice({start!r}, {stop!r}, 10)",
                        mentions=[repr(start), repr(stop), "n=10"])


@pytest.mark.clause("SPLIT-5")
@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_an_empty_or_invalid_dataset_size_is_refused(n):
    assert_raises_typed(SplitError, resolve_slice, None, None, n, clause="SPLIT-5", what=f"resolve_slice(n={n!r})",
                        mentions=[f"n={n!r}"])
    assert_raises_typed(SplitError, parse_split, "train", n, clause="SPLIT-5", what=f"parse_split('train', n={n!r})")


@pytest.mark.clause("SPLIT-6")
@pytest.mark.parametrize("spec, expected", [
    ("train", SplitSpec("train", range(100))),
    ("train[10:]", SplitSpec("train", range(10, 100))),
    ("train[:10%]", SplitSpec("train", range(10))),
    ("train[10:20]", SplitSpec("train", range(10, 20))),
    ("train[-10:]", SplitSpec("train", range(90, 100))),
    ("train[10%:20%]", SplitSpec("train", range(10, 20))),
    ("train[-10%:]", SplitSpec("train", range(90, 100))),
    ("train[-80%:]", SplitSpec("train", range(20, 100))),
    ("train[:-5%]", SplitSpec("train", range(95))),
    ("test[10:50%]", SplitSpec("test", range(10, 50))),
    ("validation[12.5%:-3]", SplitSpec("validation", range(12, 97))),
    ("train.clean.100[:]", SplitSpec("train.clean.100", range(100))),
    ("_private2[0:1]", SplitSpec("_private2", range(1))),
])
def test_split_notation_examples_resolve_to_the_documented_rows(spec, expected):
    assert_equal(parse_split(spec, 100), expected, clause="SPLIT-6", what=f"parse_split({spec!r}, 100)")


@pytest.mark.clause("SPLIT-6")
@pytest.mark.parametrize("spec", ["train[", "train[a:b]", "train[1:2:3]", "[1:2]", "train[5%:abc]", "train[:101%]", "", "train[]",
                                  "train[1]", "train [1:2]", "train[1:2] ", "train[1:2]\n", "train+test", "train[:10%](closest)",
                                  "2train", "train[1.5:2]", "train[0.5:]", "train[ 1:2]", "tr-ain", "train.[1:2]"])
def test_malformed_split_specs_are_refused_with_the_accepted_forms(spec):
    assert_raises_typed(SplitError, parse_split, spec, 100, clause="SPLIT-6", what=f"parse_split({spec!r})",
                        mentions=["accepted forms", "name[start:stop]", "train[:10%]"])


split_bounds = st.one_of(st.none(), st.integers(-120, 120),
                         st.builds(lambda sign, p: f"{sign}{p}%", st.sampled_from(["", "-"]), st.integers(0, 100)))


@pytest.mark.clause("SPLIT-6")
@given(n=st.integers(1, 500), start=split_bounds, stop=split_bounds)
def test_each_bound_of_a_spec_keeps_its_own_unit(n, start, stop):
    def oracle(bound):
        if isinstance(bound, str):
            count = half_even(int(bound.strip("-%")) * n, 100)
            return n - count if bound.startswith("-") else count
        return bound

    python_start, python_stop = oracle(start), oracle(stop)
    expected = list(range(n))[python_start:python_stop]
    spec = f"train[{bound_text(start)}:{bound_text(stop)}]"
    repro = {"spec": spec, "n": n}
    if not expected:
        assert_raises_typed(SplitError, parse_split, spec, n, clause="SPLIT-5", what=f"parse_split({spec!r})", repro=repro)
    else:
        assert_equal(list(parse_split(spec, n).rows), expected, clause="SPLIT-6", what=f"parse_split({spec!r}) rows", repro=repro)


@pytest.mark.clause("SPLIT-3", "SPLIT-6")
@given(n=st.integers(1, 3000), start=split_bounds, stop=split_bounds, percent=st.booleans())
def test_single_unit_specs_agree_with_hugging_face_datasets(n, start, stop, percent):
    arrow_reader = pytest.importorskip("datasets.arrow_reader")
    start = _as_unit(start, percent)
    stop = _as_unit(stop, percent)
    assume(start != "-0%" and stop != "-0%")
    spec = f"train[{bound_text(start)}:{bound_text(stop)}]"
    hf = arrow_reader.ReadInstruction.from_spec(spec).to_absolute({"train": n})[0]
    assume(hf.from_ < hf.to)
    assume(not any(isinstance(b, str) and b.startswith("-") and resolve_bound(b, n) == n for b in (start, stop)))
    assert_equal(parse_split(spec, n).rows, range(hf.from_, hf.to), clause="SPLIT-6", what=f"parse_split({spec!r}) vs HF",
                 repro={"spec": spec, "n": n})


def _as_unit(bound, percent):
    if bound is None:
        return None
    if percent:
        return bound if isinstance(bound, str) else f"{max(-100, min(100, bound))}%"
    return int(bound.rstrip("%")) if isinstance(bound, str) else bound


fraction_vectors = st.lists(st.integers(0, 50), min_size=1, max_size=6).filter(sum).map(
    lambda weights: [w / sum(weights) for w in weights])


@pytest.mark.clause("SPLIT-7")
@given(n=st.integers(1, 10**6), fractions=fraction_vectors)
def test_split_points_tile_the_dataset_with_sizes_within_one_of_the_fractions(n, fractions):
    parts = split_points(n, fractions)
    repro = {"n": n, "fractions": fractions}
    assert_equal(len(parts), len(fractions), clause="SPLIT-7", what="number of parts", repro=repro)
    check(parts[0].start == 0 and parts[-1].stop == n and all(a.stop == b.start for a, b in itertools.pairwise(parts)),
          clause="SPLIT-7", what=f"parts {parts} do not tile [0, {n}) contiguously", repro=repro)
    check(all(p.step == 1 and p.start <= p.stop for p in parts), clause="SPLIT-7", what=f"parts {parts} are not ranges", repro=repro)
    for part, fraction in zip(parts, fractions):
        check(abs(len(part) - fraction * n) <= 1 + 1e-6, clause="SPLIT-7",
              what=f"part {part} has {len(part)} rows, not within 1 of {fraction} * {n}", repro=repro)


@pytest.mark.clause("SPLIT-7")
@given(n=st.integers(1, 300), fractions=fraction_vectors)
def test_split_points_cover_every_row_exactly_once(n, fractions):
    assert_exactly_once([row for part in split_points(n, fractions) for row in part], range(n), clause="SPLIT-7",
                        what="rows of all parts", repro={"n": n, "fractions": fractions})


@pytest.mark.clause("SPLIT-7")
@pytest.mark.parametrize("n, fractions, expected", [
    (10, [0.7, 0.15, 0.15], [range(7), range(7, 8), range(8, 10)]),
    (3, [1 / 3, 1 / 3, 1 / 3], [range(1), range(1, 2), range(2, 3)]),
    (3, [0.7, 0.15, 0.15], [range(2), range(2, 3), range(3, 3)]),
    (5, [0.5, 0.5], [range(2), range(2, 5)]),
    (7, [1.0], [range(7)]),
    (4, [0, 1, 0], [range(0), range(4), range(4, 4)]),
    (10, [0.5, 0.5 - 1e-10], [range(5), range(5, 10)]),
])
def test_split_points_of_small_datasets_match_the_hand_computed_boundaries(n, fractions, expected):
    assert_equal(split_points(n, fractions), expected, clause="SPLIT-7", what=f"split_points({n}, {fractions})")


@pytest.mark.clause("SPLIT-7")
@pytest.mark.parametrize("n, fractions, mention", [
    (10, [0.5, 0.4], "sum"), (10, [0.6, 0.6], "sum"), (10, [], "sum"), (10, [1.0 + 1e-8], "1"), (10, [0.5, 0.5 + 1e-8], "sum"),
    (10, [0.5, 0.5 - 1e-8], "sum"),
    (10, [1.2, -0.2], "fractions[0]"), (10, [0.5, float("nan")], "fractions[1]"), (10, ["0.5", 0.5], "fractions[0]"),
    (10, [True], "fractions[0]"), (0, [1.0], "n=0"),
])
def test_split_points_refuse_fractions_not_summing_to_one_and_empty_datasets(n, fractions, mention):
    assert_raises_typed(SplitError, split_points, n, fractions, clause="SPLIT-7", what=f"split_points({n}, {fractions})",
                        mentions=[mention])


# ---------------------------------------------------------------- SPLIT-8: a pipeline's split


@pytest.mark.clause("SPLIT-8")
@given(corpus=_ls.corpora(), data=st.data())
def test_split_corpus_keeps_exactly_the_rows_in_file_major_order(corpus, data):
    flat = [(f, d) for f, file in enumerate(corpus) for d in file]
    a = data.draw(st.integers(0, len(flat)))
    b = data.draw(st.integers(a, len(flat)))
    out = split_corpus(corpus, range(a, b))
    assert_equal([d for file in out for d in file], [d for _, d in flat[a:b]], clause="SPLIT-8", what="documents")
    assert_equal([len(f) for f in out], [n for n in (sum(1 for f, _ in flat[a:b] if f == i) for i in range(len(corpus))) if n],
                 clause="SPLIT-8", what="file boundaries clipped, empty files dropped")


@pytest.mark.clause("SPLIT-8")
@given(corpus=_ls.corpora(min_documents=2), config=_ls.pipeline_configs(), cut=st.sampled_from(["50%", "25%", "75%"]),
       epoch=st.integers(0, 3))
def test_train_and_validation_splits_are_disjoint_whatever_the_seed_and_epoch(corpus, config, cut, epoch):
    n = sum(len(f) for f in corpus)
    first = PipelineConfig(packing=PackingConfig(seq_len=config.packing.seq_len, mode="none"),
                           ordering=config.ordering, split=f"train[:{cut}]")
    second = PipelineConfig(packing=first.packing, ordering=config.ordering, split=f"train[{cut}:]")
    flat = [d for file in corpus for d in file]
    try:
        rows = (first.rows(n), second.rows(n))
    except SplitError:
        return   # one side is empty for this n (SPLIT-5)
    check(rows[0].stop == rows[1].start and rows[0].start == 0 and rows[1].stop == n, clause="SPLIT-8",
          what=f"rows {rows} do not tile [0, {n})")
    for cfg, r in zip((first, second), rows):
        kept = [d for d in flat[r.start:r.stop] if d]
        trained = [s.input_ids[:len(s.input_ids) - list(s.doc_ids).count(-1)] for s in epoch_samples(corpus, cfg, epoch)]
        check(all(any(list(t) == d[:len(t)] or list(t) == d[-len(t):] or _inside(list(t), d) for d in kept) for t in trained),
              clause="SPLIT-8", what="a sample of the split holds tokens of a document outside it",
              repro={"corpus": corpus, "config": cfg, "epoch": epoch})


@pytest.mark.clause("SPLIT-9")
@given(corpus=_ls.corpora(min_documents=2), config=_ls.pipeline_configs(), cut=st.sampled_from(["50%", "25%", "75%"]),
       epoch=st.integers(0, 2))
def test_split_doc_ids_are_store_indices_so_train_and_validation_ids_never_overlap(corpus, config, cut, epoch):
    n = sum(len(f) for f in corpus)
    flat = [d for file in corpus for d in file]
    halves = (PipelineConfig(packing=config.packing, ordering=config.ordering, split=f"train[:{cut}]"),
              PipelineConfig(packing=config.packing, ordering=config.ordering, split=f"train[{cut}:]"))
    try:
        rows = [cfg.rows(n) for cfg in halves]
    except SplitError:
        return   # one side is empty for this n (SPLIT-5)
    prepared = [prepare(d, config.packing) for d in flat]
    for cfg, r in zip(halves, rows):
        repro = {"corpus": corpus, "config": cfg, "epoch": epoch}
        for s in epoch_samples(corpus, cfg, epoch):
            for j, (doc, offset) in enumerate(zip(s.doc_ids, s.token_offsets)):
                check(doc == -1 or doc in r, clause="SPLIT-9", what=f"doc id {doc} outside the split's rows {r}",
                      repro=repro)
                check(doc == -1 or offset == NO_OFFSET or s.input_ids[j] == prepared[doc][offset], clause="SPLIT-9",
                      what=f"input {s.input_ids[j]} at {j} is not store document {doc}'s token {offset}", repro=repro)


def _inside(part: list[int], doc: list[int]) -> bool:
    return any(doc[i:i + len(part)] == part for i in range(len(doc) - len(part) + 1))


@pytest.mark.clause("SPLIT-8", "SPLIT-9")
def test_split_notation_and_pairs_give_the_same_pipeline_and_enter_the_fingerprint():
    p = PackingConfig(seq_len=2, mode="none", overflow="truncate")
    corpus = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]
    assert_equal(PipelineConfig(packing=p, split="train[1:3]"), PipelineConfig(packing=p, split=(1, 3)),
                 clause="SPLIT-8", what="notation and pair")
    assert_equal(parse_bounds("validation[-10%:]"), ("validation", "-10%", None), clause="SPLIT-8", what="bounds as written")
    whole = ReferenceLoader(corpus, PipelineConfig(packing=p))
    part = ReferenceLoader(corpus, PipelineConfig(packing=p, split="train[1:3]"))
    check(whole.fingerprint != part.fingerprint, clause="SPLIT-8", what="the split must change the fingerprint")
    assert_equal([s.input_ids for s in part.samples(0)], [(4, 5), (7, 8)], clause="SPLIT-8", what="rows 1 and 2")
    assert_equal([s.doc_ids[0] for s in part.samples(0)], [1, 2], clause="SPLIT-9", what="ids are the store's rows 1 and 2")
    for bad in ("train[100]", "train[a:b]"):
        assert_raises_typed(SplitError, PipelineConfig, packing=p, split=bad, clause="SPLIT-8", what=bad, mentions=[bad])
    assert_raises_typed(SplitError, PipelineConfig(packing=p, split=(10, 20)).rows, 4, clause="SPLIT-8",
                        what="rows beyond the store", mentions=["empty"])


@pytest.mark.clause("SPLIT-8")
@pytest.mark.parametrize("spec", ["validation[:10]", "test", "train.clean[:5%]"])
def test_a_pipeline_split_naming_another_split_than_train_is_refused_never_a_slice_of_train(spec):
    p = PackingConfig(seq_len=2, mode="none", overflow="truncate")
    assert_raises_typed(SplitError, PipelineConfig, packing=p, split=spec, clause="SPLIT-8", what=spec,
                        mentions=[spec, "train", "train[99%:]"])
