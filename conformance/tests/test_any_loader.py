"""What every correct loader must satisfy, whatever its order, sharding, packing or state format.

Why a separate suite: a peer (HF datasets, torchdata, MosaicML, LitData, a
team's own) shuffles, shards and drops tails in its own way, so comparing it
with the reference's sample numbering reports differences that are not
defects. These tests never look at ``sample_index`` or the reference's order;
they grade provenance (``conformance.provenance``): each within-document pair
trained at most once per epoch, every sample the declared end policy keeps
trained (an exact account, from the corpus, not from the loader's own run),
labels that are the next token of the same document or -100, equal step
counts on every rank, exact resume (also twice in a row, in epoch 0 and in
epoch 1), and, after a change of world size, batch size or workers, an
explicit refusal or an exactly-once continuation.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="the loadspec conformance kit needs hypothesis: pip install 'loadspec[conformance]'")

from hypothesis import assume, given, reject
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.adapter import Unsupported, close, is_refusal, required_capabilities, unsupported
from conformance.assertions import ClauseViolation, check
from conformance.provenance import (
    check_epoch_coverage,
    check_provenance,
    declared_coverage,
    describe_pairs,
    expected_coverage,
    pair_counts,
    promised_pairs,
)
from reference.resume import PipelineConfig, Topology


def _ranks(t: Topology) -> list[Topology]:
    return [Topology(world_size=t.world_size, rank=r, batch_size=t.batch_size, num_workers=t.num_workers)
            for r in range(t.world_size)]


def _repro(corpus, config, topology, **extra) -> dict[str, Any]:
    return {"corpus": corpus, "config": config, "topology": topology, **extra}


class Built:
    """Every rank's loader of one topology, closed when the example ends (``close()`` hook)."""

    def __init__(self, adapter, corpus, config: PipelineConfig, topology: Topology, workdir: Path) -> None:
        assume(required_capabilities(config, topology, adapter.capabilities) <= adapter.capabilities)
        reason = unsupported(adapter, corpus, config, topology)
        if reason:
            reject()
        self.loaders: list[Any] = []
        try:
            for t in _ranks(topology):
                self.loaders.append(adapter.build(corpus, config, t, workdir=workdir))
        except Unsupported:
            close(*self.loaders)
            reject()
        except BaseException:   # a build that raises: the ranks built before it are closed all the same
            close(*self.loaders)
            raise

    def __enter__(self) -> list[Any]:
        return self.loaders

    def __exit__(self, *exc: object) -> None:
        close(*self.loaders)


def _epoch(loaders) -> list[list[list[Any]]]:
    """Each rank's batches of the rest of the epoch."""
    return [[list(b) for b in ld] for ld in loaders]


def _rows(per_rank) -> list[Any]:
    return [row for batches in per_rank for batch in batches for row in batch]


def _max_world(adapter, most: int) -> int:
    """The largest world size to draw: the adapter's declared ``limits["max_world_size"]`` caps it."""
    return max(1, min(most, int(dict(getattr(adapter, "limits", {}) or {}).get("max_world_size", most))))


def _topologies(adapter, most: int):
    return ls.topologies(max_world=_max_world(adapter, most), replication=False)


def _configs(adapter):
    return ls.adapter_configs(adapter, stride=True)


@pytest.mark.clause("PACK-4", "PACK-3")
@given(corpus=ls.provenance_corpora(), data=st.data())
def test_every_input_and_label_is_the_corpus_token_its_provenance_names(loadspec_adapter, corpus, data):
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 3), label="topology")
    with tempfile.TemporaryDirectory() as tmp, Built(loadspec_adapter, corpus, config, topology, Path(tmp)) as loaders:
        per_rank = _epoch(loaders)
    check_provenance(_rows(per_rank), corpus, config.packing, clause="PACK-4", repro=_repro(corpus, config, topology))


