"""A streaming dataset's rows as prepared token arrays: the tokenizer resolved and parsed once per process.

Why apart from :mod:`impl.streaming`: what a row's tokens are (the
tokenizer's ids, then BOS / EOS as PACK-1 adds them) and how a process
holds its tokenizer are one concern, shared by the dataset, its maps
(:mod:`impl.stream_maps`) and mixtures (:mod:`impl.stream_mixing`). The
dataset keeps the tokenizer's JSON (a string that pickles cheaply under
``spawn``); each process builds its ``tokenizers.Tokenizer`` on first use
(:func:`batch_encoder`), so a forked worker never inherits a live thread
pool, and a DataLoader worker sizes that pool to its share of the cores.

Worked example: with EOS 0 and BOS off, a unit of rows ``["a b", None]``
(row 1 skipped, STREAM-17) starting at global row 10 gives
``tokens(10) == [ids of "a b"..., 0]`` and ``tokens(11) == []``; the unit is
encoded once, in one ``encode_batch_fast`` call.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from impl.encoding import resolve_tokenizer
from reference.packing import PackingConfig

__all__ = ["RowTokens", "batch_encoder", "resolve_once"]

_RESOLVED: dict[Any, Any] = {}


def resolve_once(spec: Any) -> Any:
    """``impl.encoding.resolve_tokenizer``, remembered for a path whose files are unchanged (it costs ~1 s a call)."""
    if not isinstance(spec, (str, os.PathLike)):
        return resolve_tokenizer(spec)
    path = os.path.abspath(os.fspath(spec))
    try:
        names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
        key = (path, tuple((n, os.stat(os.path.join(path, n) if n else path).st_mtime_ns) for n in names))
    except OSError:
        return resolve_tokenizer(spec)
    if key not in _RESOLVED:
        _RESOLVED.clear()
        _RESOLVED[key] = resolve_tokenizer(spec)
    return _RESOLVED[key]


#: The last tokenizer built in this process, by its JSON: every pass (each epoch, each resume) reuses it.
_ENCODER: dict[str, Any] = {}


def _worker_threads() -> int | None:
    """In a DataLoader worker, its share of this process's cores for the tokenizer's thread pool; else None.

    Why: ``tokenizers`` encodes a batch on a thread pool as wide as the
    machine, and every worker builds its own, so K workers run K pools of
    all the cores each and mostly wait on each other. Each worker takes
    ``cores // K`` threads (at least 1): 16 cores and 8 workers give 2 each.
    """
    info = get_worker_info()
    if info is None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, info.num_workers))


def batch_encoder(tok_json: str) -> Any:
    """A batch encoder for ``tok_json``, parsed once per process rather than once per pass.

    In a DataLoader worker the tokenizer's pool is sized before its first use
    (``RAYON_NUM_THREADS`` = :func:`_worker_threads`), unless the user set it;
    also when a forked worker inherits the parent's encoder, whose pool starts
    in the worker at its first encode.
    """
    threads = _worker_threads()
    if threads is not None:
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    encode = _ENCODER.get(tok_json)
    if encode is None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tok_json)
        tok.no_truncation()
        tok.no_padding()
        encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        _ENCODER.clear()
        _ENCODER[tok_json] = encode
    return encode


class RowTokens:
    """Prepared token arrays of rows by global row number, a unit encoded per read (one process's cache).

    ``read_texts(u, census=...)`` gives unit ``u``'s rows (the dataset's
    :meth:`~impl.streaming.StreamingDataset.unit_texts`); ``starts[u]`` is
    unit ``u``'s first global row; ``keep`` rows stay cached after use.
    """

    def __init__(self, tok_json: str, packing: PackingConfig, starts: np.ndarray,
                 read_texts: Callable[..., list[str | None]], *, keep: int) -> None:
        self.tok_json, self.packing, self.starts, self.read_texts, self.keep = tok_json, packing, starts, read_texts, keep
        self._encode: Any = None
        self.units: dict[int, dict[int, np.ndarray]] = {}
        self.rows: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def encode(self, texts: Sequence[str | None]) -> list[list[int] | None]:
        """Token ids of each text, a batch per call; None stays None (a row ``on_error="skip"`` dropped, STREAM-17)."""
        if self._encode is None:
            self._encode = batch_encoder(self.tok_json)
        kept = [t for t in texts if t is not None]
        encoded = iter([e.ids for e in self._encode(kept, add_special_tokens=False)] if kept else [])
        return [None if t is None else next(encoded) for t in texts]

    def prepare(self, ids: list[int] | None) -> np.ndarray:
        """A document's tokens with BOS / EOS as the packing config adds them (PACK-1); a skipped row is empty."""
        if ids is None:      # a skipped row holds no document, whatever BOS / EOS (STREAM-17)
            return np.empty(0, dtype=np.int64)
        p = self.packing
        out = ([p.bos_id] if p.add_bos else []) + ids + ([p.eos_id] if p.add_eos else [])
        return np.array(out, dtype=np.int64)

    def unit_texts(self, u: int, *, census: bool = False) -> list[str | None]:
        return self.read_texts(u, census=census)

    def __call__(self, g: int) -> np.ndarray:
        arr = self.rows.get(g)
        if arr is not None:
            self.rows.move_to_end(g)
            return arr
        u = int(np.searchsorted(self.starts, g, side="right")) - 1
        first = int(self.starts[u])
        unit = self.units.get(u)
        if unit is None:
            ids = self.encode(self.unit_texts(u))
            unit = self.units[u] = {first + r: self.prepare(t) for r, t in enumerate(ids)}
        if g in unit:
            arr = unit.pop(g)
            if not unit:
                del self.units[u]
        else:
            # Row g was handed out before and has left the row cache (a long row a lane is still packing, while
            # other lanes read many short ones): read its unit again and keep only that row.
            arr = self.prepare(self.encode(self.unit_texts(u))[g - first])
        self.rows[g] = arr
        while len(self.rows) > self.keep:
            self.rows.popitem(last=False)
        return arr
