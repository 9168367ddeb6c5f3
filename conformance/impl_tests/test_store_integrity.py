"""The token store never serves a changed token: block checksums, offsets, reopen, verify, close, format 1.

Why these tests: a flipped bit on disk (a bad copy, a failing drive, an edit)
turns into silently wrong training data unless a reader checks the bytes it
is about to serve. Each test here fails for a plausible broken variant of the
check: only the first file checked, one reader path forgetting the check,
the offsets left unchecked, a reopened store trusting the parent's bitmap,
``verify`` skipping blocks read before or meta's own fingerprint, blocks
CRC'd on every read (or never), format 1 refused. Byte positions come from
an oracle independent of impl (pyarrow's own buffer addresses in the file).

Format 4 adds one CRC-32 per document (``documents.crc32``), checked when a
document's bounds are first asked for: a changed token byte, offsets entry
or table entry is refused naming the document; a random read CRCs exactly
its documents' bytes, once per store object; documents in file order keep
the block checks; ``verify`` recomputes every document. The tests of the
block checks on the fill and bounds paths run on a store rewritten as
format 3 (``_as_format_3``), which reads as before.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import re
import shutil
import warnings
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from impl import build_files as build_module
from impl import integrity as integrity_module
from impl import store as store_module
from impl import store_files as files_module
from impl.errors import StoreCorruptError, StoreError
from impl.store import QUICK_SIGNATURE_BYTES, TokenStore

SMALL_BLOCK = 4096


# --------------------------------------------------------------------------- helpers


def _documents(seed: int, files: int, docs: int, low: int, high: int) -> list[list[list[int]]]:
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, 50_000, size=int(rng.integers(low, high))).tolist() for _ in range(docs)]
            for _ in range(files)]


def _build(out: Path, files: list[list[list[int]]], block: int | None = SMALL_BLOCK) -> Path:
    """A store written with ``block``-byte checksum blocks (small, so a test store has many)."""
    with pytest.MonkeyPatch.context() as mp:
        if block is not None:
            mp.setattr(build_module, "BLOCK_BYTES", block)
        TokenStore.from_token_files(files, out, vocab_size=50_000)
    return out


def _layout(path: Path) -> tuple[int, int, int]:
    """``(values_at, offsets_at, size)``: byte positions of the token values and offsets, read with pyarrow alone."""
    size = path.stat().st_size
    with pa.memory_map(str(path), "r") as mm:
        col = pa.ipc.open_file(mm).get_batch(0).column(0)
        mm.seek(0)
        base = mm.read_buffer(size).address
    return col.values.buffers()[1].address - base, col.buffers()[1].address - base, size


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))


def _middle_value_byte(path: Path) -> tuple[int, int]:
    """A byte of token values in the middle of the file (outside both quick-signature windows) and its token."""
    values_at, _, size = _layout(path)
    at = size // 2
    assert QUICK_SIGNATURE_BYTES < at < size - QUICK_SIGNATURE_BYTES and at > values_at
    return at, (at - values_at) // 2


def _doc_holding(store: TokenStore, f: int, token: int) -> int:
    """Global index of the document of file ``f`` holding file-local token ``token``."""
    local = np.asarray(store.doc_offsets[store.file_document_starts[f]: store.file_document_starts[f + 1] + 1])
    local = local - local[0]
    return store.file_document_starts[f] + int(np.searchsorted(local, token, side="right")) - 1


def _block_pattern(path: Path, at: int, block: int) -> str:
    b = at // block
    end = min((b + 1) * block, path.stat().st_size) - 1
    return rf"{path.name} changed since it was built: block {b} \(bytes {b * block}-{end} of"


@pytest.fixture(scope="module")
def four_files(tmp_path_factory) -> Path:
    """4 files of ~300 KB (many 4 KiB blocks each, most outside the quick-signature windows)."""
    return _build(tmp_path_factory.mktemp("four") / "store", _documents(1, 4, 120, 500, 2000))


@pytest.fixture
def four(tmp_path, four_files) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(four_files, dst)
    return dst


@pytest.fixture(scope="module")
def large_file(tmp_path_factory) -> Path:
    """One ~3 MB file with the default blocks (BLOCK_BYTES): the configuration users get."""
    return _build(tmp_path_factory.mktemp("large") / "store", _documents(2, 1, 300, 3000, 7000), block=None)


@pytest.fixture
def large(tmp_path, large_file) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(large_file, dst)
    return dst


class _CountingCrc:
    """Stands in for the integrity module's ``crc32``: counts CRCs and their bytes, computes them with zlib's (the same)."""

    def __init__(self) -> None:
        self.calls = 0
        self.sizes: list[int] = []

    def __call__(self, data: object, value: int = 0) -> int:
        self.calls += 1
        self.sizes.append(memoryview(data).nbytes)  # type: ignore[arg-type]
        return zlib.crc32(data, value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- first read


def test_a_changed_byte_in_file_3_of_4_is_refused_when_read_while_the_other_files_read_normally(four):
    path = four / "tokens-00002.arrow"
    at, token = _middle_value_byte(path)
    clean = TokenStore.open(four)
    expected = [clean[d].tolist() for d in range(len(clean))]
    _flip(path, at)
    store = TokenStore.open(four)
    starts = store.file_document_starts
    bad = _doc_holding(store, 2, token)
    for d in [*range(starts[2]), *range(starts[3], starts[4])]:
        assert store[d].tolist() == expected[d]
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK) + r".*rebuild it with"):
        store[bad]
    assert store[starts[2]].tolist() == expected[starts[2]]  # other blocks of the same file still serve


READERS = {
    "getitem": lambda s, d, f, a, b: s[d],
    "tokens_for": lambda s, d, f, a, b: s.tokens_for(d, 0, 1),
    "read": lambda s, d, f, a, b: s.read(int(s.doc_offsets[d]), int(s.doc_offsets[d + 1])),
    "gather": lambda s, d, f, a, b: s.gather([0, d]),
    "iteration": lambda s, d, f, a, b: list(s),
    "check_blocks": lambda s, d, f, a, b: s.check_blocks(f, np.array([a]), np.array([b])),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_changed_middle_byte_of_a_large_file_is_refused_by_every_reader_on_first_read_without_verify(large, reader):
    path = large / "tokens-00000.arrow"
    at, token = _middle_value_byte(path)
    _flip(path, at)
    store = TokenStore.open(large)  # no verify=True: the read path alone must catch it
    d = _doc_holding(store, 0, token)
    a, b = int(store.doc_offsets[d]), int(store.doc_offsets[d + 1])
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, store_module.BLOCK_BYTES)):
        READERS[reader](store, d, 0, a, b)


def test_a_read_spanning_files_checks_every_file_it_touches(four):
    path = four / "tokens-00003.arrow"
    at, _ = _middle_value_byte(path)
    _flip(path, at)
    store = TokenStore.open(four)
    with pytest.raises(StoreCorruptError, match="tokens-00003.arrow changed since it was built: block"):
        store.read(0, store.num_tokens)
    with pytest.raises(StoreCorruptError, match="tokens-00003.arrow changed since it was built: block"):
        store.gather(np.arange(len(store))[::-1])


def test_a_file_changed_after_another_file_was_read_through_is_refused_by_a_batch_check_not_taken_as_verified(four):
    """Fault caught: the store-wide "every file verified" shortcut set as soon as the *first* file is verified.

    File 0 is read through (all its blocks verified, so it counts as verified
    whole); files 1 to 3 are not. A byte of file 1 then changes: a batch
    check of runs in files 0 and 1 must still CRC file 1's block and refuse it.
    """
    path = four / "tokens-00001.arrow"
    at, token = _middle_value_byte(path)
    store = TokenStore.open(four)
    starts = store.file_document_starts
    for d in range(starts[0], starts[1]):
        store[d]
    assert store._blocks[0].complete and not any(b is not None and b.complete for b in store._blocks[1:])
    _flip(path, at)
    files, lo, hi = np.array([0, 1]), np.array([0, max(token - 5, 0)]), np.array([50, token + 5])
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        store.check_blocks_batch(files, lo, hi)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        store.check_blocks_batch(files, lo, hi)  # refused again: a failed block never counts as verified


def test_a_globally_shuffled_loader_refuses_a_file_changed_after_another_file_was_read_through(four, tmp_path):
    """The same fault on the user's path: a format-3 fill checks a batch's runs in several files in one batch check.

    Each batch pairs a sample lying wholly in file 0 with one of the samples
    reading file 1, so every batch that reads file 1 spans two files (one
    batch check, never the per-file check).
    """
    from impl.dataset import PackedDataset

    _as_format_3(four)
    path = four / "tokens-00001.arrow"
    at, _ = _middle_value_byte(path)
    options = {"seq_len": 64, "packing": "concat", "shuffle": "global", "seed": 3, "cache_dir": tmp_path}
    clean = PackedDataset(TokenStore.open(four), **options)
    starts = np.asarray(clean.store.file_document_starts)
    docs = clean.samples(0, range(len(clean)))["doc_ids"]
    file_of = np.where(docs >= 0, np.searchsorted(starts, docs, side="right") - 1, -1)
    files_of = [set(row.tolist()) - {-1} for row in file_of]
    in_file_0 = next(j for j, files in enumerate(files_of) if files == {0})
    reading_1 = [j for j, files in enumerate(files_of) if 1 in files]
    store = TokenStore.open(four)
    for d in range(starts[0], starts[1]):
        store[d]
    assert store._blocks[0].complete
    _flip(path, at)
    ds = PackedDataset(store, **options)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        for j in reading_1:
            ds.samples(0, [in_file_0, j])


def test_changed_document_offsets_are_refused_before_any_boundary_is_used(tmp_path):
    """12k short documents: their offsets (96 KB) reach past the first quick-signature window (format 3: blocks)."""
    out = _build(tmp_path / "store", _documents(3, 1, 12_000, 2, 30))
    _as_format_3(out)
    path = out / "tokens-00000.arrow"
    values_at, offsets_at, size = _layout(path)
    at = offsets_at + 8 * 10_000 + 1  # document 10,000's offset: past the first 64 KiB, before the values
    assert QUICK_SIGNATURE_BYTES < at < values_at and at < size - QUICK_SIGNATURE_BYTES
    _flip(path, at)
    clean = TokenStore.open(out)
    first = clean[0].tolist()
    store = TokenStore.open(out)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        _ = store.lengths
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        store[10_000]  # refused again: the failed block never counts as verified
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        TokenStore.open(out).document_bounds(0, np.array([3, 10_000]))
    assert store[0].tolist() == first  # its offsets lie in another block, which passed


# --------------------------------------------------------------------------- once per block, per store object


def test_each_block_is_crcd_once_per_store_object_however_often_and_however_it_is_read(four, monkeypatch):
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store = TokenStore.open(four)
    total_blocks = (four / "blocks.crc32").stat().st_size // 4
    list(store)
    assert counting.calls == total_blocks  # every block holds tokens or offsets: all read, each once
    store.gather(np.arange(len(store)))
    store.read(0, store.num_tokens)
    _ = [store[d] for d in range(len(store))]
    assert counting.calls == total_blocks
    fresh = TokenStore.open(four)
    fresh[len(fresh) - 1]
    assert counting.calls > total_blocks  # a new store object checks again


def test_concurrent_readers_crc_each_block_once_and_all_get_the_right_tokens(four, monkeypatch):
    expected = [d.tolist() for d in TokenStore.open(four)]
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store = TokenStore.open(four)
    total_blocks = (four / "blocks.crc32").stat().st_size // 4
    order = np.random.default_rng(0).permutation(len(store)).tolist()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda d: (d, store[d].tolist()), order * 2))
    assert all(tokens == expected[d] for d, tokens in got)
    assert counting.calls == total_blocks


def test_a_range_in_verified_blocks_is_not_crcd_again_but_an_unverified_neighbour_is(large, monkeypatch):
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store = TokenStore.open(large)
    store.check_blocks(0, np.array([0]), np.array([1]))
    after_map = counting.calls
    store.check_blocks(0, np.array([0, 5]), np.array([1, 9]))
    assert counting.calls == after_map
    last = store.num_tokens
    store.check_blocks(0, np.array([last - 1]), np.array([last]))
    assert counting.calls == after_map + 1
    store.check_blocks(0, np.array([0, last - 1]), np.array([1, last]))  # the unverified blocks between are not read
    assert counting.calls == after_map + 1
    middle = last // 2
    store.check_blocks(0, np.array([3, middle, last - 5]), np.array([4, middle + 1, last]))
    assert counting.calls == after_map + 2


def _block_reader(store: TokenStore, counting: _CountingCrc):
    """``read(k)``: check one token of value block ``k`` of file 0; returns how many blocks that CRC'd."""
    store.check_blocks(0, np.array([0]), np.array([0]))  # maps file 0, checks nothing
    blocks = store._blocks[0]
    assert blocks is not None

    def read(k: int) -> int:
        token = max(0, -(-(k * blocks.block - blocks.base) // blocks.itemsize))
        before = counting.calls
        store.check_blocks(0, np.array([token]), np.array([token + 1]))
        return counting.calls - before

    return blocks, read


def test_a_first_read_in_file_order_verifies_a_growing_bounded_window_ahead_once_its_streak_is_long(large, monkeypatch):
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    blocks, read = _block_reader(TokenStore.open(large), counting)
    first = blocks.base // blocks.block + 1
    threshold = integrity_module._READ_AHEAD_AFTER // blocks.block
    assert blocks.count > first + 4 * blocks.read_ahead > first + 4 * threshold
    costs = [read(k) for k in range(first, blocks.count)]
    assert costs[:threshold - 1] == [1] * (threshold - 1), "no read-ahead before the streak is long enough"
    windows = [c for c in costs[threshold - 1:] if c]
    assert all(w > 1 for w in windows) and max(windows) == 1 + blocks.read_ahead, windows
    assert windows[:-1] == sorted(windows[:-1]), "the window grows with the streak, up to read_ahead"
    assert sum(costs) == blocks.count - first, "every block is CRC'd once, none skipped, none twice"
    assert len(windows) < len(costs) // 4


def test_a_random_first_read_verifies_only_its_own_blocks_even_next_to_verified_ones(large, monkeypatch):
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    blocks, read = _block_reader(TokenStore.open(large), counting)
    first = blocks.base // blocks.block + 1
    middle = blocks.count // 2
    assert read(middle) == 1
    assert read(middle + 1) == 1, "a document read in two pieces (a short streak) does not read ahead"
    assert read(middle - 1) == 1, "a verified neighbour is not a streak"
    order = np.random.default_rng(5).permutation(np.arange(first, blocks.count)).tolist()
    assert {read(k) for k in order} <= {0, 1}


def test_a_changed_block_inside_the_read_ahead_window_is_refused_before_its_tokens_are_served(large):
    store = TokenStore.open(large)
    store.check_blocks(0, np.array([0]), np.array([1]))
    blocks = store._blocks[0]
    assert blocks is not None
    ahead = blocks.base // blocks.block + 5
    store.close()
    _flip(large / store.meta["files"][0]["name"], ahead * blocks.block + 7)
    fresh = TokenStore.open(large)
    with pytest.raises(StoreCorruptError, match=rf"block {ahead} "):
        for t in range(0, fresh.num_tokens, 512):
            fresh.check_blocks(0, np.array([t]), np.array([t + 1]))
            assert (t * blocks.itemsize + blocks.base) // blocks.block < ahead, "tokens of the changed block were reached"


# --------------------------------------------------------------------------- reopen


def _read_in_child(store: TokenStore, doc: int) -> str:
    try:
        store[doc]
    except StoreCorruptError as exc:
        return f"StoreCorruptError: {exc}"
    return "served"


def test_a_store_sent_to_a_spawned_process_or_unpickled_checks_its_blocks_again(large):
    path = large / "tokens-00000.arrow"
    at, token = _middle_value_byte(path)
    store = TokenStore.open(large)
    list(store)  # every block verified by this object
    doc = _doc_holding(store, 0, token)
    _flip(path, at)
    store[doc]  # this object verified that block already: checked once per object, by design
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, store_module.BLOCK_BYTES)):
        pickle.loads(pickle.dumps(store))[doc]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        outcome = pool.apply_async(_read_in_child, (store, doc)).get(timeout=120)
    assert outcome.startswith("StoreCorruptError:") and f"block {at // store_module.BLOCK_BYTES}" in outcome


