"""The pipeline's configuration and its resume state, as executable functions.

Why: "resumes exactly" means nothing until the state is a value that can be
checked. This module states what the reference pipeline is (SPLIT → ORD →
PACK → PART, and for several sources SPLIT → ORD → PACK per source, then MIX
→ PART) as frozen configs and ``epoch_samples`` / ``mixture_samples``, and
what a resumable position is: the whole state is ``(epoch, consumed)``
(RES-2) with a format, a version and the fingerprint of the data and config
(RES-8), which ``validate_state`` refuses with a reason when it was taken on
other data or config. Because the state counts samples of the *global*
stream, it is independent of world size, batch size and worker count (RES-4,
RES-5). The per-rank loader that hands out batches and keeps this state, and
the resume contract as a function (``resume_mismatch``), are
``reference.loader``; ``audit_coverage`` here counts what an epoch trained.

Clauses: RES-1 .. RES-8, SPLIT-8, MIX-13, MIX-14, MIX-17, MIX-18.

Worked example (3 documents of 3 tokens, L = 2, one document per sample, so each is split into
2 chunks and the epoch holds 6 samples)::

    >>> from reference.packing import PackingConfig
    >>> corpus = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]]
    >>> cfg = PipelineConfig(packing=PackingConfig(seq_len=2, mode="none"))
    >>> len(epoch_samples(corpus, cfg, 0))
    6
    >>> fp = pipeline_fingerprint(corpus_fingerprint(corpus), cfg)
    >>> validate_state(make_state(fp, 1, 0), fp)             # the state after epoch 0: (epoch, consumed)
    (1, 0)
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from reference.errors import ConfigError, SplitError, StateError, TopologyError, require
from reference.mixing import MixConfig, WeightFn, check_mixture_weights, mix
from reference.ordering import OrderingConfig, epoch_order
from reference.packing import BIN_MODES, IGNORE, PackingConfig, Sample, bin_key, pack
from reference.partition import PADDING, End, PartitionConfig
from reference.splits import STORE_SPLIT, Bound, parse_bounds, resolve_bound, resolve_slice, split_corpus
from reference.streams import StreamConfig, check_batching, mix_streams

STATE_FORMAT = "loadspec.state"
STATE_VERSION = 2
SUPPORTED_STATE_VERSIONS = (1, 2)
"""The state versions this loadspec reads: exact values, not a bound (0, -1 or "1" are no version it wrote)."""
STATE_KEYS = frozenset({"format", "version", "fingerprint", "parts", "epoch", "consumed"})
STATE_KEYS_BY_VERSION = {1: STATE_KEYS - {"parts"}, 2: STATE_KEYS}
"""Version 1 states carry no ``parts``: they load when their fingerprint matches, and a mismatch is not explained."""
PART_HEX = 16
"""Hex digits of each fingerprint part (RES-8): enough to tell two components apart, short enough to stay O(K)."""
MAX_STATE_INT = 2**63 - 2
"""Largest ``epoch`` / ``consumed`` a state may hold: batches carry both as int64, and ``epoch + 1`` must fit too."""
PAD_SAMPLE_INDEX = PADDING

Corpus = Sequence[Sequence[Sequence[int]]]
"""Files, each a sequence of documents, each a sequence of token ids; document ids are file-major."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineConfig:
    """What the data is turned into: part of the fingerprint (RES-3). Topology is not.

    ``split`` selects documents ``[start, stop)`` of the store's file-major
    order before ordering (SPLIT-8): a ``(start, stop)`` pair of bounds
    (SPLIT-1..SPLIT-4) or split notation such as ``"train[:80%]"`` (SPLIT-6),
    stored as the pair. ``split=None`` (the whole store) adds no key to
    ``to_json``, so a whole-store config's fingerprint is the one a config
    without the field has, and states saved without it still match.

    >>> PipelineConfig(packing=PackingConfig(seq_len=4), split="train[10000:]").split
    (10000, None)
    """

    packing: PackingConfig
    ordering: OrderingConfig = field(default_factory=OrderingConfig)
    end: Literal["drop_last", "pad", "even"] = "drop_last"
    split: tuple[Bound, Bound] | str | None = None

    def __post_init__(self) -> None:
        require(self.end in ("drop_last", "pad", "even"), ConfigError,
                f"end={self.end!r}: choose one of 'drop_last', 'pad', 'even'")
        if self.split is not None:
            if isinstance(self.split, str):
                name, start, stop = parse_bounds(self.split)
                require(name == STORE_SPLIT, SplitError,
                        f"split={self.split!r} names the split {name!r}, but a token store holds one split, "
                        f"{STORE_SPLIT!r} (SPLIT-8): carve held-out rows out of it (e.g. \"train[99%:]\"), or build "
                        f"a store of the {name!r} data and pass it without a split")
                object.__setattr__(self, "split", (start, stop))
            require(isinstance(self.split, (tuple, list)) and len(self.split) == 2, SplitError,
                    f"split={self.split!r} must be a (start, stop) pair or split notation like \"train[:80%]\"")
            for bound in self.split:
                resolve_bound(bound, 0)
            object.__setattr__(self, "split", tuple(self.split))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ordering": asdict(self.ordering), "packing": asdict(self.packing), "end": self.end}
        if self.split is not None:
            out["split"] = list(self.split)
        if self.packing.mode in BIN_MODES and self.ordering.kind != "sequential":
            out["bins"] = "keyed"    # PACK-22: a state saved when these bins came in creation order does not fit
        return out

    def rows(self, num_documents: int) -> range:
        """The documents this pipeline reads, of a store holding ``num_documents`` (SPLIT-8)."""
        if self.split is None:
            return range(num_documents)
        assert isinstance(self.split, tuple)
        start, stop = self.split
        return resolve_slice(start, stop, num_documents)


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

    def partition(self, end: End) -> PartitionConfig:
        return PartitionConfig(world_size=self.world_size, batch_size=self.batch_size,
                               replication=self.replication, end=end)


