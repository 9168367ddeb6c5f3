"""Epoch ordering: which document sits at each position of an epoch (ORD-*).

Why a specification: the order is what makes two loaders train on the same
thing. Exact resume, elastic rescaling and a vectorised re-implementation all
need the order to be a pure function of ``(file_sizes, config, epoch)``, with
no hidden state, no ``random`` module and no ``hash()``. Every random choice
here is a counter-based draw or a Feistel permutation from ``reference.rng``
whose key includes the epoch (ORD-11).

Documents are numbered ``0..N-1`` file by file in store order (ORD-1). The
four kinds trade randomness against locality (reading few files at a time):

- ``sequential``: store order (ORD-2);
- ``global``: one keyed bijection of ``[0, N)`` (ORD-3), random access;
- ``window``: shuffled file order, then a shuffle inside windows of ``w``
  consecutive positions (ORD-4, ORD-5), random access, locality bounded by w;
- ``buffer``: the streaming buffered shuffle of HF datasets / Forgather over
  the shuffled file order (ORD-6..ORD-8), sequential by nature (ORD-10).

Worked example (files of 3, 0 and 2 documents)::

    >>> sizes = [3, 0, 2]
    >>> epoch_order(sizes, OrderingConfig(), epoch=0)
    [0, 1, 2, 3, 4]
    >>> epoch_order(sizes, OrderingConfig(kind="global"), epoch=0)
    [4, 3, 2, 0, 1]
    >>> epoch_order(sizes, OrderingConfig(kind="window", window=2), epoch=0)
    [1, 0, 3, 2, 4]
    >>> order_at(sizes, OrderingConfig(kind="window", window=2), 0, 3)
    2
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from reference.errors import ConfigError, StateError, is_int, require
from reference.rng import MASK64, FeistelPermutation, Stream, below, derive_key, permutation, subkey

Kind = Literal["sequential", "global", "window", "buffer"]

KINDS = ("sequential", "global", "window", "buffer")
RANDOM_ACCESS_KINDS = ("sequential", "global", "window")


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderingConfig:
    """How one epoch's documents are ordered: the kind and its knobs (ORD-13).

    ``window`` is used only by ``kind="window"`` and ``buffer_size`` only by
    ``kind="buffer"``; both are validated whatever the kind, so a config that
    is wrong stays wrong when someone switches the kind.

    Clauses: ORD-13 (validation); the fields drive ORD-2..ORD-7.

    >>> OrderingConfig(kind="window", window=4).window
    4
    >>> OrderingConfig(kind="shuffle")
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: kind='shuffle' is not an ordering; choose one of sequential, global, window, buffer
    """

    kind: Kind = "sequential"
    seed: int = 0
    window: int = 1024
    buffer_size: int = 1000

    def __post_init__(self) -> None:
        require(self.kind in KINDS, ConfigError,
                f"kind={self.kind!r} is not an ordering; choose one of {', '.join(KINDS)}")
        require(is_int(self.seed) and 0 <= self.seed <= MASK64, ConfigError,
                f"seed={self.seed!r} must be an integer in [0, 2**64); pass a non-negative integer seed")
        require(is_int(self.window) and self.window >= 1, ConfigError,
                f"window={self.window!r} must be an integer >= 1 (positions per shuffle window); use 1 for no in-window shuffle")
        require(is_int(self.buffer_size) and self.buffer_size >= 0, ConfigError,
                f"buffer_size={self.buffer_size!r} must be an integer >= 0; use 0 or 1 for no buffered shuffle")


def _checked_sizes(file_sizes: Sequence[int]) -> list[int]:
    """The file sizes as a list, each a non-negative int (ORD-1, ORD-13)."""
    sizes = list(file_sizes)
    for i, size in enumerate(sizes):
        require(is_int(size) and size >= 0, ConfigError,
                f"file_sizes[{i}]={size!r} must be a non-negative integer (the number of documents in file {i})")
    return sizes


def _check_epoch(epoch: int) -> None:
    require(is_int(epoch) and 0 <= epoch <= MASK64, ConfigError,
            f"epoch={epoch!r} must be an integer in [0, 2**64); epochs count from 0")


def _file_starts(sizes: Sequence[int]) -> list[int]:
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts


def file_order(file_sizes: Sequence[int], config: OrderingConfig, epoch: int) -> list[int]:
    """The epoch's order of files: position j of the file order holds file ``perm(j)`` (ORD-4).

    Why shuffle files first: a loader that reads a few files at a time keeps
    its I/O local, and the window and buffer shuffles only need to mix
    documents that are close in this sequence.

    Clauses: ORD-4.

    >>> file_order([5, 5, 5, 5], OrderingConfig(kind="window"), epoch=0)
    [1, 3, 2, 0]
    """
    sizes = _checked_sizes(file_sizes)
    _check_epoch(epoch)
    return permutation(len(sizes), derive_key(config.seed, epoch, Stream.FILE_ORDER))


def file_order_stream(file_sizes: Sequence[int], config: OrderingConfig, epoch: int) -> list[int]:
    """Sequence S: the documents of the files in the epoch's file order, each file's documents in store order (ORD-4).

    S is the input of the window shuffle and the buffered shuffle; a
    document's position in S is its *file-order position*.

    Clauses: ORD-4.

    >>> file_order_stream([2, 1, 3], OrderingConfig(kind="buffer"), epoch=0)
    [2, 0, 1, 3, 4, 5]
    """
    sizes = _checked_sizes(file_sizes)
    starts = _file_starts(sizes)
    stream: list[int] = []
    for f in file_order(sizes, config, epoch):
        stream.extend(range(starts[f], starts[f] + sizes[f]))
    return stream


def _file_order_document(sizes: list[int], config: OrderingConfig, epoch: int, s: int) -> int:
    """S[s] without building S: walk the file order, O(files)."""
    starts = _file_starts(sizes)
    files = FeistelPermutation(len(sizes), derive_key(config.seed, epoch, Stream.FILE_ORDER))
    for j in range(len(sizes)):
        f = files(j)
        if s < sizes[f]:
            return starts[f] + s
        s -= sizes[f]
    raise AssertionError("file-order position beyond the corpus")  # unreachable: callers check 0 <= s < N


def _window_source(n: int, window: int, key: int, position: int) -> int:
    """The file-order position that output ``position`` takes under the window shuffle (ORD-5)."""
    k, j = divmod(position, window)
    start = k * window
    return start + FeistelPermutation(min(window, n - start), subkey(key, k))(j)


def window_shuffle(stream: Sequence[int], window: int, key: int) -> list[int]:
    """Shuffle inside windows of ``window`` consecutive positions, each with its own sub-key (ORD-5).

    Why: a document moves less than ``window`` positions, so a reader that
    prefetches one window of the file-order stream has everything it needs.
    Window k (positions ``k*w .. k*w+m-1``, ``m = min(w, N - k*w)``) is
    permuted by ``FeistelPermutation(m, subkey(key, k))``: output position
    ``k*w + j`` takes ``stream[k*w + perm(j)]``.

    Clauses: ORD-5.

    Worked example (w = 3, N = 7: windows of 3, 3 and 1 positions)::

        >>> out = window_shuffle(list("abcdefg"), 3, key=derive_key(0, 0, Stream.WINDOW))
        >>> "".join(out)
        'cabfdeg'
        >>> [sorted(out[i:i + 3]) for i in range(0, 7, 3)]
        [['a', 'b', 'c'], ['d', 'e', 'f'], ['g']]
    """
    require(is_int(window) and window >= 1, ConfigError, f"window={window!r} must be an integer >= 1")
    n = len(stream)
    return [stream[_window_source(n, window, key, p)] for p in range(n)]


def buffer_shuffle(stream: Sequence[int], buffer_size: int, key: int) -> list[int]:
    """The buffered (reservoir-style) shuffle of HF datasets / Forgather on counter draws (ORD-6, ORD-7).

    Why: it is what streaming loaders do when they cannot seek. Fill the
    buffer with the first ``b`` items; for the t-th item arriving after that
    (t = 0, 1, ...), pick slot ``j = below(key, t, b)``, emit ``buffer[j]``
    and put the new item in slot j. At the end of the input, flush: output
    i of the flush is ``buffer[perm(i)]`` with
    ``perm = FeistelPermutation(len(buffer), subkey(key, 0))``. With ``b <= 1``
    the stream passes through unchanged; with ``len(stream) <= b`` the output
    is the flush alone. An item never leaves before it arrives: output
    position p holds an item of input position at most ``p + b - 1`` (ORD-8).

    Clauses: ORD-6, ORD-7, ORD-8.

    Worked example (b = 2)::

        >>> key = derive_key(0, 0, Stream.BUFFER)
        >>> [below(key, t, 2) for t in range(3)]
        [1, 0, 1]
        >>> buffer_shuffle(list("abcde"), 2, key)   # [a b]: emit b; [a c]: emit a; [d c]: emit c; flush [d e]
        ['b', 'a', 'c', 'd', 'e']
        >>> buffer_shuffle(list("abc"), 1, key)
        ['a', 'b', 'c']
    """
    require(is_int(buffer_size) and buffer_size >= 0, ConfigError, f"buffer_size={buffer_size!r} must be an integer >= 0")
    if buffer_size <= 1:
        return list(stream)
    buffer = list(stream[:buffer_size])
    out = []
    for t, item in enumerate(stream[buffer_size:]):
        j = below(key, t, buffer_size)
        out.append(buffer[j])
        buffer[j] = item
    flush = FeistelPermutation(len(buffer), subkey(key, 0))
    out.extend(buffer[flush(i)] for i in range(len(buffer)))
    return out


def epoch_order(file_sizes: Sequence[int], config: OrderingConfig, epoch: int) -> list[int]:
    """The permutation of ``[0, N)`` for this epoch: position p -> global document id (ORD-1..ORD-7, ORD-11).

    Why one function for all kinds: every loader, whatever its kind, must
    visit each document of the epoch exactly once, and the conformance kit
    compares loaders against this list.

    Clauses: ORD-1, ORD-2, ORD-3, ORD-4, ORD-5, ORD-6, ORD-7, ORD-11.

    Worked example (one file of 6 documents, buffer of 3)::

        >>> epoch_order([6], OrderingConfig(kind="buffer", buffer_size=3), epoch=0)
        [1, 3, 4, 0, 5, 2]
        >>> epoch_order([6], OrderingConfig(kind="buffer", buffer_size=3), epoch=1)
        [2, 0, 4, 1, 3, 5]
        >>> epoch_order([], OrderingConfig(kind="global"), epoch=0)
        []
    """
    sizes = _checked_sizes(file_sizes)
    _check_epoch(epoch)
    n = sum(sizes)
    if config.kind == "sequential":
        return list(range(n))
    if config.kind == "global":
        return permutation(n, derive_key(config.seed, epoch, Stream.ORDER))
    stream = file_order_stream(sizes, config, epoch)
    if config.kind == "window":
        return window_shuffle(stream, config.window, derive_key(config.seed, epoch, Stream.WINDOW))
    return buffer_shuffle(stream, config.buffer_size, derive_key(config.seed, epoch, Stream.BUFFER))


def order_at(file_sizes: Sequence[int], config: OrderingConfig, epoch: int, position: int) -> int:
    """``epoch_order(file_sizes, config, epoch)[position]`` without computing the order (ORD-9, ORD-10).

    Why: O(1) resume and per-rank random access. Cost: O(rounds) for global,
    O(files + rounds) for window, O(1) for sequential. The buffered shuffle
    has no random access, so ``kind="buffer"`` raises ConfigError (ORD-10).

    Clauses: ORD-9, ORD-10.

    >>> order_at([3, 0, 2], OrderingConfig(kind="global"), 0, 0)
    4
    >>> order_at([3], OrderingConfig(kind="buffer"), 0, 0)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: order_at: kind='buffer' has no random access: the buffered shuffle is sequential by nature (its state is a position, and resume recomputes the epoch from its start, O(position)); use epoch_order or remaining_order, or kind='window' for random access with locality
    """
    require(config.kind in RANDOM_ACCESS_KINDS, ConfigError,
            f"order_at: kind={config.kind!r} has no random access: the buffered shuffle is sequential by nature "
            "(its state is a position, and resume recomputes the epoch from its start, O(position)); "
            "use epoch_order or remaining_order, or kind='window' for random access with locality")
    sizes = _checked_sizes(file_sizes)
    _check_epoch(epoch)
    n = sum(sizes)
    require(is_int(position) and 0 <= position < n, ConfigError,
            f"position={position!r} must be an integer in [0, N={n}) (the epoch has {n} documents)")
    if config.kind == "sequential":
        return position
    if config.kind == "global":
        return FeistelPermutation(n, derive_key(config.seed, epoch, Stream.ORDER))(position)
    s = _window_source(n, config.window, derive_key(config.seed, epoch, Stream.WINDOW), position)
    return _file_order_document(sizes, config, epoch, s)


def remaining_order(file_sizes: Sequence[int], config: OrderingConfig, epoch: int, consumed: int) -> list[int]:
    """The rest of the epoch after ``consumed`` documents were emitted: what a resumed loader yields (ORD-10).

    Why: the ordering's whole resume state is ``(epoch, consumed)``. Random
    access kinds compute each remaining position directly (ORD-9); the
    buffered shuffle replays the epoch from its start and skips ``consumed``
    outputs, which costs O(consumed) but needs no saved buffer contents.

    Clauses: ORD-9, ORD-10.

    >>> cfg = OrderingConfig(kind="buffer", buffer_size=3)
    >>> remaining_order([6], cfg, 0, 4) == epoch_order([6], cfg, 0)[4:]
    True
    >>> remaining_order([6], cfg, 0, 7)
    Traceback (most recent call last):
    ...
    reference.errors.StateError: consumed=7 must be an integer in [0, N=6]: a position inside epoch 0; the state belongs to other data or another epoch
    """
    sizes = _checked_sizes(file_sizes)
    _check_epoch(epoch)
    n = sum(sizes)
    require(is_int(consumed) and 0 <= consumed <= n, StateError,
            f"consumed={consumed!r} must be an integer in [0, N={n}]: a position inside epoch {epoch}; "
            "the state belongs to other data or another epoch")
    if config.kind == "buffer":
        return epoch_order(sizes, config, epoch)[consumed:]
    return [order_at(sizes, config, epoch, p) for p in range(consumed, n)]


def mean_displacement(order: Sequence[int]) -> float:
    """Mean of ``|order[p] - p|`` over positions, divided by N: 0 for no movement, about 1/3 for a uniform shuffle (ORD-12).

    Why: a loader-independent measure of how far a shuffle moves documents,
    usable on any third-party loader's output order. An empty order gives 0.0.

    Clauses: ORD-12.

    >>> mean_displacement([1, 0, 2])      # (1 + 1 + 0) / 3 / 3
    0.2222222222222222
    >>> mean_displacement([2, 1, 0])      # (2 + 0 + 2) / 3 / 3
    0.4444444444444444
    """
    n = len(order)
    if n == 0:
        return 0.0
    return sum(abs(doc - p) for p, doc in enumerate(order)) / n / n


def adjacency_preservation(order: Sequence[int]) -> float:
    """Fraction of consecutive output pairs that were neighbours in the input: ``|order[p+1] - order[p]| == 1`` (ORD-12).

    Why: 1.0 for sequential reading, about 2/N for a uniform shuffle; a high
    value means the model sees runs of neighbouring documents. Orders with
    fewer than two positions have no pairs and give 0.0.

    Clauses: ORD-12.

    >>> adjacency_preservation([0, 1, 3, 2])   # pairs (0,1) yes, (1,3) no, (3,2) yes
    0.6666666666666666
    >>> adjacency_preservation([0, 1, 2, 3])
    1.0
    """
    if len(order) < 2:
        return 0.0
    return sum(abs(b - a) == 1 for a, b in itertools.pairwise(order)) / (len(order) - 1)
