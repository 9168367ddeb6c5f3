"""StreamingLoader: a streaming dataset's batches handed to the training loop in STREAM-11 order, with the exact state.

Conforms to STREAM-11 .. STREAM-15 (the order and state rules are the
dataset's, ``impl.streaming``); built by :func:`impl.loader.build_dataloader`
when its dataset is a :class:`~impl.streaming.StreamingDataset`.

Why a loader of its own: torch's DataLoader takes batches from its workers
round-robin and ahead of the training loop. Each streaming batch carries its
worker and its lanes' snapshots, and each worker ends with a marker; this loader hands batches out in
order (holding a worker's batch that arrived early) and applies a batch's
snapshots when it hands the batch out, so ``state_dict()`` never counts a
prefetched batch (as RES-6).

>>> loader = build_dataloader(ds, batch_size=8, num_workers=2)       # doctest: +SKIP
>>> batch = next(iter(loader)); batch["input_ids"].shape              # doctest: +SKIP
torch.Size([8, 2048])
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Generator, Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from impl.errors import ConfigError, is_int, require
from impl.partition import distributed_topology
from impl.stream_lanes import from_pipe
from impl.stream_mixing import StreamMixture
from impl.streaming import SKIPPED_KEY, STATE_KEY, StreamingDataset

__all__ = ["StreamingLoader"]


def _identity(batch: Any) -> Any:
    return batch


class StreamingLoader:
    """One rank's loader over a :class:`StreamingDataset` or a :class:`~impl.stream_mixing.StreamMixture` (its state)."""

    def __init__(self, dataset: StreamingDataset | StreamMixture, *, batch_size: int, rank: int | None = None,
                 world_size: int | None = None, num_workers: int = 0, multiprocessing_context: Any = None,
                 **dataloader_kwargs: Any) -> None:
        require(is_int(batch_size) and batch_size >= 1, ConfigError, f"batch_size={batch_size!r} must be >= 1")
        require(not dataloader_kwargs.get("persistent_workers"), ConfigError,
                "persistent_workers=True: a streaming pass starts its workers from the lanes' state at iter(); "
                "leave persistent_workers=False")
        rank, world_size = distributed_topology(rank, world_size)
        dataset.batch_size = batch_size
        dataset.set_topology(rank, world_size, num_workers)
        self.dataset = dataset
        self.num_workers = num_workers
        self._context = multiprocessing_context
        self._kwargs = {k: v for k, v in dataloader_kwargs.items() if k != "persistent_workers"}
        # Held weakly, as ElasticLoader does: an iterator dropped mid-epoch ends (and its workers exit) at once.
        self._live: weakref.ref[Iterator[dict[str, Any]]] | None = None

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning unless the state already sits inside it (as RES-7)."""
        self.close()
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.close()
        self.dataset.load_state_dict(state)

    def close(self) -> None:
        """End the live pass now: its DataLoader worker processes exit here; the lanes' state is kept."""
        live = self._live() if self._live is not None else None
        self._live = None
        close = getattr(live, "close", None)
        if close is not None:
            close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        live: Iterator[dict[str, Any]] = self._run() if self.num_workers else iter(self.dataset)
        self._live = weakref.ref(live)
        return live

    def _run(self) -> Generator[dict[str, Any], None, None]:
        """Batches in STREAM-11's order: the worker whose lanes consumed the fewest samples, among those not done."""
        ds, epoch = self.dataset, self.dataset.epoch
        ds._markers = True
        if isinstance(ds, StreamingDataset):     # a mapped census once here, not once in each worker (STREAM-12)
            ds.count_lanes()
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers, collate_fn=_identity,
                            multiprocessing_context=self._context, **self._kwargs)
        lanes = ds.worker_lanes(self.num_workers)
        queues: dict[int, collections.deque[tuple[Any, dict[str, Any]]]] = {k: collections.deque() for k in
                                                                             range(len(lanes))}
        done: set[int] = set()
        iterator = iter(loader)
        try:
            while len(done) < len(lanes):
                k = min((k for k in range(len(lanes)) if k not in done),
                        key=lambda k: (sum(ds.lane_samples(lane) for lane in lanes[k]), k))
                while not queues[k]:
                    batch = from_pipe(next(iterator))
                    meta = batch.pop(STATE_KEY)
                    skipped = batch.pop(SKIPPED_KEY, None)     # a worker's bad lines (STREAM-17)
                    if skipped and isinstance(ds, StreamingDataset):
                        ds.add_worker_skipped(skipped)
                    queues[meta[1]].append((meta, batch))
                meta, out = queues[k].popleft()
                if meta[2] is None:
                    done.add(k)
                    continue
                ds.apply(meta)
                yield out
        finally:
            del iterator
        if ds.epoch == epoch:
            ds.set_epoch(epoch + 1)

    def __repr__(self) -> str:
        return f"StreamingLoader({self.dataset!r}, num_workers={self.num_workers})"
