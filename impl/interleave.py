"""``interleave_datasets``: a :class:`~impl.mixed_dataset.MixedDataset` from Hugging Face / Forgather arguments.

Why a module of its own: it translates another system's vocabulary
(``probabilities``, ``stopping_strategy``, ``balance_remaining_examples``)
into loadspec's mixture configuration and owns nothing of the mixture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from impl.errors import ConfigError, require
from impl.mixed_dataset import MixedDataset
from impl.mixing import balance_remaining
from reference.mixing import WeightFn

__all__ = ["interleave_datasets"]

_INTERLEAVE_ALL_EXHAUSTED = (
    "stopping_strategy='all_exhausted' means different things in the systems loadspec replaces: Hugging Face "
    "datasets oversamples (restarts exhausted sources until every source has run out once), Forgather drops "
    "exhausted sources (every example exactly once); pass oversample=True for Hugging Face's meaning or "
    "oversample=False for Forgather's")


def interleave_datasets(datasets: Sequence[Any], probabilities: Sequence[float] | Callable[..., Sequence[float]] | None = None,
                        seed: int | None = None, stopping_strategy: str = "first_exhausted", *,
                        oversample: bool | None = None, balance_remaining_examples: bool = False,
                        end: str = "drop_last") -> MixedDataset:
    """A ``MixedDataset`` from Hugging Face / Forgather ``interleave_datasets`` arguments.

    ``probabilities``: ``None`` (round robin), one weight per dataset, or a
    callable ``(step, sizes, taken, exhausted) -> weights`` (Forgather's);
    ``balance_remaining_examples=True`` is ``weight_fn=balance_remaining``.
    ``seed=None`` means seed 0 (loadspec has no unseeded randomness).
    ``stopping_strategy="all_exhausted"`` is refused unless ``oversample``
    says which meaning is wanted (the two systems disagree).

    >>> interleave_datasets([a, b], stopping_strategy="all_exhausted")   # doctest: +SKIP
    Traceback (most recent call last):
    ...
    impl.errors.ConfigError: stopping_strategy='all_exhausted' means different things ...
    """
    if stopping_strategy == "all_exhausted":
        require(oversample is not None, ConfigError, _INTERLEAVE_ALL_EXHAUSTED)
        stopping = "all_exhausted_oversample" if oversample else "all_exhausted"
    else:
        require(stopping_strategy in ("first_exhausted", "all_exhausted_oversample"), ConfigError,
                f"stopping_strategy={stopping_strategy!r} is not one of 'first_exhausted', 'all_exhausted' "
                "(with oversample=True/False), 'all_exhausted_oversample'")
        stopping = stopping_strategy
    weight_fn: WeightFn | None = None
    weights: Sequence[float] | None = None
    if balance_remaining_examples:
        require(probabilities is None, ConfigError,
                "balance_remaining_examples=True sets the weights itself; pass probabilities=None with it")
        weight_fn = balance_remaining
    elif callable(probabilities):
        weight_fn = probabilities
    elif probabilities is not None:
        weights = list(probabilities)
    return MixedDataset(list(datasets), weights=weights, stopping=stopping, seed=0 if seed is None else seed,
                        weight_fn=weight_fn, end=end)
