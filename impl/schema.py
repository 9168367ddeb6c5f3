"""The batch schema: the token fields every dataset serves, their dtype, and the padding value of each.

One owner for the field list. ``impl.fill`` allocates batches by it,
``impl.dataset.PackedDataset`` and ``impl.mixing.MixedDataset`` copy and
stack rows by it, and a ``pad`` end policy hands out ``padding_rows`` for a
slot past the epoch's last sample (PART-5). Every field is int64
``[seq_len]`` per sample; the padding row is fully masked and belongs to no
document: ``pad_id`` inputs, ``IGNORE`` labels, position 0 (every position
starts a segment), doc id and token offset -1 (``reference.resume.padding_sample``).

    >>> [(f.name, f.padding) for f in BATCH_SCHEMA][:2]
    [('input_ids', None), ('labels', -100)]
    >>> padding_values(PackingConfig(seq_len=4, pad_id=7))
    (7, -100, 0, -1, -1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from impl.errors import ConfigError, is_int, require
from reference.packing import IGNORE, NO_DOC, NO_OFFSET, PackingConfig

__all__ = ["BATCH_DTYPE", "BATCH_FIELDS", "BATCH_SCHEMA", "BatchField", "padding_rows", "padding_values"]

BATCH_DTYPE = np.dtype(np.int64)
"""The dtype of every token field."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchField:
    """One token field of a sample: its name and what a padding row holds there (None: the config's ``pad_id``)."""

    name: str
    padding: int | None


BATCH_SCHEMA: tuple[BatchField, ...] = (
    BatchField(name="input_ids", padding=None),
    BatchField(name="labels", padding=IGNORE),
    BatchField(name="position_ids", padding=0),
    BatchField(name="doc_ids", padding=NO_DOC),
    BatchField(name="token_offsets", padding=NO_OFFSET),
)
"""The token fields, in the order batches lay them out."""

BATCH_FIELDS: tuple[str, ...] = tuple(field.name for field in BATCH_SCHEMA)
"""The names of ``BATCH_SCHEMA``'s fields, in its order."""


def padding_values(config: PackingConfig) -> tuple[int, ...]:
    """The value of each ``BATCH_FIELDS`` field in a padding row of ``config``, in the schema's order."""
    return tuple(config.pad_id if field.padding is None else field.padding for field in BATCH_SCHEMA)


def padding_rows(rows: int, config: PackingConfig) -> dict[str, np.ndarray]:
    """``rows`` padding samples (PART-5), int64 ``[rows, seq_len]`` per field: fully masked, of no document.

    What a ``pad`` end policy hands out in a slot past the epoch's last
    sample: ``pad_id`` inputs, ``IGNORE`` labels, position 0 (every position
    starts a segment), doc id and token offset -1.

    >>> out = padding_rows(2, PackingConfig(seq_len=3, pad_id=9))
    >>> out["input_ids"].tolist(), out["labels"][0].tolist(), out["doc_ids"].shape
    ([[9, 9, 9], [9, 9, 9]], [-100, -100, -100], (2, 3))
    """
    require(is_int(rows) and rows >= 0, ConfigError, f"rows={rows!r} must be an integer >= 0")
    shape = (rows, config.seq_len)
    return {name: np.full(shape, fill, dtype=BATCH_DTYPE) for name, fill in zip(BATCH_FIELDS, padding_values(config))}
