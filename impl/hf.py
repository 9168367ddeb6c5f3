"""The eager Hugging Face path: tokenize a ``datasets`` split once into a cached token store, serve chunk samples.

What KempnerForge's eager ``HuggingFaceDataset`` does, made exact and cached:
each document's text is encoded without special tokens, an EOS is appended,
the token stream is cut into disjoint windows of ``seq_len + 1`` tokens (the
remainder is dropped) and a sample is ``input_ids = window[:-1]``,
``labels = window[1:]`` with ``doc_ids`` and ``-100`` wherever the target
belongs to another document. That is ``PackedDataset(..., packing="chunk")``
over a store built with ``add_eos=True`` (PACK-4, PACK-8, PACK-9), so this
class is a :class:`~impl.dataset.PackedDataset` and resumes exactly (and on
another world size) through ``impl.loader.build_dataloader``.

What it fixes:

* *Re-tokenizing at every process start.* The tokens go to a
  :class:`~impl.store.TokenStore` under ``cache_dir`` in a directory named by
  a key of the data (the ``datasets`` fingerprint and the text field), the
  tokenizer (its serialisation and the EOS id) and the options.
  ``TokenStore.build`` returns an existing identical store under its lock
  without reading a row of the source (it compares the build key, computed
  from the fingerprint, the row count and the column names only).
* *The EOS fallback.* KempnerForge uses token 0 when the tokenizer has no EOS,
  which silently glues documents to whatever token 0 is. Here a tokenizer
  without EOS is refused (``TokenizerError``) unless ``eos_token=`` names the
  boundary token, which must be in the vocabulary.

Differences from KempnerForge, on purpose: ``doc_ids`` are store document
indices (global, not renumbered per sample), and labels are always masked
across documents (its ``pack_sequences=false`` trains the pair spanning two
documents).

Offline: ``dataset`` is a ``datasets.Dataset`` (or a ``DatasetDict`` with
``split=``), or a name / local path handed to ``datasets.load_dataset``
with ``split`` and ``load_kwargs`` (``data_files=``, ``cache_dir=``, ...);
nothing here downloads.

Worked example (``seq_len=4``, documents ``"a b"`` and ``"c d e"`` as 2 and 3
token ids, EOS ``e``)::

    stream  a b e | c d e' e          (5 + 3 = 8 tokens, one window of 5)
    window  [a, b, e, c, d]
    input   [a, b, e, c]   labels [b, e, -100, d]   doc_ids [0, 0, 0, 1]
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from impl.dataset import PackedDataset, check_bounded
from impl.encoding import eos_suggestion, resolve_tokenizer
from impl.errors import ConfigError, EmptyDataError, TokenizerError, require
from impl.plan_cache import refuse_file_cache_dir
from impl.store import TokenStore
from reference.resume import canonical_json

__all__ = ["HuggingFaceDataset", "load_split", "prepare_tokenizer", "tokenize_split"]

CACHE_FORMAT = "loadspec.hf-eager.v1"


def load_split(dataset: Any, split: str | None = None, *, config_name: str | None = None,
               load_kwargs: Mapping[str, Any] | None = None) -> Any:
    """A ``datasets.Dataset`` from a Dataset, a DatasetDict and ``split``, or a ``load_dataset`` name / path.

    Why refuse a DatasetDict without ``split``: tokenizing "the dataset" when
    it holds train and test would silently train on the test split.
    """
    import datasets

    if isinstance(dataset, (str, os.PathLike)):
        require(split is not None, ConfigError,
                f"split is None for {os.fspath(dataset)!r}: name the split to load, e.g. split='train'")
        dataset = datasets.load_dataset(os.fspath(dataset), config_name, split=split, **dict(load_kwargs or {}))
    if isinstance(dataset, datasets.DatasetDict):
        require(split is not None and split in dataset, ConfigError,
                f"split={split!r} is not one of the DatasetDict's splits {sorted(dataset)}; pass split=<one of them>")
        dataset = dataset[split]
    require(isinstance(dataset, datasets.Dataset), ConfigError,
            f"dataset is a {type(dataset).__name__}; the eager path needs a datasets.Dataset (map-style) or a "
            "load_dataset name / path with split= (streaming IterableDatasets cannot be cached by fingerprint)")
    return dataset


def prepare_tokenizer(tokenizer: Any, eos_token: str | None = None) -> Any:
    """The tokenizer object with an EOS, or a ``TokenizerError``: never a silent fallback id.

    ``eos_token`` names the boundary token (it must be in the vocabulary);
    it overrides the tokenizer's own EOS. A tokenizer given as a path is
    loaded from local files only.
    """
    from impl.encoding import load_tokenizer

    tok = load_tokenizer(tokenizer)
    if eos_token is not None:
        vocab = tok.get_vocab()
        own = tok.eos_token if getattr(tok, "eos_token_id", None) is not None else None
        require(isinstance(eos_token, str) and eos_token in vocab, TokenizerError,
                f"eos_token={eos_token!r} is not a token of {type(tok).__name__}'s vocabulary; name a token it has: "
                f"{eos_suggestion(vocab, own=own, rejected=eos_token)}"
                + (f" (or leave eos_token=None to use its own, {own!r})" if own in vocab else ""))
        tok = copy.deepcopy(tok)
        tok.eos_token = eos_token
        return tok
    if getattr(tok, "eos_token_id", None) is None:
        raise TokenizerError(
            f"tokenizer {type(tok).__name__} has no EOS token, so documents would run into each other (KempnerForge "
            "falls back to id 0, whatever token that is); name the boundary token with eos_token='<token>', one of "
            f"its vocabulary: {eos_suggestion(tok.get_vocab())}")
    return tok


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "data"


def tokenize_split(dataset: Any, tokenizer: Any, cache_dir: str | os.PathLike[str], *, text_field: str = "text",
                   num_proc: int | None = 1, progress: bool | None = None) -> TokenStore:
    """The cached token store of ``dataset`` (a ``datasets.Dataset``), building it only if it is not there yet.

    The directory is ``cache_dir/<name>-<key>``, the key hashing the data's
    fingerprint and text field, the tokenizer's identity (EOS included) and
    the options, so other data or another tokenizer gets another store and a
    restart finds its own.

    ``progress``: a bar on stderr while tokenizing, with the split's row
    count as its total, the rate and an ETA; ``None`` (default) shows it
    when stderr is a terminal, so a job's log file gets no bar lines.
    """
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    fingerprint = getattr(dataset, "_fingerprint", None)
    require(isinstance(fingerprint, str), ConfigError,
            f"{type(dataset).__name__} has no datasets fingerprint, so its tokens cannot be cached safely; "
            "pass a datasets.Dataset")
    _, info = resolve_tokenizer(tokenizer)
    key = hashlib.sha256(canonical_json({
        "format": CACHE_FORMAT, "data": fingerprint, "text_field": text_field, "tokenizer": info.sha256,
        "eos_id": info.eos_id, "add_eos": True,
    }).encode()).hexdigest()[:20]
    name = _slug(str(getattr(getattr(dataset, "info", None), "dataset_name", None) or "data"))
    out = refuse_file_cache_dir(cache_dir) / f"{name}-{key}"
    return TokenStore.build(dataset, tokenizer, out, text_field=text_field, num_proc=num_proc, add_eos=True,
                            progress=progress)


def _refuse_empty(store: TokenStore, seq_len: int, text_field: str) -> None:
    """Refuse a split with no chunk sample, or no trainable label, offering only what this class accepts.

    ``PackedDataset`` would refuse the same splits, but suggest options
    (``packing=``, ``add_eos=``) that this class fixes (``"chunk"``, EOS
    always appended). Here ``n`` tokens (EOS included) make ``n // (seq_len +
    1)`` samples, and documents holding only their EOS have no label.
    Example: 1 document of 2 tokens with ``seq_len=64`` is refused ("needs
    at least 65").
    """
    where = f"the split ({store.num_documents} documents, {store.num_tokens} tokens with EOS appended)"
    require(store.num_tokens >= seq_len + 1, EmptyDataError,
            f"{where} is too short: seq_len={seq_len} needs at least {seq_len + 1} tokens for one sample (a window "
            "of seq_len + 1 tokens); lower seq_len or use a longer split")
    require(store.num_tokens > store.num_documents, EmptyDataError,
            f"{where} has no trainable label: every document is empty besides the EOS appended to it, so every "
            f"label would be -100 (a NaN loss); check that text_field={text_field!r} names the column holding the "
            "text, or use a split with text")


class HuggingFaceDataset(PackedDataset):
    """KempnerForge's eager ``HuggingFaceDataset``: chunk samples of ``seq_len`` from a cached tokenization.

    ``dataset``: a ``datasets.Dataset``, a ``DatasetDict`` (with ``split``) or
    a ``load_dataset`` name / local path (with ``split``, ``config_name``,
    ``load_kwargs``). ``tokenizer``: a fast tokenizer object, a local
    directory or a ``tokenizer.json``. ``cache_dir``: where token stores (and
    packing plans) are kept. ``shuffle`` / ``seed`` / ``window``: the
    *document* order as ``PackedDataset``'s, applied before the stream is cut.

    What ``shuffle`` does (ORD, then PACK-8): the token stream is the store's
    documents (each with its EOS) concatenated in the epoch's document order,
    and sample ``i`` is its window ``[i*(L+1), (i+1)*(L+1))``, ``L = seq_len``.

    * ``"none"``: store order, so the windows are KempnerForge's, in its
      order, the same every epoch.
    * ``"global"``: the documents are permuted (ORD-3, keyed by seed and
      epoch) and the permuted stream is cut. The windows themselves change,
      not only their order: a window holds other documents and other
      boundaries, the pairs lost at window edges (PACK-9) and the dropped
      remainder (the stream's last ``n mod (L+1)`` tokens) change with the
      epoch, and no window need equal one of KempnerForge's. The number of
      samples, ``n // (L+1)`` for ``n`` tokens, does not change.
    * ``"window"``: the files are permuted, documents shuffled inside
      windows of ``window`` documents (ORD-4, ORD-5), then cut the same way.

    There is no option that keeps KempnerForge's windows and only reorders
    them. Example (``L = 2``, documents ``A = [a1, a2, eos]``,
    ``B = [b1, eos]``, ``C = [c1, c2, c3, eos]``, 9 tokens, 3 windows):
    ``"none"`` cuts ``[a1 a2 eos] [b1 eos c1] [c2 c3 eos]``; an epoch whose
    global order is ``C, A, B`` cuts ``[c1 c2 c3] [eos a1 a2] [eos b1 eos]``.

    Samples (``ds[i]``): ``input_ids``, ``labels`` (-100 across documents),
    ``doc_ids``, ``position_ids``, ... as ``PackedDataset`` serves them.
    Raises ``EmptyDataError`` when the split holds fewer than
    ``seq_len + 1`` tokens (no full window), or only empty texts.
    The store is this dataset's own: :meth:`close` (or ``with``) closes it.

    >>> ds = HuggingFaceDataset(split_ds, tok, seq_len=2048, cache_dir="cache")   # doctest: +SKIP
    >>> loader = build_dataloader(ds, batch_size=8)                                # doctest: +SKIP
    """

    def __init__(self, dataset: Any, tokenizer: Any, *, seq_len: int, cache_dir: str | os.PathLike[str],
                 split: str | None = None, config_name: str | None = None, text_field: str = "text",
                 eos_token: str | None = None, shuffle: str = "none", seed: int = 0, window: int = 1024,
                 num_proc: int | None = 1, progress: bool | None = None,
                 load_kwargs: Mapping[str, Any] | None = None) -> None:
        check_bounded("seq_len", seq_len)   # before tokenizing: PackedDataset's own check comes after it
        split_ds = load_split(dataset, split, config_name=config_name, load_kwargs=load_kwargs)
        tok = prepare_tokenizer(tokenizer, eos_token)
        store = tokenize_split(split_ds, tok, cache_dir, text_field=text_field, num_proc=num_proc, progress=progress)
        _refuse_empty(store, seq_len, text_field)
        super().__init__(store, seq_len=seq_len, packing="chunk", shuffle=shuffle, seed=seed, window=window,
                         cache_dir=Path(cache_dir) / "plans")
        self._own(store)   # the store this class built or found under cache_dir: close() closes it
