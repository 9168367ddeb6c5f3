"""FileChecks: one mapped token file's recorded checksums and which of its blocks and documents are verified.

Why a type of its own: :mod:`impl.store_files` makes one when it maps a file
and :mod:`impl.integrity` reads and marks it on every check; it is the state
both share, with no behaviour beyond forgetting (``reset``).
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["READ_AHEAD_BYTES", "FileChecks"]

#: The most a sequential first read verifies ahead of what it reads (``Integrity._first_read``).
READ_AHEAD_BYTES = 512 * 1024


class FileChecks:
    """One mapped file's recorded block checksums and the blocks this store object has verified.

    ``data`` is the whole file, a read-only memoryview of the mapping the
    tokens are served from (a block is checked in exactly the bytes a reader
    copies); ``base``/``offsets_at`` are the byte offsets of its values and
    offsets, ``offsets_blocks`` the (first, last) blocks holding the offsets
    (``(0, -1)``: none) and ``offsets_done`` says all are verified.
    ``verified`` is one byte per block (1: verified), a ``bytearray`` so
    that "is any block of ``[a, b]`` unverified" is one
    ``verified.find(0, a, b + 1)``; ``verified_np`` the same memory as numpy
    bools; ``left`` counts unverified blocks (``complete`` at 0).
    ``recorded`` is the file's slice of the block table (format 3+), else
    ``hex`` its ``block_crc32`` string (format 2). ``frontier``/``streak``
    track sequential first reads (``Integrity._first_read``). ``documents``
    is the file's slice of the document table (format 4), ``documents_verified``
    one byte per document whose CRC passed (a slice of the store's
    demand-zero map) and ``documents_left`` about how many have not.
    ``readable`` (format 4) is the file's rows of the store's table of what
    may be read without a further check (:mod:`impl.readable`): row ``d``
    the file-local tokens ``[start, stop)`` of document ``d`` once it is
    verified, ``(0, 0)`` before.
    """

    __slots__ = ("base", "block", "complete", "count", "data", "documents", "documents_left", "documents_verified",
                 "frontier", "hex",
                 "itemsize", "left", "lock", "offsets_at", "offsets_blocks", "offsets_done", "read_ahead", "readable",
                 "recorded", "size", "streak", "verified", "verified_np")

    def __init__(self, data: memoryview, base: int, itemsize: int, block: int, crc_hex: str, offsets_at: int,
                 recorded: np.ndarray | None = None, offsets_bytes: int = 0,
                 documents: np.ndarray | None = None, documents_verified: memoryview | None = None,
                 readable: np.ndarray | None = None) -> None:
        self.data = data
        self.size = len(data)
        self.base = base
        self.itemsize = itemsize
        self.block = block
        self.hex = crc_hex
        self.recorded = recorded
        self.count = len(crc_hex) // 8 if recorded is None else len(recorded)
        self.offsets_at = offsets_at
        self.offsets_blocks = ((offsets_at // block, (offsets_at + offsets_bytes - 1) // block) if offsets_bytes
                               else (0, -1))
        self.verified = bytearray(self.count)
        self.verified_np = np.frombuffer(self.verified, dtype=np.bool_)
        self.left = self.count
        self.complete = self.count == 0
        self.offsets_done = self.complete
        self.frontier = -1
        self.streak = 0
        self.read_ahead = max(1, READ_AHEAD_BYTES // block)
        self.lock = threading.Lock()
        self.documents = documents
        self.documents_verified = memoryview(bytearray()) if documents_verified is None else documents_verified
        self.documents_left = len(self.documents_verified)
        self.readable = readable

    def reset(self) -> None:
        """Forget every verification (``verify`` checks every block again)."""
        with self.lock:
            self.verified_np[:] = False
            self.documents_verified[:] = bytes(len(self.documents_verified))
            self.documents_left = len(self.documents_verified)
            if self.readable is not None:
                self.readable[:, 1] = 0   # the stops first: a row (start, 0) admits no run
                self.readable[:, 0] = 0
            self.left = self.count
            self.complete = self.offsets_done = self.count == 0
            self.frontier = -1
            self.streak = 0
