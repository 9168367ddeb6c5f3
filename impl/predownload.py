"""predownload: the files a reader's next samples read, scheduled for eviction and downloaded ahead (remote stores).

Why: a reader of a remote store (:class:`impl.remote.RemoteFiles`) would
otherwise wait on each token file's download at its first read, and its
bounded node cache would evict by recency. But the samples a reader (one
rank's DataLoader worker) reads next are a pure function of its position:
the loader's sampler hands each rank the step at ``consumed`` (PART-2), and
torch's DataLoader deals a pass's batches to its workers round robin, so a
worker that reads the step at ``consumed`` reads the steps at ``consumed +
k x workers x global batch`` next. A dataset that knows its plan knows the
files those samples read, in order: it says them to the access
(:meth:`~impl.remote.RemoteFiles.schedule`: eviction removes the file
needed furthest ahead) and downloads the ones past the current batch in the
background (:meth:`~impl.remote.RemoteFiles.predownload`). Samples are
unchanged: only when bytes arrive changes.

``predownload`` is MosaicML Streaming's name and meaning: the samples a
reader downloads ahead; ``None`` is its default, ``8 x`` the per-rank batch
size (``8`` samples for a dataset read one sample at a time without a
loader); ``0`` turns it off. A local store ignores it.

Worked example (2 ranks, batch 4, 2 workers: rank 1, worker 0 reads the
step at ``consumed=0``, samples 4..7)::

    >>> reader = Reader(partition=PartitionConfig(world_size=2, batch_size=4), group=1, workers=2)
    >>> upcoming(reader, [4, 5, 6, 7], total=40, count=6)      # its next steps: consumed 16, then 32
    [20, 21, 22, 23, 36, 37]
    >>> upcoming(None, [4, 5, 6, 7], total=40, count=3)        # no loader: a sequential reader
    [8, 9, 10]
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from impl.errors import ConfigError, is_int, require
from impl.partition import advance, group_batch
from reference.partition import PADDING, PartitionConfig

__all__ = ["DEFAULT_FACTOR", "Reader", "check_predownload", "check_readers", "mixture_reads", "remote_access",
           "run_ahead", "store_reads", "upcoming"]

DEFAULT_FACTOR = 8
"""``predownload=None`` downloads this many per-rank batches ahead (MosaicML Streaming's default, 8 x batch size)."""


@dataclass(frozen=True, kw_only=True)
class Reader:
    """Where one reader reads: its rank's partition, its data-parallel group, and the loader's worker count.

    ``build_dataloader`` gives it to the dataset (``set_reader``); each
    worker derives its own position from the keys of the batch it is
    handed, so the same ``Reader`` serves every worker.
    """

    partition: PartitionConfig
    group: int
    workers: int = 0


def check_predownload(value: Any) -> int | None:
    """``predownload`` as given, refused (ConfigError) unless ``None`` or an integer >= 0.

    >>> check_predownload(-1)
    Traceback (most recent call last):
    ...
    reference.errors.ConfigError: predownload=-1 must be None (8 x the batch size) or an integer >= 0 (samples downloaded ahead per reader; 0 turns it off)
    """
    require(value is None or (is_int(value) and value >= 0), ConfigError,
            f"predownload={value!r} must be None ({DEFAULT_FACTOR} x the batch size) or an integer >= 0 (samples "
            "downloaded ahead per reader; 0 turns it off)")
    return None if value is None else int(value)


def upcoming(reader: Reader | None, indices: Sequence[int], total: int, count: int) -> list[int]:
    """The next ``count`` sample indices (of the same epoch) the reader of batch ``indices`` reads after it.

    With a ``reader``: ``indices`` must be its group's whole step at some
    ``consumed`` (a partial or padded step is the epoch's last: nothing
    follows); the worker's next steps are ``workers`` steps apart. Without
    one: the samples after the batch's last, in order.
    """
    if count <= 0 or not len(indices):
        return []
    if reader is None:
        last = int(max(indices))
        return list(range(last + 1, min(last + 1 + count, total)))
    config = reader.partition
    size = config.batch_size
    consumed = int(indices[0]) - reader.group * size
    if consumed < 0 or consumed > total or list(indices) != group_batch(consumed, total, config, reader.group):
        return []   # not a step this reader's sampler deals: its future is unknown
    if len(indices) < size or PADDING in indices:
        return []
    out: list[int] = []
    while len(out) < count:
        for _ in range(max(1, reader.workers)):
            consumed = advance(consumed, total, config)
        batch = group_batch(consumed, total, config, reader.group)
        if not batch:
            break
        out.extend(i for i in batch if i != PADDING)
    return out[:count]


def remote_access(store: Any) -> tuple[Any, list[str], np.ndarray, int] | None:
    """``(access, file names, file document starts, first row)`` of a store read through a remote access, else None.

    A split (:class:`impl.splits.SplitStore`) reads its base store's files:
    its row ``r`` is the base's row ``first row + r``.
    """
    base, first = getattr(store, "base", None), 0
    if base is not None:
        first = int(store.rows.start)
    else:
        base = store
    access = getattr(base, "_files", None)
    if access is None or not callable(getattr(access, "predownload", None)):
        return None
    names = [rec.name for rec in base.file_records]
    return access, names, np.asarray(base.file_document_starts, dtype=np.int64), first


SampleReads = Callable[[int, np.ndarray], list[list[tuple[Any, str]]]]
"""``(epoch, sample indices) -> [[(access, file name), ...] per sample]``: the files each sample reads, in order."""

MEMO_SAMPLES = 4096
"""Samples whose files a reader remembers (consecutive batches' look-aheads overlap: each sample is looked up once)."""


def run_ahead(sample_reads: SampleReads, memo: collections.OrderedDict[tuple[int, int], list[tuple[Any, str]]],
              reader: Reader | None, predownload: int | None, epoch: int, indices: np.ndarray, total: int) -> None:
    """Schedule the files of batch ``indices`` and of the reader's next ``predownload`` samples, and download ahead.

    Each access gets its own files: :meth:`~impl.remote.RemoteFiles.schedule`
    with all of them in read order (the batch's first), and
    :meth:`~impl.remote.RemoteFiles.predownload` with those of the samples
    after the batch. ``memo`` keeps the files of the samples looked up
    last, so a sample is looked up once, not once per batch that sees it
    ahead; a miss looks up twice ``predownload`` samples, so about one call
    in ``predownload`` looks any up.
    """
    real = [int(i) for i in indices if i != PADDING]
    size = reader.partition.batch_size if reader is not None else max(1, len(indices))
    count = DEFAULT_FACTOR * size if predownload is None else predownload
    if not real or count == 0:
        return
    ahead = upcoming(reader, [int(i) for i in indices], total, count)
    if any((epoch, i) not in memo for i in real + ahead):   # look up twice as far: the next calls find theirs here
        further = upcoming(reader, [int(i) for i in indices], total, 2 * count)
        missing = [i for i in dict.fromkeys(real + further) if (epoch, i) not in memo]
        for i, found in zip(missing, sample_reads(epoch, np.asarray(missing, dtype=np.int64))):
            memo[(epoch, i)] = found
        while len(memo) > max(MEMO_SAMPLES, 2 * (len(real) + len(further))):
            memo.popitem(last=False)
    accesses: dict[int, Any] = {}
    order: dict[int, list[str]] = {}
    fetch: dict[int, list[str]] = {}
    for part, samples in ((0, real), (1, ahead)):
        for i in samples:
            for access, name in memo[(epoch, i)]:
                key = id(access)
                accesses[key] = access
                names = order.setdefault(key, [])
                if not names or names[-1] != name:
                    names.append(name)
                wanted = fetch.setdefault(key, [])
                if part and name not in wanted:
                    wanted.append(name)
    for key, access in accesses.items():
        access.schedule(order[key])
        access.predownload(fetch.get(key, []))


def store_reads(store: Any) -> Callable[[np.ndarray], list[tuple[Any, str]]] | None:
    """``docs -> [(access, name), ...]``: the file each of a store's rows ``docs`` sits in, for a remote store; else None."""
    found = remote_access(store)
    if found is None:
        return None
    access, names, starts, first = found

    def reads(docs: np.ndarray) -> list[tuple[Any, str]]:
        files = np.searchsorted(starts, np.asarray(docs, dtype=np.int64) + first, side="right") - 1
        return [(access, names[f]) for f in files.tolist()]

    return reads


def check_readers(stores: Sequence[Any], workers: int) -> None:
    """Refuse a ``cache_limit`` too small for every reader of the node: its ranks times the loader's workers.

    ``build_dataloader`` calls this (through the dataset's
    ``check_readers``) once it knows ``num_workers``: each worker is a
    reader mapping its own files, and ``LOCAL_WORLD_SIZE`` ranks of the
    node share the cache (:meth:`impl.remote.RemoteFiles.check_room`).
    """
    from impl.remote import node_ranks

    ranks = node_ranks()
    readers = ranks * max(1, workers)
    why = (f"LOCAL_WORLD_SIZE={ranks} rank{'s' if ranks > 1 else ''} x "
           f"{max(1, workers)} {'DataLoader workers' if workers else 'reader in the training process'}")
    for store in stores:
        found = remote_access(store)
        if found is None:
            continue
        access = found[0]
        base = getattr(store, "base", store)
        access.check_room({rec.name: rec.size for rec in base.file_records}, readers=readers, why=why)


def mixture_reads(mixed: Any, epoch: int, indices: np.ndarray) -> list[list[tuple[Any, str]]]:
    """``[[(access, file name), ...] per sample]``: the files each of a mixture's samples ``indices`` reads, in order.

    Mixed sample ``i`` is sample ``plan.item[i]`` of source ``plan.source[i]``
    (MIX-13), so its files are that source's (``sample_reads``); sources
    that are not remote ``PackedDataset`` objects contribute none.
    """
    rows: list[list[tuple[Any, str]]] = [[] for _ in range(len(indices))]
    if not len(indices):
        return rows
    plan = mixed.plan(epoch)
    source, item = plan.source[indices], plan.item[indices]
    for s in np.unique(source).tolist():
        src = mixed.sources[s]
        if getattr(src, "remote", False):
            mine = np.flatnonzero(source == s)
            for r, got in zip(mine.tolist(), src.sample_reads(epoch, item[mine])):
                rows[r] = got
    return rows
