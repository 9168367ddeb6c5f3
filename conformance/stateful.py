"""A hypothesis state machine that checkpoints, crashes, resizes and restarts a loader against the reference.

Why a state machine: resume bugs live in *sequences* of events — a checkpoint
taken after an elastic resize, a restore into a loader with workers that
prefetched, ``set_epoch`` right after a restore. Example-based tests pick a
few such sequences; this machine lets hypothesis search them, and shrinks a
failure to the shortest sequence of rules that breaks a clause.

The model is the reference: positions move by ``reference.partition``
arithmetic (``rank_batch``, ``advance``, ``steps_in_epoch``), batch contents
come from ``reference.resume.epoch_samples``, and the state a loader reports
must name the model's position (RES-2). Rules (every rank of the job moves in
lockstep, as under a collective):

* ``take``: n steps, compared row for row with the model (RES-1, PART-1/2);
* ``checkpoint``: every rank's ``state_dict()`` through JSON, equal across ranks;
* ``restore``: a crash: fresh loaders from the last checkpoint, what was
  trained since is forgotten (RES-1);
* ``resize``: fresh loaders from the last checkpoint on another world size /
  batch size (RES-4, PART-3);
* ``change_workers``: fresh loaders from the current state with 0, 1 or 2
  DataLoader workers (RES-5, RES-6; rare, workers are slow to start);
* ``finish_epoch``, ``next_epoch`` (``set_epoch(e + 1)``) and
  ``set_current_epoch`` (the training loop's ``set_epoch(e)``, a no-op for a
  resumed state) (RES-7).

Invariant: in every epoch the global sample indices trained (over
data-parallel groups, padding excluded, forgetting what a crash undid) are a
prefix ``[0, n)`` of the epoch's stream, each exactly once (PART-8, RES-4).

The machine drives any ``conformance.adapter.LoaderAdapter``, the reference
adapter included. A loader may move to the next epoch when the pass ends (as
``ReferenceLoader`` and ``impl.loader`` do) or already when the last step is
handed out: a position with no step left in its epoch and the next epoch's
start are the same position, so states are compared after normalising that.

Also here: ``ReferenceDataset``, the reference pipeline behind the
``impl.dataset.PackedDataset`` interface, so the loader layer can be tested in
isolation from the dataset.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conformance import strategies as ls
from conformance.adapter import CanonicalRow, LoaderAdapter, close, required_capabilities
from conformance.assertions import assert_equal, assert_exactly_once, check
from reference.packing import Sample
from reference.partition import PADDING, PartitionConfig, advance, rank_batch, steps_in_epoch
from reference.resume import (
    Corpus,
    PipelineConfig,
    Row,
    Topology,
    corpus_fingerprint,
    epoch_samples,
    padding_sample,
    pipeline_fingerprint,
)

__all__ = ["LoaderMachine", "ReferenceDataset", "machine_for", "sample_tensors"]


# --------------------------------------------------------------------------- the reference as a dataset


def sample_tensors(sample: Sample, epoch: int, index: int) -> dict[str, Any]:
    """A reference ``Sample`` as the dict of tensors ``PackedDataset.__getitem__`` returns."""
    import torch

    def t(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    return {"input_ids": t(sample.input_ids), "labels": t(sample.labels), "position_ids": t(sample.position_ids),
            "doc_ids": t(sample.doc_ids), "token_offsets": t(sample.token_offsets),
            "epoch": torch.tensor(epoch, dtype=torch.int64), "sample_index": torch.tensor(index, dtype=torch.int64)}


class ReferenceDataset:
    """``reference.resume``'s pipeline with ``PackedDataset``'s interface (``num_samples``, ``SampleKey`` items).

    Why: it isolates the loader layer (sampler, workers, state) from the
    dataset under test, and it is the smallest dataset a third party's loader
    layer can be checked with.

    >>> ds = ReferenceDataset([[[1, 2, 3], [4, 5]]], PipelineConfig(packing=__import__("reference.packing").packing.PackingConfig(seq_len=2)))
    >>> ds.num_samples(0), ds[(0, 1)]["input_ids"].tolist()
    (2, [3, 4])
    """

    def __init__(self, corpus: Corpus, config: PipelineConfig) -> None:
        self.corpus = [[list(doc) for doc in file] for file in corpus]
        self.config = config
        self.fingerprint = pipeline_fingerprint(corpus_fingerprint(self.corpus), config)
        self.epoch = 0
        self._cache: dict[int, list[Sample]] = {}

    def samples(self, epoch: int) -> list[Sample]:
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[epoch] = epoch_samples(self.corpus, self.config, epoch)
        return self._cache[epoch]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def num_samples(self, epoch: int) -> int:
        return len(self.samples(epoch))

    def __len__(self) -> int:
        return self.num_samples(self.epoch)

    def __getitem__(self, key: Any) -> dict[str, Any]:
        epoch, index = (self.epoch, key) if isinstance(key, int) else (int(key[0]), int(key[1]))
        sample = padding_sample(self.config.packing) if index == PADDING else self.samples(epoch)[index]
        return sample_tensors(sample, epoch, index)


# --------------------------------------------------------------------------- the machine


def _ranks(t: Topology) -> list[Topology]:
    return [Topology(world_size=t.world_size, rank=r, batch_size=t.batch_size, replication=t.replication,
                     num_workers=t.num_workers) for r in range(t.world_size)]


@st.composite
def machine_corpora(draw, *, min_tokens: int = 48) -> list[list[list[int]]]:
    """``strategies.corpora`` (small), topped up to ``min_tokens`` tokens so that most configs yield samples.

    Why: the machine is about sequences of events; a corpus that packs into
    no sample at all (common among the adversarial shapes, and covered by
    ``conformance/tests/test_loader.py``) makes every rule a no-op.
    """
    corpus = draw(ls.corpora(max_files=3, max_docs=6, max_len=30))
    missing = min_tokens - sum(len(doc) for f in corpus for doc in f)
    if missing > 0:
        corpus.append([draw(st.lists(ls.token_ids, min_size=missing, max_size=missing + 24))])
    return corpus


class LoaderMachine(RuleBasedStateMachine):
    """Set ``adapter`` on a subclass (see :func:`machine_for`); hypothesis runs the rules."""

    adapter: LoaderAdapter
    max_world = 3
    max_steps_per_rule = 4
    max_worker_rebuilds = 2

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="loadspec-stateful-")
        self.workdir = Path(self._tmp.name)
        self.loaders: list[Any] = []
        self.iterators: list[Any] = []
        self.checkpoint_state: dict[str, Any] | None = None
        self.checkpoint_trained: dict[int, list[int]] = {}
        self.trained: dict[int, list[int]] = {}
        self.worker_rebuilds = 0
        self._samples: dict[int, list[Sample]] = {}
        self.log: list[str] = []

    def teardown(self) -> None:
        try:
            self._close_loaders()
        finally:
            self._tmp.cleanup()

    def _close_loaders(self) -> None:
        """Close the loaders built so far (their files and workers), before a rebuild and at teardown."""
        self.iterators = []
        loaders, self.loaders = self.loaders, []
        close(*loaders)

    # ------------------------------------------------------------ model helpers

    def samples(self, epoch: int) -> list[Sample]:
        if epoch not in self._samples:
            if len(self._samples) > 4:
                self._samples.clear()
            self._samples[epoch] = epoch_samples(self.corpus, self.config, epoch)
        return self._samples[epoch]

    @property
    def partition(self) -> PartitionConfig:
        return self.topology.partition(self.config.end)

    def _repro(self, **extra: Any) -> dict[str, Any]:
        return {"corpus": self.corpus, "config": self.config, "topology": self.topology,
                "position": (self.epoch, self.consumed), "rules": self.log, **extra}

    def _normalised(self, epoch: int, consumed: int) -> tuple[int, int]:
        """A position whose epoch has no step left is the next epoch's start (RES-7)."""
        if consumed > 0 and steps_in_epoch(len(self.samples(epoch)), self.partition, consumed) == 0:
            return epoch + 1, 0
        return epoch, consumed

    def _build(self, topology: Topology, state: dict[str, Any] | None) -> None:
        self._close_loaders()
        self.topology = topology
        self.loaders = [self.adapter.build(self.corpus, self.config, t, workdir=self.workdir) for t in _ranks(topology)]
        if state is not None:
            for ld in self.loaders:
                ld.load_state_dict(json.loads(json.dumps(state)))
        self.iterators = [None] * topology.world_size

    def _next_step(self) -> tuple[int, int, int] | None:
        """The model's next step: (epoch, position, epochs skipped), or None after two empty epochs (``stream``)."""
        epoch, consumed = self.epoch, self.consumed
        for skipped in range(3):
            if rank_batch(consumed, len(self.samples(epoch)), self.partition, 0):
                return epoch, consumed, skipped
            if skipped == 2:
                return None
            epoch, consumed = epoch + 1, 0
        return None

    def _pull(self, rank: int, attempts: int) -> list[CanonicalRow] | None:
        for _ in range(attempts):
            if self.iterators[rank] is None:
                self.iterators[rank] = iter(self.loaders[rank])
            batch = next(self.iterators[rank], None)
            if batch is not None:
                return list(batch)
            self.iterators[rank] = None
        return None

    def _step(self) -> bool:
        found = self._next_step()
        if found is None:
            return False
        epoch, consumed, skipped = found
        samples = self.samples(epoch)
        total = len(samples)
        pad = padding_sample(self.config.packing)
        for rank in range(self.topology.world_size):
            expected = [CanonicalRow.from_reference(Row(epoch, i, pad if i == PADDING else samples[i]))
                        for i in rank_batch(consumed, total, self.partition, rank)]
            got = self._pull(rank, attempts=skipped + 3)
            assert_equal(got, expected, clause="RES-1", what=f"rank {rank}'s batch at epoch {epoch}, position {consumed}",
                         repro=self._repro(rank=rank))
            if rank % self.topology.replication == 0:
                self.trained.setdefault(epoch, []).extend(r.sample_index for r in got if r.sample_index != PADDING)
        self.epoch, self.consumed = self._normalised(epoch, advance(consumed, total, self.partition))
        return True

    # ------------------------------------------------------------ rules

    @initialize(corpus=machine_corpora(), data=st.data(),
                topology=ls.topologies(max_world=3))
    def start(self, corpus, data, topology: Topology) -> None:
        self.corpus = corpus
        self.config = data.draw(ls.pipeline_configs(self.adapter.capabilities), label="config")
        if not required_capabilities(self.config, topology, self.adapter.capabilities) <= self.adapter.capabilities:
            topology = Topology(batch_size=topology.batch_size)
        self.epoch, self.consumed = 0, 0
        self.log.append(f"start({topology})")
        self._build(topology, None)

    @rule(n=st.integers(1, max_steps_per_rule))
    def take(self, n: int) -> None:
        self.log.append(f"take({n})")
        for _ in range(n):
            if not self._step():
                break

    @rule()
    def checkpoint(self) -> None:
        self.log.append("checkpoint")
        states = [json.loads(json.dumps(ld.state_dict())) for ld in self.loaders]
        for rank, state in enumerate(states):
            assert_equal(state, states[0], clause="RES-2", what=f"rank {rank}'s state vs rank 0's", repro=self._repro())
        state = states[0]
        check(json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 4096, clause="RES-2",
              what=f"state {state!r} is not a small JSON object", repro=self._repro())
        position = self._normalised(state["epoch"], state["consumed"])
        assert_equal(position, self._normalised(self.epoch, self.consumed), clause="RES-2",
                     what="the state's (epoch, consumed)", repro=self._repro(state=state))
        self.checkpoint_state = state
        self.checkpoint_trained = {e: list(v) for e, v in self.trained.items()}

    def _restore(self, topology: Topology) -> None:
        state = self.checkpoint_state
        self._build(topology, state)
        self.trained = {e: list(v) for e, v in self.checkpoint_trained.items()}
        self.epoch, self.consumed = state["epoch"], state["consumed"]

    @precondition(lambda self: self.checkpoint_state is not None)
    @rule()
    def restore(self) -> None:
        """A crash: every rank restarts from the last checkpoint on the same topology."""
        self.log.append("restore")
        self._restore(self.topology)

    @precondition(lambda self: self.checkpoint_state is not None and "elastic" in self.adapter.capabilities)
    @rule(world=st.integers(1, max_world), batch=st.integers(1, 3))
    def resize(self, world: int, batch: int) -> None:
        """Restart from the last checkpoint on another world size and per-rank batch size (RES-4)."""
        self.log.append(f"resize(world={world}, batch={batch})")
        self._restore(Topology(world_size=world, batch_size=batch, num_workers=self.topology.num_workers))

    @precondition(lambda self: "workers" in self.adapter.capabilities
                  and self.worker_rebuilds < self.max_worker_rebuilds)
    @rule(workers=st.integers(0, 2))
    def change_workers(self, workers: int) -> None:
        """Continue from the current state with another DataLoader worker count (RES-5, RES-6)."""
        self.log.append(f"change_workers({workers})")
        self.worker_rebuilds += 1
        state = self.loaders[0].state_dict()
        t = self.topology
        self._build(Topology(world_size=t.world_size, batch_size=t.batch_size, replication=t.replication,
                             num_workers=workers), state)

    @rule()
    def finish_epoch(self) -> None:
        self.log.append("finish_epoch")
        epoch = self.epoch
        while self.epoch == epoch and self._step():
            pass

    @rule()
    def next_epoch(self) -> None:
        """``set_epoch(e + 1)`` on every rank, mid-epoch or not (RES-7)."""
        self.log.append("next_epoch")
        self.iterators = [None] * len(self.loaders)
        for ld in self.loaders:
            ld.set_epoch(self.epoch + 1)
        self.epoch, self.consumed = self.epoch + 1, 0

    @rule()
    def set_current_epoch(self) -> None:
        """The training loop's ``set_epoch(epoch)`` for the epoch the state is in: a no-op, also after a restore (RES-7)."""
        self.log.append("set_current_epoch")
        self.iterators = [None] * len(self.loaders)
        for ld in self.loaders:
            ld.set_epoch(self.epoch)

    # ------------------------------------------------------------ invariants

    @invariant()
    def every_epoch_trains_a_prefix_exactly_once(self) -> None:
        for epoch, seen in self.trained.items():
            covered = max(seen, default=-1) + 1
            assert_exactly_once(seen, range(covered), clause="RES-4",
                                what=f"global sample indices trained in epoch {epoch}", repro=self._repro())


def machine_for(adapter: LoaderAdapter) -> type[LoaderMachine]:
    """The machine class bound to one adapter (hypothesis builds a fresh instance per example)."""
    return type(f"LoaderMachine_{adapter.name}", (LoaderMachine,), {"adapter": adapter})

