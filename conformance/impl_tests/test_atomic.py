"""``atomic_write_bytes`` interrupted at any point leaves the old target and no temporary file.

Why: a Ctrl-C (``KeyboardInterrupt``) or a ``SystemExit`` can arrive during
any write of a plan cache, a checkpoint or a store's ``meta.json``; it is not
an ``OSError``, and a cleanup limited to ``OSError`` leaves a
``.<name>.<random>.tmp`` beside the target each time. The interrupt is
raised by a stand-in for one step of the write (the file's ``write`` half
way through its bytes, ``os.fsync``, ``os.replace``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from impl import _atomic
from impl._atomic import atomic_write_bytes, atomic_write_json


class _HalfThenInterrupt:
    """Stands in for the file ``os.fdopen`` opens: writes half of the bytes, then raises ``KeyboardInterrupt``."""

    def __init__(self, f) -> None:
        self._f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def write(self, data: bytes) -> int:
        self._f.write(data[:len(data) // 2])
        self._f.flush()
        raise KeyboardInterrupt

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _interrupt_at(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if step == "write":
        real_fdopen = os.fdopen
        monkeypatch.setattr(_atomic.os, "fdopen", lambda *a, **k: _HalfThenInterrupt(real_fdopen(*a, **k)))
    else:
        monkeypatch.setattr(_atomic.os, step, _interrupt)


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
@pytest.mark.parametrize("write", [atomic_write_bytes, atomic_write_json])
def test_a_keyboard_interrupt_during_an_atomic_write_propagates_and_leaves_the_old_target_and_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, write) -> None:
    """Fault caught: the temporary file removed only on ``OSError`` (a Ctrl-C during the write leaves it behind)."""
    target = tmp_path / "plan.json"
    target.write_bytes(b'{"old": true}\n')
    with monkeypatch.context() as patched:
        _interrupt_at(step, patched)
        with pytest.raises(KeyboardInterrupt):
            write(target, b"new content " * 1000 if write is atomic_write_bytes else {"new": list(range(1000))})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"], "a temporary file was left beside the target"
    assert target.read_bytes() == b'{"old": true}\n'


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_keyboard_interrupt_during_a_first_atomic_write_leaves_no_target_and_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    target = tmp_path / "meta.json"
    with monkeypatch.context() as patched:
        _interrupt_at(step, patched)
        with pytest.raises(KeyboardInterrupt):
            atomic_write_bytes(target, b"x" * 100_000)
    assert list(tmp_path.iterdir()) == []
