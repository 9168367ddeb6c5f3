"""What ``pip install loadspec`` puts in an environment, and how the shipped modules behave there.

Why: loadspec is installed beside a project's own packages and its own test
plugins. A top-level ``fixtures`` package would shadow PyPI's ``fixtures``; a
shipped module that imports ``benchmarks`` (not installed) or edits
``sys.path`` works only in a checkout; a plugin that writes hypothesis's
private attributes breaks when hypothesis renames them. The package list is
setuptools' own reading of pyproject.toml (``read_configuration`` expands
``packages.find`` as a wheel build does), so these tests see what a wheel
ships, not a copy of the configuration.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from setuptools.config.pyprojecttoml import read_configuration

REPO = Path(__file__).resolve().parents[2]

# The one sys.path edit a shipped module may make, documented in its docstring: after the user's
# --loadspec-loader module failed to import, append the directory pytest was run from if it holds the package.
ALLOWED_SYS_PATH_EDITS = {("conformance/plugin.py", "_import_adapter_module", "append")}


def _setuptools_config() -> dict:
    return read_configuration(REPO / "pyproject.toml", expand=True)["tool"]["setuptools"]


def _shipped_modules() -> list[Path]:
    packages = _setuptools_config()["packages"]
    return sorted(p for name in packages for p in (REPO / name.replace(".", "/")).glob("*.py"))


def _enclosing_functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node's innermost enclosing function (``ast.walk`` visits outer functions first)."""
    owner: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            owner.update((node, fn.name) for node in ast.walk(fn) if node is not fn)
    return owner


def _offences(path: Path, root: Path = REPO) -> list[str]:
    rel = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    owner = _enclosing_functions(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] == "benchmarks"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "benchmarks":
            found.append(f"{where} imports from {node.module}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "path"
              and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "sys"
              and node.func.attr in ("insert", "append", "extend")
              and (rel, owner.get(node), node.func.attr) not in ALLOWED_SYS_PATH_EDITS):
            found.append(f"{where} calls sys.path.{node.func.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_hypothesis"):
            found.append(f"{where} writes hypothesis's private attribute {node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and str(node.args[1].value).startswith("_hypothesis")):
            found.append(f"{where} writes hypothesis's private attribute {node.args[1].value}")
    return found


def test_the_wheel_installs_no_top_level_fixtures_package_only_loadspecs_own_three() -> None:
    config = _setuptools_config()
    packages = config["packages"]
    assert "impl" in packages and "reference" in packages and "conformance.adapters.peers" in packages
    assert {name.split(".")[0] for name in packages} == {"impl", "reference", "conformance"}, packages
    assert "fixtures" not in (config.get("package-data") or {}), config.get("package-data")


def test_no_shipped_module_imports_benchmarks_edits_sys_path_or_writes_private_hypothesis_attributes() -> None:
    modules = _shipped_modules()
    assert REPO / "conformance" / "adapters" / "peers" / "mosaicml.py" in modules
    offences = [o for path in modules for o in _offences(path)]
    assert offences == []


def test_the_check_finds_each_kind_of_offence_and_allows_only_the_documented_append(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport benchmarks.peers\nfrom benchmarks import harness\nsys.path.insert(0, '.')\n"
                   "def f(fn):\n    fn._hypothesis_internal_use_settings = 1\n    setattr(fn, '_hypothesis_x', 2)\n")
    kinds = [o.split(" ", 1)[1] for o in _offences(bad, root=tmp_path)]
    assert kinds == ["imports benchmarks.peers", "imports from benchmarks", "calls sys.path.insert",
                     "writes hypothesis's private attribute _hypothesis_internal_use_settings",
                     "writes hypothesis's private attribute _hypothesis_x"]
    assert _offences(REPO / "conformance" / "plugin.py") == []
    source = (REPO / "conformance" / "plugin.py").read_text(encoding="utf-8")
    assert "    sys.path.append(directory)\n" in source  # the documented one is still there, and still allowed


def test_the_wheel_ships_no_demo_the_demos_live_in_the_checkouts_demos_folder() -> None:
    packages = _setuptools_config()["packages"]
    shipped_demos = [p.relative_to(REPO).as_posix() for p in _shipped_modules() if p.stem.startswith("demo")]
    assert shipped_demos == [] and not any(name.split(".")[0] == "demos" for name in packages), (shipped_demos, packages)
    assert (REPO / "demos" / "train_resume.py").is_file() and (REPO / "demos" / "mixture.py").is_file()


def _user_fixtures_package(tmp_path: Path) -> Path:
    """A ``fixtures`` package of the user's own (as PyPI's would be) whose ``generators`` must never be imported."""
    stub = tmp_path / "site" / "fixtures"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("WHOSE = 'the user'\n")
    (stub / "generators.py").write_text("raise ImportError('loadspec imported the user\\'s fixtures')\n")
    return stub.parent


def test_the_walkthrough_reads_the_checkouts_fixtures_beside_a_users_own_fixtures_package(tmp_path: Path) -> None:
    site = _user_fixtures_package(tmp_path)
    code = ("import conformance.walkthrough\n"
            "from impl.repo_fixtures import generators\n"
            "texts = generators().load_corpus(limit=2)\n"
            "assert len(texts) == 2 and texts[0].startswith('In the beginning'), texts[0][:40]\n"
            "import sys, fixtures\n"
            "assert fixtures.WHOSE == 'the user' and 'fixtures.generators' not in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_demos_run_from_the_checkout_import_its_fixtures_before_a_users_own(tmp_path: Path) -> None:
    site = _user_fixtures_package(tmp_path)
    code = ("import demos.train_resume, demos.mixture, fixtures\n"
            "print(fixtures.generators.__file__)\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert Path(done.stdout.strip()) == REPO / "fixtures" / "generators.py", done.stdout


def test_the_walkthrough_without_the_checkouts_fixtures_names_the_missing_path(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance import walkthrough
    from impl import repo_fixtures
    from impl.errors import FixturesNotFoundError, LoadspecError

    missing = tmp_path / "site-packages" / "fixtures"
    monkeypatch.setattr(repo_fixtures, "FIXTURES_DIR", missing)
    with pytest.raises(FixturesNotFoundError) as raised:
        walkthrough.main()
    assert str(missing / "generators.py") in str(raised.value) and "make demo" in str(raised.value)
    assert isinstance(raised.value, LoadspecError) and isinstance(raised.value, FileNotFoundError)


def test_the_plugin_gives_a_kit_hypothesis_test_the_kit_budget_and_leaves_its_own_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance import plugin
    from conformance.budget import kit_settings

    monkeypatch.setenv("LOADSPEC_HYPOTHESIS_PROFILE", "dev")  # 10 examples, where hypothesis's default is 100
    calls: list[int] = []

    @given(st.integers())
    def plain(x: int) -> None:
        calls.append(x)

    @kit_settings(max_examples=3)
    @given(st.integers())
    def own(x: int) -> None:
        calls.append(x)

    plugin._apply_kit_budget(SimpleNamespace(obj=plain))
    plain()
    assert 0 < len(calls) <= 10
    plugin._apply_kit_budget(SimpleNamespace(obj=own))  # hypothesis refuses a second @settings: it keeps its own
    calls.clear()
    own()
    assert 0 < len(calls) <= 3
