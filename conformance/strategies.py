"""Every hypothesis strategy of the kit, in one module (import as ``ls``).

Corpora come in realistic and adversarial shapes: empty documents, a single
document, documents longer than a sample, files with zero documents, many tiny
files. Configs are drawn only from what the loader under test declares it can
do, so a loader is never failed for a feature it does not claim.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig, Topology

VOCAB = 50_257
BOS, EOS, PAD = 50_256, 50_256, 0

token_ids = st.integers(min_value=1, max_value=VOCAB - 2)


def documents(max_len: int = 40) -> st.SearchStrategy[list[int]]:
    return st.lists(token_ids, min_size=0, max_size=max_len)


@st.composite
def corpora(draw, *, max_files: int = 5, max_docs: int = 8, max_len: int = 40, min_documents: int = 1) -> list[list[list[int]]]:
    """Files of documents of token ids, with adversarial shapes mixed in."""
    shape = draw(st.sampled_from(["random", "random", "random", "single", "empty_docs", "tiny_files", "long_docs", "empty_files"]))
    if shape == "single":
        corpus = [[draw(documents(max_len).filter(len))]]
    elif shape == "empty_docs":
        corpus = [[draw(documents(max_len)) if i % 2 else [] for i in range(draw(st.integers(1, max_docs)))]]
    elif shape == "tiny_files":
        corpus = [[draw(documents(3))] for _ in range(draw(st.integers(1, 3 * max_files)))]
    elif shape == "long_docs":
        corpus = [draw(st.lists(documents(4 * max_len), min_size=1, max_size=3)) for _ in range(draw(st.integers(1, 2)))]
    elif shape == "empty_files":
        corpus = draw(st.lists(st.one_of(st.just([]), st.lists(documents(max_len), max_size=max_docs)), min_size=2, max_size=max_files))
    else:
        corpus = draw(st.lists(st.lists(documents(max_len), max_size=max_docs), min_size=1, max_size=max_files))
    if sum(len(f) for f in corpus) < min_documents:
        corpus.append([draw(documents(max_len).filter(len))])
    return corpus


def ordering_configs(kinds: Iterable[str] = ("sequential", "global", "window", "buffer"), *,
                     max_seed: int = 2**32) -> st.SearchStrategy[OrderingConfig]:
    return st.builds(lambda kind, seed, window, buffer_size: OrderingConfig(kind=kind, seed=seed, window=window, buffer_size=buffer_size),
                     st.sampled_from(sorted(kinds)), st.integers(0, max_seed), st.integers(1, 9), st.integers(0, 9))


def packing_configs(modes: Iterable[str] = ("concat", "chunk", "greedy", "first_fit", "best_fit", "none"), *,
                    options: bool = True, max_seq_len: int = 24, stride: bool = True) -> st.SearchStrategy[PackingConfig]:
    @st.composite
    def build(draw):
        mode = draw(st.sampled_from(sorted(modes)))
        seq_len = draw(st.integers(1, max_seq_len))
        kwargs: dict = {"seq_len": seq_len, "mode": mode, "window": draw(st.integers(1, 8)), "pad_id": PAD}
        if options and draw(st.booleans()):
            bos_cont = seq_len > 2 and draw(st.booleans())
            room = seq_len - (1 if bos_cont else 0)
            kwargs.update(add_bos=draw(st.booleans()), add_eos=draw(st.booleans()), bos_id=BOS, eos_id=EOS,
                          min_len=draw(st.integers(0, 3)), overflow=draw(st.sampled_from(["split", "truncate"])),
                          bos_on_continuation=bos_cont, stride=draw(st.integers(0, max(0, min(3, room - 1)))) if stride else 0)
        return PackingConfig(**kwargs)
    return build()


def pipeline_configs(capabilities: Iterable[str] | None = None, *, max_seed: int = 2**32,
                     stride: bool = True) -> st.SearchStrategy[PipelineConfig]:
    """Pipeline configs restricted to a loader's declared capabilities (``shuffle:seeded`` draws global orders)."""
    caps = set(capabilities) if capabilities is not None else None

    def allowed(prefix: str, names: Iterable[str]) -> list[str]:
        return [n for n in names if caps is None or f"{prefix}:{n}" in caps]

    kinds = allowed("ordering", ["sequential", "global", "window", "buffer"])
    if caps is not None and "shuffle:seeded" in caps and "global" not in kinds:
        kinds.append("global")
    modes = allowed("packing", ["concat", "chunk", "greedy", "first_fit", "best_fit", "none"])
    ends = allowed("end", ["drop_last", "pad", "even"])
    options = caps is None or "packing:options" in caps
    return st.builds(lambda o, p, e: PipelineConfig(ordering=o, packing=p, end=e),
                     ordering_configs(kinds, max_seed=max_seed), packing_configs(modes, options=options, stride=stride),
                     st.sampled_from(ends))


def adapter_configs(adapter: object, **kwargs: object) -> st.SearchStrategy[PipelineConfig]:
    """``pipeline_configs`` for an adapter: its capabilities and its declared ``limits`` (e.g. ``{"max_seed": ...}``)."""
    limits = dict(getattr(adapter, "limits", {}) or {})
    return pipeline_configs(adapter.capabilities, max_seed=int(limits.get("max_seed", 2**32)), **kwargs)  # type: ignore[attr-defined, arg-type]


@st.composite
def provenance_corpora(draw, *, max_files: int = 4, max_docs: int = 10, max_len: int = 40) -> list[list[list[int]]]:
    """Corpora where provenance bugs show: a few documents repeat their tokens, others share a prefix.

    Why targeted: a loader that swaps two documents, restarts a document one
    offset late or duplicates a row after a resume is caught only when the
    rows differ in content; repeated tokens make labels that are right by
    accident rare, and enough tokens make several global batches.
    """
    corpus = draw(corpora(max_files=max_files, max_docs=max_docs, max_len=max_len))
    total = sum(len(d) for f in corpus for d in f)
    if total < 60:
        corpus.append([list(range(1, 61 - total)), [7, 7, 7, 7, 8, 8, 8, 8]])
    return corpus


@st.composite
def topologies(draw, *, max_world: int = 4, replication: bool = True, workers: bool = False) -> Topology:
    world = draw(st.integers(1, max_world))
    k = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0])) if replication else 1
    return Topology(world_size=world, rank=0, batch_size=draw(st.integers(1, 3)), replication=k,
                    num_workers=draw(st.integers(0, 2)) if workers else 0)


world_sizes = st.integers(min_value=1, max_value=4)
worker_counts = st.integers(min_value=0, max_value=3)
positions = st.integers(min_value=0, max_value=40)
seeds = st.integers(min_value=0, max_value=2**32)
