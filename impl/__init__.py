"""loadspec's production loaders: ``from impl import PackedDataset, TokenStore, build_dataloader``.

One import for what a training script uses; each name lives in the module
of its concept (the module map in the README lists them in pipeline order).
``__all__`` is sorted and asserted by ``conformance/impl_tests/test_public_api.py``.
"""

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
    ConfigError,
    EmptyDataError,
    LoadspecError,
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
from impl.loader import ElasticLoader, build_dataloader
from impl.mixing import MixedDataset, StreamConfig, balance_remaining, interleave_datasets
from impl.partition import ElasticSampler, SampleKey, distributed_topology
from impl.resume import Coverage, audit_coverage
from impl.sharding import ShardedDataset, ShardIndexingMode, shard_dataset_data_parallel, shard_token_store
from impl.splits import SplitStore, select, slice_store, split_store
from impl.store import BuildOptions, TokenStore

__all__ = [
    "BufferSortedDataset",
    "BuildOptions",
    "ConfigError",
    "Coverage",
    "ElasticLoader",
    "ElasticSampler",
    "EmptyDataError",
    "EvalBuildError",
    "EvalDataset",
    "HuggingFaceDataset",
    "LoadspecError",
    "MixedDataset",
    "PackedDataset",
    "PaddingSide1D",
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
    "pad_stack_1d",
    "select",
    "shard_dataset_data_parallel",
    "shard_token_store",
    "slice_store",
    "split_store",
    "token_pooling_mask_from_attention_mask",
]
