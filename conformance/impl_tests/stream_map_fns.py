"""Map functions for the streaming map tests, at module level so DataLoader workers under spawn can unpickle them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Regroup:
    """Join a batch's texts and cut them into pieces of ``k`` characters: N rows to any M >= 0 outputs.

    With ``ids`` the pieces are returned as token ids (a character's code point), as a block tokenizer does.
    """

    k: int
    ids: bool = False

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        joined = "|".join(batch["text"])
        pieces = [joined[i:i + self.k] for i in range(0, len(joined), self.k)]
        if self.ids:
            return {"input_ids": [[ord(c) for c in p] for p in pieces], "n": list(range(len(pieces)))}
        return {"text": pieces}


@dataclass(frozen=True)
class Repeat:
    """Each text ``r`` times (r = 0: no output)."""

    r: int

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        return {"text": [t for t in batch["text"] for _ in range(self.r)]}


def shout(example: dict[str, str]) -> dict[str, str]:
    """A row map (batched=False): one example in, one out."""
    return {"text": example["text"].upper()}


def shout_batch(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    """``shout`` as a batched map."""
    return {"text": [t.upper() for t in batch["text"]]}
