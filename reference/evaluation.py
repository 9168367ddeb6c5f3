"""Eval sets built once and broadcast to every rank (EVAL-*).

Why a specification: an eval set tokenized on rank 0 and broadcast (so that
one process, not hundreds, opens the files of a cluster filesystem) has two
silent ways to go wrong. The ranks can evaluate on different data (each
built its own, with another tokenizer cache or file order), and a failure on
rank 0 before the broadcast leaves every other rank waiting in a collective
that never comes, until a timeout kills the job with no word of the cause.
The rules: the set is a pure function of the split's documents and
``seq_len``, built exactly once, and every rank ends with that one result,
the samples or the same error.

Worked example (documents already tokenized, EOS 0 appended; seq_len 3)::

    >>> samples = eval_set([[5, 6, 0], [7, 8, 9, 0]], seq_len=3)
    >>> [(s.input_ids, s.labels) for s in samples]
    [((5, 6, 0), (6, 0, -100))]
    >>> outcomes = broadcast_eval(lambda: eval_set([[5, 0]], seq_len=3), world_size=2)
    >>> [type(o).__name__ for o in outcomes], outcomes[0].args == outcomes[1].args
    (['EmptyDataError', 'EmptyDataError'], True)
    >>> agreed_source([(0, "f1"), (0, "f1")])
    0
    >>> agreed_source([(0, "f1"), (1, "f1")])
    Traceback (most recent call last):
    ...
    reference.evaluation.EvalBroadcastError: the ranks disagree on the eval set to broadcast, so none is built: \
src=0 on rank [0]; src=1 on rank [1]; pass the same src, seq_len, split and options on every rank
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from reference.errors import EmptyDataError, LoadspecError, TopologyError, is_int, require
from reference.packing import PackingConfig, Sample, pack

T = TypeVar("T")


class EvalBuildError(LoadspecError):
    """The source rank's eval build failed with an error loadspec does not type; the message names it (EVAL-3)."""


class EvalBroadcastError(LoadspecError):
    """The ranks did not all reach the eval broadcast, or reached it asking for different sets (EVAL-4, EVAL-5)."""


def eval_set(documents: Sequence[Sequence[int]], *, seq_len: int) -> list[Sample]:
    """The eval samples: chunk packing (PACK-8) of the split's documents in split order (EVAL-1).

    ``documents`` are token lists as the store holds them (EOS already
    appended). Why chunk mode: it is what KempnerForge's eval sets are,
    disjoint windows of ``seq_len + 1`` tokens, so every token is evaluated
    at most once and the set does not depend on any seed.

    Raises ``EmptyDataError`` when the split holds fewer than ``seq_len + 1``
    tokens: an eval set with no sample would report a loss of nothing.

    Clauses: EVAL-1.
    """
    config = PackingConfig(seq_len=seq_len, mode="chunk")
    total = sum(len(d) for d in documents)
    require(total >= seq_len + 1, EmptyDataError,
            f"the eval split holds {total} tokens; seq_len={seq_len} needs at least {seq_len + 1} for one sample "
            "(a window of seq_len + 1 tokens): lower seq_len or use a longer split")
    return pack(list(enumerate(documents)), config)


def broadcast_eval(build: Callable[[], T], *, world_size: int, src: int = 0) -> list[T | LoadspecError]:
    """What each of ``world_size`` ranks ends with when rank ``src`` builds and broadcasts (EVAL-2, EVAL-3).

    ``build`` runs exactly once (on ``src``; no other rank reads the data).
    Every rank gets its result; if it raises a ``LoadspecError``, every rank
    gets an error of the same class with the same message, and any other
    exception becomes ``EvalBuildError`` naming its type and message. The
    list holds the outcome of rank ``r`` at index ``r`` (errors as values, so
    the model shows that no rank is left without one).

    >>> calls = []
    >>> broadcast_eval(lambda: calls.append(1) or "tensors", world_size=3, src=1), len(calls)
    (['tensors', 'tensors', 'tensors'], 1)

    Clauses: EVAL-2, EVAL-3.
    """
    require(is_int(world_size) and world_size >= 1, TopologyError,
            f"world_size={world_size!r} must be an integer >= 1")
    require(is_int(src) and 0 <= src < world_size, TopologyError,
            f"src={src!r} must be a rank in [0, world_size={world_size})")
    try:
        result: T | LoadspecError = build()
    except LoadspecError as exc:
        return [type(exc)(*exc.args) for _ in range(world_size)]
    except Exception as exc:  # noqa: BLE001 - the model of "every failure reaches every rank"
        message = f"rank {src} could not build the eval set: {type(exc).__name__}: {exc}"
        return [EvalBuildError(message) for _ in range(world_size)]
    return [result] * world_size


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {list(ranks)}"


def agreed_source(records: Sequence[tuple[int, str] | None]) -> int:
    """The source rank every rank named, decided before any payload moves (EVAL-4, EVAL-5).

    ``records[r]`` is what rank ``r`` brought to the call: ``(src,
    fingerprint)``, the fingerprint identifying the eval set it asks for
    (``seq_len``, split, options), or ``None`` when rank ``r`` had not
    arrived within the timeout. Every rank evaluates this one function of
    the same records, so every rank returns the same source or raises the
    same ``EvalBroadcastError``: missing ranks are named first (EVAL-5),
    then every distinct ``src`` and fingerprint with the ranks that hold it
    (EVAL-4). Why before the payload: a broadcast whose ranks disagree on
    ``src`` pairs sends with sends and waits until the collective's timeout.

    >>> agreed_source([(2, "ab"), (2, "ab"), (2, "ab")])
    2
    >>> agreed_source([(0, "ab"), None, (0, "ab")])
    Traceback (most recent call last):
    ...
    reference.evaluation.EvalBroadcastError: rank [1] did not reach the eval broadcast within the timeout \
(it did not call it, or it crashed); every rank of the group must make the call, with the same src

    Clauses: EVAL-4, EVAL-5.
    """
    require(len(records) >= 1, TopologyError, "records is empty: one record per rank of the group")
    missing = [r for r, rec in enumerate(records) if rec is None]
    if missing:
        raise EvalBroadcastError(
            f"{_ranks(missing)} did not reach the eval broadcast within the timeout (it did not call it, or it "
            "crashed); every rank of the group must make the call, with the same src")
    present = [rec for rec in records if rec is not None]
    parts = []
    for field, name in ((0, "src"), (1, "fingerprint")):
        holders: dict[object, list[int]] = {}
        for r, rec in enumerate(present):
            holders.setdefault(rec[field], []).append(r)
        if len(holders) > 1:
            parts += [f"{name}={value!r} on {_ranks(ranks)}" for value, ranks in holders.items()]
    if parts:
        raise EvalBroadcastError(
            f"the ranks disagree on the eval set to broadcast, so none is built: {'; '.join(parts)}; pass the same "
            "src, seq_len, split and options on every rank")
    src = present[0][0]
    require(is_int(src) and 0 <= src < len(records), TopologyError,
            f"src={src!r} must be a rank in [0, world_size={len(records)})")
    return src
