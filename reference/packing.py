"""Packing: how an epoch's documents become fixed-length training samples (PACK-*).

Why a specification: packing decides which next-token pairs a model is trained
on. Loaders that "all pack" differ in which pairs they mask at document and
sample boundaries, which tokens they silently drop, and where position ids
restart; those differences change training and are invisible in a loss curve.
Here every rule is a clause, and every sample carries its provenance
(``doc_ids`` and ``token_offsets``: each input token is a ``(document id,
offset)``), so every claim about coverage and masking is checkable by counting.

Packing is *plan, then fill*. ``pack_plan`` computes from document lengths
alone which pieces ``(document position, start, stop)`` each sample holds;
``fill`` reads the tokens. The plan is the single source of truth (PACK-20):
a loader can count and locate samples without reading data, and a vectorised
implementation reproduces the plan with integer arithmetic only. The order of
the documents is decided upstream (ORD-*); packing's one use of randomness is
the order in which a bin mode emits each window's bins under a shuffled order
(PACK-22), keyed by the caller, since a packer such as best-fit decreasing
creates its bins longest first and would otherwise undo the shuffle.

Modes: ``concat`` and ``chunk`` cut one concatenated token stream (PACK-6 ..
PACK-9); ``greedy``, ``first_fit`` and ``best_fit`` pack whole documents, cut
into chunks no longer than a sample, into bins (PACK-10 .. PACK-18; the three bin
rules themselves are ``reference.bins``); ``none``
gives every chunk its own sample (PACK-19).

Worked example (L = 4; documents A = [1, 2, 3], B = [4, .., 9], C = [10])::

    >>> docs = [(7, [1, 2, 3]), (8, [4, 5, 6, 7, 8, 9]), (9, [10])]
    >>> def inputs(mode):
    ...     return [s.input_ids for s in pack(docs, PackingConfig(seq_len=4, mode=mode))]
    >>> inputs("concat")        # token 10 is dropped: the stream's tail
    [(1, 2, 3, 4), (5, 6, 7, 8)]
    >>> inputs("chunk")         # windows of 5: 5 and 10 are targets only
    [(1, 2, 3, 4), (6, 7, 8, 9)]
    >>> inputs("greedy")        # B is cut into [4, 5, 6, 7] and [8, 9]
    [(1, 2, 3, 0), (4, 5, 6, 7), (8, 9, 10, 0)]
    >>> inputs("first_fit")     # C goes back to the first bin, which has room
    [(1, 2, 3, 10), (4, 5, 6, 7), (8, 9, 0, 0)]
    >>> inputs("best_fit")      # longest chunk first
    [(4, 5, 6, 7), (1, 2, 3, 10), (8, 9, 0, 0)]
    >>> inputs("none")
    [(1, 2, 3, 0), (4, 5, 6, 7), (8, 9, 0, 0), (10, 0, 0, 0)]
    >>> pack(docs, PackingConfig(seq_len=4))[0].labels     # 3 -> 4 crosses from A to B
    (2, 3, -100, 5)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from reference.bins import PACKERS
from reference.errors import ConfigError, is_int, require
from reference.rng import FeistelPermutation, Stream, derive_key, subkey

IGNORE = -100
NO_DOC = -1
NO_OFFSET = -1

Mode = Literal["concat", "chunk", "greedy", "first_fit", "best_fit", "none"]
Overflow = Literal["split", "truncate"]

MODES = ("concat", "chunk", "greedy", "first_fit", "best_fit", "none")
STREAM_MODES = ("concat", "chunk")
BIN_MODES = ("greedy", "first_fit", "best_fit")
OVERFLOWS = ("split", "truncate")

Document = tuple[int, Sequence[int]]
"""A document as packing receives it: (global document id, token ids)."""


def _require_int(name: str, value: object, minimum: int | None, fix: str) -> None:
    bound = "" if minimum is None else f" >= {minimum}"
    require(isinstance(value, int) and is_int(value) and (minimum is None or value >= minimum), ConfigError,
            f"{name}={value!r} must be an integer{bound}; {fix}")


def _require_bool(name: str, value: object) -> None:
    require(isinstance(value, bool), ConfigError, f"{name}={value!r} must be True or False")


@dataclass(frozen=True, kw_only=True, slots=True)
class PackingConfig:
    """How documents become samples of ``seq_len`` input positions (PACK-21).

    ``window`` matters to the bin modes only; ``overflow``, ``stride`` and
    ``bos_on_continuation`` matter to the bin modes and ``none`` only (in
    ``concat`` and ``chunk`` documents simply run across samples). They are
    still validated in every mode, so a config is valid or not on its own.

    >>> PackingConfig(seq_len=4, stride=4)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: stride=4 must be < 4 (seq_len) so that every continuation chunk adds a new token; lower stride or raise seq_len
    >>> PackingConfig(seq_len=4, add_eos=True)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: add_eos=True needs eos_id; pass eos_id=<token id> or set add_eos=False
    """

    seq_len: int
    mode: Mode = "concat"
    window: int = 1000
    overflow: Overflow = "split"
    stride: int = 0
    bos_on_continuation: bool = False
    add_bos: bool = False
    add_eos: bool = False
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    min_len: int = 0

    def __post_init__(self) -> None:
        _require_int("seq_len", self.seq_len, 1, "pass the number of input positions per sample")
        require(self.mode in MODES, ConfigError, f"mode={self.mode!r} is not a packing mode; choose one of {MODES}")
        _require_int("window", self.window, 1, "pass how many documents one bin-packing window holds")
        require(self.overflow in OVERFLOWS, ConfigError,
                f"overflow={self.overflow!r} is not an overflow policy; choose one of {OVERFLOWS}")
        for name in ("bos_on_continuation", "add_bos", "add_eos"):
            _require_bool(name, getattr(self, name))
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            require(value is None or is_int(value), ConfigError, f"{name}={value!r} must be a token id (an integer) or None")
        _require_int("pad_id", self.pad_id, None, "pass the token id that fills padding positions")
        _require_int("min_len", self.min_len, 0, "pass 0 to keep every non-empty document")
        require(not self.add_bos or self.bos_id is not None, ConfigError,
                "add_bos=True needs bos_id; pass bos_id=<token id> or set add_bos=False")
        require(not self.add_eos or self.eos_id is not None, ConfigError,
                "add_eos=True needs eos_id; pass eos_id=<token id> or set add_eos=False")
        require(not self.bos_on_continuation or self.bos_id is not None, ConfigError,
                "bos_on_continuation=True needs bos_id; pass bos_id=<token id> or set bos_on_continuation=False")
        require(not self.bos_on_continuation or self.seq_len >= 2, ConfigError,
                f"bos_on_continuation=True needs seq_len >= 2 (a continuation holds its BOS and at least one token), "
                f"but seq_len={self.seq_len}; raise seq_len or set bos_on_continuation=False")
        _require_int("stride", self.stride, 0, "pass how many tokens a continuation chunk re-reads (0 for none)")
        room = self.continuation_room
        require(self.stride < room, ConfigError,
                f"stride={self.stride} must be < {room} (seq_len{' - 1 for bos_on_continuation' if self.bos_on_continuation else ''}) "
                f"so that every continuation chunk adds a new token; lower stride or raise seq_len")

    @property
    def continuation_room(self) -> int:
        """Document tokens a continuation chunk holds: L, less one for an inserted BOS (PACK-10)."""
        return self.seq_len - (1 if self.bos_on_continuation else 0)

    @property
    def splits(self) -> bool:
        """Whether long documents are cut into continuation chunks (bin modes and none, overflow split)."""
        return self.mode not in STREAM_MODES and self.overflow == "split"


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sample of exactly ``seq_len`` positions, with provenance (PACK-3).

    ``doc_ids[j]`` and ``token_offsets[j]`` say which token of which prepared
    document sits at input ``j`` (``-1`` at padding; the offset is ``-1`` at an
    inserted continuation BOS); ``document_starts`` lists where segments begin.
    """

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    position_ids: tuple[int, ...]
    doc_ids: tuple[int, ...]
    token_offsets: tuple[int, ...]
    document_starts: tuple[int, ...]