@dataclass(frozen=True, slots=True)
class Row:
    """One sample handed to one rank: its global index in the epoch (-1 for padding) and content."""

    epoch: int
    sample_index: int
    sample: Sample
    source: int = 0


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
    """The epoch's global sample stream: the split's documents (SPLIT-8) in ORD order, packed by PACK (RES-1).

    A shuffled order (any kind but ``sequential``) also keys the order of the
    packed bins with the ordering's seed and the epoch (PACK-22). Document ids
    are the store's: a split's document ``d`` reports ``rows.start + d``
    (SPLIT-9), so two splits of one store never share an id.
    """
    first = 0
    if config.split is not None:
        rows = config.rows(sum(len(f) for f in corpus))
        corpus, first = split_corpus(corpus, rows), rows.start
    documents = [doc for file in corpus for doc in file]
    order = epoch_order([len(f) for f in corpus], config.ordering, epoch)
    key = None if config.ordering.kind == "sequential" else bin_key(config.ordering.seed, epoch)
    return pack([(first + d, documents[d]) for d in order], config.packing, key=key)


def padding_sample(config: PackingConfig) -> Sample:
    """The sample a ``pad`` end policy hands out: fully masked, attributed to no document (PART)."""
    n = config.seq_len
    return Sample(input_ids=(config.pad_id,) * n, labels=(IGNORE,) * n, position_ids=(0,) * n,
                  doc_ids=(-1,) * n, token_offsets=(-1,) * n, document_starts=())


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))


