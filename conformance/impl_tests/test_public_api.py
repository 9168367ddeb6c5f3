"""``import impl`` exposes the public API: every name the README uses, sorted, each importable."""

from __future__ import annotations

import re
from pathlib import Path

import impl

README = Path(__file__).resolve().parents[2] / "README.md"
RECIPES = README.parent / "docs" / "RECIPES.md"


def test_impl_all_is_sorted_unique_and_every_name_resolves():
    names = list(impl.__all__)
    assert names == sorted(names), f"impl.__all__ is not sorted: {names}"
    assert len(set(names)) == len(names), "impl.__all__ repeats a name"
    missing = [n for n in names if not hasattr(impl, n)]
    assert not missing, f"impl.__all__ names {missing}, which `import impl` does not define"


def test_every_name_the_readme_and_the_recipes_import_from_impl_is_exported():
    text = README.read_text(encoding="utf-8") + RECIPES.read_text(encoding="utf-8")
    imported = set()
    for group in re.findall(r"^\s*from impl import (\([^)]*\)|[^\n]+)", text, flags=re.MULTILINE):
        imported |= {n.strip() for n in group.strip("()").replace("\n", ",").split(",") if n.strip()}
    assert imported, "the README and docs/RECIPES.md show no `from impl import ...` snippet"
    missing = sorted(imported - set(impl.__all__))
    assert not missing, f"the README imports {missing} from impl, but impl.__all__ does not export them"


def _readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the README, as a user would paste it."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index(heading):]
    return after.split("```python\n", 1)[1].split("```\n", 1)[0]


def test_the_readmes_training_snippet_runs_as_pasted_and_resumes_from_the_checkpoint_it_writes(tmp_path):
    """The snippet creates ``ckpt/`` itself; run it on 30 KJV chapters in ``data/``, then again to resume."""
    import json
    import subprocess
    import sys

    (tmp_path / "fixtures").symlink_to(README.parent / "fixtures")
    (tmp_path / "data").mkdir()
    lines = (README.parent / "fixtures" / "data" / "kjv_chapters.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp_path / "data" / "kjv.jsonl").write_text("\n".join(lines[:30]) + "\n", encoding="utf-8")
    (tmp_path / "train.py").write_text(_readme_block("## Using it in training"), encoding="utf-8")
    for run in ("first", "resumed"):
        done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                              check=False)
        assert done.returncode == 0, f"the {run} run of the README's training snippet failed:\n{done.stderr[-3000:]}"
        state = json.loads((tmp_path / "ckpt" / "loader.json").read_text())
        assert state["format"] == "loadspec.state" and state["epoch"] == 1, f"after the {run} run: {state}"


def test_every_recipe_in_docs_recipes_runs_as_pasted_from_the_repository_root(tmp_path):
    import subprocess
    import sys

    (tmp_path / "fixtures").symlink_to(README.parent / "fixtures")
    blocks = RECIPES.read_text(encoding="utf-8").split("```python\n")[1:]
    assert len(blocks) >= 2, "docs/RECIPES.md lost its snippets"
    for k, block in enumerate(blocks):
        (tmp_path / f"recipe{k}.py").write_text(block.split("```\n", 1)[0], encoding="utf-8")
        done = subprocess.run([sys.executable, f"recipe{k}.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, f"recipe {k} of docs/RECIPES.md failed:\n{done.stderr[-3000:]}"


def test_the_readmes_streaming_and_object_storage_snippets_run_as_pasted(tmp_path):
    import subprocess
    import sys

    (tmp_path / "fixtures").symlink_to(README.parent / "fixtures")
    for heading in ("### Streaming raw text", "### From object storage"):
        (tmp_path / "snippet.py").write_text(_readme_block(heading), encoding="utf-8")
        done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, f"the README's {heading!r} snippet failed:\n{done.stderr[-3000:]}"
        assert "torch.Size([" in done.stdout, done.stdout