# --------------------------------------------------------------------------- verify


def test_verify_refuses_an_edited_fingerprint_in_meta_json(four):
    meta = json.loads((four / "meta.json").read_text())
    meta["fingerprint"] = "0" * 64
    (four / "meta.json").write_text(json.dumps(meta))
    store = TokenStore.open(four)
    with pytest.raises(StoreCorruptError, match=r"fingerprint 0000000000000000\.\.\. does not match.*was edited"):
        store.verify()


def test_verify_rechecks_every_block_even_those_read_before(four):
    store = TokenStore.open(four)
    list(store)
    path = four / "tokens-00001.arrow"
    at, _ = _middle_value_byte(path)
    _flip(path, at)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        store.verify()


def test_verify_passes_a_clean_store_and_leaves_every_block_verified(four, monkeypatch):
    store = TokenStore.open(four)
    store.verify()
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store.gather(np.arange(len(store)))
    assert counting.calls == 0


@pytest.mark.parametrize(("change", "message"), [
    ("truncate", r"tokens-00001.arrow is truncated \(\d+ bytes, \d+ when built\)"),
    ("extend", r"tokens-00001.arrow changed since it was built \(\d+ bytes, \d+ when built\)"),
    ("delete", r"tokens-00001.arrow is missing"),
])
def test_a_truncated_extended_or_missing_file_is_refused_at_open_naming_it(four, change, message):
    path = four / "tokens-00001.arrow"
    if change == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 1)
    elif change == "extend":
        with open(path, "ab") as f:
            f.write(b"\0")
    else:
        path.unlink()
    with pytest.raises(StoreCorruptError, match=message + r".*rebuild it with"):
        TokenStore.open(four)


