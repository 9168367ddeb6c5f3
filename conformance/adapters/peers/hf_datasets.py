"""HF ``datasets``: ``to_iterable_dataset(num_shards)`` → ``shuffle(seed, buffer_size)`` → ``split_dataset_by_node``,
inside torchdata's ``StatefulDataLoader``, with the dataset's own ``state_dict``.

The corpus is packed by the kit's helper into rows with provenance columns
(``Dataset.from_dict``); HF shuffles shards and a buffer, splits by node and
resumes with its own state.
"""

from types import MappingProxyType

from conformance.adapters.peers import require
from conformance.adapters.peers._common import EpochLoader, identity
from conformance.provenance import ROW_COLUMNS, pack_corpus

NUM_SHARDS, BUFFER = 4, 16


class HFDatasetsAdapter:
    name = "hf-datasets"
    capabilities = frozenset({"resume", "shuffle:seeded", "ordering:sequential", "packing:concat", "packing:chunk",
                              "packing:greedy", "packing:none", "end:drop_last"})
    limits = MappingProxyType({"max_seed": 2**32 - 1})

    def __init__(self) -> None:
        self.datasets = require("datasets")
        self.StatefulDataLoader = require("torchdata.stateful_dataloader").StatefulDataLoader
        self.version = self.datasets.__version__
        # datasets' own base class, the only type of it a refusal could have. IterableDataset.load_state_dict never
        # raises it: a state from another number of shards or nodes fails on a key lookup (KeyError:
        # 'ex_iterable_idx') or is silently continued, so those cases grade as failures showing the KeyError.
        self.refusal_types = (require("datasets.exceptions").DatasetsError,)

    def build(self, corpus, config, topology, *, workdir):
        from datasets.distributed import split_dataset_by_node

        rows = pack_corpus(corpus, config.packing)
        if not rows:   # HF cannot shard an empty dataset: an empty corpus is an empty loader
            return EpochLoader(self.StatefulDataLoader([], batch_size=topology.batch_size, collate_fn=identity),
                               lambda epoch: None)
        table = self.datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in ROW_COLUMNS})
        ds = table.to_iterable_dataset(num_shards=max(1, min(NUM_SHARDS, len(rows))))
        if config.ordering.kind != "sequential":
            ds = ds.shuffle(seed=config.ordering.seed, buffer_size=BUFFER)
        ds = split_dataset_by_node(ds, rank=topology.rank, world_size=topology.world_size)
        loader = self.StatefulDataLoader(ds, batch_size=topology.batch_size, drop_last=True,
                                         num_workers=topology.num_workers, collate_fn=identity)
        return EpochLoader(loader, ds.set_epoch)


def adapter():
    return HFDatasetsAdapter()
