"""One rank's reference loader and the resume contract, as executable functions.

Why: "resumes exactly" means nothing until it is a function that can fail.
This module composes the reference pipeline (``reference.resume``: the
configs, ``epoch_samples``, the state) into a per-rank loader whose whole
state is ``(epoch, consumed)`` (RES-2), and states the contract as
``resume_mismatch``: for every position k, a fresh loader given the state
taken after k batches yields exactly batches k.. of the uninterrupted
stream, across epoch boundaries too (RES-1). Because the state counts
samples of the *global* stream, it loads on another world size, batch size
or worker count (RES-4, RES-5). impl's counterpart is ``impl.loader``.

Clauses: RES-1, RES-2, RES-4, RES-6, RES-7, MIX-13, MIX-17.

Worked example (3 documents of 3 tokens, L = 2, one document per sample, so each is split into
2 chunks and the epoch holds 6 samples; two ranks, B = 1)::

    >>> from reference.packing import PackingConfig
    >>> corpus = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]]
    >>> cfg = PipelineConfig(packing=PackingConfig(seq_len=2, mode="none"))
    >>> a = ReferenceLoader(corpus, cfg, Topology(world_size=2, rank=0))
    >>> [[row.sample_index for row in batch] for batch in a]
    [[0], [2], [4]]
    >>> a.state_dict()["epoch"], a.state_dict()["consumed"]
    (1, 0)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from reference.errors import ConfigError, StateError, require
from reference.mixing import SourceRows, check_distinct_sources
from reference.packing import Sample
from reference.partition import advance, data_parallel_group, step_slice, steps_in_epoch
from reference.resume import (
    PAD_SAMPLE_INDEX,
    Corpus,
    MixtureConfig,
    PipelineConfig,
    Row,
    Topology,
    corpus_fingerprint,
    epoch_samples,
    make_state,
    mixture_fingerprint,
    mixture_parts,
    mixture_samples,
    padding_sample,
    pipeline_fingerprint,
    pipeline_parts,
    validate_state,
)
from reference.streams import check_batch_topology

ONE_RANK = Topology()
"""The default topology: one rank, batches of one."""


class Loader(Protocol):
    """What the resume contract needs of a loader: iteration of one epoch's rest, and state."""

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ReferenceLoader:
    """One rank's view of the pipeline, with the exact, elastic state of RES-2.

    Iterating yields this rank's batches for the rest of the current epoch (a
    list of ``Row`` per step); when the epoch ends the state moves to
    ``(epoch + 1, 0)``, so the next ``iter()`` continues with the next epoch.
    ``state_dict`` counts only batches already handed out (RES-6).
    """

    def __init__(self, corpus: Corpus, config: PipelineConfig, topology: Topology = ONE_RANK, *,
                 data_fingerprint: str | None = None) -> None:
        self.corpus = corpus
        self.config = config
        self.topology = topology
        self.partition = topology.partition(config.end)
        data = data_fingerprint or corpus_fingerprint(corpus)
        self.fingerprint = pipeline_fingerprint(data, config)
        self.parts = pipeline_parts(data, config)
        self.epoch = 0
        self.consumed = 0
        self._samples: tuple[int, list[Sample]] | None = None

    def samples(self, epoch: int) -> list[Sample]:
        if self._samples is None or self._samples[0] != epoch:
            self._samples = (epoch, epoch_samples(self.corpus, self.config, epoch))
        return self._samples[1]

    def source_of(self, epoch: int, index: int) -> int:
        """Which source sample ``index`` of ``epoch`` comes from: always 0 for one source."""
        return 0

    def __len__(self) -> int:
        """Steps in the current epoch from its start."""
        return steps_in_epoch(len(self.samples(self.epoch)), self.partition)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (RES-7)."""
        require(epoch >= 0, ConfigError, f"epoch={epoch} must be >= 0")
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def __iter__(self) -> Iterator[list[Row]]:
        epoch = self.epoch
        samples = self.samples(epoch)
        pad = padding_sample(self.config.packing)
        group = data_parallel_group(self.topology.rank, self.partition)
        while step := step_slice(self.consumed, len(samples), self.partition):
            self.consumed = advance(self.consumed, len(samples), self.partition)
            yield [Row(epoch, i, samples[i], self.source_of(epoch, i)) if i != PAD_SAMPLE_INDEX
                   else Row(epoch, i, pad) for i in step[group]]
        self.epoch, self.consumed = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return make_state(self.fingerprint, self.epoch, self.consumed, self.parts)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        epoch, consumed = validate_state(state, self.fingerprint, self.parts)
        total = len(self.samples(epoch))
        require(consumed <= total, StateError,
                f"state has consumed={consumed} but epoch {epoch} holds {total} samples: it was taken on other data "
                "or config; start from a fresh state or restore the matching data")
        self.epoch, self.consumed = epoch, consumed


def source_rows(data_fingerprints: Sequence[str], sources: Sequence[Corpus], config: MixtureConfig) -> list[SourceRows]:
    """Each source's identity for MIX-17: its data fingerprint and the rows its split reads (all rows without one).

    >>> from reference.packing import PackingConfig
    >>> p = PackingConfig(seq_len=4)
    >>> config = MixtureConfig(sources=(PipelineConfig(packing=p, split="train[:60%]"),
    ...                                 PipelineConfig(packing=p, split="train[50%:]")), allow_repeat=True)
    >>> corpus = [[[1, 2], [3], [4, 5], [6], [7], [8], [9], [10], [11], [12]]]
    >>> source_rows(["web", "web"], [corpus, corpus], config)
    [('web', range(0, 6)), ('web', range(5, 10))]

    Clauses: MIX-17.
    """
    require(len(data_fingerprints) == len(sources) == len(config.sources), ConfigError,
            f"{len(data_fingerprints)} data fingerprints and {len(sources)} corpora for {len(config.sources)} sources; "
            "pass one of each per source")
    out: list[SourceRows] = []
    for data, corpus, cfg in zip(data_fingerprints, sources, config.sources):
        n = sum(len(f) for f in corpus)
        out.append((str(data), cfg.rows(n) if n else range(0)))
    return out


class MixtureReferenceLoader(ReferenceLoader):
    """One rank's view of a mixture (MIX-13): ReferenceLoader over the mixed stream, rows tagged with their source.

    The state is the same ``(epoch, consumed)`` of RES-2, counting the mixed
    stream, so resuming needs no mixing cursor: the stream is a pure function
    of the sources, the config and the epoch (MIX-13, RES-4). Sources that
    read the same documents are refused unless ``config.allow_repeat``
    (MIX-17): the loader is where the reference knows each source's data.
    """

    def __init__(self, sources: Sequence[Corpus], config: MixtureConfig, topology: Topology = ONE_RANK, *,
                 data_fingerprints: Sequence[str] | None = None) -> None:
        require(isinstance(config, MixtureConfig), ConfigError, f"config={config!r} must be a MixtureConfig")
        self.corpus = sources   # type: ignore[assignment]
        self.sources = sources
        self.mixture = config
        self.config = config.sources[0]
        self.topology = topology
        self.partition = topology.partition(config.end)
        check_batch_topology(config.batching_method, config.global_batch_size, config.device_batch_size,
                             self.partition.data_parallel_size, self.partition.batch_size)
        prints = data_fingerprints or [corpus_fingerprint(c) for c in sources]
        self.fingerprint = mixture_fingerprint(prints, config)
        check_distinct_sources(source_rows(prints, sources, config), allow_repeat=config.allow_repeat)
        self.parts = mixture_parts(prints, config)
        self.epoch = 0
        self.consumed = 0
        self._samples = None
        self._mixed: tuple[int, list[int]] | None = None

    def samples(self, epoch: int) -> list[Sample]:
        if self._samples is None or self._samples[0] != epoch:
            mixed = mixture_samples(self.sources, self.mixture, epoch)
            self._samples = (epoch, [sample for _, sample in mixed])
            self._mixed = (epoch, [s for s, _ in mixed])
        return self._samples[1]

    def source_of(self, epoch: int, index: int) -> int:
        self.samples(epoch)
        assert self._mixed is not None
        return self._mixed[1][index]



def stream(loader: Loader, *, max_empty_epochs: int = 2) -> Iterator[Any]:
    """Batches across epoch boundaries: the uninterrupted stream RES-1 speaks of."""
    empty = 0
    while empty < max_empty_epochs:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        empty = 0 if produced else empty + 1


def take(loader: Loader, n: int) -> list[Any]:
    """The next ``n`` batches of ``stream(loader)`` (fewer if the data yields fewer)."""
    out: list[Any] = []
    if n <= 0:
        return out
    for batch in stream(loader):
        out.append(batch)
        if len(out) == n:
            break
    return out


def checkpoint_after(loader: Loader, k: int) -> dict[str, Any]:
    """Consume ``k`` batches and return the state, round-tripped through JSON (RES-2)."""
    take(loader, k)
    state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    return state


def resume_mismatch(make_loader: Callable[[], Loader], positions: Iterable[int], horizon: int) -> tuple[int, int] | None:
    """RES-1 as a function: ``None`` if resuming at every position reproduces the stream, else ``(k, j)``.

    ``k`` is the checkpoint position and ``j`` the first batch after it that differs.
    """
    reference_run = take(make_loader(), horizon)
    for k in positions:
        if k > len(reference_run):
            continue
        state = checkpoint_after(make_loader(), k)
        resumed = make_loader()
        resumed.load_state_dict(state)
        rest = take(resumed, len(reference_run) - k)
        if rest != reference_run[k:]:
            first = next((j for j, (a, b) in enumerate(zip(rest, reference_run[k:])) if a != b), min(len(rest), len(reference_run) - k))
            return k, k + first
    return None


def global_steps(corpus: Corpus, config: PipelineConfig, epoch: int, topologies: Sequence[tuple[Topology, int]]) -> list[list[Row]]:
    """Run an epoch through a sequence of topologies (each for a number of steps, -1 = to the end) and
    return every rank's batches: the elastic run RES-4 compares with the uninterrupted one."""
    batches: list[list[Row]] = []
    state: dict[str, Any] | None = None
    for topology, steps in topologies:
        loaders = [ReferenceLoader(corpus, config, Topology(world_size=topology.world_size, rank=r,
                                                           batch_size=topology.batch_size,
                                                           replication=topology.replication))
                   for r in range(topology.world_size)]
        for ld in loaders:
            ld.set_epoch(epoch)
            if state is not None:
                ld.load_state_dict(state)
        iterators = [iter(ld) for ld in loaders]
        taken = 0
        while steps < 0 or taken < steps:
            step = [next(it, None) for it in iterators]
            if any(b is None for b in step):
                require(all(b is None for b in step), StateError, "ranks disagree on the number of steps")
                break
            batches.extend(b for b in step if b is not None)
            taken += 1
        state = loaders[0].state_dict()
        if state["epoch"] != epoch:
            break
    return batches
