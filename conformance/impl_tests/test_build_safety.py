"""A build never destroys what the user made, never mixes with its source, and replaces a store atomically.

Why these tests: ``--overwrite`` once deleted a directory of source ``.jsonl``
files. Each test below puts something the user owns in the build's way
(a plain directory, the source itself, a directory named like a build's
temp dir) and checks that it is still there, byte for byte, afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.impl_tests.test_store import expected_tokens, make_docs, word_tokenizer
from impl import build as build_module
from impl import cli
from impl.errors import StoreError, UnsafeOutputError
from impl.store import TokenStore


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_directory_that_is_not_a_store_and_keeps_every_file(tmp_path, tok):
    out = tmp_path / "mine"
    write_jsonl(out / "a.jsonl", ["alpha beta"])
    (out / "sub").mkdir()
    (out / "sub" / "notes.txt").write_text("keep me")
    before = snapshot(out)
    with pytest.raises(UnsafeOutputError, match="not a loadspec token store") as info:
        TokenStore.build(["alpha"], tok, out, overwrite=True, progress=False)
    assert "delete" not in str(info.value) and "remove" not in str(info.value)
    assert snapshot(out) == before


def test_a_store_holding_a_file_the_user_added_is_not_replaced(tmp_path, tok):
    out = tmp_path / "store"
    TokenStore.build(["alpha beta"], tok, out, progress=False)
    (out / "my_notes.md").write_text("results of run 7")
    with pytest.raises(UnsafeOutputError, match="my_notes.md"):
        TokenStore.build(["gamma"], tok, out, overwrite=True, progress=False)
    assert (out / "my_notes.md").read_text() == "results of run 7"


def test_cli_build_with_the_source_directory_as_output_refuses_and_keeps_the_source(tmp_path, capsys):
    data = tmp_path / "data"
    write_jsonl(data / "part-0.jsonl", ["alpha beta", "gamma"])
    before = snapshot(data)
    from fixtures import generators

    code = cli.main(["build", str(data), str(data), "--tokenizer", str(generators.tokenizer_path()),
                     "--overwrite", "--num-proc", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "is the source" in err and "outside the source" in err and "Traceback" not in err
    assert snapshot(data) == before


@pytest.mark.parametrize("layout", ["out_inside_source", "source_inside_out", "source_file_inside_out"])
def test_an_output_path_inside_or_containing_the_source_is_refused(tmp_path, tok, layout):
    data = tmp_path / "data"
    src_file = write_jsonl(data / "part-0.jsonl", ["alpha beta"])
    source, out, how = {
        "out_inside_source": (data, data / "store", "is inside the source"),
        "source_inside_out": (data, tmp_path, "contains the source"),
        "source_file_inside_out": (src_file, data, "contains the source"),
    }[layout]
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeOutputError, match=how):
        TokenStore.build(source, tok, out, overwrite=True, progress=False)
    assert snapshot(tmp_path) == before
    assert not (data / "store").exists()


def test_overwrite_of_a_file_is_refused_and_the_file_kept(tmp_path, tok):
    out = tmp_path / "store"
    out.write_text("not a directory")
    with pytest.raises(UnsafeOutputError, match="is a file"):
        TokenStore.build(["alpha"], tok, out, overwrite=True, progress=False)
    assert out.read_text() == "not a directory"


def test_overwrite_replaces_a_store_and_the_old_one_stays_readable_until_the_new_one_is_published(
        tmp_path, tok, monkeypatch):
    out = tmp_path / "store"
    old_docs, new_docs = make_docs(12, seed=1), make_docs(11, seed=2)
    old = TokenStore.build(old_docs, tok, out, progress=False)
    seen_during_build = []

    def read_old_store(tmp_dir, record):
        seen_during_build.append(TokenStore.open(out, verify=True).fingerprint)

    monkeypatch.setattr(build_module, "_on_file_written", read_old_store)
    new = TokenStore.build(new_docs, tok, out, overwrite=True, docs_per_file=4, num_proc=1, progress=False)
    assert seen_during_build == [old.fingerprint] * 3
    assert [new[i].tolist() for i in range(len(new))] == expected_tokens(tok, new_docs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "store.lock"]
    assert not (out / ".loadspec-build").exists()


def test_a_store_that_no_longer_opens_can_be_replaced_with_overwrite(tmp_path, tok):
    out = tmp_path / "store"
    TokenStore.build(["alpha beta"], tok, out, progress=False)
    (out / "tokens-00000.arrow").unlink()
    with pytest.raises(StoreError, match="cannot be opened.*overwrite=True"):
        TokenStore.build(["gamma"], tok, out, progress=False)
    assert len(TokenStore.build(["gamma"], tok, out, overwrite=True, progress=False)) == 1


def test_stale_cleanup_removes_only_marked_temp_dirs_never_a_user_directory_with_a_matching_name(tmp_path, tok):
    out = tmp_path / "store"
    user = tmp_path / ".store.tmp-123-abcdef"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    user_old = tmp_path / ".store.old-9-x"
    user_old.mkdir()
    (user_old / "meta.json").write_text(json.dumps({"format": "something else"}))
    stale = tmp_path / ".store.tmp-456-0123456789ab"
    stale.mkdir()
    (stale / ".loadspec-build").write_text(json.dumps({"out": "store", "pid": 456, "host": "h"}))
    (stale / "tokens-00000.arrow").write_bytes(b"half")
    TokenStore.build(["alpha"], tok, out, progress=False)
    assert (user / "thesis.tex").read_text() == "years of work"
    assert (user_old / "meta.json").exists()
    assert not stale.exists()


@pytest.mark.parametrize("num_proc", [1, 2])
def test_an_iterable_source_is_stored_in_full_including_its_last_partial_batch(tmp_path, tok, num_proc):
    docs = make_docs(8192 + 37, seed=3)  # one full internal text batch (8192) plus a partial one
    store = TokenStore.build(iter(docs), tok, tmp_path / "store", docs_per_file=3000, num_proc=num_proc,
                             progress=False)
    assert len(store) == len(docs)
    want = expected_tokens(tok, docs[-40:])
    assert [store[i].tolist() for i in range(len(docs) - 40, len(docs))] == want


# --------------------------------------------------------------------------- no hangs


def test_a_held_lock_times_out_with_an_error_naming_the_holders_pid_and_host(tmp_path, tok, monkeypatch):
    import os
    import socket

    from impl._atomic import file_lock, lock_path_for
    from impl.errors import LockTimeoutError

    out = tmp_path / "store"
    monkeypatch.setenv("LOADSPEC_LOCK_TIMEOUT_S", "0.3")
    with file_lock(lock_path_for(out)), pytest.raises(LockTimeoutError, match="LOADSPEC_LOCK_TIMEOUT_S") as info:
        TokenStore.build(["alpha"], tok, out, progress=False)
    assert f"pid {os.getpid()}" in str(info.value) and socket.gethostname() in str(info.value)
    assert isinstance(info.value, TimeoutError) and not out.exists()
    assert len(TokenStore.build(["alpha"], tok, out, progress=False)) == 1


UNGUARDED_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from impl.store import TokenStore
docs = ["alpha beta gamma"] * 12
TokenStore.build(docs, {tok!r}, {out!r}, num_proc=2, docs_per_file=3, progress=False)
print("built")
"""


