"""The epoch a plain int index refers to, in one shared-memory int64 that DataLoader workers see: ``SharedEpoch``.

One concept: a dataset's current epoch that crosses process boundaries. The
keyed datasets (``impl.dataset.PackedDataset``, ``impl.mixing.MixedDataset``)
inherit it; keys that carry their epoch (``impl.keys.SampleKey``) do not need
it. Importing this module registers the fork hook (``os.register_at_fork``)
that puts every live instance's epoch in shared memory before a fork (RES-7).

    >>> class Keyed(SharedEpoch): pass
    >>> ds = Keyed(); ds.set_epoch(2); ds.epoch
    2
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any, Self, SupportsIndex

import torch

from impl.errors import ConfigError, SharedEpochError, is_integer, require

__all__ = ["SharedEpoch"]


class SharedEpoch:
    """The epoch a plain int index refers to, held in one shared-memory int64: a mixin of the keyed datasets.

    Why shared memory: a plain ``DataLoader(ds, num_workers=2,
    persistent_workers=True)`` keeps the copies of the dataset its workers got
    when they started, so an attribute set by ``ds.set_epoch(1)`` in the
    training process never reaches them and epoch 0 repeats. The cell is
    shared with forked workers (inherited mapping) and spawned ones (torch's
    pickler shares the storage); plain ``pickle`` copies the value. Keys that
    carry their epoch (``SampleKey``, what ``build_dataloader`` uses) do not
    need it.

    Why the cell is allocated late: allocating it (a shared-memory file)
    is a visible share of a fresh resume, and a process without
    workers never needs it. Until a copy of the dataset can leave the
    process the epoch is a plain attribute; the cell is made, holding that
    epoch, just before any ``os.fork`` (``os.register_at_fork``: forked
    workers inherit it) and when the dataset is pickled or copied
    (``__reduce_ex__``: spawned workers share it).

    If the cell cannot be allocated before a fork, the fork goes ahead (a
    fork hook cannot refuse) with a ``RuntimeWarning``, and every later
    ``set_epoch`` raises ``SharedEpochError``: forked workers would not see it.

    >>> class Keyed(SharedEpoch): pass
    >>> ds = Keyed(); ds.set_epoch(3); ds.epoch
    3
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = super().__new__(cls)
        _UNSHARED[id(self)] = self     # every instance, so a fork shares even an epoch that was never set
        return self

    def set_epoch(self, epoch: int) -> None:
        """The epoch a plain int index refers to (keys carry their own), in this process and in DataLoader workers."""
        require(is_integer(epoch) and epoch >= 0, ConfigError, f"epoch={epoch!r} must be an integer >= 0")
        self.epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch of plain int indices (0 until ``set_epoch``)."""
        state = self.__dict__
        cell = state.get("_epoch_cell")
        return int(state.get("_epoch_value", 0)) if cell is None else int(cell.item())

    @epoch.setter
    def epoch(self, value: int) -> None:
        cell = self.__dict__.get("_epoch_cell")
        if cell is None:
            failure = self.__dict__.get("_share_failure")
            if failure is not None:
                raise SharedEpochError(
                    f"set_epoch({value}) cannot reach this dataset's forked workers: its epoch could not be put in "
                    f"shared memory before the fork ({failure}); free shared memory (/dev/shm) and restart the "
                    "workers, or use build_dataloader, whose keys carry their epoch")
            self._epoch_value = int(value)   # shared before a fork: __new__ registered every instance
        else:
            cell.fill_(int(value))

    def _share_epoch(self) -> torch.Tensor:
        """The shared-memory cell of the epoch, allocated now if it was not yet (holding the current epoch)."""
        cell: torch.Tensor | None = self.__dict__.get("_epoch_cell")
        if cell is None:
            cell = torch.tensor(self.epoch, dtype=torch.int64).share_memory_()
            self._epoch_cell = cell
            self.__dict__.pop("_epoch_value", None)
            _UNSHARED.pop(id(self), None)
        return cell

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        self._share_epoch()
        return super().__reduce_ex__(protocol)


_UNSHARED: weakref.WeakValueDictionary[int, SharedEpoch] = weakref.WeakValueDictionary()
"""The live ``SharedEpoch`` objects whose epoch is not in shared memory yet (keyed by ``id``: datasets need not hash)."""


def _share_before_fork() -> None:
    for dataset in list(_UNSHARED.values()):
        try:
            dataset._share_epoch()
        except (OSError, RuntimeError) as exc:   # a fork hook cannot refuse the fork: so set_epoch refuses later
            dataset.__dict__["_share_failure"] = f"{type(exc).__name__}: {exc}"
            _UNSHARED.pop(id(dataset), None)
            warnings.warn(f"{type(dataset).__name__}'s epoch could not be put in shared memory before os.fork "
                          f"({type(exc).__name__}: {exc}); set_epoch will refuse, as forked workers would not see it",
                          RuntimeWarning, stacklevel=2)


os.register_at_fork(before=_share_before_fork)
