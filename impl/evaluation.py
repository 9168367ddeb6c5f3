"""Eval sets built on one rank and broadcast: one process touches the filesystem, every rank gets the same tensors.

Conforms to EVAL-1..EVAL-5 of docs/SEMANTICS.md ("Evaluation"); the model is
``reference.evaluation`` (``eval_set``, ``broadcast_eval``, ``agreed_source``).

Why: on cluster filesystems (Lustre, VAST) many processes opening the same
``datasets`` cache at once trip file locks, so KempnerForge tokenizes the
eval split on rank 0 and broadcasts the packed tensor. The faults of that
pattern fixed here:

* *An error on rank 0 hangs the job.* If rank 0 raises before the broadcast
  (a split too short for one sample, a missing file), the other ranks wait
  in ``broadcast`` until the collective times out. Here the source always
  publishes the call's outcome, the tensors' shape or the error, and on
  failure every rank raises the *same* typed error (same class, same
  message), so no rank waits for a tensor that never comes (EVAL-3).
* *Ranks that disagree, or a rank that never comes, hang the job.* Ranks
  passing different ``src`` (or ``seq_len``, split, options), or a rank that
  skips the call, would block every rank until the process group's timeout
  (30 minutes by default) and then die on a raw gloo error. Here the ranks
  first agree on ``src`` and the eval fingerprint, within ``timeout``,
  before anything is built or sent; a disagreement or a missing rank raises
  one ``EvalBroadcastError`` on every rank that came, naming the values,
  the ranks and the fix (EVAL-4, EVAL-5).
* *Re-tokenizing at every start.* Rank 0 builds through
  :class:`impl.hf.HuggingFaceDataset`, whose token store is cached under
  ``cache_dir``: a restart reads the cached tokens.

Protocol (call ``n`` of this process on the group; keys in the group's
rendezvous store, JSON values)::

    every rank  set   loadspec/eval/n/rank<g> = {"src", "fingerprint", "config"}
                wait  every rank's key (timeout); agreed_source(records) on every rank
    src         build, then compare_set loadspec/eval/n/outcome = {"samples", "seq_len"} | {"error", "message"}
    others      wait  loadspec/eval/n/outcome (build_timeout)
    all         one broadcast of the [4, samples, seq_len] int64 payload (timeout)

The outcome key is written once (``compare_set`` against an absent key): a
rank that gives up waiting writes its ``EvalBroadcastError`` there, so the
source and any rank arriving late raise that same error instead of waiting
for peers that left.

Why the store, not a collective, for the handshake (gloo, torch 2.13 CPU):
store keys match by *name*, so a rank busy in another collective is never
taken for a participant (collectives, ``barrier`` and ``monitored_barrier``
included, match by order), and ``store.wait(keys, timeout)`` returns at the
timeout with nothing left pending. On gloo, ``work.wait(timeout)`` of an
``async_op`` raises at the timeout but leaves the operation queued (the next
collective waits behind it), and a per-op ``BroadcastOptions.timeout``
aborts the operation but closes the group's connections. The payload uses
the latter: by then every rank has arrived and agreed, so only a rank
crashing mid-transfer trips it, and that group is lost anyway.

Worked example (no process group: the set is built in this process)::

    eval_set = build_eval_dataset(split, tok, seq_len=1024, cache_dir="cache")   # doctest: +SKIP
    for batch in DataLoader(eval_set, batch_size=8): ...                          # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from impl.errors import (
    ConfigError,
    EmptyDataError,
    EvalBroadcastError,
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
    is_int,
    require,
)

__all__ = ["ERRORS", "EvalBroadcastError", "EvalBuildError", "EvalDataset", "agreed_source", "build_eval_dataset",
           "eval_config"]

FIELDS = ("input_ids", "labels", "doc_ids", "position_ids")


ERRORS: tuple[type[LoadspecError], ...] = (
    EmptyDataError, TokenizerError, SourceError, SplitError, TopologyError, ConfigError, StateError,
    StoreNotFoundError, StoreCorruptError, StoreVersionError, StoreError, EvalBuildError, EvalBroadcastError,
    LoadspecError,
)
"""Error classes an outcome can carry (by name), most specific first."""

DEFAULT_TIMEOUT = timedelta(minutes=5)
"""How long a rank waits for the others to reach the call, and for the payload's transfer."""
DEFAULT_BUILD_TIMEOUT = timedelta(minutes=30)
"""How long the other ranks wait for the source's build (torch's default process group timeout)."""

