"""Provenance: what the kit needs to grade a loader that knows nothing of loadspec's sample numbering.

Why: a peer (HF datasets, torchdata, MosaicML, LitData, yours) shuffles and
shards in its own way, so its stream cannot be compared with the reference's
order. What *can* be checked on any loader is provenance: every input token
is ``(document, offset)`` of the corpus, every label is the next token of the
same document or -100, and every within-document pair ``(d, p) -> (d, p + 1)``
is trained at most once per epoch. This module has both halves:

* for adapter authors: :func:`pack_corpus` chunks the corpus into rows with
  provenance columns by a declared packing mode (so a loader that does not
  pack can still claim ``packing:concat``), and :class:`ProvenanceCodec`
  encodes each token as its global position, for loaders that only carry
  token ids (token-block loaders);
* for the tests: :func:`check_provenance`, :func:`pair_counts`,
  :func:`promised_pairs`, and the exact loss account of an epoch,
  :func:`expected_coverage` and :func:`check_epoch_coverage`.

Worked example (a two-document corpus, concat, L = 2)::

    >>> from reference.packing import PackingConfig
    >>> rows = pack_corpus([[[5, 6, 7], [8, 9]]], PackingConfig(seq_len=2))
    >>> [(r["input_ids"], r["labels"], r["doc_ids"], r["token_offsets"]) for r in rows]
    [([5, 6], [6, 7], [0, 0], [0, 1]), ([7, 8], [-100, 9], [0, 1], [2, 0])]
    >>> codec = ProvenanceCodec([[[5, 6, 7], [8, 9]]])
    >>> codec.encoded_corpus()
    [[[1, 2, 3], [4, 5]]]
    >>> codec.row([3, 4, 5], epoch=0, index=7).labels     # a block crossing documents trains 7 -> 8
    (8, 9)
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.adapter import CanonicalRow
from conformance.assertions import ClauseViolation
from reference.ordering import OrderingConfig
from reference.packing import BIN_MODES, IGNORE, NO_DOC, PackingConfig, is_kept, pack, prepare, trained_pairs
from reference.partition import steps_in_epoch, trained_end
from reference.resume import Corpus, PipelineConfig, Topology, epoch_samples

ROW_COLUMNS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")


def documents(corpus: Corpus) -> list[list[int]]:
    """The corpus's documents numbered file by file, as every ``doc_ids`` column counts them (ORD-1)."""
    return [list(doc) for file in corpus for doc in file]


def pack_corpus(corpus: Corpus, packing: PackingConfig) -> list[dict[str, list[int]]]:
    """The corpus packed in store order by ``packing``: one dict of provenance columns per sample.

    Why: a loader that does not pack stores these rows (any columns it can
    carry), shuffles and shards them, and hands them back; the adapter turns
    each back into a ``CanonicalRow``. Packing before the shuffle keeps every
    promise of the mode (PACK-7, PACK-18), only the row order differs.
    """
    config = PipelineConfig(packing=packing, ordering=OrderingConfig(kind="sequential"))
    return [{c: list(getattr(s, c)) for c in ROW_COLUMNS} for s in epoch_samples(corpus, config, 0)]


def row_from_columns(columns: Mapping[str, Sequence[int]], *, epoch: int, index: int) -> CanonicalRow:
    """One row of :func:`pack_corpus` (after a trip through a peer) as a ``CanonicalRow``."""
    return CanonicalRow(epoch, index, *(tuple(int(v) for v in columns[c]) for c in ROW_COLUMNS))


class ProvenanceCodec:
    """Token ids that *are* provenance: token ``k + 1`` is the corpus's k-th token (0 stays free for padding).

    Why: token-block loaders (LitData's ``TokensLoader``) keep no columns and
    no document boundaries; feeding them the encoded corpus lets the adapter
    recover, for every token they yield, the document and offset it came from,
    and so grade what they train.
    """

    def __init__(self, corpus: Corpus) -> None:
        self.docs = documents(corpus)
        self.starts: list[int] = []
        total = 0
        for doc in self.docs:
            self.starts.append(total)
            total += len(doc)
        self.total = total
        self.corpus = corpus

    def encoded_corpus(self) -> list[list[list[int]]]:
        out, d = [], 0
        for file in self.corpus:
            out.append([[self.starts[d + i] + j + 1 for j in range(len(doc))] for i, doc in enumerate(file)])
            d += len(file)
        return out

    def decode(self, code: int) -> tuple[int, int]:
        """``(doc, offset)`` of an encoded token, or ``(-1, -1)`` for padding."""
        if not 1 <= code <= self.total:
            return NO_DOC, -1
        doc = bisect.bisect_right(self.starts, code - 1) - 1
        while len(self.docs[doc]) == 0:
            doc -= 1
        return doc, code - 1 - self.starts[doc]

    def row(self, block: Sequence[int], *, epoch: int, index: int) -> CanonicalRow:
        """A block of L + 1 encoded tokens as a row: inputs ``block[:-1]``, targets ``block[1:]``.

        Every target is reported as the token the loader trains on, also when it
        belongs to another document: then the kit flags it (PACK-4).
        """
        where = [self.decode(int(c)) for c in block]
        inputs, labels, positions, docs, offsets = [], [], [], [], []
        for j, (d, p) in enumerate(where[:-1]):
            nd, npos = where[j + 1]
            inputs.append(self.docs[d][p] if d >= 0 else 0)
            labels.append(IGNORE if d < 0 or nd < 0 else self.docs[nd][npos])
            positions.append(0 if j == 0 or where[j - 1][0] != d else positions[-1] + 1)
            docs.append(d)
            offsets.append(p)
        return CanonicalRow(epoch, index, tuple(inputs), tuple(labels), tuple(positions), tuple(docs), tuple(offsets))


