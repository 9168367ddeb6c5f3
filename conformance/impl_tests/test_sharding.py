"""impl.sharding against reference.sharding, and the ShardedDataset view over plain torch datasets.

The reference is the oracle for the index arithmetic (every (N, W, mode,
policy), and file / example / auto sharding); the view tests check what the
d9d-style wrapper adds on top: iteration that ends, ``IndexError`` past the
end, padding that never borrows another shard's item, sort keys and batches
forwarded, views on a ``TokenStore`` and a ``PackedDataset``, and a state
that refuses another world size.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from conformance.assertions import assert_equal, assert_exactly_once, assert_raises_typed, check
from impl import sharding as ish
from impl.collation import collate
from impl.dataset import PackedDataset
from impl.errors import ConfigError, StateError, TopologyError
from impl.store import TokenStore
from reference import sharding as rsh
from reference.sharding import FILE_MODES, MODES, UNEVEN_POLICIES, ShardConfig

items = st.integers(min_value=0, max_value=80)
shards = st.integers(min_value=1, max_value=9)


def _reference_or_error(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except TopologyError as exc:
        return type(exc)


def _impl_or_error(fn, *args, **kwargs):
    try:
        out = fn(*args, **kwargs)
    except TopologyError as exc:
        return type(exc)
    return out.tolist() if hasattr(out, "tolist") else out


@pytest.mark.clause("SHARD-1", "SHARD-2", "SHARD-3", "SHARD-4", "SHARD-5", "SHARD-6", "SHARD-7", "SHARD-8",
                    "SHARD-15")
@given(n=items, w=shards, mode=st.sampled_from(MODES), uneven=st.sampled_from(UNEVEN_POLICIES))
def test_impl_shard_indices_and_sizes_equal_the_reference_for_every_layout_and_policy(n, w, mode, uneven):
    config = ShardConfig(num_shards=w, mode=mode, uneven=uneven)
    repro = {"n": n, "config": config}
    for r in range(w):
        assert_equal(_impl_or_error(ish.shard_indices, n, config, r), _reference_or_error(rsh.shard_indices, n, config, r),
                     clause="SHARD-1" if mode == "sequential" else "SHARD-2", what=f"shard {r}", repro=repro)
    assert_equal(_impl_or_error(ish.shard_sizes, n, config), _reference_or_error(rsh.shard_sizes, n, config),
                 clause="SHARD-8", what="shard sizes", repro=repro)


@pytest.mark.clause("SHARD-9", "SHARD-10", "SHARD-11")
@given(file_sizes=st.lists(st.integers(0, 12), max_size=8), w=shards, mode=st.sampled_from(FILE_MODES))
def test_impl_file_sharding_equals_the_reference_and_refuses_file_mode_with_more_shards_than_files(file_sizes, w, mode):
    repro = {"file_sizes": file_sizes, "num_shards": w, "mode": mode}
    for r in range(w):
        assert_equal(_impl_or_error(ish.shard_files, file_sizes, w, r, mode),
                     _reference_or_error(rsh.shard_files, file_sizes, w, r, mode), clause="SHARD-9",
                     what=f"file shard {r}", repro=repro)
    assert_equal(_impl_or_error(ish.file_shard_sizes, file_sizes, w, mode),
                 _reference_or_error(rsh.file_shard_sizes, file_sizes, w, mode), clause="SHARD-10",
                 what="file shard sizes", repro=repro)


def _views(n: int, w: int, mode: str, **kwargs) -> list[ish.ShardedDataset]:
    data = TensorDataset(torch.arange(n) * 10)
    return [ish.ShardedDataset(data, w, r, mode, **kwargs) for r in range(w)]


@pytest.mark.clause("SHARD-3")
@given(n=st.integers(1, 60), w=st.integers(1, 6), mode=st.sampled_from(MODES))
def test_iterating_unpadded_views_yields_every_item_exactly_once_and_ends(n, w, mode):
    seen = [int(x[0]) // 10 for view in _views(n, w, mode) for x in view]
    assert_exactly_once(seen, range(n), clause="SHARD-3", what="items over all views", repro={"n": n, "w": w})


@pytest.mark.clause("SHARD-15")
@given(n=st.integers(1, 60), w=st.integers(1, 6), mode=st.sampled_from(MODES))
def test_padding_to_equal_size_repeats_only_the_shards_own_items(n, w, mode):
    repro = {"n": n, "w": w, "mode": mode}
    if n < w:
        assert_raises_typed(TopologyError, ish.ShardedDataset, list(range(n)), w, 0, mode, True, clause="SHARD-15",
                            what="padding with fewer items than shards", mentions=["wrap"])
        return
    own = [set(view.indices.tolist()) for view in _views(n, w, mode)]
    padded = _views(n, w, mode, pad_to_equal_size_across_shards=True)
    assert_equal({len(v) for v in padded}, {-(-n // w)}, clause="SHARD-15", what="padded lengths", repro=repro)
    for r, view in enumerate(padded):
        got = {int(view[i][0]) // 10 for i in range(len(view))}
        check(got == own[r], clause="SHARD-15", what=f"shard {r} holds {sorted(got - own[r])} of another shard",
              repro=repro)


@pytest.mark.clause("SHARD-14")
def test_view_indexing_raises_index_error_past_the_end_and_accepts_negative_indices():
    view = _views(14, 4, "chunked")[3]
    assert_equal([int(view[i][0]) for i in range(-3, 3)], [110, 120, 130, 110, 120, 130], clause="SHARD-2",
                 what="negative and positive indices")
    with pytest.raises(IndexError, match="index 3 is out of range for shard 3 of 4"):
        view[3]
    with pytest.raises(IndexError):
        view[-4]
    with pytest.raises(TypeError):
        view[1.0]
    assert_equal(len(list(iter(view))), 3, clause="SHARD-2", what="items iterated")


@pytest.mark.clause("SHARD-14")
def test_impossible_views_are_refused_with_typed_errors():
    assert_raises_typed(TopologyError, ish.ShardedDataset, [1, 2], 4, 4, clause="SHARD-14", what="shard 4 of 4",
                        mentions=["current_shard=4", "total_shards=4"])
    assert_raises_typed(TopologyError, ish.ShardedDataset, [1, 2], 0, 0, clause="SHARD-14", what="0 shards",
                        mentions=["total_shards=0"])
    assert_raises_typed(ConfigError, ish.ShardedDataset, [1, 2], 2, 0, "strided", clause="SHARD-14",
                        what="bad mode", mentions=["indexing_mode", "chunked"])
    assert_raises_typed(ConfigError, ish.ShardedDataset, [1, 2], 2, 0, "sequential", True, uneven="wrap",
                        clause="SHARD-14", what="both padding switches", mentions=["repeat_own_last"])


@pytest.mark.clause("SHARD-1")
def test_d9d_enum_and_data_parallel_helper_without_a_process_group_give_one_full_shard():
    view = ish.shard_dataset_data_parallel(list(range(7)), indexing_mode=ish.ShardIndexingMode.chunked)
    assert_equal([view[i] for i in range(len(view))], list(range(7)), clause="SHARD-1", what="single-rank view")


class _Mesh:
    """A ``DeviceMesh`` stand-in with torch's signatures: ``size(dim)`` takes an index, ``get_local_rank`` either."""

    def __init__(self, sizes: dict[str, int], ranks: dict[str, int]) -> None:
        self.mesh_dim_names, self.ndim = tuple(sizes), len(sizes)
        self._sizes, self._ranks = list(sizes.values()), list(ranks.values())

    def size(self, dim: int) -> int:
        return self._sizes[dim]

    def get_local_rank(self, dim: int) -> int:
        return self._ranks[dim]


