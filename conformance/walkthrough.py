"""A walk through the reference semantics on the shipped fixtures (``python -m conformance.walkthrough``).

Why: the clauses of docs/SEMANTICS.md are easier to trust once seen on real
text. This tokenizes King James Bible chapters with the committed GPT-2
tokenizer, packs them, shows samples with their document boundaries and masked
labels, checkpoints two ranks mid-epoch, resumes on three, and audits that
every sample of the epoch was trained exactly once. Then it mixes two corpora
(KJV chapters and the opening of loadspec's reference modules), each cut into
a 90 % training split and a 10 % validation split, 70/30 at sample level, and
shows the mixed stream's per-source counts and token shares (MIX-13, SPLIT-8).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from impl.repo_fixtures import generators as fixture_generators
from reference.loader import MixtureReferenceLoader, ReferenceLoader, global_steps
from reference.mixing import MixConfig
from reference.ordering import OrderingConfig
from reference.packing import IGNORE, PackingConfig
from reference.partition import trained_end
from reference.resume import MixtureConfig, PipelineConfig, Topology, audit_coverage, epoch_samples

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
    generators = fixture_generators()
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

    readme = PipelineConfig(ordering=OrderingConfig(kind="global", seed=0),
                            packing=PackingConfig(seq_len=256, mode="best_fit", pad_id=tokenizer.pad_token_id))
    print(RULE)
    print("The README's training config (best_fit, global shuffle, seed 0; one pack window holds all 48 chapters):")
    for epoch in (0, 1):
        firsts = [sorted({d for d in s.doc_ids if d >= 0}) for s in ReferenceLoader(corpus, readme).samples(epoch)[:4]]
        print(f"  epoch {epoch}: first 4 samples hold chapters {firsts}")

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
    _mixture(tokenizer, corpus)
    print(RULE)


def _mixture(tokenizer, web) -> None:
    """Two corpora, each split 90/10, mixed 70/30 at sample level; resumed from 2 ranks onto 3 (MIX-13, SPLIT-8)."""
    reference = Path(__file__).resolve().parents[1] / "reference"
    code = [[tokenizer(p.read_text()[:6000], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
             for p in sorted(reference.glob("*.py")) if p.stat().st_size]]
    packing = PackingConfig(seq_len=256, mode="concat")
    train = tuple(PipelineConfig(packing=packing, ordering=OrderingConfig(kind="global", seed=s), split="train[:90%]")
                  for s in (1, 2))
    config = MixtureConfig(sources=train, mixing=MixConfig(weights=(0.7, 0.3), stopping="all_exhausted", seed=5))
    sizes = [len(epoch_samples(c, cfg, 0)) for c, cfg in zip((web, code), train)]
    validation = [len(epoch_samples(c, PipelineConfig(packing=packing, split="train[90%:]"), 0)) for c in (web, code)]
    loader = MixtureReferenceLoader([web, code], config, Topology(world_size=2, rank=0, batch_size=4))
    stream = loader.samples(0)
    sources = [loader.source_of(0, i) for i in range(len(stream))]
    first_out = min(max(i for i, s in enumerate(sources) if s == k) for k in (0, 1))
    share = Counter(sources[:first_out])
    print(RULE)
    print(f"Mixture: web (KJV, {sizes[0]} training samples) and code ({sizes[1]}), split 'train[:90%]' each "
          f"(validation 'train[90%:]': {validation[0]} and {validation[1]} samples), weights 0.7/0.3, all_exhausted")
    print(f"  mixed stream: {len(stream)} samples, first 24 sources {''.join('WC'[s] for s in sources[:24])}")
    print(f"  before a source ran out ({first_out} samples): web {share[0] / first_out:.1%}, code {share[1] / first_out:.1%}")
    for _, _ in zip(range(5), loader):
        pass
    state = loader.state_dict()
    ranks = [MixtureReferenceLoader([web, code], config, Topology(world_size=3, rank=r, batch_size=2)) for r in range(3)]
    first_rows = [r for k in range(2) for batch in list(MixtureReferenceLoader(
        [web, code], config, Topology(world_size=2, rank=k, batch_size=4)))[:5] for r in batch]
    for ld in ranks:
        ld.load_state_dict(state)
    rows = first_rows + [r for ld in ranks for batch in ld for r in batch]
    end = trained_end(state["consumed"], len(stream), Topology(world_size=3, batch_size=2).partition("drop_last"))
    audit = audit_coverage((r.sample_index for r in rows), end)
    per_source = Counter(r.source for r in rows)
    print(f"  2 ranks × 4 for 5 steps, checkpoint {json.dumps({k: state[k] for k in ('epoch', 'consumed')})}, "
          "then 3 ranks × 2 to the end")
    print(f"  trained per source: web {per_source[0]} of {sizes[0]}, code {per_source[1]} of {sizes[1]}; "
          f"duplicates {audit.duplicates}, missing {audit.missing}, dropped by drop_last {len(stream) - end}")
    if not audit.exact:
        raise SystemExit("mixture coverage audit FAILED")


if __name__ == "__main__":
    main()
