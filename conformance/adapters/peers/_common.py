"""What the torch-DataLoader-shaped peers share: epochs counted by the adapter, the state kept native.

Why: torchdata's ``StatefulDataLoader`` (alone, under HF datasets, or as
MosaicML's and LitData's loaders) keeps no epoch a kit can read, and a training
loop saves the epoch beside the loader's state. ``EpochLoader`` does the same:
its state is ``{"epoch": e, "loader": <the peer's own state>}``, untouched.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from conformance.adapter import CanonicalRow
from conformance.provenance import ROW_COLUMNS, row_from_columns


def rows_of(batch: Any, epoch: int) -> list[CanonicalRow]:
    """A batch of :func:`conformance.provenance.pack_corpus` rows (dicts of lists) as canonical rows."""
    return [row_from_columns(r, epoch=epoch, index=-1) for r in batch]


def identity(batch: list[Any]) -> list[Any]:
    return batch


def by_column(batch: list[Any]) -> dict[str, list[Any]]:
    """A batch of rows as one list per column: what a loader that counts a batch's samples as ``len`` of its
    first column (MosaicML's ``StreamingDataLoader``) counts right; a list of row dicts counts as its keys."""
    return {c: [row[c] for row in batch] for c in ROW_COLUMNS}


def rows_of_columns(batch: dict[str, list[Any]], epoch: int) -> list[CanonicalRow]:
    """A :func:`by_column` batch as canonical rows."""
    return [row_from_columns({c: batch[c][i] for c in ROW_COLUMNS}, epoch=epoch, index=-1)
            for i in range(len(batch["input_ids"]))]


class Empty:
    """What a corpus with no sample loads as, for a peer that refuses an empty dataset: no batch, a state."""

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@contextlib.contextmanager
def data_dir(workdir: Path, world_size: int) -> Iterator[Path]:
    """Where to write a peer's dataset files, held while they are written and checked.

    In one process (the in-process suite) that is ``workdir``. Under the
    per-rank harness (``conformance.ranks``) each rank is a process of one
    node, and peers that coordinate local ranks (MosaicML's shared ``local``)
    need the same files at the same path on every rank: ``LOADSPEC_NODE_DIR``,
    written by whichever rank takes the lock first, as one offline
    preparation step would.
    """
    node = os.environ.get("LOADSPEC_NODE_DIR")
    if not node or world_size == 1:
        yield Path(workdir)
        return
    from impl._atomic import file_lock

    Path(node).mkdir(parents=True, exist_ok=True)
    with file_lock(Path(node) / ".prepare.lock"):
        yield Path(node)


class EpochLoader:
    """A peer loader plus the epoch the training loop keeps; ``on_epoch(e)`` tells the peer (``set_epoch``)."""

    def __init__(self, loader: Any, on_epoch: Callable[[int], None] = lambda e: None,
                 to_rows: Callable[[Any, int], list[CanonicalRow]] = rows_of) -> None:
        self.loader, self.on_epoch, self.to_rows = loader, on_epoch, to_rows
        self.epoch = 0
        self._it: Iterator[Any] | None = None
        self._opened: list[Any] = []

    def __iter__(self) -> Iterator[list[CanonicalRow]]:
        self.on_epoch(self.epoch)
        self._it = iter(self.loader)
        self._opened.append(self._it)
        for batch in self._it:
            yield self.to_rows(batch, self.epoch)
        self._it = None
        self.epoch += 1

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._it = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.on_epoch(self.epoch)
        self.loader.load_state_dict(state["loader"])

    def close(self) -> None:
        """Stop the worker processes of every iterator this loader opened (an abandoned one keeps them alive)."""
        for it in [*self._opened, getattr(self.loader, "_iterator", None)]:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._opened, self._it = [], None
        gc.collect()  # an abandoned generator cycle still holds its iterator; collecting it stops those workers