@pytest.mark.clause("PART-1")
@given(corpus=ls.provenance_corpora(), data=st.data())
def test_every_rank_runs_the_same_number_of_steps(loadspec_adapter, corpus, data):
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 4), label="topology")
    with tempfile.TemporaryDirectory() as tmp, Built(loadspec_adapter, corpus, config, topology, Path(tmp)) as loaders:
        steps = [len(batches) for batches in _epoch(loaders)]
    check(len(set(steps)) <= 1, clause="PART-1", what=f"ranks ran {steps} steps: a collective would hang",
          repro=_repro(corpus, config, topology))


@pytest.mark.clause("PART-1", "PACK-7", "PACK-12")
@given(corpus=ls.provenance_corpora(), data=st.data())
def test_no_within_document_pair_is_trained_twice_in_an_epoch(loadspec_adapter, corpus, data):
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 3), label="topology")
    with tempfile.TemporaryDirectory() as tmp, Built(loadspec_adapter, corpus, config, topology, Path(tmp)) as loaders:
        counts = pair_counts(_rows(_epoch(loaders)))
    twice = sorted(p for p, c in counts.items() if c > 1)
    check(not twice, clause="PART-1", what=f"{len(twice)} (doc, offset) pairs trained more than once, e.g. {twice[:8]}",
          repro=_repro(corpus, config, topology))


def _universe(adapter, corpus, config, workdir: Path) -> Counter:
    """The pairs the loader trains in one uninterrupted epoch on one rank with batch size 1 (nothing dropped)."""
    with Built(adapter, corpus, config, Topology(), workdir) as loaders:
        return pair_counts(_rows(_epoch(loaders)))


@pytest.mark.clause("PART-1", "PART-4", "PART-5", "PART-6", "PART-7", "PACK-7", "PACK-18")
@given(corpus=ls.provenance_corpora(), data=st.data())
def test_fewer_than_one_global_batch_is_left_untrained(loadspec_adapter, corpus, data):
    """Exactly what the declared end policy drops is left untrained: one sample lost, or a batch held back, fails.

    The account comes from the corpus and the end policy
    (``conformance.provenance.expected_coverage``): the epoch must train that
    many distinct samples. Only the bin modes under a shuffled order, whose
    sample count depends on the loader's order, fall back to comparing with
    the loader's own run on one rank with batch size 1. An adapter whose
    loader ends an epoch by a rule of its own declares the exact account of
    that rule (``epoch_coverage``, ``conformance.provenance.declared_coverage``).
    """
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 3), label="topology")
    bit_exact = "bit_exact" in loadspec_adapter.capabilities
    repro = _repro(corpus, config, topology)
    with tempfile.TemporaryDirectory() as tmp:
        with Built(loadspec_adapter, corpus, config, topology, Path(tmp)) as loaders:
            per_rank = _epoch(loaders)
        coverage = (declared_coverage(loadspec_adapter, corpus, config, topology)
                    or expected_coverage(corpus, config, topology, order_known=bit_exact))
        universe = _universe(loadspec_adapter, corpus, config, Path(tmp)) if coverage is None else None
    trained = pair_counts(_rows(per_rank))
    g, seq_len = topology.world_size * topology.batch_size, config.packing.seq_len
    if coverage is not None:
        check_epoch_coverage(per_rank, corpus, config, topology, coverage, bit_exact=bit_exact, repro=repro)
        dropped = (coverage.samples - coverage.kept) * seq_len
    else:
        assert universe is not None
        dropped = g * seq_len
        lost = sorted(set(universe) - set(trained))
        check(len(lost) < dropped, clause="PART-4",
              what=f"{len(lost)} pairs that the loader trains on 1 rank with batch size 1 were never trained on "
                   f"{topology.world_size} rank(s) x batch size {topology.batch_size}, where end={config.end!r} may "
                   f"drop less than one global batch (G = {g} samples, at most {dropped} pairs): "
                   f"{describe_pairs(lost)}", repro=repro)
    promise = promised_pairs(corpus, config.packing)
    if promise is not None:
        pairs, tail = promise
        missing = sorted(pairs - set(trained))
        allowed = dropped + (coverage.streams if coverage is not None else 1) * max(tail - 1, 0)
        check(len(missing) <= allowed, clause="PACK-7" if config.packing.mode == "concat" else "PACK-18",
              what=f"{len(missing)} within-document pairs that {config.packing.mode!r} promises were never trained "
                   f"(allowed: {allowed}, the samples end={config.end!r} drops and the stream's tail): "
                   f"{describe_pairs(missing)}", repro=repro)


