"""impl.stream_tokens reads and encodes a lane's next unit ahead, and impl.stream_loader's workers send numpy:
neither changes what a pass hands out, counts or raises (STREAM-2, STREAM-11, STREAM-15, STREAM-17)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, ref_rows, tokenizer, write
from impl.errors import SourceError
from impl.loader import build_dataloader
from impl.stream_lanes import PIPE_KEY, lane_rows
from impl.streaming import StreamingDataset
from reference.streaming import StreamingReferenceLoader

ROWS = [f"row {i} " + "word " * (i % 5) for i in range(30)]


def _ds(names, **kw):
    return StreamingDataset(names, tokenizer=tokenizer()[0], **{"seq_len": 4, "unit_bytes": 64, **kw})


def _unit_of(ds, g):
    return int(np.searchsorted(ds._starts, g, side="right")) - 1


@pytest.mark.clause("STREAM-15")
def test_a_lanes_next_unit_is_encoded_ahead_but_counted_as_read_only_when_the_lane_needs_it(tmp_path):
    names, _ = write(tmp_path / "d", [("jsonl", [ROWS])])
    ds = _ds(names)
    _, encode, _ = tokenizer()
    eos = ds.config.packing.eos_id
    rows = lane_rows(ds.windows(0, 0))
    order = list(dict.fromkeys(_unit_of(ds, int(g)) for g in rows))
    assert len(order) >= 3
    tokens = ds.row_tokens()
    tokens.follow(rows)
    assert list(tokens.ahead) == [order[0]] and ds.unit_reads == 0
    first = int(rows[0])
    assert tokens(first).tolist() == encode(ROWS[first]) + [eos]
    assert ds.unit_reads == 1 and order[1] in tokens.ahead and order[2] not in tokens.ahead
    last = int(ds._starts[order[1]])
    assert tokens(last).tolist() == encode(ROWS[last]) + [eos]
    assert ds.unit_reads == 2 and order[2] in tokens.ahead


@pytest.mark.clause("STREAM-2", "STREAM-17")
def test_a_bad_line_in_a_unit_read_ahead_is_raised_and_counted_only_when_its_lane_reaches_it(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": t}) for t in ROWS[:6]] + ["{not json"] + [json.dumps({"text": t}) for t in ROWS[6:]]
    path.write_text("\n".join(lines) + "\n")
    ds = _ds([str(path)])
    rows = lane_rows(ds.windows(0, 0))
    tokens = ds.row_tokens()
    bad = next(u for u in range(len(ds.index.units)) if ds.index.units[u].start <= sum(len(x) + 1 for x in lines[:6])
               < ds.index.units[u].stop)
    tokens.follow(rows[rows >= ds._starts[bad]])       # the bad unit is the first one read ahead: no error yet
    assert bad in tokens.ahead and ds.unit_reads == 0
    with pytest.raises(SourceError, match=r"a\.jsonl: the line at byte \d+ is not JSON"):
        tokens(int(ds._starts[bad]))
    assert ds.unit_reads == 1


@pytest.mark.clause("STREAM-11")
def test_a_loader_worker_sends_numpy_arrays_through_its_pipe_and_the_loader_hands_out_the_same_tensors(tmp_path):
    import torch
    from torch.utils.data import DataLoader

    names, ref_files = write(tmp_path / "d", [("jsonl", [ROWS]), ("txt", [ROWS[::-1]])])
    ds = _ds(names, num_lanes=2, batch_size=2)
    ds._markers = True      # as impl.stream_loader sets it for its workers
    sent = [b for b in DataLoader(ds, batch_size=None, num_workers=1, collate_fn=lambda b: b,
                                  multiprocessing_context="fork") if PIPE_KEY in b]
    assert sent and all(isinstance(b["input_ids"], np.ndarray) and "input_ids" in b[PIPE_KEY] for b in sent)
    with_workers = list(build_dataloader(_ds(names, num_lanes=2), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork"))
    _, tok, tok_id = tokenizer()
    ref = StreamingReferenceLoader(ref_files, ds.config, tok, tokenizer_id=tok_id, num_workers=2, batch_size=2)
    assert all(isinstance(b["input_ids"], torch.Tensor) and PIPE_KEY not in b for b in with_workers)
    assert impl_rows(with_workers) == ref_rows(ref) and len(with_workers) > 2
