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
