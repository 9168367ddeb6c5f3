"""impl's modules import one another without circles, and none imports another's private names.

Why a test: a circle (``build`` importing ``store`` importing ``build``
back, even lazily inside a function) means neither module can be read,
tested or changed alone, and a private name borrowed across modules is a
fact with two owners that a refactor of its owner silently breaks. Every
import in ``impl/*.py`` is read with ``ast``, at module level or inside a
function or method; imports under ``if TYPE_CHECKING:`` are left out, since
they never run. ``from impl import x`` counts as an import of ``impl.x``
when ``x`` is a module, else of the package ``impl``.
"""

from __future__ import annotations

import ast
from pathlib import Path

IMPL = Path(__file__).resolve().parents[2] / "impl"

KNOWN_PRIVATE_IMPORTS: frozenset[tuple[str, str, str]] = frozenset()
"""``(importer, module, name)``: private imports allowed across impl modules. Empty: no private name crosses a
module boundary; an entry added here must still exist (:func:`test_every_known_private_import_still_exists`).
"""


def module_name(path: Path) -> str:
    return "impl" if path.stem == "__init__" else f"impl.{path.stem}"


def impl_sources() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in sorted(IMPL.glob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def impl_imports(module: str, source: str, modules: frozenset[str]) -> list[tuple[int, str, str]]:
    r"""``(line, imported module, name)`` for each import of impl in ``source``; ``name`` is ``*`` for a whole module.

    >>> mods = frozenset({"impl", "impl.a", "impl.b", "impl.c"})
    >>> impl_imports("impl.a", "def f():\n    from impl.b import _x, y\nfrom impl import c, Thing\n", mods)
    [(2, 'impl.b', '_x'), (2, 'impl.b', 'y'), (3, 'impl', 'Thing'), (3, 'impl.c', '*')]
    >>> impl_imports("impl.a", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import impl.b\n", mods)
    []
    >>> impl_imports("impl.a", "from .b import y\nimport impl.c as c\n", mods)
    [(1, 'impl.b', 'y'), (2, 'impl.c', '*')]
    """
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = "impl" + (f".{target}" if target else "")
            if target == "impl" or target.startswith("impl."):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.append((node.lineno, sub, "*") if target == "impl" and sub in modules
                                 else (node.lineno, target, alias.name))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, "*") for alias in node.names
                         if alias.name == "impl" or alias.name.startswith("impl."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return sorted(found)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each module's imported impl modules (itself left out)."""
    modules = frozenset(sources)
    return {name: {target for _, target, _ in impl_imports(name, source, modules) if target != name}
            for name, source in sources.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk meets, as ``[a, b, ..., a]`` (each circle once, from its first module).

    >>> import_cycles({"impl.a": {"impl.b"}, "impl.b": {"impl.c"}, "impl.c": {"impl.a"}, "impl.d": {"impl.a"}})
    [['impl.a', 'impl.b', 'impl.c', 'impl.a']]
    >>> import_cycles({"impl.a": {"impl.b"}, "impl.b": set()})
    []
    """
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    done: set[str] = set()
    stack: list[str] = []

    def walk(node: str) -> None:
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target in stack:
                cycle = [*stack[stack.index(target):], target]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append(cycle)
            elif target not in done:
                walk(target)
        stack.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            walk(node)
    return cycles


def private_imports(sources: dict[str, str]) -> set[tuple[str, str, str]]:
    """``(importer, module, name)`` for each import of a name with a leading underscore from another impl module."""
    modules = frozenset(sources)
    return {(name, target, imported) for name, source in sources.items()
            for _, target, imported in impl_imports(name, source, modules)
            if target != name and imported.startswith("_") and not imported.startswith("__")}


def test_no_impl_module_imports_a_module_that_imports_it_back():
    cycles = import_cycles(import_graph(impl_sources()))
    assert not cycles, "impl modules import each other in a circle (move what both need into a module of its own):\n" \
        + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_impl_module_imports_a_private_name_of_another():
    borrowed = sorted(private_imports(impl_sources()) - KNOWN_PRIVATE_IMPORTS)
    assert not borrowed, "impl modules import private names of other modules (make the name public in its owner, " \
        "or move it to a module both import):\n" + "\n".join(f"{a}: from {m} import {n}" for a, m, n in borrowed)


def test_every_known_private_import_still_exists():
    gone = sorted(KNOWN_PRIVATE_IMPORTS - private_imports(impl_sources()))
    assert not gone, f"these private imports are gone: remove them from KNOWN_PRIVATE_IMPORTS: {gone}"


def test_the_store_its_writer_and_its_format_borrow_no_private_names():
    store_modules = {"impl.store", "impl.build", "impl.store_format"}
    assert not {entry for entry in KNOWN_PRIVATE_IMPORTS if {entry[0], entry[1]} & store_modules}
    assert not {entry for entry in private_imports(impl_sources()) if {entry[0], entry[1]} & store_modules}


def test_the_checks_find_a_lazy_circle_and_a_private_name_and_skip_type_checking_imports():
    sources = {"impl": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from impl.a import A\n",
               "impl.a": "from impl import b\nclass A:\n    def build(self):\n        from impl.c import _helper\n",
               "impl.b": "from impl.errors import ConfigError\n",
               "impl.c": "import impl.a\n",
               "impl.errors": "from impl import ConfigError\n"}
    assert import_cycles(import_graph(sources)) == [["impl.a", "impl.c", "impl.a"]]
    assert private_imports(sources) == {("impl.a", "impl.c", "_helper")}


#: The token store's private members that hold or reach its mapped bytes: only ``impl/store.py`` may touch them.
STORE_MAPPINGS = frozenset({"_map", "_part", "_mapped", "_blocks", "_values", "_offsets", "_map_file", "_check_span",
                            "_verify_documents", "_verify_span", "_tables", "_files"})


def store_mapping_uses(module: str, source: str) -> list[tuple[int, str]]:
    r"""``(line, name)`` of each ``x._name`` in ``source`` with ``_name`` a store mapping and ``x`` not ``self``.

    >>> store_mapping_uses("impl.fill", "def f(store):\n    return store._map(0)\nclass A:\n    def g(self):\n        self._map\n")
    [(2, '_map')]
    """
    return [(node.lineno, node.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in STORE_MAPPINGS
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def test_no_impl_module_but_the_store_reaches_into_a_stores_mappings():
    found = [f"{module}:{line}: .{name}" for module, source in impl_sources().items() if module != "impl.store"
             for line, name in store_mapping_uses(module, source)]
    assert not found, "these modules read a store's mappings around its checked read (use TokenStore.read_runs / " \
        "document_bounds_batch):\n" + "\n".join(found)
