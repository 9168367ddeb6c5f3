"""Adapters that misbehave on purpose, for the per-rank harness's own tests (``conformance.ranks``).

Each wraps the reference's loader; the rank processes import them by spec
(``conformance.kit_tests.rank_faults:hang``), as they would any adapter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from conformance.adapters.reference import ReferenceAdapter


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
