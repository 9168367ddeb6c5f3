"""Adapters that misbehave on purpose, for the per-rank harness's own tests (``conformance.ranks``).

Each wraps the reference's loader; the rank processes import them by spec
(``conformance.kit_tests.rank_faults:hang``), as they would any adapter.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance.adapters.reference import ReferenceAdapter
from conformance.ranks import RankJob
from reference.ordering import OrderingConfig
from reference.packing import PackingConfig
from reference.resume import PipelineConfig

CONFIG = PipelineConfig(packing=PackingConfig(seq_len=4, mode="concat", pad_id=0),
                        ordering=OrderingConfig(kind="global", seed=3))
"""The kit tests' pipeline: small samples under a global shuffle."""


def small_corpus() -> list[list[list[int]]]:
    """Two files of eight short documents, the same every call."""
    rng = random.Random(7)
    return [[[rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))] for _ in range(8)] for _ in range(2)]


def small_job(loader: str, **kw: Any) -> RankJob:
    """A per-rank job of ``loader`` (``module:factory``) on :func:`small_corpus`, 2 ranks x batch 2 unless told."""
    kw.setdefault("world_size", 2)
    kw.setdefault("batch_size", 2)
    return RankJob(loader=loader, corpus=small_corpus(), config=CONFIG.to_json(), **kw)


class FaultyLoader:
    def __init__(self, loader: Any, rank: int, fault: str) -> None:
        self.loader, self.rank, self.fault = loader, rank, fault

    def __iter__(self) -> Iterator[Any]:
        last = None
        for step, batch in enumerate(self.loader, start=1):
            if self.fault == "hang" and self.rank == 1 and step == 2:
                time.sleep(3600)
            if self.fault == "crash" and self.rank == 1 and step == 2:
                raise RuntimeError("rank 1 crashed on purpose at step 2")
            last = batch
            yield batch
        if self.fault == "extra" and self.rank == 0 and last is not None:
            yield last

    def state_dict(self) -> Any:
        return self.loader.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class FaultyAdapter(ReferenceAdapter):
    def __init__(self, fault: str) -> None:
        self.fault, self.name = fault, f"reference-{fault}"

    def build(self, corpus, config, topology, *, workdir):
        return FaultyLoader(super().build(corpus, config, topology, workdir=workdir), topology.rank, self.fault)


class ProcessGroupAdapter(ReferenceAdapter):
    """The reference, built only where the harness joined a process group matching the topology and the env."""

    name, process_group = "reference-in-a-process-group", True

    def build(self, corpus, config, topology, *, workdir):
        import torch.distributed as dist

        seen = (dist.is_initialized() and dist.get_rank(), dist.get_world_size(), os.environ.get("RANK"),
                os.environ.get("WORLD_SIZE"))
        expected = (topology.rank, topology.world_size, str(topology.rank), str(topology.world_size))
        if seen != expected:
            raise RuntimeError(f"process group and env {seen} do not match the topology {expected}")
        return super().build(corpus, config, topology, workdir=workdir)


def hang() -> FaultyAdapter:
    return FaultyAdapter("hang")


def crash() -> FaultyAdapter:
    return FaultyAdapter("crash")


def extra() -> FaultyAdapter:
    return FaultyAdapter("extra")


def process_group() -> ProcessGroupAdapter:
    return ProcessGroupAdapter()


# --------------------------------------------------------------------------- blind spots of issue 22: each is caught
# only by the harness's skew, per-rank counting, joint resize and declared refusal types


class CountingLoader:
    """The reference's loader that publishes its ``consumed`` in a directory of its job (``shared``) each time it
    hands out a batch, and whose state takes ``consumed`` from there (``count``: ``rank0`` on every rank, as a
    broadcast from rank 0 gives, or ``furthest`` on rank 0 only)."""

    def __init__(self, loader: Any, rank: int, count: str, shared: Path) -> None:
        self.loader, self.rank, self.count, self.shared = loader, rank, count, shared
        shared.mkdir(parents=True, exist_ok=True)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            (self.shared / f"consumed-rank{self.rank}").write_text(str(self.loader.state_dict()["consumed"]))
            yield batch

    def state_dict(self) -> Any:
        state = dict(self.loader.state_dict())
        published = {int(p.name.removeprefix("consumed-rank")): int(p.read_text())
                     for p in self.shared.glob("consumed-rank*")}
        if self.count == "rank0" and 0 in published:  # rank 0's batches x batch size x ranks, as a broadcast gives
            state["consumed"] = published[0]
        if self.count == "furthest" and self.rank == 0 and published:  # the furthest rank's count, on rank 0 only
            state["consumed"] = max(published.values())
        return state

    def load_state_dict(self, state: Any) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class CountingAdapter(ReferenceAdapter):
    def __init__(self, count: str) -> None:
        self.count, self.name = count, f"reference-count-{count}"

    def build(self, corpus, config, topology, *, workdir):
        # the harness builds rank r in <job>/work/rank{r}: <job>/work/counts is this job's alone
        return CountingLoader(super().build(corpus, config, topology, workdir=workdir), topology.rank, self.count,
                              Path(workdir).parent / "counts")


class TopologyLoader:
    """The reference's loader whose state also records the topology that wrote it; ``fault`` misuses it on load:
    ``rewind`` goes back one global batch when the ranks and the workers both changed (duplicates), ``keyerror``
    raises the ``KeyError`` a missing key of the state would when the world size changed."""

    def __init__(self, loader: Any, topology: Any, fault: str) -> None:
        self.loader, self.topology, self.fault = loader, topology, fault

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def state_dict(self) -> Any:
        t = self.topology
        return {"inner": self.loader.state_dict(), "world": t.world_size, "batch": t.batch_size,
                "workers": t.num_workers}

    def load_state_dict(self, state: Any) -> None:
        inner, t = dict(state["inner"]), self.topology
        moved = state["world"] != t.world_size
        if self.fault == "rewind" and moved and state["workers"] != t.num_workers:
            inner["consumed"] = max(0, inner["consumed"] - state["world"] * state["batch"])
        if self.fault == "keyerror" and moved:
            raise KeyError("ex_iterable_idx")
        self.loader.load_state_dict(inner)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class TopologyAdapter(ReferenceAdapter):
    def __init__(self, fault: str) -> None:
        self.fault, self.name = fault, f"reference-{fault}"

    def build(self, corpus, config, topology, *, workdir):
        return TopologyLoader(super().build(corpus, config, topology, workdir=workdir), topology, self.fault)


class KeyErrorAdapter(TopologyAdapter):
    """Declares loadspec's ``StateError`` as its refusal but raises a ``KeyError``, and (the old protocol) decides
    after the fact that a ``KeyError`` is a refusal: the kit no longer reads that hook."""

    def __init__(self) -> None:
        super().__init__("keyerror")

    def is_refusal(self, exc: BaseException) -> bool:
        return isinstance(exc, KeyError)


class AssertingAdapter(ReferenceAdapter):
    """Declares a bare ``AssertionError`` as its refusal (what torchdata raises on a state of other workers)."""

    name, refusal_types = "reference-asserting", (AssertionError,)


def rank0_count() -> CountingAdapter:
    return CountingAdapter("rank0")


def furthest_count() -> CountingAdapter:
    return CountingAdapter("furthest")


def rewind_on_joint_resize() -> TopologyAdapter:
    return TopologyAdapter("rewind")


def keyerror_on_load() -> KeyErrorAdapter:
    return KeyErrorAdapter()


def asserting() -> AssertingAdapter:
    return AssertingAdapter()