def test_a_top_level_build_without_a_main_guard_fails_at_once_naming_the_guard(tmp_path):
    import subprocess
    import sys

    from fixtures import generators

    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.format(repo=repo, tok=str(generators.tokenizer_path()),
                                              out=str(tmp_path / "store")))
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode != 0 and "built" not in proc.stdout
    assert "UnguardedMainError" in proc.stderr
    assert 'if __name__ == "__main__":' in proc.stderr and "num_proc=1" in proc.stderr
    assert not (tmp_path / "store").exists()


def _slow_worker_init(*args):
    import os

    from impl import build_pool

    build_pool._worker_init(*args)
    Path(os.environ["LOADSPEC_TEST_PIDS"], str(os.getpid())).write_text("")


def _hanging_worker_encode(texts):
    import time

    time.sleep(600)


def _parent_of_hanging_workers(source_docs, tok_dir, out, pid_dir):
    import os

    from impl import build_pool

    os.environ["LOADSPEC_TEST_PIDS"] = pid_dir
    build_pool._worker_init = _slow_worker_init
    build_pool._worker_encode = _hanging_worker_encode
    TokenStore.build(source_docs, tok_dir, out, num_proc=2, docs_per_file=2, progress=False)


def test_build_workers_die_with_their_killed_parent(tmp_path):
    import multiprocessing
    import os
    import signal
    import time

    from fixtures import generators

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    parent = multiprocessing.get_context("spawn").Process(
        target=_parent_of_hanging_workers,
        args=(["alpha beta"] * 8, str(generators.tokenizer_path()), str(tmp_path / "store"), str(pid_dir)))
    parent.start()
    try:
        deadline = time.monotonic() + 120
        while len(list(pid_dir.iterdir())) < 2 and time.monotonic() < deadline and parent.is_alive():
            time.sleep(0.1)
        workers = [int(p.name) for p in pid_dir.iterdir()]
        assert len(workers) == 2, f"workers did not start (parent exit code {parent.exitcode})"
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.join(30)

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == [], f"workers {left} outlived their killed parent"


