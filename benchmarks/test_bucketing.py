"""(8) Bucketing: padding saved against random batching, and the bucketed loader's throughput.

``bucket-order-<dist>``: compute a whole epoch's bucketed order
(``impl.bucketing.bucket_order``, numpy) for ``ITEMS[size]`` lengths; its
extra_info carries the padding figures, which are counts, not timings: the
padded positions of batches of ``BATCH`` consecutive items in the bucketed
order against the same batches of a random order (both padded to the longest
item of the batch, as ``pad_stack_1d`` does).

``bucket-loader-<dist>``: iterate ``LOADER_BATCHES`` batches of a
``BufferSortedDataset`` over a plain torch dataset through
``build_dataloader`` with a ``pad_stack_1d`` collate (main process), against
the same loop over a shuffled ``DataLoader`` (``random-loader-<dist>``):
samples/s and real tokens/s.

Distributions (lengths in tokens):

* ``pretrain``: the corpora's log-normal, median 400, sigma 1, clipped to [2, 20000];
* ``sft``: chat-style examples, log-normal median 180, sigma 0.8, clipped to [8, 4096].
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.corpora import make_lengths
from impl.bucketing import BucketConfig, BufferSortedDataset, bucket_order
from impl.collation import pad_stack_1d
from impl.loader import build_dataloader

BATCH = 32
BUFFER = 32 * BATCH
ITEMS = {"S": 20_000, "M": 100_000, "L": 200_000}
LOADER_BATCHES = {"S": 100, "M": 300, "L": 300}


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A length distribution."""

    name: str

    def __str__(self) -> str:
        return self.name

    def sample(self, n: int) -> np.ndarray:
        if self.name == "pretrain":
            return make_lengths(n)
        rng = np.random.Generator(np.random.PCG64(7))
        return np.clip(np.rint(rng.lognormal(np.log(180), 0.8, size=n)), 8, 4096).astype(np.int64)


DISTRIBUTIONS = (Lengths("pretrain"), Lengths("sft"))


def padding(lengths: np.ndarray, order: np.ndarray, batch: int) -> dict[str, float]:
    """Padded positions and the padding fraction of consecutive batches of ``order`` (the last may be short)."""
    ordered = lengths[order]
    full = len(ordered) // batch * batch
    rows = ordered[:full].reshape(-1, batch)
    pad = int((rows.max(axis=1)[:, None] - rows).sum())
    if full < len(ordered):
        tail = ordered[full:]
        pad += int((tail.max() - tail).sum())
    real = int(ordered.sum())
    return {"pad_tokens": pad, "pad_fraction": pad / (pad + real)}


class Rows(Dataset):
    """A plain map-style dataset of token rows (views of one buffer), with ``sort_key``."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths.tolist()
        self.tokens = torch.arange(int(lengths.max()), dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[:self.lengths[index]]

    def sort_key(self, index: int) -> int:
        return self.lengths[index]


def pad_collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"input_ids": pad_stack_1d(rows, 0, pad_to_multiple_of=8),
            "attention_mask": pad_stack_1d([torch.ones_like(r) for r in rows], 0, pad_to_multiple_of=8)}


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=str)
def test_bucket_order(benchmark, dist: Lengths, size: str, smoke: bool):
    benchmark.group = "bucketing"
    lengths = dist.sample(ITEMS[size])
    config = BucketConfig(buffer_size=BUFFER, pack_size=BATCH, seed=0)
    out = {}

    def target():
        out["order"] = bucket_order(lengths, config, 0)

    benchmark.pedantic(target, rounds=1 if smoke else 5, warmup_rounds=0 if smoke else 1)
    bucketed = padding(lengths, out["order"], BATCH)
    shuffled = padding(lengths, np.random.Generator(np.random.PCG64(1)).permutation(len(lengths)), BATCH)
    benchmark.extra_info.update(
        kind="bucketing", distribution=str(dist), items=len(lengths), batch=BATCH, buffer=BUFFER,
        random_pad_fraction=shuffled["pad_fraction"], bucketed_pad_fraction=bucketed["pad_fraction"],
        padding_saved=1 - bucketed["pad_tokens"] / shuffled["pad_tokens"],
    )
    assert sorted(out["order"].tolist()) == list(range(len(lengths)))
    assert bucketed["pad_tokens"] < shuffled["pad_tokens"]


def _run(loader, batches: int) -> dict[str, int]:
    seen = {"samples": 0, "tokens": 0}
    for k, batch in enumerate(loader):
        seen["samples"] += batch["input_ids"].shape[0]
        seen["tokens"] += int(batch["attention_mask"].sum())
        if k + 1 == batches:
            break
    return seen


@pytest.mark.parametrize("kind", ["bucketed", "random"])
@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=str)
def test_loader(benchmark, dist: Lengths, kind: str, size: str, smoke: bool):
    benchmark.group = "bucketing-loader"
    rows = Rows(dist.sample(ITEMS[size]))
    batches = LOADER_BATCHES[size]
    if kind == "bucketed":
        dataset = BufferSortedDataset(rows, buffer_size=BUFFER, pack_size=BATCH, init_seed=0)

        def make():
            return build_dataloader(dataset, batch_size=BATCH, rank=0, world_size=1, collate_fn=pad_collate)
    else:
        def make():
            return DataLoader(rows, batch_size=BATCH, shuffle=True, collate_fn=pad_collate,
                              generator=torch.Generator().manual_seed(0))
    out = {}

    def target():
        out["seen"] = _run(make(), batches)

    benchmark.pedantic(target, rounds=1 if smoke else 5, warmup_rounds=0 if smoke else 1)
    seconds = benchmark.stats.stats.mean if benchmark.stats else None
    benchmark.extra_info.update(kind=f"{kind}-loader", distribution=str(dist), batch=BATCH, batches=batches,
                                **out["seen"])
    if seconds:
        benchmark.extra_info.update(samples_per_s=out["seen"]["samples"] / seconds,
                                    tokens_per_s=out["seen"]["tokens"] / seconds)
    assert out["seen"]["samples"] == batches * BATCH