class Piece(NamedTuple):
    """Prepared tokens ``[start, stop)`` of the document at position ``doc`` of the input sequence.

    A piece enters its sample as one segment (PACK-5). In the bin modes and
    ``none`` a piece with ``start > 0`` is a continuation chunk, preceded by
    ``bos_id`` when ``bos_on_continuation`` (PACK-10).
    """

    doc: int
    start: int
    stop: int


Plan = list[tuple[Piece, ...]]


# ------------------------------------------------------------------ documents


def prepare(tokens: Sequence[int], config: PackingConfig) -> tuple[int, ...]:
    """The prepared document: ``[bos_id]`` if add_bos, the tokens, ``[eos_id]`` if add_eos (PACK-1).

    Why a named step: every offset, length and chunk boundary counts positions
    of the prepared document, so BOS and EOS are ordinary tokens from here on.

    >>> prepare([5, 6], PackingConfig(seq_len=4, add_bos=True, bos_id=1, add_eos=True, eos_id=2))
    (1, 5, 6, 2)
    """
    bos = (config.bos_id,) if config.add_bos and config.bos_id is not None else ()
    eos = (config.eos_id,) if config.add_eos and config.eos_id is not None else ()
    return bos + tuple(tokens) + eos


def prepared_length(length: int, config: PackingConfig) -> int:
    """The length of a prepared document from the raw token count alone (PACK-1).

    >>> prepared_length(2, PackingConfig(seq_len=4, add_eos=True, eos_id=2))
    3
    """
    return length + int(config.add_bos) + int(config.add_eos)