def _first_difference(got: list[list[Any]], expected: list[list[Any]]) -> tuple[int, int, Any, Any] | None:
    """``(step, row, got_row, expected_row)`` of the first sample where two runs differ (None: a row is absent)."""
    for t in range(max(len(got), len(expected))):
        a = got[t] if t < len(got) else []
        b = expected[t] if t < len(expected) else []
        for i in range(max(len(a), len(b))):
            x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
            if x != y:
                return t, i, x, y
    return None


def _assert_same_stream(got: list[list[Any]], expected: list[list[Any]], *, rank: int, what: str, epoch: int,
                        first_step: int, states: dict[str, Any], repro: dict[str, Any]) -> None:
    """Fail naming the first differing sample (its step and row, both values) and every state the run resumed from."""
    __tracebackhide__ = True
    diff = _first_difference(got, expected)
    if diff is None:
        return
    t, i, mine, theirs = diff
    saved = ", ".join(f"{name} {state!r}" for name, state in states.items())
    raise ClauseViolation("RES-1", f"{what}: rank {rank}'s first differing sample is row {i} of step "
                                   f"{first_step + t + 1} of epoch {epoch} (counting from 1): {mine!r}, but the uninterrupted run has {theirs!r} (steps: "
                                   f"{len(got)} resumed vs {len(expected)} uninterrupted; resumed from {saved})", repro)


@pytest.mark.clause("RES-1", "RES-2")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.provenance_corpora(), data=st.data(),
       k=st.integers(0, 8), j=st.integers(0, 3))
def test_resuming_after_k_steps_continues_the_uninterrupted_stream_also_when_resumed_twice(
        loadspec_adapter, corpus, data, k, j):
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 2), label="topology")
    with tempfile.TemporaryDirectory() as tmp:
        def run(states: list[Any] | None, steps: int | None) -> tuple[list[list[list[Any]]], list[Any]]:
            with Built(loadspec_adapter, corpus, config, topology, Path(tmp)) as loaders:
                if states is not None:
                    for ld, state in zip(loaders, states):
                        ld.load_state_dict(state)
                batches = [[list(b) for b in itertools.islice(iter(ld), steps)] for ld in loaders]
                return batches, [json.loads(json.dumps(ld.state_dict())) for ld in loaders]

        uninterrupted, _ = run(None, None)
        k = min(k, min(map(len, uninterrupted)))
        j = min(j, min(map(len, uninterrupted)) - k)
        head, states = run(None, k)
        middle, states2 = run(states, j)
        rest, _ = run(states2, None)
    repro = _repro(corpus, config, topology, k=k, j=j)
    for r in range(topology.world_size):
        _assert_same_stream(head[r] + middle[r] + rest[r], uninterrupted[r], rank=r, epoch=0, first_step=0,
                            what=f"{k} steps of epoch 0, resume, {j} steps, resume again, the rest", repro=repro,
                            states={f"the state after {k} steps": states[r],
                                    f"the state after {j} more": states2[r]})


