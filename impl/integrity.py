"""Integrity: the one component that answers "verified" before any reader sees a token file's bytes.

Why a component of its own: the rule "no token value or document boundary
is served before its bytes are checked" holds only if every reader goes
through one owner of the checks. :mod:`impl.store_files` maps a file and
hands this component the mapped bytes and the recorded tables
(:class:`FileChecks`); every read the store serves, and every run it copies
(``TokenStore.read_runs``), first asks here.

What it checks: each 16 KiB block of a file against its recorded CRC-32
(formats 2 to 4) and each document's tokens against its own CRC-32 (format
4), each once per store object, remembered in a per-file bitmap. A changed
block or document raises :class:`~impl.errors.StoreCorruptError` naming the
store, the file, the bytes and the fix. Format 1 carries no checksums.

Worked example (a store object's first read of document 3 of file 0)::

    checks.document_bounds(0, np.array([3]))   # (array([9]), array([4])): offsets blocks (or the document) CRC'd first
    checks.check_blocks(0, np.array([9]), np.array([13]))   # the value blocks of tokens 9..12, CRC'd once
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from impl._arrays import distinct, distinct_ints
from impl._crc import crc32
from impl.errors import REBUILD_HINT, StoreCorruptError
from impl.file_checks import FileChecks
from impl.readable import Readable
from impl.store_format import DOCUMENT_TABLE, META_FILE, OFFSET_BYTES, FileRecord

__all__ = ["FileChecks", "Integrity"]

#: Up to this many ranges, block checks loop in Python over ``bytearray.find`` (numpy's per-call cost is more).
_SMALL = 64
#: A first read continuing a sequential streak of at least ``_READ_AHEAD_AFTER`` bytes (a reader in file order)
#: also verifies as many blocks past it as the streak holds, up to ``READ_AHEAD_BYTES``, so the next batches find
#: them verified and pay one ``find`` each (``TokenStore._first_read``).
_READ_AHEAD_AFTER = 64 * 1024

class Integrity:
    """A store's checks over its mapped files: block and document CRCs, verified once each per store object.

    ``records`` are the store's file records, ``file_doc_starts`` each
    file's first document (and the total), ``where(name)`` how messages name
    a file; ``mapped`` is the store's list of mapped ``(values, offsets)``
    per file (None until mapped) and ``map(f)`` maps file ``f`` on demand,
    registering its :class:`FileChecks` in ``files`` (a bound method of the
    store, held weakly so that a dropped store is freed, and its files
    unmapped, at once); ``require_open()`` refuses a closed store.
    ``all_verified`` says every file's every byte readers use is verified
    (then a batch's check is one attribute test). ``readable``
    (:mod:`impl.readable`, format 4) holds what each verified document lets
    a reader copy unchecked: a batch's runs are tested against it in one
    numpy pass.
    """

    def __init__(self, records: list[FileRecord], file_doc_starts: list[int], where: Callable[[str], str],
                 mapped: list[tuple[np.ndarray, np.ndarray] | None],
                 map_file: Callable[[int], tuple[np.ndarray, np.ndarray]], require_open: Callable[[], None],
                 refused: Callable[[str], str] | None = None) -> None:
        #: Given a file a check refused, what to do about it (a remote access drops its cached copy and says so).
        self.refused = refused
        self.records = records
        self.file_doc_starts = file_doc_starts
        self.where = where
        self.mapped = mapped
        self.files: list[FileChecks | None] = [None] * len(records)
        self.all_verified = False
        self.readable = Readable(file_doc_starts)
        self._map_file = weakref.WeakMethod(map_file)
        self._require_open = weakref.WeakMethod(require_open)

    def map(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """File ``f``'s mapped ``(values, offsets)`` (its offsets not checked: readers use :meth:`document_bounds`)."""
        got = self.mapped[f]
        if got is None:
            got = self._map_file()(f)  # type: ignore[misc]
        return got

    def require_open(self) -> None:
        self._require_open()()  # type: ignore[misc]

    def forget(self) -> None:
        """The store closed or reset: no file is tracked (and none counts as verified)."""
        self.files[:] = [None] * len(self.files)
        self.all_verified = False
        self.readable.forget()


    def _recorded_crc(self, rec: FileRecord, blocks: FileChecks, b: int) -> int:
        """Block ``b``'s CRC-32 as recorded: from the block table (format 3), else its 8 hex digits parsed now."""
        if blocks.recorded is not None:
            return int(blocks.recorded.item(b))
        try:
            raw = bytes.fromhex(blocks.hex[8 * b:8 * b + 8])
        except ValueError:
            raw = b""
        if len(raw) != 4:
            raise StoreCorruptError(
                f"{self.where(rec.name)}: its block_crc32 in {META_FILE} is not hexadecimal; {REBUILD_HINT}"
            )
        return int.from_bytes(raw, "big")

    def check_all_offsets(self, f: int, blocks: FileChecks, offsets: np.ndarray) -> None:
        """Verify every block holding file ``f``'s offsets, then its end offsets (before any whole-file use)."""
        rec = self.records[f]
        first, last = blocks.offsets_blocks
        if last >= first:
            self.verify_span(rec, blocks, first, last)
        if int(offsets[0]) != 0 or int(offsets[-1]) != rec.num_tokens:
            raise StoreCorruptError(
                f"{self.where(rec.name)}: document offsets do not match the {rec.num_tokens} tokens recorded; "
                f"{REBUILD_HINT}"
            )
        blocks.offsets_done = True

    def _offsets_read(self, f: int, blocks: FileChecks, offsets: np.ndarray) -> None:
        """After offsets blocks were verified: once all of the file's are, its offsets are read unchecked.

        Why: a global shuffle's batches verify every file's offsets blocks
        within the first few hundred batches, and from then on each
        document's bounds skip the per-entry test.
        """
        first, last = blocks.offsets_blocks
        if blocks.verified.find(0, first, last + 1) < 0:
            self.check_all_offsets(f, blocks, offsets)

    def document_bounds(self, file: int, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` (file-local tokens, int64) of file-local documents ``docs`` of ``file``.

        Reads only the offsets entries ``docs`` and ``docs + 1``, after the
        blocks holding them passed their CRC (format 2), so a batch's first
        read of a file checks a few small blocks, not the file's whole
        offsets region. A bound outside the file's tokens is refused as
        corrupt (an edited ``meta.json`` layout cannot yield wrong tokens).
        Format 4 also checks each returned document's tokens before
        returning (:attr:`document_checks`): documents spread over more than
        twice their count of ids (a shuffle) each by its own CRC-32, which
        covers its offsets entries too; documents closer together (file
        order) by the blocks of their offsets and of their tokens, read ahead.

        >>> store.document_bounds(0, np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        self.require_open()
        f = operator.index(file)
        if not 0 <= f < len(self.records):
            raise IndexError(f"file {file} out of range for a store of {len(self.records)} files")
        rec = self.records[f]
        local = np.asarray(docs, dtype=np.int64).reshape(-1)
        first_doc = last_doc = 0
        if local.size:
            if local.size <= _SMALL:  # Python's min/max beat numpy's call overhead on a batch's few documents
                listed = local.tolist()
                first_doc, last_doc = min(listed), max(listed)
            else:
                first_doc, last_doc = int(local.min()), int(local.max())
            if first_doc < 0 or last_doc >= rec.num_documents:
                raise IndexError(f"document out of range for file {f} of {rec.num_documents} documents")
        offsets = self.map(f)[1]
        blocks = self.files[f]
        check_offsets = check_tokens = by_document = False
        if blocks is not None and local.size:
            check_offsets = not blocks.offsets_done
            check_tokens = blocks.documents is not None and not blocks.complete
        if blocks is not None and (check_offsets or check_tokens):
            at0, block = blocks.offsets_at, blocks.block
            lo, hi = (at0 + first_doc * OFFSET_BYTES) // block, (at0 + (last_doc + 2) * OFFSET_BYTES - 1) // block
            dense = hi - lo <= local.size   # offsets entries close together: their blocks, in spans
            by_document = check_tokens and last_doc - first_doc + 1 > 2 * local.size  # not file order
        if blocks is not None and check_offsets and not by_document:
            if dense:
                self.verify_span(rec, blocks, lo, hi)
            elif local.size <= _SMALL:
                for d in local.tolist():
                    at = at0 + d * OFFSET_BYTES
                    self.verify_span(rec, blocks, at // block, (at + 2 * OFFSET_BYTES - 1) // block)
            else:
                at_np = at0 + local * OFFSET_BYTES
                wanted = np.concatenate((at_np // block, (at_np + 2 * OFFSET_BYTES - 1) // block))
                self._verify_blocks(rec, blocks, wanted[~blocks.verified_np[wanted]].tolist())
            self._offsets_read(f, blocks, offsets)
        starts = offsets[local]
        stops = offsets[local + 1]
        if local.size and not bool(((starts >= 0) & (starts <= stops) & (stops <= rec.num_tokens)).all()):
            raise StoreCorruptError(
                f"{self.where(rec.name)}: document offsets out of order or past its {rec.num_tokens} tokens; "
                f"{REBUILD_HINT}"
            )
        if blocks is not None and by_document:
            self.verify_documents([(f, d, a, b) for d, a, b in zip(local.tolist(), starts.tolist(), stops.tolist())])
        elif blocks is not None and check_tokens:  # dense: offsets checked above; skip when their span is verified
            item, block = blocks.itemsize, blocks.block
            first = (blocks.base + offsets.item(first_doc) * item) // block
            if blocks.verified.find(0, first, (blocks.base + offsets.item(last_doc + 1) * item - 1) // block + 1) >= 0:
                self.check_blocks(f, starts, stops)
            if blocks.readable is not None:   # offsets and tokens verified: runs inside them need no check
                blocks.readable[local, 0] = starts   # the starts first: a row (start, 0) admits no run
                blocks.readable[local, 1] = stops
        return starts.astype(np.int64, copy=False), stops - starts

    def document_bounds_batch(self, files: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`document_bounds` of many files at once: ``(start, length)`` of document ``docs[i]`` of ``files[i]``.

        Why: a fresh resume's first batch names a few dozen documents in a
        dozen files; one Python pass pays per document once, where a numpy
        pipeline per file pays its fixed cost per file. Many documents, or
        many per file (file order), go through :meth:`document_bounds`.

        >>> store.document_bounds_batch(np.array([0, 2]), np.array([3, 0]))      # doctest: +SKIP
        (array([9, 0]), array([4, 3]))
        """
        self.require_open()
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        dl = np.asarray(docs, dtype=np.int64).reshape(-1)
        if fl.shape != dl.shape:
            raise ValueError(f"files and docs differ in length ({fl.size} and {dl.size})")
        touched = distinct(fl) if fl.size > 8 else None
        if touched is not None and (fl.size > _SMALL or fl.size >= 8 * len(touched)):
            if len(touched) == 1:  # many documents of one file (file order): one numpy pass
                return self.document_bounds(int(touched[0]), dl)
            starts = np.empty(fl.size, dtype=np.int64)
            lengths = np.empty(fl.size, dtype=np.int64)
            for f in touched.tolist():
                mine = fl == f
                starts[mine], lengths[mine] = self.document_bounds(f, dl[mine])
            return starts, lengths
        out_start: list[int] = []
        out_length: list[int] = []
        records, blocks_of, mapped = self.records, self.files, self.mapped
        pending: list[tuple[int, int, int, int]] = []
        for f, d in zip(fl.tolist(), dl.tolist()):
            if not 0 <= f < len(records):
                raise IndexError(f"file {f} out of range for a store of {len(records)} files")
            rec = records[f]
            if not 0 <= d < rec.num_documents:
                raise IndexError(f"document out of range for file {f} of {rec.num_documents} documents")
            offsets = (mapped[f] or self.map(f))[1]
            blocks = blocks_of[f]
            by_document = blocks is not None and blocks.documents is not None and not blocks.complete
            if blocks is not None and not blocks.offsets_done and not by_document:
                at = blocks.offsets_at + d * OFFSET_BYTES
                lo, hi = at // blocks.block, (at + 2 * OFFSET_BYTES - 1) // blocks.block
                if blocks.verified.find(0, lo, hi + 1) >= 0:
                    self.verify_span(rec, blocks, lo, hi)
                    self._offsets_read(f, blocks, offsets)
            a, b = offsets.item(d), offsets.item(d + 1)
            if not 0 <= a <= b <= rec.num_tokens:
                raise StoreCorruptError(
                    f"{self.where(rec.name)}: document offsets out of order or past its {rec.num_tokens} tokens; "
                    f"{REBUILD_HINT}"
                )
            if by_document and not blocks.documents_verified[d]:  # type: ignore[union-attr]
                pending.append((f, d, a, b))
            out_start.append(a)
            out_length.append(b - a)
        if pending:
            self.verify_documents(pending)
        return np.array(out_start, dtype=np.int64), np.array(out_length, dtype=np.int64)

    def verify_span(self, rec: FileRecord, blocks: FileChecks, lo: int, hi: int) -> None:
        """CRC the unverified blocks among ``lo..hi`` (once each per store object); refuse the first that changed.

        The one loop every check ends in: a block costs a ``find``, a slice,
        a CRC and an int compare (its recorded CRC read from the table as a
        Python int). Under the file's lock, so concurrent readers CRC each
        block once; a span already verified returns without taking it (a
        block is marked only after its CRC passed, so an unlocked ``find``
        that sees no unverified block is final).
        """
        verified = blocks.verified
        if verified.find(0, lo, hi + 1) < 0:
            return
        with blocks.lock:
            b = verified.find(0, lo, hi + 1)
            if b < 0:
                return
            data, block, recorded, left = blocks.data, blocks.block, blocks.recorded, blocks.left
            while b >= 0:
                at = b * block
                crc = crc32(data[at:at + block])
                want = recorded.item(b) if recorded is not None else self._recorded_crc(rec, blocks, b)
                if crc != want:
                    blocks.left = left
                    raise self._changed_block(rec, blocks, b, crc, want)
                verified[b] = 1
                left -= 1
                b = verified.find(0, b + 1, hi + 1)
            blocks.left = left
            if not left:
                self._file_verified(rec, blocks)

    def _verify_blocks(self, rec: FileRecord, blocks: FileChecks, todo: Iterable[int]) -> None:
        """:meth:`_verify_span` of each block of ``todo``, in order."""
        for b in sorted(set(todo)):
            self.verify_span(rec, blocks, b, b)

    def _changed_block(self, rec: FileRecord, blocks: FileChecks, b: int, crc: int, recorded: int) -> StoreCorruptError:
        """The refusal of a changed block: the store, the file, the block, its bytes, both CRCs and the fix."""
        at, size = b * blocks.block, blocks.size
        end = min(at + blocks.block, size)
        return StoreCorruptError(
            f"{self.where(rec.name)} changed since it was built: block {b} (bytes {at}-{end - 1} of {size}) has "
            f"CRC-32 {crc:08x}, {recorded:08x} when built, so none of its tokens is served; {self._fix(rec.name)}"
        )

    def verify_documents(self, pending: Sequence[tuple[int, int, int, int]]) -> None:
        """Format 4: CRC documents ``(file, document, first token, stop token)`` against their recorded CRC-32s.

        Why per document: under a global shuffle (or a fresh resume's first
        batch) each document of a batch lies in a block no reader has
        verified yet, so a block check CRCs 16 KiB, from cold memory, to serve
        one document, usually far smaller; the document's own CRC reads
        exactly the bytes served. Its token range comes from the offsets read
        unchecked: an offsets entry changed since the build moves the range
        of the two documents it bounds, whose CRCs then fail (barring a CRC
        collision), so a document that passes was read with its recorded
        bounds and tokens.

        Each document is CRC'd straight from the mapping: copying a batch's
        documents into one buffer first (``bytes.join``, whose C loop
        overlaps their cache misses) and CRC'ing them there costs as much
        under a global shuffle (benchmarks/README.md, "Design figures"). A
        file whose documents have all passed counts as verified whole (every
        token byte and offsets entry was checked), and its reads skip the
        checks.

        >>> store._verify_documents([(0, 3, 9, 13), (2, 0, 0, 4)])      # doctest: +SKIP
        """
        blocks_of = self.files
        for f, d, a, b in pending:
            blocks = blocks_of[f]
            if blocks is None or blocks.documents is None or blocks.documents_verified[d]:
                continue
            at = blocks.base + a * blocks.itemsize
            crc = crc32(blocks.data[at:at + (b - a) * blocks.itemsize])
            if crc != blocks.documents.item(d):
                raise self._changed_document(f, blocks, d, a, b, crc)
            if blocks.readable is not None:
                blocks.readable[d, 0] = a   # the start first: a row (start, 0) admits no run
                blocks.readable[d, 1] = b
            blocks.documents_verified[d] = 1
            blocks.documents_left -= 1
            if blocks.documents_left <= 0 and blocks.documents_verified.tobytes().find(0) < 0:
                self._file_verified(self.records[f], blocks)  # every document passed (a scan confirms the count)

    def _file_verified(self, rec: FileRecord, blocks: FileChecks) -> None:
        """Every byte of a file that readers use is verified: its reads skip every check from now on."""
        blocks.complete = True
        if blocks.readable is not None:   # any run of its tokens may be read
            blocks.readable[:, 0] = 0
            blocks.readable[:, 1] = rec.num_tokens
        self.all_verified = all(other is not None and other.complete for other in self.files)

    def _changed_document(self, f: int, blocks: FileChecks, d: int, a: int, b: int, crc: int) -> StoreCorruptError:
        """The refusal of a changed document: the store, the file, the document, its bytes, both CRCs and the fix."""
        rec = self.records[f]
        at, end = blocks.base + a * blocks.itemsize, blocks.base + b * blocks.itemsize
        recorded = int(blocks.documents.item(d))  # type: ignore[union-attr]
        return StoreCorruptError(
            f"{self.where(rec.name)} changed since it was built: its document {d} (document "
            f"{self.file_doc_starts[f] + d} of the store; tokens {a}-{b - 1}, bytes {at}-{end - 1} of {blocks.size}, "
            f"as its offsets now say) has CRC-32 {crc:08x}, {recorded:08x} when built ({DOCUMENT_TABLE}), so none of "
            f"its tokens is served; {self._fix(rec.name)}"
        )

    def _fix(self, name: str) -> str:
        """The fix a refusal of file ``name`` offers: the access's (a remote copy dropped), else restore or rebuild."""
        if self.refused is not None:
            return self.refused(name)
        return f"restore the file from a good copy or {REBUILD_HINT}"

    def _first_read(self, f: int, blocks: FileChecks, lo: int, hi: int) -> None:
        """A reader's first read of value blocks ``lo..hi`` (``lo`` unverified): verify them, reading ahead in a streak.

        A read whose first block is the file's frontier (the block after the
        previous first read) continues a sequential streak; once the streak
        holds :data:`_READ_AHEAD_AFTER` bytes, the read also verifies as many
        blocks past it as the streak holds, up to :data:`~impl.file_checks.READ_AHEAD_BYTES`
        (the window doubles as a reader in file order goes on). Why a streak
        and not "the block before is verified": under a global shuffle a
        random block's neighbour is verified more and more often as an epoch
        goes on, and a long document read in two pieces continues the
        frontier once; reading ahead for those would make a first pass CRC
        far more bytes than it reads.
        """
        streak = hi - lo + 1 + (blocks.streak if lo == blocks.frontier else 0)
        if streak * blocks.block >= _READ_AHEAD_AFTER and hi + 1 < blocks.count:
            ahead = min(streak, blocks.read_ahead, blocks.count - 1 - hi)
            hi += ahead
            streak += ahead
        self.verify_span(self.records[f], blocks, lo, hi)
        blocks.frontier = hi + 1
        blocks.streak = streak

    def check_span(self, f: int, start: int, stop: int) -> None:
        """The blocks of tokens ``[start, stop)`` of file ``f`` (already mapped): the one run check of every path.

        Single reads, :meth:`check_blocks`' runs that leave gaps and
        :meth:`check_blocks_batch`'s runs all end here: a ``find`` for the
        first unverified block, then :meth:`_first_read`.
        """
        blocks = self.files[f]
        if blocks is None or blocks.complete or stop <= start:
            return
        hi = (blocks.base + stop * blocks.itemsize - 1) // blocks.block
        lo = blocks.verified.find(0, (blocks.base + start * blocks.itemsize) // blocks.block, hi + 1)
        if lo >= 0:
            self._first_read(f, blocks, lo, hi)

    def check_document_runs(self, fl: np.ndarray, lo: np.ndarray, hi: np.ndarray, docs: np.ndarray) -> None:
        """Format 4: verify what the runs read that :attr:`readable` does not admit (``TokenStore.read_runs``' fallback).

        The documents of those runs are verified (:meth:`document_bounds_batch`:
        by their CRC-32, or by their offsets' and tokens' blocks, each
        writing its row); a run still outside its document's bounds (a
        caller's run that crosses documents) has its blocks checked. A
        document out of its file's range is an IndexError.
        """
        bad = self.readable.out_of_range(fl, docs)
        if bad is not None:
            f = int(fl[bad])
            raise IndexError(f"document out of range for file {f} of {self.records[f].num_documents} documents")
        outside = self.readable.outside(fl, lo, hi, docs)
        if not outside.any():
            return
        fl, lo, hi, docs = fl[outside], lo[outside], hi[outside], docs[outside]
        self.document_bounds_batch(fl, docs)
        still = self.readable.outside(fl, lo, hi, docs)
        if still.any():
            self.check_blocks_batch(fl[still], lo[still], hi[still])

    # ------------------------------------------------------------ integrity

    def check_blocks(self, file: int, starts: np.ndarray, stops: np.ndarray) -> None:
        """Refuse changed tokens before they are served: check the blocks holding tokens ``[starts[i], stops[i])`` of ``file``.

        ``starts``/``stops`` are file-local token offsets (int64 arrays of
        equal length; empty ranges are ignored). **Every reader of token
        values must call this first** (readers outside this class copy
        through ``TokenStore.read_runs``, which does). A block is CRC'd from
        the mapping on its first read by this store object and remembered in
        a per-file bitmap, so a range in verified blocks costs a
        ``bytearray.find`` and a complete file one attribute test (the first
        lines below: keep that path short). A changed block raises
        :class:`StoreCorruptError` naming the store, the file, the block and
        its bytes, and the fix. Format-1 files have no checksums: for them
        this only maps the file.

        Why blocks of the file's bytes: one scheme covers values, offsets and
        Arrow metadata alike, and the build computes it in the same read as
        the file's sha256; the block size (16 KiB) sets a fresh resume's
        first batch cost (benchmarks/README.md, "Design figures"). A first
        read continuing a sequential streak also verifies up to 512 KiB ahead
        (:meth:`_first_read`), still before any of their tokens is served.
        Thread-safe: each block is CRC'd once under its file's lock.

        >>> store.check_blocks(0, np.array([0, 100]), np.array([10, 4096]))   # doctest: +SKIP
        """
        try:
            done = file >= 0 and self.files[file].complete  # type: ignore[union-attr]
        except (AttributeError, IndexError, TypeError):
            done = False
        if done:
            return
        self.require_open()
        f = operator.index(file)
        if not 0 <= f < len(self.records):
            raise IndexError(f"file {file} out of range for a store of {len(self.records)} files")
        self.map(f)
        blocks = self.files[f]
        if blocks is None or blocks.complete:
            return
        lo_tok = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi_tok = np.asarray(stops, dtype=np.int64).reshape(-1)
        if lo_tok.shape != hi_tok.shape:
            raise ValueError(f"starts and stops differ in length ({lo_tok.size} and {hi_tok.size})")
        if not lo_tok.size:
            return
        small = lo_tok.size <= _SMALL
        if small:  # a batch's few runs per file: Python's min/max beat numpy's call overhead
            lo_list, hi_list = lo_tok.tolist(), hi_tok.tolist()
            first_tok, last_tok = min(lo_list), max(hi_list)
        else:
            first_tok, last_tok = int(lo_tok.min()), int(hi_tok.max())
        if first_tok < 0 or last_tok > self.records[f].num_tokens:
            raise IndexError(
                f"token range out of bounds for file {f} of {self.records[f].num_tokens} tokens "
                f"(starts from {first_tok}, stops up to {last_tok})"
            )
        if last_tok <= first_tok:
            return
        base, item, block = blocks.base, blocks.itemsize, blocks.block
        first = (base + first_tok * item) // block
        last = (base + last_tok * item - 1) // block
        verified = blocks.verified
        lo = verified.find(0, first, last + 1)
        if lo < 0:
            return
        if small and sum(hi_list) - sum(lo_list) >= last_tok - first_tok:
            self._first_read(f, blocks, lo, last)  # the runs cover the span (e.g. one sample's pieces in file order)
        elif small:
            for a, b in zip(lo_list, hi_list):
                self.check_span(f, a, b)
        else:
            keep = hi_tok > lo_tok
            if not keep.all():
                lo_tok, hi_tok = lo_tok[keep], hi_tok[keep]
            lo_np = (base + lo_tok * item) // block
            hi_np = (base + hi_tok * item - 1) // block
            n = blocks.count
            if np.array_equal(lo_np, hi_np):
                wanted = lo_np
            else:
                depth = np.cumsum(np.bincount(lo_np, minlength=n + 1) - np.bincount(hi_np + 1, minlength=n + 1))
                wanted = np.flatnonzero(depth[:n])
            todo = wanted[~blocks.verified_np[wanted]].tolist()
            if todo and todo[-1] - todo[0] + 1 == len(todo):  # one run of unverified blocks: may continue a streak
                self._first_read(f, blocks, todo[0], todo[-1])
            elif todo:
                self._verify_blocks(self.records[f], blocks, todo)

    def check_blocks_batch(self, files: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        """:meth:`check_blocks` of a whole batch: the blocks holding tokens ``[starts[i], stops[i])`` of ``files[i]``.

        Why one call a batch: under a global shuffle a batch of 8 x 2048
        tokens copies dozens of runs from a dozen files; one ``check_blocks``
        call per file (array conversions, spans, its own CRC loop) and the
        caller's per-file selections pay their fixed costs once per file,
        even when every block is verified (the rest of a first epoch), and
        more on a first read. Here one pass over the runs finds each run's
        unverified blocks (a ``find``) and CRCs them there; once every block
        of the store is verified the call is one attribute test. All runs in
        one file (file order), or more than :data:`_SMALL` runs, go through
        :meth:`check_blocks` (its span and numpy paths). The same guarantee:
        every block holding a token of a run is verified before this
        returns, or :class:`StoreCorruptError` names the first changed one.

        >>> store.check_blocks_batch(np.array([0, 2]), np.array([0, 100]), np.array([10, 4096]))  # doctest: +SKIP
        """
        if self.all_verified:
            self.require_open()
            return
        fl = np.asarray(files, dtype=np.int64).reshape(-1)
        lo_tok = np.asarray(starts, dtype=np.int64).reshape(-1)
        hi_tok = np.asarray(stops, dtype=np.int64).reshape(-1)
        if not fl.shape == lo_tok.shape == hi_tok.shape:
            raise ValueError(f"files, starts and stops differ in length ({fl.size}, {lo_tok.size}, {hi_tok.size})")
        file_list = fl.tolist()
        if not file_list:
            return
        if file_list.count(file_list[0]) == len(file_list):
            self.check_blocks(file_list[0], lo_tok, hi_tok)
            return
        if len(file_list) > _SMALL:
            for f in distinct_ints(fl):
                mine = fl == f
                self.check_blocks(f, lo_tok[mine], hi_tok[mine])
            return
        blocks_of, records = self.files, self.records
        for f, a, b in zip(file_list, lo_tok.tolist(), hi_tok.tolist()):
            if not 0 <= f < len(records):
                raise IndexError(f"file {f} out of range for a store of {len(records)} files")
            blocks = blocks_of[f]
            if blocks is None:
                self.require_open()
                self.map(f)
                blocks = blocks_of[f]
                if blocks is None:
                    continue
            if blocks.complete or b <= a:
                continue
            if a < 0 or b > records[f].num_tokens:
                raise IndexError(f"token range [{a}, {b}) out of bounds for file {f} of {records[f].num_tokens} tokens")
            self.check_span(f, a, b)
