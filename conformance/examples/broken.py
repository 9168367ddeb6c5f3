"""The worked example (``third_party.py``) with one bug each: what the kit's own tests prove it catches.

Each variant is a bug a real loader has had, and each passed the kit until
the kit looked for it (``conformance/kit_tests/test_blind_spots.py`` runs the
kit on every one):

* ``forgets_epoch``: the sampler keeps its own epoch, which
  ``load_state_dict`` does not restore, so a job resumed in epoch 1 trains
  epoch 0's order again (its rows still say epoch 1). Invisible to any resume
  in epoch 0, and to sequential orders.
* ``loses_last_sample``: the loader believes the packed stream's last
  window is its tail and never serves it: one sample lost every epoch.
* ``holds_back_even_batch``: the loop tests ``seen + g < len(rows)``, so
  when the epoch divides into global batches evenly its last one is never
  served (a batch lost whenever ``S mod G == 0``).
* ``counts_furthest_rank``: rank 0 checkpoints the furthest position any
  rank of the job reached (a counter the ranks share), not its own. Exact
  while rank 0 is the rank ahead at a checkpoint; when the last rank is
  ahead, every rank restoring rank 0's state skips a step of the others.

Run the kit on one: ``pytest --pyargs conformance.tests --loadspec-loader conformance.examples.broken:forgets_epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from conformance.adapter import RowLoader
from conformance.examples.third_party import TinyAdapter
from conformance.examples.tiny_loader import TinyLoader
from conformance.provenance import pack_corpus, row_from_columns


class ForgetfulSamplerLoader(TinyLoader):
    """The order comes from the sampler's own epoch, which a restored state leaves at 0."""

    def __init__(self, rows: list[Any], **kwargs: Any) -> None:
        super().__init__(rows, **kwargs)
        self.sampler_epoch = 0

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, self.sampler_epoch]).permutation(len(self.rows))

    def __iter__(self) -> Iterator[list[Any]]:
        yield from super().__iter__()
        self.sampler_epoch = self.epoch

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.sampler_epoch = epoch


class LastSampleLoader(TinyLoader):
    """Serves the rows but the last: it takes the packed stream's last window for a tail to drop."""

    def __init__(self, rows: list[Any], **kwargs: Any) -> None:
        super().__init__(rows[:-1], **kwargs)


class EvenBatchLoader(TinyLoader):
    """``seen + g < len(rows)`` where ``<=`` was meant: an epoch of whole global batches loses its last one."""

    def __iter__(self) -> Iterator[list[Any]]:
        order, g = self._order(), self.world_size * self.batch_size
        while self.seen + g < len(self.rows):
            start = self.seen + self.rank * self.batch_size
            self.seen += g
            yield [self.rows[i] for i in order[start:start + self.batch_size]]
        self.epoch, self.seen = self.epoch + 1, 0


class FurthestRankLoader(TinyLoader):
    """Rank 0's state is the furthest ``(epoch, seen)`` of any loader of its job (``job``, shared by the ranks)."""

    def __init__(self, rows: list[Any], *, job: list[TinyLoader], **kwargs: Any) -> None:
        super().__init__(rows, **kwargs)
        self.job = job
        job.append(self)

    def state_dict(self) -> dict[str, int]:
        if self.rank != 0:
            return super().state_dict()
        epoch, seen = max((ld.epoch, ld.seen) for ld in self.job)
        return {"ep": epoch, "seen": seen}


class BrokenAdapter(TinyAdapter):
    """``TinyAdapter`` building one of the broken loaders above."""

    def __init__(self, loader_class: type[TinyLoader], name: str) -> None:
        self.loader_class, self.name = loader_class, name
        self.job: list[TinyLoader] = []

    def build(self, corpus, config, topology, *, workdir):
        shared: dict[str, Any] = {}
        if self.loader_class is FurthestRankLoader:  # the ranks built after a rank 0 are its job's
            if topology.rank == 0:
                self.job = []
            shared["job"] = self.job
        loader = self.loader_class(pack_corpus(corpus, config.packing), batch_size=topology.batch_size,
                                   rank=topology.rank, world_size=topology.world_size, seed=config.ordering.seed,
                                   shuffle=config.ordering.kind != "sequential", **shared)
        return RowLoader(loader, lambda batch: [row_from_columns(r, epoch=loader.epoch, index=-1) for r in batch])


def forgets_epoch() -> BrokenAdapter:
    return BrokenAdapter(ForgetfulSamplerLoader, "tiny-loader-forgets-epoch")


def loses_last_sample() -> BrokenAdapter:
    return BrokenAdapter(LastSampleLoader, "tiny-loader-loses-last-sample")


def holds_back_even_batch() -> BrokenAdapter:
    return BrokenAdapter(EvenBatchLoader, "tiny-loader-holds-back-even-batch")


def counts_furthest_rank() -> BrokenAdapter:
    return BrokenAdapter(FurthestRankLoader, "tiny-loader-counts-furthest-rank")