@dataclass(frozen=True, kw_only=True, slots=True)
class MixtureConfig:
    """Several sources, each its own pipeline up to PACK, mixed at sample level (MIX-13).

    Why sample level: a sample is ``seq_len`` positions whatever its source,
    so weights count samples, hence tokens, not documents of unequal length:
    a weight of 0.7 is 70 % of the draws while every source can be drawn,
    which under ``all_exhausted`` lasts only until a source runs out (the
    epoch's shares are then the sources' sizes, MIX-19). Each source keeps its own ``PipelineConfig``
    (split, ordering, packing; its ``end`` is unused); the mixture's ``end``
    is the partition's. Every source must pack to the same ``seq_len`` and
    ``pad_id`` (a batch stacks samples of several sources). ``weight_fn``
    (MIX-4) enters the fingerprint by its qualified name (MIX-14).
    ``streams`` (one ``StreamConfig`` per source) with ``epoch_size`` and
    ``batching_method`` select MosaicML-style per-epoch counts instead
    (MIX-15, MIX-16; ``global_batch_size`` and ``device_batch_size`` for
    the methods that compose batches, MIX-20, MIX-21); the weights then come from the counts, and
    ``mixing.seed`` keys the draws. A static weight of 0 is refused (MIX-18);
    ``allow_repeat=True`` lets sources read the same documents (MIX-17,
    checked by ``MixtureReferenceLoader``, which knows the data) and stays
    out of ``to_json``: it permits a mixture, it changes no sample.

    >>> p = PackingConfig(seq_len=4)
    >>> MixtureConfig(sources=(PipelineConfig(packing=p), PipelineConfig(packing=PackingConfig(seq_len=8))))
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: sources[1] packs seq_len=8, pad_id=0 but sources[0] packs seq_len=4, pad_id=0; every source of a mixture must pack to the same seq_len and pad_id
    """

    sources: tuple[PipelineConfig, ...]
    mixing: MixConfig = field(default_factory=MixConfig)
    end: Literal["drop_last", "pad", "even"] = "drop_last"
    weight_fn: WeightFn | None = None
    streams: tuple[StreamConfig, ...] | None = None
    epoch_size: int | None = None
    batching_method: str = "random"
    global_batch_size: int | None = None
    device_batch_size: int | None = None
    allow_repeat: bool = False

    def __post_init__(self) -> None:
        require(isinstance(self.allow_repeat, bool), ConfigError,
                f"allow_repeat={self.allow_repeat!r} must be True or False")
        if self.streams is not None:
            object.__setattr__(self, "streams", tuple(self.streams))
            require(len(self.streams) == len(self.sources), ConfigError,
                    f"{len(self.streams)} streams for {len(self.sources)} sources; pass one StreamConfig per source")
            require(all(isinstance(s, StreamConfig) for s in self.streams), ConfigError,
                    "streams must be StreamConfig objects, one per source")
            require(self.mixing.weights is None and self.weight_fn is None, ConfigError,
                    "streams set each source's share of the epoch; pass weights=None and weight_fn=None with them")
            check_batching(self.batching_method, self.global_batch_size, self.device_batch_size)
        else:
            require(self.epoch_size is None and self.batching_method == "random" and self.global_batch_size is None
                    and self.device_batch_size is None, ConfigError,
                    "epoch_size, batching_method and the batch sizes apply to streams; pass "
                    "streams=(StreamConfig(...), ...) with them")
        require(isinstance(self.sources, (tuple, list)) and len(self.sources) >= 1, ConfigError,
                f"sources={self.sources!r} must be a non-empty tuple of PipelineConfig, one per source")
        object.__setattr__(self, "sources", tuple(self.sources))
        for i, src in enumerate(self.sources):
            require(isinstance(src, PipelineConfig), ConfigError, f"sources[{i}]={src!r} must be a PipelineConfig")
        first = self.sources[0].packing
        for i, src in enumerate(self.sources[1:], start=1):
            p = src.packing
            require((p.seq_len, p.pad_id) == (first.seq_len, first.pad_id), ConfigError,
                    f"sources[{i}] packs seq_len={p.seq_len}, pad_id={p.pad_id} but sources[0] packs "
                    f"seq_len={first.seq_len}, pad_id={first.pad_id}; every source of a mixture must pack to the "
                    "same seq_len and pad_id")
        require(isinstance(self.mixing, MixConfig), ConfigError, f"mixing={self.mixing!r} must be a MixConfig")
        weights = self.mixing.weights
        require(weights is None or len(weights) == len(self.sources), ConfigError,
                f"mixing.weights has {0 if weights is None else len(weights)} entries but there are "
                f"{len(self.sources)} sources; pass one weight per source")
        require(self.end in ("drop_last", "pad", "even"), ConfigError,
                f"end={self.end!r}: choose one of 'drop_last', 'pad', 'even'")
        require(self.weight_fn is None or callable(self.weight_fn), ConfigError,
                f"weight_fn={self.weight_fn!r} must be callable (step, sizes, taken, exhausted) -> weights")
        if self.weight_fn is None:
            check_mixture_weights(self.mixing)

    @property
    def packing(self) -> PackingConfig:
        return self.sources[0].packing

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sources": [s.to_json() for s in self.sources], "mixing": asdict(self.mixing),
               "end": self.end, "weight_fn": _callable_name(self.weight_fn)}
        if self.streams is not None:
            out.update(streams=[asdict(s) for s in self.streams], epoch_size=self.epoch_size,
                       batching_method=self.batching_method)
            out.update({k: v for k, v in (("global_batch_size", self.global_batch_size),
                                          ("device_batch_size", self.device_batch_size)) if v is not None})
        return out


