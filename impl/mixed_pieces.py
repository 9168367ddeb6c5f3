"""Mixed pieces: where the rows of a mixed batch of ``PackedDataset`` sources come from, for one fill.

Why a module of its own: ``MixedDataset`` (:mod:`impl.mixed_dataset`) decides
which sample of which source is mixed sample ``i`` (the epoch's plan); this
module turns a batch of mixed samples into the pieces ``fill_batch``
(:mod:`impl.fill`) reads, every document id moved into ``TokenSource.concat``
of the sources, so one fill reads the whole batch however many sources it
touches. It also keeps the pieces of the last blocks of ``PIECE_BLOCK``
mixed samples, which a sequential reader's next batches are a slice of.

Worked example (two sources; mixed samples 0 and 1 of epoch 0, whose plan
names sample 0 of source 1 and sample 0 of source 0)::

    found = MixedPieces([web, code])
    pieces = found.batch(np.array([0, 0]), np.array([0, 1]), mixed.plan)
    pieces.source.tolist(), pieces.item.tolist()        # ([1, 0], [0, 0])
    fill_batch(pieces.counts, pieces.docs, pieces.starts, pieces.stops, packing, found.tokens, ...)
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from impl._arrays import distinct_ints, exclusive_cumsum, ranges
from impl.fill import TokenSource
from impl.mixing import MixPlan
from reference.partition import PADDING

__all__ = ["PIECE_BLOCK", "PIECE_BLOCKS_KEPT", "MixedPieces", "Pieces"]

_I64 = np.int64

PIECE_BLOCK = 1024
"""Mixed samples per cached block of pieces (``MixedPieces._from_block``)."""
PIECE_BLOCKS_KEPT = 2


class Pieces(NamedTuple):
    """Rows' pieces for ``fill_batch``: row r holds the next ``counts[r]``; ``docs`` in the concatenated sources."""

    counts: np.ndarray
    docs: np.ndarray
    reported: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    source: np.ndarray
    item: np.ndarray


