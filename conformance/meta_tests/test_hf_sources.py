"""Meta tests: reference.arrow_stream and reference.hf_sources obey STREAM-18 and STREAM-19.

The oracle for a stream's batch ranges is pyarrow's own message reader
(``pyarrow.ipc.MessageReader`` and the stream position after each message),
never the framing scan under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed
from reference.arrow_stream import ArrowStreamFile, stream_batches
from reference.errors import SourceError
from reference.hf_sources import cache_shards, hf_data_files
from reference.packing import PackingConfig
from reference.streaming import StreamingConfig, StreamingReferenceLoader
from reference.units import RowFile, build_index, read_unit

words = st.text(alphabet="abcd ", max_size=7)
batches = st.lists(st.lists(words, max_size=5), max_size=5)


def stream_bytes(groups, extra=False):
    """An Arrow IPC stream of one text column (and an int column with ``extra``), one record batch per group."""
    fields = [("text", pa.string())] + ([("n", pa.int64())] if extra else [])
    schema = pa.schema(fields)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for rows in groups:
            cols = [pa.array(rows, pa.string())] + ([pa.array(range(len(rows)), pa.int64())] if extra else [])
            writer.write_batch(pa.record_batch(cols, schema=schema))
    return sink.getvalue().to_pybytes()


def pyarrow_ranges(data):
    """Each record batch message's byte range, by pyarrow's message reader."""
    src = pa.BufferReader(data)
    reader = pa.ipc.MessageReader.open_stream(src)
    out, pos = [], 0
    while True:
        try:
            msg = reader.read_next_message()
        except StopIteration:
            return out
        if msg.type == "record batch":
            out.append((pos, src.tell()))
        pos = src.tell()


def tok(text):
    return [1 + "abcd ".index(c) for c in text]


@pytest.mark.clause("STREAM-18")
@given(groups=batches, extra=st.booleans())
def test_each_record_batch_of_an_arrow_stream_is_one_unit_at_its_messages_byte_range(groups, extra):
    data = stream_bytes(groups, extra)
    f = ArrowStreamFile(path="s.arrow", data=data, groups=tuple(tuple(g) for g in groups), etag="1")
    index = build_index([f])
    assert_equal([(u.start, u.stop) for u in index.units], pyarrow_ranges(data), clause="STREAM-18",
                 what="unit byte ranges", repro={"groups": groups})
    assert_equal([u.rows for u in index.units], [len(g) for g in groups], clause="STREAM-18", what="unit rows")
    assert_equal([read_unit([f], index, u) for u in range(len(index.units))], [list(g) for g in groups],
                 clause="STREAM-18", what="rows read unit by unit")
    assert_equal(index.files, (("s.arrow", "arrow_stream", False, len(data), "1"),), clause="STREAM-18",
                 what="index entry")


@pytest.mark.clause("STREAM-18")
@given(groups=batches.filter(lambda g: any(g)), seed=st.integers(0, 2**16), lanes=st.sampled_from([1, 2]))
def test_an_arrow_stream_streams_the_batches_of_the_same_groups_held_as_an_arrow_file(groups, seed, lanes):
    config = StreamingConfig(packing=PackingConfig(seq_len=1, mode="concat", add_eos=True, eos_id=9),
                             num_lanes=lanes, seed=seed, shuffle=True, unit_window=2, shuffle_buffer_size=2)
    rows = tuple(tuple(g) for g in groups)
    stream = [ArrowStreamFile(path="s.arrow", data=stream_bytes(groups), groups=rows)]
    table = [RowFile(path="s.arrow", groups=rows, format="arrow")]

    def batches_of(fs):
        return [b for b in StreamingReferenceLoader(fs, config, tok, tokenizer_id="chars", batch_size=1)]

    assert_equal(batches_of(stream), batches_of(table), clause="STREAM-18", what="batches", repro={"groups": groups})


def _dictionary_stream():
    sink = pa.BufferOutputStream()
    arr = pa.array(["a", "b", "a"]).dictionary_encode()
    schema = pa.schema([("text", arr.type)])
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.record_batch([arr], schema=schema))
    return sink.getvalue().to_pybytes()


@pytest.mark.clause("STREAM-18")
def test_a_stream_with_a_dictionary_batch_a_cut_message_or_no_schema_raises_naming_the_file():
    assert_raises_typed(SourceError, stream_batches, "d.arrow", _dictionary_stream(), clause="STREAM-18",
                        what="dictionary batch", mentions=["d.arrow", "dictionary batch", "cast the columns"])
    whole = stream_bytes([["ab", "c"]])
    assert_raises_typed(SourceError, stream_batches, "t.arrow", whole[:150], clause="STREAM-18",
                        what="truncated stream", mentions=["t.arrow", "truncated"])
    schema_end = pyarrow_ranges(whole)[0][0]
    assert_raises_typed(SourceError, stream_batches, "n.arrow", whole[schema_end:], clause="STREAM-18",
                        what="no schema first", mentions=["n.arrow", "schema"])
    assert_raises_typed(SourceError, stream_batches, "e.arrow", bytes(8), clause="STREAM-18",
                        what="no message", mentions=["e.arrow", "no schema"])


def listing(directory):
    """A directory as the reference's model: every file's path under it and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
            and not p.name.endswith(".lock")}


def quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


@pytest.mark.clause("STREAM-19")
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3), shards=st.integers(1, 3))
def test_a_save_to_disk_directory_streams_the_files_load_from_disk_reads_in_its_order(tmp_path_factory, sizes,
                                                                                          shards):
    datasets = quiet_datasets()
    directory = tmp_path_factory.mktemp("saved")
    splits = {f"s{i}": datasets.Dataset.from_dict({"text": [f"r{j}" for j in range(n)]}) for i, n in enumerate(sizes)}
    dd = datasets.DatasetDict(splits)
    dd.save_to_disk(str(directory), num_shards={k: min(shards, len(v)) for k, v in splits.items()})
    loaded = datasets.load_from_disk(str(directory))
    for split in splits:
        expected = [str(Path(c["filename"]).relative_to(directory))
                    for c in loaded[split].cache_files]
        assert_equal(hf_data_files(listing(directory), split), expected, clause="STREAM-19", what=f"split {split}")
        inner = {k[len(split) + 1:]: v for k, v in listing(directory).items() if k.startswith(split + "/")}
        assert_equal(hf_data_files(inner), [e[len(split) + 1:] for e in expected], clause="STREAM-19",
                     what=f"the Dataset directory of split {split}")
    assert_raises_typed(SourceError, hf_data_files, listing(directory), clause="STREAM-19", what="no split",
                        mentions=["DatasetDict", *splits, "split="])
    assert_raises_typed(SourceError, hf_data_files, listing(directory), "nope", clause="STREAM-19",
                        what="unknown split", mentions=["'nope'", *splits])


@pytest.mark.clause("STREAM-19")
def test_a_state_json_order_wins_over_the_listing_order_and_a_named_missing_file_raises():
    files = {"state.json": b'{"_data_files": [{"filename": "b.arrow"}, {"filename": "a.arrow"}], "_split": "train"}',
             "a.arrow": b"", "b.arrow": b"", "dataset_info.json": b"{}"}
    assert_equal(hf_data_files(files), ["b.arrow", "a.arrow"], clause="STREAM-19", what="state.json order")
    assert_equal(hf_data_files(files, "train"), ["b.arrow", "a.arrow"], clause="STREAM-19", what="its own split")
    assert_raises_typed(SourceError, hf_data_files, files, "test", clause="STREAM-19", what="split of a Dataset",
                        mentions=["'test'", "one Dataset", "leave split out"])
    del files["a.arrow"]
    assert_raises_typed(SourceError, hf_data_files, files, clause="STREAM-19", what="missing data file",
                        mentions=["'a.arrow'", "save it again"])
    assert_raises_typed(SourceError, hf_data_files, {"x.arrow": b""}, clause="STREAM-19", what="not an HF directory",
                        mentions=["save_to_disk", "load_dataset"])


@pytest.mark.clause("STREAM-19")
def test_a_load_dataset_cache_streams_one_split_s_shards_in_shard_order(tmp_path):
    datasets = quiet_datasets()
    for name, n in (("train", 5), ("test", 2)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": f"{name}{j}"}) + "\n" for j in range(n)))
    built = datasets.load_dataset("json", data_files={s: str(tmp_path / f"{s}.jsonl") for s in ("train", "test")},
                                  cache_dir=str(tmp_path / "cache"))
    (info,) = list((tmp_path / "cache").rglob("dataset_info.json"))
    directory = info.parent
    for split in ("train", "test"):
        expected = [str(Path(c["filename"]).relative_to(directory))
                    for c in built[split].cache_files]
        assert_equal(hf_data_files(listing(directory), split), expected, clause="STREAM-19", what=split)
    assert_raises_typed(SourceError, hf_data_files, listing(directory), clause="STREAM-19", what="two splits",
                        mentions=["'test'", "'train'", "split="])
    shards = ["a-b-train-00001-of-00002.arrow", "a-b-train-00000-of-00002.arrow"]
    assert_equal(cache_shards(shards), {"train": sorted(shards)}, clause="STREAM-19", what="hyphenated builder")
    assert_raises_typed(SourceError, cache_shards, shards[:1], clause="STREAM-19", what="a shard missing",
                        mentions=["'train'", "load_dataset"])