@pytest.mark.clause("SHARD-13")
def test_data_parallel_helper_reads_the_dp_dimension_of_a_device_mesh_and_refuses_a_missing_one():
    mesh = _Mesh({"dp": 3, "tp": 2}, {"dp": 1, "tp": 1})
    view = ish.shard_dataset_data_parallel(list(range(10)), mesh)
    assert_equal([view[i] for i in range(len(view))], [1, 4, 7, 7], clause="SHARD-15", what="dp rank 1 of 3")
    assert_raises_typed(TopologyError, ish.shard_dataset_data_parallel, list(range(10)), mesh, mesh_dim="fsdp",
                        clause="SHARD-14", what="missing mesh dimension", mentions=["fsdp", "mesh_dim"])
    by_index = ish.shard_dataset_data_parallel(list(range(10)), mesh, mesh_dim=0)
    assert_equal(by_index.indices.tolist(), view.indices.tolist(), clause="SHARD-15", what="dimension by index")
    assert_raises_typed(TopologyError, ish.shard_dataset_data_parallel, list(range(10)), mesh, mesh_dim=2,
                        clause="SHARD-14", what="dimension index out of range", mentions=["mesh_dim=2"])


@pytest.mark.clause("SHARD-9", "SHARD-10", "SHARD-11")
def test_token_store_views_shard_whole_files_or_balanced_blocks_and_refuse_empty_file_shards(tmp_path):
    files = [[[1, 2], [3]], [[4, 5, 6]], [[7], [8], [9]]]
    store = TokenStore.from_token_files(files, tmp_path / "store")
    docs = [list(map(int, store[i])) for i in range(len(store))]
    by_file = [ish.shard_token_store(store, 2, r, mode="file") for r in range(2)]
    assert_equal([[list(map(int, v[i])) for i in range(len(v))] for v in by_file],
                 [[docs[0], docs[1], docs[3], docs[4], docs[5]], [docs[2]]], clause="SHARD-9", what="file views")
    by_example = [ish.shard_token_store(store, 4, r) for r in range(4)]   # auto: 3 files < 4 shards
    assert_equal([len(v) for v in by_example], [2, 2, 1, 1], clause="SHARD-11", what="auto picks example")
    assert_raises_typed(TopologyError, ish.shard_token_store, store, 4, 0, mode="file", clause="SHARD-9",
                        what="more shards than files", mentions=["mode='example'", "num_files=3"])


