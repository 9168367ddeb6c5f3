"""Workloads: frozen dataclasses, one per benchmark case, used as pytest ids.

``str(workload)`` is the test id and the key ``benchmarks.compare`` and
``benchmarks.report`` find figures by (with the corpus size). Constants here
fix what every loader is asked to do, so the peers and impl do the same work.
"""

from __future__ import annotations

import dataclasses

SEQ_LEN = 2048                  # packed sample length (impl) / LitData TokensLoader block = SEQ_LEN + 1
RESUME_BATCH = 8                # "first batch" after a resume: 8 packed samples (impl) / 8 documents (peers)
TPUT_BATCH = 8                  # impl batch (8 x 2048 tokens); raw gather uses the same batches
PEER_TPUT_BATCH = 32            # peers yield documents (~660 tokens): batches of 32 as in the calibration runs
HF_ITERABLE_SHARDS = 32         # to_iterable_dataset(num_shards=...)
POSITIONS = (0.0, 0.5, 0.9)     # resume positions, fractions of the epoch
PACKING_MODES = ("concat", "chunk", "greedy", "first_fit", "best_fit", "none")
BUILD_NUM_PROC = 2

# Token budget per timed throughput round (the whole corpus is never iterated: a round is a fixed slice).
TPUT_TOKENS = {"S": 1 << 20, "M": 8 << 20, "L": 8 << 20}
# Samples materialised per packing-throughput round.
PACK_SAMPLES = {"S": 64, "M": 512, "L": 512}


@dataclasses.dataclass(frozen=True)
class Open:
    """Warm open/construct of an already-converted corpus (imports and conversion excluded)."""

    loader: str         # impl | impl-dataset | hf-load_from_disk | hf-load_dataset | mosaicml | litdata
    size: str

    def __str__(self) -> str:
        return f"open-{self.loader}-{self.size}"


@dataclasses.dataclass(frozen=True)
class Build:
    """Cold tokenize + index of the text corpus with the fixture tokenizer, ``num_proc`` processes."""

    loader: str         # impl | hf-map
    num_proc: int = BUILD_NUM_PROC

    def __str__(self) -> str:
        return f"build-{self.loader}-p{self.num_proc}"


@dataclasses.dataclass(frozen=True)
class Resume:
    """A fresh loader object: ``load_state_dict`` (or ``.skip``) -> first batch, at ``position`` of the epoch."""

    loader: str         # impl | impl-fresh | hf-iterable | hf-streaming | hf-skip | mosaicml | litdata
    position: float

    def __str__(self) -> str:
        return f"resume-{self.loader}-p{round(self.position * 100):02d}"


@dataclasses.dataclass(frozen=True)
class Construct:
    """``PackedDataset(store, ...)`` and its ``len`` on an opened store, the epoch plan already cached on disk."""

    packing: str
    shuffle: str

    def __str__(self) -> str:
        return f"construct-{self.packing}-{self.shuffle}"


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Steady-state iteration of a fixed token budget from the epoch start."""

    loader: str         # impl | raw | floor | hf-numpy | hf-arrow | mosaicml | litdata | litdata-tokens
    workers: int = 0
    shuffle: str = "none"   # impl, raw and floor only: "none" | "global"

    def __str__(self) -> str:
        shuffle = f"-{self.shuffle}" if self.loader in ("impl", "raw", "floor") else ""
        return f"tput-{self.loader}{shuffle}-w{self.workers}"


@dataclasses.dataclass(frozen=True)
class Packing:
    """Materialise ``PACK_SAMPLES`` samples of one packing mode (utilisation in extra_info)."""

    mode: str

    def __str__(self) -> str:
        return f"pack-{self.mode}"


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Compute one epoch's packing plan for one mode (no cache)."""

    mode: str

    def __str__(self) -> str:
        return f"plan-{self.mode}"


@dataclasses.dataclass(frozen=True)
class Rss:
    """Peak RSS across one epoch, measured in a subprocess."""

    loader: str         # impl | hf-iterable | mosaicml | litdata
    workers: int = 0

    def __str__(self) -> str:
        return f"rss-{self.loader}-w{self.workers}"


OPEN_LOADERS = ("impl", "impl-dataset", "hf-load_from_disk", "hf-load_dataset", "mosaicml", "litdata")
BUILDS = (Build("impl"), Build("hf-map"))
RESUME_LOADERS = ("impl", "impl-fresh", "hf-iterable", "hf-streaming", "hf-skip", "mosaicml", "litdata")
RESUMES = tuple(Resume(loader, p) for loader in RESUME_LOADERS for p in POSITIONS)
THROUGHPUTS = (
    Throughput("raw", 0, "none"), Throughput("floor", 0, "none"), Throughput("impl", 0, "none"),
    Throughput("impl", 2, "none"),
    Throughput("raw", 0, "global"), Throughput("floor", 0, "global"), Throughput("impl", 0, "global"),
    Throughput("impl", 2, "global"),
    Throughput("hf-numpy", 0), Throughput("hf-numpy", 2), Throughput("hf-arrow", 0),
    Throughput("mosaicml", 0), Throughput("mosaicml", 2),
    Throughput("litdata", 0), Throughput("litdata", 2),
)
CONSTRUCTS = (Construct("concat", "global"), Construct("concat", "window"), Construct("greedy", "global"))
PACKINGS = tuple(Packing(m) for m in PACKING_MODES)
PLANS = tuple(PackPlan(m) for m in PACKING_MODES)
RSSES = (Rss("impl", 0), Rss("impl", 2), Rss("hf-iterable", 0), Rss("mosaicml", 0), Rss("litdata", 0))


def ids(workload: object) -> str:
    return str(workload)