# --------------------------------------------------------------------------- sources


@pytest.mark.parametrize("name", ["a.txt", "a.jsonl", "a.txt.gz", "a.jsonl.gz"])
def test_a_utf8_byte_order_mark_is_dropped_from_the_first_document_only(tmp_path, tok, name):
    import gzip

    from impl.sources import resolve_source

    if ".jsonl" in name:
        body = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in ["alpha", "\ufeffbeta"])
    else:
        body = "alpha\n\ufeffbeta\n"
    raw = b"\xef\xbb\xbf" + body.encode("utf-8")
    (tmp_path / name).write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    texts = [t for batch in resolve_source(tmp_path / name).batches() for t in batch]
    assert texts == ["alpha", "\ufeffbeta"]
    store = TokenStore.build(tmp_path / name, tok, tmp_path / "store", progress=False)
    assert store[0].tolist() == expected_tokens(tok, ["alpha"])[0]


def test_a_symlinked_out_dir_returns_the_same_store_but_is_never_replaced(tmp_path, tok):
    real = tmp_path / "real"
    store = TokenStore.build(["alpha beta"], tok, real, progress=False)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert TokenStore.build(["alpha beta"], tok, link, progress=False).fingerprint == store.fingerprint
    with pytest.raises(UnsafeOutputError, match="is a symlink.*pass the directory it points to"):
        TokenStore.build(["gamma"], tok, link, overwrite=True, progress=False)
    assert link.is_symlink() and TokenStore.open(real).fingerprint == store.fingerprint


def test_overwrite_replaces_a_store_that_a_dataset_has_cached_plans_in(tmp_path):
    from impl.dataset import PackedDataset
    from impl.store import TokenStore

    out = tmp_path / "store"
    TokenStore.from_token_files([[[1, 2, 3, 4, 5]] * 8], out, vocab_size=8)
    PackedDataset(out, seq_len=4, packing="best_fit")[0]   # computes a plan: cached in <store>/.plans
    assert (out / ".plans").is_dir() and any((out / ".plans").iterdir())
    store = TokenStore.from_token_files([[[6, 7]] * 3], out, vocab_size=8, overwrite=True)
    assert len(store) == 3 and not (out / ".plans").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store.")], "the old store was not removed"


def test_a_plans_directory_holding_a_user_file_is_not_a_store_to_replace(tmp_path):
    import pytest

    from impl.errors import UnsafeOutputError
    from impl.store import TokenStore

    out = tmp_path / "store"
    TokenStore.from_token_files([[[1, 2, 3]]], out, vocab_size=8)
    (out / ".plans").mkdir()
    (out / ".plans" / "notes.txt").write_text("mine")
    with pytest.raises(UnsafeOutputError, match="not a loadspec token store"):
        TokenStore.from_token_files([[[4]]], out, vocab_size=8, overwrite=True)
    assert (out / ".plans" / "notes.txt").read_text() == "mine"
