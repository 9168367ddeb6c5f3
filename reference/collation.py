"""Collation: padding, masks and varlen boundaries on plain lists (COLL-*).

Why a specification: collation bugs are silent. A mask that is off by one
trains on padding; a "first token" pooler that assumes right padding pools a
pad token when the batch is left padded; a varlen boundary in the wrong place
lets one document attend to another. These list versions of d9d's padding
utilities are the meaning that tensor implementations are checked against.

Worked example (d9d's documentation example)::

    >>> pad_stack_1d([[1, 2, 3], [4], [5, 6]], 0)
    [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    >>> pad_stack_1d([[1, 2, 3], [4], [5, 6]], 0, side="left")
    [[1, 2, 3], [0, 0, 4], [0, 5, 6]]
    >>> token_pooling_mask(attention_mask([3, 1, 2], side="left"), "first")
    [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from reference.errors import ConfigError, is_int, require
from reference.packing import NO_DOC

Side = Literal["right", "left"]
Pooling = Literal["first", "last", "all"]
SIDES = ("right", "left")
POOLINGS = ("first", "last", "all")

IGNORE_INDEX = -100
"""The label of a padding position: loss functions skip it (COLL-9)."""

FIELD_PADDING: Mapping[str, int | None] = {"input_ids": None, "labels": IGNORE_INDEX, "position_ids": 0, "doc_ids": NO_DOC}
"""The fields ``collate_samples`` stacks and the value each is padded with (``None``: the caller's ``pad_id``)."""


def _check_side(side: str) -> None:
    require(side in SIDES, ConfigError, f"side={side!r} is not a padding side; choose one of {SIDES}")


def _target_length(longest: int, pad_to_multiple_of: int | None) -> int:
    require(pad_to_multiple_of is None or (is_int(pad_to_multiple_of) and pad_to_multiple_of >= 1), ConfigError,
            f"pad_to_multiple_of={pad_to_multiple_of!r} must be an integer >= 1, or None for no rounding")
    multiple = pad_to_multiple_of or 1
    return -(-longest // multiple) * multiple


def _pad_row(row: Sequence[int], width: int, pad_value: int, side: str) -> list[int]:
    padding = [pad_value] * (width - len(row))
    return list(row) + padding if side == "right" else padding + list(row)


def pad_stack_1d(items: Sequence[Sequence[int]], pad_value: int, *, side: Side = "right",
                 pad_to_multiple_of: int | None = None) -> list[list[int]]:
    """Stack variable-length rows into one rectangle by padding each on ``side``.

    Why round up: kernels (tensor cores, flash attention blocks) run faster on
    lengths that are multiples of 8 or 64, and a fixed multiple keeps the set
    of shapes (and thus compilations) small.

    Worked example (longest row 3, multiple of 4, so every row has 4 entries)::

        >>> pad_stack_1d([[1, 2, 3], [4]], -1, pad_to_multiple_of=4)
        [[1, 2, 3, -1], [4, -1, -1, -1]]
        >>> pad_stack_1d([[], []], 0)
        [[], []]

    Clauses: COLL-1, COLL-2.
    """
    require(len(items) > 0, ConfigError, "items is empty; pad_stack_1d needs at least one row to know the batch shape")
    _check_side(side)
    width = _target_length(max(len(row) for row in items), pad_to_multiple_of)
    return [_pad_row(row, width, pad_value, side) for row in items]


def attention_mask(lengths: Sequence[int], *, side: Side = "right", total: int | None = None) -> list[list[int]]:
    """The 0/1 mask of rows of ``lengths`` real tokens padded to ``total`` on ``side``.

    Why from lengths: the mask must mark exactly the positions where
    ``pad_stack_1d`` put real tokens (1) and padding (0), whatever the token
    values are; a pad id that also occurs as a real token cannot tell them apart.

    >>> attention_mask([2, 0, 3])
    [[1, 1, 0], [0, 0, 0], [1, 1, 1]]
    >>> attention_mask([2, 1], side="left", total=4)
    [[0, 0, 1, 1], [0, 0, 0, 1]]

    Clauses: COLL-3.
    """
    _check_side(side)
    for i, length in enumerate(lengths):
        require(is_int(length) and length >= 0, ConfigError, f"lengths[{i}]={length!r} must be a non-negative integer")
    longest = max(lengths, default=0)
    width = longest if total is None else total
    require(is_int(width) and width >= longest, ConfigError,
            f"total={total!r} must be an integer >= the longest length {longest}; omit it to use the longest length")
    return [_pad_row([1] * length, width, 0, side) for length in lengths]


def token_pooling_mask(attention_mask: Sequence[Sequence[int]], pooling: Pooling) -> list[list[int]]:
    """The positions a pooler reads: the first, the last, or all real tokens of each row.

    Why positions come from the mask, not from the row ends: under left
    padding position 0 is padding, so "first" must be the first 1 of the mask
    (d9d's "first" picks position 0 and pools a pad token there). A row
    without real tokens selects nothing.

    Worked example (rows padded on the left and on the right)::

        >>> token_pooling_mask([[0, 1, 1], [1, 1, 0], [0, 0, 0]], "first")
        [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
        >>> token_pooling_mask([[0, 1, 1], [1, 1, 0], [0, 0, 0]], "last")
        [[0, 0, 1], [0, 1, 0], [0, 0, 0]]
        >>> token_pooling_mask([[0, 1, 1], [1, 1, 0]], "all")
        [[0, 1, 1], [1, 1, 0]]

    Clauses: COLL-4, COLL-5, COLL-6, COLL-7.
    """
    require(pooling in POOLINGS, ConfigError, f"pooling={pooling!r} is not a pooling; choose one of {POOLINGS}")
    pooled = []
    for r, row in enumerate(attention_mask):
        require(all(v in (0, 1) and not isinstance(v, bool) for v in row), ConfigError,
                f"attention_mask[{r}]={list(row)!r} must hold only 0 and 1; build it with attention_mask(lengths)")
        real = [i for i, v in enumerate(row) if v == 1]
        if pooling == "all" or not real:
            chosen = set(real)
        else:
            chosen = {real[0] if pooling == "first" else real[-1]}
        pooled.append([1 if i in chosen else 0 for i in range(len(row))])
    return pooled


def cu_seqlens(position_ids: Sequence[int], doc_ids: Sequence[int] | None = None) -> list[int]:
    """Cumulative segment lengths of one packed row, for varlen attention.

    Why: a packed row holds several documents; varlen attention kernels take
    their boundaries as offsets ``[0, end_1, end_2, ..., len]`` so that no token
    attends across a boundary. A segment starts at index 0 and wherever the
    position id of a real token resets to 0 (COLL-8). Index 0 starts a segment
    even when its position is not 0: that is a document continued from the
    previous pack.

    Padding (``doc_ids == -1``, the value ``collate_samples`` and the packer
    pad ``doc_ids`` with) is one segment per run, not one per position
    (COLL-11): padding's position ids are all 0, and a segment per position
    turned a padded row into thousands of length-1 segments. It stays a
    segment rather than being left out because ``flash_attn_varlen_func``
    writes output only for the tokens its segments cover: uncovered padding
    rows would hold uninitialised memory (possibly NaN). Its length counts
    toward ``max_seqlen``, which the kernel needs ``>=`` every segment.
    Without ``doc_ids`` no position is known to be padding (a padding 0 looks
    like a one-token document), so every position 0 starts a segment.

    >>> cu_seqlens([0, 1, 2, 0, 1, 0])
    [0, 3, 5, 6]
    >>> cu_seqlens([7, 8, 0, 1])
    [0, 2, 4]
    >>> cu_seqlens([0, 1, 0, 0, 0, 0], doc_ids=[4, 4, 5, -1, -1, -1])
    [0, 2, 3, 6]
    >>> cu_seqlens([])
    [0]

    Clauses: COLL-8, COLL-11.
    """
    for i, position in enumerate(position_ids):
        require(is_int(position) and position >= 0, ConfigError,
                f"position_ids[{i}]={position!r} must be a non-negative integer")
    if doc_ids is None:
        padding = [False] * len(position_ids)
    else:
        require(len(doc_ids) == len(position_ids), ConfigError,
                f"doc_ids has {len(doc_ids)} entries but position_ids has {len(position_ids)}; "
                "pass the row's doc_ids, one per position")
        for i, doc in enumerate(doc_ids):
            require(is_int(doc) and doc >= NO_DOC, ConfigError,
                    f"doc_ids[{i}]={doc!r} must be a document id >= 0, or {NO_DOC} for padding")
        padding = [doc == NO_DOC for doc in doc_ids]
    starts = [i for i, position in enumerate(position_ids)
              if i == 0 or padding[i] != padding[i - 1] or (not padding[i] and position == 0)]
    return starts + [len(position_ids)] if position_ids else [0]


def collate_samples(samples: Sequence[Mapping[str, Sequence[int]]], *, pad_id: int,
                    pad_to_multiple_of: int | None = None) -> dict[str, list[list[int]]]:
    """Stack a batch of samples into rectangular fields, right-padded, plus their attention mask.

    Each sample maps field names to equally long token sequences:
    ``input_ids`` (required) and any of ``labels``, ``position_ids``,
    ``doc_ids`` (present in every sample or in none). Padding values: the
    caller's ``pad_id`` for input ids, -100 for labels (ignored by the loss),
    0 for position ids, -1 for document ids (no document). ``attention_mask``
    marks the real tokens. A sample with no tokens becomes a row of padding:
    that is how a loader materialises a PART-5 padding slot, masked entirely.

    Why strict about keys: a field silently dropped or half-present is data
    loss that no later stage can detect.

    >>> out = collate_samples([{"input_ids": [5, 6], "labels": [6, 7]}, {"input_ids": [8], "labels": [9]}], pad_id=0)
    >>> out["input_ids"], out["labels"], out["attention_mask"]
    ([[5, 6], [8, 0]], [[6, 7], [9, -100]], [[1, 1], [1, 0]])

    Clauses: COLL-9, COLL-10.
    """
    require(len(samples) > 0, ConfigError, "samples is empty; collate_samples needs at least one sample")
    require(is_int(pad_id), ConfigError, f"pad_id={pad_id!r} must be an integer token id")
    fields = [name for name in FIELD_PADDING if name in samples[0]]
    require("input_ids" in fields, ConfigError,
            f"samples[0] has no 'input_ids' (fields {sorted(samples[0])}); every sample needs input_ids")
    for s, sample in enumerate(samples):
        unknown = sorted(set(sample) - set(FIELD_PADDING))
        require(not unknown, ConfigError,
                f"samples[{s}] has unknown fields {unknown}; collate_samples stacks only {list(FIELD_PADDING)}: drop the others first")
        require(set(sample) == set(fields), ConfigError,
                f"samples[{s}] has fields {sorted(sample)} but samples[0] has {sorted(fields)}; every sample needs the same fields")
        lengths = {name: len(sample[name]) for name in fields}
        require(len(set(lengths.values())) == 1, ConfigError,
                f"samples[{s}] has fields of different lengths {lengths}; every field of a sample needs one entry per token")
    out = {name: pad_stack_1d([sample[name] for sample in samples],
                              _field_padding(name, pad_id),
                              pad_to_multiple_of=pad_to_multiple_of)
           for name in fields}
    out["attention_mask"] = attention_mask([len(sample["input_ids"]) for sample in samples],
                                           total=len(out["input_ids"][0]))
    return out


def _field_padding(name: str, pad_id: int | None) -> int:
    """The padding value of field ``name``: its fixed one, else ``pad_id`` (required for such fields)."""
    fixed = FIELD_PADDING[name]
    if fixed is not None:
        return fixed
    require(pad_id is not None, ConfigError, f"field {name!r} pads with pad_id, but pad_id is None; pass pad_id=<id>")
    assert pad_id is not None
    return pad_id
