"""The reference as a loader under test: the strict minimal implementation every suite runs against."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from conformance.adapter import CAPABILITIES, CanonicalRow
from reference.resume import Corpus, PipelineConfig, ReferenceLoader, Topology


class _Wrapped:
    def __init__(self, loader: ReferenceLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[list[CanonicalRow]]:
        for batch in self.loader:
            yield [CanonicalRow.from_reference(r) for r in batch]

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


class ReferenceAdapter:
    name = "reference"
    capabilities = CAPABILITIES

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> _Wrapped:
        return _Wrapped(ReferenceLoader(corpus, config, topology))


def adapter() -> ReferenceAdapter:
    return ReferenceAdapter()
