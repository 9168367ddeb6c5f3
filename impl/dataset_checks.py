"""What a ``PackedDataset`` refuses before it reads a token: sized options out of range, and epochs with no sample.

Why from sizes: a restarted job builds its dataset before its first batch,
and construction reads ``meta.json`` only; with ``min_len <= 1`` the kept
documents and their tokens follow from the store's totals, so a config that
would give an empty epoch, or one whose every label is -100 (a NaN loss), is
refused by name at construction instead of at the first batch.

Worked example: a store of 10 documents, 2 of them empty, 50 tokens keeps
``(8, 50)`` under ``min_len=0``; with ``add_eos=True`` every document gets
one more token, ``(10, 60)``; ``seq_len=64`` with ``packing="concat"`` then
needs 65 tokens and is refused, naming the lower ``seq_len`` as the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from impl.errors import ConfigError, EmptyDataError, is_integer, require
from impl.packing import closed_form_samples
from impl.splits import SplitStore
from reference.packing import STREAM_MODES, PackingConfig
from reference.resume import PipelineConfig

__all__ = ["MAX_SEQ_LEN", "check_bounded", "check_not_empty", "kept_totals", "refuse_empty"]

MAX_SEQ_LEN = 1 << 24
"""The largest ``seq_len`` accepted (16M positions): a batch row is five int64 arrays of it."""
BOUNDS = {
    "seq_len": (1, MAX_SEQ_LEN, "input positions per sample, e.g. seq_len=2048"),
    "seed": (0, (1 << 64) - 1, "a non-negative integer below 2**64, e.g. seed=0"),
    "window": (1, 1 << 40, "documents per shuffle window, e.g. window=1024"),
    "pack_window": (1, 1 << 40, "documents per bin-packing window, e.g. pack_window=1000"),
    "stride": (0, MAX_SEQ_LEN - 1, "tokens a continuation chunk re-reads, below seq_len (0 for none)"),
    "min_len": (0, 1 << 40, "the shortest document kept, in tokens (0 keeps every non-empty document)"),
    "pad_id": (0, (1 << 32) - 1, "a token id, e.g. the tokenizer's pad or eos id"),
    "epoch": (0, 1 << 40, "the epoch to start in, e.g. epoch=0"),
}


def kept_totals(store: Any, p: PackingConfig) -> tuple[int, int] | None:
    """``(kept documents, their prepared tokens)`` from ``meta.json`` alone; None when ``min_len`` needs lengths.

    A document is kept when its prepared length (tokens plus added
    BOS/EOS) is positive and at least ``min_len`` (PACK-2). With
    ``min_len <= 1`` that is "positive", so the counts follow from the
    store's totals: empty documents are the ones whose text had no token
    (none when the store itself added BOS or EOS). Example: 10 documents,
    2 of them empty, 50 tokens give (8, 50); with ``add_eos=True``,
    (10, 60).
    """
    if p.min_len > 1:
        return None
    extra = int(p.add_bos) + int(p.add_eos)
    options = store.meta.get("options") or {}
    empty = 0 if options.get("add_bos") or options.get("add_eos") else store.num_empty_documents
    if extra:
        return store.num_documents, store.num_tokens + extra * store.num_documents
    return store.num_documents - empty, store.num_tokens


def check_not_empty(store: Any, config: PipelineConfig, plan: Callable[[int], Any], epoch: int) -> int | None:
    """Refuse a config whose epochs hold no sample, or no trainable label, checked from sizes (no token read).

    Why "no trainable label" is refused: a label is the next token of
    the same document, so documents of at most one prepared token give
    samples whose labels are all IGNORE, and a mean loss over no label
    is NaN. With ``min_len <= 1`` the counts come from ``meta.json``
    (:func:`kept_totals`); with a larger ``min_len`` every kept document
    has labels, and the epoch's plan says whether any is kept.
    Returns the epochs' sample count when it follows from the totals (the
    first plan is checked against it), None when ``plan(epoch)`` decided.
    """
    p = config.packing
    where = f"the store at {store.path} ({store.num_documents} documents, {store.num_tokens} tokens)"
    if isinstance(store, SplitStore):
        where = (f"split={store.notation!r} of the store at {store.path} (documents {store.rows.start} to "
                 f"{store.rows.stop - 1}: {store.num_documents} of its {store.base.num_documents} documents, "
                 f"{store.num_tokens} tokens)")
    require(store.num_documents > 0, EmptyDataError, f"{where} is empty; build it from a source with documents")
    totals = kept_totals(store, p)
    if totals is not None:
        kept, n = totals
        refuse_empty(store, p, where, kept, n)
        return closed_form_samples(p, kept, n)
    if plan(epoch).num_samples == 0:
        refuse_empty(store, p, where, 0, 0)
    return None


def refuse_empty(store: Any, p: PackingConfig, where: str, kept: int, n: int) -> None:
    """EmptyDataError naming why ``kept`` documents of ``n`` prepared tokens give no sample or no label."""
    L = p.seq_len
    wider = ", widen the split" if isinstance(store, SplitStore) else ""
    if not kept:
        raise EmptyDataError(
            f"{where} keeps no document for this config: every document is empty"
            + (f" or shorter than min_len={p.min_len}" if p.min_len else "")
            + f"; lower min_len, set add_eos=True{wider}, or check the store")
    if p.mode in STREAM_MODES:
        require(n >= L + 1, EmptyDataError,
                f"{where} yields {n} tokens to pack; seq_len={L} needs at least {L + 1} for packing={p.mode!r} "
                + ("(a sample's inputs and the target after them)" if p.mode == "concat" else
                   "(one window of L + 1 tokens)") + f"; lower seq_len{wider} or use packing='none'")
    require(n > kept, EmptyDataError,
            f"{where} has no trainable label for this config: each of its {kept} kept documents holds at most one "
            "token after BOS/EOS are added, and a label is the next token of the same document, so every label "
            f"would be -100 (a NaN loss); set add_eos=True or add_bos=True{wider}, or build the store from longer "
            "documents")


def check_bounded(name: str, value: Any) -> None:
    """ConfigError unless ``value`` is an integer (never a bool or float) within ``BOUNDS[name]``.

    The one check of ``seq_len`` and the other sized arguments: each
    constructor (``PackedDataset(...)``, ``PackedDataset.from_config``,
    ``impl.hf.HuggingFaceDataset`` before it tokenizes) runs it once per value.

    >>> check_bounded("seq_len", 0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: seq_len=0 must be an integer in [1, 16777216] (input positions per sample, e.g. seq_len=2048)
    """
    lo, hi, what = BOUNDS[name]
    if not (is_integer(value) and lo <= value <= hi):   # the message only on failure: construction checks ~15 values
        raise ConfigError(f"{name}={value!r} must be an integer in [{lo}, {hi}] ({what})")

