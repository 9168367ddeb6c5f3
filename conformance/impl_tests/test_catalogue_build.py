"""Catalogue of bad inputs to the build, its sources and the CLI: each is refused with a typed error.

Why: a build is often the first thing a user runs, on their own files. Every
mistake below must stop with the error's type, a message naming the problem
(the file, the value) and a fix, never a bare ``zlib.error``, a traceback from
argparse, a hang, or a deleted directory. One case per bad input.
"""

from __future__ import annotations

import errno
import gzip
import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest

from conformance.impl_tests.test_store import WORDS, assert_store_holds, expected_tokens, word_tokenizer
from fixtures import generators
from impl import cli
from impl.errors import (
    ConfigError,
    EmptyDataError,
    LockTimeoutError,
    SourceError,
    StoreError,
    TokenizerError,
    UnguardedMainError,
    UnsafeOutputError,
)
from impl.store import TokenStore


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


def jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def gz_bytes(n: int = 400) -> bytes:
    return gzip.compress(b"".join(json.dumps({"text": f"alpha beta {i}"}).encode() + b"\n" for i in range(n)))


# Each setup returns (kwargs for TokenStore.build); `tmp` is the test's tmp_path.


def _overwrite_non_store_dir(tmp: Path, tok):
    jsonl(tmp / "mine" / "keep.jsonl", [{"text": "alpha"}])
    return dict(source=["alpha"], out_dir=tmp / "mine", overwrite=True)


def _output_is_source(tmp: Path, tok):
    jsonl(tmp / "data" / "a.jsonl", [{"text": "alpha"}])
    return dict(source=str(tmp / "data"), out_dir=tmp / "data", overwrite=True)


def _output_inside_source(tmp: Path, tok):
    jsonl(tmp / "data" / "a.jsonl", [{"text": "alpha"}])
    return dict(source=tmp / "data", out_dir=tmp / "data" / "store")


def _source_inside_output(tmp: Path, tok):
    src = jsonl(tmp / "out" / "data" / "a.jsonl", [{"text": "alpha"}])
    return dict(source=[src], out_dir=tmp / "out", overwrite=True)


def _overwrite_a_file(tmp: Path, tok):
    (tmp / "store").write_text("my file")
    return dict(source=["alpha"], out_dir=tmp / "store", overwrite=True)


def _corrupt_gz(tmp: Path, tok):
    data = gz_bytes()
    (tmp / "a.jsonl.gz").write_bytes(data[:20] + b"\xff" * 40 + data[60:])
    return dict(source=tmp / "a.jsonl.gz", out_dir=tmp / "store")


def _truncated_gz(tmp: Path, tok):
    (tmp / "a.txt.gz").write_bytes(gz_bytes()[:200])
    return dict(source=tmp / "a.txt.gz", out_dir=tmp / "store")


def _not_gzip_at_all(tmp: Path, tok):
    (tmp / "a.jsonl.gz").write_bytes(b'{"text": "plain"}\n')
    return dict(source=tmp / "a.jsonl.gz", out_dir=tmp / "store")


def _undecodable_txt(tmp: Path, tok):
    (tmp / "a.txt").write_bytes(b"alpha\nbeta \xe9t\xe9\n")
    return dict(source=tmp / "a.txt", out_dir=tmp / "store")


