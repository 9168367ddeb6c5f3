"""A document longer than many samples, beside a lane of short documents, streams as the reference does (STREAM-9).

Why its own test: impl tokenizes a unit at a time and keeps the prepared rows
it handed out in a small recent-rows cache. A document that spans many
samples is asked for once per sample; while another lane consumes many short
documents in between, that row leaves the cache, and it must be prepared
again from its unit, not looked up in what is left of the unit.
"""

from __future__ import annotations

import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, ref_rows, tokenizer, write
from impl.streaming import StreamingDataset
from reference.streaming import StreamingReferenceLoader


@pytest.mark.clause("STREAM-9")
@pytest.mark.parametrize("num_lanes", [2, 3])
def test_a_document_spanning_many_samples_beside_a_lane_of_short_ones_equals_the_reference(tmp_path, num_lanes):
    long_doc = " ".join(f"w{i}" for i in range(400))
    short = [f"s{i}" for i in range(300)]
    names, ref_files = write(tmp_path, [("txt", [[long_doc, "tail one", "tail two"]]), ("txt", [short])] +
                             [("txt", [short[:40]])] * (num_lanes - 2))
    path, tok, tok_id = tokenizer()
    ds = StreamingDataset(names, tokenizer=path, seq_len=4, num_lanes=num_lanes, batch_size=1)
    ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, batch_size=1)
    assert impl_rows(ds) == ref_rows(ref)
