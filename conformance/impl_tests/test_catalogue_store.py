"""Catalogue of bad token stores: each is refused with a typed error naming the problem and the fix.

Why a catalogue: the reader of a store meets whatever a disk, a copy or a
person did to it. One row per bad input keeps the whole list in view; each
asserts the exception type, a phrase naming the problem (with the file or
value where there is one) and a phrase naming the fix.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from impl import build_files as build_module
from impl.errors import StoreCorruptError, StoreError, StoreNotFoundError, StoreVersionError
from impl.store import FORMAT_VERSION, QUICK_SIGNATURE_BYTES, TokenStore

REBUILD = r"rebuild it with `TokenStore\.build\(source, tokenizer, out_dir, overwrite=True\)`"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """A bad input: ``damage(store_dir)`` makes it, ``use(store_dir)`` meets it."""

    id: str
    damage: Callable[[Path], Any]
    use: Callable[[Path], Any]
    error: type[Exception]
    problem: str
    fix: str = REBUILD


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def _edit_meta(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        meta = json.loads((root / "meta.json").read_text())
        change(meta)
        (root / "meta.json").write_text(json.dumps(meta))
    return damage


def _set(key: str, value: Any) -> Callable[[Path], None]:
    return _edit_meta(lambda meta: meta.__setitem__(key, value))


def _middle_byte(root: Path) -> None:
    path = root / "tokens-00001.arrow"
    _flip(path, path.stat().st_size // 2)


def _offsets_byte(root: Path) -> None:
    """A byte of document 9,000's offset in the many-documents store: past the first 64 KiB window."""
    path = root / "tokens-00000.arrow"
    with pa.memory_map(str(path), "r") as mm:
        col = pa.ipc.open_file(mm).get_batch(0).column(0)
        mm.seek(0)
        at = col.buffers()[1].address - mm.read_buffer(path.stat().st_size).address + 8 * 9_000
    assert at > QUICK_SIGNATURE_BYTES
    _flip(path, at)


def _truncate(root: Path) -> None:
    path = root / "tokens-00001.arrow"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)


def _extend(root: Path) -> None:
    with open(root / "tokens-00001.arrow", "ab") as f:
        f.write(b"\0\0\0")


def _closed(root: Path) -> Any:
    store = TokenStore.open(root)
    store.close()
    return store


def _read_all(root: Path) -> None:
    store = TokenStore.open(root)
    store.gather(np.arange(len(store)))


def _lengths(root: Path) -> None:
    _ = TokenStore.open(root).lengths


def _open(root: Path) -> None:
    TokenStore.open(root)


def _verify(root: Path) -> None:
    TokenStore.open(root).verify()