def _undecodable_jsonl(tmp: Path, tok):
    (tmp / "a.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    return dict(source=tmp / "a.jsonl", out_dir=tmp / "store")


def _missing_text_field(tmp: Path, tok):
    return dict(source=jsonl(tmp / "a.jsonl", [{"text": "a"}, {"body": "b"}]), out_dir=tmp / "store")


def _wrong_field_type(tmp: Path, tok):
    return dict(source=jsonl(tmp / "a.jsonl", [{"text": "a"}, {"text": 7}]), out_dir=tmp / "store")


def _invalid_json_line(tmp: Path, tok):
    (tmp / "a.jsonl").write_text('{"text": "a"}\n{"text": \n')
    return dict(source=tmp / "a.jsonl", out_dir=tmp / "store")


def _empty_source(tmp: Path, tok):
    (tmp / "a.jsonl").write_text("")
    return dict(source=tmp / "a.jsonl", out_dir=tmp / "store")


def _unknown_file_kind(tmp: Path, tok):
    (tmp / "a.csv").write_text("text\nalpha\n")
    return dict(source=tmp / "a.csv", out_dir=tmp / "store")


def _nonexistent_source(tmp: Path, tok):
    return dict(source=tmp / "nowhere", out_dir=tmp / "store")


def _num_proc_zero(tmp: Path, tok):
    return dict(source=["alpha"], out_dir=tmp / "store", num_proc=0)


def _num_proc_string(tmp: Path, tok):
    return dict(source=["alpha"], out_dir=tmp / "store", num_proc="2")


def _no_eos_with_add_eos(tmp: Path, tok):
    return dict(source=["alpha"], out_dir=tmp / "store", tokenizer=word_tokenizer(eos=False))


def _nonexistent_tokenizer(tmp: Path, tok):
    return dict(source=["alpha"], out_dir=tmp / "store", tokenizer=str(tmp / "no-tokenizer"))


def _split_for_a_plain_list(tmp: Path, tok):
    return dict(source=["alpha"], out_dir=tmp / "store", split="train")


def _different_store_without_overwrite(tmp: Path, tok):
    TokenStore.build(["alpha"], tok, tmp / "store", progress=False)
    return dict(source=["beta"], out_dir=tmp / "store")


CASES = [
    (_overwrite_non_store_dir, UnsafeOutputError, r"not a loadspec token store.*choose another out_dir"),
    (_output_is_source, UnsafeOutputError, r"is the source.*choose an out_dir outside the source"),
    (_output_inside_source, UnsafeOutputError, r"is inside the source.*choose an out_dir outside"),
    (_source_inside_output, UnsafeOutputError, r"contains the source.*choose an out_dir outside"),
    (_overwrite_a_file, UnsafeOutputError, r"is a file.*never replaces it.*choose another out_dir"),
    (_corrupt_gz, SourceError, r"a\.jsonl\.gz: corrupt or truncated gzip.*gzip -t"),
    (_truncated_gz, SourceError, r"a\.txt\.gz: corrupt or truncated gzip.*ended before.*re-download"),
    (_not_gzip_at_all, SourceError, r"a\.jsonl\.gz: corrupt or truncated gzip.*Not a gzipped file.*re-compress"),
    (_undecodable_txt, SourceError, r"a\.txt:2: not valid UTF-8.*b'\\xe9'.*re-encode the file as UTF-8"),
    (_undecodable_jsonl, SourceError, r"a\.jsonl:1: not valid UTF-8.*re-encode"),
    (_missing_text_field, SourceError, r"a\.jsonl:2: record has no field 'text' \(fields: \['body'\]\).*text_field="),
    (_wrong_field_type, SourceError, r"a\.jsonl:2: field 'text' is int, not a string.*use ''"),
    (_invalid_json_line, SourceError, r"a\.jsonl:2: not valid JSON.*one JSON object a line"),
    (_empty_source, EmptyDataError, r"source has no documents.*a\.jsonl.*check the path"),
    (_unknown_file_kind, SourceError, r"a\.csv: unknown file kind; supported: .*\.parquet"),
    (_nonexistent_source, SourceError, r"nowhere' does not exist: pass an existing file or directory"),
    (_num_proc_zero, ConfigError, r"num_proc=0: must be None \(all CPUs\) or an integer >= 1"),
    (_num_proc_string, ConfigError, r"num_proc='2': must be None .* or an integer >= 1"),
    (_no_eos_with_add_eos, TokenizerError, r"no eos_token but add_eos=True: set add_eos=False"),
    (_nonexistent_tokenizer, TokenizerError, r"no-tokenizer' does not exist: pass a local directory"),
    (_split_for_a_plain_list, ConfigError, r"split='train' was given but the source .* has no splits: drop split="),
    (_different_store_without_overwrite, StoreError, r"already exists.*pass overwrite=True.*or choose another"),
]


@pytest.mark.parametrize(("setup", "error", "pattern"), CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_a_bad_build_input_is_refused_with_a_typed_error_naming_the_problem_and_the_fix(
        setup, error, pattern, tmp_path, tok):
    kwargs = setup(tmp_path, tok)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    kwargs.setdefault("tokenizer", tok)
    with pytest.raises(error) as info:
        TokenStore.build(progress=False, **kwargs)
    assert re.search(pattern, str(info.value), re.DOTALL), str(info.value)
    assert not isinstance(info.value, UnsafeOutputError) or "delete" not in str(info.value)
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.name.endswith(".lock"))
    assert after == [p for p in before if not p.endswith(".lock")], "a refused build changed the directory"


def test_an_unguarded_build_inside_a_spawned_child_is_refused_naming_the_main_guard(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(UnguardedMainError, match=r're-importing .*if __name__ == "__main__":.*num_proc=1'):
        TokenStore.build(["alpha"], tok, tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()


def test_a_lock_held_by_another_builder_times_out_naming_the_holder(tmp_path, tok, monkeypatch):
    from impl._atomic import file_lock, lock_path_for

    monkeypatch.setenv("LOADSPEC_LOCK_TIMEOUT_S", "0.2")
    with file_lock(lock_path_for(tmp_path / "store")), pytest.raises(LockTimeoutError) as info:
        TokenStore.build(["alpha"], tok, tmp_path / "store", progress=False)
    assert re.search(rf"held by pid {os.getpid()} on host .*wait for that process", str(info.value))


def test_a_read_only_output_directory_is_a_store_error_naming_the_path(tmp_path, tok, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    if os.geteuid() != 0:
        parent.chmod(0o555)
    else:  # root ignores permissions: make the filesystem refuse like a read-only mount would
        real_mkdir = os.mkdir

        def refuse(path, *args, **kwargs):
            if str(path).startswith(str(parent)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", refuse)
    try:
        with pytest.raises(StoreError, match=r"ro.*(read-only|may not write).*choose a writable out_dir"):
            TokenStore.build(["alpha"], tok, parent / "store", progress=False)
    finally:
        parent.chmod(0o755)
    assert not (parent / "store").exists()


def _full_disk_child(out: str, result: str) -> None:
    import resource
    import signal

    from conformance.impl_tests.test_store import word_tokenizer
    from impl.store import TokenStore

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    limit = 64 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    docs = [" ".join(["alpha beta gamma delta"] * 8)] * 3000  # ~200 KB of uint16 tokens
    try:
        TokenStore.build(docs, word_tokenizer(), out, overwrite=True, num_proc=1, progress=False)
        outcome = {"type": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - the parent asserts the type
        outcome = {"type": type(exc).__name__, "message": str(exc)}
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    Path(result).write_text(json.dumps(outcome))


def test_a_full_disk_during_a_replacing_build_is_a_store_error_and_the_old_store_survives(tmp_path, tok):
    out = tmp_path / "store"
    old = TokenStore.build(["alpha beta"], tok, out, progress=False)
    proc = multiprocessing.get_context("spawn").Process(target=_full_disk_child,
                                                        args=(str(out), str(tmp_path / "result.json")))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    outcome = json.loads((tmp_path / "result.json").read_text())
    assert outcome["type"] == "StoreError", outcome
    assert re.search(r"failed writing .*tokens-00000\.arrow.*File too large.*no store was written.*ulimit -f",
                     outcome["message"]), outcome["message"]
    assert TokenStore.open(out, verify=True).fingerprint == old.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".store")) == []


# --------------------------------------------------------------------------- the CLI


def _cli_build_args(tmp: Path) -> list[str]:
    jsonl(tmp / "data" / "a.jsonl", [{"text": "In the beginning"}])
    return ["build", str(tmp / "data"), str(tmp / "out"), "--tokenizer", str(generators.tokenizer_path())]


CLI_CASES = [
    (lambda t: ["check", str(t), "--seq-len", "8", "--world-sizes", "2,x"], r"--world-sizes: .*'x' is not a world size.*2,3,8"),
    (lambda t: ["check", str(t), "--seq-len", "8", "--world-sizes", "0"], r"'0' is not a world size; pass comma-separated integers >= 1"),
    (lambda t: ["check", str(t), "--seq-len", "8", "--resumes", "-1"], r"--resumes: -1 is too small: expected an integer >= 0"),
    (lambda t: ["check", str(t), "--seq-len", "0"], r"--seq-len: 0 is too small: expected an integer >= 1"),
    (lambda t: ["check", str(t), "--seq-len", "8", "--batch-size", "abc"], r"--batch-size: 'abc' is not an integer"),
    (lambda t: ["check", str(t), "--seq-len", "8", "--packing", "bogus"], r"--packing: invalid choice: 'bogus'"),
    (lambda t: ["preview", str(t), "--seq-len", "8", "-n", "-1"], r"-n: -1 is too small"),
    (lambda t: ["check", str(t)], r"the following arguments are required: --seq-len"),
    (lambda t: _cli_build_args(t) + ["--num-proc", "0"], r"--num-proc: 0 is too small: expected an integer >= 1"),
    (lambda t: _cli_build_args(t)[:3], r"loadspec build needs SOURCE OUT --tokenizer T"),
    (lambda t: ["frobnicate"], r"invalid choice: 'frobnicate'"),
    (lambda t: ["check", str(t / "nowhere"), "--seq-len", "8"], r"StoreNotFoundError: .*nowhere"),
    (lambda t: ["build", str(t / "nowhere"), str(t / "out"), "--tokenizer", str(generators.tokenizer_path())],
     r"SourceError: source path .*nowhere' does not exist: pass an existing file"),
    (lambda t: _cli_build_args(t)[:2] + [str(t / "data"), "--tokenizer", str(generators.tokenizer_path()),
                                         "--overwrite"],
     r"UnsafeOutputError: .*is the source.*outside the source"),
    (lambda t: _cli_build_args(t)[:3] + ["--tokenizer", str(t / "no-tok")], r"TokenizerError: .*no-tok' does not exist"),
]


@pytest.mark.parametrize("case", range(len(CLI_CASES)))
def test_a_bad_cli_invocation_exits_2_with_a_usage_message_and_no_traceback(case, tmp_path, capsys):
    make_argv, pattern = CLI_CASES[case]
    argv = make_argv(tmp_path)
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, (argv, captured.err)
    assert re.search(pattern, captured.err, re.DOTALL), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "out").exists()
    if (tmp_path / "data").exists():
        assert (tmp_path / "data" / "a.jsonl").exists()


# --------------------------------------------------------------------------- no row lost between a source's batches


@pytest.mark.parametrize("n", [7, 8195, 2 * 8192 + 3])
def test_a_streaming_iterable_dataset_of_n_rows_builds_exactly_n_documents_its_last_short_batch_included(n, tmp_path,
                                                                                                            tok):
    """Fault caught: an ``IterableDataset`` source losing its last short batch of rows (8,195 texts, 8,192 documents).

    The source is read in batches of rows; ``n`` below one batch and a few
    rows past one and two batches must give ``n`` documents, each the
    tokenizer's own encoding of its row, the last ones included.
    """
    import datasets

    docs = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(i % 4)) for i in range(n)]  # 0..3 words
    source = datasets.Dataset.from_dict({"text": docs}).to_iterable_dataset(num_shards=1)
    assert isinstance(source, datasets.IterableDataset)
    store = TokenStore.build(source, tok, tmp_path / "store", num_proc=1, docs_per_file=3000, progress=False)
    expected = expected_tokens(tok, docs)
    assert len(store) == n
    assert [store[d].tolist() for d in range(n - 3, n)] == expected[-3:]
    assert_store_holds(store, expected)
