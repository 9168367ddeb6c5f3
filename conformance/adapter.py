"""The seam between the conformance kit and any loader: ours, the reference, or a third party's.

Why: tests must compare like with like. An adapter builds the loader under test
from a corpus (files of pre-tokenized documents) and a ``PipelineConfig`` for
one rank of a topology, and converts what the loader yields into canonical rows
that carry document provenance. Conversion lives here, never in tests.

A third-party adapter is one file::

    class MyAdapter:
        name = "my-loader"
        capabilities = frozenset({"resume", "packing:concat", "ordering:sequential"})
        def build(self, corpus, config, topology, *, workdir):
            return MyLoaderWrapper(...)   # iterates list[CanonicalRow] per step; state_dict/load_state_dict
    def adapter():
        return MyAdapter()

and is selected with ``pytest conformance --loader mypkg.adapter:adapter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reference.resume import Corpus, PipelineConfig, Row, Topology

CAPABILITIES = frozenset({
    "bit_exact",          # rows equal the reference's, field for field
    "resume",             # state_dict/load_state_dict reproduce the stream (RES-1, RES-2)
    "elastic",            # resume on another world size or batch size (RES-4)
    "workers",            # num_workers > 0 gives the same stream (RES-5)
    "replication",        # replication > 1 (PART)
    "end:drop_last", "end:pad", "end:even",
    "ordering:sequential", "ordering:global", "ordering:window", "ordering:buffer",
    "packing:concat", "packing:chunk", "packing:greedy", "packing:first_fit", "packing:best_fit", "packing:none",
    "packing:options",    # add_bos/add_eos/min_len/stride/bos_on_continuation/truncate
})


@dataclass(frozen=True, slots=True)
class CanonicalRow:
    """One sample as every test sees it: position in the epoch, tokens, and provenance."""

    epoch: int
    sample_index: int
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    position_ids: tuple[int, ...]
    doc_ids: tuple[int, ...]
    token_offsets: tuple[int, ...]

    @classmethod
    def from_reference(cls, row: Row) -> CanonicalRow:
        s = row.sample
        return cls(row.epoch, row.sample_index, tuple(s.input_ids), tuple(s.labels), tuple(s.position_ids),
                   tuple(s.doc_ids), tuple(s.token_offsets))


class LoaderUnderTest(Protocol):
    """One rank's loader: iterating yields the rest of the current epoch, one list of rows per step."""

    def __iter__(self) -> Iterator[list[CanonicalRow]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def set_epoch(self, epoch: int) -> None: ...


@runtime_checkable
class LoaderAdapter(Protocol):
    name: str
    capabilities: frozenset[str]

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> LoaderUnderTest: ...


class RowLoader:
    """A loader whose batches are converted to canonical rows; state calls pass straight through.

    Adapters wrap their loader in this with the one function that knows its batch format.
    """

    def __init__(self, loader: Any, to_rows: Callable[[Any], list[CanonicalRow]]) -> None:
        self.loader = loader
        self.to_rows = to_rows

    def __iter__(self) -> Iterator[list[CanonicalRow]]:
        for batch in self.loader:
            yield self.to_rows(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)


def required_capabilities(config: PipelineConfig, topology: Topology | None = None) -> set[str]:
    """The capabilities a loader must declare to be tested on this config and topology."""
    p = config.packing
    needed = {f"ordering:{config.ordering.kind}", f"packing:{p.mode}", f"end:{config.end}"}
    if p.add_bos or p.add_eos or p.min_len or p.stride or p.bos_on_continuation or p.overflow != "split":
        needed.add("packing:options")
    if topology is not None:
        if topology.replication > 1:
            needed.add("replication")
        if topology.num_workers > 0:
            needed.add("workers")
    return needed
