"""LitData's token-block loader: ``StreamingDataset(item_loader=TokensLoader(block_size=L + 1))`` + ``StreamingDataLoader``.

LitData packs by itself (blocks of L + 1 consecutive tokens of the
concatenated documents), so the adapter claims ``packing:chunk`` and recovers
provenance from content: the corpus is written encoded by the kit's
``ProvenanceCodec`` (token k + 1 is the corpus's k-th token) and every block
is decoded back. In one process, one rank only (``limits``); batch size and
workers vary. The per-rank harness (``conformance.ranks``) grades 2 and 3
ranks in a process group (LitData reads the rank from it).
"""

import hashlib
from pathlib import Path
from types import MappingProxyType

from conformance.adapters.peers import require
from conformance.adapters.peers._common import Empty, EpochLoader, data_dir, identity
from conformance.provenance import ProvenanceCodec

CHUNK_TOKENS = 64


class LitDataAdapter:
    name = "litdata-tokens"
    capabilities = frozenset({"resume", "workers", "shuffle:seeded", "ordering:sequential", "packing:chunk",
                              "end:drop_last"})
    limits = MappingProxyType({"max_seed": 2**31 - 1, "max_world_size": 1})
    process_group = True
    refusal_types = ()
    """None: LitData has no exception class for a refused state. ``StreamingDataset._validate_state_dict``
    compares the saved ``shuffle``, ``num_workers`` (workers x ranks), ``seed``, ``drop_last``... with its own
    and raises a bare ``ValueError`` ("The provided `num_workers` state doesn't match the current one"), the
    same type its other code raises for unrelated bugs; the kit grades it as a failure that shows the message,
    so a state from another topology passes only when LitData continues it exactly once."""

    def __init__(self) -> None:
        self.litdata = require("litdata")
        self.version = self.litdata.__version__

    def _write(self, codec: ProvenanceCodec, workdir: Path) -> Path:
        import torch
        from litdata.streaming.item_loader import TokensLoader
        from litdata.streaming.writer import BinaryWriter
        from litdata.utilities.env import _DistributedEnv

        docs = [d for f in codec.encoded_corpus() for d in f if d]
        out = Path(workdir) / "litdata" / hashlib.sha256(repr(docs).encode()).hexdigest()[:20]
        if not (out / "index.json").exists():
            writer = BinaryWriter(str(out), chunk_size=CHUNK_TOKENS, item_loader=TokensLoader())
            writer._distributed_env = _DistributedEnv(world_size=1, global_rank=0, num_nodes=1)  # one writer, not one per rank
            for i, doc in enumerate(docs):
                writer[i] = torch.tensor(doc, dtype=torch.int64)
            writer.done()
            writer.merge()
        return out

    def build(self, corpus, config, topology, *, workdir):
        from litdata.streaming.item_loader import TokensLoader

        codec, block = ProvenanceCodec(corpus), config.packing.seq_len + 1

        def to_rows(batch, epoch):
            return [codec.row(b.tolist(), epoch=epoch, index=-1) for b in batch]

        if codec.total < block:
            return EpochLoader(Empty(), to_rows=to_rows)
        with data_dir(Path(workdir), topology.world_size) as where:
            data = self._write(codec, where)
        ds = self.litdata.StreamingDataset(str(data), drop_last=True,
                                           item_loader=TokensLoader(block_size=block), seed=config.ordering.seed,
                                           shuffle=config.ordering.kind != "sequential")
        loader = self.litdata.StreamingDataLoader(ds, batch_size=topology.batch_size, drop_last=True,
                                                  num_workers=topology.num_workers, collate_fn=identity)
        return EpochLoader(loader, to_rows=to_rows)  # StreamingDataLoader sets the dataset's epoch itself


def adapter():
    return LitDataAdapter()
