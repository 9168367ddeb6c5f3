"""Bin packing for impl's plan: the three rules of ``reference.bins``, written for speed (PACK-15 .. PACK-17).

Conforms to PACK-15 .. PACK-17 of docs/SEMANTICS.md: each packer returns
exactly the bins ``reference.bins`` returns for the same widths and capacity
(``conformance/impl_tests/test_packing.py`` compares them). Why apart from
``impl.packing``: a packer is a pure function of widths and a capacity; the
plan (``impl.packing``) measures the pieces, calls :data:`PACKERS` by mode and
lays the bins out as arrays.

Worked example (capacity 4, widths 3, 4, 2, 1)::

    >>> {mode: packer([3, 4, 2, 1], 4) for mode, packer in PACKERS.items()}
    {'greedy': [[0], [1], [2, 3]], 'first_fit': [[0, 3], [1], [2]], 'best_fit': [[1], [0, 3], [2]]}
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np


def greedy_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Next-fit (PACK-15): ``reference.bins.greedy_bins``.

    >>> greedy_bins([3, 4, 2, 1], 4)
    [[0], [1], [2, 3]]
    """
    bins: list[list[int]] = []
    room = 0
    current: list[int] = []
    for item, width in enumerate(widths):
        if not bins or width > room:
            current = []
            bins.append(current)
            room = capacity
        current.append(item)
        room -= width
    return bins


def first_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit (PACK-16): ``reference.bins.first_fit_bins`` with the max-tree inlined.

    The tree holds each bin's room (-1 for bins not yet opened); a lookup
    descends to the lowest leaf with room >= width, an update climbs only while
    a parent's maximum changes.

    >>> first_fit_bins([3, 4, 2, 1], 4)
    [[0, 3], [1], [2]]
    """
    size = 1 << max(0, len(widths) - 1).bit_length()
    tree = [-1] * (2 * size)
    bins: list[list[int]] = []
    for item, width in enumerate(widths):
        if tree[1] >= width:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= width else 2 * node + 1
            bins[node - size].append(item)
            tree[node] -= width
        else:
            node = len(bins) + size
            bins.append([item])
            tree[node] = capacity - width
        node >>= 1
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            best = max(right, left)
            if tree[node] == best:
                break
            tree[node] = best
            node >>= 1
    return bins


def best_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing (PACK-17): ``reference.bins.best_fit_bins``.

    Open bins are one sorted list of ints ``room << 32 | bin`` (the
    reference's ``(room, bin)`` tuples, cheaper to compare); a full bin
    (room 0) can take no item (widths >= 1) and leaves the list.

    >>> best_fit_bins([3, 4, 2, 1], 4)
    [[1], [0, 3], [2]]
    >>> best_fit_bins([6, 4, 4, 1], 9)
    [[0], [1, 2, 3]]
    """
    w = np.asarray(widths, dtype=np.int64)
    order = np.argsort(-w, kind="stable").tolist()
    bins: list[list[int]] = []
    rooms: list[int] = []
    for item in order:
        width = widths[item]
        at = bisect.bisect_left(rooms, width << 32)
        if at == len(rooms):
            target, room = len(bins), capacity
            bins.append([item])
        else:
            key = rooms.pop(at)
            target, room = key & 0xFFFFFFFF, key >> 32
            bins[target].append(item)
        room -= width
        if room:
            bisect.insort(rooms, room << 32 | target)
    return bins


PACKERS: dict[str, Callable[[Sequence[int], int], list[list[int]]]] = {
    "greedy": greedy_bins, "first_fit": first_fit_bins, "best_fit": best_fit_bins}
