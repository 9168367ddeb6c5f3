"""The seam between the conformance kit and any loader: ours, the reference, or a third party's.

Why: tests must compare like with like. An adapter builds the loader under test
from a corpus (files of pre-tokenized documents) and a ``PipelineConfig`` for
one rank of a topology, and converts what the loader yields into canonical rows
that carry document provenance. Conversion lives here, never in tests.

Everything an adapter must do (the whole obligation):

* ``name`` and ``capabilities`` (a subset of :data:`CAPABILITIES`); tests
  needing a capability the adapter lacks are skipped with the reason, and
  configs are drawn only from what it declares;
* ``build(corpus, config, topology, *, workdir)`` returns one rank's loader:
  iterating it yields the rest of the current epoch, one ``list[CanonicalRow]``
  per step (``RowLoader`` wraps a loader with the function that converts one
  batch); with ``resume``, ``state_dict()`` returns anything JSON can carry and
  ``load_state_dict(state)`` takes it back; ``set_epoch(e)`` starts epoch e.

Optional, with the default the kit uses when absent:

* ``version`` (str): printed in the report header and the matrix;
* ``position(state) -> (epoch, consumed) | None``: where a state stands
  (default: its ``epoch``/``consumed`` keys if present, else None);
* ``is_refusal(exc) -> bool``: whether an exception from loading a state on
  another topology is the loader's explicit refusal (default: any
  ``LoadspecError``, ``ValueError``, ``RuntimeError`` or ``NotImplementedError``);
* ``unsupported(corpus, config, topology) -> str | None``: a reason when the
  loader documents this case as unsupported (the example is then discarded,
  not failed); ``build`` may also raise :class:`Unsupported`;
* ``close()`` on a built loader: called after every example, so loaders that
  hold shared memory, threads or file descriptors release them while
  hypothesis runs hundreds of examples;
* ``limits`` (a mapping): ``max_seed``, and ``max_world_size``, the most ranks
  the loader can simulate in one process (the in-process suite draws no more);
* ``process_group = True``: the loader reads ``torch.distributed``, so the
  per-rank harness (``conformance.ranks``: one process per rank, file
  rendezvous, ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) joins a gloo group
  before ``build``. There each rank builds in its own ``workdir``;
  ``LOADSPEC_NODE_DIR`` names a directory its ranks share (data a peer's
  local ranks must open at one path). The harness's tests
  (``conformance/tests/test_any_loader_processes.py``) need nothing more.

``bit_exact`` is the only capability that makes the kit compare with the
reference's sample numbering and order (``sample_index``, the state machine,
the bit-for-bit batches); ``state:version`` and ``state:fingerprint`` make it
check loadspec's state keys and refusals (RES-2, RES-3). Every other test
checks properties that any correct loader has (``conformance/tests/test_any_loader.py``,
and with one process per rank ``test_any_loader_processes.py``): provenance,
at most once, fewer than one global batch lost, equal step counts, exact
resume, and refusal or exactness after a change of topology.

A third-party adapter is one file (``conformance/examples/third_party.py`` is
a complete, tested one)::

    class MyAdapter:
        name = "my-loader"
        capabilities = frozenset({"resume", "packing:concat", "ordering:sequential", "end:drop_last"})
        def build(self, corpus, config, topology, *, workdir):
            return RowLoader(MyLoader(...), to_rows)   # to_rows: one batch -> list[CanonicalRow]
    def adapter():
        return MyAdapter()

and is selected with ``pytest --pyargs conformance.tests --loadspec-loader mypkg.adapter:adapter``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reference.errors import LoadspecError
from reference.resume import Corpus, PipelineConfig, Row, Topology

CAPABILITIES = frozenset({
    "bit_exact",          # rows equal the reference's, field for field
    "resume",             # state_dict/load_state_dict reproduce the stream (RES-1, RES-2)
    "elastic",            # resume on another world size or batch size (RES-4)
    "workers",            # the loader runs with num_workers > 0 (topology changes may change the worker count)
    "workers:same_stream",  # num_workers > 0 gives the same stream as 0 (RES-5: a loadspec promise, not every loader's)
    "replication",        # replication > 1 (PART)
    "end:drop_last", "end:pad", "end:even",
    "ordering:sequential", "ordering:global", "ordering:window", "ordering:buffer",
    "packing:concat", "packing:chunk", "packing:greedy", "packing:first_fit", "packing:best_fit", "packing:none",
    "packing:options",    # add_bos/add_eos/min_len/stride/bos_on_continuation/truncate
    "shuffle:seeded",     # ordering:global means "some shuffle keyed by the seed" (not the reference's, unless bit_exact)
    "state:version", "state:fingerprint",  # the state carries loadspec's version/fingerprint keys (RES-2, RES-3)
})


class Unsupported(Exception):
    """Raised by ``build`` for a case the loader documents as unsupported: the example is discarded, not failed."""


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


def position(adapter: Any, state: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(epoch, consumed)`` of a state: the adapter's ``position`` hook, else the state's own keys, else None."""
    hook = getattr(adapter, "position", None)
    if hook is not None:
        return hook(state)
    if isinstance(state, Mapping) and "epoch" in state and "consumed" in state:
        return int(state["epoch"]), int(state["consumed"])
    return None


def is_refusal(adapter: Any, exc: BaseException) -> bool:
    """Whether ``exc`` is the loader's explicit refusal (the adapter's ``is_refusal`` hook, else a typed error)."""
    hook = getattr(adapter, "is_refusal", None)
    if hook is not None:
        return bool(hook(exc))
    return isinstance(exc, (LoadspecError, ValueError, RuntimeError, NotImplementedError))


def unsupported(adapter: Any, corpus: Corpus, config: PipelineConfig, topology: Topology) -> str | None:
    hook = getattr(adapter, "unsupported", None)
    return hook(corpus, config, topology) if hook is not None else None


def close(*loaders: Any) -> None:
    """Call ``close()`` on every built loader that has one (after each example)."""
    for ld in loaders:
        fn = getattr(ld, "close", None) or getattr(getattr(ld, "loader", None), "close", None)
        if fn is not None:
            fn()


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

    def close(self) -> None:
        fn = getattr(self.loader, "close", None)
        if fn is not None:
            fn()


def required_capabilities(config: PipelineConfig, topology: Topology | None = None,
                          caps: frozenset[str] = frozenset({"bit_exact"})) -> set[str]:
    """The capabilities a loader (declaring ``caps``) must declare to be tested on this config and topology.

    A loader that is not ``bit_exact`` is tested on a global order when it declares ``shuffle:seeded``.
    """
    p = config.packing
    needed = {f"ordering:{config.ordering.kind}", f"packing:{p.mode}", f"end:{config.end}"}
    if config.ordering.kind == "global" and "bit_exact" not in caps:
        needed = (needed - {"ordering:global"}) | {"shuffle:seeded"}
    if p.add_bos or p.add_eos or p.min_len or p.stride or p.bos_on_continuation or p.overflow != "split":
        needed.add("packing:options")
    if topology is not None:
        if topology.replication > 1:
            needed.add("replication")
        if topology.num_workers > 0:
            needed.add("workers")
    return needed
