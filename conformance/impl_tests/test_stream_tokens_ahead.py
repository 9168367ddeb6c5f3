"""impl.stream_loader's workers send numpy: it does not change what a pass hands out (STREAM-11)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.impl_tests.streaming_corpus import impl_rows, ref_rows, tokenizer, write
from impl.loader import build_dataloader
from impl.stream_lanes import PIPE_KEY
from impl.streaming import StreamingDataset
from reference.streaming import StreamingReferenceLoader

ROWS = [f"row {i} " + "word " * (i % 5) for i in range(30)]


def _ds(names, **kw):
    return StreamingDataset(names, tokenizer=tokenizer()[0], **{"seq_len": 4, "unit_bytes": 64, **kw})


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
