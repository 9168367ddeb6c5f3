"""The build's progress bar: documents when the count is known, bytes of the source files when it is not.

Why apart from :mod:`impl.build`: the bar is presentation only (tqdm on
stderr, or nothing); keeping it out of the build keeps the build's logic free
of display concerns.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["BytesProgress", "NoBar", "progress_bar"]


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, total: int | None, unit: str = "doc") -> Any:
    """A tqdm bar on stderr (total, rate and ETA when ``total`` is known), or a no-op when disabled.

    ``unit="B"`` counts bytes, scaled (``1.50MB/s``).
    """
    if not enabled:
        return NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with datasets
        return NoBar()
    scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, unit=unit, desc="tokenizing", file=sys.stderr, dynamic_ncols=True, **scaled)


class BytesProgress:
    """Progress in bytes of the source's files, for sources whose document count is not known up front.

    Why bytes: a JSON Lines or txt directory's document count is known only
    after reading it all, but the sum of its file sizes costs a stat per
    file, and it gives the bar a total, a rate and an ETA. The reader records
    ``(documents read, bytes read)`` after each batch (:meth:`track`); the
    tokenizer reports documents done (:meth:`update`), and the bar moves to
    the bytes interpolated between the checkpoints around that count (reading
    runs at most a few ranges ahead of tokenizing).

    >>> bar = BytesProgress(NoBar())
    >>> list(bar.track(iter([(["a", "b"], 10), (["c", "d"], 30), ([], 40)])))
    [['a', 'b'], ['c', 'd']]
    >>> [bar.update(1) for _ in range(4)] and bar.shown
    40
    >>> bar._position(3), bar._position(1)
    (20, 5)
    """

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.docs, self.bytes = [0], [0]
        self.done = self.shown = 0

    def track(self, batches: Iterator[tuple[list[str], int]]) -> Iterator[list[str]]:
        for texts, read in batches:
            self.docs.append(self.docs[-1] + len(texts))
            self.bytes.append(max(read, self.bytes[-1]))
            if texts:
                yield texts

    def _position(self, done: int) -> int:
        i = bisect.bisect_right(self.docs, done) - 1
        if i + 1 >= len(self.docs):
            return self.bytes[i]
        d0, d1, b0, b1 = self.docs[i], self.docs[i + 1], self.bytes[i], self.bytes[i + 1]
        return b0 + (b1 - b0) * (done - d0) // max(1, d1 - d0)

    def update(self, n: int = 1) -> None:
        self.done += n
        position = self._position(self.done)
        if position > self.shown:
            self.bar.update(position - self.shown)
            self.shown = position

    def close(self) -> None:
        self.bar.close()

