"""The kit's pytest plugin is a guest in other projects, and its own switches work (pytester, one subprocess each).

Why subprocesses: the plugin is loaded the way a host project loads it, with
``-p conformance.plugin`` and entry-point autoloading off, so each test sees
exactly one copy of it and controls which packages are importable (a host
without hypothesis is simulated by a module that refuses to import).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "conformance" / "examples" / "third_party.py"


def _run(pytester: pytest.Pytester, *args: str, block_hypothesis: bool = False, **env: str) -> pytest.RunResult:
    paths = [str(REPO)]
    if block_hypothesis:
        blocker = pytester.mkpydir("blocker")
        (blocker / "hypothesis").mkdir()
        (blocker / "hypothesis" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n")
        paths.insert(0, str(blocker))
    pytester._monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    pytester._monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester._monkeypatch.delenv("LOADSPEC_LOADER", raising=False)
    for key, value in env.items():
        pytester._monkeypatch.setenv(key, value)
    return pytester.runpytest_subprocess("-p", "conformance.plugin", "-p", "no:cacheprovider", *args, timeout=300)


def test_a_host_project_without_hypothesis_still_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_host="""
        import pytest

        def test_hypothesis_is_really_absent():
            with pytest.raises(ImportError):
                import hypothesis  # noqa: F401

        def test_host_code():
            assert sum([1, 2]) == 3
    """)
    result = _run(pytester, block_hypothesis=True)
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_kit_test_without_hypothesis_is_skipped_with_an_install_hint(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--pyargs", "conformance.tests.test_any_loader", "-rs", block_hypothesis=True)
    result.assert_outcomes(skipped=1)
    assert "pip install 'loadspec[conformance]'" in result.stdout.str()


def test_a_host_projects_own_hypothesis_profile_is_untouched(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        from hypothesis import settings
        settings.register_profile("host", max_examples=7)
        settings.load_profile("host")
    """)
    pytester.makepyfile(test_host="""
        from hypothesis import given, settings, strategies as st

        CALLS = []

        @given(st.integers())
        def test_draws(x):
            CALLS.append(x)

        def test_the_host_budget_held():
            assert settings.default.max_examples == 7
            assert 0 < len(CALLS) <= 7
    """)
    result = _run(pytester, "-p", "no:randomly", LOADSPEC_HYPOTHESIS_PROFILE="thorough")
    result.assert_outcomes(passed=2)


