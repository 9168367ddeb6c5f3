"""KempnerForge's and Forgather's streaming constructors over StreamingDataset: same meaning accepted, other refused."""

from __future__ import annotations

import pytest

from conformance.impl_tests.stream_map_fns import Regroup, block_tokenize, count_words, shout, shout_batch
from conformance.impl_tests.streaming_corpus import impl_rows, take, tokenizer, write
from impl.errors import ConfigError, MapError, TopologyError
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


@pytest.mark.clause("STREAM-19")
def test_kempnerforge_names_over_a_save_to_disk_directory_read_its_split_in_state_json_order(tmp_path):
    import json

    import datasets

    rows = [f"r{i} " * (1 + i % 3) for i in range(12)]
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": rows}),
                         test=datasets.Dataset.from_dict({"text": rows[:2]})).save_to_disk(str(tmp_path / "dd"),
                                                                                           num_shards={"train": 3,
                                                                                                       "test": 1})
    state_path = tmp_path / "dd" / "train" / "state.json"
    state = json.loads(state_path.read_text())
    state["_data_files"].reverse()                 # the metadata's order, not the names' order, is the row order
    state_path.write_text(json.dumps(state))
    path = tokenizer()[0]
    ds = StreamingHuggingFaceDataset(hf_dataset_name=str(tmp_path / "dd"), hf_dataset_split="train",
                                     tokenizer_path=path, seq_len=4, shuffle_buffer_size=0, num_lanes=1)
    same = StreamingDataset(str(tmp_path / "dd"), split="train", tokenizer=path, seq_len=4, shuffle=False,
                            shuffle_buffer_size=0, num_lanes=1)
    assert [f[0] for f in ds.index.files] == [f[0] for f in same.index.files]
    assert [f[0].rsplit("/", 1)[-1] for f in ds.index.files] == [e["filename"] for e in state["_data_files"]]
    assert impl_rows(ds) == impl_rows(same)
    saved = StreamingHuggingFaceDataset(hf_dataset_name=str(tmp_path / "dd" / "test"), tokenizer_path=path,
                                        seq_len=4, shuffle_buffer_size=0)   # one saved Dataset: its files, split aside
    assert [f[0].rsplit("/", 1)[-1] for f in saved.index.files] == ["data-00000-of-00001.arrow"]


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
    for call in (lambda: base.slice(0, 5), lambda: base.select(range(3))):
        with pytest.raises(ConfigError, match="TokenStore|paths"):
            call()


@pytest.mark.clause("STREAM-20", "STREAM-21")
def test_forgather_s_block_tokenizer_map_equals_the_dataset_s_map_and_resumes_inside_a_batch(tmp_path):
    root, train = _data(tmp_path)
    path = tokenizer()[0]
    opts = dict(tokenizer=path, seq_len=4, num_lanes=2, add_eos=False)
    blocks = fast_load_iterable_dataset(str(root), split="train", **opts).shuffle(seed=2, buffer_size=3).map(
        block_tokenize, batched=True, batch_size=4, remove_columns=["text"])
    same = StreamingDataset(train, shuffle=True, seed=2, shuffle_buffer_size=3, **opts).map(
        block_tokenize, batch_size=4, name=f"{block_tokenize.__module__}.{block_tokenize.__qualname__}")
    expected = impl_rows(same)
    assert impl_rows(blocks) == expected and expected
    first = fast_load_iterable_dataset(str(root), split="train", **opts).shuffle(seed=2, buffer_size=3).map(
        block_tokenize, batched=True, batch_size=4, remove_columns="text")
    head = impl_rows(take(first, 3))
    state = first.state_dict()
    assert any(lane["output"] > 0 for lane in state["lanes"].values())
    resumed = blocks.shard(1, 0)
    resumed.load_state_dict(state)
    assert head + impl_rows(resumed) == expected


def test_forgather_map_keeps_the_text_column_as_hugging_face_does_and_refuses_other_meanings(tmp_path):
    root, _ = _data(tmp_path)
    base = fast_load_iterable_dataset(str(root), split="train", tokenizer=tokenizer()[0], seq_len=4, num_lanes=2)

    def tokens(rows):      # all but the document ids, which a map numbers by output (STREAM-20)
        return [[r[:6] + r[7:] for r in b] for b in rows]

    plain = tokens(impl_rows(base))
    assert tokens(impl_rows(base.map(count_words, batched=True, batch_size=3))) == plain   # text kept: same tokens
    assert impl_rows(base.map(shout)) == impl_rows(base.shard(1, 0).dataset.map(shout_batch, batch_size=1))
    with pytest.raises(MapError, match=r"while keeping the input column 'text': pass remove_columns=\['text'\]"):
        next(iter(base.map(Regroup(1, ids=True), batched=True, batch_size=4)))
    with pytest.raises(MapError, match=r"neither 'input_ids' .* nor 'text'"):
        next(iter(base.map(count_words, batched=True, remove_columns=["text"])))
    for kwargs, match in ((dict(with_indices=True), "no example index"), (dict(fn_kwargs={"k": 1}), "partial"),
                          (dict(drop_last_batch=True), "short last batch"), (dict(input_columns=["text"]), "dict"),
                          (dict(batched=True, batch_size=None), "batch_size=None")):
        with pytest.raises(ConfigError, match=match):
            base.map(count_words, **kwargs)
    with pytest.raises(ConfigError, match="already mapped"):
        base.map(count_words).map(count_words)
