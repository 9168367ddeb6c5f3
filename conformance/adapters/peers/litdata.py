"""LitData's token-block loader: ``StreamingDataset(item_loader=TokensLoader(block_size=L + 1))`` + ``StreamingDataLoader``.

LitData packs by itself (blocks of L + 1 consecutive tokens of the
concatenated documents), so the adapter claims ``packing:chunk`` and recovers
provenance from content: the corpus is written encoded by the kit's
``ProvenanceCodec`` (token k + 1 is the corpus's k-th token) and every block
is decoded back. One rank only (``limits``); batch size and workers vary.
"""

import hashlib
from pathlib import Path
from types import MappingProxyType

from conformance.adapters.peers import require
from conformance.adapters.peers._common import EpochLoader, identity
from conformance.provenance import ProvenanceCodec

CHUNK_TOKENS = 64


class _Empty:
    """What a corpus shorter than one block loads as: no batch, a state like any other."""

    def __iter__(self):
        return iter(())

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class LitDataAdapter:
    name = "litdata-tokens"
    capabilities = frozenset({"resume", "workers", "shuffle:seeded", "ordering:sequential", "packing:chunk",
                              "end:drop_last"})
    limits = MappingProxyType({"max_seed": 2**31 - 1, "max_world_size": 1})

    def __init__(self) -> None:
        self.litdata = require("litdata")
        self.version = self.litdata.__version__

    def _write(self, codec: ProvenanceCodec, workdir: Path) -> Path:
        import torch
        from litdata.streaming.item_loader import TokensLoader
        from litdata.streaming.writer import BinaryWriter

        docs = [d for f in codec.encoded_corpus() for d in f if d]
        out = Path(workdir) / "litdata" / hashlib.sha256(repr(docs).encode()).hexdigest()[:20]
        if not (out / "index.json").exists():
            writer = BinaryWriter(str(out), chunk_size=CHUNK_TOKENS, item_loader=TokensLoader())
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
            return EpochLoader(_Empty(), to_rows=to_rows)
        ds = self.litdata.StreamingDataset(str(self._write(codec, Path(workdir))), drop_last=True,
                                           item_loader=TokensLoader(block_size=block), seed=config.ordering.seed,
                                           shuffle=config.ordering.kind != "sequential")
        loader = self.litdata.StreamingDataLoader(ds, batch_size=topology.batch_size, drop_last=True,
                                                  num_workers=topology.num_workers, collate_fn=identity)
        return EpochLoader(loader, ds.set_epoch, to_rows=to_rows)


def adapter():
    return LitDataAdapter()
