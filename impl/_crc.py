"""CRC-32 of block checks at hardware speed: zlib's checksum (same polynomial, same values), computed by ISA-L.

Why: every block of a token file (:mod:`impl.store`) and of a cached epoch
plan (:mod:`impl.dataset`) is CRC'd the first time a process reads it, so
the CRC's speed is the price of the first read. ISA-L's folding CRC
(carry-less multiplication, ``python-isal``'s ``isal_zlib.crc32``) computes
the very same CRC-32 as ``zlib.crc32``, several times faster (figures and the
command that measures them: benchmarks/README.md, "Design figures"), from
any buffer (a memoryview of the mapped file: no copy). Same values means no
format change: every store and plan cache is checked with it, and
``zlib.crc32`` stays a correct fallback and an independent oracle in tests.

Why not CRC-32C (``google-crc32c``): as fast or slightly faster on an SSE4.2
CPU, but a new checksum is a new store format, a new plan format, and a
rebuild before any existing store reads faster; its C call also refuses a
memoryview, and its pure-Python fallback is far slower than zlib.

Without ``isal`` (a platform it has no wheel for), :data:`IMPLEMENTATION` is
``"zlib"``: the same checks, slower first reads, and one ``RuntimeWarning``
at import saying so and how to fix it.

>>> crc32(b"abc") == __import__("zlib").crc32(b"abc") == 0x352441C2
True
>>> crc32(b"c", crc32(b"ab")) == crc32(b"abc")      # running CRC, as zlib's
True
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable

__all__ = ["IMPLEMENTATION", "crc32"]

crc32: Callable[..., int]
IMPLEMENTATION: str

try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - the dependency is installed wherever isal has a wheel
    crc32 = zlib.crc32
    IMPLEMENTATION = "zlib"
    warnings.warn(
        "loadspec: python-isal is not installed, so block checks use zlib's CRC-32 (the same checksums, about 4x "
        "slower on a block's first read); install it with `pip install isal` for hardware-speed checks",
        RuntimeWarning, stacklevel=2,
    )
else:
    crc32 = _isal_crc32
    IMPLEMENTATION = "isal"
