"""An epoch's step count travels in a streaming state, with the steps each rank took (STREAM-22); merge_states (STREAM-14).

Why: equal-step truncation (STREAM-12) fixes S, the steps every rank takes,
from the lane states where the epoch starts. A checkpoint is one cut across
ranks that need not stand at the same step (a rank one batch ahead, even one
already in the next epoch). Recomputing STREAM-12 from such a cut counts the
rank that is ahead as poorer by one batch and drops the last batch of every
other rank. So a state of version 2 carries the topology it was taken on,
S, and each rank's epoch and steps taken ``t_r``; a resume on the same
topology runs rank r for ``S - t_r`` more steps, a resume on another one
recomputes STREAM-12 from the lane states (refusing lanes that straddle two
epochs, which no other topology can split into equal steps).

Worked example (2 ranks, B = 1; S = 3; rank 1 finished epoch 0 and moved on
while rank 0 had taken 2 steps)::

    >>> topology = {"world_size": 2, "num_workers": 0, "batch_size": 1}
    >>> a = {"format": "f", "version": 2, "topology": topology, "epoch": 0,
    ...      "ranks": {"0": {"epoch": 0, "steps": 3, "taken": 2}}, "lanes": {"0": {}}}
    >>> b = dict(a, epoch=1, ranks={"1": {"epoch": 1, "steps": 4, "taken": 0}}, lanes={"1": {}})
    >>> merged = merge_states([a, b])
    >>> merged["epoch"], merged["ranks"]
    (0, {'0': {'epoch': 0, 'steps': 3, 'taken': 2}, '1': {'epoch': 1, 'steps': 4, 'taken': 0}})
    >>> resume_steps(merged, num_lanes=2, world_size=2, num_workers=0, batch_size=1, rank=1)
    Resumed(steps=3, taken=3, next_steps=4, next_taken=0, lane_epochs={0: 0, 1: 1})
    >>> resume_steps(merged, num_lanes=2, world_size=1, num_workers=0, batch_size=1, rank=0)
    Traceback (most recent call last):
    ...
    reference.errors.StateError: the checkpoint's lanes straddle two epochs (rank 0 in epoch 0, rank 1 in epoch 1), which another topology cannot split into equal steps (STREAM-22): resume on world_size=2 with num_workers=0 and batch_size=1, or take the checkpoint with every rank at the same step (state_dict() is a collective in a job with a process group)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference.errors import StateError, is_int, require

STEPS_VERSION = 2
"""The streaming state version that carries ``topology`` and ``ranks`` (STREAM-22); version 1 does not."""
STEPS_KEYS = frozenset({"topology", "ranks"})
TOPOLOGY_KEYS = ("world_size", "num_workers", "batch_size")
RANK_KEYS = frozenset({"epoch", "steps", "taken"})


def owner(lane: int, world_size: int, num_workers: int) -> int:
    """The rank whose workers own ``lane``: ``(lane mod (W * K)) // K`` (STREAM-10)."""
    workers = max(1, num_workers)
    return (lane % (world_size * workers)) // workers