def mixture_fingerprint(data_fingerprints: Sequence[str], config: MixtureConfig) -> str:
    """Fingerprint of a mixture: every source's data, in order, and the mixture config (MIX-14, RES-3).

    >>> p = PipelineConfig(packing=PackingConfig(seq_len=4))
    >>> a = mixture_fingerprint(["d0", "d1"], MixtureConfig(sources=(p, p)))
    >>> a != mixture_fingerprint(["d1", "d0"], MixtureConfig(sources=(p, p)))
    True

    Clauses: MIX-14.
    """
    require(len(data_fingerprints) == len(config.sources), ConfigError,
            f"{len(data_fingerprints)} data fingerprints for {len(config.sources)} sources; pass one per source")
    payload = canonical_json({"data": list(data_fingerprints), "mixture": config.to_json()})
    return hashlib.sha256(payload.encode()).hexdigest()


def part_hash(value: Any) -> str:
    """The first ``PART_HEX`` hex digits of the sha256 of ``value``'s canonical JSON: one fingerprint part (RES-8)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:PART_HEX]


PIPELINE_PARTS = ("data", "ordering", "packing", "split", "end")
"""What a pipeline's fingerprint covers, part by part (RES-8); a mixture holds them per source, ``source_<i>_<part>``."""


def pipeline_parts(data_fingerprint: str, config: PipelineConfig) -> dict[str, str]:
    """The components of ``pipeline_fingerprint(data_fingerprint, config)``, each a short hash (RES-8).

    They only explain a refusal: the fingerprint alone decides whether a
    state loads (RES-3).

    >>> p = pipeline_parts("d" * 64, PipelineConfig(packing=PackingConfig(seq_len=4)))
    >>> sorted(p), len(p["packing"])
    (['data', 'end', 'ordering', 'packing', 'split'], 16)
    >>> q = pipeline_parts("d" * 64, PipelineConfig(packing=PackingConfig(seq_len=8)))
    >>> [k for k in p if p[k] != q[k]]
    ['packing']
    """
    return {"data": part_hash(data_fingerprint), "ordering": part_hash(asdict(config.ordering)),
            "packing": part_hash(asdict(config.packing)),
            "split": part_hash(None if config.split is None else list(config.split)), "end": part_hash(config.end)}


def mixture_level_parts(mixing: Mapping[str, Any], end: str, weight_fn: str | None,
                        streams: Any = None) -> dict[str, str]:
    """The mixture-wide components of a mixture fingerprint (RES-8): weights, seed, stopping, end, weight_fn, streams.

    ``mixing`` is the MixConfig as JSON (``weights``, ``stopping``,
    ``seed``); ``streams`` the streams with ``epoch_size`` and
    ``batching_method`` (None without streams).
    """
    return {"weights": part_hash(mixing.get("weights")), "mix_seed": part_hash(mixing.get("seed")),
            "stopping": part_hash(mixing.get("stopping")), "mix_end": part_hash(end),
            "weight_fn": part_hash(weight_fn), "streams": part_hash(streams)}


STREAM_KEYS = ("streams", "epoch_size", "batching_method", "global_batch_size", "device_batch_size")
"""What the ``streams`` part of a mixture's fingerprint covers (RES-8); the batch sizes only when set (MIX-16)."""


def mixture_parts(data_fingerprints: Sequence[str], config: MixtureConfig) -> dict[str, str]:
    """The components of ``mixture_fingerprint``: each source's pipeline parts, then the mixture's (RES-8).

    >>> p = PipelineConfig(packing=PackingConfig(seq_len=4))
    >>> parts = mixture_parts(["d0", "d1"], MixtureConfig(sources=(p, p)))
    >>> len(parts), parts["source_1_data"] == part_hash("d1")
    (16, True)
    """
    require(len(data_fingerprints) == len(config.sources), ConfigError,
            f"{len(data_fingerprints)} data fingerprints for {len(config.sources)} sources; pass one per source")
    out: dict[str, str] = {}
    for i, (data, source) in enumerate(zip(data_fingerprints, config.sources)):
        out.update({f"source_{i}_{k}": v for k, v in pipeline_parts(data, source).items()})
    mixture = config.to_json()
    streams = None if config.streams is None else {k: mixture[k] for k in STREAM_KEYS if k in mixture}
    out.update(mixture_level_parts(mixture["mixing"], config.end, mixture["weight_fn"], streams))
    return out


