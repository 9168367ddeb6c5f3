"""Collation on torch tensors: stacking packed samples into a batch, with varlen boundaries.

Conforms to COLL-1, COLL-2 (``pad_stack_1d``) and COLL-8, COLL-11
(``cu_seqlens``, ``max_seqlen``) of docs/SEMANTICS.md ("Collation"), mirroring
``reference.collation`` bit for bit; ``collate`` is the ``collate_fn`` of
``impl.loader``.

Why cu_seqlens over the flattened batch: varlen attention kernels
(flash-attn's ``flash_attn_varlen_func``, torch's nested/jagged SDPA) take one
long token sequence and the offsets where its segments start, so no token of a
packed row attends to another document. A segment starts at every row start
and wherever ``position_ids`` of a real token resets to 0 (COLL-8); a row
starting mid-document (position != 0) still starts a segment, since the
previous row is another sample. A run of padding (``doc_ids == -1``) is one
segment (COLL-11), so a padded row adds one segment, not one per pad.

Worked example (2 rows of 4 positions; row 0 holds documents of 3 and 1
tokens, row 1 continues a document for 2 positions, then a new one)::

    >>> import torch
    >>> def sample(pos):
    ...     t = torch.tensor(pos)
    ...     return {"input_ids": t + 10, "position_ids": t, "epoch": torch.tensor(0), "sample_index": torch.tensor(0)}
    >>> out = collate([sample([0, 1, 2, 0]), sample([5, 6, 0, 1])])
    >>> out["input_ids"].shape, out["cu_seqlens"].tolist(), out["max_seqlen"]
    (torch.Size([2, 4]), [0, 3, 4, 6, 8], 3)
    >>> pad_stack_1d([torch.tensor([1, 2, 3]), torch.tensor([4])], 0, side="left").tolist()
    [[1, 2, 3], [0, 0, 4]]
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, overload

import numpy as np
import torch

from impl.errors import ConfigError, is_int, require
from reference.collation import SIDES
from reference.packing import NO_DOC

__all__ = ["PaddingSide1D", "SampleBatch", "TokenPoolingType", "attention_mask", "batch_cu_seqlens", "collate",
           "cu_seqlens", "pad_stack_1d", "sample_cu_seqlens", "token_pooling_mask_from_attention_mask"]

_BATCH_ONLY = ("cu_seqlens", "max_seqlen")


def pad_stack_1d(items: Sequence[torch.Tensor | Sequence[int]], pad_value: float, *, side: str = "right",
                 pad_to_multiple_of: int | None = None) -> torch.Tensor:
    """Stack 1-d rows of different lengths into ``[N, T]``, padding each on ``side`` (COLL-1, COLL-2).

    ``T`` is the longest length rounded up to ``pad_to_multiple_of``. The
    result's dtype is the promotion of the rows' dtypes (lists become int64).
    One boolean-mask write places every real token: no Python loop per row
    beyond reading the lengths.

    >>> pad_stack_1d([torch.tensor([1, 2, 3]), torch.tensor([4])], -1, pad_to_multiple_of=4).tolist()
    [[1, 2, 3, -1], [4, -1, -1, -1]]
    """
    require(len(items) > 0, ConfigError, "items is empty; pad_stack_1d needs at least one row to know the batch shape")
    require(side in SIDES, ConfigError, f"side={side!r} is not a padding side; choose one of {SIDES}")
    require(pad_to_multiple_of is None or (is_int(pad_to_multiple_of) and pad_to_multiple_of >= 1), ConfigError,
            f"pad_to_multiple_of={pad_to_multiple_of!r} must be an integer >= 1, or None for no rounding")
    rows = [t if isinstance(t, torch.Tensor) else torch.as_tensor(list(t), dtype=torch.int64) for t in items]
    for i, row in enumerate(rows):
        require(row.dim() == 1, ConfigError,
                f"items[{i}] has shape {tuple(row.shape)}; pad_stack_1d stacks 1-d rows: flatten or split it first")
    dtype = rows[0].dtype
    for row in rows[1:]:
        dtype = torch.promote_types(dtype, row.dtype)
    lengths = torch.tensor([row.numel() for row in rows], dtype=torch.int64)
    multiple = pad_to_multiple_of or 1
    width = -(-int(lengths.max()) // multiple) * multiple
    out = torch.full((len(rows), width), pad_value, dtype=dtype, device=rows[0].device)
    columns = torch.arange(width)
    real = columns < lengths[:, None] if side == "right" else columns >= (width - lengths)[:, None]
    out[real.to(out.device)] = torch.cat([row.to(dtype) for row in rows])
    return out


def _segment_starts(position_ids: np.ndarray, doc_ids: np.ndarray | None) -> np.ndarray:
    """The boolean ``[..., L]`` mask of segment starts (COLL-8, COLL-11): row starts, real resets, padding-run edges."""
    starts: np.ndarray = position_ids == 0
    if doc_ids is not None:
        require(doc_ids.shape == position_ids.shape, ConfigError,
                f"doc_ids has shape {tuple(doc_ids.shape)} but position_ids has {tuple(position_ids.shape)}; "
                "pass the batch's doc_ids, one per position")
        padding = doc_ids == NO_DOC
        starts &= ~padding
        starts[..., 1:] |= padding[..., 1:] != padding[..., :-1]
    if position_ids.shape[-1]:
        starts[..., 0] = True
    return starts


def batch_cu_seqlens(position_ids: np.ndarray, doc_ids: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``cu_seqlens`` in numpy: int32 segment starts over the flattened ``[B, L]`` batch, plus the end.

    The one implementation: ``cu_seqlens`` wraps it for torch tensors, and
    the batched dataset path calls it on numpy rows before any tensor exists.
    With ``doc_ids``, each run of padding (``doc_ids == -1``) is one segment
    (COLL-11), and counts toward ``max_seqlen``.

    >>> batch_cu_seqlens(np.array([[0, 1, 2, 0], [5, 6, 0, 1]]))
    (array([0, 3, 4, 6, 8], dtype=int32), 3)
    >>> batch_cu_seqlens(np.array([[0, 1, 0, 0], [0, 0, 0, 0]]), np.array([[3, 3, -1, -1], [-1, -1, -1, -1]]))
    (array([0, 2, 4, 8], dtype=int32), 4)
    """
    rows, length = position_ids.shape
    idx = np.flatnonzero(_segment_starts(position_ids, doc_ids))
    cu = np.empty(len(idx) + 1, dtype=np.int32)
    cu[:-1] = idx
    cu[-1] = rows * length
    return cu, (int(np.diff(cu).max()) if len(cu) > 1 else 0)


