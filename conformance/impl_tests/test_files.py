"""The file seam (impl.files): local access by relative name, as every reader sees it."""

from __future__ import annotations

import pytest

from impl.files import FileAccess, LocalFiles


def test_local_files_map_stat_open_and_glob_name_files_relative_to_the_root(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"abc")
    (tmp_path / "empty").write_bytes(b"")
    files = LocalFiles(tmp_path)
    assert isinstance(files, FileAccess)
    assert bytes(files.map("a/x.bin")) == b"abc"
    assert files.map("empty") == b""
    st = files.stat("a/x.bin")
    assert st is not None and st.size == 3
    assert files.stat("missing") is None
    with files.open("a/x.bin") as fh:
        assert fh.read() == b"abc"
    assert files.glob("**/*.bin") == ["a/x.bin"]
    assert files.where("a/x.bin") == str(tmp_path / "a" / "x.bin")
    with pytest.raises(FileNotFoundError):
        files.map("missing")


def test_a_rewritten_file_gets_a_new_version(tmp_path):
    import os

    p = tmp_path / "f"
    p.write_bytes(b"one")
    files = LocalFiles(tmp_path)
    before = files.stat("f")
    p.write_bytes(b"two")
    os.utime(p, ns=(1, 1))
    after = files.stat("f")
    assert before is not None and after is not None and before.version != after.version
