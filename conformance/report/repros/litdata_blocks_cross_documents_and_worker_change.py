"""LitData TokensLoader: blocks cross document boundaries (a pair no document has is trained), and a state taken
on 0 workers resumed on 2 silently drops the last block.

Run: .venv-bench/bin/python conformance/report/repros/litdata_blocks_cross_documents_and_worker_change.py
"""

import json
import tempfile

import litdata
import torch
from litdata.streaming.item_loader import TokensLoader
from litdata.streaming.writer import BinaryWriter


def write(docs: list[list[int]]) -> str:
    out = tempfile.mkdtemp()
    writer = BinaryWriter(out, chunk_size=64, item_loader=TokensLoader())
    for i, doc in enumerate(docs):
        writer[i] = torch.tensor(doc, dtype=torch.int64)
    writer.done()
    writer.merge()
    return out


def loader(data: str, workers: int = 0) -> litdata.StreamingDataLoader:
    ds = litdata.StreamingDataset(data, item_loader=TokensLoader(block_size=2), shuffle=False, drop_last=True)
    return litdata.StreamingDataLoader(ds, batch_size=1, num_workers=workers, collate_fn=lambda b: b)


def blocks(ld, n=None) -> list[list[int]]:
    out = []
    for batch in ld:
        out.append(batch[0].tolist())
        if n is not None and len(out) == n:
            break
    return out


if __name__ == "__main__":
    print("documents [1, 2, 3] and [4, 5, 6] as blocks of (input, target):", blocks(loader(write([[1, 2, 3], [4, 5, 6]]))),
          "-> [3, 4] trains 3 -> 4, a pair no document has")
    data = write([[10 * i + j for j in range(1, 5)] for i in range(5)])
    whole = blocks(loader(data))
    ld = loader(data)
    head = blocks(ld, 3)
    state = json.loads(json.dumps(ld.state_dict()))
    resumed = loader(data, workers=2)
    resumed.load_state_dict(state)
    rest = blocks(resumed)
    print(f"uninterrupted {whole}\n3 blocks on 0 workers + resumed on 2 workers: {head} + {rest}\n"
          f"never trained: {[b for b in whole if b not in head + rest]}")