_PART_WHAT = {
    "data": ("data differs", "the store was rebuilt or is another store: other documents, tokenizer or build options"),
    "ordering": ("ordering differs", "shuffle, seed or window"),
    "packing": ("packing differs", "seq_len, mode or another packing option"),
    "split": ("split differs", "another split= of the store"),
    "end": ("end policy differs", "end='drop_last', 'pad' or 'even'"),
    "weights": ("weights differ", "weights="),
    "mix_seed": ("mix seed differs", "the mixture's seed="),
    "stopping": ("stopping strategy differs", "stopping="),
    "mix_end": ("end policy differs", "the mixture's end="),
    "weight_fn": ("weight_fn differs", "another function, by qualified name"),
    "streams": ("streams differ", "streams=, epoch_size=, batching_method=, global_batch_size= or device_batch_size="),
}


def _source_count(parts: Mapping[str, Any]) -> int:
    return sum(1 for k in parts if k.startswith("source_") and k.endswith("_data"))


def _source_parts(parts: Mapping[str, Any], i: int) -> tuple[Any, ...]:
    return tuple(parts.get(f"source_{i}_{k}") for k in PIPELINE_PARTS)


def mismatch_reasons(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between a checkpoint's fingerprint parts and this pipeline's, in words (RES-8).

    Sources that moved are named as a swap (matching every part of a
    source); the rest is listed part by part. Empty when the parts say
    nothing (a version-1 state, or parts that agree).

    >>> p = PipelineConfig(packing=PackingConfig(seq_len=4))
    >>> ab, ba = mixture_parts(["a", "b"], MixtureConfig(sources=(p, p))), mixture_parts(["b", "a"], MixtureConfig(sources=(p, p)))
    >>> mismatch_reasons(ab, ba)
    ["sources swapped: the checkpoint's source 0 is this mixture's source 1, the checkpoint's source 1 is this mixture's source 0"]
    """
    if not saved or not current:
        return []
    reasons: list[str] = []
    k_saved, k_now = _source_count(saved), _source_count(current)
    if k_saved != k_now:
        what = [f"a mixture of {k} sources" if k else "a single pipeline" for k in (k_saved, k_now)]
        return [f"the checkpoint is of {what[0]} but this is {what[1]}"]
    if k_now:
        old = [_source_parts(saved, i) for i in range(k_now)]
        new = [_source_parts(current, i) for i in range(k_now)]
        if old != new and Counter(old) == Counter(new):
            moved = [f"the checkpoint's source {i} is this mixture's source {new.index(o)}"
                     for i, o in enumerate(old) if o != new[i]]
            reasons.append("sources swapped: " + ", ".join(moved))
        else:
            for i in range(k_now):
                for k in PIPELINE_PARTS:
                    if saved.get(f"source_{i}_{k}") != current.get(f"source_{i}_{k}"):
                        short, detail = _PART_WHAT[k]
                        reasons.append(f"source {i}'s {short} ({detail})")
    for k, (short, detail) in _PART_WHAT.items():
        if k in current and saved.get(k) != current.get(k):
            reasons.append(f"the checkpoint's {short} ({detail})")
    return reasons


def mixture_items(source_sizes: Sequence[int], config: MixtureConfig, epoch: int) -> list[tuple[int, int]]:
    """Epoch ``epoch``'s mixed stream of ``(source, sample index within the source's epoch)`` (MIX-13, MIX-15)."""
    if config.streams is not None:
        return mix_streams(source_sizes, config.streams, config.mixing.seed, epoch, epoch_size=config.epoch_size,
                           batching_method=config.batching_method, global_batch_size=config.global_batch_size,
                           device_batch_size=config.device_batch_size)
    return mix(source_sizes, config.mixing, epoch, weight_fn=config.weight_fn)


def mixture_samples(sources: Sequence[Corpus], config: MixtureConfig, epoch: int) -> list[tuple[int, Sample]]:
    """The epoch's global stream of a mixture: ``(source, sample)`` pairs (MIX-13).

    Each source runs its own pipeline up to PACK (``epoch_samples``: split,
    order, pack, keyed by the source's own seed and the epoch); MIX then
    interleaves the sources' sample indices (``mix`` over the per-source
    sample counts of this epoch); PART partitions the result like any
    single-source stream. A fresh mixture every epoch: the MIX draws are
    keyed by ``(mixing.seed, epoch)``.

    Worked example (two sources of one file; A: 2 documents of 3 tokens, B: 1 document of 7 tokens,
    L = 2, chunk packing, round robin, all_exhausted)::

        >>> cfg = PipelineConfig(packing=PackingConfig(seq_len=2, mode="chunk"))
        >>> mixed = mixture_samples([[[[1, 2, 3], [4, 5, 6]]], [[[7, 8, 9, 10, 11, 12, 13]]]],
        ...                         MixtureConfig(sources=(cfg, cfg), mixing=MixConfig(stopping="all_exhausted")), 0)
        >>> [(s, x.input_ids) for s, x in mixed]
        [(0, (1, 2)), (1, (7, 8)), (0, (4, 5)), (1, (10, 11))]

    Clauses: MIX-13.
    """
    require(len(sources) == len(config.sources), ConfigError,
            f"{len(sources)} corpora for {len(config.sources)} source configs; pass one corpus per source")
    per_source = [epoch_samples(corpus, cfg, epoch) for corpus, cfg in zip(sources, config.sources)]
    items = mixture_items([len(s) for s in per_source], config, epoch)
    return [(s, per_source[s][i]) for s, i in items]


def make_state(fingerprint: str, epoch: int, consumed: int, parts: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole resume state (RES-2): JSON primitives, a format, a version, a fingerprint and its parts (RES-8).

    ``parts`` (``pipeline_parts`` / ``mixture_parts``; empty for a dataset
    that offers none) only explain a refusal: the fingerprint decides.
    """
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": fingerprint,
            "parts": dict(parts or {}), "epoch": epoch, "consumed": consumed}


