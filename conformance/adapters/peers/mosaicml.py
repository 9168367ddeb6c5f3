"""MosaicML ``StreamingDataset`` + ``StreamingDataLoader`` over MDS written from the corpus, shuffle on and off.

In one process, one rank only (``limits``): with ``WORLD_SIZE > 1`` streaming
joins ``torch.distributed`` and shares memory between the local ranks, so its
ranks cannot be simulated in one interpreter; the per-rank harness
(``conformance.ranks``, ``process_group``) grades 2 and 3 ranks, every rank
opening the node's one MDS copy. Each in-process build gets its own copy of
the MDS directory (streaming refuses two live datasets on one local
directory), and ``close()`` releases the dataset's shared memory.
"""

import gc
import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from types import MappingProxyType

from conformance.adapters.peers import require
from conformance.adapters.peers._common import Empty, EpochLoader, by_column, data_dir, rows_of_columns
from conformance.adapters.peers._streaming import import_streaming
from conformance.provenance import ROW_COLUMNS, pack_corpus


class MosaicLoader(EpochLoader):
    def __init__(self, loader, dataset, local: Path) -> None:
        super().__init__(loader, to_rows=rows_of_columns)
        self.dataset, self.local = dataset, local

    def close(self) -> None:
        super().close()
        prefix = getattr(self.dataset, "_shm_prefix_int", None)
        self.loader = self.dataset = None
        gc.collect()
        if prefix is not None:
            for root in ("/dev/shm", tempfile.gettempdir()):
                for name in (n for n in os.listdir(root) if n.startswith(f"{prefix:06}_")):
                    Path(root, name).unlink(missing_ok=True)
        if self.local is not None:
            shutil.rmtree(self.local, ignore_errors=True)


class MosaicAdapter:
    name = "mosaicml-streaming"
    capabilities = frozenset({"resume", "workers", "shuffle:seeded", "ordering:sequential", "packing:concat",
                              "packing:chunk", "packing:greedy", "packing:none", "end:drop_last"})
    limits = MappingProxyType({"max_seed": 2**31 - 1, "max_world_size": 1})
    process_group = True
    refusal_types = ()
    """None: streaming has no exception class for a refused state. ``StreamingDataset.load_state_dict`` takes
    any ``sample_in_epoch`` (the loader's samples yielded on this rank times the number of ranks) and resumes
    there on any topology; whatever it raises on a state it cannot use is a builtin (a ``KeyError`` on a missing
    key, for one), graded as a failure showing it."""

    def __init__(self) -> None:
        self.streaming = import_streaming()
        self.version = self.streaming.__version__
        self.np = require("numpy")

    def _mds(self, rows, workdir: Path) -> Path:
        key = hashlib.sha256(repr((rows,)).encode()).hexdigest()[:20]
        out = Path(workdir) / "mds" / key
        if not (out / "index.json").exists():
            with self.streaming.MDSWriter(out=str(out), columns={c: "ndarray:int64" for c in ROW_COLUMNS},
                                          compression=None, hashes=[], progress_bar=False) as writer:
                for row in rows:
                    writer.write({c: self.np.asarray(row[c], dtype=self.np.int64) for c in ROW_COLUMNS})
        return out

    def build(self, corpus, config, topology, *, workdir):
        rows = pack_corpus(corpus, config.packing)
        if not rows:  # streaming refuses a dataset with no sample ("Stream contains no samples"): no batch
            return EpochLoader(Empty(), to_rows=rows_of_columns)
        with data_dir(Path(workdir), topology.world_size) as where:
            mds = self._mds(rows, where)
        local = None if topology.world_size > 1 else Path(workdir) / "mds-copies" / uuid.uuid4().hex
        if local is not None:
            shutil.copytree(mds, local)
        ds = self.streaming.StreamingDataset(local=str(local or mds), batch_size=topology.batch_size,
                                             shuffle=config.ordering.kind != "sequential",
                                             shuffle_seed=config.ordering.seed)
        loader = self.streaming.StreamingDataLoader(ds, batch_size=topology.batch_size, drop_last=True,
                                                    num_workers=topology.num_workers, collate_fn=by_column)
        return MosaicLoader(loader, ds, local)


def adapter():
    return MosaicAdapter()
