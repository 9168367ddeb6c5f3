"""impl's StreamingDataset as a loader under test: the kit's token corpus as jsonl text, tokenized on the fly.

Why text: the kit hands adapters pre-tokenized documents, and
``impl.streaming.StreamingDataset`` reads raw text through a tokenizer. So
each corpus file is written as a jsonl file (``{"text": "17 4 902"}`` per
document, in order) and tokenized by a word-level tokenizer whose vocabulary
is every id written in decimal (``"17"`` → 17) and whose EOS / BOS token is
the kit's ``EOS`` (50256): encoding gives back the corpus's ids exactly and
the row numbers are the corpus's document ids.

What maps and what does not: packing ``concat`` / ``chunk`` with
``add_bos`` / ``add_eos`` / ``min_len`` and the pad id; ordering
``sequential`` (no shuffle) and ``global`` (unit and row shuffle keyed by the
seed: a seeded shuffle, not the reference's ORD order, so no ``bit_exact``);
the end is STREAM-12's equal-step truncation (``end:drop_last``). Samples are
numbered per lane (STREAM-9); the canonical ``sample_index`` here is
``index * num_lanes + lane``, unique in the epoch. The lane count is fixed
(``NUM_LANES`` = 12, every world size the kit draws divides it); one that did not would be refused with
``TopologyError`` (a declared refusal). A file with no documents is left
out of the paths (the streaming dataset refuses an empty file; it would hold
no row, so nothing else changes).

What a real job does, in one process: with a process group every rank's
``state_dict()`` is the global state (its lanes gathered from every rank and
merged, STREAM-14), and every rank loads that. The ranks the in-process suite
builds for one topology form a group here, and a rank's ``state_dict()`` is
``merge_states`` of its group's states taken then, which is what the
all-gather returns; in the per-rank harness (``process_group = True``) the
dataset gathers through gloo itself. The kit is told so (``state:global``):
every rank's state is one consistent cut where each rank stands.

The end of an epoch is STREAM-12's equal-step truncation over lanes, which
may leave more than one global batch untrained when lanes hold unequal
shares; :meth:`StreamingAdapter.epoch_coverage` declares its exact account,
computed from ``reference.streaming`` (the specification, not the loader's
run): every lane's samples, and ``steps × world size × batch size`` of them
trained.

Select with ``pytest conformance/tests --loadspec-loader conformance.adapters.streaming:adapter``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from conformance.adapter import CanonicalRow, RowLoader
from conformance.adapters.impl import corpus_key
from conformance.provenance import EpochCoverage
from impl.errors import ConfigError, StateError
from reference.resume import Corpus, PipelineConfig, Topology

NUM_LANES = 12
VOCAB = 50_257
EOS = 50_256
ROW_FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")


@functools.cache
def decimal_tokenizer() -> Any:
    """A fast tokenizer that maps ``"17 4"`` to ``[17, 4]`` and names ``EOS`` its eos / bos token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(EOS)} | {"<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<eos>")


def jsonl_text(docs: Sequence[Sequence[int]]) -> str:
    """One corpus file as jsonl: ``{"text": "17 4 902"}`` per document, in order."""
    return "".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs)


def write_corpus(corpus: Corpus, workdir: Path) -> list[str]:
    """The corpus's files with documents as jsonl files ``workdir/stream/<hash>/f0000.jsonl`` ... (written once).

    A file with no document is left out: the streaming dataset refuses an
    empty file, and one with no row changes neither the units, their order
    nor any row's number (the document ids). The ranks of a per-rank job
    share ``workdir`` (``LOADSPEC_NODE_DIR``): one writes under a lock, so
    every rank indexes the same paths and modification times (STREAM-5).
    """
    import fcntl

    root = Path(workdir) / "stream" / corpus_key(corpus)
    names = [str(root / f"f{i:04d}.jsonl") for i, docs in enumerate(corpus) if docs]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            for i, docs in enumerate(corpus):
                if docs:
                    Path(root / f"f{i:04d}.jsonl").write_text(jsonl_text(docs))
            (root / "done").write_text("")
    return names


def streaming_config(config: PipelineConfig) -> Any:
    """The ``reference.streaming.StreamingConfig`` the adapter's ``StreamingDataset`` is built with."""
    from reference.packing import PackingConfig
    from reference.streaming import StreamingConfig

    p = config.packing
    packing = PackingConfig(seq_len=p.seq_len, mode=p.mode, add_bos=p.add_bos, add_eos=p.add_eos,
                            bos_id=EOS if p.add_bos else None, eos_id=EOS if p.add_eos else None, pad_id=p.pad_id,
                            min_len=p.min_len)
    return StreamingConfig(packing=packing, num_lanes=NUM_LANES, seed=config.ordering.seed,
                           shuffle=config.ordering.kind == "global")