def is_kept(length: int, config: PackingConfig) -> bool:
    """Whether a prepared document of ``length`` tokens is packed at all (PACK-2).

    Why: an empty document has no token to place, and ``min_len`` drops
    documents too short to teach anything; both are decided before any mode
    looks at the documents, so dropped documents never occupy a window slot.

    >>> [is_kept(m, PackingConfig(seq_len=4, min_len=3)) for m in (0, 2, 3, 5)]
    [False, False, True, True]
    >>> is_kept(0, PackingConfig(seq_len=4))
    False
    """
    return length > 0 and length >= config.min_len


def chunk_spans(length: int, config: PackingConfig) -> list[tuple[int, int]]:
    """The chunks ``[a_c, b_c)`` of a prepared document of ``length`` tokens (PACK-10, PACK-11).

    Why chunks: a bin holds at most L positions, so a longer document must be
    cut (``split``) or cut short (``truncate``). With ``split``, chunk 0 is
    ``[0, L)`` and each continuation starts ``stride`` tokens before the
    previous chunk's end (re-read context) and holds up to
    ``L - bos_on_continuation`` document tokens, until the document ends.
    Only the bin modes and ``none`` use chunks.

    >>> chunk_spans(10, PackingConfig(seq_len=4, mode="none"))
    [(0, 4), (4, 8), (8, 10)]
    >>> chunk_spans(10, PackingConfig(seq_len=4, mode="none", stride=1))
    [(0, 4), (3, 7), (6, 10)]
    >>> chunk_spans(10, PackingConfig(seq_len=4, mode="none", bos_on_continuation=True, bos_id=1))
    [(0, 4), (4, 7), (7, 10)]
    >>> chunk_spans(10, PackingConfig(seq_len=4, mode="none", overflow="truncate"))
    [(0, 4)]
    >>> chunk_spans(3, PackingConfig(seq_len=4, mode="none"))
    [(0, 3)]
    """
    L = config.seq_len
    if length <= L:
        return [(0, length)]
    if config.overflow == "truncate":
        return [(0, L)]
    spans = [(0, L)]
    while spans[-1][1] < length:
        start = spans[-1][1] - config.stride
        spans.append((start, min(length, start + config.continuation_room)))
    return spans


def chunk_count(length: int, config: PackingConfig) -> int:
    """How many chunks ``chunk_spans`` cuts, in closed form (PACK-10).

    Each continuation adds ``L - bos_on_continuation - stride`` new tokens, so
    a document of m > L tokens has ``1 + ceil((m - L) / step)`` chunks.

    >>> chunk_count(10, PackingConfig(seq_len=4, mode="none", stride=1))
    3
    """
    if length <= config.seq_len or not config.splits:
        return 1
    step = config.continuation_room - config.stride
    return 1 + (length - config.seq_len + step - 1) // step


