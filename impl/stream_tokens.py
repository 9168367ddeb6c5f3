"""A streaming dataset's rows as prepared token arrays: the tokenizer resolved and parsed once per process.

Why apart from :mod:`impl.streaming`: what a row's tokens are (the
tokenizer's ids, then BOS / EOS as PACK-1 adds them) and how a process
holds its tokenizer are one concern, shared by the dataset, its maps
(:mod:`impl.stream_maps`) and mixtures (:mod:`impl.stream_mixing`). The
dataset keeps the tokenizer's JSON (a string that pickles cheaply under
``spawn``); each process builds its ``tokenizers.Tokenizer`` on first use
(:func:`batch_encoder`), so a forked worker never inherits a live thread
pool, and a DataLoader worker sizes that pool to its share of the cores.

Why a unit is encoded ahead, on a thread of its own: ``encode_batch_fast``
releases the GIL, so while the packing (Python) works through a lane's unit,
the lane's next unit is being encoded; the encoder's thread pool would
otherwise idle during the packing and at the tail of each unit's batch.
Only encoding moves off the calling thread: a unit's file is read there
(:class:`~impl.files.FileAccess` is used from one thread), and a unit read
ahead is counted, reported (skipped lines) and its read error raised only
when a lane needs it, so the pass, its counts and its errors are those of a
pass that reads each unit when it needs it.

Worked example: with EOS 0 and BOS off, a unit of rows ``["a b", None]``
(row 1 skipped, STREAM-17) starting at global row 10 gives
``tokens(10) == [ids of "a b"..., 0]`` and ``tokens(11) == []``; the unit is
encoded once, in one ``encode_batch_fast`` call.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
    With ``read`` (the same rows, uncounted) and ``account`` (count a unit as
    read, given its rows), units of the lanes :meth:`follow` names are read
    and encoded one ahead of need.
    """

    def __init__(self, tok_json: str, packing: PackingConfig, starts: np.ndarray,
                 read_texts: Callable[..., list[str | None]], *, keep: int,
                 read: Callable[[int], list[str | None]] | None = None,
                 account: Callable[[int, list[str | None]], None] | None = None) -> None:
        self.tok_json, self.packing, self.starts, self.read_texts, self.keep = tok_json, packing, starts, read_texts, keep
        self.read, self.account = read, account
        self._encode: Any = None
        self.units: dict[int, dict[int, np.ndarray]] = {}
        self.rows: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        #: Units read ahead: their rows (or the read's error, raised when the unit is needed) and their encoding.
        self.ahead: dict[int, tuple[list[str | None] | Exception, Future[dict[int, np.ndarray]] | None]] = {}
        self.next_unit: dict[int, int] = {}
        self._pool: ThreadPoolExecutor | None = None

    def follow(self, rows: np.ndarray) -> None:
        """Learn a lane's coming rows (global numbers, in read order): its units are then encoded one ahead.

        ``rows`` of units ``[4, 4, 6, 4, 8]`` make the lane need 4, then 6,
        then 8: unit 4 starts encoding now, 6 when 4 is first needed, and so on.
        """
        if self.read is None or self.account is None or not len(rows):
            return
        units = np.searchsorted(self.starts, rows, side="right") - 1
        _, first = np.unique(units, return_index=True)
        order: list[int] = units[np.sort(first)].tolist()
        self.next_unit.update(itertools.pairwise(order))
        self._ahead(order[0])

    def _ahead(self, u: int) -> None:
        """Read unit ``u`` now and encode it on the encoding thread, unless it is held or on its way."""
        if u in self.ahead or u in self.units or self.read is None:
            return
        try:
            texts = self.read(u)
        except Exception as exc:  # noqa: BLE001 - raised when a lane needs the unit, as without reading ahead
            self.ahead[u] = (exc, None)
            return
        self._encoder()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadspec-encode")
        self.ahead[u] = (texts, self._pool.submit(self._prepared, int(self.starts[u]), texts))

    def _encoder(self) -> Any:
        if self._encode is None:
            self._encode = batch_encoder(self.tok_json)
        return self._encode

    def _prepared(self, first: int, texts: Sequence[str | None]) -> dict[int, np.ndarray]:
        """A unit's prepared rows by global row number, ``first`` being its first row's."""
        return {first + r: self.prepare(t) for r, t in enumerate(self.encode(texts))}

    def _unit(self, u: int) -> dict[int, np.ndarray]:
        """Unit ``u``'s prepared rows, counted as read; the lane's next unit starts encoding first."""
        nxt = self.next_unit.get(u)
        if nxt is not None:
            self._ahead(nxt)
        held = self.ahead.pop(u, None)
        if held is None:
            return self._prepared(int(self.starts[u]), self.unit_texts(u))
        texts, encoding = held
        assert self.account is not None
        if isinstance(texts, Exception):
            self.account(u, [])
            raise texts
        self.account(u, texts)
        assert encoding is not None
        return encoding.result()

    def encode(self, texts: Sequence[str | None]) -> list[list[int] | None]:
        """Token ids of each text, a batch per call; None stays None (a row ``on_error="skip"`` dropped, STREAM-17)."""
        encode = self._encoder()
        kept = [t for t in texts if t is not None]
        encoded = iter([e.ids for e in encode(kept, add_special_tokens=False)] if kept else [])
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
            unit = self.units[u] = self._unit(u)
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
