"""The kit's worked example: a complete adapter for a third-party loader (``tiny_loader.TinyLoader``): 15 lines of code.

Run the kit on it: ``pytest --pyargs conformance.tests --loadspec-loader conformance.examples.third_party:adapter``.
The loader does not pack, so the adapter packs the corpus with the kit's
helper (``pack_corpus``: rows carrying their provenance columns) and claims
``packing:concat``; it keeps its own state format and errors.
"""

from conformance.adapter import RowLoader
from conformance.examples.tiny_loader import TinyLoader, TinyStateError
from conformance.provenance import pack_corpus, row_from_columns


class TinyAdapter:
    name, version = "tiny-loader", "1.0"
    capabilities = frozenset({"resume", "elastic", "shuffle:seeded", "ordering:sequential", "packing:concat",
                              "packing:chunk", "end:drop_last"})
    refusal_types = (TinyStateError,)   # what the loader raises to refuse a state that is not its own

    def build(self, corpus, config, topology, *, workdir):
        loader = TinyLoader(pack_corpus(corpus, config.packing), batch_size=topology.batch_size, rank=topology.rank,
                            world_size=topology.world_size, seed=config.ordering.seed,
                            shuffle=config.ordering.kind != "sequential")
        return RowLoader(loader, lambda batch: [row_from_columns(r, epoch=loader.epoch, index=-1) for r in batch])


def adapter():
    return TinyAdapter()