def has_continuation_bos(piece: Piece, config: PackingConfig) -> bool:
    """Whether ``bos_id`` is inserted before the piece: a continuation chunk under bos_on_continuation (PACK-10).

    >>> cfg = PackingConfig(seq_len=4, mode="none", bos_on_continuation=True, bos_id=1)
    >>> has_continuation_bos(Piece(0, 0, 4), cfg), has_continuation_bos(Piece(0, 4, 7), cfg)
    (False, True)
    """
    return config.splits and config.bos_on_continuation and piece.start > 0


def piece_width(piece: Piece, config: PackingConfig) -> int:
    """Input positions a piece occupies: its tokens plus an inserted BOS (PACK-14).

    >>> piece_width(Piece(0, 4, 7), PackingConfig(seq_len=4, mode="none", bos_on_continuation=True, bos_id=1))
    4
    """
    return piece.stop - piece.start + int(has_continuation_bos(piece, config))


def trained_offsets(piece: Piece, length: int, config: PackingConfig) -> range:
    """The offsets p of the piece whose input carries the label ``d[p + 1]``; all others are IGNORE.

    Why one function: it is the whole masking rule, and ``fill`` applies it
    as is. Clauses: PACK-4, PACK-7, PACK-9, PACK-12, PACK-13.

    * ``concat`` and ``chunk``: every input whose next token exists in the same
      document, including the last input of a sample, whose target is the
      first token of the next window (concat) or the window's extra token
      (chunk).
    * bin modes and ``none``: the last document token of a chunk is IGNORE
      (its target is not in the sample); in a continuation chunk the pairs an
      earlier chunk already trained, ``p + 1 < a + stride``, are IGNORE, so
      the re-read tokens are context only.

    >>> trained_offsets(Piece(0, 4, 8), 9, PackingConfig(seq_len=4))
    range(4, 8)
    >>> trained_offsets(Piece(0, 4, 8), 9, PackingConfig(seq_len=4, mode="none"))
    range(4, 7)
    >>> trained_offsets(Piece(0, 2, 6), 6, PackingConfig(seq_len=4, mode="none", stride=2))
    range(3, 5)
    """
    if config.mode in STREAM_MODES:
        return range(piece.start, min(piece.stop, length - 1))
    first = piece.start + max(0, config.stride - 1) if piece.start > 0 else 0
    return range(first, piece.stop - 1)


# ------------------------------------------------------------------ the plan


