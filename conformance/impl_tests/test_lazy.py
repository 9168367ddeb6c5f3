"""The lazy path: constructing a dataset reads no token file, a batch reads only the files it touches, and every
token copied into a batch was checked first: handed to ``TokenStore.check_blocks`` (format 3), or inside a document
whose own CRC-32 (or whose blocks) the store verified when it gave its bounds (format 4).

Counted, not timed: ``StoreFiles.map_file`` (a file mapped),
``impl.store_files.quick_signature_of`` (a file signed) and ``impl.store_files._open_arrow``
(an Arrow footer parsed) are wrapped to record their calls on a store of many
files; ``check_blocks`` is replaced on the store instance by a recorder
(format 3), ``TokenSource.gather`` wrapped to audit each run at its entry
(format 4). A format-2 store maps a file from its recorded buffer layout:
neither signed nor parsed by Arrow on the read path.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conformance import strategies as ls
from conformance.assertions import assert_equal, check
from conformance.impl_tests.test_dataset import make_store
from conformance.impl_tests.test_store_integrity import _as_format_3
from impl import build_files as build_module
from impl import store_files as files_module
from impl.dataset import PackedDataset
from impl.errors import StoreCorruptError
from impl.fill import TokenSource
from impl.loader import build_dataloader
from impl.store import TokenStore
from impl.store_files import StoreFiles
from reference.packing import IGNORE, MODES, NO_OFFSET
from reference.resume import make_state

FILES = 6
DOCS_PER_FILE = 5


def corpus() -> list[list[list[int]]]:
    """Six files of five documents of 3..14 tokens, every token unique (file f, document j, offset k)."""
    return [[[10_000 + 1000 * f + 100 * j + k for k in range(3 + (5 * f + 3 * j) % 12)] for j in range(DOCS_PER_FILE)]
            for f in range(FILES)]


@pytest.fixture(scope="module")
def store_dir():
    with tempfile.TemporaryDirectory() as tmp:
        yield make_store(corpus(), Path(tmp) / "store").path


@pytest.fixture
def counted(monkeypatch):
    """Record which files get mapped, signed and parsed by Arrow."""
    seen: dict[str, list] = {"mapped": [], "signed": [], "parsed": []}
    real_map, real_sign, real_open = StoreFiles.map_file, files_module.quick_signature_of, files_module._open_arrow

    def map_file(self, rec):
        seen["mapped"].append(rec.name)
        return real_map(self, rec)

    def sign(files, name):
        seen["signed"].append(name)
        return real_sign(files, name)

    monkeypatch.setattr(StoreFiles, "map_file", map_file)
    def open_arrow(data, where):
        seen["parsed"].append(Path(where).name)
        return real_open(data, where)

    monkeypatch.setattr(files_module, "quick_signature_of", sign)
    monkeypatch.setattr(files_module, "_open_arrow", open_arrow)
    return seen


def files_of(store: TokenStore, doc_ids: np.ndarray) -> set[str]:
    """The names of the files holding these documents (ids >= 0)."""
    starts = np.asarray(store.file_document_starts)
    docs = np.unique(doc_ids[doc_ids >= 0])
    return {store.file_records[int(f)].name for f in np.searchsorted(starts, docs, side="right") - 1}


@pytest.mark.clause("PACK-20", "RES-1")
@pytest.mark.parametrize("shuffle", ["none", "global", "window"])
def test_constructing_a_dataset_maps_and_signs_no_token_file(store_dir, counted, tmp_path, shuffle):
    cache = tmp_path / "cache"
    PackedDataset(TokenStore.open(store_dir), seq_len=8, shuffle=shuffle, window=3, cache_dir=cache).plan(0)  # warm
    counted["mapped"].clear()
    counted["signed"].clear()
    ds = PackedDataset(TokenStore.open(store_dir), seq_len=8, shuffle=shuffle, window=3, cache_dir=cache)
    len(ds)
    ds.plan(0)
    assert_equal((counted["mapped"], counted["signed"]), ([], []), clause="PACK-20",
                 what="files mapped/signed by construction, len and the cached plan")


@pytest.mark.clause("PACK-20", "RES-1")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_batch_maps_only_the_files_its_documents_sit_in_without_signing_or_parsing_them(
        store_dir, counted, tmp_path, mode, shuffle):
    ds = PackedDataset(TokenStore.open(store_dir), seq_len=8, packing=mode, shuffle=shuffle, cache_dir=tmp_path)
    ds.plan(0)                                    # computing a plan reads every length: done once, then cached
    for start in (0, len(ds) // 2, len(ds) - 2):
        fresh = PackedDataset(TokenStore.open(store_dir), seq_len=8, packing=mode, shuffle=shuffle, cache_dir=tmp_path)
        for seen in counted.values():
            seen.clear()
        batch = fresh.samples(0, [start, start + 1])
        touched = files_of(fresh.store, batch["doc_ids"])
        assert_equal(sorted(counted["mapped"]), sorted(touched), clause="PACK-20",
                     what=f"{mode}/{shuffle} samples {start}, {start + 1}: files mapped, once each")
        assert_equal((counted["signed"], counted["parsed"]), ([], []), clause="PACK-20",
                     what=f"{mode}/{shuffle} samples {start}, {start + 1}: files signed/parsed by Arrow")
        check(len(touched) < FILES, clause="PACK-20", what=f"two samples touch {len(touched)} of {FILES} files")


@pytest.mark.clause("RES-1")
def test_a_resumed_loader_maps_only_the_files_of_its_first_batch(store_dir, counted, tmp_path):
    ds = PackedDataset(TokenStore.open(store_dir), seq_len=8, shuffle="global", cache_dir=tmp_path)
    fingerprint = build_dataloader(ds, batch_size=2, rank=0, world_size=1).fingerprint
    ds.plan(0)
    for consumed in (0, 10, 2 * (len(ds) // 2) - 2):
        counted["mapped"].clear()
        fresh = PackedDataset(TokenStore.open(store_dir), seq_len=8, shuffle="global", cache_dir=tmp_path)
        loader = build_dataloader(fresh, batch_size=2, rank=0, world_size=1)
        loader.load_state_dict(make_state(fingerprint, 0, consumed))
        batch = next(iter(loader))
        assert_equal(batch["sample_index"].tolist(), [consumed, consumed + 1], clause="RES-1", what="resumed batch")
        assert_equal(sorted(set(counted["mapped"])), sorted(files_of(fresh.store, batch["doc_ids"].numpy())),
                     clause="RES-1", what=f"files mapped by a resume at {consumed}")


# ------------------------------------------------------------------ check_blocks before every copy


def record_checks(store: TokenStore) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Record what the store's block checks are handed: per file, its runs, from ``check_blocks`` or per batch.

    A ``check_blocks_batch`` call is recorded as one entry per file it names
    (and the ``check_blocks`` calls it makes itself are not recorded again).
    """
    calls: list[tuple[int, np.ndarray, np.ndarray]] = []
    real, real_batch = store.check_blocks, store.check_blocks_batch
    inside = []

    def arrays(starts, stops):
        starts, stops = np.asarray(starts), np.asarray(stops)
        check(starts.dtype == np.int64 and stops.dtype == np.int64 and starts.shape == stops.shape, clause="PACK-20",
              what=f"block check arguments {starts.dtype}/{stops.dtype} {starts.shape}/{stops.shape}")
        return starts.copy(), stops.copy()

    def check_blocks(file, starts, stops):
        if not inside:
            calls.append((int(file), *arrays(starts, stops)))
        real(file, starts, stops)

    def check_blocks_batch(files, starts, stops):
        starts, stops = arrays(starts, stops)
        files = np.asarray(files)
        calls.extend((int(f), starts[files == f], stops[files == f]) for f in np.unique(files))
        inside.append(True)
        try:
            real_batch(files, starts, stops)
        finally:
            inside.pop()

    store.check_blocks = check_blocks
    store.check_blocks_batch = check_blocks_batch
    return calls


