"""Typed errors shared by reference and impl.

Why: bad input must never turn into silently wrong data. Every error names
what is wrong and how to fix it, and its type lets callers (and the
conformance kit) tell a refused configuration from a refused state or a
corrupt store. ``impl.errors`` re-exports these and adds store-specific ones.
"""

from __future__ import annotations


class LoadspecError(Exception):
    """Base of every error loadspec raises on purpose."""


class ConfigError(LoadspecError, ValueError):
    """A configuration field is out of its domain (names the field and the fix)."""


class SplitError(ConfigError):
    """A split specification is malformed or selects an empty range (SPLIT-*)."""


class TopologyError(ConfigError):
    """Rank, world size, worker or replication values that cannot describe a job."""


class StateError(LoadspecError, ValueError):
    """A state_dict was refused: foreign, future-version, or for other data or config (RES-*)."""


class SourceError(LoadspecError, ValueError):
    """A source file's content cannot be read as rows: names the file, the byte offset and the fix (STREAM-2)."""


class MapError(LoadspecError, ValueError):
    """A streaming map's function returned what a lane cannot pack, or cannot travel to workers (STREAM-20)."""


class EmptyDataError(ConfigError):
    """The data holds nothing a loader could yield (for example an empty store)."""


def is_int(value: object) -> bool:
    """A true integer: ``bool`` is an ``int`` subclass, and ``True`` as a size or index is always a mistake."""
    return isinstance(value, int) and not isinstance(value, bool)


def require(condition: bool, error: type[LoadspecError], message: str) -> None:
    """Raise ``error(message)`` unless ``condition``; keeps validation one line per rule."""
    if not condition:
        raise error(message)
