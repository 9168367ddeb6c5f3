"""Array helpers of the hot paths: ``distinct`` (``np.unique`` without its import) and ``demand_zero`` memory.

``distinct``: ``np.unique`` for the hot paths, without its first-call import of ``numpy.ma``.

Why: ``np.unique`` imports ``numpy.ma`` the first time it runs in a process,
so a freshly spawned rank would pay that import inside its first batch,
several times the rest of a resume (benchmarks/README.md, "Design figures").
A sort and a comparison give the same distinct values and import nothing.

>>> distinct(np.array([3, 1, 3, 2])).tolist()
[1, 2, 3]
>>> distinct(np.zeros(0, dtype=np.int64)).tolist()
[]
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Sequence

import numpy as np

__all__ = ["demand_zero", "demand_zero_rows", "distinct", "distinct_ints", "exclusive_cumsum", "groups", "ranges"]


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-d array, ascending (``np.unique(values)``)."""
    flat = np.sort(np.asarray(values).reshape(-1))
    if len(flat) < 2:
        return flat
    keep = np.empty(len(flat), dtype=bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    return flat[keep]


def distinct_ints(values: np.ndarray) -> list[int]:
    """The distinct values, ascending, as ints, without a sort when all are equal (a batch of one epoch or file).

    >>> distinct_ints(np.array([2, 2, 2])), distinct_ints(np.array([3, 1, 3]))
    ([2], [1, 3])
    """
    if not len(values):
        return []
    first = int(values[0])
    if not (values != first).any():
        return [first]
    return [int(v) for v in distinct(values)]


def demand_zero(nbytes: int) -> mmap.mmap:
    """``nbytes`` of zeros whose 4 KiB pages the kernel zeroes as they are first touched (an anonymous mapping).

    Why not ``np.zeros``/``bytearray``: those zero every byte up front (and
    numpy advises allocations of 4 MB and more into 2 MiB huge pages, each
    zeroed whole on its first write), while a fresh resume's first batch
    touches a few dozen entries of tables sized by the whole store: here each
    costs one page. Private: a forked process (a DataLoader worker) writes
    its own copy, as it would of a numpy array. At least one byte is mapped
    (an empty mapping is refused).

    >>> buf = demand_zero(3)
    >>> buf[1] = 7
    >>> bytes(buf[:3])
    b'\\x00\\x07\\x00'
    """
    buf = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return buf


def demand_zero_rows(n: int) -> np.ndarray:
    """An ``n x 2`` int64 table of zeros whose pages are zeroed by the kernel as they are first touched.

    Why not ``np.zeros``/``np.empty``: numpy advises allocations of 4 MB and
    more into 2 MiB huge pages, each zeroed whole on its first write, so the
    few dozen scattered rows a fresh resume's first batch writes would each
    zero a whole huge page; here each costs one 4 KiB page.

    >>> t = demand_zero_rows(3)
    >>> t[1] = (5, 7)
    >>> t.tolist()
    [[0, 0], [5, 7], [0, 0]]
    """
    if n == 0:
        return np.zeros((0, 2), dtype=np.int64)
    return np.frombuffer(demand_zero(n * 16), dtype=np.int64).reshape(n, 2)


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """``[0, v0, v0 + v1, ...]``: length ``len(values) + 1``, int64."""
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` in three numpy calls (lengths >= 0).

    >>> ranges(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
    [5, 6, 9, 10, 11]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    out = np.arange(total, dtype=np.int64)
    if total:
        out += np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return out


def groups(files: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """``(value, selection)`` per distinct value of ``files`` (a non-empty int array); selection None when all share it.

    >>> [(f, None if sel is None else sel.tolist()) for f, sel in groups(np.array([2, 0, 2]))]
    [(0, [1]), (2, [0, 2])]
    """
    first = int(files[0])
    if not (files != first).any():
        return [(first, None)]
    order = np.argsort(files, kind="stable")
    ordered = files[order]
    bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(files)]
    return [(int(ordered[a]), order[a:b]) for a, b in itertools.pairwise(bounds)]


#: :func:`copy_runs` callers (``TokenStore.read_runs``, ``TokenSource.gather``) copy one slice per run when runs
#: average at least this many tokens, else fancy-index every token at once (faster for many tiny runs).
SLICE_MIN_WIDTH = 16


def copy_runs(values: Sequence[np.ndarray], files: np.ndarray, starts: np.ndarray, stops: np.ndarray,
              by_file: list[tuple[int, np.ndarray | None]], out: np.ndarray, dest: np.ndarray,
              tail: np.ndarray | None, *, slices: bool) -> np.ndarray:
    """Copy ``values[files[r]][starts[r]:stops[r]]`` to ``out[dest[r]:]`` (a ``dest`` past ``out``: into ``tail``).

    ``by_file`` is :func:`groups` of ``files`` (not read with ``slices``: pass ``[]``); ``slices`` copies one
    slice per run, else one fancy index per file (faster for many tiny runs).

    >>> out, tail = np.zeros(3, np.int64), np.zeros(1, np.int64)
    >>> f, a, b, d = np.array([0, 1]), np.array([1, 0]), np.array([3, 2]), np.array([0, 2])
    >>> copy_runs([np.arange(5), np.arange(10, 15)], f, a, b, groups(f), out, d, tail, slices=False).tolist(), tail
    ([1, 2, 10], array([11]))
    """
    T = len(out)
    widths = stops - starts
    if slices:
        for q, x0, x1, to in zip(files.tolist(), starts.tolist(), stops.tolist(), dest.tolist()):
            part = values[q]
            if to < T:
                out[to:to + x1 - x0] = part[x0:x1]
            elif tail is not None:
                tail[to - T:to - T + x1 - x0] = part[x0:x1]
        return out
    into = ranges(dest, widths)
    got = np.empty(len(into), dtype=out.dtype)
    for f, sel in by_file:
        part = values[f]
        if sel is None:
            got[:] = part[ranges(starts, widths)]
        else:
            got[ranges(exclusive_cumsum(widths)[sel], widths[sel])] = part[ranges(starts[sel], widths[sel])]
    front = into < T
    if front.all():
        out[into] = got
    else:
        out[into[front]] = got[front]
        if tail is not None:
            tail[into[~front] - T] = got[~front]
    return out
