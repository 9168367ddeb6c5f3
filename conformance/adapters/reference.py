"""The reference as a loader under test: the strict minimal implementation every suite runs against."""

from __future__ import annotations

from pathlib import Path

from conformance.adapter import CAPABILITIES, CanonicalRow, RowLoader
from reference.errors import ConfigError, StateError
from reference.loader import ReferenceLoader
from reference.resume import Corpus, PipelineConfig, Row, Topology


def rows_from_batch(batch: list[Row]) -> list[CanonicalRow]:
    return [CanonicalRow.from_reference(r) for r in batch]


class ReferenceAdapter:
    name = "reference"
    capabilities = CAPABILITIES - {"state:global"}
    """Every capability but ``state:global``: a rank's state counts its own batches (RES-6), not a collective's."""
    refusal_types = (StateError, ConfigError)
    """RES-3 refuses a state with ``StateError``, PART-12 an impossible position or topology with ``ConfigError``."""

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> RowLoader:
        return RowLoader(ReferenceLoader(corpus, config, topology), rows_from_batch)


def adapter() -> ReferenceAdapter:
    return ReferenceAdapter()
