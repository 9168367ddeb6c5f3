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
* ``global_state_of_its_own_rank``: declares ``state:global`` because its
  state counts global rows, but each rank returns its own ``(epoch, seen)``,
  which is every rank's only while the ranks are in lockstep.
* ``global_state_copied_from_rank_0``: declares ``state:global`` and every
  rank returns rank 0's state (a broadcast from rank 0): the same on every
  rank, but a rank that was a batch ahead of rank 0 redoes that batch.
* ``global_state_of_the_furthest_rank``: declares ``state:global`` and every
  rank returns the furthest ``(epoch, seen)`` of its job (an all-reduce of
  the maximum): a rank behind the furthest skips its batch of that step.
* ``declares_one_sample_more_kept``: declares its end rule's account
  (``epoch_coverage``) with an off-by-one, ``steps * G + 1`` samples kept
  where the loop keeps ``steps * G``.
* ``declares_one_sample_fewer_kept``: declares ``steps * G - 1`` samples
  kept, which loosens the exact loss account by a sample the loader could
  then lose unseen.

Run the kit on one: ``pytest --pyargs conformance.tests --loadspec-loader conformance.examples.broken:forgets_epoch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from conformance.adapter import RowLoader
from conformance.examples.third_party import TinyAdapter
from conformance.examples.tiny_loader import TinyLoader
from conformance.provenance import EpochCoverage, expected_coverage, pack_corpus, row_from_columns


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


class JobStateLoader(TinyLoader):
    """Every rank's state is one loader's of its job (``job``, shared by the ranks): rank 0's, or the furthest's."""

    def __init__(self, rows: list[Any], *, job: list[TinyLoader], furthest: bool = False, **kwargs: Any) -> None:
        super().__init__(rows, **kwargs)
        self.job, self.furthest = job, furthest
        job.append(self)

    def state_dict(self) -> dict[str, int]:
        epoch, seen = max((ld.epoch, ld.seen) for ld in self.job) if self.furthest else (self.job[0].epoch,
                                                                                           self.job[0].seen)
        return {"ep": epoch, "seen": seen}


class FurthestJobStateLoader(JobStateLoader):
    def __init__(self, rows: list[Any], **kwargs: Any) -> None:
        super().__init__(rows, furthest=True, **kwargs)


class BrokenAdapter(TinyAdapter):
    """``TinyAdapter`` building one of the broken loaders above (``extra``: capabilities it declares beyond it)."""

    def __init__(self, loader_class: type[TinyLoader], name: str, extra: frozenset[str] = frozenset()) -> None:
        self.loader_class, self.name = loader_class, name
        self.capabilities = TinyAdapter.capabilities | extra
        self.job: list[TinyLoader] = []

    def build(self, corpus, config, topology, *, workdir):
        shared: dict[str, Any] = {}
        if issubclass(self.loader_class, (FurthestRankLoader, JobStateLoader)):  # the ranks built after a rank 0
            if topology.rank == 0:
                self.job = []
            shared["job"] = self.job
        loader = self.loader_class(pack_corpus(corpus, config.packing), batch_size=topology.batch_size,
                                   rank=topology.rank, world_size=topology.world_size, seed=config.ordering.seed,
                                   shuffle=config.ordering.kind != "sequential", **shared)
        return RowLoader(loader, lambda batch: [row_from_columns(r, epoch=loader.epoch, index=-1) for r in batch])


class MiscountingAdapter(BrokenAdapter):
    """The intact loader, whose adapter declares its end rule's account (``epoch_coverage``) ``off`` by samples."""

    def __init__(self, off: int, name: str) -> None:
        super().__init__(TinyLoader, name)
        self.off = off

    def epoch_coverage(self, corpus, config, topology, state=None) -> EpochCoverage | None:
        coverage = expected_coverage(corpus, config, topology)
        if coverage is None or state is not None:
            return None
        return replace(coverage, kept=min(max(coverage.kept + self.off, 0), coverage.samples), clause="PART-4")


def forgets_epoch() -> BrokenAdapter:
    return BrokenAdapter(ForgetfulSamplerLoader, "tiny-loader-forgets-epoch")


def loses_last_sample() -> BrokenAdapter:
    return BrokenAdapter(LastSampleLoader, "tiny-loader-loses-last-sample")


def holds_back_even_batch() -> BrokenAdapter:
    return BrokenAdapter(EvenBatchLoader, "tiny-loader-holds-back-even-batch")


def counts_furthest_rank() -> BrokenAdapter:
    return BrokenAdapter(FurthestRankLoader, "tiny-loader-counts-furthest-rank")


def global_state_of_its_own_rank() -> BrokenAdapter:
    return BrokenAdapter(TinyLoader, "tiny-loader-global-state-of-its-own-rank", frozenset({"state:global"}))


def global_state_copied_from_rank_0() -> BrokenAdapter:
    return BrokenAdapter(JobStateLoader, "tiny-loader-global-state-copied-from-rank-0", frozenset({"state:global"}))


def global_state_of_the_furthest_rank() -> BrokenAdapter:
    return BrokenAdapter(FurthestJobStateLoader, "tiny-loader-global-state-of-the-furthest-rank",
                         frozenset({"state:global"}))


def declares_one_sample_more_kept() -> MiscountingAdapter:
    return MiscountingAdapter(+1, "tiny-loader-declares-one-sample-more-kept")


def declares_one_sample_fewer_kept() -> MiscountingAdapter:
    return MiscountingAdapter(-1, "tiny-loader-declares-one-sample-fewer-kept")
