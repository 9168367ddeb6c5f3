"""Tokenizer identity and batched encoding: which tokenizer a store is built with, and text to token ids.

Why a module of its own: a store is only reproducible if "the tokenizer" is
pinned down exactly. Users hand over a directory, a ``tokenizer.json``, a
``transformers`` tokenizer or a bare ``tokenizers.Tokenizer``;
:func:`resolve_tokenizer` reduces all of them (locally, never fetching from
the hub) to one normalised ``tokenizers`` JSON string, which is both what
worker processes rebuild the tokenizer from (a string pickles cheaply and
loads identically under ``spawn``) and what :class:`TokenizerInfo` hashes to
identify it. :class:`Encoder` is the only place text becomes token ids: it
encodes with ``add_special_tokens=False`` (truncation and padding off) and
adds bos/eos itself, so the result does not depend on a tokenizer's
post-processor or on how the documents were batched.

The encoding knows nothing of files: ``impl.store`` writes what
:meth:`Encoder.encode` returns (flat values plus int64 document offsets, the
layout of an Arrow ``large_list`` column) as token files.

Worked example (a tiny word-level tokenizer built in memory)::

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"<eos>": 0, "hello": 1, "world": 2, "<unk>": 3}, unk_token="<unk>"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> tok_json, info = resolve_tokenizer(tok)
    >>> info.vocab_size, info.eos_id            # this tokenizer names no eos_token
    (4, None)
    >>> enc = Encoder(tok_json, dtype="uint16", bos_id=None, eos_id=0, batch_size=2)
    >>> values, offsets, num_empty = enc.encode(["hello world", "", "world hello"])
    >>> values.tolist(), offsets.tolist(), num_empty    # the empty document is kept: just eos
    ([1, 2, 0, 0, 2, 1, 0], [0, 3, 4, 7], 1)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from impl.errors import TokenizerError

__all__ = ["Encoder", "TokenizerInfo", "resolve_tokenizer"]

K = TypeVar("K")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    """Identity of the tokenizer a store was built with.

    ``sha256`` hashes the tokenizer's JSON serialisation (with truncation and
    padding switched off, since the build never uses them), so two tokenizers
    that encode identically from the same definition share it.
    """

    sha256: str
    class_name: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    pad_id: int | None
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_tokenizer(spec: Any) -> Any:
    """Turn a path or object into a transformers fast tokenizer (never touches the network)."""
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if not path.exists():
            raise TokenizerError(
                f"tokenizer path {str(path)!r} does not exist: pass a local directory loadable by "
                "transformers.AutoTokenizer.from_pretrained, a tokenizer.json file, or a tokenizer object "
                "(hub names are not fetched)"
            )
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        try:
            if path.is_dir():
                return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            if path.name == "tokenizer.json" and (
                (path.parent / "tokenizer_config.json").exists() or (path.parent / "special_tokens_map.json").exists()
            ):
                # The sibling configs carry eos/bos/pad, which tokenizer.json alone does not.
                return AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
        except TokenizerError:
            raise
        except Exception as exc:
            raise TokenizerError(
                f"could not load a tokenizer from {str(path)!r} ({type(exc).__name__}: {exc}); pass a directory "
                "saved with tokenizer.save_pretrained() or a tokenizer.json file"
            ) from exc
    import tokenizers

    if isinstance(spec, tokenizers.Tokenizer):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=spec)
    return spec


_GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
# tokenizer_config.json keys that a generic transformers>=5 tokenizer only reads, never applies to the backend.
_PLAIN_CONFIG_KEYS = frozenset({"backend", "tokenizer_class", "bos_token", "eos_token", "pad_token", "unk_token",
                                "model_max_length", "clean_up_tokenization_spaces", "name_or_path"})
_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
_PARSED: dict[str, Any] = {}


def _transformers_major() -> int | None:
    from importlib import metadata

    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def _direct_json_and_config(spec: Any) -> tuple[Any, dict[str, Any]] | None:
    """The ``tokenizers.Tokenizer`` and tokenizer_config that transformers would load verbatim, else None.

    Why: ``import transformers`` pulls in torch (seconds) and its tokenizer
    parses the JSON again; for a generic tokenizer (a bare ``tokenizer.json``,
    a ``tokenizers.Tokenizer``, a directory whose config names
    ``TokenizersBackend`` and only plain special tokens of its vocabulary)
    transformers >= 5 uses the JSON as is, so reading it here gives the same
    identity. Anything else (a model class such as ``GPT2Tokenizer`` that
    rebuilds its backend, extra config keys, added tokens) returns None and
    goes through transformers.
    """
    import json

    from tokenizers import Tokenizer

    if _transformers_major() is None or (_transformers_major() or 0) < 5:
        return None
    if isinstance(spec, Tokenizer):
        return Tokenizer.from_str(spec.to_str()), {}
    if not isinstance(spec, (str, os.PathLike)):
        return None
    path = Path(spec)
    folder = path if path.is_dir() else path.parent
    file = folder / "tokenizer.json" if path.is_dir() else path
    if not file.is_file() or (not path.is_dir() and path.name != "tokenizer.json"):
        return None
    others = {p.name for p in folder.iterdir()} & {"special_tokens_map.json", "added_tokens.json", "vocab.json",
                                                    "merges.txt", "tokenizer.model", "vocab.txt"}
    config_file = folder / "tokenizer_config.json"
    if others or (path.is_dir() and not config_file.exists()):
        return None
    config: dict[str, Any] = {}
    if config_file.exists():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if (not isinstance(config, dict) or config.get("tokenizer_class") not in _GENERIC_CLASSES
                or set(config) - _PLAIN_CONFIG_KEYS):
            return None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - a file tokenizers cannot read goes to transformers, which names the problem
        return None
    for name in _SPECIAL_NAMES:
        token = config.get(name)
        if token is not None and (not isinstance(token, str) or tok.token_to_id(token) is None):
            return None
    return tok, {name: config.get(name) for name in _SPECIAL_NAMES}


def parsed_tokenizer(tok_json: str) -> Any:
    """A ``tokenizers.Tokenizer`` for ``tok_json``, parsed once per process (encoding does not mutate it)."""
    from tokenizers import Tokenizer

    key = hashlib.sha256(tok_json.encode("utf-8")).hexdigest()
    tok = _PARSED.get(key)
    if tok is None:
        tok = Tokenizer.from_str(tok_json)
        tok.no_truncation()
        tok.no_padding()
        _PARSED.clear()
        _PARSED[key] = tok
    return tok


def resolve_tokenizer(spec: Any) -> tuple[str, TokenizerInfo]:
    """Return the normalised tokenizer JSON (what workers rebuild from) and its identity.

    A generic tokenizer is read with ``tokenizers`` alone
    (:func:`_direct_json_and_config`); its identity is the one transformers
    gives it, so a store's fingerprint does not depend on the path taken.
    A model tokenizer is resolved by transformers once and then read back from
    :mod:`impl.tokenizer_cache` (keyed by its files' bytes), with the same identity.
    """
    direct = _direct_json_and_config(spec)
    if direct is not None:
        normal, config = direct
        normal.no_truncation()
        normal.no_padding()
        tok_json = normal.to_str()
        vocab_size = normal.get_vocab_size(with_added_tokens=True)
        vocab = normal.get_vocab(with_added_tokens=True)
        vocab_size = max(vocab_size, max(vocab.values()) + 1 if vocab else 0)
        specials = {}
        for name in ("eos_token", "bos_token", "pad_token"):
            token = config.get(name)
            specials[name] = (None if token is None else int(normal.token_to_id(token)), token)
        sha = hashlib.sha256(tok_json.encode("utf-8")).hexdigest()
        _PARSED.clear()
        _PARSED[sha] = normal
        return tok_json, TokenizerInfo(
            sha256=sha, class_name="TokenizersBackend", vocab_size=int(vocab_size),
            eos_id=specials["eos_token"][0], bos_id=specials["bos_token"][0], pad_id=specials["pad_token"][0],
            eos_token=specials["eos_token"][1], bos_token=specials["bos_token"][1], pad_token=specials["pad_token"][1],
        )
    from impl import tokenizer_cache

    key = tokenizer_cache.cache_key(spec)
    cached = None if key is None else tokenizer_cache.load_cached(key)
    if cached is not None:
        with contextlib.suppress(TypeError):
            return cached[0], TokenizerInfo(**cached[1])
    tok_json, info = _resolve_with_transformers(spec)
    if key is not None:
        tokenizer_cache.store_cached(key, tok_json, info.to_json())
    return tok_json, info


def _resolve_with_transformers(spec: Any) -> tuple[str, TokenizerInfo]:
    from tokenizers import Tokenizer

    tok = load_tokenizer(spec)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise TokenizerError(
            f"{type(tok).__name__} is not a fast tokenizer (no backend_tokenizer): load it with "
            "AutoTokenizer.from_pretrained(..., use_fast=True) or pass a tokenizer.json"
        )
    normal = Tokenizer.from_str(backend.to_str())
    normal.no_truncation()
    normal.no_padding()
    tok_json = normal.to_str()
    _PARSED.clear()
    _PARSED[hashlib.sha256(tok_json.encode("utf-8")).hexdigest()] = normal
    vocab = normal.get_vocab(with_added_tokens=True)
    max_id = max(vocab.values()) if vocab else -1
    try:
        length = len(tok)
    except TypeError:
        length = 0
    vocab_size = max(length, max_id + 1, normal.get_vocab_size(with_added_tokens=True))

    def _special(name: str) -> tuple[int | None, str | None]:
        # A named token's id is the vocabulary's own: transformers answers a token outside the vocabulary
        # with unk_token's id, which would make [UNK] the document separator without a word.
        token = getattr(tok, name, None)
        tid = getattr(tok, name + "_id", None)
        if isinstance(token, str):
            tid = normal.token_to_id(token)
        if tid is not None:
            tid = int(tid)
        return tid, (str(token) if token is not None else None)

    eos_id, eos_token = _special("eos_token")
    bos_id, bos_token = _special("bos_token")
    pad_id, pad_token = _special("pad_token")
    info = TokenizerInfo(
        sha256=hashlib.sha256(tok_json.encode("utf-8")).hexdigest(),
        class_name=type(tok).__name__,
        vocab_size=int(vocab_size),
        eos_id=eos_id,
        bos_id=bos_id,
        pad_id=pad_id,
        eos_token=eos_token,
        bos_token=bos_token,
        pad_token=pad_token,
    )
    return tok_json, info


EOS_SPELLINGS = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<|end|>", "[SEP]")
"""The usual spellings of an end-of-text token, offered when a tokenizer's EOS is missing or unknown."""


def eos_suggestion(vocab: Any, *, own: str | None = None, rejected: str | None = None) -> str:
    """The EOS tokens ``vocab`` really holds, in words for an error message; never ``rejected``.

    Why: a message that suggests a token the tokenizer lacks (or the very
    token it just refused) sends the user round in a circle.

    >>> eos_suggestion({"</s>": 1, "a": 2}, rejected="<|endoftext|>")
    "'</s>'"
    >>> eos_suggestion({"a": 2})
    "none: its vocabulary holds none of the usual EOS tokens (add one with tokenizer.add_special_tokens({'eos_token': ...}))"
    """
    names = [own] if own is not None and own in vocab and own != rejected else []
    names += [t for t in EOS_SPELLINGS if t in vocab and t != rejected and t not in names]
    if not names:
        return ("none: its vocabulary holds none of the usual EOS tokens (add one with "
                "tokenizer.add_special_tokens({'eos_token': ...}))")
    return " or ".join(repr(t) for t in names[:3])


class Encoder:
    """Tokenizes ranges of documents into flat token values plus document offsets (bos/eos added here)."""

    def __init__(self, tok_json: str, *, dtype: str, bos_id: int | None, eos_id: int | None, batch_size: int):
        self.tok = parsed_tokenizer(tok_json)
        self.dtype = np.dtype(dtype)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.batch_size = batch_size
        self._encode = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch

    def encode(self, texts: Sequence[str], on_batch: Callable[[int], Any] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """Return (values, int64 offsets of length n+1, number of documents with no text tokens)."""
        for _, values, offsets, num_empty in self.encode_ranges([(None, texts)], on_batch):
            return values, offsets, num_empty
        raise AssertionError("encode_ranges yields one result per range")

    def encode_ranges(self, ranges: Iterable[tuple[K, Sequence[str]]], on_batch: Callable[[int], Any] | None = None
                      ) -> Iterator[tuple[K, np.ndarray, np.ndarray, int]]:
        """``(key, values, offsets, num_empty)`` of each ``(key, texts)`` range, in order: :meth:`encode` of each.

        Why one stream: the tokenizer releases the GIL while it encodes, so
        batch b + 1 encodes in a thread while this one takes the next batch
        from ``ranges`` (reading the next range's texts), turns batch b's ids
        into numpy arrays and, when b ends a range, yields it (the caller
        writes it). Encoding range by range would leave the tokenizer idle
        between ranges (at the first and last batch of each). Batches never
        span ranges, so each range's arrays are those of :meth:`encode` of it.

        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> tok = Tokenizer(models.WordLevel({"<eos>": 0, "a": 1, "b": 2, "<unk>": 3}, unk_token="<unk>"))
        >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> enc = Encoder(resolve_tokenizer(tok)[0], dtype="uint16", bos_id=None, eos_id=0, batch_size=2)
        >>> [(k, v.tolist(), o.tolist()) for k, v, o, _ in enc.encode_ranges([(7, ["a b", "b", "a"]), (8, [])])]
        [(7, [1, 2, 0, 2, 0, 1, 0], [0, 3, 5, 7]), (8, [], [0])]
        """
        values_parts: list[np.ndarray] = []
        length_parts: list[np.ndarray] = []

        def batches() -> Iterator[tuple[K, Sequence[str] | None, bool]]:
            for key, texts in ranges:
                starts = range(0, len(texts), self.batch_size)
                if not starts:
                    yield key, None, True
                for i, b in enumerate(starts):
                    yield key, texts[b : b + self.batch_size], i + 1 == len(starts)

        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadspec-encode") as pool:
            def submit(batch: Sequence[str] | None) -> concurrent.futures.Future[Any] | None:
                return None if batch is None else pool.submit(self._encode, list(batch), add_special_tokens=False)

            items = batches()
            current = next(items, None)
            ahead = None if current is None else submit(current[1])
            while current is not None:
                following = next(items, None)
                encodings = None if ahead is None else ahead.result()
                ahead = None if following is None else submit(following[1])
                key, batch, last = current
                if encodings is not None and batch is not None:
                    self._collect(encodings, values_parts, length_parts)
                    if on_batch is not None:
                        on_batch(len(batch))
                if last:
                    yield (key, *self._assemble(values_parts, length_parts))
                    values_parts, length_parts = [], []
                current = following

    def _collect(self, encodings: Sequence[Any], values_parts: list[np.ndarray],
                 length_parts: list[np.ndarray]) -> None:
        ids = [e.ids for e in encodings]
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        content = np.fromiter(itertools.chain.from_iterable(ids), dtype=self.dtype, count=int(lens.sum()))
        values_parts.append(content)
        length_parts.append(lens)

    def _assemble(self, values_parts: list[np.ndarray],
                  length_parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        n_pre = 0 if self.bos_id is None else 1
        n_post = 0 if self.eos_id is None else 1
        content = np.concatenate(values_parts) if values_parts else np.empty(0, self.dtype)
        lens = np.concatenate(length_parts) if length_parts else np.empty(0, np.int64)
        num_empty = int(np.count_nonzero(lens == 0))
        out_lens = lens + (n_pre + n_post)
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(out_lens, out=offsets[1:])
        if n_pre == 0 and n_post == 0:
            return content, offsets, num_empty
        values = np.empty(int(offsets[-1]), dtype=self.dtype)
        if n_pre:
            values[offsets[:-1]] = self.bos_id
        if n_post:
            values[offsets[1:] - 1] = self.eos_id
        content_starts = np.zeros(len(lens), dtype=np.int64)
        np.cumsum(lens[:-1], out=content_starts[1:])
        dest = np.arange(len(content), dtype=np.int64) + np.repeat(offsets[:-1] + n_pre - content_starts, lens)
        values[dest] = content
        return values, offsets, num_empty
