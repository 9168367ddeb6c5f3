"""Meta test: every clause in docs/SEMANTICS.md has a reference function and a test that cites it."""

from __future__ import annotations

import re
from pathlib import Path

from conformance.assertions import check

ROOT = Path(__file__).resolve().parents[2]
CLAUSE_HEADING = re.compile(r"^### ([A-Z]+-\d+): (.+)$", re.MULTILINE)


def _clauses() -> dict[str, str]:
    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    return dict(CLAUSE_HEADING.findall(text))


def _text_of(folder: str) -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / folder).rglob("*.py")))


def test_semantics_lists_clauses_with_a_sentence_and_an_example_each():
    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    clauses = _clauses()
    check(len(clauses) >= 40, clause="DOC", what=f"only {len(clauses)} clauses found in docs/SEMANTICS.md")
    for cid in clauses:
        body = text.split(f"### {cid}:", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        check("Example" in body, clause=cid, what="clause has no worked example")


def test_every_clause_is_cited_by_a_reference_function():
    reference = _text_of("reference")
    missing = [cid for cid in _clauses() if not re.search(rf"\b{cid}\b", reference)]
    check(not missing, clause="DOC", what=f"clauses no reference docstring cites: {missing}")


def test_every_clause_has_a_test_marked_with_it():
    tests = _text_of("conformance")
    missing = [cid for cid in _clauses() if not re.search(rf"clause\([^)]*\"{cid}\"", tests)]
    check(not missing, clause="DOC", what=f"clauses no test is marked with: {missing}")


def test_clause_ids_are_unique_and_numbered_consecutively():
    ids = CLAUSE_HEADING.findall((ROOT / "docs" / "SEMANTICS.md").read_text())
    names = [cid for cid, _ in ids]
    check(len(names) == len(set(names)), clause="DOC", what="duplicate clause ids")
    by_prefix: dict[str, list[int]] = {}
    for cid in names:
        prefix, num = cid.split("-")
        by_prefix.setdefault(prefix, []).append(int(num))
    for prefix, nums in by_prefix.items():
        check(sorted(nums) == list(range(1, len(nums) + 1)), clause="DOC", what=f"{prefix} numbered {sorted(nums)}")
