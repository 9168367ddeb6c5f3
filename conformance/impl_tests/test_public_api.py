"""``import impl`` exposes the public API: every name the README uses, sorted, each importable."""

from __future__ import annotations

import re
from pathlib import Path

import impl

README = Path(__file__).resolve().parents[2] / "README.md"


def test_impl_all_is_sorted_unique_and_every_name_resolves():
    names = list(impl.__all__)
    assert names == sorted(names), f"impl.__all__ is not sorted: {names}"
    assert len(set(names)) == len(names), "impl.__all__ repeats a name"
    missing = [n for n in names if not hasattr(impl, n)]
    assert not missing, f"impl.__all__ names {missing}, which `import impl` does not define"


def test_every_name_the_readme_imports_from_impl_is_exported():
    text = README.read_text(encoding="utf-8")
    imported = set()
    for group in re.findall(r"^\s*from impl import (\([^)]*\)|[^\n]+)", text, flags=re.MULTILINE):
        imported |= {n.strip() for n in group.strip("()").replace("\n", ",").split(",") if n.strip()}
    assert imported, "the README shows no `from impl import ...` snippet"
    missing = sorted(imported - set(impl.__all__))
    assert not missing, f"the README imports {missing} from impl, but impl.__all__ does not export them"