def validate_state(state: Mapping[str, Any], fingerprint: str,
                   parts: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Refuse a state that loadspec did not write or that does not fit, with the reason and the fix (RES-3).

    Checked in order: a mapping; the format; the version, one of
    ``SUPPORTED_STATE_VERSIONS`` exactly (an int, not a bool or a string);
    exactly the keys of that version (``STATE_KEYS_BY_VERSION``); ``parts``
    a dict of strings; the fingerprint, whose refusal names the parts that
    differ from ``parts`` (RES-8); ``epoch`` and ``consumed`` integers in
    ``[0, MAX_STATE_INT]``. Returns ``(epoch, consumed)``.

    >>> good = make_state("f" * 64, 2, 10)
    >>> validate_state(good, "f" * 64)
    (2, 10)
    >>> validate_state(dict(good, version=0), "f" * 64)
    Traceback (most recent call last):
    ...
    reference.errors.StateError: state version 0 is not one this loadspec reads (supported: 1, 2): a state from a newer loadspec needs that version (upgrade loadspec); any other value was not written by loadspec
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
    assert isinstance(version, int)
    keys, wanted = set(state), STATE_KEYS_BY_VERSION[version]
    require(keys == wanted, StateError,
            f"state keys {sorted(keys)} are not {sorted(wanted)} (missing: {sorted(wanted - keys)}, "
            f"extra: {sorted(keys - wanted)}): it was edited or written by another tool; "
            "pass the dict state_dict() returned, unchanged")
    saved = state.get("parts", {})
    require(isinstance(saved, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in saved.items()),
            StateError, f"state parts ({type(saved).__name__}) must be a dict of strings (the fingerprint's "
            "components): it was edited or written by another tool; pass the dict state_dict() returned, unchanged")
    if state.get("fingerprint") != fingerprint:
        reasons = mismatch_reasons(saved, parts or {})
        why = ("; ".join(reasons) + "; a state resumes only the data and config it was taken on: restore the "
               "checkpoint's (the parts named), or start from a fresh state") if reasons else (
            "the checkpoint belongs to another dataset or pipeline configuration; restore the original data/config "
            "or start from a fresh state")
        raise StateError(f"state fingerprint {str(state.get('fingerprint'))[:12]}… does not match this data and "
                         f"config ({fingerprint[:12]}…): {why}")
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