def _stream_plan(kept: list[int], lengths: list[int], config: PackingConfig) -> Plan:
    """Samples cut from the concatenated stream T: inputs ``T[i*hop : i*hop + L]`` (PACK-6, PACK-8)."""
    L = config.seq_len
    n = sum(lengths[d] for d in kept)
    hop, count = (L, max(0, (n - 1) // L)) if config.mode == "concat" else (L + 1, n // (L + 1))
    plan: Plan = []
    first, first_begin = 0, 0
    for i in range(count):
        lo, hi = i * hop, i * hop + L
        while first_begin + lengths[kept[first]] <= lo:
            first_begin += lengths[kept[first]]
            first += 1
        pieces = []
        k, begin = first, first_begin
        while begin < hi:
            doc = kept[k]
            pieces.append(Piece(doc, max(0, lo - begin), min(lengths[doc], hi - begin)))
            begin += lengths[doc]
            k += 1
        plan.append(tuple(pieces))
    return plan


def _chunks(docs: Sequence[int], lengths: list[int], config: PackingConfig) -> list[Piece]:
    return [Piece(doc, a, b) for doc in docs for a, b in chunk_spans(lengths[doc], config)]


def bin_key(seed: int, epoch: int) -> int:
    """The key of the bins' emission order under a shuffled order of ``seed`` in ``epoch`` (PACK-22).

    >>> bin_key(0, 0) != bin_key(0, 1) != bin_key(1, 0)
    True
    """
    return derive_key(seed, epoch, Stream.BIN_ORDER)


def emission_order(num_bins: int, key: int | None, window: int) -> list[int]:
    """Which bin of window ``window`` each sample of that window is: creation order, or keyed (PACK-14, PACK-22).

    Why keyed: the packers create bins in an order tied to the items' widths
    (best-fit decreasing: longest first), so emitting them in creation order
    turns a shuffled document order into a length-sorted sample order that is
    the same for every seed and epoch when a window holds all documents.
    Sample ``j`` of the window is bin ``π(j)``, ``π`` the keyed bijection
    (RNG-5) of ``[0, num_bins)`` under ``subkey(key, window)`` (RNG-6).

    >>> emission_order(4, None, 0)
    [0, 1, 2, 3]
    >>> sorted(emission_order(4, bin_key(0, 0), 0))
    [0, 1, 2, 3]
    """
    if key is None:
        return list(range(num_bins))
    return FeistelPermutation(num_bins, subkey(key, window)).to_list()


def _bin_plan(kept: list[int], lengths: list[int], config: PackingConfig, key: int | None) -> Plan:
    """Each window's chunks packed into bins, the window's bins emitted in creation or keyed order (PACK-14, PACK-22)."""
    plan: Plan = []
    packer = PACKERS[config.mode]
    for w, first in enumerate(range(0, len(kept), config.window)):
        items = _chunks(kept[first:first + config.window], lengths, config)
        bins = packer([piece_width(p, config) for p in items], config.seq_len)
        plan.extend(tuple(items[i] for i in bins[b]) for b in emission_order(len(bins), key, w))
    return plan


def pack_plan(lengths: Sequence[int], config: PackingConfig, *, key: int | None = None) -> Plan:
    """Every sample's pieces, from the raw document lengths alone (PACK-20).

    ``lengths[i]`` is the number of tokens of document ``i`` before
    preparation; each piece ``(doc, start, stop)`` names a document by its
    position ``i`` and a range of its prepared tokens, in input order.
    ``key`` (``bin_key(seed, epoch)`` when the documents come in a shuffled
    order, None otherwise) sets the order of each window's bins in the bin
    modes (PACK-22); the other modes ignore it.
    Clauses: PACK-2, PACK-6, PACK-8, PACK-14, PACK-18, PACK-19, PACK-20, PACK-22.

    >>> pack_plan([3, 6, 1], PackingConfig(seq_len=4))
    [(Piece(doc=0, start=0, stop=3), Piece(doc=1, start=0, stop=1)), (Piece(doc=1, start=1, stop=5),)]
    >>> pack_plan([3, 0, 6, 1], PackingConfig(seq_len=4, mode="first_fit"))
    [(Piece(doc=0, start=0, stop=3), Piece(doc=3, start=0, stop=1)), (Piece(doc=2, start=0, stop=4),), (Piece(doc=2, start=4, stop=6),)]
    """
    prepared = [prepared_length(n, config) for n in lengths]
    kept = [doc for doc, m in enumerate(prepared) if is_kept(m, config)]
    if config.mode in STREAM_MODES:
        return _stream_plan(kept, prepared, config)
    if config.mode == "none":
        return [(piece,) for piece in _chunks(kept, prepared, config)]
    return _bin_plan(kept, prepared, config, key)


def num_samples(lengths: Sequence[int], config: PackingConfig) -> int:
    """How many samples ``pack`` yields, from raw document lengths alone (PACK-20).

    Why: a loader sizes epochs and resumes without reading tokens. The
    stream modes and ``none`` have closed forms; the bin modes must run the
    packer on the widths (still no tokens).

    >>> num_samples([3, 6, 1], PackingConfig(seq_len=4))       # n = 10: (10 - 1) // 4
    2
    >>> num_samples([3, 6, 1], PackingConfig(seq_len=4, mode="none"))
    4
    """
    prepared = [m for m in (prepared_length(n, config) for n in lengths) if is_kept(m, config)]
    n, L = sum(prepared), config.seq_len
    if config.mode == "concat":
        return max(0, (n - 1) // L)
    if config.mode == "chunk":
        return n // (L + 1)
    if config.mode == "none":
        return sum(chunk_count(m, config) for m in prepared)
    return len(pack_plan(lengths, config))


# ------------------------------------------------------------------ the fill


def fill(plan: Plan, documents: Sequence[Document], config: PackingConfig) -> list[Sample]:
    """The samples a plan describes, with tokens, labels, positions and provenance.

    Each piece is one segment: it starts a new entry of ``document_starts``
    and restarts ``position_ids`` at 0, whatever its offset in the document;
    labels follow ``trained_offsets``; the rest of the sample is padding.
    Clauses: PACK-3, PACK-4, PACK-5.

    >>> docs = [(7, [1, 2, 3]), (8, [4, 5, 6, 7, 8, 9])]
    >>> s = fill([(Piece(0, 2, 3), Piece(1, 0, 2))], docs, PackingConfig(seq_len=4, mode="greedy"))[0]
    >>> s.input_ids, s.labels, s.position_ids, s.doc_ids, s.token_offsets, s.document_starts
    ((3, 4, 5, 0), (-100, 5, -100, -100), (0, 0, 1, 0), (7, 8, 8, -1), (2, 0, 1, -1), (0, 1))
    """
    prepared: dict[int, tuple[int, ...]] = {}
    return [_fill_sample(pieces, documents, prepared, config) for pieces in plan]


def _fill_sample(pieces: Sequence[Piece], documents: Sequence[Document], prepared: dict[int, tuple[int, ...]],
                 config: PackingConfig) -> Sample:
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    doc_ids: list[int] = []
    offsets: list[int] = []
    starts: list[int] = []

    def put(token: int, label: int, doc_id: int, offset: int) -> None:
        ids.append(token)
        labels.append(label)
        positions.append(len(ids) - 1 - starts[-1])
        doc_ids.append(doc_id)
        offsets.append(offset)

    for piece in pieces:
        doc_id, tokens = documents[piece.doc]
        if piece.doc not in prepared:
            prepared[piece.doc] = prepare(tokens, config)
        d = prepared[piece.doc]
        trained = trained_offsets(piece, len(d), config)
        starts.append(len(ids))
        if has_continuation_bos(piece, config) and config.bos_id is not None:
            put(config.bos_id, IGNORE, doc_id, NO_OFFSET)
        for p in range(piece.start, piece.stop):
            put(d[p], d[p + 1] if p in trained else IGNORE, doc_id, p)
    L = config.seq_len
    require(len(ids) <= L, ConfigError, f"a plan sample holds {len(ids)} positions but seq_len={L}; the plan is not for this config")
    pad = L - len(ids)
    return Sample(input_ids=tuple(ids) + (config.pad_id,) * pad, labels=tuple(labels) + (IGNORE,) * pad,
                  position_ids=tuple(positions) + (0,) * pad, doc_ids=tuple(doc_ids) + (NO_DOC,) * pad,
                  token_offsets=tuple(offsets) + (NO_OFFSET,) * pad, document_starts=tuple(starts))


def pack(documents: Sequence[Document], config: PackingConfig, *, key: int | None = None) -> list[Sample]:
    """The epoch's samples: the plan of the documents' lengths, filled with their tokens (PACK-20).

    ``key``: as ``pack_plan``'s (PACK-22). Clauses: PACK-1 .. PACK-19, PACK-22 through ``pack_plan`` and ``fill``.

    >>> [s.input_ids for s in pack([(0, [1, 2]), (1, []), (2, [3])], PackingConfig(seq_len=2, mode="none"))]
    [(1, 2), (3, 0)]
    """
    return fill(pack_plan([len(tokens) for _, tokens in documents], config, key=key), documents, config)


# ------------------------------------------------------------------ accounting


def trained_pairs(samples: Sequence[Sample]) -> Counter[tuple[int, int]]:
    """How often each ``(doc_id, offset)`` input is trained on its next token: one count per non-IGNORE label.

    Why: "every pair exactly once" and "no pair across documents" become
    counting statements any third party can check on a loader's output.

    >>> trained_pairs(pack([(7, [1, 2, 3])], PackingConfig(seq_len=2)))
    Counter({(7, 0): 1, (7, 1): 1})
    """
    return Counter((s.doc_ids[j], s.token_offsets[j]) for s in samples for j, label in enumerate(s.labels)
                   if label != IGNORE)


def input_tokens(samples: Sequence[Sample]) -> Counter[tuple[int, int]]:
    """How often each ``(doc_id, offset)`` prepared token is an input (padding and inserted BOS excluded).

    >>> input_tokens(pack([(7, [1, 2, 3])], PackingConfig(seq_len=2)))
    Counter({(7, 0): 1, (7, 1): 1})
    """
    return Counter((s.doc_ids[j], s.token_offsets[j]) for s in samples for j in range(len(s.input_ids))
                   if s.token_offsets[j] != NO_OFFSET)
