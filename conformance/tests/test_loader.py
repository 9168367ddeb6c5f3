"""The conformance suite: the loadspec_adapter under test (``--loadspec_adapter``) against the reference.

Each test builds every rank of a topology through the adapter, runs it, and
compares with ``reference.resume``. Configs are drawn only from the loadspec_adapter's
declared capabilities; tests that need more are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance import strategies as ls
from conformance.adapter import CanonicalRow, close, required_capabilities
from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from reference.errors import StateError
from reference.loader import ReferenceLoader, take
from reference.partition import trained_end
from reference.resume import PipelineConfig, Topology


def _rank_topologies(t: Topology) -> list[Topology]:
    return [Topology(world_size=t.world_size, rank=r, batch_size=t.batch_size, replication=t.replication,
                     num_workers=t.num_workers) for r in range(t.world_size)]


def _reference_epochs(corpus, config: PipelineConfig, t: Topology, epochs: int = 1) -> list[list[list[CanonicalRow]]]:
    """The reference's batches for the first ``epochs`` passes, one list per epoch."""
    loadspec_adapter = ReferenceLoader(corpus, config, t)
    return [[[CanonicalRow.from_reference(r) for r in batch] for batch in loadspec_adapter] for _ in range(epochs)]


def _build(stack: contextlib.ExitStack, adapter, corpus, config, topology, *, workdir):
    """``adapter.build(...)``, closed when ``stack`` exits (before the example's directory is deleted)."""
    loader = adapter.build(corpus, config, topology, workdir=workdir)
    stack.callback(close, loader)
    return loader


def _repro(corpus, config, topology, **extra):
    return {"corpus": corpus, "config": config, "topology": topology, **extra}


def _supported(loadspec_adapter, config: PipelineConfig, topology: Topology | None = None) -> bool:
    return required_capabilities(config, topology, loadspec_adapter.capabilities) <= loadspec_adapter.capabilities


@pytest.mark.clause("RES-1", "PART-1", "PACK-1", "ORD-1")
@pytest.mark.loadspec_capability("bit_exact")
@given(corpus=ls.corpora(), data=st.data(), topology=ls.topologies())
def test_every_rank_batch_equals_the_reference_bit_for_bit(loadspec_adapter, corpus, data, topology):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    assume(_supported(loadspec_adapter, config, topology))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        for t in _rank_topologies(topology):
            built = _build(built_here, loadspec_adapter, corpus, config, t, workdir=Path(tmp))
            got = [list(b) for b in built]
            assert_equal(got, _reference_epochs(corpus, config, t)[0], clause="RES-1", what=f"rank {t.rank} batches of epoch 0",
                         repro=_repro(corpus, config, t))


@pytest.mark.clause("PART-1", "SHARD-1")
@pytest.mark.loadspec_capability("bit_exact")
@given(corpus=ls.corpora(), data=st.data(), topology=ls.topologies())
def test_ranks_together_see_every_sample_of_the_epoch_exactly_once(loadspec_adapter, corpus, data, topology):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    assume(_supported(loadspec_adapter, config, topology) and config.end == "drop_last")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        per_rank = [list(_build(built_here, loadspec_adapter, corpus, config, t, workdir=Path(tmp))) for t in _rank_topologies(topology)]
    steps = {len(b) for b in per_rank}
    check(len(steps) == 1, clause="PART-1", what=f"ranks ran different step counts {steps}: a collective would hang",
          repro=_repro(corpus, config, topology))
    leaders = per_rank[:: topology.replication]
    seen = [row.sample_index for batches in leaders for batch in batches for row in batch]
    reference_len = len(ReferenceLoader(corpus, config, topology).samples(0))
    covered = trained_end(0, reference_len, topology.partition(config.end))
    assert_exactly_once(seen, range(covered), clause="PART-1", what="global sample indices over data-parallel groups",
                        repro=_repro(corpus, config, topology))
    for r in range(topology.world_size):
        assert_equal(per_rank[r], per_rank[r - r % topology.replication], clause="PART-2",
                     what=f"rank {r} vs its replica leader", repro=_repro(corpus, config, topology))


@pytest.mark.clause("RES-1", "RES-2")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.corpora(), data=st.data(), topology=ls.topologies(max_world=2), k=ls.positions)
def test_resuming_at_any_step_continues_the_uninterrupted_stream(loadspec_adapter, corpus, data, topology, k):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    assume(_supported(loadspec_adapter, config, topology))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        make = lambda: _build(built_here, loadspec_adapter, corpus, config, topology, workdir=Path(tmp))
        horizon = k + 6
        uninterrupted = take(make(), horizon)
        k = min(k, len(uninterrupted))
        first = make()
        take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        rest = take(resumed, len(uninterrupted) - k)
    assert_equal(rest, uninterrupted[k:], clause="RES-1", what=f"batches after resuming at step {k} from state {state!r}",
                 repro=_repro(corpus, config, topology, k=k, state=state))


