"""torchdata ``StatefulDataLoader`` over a map-style dataset with ``DistributedSampler`` (0 or 2 workers).

The corpus is packed by the kit's helper (the sampler deals rows, not
tokens); ``DistributedSampler(shuffle, seed, drop_last=True)`` shards and
shuffles, and the loader's own ``state_dict`` (samples yielded per rank) is
the state. ``adapter_workers()`` also draws 1-2 workers.
"""

from types import MappingProxyType

from conformance.adapters.peers import require
from conformance.adapters.peers._common import EpochLoader, identity
from conformance.provenance import pack_corpus


class TorchdataMapAdapter:
    name = "torchdata-map"
    capabilities = frozenset({"resume", "shuffle:seeded", "ordering:sequential", "packing:concat", "packing:chunk",
                              "packing:greedy", "packing:none", "end:drop_last"})
    limits = MappingProxyType({"max_seed": 2**63 - 1})
    refusal_types = ()
    """None: torchdata defines no exception class of its own. ``StatefulDataLoader`` meets a state taken with
    another worker count with a bare ``AssertionError`` at the first batch (what the old ``is_refusal`` hook
    counted as a refusal), and ``DistributedSampler`` keeps no state it could check against the world size, so
    a state from another topology is either silently continued or that ``AssertionError``: an unchecked assert,
    which the kit grades as a failure showing it, not as a refusal."""

    def __init__(self, workers: bool = False) -> None:
        torchdata = require("torchdata.stateful_dataloader")
        self.StatefulDataLoader = torchdata.StatefulDataLoader
        self.version = require("torchdata").__version__
        if workers:
            self.name, self.capabilities = "torchdata-map-2-workers", self.capabilities | {"workers"}

    def build(self, corpus, config, topology, *, workdir):
        from torch.utils.data import DistributedSampler

        rows = pack_corpus(corpus, config.packing)
        sampler = DistributedSampler(rows, num_replicas=topology.world_size, rank=topology.rank, drop_last=True,
                                     shuffle=config.ordering.kind != "sequential", seed=config.ordering.seed)
        loader = self.StatefulDataLoader(rows, batch_size=topology.batch_size, sampler=sampler, drop_last=True,
                                         num_workers=topology.num_workers, collate_fn=identity)
        return EpochLoader(loader, sampler.set_epoch)


def adapter():
    return TorchdataMapAdapter()


def adapter_workers():
    return TorchdataMapAdapter(workers=True)