class _Group:
    """The loaders of one topology's ranks built in this process: their states merged are the global state."""

    def __init__(self, world_size: int, build_rank: Any) -> None:
        self.world_size = world_size
        self.members: dict[int, Any] = {}
        self.build_rank = build_rank
        """``build_rank(r)``: a fresh ``StreamingLoader`` of rank r, for a rank the kit did not build."""


class GatheredLoader(RowLoader):
    """A rank's loader whose ``state_dict()`` is the global state, as a process group's all-gather makes it.

    Without a process group a ``StreamingDataset`` returns its own lanes; the
    ranks of a group here are all in this process, so the gather is reading
    each member's lanes and merging them (``impl.merge_states``, STREAM-14).
    Every rank returns the same state, as every rank of a real job does. A
    rank the kit did not build (a test that runs one rank of a topology) is
    run here as a job would run it: a fresh loader of that rank replays what
    this one did (each load, each pass's batches, each ``set_epoch``), which
    equal-step truncation (STREAM-12) keeps in lockstep.
    """

    def __init__(self, loader: Any, group: _Group) -> None:
        super().__init__(loader, rows_from_batch)
        self.group = group
        self.log: list[list[Any]] = []

    def __iter__(self) -> Any:
        entry: list[Any] = ["pass", 0, False]
        self.log.append(entry)
        for batch in self.loader:
            entry[1] += 1
            yield self.to_rows(batch)
        entry[2] = True

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self.log = [["load", state]]

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)
        self.log.append(["set_epoch", epoch])

    def _replayed(self, rank: int) -> dict[str, Any]:
        shadow = self.group.build_rank(rank)
        for event in self.log:
            if event[0] == "load":
                shadow.load_state_dict(event[1])
            elif event[0] == "set_epoch":
                shadow.set_epoch(event[1])
            else:
                it = iter(shadow)
                for _ in range(event[1]):
                    next(it)
                if event[2]:
                    list(it)
        return dict(shadow.state_dict())

    def state_dict(self) -> dict[str, Any]:
        import torch.distributed as dist

        from impl.streaming import merge_states

        if dist.is_available() and dist.is_initialized():     # the per-rank harness: the dataset gathers via gloo
            return dict(self.loader.state_dict())
        return merge_states([self.group.members[r].loader.state_dict() if r in self.group.members
                             else self._replayed(r) for r in range(self.group.world_size)])


def rows_from_batch(batch: Mapping[str, Any]) -> list[CanonicalRow]:
    epochs, lanes, indices = (batch[k].tolist() for k in ("epoch", "lane", "sample_index"))
    columns = [batch[name].tolist() for name in ROW_FIELDS]
    return [CanonicalRow(epochs[b], indices[b] * NUM_LANES + lanes[b], *(tuple(col[b]) for col in columns))
            for b in range(len(indices))]


