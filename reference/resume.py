"""The pipeline and its resume contract, as executable functions.

Why: "resumes exactly" means nothing until it is a function that can fail.
This module composes the reference pipeline (ORD → PACK → PART) into a per-rank
loader whose whole state is ``(epoch, consumed)`` (RES-2), and states the
contract as ``resume_mismatch``: for every position k, a fresh loader given the
state taken after k batches yields exactly batches k.. of the uninterrupted
stream, across epoch boundaries too (RES-1). Because the state counts samples
of the *global* stream, it is independent of world size, batch size and worker
count (RES-4, RES-5).

Clauses: RES-1 .. RES-7.

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

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from reference.errors import ConfigError, StateError, TopologyError, require
from reference.ordering import OrderingConfig, epoch_order
from reference.packing import IGNORE, PackingConfig, Sample, pack
from reference.partition import PADDING, PartitionConfig, advance, data_parallel_group, step_slice, steps_in_epoch

STATE_FORMAT = "loadspec.state"
STATE_VERSION = 1
SUPPORTED_STATE_VERSIONS = (1,)
"""The state versions this loadspec reads: exact values, not a bound (0, -1 or "1" are no version it wrote)."""
STATE_KEYS = frozenset({"format", "version", "fingerprint", "epoch", "consumed"})
MAX_STATE_INT = 2**63 - 2
"""Largest ``epoch`` / ``consumed`` a state may hold: batches carry both as int64, and ``epoch + 1`` must fit too."""
PAD_SAMPLE_INDEX = PADDING

Corpus = Sequence[Sequence[Sequence[int]]]
"""Files, each a sequence of documents, each a sequence of token ids; document ids are file-major."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineConfig:
    """What the data is turned into: part of the fingerprint (RES-3). Topology is not."""

    packing: PackingConfig
    ordering: OrderingConfig = field(default_factory=OrderingConfig)
    end: Literal["drop_last", "pad", "even"] = "drop_last"

    def __post_init__(self) -> None:
        require(self.end in ("drop_last", "pad", "even"), ConfigError,
                f"end={self.end!r}: choose one of 'drop_last', 'pad', 'even'")

    def to_json(self) -> dict[str, Any]:
        return {"ordering": asdict(self.ordering), "packing": asdict(self.packing), "end": self.end}


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """Where this loader runs: may change between save and load (RES-4, RES-5)."""

    world_size: int = 1
    rank: int = 0
    batch_size: int = 1
    replication: int = 1
    num_workers: int = 0

    def __post_init__(self) -> None:
        require(self.world_size >= 1, TopologyError, f"world_size={self.world_size} must be >= 1")
        require(0 <= self.rank < self.world_size, TopologyError,
                f"rank={self.rank} must lie in [0, world_size={self.world_size})")
        require(self.num_workers >= 0, TopologyError, f"num_workers={self.num_workers} must be >= 0")

    def partition(self, end: str) -> PartitionConfig:
        return PartitionConfig(world_size=self.world_size, batch_size=self.batch_size,
                               replication=self.replication, end=end)


@dataclass(frozen=True, slots=True)
class Row:
    """One sample handed to one rank: its global index in the epoch (-1 for padding) and content."""

    epoch: int
    sample_index: int
    sample: Sample


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def corpus_fingerprint(corpus: Corpus) -> str:
    """sha256 of the corpus's canonical JSON: the data half of the fingerprint (RES-3)."""
    return hashlib.sha256(canonical_json([[list(d) for d in f] for f in corpus]).encode()).hexdigest()


def pipeline_fingerprint(data_fingerprint: str, config: PipelineConfig) -> str:
    """Fingerprint of data and config together (RES-3); topology is deliberately left out."""
    payload = canonical_json({"data": data_fingerprint, "config": config.to_json()})
    return hashlib.sha256(payload.encode()).hexdigest()


def epoch_samples(corpus: Corpus, config: PipelineConfig, epoch: int) -> list[Sample]:
    """The epoch's global sample stream: documents in ORD order, packed by PACK (RES-1)."""
    documents = [doc for file in corpus for doc in file]
    order = epoch_order([len(f) for f in corpus], config.ordering, epoch)
    return pack([(d, documents[d]) for d in order], config.packing)