@pytest.mark.clause("SHARD-1")
def test_views_of_a_packed_dataset_serve_its_samples_singly_and_in_batches(tmp_path):
    store = TokenStore.from_token_files([[list(range(1, 40)), list(range(50, 90))]], tmp_path / "store", eos_id=0)
    dataset = PackedDataset(store, seq_len=8, packing="chunk", cache_dir=False)
    view = ish.ShardedDataset(dataset, 2, 1)
    for i in range(len(view)):
        assert_equal(view[i]["input_ids"].tolist(), dataset[int(view.indices[i])]["input_ids"].tolist(),
                     clause="SHARD-1", what=f"view sample {i}")
    batch = collate(view.__getitems__([0, 1]))   # a batch dict, or a SampleBatch holding one
    assert_equal(batch["sample_index"].tolist(), view.indices[:2].tolist(), clause="SHARD-1", what="batched keys")
    loader = DataLoader(view, batch_size=2, collate_fn=collate)
    assert_equal(sum(len(b["sample_index"]) for b in loader), len(view), clause="SHARD-1", what="DataLoader samples")


class _Keyed(list):
    def sort_key(self, index: int) -> int:
        return len(self[index])


def test_view_forwards_sort_key_only_when_the_dataset_has_one():
    view = ish.ShardedDataset(_Keyed(["a", "bbb", "cc", "dddd"]), 2, 1)
    assert view.sort_key(1) == 4
    assert not hasattr(ish.ShardedDataset(["a", "b"], 2, 0), "sort_key")


def test_view_state_round_trips_as_json_and_refuses_another_world_size():
    import json

    view = _views(10, 2, "sequential")[1]
    state = json.loads(json.dumps(view.state_dict()))
    _views(10, 2, "sequential")[1].load_state_dict(state)
    with pytest.raises(StateError, match="not elastic"):
        _views(10, 3, "sequential")[1].load_state_dict(state)
    with pytest.raises(StateError, match="other data"):
        _views(11, 2, "sequential")[1].load_state_dict(state)
