"""The loadspec conformance kit as a pytest plugin (registered by the ``pytest11`` entry point).

Why it is written as a guest: a ``pytest11`` entry point runs in *every*
project of the environment. So this module imports nothing optional at import
or configure time (hypothesis is imported only when a kit test runs), never
loads a hypothesis profile globally, and takes only namespaced names.

What it adds:
- ``--loadspec-loader module:factory`` (env ``LOADSPEC_LOADER``; default impl):
  the loader under test; the ``loadspec_adapter`` fixture returns the adapter
  it builds, and skips a test marked ``loadspec_capability(...)`` the loader lacks;
  ``loadspec_loader_spec`` is the spec itself (for the per-rank processes);
  a loader chosen explicitly is checked at configure time
  (``conformance.adapter.check_adapter``), each problem a usage error (exit 4),
  and its package is also looked for in the directory pytest was run from;
- the kit's hypothesis budget (``conformance.budget``, chosen by
  ``LOADSPEC_HYPOTHESIS_PROFILE``: ``ci`` by default, ``thorough``, ``dev``),
  applied to tests inside the ``conformance`` package only, through hypothesis's
  public ``@settings`` decorator (a test with its own ``@settings`` keeps it);
- ``--loadspec-xfails FILE`` / ``--loadspec-skips FILE``: one test id (or id
  prefix) per line, ``#`` comments, so a team can track its known failures
  (the array-api-tests convention);
- markers ``clause(id, ...)``, ``loadspec_capability(name, ...)``, ``loadspec_gloo`` and
  ``loadspec_processes`` (``clause`` keeps its short name: every test of the
  suites and of docs/SEMANTICS.md's meta test uses it);
- a report header naming the loader under test, its version and capabilities
  (when the kit's own tests run or a loader was chosen).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

DEFAULT_LOADER = "conformance.adapters.impl:adapter"
LOADER_ENV = "LOADSPEC_LOADER"
KIT_ROOT = Path(__file__).resolve().parent
INSTALL_HINT = "the loadspec conformance kit needs hypothesis: pip install 'loadspec[conformance]'"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loadspec", "loadspec conformance kit")
    group.addoption("--loadspec-loader", action="store", default=None, metavar="MODULE:FACTORY",
                    help=f"the loader under test; the factory returns a conformance.adapter.LoaderAdapter (default: "
                         f"${LOADER_ENV} or {DEFAULT_LOADER}; the reference is conformance.adapters.reference:adapter)")
    group.addoption("--loadspec-xfails", action="store", default=None, metavar="FILE",
                    help="file of test ids (one per line, # comments) the loader under test is known to fail: xfail")
    group.addoption("--loadspec-skips", action="store", default=None, metavar="FILE",
                    help="file of test ids (one per line, # comments) to skip for the loader under test")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(*ids): the docs/SEMANTICS.md clause(s) a test checks")
    config.addinivalue_line("markers", "loadspec_capability(*names): adapter capabilities the test needs; skipped "
                                       "when the loader under test lacks one")
    config.addinivalue_line("markers", "loadspec_gloo: multi-process torch.distributed (gloo) test")
    config.addinivalue_line("markers", "loadspec_processes: one process per rank (conformance.ranks)")
    explicit = config.getoption("--loadspec-loader") or os.environ.get(LOADER_ENV)
    if explicit and not config.getoption("help", False):
        check_chosen_loader(config, explicit)


def loader_spec(config: pytest.Config) -> str:
    return config.getoption("--loadspec-loader") or os.environ.get(LOADER_ENV) or DEFAULT_LOADER


def load_adapter(spec: str, *, search_dir: Path | None = None) -> Any:
    """Import ``module:factory`` and call the factory; errors name the fix.

    ``search_dir`` (the plugin passes the directory pytest was run from): when
    the module's top-level package is on no ``sys.path`` entry, it is looked
    for there, and that directory is *appended* to ``sys.path`` if it holds it.
    Why a guest may do this: the user named this module on the command line,
    the README runs ``pytest`` from the adapter's directory, and the ``pytest``
    script (unlike ``python -m pytest``) does not put that directory on the
    path; appending only after the import failed, for the package the user
    named, shadows nothing the host imports, and keeping it there lets the
    adapter's lazy imports and the per-rank processes (``conformance.ranks``
    passes ``sys.path`` on) find the package too. When the directory does not
    hold it either, the error says where to run from or what to put on
    ``PYTHONPATH``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise pytest.UsageError(f"--loadspec-loader {spec!r}: write it as module:factory, "
                                "e.g. conformance.adapters.reference:adapter")
    try:
        factory = getattr(_import_adapter_module(module_name, search_dir), attr)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"--loadspec-loader {spec!r} could not be imported: {exc}") from exc
    try:
        return factory()
    except Exception as exc:
        raise pytest.UsageError(f"--loadspec-loader {spec!r}: calling {attr}() raised "
                                f"{type(exc).__name__}: {exc}") from exc