@pytest.mark.clause("RES-2")
@pytest.mark.loadspec_capability("resume", "state:version", "state:fingerprint")
@given(corpus=ls.corpora(), data=st.data(), k=st.integers(0, 5))
def test_state_is_small_json_with_version_and_fingerprint(loadspec_adapter, corpus, data, k):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        built = _build(built_here, loadspec_adapter, corpus, config, Topology(), workdir=Path(tmp))
        take(built, k)
        state = built.state_dict()
    text = json.dumps(state)
    check(json.loads(text) == state, clause="RES-2", what="state does not survive a JSON round trip")
    check(len(text) < 4096, clause="RES-2", what=f"state is {len(text)} bytes of JSON, expected a small dict")
    check({"version", "fingerprint"} <= set(state), clause="RES-2", what=f"state keys {sorted(state)} lack version/fingerprint")


@pytest.mark.clause("RES-3")
@pytest.mark.loadspec_capability("resume", "state:version", "state:fingerprint")
@given(corpus=ls.corpora(min_documents=2), data=st.data())
def test_a_state_from_other_data_or_a_future_version_is_refused(loadspec_adapter, corpus, data):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    other = [[[t + 1 for t in doc] for doc in f] for f in corpus] + [[[7, 7, 7]]]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        a = _build(built_here, loadspec_adapter, corpus, config, Topology(), workdir=Path(tmp) / "a")
        b = _build(built_here, loadspec_adapter, other, config, Topology(), workdir=Path(tmp) / "b")
        assert_raises_typed(StateError, b.load_state_dict, a.state_dict(), clause="RES-3",
                            what="loading a state of other data", mentions=["fingerprint"])
        future = dict(a.state_dict(), version=a.state_dict()["version"] + 1)
        assert_raises_typed(StateError, a.load_state_dict, future, clause="RES-3",
                            what="loading a future-version state", mentions=["version"])


@pytest.mark.clause("RES-4", "PART-3")
@pytest.mark.loadspec_capability("bit_exact", "resume", "elastic", "end:drop_last")
@given(corpus=ls.corpora(max_docs=12), data=st.data(), before=ls.topologies(replication=False),
       after=ls.topologies(replication=False), k=st.integers(0, 6))
def test_resume_after_world_size_change_sees_every_sample_once(loadspec_adapter, corpus, data, before, after, k):
    drawn = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    config = PipelineConfig(ordering=drawn.ordering, packing=drawn.packing, end="drop_last")
    total = len(ReferenceLoader(corpus, config).samples(0))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        loaders = [_build(built_here, loadspec_adapter, corpus, config, t, workdir=Path(tmp)) for t in _rank_topologies(before)]
        iterators = [iter(ld) for ld in loaders]
        seen: list[int] = []
        for _ in range(k):
            step = [next(it, None) for it in iterators]
            if any(batch is None for batch in step):
                break
            seen += [row.sample_index for batch in step for row in batch]
        else:
            state = json.loads(json.dumps(loaders[0].state_dict()))
            resumed = [_build(built_here, loadspec_adapter, corpus, config, t, workdir=Path(tmp)) for t in _rank_topologies(after)]
            for ld in resumed:
                ld.load_state_dict(state)
            seen += [row.sample_index for ld in resumed for batch in ld for row in batch]
            consumed = state["consumed"]
            covered = trained_end(consumed, total, after.partition(config.end))
            assert_exactly_once(seen, range(covered), clause="RES-4", what="samples over both topologies",
                                repro=_repro(corpus, config, (before, after), k=k))
            return
    assert_exactly_once(seen, range(trained_end(0, total, before.partition(config.end))), clause="PART-7",
                        what="samples of an epoch the first topology finished", repro=_repro(corpus, config, before, k=k))


@pytest.mark.clause("RES-5")
@pytest.mark.loadspec_capability("workers", "workers:same_stream")
@given(corpus=ls.corpora(), data=st.data(), workers=st.integers(1, 2))
def test_worker_count_does_not_change_the_stream(loadspec_adapter, corpus, data, workers):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        plain = list(_build(built_here, loadspec_adapter, corpus, config, Topology(batch_size=2), workdir=Path(tmp)))
        with_workers = list(_build(built_here, loadspec_adapter, corpus, config, Topology(batch_size=2, num_workers=workers), workdir=Path(tmp)))
    assert_equal(with_workers, plain, clause="RES-5", what=f"batches with num_workers={workers}",
                 repro={"corpus": corpus, "config": config})


@pytest.mark.clause("RES-7", "ORD-1")
@pytest.mark.loadspec_capability("resume")
@given(corpus=ls.corpora(min_documents=4), data=st.data())
def test_the_next_epoch_follows_the_last_batch_of_the_previous_one(loadspec_adapter, corpus, data):
    config = data.draw(ls.pipeline_configs(loadspec_adapter.capabilities))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as built_here:
        built = _build(built_here, loadspec_adapter, corpus, config, Topology(), workdir=Path(tmp))
        first = list(built)
        second = list(built)
    check(all(r.epoch == 0 for b in first for r in b), clause="RES-7", what="first pass yields epoch 0")
    check(all(r.epoch == 1 for b in second for r in b), clause="RES-7", what="second pass yields epoch 1")
    if "bit_exact" in loadspec_adapter.capabilities:
        assert_equal([first, second], _reference_epochs(corpus, config, Topology(), 2), clause="RES-7",
                     what="epoch 0 and epoch 1 batches", repro={"corpus": corpus, "config": config})
