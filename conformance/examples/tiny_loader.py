"""A third party's loader, as a team might have written it before meeting loadspec (the kit's worked example).

It knows nothing of loadspec: it takes a list of rows (dicts), shuffles them
per epoch with numpy's generator keyed by ``(seed, epoch)``, deals each global
batch of ``world_size * batch_size`` rows to the ranks, drops the last partial
global batch, and keeps its own state format ``{"ep": epoch, "seen": rows}``.
Because the state counts *global* rows, a resume on another world size or
batch size continues exactly (the Megatron design).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class TinyStateError(ValueError):
    """The loader's refusal of a state that is not its own (the adapter declares it as its refusal type)."""


class TinyLoader:
    def __init__(self, rows: list[Any], *, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True) -> None:
        self.rows, self.batch_size, self.rank, self.world_size = rows, batch_size, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.seen = 0, 0

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.rows))

    def __iter__(self) -> Iterator[list[Any]]:
        order, g = self._order(), self.world_size * self.batch_size
        while self.seen + g <= len(self.rows):
            start = self.seen + self.rank * self.batch_size
            self.seen += g
            yield [self.rows[i] for i in order[start:start + self.batch_size]]
        self.epoch, self.seen = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.seen = epoch, 0

    def state_dict(self) -> dict[str, int]:
        return {"ep": self.epoch, "seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if set(state) != {"ep", "seen"}:
            raise TinyStateError(f"not a TinyLoader state: {state!r}")
        self.epoch, self.seen = int(state["ep"]), int(state["seen"])