def _resumed(loaders: list[Any], states: list[Any], j: int, *,
             skip_empty_pass: bool) -> tuple[list[list[list[Any]]], list[Any]]:
    """Every rank's rest of the pass after loading its state, and each rank's state after its first ``j`` batches.

    The ranks run in lockstep, as a job's do: each takes its next batch in
    turn, and a rank's state is taken once every rank has taken its ``j``-th
    (a state that is a collective over the ranks, ``state:global``, is then
    asked at one step of all of them; a rank's own state is the same either way).

    ``skip_empty_pass``: the state was taken when epoch 0's last step had been
    handed out but its pass had not ended; a loader may then still be in
    epoch 0 (an empty pass ends it) or already in epoch 1, and either is
    right, so an empty first pass is followed by the next one.
    """
    for ld, state in zip(loaders, states):
        ld.load_state_dict(state)
    later = [json.loads(json.dumps(ld.state_dict())) if j == 0 else None for ld in loaders]
    batches: list[list[list[Any]]] = [[] for _ in loaders]
    for first_pass in ([True, False] if skip_empty_pass else [True]):
        live = {r: iter(ld) for r, ld in enumerate(loaders) if first_pass or not batches[r]}
        while live:
            for r, it in list(live.items()):
                batch = next(it, None)
                if batch is None:
                    del live[r]
                else:
                    batches[r].append(list(batch))
            for r, ld in enumerate(loaders):
                if later[r] is None and len(batches[r]) == j:
                    later[r] = json.loads(json.dumps(ld.state_dict()))
    for r, ld in enumerate(loaders):
        if later[r] is None:  # fewer than j batches: the comparison names the difference
            later[r] = json.loads(json.dumps(ld.state_dict()))
    return batches, later


@pytest.mark.clause("RES-1", "RES-2", "RES-7")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.provenance_corpora(max_docs=8), data=st.data(),
       at=st.sampled_from(["epoch 0's last step", "the end of epoch 0's pass", "mid epoch 1"]),
       k=st.integers(1, 6), j=st.integers(0, 2))
def test_resuming_in_a_later_epoch_continues_that_epochs_stream_also_when_resumed_twice(
        loadspec_adapter, corpus, data, at, k, j):
    """A state taken in epoch 1, or at the boundary of epochs 0 and 1, resumes epoch 1's own stream, once or twice.

    Why: a sampler that forgets its epoch on resume (epoch 1 resumed in
    epoch 0's order) passes every resume in epoch 0. The state is taken after
    epoch 0's last step was handed out (the pass not yet ended), after the
    pass ended, or ``k`` steps into epoch 1; the run resumed from it once must
    give the rest of the uninterrupted epoch 1, and so must its first ``j``
    steps followed by a run resumed from the state it had after them.
    """
    config = data.draw(_configs(loadspec_adapter))
    topology = data.draw(_topologies(loadspec_adapter, 2), label="topology")
    with tempfile.TemporaryDirectory() as tmp:
        def build() -> Built:
            return Built(loadspec_adapter, corpus, config, topology, Path(tmp))

        with build() as loaders:
            epoch0 = _epoch(loaders)
            epoch1 = _epoch(loaders)
        last_step = at == "epoch 0's last step"
        k = 0 if at != "mid epoch 1" else min(k, min(map(len, epoch1)))
        with build() as loaders:
            if last_step:
                for ld, batches in zip(loaders, epoch0):
                    list(itertools.islice(iter(ld), len(batches)))
            else:
                _epoch(loaders)
                for ld in loaders:
                    list(itertools.islice(iter(ld), k))
            states = [json.loads(json.dumps(ld.state_dict())) for ld in loaders]
        j = min(j, min(map(len, epoch1)) - k)
        with build() as loaders:
            once, states2 = _resumed(loaders, states, j, skip_empty_pass=last_step)
        with build() as loaders:
            rest = _resumed(loaders, states2, 0, skip_empty_pass=last_step and j == 0)[0]
    where = f"after {at}" + (f" ({k} steps)" if at == "mid epoch 1" else "")
    repro = _repro(corpus, config, topology, at=at, k=k, j=j)
    for r in range(topology.world_size):
        _assert_same_stream(once[r], epoch1[r][k:], rank=r, epoch=1, first_step=k, repro=repro,
                            what=f"epoch 1 resumed once from the state saved {where}",
                            states={f"the state saved {where}": states[r]})
        _assert_same_stream(once[r][:j] + rest[r], epoch1[r][k:], rank=r, epoch=1, first_step=k, repro=repro,
                            what=f"epoch 1 resumed from the state saved {where}, {j} steps, then resumed again",
                            states={f"the state saved {where}": states[r], f"the state after {j} more": states2[r]})