def test_a_host_with_its_own_loader_option_and_fixture_still_works(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest

        def pytest_addoption(parser):
            parser.addoption("--loader", default="default")

        @pytest.fixture
        def loader(request):
            return request.config.getoption("--loader")
    """)
    pytester.makepyfile(test_host="""
        def test_my_loader(loader):
            assert loader == "mine"
    """)
    result = _run(pytester, "--loader", "mine")
    result.assert_outcomes(passed=1)


def test_the_report_header_names_the_loader_its_version_and_capabilities(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_host="def test_ok():\n    pass\n")
    result = _run(pytester, "--loadspec-loader", "conformance.examples.third_party:adapter")
    result.stdout.fnmatch_lines(["loadspec: loader under test tiny-loader 1.0 (conformance.examples.third_party:adapter)",
                                 "loadspec: capabilities: *elastic*resume*shuffle:seeded*"])
    result.assert_outcomes(passed=1)


def test_a_host_run_without_a_chosen_loader_prints_no_loadspec_header(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_host="def test_ok():\n    pass\n")
    result = _run(pytester)
    assert "loadspec:" not in result.stdout.str()
    result.assert_outcomes(passed=1)


def test_xfails_and_skips_files_mark_the_listed_tests_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_known="""
        def test_known_failure():
            assert False

        def test_flaky_peer():
            assert False

        def test_fine():
            pass
    """)
    xfails = pytester.path / "xfails.txt"
    xfails.write_text("# known failures of our loader\ntest_known.py::test_known_failure  # issue 12\n")
    skips = pytester.path / "skips.txt"
    skips.write_text("test_known.py::test_flaky_peer\n")
    result = _run(pytester, "--loadspec-xfails", str(xfails), "--loadspec-skips", str(skips), "-rxs")
    result.assert_outcomes(passed=1, xfailed=1, skipped=1)


def test_the_worked_third_party_example_passes_every_property_it_claims(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--pyargs", "conformance.tests.test_any_loader", "conformance.tests.test_loader",
                  "--loadspec-loader", "conformance.examples.third_party:adapter", "-p", "no:randomly",
                  LOADSPEC_HYPOTHESIS_PROFILE="dev")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes.get("passed", 0) >= 7


# --------------------------------------------------------------------------- the chosen adapter is checked at load


def _adapter_package(root: Path, *edits: tuple[str, str]) -> Path:
    """``root/mypkg/adapter.py``: the worked example (``conformance/examples/third_party.py``) with ``edits`` applied."""
    source = EXAMPLE.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in source, f"the worked example no longer contains {old!r}"
        source = source.replace(old, new)
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "adapter.py").write_text(source)
    return root


def _run_kit_on_mypkg(pytester: pytest.Pytester, *edits: tuple[str, str]) -> tuple[pytest.RunResult, str]:
    _adapter_package(pytester.path, *edits)
    result = _run(pytester, "--pyargs", "conformance.tests.test_any_loader", "--loadspec-loader", "mypkg.adapter:adapter",
                  "-x", "-p", "no:randomly", LOADSPEC_HYPOTHESIS_PROFILE="dev")
    return result, result.stdout.str() + result.stderr.str()


def test_a_misspelt_capability_is_a_usage_error_naming_the_valid_ones_and_the_nearest_match(
        pytester: pytest.Pytester) -> None:
    result, output = _run_kit_on_mypkg(pytester, ('"packing:concat",\n', '"packing:concatt",\n'),
                                       ('"packing:chunk", ', ""))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert "'packing:concatt' is not a capability (did you mean 'packing:concat'?)" in output
    assert "valid capabilities: bit_exact, elastic, end:drop_last, end:even, end:pad, ordering:buffer" in output
    assert "InvalidArgument" not in output and "passed" not in output


@pytest.mark.parametrize("member", ["build", "capabilities"])
def test_an_adapter_without_a_required_member_is_a_usage_error_naming_it(pytester: pytest.Pytester,
                                                                         member: str) -> None:
    edit = ("def build(", "def make(") if member == "build" else ("capabilities = ", "features = ")
    result, output = _run_kit_on_mypkg(pytester, edit)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert f"it has no '{member}'" in output
    assert "AttributeError" not in output


def test_an_adapter_yielding_plain_dict_batches_is_a_usage_error_naming_the_expected_shape(
        pytester: pytest.Pytester) -> None:
    result, output = _run_kit_on_mypkg(pytester, ("return RowLoader(loader, lambda batch:", "return loader  # ("))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert ("row 0 of the first batch (PROBE_CORPUS, ordering 'sequential', packing 'concat' seq_len 4, "
            "end 'drop_last', batch_size 2) is a dict with keys "
            "['doc_ids', 'input_ids', 'labels', 'position_ids', 'token_offsets']") in output
    assert ("expected a conformance.adapter.CanonicalRow "
            "(epoch, sample_index, input_ids, labels, position_ids, doc_ids, token_offsets)") in output
    assert "AttributeError" not in output


def _pytest_script(cwd: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """``pytest ARGS`` as the README runs it: the console script, which (unlike ``python -m pytest``, and unlike
    pytester, which puts its directory on ``PYTHONPATH``) does not put the working directory on ``sys.path``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **env_vars)
    env.pop("LOADSPEC_LOADER", None)
    return subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_readme_command_run_from_the_adapters_directory_finds_the_adapter_and_runs_the_kit(
        pytester: pytest.Pytester) -> None:
    project = _adapter_package(pytester.path / "project")
    done = _pytest_script(project, "--pyargs", "conformance.tests", "--loadspec-loader", "mypkg.adapter:adapter",
                          "-k", "test_every_input_and_label_is_the_corpus_token_its_provenance_names",
                          "-p", "no:randomly", LOADSPEC_HYPOTHESIS_PROFILE="dev")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "loadspec: loader under test tiny-loader 1.0 (mypkg.adapter:adapter)" in done.stdout
    assert "1 passed" in done.stdout


def test_an_adapter_package_found_nowhere_is_a_usage_error_saying_where_to_run_from(pytester: pytest.Pytester) -> None:
    _adapter_package(pytester.path / "project")
    elsewhere = pytester.mkdir("elsewhere")
    done = _pytest_script(elsewhere, "--pyargs", "conformance.tests", "--loadspec-loader", "mypkg.adapter:adapter",
                          "--collect-only", "-q")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "run pytest from the directory that holds mypkg/ (or mypkg.py)" in done.stderr
    assert "PYTHONPATH=" in done.stderr