class StreamingAdapter:
    name = "impl-streaming"
    capabilities = frozenset({"resume", "elastic", "packing:concat", "packing:chunk", "ordering:sequential",
                              "ordering:global", "shuffle:seeded", "end:drop_last", "state:global"})
    refusal_types = (StateError, ConfigError)
    limits: ClassVar[Mapping[str, int]] = {"max_world_size": 4}
    process_group = True
    """``StreamingDataset.state_dict()`` gathers every rank's lanes through ``torch.distributed`` (STREAM-14)."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Any, ...], _Group] | None = None

    def epoch_coverage(self, corpus: Corpus, config: PipelineConfig, topology: Topology,
                       state: Mapping[str, Any] | None = None) -> EpochCoverage | None:
        """The exact account under STREAM-12 of epoch 0, or of the rest of ``state``'s epoch, on ``topology`` (STREAM-22).

        From ``reference.streaming`` over the same jsonl bytes (the
        specification, not the loader's run): every lane's samples left
        (``lane_remaining``, from a fresh epoch or from the lanes of the
        global ``state``), the steps every rank takes (``epoch_steps``: the
        minimum over ranks of its full batches), and ``steps × W × B`` of the
        samples trained; each lane packs its own stream, so ``streams`` is
        the lane count. A state resumed on the topology it was taken on runs
        rank r for ``S - t_r`` steps (STREAM-22: a rank that was ahead takes
        fewer), so ``kept`` is their sum times B, and lanes already in the
        next epoch have no sample left in this one.
        """
        from reference.stream_steps import STEPS_VERSION, resume_steps
        from reference.streaming import StreamingReferenceLoader, epoch_steps, lane_remaining
        from reference.units import TextFile

        files = [TextFile(path=f"f{i:04d}.jsonl", data=jsonl_text(docs).encode(), format="jsonl")
                 for i, docs in enumerate(corpus) if docs]
        W, B = topology.world_size, topology.batch_size
        ref = StreamingReferenceLoader(files, streaming_config(config), lambda text: [int(w) for w in text.split()],
                                       tokenizer_id=str(state["tokenizer"]) if state else "decimal",
                                       world_size=W, num_workers=topology.num_workers, batch_size=B)
        if state is not None:   # impl's index names its files by path and mtime: the lanes are what it positions
            try:
                ref.load_state_dict(dict(state, index=ref.index.fingerprint))
            except StateError:  # lanes straddling two epochs on another topology: the loader refuses it too
                return None
        ahead = set() if ref._next is None else set(ref._next[0])     # lanes already in the next epoch (STREAM-22)
        remaining = {lane: 0 if lane in ahead else lane_remaining(ref._census, ref.epoch, lane, s)
                     for lane, s in ref.lanes.items()}
        steps = epoch_steps(remaining, NUM_LANES, W, topology.num_workers, B)
        left = [steps] * W
        if state is not None and state["version"] == STEPS_VERSION:    # same topology: rank r runs S - t_r (STREAM-22)
            for r in range(W):
                resumed = resume_steps(state, num_lanes=NUM_LANES, world_size=W, num_workers=topology.num_workers,
                                       batch_size=B, rank=r)
                if resumed.steps is not None:
                    left[r] = resumed.steps - resumed.taken
        return EpochCoverage(samples=sum(remaining.values()), kept=sum(left) * B, steps=max(left),
                             last_step=W * B if max(left) else 0, global_batch=W * B, streams=NUM_LANES,
                             clause="STREAM-22" if left != [steps] * W else "STREAM-12")

    def unsupported(self, corpus: Corpus, config: PipelineConfig, topology: Topology) -> str | None:
        from reference.streaming import valid_world_sizes

        if topology.world_size not in valid_world_sizes(NUM_LANES, topology.num_workers):
            return f"world_size={topology.world_size} with {topology.num_workers} workers does not divide {NUM_LANES} lanes"
        if not any(corpus):
            return "a corpus with no document has no file the streaming dataset accepts"
        p = config.packing
        if p.stride or p.overflow != "split" or p.bos_on_continuation:
            return "stride, overflow='truncate' and bos_on_continuation are PackedDataset options"
        return None

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> RowLoader:
        from impl.loader import build_dataloader
        from impl.streaming import StreamingDataset

        p, o = config.packing, config.ordering
        names = write_corpus(corpus, Path(os.environ.get("LOADSPEC_NODE_DIR") or workdir))

        def build_rank(rank: int) -> Any:
            ds = StreamingDataset(names, tokenizer=decimal_tokenizer(), seq_len=p.seq_len, packing=p.mode,
                                  num_lanes=NUM_LANES, seed=o.seed, shuffle=o.kind == "global", add_bos=p.add_bos,
                                  add_eos=p.add_eos, min_len=p.min_len, pad_id=p.pad_id, rank=rank,
                                  world_size=topology.world_size)
            return build_dataloader(ds, batch_size=topology.batch_size, rank=rank, world_size=topology.world_size,
                                    num_workers=topology.num_workers)

        group = self._group(corpus, config, topology, workdir, build_rank)
        group.members[topology.rank] = gathered = GatheredLoader(build_rank(topology.rank), group)
        return gathered

    def _group(self, corpus: Corpus, config: PipelineConfig, topology: Topology, workdir: Path,
               build_rank: Any) -> _Group:
        """The group rank ``topology.rank`` joins: the last one built, when of its topology and without that rank.

        The kit builds a topology's ranks one after the other (rank 0 first),
        so only the last group can still be joined; keeping no other holds no
        loader past its example.
        """
        key = (str(workdir), corpus_key(corpus), repr(config), topology.world_size, topology.batch_size,
               topology.num_workers)
        if self._last is None or self._last[0] != key or topology.rank in self._last[1].members:
            self._last = (key, _Group(topology.world_size, build_rank))
        return self._last[1]


def adapter() -> StreamingAdapter:
    return StreamingAdapter()
