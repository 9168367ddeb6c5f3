"""The token store reads every byte through its file seam (:mod:`impl.files`), never through a path of its own.

Shown with accesses that are not the local disk: an in-memory access serving a
copy of a store's bytes (the directory deleted) opens, reads, verifies and
pickles to the same tokens, and a counting access sees every file the store
touches; its errors name the file as the access names it.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from impl.errors import StoreCorruptError
from impl.files import FileStat, LocalFiles
from impl.store import TokenStore


class MemoryFiles:
    """A FileAccess serving files from a dict of bytes (picklable: a spawned worker gets the bytes too)."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs

    def where(self, name: str) -> str:
        return f"mem://store/{name}"

    def stat(self, name: str) -> FileStat | None:
        blob = self.blobs.get(name)
        return None if blob is None else FileStat(size=len(blob), version="1")

    def map(self, name: str) -> bytes:
        try:
            return self.blobs[name]
        except KeyError:
            raise FileNotFoundError(self.where(name)) from None

    def open(self, name: str) -> io.BytesIO:
        return io.BytesIO(self.map(name))


class CountingFiles(LocalFiles):
    """LocalFiles that records every name asked for (stat or map)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[tuple[str, str]] = []

    def stat(self, name: str) -> FileStat | None:
        self.asked.append(("stat", name))
        return super().stat(name)

    def map(self, name: str):  # type: ignore[no-untyped-def]
        self.asked.append(("map", name))
        return super().map(name)


def _documents() -> list[list[list[int]]]:
    rng = np.random.default_rng(7)
    return [[rng.integers(0, 50_000, size=int(rng.integers(0, 300))).tolist() for _ in range(40)] for _ in range(3)]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return TokenStore.from_token_files(_documents(), tmp_path / "store", vocab_size=50_000).path


def _blobs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


@pytest.mark.parametrize("layout", ["recorded buffers", "through Arrow"])
def test_a_store_served_from_memory_opens_reads_and_verifies_to_the_same_tokens_with_its_directory_gone(
        store_dir, layout):
    if layout == "through Arrow":  # records without a buffer layout: the quick signature and Arrow parse path
        meta = json.loads((store_dir / "meta.json").read_text())
        for record in meta["files"]:
            del record["buffers"]
        (store_dir / "meta.json").write_text(json.dumps(meta))
    expected = [d.tolist() for d in TokenStore.open(store_dir)]
    blobs = _blobs(store_dir)
    shutil.rmtree(store_dir)
    store = TokenStore.open("somewhere/else", files=MemoryFiles(blobs))
    assert [store[i].tolist() for i in range(len(store))] == expected
    assert [d.tolist() for d in store] == expected
    assert store.read(5, 900).tolist() == np.concatenate([np.asarray(d, dtype=np.int64) for d in expected])[5:900].tolist()
    store.verify()
    clone = pickle.loads(pickle.dumps(store))   # a spawned worker reopens through the same access
    assert clone.fingerprint == store.fingerprint
    assert [d.tolist() for d in clone] == expected


def test_every_file_the_store_reads_is_asked_of_its_file_access_by_name(store_dir):
    files = CountingFiles(store_dir)
    store = TokenStore.open(store_dir, files=files)
    opened = set(files.asked)
    assert ("map", "meta.json") in opened
    assert {("stat", r.name) for r in store.file_records} <= opened   # sizes at open, no token file mapped
    assert not [n for kind, n in opened if kind == "map" and n.endswith(".arrow")]
    list(store)
    store.verify()
    names = {n for _, n in files.asked}
    assert names == {"meta.json", "blocks.crc32", "documents.crc32", *(r.name for r in store.file_records)}


def test_a_changed_file_behind_the_access_is_refused_naming_it_as_the_access_does(store_dir):
    blobs = _blobs(store_dir)
    name = TokenStore.open(store_dir).file_records[1].name
    blobs[name] = blobs[name][:-8]
    with pytest.raises(StoreCorruptError, match=rf"{name} is truncated"):
        TokenStore.open("mem-store", files=MemoryFiles(blobs))
    del blobs[name]
    with pytest.raises(StoreCorruptError, match=rf"{name} is missing"):
        TokenStore.open("mem-store", files=MemoryFiles(blobs))
    blobs = _blobs(store_dir)
    table = bytearray(blobs["blocks.crc32"])
    table[0] ^= 0xFF
    blobs["blocks.crc32"] = bytes(table)
    store = TokenStore.open("mem-store", files=MemoryFiles(blobs))
    with pytest.raises(StoreCorruptError, match=r"blocks\.crc32 changed since it was built"):
        store.verify()


# --------------------------------------------------------------------------- the one checked read


def _runs(store: TokenStore, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    """``n`` random runs, each inside one document: (files, starts, stops, file-local docs, global docs, lo, hi)."""
    docs = rng.integers(0, len(store), size=n)
    files = np.searchsorted(np.asarray(store.file_document_starts), docs, side="right") - 1
    local = docs - np.asarray(store.file_document_starts)[files]
    starts, lengths = store.document_bounds_batch(files, local)
    lo = (rng.random(n) * (lengths + 1)).astype(np.int64)
    hi = lo + (rng.random(n) * (lengths - lo + 1)).astype(np.int64)
    return files, starts + lo, starts + hi, local, docs, lo, hi


@pytest.mark.parametrize("copy", ["slices", "fancy index"])
@pytest.mark.parametrize("with_docs", [True, False])
def test_read_runs_gives_exactly_the_slices_of_the_documents_the_runs_lie_in(store_dir, monkeypatch, copy, with_docs):
    import impl.store as store_module

    monkeypatch.setattr(store_module, "SLICE_MIN_WIDTH", 0 if copy == "slices" else 10**9)
    clean = TokenStore.open(store_dir)
    store = TokenStore.open(store_dir)
    files, starts, stops, local, docs, lo, hi = _runs(clean, np.random.default_rng(3), 50)
    got = store.read_runs(files, starts, stops, docs=local if with_docs else None)
    expected = [clean[int(d)][a:b] for d, a, b in zip(docs.tolist(), lo.tolist(), hi.tolist())]
    assert got.dtype == clean.dtype
    assert got.tolist() == np.concatenate(expected).tolist()
    last, front = expected[-1].tolist(), np.concatenate(expected[:-1]).tolist()
    out, tail = np.full(len(front) + 5, -1, dtype=np.int64), np.full(len(last) + 3, -1, dtype=np.int64)
    dest = np.concatenate(([0], np.cumsum(stops - starts)[:-1]))
    dest[-1] = len(out)   # a dest past out addresses tail: the last run goes there
    store.read_runs(files, starts, stops, docs=local if with_docs else None, out=out, dest=dest, tail=tail)
    assert out.tolist() == front + [-1] * 5
    assert tail.tolist() == last + [-1] * 3


@pytest.mark.parametrize("with_docs", [True, False])
def test_read_runs_refuses_a_run_whose_bytes_changed_since_the_build(store_dir, with_docs):
    store = TokenStore.open(store_dir)
    rec = store.file_records[1]
    doc = max(range(rec.num_documents), key=lambda d: int(store.lengths[store.file_document_starts[1] + d]))
    starts, lengths = store.document_bounds(1, np.array([doc]))
    layout = store.meta["files"][1]["buffers"]["values"][0]
    path = store_dir / rec.name
    data = bytearray(path.read_bytes())
    data[layout + 2 * int(starts[0] + lengths[0] // 2)] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = TokenStore.open(store_dir)
    with pytest.raises(StoreCorruptError, match=rf"{rec.name} changed since it was built"):
        fresh.read_runs(np.array([1]), starts, starts + lengths, docs=np.array([doc]) if with_docs else None)


def _change_token(store_dir: Path, store: TokenStore, f: int, token: int) -> None:
    """Flip a byte of file-local token ``token`` of file ``f`` on disk (same inode: mappings see it)."""
    at = store.meta["files"][f]["buffers"]["values"][0] + store.dtype.itemsize * token
    path = store_dir / store.file_records[f].name
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _bounds(store: TokenStore, f: int) -> tuple[list[int], list[int]]:
    """File ``f``'s documents' (file-local start, stop), from a separate clean store object."""
    starts, lengths = TokenStore.open(store.path).document_bounds(f, np.arange(store.file_document_counts[f]))
    return starts.tolist(), (starts + lengths).tolist()


def test_read_runs_refuses_a_changed_first_document_of_a_file_whose_other_documents_were_all_verified(store_dir):
    store = TokenStore.open(store_dir)
    starts, stops = _bounds(store, 1)
    first = next(d for d in range(len(starts)) if stops[d] > starts[d])   # its tokens start at file-local 0
    others = np.array([d for d in range(len(starts)) if d != first])
    _change_token(store_dir, store, 1, starts[first])
    for d in others.tolist():   # one at a time: each by its own CRC (the file's one block stays unverified)
        store.document_bounds_batch(np.array([1]), np.array([d]))
    assert store.read_runs(np.ones(len(others), dtype=np.int64), np.array(starts)[others], np.array(stops)[others],
                           docs=others).size == sum(stops) - sum(starts) - (stops[first] - starts[first])
    files, docs = np.array([1, 1]), np.array([others[0], first])
    with pytest.raises(StoreCorruptError, match=rf"{store.file_records[1].name} changed since it was built"):
        store.read_runs(files, np.array([starts[others[0]], starts[first]]),
                        np.array([stops[others[0]], stops[first]]), docs=docs)


def test_read_runs_refuses_a_run_that_leaves_its_verified_document_for_a_changed_neighbour(store_dir):
    store = TokenStore.open(store_dir)
    starts, stops = _bounds(store, 0)
    d = next(k for k in range(len(starts) - 1) if stops[k] > starts[k] and stops[k + 1] > starts[k + 1])
    expected = TokenStore.open(store_dir)[d].tolist()
    _change_token(store_dir, store, 0, starts[d + 1])
    store.document_bounds_batch(np.array([0]), np.array([d]))   # d verified by its own CRC
    got = store.read_runs(np.array([0]), np.array([starts[d]]), np.array([stops[d]]), docs=np.array([d]))
    assert got.tolist() == expected
    with pytest.raises(StoreCorruptError, match="changed since it was built"):
        store.read_runs(np.array([0]), np.array([starts[d]]), np.array([stops[d + 1]]), docs=np.array([d]))


def test_read_runs_refuses_a_document_number_past_its_file_even_when_that_names_a_verified_document_of_the_next(
        store_dir):
    store = TokenStore.open(store_dir)
    count = store.file_document_counts[0]
    starts, stops = _bounds(store, 1)
    d = next(k for k in range(len(starts)) if stops[k] > starts[k])
    store.read_runs(np.array([1]), np.array([starts[d]]), np.array([stops[d]]), docs=np.array([d]))  # verifies it
    for bad in (count + d, -1):
        with pytest.raises(IndexError, match="document out of range for file 0"):
            store.read_runs(np.array([0]), np.array([starts[d]]), np.array([stops[d]]), docs=np.array([bad]))


class KeepOneMapped(LocalFiles):
    """LocalFiles whose store keeps one token file mapped (as a remote access under a small cache limit)."""

    keep_mapped = 1


def test_a_document_verified_before_its_file_was_released_is_crcd_again_when_its_file_maps_again(store_dir):
    store = TokenStore.open(store_dir, files=KeepOneMapped(store_dir))
    starts, stops = _bounds(store, 0)
    d = next(k for k in range(len(starts)) if stops[k] > starts[k])
    run = np.array([0]), np.array([starts[d]]), np.array([stops[d]])
    store.read_runs(*run, docs=np.array([d]))                          # verified
    store.read_runs(np.array([1]), np.array([0]), np.array([1]), docs=np.array([0]))   # file 0 released
    _change_token(store_dir, store, 0, starts[d])                       # a new copy, changed
    with pytest.raises(StoreCorruptError, match=rf"{store.file_records[0].name} changed since it was built"):
        store.read_runs(*run, docs=np.array([d]))


@pytest.mark.parametrize("with_docs", [True, False])
def test_read_runs_refuses_a_run_that_stops_before_it_starts(store_dir, with_docs):
    store = TokenStore.open(store_dir)
    with pytest.raises(ValueError, match=r"run 1 stops before it starts \(9 > 4\); pass stops >= starts"):
        store.read_runs(np.array([0, 0]), np.array([0, 9]), np.array([2, 4]), docs=np.array([0, 0]) if with_docs else None)


def test_a_concatenation_of_two_stores_sources_gathers_each_documents_tokens_from_its_own_store(tmp_path):
    from impl.fill import TokenSource

    rng = np.random.default_rng(11)
    stores = [TokenStore.from_token_files([[rng.integers(0, 500, size=int(rng.integers(1, 40))).tolist()
                                            for _ in range(docs)] for docs in counts], tmp_path / f"s{k}",
                                          vocab_size=500) for k, counts in enumerate([(7, 5), (3, 9, 4)])]
    source = TokenSource.concat([TokenSource.from_store(s) for s in stores])
    docs = np.array([0, 13, 8, 27, 11, 12, 20, 6], dtype=np.int64)
    file, start, length = source.locate(docs)
    out = np.zeros(int(length.sum()), dtype=np.int64)
    source.gather(out, file, start, start + length, np.concatenate(([0], np.cumsum(length)[:-1])), None, docs)
    whose = [(0, int(d)) if d < len(stores[0]) else (1, int(d) - len(stores[0])) for d in docs]
    assert out.tolist() == np.concatenate([stores[k][d] for k, d in whose]).tolist()


def test_a_store_rebuilt_between_pickling_and_unpickling_is_refused_in_the_receiving_process_not_served(tmp_path):
    out = tmp_path / "store"
    store = TokenStore.from_token_files([[[1, 2, 3], [4, 5]]], out, vocab_size=100)
    blob = pickle.dumps(store)   # what a spawned DataLoader worker receives
    TokenStore.from_token_files([[[9, 9, 9], [8, 8]]], out, vocab_size=100, overwrite=True)
    with pytest.raises(StoreCorruptError, match=r"changed \(fingerprint .*between processes"):
        pickle.loads(blob)