# --------------------------------------------------------------------------- close


CLOSED_ACCESSORS = {
    "getitem": lambda s: s[0],
    "tokens_for": lambda s: s.tokens_for(0),
    "read": lambda s: s.read(0, 1),
    "empty read": lambda s: s.read(0, 0),
    "gather": lambda s: s.gather([0]),
    "iteration": lambda s: next(iter(s)),
    "lengths": lambda s: s.lengths,
    "doc_offsets": lambda s: s.doc_offsets,
    "check_blocks": lambda s: s.check_blocks(0, np.array([0]), np.array([1])),
    "check_blocks_batch": lambda s: s.check_blocks_batch(np.array([0, 1]), np.array([0, 0]), np.array([1, 1])),
    "verify": lambda s: s.verify(),
}


@pytest.mark.parametrize("accessor", list(CLOSED_ACCESSORS))
def test_every_accessor_that_needs_the_files_raises_store_error_after_close(four_files, accessor):
    store = TokenStore.open(four_files)
    _ = store.lengths  # cached before close: close must drop it
    store.close()
    store.close()  # idempotent
    assert store.closed
    with pytest.raises(StoreError, match=r"is closed; open it again with TokenStore.open\("):
        CLOSED_ACCESSORS[accessor](store)


def test_a_fully_verified_store_checks_a_batch_without_a_crc_and_still_refuses_it_after_close(four_files, monkeypatch):
    store = TokenStore.open(four_files)
    store.verify()
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store.check_blocks_batch(np.array([0, 3, 1]), np.array([0, 5, 9]), np.array([100, 50, 10]))
    assert counting.calls == 0
    store.close()
    with pytest.raises(StoreError, match=r"is closed; open it again with TokenStore.open\("):
        store.check_blocks_batch(np.array([0, 3]), np.array([0, 5]), np.array([100, 50]))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings from /proc (Linux)")
def test_close_unmaps_every_file_the_store_mapped_its_checksum_tables_included(four):
    def mapped() -> set[str]:
        with open("/proc/self/maps") as maps:
            return {Path(line.split()[-1]).name for line in maps if str(four) in line}

    store = TokenStore.open(four)
    _ = store.document_bounds_batch(np.array([0, 2]), np.array([3, 7]))
    assert mapped() == {"blocks.crc32", "documents.crc32", "tokens-00000.arrow", "tokens-00002.arrow"}
    store.close()
    assert mapped() == set()


def test_after_close_metadata_stays_readable_old_views_stay_valid_and_a_pickle_reopens(four_files):
    store = TokenStore.open(four_files)
    first = store[0]
    tokens = first.tolist()
    store.close()
    assert first.tolist() == tokens
    assert len(store) == 480 and store.num_files == 4 and len(store.fingerprint) == 64
    assert pickle.loads(pickle.dumps(store))[0].tolist() == tokens


# --------------------------------------------------------------------------- formats 1, 2 and 3


def _refingerprint(meta: dict, version: int) -> None:
    meta["format_version"] = version
    meta["fingerprint"] = files_module._content_fingerprint(
        [r["sha256"] for r in meta["files"]], meta["dtype"], meta["tokenizer"]["sha256"],
        meta["options"]["add_bos"], meta["options"]["add_eos"], format_version=version)


def _as_format_3(path: Path) -> None:
    """Rewrite a store as format 3 wrote it: the block table alone, no documents.crc32, version 3 in the fingerprint."""
    meta = json.loads((path / "meta.json").read_text())
    del meta["layout"]["document_table"], meta["layout"]["document_checksum"]
    (path / "documents.crc32").unlink()
    _refingerprint(meta, 3)
    (path / "meta.json").write_text(json.dumps(meta))


def _as_format_1(path: Path) -> None:
    """Rewrite a store's meta.json exactly as format 1 recorded it: no block checksums, version 1 in the fingerprint."""
    _as_format_3(path)
    meta = json.loads((path / "meta.json").read_text())
    for record in meta["files"]:
        del record["buffers"]
    del meta["layout"]["block_bytes"], meta["layout"]["block_checksum"], meta["layout"]["block_table"]
    (path / "blocks.crc32").unlink()
    _refingerprint(meta, 1)
    (path / "meta.json").write_text(json.dumps(meta))


