"""Sample keys: ``SampleKey(epoch, index)``, and the one rule by which a keyed dataset resolves a key or a batch of keys.

Why keys carry the epoch: torch's DataLoader computes samples in worker
processes holding their own copy of the dataset, and persistent workers never
see ``set_epoch``. A ``SampleKey`` carries everything a worker needs, so any
worker computes any sample of any epoch; ``index == -1`` (``PADDING``) is the
padding sample (PART-5). ``impl.partition.ElasticSampler`` makes keys;
``impl.dataset.PackedDataset`` and ``impl.mixing.MixedDataset`` resolve them.

    >>> resolve_key(SampleKey(epoch=1, index=-1), 0, lambda e: 10)
    (1, -1)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from impl._arrays import distinct_ints
from impl.errors import ConfigError, is_integer, require
from reference.partition import PADDING

__all__ = ["SampleKey", "resolve_key", "resolve_keys"]


class SampleKey(NamedTuple):
    """Which sample to compute: ``index`` of epoch ``epoch``'s global stream; ``index == -1`` (PADDING) is padding.

    ``impl.partition.ElasticSampler`` makes them; ``impl.dataset`` re-exports the name.
    """

    epoch: int
    index: int  # type: ignore[assignment]  # shadows tuple.index; the field name is the public API


def resolve_key(key: Any, epoch: int, num_samples: Callable[[int], int], what: str = "") -> tuple[int, int]:
    """``(epoch, index)`` of a dataset key: a ``SampleKey(epoch, index)`` or an int index into ``epoch``.

    One rule for every dataset that takes keys (``PackedDataset``,
    ``MixedDataset``): a key's index is in ``[0, num_samples(epoch))`` or
    ``PADDING``; an int counts from the end when negative, like a list.
    ``what`` names the dataset in errors (e.g. ``" of the mixture"``).

    >>> resolve_key(SampleKey(1, 3), 0, lambda e: 10), resolve_key(-1, 2, lambda e: 10)
    ((1, 3), (2, 9))
    """
    if isinstance(key, tuple):
        require(len(key) == 2, ConfigError, f"key={key!r} must be SampleKey(epoch, index) or an int index")
        key_epoch, index = key
        require(is_integer(key_epoch) and key_epoch >= 0, ConfigError, f"key epoch={key_epoch!r} must be an integer >= 0")
        require(is_integer(index), ConfigError, f"key index={index!r} must be an integer (-1 for padding)")
        key_epoch, index = int(key_epoch), int(index)
        if index != PADDING:
            total = num_samples(key_epoch)
            if not 0 <= index < total:
                raise IndexError(f"SampleKey({key_epoch}, {index}): epoch {key_epoch}{what} has {total} samples "
                                 f"(indices 0..{total - 1}; -1 is the padding sample)")
        return key_epoch, index
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"index {key!r} is a bool; pass an int or a SampleKey(epoch, index)")
    try:
        index = operator.index(key)
    except TypeError:
        raise TypeError(f"index must be an int or a SampleKey(epoch, index), not {type(key).__name__}") from None
    total = num_samples(epoch)
    if index < 0:
        index += total
    if not 0 <= index < total:
        raise IndexError(f"index {key} out of range: epoch {epoch}{what} has {total} samples")
    return epoch, index


def resolve_keys(keys: Sequence[Any], resolve: Callable[[Any], tuple[int, int]],
                 num_samples: Callable[[int], int]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(epochs, indices)`` int64 of a batch of keys, each checked as ``resolve`` checks one key (same errors).

    One rule for every keyed dataset's batch path (``PackedDataset``,
    ``MixedDataset``): ``SampleKey``s of plain ints (what ``ElasticSampler``
    yields) are checked together (epochs >= 0, indices in ``[-1,
    num_samples(epoch))``), any other key goes through ``resolve``. On a bad
    key the keys are resolved one by one, so the error is the one
    ``ds[key]`` raises for the first bad key. None when a value does not fit
    int64 (every key resolved alone first; the caller decides).

    >>> resolve_keys([SampleKey(0, 3), SampleKey(0, -1)], lambda k: k, lambda e: 10)
    (array([0, 0]), array([ 3, -1]))
    """
    pairs = [k if type(k) is SampleKey and type(k[0]) is int and type(k[1]) is int else resolve(k) for k in keys]
    try:
        arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    except OverflowError:
        for key in keys:
            resolve(key)
        return None
    epochs, indices = arr[:, 0], arr[:, 1]
    if len(arr) and not _keys_in_range(epochs, indices, num_samples):
        for key in keys:
            resolve(key)
        raise AssertionError(f"keys {keys!r} failed the batch check but none fails alone")  # pragma: no cover
    return epochs, indices


def _keys_in_range(epochs: np.ndarray, indices: np.ndarray, num_samples: Callable[[int], int]) -> bool:
    if int(epochs.min()) < 0 or int(indices.min()) < PADDING:
        return False
    real = indices != PADDING
    return all(int(indices[real & (epochs == e)].max()) < num_samples(e) for e in distinct_ints(epochs[real]))
