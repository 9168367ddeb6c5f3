"""Resume audit: did an epoch train every sample exactly once? (RES-4, PART-8)

Why impl has its own: ``loadspec check`` and the demo audit what impl's
loader trained, and the seam rule keeps the reference out of impl's
running code (the reference is the second implementation conformance
compares against, not a library). ``reference.resume.audit_coverage``
defines the same counts; ``conformance/impl_tests`` compares the two.

Worked example: samples 0..3 of an epoch whose trained prefix ends at 4;
sample 1 was trained twice, 2 never, 5 lies past the prefix, -1 is padding::

    >>> audit_coverage([0, 1, 1, 3, 5, -1], end=4)
    Coverage(trained=5, duplicates=1, missing=1, beyond_end=1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from impl.errors import ConfigError, is_int, require
from reference.partition import PADDING

__all__ = ["Coverage", "audit_coverage"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """What an epoch's audit found: samples trained, repeats, gaps, and samples past the trained prefix."""

    trained: int
    duplicates: int
    missing: int
    beyond_end: int

    @property
    def exact(self) -> bool:
        """Every sample of the trained prefix once, none past it."""
        return self.duplicates == 0 and self.missing == 0 and self.beyond_end == 0

    def __repr__(self) -> str:
        return (f"Coverage(trained={self.trained}, duplicates={self.duplicates}, missing={self.missing}, "
                f"beyond_end={self.beyond_end})")


def audit_coverage(trained: Iterable[int], end: int) -> Coverage:
    """Counts over the trained sample indices (padding ``-1`` ignored) against the prefix ``[0, end)``.

    One ``np.bincount`` over the indices, so auditing an epoch of millions of
    samples is one vectorised pass, not a Python loop per sample.
    """
    require(is_int(end) and end >= 0, ConfigError, f"end={end!r} must be an integer >= 0 (see trained_end)")
    idx = np.fromiter(trained, dtype=np.int64)
    idx = idx[idx != PADDING]
    require(not (idx < 0).any(), ConfigError,
            f"trained sample indices must be >= 0 or {PADDING} (padding); got {int(idx.min()) if idx.size else 0}")
    counts = np.bincount(idx, minlength=end)
    inside = counts[:end]
    return Coverage(trained=int(idx.size),
                    duplicates=int(np.maximum(counts - 1, 0).sum()),
                    missing=int(np.count_nonzero(inside == 0)),
                    beyond_end=int(counts[end:].sum()))
