"""Splits: virtual, contiguous slices of a dataset of n examples (SPLIT-*).

Why a specification: "train[:10%]" must select the same rows in every
loader, every process and every run, or evaluation data leaks into training.
The rules follow Python slicing for integer bounds and Hugging Face datasets'
"closest" rounding for fractions and percents, with deliberate differences
that refuse or keep input instead of guessing:

- a percent outside [-100%, 100%] and a slice that selects nothing raise
  SplitError (HF clamps, or returns an empty split);
- each bound keeps its own unit (HF reads "train[10:50%]" as 10% to 50%;
  here it is row 10 up to 50%);
- "-P%" is always ``n - round(P * n / 100)``, so "train[-0.4%:]" of 100 rows
  is empty (refused) rather than HF's whole split (HF turns the rounded 0
  into the index -0, which is 0).

Rounding is Python's ``round`` (half to even) of the *exact* product, computed
with ``fractions.Fraction``; a float is read as the decimal it prints as
(``repr``), so ``0.7`` means exactly 7/10 (SPLIT-2, SPLIT-3).

Worked example (n = 999, HF's documented case)::

    >>> parse_split("train[50%:52%]", 999)      # 499.5 -> 500 (half to even), 519.48 -> 519
    SplitSpec(name='train', rows=range(500, 519))
    >>> split_points(10, [0.7, 0.15, 0.15])     # boundaries 7, round(8.5) = 8, 10
    [range(0, 7), range(7, 8), range(8, 10)]
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from reference.errors import SplitError, is_int, require

Bound = int | float | str | None

STORE_SPLIT = "train"
"""The one split a token store holds: split notation on a pipeline must name it (SPLIT-8)."""

ACCEPTED_FORMS = ('accepted forms: "name" (whole split) or "name[start:stop]" where name is an identifier '
                  '(dots allowed, e.g. "train.clean") and start/stop are each empty, an integer (negative counts '
                  'from the end) or a percent "NN%"/"NN.N%" in [-100%, 100%]; e.g. "train", "train[10000:]", '
                  '"train[:10%]", "train[1000:10000]", "train[-1000:]", "train[10%:20%]", "train[-10%:]"')

_PERCENT = r"-?\d+(?:\.\d+)?%"
_INTEGER = r"-?\d+"
_PERCENT_RE = re.compile(r"(-?)(\d+(?:\.\d+)?)%", re.ASCII)
_SPEC_RE = re.compile(
    rf"(?P<name>[A-Za-z_]\w*(?:\.\w+)*)(?:\[(?P<start>{_PERCENT}|{_INTEGER})?:(?P<stop>{_PERCENT}|{_INTEGER})?\])?",
    re.ASCII,
)


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """A parsed split: its name and the rows it selects (SPLIT-6).

    Why a dataclass and not a bare range: the name says which stored split the
    rows index into; a loader that receives "test[:5%]" must not slice "train".
    """

    name: str
    rows: range


def _check_n(n: int) -> None:
    require(is_int(n) and n >= 0, SplitError, f"n={n!r} must be a non-negative integer (the number of examples)")


def _clamp_index(index: int, n: int) -> int:
    """Python slice semantics for one integer bound: negative counts from the end, then clamp to [0, n]."""
    if index < 0:
        index += n
    return min(max(index, 0), n)


def resolve_bound(bound: Bound, n: int, *, default: int = 0) -> int:
    """One slice bound as a row index in ``[0, n]`` (SPLIT-1..SPLIT-4).

    Why each form: ints are row indices exactly as in Python slicing
    (SPLIT-1); floats are fractions of n (SPLIT-2); ``"NN%"`` strings are
    percents of n, negative ones counting from the end (SPLIT-3). ``None``
    resolves to ``default`` (0 for a start; ``resolve_slice`` passes n for a
    stop). Anything else, including ``True`` and int-like strings such as
    ``"10"``, is refused (SPLIT-4): ``1`` is row 1 and ``1.0`` is all rows,
    so the type must be unambiguous.

    Clauses: SPLIT-1, SPLIT-2, SPLIT-3, SPLIT-4.

    Worked example (n = 5)::

        >>> [resolve_bound(b, 5) for b in (2, -2, 99, -99)]
        [2, 3, 5, 0]
        >>> [resolve_bound(f, 5) for f in (0.7, 0.3, 0.5, 1.0)]   # 3.5 -> 4, 1.5 -> 2, 2.5 -> 2, 5
        [4, 2, 2, 5]
        >>> [resolve_bound(p, 5) for p in ("10%", "50%", "-50%", "12.5%")]   # 0.5 -> 0, 2.5 -> 2, 5 - 2, 0.625 -> 1
        [0, 2, 3, 1]
        >>> resolve_bound("10", 5)
        Traceback (most recent call last):
        ...
        reference.errors.SplitError: bound='10' is not a percent "NN%"/"NN.N%" (e.g. "10%" or "-12.5%"); pass an int for a row index
    """
    _check_n(n)
    if bound is None:
        return default
    require(not isinstance(bound, bool), SplitError,
            f"bound={bound!r} is a bool; pass an int row index, a float fraction in [0, 1] or a percent string like \"10%\"")
    if isinstance(bound, int):
        return _clamp_index(bound, n)
    if isinstance(bound, float):
        require(math.isfinite(bound) and 0.0 <= bound <= 1.0, SplitError,
                f"bound={bound!r} is a fraction outside [0, 1]; pass a fraction in [0, 1], a percent string like \"-10%\" "
                "to count from the end, or an int row index")
        return round(Fraction(repr(bound)) * n)
    if isinstance(bound, str):
        match = _PERCENT_RE.fullmatch(bound)
        require(match is not None, SplitError,
                f"bound={bound!r} is not a percent \"NN%\"/\"NN.N%\" (e.g. \"10%\" or \"-12.5%\"); pass an int for a row index")
        assert match is not None
        percent = Fraction(match[2])
        require(percent <= 100, SplitError, f"bound={bound!r} is a percent outside [-100%, 100%]; pass at most 100%")
        count = round(percent * n / 100)
        return n - count if match[1] else count
    raise SplitError(f"bound={bound!r} of type {type(bound).__name__} is not a slice bound; "
                     "pass None, an int row index, a float fraction in [0, 1] or a percent string like \"10%\"")


def resolve_slice(start: Bound, stop: Bound, n: int) -> range:
    """The rows ``[start, stop)`` of a dataset of n examples; refuses to select nothing (SPLIT-5).

    Why refuse an empty slice: an empty evaluation split is almost always a
    typo ("train[90%:10%]") that would otherwise pass silently as "no data".

    Clauses: SPLIT-5 (and SPLIT-1..SPLIT-4 through ``resolve_bound``).

    >>> resolve_slice(None, "10%", 100), resolve_slice(-10, None, 100), resolve_slice(0.25, "75%", 8)
    (range(0, 10), range(90, 100), range(2, 6))
    >>> resolve_slice("90%", "10%", 100)
    Traceback (most recent call last):
    ...
    reference.errors.SplitError: slice [start='90%' : stop='10%'] of n=100 examples resolves to rows [90, 10), which is empty; pick a start below the stop
    """
    _check_n(n)
    require(n > 0, SplitError, f"n=0: there is nothing to split (slice [start={start!r} : stop={stop!r}]); check the dataset is not empty")
    first = resolve_bound(start, n, default=0)
    last = resolve_bound(stop, n, default=n)
    require(first < last, SplitError,
            f"slice [start={start!r} : stop={stop!r}] of n={n} examples resolves to rows [{first}, {last}), which is empty; "
            "pick a start below the stop")
    return range(first, last)


def _parsed_bound(text: str | None) -> int | str | None:
    if text is None or text.endswith("%"):
        return text
    return int(text)


def parse_split(spec: str, n: int) -> SplitSpec:
    """Hugging Face split notation ``name`` or ``name[start:stop]`` resolved against n examples (SPLIT-6).

    Why return a SplitSpec: the caller needs both which split to open and
    which of its rows to read. Each bound keeps its own unit, so
    ``"train[10:50%]"`` is row 10 up to 50% (HF would read both as percents).
    Concatenation (``"train+test"``) and HF's rounding suffix (``"(pct1_dropremainder)"``)
    are not part of this notation and are refused.

    Clauses: SPLIT-6 (and SPLIT-1..SPLIT-5 for the bounds and the slice).

    >>> parse_split("train", 100)
    SplitSpec(name='train', rows=range(0, 100))
    >>> parse_split("train[:10%]", 100).rows, parse_split("train[-10%:]", 100).rows, parse_split("test[10:50%]", 100).rows
    (range(0, 10), range(90, 100), range(10, 50))
    >>> parse_split("train[1:2:3]", 100)
    Traceback (most recent call last):
    ...
    reference.errors.SplitError: split spec 'train[1:2:3]' is malformed; accepted forms: "name" (whole split) or "name[start:stop]" where name is an identifier (dots allowed, e.g. "train.clean") and start/stop are each empty, an integer (negative counts from the end) or a percent "NN%"/"NN.N%" in [-100%, 100%]; e.g. "train", "train[10000:]", "train[:10%]", "train[1000:10000]", "train[-1000:]", "train[10%:20%]", "train[-10%:]"
    """
    require(isinstance(spec, str), SplitError, f"split spec {spec!r} must be a string; {ACCEPTED_FORMS}")
    match = _SPEC_RE.fullmatch(spec)
    require(match is not None, SplitError, f"split spec {spec!r} is malformed; {ACCEPTED_FORMS}")
    assert match is not None
    try:
        rows = resolve_slice(_parsed_bound(match["start"]), _parsed_bound(match["stop"]), n)
    except SplitError as exc:
        raise SplitError(f"split spec {spec!r}: {exc}; {ACCEPTED_FORMS}") from exc
    return SplitSpec(match["name"], rows)


def _exact_fraction(value: object, index: int) -> Fraction:
    ok = (isinstance(value, (int, float)) and (is_int(value) or isinstance(value, float))
          and math.isfinite(value) and 0 <= value <= 1)
    require(ok, SplitError, f"fractions[{index}]={value!r} must be a number in [0, 1]")
    assert isinstance(value, (int, float))
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def split_points(n: int, fractions: Sequence[float]) -> list[range]:
    """Contiguous splits (train/val/test style) that tile ``[0, n)`` exactly (SPLIT-7).

    Why cumulative boundaries: rounding each part's size separately can lose
    or duplicate a row (3 x round(10/3) = 9); rounding the cumulative
    boundary ``round(n * (f_0 + ... + f_i))`` (half to even, exact) and
    forcing the last boundary to n cannot. Each part's size is within 1 of
    ``f_i * n``; a part may be empty when n is small. The fractions must sum
    to 1 within 1e-9.

    Clauses: SPLIT-7.

    >>> split_points(10, [0.7, 0.15, 0.15])   # 7, round(8.5) = 8, 10
    [range(0, 7), range(7, 8), range(8, 10)]
    >>> split_points(3, [1/3, 1/3, 1/3])
    [range(0, 1), range(1, 2), range(2, 3)]
    >>> split_points(10, [0.5, 0.4])
    Traceback (most recent call last):
    ...
    reference.errors.SplitError: fractions=[0.5, 0.4] sum to 0.9, not 1 (within 1e-9); make the parts add up to 1, e.g. [0.7, 0.15, 0.15]
    """
    _check_n(n)
    require(n > 0, SplitError, "n=0: there is nothing to split; check the dataset is not empty")
    parts = [_exact_fraction(f, i) for i, f in enumerate(fractions)]
    total = sum(parts, Fraction(0))
    require(len(parts) > 0 and abs(total - 1) <= Fraction(1, 10**9), SplitError,
            f"fractions={list(fractions)!r} sum to {float(total):.12g}, not 1 (within 1e-9); "
            "make the parts add up to 1, e.g. [0.7, 0.15, 0.15]")
    bounds, cumulative = [0], Fraction(0)
    for part in parts[:-1]:
        cumulative += part
        bounds.append(min(round(cumulative * n), n))
    bounds.append(n)
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def parse_bounds(spec: str) -> tuple[str, int | str | None, int | str | None]:
    """The name and the two bounds of split notation, without resolving them against n (SPLIT-6, SPLIT-8).

    Why: a pipeline configuration records the bounds as written (they are
    part of its fingerprint) before it sees the data they resolve against.

    >>> parse_bounds("train[:80%]"), parse_bounds("train[10000:]"), parse_bounds("train")
    (('train', None, '80%'), ('train', 10000, None), ('train', None, None))

    Clauses: SPLIT-6, SPLIT-8.
    """
    require(isinstance(spec, str), SplitError, f"split spec {spec!r} must be a string; {ACCEPTED_FORMS}")
    match = _SPEC_RE.fullmatch(spec)
    require(match is not None, SplitError, f"split spec {spec!r} is malformed; {ACCEPTED_FORMS}")
    assert match is not None
    return match["name"], _parsed_bound(match["start"]), _parsed_bound(match["stop"])


def split_corpus(corpus: Sequence[Sequence[Sequence[int]]], rows: range) -> list[list[Sequence[int]]]:
    """The documents ``rows`` of a corpus's file-major order, as a corpus of its own (SPLIT-8).

    Why before ordering: a split is a fixed set of documents (a validation set
    must not change with the shuffle seed or the epoch), so it is cut from
    the stored order and ORD then shuffles only inside it. Files keep their
    boundaries, clipped to the rows; files left with no document are dropped.
    The returned corpus counts its documents from 0; ``epoch_samples`` reports
    document ``d`` of it as the store's ``rows.start + d`` (SPLIT-9).

    >>> split_corpus([[[1], [2]], [[3], [4], [5]], [[6]]], range(1, 4))
    [[[2]], [[3], [4]]]

    Clauses: SPLIT-8, SPLIT-9.
    """
    out: list[list[Sequence[int]]] = []
    start = 0
    for file in corpus:
        stop = start + len(file)
        lo, hi = max(start, rows.start), min(stop, rows.stop)
        if lo < hi:
            out.append(list(file[lo - start:hi - start]))
        start = stop
    return out