def copied_tokens(store: TokenStore, batch: dict, add_bos: bool) -> list[tuple[int, int]]:
    """``(file, file-local token index)`` of every store token in the batch: inputs, and labels that are tokens."""
    starts = np.asarray(store.file_document_starts)
    out = []
    for docs, offsets, labels in zip(batch["doc_ids"], batch["token_offsets"], batch["labels"]):
        for doc, offset, label in zip(docs.tolist(), offsets.tolist(), labels.tolist()):
            if doc < 0 or offset == NO_OFFSET:
                continue
            f = int(np.searchsorted(starts, doc, side="right")) - 1
            local = store._offsets[f]
            first, length = int(local[doc - starts[f]]), int(local[doc - starts[f] + 1] - local[doc - starts[f]])
            for raw in (offset - add_bos, offset + 1 - add_bos if label != IGNORE else -1):
                if 0 <= raw < length:
                    out.append((f, first + raw))
    return out


EDGES = {"plain": {}, "bos+eos": {"add_bos": True, "add_eos": True},
         "continuation bos": {"bos_on_continuation": True, "stride": 2}}


def shuffled_dataset(store: TokenStore, cache_dir: Path, mode: str, edges: str) -> PackedDataset:
    """A dataset of ``store`` under a global shuffle, with the packing ``edges`` (stride 0 where none continues)."""
    kwargs = EDGES[edges] if mode not in ("concat", "chunk") or edges != "continuation bos" else {"stride": 0}
    return PackedDataset(store, seq_len=8, packing=mode, shuffle="global", cache_dir=cache_dir, **kwargs)