def _as_format_2(path: Path) -> None:
    """Rewrite a store as format 2 wrote it: each record's block CRCs as hex in meta.json, no block table file."""
    _as_format_3(path)
    meta = json.loads((path / "meta.json").read_text())
    table = (path / "blocks.crc32").read_bytes()
    block, at = meta["layout"]["block_bytes"], 0
    for record in meta["files"]:
        n = -(-record["size"] // block)
        record["block_crc32"] = table[4 * at:4 * (at + n)].hex()
        at += n
    assert 4 * at == len(table)
    del meta["layout"]["block_table"]
    (path / "blocks.crc32").unlink()
    _refingerprint(meta, 2)
    (path / "meta.json").write_text(json.dumps(meta))


def test_a_format_2_store_opens_reads_the_same_tokens_checks_each_block_once_and_verifies(four, monkeypatch):
    expected = [d.tolist() for d in TokenStore.open(four)]
    _as_format_2(four)
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = TokenStore.open(four)
        assert store.format_version == 2
        assert [d.tolist() for d in store] == expected
        blocks = sum(len(r["block_crc32"]) // 8 for r in store.meta["files"])
        assert counting.calls == blocks
        tokens, _ = store.gather(np.arange(len(store)))
        assert tokens.tolist() == [t for doc in expected for t in doc] and counting.calls == blocks
        TokenStore.open(four, verify=True)


def test_a_format_2_store_with_a_changed_middle_byte_is_refused_on_first_read_naming_the_block(four):
    _as_format_2(four)
    path = four / "tokens-00002.arrow"
    at, token = _middle_value_byte(path)
    _flip(path, at)
    store = TokenStore.open(four)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        store[_doc_holding(store, 2, token)]


@pytest.mark.parametrize("name", ["blocks.crc32", "documents.crc32"])
@pytest.mark.parametrize("change", ["truncate", "delete"])
def test_a_truncated_or_missing_checksum_table_is_refused_at_open_naming_it(four, change, name):
    table = four / name
    if change == "truncate":
        table.write_bytes(table.read_bytes()[:-4])
    else:
        table.unlink()
    escaped = re.escape(name)
    message = rf"{escaped} is truncated \(\d+ bytes, \d+ when built\)" if change == "truncate" else \
        rf"{escaped} is missing"
    with pytest.raises(StoreCorruptError, match=message + r".*rebuild it with"):
        TokenStore.open(four)


def test_a_changed_entry_of_the_block_table_refuses_its_block_on_read_and_verify_names_the_table(four):
    table = four / "blocks.crc32"
    data = bytearray(table.read_bytes())
    data[1] ^= 0x01  # the first block of tokens-00000.arrow: its Arrow header and offsets
    table.write_bytes(bytes(data))
    store = TokenStore.open(four)
    with pytest.raises(StoreCorruptError, match=r"tokens-00000\.arrow changed since it was built: block 0 "):
        store[0]
    with pytest.raises(StoreCorruptError, match=r"blocks\.crc32 changed since it was built \(sha256"):
        TokenStore.open(four).verify()


def test_a_format_1_store_opens_without_warnings_reads_the_same_tokens_and_verifies(four):
    expected = [d.tolist() for d in TokenStore.open(four)]
    _as_format_1(four)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = TokenStore.open(four, verify=True)
        assert store.format_version == 1
        assert [store[d].tolist() for d in range(len(store))] == expected
        assert [d.tolist() for d in store] == expected
        tokens, _ = store.gather(np.arange(len(store)))
        assert tokens.tolist() == [t for doc in expected for t in doc]
        store.check_blocks(2, np.array([0]), np.array([10]))  # nothing recorded to check: maps only


def test_a_format_1_store_with_a_changed_middle_byte_is_refused_by_verify(four):
    _as_format_1(four)
    path = four / "tokens-00002.arrow"
    at, _ = _middle_value_byte(path)
    _flip(path, at)
    with pytest.raises(StoreCorruptError, match=r"tokens-00002.arrow changed since it was built \(sha256"):
        TokenStore.open(four, verify=True)


# --------------------------------------------------------------------------- recorded buffer layout, lazy offsets


def _edit_records(path: Path, edit) -> None:
    meta = json.loads((path / "meta.json").read_text())
    for record in meta["files"]:
        edit(record)
    (path / "meta.json").write_text(json.dumps(meta))


def test_the_recorded_buffer_layout_is_where_pyarrow_finds_the_offsets_and_values(four):
    store = TokenStore.open(four)
    for f, record in enumerate(store.meta["files"]):
        values_at, offsets_at, _ = _layout(four / record["name"])
        assert record["buffers"] == {
            "offsets": [offsets_at, (record["num_documents"] + 1) * 8],
            "values": [values_at, record["num_tokens"] * store.dtype.itemsize],
        }, f"file {f}"


def test_a_batch_checks_only_the_offsets_blocks_of_its_documents_and_refuses_a_changed_one(tmp_path, monkeypatch):
    from impl.fill import TokenSource

    out = _build(tmp_path / "store", _documents(3, 1, 12_000, 2, 30))
    _as_format_3(out)  # block checks of the offsets (format 4 checks each document instead: tested apart)
    path = out / "tokens-00000.arrow"
    _, offsets_at, _ = _layout(path)
    expected = TokenStore.open(out)
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    source = TokenSource.from_store(TokenStore.open(out))
    _, lo, length = source.locate(np.array([5, 9_000]))
    offsets_blocks = -(-12_001 * 8 // SMALL_BLOCK)
    assert counting.calls <= 4 < offsets_blocks  # two documents' entries, not the file's 24 offsets blocks
    assert lo.tolist() == [int(expected.doc_offsets[d]) for d in (5, 9_000)]
    assert length.tolist() == [len(expected[d]) for d in (5, 9_000)]
    at = offsets_at + 8 * 9_001 + 2  # the end of document 9,000: a byte the locate above used
    _flip(path, at)
    fresh = TokenSource.from_store(TokenStore.open(out))
    assert fresh.locate(np.array([5]))[2].tolist() == [len(expected[5])]
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        fresh.locate(np.array([9_000]))


def test_verify_refuses_a_recorded_buffer_layout_that_is_not_the_arrow_files(four):
    def shift(record):
        record["buffers"]["values"][0] += 8  # still inside the file, so only the Arrow comparison can tell

    _edit_records(four, shift)
    with pytest.raises(StoreCorruptError, match=r"records its buffers at .* but the Arrow file holds them at"):
        TokenStore.open(four, verify=True)


@pytest.mark.parametrize("edit", [
    pytest.param(lambda r: r["buffers"]["values"].__setitem__(0, r["size"] - 2), id="values-past-the-end"),
    pytest.param(lambda r: r["buffers"]["offsets"].__setitem__(1, 8), id="offsets-too-short"),
    pytest.param(lambda r: r["buffers"].__setitem__("offsets", "0"), id="offsets-not-a-pair"),
    pytest.param(lambda r: r["buffers"]["offsets"].__setitem__(0, -8), id="offsets-before-the-start"),
])
def test_a_recorded_buffer_outside_the_file_or_of_the_wrong_length_is_refused_as_corrupt_before_any_read(four, edit):
    _edit_records(four, edit)
    store = TokenStore.open(four)
    with pytest.raises(StoreCorruptError, match=r"tokens-00000.arrow: meta.json records its \w+ buffer at .*rebuild"):
        store[0]


def test_a_format_2_store_without_recorded_buffers_reads_through_arrow_after_its_quick_signature(four, monkeypatch):
    expected = [d.tolist() for d in TokenStore.open(four)]
    _edit_records(four, lambda r: r.pop("buffers"))
    signed = []
    real = files_module.quick_signature_of

    def sign(files, name):
        signed.append(name)
        return real(files, name)

    monkeypatch.setattr(files_module, "quick_signature_of", sign)
    store = TokenStore.open(four)
    assert store[len(store) - 1].tolist() == expected[-1]
    assert signed == ["tokens-00003.arrow"]
    assert [d.tolist() for d in store] == expected
    store.verify()


@pytest.mark.parametrize("picks", ["few across files", "many in one file", "many across files"])
def test_document_bounds_batch_gives_every_documents_checked_bounds_whichever_path_it_takes(four, picks):
    clean = TokenStore.open(four)
    starts = clean.file_document_starts
    rng = np.random.default_rng(3)
    docs = {"few across files": rng.choice(len(clean), 6, replace=False),
            "many in one file": np.arange(starts[1] + 2, starts[1] + 40),
            "many across files": rng.choice(len(clean), 200)}[picks]
    files = np.searchsorted(starts, docs, side="right") - 1
    local = docs - np.asarray(starts)[files]
    got_start, got_length = TokenStore.open(four).document_bounds_batch(files, local)
    offsets = clean.doc_offsets
    file_token_starts = np.array([0, *np.cumsum(clean.file_token_counts)])
    assert got_start.tolist() == (offsets[docs] - file_token_starts[files]).tolist()
    assert got_length.tolist() == (offsets[docs + 1] - offsets[docs]).tolist()
    with pytest.raises(IndexError, match="out of range"):
        clean.document_bounds_batch(np.array([0]), np.array([starts[1] - starts[0]]))


# --------------------------------------------------------------------------- random batches over several files


def _shuffled_batches(store: TokenStore, seed: int, runs_per_batch: int = 12) -> list[list[tuple[int, int, int]]]:
    """Every document of every file as ``(file, start, stop)`` runs (cut in up to 3 pieces), shuffled into batches."""
    rng = np.random.default_rng(seed)
    runs = []
    for f in range(store.num_files):
        offsets = np.asarray(store._offsets[f]).tolist()
        for a, b in itertools.pairwise(offsets):
            cuts = sorted({a, b, *rng.integers(a, b + 1, size=2).tolist()})
            runs += [(f, x, y) for x, y in itertools.pairwise(cuts)]
    order = rng.permutation(len(runs)).tolist()
    shuffled = [runs[k] for k in order]
    return [shuffled[k:k + runs_per_batch] for k in range(0, len(shuffled), runs_per_batch)]


def _value_bytes_to_change(store_dir: Path, store: TokenStore, seed: int) -> list[tuple[int, int]]:
    """``(file, byte)``: in every file, a byte of token values in its first, its last and two random value blocks."""
    rng = np.random.default_rng(seed)
    out = []
    for f, rec in enumerate(store.file_records):
        values_at, _, _ = _layout(store_dir / rec.name)
        end = values_at + rec.num_tokens * store.dtype.itemsize
        picks = [values_at, end - 1, *rng.integers(values_at, end, size=2).tolist()]
        out += [(f, int(at)) for at in picks]
    return out


def test_a_changed_byte_in_any_value_block_is_refused_by_a_batch_check_before_any_token_of_its_block_is_served(four):
    clean = TokenStore.open(four)
    batches = _shuffled_batches(clean, seed=7)
    assert all(len({f for f, _, _ in batch}) > 1 for batch in batches[:-1]), "each batch spans several files"
    item = clean.dtype.itemsize
    for f, at in _value_bytes_to_change(four, clean, seed=11):
        path = four / clean.file_records[f].name
        values_at = _layout(path)[0]
        block = at // SMALL_BLOCK
        _flip(path, at)
        try:
            store = TokenStore.open(four)
            refused = None
            for k, batch in enumerate(batches):
                files, starts, stops = (np.array(column, dtype=np.int64) for column in zip(*batch))
                try:
                    store.check_blocks_batch(files, starts, stops)
                except StoreCorruptError as exc:
                    refused = (k, str(exc))
                    break
                served = [(g, (values_at + x * item) // SMALL_BLOCK, (values_at + y * item - 1) // SMALL_BLOCK)
                          for g, x, y in batch if g == f]
                assert not any(lo <= block <= hi for _, lo, hi in served), f"block {block} of file {f} was served"
            assert refused is not None, f"the changed byte {at} of file {f} was never refused"
            assert f"{path.name} changed since it was built: block {block} " in refused[1]
        finally:
            _flip(path, at)  # restore it for the next byte


def test_a_loader_under_a_global_shuffle_refuses_a_changed_value_or_offsets_block_before_serving_any_of_its_tokens(
        four, tmp_path):
    """Format 3: the fill checks the blocks of every run it copies (format 4's document checks are tested apart)."""
    from impl.dataset import PackedDataset

    _as_format_3(four)
    clean = TokenStore.open(four)
    starts = np.asarray(clean.file_document_starts)
    changes = {"values": ("tokens-00002.arrow", _middle_value_byte(four / "tokens-00002.arrow")[0]),
               "offsets": ("tokens-00001.arrow", _layout(four / "tokens-00001.arrow")[1] + 8 * 60 + 3)}
    for what, (name, at) in changes.items():
        f = clean.file_records.index(next(r for r in clean.file_records if r.name == name))
        values_at, offsets_at, _ = _layout(four / name)
        block = at // SMALL_BLOCK
        _flip(four / name, at)
        try:
            ds = PackedDataset(TokenStore.open(four), seq_len=64, packing="concat", shuffle="global", seed=3,
                               cache_dir=tmp_path)
            with pytest.raises(StoreCorruptError, match=rf"{name} changed since it was built: block {block} "):
                for first in range(0, len(ds), 8):
                    batch = ds.samples(0, range(first, min(first + 8, len(ds))))
                    keep = batch["doc_ids"] >= 0
                    docs, offsets = batch["doc_ids"][keep], batch["token_offsets"][keep]
                    mine = np.searchsorted(starts, docs, side="right") - 1 == f
                    local, offsets = docs[mine] - starts[f], offsets[mine]
                    if what == "offsets":  # each served document's two offsets entries
                        used = {(offsets_at + 8 * d + j) // SMALL_BLOCK for d in local.tolist() for j in (0, 15)}
                    else:  # each served token: an input at its offset, its label at the next (when in the document)
                        bounds = np.asarray(clean._offsets[f])
                        tokens = np.concatenate((bounds[local] + offsets, np.minimum(bounds[local] + offsets + 1,
                                                                                      bounds[local + 1] - 1)))
                        used = set(((values_at + 2 * tokens) // SMALL_BLOCK).tolist())
                    assert block not in used, f"a token of the changed {what} block {block} was served"
        finally:
            _flip(four / name, at)


@pytest.mark.parametrize("edge", ["ends one token into it", "starts at its last token"])
def test_a_run_touching_a_changed_block_by_one_token_is_refused_by_both_block_checks(four, edge):
    path = four / "tokens-00001.arrow"
    at, _ = _middle_value_byte(path)
    values_at = _layout(path)[0]
    block = at // SMALL_BLOCK
    first_token = -(-(block * SMALL_BLOCK - values_at) // 2)
    last_token = ((block + 1) * SMALL_BLOCK - values_at) // 2 - 1
    ends_in = edge == "ends one token into it"
    a, b = (first_token - 40, first_token + 1) if ends_in else (last_token, last_token + 40)
    _flip(path, at)
    pattern = _block_pattern(path, at, SMALL_BLOCK)
    with pytest.raises(StoreCorruptError, match=pattern):
        TokenStore.open(four).check_blocks(1, np.array([a]), np.array([b]))
    with pytest.raises(StoreCorruptError, match=pattern):
        TokenStore.open(four).check_blocks_batch(np.array([0, 1, 3]), np.array([5, a, 7]), np.array([9, b, 8]))
    short = first_token if ends_in else a  # the same run stopping short of the block
    TokenStore.open(four).check_blocks_batch(np.array([0, 1, 3]), np.array([5, a, 7]), np.array([9, short, 8]))


# --------------------------------------------------------------------------- format 4: one CRC-32 per document


@pytest.fixture(scope="module")
def many_short_file(tmp_path_factory) -> Path:
    """One file of 12k documents of 0-29 tokens (~400 empty) in 1 KiB blocks: its offsets span 94 blocks."""
    return _build(tmp_path_factory.mktemp("many") / "store", _documents(3, 1, 12_000, 0, 30), block=1024)


@pytest.fixture
def many_short(tmp_path, many_short_file) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(many_short_file, dst)
    return dst


def _document_pattern(name: str, local: int, document: int) -> str:
    """The refusal of document ``local`` of file ``name`` (``document`` of the store) by its CRC-32."""
    return (rf"{name} changed since it was built: its document {local} \(document {document} of the store; tokens "
            rf"\d+-\d+, bytes \d+-\d+ of \d+, as its offsets now say\) has CRC-32 [0-9a-f]{{8}}, [0-9a-f]{{8}} when "
            rf"built \(documents\.crc32\), so none of its tokens is served; restore the file from a good copy or "
            rf"rebuild it with")


def _add_to_offset(path: Path, entry: int, delta: int) -> None:
    """Add ``delta`` to offsets entry ``entry`` (int64, little-endian) of the file: the bound of two documents moves."""
    at = _layout(path)[1] + 8 * entry
    with open(path, "r+b") as f:
        f.seek(at)
        value = int.from_bytes(f.read(8), "little", signed=True)
        f.seek(at)
        f.write((value + delta).to_bytes(8, "little", signed=True))


def _among_scattered(store: TokenStore, docs: np.ndarray) -> np.ndarray:
    """``docs`` of file 0 after 72 others spread evenly over it (none next to them): scattered, as a global shuffle."""
    near = {int(d) + k for d in docs.tolist() for k in (-1, 0, 1)}
    spread = [d for d in np.linspace(0, store.num_documents - 1, 72).astype(int).tolist() if d not in near]
    return np.array([*spread, *docs.tolist()], dtype=np.int64)


#: How a reader asks for the bounds of ``docs`` of file 0: the per-document loop, or among many scattered (numpy).
BOUNDS_PATHS = {
    "one at a time (document_bounds_batch)": lambda s, docs: [s.document_bounds_batch(np.array([0]), np.array([d]))
                                                             for d in docs.tolist()],
    "among 72 scattered (document_bounds)": lambda s, docs: s.document_bounds(0, _among_scattered(s, docs)),
    "among 72 scattered (document_bounds_batch)": lambda s, docs: s.document_bounds_batch(
        np.zeros(len(_among_scattered(s, docs)), dtype=np.int64), _among_scattered(s, docs)),
}


def _lengths_of(store_dir: Path) -> np.ndarray:
    return np.asarray(TokenStore.open(store_dir).lengths)


def _entry_between(lengths: np.ndarray, near: int, empty_before: bool, empty_after: bool) -> int:
    """The first offsets entry ``k >= near`` between documents ``k - 1`` and ``k`` empty or not as asked."""
    empty = (lengths == 0).tolist()
    return next(k for k in range(near, len(lengths)) if (empty[k - 1], empty[k]) == (empty_before, empty_after))


@pytest.mark.parametrize("path", list(BOUNDS_PATHS))
def test_a_changed_token_byte_is_refused_by_the_bounds_of_its_document_naming_it_on_every_read(many_short, path):
    lengths = _lengths_of(many_short)
    d = 6_000 + int(np.flatnonzero(lengths[6_000:] >= 4)[0])
    file = many_short / "tokens-00000.arrow"
    clean = TokenStore.open(many_short)
    good = np.array([d - 1, d + 1])
    expected = clean.document_bounds(0, good)
    _flip(file, _layout(file)[0] + 2 * (int(clean.doc_offsets[d]) + 2))
    store = TokenStore.open(many_short)
    assert store.document_checks
    for _ in range(2):  # refused again: a document whose CRC failed never counts as verified
        with pytest.raises(StoreCorruptError, match=_document_pattern(file.name, d, d)):
            BOUNDS_PATHS[path](store, np.array([d]))
    got = store.document_bounds_batch(np.zeros(2, dtype=np.int64), good)  # its neighbours still serve
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]


@pytest.mark.parametrize("path", list(BOUNDS_PATHS))
@pytest.mark.parametrize(("entry", "empty_before", "empty_after", "delta"), [
    ("between two documents", False, False, 1),
    ("ending an empty document", True, False, 1),
    ("starting an empty document", False, True, -1),
])
def test_a_changed_offsets_entry_is_refused_by_the_crc_of_either_document_it_bounds(many_short, path, entry,
                                                                                     empty_before, empty_after, delta):
    """The entry moves by one token: each of its two documents is then read over a moved range, whose CRC fails."""
    k = _entry_between(_lengths_of(many_short), 4_000, empty_before, empty_after)
    file = many_short / "tokens-00000.arrow"
    _add_to_offset(file, k, delta)
    for d in (k - 1, k):
        store = TokenStore.open(many_short)
        for _ in range(2):
            with pytest.raises(StoreCorruptError, match=_document_pattern(file.name, d, d)):
                BOUNDS_PATHS[path](store, np.array([d]))


def test_a_changed_offsets_entry_of_a_format_4_file_is_refused_by_its_block_for_whole_file_uses_by_its_documents_else(
        many_short):
    """The format-4 side of the offsets test above: ``lengths`` and ``store[d]`` read offsets checked by block."""
    k = _entry_between(_lengths_of(many_short), 10_000, False, False)
    file = many_short / "tokens-00000.arrow"
    at = _layout(file)[1] + 8 * k
    _add_to_offset(file, k, 1)
    store = TokenStore.open(many_short)
    with pytest.raises(StoreCorruptError, match=_block_pattern(file, at, 1024)):
        _ = store.lengths
    with pytest.raises(StoreCorruptError, match=_block_pattern(file, at, 1024)):
        store[k]
    with pytest.raises(StoreCorruptError, match=_document_pattern(file.name, k, k)):
        TokenStore.open(many_short).document_bounds(0, np.array([3, k]))


def test_a_located_batch_crcs_only_its_documents_bytes_and_refuses_a_changed_offsets_entry_naming_the_document(
        many_short, monkeypatch):
    """The format-4 side of the batch test above: no offsets block is read, each document's own bytes are."""
    from impl.fill import TokenSource

    lengths = _lengths_of(many_short)
    d = _entry_between(lengths, 9_000, False, False)
    clean = TokenStore.open(many_short)
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    _, lo, length = TokenSource.from_store(TokenStore.open(many_short)).locate(np.array([5, d]))
    assert counting.sizes == [2 * int(lengths[5]), 2 * int(lengths[d])]
    assert lo.tolist() == [int(clean.doc_offsets[e]) for e in (5, d)] and length.tolist() == lengths[[5, d]].tolist()
    file = many_short / "tokens-00000.arrow"
    _add_to_offset(file, d + 1, 1)  # the end of document d: an entry the locate above used
    fresh = TokenSource.from_store(TokenStore.open(many_short))
    assert fresh.locate(np.array([5]))[2].tolist() == [int(lengths[5])]
    with pytest.raises(StoreCorruptError, match=_document_pattern(file.name, d, d)):
        fresh.locate(np.array([d]))


@pytest.mark.parametrize(("change", "split"), [("token byte", None), ("offsets entry", None),
                                               ("token byte", "train[10%:95%]")],
                         ids=["token byte", "offsets entry", "token byte, a split of the store"])
def test_a_loader_under_a_global_shuffle_refuses_a_changed_document_before_serving_any_of_its_tokens_naming_it(
        four, tmp_path, change, split):
    """Format 4: the fill copies only documents whose CRC passed; a changed one is named with documents.crc32.

    The plan is computed (and cached) before the change: computing it reads
    every length, whose offsets are checked by block. A split reads through
    its store's bounds, so it checks tokens the same way (it reads its
    store's whole offsets when it is made, checked by block, so a changed
    entry is refused there).
    """
    from impl.dataset import PackedDataset

    def dataset() -> PackedDataset:
        return PackedDataset(TokenStore.open(four), seq_len=64, packing="concat", shuffle="global", seed=3,
                             cache_dir=tmp_path, split=split)

    dataset().plan(0)
    clean = TokenStore.open(four)
    starts = clean.file_document_starts
    if change == "token byte":
        f, (at, token) = 2, _middle_value_byte(four / "tokens-00002.arrow")
        _flip(four / "tokens-00002.arrow", at)
        changed = {_doc_holding(clean, 2, token)}
    else:
        f = 1
        _add_to_offset(four / "tokens-00001.arrow", 60, 1)  # the end of its document 59, the start of 60
        changed = {starts[1] + 59, starts[1] + 60}
    name = clean.file_records[f].name
    ds = dataset()
    assert ds.store.document_checks
    base_row = ds.store.rows.start if split else 0
    assert all(base_row <= d < base_row + ds.store.num_documents for d in changed)
    with pytest.raises(StoreCorruptError) as refused:
        for first in range(0, len(ds), 8):
            rows = ds.samples(0, range(first, min(first + 8, len(ds))))["doc_ids"].ravel()
            served = {d for d in rows.tolist() if d >= 0}   # store indices, under a split too (SPLIT-9)
            assert not served & changed, f"a token of the changed document(s) {changed & served} was served"
    assert any(re.search(_document_pattern(name, d - starts[f], d), str(refused.value)) for d in changed), \
        str(refused.value)


def test_a_changed_entry_of_the_document_table_refuses_its_document_on_read_and_verify_names_the_table(four):
    starts = TokenStore.open(four).file_document_starts
    g = starts[1] + 7
    _flip(four / "documents.crc32", 4 * g + 1)
    store = TokenStore.open(four)
    for _ in range(2):
        with pytest.raises(StoreCorruptError, match=_document_pattern("tokens-00001.arrow", 7, g)):
            store.document_bounds_batch(np.array([0, 1]), np.array([6, 7]))
    store.document_bounds_batch(np.array([1, 1]), np.array([6, 8]))  # its neighbours' entries are intact
    with pytest.raises(StoreCorruptError, match=r"documents\.crc32 changed since it was built \(sha256 [0-9a-f]{16}"
                                                r"\.\.\., recorded [0-9a-f]{16}\.\.\.\): the document checks cannot be "
                                                r"trusted; rebuild it with"):
        TokenStore.open(four).verify()


def test_verify_recomputes_every_document_even_when_the_document_table_and_its_recorded_sha256_were_edited_together(
        four):
    starts = TokenStore.open(four).file_document_starts
    g = starts[3] + 11
    table = four / "documents.crc32"
    data = bytearray(table.read_bytes())
    data[4 * g + 3] ^= 0x01
    table.write_bytes(bytes(data))
    meta = json.loads((four / "meta.json").read_text())
    meta["layout"]["document_table"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (four / "meta.json").write_text(json.dumps(meta))
    store = TokenStore.open(four)
    store.document_bounds_batch(np.array([3]), np.array([10]))  # not refused: only its own document is read
    with pytest.raises(StoreCorruptError, match=_document_pattern("tokens-00003.arrow", 11, g)):
        store.verify()
    with pytest.raises(StoreCorruptError, match=_document_pattern("tokens-00003.arrow", 11, g)):
        TokenStore.open(four, verify=True)


@pytest.mark.parametrize("edit", [
    pytest.param(lambda layout: layout.pop("document_table"), id="missing"),
    pytest.param(lambda layout: layout.__setitem__("document_table", "documents.crc32"), id="not-a-record"),
    pytest.param(lambda layout: layout["document_table"].__setitem__("name", "blocks.crc32"), id="another-name"),
    pytest.param(lambda layout: layout["document_table"].__setitem__("size", True), id="size-a-bool"),
    pytest.param(lambda layout: layout["document_table"].pop("sha256"), id="no-sha256"),
])
def test_a_malformed_document_table_record_in_meta_json_is_refused_at_open(four, edit):
    meta = json.loads((four / "meta.json").read_text())
    edit(meta["layout"])
    (four / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreCorruptError, match=r"meta\.json: invalid layout\.document_table .*rebuild it with"):
        TokenStore.open(four)


def test_a_wrong_document_table_size_in_meta_json_is_refused_at_open_naming_the_documents(four):
    meta = json.loads((four / "meta.json").read_text())
    meta["layout"]["document_table"]["size"] -= 4
    (four / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreCorruptError, match=r"layout\.document_table records 1916 bytes, but the store's 480 "
                                                r"documents need 1920; rebuild it with"):
        TokenStore.open(four)


def _bounds_of(store: TokenStore, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``document_bounds_batch`` of store documents ``docs``: their files and file-local indices computed here."""
    starts = np.asarray(store.file_document_starts)
    files = np.searchsorted(starts, docs, side="right") - 1
    return store.document_bounds_batch(files, docs - starts[files])


@pytest.mark.parametrize(("store_dir", "count"), [("four", 6), ("many_short", 72), ("many_short", 120)],
                         ids=["a few across files (one by one)", "many scattered in one file (numpy)",
                              "more scattered than the file has offsets blocks (94)"])
def test_a_random_first_read_crcs_exactly_its_documents_bytes_once_per_store_object_and_again_when_reopened(
        request, monkeypatch, store_dir, count):
    path = request.getfixturevalue(store_dir)
    lengths = _lengths_of(path)
    item = TokenStore.open(path).dtype.itemsize
    rng = np.random.default_rng(4)
    first, other = (rng.choice(len(lengths), count, replace=False) for _ in range(2))
    second = rng.permutation(np.setdiff1d(other, first))[:count - count // 3]  # with a third of first: count again
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)

    def crcd(store: TokenStore, docs: np.ndarray) -> list[int]:
        counting.sizes.clear()
        _bounds_of(store, docs)
        return sorted(counting.sizes)

    def bytes_of(docs: np.ndarray) -> list[int]:
        return sorted((lengths[docs] * item).tolist())

    store = TokenStore.open(path)
    assert crcd(store, first) == bytes_of(first)
    assert crcd(store, np.concatenate((first[: count // 3], second))) == bytes_of(second), "once per store object"
    assert crcd(store, first) == []
    for other in (TokenStore.open(path), pickle.loads(pickle.dumps(store))):
        assert crcd(other, first) == bytes_of(first), "a reopened or unpickled store checks again"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_document_checked_in_a_forked_worker_is_checked_again_by_the_parent(four, monkeypatch):
    """The verified bytes are private memory: a DataLoader worker forked from the training process checks its own."""
    store = TokenStore.open(four)
    store._map(0)  # mapped before the fork, as a DataLoader's forked workers inherit it
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    pid = os.fork()
    if pid == 0:  # the worker: checks document 3 of file 0 and reports whether it counts as verified there
        try:
            store.document_bounds_batch(np.array([0]), np.array([3]))
            os._exit(0 if counting.calls == 1 and store._blocks[0].documents_verified[3] else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked worker did not check the document"
    assert store._blocks[0].documents_verified[3] == 0 and counting.calls == 0
    store.document_bounds_batch(np.array([0]), np.array([3]))
    assert counting.calls == 1, "the parent trusted a check made in another process"


def test_a_shuffled_batch_crcs_exactly_the_bytes_of_the_documents_it_serves(many_short, tmp_path, monkeypatch):
    from impl.dataset import PackedDataset

    def dataset() -> PackedDataset:
        return PackedDataset(TokenStore.open(many_short), seq_len=64, packing="concat", shuffle="global", seed=3,
                             cache_dir=tmp_path)

    dataset().plan(0)  # the plan reads every length (offsets checked by block): cached, as a resumed job finds it
    lengths = _lengths_of(many_short)
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    ds = dataset()
    served: set[int] = set()
    for rows in ([0, 1, 2, 3], [len(ds) // 2, 7, 3], [len(ds) - 1]):
        counting.sizes.clear()
        docs = set(ds.samples(0, rows)["doc_ids"].ravel().tolist()) - {-1}
        new = np.array(sorted(docs - served), dtype=np.int64)
        assert sorted(counting.sizes) == sorted((2 * lengths[new]).tolist()), rows
        served |= docs
    assert len(served) > 8


def test_documents_read_in_file_order_keep_the_block_checks_and_read_ahead_and_a_changed_byte_is_refused_by_block(
        large, monkeypatch):
    """Dense documents (their offsets in few blocks) are checked by block, reading ahead, not by document CRCs."""
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    store = TokenStore.open(large)
    half = store.num_documents // 2
    for k in range(0, half, 10):
        store.document_bounds(0, np.arange(k, k + 10))
    blocks = store._blocks[0]
    assert blocks is not None and not any(blocks.documents_verified)
    assert set(counting.sizes) <= {store_module.BLOCK_BYTES, blocks.size % store_module.BLOCK_BYTES}
    last = (blocks.base + 2 * int(store.doc_offsets[half]) - 1) // blocks.block
    assert blocks.verified_np[last + 1:last + 1 + blocks.read_ahead // 2].all(), "no read-ahead past the documents"
    path = large / "tokens-00000.arrow"
    at, token = _middle_value_byte(path)
    _flip(path, at)
    fresh = TokenStore.open(large)
    bad = _doc_holding(fresh, 0, token)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, store_module.BLOCK_BYTES)):
        for k in range(0, fresh.num_documents, 10):
            fresh.document_bounds(0, np.arange(k, min(k + 10, fresh.num_documents)))
            assert k + 10 <= bad, "the bounds of the changed document were returned"


@pytest.mark.parametrize(("vocab", "dtype"), [(50_000, np.uint16), (100_000, np.uint32)], ids=["uint16", "uint32"])
def test_documents_crc32_holds_the_crc_of_each_documents_token_bytes_as_pyarrow_finds_them_empty_ones_included(
        tmp_path, vocab, dtype):
    rng = np.random.default_rng(9)
    files = [[rng.integers(0, vocab, size=int(rng.integers(0, 40)) * bool(j % 5)).tolist() for j in range(31)]
             for _ in range(3)]
    files[1][-1] = []
    store = TokenStore.from_token_files(files, tmp_path / "store", vocab_size=vocab)
    assert store.dtype == dtype
    oracle: list[int] = []
    for rec in store.file_records:
        path = store.path / rec.name
        with pa.memory_map(str(path), "r") as mm:
            col = pa.ipc.open_file(mm).get_batch(0).column(0)
            item = col.type.value_type.bit_width // 8
            values = col.values.buffers()[1].to_pybytes()
            offsets = col.offsets.to_numpy()
        crcs = [zlib.crc32(values[a * item:b * item]) for a, b in itertools.pairwise(offsets.tolist())]
        assert store_module.hash_documents(path, _layout(path)[0], offsets, item) == \
            b"".join(c.to_bytes(4, "big") for c in crcs).hex()
        oracle += crcs
    table = np.frombuffer((store.path / "documents.crc32").read_bytes(), dtype=">u4").tolist()
    assert table == oracle and len(table) == 93
    empty = [c for c, n in zip(table, store.lengths.tolist()) if n == 0]
    assert len(empty) >= 20 and set(empty) == {0}, "an empty document's CRC is 0"


def test_a_format_3_store_opens_reads_the_same_tokens_has_no_document_checks_and_its_fill_refuses_a_changed_block(
        four):
    from impl.fill import TokenSource

    expected = [d.tolist() for d in TokenStore.open(four)]
    bounds = [b.tolist() for b in _bounds_of(TokenStore.open(four), np.arange(0, 480, 7))]
    _as_format_3(four)
    assert not (four / "documents.crc32").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = TokenStore.open(four, verify=True)
        assert store.format_version == 3 and not store.document_checks
        assert [store[d].tolist() for d in range(len(store))] == expected
        assert [b.tolist() for b in _bounds_of(store, np.arange(0, 480, 7))] == bounds
    path = four / "tokens-00002.arrow"
    at, token = _middle_value_byte(path)
    _flip(path, at)
    source = TokenSource.from_store(TokenStore.open(four))
    bad = _doc_holding(store, 2, token)
    files, starts, lengths = source.locate(np.array([3, bad]))  # its offsets are intact: located
    out = np.zeros(int(lengths.sum()), dtype=np.int64)
    with pytest.raises(StoreCorruptError, match=_block_pattern(path, at, SMALL_BLOCK)):
        source.gather(out, files, starts, starts + lengths, np.array([0, int(lengths[0])]))


def test_a_file_whose_blocks_are_all_verified_gives_its_documents_bounds_without_a_document_crc(four, monkeypatch):
    store = TokenStore.open(four)
    list(store)  # every block of every file verified
    counting = _CountingCrc()
    monkeypatch.setattr(integrity_module, "crc32", counting)
    _bounds_of(store, np.array([3, 200, 450]))
    assert counting.calls == 0 and not any(store._blocks[0].documents_verified)