# --------------------------------------------------------------------------- audits for the tests


def check_provenance(rows: Iterable[CanonicalRow], corpus: Corpus, packing: PackingConfig, *, clause: str = "PACK-4",
                     repro: Mapping[str, Any] | None = None) -> None:
    """Every input is the prepared token its ``(doc_id, offset)`` names; every label is the next one or -100."""
    __tracebackhide__ = True
    prepared = [prepare(doc, packing) for doc in documents(corpus)]
    for row in rows:
        for j, (d, p) in enumerate(zip(row.doc_ids, row.token_offsets)):
            label = row.labels[j]
            if d < 0 or p < 0:
                if label != IGNORE:
                    raise ClauseViolation(clause, f"position {j} holds no document token but has label {label}",
                                          dict(repro or {}, row=row))
                continue
            if d >= len(prepared) or p >= len(prepared[d]) or row.input_ids[j] != prepared[d][p]:
                raise ClauseViolation(clause, f"input {row.input_ids[j]} at position {j} is not token {p} of "
                                              f"document {d}", dict(repro or {}, row=row))
            if label != IGNORE and (p + 1 >= len(prepared[d]) or label != prepared[d][p + 1]):
                raise ClauseViolation(clause, f"label {label} at position {j} is not the next token of document {d} "
                                              f"after offset {p}, nor -100", dict(repro or {}, row=row))


def pair_counts(rows: Iterable[CanonicalRow], *, epoch: int | None = None) -> Counter[tuple[int, int]]:
    """How often each within-document pair ``(doc, offset) -> (doc, offset + 1)`` was trained (in ``epoch``)."""
    return Counter((d, p) for row in rows if epoch is None or row.epoch == epoch
                   for d, p, label in zip(row.doc_ids, row.token_offsets, row.labels) if label != IGNORE and d >= 0)


def promised_pairs(corpus: Corpus, packing: PackingConfig) -> tuple[set[tuple[int, int]], int] | None:
    """The pairs a packing mode promises to train in every epoch, and how many a shuffled tail may lose.

    ``concat`` trains every within-document pair of the kept documents but the
    stream's tail, fewer than L + 1 pairs (PACK-7); the bin modes and ``none``
    train a set of pairs that depends on each document alone (PACK-10, -12,
    -18), whatever the order; ``chunk`` loses pairs where its windows fall,
    which depends on the order, so it promises no set (None).
    """
    docs = documents(corpus)
    if packing.mode == "concat":
        pairs = {(d, p) for d, doc in enumerate(docs) if is_kept(len(prepare(doc, packing)), packing)
                 for p in range(len(prepare(doc, packing)) - 1)}
        return pairs, packing.seq_len
    if packing.mode in BIN_MODES or packing.mode == "none":
        return set(trained_pairs(pack(list(enumerate(docs)), packing))), 0
    return None


# --------------------------------------------------------------------------- the exact loss account of an epoch


@dataclass(frozen=True, slots=True)
class EpochCoverage:
    """What one epoch must train, from the corpus, the packing and the declared end policy alone (PART-4..PART-7).

    ``samples`` (S) is how many samples the corpus packs into, ``kept`` (S')
    how many of them the end policy trains on this topology (the rest, only
    the stream's last ``S - S'``, it may drop), ``steps`` how many steps each
    rank runs and ``last_step`` how many real samples (padding excluded) the
    last of them holds. ``streams`` is how many token streams are packed
    independently (each loses its own tail of fewer than L + 1 tokens, PACK-7):
    1 for the kit's end policies. ``clause`` names the loader's own end rule
    when the account is one an adapter declares (``epoch_coverage``, e.g.
    STREAM-12's equal-step truncation over lanes), empty for the kit's
    ``end:*`` policies (PART-4 .. PART-6).

    >>> from reference.packing import PackingConfig
    >>> config = PipelineConfig(packing=PackingConfig(seq_len=4))        # concat: (21 - 1) // 4 = 5 samples
    >>> expected_coverage([[list(range(1, 22))]], config, Topology(world_size=2, batch_size=2))
    EpochCoverage(samples=5, kept=4, steps=1, last_step=4, global_batch=4, streams=1, clause='')
    """

    samples: int
    kept: int
    steps: int
    last_step: int
    global_batch: int
    streams: int = 1
    clause: str = ""


