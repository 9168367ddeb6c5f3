"""A streaming state's steps: the epoch's S and each rank's steps taken, merged and resumed (STREAM-14, STREAM-22).

Conforms to STREAM-14 and STREAM-22; its model is ``reference.stream_steps``
(``merge_states``, ``resume_steps``). Why the steps travel: equal-step
truncation (STREAM-12) fixes S where an epoch starts; a checkpoint taken while
one rank is a batch ahead (even in the next epoch) would, recomputed from
the lanes, count that rank as one batch poorer and drop every other rank's
last batch. On the same topology each rank runs ``S - t_r`` more steps.

Worked example (rank 0 at step 1 of S = 2, rank 1 already in epoch 1)::

    >>> top = {"world_size": 2, "num_workers": 0, "batch_size": 1}
    >>> a = {"version": 2, "topology": top, "epoch": 0, "ranks": {"0": {"epoch": 0, "steps": 2, "taken": 1}},
    ...      "lanes": {"0": {}}}
    >>> b = dict(a, epoch=1, ranks={"1": {"epoch": 1, "steps": 2, "taken": 0}}, lanes={"1": {}})
    >>> merged = merge_states([a, b])
    >>> resumed_steps(merged, num_lanes=2, topology=(2, 0, 1), rank=1)
    (2, 2, (2, 0), {0: 0, 1: 1})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from impl.errors import StateError, is_int, require
from reference.stream_steps import RANK_KEYS, STEPS_VERSION, TOPOLOGY_KEYS

__all__ = ["merge_states", "resumed_steps", "steps_fields"]

Resumed = tuple[int | None, int, tuple[int | None, int] | None, dict[int, int]]
"""``(S, taken)`` of the state's epoch for this rank, ``(S, taken)`` of the next epoch when lanes straddle, lane epochs."""


def steps_fields(topology: tuple[int, int, int], rank: int, epoch: int, steps: int | None,
                 taken: int) -> dict[str, Any]:
    """One rank's ``topology`` and ``ranks`` entries (STREAM-22); S is kept only with several ranks."""
    W, K, B = topology
    return {"topology": {"world_size": W, "num_workers": K, "batch_size": B},
            "ranks": {str(rank): {"epoch": epoch, "steps": steps if W > 1 else None, "taken": taken}}}