@st.composite
def _topology_changes(draw, workers: bool, max_world: int, min_world: int = 1) -> tuple[Topology, Topology]:
    def one(least: int) -> Topology:
        return Topology(world_size=draw(st.integers(least, max_world)), batch_size=draw(st.integers(1, 3)),
                        num_workers=draw(st.integers(0, 2)) if workers else 0)
    before, after = one(min_world), one(1)
    assume(before != after)
    return before, after


class _LoadRaised(Exception):
    """An exception raised by ``load_state_dict`` or the first batch after it (``exc``): a refusal or a failure."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _continue(adapter, corpus, config, topology: Topology, states: list[Any], workdir: Path) -> list[list[list[Any]]]:
    """Every rank of ``topology`` loads its state of ``states`` and runs the rest of the pass.

    An exception at a load or a first batch is raised as :class:`_LoadRaised` (the kit's own violations pass).
    """
    with Built(adapter, corpus, config, topology, workdir) as loaders:
        firsts: list[Any] = []
        try:
            for ld, state in zip(loaders, states):
                ld.load_state_dict(state)
            for ld in loaders:
                it = iter(ld)
                firsts.append((it, next(it, None)))
        except ClauseViolation:
            raise
        except Exception as exc:
            firsts.clear()     # a partly read iterator's DataLoader workers stop now, not when the workdir is gone
            raise _LoadRaised(exc) from exc
        batches = [([list(first)] if first is not None else []) + [list(b) for b in it] for it, first in firsts]
        firsts.clear()
    return batches


def _check_global_cut(adapter, corpus, config, topology: Topology, states: list[Any], rests: list[list[list[Any]]],
                      taken: list[list[list[Any]]], ahead: int, workdir: Path, repro: dict[str, Any]) -> None:
    """Fail unless the global ``states`` (saved while rank ``ahead`` was a batch ahead), restored on their own
    ``topology``, resume every rank exactly where it stood: its own rest of the epoch (``rests``), no batch redone
    or skipped (a refusal passes: it is explicit).

    Why on the same topology: after a change of topology a redone batch is
    trained twice, which the at-most-once account sees, but a skipped one is
    lost within the end policy's allowance (fewer than a global batch); here
    the rest of each rank's stream is known exactly, so a global state copied
    from the furthest rank (an all-reduce of the maximum) fails as surely as
    one copied from rank 0.
    """
    __tracebackhide__ = True
    try:
        resumed = _continue(adapter, corpus, config, topology, states, workdir)
    except _LoadRaised as raised:
        check(is_refusal(adapter, raised.exc), clause="RES-6",
              what=f"loading the global state on {topology}, the topology that saved it, raised "
                   f"{type(raised.exc).__name__}: {raised.exc}, which the adapter does not count as a refusal",
              repro=repro)
        return
    for r, rest in enumerate(rests):   # past a rank's rest a loader may begin epoch 1: compare only the rest
        diff = _first_difference(resumed[r][:len(rest)], rest)
        check(diff is None, clause="RES-6",
              what=f"the adapter declares state:global, and every rank returned {states[0]!r} while rank {ahead} "
                   f"was one batch ahead ({len(taken[ahead])} taken, the others {len(taken[1 if ahead == 0 else 0])}); "
                   f"restored on the same {topology}, rank {r} (which had taken {len(taken[r])}) does not continue "
                   f"where it stood, so the state is not every rank's position: first difference (step after the "
                   f"checkpoint, row, resumed, uninterrupted): {diff}", repro=repro)


def _topology_change(adapter, corpus, config, before: Topology, after: Topology, *, k: int, restore: str,
                     ahead: int | None, repro: dict[str, Any]) -> None:
    """Take ``k`` steps on ``before`` (rank ``ahead`` one more), checkpoint, continue on ``after``; grade the epoch.

    With a rank ahead every rank restores rank 0's state, the checkpoint's cut:
    a rank that was ahead of rank 0 redoes its batch past the cut (it is not
    counted as trained), and a rank behind rank 0 skips its batch (allowed as
    lost). Rank 0's state must count rank 0's own batches (RES-6), so the run
    resumed from it continues exactly as one resumed from rank 0's state of a
    job whose ranks all took rank 0's count in lockstep.
    """
    global_state = "state:global" in adapter.capabilities
    with tempfile.TemporaryDirectory() as tmp:
        universe = _universe(adapter, corpus, config, Path(tmp))
        with Built(adapter, corpus, config, before, Path(tmp)) as loaders:
            iterators = [iter(ld) for ld in loaders]
            taken = [[list(b) for b in itertools.islice(it, k + (1 if r == ahead else 0))]
                     for r, it in enumerate(iterators)]
            states = [json.loads(json.dumps(ld.state_dict())) for ld in loaders]
            # each rank's own rest of the epoch, which a global state must resume on this topology
            rests = [[list(b) for b in it] for it in iterators] if global_state and ahead is not None else None
            del iterators      # a partly read iterator's DataLoader workers stop now, not when the workdir is gone
        if global_state:       # rank 0's copy is every rank's own position: no rank redoes or skips a batch
            differ = [r for r, state in enumerate(states) if state != states[0]]
            check(not differ, clause="RES-6", what=f"the adapter declares state:global, but rank(s) {differ} "
                                                   f"returned a state other than rank 0's", repro=repro)
            if rests is not None:
                _check_global_cut(adapter, corpus, config, before, states, rests, taken, ahead, Path(tmp), repro)
            ahead = None
        cut = len(taken[0])    # rank 0's count: a rank ahead of it redoes the batches past it
        trained = pair_counts(_rows([b[:cut] if ahead is not None else b for b in taken]), epoch=0)
        loaded = [states[0] if restore == "rank0" else states[r % before.world_size] for r in range(after.world_size)]
        try:
            after_batches = _continue(adapter, corpus, config, after, loaded, Path(tmp))
        except _LoadRaised as raised:
            exc = raised.exc
            check(is_refusal(adapter, exc), clause="RES-4",
                  what=f"loading the state on {after} raised {type(exc).__name__}: {exc}, which the adapter "
                       "does not count as a refusal", repro=repro)
            return
        if ahead is not None:
            with Built(adapter, corpus, config, before, Path(tmp)) as loaders:
                iterators = [iter(ld) for ld in loaders]
                for it in iterators:   # every rank asks for rank 0's batches (past the epoch's end too)
                    list(itertools.islice(it, k + (1 if ahead == 0 else 0)))
                lockstep = json.loads(json.dumps(loaders[0].state_dict()))
                del iterators
            if lockstep != states[0]:
                expected = _continue(adapter, corpus, config, after, [lockstep] * after.world_size, Path(tmp))
                for r in range(after.world_size):
                    diff = _first_difference(after_batches[r], expected[r])
                    check(diff is None, clause="RES-6",
                          what=f"rank 0 wrote its state after {cut} steps while rank {ahead} was one batch ahead: "
                               f"{states[0]!r}; resumed on {after}, rank {r} continues differently from the same "
                               f"{cut} steps taken in lockstep (state {lockstep!r}): the state counts another rank's "
                               f"batches, not rank 0's; first difference (step, row, resumed, lockstep): {diff}",
                          repro=repro)
    trained += pair_counts(_rows(after_batches), epoch=0)
    twice = sorted(p for p, c in trained.items() if c > 1)
    check(not twice, clause="RES-4", what=f"after resuming on {after}, {len(twice)} pairs were trained twice in the "
                                          f"epoch, e.g. {twice[:8]}", repro=repro)
    g1, g2 = before.world_size * before.batch_size, after.world_size * after.batch_size
    behind = g1 if ahead == 0 else 0   # rank 0 ahead: the others skip their batch of that step
    room = (max(g1, g2) + behind) * config.packing.seq_len
    ended = any(len(b) < k + (1 if r == ahead else 0) for r, b in enumerate(taken))   # epoch 0 ended before the cut
    coverage = (None if not global_state else declared_coverage(adapter, corpus, config, before) if ended
                else declared_coverage(adapter, corpus, config, after, state=loaded[0]))
    if coverage is not None:           # the loader's own end rule drops exactly what it declares, in epoch 0
        room = (coverage.samples - coverage.kept) * config.packing.seq_len + 1
    lost = sorted(set(universe) - set(trained))
    check(len(lost) < room, clause="RES-4", what=f"after resuming on {after}, {len(lost)} pairs were never trained "
                                                 f"(allowed: fewer than {room}), e.g. {lost[:8]}", repro=repro)
    if ahead is None:
        steps = [len(b) for b in after_batches]
        check(len(set(steps)) <= 1, clause="PART-1", what=f"resumed ranks ran {steps} steps: a collective would hang",
              repro=repro)


@pytest.mark.clause("RES-4", "RES-6", "PART-3", "PART-8")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.provenance_corpora(max_docs=12), data=st.data(), k=st.integers(0, 5),
       skew=st.sampled_from([0, 0, 1]), restore=st.sampled_from(["own", "rank0"]))
def test_a_state_loaded_on_another_topology_is_refused_or_continues_exactly_once(
        loadspec_adapter, corpus, data, k, skew, restore):
    """Change world size, batch size or workers at a checkpoint: an explicit error passes, silent loss or repeats fail.

    Also: every rank restoring its own state versus all restoring rank 0's,
    and rank 0 one batch ahead of the others when it wrote the checkpoint
    (``skew``, with rank 0's state: a job whose ranks each save their own
    state out of lockstep has no consistent checkpoint to grade). The other
    direction, the last rank ahead, is the next test. With ``state:global``
    every rank holds the same state, where each rank stood: no rank redoes
    or skips a batch.
    """
    config = data.draw(_configs(loadspec_adapter))
    before, after = data.draw(_topology_changes("workers" in loadspec_adapter.capabilities,
                                                    _max_world(loadspec_adapter, 3)))
    skew = skew if before.world_size > 1 and restore == "rank0" else 0
    _topology_change(loadspec_adapter, corpus, config, before, after, k=k, restore=restore,
                     ahead=0 if skew else None,
                     repro=_repro(corpus, config, (before, after), k=k, skew=skew, restore=restore))


@pytest.mark.clause("RES-4", "RES-6", "PART-3", "PART-8")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.provenance_corpora(max_docs=12), data=st.data(), k=st.integers(0, 5))
def test_a_state_saved_while_the_last_rank_was_a_batch_ahead_continues_from_rank_0s_count_on_another_topology(
        loadspec_adapter, corpus, data, k):
    """Lockstep skew the other way: the last rank one batch ahead of rank 0 when every rank restores rank 0's state.

    Why: a loader whose rank 0 checkpoints the furthest position any rank
    reached (a counter the ranks share) is exact while rank 0 is the one
    ahead, and skips a step of every other rank when rank 0 lags. The last
    rank redoes its batch past rank 0's count; nothing else may be repeated,
    and the run continues exactly as from a lockstep checkpoint at rank 0's
    count (RES-6), or the state is refused.
    """
    most = _max_world(loadspec_adapter, 3)
    if most < 2:
        pytest.skip(f"the adapter declares limits['max_world_size'] = {most}: lockstep skew needs two ranks in one "
                    "process (the per-rank suite skews ranks that run as processes)")
    config = data.draw(_configs(loadspec_adapter))
    before, after = data.draw(_topology_changes("workers" in loadspec_adapter.capabilities, most, min_world=2))
    _topology_change(loadspec_adapter, corpus, config, before, after, k=k, restore="rank0",
                     ahead=before.world_size - 1,
                     repro=_repro(corpus, config, (before, after), k=k, ahead=before.world_size - 1, restore="rank0"))