def expected_coverage(corpus: Corpus, config: PipelineConfig, topology: Topology, *,
                      order_known: bool = False) -> EpochCoverage | None:
    """The :class:`EpochCoverage` of epoch 0 on ``topology``; None when the loader's order decides the count.

    Why not the loader's own run: a loader that loses a sample loses it on
    one rank too, so comparing it with itself hides the loss. How many
    samples the corpus packs into is fixed by the packing alone for
    ``concat``, ``chunk`` and ``none`` (PACK-6, PACK-8, PACK-19) and for the
    bin modes under the store order; the bin modes under a shuffled order
    pack the documents in the loader's order, known only when it is the
    reference's (``order_known``, i.e. ``bit_exact``).
    """
    if config.packing.mode in BIN_MODES and config.ordering.kind != "sequential" and not order_known:
        return None
    total = len(epoch_samples(corpus, config, 0))
    partition = topology.partition(config.end)
    kept, steps = trained_end(0, total, partition), steps_in_epoch(total, partition)
    g = partition.global_batch_size
    return EpochCoverage(total, kept, steps, kept - (steps - 1) * g if steps else 0, g)


def declared_coverage(adapter: Any, corpus: Corpus, config: PipelineConfig, topology: Topology,
                      state: Any = None) -> EpochCoverage | None:
    """The account of epoch 0 (or of the rest of ``state``'s epoch) the adapter declares for its own end rule, else None.

    Why a declaration: a loader whose end rule is none of the kit's
    ``end:*`` policies (a streaming loader's equal-step truncation over
    lanes, STREAM-12, may leave several global batches untrained when lanes
    hold unequal shares) cannot be graded by :func:`expected_coverage`. Its
    adapter computes the exact account from the loader's specification (never
    from the loader's run, which would hide a loss) and names the clause;
    the kit then checks the run against it as exactly as against its own.
    With ``state`` (one the loader saved, resumed on ``topology``) the
    account covers the rest of that state's epoch: ``samples`` left,
    ``kept`` of them trained.
    """
    hook = getattr(adapter, "epoch_coverage", None)
    if hook is None:
        return None
    coverage = hook(corpus, config, topology) if state is None else hook(corpus, config, topology, state=state)
    if coverage is not None and not (isinstance(coverage, EpochCoverage) and coverage.clause
                                     and 0 <= coverage.kept <= coverage.samples and coverage.streams >= 1):
        raise TypeError(f"{type(adapter).__name__}.epoch_coverage returned {coverage!r}: expected None or an "
                        "EpochCoverage with 0 <= kept <= samples, streams >= 1 and the clause of its end rule")
    return coverage