def steps_fields(world_size: int, num_workers: int, batch_size: int, rank: int, epoch: int, steps: int | None,
                 taken: int) -> dict[str, Any]:
    """The ``topology`` and ``ranks`` entries of one rank's state (STREAM-22); S is kept only with several ranks.

    >>> steps_fields(1, 0, 2, 0, 0, 5, 1)["ranks"]
    {'0': {'epoch': 0, 'steps': None, 'taken': 1}}
    """
    return {"topology": {"world_size": world_size, "num_workers": num_workers, "batch_size": batch_size},
            "ranks": {str(rank): {"epoch": epoch, "steps": steps if world_size > 1 else None, "taken": taken}}}


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a loaded state means for one rank (STREAM-22).

    ``steps`` / ``taken``: S of the state's epoch (None: STREAM-12 from the
    lane states at the next pass) and the steps this rank took of it;
    ``next_steps`` / ``next_taken``: the same for the next epoch, when some
    rank was already in it (then ``straddle``); ``lane_epochs``: each lane's epoch.
    """

    steps: int | None = None
    taken: int = 0
    next_steps: int | None = None
    next_taken: int = 0
    lane_epochs: dict[int, int] = field(default_factory=dict)

    @property
    def straddle(self) -> bool:
        return len(set(self.lane_epochs.values())) > 1


def resume_steps(state: Mapping[str, Any], *, num_lanes: int, world_size: int, num_workers: int, batch_size: int,
                 rank: int) -> Resumed:
    """Rank ``rank``'s steps from a global state of version 2 on the given topology (STREAM-22).

    Same topology (world size, workers, batch size): S and ``t_r`` as saved,
    so the rank runs ``S - t_r`` more steps (0 for a rank already in the next
    epoch, which then continues that epoch from its record). Another
    topology: S recomputed from the lane states (``steps=None``, ``taken=0``)
    when every lane is in one epoch, else ``StateError``.
    """
    epoch, top, ranks = state["epoch"], state["topology"], state["ranks"]
    require(isinstance(top, Mapping) and set(top) == set(TOPOLOGY_KEYS)
            and all(is_int(top[k]) for k in TOPOLOGY_KEYS) and top["world_size"] >= 1 and top["num_workers"] >= 0
            and top["batch_size"] >= 1 and num_lanes % (top["world_size"] * max(1, top["num_workers"])) == 0,
            StateError, f"topology={top!r} must hold {list(TOPOLOGY_KEYS)} of a valid topology for {num_lanes} lanes: "
            "the state is corrupt; pass the dict state_dict() returned, unchanged")
    W, K = top["world_size"], top["num_workers"]
    require(isinstance(ranks, Mapping) and sorted(ranks, key=str) == sorted(str(r) for r in range(W)), StateError,
            f"state holds ranks {sorted(ranks) if isinstance(ranks, Mapping) else ranks!r} of {W}: combine every "
            "rank's state_dict() with merge_states and load the result")
    records: dict[int, tuple[int, int | None, int]] = {}
    for key, rec in ranks.items():
        ok = (isinstance(rec, Mapping) and set(rec) == RANK_KEYS and is_int(rec["epoch"])
              and rec["epoch"] in (epoch, epoch + 1) and is_int(rec["taken"]) and rec["taken"] >= 0
              and (rec["steps"] is None and (W == 1 or rec["taken"] == 0)
                   or is_int(rec["steps"]) and 0 <= rec["taken"] <= rec["steps"]))
        require(ok, StateError, f"rank {key} record {rec!r} must be {{epoch: {epoch} or {epoch + 1}, steps: S >= "
                                "taken (null only before a step, or with one rank), taken}: the state is corrupt")
        records[int(key)] = (rec["epoch"], rec["steps"], rec["taken"])
    for e in (epoch, epoch + 1):
        known = {s for re, s, _ in records.values() if re == e and s is not None}
        require(len(known) <= 1, StateError, f"the ranks in epoch {e} disagree on its steps {sorted(known)}: merge "
                                             "the states the ranks saved at one checkpoint of one run")
    require(any(re == epoch for re, _, _ in records.values()), StateError,
            f"epoch={epoch} is not the earliest rank's epoch: the state is corrupt")
    lane_epochs = {lane: records[owner(lane, W, K)][0] for lane in range(num_lanes)}
    if (W, K, top["batch_size"]) != (world_size, num_workers, batch_size):
        straddle = sorted(records.items())
        require(len({re for re, _, _ in records.values()}) == 1, StateError,
                "the checkpoint's lanes straddle two epochs ("
                + ", ".join(f"rank {r} in epoch {re}" for r, (re, _, _) in straddle)
                + "), which another topology cannot split into equal steps (STREAM-22): resume on "
                f"world_size={W} with num_workers={K} and batch_size={top['batch_size']}, or take the checkpoint "
                "with every rank at the same step (state_dict() is a collective in a job with a process group)")
        return Resumed(lane_epochs=lane_epochs)

    def fixed(e: int) -> int | None:
        return next((s for re, s, _ in records.values() if re == e and s is not None), None)

    mine, steps = records[rank], fixed(epoch)
    if mine[0] == epoch:
        return Resumed(steps, mine[2], fixed(epoch + 1), 0, lane_epochs)
    require(steps is not None, StateError, f"rank {rank} is in epoch {epoch + 1} while no rank in epoch {epoch} "
                                           "records that epoch's steps: the state is corrupt")
    assert steps is not None
    return Resumed(steps, steps, fixed(epoch + 1), mine[2], lane_epochs)


class EpochSteps:
    """A streaming loader's S, its steps taken and a straddling state's next epoch (STREAM-12, STREAM-22).

    Mixed into ``StreamingReferenceLoader`` (and its mapped kind), which
    define ``_fresh()`` (every lane at its epoch's start), ``_remaining``
    (each lane's samples left, STREAM-12's census) and ``_steps_of``
    (STREAM-12 over those counts).
    """

    world_size: int
    num_workers: int
    batch_size: int
    rank: int
    epoch: int
    lanes: dict[int, Any]
    _total: int | None      # S of this epoch once fixed
    _taken: int             # steps this rank took of it
    _next: tuple[dict[int, Any], int | None, int] | None    # lanes, S and taken of epoch + 1 of a straddling state

    def _fresh(self) -> dict[int, Any]:
        raise NotImplementedError

    def _remaining(self, epoch: int, lanes: Mapping[int, Any]) -> dict[int, int]:
        raise NotImplementedError

    def _steps_of(self, remaining: Mapping[int, int]) -> int:
        raise NotImplementedError

    def _enter_epoch(self, epoch: int) -> None:
        """Start ``epoch`` fresh, or with the lanes and steps a straddling state already had in it."""
        if epoch != self.epoch:
            ahead = self._next if epoch == self.epoch + 1 else None
            self.epoch, self.lanes, self._total, self._taken, self._next = epoch, self._fresh(), None, 0, None
            if ahead is not None:
                self.lanes.update(ahead[0])
                self._total, self._taken = ahead[1], ahead[2]

    def _steps_left(self, remaining: Mapping[int, int]) -> int:
        """``S - t_r``, S fixed by STREAM-12 where the epoch (or a resume on another topology) starts.

        With one rank S is not kept: its full batches now are ``S - t``.
        """
        steps = self._steps_of(remaining)
        if self.world_size == 1:
            return steps
        if self._total is None:
            self._total = steps
        return self._total - self._taken

    def _steps_record(self, mine: Sequence[int]) -> tuple[int, dict[int, Any], dict[str, Any]]:
        """This rank's epoch, lanes and ``topology`` / ``ranks`` entries, S fixed now if still open."""
        if self._next is not None and set(mine) <= set(self._next[0]):     # this rank is in the next epoch
            epoch, lanes = self.epoch + 1, {**self._fresh(), **self._next[0]}
            if self._next[1] is None and self.world_size > 1:
                self._next = (self._next[0], self._steps_of(self._remaining(epoch, lanes)), self._next[2])
            steps, taken = self._next[1], self._next[2]
        else:
            epoch, lanes = self.epoch, self.lanes
            if self._total is None and self.world_size > 1:
                self._total = self._steps_of(self._remaining(epoch, lanes))
            steps, taken = self._total, self._taken
        return epoch, lanes, steps_fields(self.world_size, self.num_workers, self.batch_size, self.rank, epoch,
                                          steps, taken)

    def _resume(self, epoch: int, resumed: Resumed, lanes: Mapping[int, Any]) -> None:
        """Lanes of ``epoch`` as loaded, those already in epoch + 1 kept for it, and this rank's steps."""
        self.epoch, self.lanes = epoch, self._fresh()
        self.lanes.update({lane: s for lane, s in lanes.items() if resumed.lane_epochs[lane] == epoch})
        self._total, self._taken = resumed.steps, resumed.taken
        self._next = None if not resumed.straddle else (
            {lane: s for lane, s in lanes.items() if resumed.lane_epochs[lane] != epoch}, resumed.next_steps,
            resumed.next_taken)


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One global state from the per-rank states of one checkpoint: every field equal, lanes and ranks united (STREAM-14).

    Why: a rank without a process group knows only its own lanes; a
    checkpoint is one global state, loadable on any valid world size. Of a
    version-2 state the ranks' epochs may differ by one (a rank already in
    the next epoch, STREAM-22): the merged ``epoch`` is the earliest.

    >>> a = {"format": "f", "epoch": 0, "lanes": {"0": {"samples": 1}}}
    >>> merge_states([a, dict(a, lanes={"1": {"samples": 2}})])["lanes"]
    {'0': {'samples': 1}, '1': {'samples': 2}}
    >>> merge_states([a, dict(a, epoch=1)])
    Traceback (most recent call last):
    ...
    reference.errors.StateError: state 1 differs from state 0 in epoch: merge the states the ranks saved at the same step of the same run
    """
    require(isinstance(states, Sequence) and len(states) >= 1, StateError,
            "merge_states needs at least one state; pass every rank's state_dict()")
    first = states[0]
    united: dict[str, dict[str, Any]] = {"lanes": {}, "ranks": {}}
    stepped = first.get("version") == STEPS_VERSION if isinstance(first, Mapping) else False
    free = {"lanes", "ranks", "epoch"} if stepped else {"lanes"}
    epochs: list[int] = []
    for i, state in enumerate(states):
        require(isinstance(state, Mapping) and isinstance(state.get("lanes"), Mapping), StateError,
                f"state {i} is not a streaming state with lanes; pass every rank's state_dict() unchanged")
        for key in sorted(set(first) | set(state)):
            require(key in free or state.get(key) == first.get(key), StateError,
                    f"state {i} differs from state 0 in {key}: merge the states the ranks saved at the same step "
                    "of the same run")
        epoch = state.get("epoch")
        require(not stepped or is_int(epoch), StateError, f"state {i} epoch={epoch!r} must be an integer")
        epochs.append(epoch if isinstance(epoch, int) else 0)
        for part in ("lanes", "ranks") if stepped else ("lanes",):
            require(isinstance(state.get(part), Mapping), StateError,
                    f"state {i} has no {part}: pass every rank's state_dict() unchanged")
            for key, value in state[part].items():
                require(key not in united[part], StateError,
                        f"{part[:-1]} {key} appears in two states: pass each rank's state once, from one run")
                united[part][key] = value
    if stepped:
        require(max(epochs) - min(epochs) <= 1, StateError,
                f"the states' epochs {epochs} differ by more than one: merge the states the ranks saved at one "
                "checkpoint of one run")
    out = dict(first, lanes=dict(sorted(united["lanes"].items(), key=lambda kv: int(kv[0]))))
    if stepped:
        out.update(epoch=min(epochs), ranks=dict(sorted(united["ranks"].items(), key=lambda kv: int(kv[0]))))
    return out
