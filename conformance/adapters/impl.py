"""The production loader (``impl``) as a loader under test: TokenStore → PackedDataset → ElasticLoader.

Why this path and no shortcut: the conformance suite must exercise what users
run. The corpus (files of pre-tokenized documents) is written to a real token
store, one store file per corpus file so that file-level ordering (ORD) sees
the same files as the reference; ``impl.dataset.PackedDataset`` packs it, and
``impl.loader.build_dataloader`` partitions, collates and keeps the state.
Each collated batch is turned back into ``CanonicalRow`` lists here, never in
tests.

Stores are cached by a hash of the corpus's canonical JSON inside the
workdir, so the ranks of one topology (and repeated builds in one test)
share one store's files; each loader's dataset opens the store itself, and
closing the loader (the kit does, after each example) closes the dataset and
so unmaps the store's files and plans.

``adapter()`` is the default ``--loader``. ``ImplAdapter(dataset_factory=...)``
swaps the dataset (for example ``conformance.stateful.ReferenceDataset``) to
test the loader layer alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conformance.adapter import CAPABILITIES, CanonicalRow, RowLoader
from impl.errors import ConfigError, StateError
from impl.loader import build_dataloader
from reference.resume import Corpus, PipelineConfig, Topology, canonical_json, pipeline_fingerprint

ROW_FIELDS = ("input_ids", "labels", "position_ids", "doc_ids", "token_offsets")

DatasetFactory = Callable[[Corpus, PipelineConfig, Path], Any]


def rows_from_batch(batch: Mapping[str, Any]) -> list[CanonicalRow]:
    """A collated batch (``impl.collation.collate``) as one ``CanonicalRow`` per sample."""
    epochs = batch["epoch"].tolist()
    indices = batch["sample_index"].tolist()
    columns = [batch[name].tolist() for name in ROW_FIELDS]
    return [CanonicalRow(epochs[b], indices[b], *(tuple(col[b]) for col in columns)) for b in range(len(indices))]


def corpus_key(corpus: Corpus) -> str:
    return hashlib.sha256(canonical_json([[list(d) for d in f] for f in corpus]).encode()).hexdigest()[:24]


def build_store(corpus: Corpus, workdir: Path) -> Any:
    """The corpus as a token store in ``workdir/stores/<hash>``, one store file per corpus file (built once).

    ``TokenStore.from_token_files`` keeps files with no documents and
    documents with no tokens, so ``store.file_document_counts`` is the
    corpus's file sizes and file-level ordering matches the reference.
    """
    from impl.store import TokenStore

    path = Path(workdir) / "stores" / corpus_key(corpus)
    if (path / "meta.json").exists():
        return TokenStore.open(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return TokenStore.from_token_files([[list(doc) for doc in f] for f in corpus], path)


class _NoSamples:
    """The dataset of a pipeline with no sample in any epoch, for a store ``PackedDataset`` refused.

    Why: ``PackedDataset`` refuses such a store with ``EmptyDataError`` (a
    production job should stop there), while the reference yields no batch.
    The adapter checks that the refusal is exactly that case (the reference
    packs zero samples) and then runs the real ``ElasticLoader`` over zero
    samples, so state, fingerprint and ``set_epoch`` are still impl's.
    """

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.epoch = 0

    def num_samples(self, epoch: int) -> int:
        return 0

    def __getitem__(self, key: Any) -> Any:
        raise IndexError(f"{key!r}: this pipeline has no samples")

    def __len__(self) -> int:
        return 0


def build_packed_dataset(corpus: Corpus, config: PipelineConfig, workdir: Path) -> Any:
    """``impl.dataset.PackedDataset.from_config`` over the corpus's store (``_NoSamples`` where it refuses empty data)."""
    from impl.dataset import PackedDataset
    from impl.errors import EmptyDataError
    from reference.packing import num_samples

    with build_store(corpus, workdir) as store:   # the dataset opens it itself, so its close() closes it
        path, store_fingerprint = store.path, store.fingerprint
    try:
        dataset = PackedDataset.from_config(path, config, cache_dir=Path(workdir) / "plans")
    except EmptyDataError:
        lengths = [len(doc) for f in corpus for doc in f]
        if not num_samples(lengths, config.packing):
            return _NoSamples(pipeline_fingerprint(store_fingerprint, config))
        p = config.packing
        prepared = [n + p.add_bos + p.add_eos for n in lengths]
        if all(m <= 1 for m in prepared if m > 0 and m >= p.min_len):
            # PackedDataset refuses an epoch with no trainable label (every label -100: a NaN loss) by design; the
            # reference still packs it. Outside what impl accepts: not a counterexample.
            from hypothesis import reject

            reject()
        raise
    if dataset.config != config:
        dataset.close()
        raise ConfigError(f"PackedDataset built for {config} reports config {dataset.config}: it cannot express "
                          "this pipeline")
    return dataset


class ImplAdapter:
    name = "impl"
    capabilities = CAPABILITIES - {"ordering:buffer", "state:global"}
    """Everything but the buffered shuffle, which ``PackedDataset`` refuses (it has no O(1) random access), and
    ``state:global`` (a rank's state counts its own batches, RES-6; only the streaming adapter's is a collective)."""
    refusal_types = (StateError, ConfigError)
    """``ElasticLoader.load_state_dict`` refuses a state with ``StateError`` (RES-3) and an impossible topology or
    position with ``ConfigError`` (``TopologyError``, PART-12); both are ``impl.errors``' re-exports of reference's."""

    def __init__(self, dataset_factory: DatasetFactory | None = None, capabilities: frozenset[str] | None = None,
                 name: str | None = None) -> None:
        self.dataset_factory = dataset_factory or build_packed_dataset
        if capabilities is not None:
            self.capabilities = frozenset(capabilities)
        if name is not None:
            self.name = name

    def build(self, corpus: Corpus, config: PipelineConfig, topology: Topology, *, workdir: Path) -> RowLoader:
        dataset = self.dataset_factory(corpus, config, Path(workdir))
        try:
            loader = build_dataloader(dataset, batch_size=topology.batch_size, rank=topology.rank,
                                      world_size=topology.world_size, replication=topology.replication,
                                      end=config.end, num_workers=topology.num_workers, allow_empty_epoch=True)
        except BaseException:
            close = getattr(dataset, "close", None)
            if close is not None:
                close()
            raise
        return RowLoader(loader, rows_from_batch, closes=(dataset,))


def adapter() -> ImplAdapter:
    return ImplAdapter()


def loader_layer_adapter() -> ImplAdapter:
    """impl's loader layer over ``conformance.stateful.ReferenceDataset``: checks sampler, workers and state alone."""
    from conformance.stateful import ReferenceDataset

    return ImplAdapter(lambda corpus, config, workdir: ReferenceDataset(corpus, config),
                       capabilities=CAPABILITIES - {"state:global"}, name="impl-loader-over-reference")
