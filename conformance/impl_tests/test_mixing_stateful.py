"""A mixture through the resume state machine: impl's ``MixedDataset`` behind ``build_dataloader``, the reference mixture as the model.

``conformance.stateful.LoaderMachine`` drives one loader per rank through
``take``, ``checkpoint`` (every rank's state through JSON, equal across
ranks), ``restore`` (a crash back to the last checkpoint), ``resize`` (the
last checkpoint on another world size and batch size), ``finish_epoch``,
``next_epoch`` and ``set_current_epoch``, comparing every batch row for row
with the model. Here the model is ``reference.resume.mixture_samples`` (each
source split, ordered and packed by its own config, then MIX) and every row's
``source`` / ``source_index`` is compared with ``reference.resume.mixture_items``
too. On top of the machine's invariant (each epoch trains a prefix of its
stream, each index once), :meth:`MixtureMachine.every_source_is_trained_as_its_stopping_strategy_says`
checks, per epoch and source, what the issue asks of a mixture: each
source's samples trained once each, in its own order (``first_exhausted``,
``all_exhausted``; every one of them when the whole epoch was trained under
``all_exhausted``), cyclically (``all_exhausted_oversample``) or at most
once per whole pass (streams); and the per-source counts of what was trained
equal the mix's counts over that prefix (MosaicML streams: the exact
per-epoch counts of MIX-15 when the epoch was trained whole).

Bounded for CI (2 cores): at most 10 examples of at most 16 rules each,
whatever the hypothesis profile asks for; no DataLoader workers (a worker
start costs seconds; ``test_mixing.py`` runs a mixture with workers).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule, run_state_machine_as_test

from conformance import strategies as ls
from conformance.adapter import CanonicalRow
from conformance.adapters.impl import build_store, rows_from_batch
from conformance.assertions import assert_equal, check
from conformance.budget import kit_settings
from conformance.stateful import LoaderMachine, machine_corpora
from reference import mixing as ref_mixing
from reference import streams as ref_streams
from reference.mixing import STOPPING_STRATEGIES, MixConfig
from reference.partition import PADDING, advance, rank_batch
from reference.resume import MixtureConfig, PipelineConfig, Row, Topology, epoch_samples, mixture_items, padding_sample
from reference.streams import StreamConfig

MAX_EXAMPLES = 10
STEPS = 16


@st.composite
def machine_mixtures(draw) -> tuple[list[Any], MixtureConfig]:
    """1 to 3 corpora, one packing, an order each, and a mix: round robin, weights, balance_remaining or streams."""
    k = draw(st.integers(1, 3))
    packing = draw(ls.packing_configs(max_seq_len=12))
    corpora = [draw(machine_corpora()) for _ in range(k)]
    sources = tuple(PipelineConfig(packing=packing, ordering=draw(ls.ordering_configs(("sequential", "global", "window"))))
                    for _ in range(k))
    end = draw(st.sampled_from(["drop_last", "pad", "even"]))
    kind = draw(st.sampled_from(["round_robin", "weights", "balance", "streams"]))
    seed = draw(ls.seeds)
    if kind == "streams":
        if draw(st.booleans()):
            streams = tuple(StreamConfig(proportion=draw(st.sampled_from([0.5, 1.0, 2.0]))) for _ in range(k))
        else:
            streams = tuple(draw(st.sampled_from([StreamConfig(), StreamConfig(repeat=0.5), StreamConfig(repeat=1.5),
                                                  StreamConfig(choose=draw(st.integers(0, 12)))])) for _ in range(k))
        epoch_size = draw(st.one_of(st.none(), st.integers(1, 40)))
        return corpora, MixtureConfig(sources=sources, mixing=MixConfig(seed=seed), end=end, streams=streams,
                                      epoch_size=epoch_size, allow_repeat=True)   # drawn corpora may coincide (MIX-17)
    weights = tuple(float(w) for w in draw(st.lists(st.integers(1, 5), min_size=k, max_size=k))) \
        if kind == "weights" else None
    mixing = MixConfig(weights=weights, stopping=draw(st.sampled_from(STOPPING_STRATEGIES)), seed=seed)
    return corpora, MixtureConfig(sources=sources, mixing=mixing, end=end, allow_repeat=True,
                                  weight_fn=ref_mixing.balance_remaining if kind == "balance" else None)


class _MixtureRows:
    """One rank's impl loader over a fresh ``MixedDataset``, yielding ``(CanonicalRow, source, source_index)`` per row."""

    def __init__(self, dataset: Any, config: MixtureConfig, topology: Topology) -> None:
        from impl.loader import build_dataloader

        self.loader = build_dataloader(dataset, batch_size=topology.batch_size, rank=topology.rank,
                                       world_size=topology.world_size, replication=topology.replication,
                                       end=config.end, allow_empty_epoch=True)

    def __iter__(self):
        for batch in self.loader:
            yield list(zip(rows_from_batch(batch), batch["source"].tolist(), batch["source_index"].tolist()))

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class _Capabilities:
    """What ``LoaderMachine``'s preconditions read: resizes on, worker rebuilds off (seconds each on 2 cores)."""

    name = "impl-mixture"
    capabilities = frozenset({"bit_exact", "resume", "elastic"})


