"""Assertion helpers that name the clause and print a reproduction.

Why: a conformance failure is only useful if it says which rule broke and how
to replay it. Every helper hides its own frame (``__tracebackhide__``) and
raises ``ClauseViolation`` whose message reads
``[PACK-3] labels=..., but should be ... | repro: corpus=..., config=..., rank=1/2, step=7``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_MAX_REPR = 600


class ClauseViolation(AssertionError):
    """A loader broke a numbered clause of docs/SEMANTICS.md."""

    def __init__(self, clause: str, message: str, repro: Mapping[str, Any] | None = None) -> None:
        self.clause = clause
        self.repro = dict(repro or {})
        text = f"[{clause}] {message}"
        if self.repro:
            text += " | repro: " + ", ".join(f"{k}={_short(v)}" for k, v in self.repro.items())
        super().__init__(text)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 20] + f"... ({len(text)} chars)"


def check(condition: bool, *, clause: str, what: str, repro: Mapping[str, Any] | None = None) -> None:
    """Fail with ``what`` unless ``condition``."""
    __tracebackhide__ = True
    if not condition:
        raise ClauseViolation(clause, what, repro)


def assert_equal(actual: Any, expected: Any, *, clause: str, what: str, repro: Mapping[str, Any] | None = None) -> None:
    """``what=actual, but should be expected``, with the first differing position for sequences."""
    __tracebackhide__ = True
    if actual == expected:
        return
    detail = f"{what}={_short(actual)}, but should be {_short(expected)}"
    if isinstance(actual, Sequence) and isinstance(expected, Sequence) and not isinstance(actual, str):
        first = next((i for i, (a, e) in enumerate(zip(actual, expected)) if a != e), min(len(actual), len(expected)))
        detail += f" (first difference at position {first}; lengths {len(actual)} vs {len(expected)})"
    raise ClauseViolation(clause, detail, repro)


def assert_exactly_once(seen: Iterable[Any], universe: Iterable[Any], *, clause: str, what: str,
                        repro: Mapping[str, Any] | None = None) -> None:
    """Every element of ``universe`` occurs in ``seen`` exactly once, and nothing else does."""
    __tracebackhide__ = True
    counts = Counter(seen)
    expected = Counter(universe)
    duplicated = sorted((k for k, c in counts.items() if c > expected.get(k, 0) and k in expected), key=repr)
    missing = sorted((k for k in expected if counts.get(k, 0) < expected[k]), key=repr)
    foreign = sorted((k for k in counts if k not in expected), key=repr)
    if duplicated or missing or foreign:
        raise ClauseViolation(
            clause,
            f"{what}: duplicated={_short(duplicated[:20])} ({len(duplicated)}), missing={_short(missing[:20])} "
            f"({len(missing)}), foreign={_short(foreign[:20])} ({len(foreign)})",
            repro,
        )


def assert_raises_typed(error: type[BaseException], fn, *args, clause: str, what: str, mentions: Sequence[str] = (),
                        repro: Mapping[str, Any] | None = None, **kwargs) -> BaseException:
    """``fn(*args, **kwargs)`` raises ``error`` whose message mentions each of ``mentions``."""
    __tracebackhide__ = True
    try:
        fn(*args, **kwargs)
    except error as exc:
        text = str(exc)
        absent = [m for m in mentions if m.lower() not in text.lower()]
        if absent:
            raise ClauseViolation(clause, f"{what}: error message {text!r} does not mention {absent}", repro) from exc
        return exc
    except Exception as exc:
        raise ClauseViolation(clause, f"{what}: raised {type(exc).__name__}: {exc}, but should raise {error.__name__}", repro) from exc
    raise ClauseViolation(clause, f"{what}: returned normally, but should raise {error.__name__}", repro)