class MixedPieces:
    """The pieces of mixed samples of ``sources`` (``PackedDataset``s packing alike), and their one token source.

    ``block`` is the number of mixed samples per cached block of pieces.
    Each call is given ``plan(epoch)``, the mixture's plan of an epoch, so
    this object holds no reference to the dataset; a pickled copy (a
    worker's) starts with no token source and no cached block.
    """

    def __init__(self, sources: Sequence[Any], block: int = PIECE_BLOCK) -> None:
        self.sources = sources
        self._tokens: TokenSource | None = None
        self._doc_base = np.zeros(len(sources), dtype=_I64)
        self._blocks: collections.OrderedDict[tuple[int, int], tuple[Pieces, np.ndarray]] = collections.OrderedDict()
        self._last_block: tuple[int, int] | None = None
        self._block = block

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokens"] = None
        state["_blocks"] = collections.OrderedDict()
        return state

    @property
    def tokens(self) -> TokenSource:
        """``TokenSource.concat`` of the sources' token sources (made on first use): what ``Pieces.docs`` index."""
        if self._tokens is None:
            parts = [src.source for src in self.sources]
            self._doc_base = exclusive_cumsum(np.array([p.num_documents for p in parts], dtype=_I64))[:-1]
            self._tokens = TokenSource.concat(parts)
        return self._tokens

    def _bases(self) -> np.ndarray:
        """Each source's first document in :attr:`tokens` (set when the token source is made)."""
        if self._tokens is None:
            self.tokens  # noqa: B018
        return self._doc_base

    def batch(self, epochs: np.ndarray, indices: np.ndarray, plan: Callable[[int], MixPlan]) -> Pieces:
        """The pieces of mixed samples ``indices`` of epochs ``epochs`` (``-1``: padding rows, no piece), row by row.

        A batch of one epoch with no padding row is a slice of a cached
        block when its reader is sequential, else found source by source;
        otherwise each epoch's rows are found apart and laid out in row order.
        """
        n = len(indices)
        real = indices != PADDING
        epoch_list = distinct_ints(epochs[real])
        if len(epoch_list) == 1 and real.all():
            pieces = self._from_block(epoch_list[0], indices, plan)
            return self.of(epoch_list[0], indices, plan) if pieces is None else pieces
        parts = [(np.flatnonzero(real & (epochs == e)), e) for e in epoch_list]
        found = [(rows, self.of(e, indices[rows], plan)) for rows, e in parts]
        counts = np.zeros(n, dtype=_I64)
        source = np.full(n, -1, dtype=_I64)
        item = np.full(n, -1, dtype=_I64)
        for rows, got in found:
            counts[rows], source[rows], item[rows] = got.counts, got.source, got.item
        ptr = exclusive_cumsum(counts)
        docs, reported, starts, stops = (np.empty(int(ptr[-1]), dtype=_I64) for _ in range(4))
        for rows, got in found:
            at = ranges(ptr[rows], got.counts)
            docs[at], reported[at], starts[at], stops[at] = got.docs, got.reported, got.starts, got.stops
        return Pieces(counts, docs, reported, starts, stops, source, item)

    def of(self, epoch: int, indices: np.ndarray, plan: Callable[[int], MixPlan]) -> Pieces:
        """The pieces of mixed samples ``indices`` of epoch ``epoch`` (all real), in ``indices``' order.

        Each source present finds its rows' pieces (``PackPlan.batch_pieces``
        and its order) once; the pieces are laid out row by row, each
        document id moved into ``TokenSource.concat`` of the sources.
        """
        base = self._bases()
        mixed = plan(epoch)
        source, item = mixed.source[indices], mixed.item[indices]
        found = []
        counts = np.zeros(len(indices), dtype=_I64)
        for s in distinct_ints(source):
            rows = np.flatnonzero(source == s)
            dataset = self.sources[s]
            c, pos, a, b = dataset.plan(epoch).batch_pieces(item[rows])
            ids = dataset.order(epoch)(pos) if len(pos) else pos
            counts[rows] = c
            found.append((rows, c, ids, a, b, s))
        if len(found) == 1:   # one source: its pieces are already in row order
            _, _, ids, starts, stops, s = found[0]
            docs, reported = ids + base[s], ids + self.sources[s].first_document
        else:
            ptr = exclusive_cumsum(counts)
            docs, reported, starts, stops = (np.empty(int(ptr[-1]), dtype=_I64) for _ in range(4))
            for rows, c, ids, a, b, s in found:
                at = ranges(ptr[rows], c)
                docs[at] = ids + base[s]
                reported[at], starts[at], stops[at] = ids + self.sources[s].first_document, a, b
        return Pieces(counts, docs, reported, starts, stops, source, item)

    def _from_block(self, epoch: int, indices: np.ndarray, plan: Callable[[int], MixPlan]) -> Pieces | None:
        """The pieces from cached blocks of ``PIECE_BLOCK`` mixed samples, or None (then the caller computes them).

        Why: a sequential reader (a loader on few ranks) asks for a short run
        of consecutive samples, the next batch the run after it. Finding the
        pieces source by source costs a fixed number of numpy calls per
        source present, for 8 rows as for 1024; a block's pieces, found once,
        serve each of its batches by one slice. A block is computed when a
        batch falls in one block and the previous batch fell in it or the
        one before (a sequential reader); isolated lookups and readers that
        skip blocks (many ranks, a resume's first batch) compute their own
        rows. At most ``PIECE_BLOCKS_KEPT`` blocks are kept, so memory stays
        O(block), never O(epoch).
        """
        size = self._block
        block = int(indices.min()) // size
        if int(indices.max()) // size != block:
            return None
        key = (epoch, block)
        last, self._last_block = self._last_block, key
        table = self._blocks.get(key)
        if table is None:
            if last not in (key, (epoch, block - 1)):
                return None
            start = block * size
            whole = self.of(epoch, np.arange(start, min(start + size, len(plan(epoch).source)), dtype=_I64), plan)
            table = (whole, exclusive_cumsum(whole.counts))
            self._blocks[key] = table
            while len(self._blocks) > PIECE_BLOCKS_KEPT:
                with contextlib.suppress(KeyError):
                    self._blocks.popitem(last=False)
        whole, ptr = table
        rows = indices - block * size
        counts = whole.counts[rows]
        at = ranges(ptr[rows], counts)
        return Pieces(counts, whole.docs[at], whole.reported[at], whole.starts[at], whole.stops[at],
                       whole.source[rows], whole.item[rows])
