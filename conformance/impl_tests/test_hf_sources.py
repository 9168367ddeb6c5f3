"""impl.arrow_stream and impl.hf_sources: Arrow IPC streams and HF ``datasets`` sources (STREAM-18, STREAM-19).

Arrow streams are checked against ``reference.arrow_stream`` bit for bit;
an HF source is checked against the same texts given as jsonl files with
one unit per file (``unit_bytes`` larger than any file, one record batch
per arrow file), whose units then match one for one, so every batch field,
document ids included, must be equal.
"""

from __future__ import annotations

import itertools
import json
import os
import re

import datasets
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.impl_tests.streaming_corpus import file_specs, impl_rows, ref_rows, take, tokenizer, words, write
from impl.errors import ConfigError, SourceError, StateError
from impl.files import LocalFiles
from impl.streaming import StreamingDataset
from impl.units import build_unit_index, read_unit
from reference import units as ref_units
from reference.arrow_stream import ArrowStreamFile
from reference.streaming import StreamingReferenceLoader

datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()
_counter = itertools.count()
BIG = 1 << 30      # unit_bytes: one unit per jsonl file, as one record batch per arrow file


def write_streams(directory, groups_per_file):
    """Arrow IPC stream files (text and an int column), one record batch per group; and the reference's view."""
    directory.mkdir(parents=True, exist_ok=True)
    names, ref = [], []
    schema = pa.schema([("text", pa.string()), ("n", pa.int64())])
    for i, groups in enumerate(groups_per_file):
        path = directory / f"s{i:02d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            for g in groups:
                w.write_batch(pa.record_batch([pa.array(g, pa.string()), pa.array(range(len(g)), pa.int64())],
                                              schema=schema))
        st_ = os.stat(path)
        ref.append(ArrowStreamFile(path=str(path), data=path.read_bytes(), groups=tuple(tuple(g) for g in groups),
                                   etag=str(st_.st_mtime_ns)))
        names.append(str(path))
    return names, ref


streams = st.lists(st.lists(st.lists(words, max_size=4), min_size=1, max_size=3), min_size=1, max_size=2)


@pytest.mark.clause("STREAM-18", "STREAM-5")
@given(groups=streams, specs=file_specs(max_files=2), unit_bytes=st.integers(1, 40))
def test_an_arrow_stream_s_unit_index_and_batches_equal_the_reference_s(tmp_path, groups, specs, unit_bytes):
    d = tmp_path / f"c{next(_counter)}"
    s_names, s_ref = write_streams(d, groups)
    o_names, o_ref = write(d, specs)
    names, ref_files = s_names + o_names, s_ref + o_ref
    index = build_unit_index(names, unit_bytes=unit_bytes)
    expected = ref_units.build_index(ref_files, unit_bytes)
    assert index.to_json() == expected.to_json() and index.fingerprint == expected.fingerprint
    for u in range(len(index.units)):
        assert read_unit(LocalFiles(""), index, u) == ref_units.read_unit(ref_files, expected, u)


@pytest.mark.clause("STREAM-18", "STREAM-15")
@given(groups=streams, seed=st.integers(0, 3), lanes=st.sampled_from([1, 2]), cut=st.integers(0, 4))
def test_an_arrow_stream_streams_and_resumes_mid_epoch_as_the_reference_does(tmp_path, groups, seed, lanes, cut):
    names, ref_files = write_streams(tmp_path / f"c{next(_counter)}", groups)
    path, tok, tok_id = tokenizer()

    def pair():
        ds = StreamingDataset(names, tokenizer=path, seq_len=3, num_lanes=lanes, seed=seed, shuffle=True,
                              unit_window=2, shuffle_buffer_size=2)
        return ds, StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id)

    ds, ref = pair()
    whole = impl_rows(ds) + impl_rows(ds)
    assert whole == ref_rows(ref) + ref_rows(ref)
    first, ref1 = pair()
    got = impl_rows(take(iter(first), cut))
    assert got == ref_rows(take(iter(ref1), cut))
    assert first.state_dict() == ref1.state_dict()
    resumed, _ = pair()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    while resumed.epoch < 2:
        got += impl_rows(resumed)
    assert got == whole


