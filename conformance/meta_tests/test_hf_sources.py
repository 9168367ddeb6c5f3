"""Meta tests: reference.arrow_stream obeys STREAM-18.

The oracle for a stream's batch ranges is pyarrow's own message reader
(``pyarrow.ipc.MessageReader`` and the stream position after each message),
never the framing scan under test.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.assertions import assert_equal, assert_raises_typed
from reference.arrow_stream import ArrowStreamFile, stream_batches
from reference.errors import SourceError
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
    config = StreamingConfig(packing=PackingConfig(seq_len=2, mode="concat", add_eos=True, eos_id=9),
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

