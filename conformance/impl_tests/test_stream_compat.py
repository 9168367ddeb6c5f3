"""KempnerForge's and Forgather's streaming constructors over StreamingDataset: same meaning accepted, other refused."""

from __future__ import annotations

import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, take, tokenizer, write
from impl.errors import ConfigError, TopologyError
from impl.stream_compat import StreamingHuggingFaceDataset, fast_load_iterable_dataset
from impl.streaming import StreamingDataset, merge_states

ROWS = [f"row {i} " + "word " * (i % 4) for i in range(24)]


def _data(tmp_path):
    """A data directory with a train and a test split (jsonl and parquet), and a file of an unknown kind."""
    train, _ = write(tmp_path / "d" / "train", [("jsonl", [ROWS[:12]]), ("parquet", [ROWS[12:18], ROWS[18:]])])
    write(tmp_path / "d" / "test", [("txt", [ROWS[:3]])])
    (tmp_path / "d" / "README.md").write_text("not data")
    return tmp_path / "d", train


def test_kempnerforge_names_give_the_streaming_dataset_of_the_split_s_files_with_the_buffer(tmp_path):
    root, train = _data(tmp_path)
    path = tokenizer()[0]
    ds = StreamingHuggingFaceDataset(hf_dataset_name=str(root), hf_dataset_split="train", tokenizer_path=path,
                                     seq_len=4, shuffle_buffer_size=5, seed=3, num_lanes=2)
    assert ds.config.shuffle and ds.config.shuffle_buffer_size == 5 and ds.config.seed == 3
    assert [f[0] for f in ds.index.files] == train
    same = StreamingDataset(train, tokenizer=path, seq_len=4, shuffle=True, shuffle_buffer_size=5, seed=3, num_lanes=2)
    assert impl_rows(ds) == impl_rows(same)
    assert StreamingHuggingFaceDataset(hf_dataset_name=str(root), tokenizer_path=path,
                                       seq_len=4).config.shuffle_buffer_size == 10_000
    with pytest.raises(ConfigError, match=r"pack_sequences=False .* PackedDataset\(\.\.\., packing='none'\)"):
        StreamingHuggingFaceDataset(hf_dataset_name=str(root), tokenizer_path=path, seq_len=4, pack_sequences=False)


def test_forgather_shuffle_shard_and_state_resume_and_other_meanings_are_refused(tmp_path):
    root, _ = _data(tmp_path)
    base = fast_load_iterable_dataset(str(root), split="train", tokenizer=tokenizer()[0], seq_len=4, num_lanes=2)
    shuffled = base.shuffle(seed=7, buffer_size=3)
    assert shuffled.dataset.config.shuffle_buffer_size == 3 and not base.dataset.config.shuffle
    shards = [shuffled.shard(2, i, mode="file") for i in range(2)]
    assert [s.dataset.rank for s in shards] == [0, 1] and shards[0].dataset.world_size == 2
    for s in shards:
        take(s, 1)
    whole = shuffled.shard(1, 0)
    expected = impl_rows(whole)
    resumed = shuffled.shard(1, 0)
    resumed.load_state_dict(merge_states([s.state_dict() for s in shards]))
    lanes = {int(k): v["samples"] for k, v in resumed.state_dict()["lanes"].items()}
    assert sorted(r for b in impl_rows(resumed) for r in b) == sorted(
        r for b in expected for r in b if r[2] >= lanes[r[1]])
    with pytest.raises(TopologyError, match=r"num_lanes=2 .* choose num_shards in \[1, 2\]"):
        base.shard(3, 0, mode="example")
    with pytest.raises(ConfigError, match="slices examples by position"):
        fast_load_iterable_dataset(str(root), split="train[10:]", tokenizer=tokenizer()[0], seq_len=4)
    for call in (lambda: base.slice(0, 5), lambda: base.select(range(3)), lambda: base.map(len, batched=True)):
        with pytest.raises(ConfigError, match="StreamingDataset|TokenStore|paths"):
            call()
