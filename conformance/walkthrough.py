"""A walk through the reference semantics on the shipped fixtures (``python -m conformance.walkthrough``).

Why: the clauses of docs/SEMANTICS.md are easier to trust once seen on real
text. This tokenizes King James Bible chapters with the committed GPT-2
tokenizer, packs them, shows samples with their document boundaries and masked
labels, checkpoints two ranks mid-epoch, resumes on three, and audits that
every sample of the epoch was trained exactly once.
"""

from __future__ import annotations

import json

from fixtures import generators
from reference.ordering import OrderingConfig
from reference.packing import IGNORE, PackingConfig
from reference.partition import trained_end
from reference.resume import PipelineConfig, ReferenceLoader, Topology, audit_coverage, global_steps

RULE = "─" * 78


def _show_sample(tokenizer, sample, *, width: int = 78) -> None:
    starts = set(sample.document_starts)
    pieces = []
    for j, tok in enumerate(sample.input_ids):
        if sample.doc_ids[j] < 0:
            pieces.append("·")
            continue
        if j in starts:
            pieces.append(f" ⟦doc {sample.doc_ids[j]} @{sample.token_offsets[j]}⟧ ")
        pieces.append(tokenizer.decode([tok]).replace("\n", " "))
    text = "".join(pieces)
    masked = sum(label == IGNORE for label in sample.labels)
    print(f"  segments at positions {list(sample.document_starts)}; {masked} of {len(sample.labels)} labels masked (-100)")
    print("  " + (text[: width * 3] + " …" if len(text) > width * 3 else text))


def main() -> None:
    tokenizer = generators.load_tokenizer()
    texts = generators.load_corpus(limit=48)
    docs = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
    corpus = [docs[i:i + 12] for i in range(0, len(docs), 12)]
    print(RULE)
    print(f"Corpus: {len(docs)} KJV chapters in {len(corpus)} files, {sum(map(len, docs))} GPT-2 tokens "
          f"(document lengths {min(map(len, docs))}..{max(map(len, docs))})")

    for mode in ("concat", "best_fit"):
        config = PipelineConfig(ordering=OrderingConfig(kind="window", seed=7, window=8),
                                packing=PackingConfig(seq_len=256, mode=mode, window=16, pad_id=tokenizer.pad_token_id))
        samples = ReferenceLoader(corpus, config).samples(0)
        used = sum(d >= 0 for s in samples for d in s.doc_ids)
        print(RULE)
        print(f"Packing {mode!r}, seq_len 256, window shuffle: {len(samples)} samples, "
              f"utilisation {used / (len(samples) * 256):.1%}")
        boundary = next(s for s in samples if len(s.document_starts) > 1)
        _show_sample(tokenizer, boundary)

    config = PipelineConfig(ordering=OrderingConfig(kind="global", seed=7),
                            packing=PackingConfig(seq_len=256, mode="concat"), end="drop_last")
    total = len(ReferenceLoader(corpus, config).samples(0))
    before, after = Topology(world_size=2, batch_size=4), Topology(world_size=3, batch_size=2)
    print(RULE)
    print(f"Elastic resume: {total} samples in epoch 0; 2 ranks × batch 4 for 5 steps, then 3 ranks × batch 2")
    first = ReferenceLoader(corpus, config, Topology(world_size=2, rank=0, batch_size=4))
    for _, _ in zip(range(5), first):
        pass
    state = first.state_dict()
    print("  checkpoint (JSON):", json.dumps(state))
    rows = global_steps(corpus, config, 0, [(before, 5), (after, -1)])
    end = trained_end(state["consumed"], total, after.partition(config.end))
    audit = audit_coverage((r.sample_index for batch in rows for r in batch), end)
    print(RULE)
    print("Coverage audit of epoch 0:")
    print(f"  samples trained {audit.trained}, covered range [0, {end}), dropped by drop_last {total - end}, "
          f"duplicates {audit.duplicates}, missing {audit.missing}")
    if not audit.exact:
        raise SystemExit("coverage audit FAILED")
    print(RULE)


if __name__ == "__main__":
    main()