class MixtureMachine(LoaderMachine):
    adapter = _Capabilities()  # type: ignore[assignment]

    @initialize(mixture=machine_mixtures(), topology=ls.topologies(max_world=3))
    def start(self, mixture, topology: Topology) -> None:  # type: ignore[override]
        from impl.dataset import PackedDataset
        from impl.errors import EmptyDataError

        self.corpora, self.config = mixture
        self.corpus = self.corpora   # what the machine's repro prints
        try:
            self.stores = [PackedDataset.from_config(build_store(c, self.workdir), cfg, cache_dir=False).store
                           for c, cfg in zip(self.corpora, self.config.sources)]
        except EmptyDataError:
            assume(False)
        self._tags: dict[int, list[tuple[int, int]]] = {}
        self._sizes: dict[int, list[int]] = {}
        self.epoch, self.consumed = 0, 0
        self.log.append(f"start({topology})")
        self._build(topology, None)

    # ------------------------------------------------------------ the model: the reference mixture

    def samples(self, epoch: int) -> list[Any]:
        if epoch not in self._samples:
            if len(self._samples) > 4:
                self._samples.clear()
            per_source = [epoch_samples(c, cfg, epoch) for c, cfg in zip(self.corpora, self.config.sources)]
            self._sizes[epoch] = [len(s) for s in per_source]
            self._tags[epoch] = mixture_items(self._sizes[epoch], self.config, epoch)
            self._samples[epoch] = [per_source[s][i] for s, i in self._tags[epoch]]
        return self._samples[epoch]

    def tags(self, epoch: int) -> list[tuple[int, int]]:
        self.samples(epoch)
        return self._tags[epoch]

    # ------------------------------------------------------------ the loaders under test

    def _dataset(self) -> Any:
        """A fresh mixture, as a restarted process builds it."""
        from impl.dataset import PackedDataset
        from impl.mixed_dataset import MixedDataset
        from impl.mixing import balance_remaining

        c = self.config
        sources = [PackedDataset.from_config(store, cfg, cache_dir=False) for store, cfg in zip(self.stores, c.sources)]
        if c.streams is not None:
            return MixedDataset(sources, streams=c.streams, epoch_size=c.epoch_size, seed=c.mixing.seed, end=c.end,
                                allow_repeat=c.allow_repeat)
        return MixedDataset(sources, weights=c.mixing.weights, stopping=c.mixing.stopping, seed=c.mixing.seed,
                            weight_fn=balance_remaining if c.weight_fn is not None else None, end=c.end,
                            allow_repeat=c.allow_repeat)

    def _build(self, topology: Topology, state: dict[str, Any] | None) -> None:
        import json

        self.iterators = []
        self.loaders = []
        self.topology = topology
        self.loaders = [_MixtureRows(self._dataset(), self.config, Topology(
            world_size=topology.world_size, rank=r, batch_size=topology.batch_size,
            replication=topology.replication)) for r in range(topology.world_size)]
        if state is not None:
            for ld in self.loaders:
                ld.load_state_dict(json.loads(json.dumps(state)))
        self.iterators = [None] * topology.world_size

    def _step(self) -> bool:
        found = self._next_step()
        if found is None:
            return False
        epoch, consumed, skipped = found
        samples, tags = self.samples(epoch), self.tags(epoch)
        total = len(samples)
        pad = padding_sample(self.config.packing)
        for rank in range(self.topology.world_size):
            indices = rank_batch(consumed, total, self.partition, rank)
            expected = [(CanonicalRow.from_reference(Row(epoch, i, pad if i == PADDING else samples[i])),
                         *((-1, -1) if i == PADDING else tags[i])) for i in indices]
            got = self._pull(rank, attempts=skipped + 3)
            assert_equal(got, expected, clause="MIX-13",
                         what=f"rank {rank}'s batch (rows, source, source_index) at epoch {epoch}, position {consumed}",
                         repro=self._repro(rank=rank))
            if rank % self.topology.replication == 0:
                self.trained.setdefault(epoch, []).extend(r.sample_index for r, _, _ in got if r.sample_index != PADDING)
        self.epoch, self.consumed = self._normalised(epoch, advance(consumed, total, self.partition))
        return True

    @rule(n=st.integers(1, LoaderMachine.max_steps_per_rule))
    def take_more(self, n: int) -> None:
        """``take`` again: with eight rules and 16 steps, half the examples otherwise trained nothing."""
        self.take(n)

    # ------------------------------------------------------------ the mixture's invariant

    @invariant()
    def every_source_is_trained_as_its_stopping_strategy_says(self) -> None:
        streams = self.config.streams
        stopping = self.config.mixing.stopping
        for epoch, seen in self.trained.items():
            tags = self.tags(epoch)
            sizes = self._sizes[epoch]
            covered = max(seen, default=-1) + 1
            counts = Counter(tags[i][0] for i in seen)
            assert_equal(counts, Counter(s for s, _ in tags[:covered]), clause="MIX-3",
                         what=f"per-source counts of epoch {epoch}'s trained prefix [0, {covered})", repro=self._repro())
            whole = covered == len(tags)
            if streams is not None and whole:
                wanted = ref_streams.stream_counts(sizes, streams, self.config.epoch_size)
                assert_equal([counts[s] for s in range(len(sizes))], wanted, clause="MIX-15",
                             what=f"per-stream counts of the whole epoch {epoch}", repro=self._repro())
            for s, n in enumerate(sizes):
                items = [tags[i][1] for i in sorted(seen) if tags[i][0] == s]
                if streams is not None:
                    bound = math.ceil(counts[s] / n) if n else 0
                    check(all(c <= bound for c in Counter(items).values()), clause="MIX-15",
                          what=f"source {s} of epoch {epoch}: no sample repeated within a pass ({Counter(items)})",
                          repro=self._repro())
                    continue
                cycle = [j % n for j in range(len(items))] if n else []
                assert_equal(items, cycle if stopping == "all_exhausted_oversample" else list(range(len(items))),
                             clause="MIX-6", what=f"source {s}'s samples trained in epoch {epoch}, in order",
                             repro=self._repro())
                if stopping == "all_exhausted" and whole:
                    assert_equal(len(items), n, clause="MIX-7",
                                 what=f"source {s}'s samples trained in the whole epoch {epoch}", repro=self._repro())


@pytest.mark.clause("MIX-3", "MIX-6", "MIX-7", "MIX-13", "MIX-15", "RES-1", "RES-2", "RES-4", "RES-7", "PART-8")
def test_any_sequence_of_steps_checkpoints_crashes_resizes_and_epochs_keeps_a_mixture_exact():
    bounded = kit_settings(max_examples=min(kit_settings().max_examples, MAX_EXAMPLES), stateful_step_count=STEPS)
    run_state_machine_as_test(MixtureMachine, settings=bounded)
