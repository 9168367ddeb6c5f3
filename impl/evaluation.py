"""Eval sets built on one rank and broadcast: one process touches the filesystem, every rank gets the same tensors.

Conforms to EVAL-1..EVAL-3 of docs/SEMANTICS.md ("Evaluation"); the model is
``reference.evaluation`` (``eval_set``, ``broadcast_eval``).

Why: on cluster filesystems (Lustre, VAST) many processes opening the same
``datasets`` cache at once trip file locks, so KempnerForge tokenizes the
eval split on rank 0 and broadcasts the packed tensor. Two faults of that
pattern are fixed here:

* *An error on rank 0 hangs the job.* If rank 0 raises before the broadcast
  (a split too short for one sample, a missing file), the other ranks wait
  in ``broadcast`` until the collective times out. Here rank 0 always
  broadcasts a header first: a status code, then either the tensor's shape
  or an error message. On failure every rank raises the *same* typed error
  (same class, same message), so no rank waits for a tensor that never
  comes.
* *Re-tokenizing at every start.* Rank 0 builds through
  :class:`impl.hf.HuggingFaceDataset`, whose token store is cached under
  ``cache_dir``: a restart reads the cached tokens.

Wire protocol (all int64 tensors on CPU, one ``broadcast`` each; gloo and
NCCL-with-CPU-copy both carry them)::

    header  [status, a, b]       status 0: a = samples, b = seq_len
                                 status k > 0: error class ERRORS[k - 1], a = message bytes
    then    [4, a, b] tensor     input_ids, labels, doc_ids, position_ids    (status 0)
    or      [a] uint8 tensor     the UTF-8 error message                     (status > 0)

Worked example (no process group: the set is built in this process)::

    eval_set = build_eval_dataset(split, tok, seq_len=1024, cache_dir="cache")   # doctest: +SKIP
    for batch in DataLoader(eval_set, batch_size=8): ...                          # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from impl.errors import (
    ConfigError,
    EmptyDataError,
    EvalBuildError,
    LoadspecError,
    SourceError,
    SplitError,
    StateError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
    TokenizerError,
    TopologyError,
)

__all__ = ["ERRORS", "EvalBuildError", "EvalDataset", "build_eval_dataset"]

FIELDS = ("input_ids", "labels", "doc_ids", "position_ids")


ERRORS: tuple[type[LoadspecError], ...] = (
    EmptyDataError, TokenizerError, SourceError, SplitError, TopologyError, ConfigError, StateError,
    StoreNotFoundError, StoreCorruptError, StoreVersionError, StoreError, EvalBuildError, LoadspecError,
)
"""Error classes the header can carry, most specific first; status k means ``ERRORS[k - 1]``."""


class EvalDataset(Dataset):  # type: ignore[type-arg]
    """Eval samples held as ``[S, seq_len]`` int64 tensors: ``ds[i]`` is a dict of row ``i`` of each field."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = dict(tensors)
        self._n = int(self.tensors["input_ids"].shape[0])

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -self._n <= index < self._n:
            raise IndexError(f"index {index} is out of range for an eval set of {self._n} samples")
        return {name: value[index] for name, value in self.tensors.items()}


def _error_code(exc: BaseException) -> int:
    for k, cls in enumerate(ERRORS):
        if type(exc) is cls:
            return k + 1
    for k, cls in enumerate(ERRORS):
        if isinstance(exc, cls):
            return k + 1
    return ERRORS.index(EvalBuildError) + 1


def _build_local(dataset: Any, tokenizer: Any, kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    from impl.hf import HuggingFaceDataset

    ds = HuggingFaceDataset(dataset, tokenizer, **kwargs)
    rows = ds.samples(0, np.arange(len(ds), dtype=np.int64))
    return {name: torch.from_numpy(np.ascontiguousarray(rows[name], dtype=np.int64)) for name in FIELDS}


def build_eval_dataset(dataset: Any, tokenizer: Any, *, seq_len: int, cache_dir: str | os.PathLike[str],
                       split: str | None = None, src: int = 0, group: Any = None,
                       **hf_kwargs: Any) -> EvalDataset:
    """The eval set (KempnerForge chunk samples), built on rank ``src`` and broadcast to every rank of ``group``.

    Arguments as :class:`impl.hf.HuggingFaceDataset` (``shuffle`` stays
    ``"none"``: an eval set is read in order). Only rank ``src`` reads
    ``dataset``, ``tokenizer`` and ``cache_dir``; the other ranks' values are
    ignored. Without an initialised process group (or with one rank) the set
    is built in this process. Every rank returns equal tensors or raises the
    same error: a split too short for one sample raises ``EmptyDataError``
    everywhere; an error loadspec does not type becomes ``EvalBuildError``
    carrying its type and message.
    """
    import torch.distributed as dist

    kwargs = dict(hf_kwargs, seq_len=seq_len, cache_dir=cache_dir, split=split)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return EvalDataset(_build_local(dataset, tokenizer, kwargs))
    rank = dist.get_rank()
    header = torch.zeros(3, dtype=torch.int64)
    payload: torch.Tensor | None = None
    failure: BaseException | None = None
    message = b""
    if rank == src:
        try:
            tensors = _build_local(dataset, tokenizer, kwargs)
            payload = torch.stack([tensors[name] for name in FIELDS])
            header[1], header[2] = payload.shape[1], payload.shape[2]
        except Exception as exc:  # noqa: BLE001 - every failure must reach the other ranks, or they hang
            failure = exc
            text = str(exc) if isinstance(exc, LoadspecError) else f"{type(exc).__name__}: {exc}"
            message = f"rank {src} could not build the eval set: {text}".encode()
            header[0], header[1] = _error_code(exc), len(message)
    dist.broadcast(header, src=src, group=group)
    status, a, b = (int(v) for v in header.tolist())
    if status:
        buffer = torch.frombuffer(bytearray(message), dtype=torch.uint8) if rank == src else \
            torch.zeros(a, dtype=torch.uint8)
        dist.broadcast(buffer, src=src, group=group)
        raise ERRORS[status - 1](bytes(buffer.tolist()).decode()) from failure
    if payload is None:
        payload = torch.empty((len(FIELDS), a, b), dtype=torch.int64)
    dist.broadcast(payload, src=src, group=group)
    return EvalDataset({name: payload[k] for k, name in enumerate(FIELDS)})