@pytest.mark.clause("STREAM-18")
def test_an_arrow_stream_with_a_dictionary_batch_or_cut_short_is_refused_naming_the_file(tmp_path):
    arr = pa.array(["a", "b", "a"]).dictionary_encode()
    schema = pa.schema([("text", arr.type)])
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch([arr], schema=schema))
    with pytest.raises(SourceError, match=rf"{tmp_path}/d.arrow: the message at byte \d+ is a dictionary batch "
                                          r"\(a dictionary-encoded column\), not a record batch; cast the columns"):
        build_unit_index([str(tmp_path / "d.arrow")])
    (name,), _ = write_streams(tmp_path / "s", [[["ab", "c"], ["d"]]])
    with open(name, "r+b") as f:
        f.truncate(os.path.getsize(name) - 40)
    with pytest.raises(SourceError, match=rf"{name} cannot be read as an Arrow IPC stream .*truncated: write it again"):
        build_unit_index([name])


# ---------------------------------------------------------------- HF sources against jsonl (STREAM-19)

def _jsonl(directory, shards):
    """The same rows as jsonl files, one per shard."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for i, rows in enumerate(shards):
        path = directory / f"p{i:02d}.jsonl"
        path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
        names.append(str(path))
    return names


def _ds(source, **over):
    opts = dict(tokenizer=tokenizer()[0], seq_len=3, num_lanes=2, seed=1, shuffle=True, unit_window=2,
                shuffle_buffer_size=2, unit_bytes=BIG)
    return StreamingDataset(source, **dict(opts, **over))


def _epochs(ds, n=2):
    out = []
    for _ in range(n):
        out += impl_rows(ds)
    return out


def _resumes_exactly(make, cut):
    """Batches after a checkpoint at ``cut`` in a fresh dataset continue the uninterrupted two epochs."""
    whole = _epochs(make())
    first = make()
    got = impl_rows(take(iter(first), cut))
    state = json.loads(json.dumps(first.state_dict()))
    again = make()
    again.load_state_dict(state)
    while again.epoch < 2:
        got += impl_rows(again)
    return got == whole


shard_rows = st.lists(st.lists(st.text(alphabet="ab cé", min_size=1, max_size=12), min_size=1, max_size=5),
                      min_size=1, max_size=3)


@pytest.mark.clause("STREAM-19")
@given(shards=shard_rows, cut=st.integers(0, 3))
def test_a_save_to_disk_dataset_dict_streams_as_its_rows_given_as_jsonl_and_resumes_exactly(tmp_path_factory, shards,
                                                                                             cut):
    d = tmp_path_factory.mktemp("saved")
    jsonl = _jsonl(d / "jsonl", shards)
    rows = [r for shard in shards for r in shard]
    train = datasets.concatenate_datasets([datasets.Dataset.from_dict({"text": s}) for s in shards])
    dd = datasets.DatasetDict(train=train, test=datasets.Dataset.from_dict({"text": ["x"]}))
    # save_to_disk cuts a split into shards of equal size: write each shard as its own file instead
    dd.save_to_disk(str(d / "hf"), num_shards={"train": 1, "test": 1})
    state = json.loads((d / "hf" / "train" / "state.json").read_text())
    for i, s in enumerate(shards):
        datasets.Dataset.from_dict({"text": s}).save_to_disk(str(d / f"part{i}"))
        os.replace(d / f"part{i}" / "data-00000-of-00001.arrow", d / "hf" / "train" / f"data-{i:05d}.arrow")
    os.remove(d / "hf" / "train" / "data-00000-of-00001.arrow")
    state["_data_files"] = [{"filename": f"data-{i:05d}.arrow"} for i in range(len(shards))]
    (d / "hf" / "train" / "state.json").write_text(json.dumps(state))
    assert datasets.load_from_disk(str(d / "hf"))["train"]["text"] == rows
    assert _epochs(_ds(str(d / "hf"), split="train")) == _epochs(_ds(jsonl))
    assert _resumes_exactly(lambda: _ds(str(d / "hf"), split="train"), cut)


@pytest.mark.clause("STREAM-19")
def test_a_dataset_directory_its_loaded_dataset_and_a_load_dataset_cache_stream_as_the_jsonl_they_hold(tmp_path):
    rows = [f"row {i} " + "ab" * i for i in range(9)]
    jsonl = _jsonl(tmp_path / "jsonl", [rows])
    want = _epochs(_ds(jsonl))
    built = datasets.load_dataset("json", data_files={"train": jsonl}, cache_dir=str(tmp_path / "cache"))
    cache_dir = os.path.dirname(built["train"].cache_files[0]["filename"])
    assert _epochs(_ds(cache_dir)) == want
    assert _ds(built["train"]).index.fingerprint == _ds(cache_dir).index.fingerprint   # same files, same identity
    assert _epochs(_ds(built["train"])) == want
    assert _epochs(_ds(built, split="train")) == want
    built["train"].save_to_disk(str(tmp_path / "saved"))
    assert _epochs(_ds(str(tmp_path / "saved"))) == want
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert _epochs(_ds(loaded)) == want
    assert _resumes_exactly(lambda: _ds(loaded), 2)
    for shards in (1, 2, 4):          # a Dataset's to_iterable_dataset: its shards, joined, are its files
        assert _epochs(_ds(loaded.to_iterable_dataset(num_shards=shards))) == want
    assert _resumes_exactly(lambda: _ds(loaded.to_iterable_dataset(num_shards=3)), 2)
    streamed = datasets.load_dataset("json", data_files={"train": jsonl}, split="train", streaming=True)
    assert _epochs(_ds(streamed)) == want
    assert _ds(streamed).index.fingerprint == _ds(jsonl).index.fingerprint
    assert _resumes_exactly(lambda: _ds(streamed), 3)


@pytest.mark.clause("STREAM-19")
def test_a_save_to_disk_dataset_of_several_shards_streams_them_in_state_json_order(tmp_path):
    rows = [f"r{i}" * (1 + i % 3) for i in range(12)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    jsonl = _jsonl(tmp_path / "jsonl", [rows[0:4], rows[4:8], rows[8:12]])
    assert _epochs(_ds(str(tmp_path / "saved"))) == _epochs(_ds(jsonl))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert _epochs(_ds(loaded.to_iterable_dataset(num_shards=2))) == _epochs(_ds(jsonl))   # shards across files
    state_path = tmp_path / "saved" / "state.json"
    state = json.loads(state_path.read_text())
    state["_data_files"].reverse()
    state_path.write_text(json.dumps(state))
    assert _epochs(_ds(str(tmp_path / "saved"))) == _epochs(_ds(jsonl[::-1]))


# ---------------------------------------------------------------- bad inputs

def test_a_dataset_dict_without_a_split_is_refused_listing_its_splits(tmp_path):
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": ["a"]}),
                              test=datasets.Dataset.from_dict({"text": ["b"]}))
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"dd is a DatasetDict of splits \['train', 'test'\]; pass split="):
        _ds(str(tmp_path / "dd"))
    with pytest.raises(SourceError, match=r"split='dev' is not among the DatasetDict's splits \['train', 'test'\]"):
        _ds(str(tmp_path / "dd"), split="dev")
    with pytest.raises(SourceError, match=r"DatasetDict holds splits \['train', 'test'\]; pass split="):
        _ds(datasets.load_from_disk(str(tmp_path / "dd")))
    with pytest.raises(ConfigError, match=r"split='train' is for an HF source"):
        _ds(_jsonl(tmp_path / "j", [["a"]]), split="train")


def test_a_dataset_whose_rows_are_not_its_cache_files_is_refused_naming_save_to_disk(tmp_path):
    memory = datasets.Dataset.from_dict({"text": [f"r{i}" for i in range(10)]})
    with pytest.raises(SourceError, match=r"held in memory \(it has no cache files\).*ds.save_to_disk\(<dir>\)"):
        _ds(memory)
    memory.save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    with pytest.raises(SourceError, match=r"indices mapping .*flatten_indices\(\)"):
        _ds(loaded.shuffle(seed=0))
    with pytest.raises(SourceError, match=r"columns or rows beside its cache files .*save_to_disk"):
        _ds(loaded.add_column("n", list(range(10))))
    with pytest.raises(SourceError, match=r"columns or rows beside its cache files"):
        _ds(loaded.rename_column("text", "body"), text_field="body")
    with pytest.raises(SourceError, match=rf"holds only rows 0 .. 5 of {tmp_path}/saved/data-00000-of-00001.arrow "
                                          r"\(a slice, select or shard\).*save_to_disk"):
        _ds(loaded.select(range(5)))
    with pytest.raises(SourceError, match=r"IterableDataset \(its shards joined\) holds only rows 2 .. 10"):
        _ds(loaded.select(range(2, 10)).to_iterable_dataset(num_shards=2))


def test_an_iterable_dataset_that_cannot_be_reread_by_position_is_refused_naming_the_fix(tmp_path):
    gen = datasets.IterableDataset.from_generator(lambda: ({"text": t} for t in ("a", "b")))
    with pytest.raises(SourceError, match=r"built on ExamplesIterable .*Dataset.from_generator\(...\) / "
                                          r"ds.save_to_disk\(<dir>\)"):
        _ds(gen)
    jsonl = _jsonl(tmp_path / "j", [["a", "b"]])
    streamed = datasets.load_dataset("json", data_files=jsonl, split="train", streaming=True)
    with pytest.raises(SourceError, match=r"built on MappedExamplesIterable"):
        _ds(streamed.map(lambda x: {"text": x["text"] + "!"}))
    with pytest.raises(SourceError, match=r"held in memory \(it has no cache files\)"):
        _ds(datasets.Dataset.from_dict({"text": ["a", "b"]}).to_iterable_dataset())
    with pytest.raises(SourceError, match=r"split_dataset_by_node; pass the unsplit one"):
        from datasets.distributed import split_dataset_by_node

        _ds(split_dataset_by_node(streamed, rank=0, world_size=2))


def test_an_hf_directory_without_the_text_column_is_refused_naming_the_file_and_columns(tmp_path):
    datasets.Dataset.from_dict({"body": ["a"]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(SourceError, match=r"data-00000-of-00001.arrow has no column 'text' \(its columns: \['body'\]\); "
                                          r"pass text_field="):
        _ds(str(tmp_path / "saved"))
    assert _epochs(_ds(str(tmp_path / "saved"), text_field="body", seq_len=1), 1) != []
    with pytest.raises(SourceError, match=r"neither a save_to_disk directory nor a load_dataset cache"):
        _ds(str(tmp_path))


@pytest.mark.clause("STREAM-15", "STREAM-18")
def test_an_arrow_file_changed_between_checkpoint_and_resume_is_refused_naming_the_file(tmp_path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": [f"row {i} ab ab" for i in range(8)]}).save_to_disk(str(saved))
    idx = tmp_path / "idx"
    ds = _ds(str(saved), index_dir=idx)
    take(iter(ds), 2)
    state = ds.state_dict()
    other = tmp_path / "other"
    datasets.Dataset.from_dict({"text": [f"new row {i}" for i in range(9)]}).save_to_disk(str(other))
    os.replace(other / "data-00000-of-00001.arrow", saved / "data-00000-of-00001.arrow")
    name = str(saved / "data-00000-of-00001.arrow")
    with pytest.raises(StateError, match=rf"unit index \({name} changed \(size \d+, version \d+ at the checkpoint; "
                                         rf"size \d+, version \d+ now\)\).*start from a fresh state"):
        _ds(str(saved), index_dir=idx).load_state_dict(state)
    with pytest.raises(StateError, match=r"with the same index_dir at checkpoint and resume the changed file is named"):
        _ds(str(saved)).load_state_dict(state)
    with pytest.raises(SourceError, match=rf"{name} changed since its unit index was built .*restore the file"):
        impl_rows(take(iter(ds), 1))


@pytest.mark.parametrize("what, attribute", [("dataset", "_indices"), ("iterable", "_ex_iterable"),
                                             ("iterable", "_distributed")])
def test_a_datasets_version_without_an_internal_attribute_read_raises_datasets_version_error_naming_it(
        tmp_path, what, attribute):
    """Each private attribute read is one accessor: its absence is named with the version and the fix, never
    taken for "not split" or surfaced as an AttributeError from inside the loader (STREAM-19)."""
    from impl.errors import DatasetsVersionError

    jsonl = _jsonl(tmp_path / "j", [["a", "b"]])
    if what == "dataset":
        datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "saved"))
        source = datasets.load_from_disk(str(tmp_path / "saved"))
    else:
        source = datasets.load_dataset("json", data_files=jsonl, split="train", streaming=True)
    delattr(source, attribute)          # as a datasets release that renamed or dropped it
    kind = "Dataset" if what == "dataset" else "IterableDataset"
    with pytest.raises(DatasetsVersionError, match=rf"datasets {re.escape(datasets.__version__)} has no "
                                                   rf"{kind}\.{attribute}, .*pass the data files themselves"):
        _ds(source)