def padding_sample(config: PackingConfig) -> Sample:
    """The sample a ``pad`` end policy hands out: fully masked, attributed to no document (PART)."""
    n = config.seq_len
    return Sample(input_ids=(config.pad_id,) * n, labels=(IGNORE,) * n, position_ids=(0,) * n,
                  doc_ids=(-1,) * n, token_offsets=(-1,) * n, document_starts=())


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

    def __init__(self, corpus: Corpus, config: PipelineConfig, topology: Topology = Topology(), *,
                 data_fingerprint: str | None = None) -> None:
        self.corpus = corpus
        self.config = config
        self.topology = topology
        self.partition = topology.partition(config.end)
        self.fingerprint = pipeline_fingerprint(data_fingerprint or corpus_fingerprint(corpus), config)
        self.epoch = 0
        self.consumed = 0
        self._samples: tuple[int, list[Sample]] | None = None

    def samples(self, epoch: int) -> list[Sample]:
        if self._samples is None or self._samples[0] != epoch:
            self._samples = (epoch, epoch_samples(self.corpus, self.config, epoch))
        return self._samples[1]

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
            yield [Row(epoch, i, samples[i] if i != PAD_SAMPLE_INDEX else pad) for i in step[group]]
        self.epoch, self.consumed = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return make_state(self.fingerprint, self.epoch, self.consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        epoch, consumed = validate_state(state, self.fingerprint)
        total = len(self.samples(epoch))
        require(consumed <= total, StateError,
                f"state has consumed={consumed} but epoch {epoch} holds {total} samples: it was taken on other data "
                "or config; start from a fresh state or restore the matching data")
        self.epoch, self.consumed = epoch, consumed


def make_state(fingerprint: str, epoch: int, consumed: int) -> dict[str, Any]:
    """The whole resume state (RES-2): JSON primitives, a format, a version and a fingerprint."""
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": fingerprint,
            "epoch": epoch, "consumed": consumed}


def validate_state(state: Mapping[str, Any], fingerprint: str) -> tuple[int, int]:
    """Refuse a state that loadspec did not write or that does not fit, with the reason and the fix (RES-3).

    Checked in order: a mapping; the format; the version, one of
    ``SUPPORTED_STATE_VERSIONS`` exactly (an int, not a bool or a string);
    exactly the keys of ``STATE_KEYS``; the fingerprint; ``epoch`` and
    ``consumed`` integers in ``[0, MAX_STATE_INT]``. Returns ``(epoch, consumed)``.

    >>> good = make_state("f" * 64, 2, 10)
    >>> validate_state(good, "f" * 64)
    (2, 10)
    >>> validate_state(dict(good, version=0), "f" * 64)
    Traceback (most recent call last):
    ...
    reference.errors.StateError: state version 0 is not one this loadspec reads (supported: 1): a state from a newer loadspec needs that version (upgrade loadspec); any other value was not written by loadspec
    """
    require(isinstance(state, Mapping), StateError,
            f"state must be a dict (a loader's state_dict()), got {type(state).__name__}; pass the dict you saved")
    require(state.get("format") == STATE_FORMAT, StateError,
            f"state format {state.get('format')!r} is not {STATE_FORMAT!r}: this state was not written by loadspec; "
            "pass the dict a loadspec loader's state_dict() returned")
    version = state.get("version")
    require(type(version) is int and version in SUPPORTED_STATE_VERSIONS, StateError,
            f"state version {version!r} is not one this loadspec reads (supported: "
            f"{', '.join(map(str, SUPPORTED_STATE_VERSIONS))}): a state from a newer loadspec needs that version "
            "(upgrade loadspec); any other value was not written by loadspec")
    keys = set(state)
    require(keys == STATE_KEYS, StateError,
            f"state keys {sorted(keys)} are not {sorted(STATE_KEYS)} (missing: {sorted(STATE_KEYS - keys)}, "
            f"extra: {sorted(keys - STATE_KEYS)}): it was edited or written by another tool; "
            "pass the dict state_dict() returned, unchanged")
    require(state.get("fingerprint") == fingerprint, StateError,
            f"state fingerprint {str(state.get('fingerprint'))[:12]}… does not match this data and config "
            f"({fingerprint[:12]}…): the checkpoint belongs to another dataset or pipeline configuration; "
            "restore the original data/config or start from a fresh state")
    epoch, consumed = state["epoch"], state["consumed"]
    for name, value in (("epoch", epoch), ("consumed", consumed)):
        require(type(value) is int and 0 <= value <= MAX_STATE_INT, StateError,
                f"state {name}={value!r} must be an integer in [0, {MAX_STATE_INT}] (it is carried as int64): "
                "the state is corrupt or edited; start from a fresh state or an earlier checkpoint")
    return epoch, consumed


@dataclass(frozen=True, slots=True)
class Coverage:
    """What an epoch's audit found (RES-4): samples trained, repeats, gaps, and samples past the trained prefix."""

    trained: int
    duplicates: int
    missing: int
    beyond_end: int

    @property
    def exact(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.beyond_end == 0


def audit_coverage(trained: Iterable[int], end: int) -> Coverage:
    """RES-4 as counts: each sample index in ``[0, end)`` trained exactly once, none past it; padding (-1) ignored.

    ``end`` is ``reference.partition.trained_end`` of the config that finished the epoch.

    >>> audit_coverage([0, 1, 1, 3, 5, -1], end=4)
    Coverage(trained=5, duplicates=1, missing=1, beyond_end=1)
    """
    counts = Counter(i for i in trained if i != PAD_SAMPLE_INDEX)
    return Coverage(trained=sum(counts.values()),
                    duplicates=sum(c - 1 for c in counts.values() if c > 1),
                    missing=sum(1 for i in range(end) if i not in counts),
                    beyond_end=sum(c for i, c in counts.items() if i >= end))


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
    return json.loads(json.dumps(loader.state_dict()))


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
            batches.extend(step)
            taken += 1
        state = loaders[0].state_dict()
        if state["epoch"] != epoch:
            break
    return batches