def some_rows(total: int) -> list[list[int]]:
    """A first batch, one with padding and rows from both ends, then every row: each pass of a check."""
    return [[0, 1, 2], [total - 1, -1, total // 2], list(range(total))]


@pytest.fixture(scope="module")
def store_dir_small_blocks(tmp_path_factory):
    """The corpus in 64-byte checksum blocks: a file is many blocks, so a batch cannot verify all of them at once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build_module, "BLOCK_BYTES", 64)
        return make_store(corpus(), tmp_path_factory.mktemp("small-blocks") / "store").path


@pytest.fixture(scope="module")
def store_dir_3(store_dir, tmp_path_factory):
    """The store rewritten as format 3 wrote it: no document checksums, the fill checks blocks."""
    path = tmp_path_factory.mktemp("format3") / "store"
    shutil.copytree(store_dir, path)
    _as_format_3(path)
    return path


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("edges", list(EDGES))
def test_every_token_copied_into_a_batch_was_handed_to_check_blocks_first_once_per_file(store_dir_3, tmp_path, mode,
                                                                                       edges):
    ds = shuffled_dataset(TokenStore.open(store_dir_3), tmp_path, mode, edges)
    check(ds.store.format_version == 3 and not ds.store.document_checks, clause="PACK-20", what="a format-3 store")
    calls = record_checks(ds.store)
    for rows in some_rows(len(ds)):
        calls.clear()
        batch = ds.samples(0, rows)
        files = [f for f, _, _ in calls]
        assert_equal(len(files), len(set(files)), clause="PACK-20", what=f"check_blocks calls per file for rows {rows}")
        covered = {(f, t) for f, a, b in calls for x, y in zip(a.tolist(), b.tolist()) for t in range(x, y)}
        missing = [ft for ft in copied_tokens(ds.store, batch, ds.config.packing.add_bos) if ft not in covered]
        assert_equal(missing, [], clause="PACK-20", what=f"{mode}/{edges} tokens copied without a check, rows {rows}")


class RunAudit:
    """Wraps ``TokenSource.gather``: at its entry, each run must lie in one document ``store`` verified (format 4).

    A run ``(file, start, stop)`` passes when one document of its file (by
    ``clean``'s offsets) holds all of it and that document's CRC passed on
    ``store`` (``documents_verified``, counted in ``by_document``) or every
    block holding the document did (documents in file order keep the block
    checks); ``unverified`` lists the other runs with why.
    """

    def __init__(self, monkeypatch, store: TokenStore, clean: TokenStore) -> None:
        self.store = store
        self.bounds = [np.asarray(clean._offsets[f]) for f in range(clean.num_files)]
        self.by_document = 0
        self.unverified: list[tuple[int, int, int, str]] = []
        real = TokenSource.gather

        def gather(source, out, files, starts, stops, dest, tail=None, docs=None):
            for run in zip(np.asarray(files).tolist(), np.asarray(starts).tolist(), np.asarray(stops).tolist()):
                self.audit(*run)
            return real(source, out, files, starts, stops, dest, tail, docs)

        monkeypatch.setattr(TokenSource, "gather", gather)

    def audit(self, f: int, a: int, b: int) -> None:
        bounds, blocks = self.bounds[f], self.store._blocks[f]
        d = int(np.searchsorted(bounds, a, side="right")) - 1
        if not (0 <= d < len(bounds) - 1 and bounds[d] <= a < b <= bounds[d + 1]):
            self.unverified.append((f, a, b, "not inside one document"))
        elif blocks is None:
            self.unverified.append((f, a, b, "its file is not mapped"))
        elif blocks.documents_verified[d]:
            self.by_document += 1
        else:
            first, last = (blocks.base + int(bounds[d + k]) * blocks.itemsize - k for k in (0, 1))
            if not blocks.verified_np[first // blocks.block:last // blocks.block + 1].all():
                self.unverified.append((f, a, b, f"neither document {d} nor its blocks verified"))


@pytest.mark.clause("PACK-20")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("edges", list(EDGES))
def test_every_run_copied_from_a_format_4_store_lies_inside_a_document_whose_crc_passed_first(
        store_dir_small_blocks, tmp_path, monkeypatch, mode, edges):
    ds = shuffled_dataset(TokenStore.open(store_dir_small_blocks), tmp_path, mode, edges)
    check(ds.store.format_version == 4 and ds.store.document_checks, clause="PACK-20", what="a format-4 store")
    audit = RunAudit(monkeypatch, ds.store, TokenStore.open(store_dir_small_blocks))
    for rows in some_rows(len(ds)):
        audit.unverified.clear()
        ds.samples(0, rows)
        assert_equal(audit.unverified, [], clause="PACK-20", what=f"{mode}/{edges} runs copied unverified, rows {rows}")
    check(audit.by_document > 0, clause="PACK-20", what=f"{mode}/{edges}: no run passed by its document's own CRC")


# ------------------------------------------------------------------ a restarted process's first batch

_FIRST_BATCH_IMPORTS = """
import json, sys
from impl.dataset import PackedDataset
from impl.fill import TokenSource
from impl.loader import build_dataloader
store, state = sys.argv[1], json.loads(sys.argv[2])
ds = PackedDataset(store, seq_len=8, packing="concat", shuffle="global", cache_dir=sys.argv[3])
loader = build_dataloader(ds, batch_size=2, rank=0, world_size=1)
before = set(sys.modules)
loader.load_state_dict(state)
next(iter(loader))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_fresh_process_resume_imports_no_module_inside_its_first_batch(store_dir, tmp_path):
    """A module imported on the first batch is paid inside a restarted job's resume (np.unique's numpy.ma: 10-20 ms)."""
    import json
    import os
    import subprocess
    import sys

    ds = PackedDataset(TokenStore.open(store_dir), seq_len=8, packing="concat", shuffle="global", cache_dir=tmp_path)
    state = make_state(build_dataloader(ds, batch_size=2, rank=0, world_size=1).fingerprint, 0, 4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _FIRST_BATCH_IMPORTS, str(store_dir), json.dumps(state), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == [], f"the first batch after a resume imported {imported}"


def test_a_store_or_dataset_unpickled_after_its_directory_was_rebuilt_with_other_data_is_refused_naming_both_fingerprints(
        tmp_path):
    """Fault caught: a store reopened in a spawned worker without checking the directory still holds the pickled store.

    A DataLoader sends its dataset to spawned workers by pickle; a store
    pickles as its path and fingerprint. Rebuilt in between (another corpus,
    ``overwrite=True``), the directory holds another store, which the worker
    must refuse, naming the fingerprint it found and the one it expected,
    rather than serve other tokens under the old plan.
    """
    out = tmp_path / "store"
    store = make_store(corpus(), out)
    ds = PackedDataset(store, seq_len=8, packing="concat", shuffle="global", cache_dir=tmp_path / "plans")
    blobs = {"store": pickle.dumps(store), "dataset": pickle.dumps(ds)}
    assert [d.tolist() for d in pickle.loads(blobs["store"])] == [d for f in corpus() for d in f]
    other = [[[token + 1 for token in d] for d in f] for f in corpus()]
    rebuilt = TokenStore.from_token_files(other, out, vocab_size=ls.VOCAB, bos_id=ls.BOS, eos_id=ls.EOS,
                                          pad_id=ls.PAD, overwrite=True)
    assert rebuilt.fingerprint != store.fingerprint and TokenStore.open(out)[0].tolist() == other[0][0]
    pattern = (rf"token store {out} changed \(fingerprint {rebuilt.fingerprint[:16]}\.\.\., "
               rf"expected {store.fingerprint[:16]}\.\.\.\)")
    for blob in blobs.values():
        with pytest.raises(StoreCorruptError, match=pattern):
            pickle.loads(blob)[0]