def cu_seqlens(position_ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Varlen boundaries of a ``[B, L]`` batch flattened to ``B*L`` tokens, and the longest segment (COLL-8, COLL-11).

    Returns ``(cu_seqlens, max_seqlen)``: int32 offsets ``[0, s_1, ..., B*L]``
    where a segment starts at each row start, at each position-id reset to
    0 of a real token, and where a run of padding (``doc_ids == -1``) begins
    or ends, so row ``r``'s part equals
    ``reference.collation.cu_seqlens(row, doc_row) + r*L``. Pass ``doc_ids``:
    without them every padding position is a length-1 segment.

    >>> cu_seqlens(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    (tensor([0, 3, 5, 6], dtype=torch.int32), 3)
    >>> cu_seqlens(torch.tensor([[0, 1, 2, 0, 0, 0]]), torch.tensor([[7, 7, 7, -1, -1, -1]]))
    (tensor([0, 3, 6], dtype=torch.int32), 3)
    """
    require(position_ids.dim() == 2, ConfigError,
            f"position_ids has shape {tuple(position_ids.shape)}; pass a [batch, seq_len] tensor")
    docs = None
    if doc_ids is not None:
        docs = torch.as_tensor(doc_ids).numpy()
        require(not docs.size or int(docs.min()) >= NO_DOC, ConfigError,
                f"doc_ids holds {int(docs.min())}; document ids are >= 0, and {NO_DOC} marks padding")
    cu, max_seqlen = batch_cu_seqlens(position_ids.numpy(), docs)
    return torch.from_numpy(cu), max_seqlen


def sample_cu_seqlens(position_ids: np.ndarray, doc_ids: np.ndarray | None = None) -> np.ndarray:
    """One sample's ``cu_seqlens`` at fixed width: int32 ``[L + 1]``, the segment starts then repeats of ``L``.

    The segments are ``reference.collation.cu_seqlens(position_ids,
    doc_ids)``'s (COLL-8, COLL-11); the fixed width lets samples of one
    batch stack (``PackedDataset.__getitem__``'s per-sample field).

    >>> sample_cu_seqlens(np.array([0, 1, 2, 0])).tolist()
    [0, 3, 4, 4, 4]
    >>> sample_cu_seqlens(np.array([0, 1, 0, 0]), np.array([2, 2, -1, -1])).tolist()
    [0, 2, 4, 4, 4]
    """
    length = len(position_ids)
    starts = np.flatnonzero(_segment_starts(position_ids, doc_ids))
    cu = np.full(length + 1, length, dtype=np.int32)
    cu[:len(starts)] = starts
    return cu


class SampleBatch(Sequence[dict[str, Any]]):
    """A batch computed at once that reads as the list of its samples: what ``__getitems__`` returns.

    Why both: torch's DataLoader hands ``dataset.__getitems__(keys)`` to its
    ``collate_fn``, and its ``default_collate`` (and torchdata's
    ``StatefulDataLoader``, and any user's collate) expects a list of
    per-sample dicts. ``PackedDataset`` computes the whole batch in a fixed
    number of numpy calls; this wrapper keeps that batch (``.batch``, which
    ``collate`` returns as is) and shows each sample on demand: ``sb[i]`` is
    ``dataset[keys[i]]`` field for field (tensor views into the batch, plus
    the sample's own ``cu_seqlens``), so ``default_collate(sb)`` stacks the
    same batch back.

    >>> sb = SampleBatch({"input_ids": torch.tensor([[5, 6], [7, 8]]), "position_ids": torch.tensor([[0, 1], [1, 0]]),
    ...                   "cu_seqlens": torch.tensor([0, 2, 3, 4], dtype=torch.int32), "max_seqlen": 2})
    >>> len(sb), sb[1]["input_ids"].tolist(), sb[1]["cu_seqlens"].tolist()
    (2, [7, 8], [0, 1, 2])
    >>> collate(sb) is sb.batch
    True
    """

    __slots__ = ("batch",)

    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return int(self.batch["input_ids"].shape[0])

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not (is_int(index) and -n <= index < n):
            raise IndexError(f"sample {index!r} of a batch of {n}: pass an int in [-{n}, {n})")
        sample = {name: value[index] for name, value in self.batch.items() if name not in _BATCH_ONLY}
        if "position_ids" in sample:
            docs = sample["doc_ids"].numpy() if "doc_ids" in sample else None
            sample["cu_seqlens"] = torch.from_numpy(sample_cu_seqlens(sample["position_ids"].numpy(), docs))
        return sample

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)} samples, fields {sorted(self.batch)})"


def collate(batch: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
    """Stack a list of samples (dicts of equally shaped tensors) into ``[B, ...]`` tensors, plus varlen fields.

    A ``SampleBatch`` (what ``impl.dataset.PackedDataset.__getitems__``
    returns: torch's DataLoader hands it to ``collate_fn`` as is) gives its
    already computed batch, unchanged. An already batched dict (a Mapping)
    passes through, with ``cu_seqlens`` / ``max_seqlen`` computed from its
    ``position_ids`` if either is missing.

    Every sample must have the same keys and each key the same shape (packed
    samples all have ``seq_len`` positions; a ``pad`` end-of-epoch slot is a
    full-length, fully masked sample, not a short one), so stacking never pads
    and never guesses a pad value. With ``position_ids`` present, adds
    ``cu_seqlens`` (int32) and ``max_seqlen`` (int) over the flattened batch
    (COLL-8; with ``doc_ids`` present too, each padding run is one segment,
    COLL-11), replacing any per-sample ``cu_seqlens`` (``PackedDataset``
    ships one per sample; the batch needs them over the flattened batch).
    0-d fields (``epoch``, ``sample_index``) become ``[B]``.

    Why strict: a field silently dropped or padded with the wrong value is data
    loss no later stage can see (COLL-10's reasoning).
    """
    if type(batch) is SampleBatch:
        return batch.batch
    if isinstance(batch, Mapping):
        if "position_ids" not in batch or ("cu_seqlens" in batch and "max_seqlen" in batch):
            return batch if isinstance(batch, dict) else dict(batch)
        given = {key: value for key, value in batch.items() if key not in _BATCH_ONLY}
        docs = torch.as_tensor(given["doc_ids"]) if "doc_ids" in given else None
        given["cu_seqlens"], given["max_seqlen"] = cu_seqlens(torch.as_tensor(given["position_ids"]), docs)
        return given
    require(len(batch) > 0, ConfigError, "batch is empty; collate needs at least one sample")
    keys = list(batch[0])
    out: dict[str, Any] = {}
    for s, sample in enumerate(batch):
        require(set(sample) == set(keys), ConfigError,
                f"batch[{s}] has fields {sorted(sample)} but batch[0] has {sorted(keys)}; every sample needs the same fields")
    varlen = "position_ids" in keys
    for key in keys:
        if varlen and key == "cu_seqlens":
            continue  # a sample's own boundaries; the batch's come from position_ids below
        values = [torch.as_tensor(sample[key]) for sample in batch]
        shapes = {tuple(v.shape) for v in values}
        require(len(shapes) == 1, ConfigError,
                f"field {key!r} has shapes {sorted(shapes)} across the batch; collate stacks equal shapes only: "
                "pad the rows first with impl.collation.pad_stack_1d")
        out[key] = torch.stack(values)
    if varlen:
        out["cu_seqlens"], out["max_seqlen"] = cu_seqlens(out["position_ids"], out.get("doc_ids"))
    return out


# --------------------------------------------------------------------------- pooling masks (COLL-3..COLL-7)


class TokenPoolingType(enum.StrEnum):
    """d9d's pooling names: the first real token, the last real token, or every real token (COLL-4..COLL-6)."""

    first = "first"
    last = "last"
    all = "all"


def attention_mask(lengths: Sequence[int] | torch.Tensor, *, side: str = "right",
                   total: int | None = None) -> torch.Tensor:
    """The int64 ``[N, T]`` 0/1 mask of rows of ``lengths`` real tokens padded on ``side`` (COLL-3).

    It marks exactly where :func:`pad_stack_1d` with the same side puts real
    tokens, whatever their values (a pad id that also occurs as a real token
    cannot tell them apart).

    >>> attention_mask([2, 1], side="left", total=4).tolist()
    [[0, 0, 1, 1], [0, 0, 0, 1]]
    """
    require(side in SIDES, ConfigError, f"side={side!r} is not a padding side; choose one of {SIDES}")
    lens = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    require(not len(lens) or int(lens.min()) >= 0, ConfigError,
            f"lengths must be non-negative integers, got {lens.tolist()}")
    longest = int(lens.max()) if len(lens) else 0
    width = longest if total is None else total
    require(is_int(width) and width >= longest, ConfigError,
            f"total={total!r} must be an integer >= the longest length {longest}; omit it to use the longest length")
    columns = torch.arange(width)
    real = columns < lens[:, None] if side == "right" else columns >= (width - lens)[:, None]
    return real.to(torch.int64)


def token_pooling_mask_from_attention_mask(attention_mask: torch.Tensor,
                                           pooling_type: str | TokenPoolingType) -> torch.Tensor:
    """The int64 mask of the positions a pooler reads, from a ``[batch, seq]`` 0/1 attention mask (COLL-4..COLL-7).

    Positions come from the mask, not from the row ends: ``first`` is the
    lowest position holding 1 and ``last`` the highest, so left- and
    right-padded batches pool the same tokens (d9d's ``first`` takes position
    0, a pad token under left padding). A row of only padding pools nothing.
    A mask holding anything but 0 and 1 is refused (``ConfigError``): a
    boolean or float mask converted with the wrong threshold is the usual
    cause, and guessing would pool the wrong tokens.

    >>> m = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 0]])
    >>> token_pooling_mask_from_attention_mask(m, "first").tolist()
    [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
    >>> token_pooling_mask_from_attention_mask(m, "last").tolist()
    [[0, 0, 1], [0, 1, 0], [0, 0, 0]]
    """
    pooling = pooling_type.value if isinstance(pooling_type, TokenPoolingType) else pooling_type
    require(pooling in ("first", "last", "all"), ConfigError,
            f"pooling_type={pooling_type!r} is not a pooling; choose one of first, last, all")
    mask = torch.as_tensor(attention_mask)
    require(mask.dim() == 2, ConfigError,
            f"attention_mask has shape {tuple(mask.shape)}; pass a [batch, seq_len] mask")
    if mask.dtype == torch.bool:
        mask = mask.to(torch.int64)
    binary = (mask == 0) | (mask == 1)
    if not bool(binary.all()):
        row = int((~binary).any(dim=1).nonzero()[0])
        raise ConfigError(f"attention_mask[{row}]={mask[row].tolist()} must hold only 0 and 1; build it with "
                          "impl.collation.attention_mask(lengths, side=...)")
    real = (mask == 1).to(torch.int64)
    if pooling == "all":
        return real
    rows, width = real.shape
    out = torch.zeros_like(real)
    if not width:
        return out
    has = real.any(dim=1)
    columns = torch.arange(width, device=real.device)
    if pooling == "first":
        position = torch.where(real.bool(), columns, width).min(dim=1).values
    else:
        position = torch.where(real.bool(), columns, -1).max(dim=1).values
    picked = torch.arange(rows, device=real.device)[has]
    out[picked, position[has]] = 1
    return out


class PaddingSide1D(enum.StrEnum):
    """d9d's padding sides; ``pad_stack_1d(..., side=PaddingSide1D.left)`` accepts them like the strings (COLL-1)."""

    left = "left"
    right = "right"
