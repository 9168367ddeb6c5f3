"""loadspec's production loaders: ``from impl import PackedDataset, TokenStore, build_dataloader``.

One import for what a training script uses; each name lives in the module
of its concept (``docs/MODULES.md`` lists them in pipeline order).
``__all__`` is sorted and asserted by ``conformance/impl_tests/test_public_api.py``.

Names are imported on first use (PEP 562 ``__getattr__``), so ``import impl.errors``
(the ``loadspec`` command's ``--help`` and usage errors) does not pay for torch::

    >>> import impl
    >>> impl.ConfigError.__module__
    'impl.errors'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from impl.bucketing import BufferSortedDataset
    from impl.collation import (
        PaddingSide1D,
        SampleBatch,
        TokenPoolingType,
        attention_mask,
        collate,
        cu_seqlens,
        pad_stack_1d,
        token_pooling_mask_from_attention_mask,
    )
    from impl.dataset import PackedDataset
    from impl.errors import (
        CacheLimitError,
        ConfigError,
        DownloadError,
        EmptyDataError,
        EvalBroadcastError,
        LoadspecError,
        RemoteChangedError,
        RemoteError,
        SourceError,
        SplitError,
        StateError,
        StoreCorruptError,
        StoreError,
        StoreNotFoundError,
        StoreVersionError,
        TokenizerError,
        TopologyError,
    )
    from impl.evaluation import EvalBuildError, EvalDataset, build_eval_dataset
    from impl.hf import HuggingFaceDataset
    from impl.interleave import interleave_datasets
    from impl.keys import SampleKey
    from impl.loader import ElasticLoader, build_dataloader
    from impl.mixed_dataset import MixedDataset
    from impl.mixing import balance_remaining
    from impl.partition import ElasticSampler, distributed_topology
    from impl.remote import RemoteFiles
    from impl.resume import Coverage, audit_coverage
    from impl.sharding import ShardedDataset, ShardIndexingMode, shard_dataset_data_parallel, shard_token_store
    from impl.splits import SplitStore, select, slice_store, split_store
    from impl.store import BuildOptions, TokenStore
    from impl.stream_mixing import StreamMixture
    from impl.streaming import StreamingDataset, merge_states
    from impl.streams import StreamConfig

_MODULE_OF = {
    "BufferSortedDataset": "impl.bucketing",
    "BuildOptions": "impl.store",
    "CacheLimitError": "impl.errors",
    "ConfigError": "impl.errors",
    "Coverage": "impl.resume",
    "DownloadError": "impl.errors",
    "ElasticLoader": "impl.loader",
    "ElasticSampler": "impl.partition",
    "EmptyDataError": "impl.errors",
    "EvalBroadcastError": "impl.errors",
    "EvalBuildError": "impl.evaluation",
    "EvalDataset": "impl.evaluation",
    "HuggingFaceDataset": "impl.hf",
    "LoadspecError": "impl.errors",
    "MixedDataset": "impl.mixed_dataset",
    "PackedDataset": "impl.dataset",
    "PaddingSide1D": "impl.collation",
    "RemoteChangedError": "impl.errors",
    "RemoteError": "impl.errors",
    "RemoteFiles": "impl.remote",
    "SampleBatch": "impl.collation",
    "SampleKey": "impl.keys",
    "ShardIndexingMode": "impl.sharding",
    "ShardedDataset": "impl.sharding",
    "SourceError": "impl.errors",
    "SplitError": "impl.errors",
    "SplitStore": "impl.splits",
    "StateError": "impl.errors",
    "StoreCorruptError": "impl.errors",
    "StoreError": "impl.errors",
    "StoreNotFoundError": "impl.errors",
    "StoreVersionError": "impl.errors",
    "StreamConfig": "impl.streams",
    "TokenPoolingType": "impl.collation",
    "TokenStore": "impl.store",
    "TokenizerError": "impl.errors",
    "TopologyError": "impl.errors",
    "attention_mask": "impl.collation",
    "audit_coverage": "impl.resume",
    "balance_remaining": "impl.mixing",
    "build_dataloader": "impl.loader",
    "build_eval_dataset": "impl.evaluation",
    "collate": "impl.collation",
    "cu_seqlens": "impl.collation",
    "distributed_topology": "impl.partition",
    "interleave_datasets": "impl.interleave",
    "pad_stack_1d": "impl.collation",
    "select": "impl.splits",
    "shard_dataset_data_parallel": "impl.sharding",
    "shard_token_store": "impl.sharding",
    "slice_store": "impl.splits",
    "split_store": "impl.splits",
    "token_pooling_mask_from_attention_mask": "impl.collation",
    "StreamingDataset": "impl.streaming",
    "StreamMixture": "impl.stream_mixing",
    "merge_states": "impl.streaming",
}


__all__ = [
    "BufferSortedDataset",
    "BuildOptions",
    "CacheLimitError",
    "ConfigError",
    "Coverage",
    "DownloadError",
    "ElasticLoader",
    "ElasticSampler",
    "EmptyDataError",
    "EvalBroadcastError",
    "EvalBuildError",
    "EvalDataset",
    "HuggingFaceDataset",
    "LoadspecError",
    "MixedDataset",
    "PackedDataset",
    "PaddingSide1D",
    "RemoteChangedError",
    "RemoteError",
    "RemoteFiles",
    "SampleBatch",
    "SampleKey",
    "ShardIndexingMode",
    "ShardedDataset",
    "SourceError",
    "SplitError",
    "SplitStore",
    "StateError",
    "StoreCorruptError",
    "StoreError",
    "StoreNotFoundError",
    "StoreVersionError",
    "StreamConfig",
    "StreamMixture",
    "StreamingDataset",
    "TokenPoolingType",
    "TokenStore",
    "TokenizerError",
    "TopologyError",
    "attention_mask",
    "audit_coverage",
    "balance_remaining",
    "build_dataloader",
    "build_eval_dataset",
    "collate",
    "cu_seqlens",
    "distributed_topology",
    "interleave_datasets",
    "merge_states",
    "pad_stack_1d",
    "select",
    "shard_dataset_data_parallel",
    "shard_token_store",
    "slice_store",
    "split_store",
    "token_pooling_mask_from_attention_mask",
]


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use and cache the name here."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