def resumed_steps(state: Mapping[str, Any], *, num_lanes: int, topology: tuple[int, int, int], rank: int) -> Resumed:
    """This rank's steps from a global version-2 state on ``topology`` (STREAM-22); ``StateError`` when refused."""
    epoch, top, ranks = state["epoch"], state["topology"], state["ranks"]
    ok = isinstance(top, Mapping) and set(top) == set(TOPOLOGY_KEYS) and all(is_int(top[k]) for k in TOPOLOGY_KEYS)
    W, K, B = (top["world_size"], top["num_workers"], top["batch_size"]) if ok else (0, 0, 0)
    require(ok and W >= 1 and K >= 0 and B >= 1 and num_lanes % (W * max(1, K)) == 0, StateError,
            f"topology={top!r} must hold {list(TOPOLOGY_KEYS)} of a valid topology for {num_lanes} lanes: the state "
            "is corrupt; pass the dict state_dict() returned, unchanged")
    require(isinstance(ranks, Mapping) and sorted(ranks, key=str) == sorted(str(r) for r in range(W)), StateError,
            f"state holds ranks {sorted(ranks) if isinstance(ranks, Mapping) else ranks!r} of {W}: combine every "
            "rank's state_dict() with merge_states and load the result")
    records: dict[int, tuple[int, int | None, int]] = {}
    for key, rec in ranks.items():
        good = (isinstance(rec, Mapping) and set(rec) == RANK_KEYS and is_int(rec["epoch"])
                and rec["epoch"] in (epoch, epoch + 1) and is_int(rec["taken"]) and rec["taken"] >= 0
                and (rec["steps"] is None and (W == 1 or rec["taken"] == 0)
                     or is_int(rec["steps"]) and 0 <= rec["taken"] <= rec["steps"]))
        require(good, StateError, f"rank {key} record {rec!r} must be {{epoch: {epoch} or {epoch + 1}, steps: S >= "
                                  "taken (null only before a step, or with one rank), taken}: the state is corrupt")
        records[int(key)] = (rec["epoch"], rec["steps"], rec["taken"])
    fixed: dict[int, int | None] = {}
    for e in (epoch, epoch + 1):
        known = sorted({s for re, s, _ in records.values() if re == e and s is not None})
        require(len(known) <= 1, StateError, f"the ranks in epoch {e} disagree on its steps {known}: merge the "
                                             "states the ranks saved at one checkpoint of one run")
        fixed[e] = known[0] if known else None
    require(any(re == epoch for re, _, _ in records.values()), StateError,
            f"epoch={epoch} is not the earliest rank's epoch: the state is corrupt")
    workers = max(1, K)
    lane_epochs = {lane: records[(lane % (W * workers)) // workers][0] for lane in range(num_lanes)}
    straddle = any(re != epoch for re, _, _ in records.values())
    if (W, K, B) != topology:
        require(not straddle, StateError, "the checkpoint's lanes straddle two epochs ("
                + ", ".join(f"rank {r} in epoch {re}" for r, (re, _, _) in sorted(records.items()))
                + f"), which another topology cannot split into equal steps (STREAM-22): resume on world_size={W} "
                f"with num_workers={K} and batch_size={B}, or take the checkpoint with every rank at the same step "
                "(state_dict() is a collective in a job with a process group)")
        return None, 0, None, lane_epochs
    mine_epoch, _, mine_taken = records[rank]
    nxt = (fixed[epoch + 1], 0 if mine_epoch == epoch else mine_taken) if straddle else None
    if mine_epoch == epoch:
        return fixed[epoch], mine_taken, nxt, lane_epochs
    require(fixed[epoch] is not None, StateError, f"rank {rank} is in epoch {epoch + 1} while no rank in epoch "
                                                  f"{epoch} records that epoch's steps: the state is corrupt")
    return fixed[epoch], fixed[epoch] or 0, nxt, lane_epochs


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One global state from the per-rank states of one checkpoint: every field equal, lanes and ranks united (STREAM-14).

    Of version-2 states the epochs may differ by one (a rank already in the
    next epoch, STREAM-22): the merged ``epoch`` is the earliest.

    >>> a = {"format": "loadspec.stream_state", "epoch": 0, "lanes": {"0": {"samples": 1}}}
    >>> merge_states([a, dict(a, lanes={"1": {"samples": 2}})])["lanes"]
    {'0': {'samples': 1}, '1': {'samples': 2}}
    """
    require(isinstance(states, Sequence) and len(states) >= 1, StateError,
            "merge_states needs at least one state; pass every rank's state_dict()")
    first = states[0]
    stepped = isinstance(first, Mapping) and first.get("version") == STEPS_VERSION
    parts = ("lanes", "ranks") if stepped else ("lanes",)
    free = {*parts, "epoch"} if stepped else {"lanes"}
    united: dict[str, dict[str, Any]] = {part: {} for part in parts}
    epochs: list[int] = []
    for i, state in enumerate(states):
        require(isinstance(state, Mapping) and all(isinstance(state.get(p), Mapping) for p in parts), StateError,
                f"state {i} is not a streaming state with {' and '.join(parts)}; pass every rank's state_dict() "
                "unchanged")
        for key in sorted(set(first) | set(state)):
            require(key in free or state.get(key) == first.get(key), StateError,
                    f"state {i} differs from state 0 in {key}: merge the states the ranks saved at the same step "
                    "of the same run")
        if stepped:
            epoch = state.get("epoch")
            require(isinstance(epoch, int), StateError, f"state {i} epoch={epoch!r} must be an integer")
            epochs.append(epoch if isinstance(epoch, int) else 0)
        for part in parts:
            for key, value in state[part].items():
                require(key not in united[part], StateError,
                        f"{part[:-1]} {key} appears in two states: pass each rank's state once, from one run")
                united[part][key] = value
    out = dict(first, **{part: dict(sorted(united[part].items(), key=lambda kv: int(kv[0]))) for part in parts})
    if stepped:
        require(max(epochs) - min(epochs) <= 1, StateError,
                f"the states' epochs {epochs} differ by more than one: merge the states the ranks saved at one "
                "checkpoint of one run")
        out["epoch"] = min(epochs)
    return out