def _format_2(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """The store rewritten as format 2 recorded it (block CRCs as hex in each record, no table), then ``change``d."""
    def damage(root: Path) -> None:
        meta = json.loads((root / "meta.json").read_text())
        table, at = (root / "blocks.crc32").read_bytes(), 0
        for record in meta["files"]:
            n = -(-record["size"] // meta["layout"]["block_bytes"])
            record["block_crc32"], at = table[4 * at:4 * (at + n)].hex(), at + n
        del meta["layout"]["block_table"]
        meta["format_version"] = 2
        (root / "blocks.crc32").unlink()
        change(meta)
        (root / "meta.json").write_text(json.dumps(meta))
    return damage


def _drop_block_crcs(meta: dict[str, Any]) -> None:
    del meta["files"][0]["block_crc32"]


def _garble_block_crcs(meta: dict[str, Any]) -> None:
    record = meta["files"][0]
    record["block_crc32"] = "zz" + record["block_crc32"][2:]


def _truncate_table(name: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        table = root / name
        table.write_bytes(table.read_bytes()[:-4])
    return damage


def _edit_table(root: Path) -> None:
    _flip(root / "blocks.crc32", 1)


def _read_each_document_alone(root: Path) -> None:
    """Every document's bounds asked for one at a time, in a shuffled order: format 4 CRCs each document."""
    store = TokenStore.open(root)
    starts = np.asarray(store.file_document_starts)
    for d in np.random.default_rng(5).permutation(len(store)).tolist():
        f = int(np.searchsorted(starts, d, side="right")) - 1
        store.document_bounds_batch(np.array([f]), np.array([d - starts[f]]))


_CHANGED_DOCUMENT = (r"changed since it was built: its document \d+ \(document \d+ of the store; tokens \d+-\d+, bytes "
                     r"\d+-\d+ of \d+, as its offsets now say\) has CRC-32 [0-9a-f]{8}, [0-9a-f]{8} when built "
                     r"\(documents\.crc32\), so none of its tokens is served")


def _name_outside(meta: dict[str, Any]) -> None:
    meta["files"][0]["name"] = "../tokens-00000.arrow"


CASES = [
    Case(id="corrupted middle byte", damage=_middle_byte, use=_read_all, error=StoreCorruptError,
         problem=r"tokens-00001\.arrow changed since it was built: block \d+ \(bytes \d+-\d+ of \d+\)"),
    Case(id="corrupted document offsets", damage=_offsets_byte, use=_lengths, error=StoreCorruptError,
         problem=r"tokens-00000\.arrow changed since it was built: block \d+"),
    Case(id="truncated file", damage=_truncate, use=_open, error=StoreCorruptError,
         problem=r"tokens-00001\.arrow is truncated \(\d+ bytes, \d+ when built\)"),
    Case(id="extra bytes", damage=_extend, use=_open, error=StoreCorruptError,
         problem=r"tokens-00001\.arrow changed since it was built \(\d+ bytes, \d+ when built\)"),
    Case(id="missing file", damage=lambda root: (root / "tokens-00002.arrow").unlink(), use=_open,
         error=StoreCorruptError, problem=r"tokens-00002\.arrow is missing"),
    Case(id="meta.json not JSON", damage=lambda root: (root / "meta.json").write_text('{"format": "loadspec'),
         use=_open, error=StoreCorruptError, problem=r"meta\.json is not valid JSON"),
    Case(id="meta.json of another format", damage=_set("format", "someone.else"), use=_open, error=StoreCorruptError,
         problem=r"format is 'someone\.else', not 'loadspec\.tokenstore'"),
    Case(id="newer format version", damage=_set("format_version", FORMAT_VERSION + 1), use=_open,
         error=StoreVersionError, problem=rf"format version {FORMAT_VERSION + 1} is newer",
         fix=r"upgrade loadspec, or " + REBUILD),
    Case(id="unknown format version", damage=_set("format_version", 0), use=_open, error=StoreVersionError,
         problem=r"format version 0 is unknown \(this loadspec reads versions 1, 2"),
    Case(id="format version not an integer", damage=_set("format_version", "2"), use=_open,
         error=StoreVersionError, problem=r"format_version '2' is not an integer"),
    Case(id="negative document count", damage=_set("num_documents", -1), use=_open, error=StoreCorruptError,
         problem=r"invalid num_documents -1"),
    Case(id="totals disagree with the files", damage=_set("num_tokens", 7), use=_open, error=StoreCorruptError,
         problem=r"per-file counts \(\d+ documents, \d+ tokens\) disagree with the totals"),
    Case(id="record naming a file outside the store", damage=_edit_meta(_name_outside), use=_open,
         error=StoreCorruptError, problem=r"file \.\./tokens-00000\.arrow: invalid file name in meta\.json"),
    Case(id="block checksums missing from a format-2 record", damage=_format_2(_drop_block_crcs), use=_open,
         error=StoreCorruptError, problem=r"tokens-00000\.arrow: meta\.json records none, expected \d+"),
    Case(id="block checksums of a format-2 record not hexadecimal", damage=_format_2(_garble_block_crcs),
         use=_read_all, error=StoreCorruptError,
         problem=r"tokens-00000\.arrow: its block_crc32 in meta\.json is not hexadecimal"),
    Case(id="block table missing", damage=lambda root: (root / "blocks.crc32").unlink(), use=_open,
         error=StoreCorruptError, problem=r"blocks\.crc32 is missing"),
    Case(id="block table truncated", damage=_truncate_table("blocks.crc32"), use=_open, error=StoreCorruptError,
         problem=r"blocks\.crc32 is truncated \(\d+ bytes, \d+ when built\)"),
    Case(id="block table edited", damage=_edit_table, use=_verify, error=StoreCorruptError,
         problem=r"blocks\.crc32 changed since it was built \(sha256 [0-9a-f]{16}\.\.\., recorded"),
    Case(id="block table size in meta.json wrong", damage=_edit_meta(lambda m: m["layout"]["block_table"].update(
        size=8)), use=_open, error=StoreCorruptError,
         problem=r"layout\.block_table records 8 bytes, but the store's \d+ blocks of 4096 bytes need \d+"),
    Case(id="corrupted document", damage=_middle_byte, use=_read_each_document_alone, error=StoreCorruptError,
         problem=r"tokens-00001\.arrow " + _CHANGED_DOCUMENT, fix=r"restore the file from a good copy or " + REBUILD),
    Case(id="document table entry edited", damage=lambda root: _flip(root / "documents.crc32", 1),
         use=_read_each_document_alone, error=StoreCorruptError, problem=r"tokens-00000\.arrow " + _CHANGED_DOCUMENT),
    Case(id="document table edited", damage=lambda root: _flip(root / "documents.crc32", 1), use=_verify,
         error=StoreCorruptError,
         problem=r"documents\.crc32 changed since it was built \(sha256 [0-9a-f]{16}\.\.\., recorded"),
    Case(id="document table missing", damage=lambda root: (root / "documents.crc32").unlink(), use=_open,
         error=StoreCorruptError, problem=r"documents\.crc32 is missing"),
    Case(id="document table truncated", damage=_truncate_table("documents.crc32"), use=_open, error=StoreCorruptError,
         problem=r"documents\.crc32 is truncated \(\d+ bytes, \d+ when built\)"),
    Case(id="document table in meta.json not a record", damage=_edit_meta(
        lambda m: m["layout"].__setitem__("document_table", "documents.crc32")), use=_open, error=StoreCorruptError,
         problem=r"invalid layout\.document_table 'documents\.crc32'"),
    Case(id="document table size in meta.json wrong", damage=_edit_meta(
        lambda m: m["layout"]["document_table"].update(size=8)), use=_open, error=StoreCorruptError,
         problem=r"layout\.document_table records 8 bytes, but the store's 600 documents need 2400"),
    Case(id="block size missing", damage=_edit_meta(lambda meta: meta["layout"].pop("block_bytes")), use=_open,
         error=StoreCorruptError, problem=r"invalid layout\.block_bytes None"),
    Case(id="fingerprint edited", damage=_set("fingerprint", "f" * 64), use=_verify, error=StoreCorruptError,
         problem=r"meta\.json fingerprint ffffffffffffffff\.\.\. does not match the one recomputed"),
    Case(id="store used after close", damage=lambda root: None, use=lambda root: _closed(root)[0],
         error=StoreError, problem=r"token store .* is closed", fix=r"open it again with TokenStore\.open\("),
    Case(id="a file path instead of the store directory", damage=lambda root: None,
         use=lambda root: TokenStore.open(root / "meta.json"), error=StoreNotFoundError,
         problem=r"meta\.json is a file, not a token store directory", fix=r"pass the store's directory"),
    Case(id="non-existent path", damage=lambda root: shutil.rmtree(root), use=_open, error=StoreNotFoundError,
         problem=r"no token store at .*: the directory does not exist", fix=r"build it with TokenStore\.build\("),
    Case(id="directory without meta.json", damage=lambda root: (root / "meta.json").unlink(), use=_open,
         error=StoreNotFoundError, problem=r"has no meta\.json: it is not a token store",
         fix=r"build it with TokenStore\.build\("),
]

MANY_DOCUMENT_CASES = {"corrupted document offsets"}


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A 4-file store of ~200 KB files and a 1-file store of 12k short documents (offsets past 64 KiB)."""
    rng = np.random.default_rng(7)
    four = [[rng.integers(0, 1000, size=int(rng.integers(200, 1500))).tolist() for _ in range(150)]
            for _ in range(4)]
    many = [[rng.integers(0, 1000, size=int(rng.integers(1, 20))).tolist() for _ in range(12_000)]]
    root = tmp_path_factory.mktemp("catalogue")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build_module, "BLOCK_BYTES", 4096)
        return {"four": TokenStore.from_token_files(four, root / "four", vocab_size=1000).path,
                "many": TokenStore.from_token_files(many, root / "many", vocab_size=1000).path}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_store_is_refused_with_a_typed_error_naming_the_problem_and_the_fix(case, stores, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(stores["many" if case.id in MANY_DOCUMENT_CASES else "four"], root)
    case.damage(root)
    with pytest.raises(case.error) as info:
        case.use(root)
    message = str(info.value)
    assert re.search(case.problem, message), f"problem not named: {message}"
    assert re.search(case.fix, message), f"fix not named: {message}"

