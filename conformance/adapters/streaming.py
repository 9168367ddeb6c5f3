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
``TopologyError`` (a declared refusal). A file with no documents is
refused by the streaming dataset as bad input (an empty file), so such
corpora are reported unsupported.

Known contract mismatches (graded as failures, not defects): a rank's
``state_dict()`` without a process group holds only its lanes and
``load_state_dict`` takes the global state (``merge_states``, STREAM-14),
while the kit's in-process resume tests restore each rank from its own
state; and equal-step truncation over lanes may leave more than one global
batch untrained when lanes hold unequal shares.

Select with ``pytest conformance/tests --loadspec-loader conformance.adapters.streaming:adapter``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from conformance.adapter import CanonicalRow, RowLoader
from conformance.adapters.impl import corpus_key
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


def write_corpus(corpus: Corpus, workdir: Path) -> list[str]:
    """The corpus as jsonl files ``workdir/stream/<hash>/f0000.jsonl`` ... (written once)."""
    root = Path(workdir) / "stream" / corpus_key(corpus)
    names = [str(root / f"f{i:04d}.jsonl") for i in range(len(corpus))]
    if not (root / "done").exists():
        root.mkdir(parents=True, exist_ok=True)
        for name, docs in zip(names, corpus):
            Path(name).write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in docs))
        (root / "done").write_text("")
    return names


def rows_from_batch(batch: Mapping[str, Any]) -> list[CanonicalRow]:
    epochs, lanes, indices = (batch[k].tolist() for k in ("epoch", "lane", "sample_index"))
    columns = [batch[name].tolist() for name in ROW_FIELDS]
    return [CanonicalRow(epochs[b], indices[b] * NUM_LANES + lanes[b], *(tuple(col[b]) for col in columns))
            for b in range(len(indices))]


class StreamingAdapter:
    name = "impl-streaming"
    capabilities = frozenset({"resume", "elastic", "packing:concat", "packing:chunk", "ordering:sequential",
                              "ordering:global", "shuffle:seeded", "end:drop_last"})
    refusal_types = (StateError, ConfigError)
    limits: ClassVar[Mapping[str, int]] = {"max_world_size": 4}

    def unsupported(self, corpus: Corpus, config: PipelineConfig, topology: Topology) -> str | None:
        from reference.streaming import valid_world_sizes

        if topology.world_size not in valid_world_sizes(NUM_LANES, topology.num_workers):
            return f"world_size={topology.world_size} with {topology.num_workers} workers does not divide {NUM_LANES} lanes"
        if any(len(f) == 0 for f in corpus):
            return "a file with no documents is refused as an empty file (bad input for a streaming source)"
        p = config.packing
        if p.stride or p.overflow != "split" or p.bos_on_continuation:
            return "stride, overflow='truncate' and bos_on_continuation are PackedDataset options"
        return None

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> RowLoader:
        from impl.loader import build_dataloader
        from impl.streaming import StreamingDataset

        p, o = config.packing, config.ordering
        ds = StreamingDataset(write_corpus(corpus, workdir), tokenizer=decimal_tokenizer(), seq_len=p.seq_len,
                              packing=p.mode, num_lanes=NUM_LANES, seed=o.seed, shuffle=o.kind == "global",
                              add_bos=p.add_bos, add_eos=p.add_eos, min_len=p.min_len, pad_id=p.pad_id,
                              rank=topology.rank, world_size=topology.world_size)
        loader = build_dataloader(ds, batch_size=topology.batch_size, rank=topology.rank,
                                  world_size=topology.world_size, num_workers=topology.num_workers)
        return RowLoader(loader, rows_from_batch)


def adapter() -> StreamingAdapter:
    return StreamingAdapter()