def _import_adapter_module(module_name: str, search_dir: Path | None) -> Any:
    top = module_name.split(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != top:
            raise
        directory = str(Path(search_dir or Path.cwd()).resolve())
        holds = (Path(directory) / top).is_dir() or (Path(directory) / f"{top}.py").is_file()
        if search_dir is None or not holds or directory in sys.path:
            raise ModuleNotFoundError(
                f"No module named {top!r}, on sys.path or in {directory}: run pytest from the directory that holds "
                f"{top}/ (or {top}.py), or put that directory on the path: PYTHONPATH=/path/to/it pytest ...",
                name=top) from exc
    sys.path.append(directory)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def check_chosen_loader(config: pytest.Config, spec: str) -> None:
    """Load the chosen adapter and check it (``conformance.adapter.check_adapter``); any problem is a usage error.

    Why at configure time: an adapter that breaks the protocol would otherwise
    fail every test with the same ``AttributeError`` or hypothesis error, read
    as the loader failing the kit; a usage error (exit code 4) names each
    problem once, before any test runs. Only for a loader chosen explicitly
    (``--loadspec-loader`` or ``$LOADSPEC_LOADER``): a host project that merely
    has the plugin installed pays nothing. It costs one import and one tiny
    loader built on 32 tokens.
    """
    import tempfile

    from conformance.adapter import AdapterError, check_adapter

    adapter = load_adapter(spec, search_dir=config.invocation_params.dir)
    with tempfile.TemporaryDirectory(prefix="loadspec-check-") as workdir:
        try:
            check_adapter(adapter, workdir=Path(workdir))
        except AdapterError as exc:
            raise pytest.UsageError(f"--loadspec-loader {spec}: {exc}") from exc


def _runs_kit(config: pytest.Config) -> bool:
    explicit = config.getoption("--loadspec-loader") or os.environ.get(LOADER_ENV)
    return bool(explicit) or (KIT_ROOT.parent / "pyproject.toml").exists() and Path(config.rootpath) == KIT_ROOT.parent


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not _runs_kit(config):
        return None
    spec = loader_spec(config)
    try:
        adapter = load_adapter(spec)
    except pytest.UsageError as exc:
        return [f"loadspec: loader under test {spec}: {exc}"]
    version = getattr(adapter, "version", None) or "unversioned"
    caps = ", ".join(sorted(adapter.capabilities))
    return [f"loadspec: loader under test {adapter.name} {version} ({spec})", f"loadspec: capabilities: {caps}"]


# --------------------------------------------------------------------------- the adapter fixture


@pytest.fixture(scope="session")
def _loadspec_session_adapter(request: pytest.FixtureRequest) -> Any:
    return load_adapter(loader_spec(request.config))


@pytest.fixture(scope="session")
def loadspec_loader_spec(request: pytest.FixtureRequest) -> str:
    """The ``module:factory`` of the loader under test (what each rank of ``conformance.ranks`` imports)."""
    return loader_spec(request.config)


@pytest.fixture
def loadspec_adapter(request: pytest.FixtureRequest, _loadspec_session_adapter: Any) -> Any:
    """The adapter of the loader under test; a test marked ``loadspec_capability(...)`` it lacks is skipped."""
    marker = request.node.get_closest_marker("loadspec_capability")
    if marker is not None:
        missing = [c for c in marker.args if c not in _loadspec_session_adapter.capabilities]
        if missing:
            pytest.skip(f"loader {_loadspec_session_adapter.name!r} lacks capabilities {missing}")
    return _loadspec_session_adapter


# --------------------------------------------------------------------------- known failures and the budget


def read_id_file(path: str) -> list[str]:
    """Test ids of an xfails/skips file: one per line, blank lines and ``#`` comments ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise pytest.UsageError(f"cannot read the loadspec id file {path!r}: {exc}") from exc
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def _matches(nodeid: str, entry: str) -> bool:
    return nodeid == entry or nodeid.startswith((entry + "[", entry + "::")) or nodeid.endswith(("/" + entry, "::" + entry)) or "/" + entry + "[" in nodeid


def _in_kit(item: pytest.Item) -> bool:
    try:
        return Path(str(item.path)).resolve().is_relative_to(KIT_ROOT)
    except (OSError, ValueError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for option, mark in (("--loadspec-xfails", "xfail"), ("--loadspec-skips", "skip")):
        path = config.getoption(option)
        if not path:
            continue
        entries = read_id_file(path)
        used: set[str] = set()
        for item in items:
            for entry in entries:
                if _matches(item.nodeid, entry):
                    used.add(entry)
                    reason = f"listed in {option} {path}"
                    item.add_marker(pytest.mark.xfail(reason=reason, strict=False) if mark == "xfail"
                                    else pytest.mark.skip(reason=reason))
                    break
        for entry in entries:
            if entry not in used:
                warnings.warn(f"{option} {path}: {entry!r} matches no collected test", stacklevel=1)
    for item in items:
        if _in_kit(item):
            _apply_kit_budget(item)


def _apply_kit_budget(item: pytest.Item) -> None:
    """Give a kit hypothesis test without its own ``@settings`` the kit's budget (``budget.apply_kit_budget``)."""
    from conformance.budget import apply_kit_budget

    apply_kit_budget(getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None)))
