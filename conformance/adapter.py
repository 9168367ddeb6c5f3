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
* ``refusal_types`` (a tuple of exception classes): what the loader raises,
  at ``load_state_dict`` or at the first batch after it, to refuse a state
  explicitly (default :data:`DEFAULT_REFUSAL_TYPES`: loadspec's
  ``StateError`` and ``ConfigError`` families). Declared up front so the
  verdict never rests on the adapter deciding after the fact: an exception of
  any other type on a state load is a failure that shows the exception. A
  bare builtin (``AssertionError``, ``KeyError``, ``ValueError``...) cannot be
  declared: it is what an unchecked index or assert raises, not a refusal, so
  :func:`check_adapter` refuses it (declare the library's own class, or
  subclass ``reference.errors.StateError`` in the loader). The old
  ``is_refusal(exc)`` hook is no longer read, and an adapter that still
  defines it is refused the same way;
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

* ``epoch_coverage(corpus, config, topology, state=None) -> EpochCoverage | None``:
  the exact account of epoch 0 (samples packed, samples trained, steps),
  or with ``state`` of the rest of that saved state's epoch resumed on
  ``topology``, when the loader ends an epoch by a rule of its own rather
  than one of the kit's ``end:*`` policies, computed from the loader's
  specification and naming its clause (``conformance.provenance.declared_coverage``;
  the streaming adapter's equal-step truncation over lanes, STREAM-12, is one).

``state:global`` says every rank's ``state_dict()`` returns the same state,
the job's (gathered as a collective): restoring it restores every rank
where it stood, so a rank that was a batch ahead at the checkpoint does not
redo that batch whichever rank's copy it loads; the kit checks that the
ranks' states are equal, and that a state saved while a rank was a batch
ahead, restored on the same topology, resumes every rank where it stood.
A declared ``epoch_coverage`` is held exact both ways: an epoch that trains
more samples than it declares fails as well as one that trains fewer.

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

and is selected with ``pytest --pyargs conformance.tests --loadspec-loader mypkg.adapter:adapter``,
run from the directory that holds ``mypkg/``. The plugin checks it before
any test runs (:func:`check_adapter`: members, capability names, the shape
of a first batch); each problem is a pytest usage error that names it.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from reference.errors import ConfigError, StateError
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
    "state:global",       # every rank's state_dict() is the job's one global state (a collective, e.g. STREAM-14)
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


REQUIRED_MEMBERS = ("name", "capabilities", "build")
"""The members :class:`LoaderAdapter` declares: what :func:`check_adapter` requires of every adapter."""


def position(adapter: Any, state: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(epoch, consumed)`` of a state: the adapter's ``position`` hook, else the state's own keys, else None."""
    hook = getattr(adapter, "position", None)
    if hook is not None:
        return hook(state)
    if isinstance(state, Mapping) and "epoch" in state and "consumed" in state:
        return int(state["epoch"]), int(state["consumed"])
    return None


DEFAULT_REFUSAL_TYPES: tuple[type[BaseException], ...] = (StateError, ConfigError)
"""What counts as a refusal of a state when an adapter declares no ``refusal_types``: loadspec's typed errors
(RES-3's ``StateError``, PART-12's ``ConfigError`` family), which a loader may also subclass."""


def bare_builtin(kind: Any) -> bool:
    """Whether ``kind`` is one of Python's own exception classes (``KeyError``, ``AssertionError``, ``Exception``...).

    >>> bare_builtin(KeyError), bare_builtin(StateError)
    (True, False)
    """
    return isinstance(kind, type) and issubclass(kind, BaseException) and kind.__module__ == "builtins"


def refusal_types(adapter: Any) -> tuple[type[BaseException], ...]:
    """The exception classes ``adapter`` declares as its refusals of a state, bare builtins left out.

    Left out even when :func:`check_adapter` did not run (a rank process of
    ``conformance.ranks`` loads the adapter by itself): a ``KeyError`` counts
    as a failure wherever it is raised.
    """
    declared = getattr(adapter, "refusal_types", DEFAULT_REFUSAL_TYPES)
    if not isinstance(declared, tuple):
        return ()
    return tuple(t for t in declared if isinstance(t, type) and issubclass(t, BaseException) and not bare_builtin(t))


def is_refusal(adapter: Any, exc: BaseException) -> bool:
    """Whether ``exc`` (raised loading a state, or at the first batch after) is one of the adapter's declared refusals.

    >>> class Mine:
    ...     refusal_types = (StateError,)
    >>> is_refusal(Mine(), StateError("fingerprint differs")), is_refusal(Mine(), KeyError("ex_iterable_idx"))
    (True, False)
    """
    return isinstance(exc, refusal_types(adapter))


def describe_exception(exc: BaseException) -> str:
    """``module.Type: message``, as a failure shows an exception that was not a declared refusal."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {exc}"


def unsupported(adapter: Any, corpus: Corpus, config: PipelineConfig, topology: Topology) -> str | None:
    hook = getattr(adapter, "unsupported", None)
    return hook(corpus, config, topology) if hook is not None else None


def close(*loaders: Any) -> None:
    """Call ``close()`` on every built loader that has one (after each example), each even when one before raised.

    Why the kit closes: a suite builds thousands of loaders in one process;
    one whose files (mapped stores, worker pipes) wait for the garbage
    collector holds them long after its example's directory is deleted.
    The first exception is raised once every loader was closed.
    """
    with contextlib.ExitStack() as stack:
        for ld in loaders:
            fn = getattr(ld, "close", None) or getattr(getattr(ld, "loader", None), "close", None)
            if fn is not None:
                stack.callback(fn)


class RowLoader:
    """A loader whose batches are converted to canonical rows; state calls pass straight through.

    Adapters wrap their loader in this with the one function that knows its batch format.
    ``closes``: what the adapter built for this loader alone and must release with it (its
    dataset, a store it opened), closed by :meth:`close` after the loader, last built first::

        RowLoader(build_dataloader(dataset), to_rows, closes=(dataset,))
    """

    def __init__(self, loader: Any, to_rows: Callable[[Any], list[CanonicalRow]], *,
                 closes: tuple[Any, ...] = ()) -> None:
        self.loader = loader
        self.to_rows = to_rows
        self.closes = closes

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
        """Close the loader, then everything in ``closes`` (each that has a ``close()``), each even if one raises."""
        with contextlib.ExitStack() as stack:
            for thing in self.closes:   # an ExitStack runs its callbacks last in, first out: the loader first
                fn = getattr(thing, "close", None)
                if fn is not None:
                    stack.callback(fn)
            fn = getattr(self.loader, "close", None)
            if fn is not None:
                stack.callback(fn)


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


# --------------------------------------------------------------------------- checking an adapter before any test


class AdapterError(ConfigError):
    """An adapter that does not meet the protocol above; the message names every problem found and its fix."""


PROBE_CORPUS: Corpus = [[list(range(1, 17)), list(range(17, 33))]]
"""The corpus :func:`check_adapter` builds on: one file of two 16-token documents (a few samples in every mode)."""

_FAMILIES = {
    "ordering": (("ordering:sequential", "ordering:global", "ordering:window", "ordering:buffer", "shuffle:seeded"),
                 "order"),
    "packing": (("packing:concat", "packing:chunk", "packing:greedy", "packing:first_fit", "packing:best_fit",
                 "packing:none"), "packing mode"),
    "end": (("end:drop_last", "end:pad", "end:even"), "end-of-epoch policy"),
}


def check_adapter(adapter: Any, *, workdir: Path) -> None:
    """Raise :class:`AdapterError` naming every way ``adapter`` breaks the protocol, before any test runs.

    Why: an adapter with a misspelt capability, a missing member or batches in
    the loader's own format otherwise fails deep inside the tests (a hypothesis
    ``InvalidArgument`` or an ``AttributeError`` on every example), which reads
    as the loader failing the kit. Three checks, in order, each only when the
    one before passed: the members (:data:`REQUIRED_MEMBERS`, with ``build``
    taking ``(corpus, config, topology, *, workdir)``, and ``refusal_types``
    when declared: a tuple of exception classes, none a bare builtin); the capabilities (each
    in :data:`CAPABILITIES`, and at least one order, packing mode and end
    policy, without which no config can be drawn); and one batch of a loader
    built on :data:`PROBE_CORPUS` with the first config the adapter declares
    (:func:`probe_case`), which must be a list of :class:`CanonicalRow`.
    The batch is not checked when the adapter needs a process group
    (``process_group = True``: the per-rank harness builds it), calls the case
    unsupported, or its ``build`` or loader raises: the tests grade that, with
    a reproduction. The loader is built once, on 32 tokens.

    >>> class Misspelt:
    ...     name, capabilities = "mine", frozenset({"ordering:sequential", "packing:concatt", "end:drop_last"})
    ...     def build(self, corpus, config, topology, *, workdir): ...
    >>> check_adapter(Misspelt(), workdir=Path("."))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    conformance.adapter.AdapterError: ...'packing:concatt' is not a capability (did you mean 'packing:concat'?)...
    """
    problems = _member_problems(adapter) + _refusal_problems(adapter)
    if not problems:
        problems = _capability_problems(adapter.capabilities)
    if not problems:
        problems = _batch_problems(adapter, workdir)
    if problems:
        raise AdapterError(f"adapter {_describe(adapter)} does not meet conformance.adapter's protocol:\n"
                           + "\n".join(f"  - {p}" for p in problems))


def _describe(adapter: Any) -> str:
    name = getattr(adapter, "name", None)
    kind = f"{type(adapter).__module__}.{type(adapter).__qualname__}"
    return f"{name!r} ({kind})" if isinstance(name, str) else kind


def _member_problems(adapter: Any) -> list[str]:
    problems = [f"it has no {m!r}: {_MEMBER_HINTS[m]}" for m in REQUIRED_MEMBERS if not hasattr(adapter, m)]
    name = getattr(adapter, "name", "")
    if not isinstance(name, str):
        problems.append(f"'name' is a {type(name).__name__}, expected a str")
    caps = getattr(adapter, "capabilities", frozenset())
    if not isinstance(caps, AbstractSet) or not all(isinstance(c, str) for c in caps):
        problems.append(f"'capabilities' is {caps!r}, expected a frozenset of str, e.g. {_EXAMPLE_CAPS}")
    build = getattr(adapter, "build", None)
    if build is not None and not callable(build):
        problems.append(f"'build' is a {type(build).__name__}, expected a method")
    elif build is not None:
        try:
            inspect.signature(build).bind(PROBE_CORPUS, None, None, workdir=Path("."))
        except TypeError:
            problems.append(f"'build{inspect.signature(build)}' cannot be called as "
                            "build(corpus, config, topology, *, workdir)")
        except ValueError:  # no signature to read (a builtin): the tests will tell
            pass
    return problems


def _refusal_problems(adapter: Any) -> list[str]:
    fix = ("declare the class the loader raises to refuse a state, e.g. refusal_types = (mylib.StateMismatch,), "
           "or make the loader raise reference.errors.StateError (a subclass of it), or declare refusal_types = () "
           "when it never refuses")
    problems = []
    if hasattr(adapter, "is_refusal"):
        problems.append(f"it defines is_refusal(exc), which the kit no longer reads (whether an exception is a "
                        f"refusal is declared up front, not decided per exception): {fix}")
    declared = getattr(adapter, "refusal_types", DEFAULT_REFUSAL_TYPES)
    if not isinstance(declared, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException)
                                                  for t in declared):
        return [*problems, f"'refusal_types' is {declared!r}, expected a tuple of exception classes: {fix}"]
    bare = [t.__name__ for t in declared if bare_builtin(t)]
    if bare:
        problems.append(f"'refusal_types' declares the bare builtin(s) {', '.join(bare)}: an unchecked assert, "
                        "index or key lookup raises those, so they cannot tell a refusal from a crash; " + fix)
    return problems


_EXAMPLE_CAPS = "frozenset({'resume', 'ordering:sequential', 'packing:concat', 'end:drop_last'})"
_MEMBER_HINTS = {
    "name": "a str naming the loader in reports, e.g. name = 'my-loader'",
    "capabilities": f"the frozenset of conformance.adapter.CAPABILITIES it supports, e.g. {_EXAMPLE_CAPS}",
    "build": "build(self, corpus, config, topology, *, workdir) returning one rank's loader, "
             "e.g. RowLoader(my_loader, to_rows)",
}


def _capability_problems(caps: AbstractSet[str]) -> list[str]:
    problems = []
    for cap in sorted(set(caps) - CAPABILITIES):
        near = difflib.get_close_matches(cap, sorted(CAPABILITIES), n=1)
        problems.append(f"{cap!r} is not a capability" + (f" (did you mean {near[0]!r}?)" if near else ""))
    for names, what in _FAMILIES.values():
        if not set(names) & set(caps):
            problems.append(f"it declares no {what} (one of {', '.join(names)}), so the kit can draw no config for it")
    if problems:
        problems.append(f"valid capabilities: {', '.join(sorted(CAPABILITIES))}")
    return problems


def probe_case(caps: AbstractSet[str]) -> tuple[PipelineConfig, Topology]:
    """The first config and topology the adapter declares, in the families' order: what :func:`check_adapter` builds.

    >>> config, topology = probe_case({"shuffle:seeded", "packing:chunk", "end:pad"})
    >>> config.ordering.kind, config.packing.mode, config.end, topology.batch_size
    ('global', 'chunk', 'pad', 2)
    """
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig

    order, mode, end = (next(n for n in names if n in caps).split(":")[1] for names, _ in _FAMILIES.values())
    config = PipelineConfig(ordering=OrderingConfig(kind="global" if order == "seeded" else order),  # type: ignore[arg-type]
                            packing=PackingConfig(seq_len=4, mode=mode), end=end)  # type: ignore[arg-type]
    return config, Topology(world_size=1, rank=0, batch_size=2)


def _batch_problems(adapter: Any, workdir: Path) -> list[str]:
    if getattr(adapter, "process_group", False):
        return []
    config, topology = probe_case(adapter.capabilities)
    loader = None
    try:
        if unsupported(adapter, PROBE_CORPUS, config, topology):
            return []
        loader = adapter.build(PROBE_CORPUS, config, topology, workdir=Path(workdir))
        problems = [f"build(...) returned a loader without {m}() though the adapter declares 'resume'"
                    for m in ("state_dict", "load_state_dict")
                    if "resume" in adapter.capabilities and not callable(getattr(loader, m, None))]
        if not hasattr(loader, "__iter__"):
            return [*problems, (f"build(...) returned a {type(loader).__name__}, which cannot be iterated; expected "
                                "a loader yielding one list of CanonicalRow per step, e.g. RowLoader(my_loader, to_rows)")]
        batch = next(iter(loader), None)
    except Exception:  # noqa: BLE001 - a build or loader that raises is the tests' to grade, with a reproduction
        return []
    finally:
        if loader is not None:
            with contextlib.suppress(Exception):  # so is a close() that raises
                close(loader)
    return problems + _shape_problems(batch, config, topology)


_ROW_FIELDS = ", ".join(f.name for f in fields(CanonicalRow))
_ROW_FIX = ("convert each batch in the adapter: RowLoader(my_loader, to_rows), where to_rows turns one batch into "
            "a list of rows (conformance.provenance.row_from_columns makes a row from a dict of its columns)")


def _shape_problems(batch: Any, config: PipelineConfig, topology: Topology) -> list[str]:
    """What is wrong with the first batch: the type found against ``list[CanonicalRow]``, naming the fix."""
    where = (f"the first batch (PROBE_CORPUS, ordering {config.ordering.kind!r}, packing {config.packing.mode!r} "
             f"seq_len {config.packing.seq_len}, end {config.end!r}, batch_size {topology.batch_size})")
    if batch is None:
        return []
    if not isinstance(batch, (list, tuple)):
        found = type(batch).__name__ + (f" with keys {sorted(map(str, batch))}" if isinstance(batch, Mapping) else "")
        return [f"{where} is a {found}; expected a list of CanonicalRow ({_ROW_FIELDS}), one per sample: {_ROW_FIX}"]
    for i, row in enumerate(batch):
        if not isinstance(row, CanonicalRow):
            found = type(row).__name__ + (f" with keys {sorted(map(str, row))}" if isinstance(row, Mapping) else "")
            return [(f"row {i} of {where} is a {found}; expected a conformance.adapter.CanonicalRow "
                     f"({_ROW_FIELDS}): {_ROW_FIX}")]
        bad = [f.name for f in fields(row) if not isinstance(getattr(row, f.name), int if f.name in
               ("epoch", "sample_index") else tuple)]
        if bad:
            return [(f"row {i} of {where} has {', '.join(f'{n}={getattr(row, n)!r}' for n in bad)}; expected "
                     "epoch and sample_index ints and the other fields tuples of ints (CanonicalRow.from_reference "
                     "and row_from_columns make them)")]
    return []