def _runs(values: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` as ``'1..3, 7'``."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def describe_pairs(pairs: Iterable[tuple[int, int]], most: int = 6) -> str:
    """Pairs ``(doc, offset)`` grouped by document: ``'doc 3 offsets 56..59; doc 5 offset 0'``."""
    by_doc: dict[int, list[int]] = {}
    for d, p in pairs:
        by_doc.setdefault(d, []).append(p)
    parts = [f"doc {d} offset{'s' if len(ps) > 1 else ''} {_runs(ps)}" for d, ps in sorted(by_doc.items())]
    return "; ".join(parts[:most]) + (f"; ... ({len(parts)} documents)" if len(parts) > most else "")


def sample_key(row: Any) -> tuple[tuple[int, int], ...]:
    """A sample's identity: the ``(doc, offset)`` of each input position (distinct samples of an epoch differ)."""
    return tuple(zip(row.doc_ids, row.token_offsets))


def _is_padding(row: Any) -> bool:
    return all(d < 0 for d in row.doc_ids)


def check_epoch_coverage(per_rank: Sequence[Sequence[Sequence[CanonicalRow]]], corpus: Corpus, config: PipelineConfig,
                         topology: Topology, coverage: EpochCoverage, *, bit_exact: bool = False,
                         repro: Mapping[str, Any] | None = None) -> None:
    """Fail unless the epoch trained every sample the end policy keeps, naming the lost samples and their pairs.

    ``per_rank`` is every rank's batches of one uninterrupted epoch 0. The
    account is exact: ``coverage.kept`` distinct real samples (padding
    excluded) over the data-parallel groups, so one sample lost, or a whole
    global batch held back, fails. The message says which samples were lost
    (their sample indices for a ``bit_exact`` loader, else their place in the
    packed stream's store order when the loader packs in store order) and
    which pairs were never trained, and, when every rank ran one step short
    and the loss is that step's samples, that they are the epoch's last
    global batch. Training more than the kit's own account keeps is not
    loss, and is not checked here; training more than an account the
    adapter declares (``epoch_coverage``, naming its clause) fails: the
    declaration is the exact account the loss check is held to, and one
    that undercounts would let that many lost samples pass.
    """
    __tracebackhide__ = True
    leaders = per_rank[:: topology.replication]
    rows = [row for batches in leaders for batch in batches for row in batch if not _is_padding(row)]
    trained = {sample_key(row) for row in rows}
    if coverage.clause and len(trained) > coverage.kept:   # a declaration that undercounts loosens the account
        raise ClauseViolation(coverage.clause, (
            f"epoch 0 trained {_count(len(trained), 'distinct sample')}, but the adapter declares (epoch_coverage) that "
            f"the loader's end rule ({coverage.clause}) on {_count(topology.world_size, 'rank')} x batch size "
            f"{topology.batch_size} trains exactly {coverage.kept} of the {coverage.samples} the corpus packs into: "
            f"the declared account is not the loader's ({len(trained) - coverage.kept} more trained than declared), "
            f"so a loss of that many samples would pass unseen"), repro)
    if len(trained) >= coverage.kept:
        return
    p, part = config.packing, topology.partition(config.end)
    clause = coverage.clause or {"drop_last": "PART-4", "pad": "PART-5", "even": "PART-6"}[config.end]
    s, kept, g, steps = coverage.samples, coverage.kept, coverage.global_batch, coverage.steps
    lost = kept - len(trained)
    if coverage.clause:
        drops = f"may drop only the {_count(s - kept, 'sample')} its end rule drops ({clause})"
    elif s == kept:
        drops = "may drop none of them" + (" (PART-5)" if config.end == "pad" else f" ({s} is a multiple of G)")
    else:
        bound = f"G = {g}" if config.end == "drop_last" else f"D = {part.data_parallel_size}"
        drops = f"may drop only the stream's last {_count(s - kept, 'sample')} (fewer than {bound}, {clause})"
    packed = f"{p.mode!r}, seq_len {p.seq_len}" + (f", {coverage.streams} streams" if coverage.streams > 1 else "")
    end = f"the loader's end rule ({clause})" if coverage.clause else f"end={config.end!r}"
    what = (f"epoch 0 trained {_count(len(trained), 'distinct sample')}, but the corpus packs into {s} ({packed}) "
            f"and {end} on {_count(topology.world_size, 'rank')} x batch size "
            f"{topology.batch_size} (G = {_count(g, 'sample')} a step) trains {kept} of them and {drops}: "
            f"{_count(lost, 'sample')} lost")
    ran = sorted({len(b) for b in per_rank})
    if ran == [steps - 1] and lost == coverage.last_step:
        which = f"sample {kept - 1}" if lost == 1 else f"samples {kept - lost}..{kept - 1}"
        what += (f"; every rank ran {_count(steps - 1, 'step')} where {steps} were due: the lost "
                 f"{'sample is' if lost == 1 else 'samples are'} the epoch's last global batch (step {steps} of {steps}, {which} of its stream), never served")
    else:
        what += f"; ranks ran {', '.join(map(str, ran))} steps, {steps} were due"
    if bit_exact:
        missing = sorted(set(range(kept)) - {row.sample_index for row in rows})
        what += f"; sample indices never trained: {_runs(missing)}"
    elif config.split is None:
        store = [sample_key(row_from_columns(c, epoch=0, index=i)) for i, c in enumerate(pack_corpus(corpus, p))]
        if trained <= set(store):
            untrained = [i for i, key in enumerate(store) if key not in trained]
            shown = "; ".join(f"{i} = {describe_pairs((d, o) for d, o in store[i] if d >= 0)}" for i in untrained[:4])
            what += (f"; never trained, by place in the packed stream's store order (0..{len(store) - 1}): {shown}"
                     + (f"; ... ({_runs(untrained)})" if len(untrained) > 4 else "")
                     + (" (the stream's last window among them)" if len(store) - 1 in untrained else ""))
    promise = promised_pairs(corpus, p)
    if promise is not None:
        never = promise[0] - set(pair_counts(rows))
        what += f"; pairs never trained ({len(never)}): {describe_pairs(never)}"
    raise ClauseViolation(clause, what, repro)
