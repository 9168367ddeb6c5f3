"""Bin packing: which whole documents (or their chunks) share a sample, by one of three rules (PACK-15 .. PACK-17).

Why a module of its own: a packer is a pure function from item widths and
a capacity to bins of item indices; it knows nothing of tokens, documents or
configs. ``reference.packing`` measures each piece's width, asks the packer
of its ``mode`` (:data:`PACKERS`) for the bins, and makes the plan. Bins come
in creation order and the items of a bin in insertion order (PACK-14); the
order in which a shuffled plan emits them is ``reference.packing``'s
(PACK-22). impl's counterpart is ``impl.bins``.

Worked example (capacity 4, widths 3, 4, 2, 1)::

    >>> {mode: packer([3, 4, 2, 1], 4) for mode, packer in PACKERS.items()}
    {'greedy': [[0], [1], [2, 3]], 'first_fit': [[0, 3], [1], [2]], 'best_fit': [[1], [0, 3], [2]]}
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol


class Packer(Protocol):
    """A bin-packing rule: item widths and a capacity in, bins of item indices out.

    Bins come in creation order, the items of a bin in insertion order (PACK-14).
    """

    def __call__(self, widths: Sequence[int], capacity: int) -> list[list[int]]: ...


def greedy_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Next-fit: one open bin, closed as soon as the next item does not fit (PACK-15).

    Why: it is what streaming packers do (Forgather's greedy), needs O(1)
    memory, and keeps the items in arrival order across bins.

    >>> greedy_bins([3, 4, 2, 1], 4)
    [[0], [1], [2, 3]]
    """
    bins: list[list[int]] = []
    room = 0
    for item, width in enumerate(widths):
        if not bins or width > room:
            bins.append([])
            room = capacity
        bins[-1].append(item)
        room -= width
    return bins


class _LowestRoomyBin:
    """A max-tree over bin rooms: the lowest-index bin with room >= need in O(log bins).

    Slots of bins not yet opened hold -1, so no width (always >= 1) finds them.
    """

    __slots__ = ("size", "tree")

    def __init__(self, slots: int) -> None:
        self.size = 1 << max(0, slots - 1).bit_length()
        self.tree = [-1] * (2 * self.size)

    def set(self, slot: int, room: int) -> None:
        node = slot + self.size
        self.tree[node] = room
        node //= 2
        while node:
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])
            node //= 2

    def find(self, need: int) -> int | None:
        if self.tree[1] < need:
            return None
        node = 1
        while node < self.size:
            node = 2 * node if self.tree[2 * node] >= need else 2 * node + 1
        return node - self.size


def first_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit: each item, in arrival order, into the lowest-index bin with room, else a new bin (PACK-16).

    The search is a max-tree over rooms (O(log bins)), equivalent to scanning
    the bins from index 0 and taking the first whose room is at least the width.

    >>> first_fit_bins([3, 4, 2, 1], 4)
    [[0, 3], [1], [2]]
    """
    bins: list[list[int]] = []
    rooms = _LowestRoomyBin(len(widths))
    room_of: list[int] = []
    for item, width in enumerate(widths):
        target = rooms.find(width)
        if target is None:
            target = len(bins)
            bins.append([])
            room_of.append(capacity)
        bins[target].append(item)
        room_of[target] -= width
        rooms.set(target, room_of[target])
    return bins


def best_fit_bins(widths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: widest item first, each into the tightest bin that fits (PACK-17).

    Items go in order of ``(-width, arrival index)``; an item goes to the bin
    whose room is the smallest that is still at least its width, ties to the
    lowest bin index; a new bin only when no bin fits. The open bins are kept
    as a sorted list of ``(room, bin index)``, so the first entry not below
    ``(width, -1)`` is exactly that bin.

    >>> best_fit_bins([3, 4, 2, 1], 4)
    [[1], [0, 3], [2]]
    >>> best_fit_bins([6, 4, 4, 1], 9)     # 1 goes to the bin with room 1, not the one with room 3
    [[0], [1, 2, 3]]
    """
    order = sorted(range(len(widths)), key=lambda item: (-widths[item], item))
    bins: list[list[int]] = []
    rooms: list[tuple[int, int]] = []
    for item in order:
        width = widths[item]
        at = bisect.bisect_left(rooms, (width, -1))
        if at == len(rooms):
            target, room = len(bins), capacity
            bins.append([])
        else:
            room, target = rooms.pop(at)
        bins[target].append(item)
        bisect.insort(rooms, (room - width, target))
    return bins


PACKERS: dict[str, Packer] = {"greedy": greedy_bins, "first_fit": first_fit_bins, "best_fit": best_fit_bins}
