"""Map functions for the streaming map tests, at module level so DataLoader workers under spawn can unpickle them."""

from __future__ import annotations

from collections import Counter
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


def block_tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
    """Forgather's block tokenizer: the batch's texts tokenized, each ended by EOS, joined, cut into blocks of 5."""
    from conformance.impl_tests.streaming_corpus import tokenizer

    encode = tokenizer()[1]
    ids = [t for text in batch["text"] for t in [*encode(text), EOS]]
    return {"input_ids": [ids[i:i + 5] for i in range(0, len(ids) - 4, 5)]}


EOS = 50256


def count_words(batch: dict[str, list[str]]) -> dict[str, list[int]]:
    """A 1:1 map adding a column and leaving the text as it is."""
    return {"words": [len(t.split()) for t in batch["text"]]}


@dataclass(frozen=True)
class CountCalls:
    """Each text ``r`` times, counting in ``CALLS`` how often each input batch (its texts, in order) was mapped.

    In-process only: a DataLoader worker counts in its own process.
    """

    r: int = 1

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        CALLS[tuple(batch["text"])] += 1
        return {"text": [t for t in batch["text"] for _ in range(self.r)]}


CALLS: Counter[tuple[str, ...]] = Counter()


@dataclass(frozen=True)
class LogCalls:
    """Each text once, appending each input batch it maps (its texts, tab-joined) as a line of ``path``.

    Counts across processes: a DataLoader worker appends to the same file.
    """

    path: str

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[str]]:
        with open(self.path, "a") as f:
            f.write("\t".join(batch["text"]) + "\n")
        return {"text": list(batch["text"])}