FINGERPRINTED: Mapping[str, Any] = {
    "split": None, "config_name": None, "text_field": "text", "eos_token": None, "shuffle": "none", "seed": 0,
    "window": 1024,
}
"""The ``HuggingFaceDataset`` options (with their defaults) that change the eval set, besides ``seq_len``."""

_KEY = "loadspec/eval"
_CALLS: dict[int, int] = {}

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


def _error_class(exc: BaseException) -> type[LoadspecError]:
    for cls in ERRORS:
        if type(exc) is cls:
            return cls
    for cls in ERRORS:
        if isinstance(exc, cls):
            return cls
    return EvalBuildError


def _build_local(dataset: Any, tokenizer: Any, kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    from impl.hf import HuggingFaceDataset

    with HuggingFaceDataset(dataset, tokenizer, **kwargs) as ds:   # the tensors are copies: its files close here
        rows = ds.samples(0, np.arange(len(ds), dtype=np.int64))
        return {name: torch.from_numpy(np.ascontiguousarray(rows[name], dtype=np.int64)) for name in FIELDS}


def _seconds(value: Any, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    require(isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 < seconds < float("inf"),
            ConfigError, f"{name}={value!r} must be a positive number of seconds or a datetime.timedelta, "
            f"e.g. {name}=300 or {name}=timedelta(minutes=5)")
    return float(seconds)


def eval_config(*, seq_len: Any, split: Any = None, **hf_kwargs: Any) -> dict[str, Any]:
    """What identifies the eval set a rank asks for: ``seq_len`` and the options in ``FINGERPRINTED``.

    Not in it: ``dataset``, ``tokenizer``, ``cache_dir`` and ``load_kwargs``
    (only the source reads them, and the other ranks may not have the files)
    and ``num_proc`` / ``progress`` (they do not change the set). Values are
    kept as JSON, anything else as its ``repr``.

    >>> eval_config(seq_len=8, split="validation")["split"], eval_config(seq_len=8)["text_field"]
    ('validation', 'text')
    """
    given = dict(FINGERPRINTED, **{k: v for k, v in hf_kwargs.items() if k in FINGERPRINTED}, split=split)
    config = {"seq_len": seq_len, **{k: given[k] for k in FINGERPRINTED}}
    return dict(json.loads(json.dumps(config, sort_keys=True, default=repr)))


def _record(src: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return {"src": src if is_int(src) else repr(src), "fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16],
            "config": dict(config)}


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {list(ranks)}"


def _missing_message(missing: Sequence[int], seconds: float | None = None) -> str:
    within = "the timeout" if seconds is None else f"timeout={seconds:g}s"
    return (f"{_ranks(missing)} did not reach build_eval_dataset within {within}: that rank did not call "
            "build_eval_dataset (every rank of the group must call it, with the same src), or it crashed or is "
            "still busy before the call; make every rank call it, or pass a larger timeout= if one is slow to "
            "get there")


def agreed_source(records: Sequence[Mapping[str, Any] | None], ranks: Sequence[int]) -> int:
    """The ``src`` every rank named (EVAL-4, EVAL-5), decided identically on every rank from the same records.

    ``records[g]`` is group rank ``g``'s record (``src``, ``fingerprint``,
    ``config``) or ``None`` if it had not arrived within the timeout;
    ``ranks[g]`` is its global rank, used in messages. Raises
    ``EvalBroadcastError`` naming the missing ranks, or each distinct
    ``src`` and each differing config value with the ranks holding it.

    >>> rec = {"src": 0, "fingerprint": "f", "config": {"seq_len": 8}}
    >>> agreed_source([rec, rec], [0, 1])
    0
    >>> agreed_source([rec, dict(rec, src=1)], [0, 1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    impl.errors.EvalBroadcastError: ...src=0 on rank [0]; src=1 on rank [1]; ...
    """
    missing = [ranks[g] for g, rec in enumerate(records) if rec is None]
    if missing:
        raise EvalBroadcastError(_missing_message(missing))
    present = [(ranks[g], rec) for g, rec in enumerate(records) if rec is not None]
    parts: list[str] = []
    for name in ("src", *present[0][1]["config"]):
        holders: dict[str, list[int]] = {}
        for rank, rec in present:
            value = rec["src"] if name == "src" else rec["config"].get(name)
            holders.setdefault(json.dumps(value), []).append(rank)
        if len(holders) > 1:
            parts += [f"{name}={json.loads(v)!r} on {_ranks(rs)}" for v, rs in holders.items()]
    if not parts and len({rec["fingerprint"] for _, rec in present}) > 1:
        parts = [f"fingerprint={rec['fingerprint']!r} on rank {rank}" for rank, rec in present]
    if parts:
        raise EvalBroadcastError(
            f"the ranks disagree on the eval set to broadcast, so none is built: {'; '.join(parts)}; pass the same "
            "src, seq_len, split and options to build_eval_dataset on every rank (dataset, tokenizer, cache_dir and "
            "load_kwargs may differ: only rank src reads them)")
    src = present[0][1]["src"]
    require(src in ranks, TopologyError,
            f"src={src!r} is not a rank of the group (its global ranks are {list(ranks)}); pass one of them")
    return int(src)


def _settle(store: Any, key: str, outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The call's one outcome: ``outcome`` if ``key`` was unset, else what another rank wrote first."""
    written = store.compare_set(key, "", json.dumps(outcome))
    return dict(json.loads(written))


def _raise(outcome: Mapping[str, Any], cause: BaseException | None = None) -> None:
    if "error" in outcome:
        cls = {c.__name__: c for c in ERRORS}.get(outcome["error"], EvalBuildError)
        raise cls(outcome["message"]) from cause


def _wait(store: Any, keys: list[str], seconds: float) -> list[bool]:
    """Which of ``keys`` are set after waiting up to ``seconds`` for all of them."""
    try:
        store.wait(keys, timedelta(seconds=seconds))
    except RuntimeError:  # the store's timeout (DistStoreError on newer torch)
        return [bool(store.check([k])) for k in keys]
    return [True] * len(keys)


def build_eval_dataset(dataset: Any, tokenizer: Any, *, seq_len: int, cache_dir: str | os.PathLike[str],
                       split: str | None = None, src: int = 0, group: Any = None,
                       timeout: float | timedelta = DEFAULT_TIMEOUT,
                       build_timeout: float | timedelta = DEFAULT_BUILD_TIMEOUT, **hf_kwargs: Any) -> EvalDataset:
    """The eval set (KempnerForge chunk samples), built on rank ``src`` and broadcast to every rank of ``group``.

    Arguments as :class:`impl.hf.HuggingFaceDataset` (``shuffle`` stays
    ``"none"``: an eval set is read in order). Only rank ``src`` (a global
    rank, as in ``torch.distributed.broadcast``) reads ``dataset``,
    ``tokenizer``, ``cache_dir`` and ``load_kwargs``; the other ranks'
    values are ignored. Every rank of the group must call this with the same
    ``src``, ``seq_len``, ``split`` and options (``eval_config``): they are
    compared before anything is built (EVAL-4).

    ``timeout`` (seconds or a ``timedelta``, default 5 minutes) bounds how
    long a rank waits for the others to reach the call and for the payload's
    transfer; ``build_timeout`` (default 30 minutes) bounds how long the
    other ranks wait for the source's build (tokenizing a large split the
    first time). A rank that does not call, or a disagreement, raises one
    ``EvalBroadcastError`` on every rank that called (EVAL-5).

    Without an initialised process group (or with one rank) the set is built
    in this process. Every rank returns equal tensors or raises the same
    error: a split too short for one sample raises ``EmptyDataError``
    everywhere; an error loadspec does not type becomes ``EvalBuildError``
    carrying its type and message.
    """
    import torch.distributed as dist

    kwargs = dict(hf_kwargs, seq_len=seq_len, cache_dir=cache_dir, split=split)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        _seconds(timeout, "timeout")
        _seconds(build_timeout, "build_timeout")
        return EvalDataset(_build_local(dataset, tokenizer, kwargs))
    from torch.distributed.distributed_c10d import _get_process_group_store

    pg: Any = group if group is not None else dist.group.WORLD
    me = dist.get_rank(pg)
    require(me >= 0, TopologyError, f"rank {dist.get_rank()} is not in the group passed as group=; call "
                                    "build_eval_dataset only on the group's ranks")
    ranks = dist.get_process_group_ranks(pg)
    call = _CALLS[id(pg)] = _CALLS.get(id(pg), 0) + 1
    wait_s, build_s = _seconds(timeout, "timeout"), _seconds(build_timeout, "build_timeout")
    store = _get_process_group_store(pg)
    prefix = f"{_KEY}/{call}"
    keys = [f"{prefix}/rank{g}" for g in range(len(ranks))]
    outcome_key = f"{prefix}/outcome"
    store.set(keys[me], json.dumps(_record(src, eval_config(seq_len=seq_len, split=split, **hf_kwargs))))
    arrived = _wait(store, keys, wait_s)
    if not all(arrived):
        missing = [ranks[g] for g, ok in enumerate(arrived) if not ok]
        gave_up = {"error": "EvalBroadcastError", "message": _missing_message(missing, wait_s)}
        _raise(_settle(store, outcome_key, gave_up))
        _wait(store, keys, wait_s)  # the outcome holds no error: the source saw every rank arrive
    records = [json.loads(store.get(k)) for k in keys]
    group_src = ranks.index(agreed_source(records, ranks))
    failure: BaseException | None = None
    payload: torch.Tensor | None = None
    if me == group_src and store.check([outcome_key]):  # arrived after the others gave up
        outcome = json.loads(store.get(outcome_key))
    elif me == group_src:
        try:
            tensors = _build_local(dataset, tokenizer, kwargs)
            payload = torch.stack([tensors[name] for name in FIELDS])
            outcome = {"samples": int(payload.shape[1]), "seq_len": int(payload.shape[2])}
        except Exception as exc:  # noqa: BLE001 - every failure must reach the other ranks, or they hang
            failure = exc
            text = str(exc) if isinstance(exc, LoadspecError) else f"{type(exc).__name__}: {exc}"
            outcome = {"error": _error_class(exc).__name__,
                       "message": f"rank {ranks[group_src]} could not build the eval set: {text}"}
        outcome = _settle(store, outcome_key, outcome)
    elif _wait(store, [outcome_key], build_s)[0]:
        outcome = json.loads(store.get(outcome_key))
    else:
        outcome = _settle(store, outcome_key, {"error": "EvalBroadcastError", "message": (
            f"rank {ranks[group_src]} (src) did not finish building the eval set within build_timeout="
            f"{build_s:g}s: it crashed, or the build is slower; pass a larger build_timeout=")})
    _raise(outcome, failure)
    if payload is None:
        payload = torch.empty((len(FIELDS), outcome["samples"], outcome["seq_len"]), dtype=torch.int64)
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor, opts.timeout = group_src, 0, timedelta(seconds=wait_s)
    try:
        pg.broadcast([payload], opts).wait()
    except RuntimeError as exc:
        raise EvalBroadcastError(
            f"the eval set's transfer from rank {ranks[group_src]} did not complete within timeout={wait_s:g}s: a "
            f"rank crashed or left during the transfer ({exc})") from exc
    return EvalDataset({name: payload[k] for k, name in enumerate(FIELDS)})
