"""impl.arrow_stream: Arrow IPC stream files against ``reference.arrow_stream``, bit for bit (STREAM-18)."""

from __future__ import annotations

import itertools
import json
import os

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.impl_tests.streaming_corpus import file_specs, impl_rows, ref_rows, take, tokenizer, words, write
from impl.files import LocalFiles
from impl.streaming import StreamingDataset
from impl.units import build_unit_index, read_unit
from reference import units as ref_units
from reference.arrow_stream import ArrowStreamFile
from reference.streaming import StreamingReferenceLoader

_counter = itertools.count()


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

