"""A build split into tasks (torchrun, Slurm array, --task/--tasks) and committed: identical to a local build.

Why: a corpus too large for one machine is tokenized by N tasks; the store
they commit must not depend on N (a relaunch with another N, or a local
rebuild, must give the same fingerprint), a relaunch must skip finished
tasks, and the commit must refuse a corrupt or mismatched fragment instead
of publishing it.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from conformance.impl_tests.test_store import make_docs, word_tokenizer
from fixtures import generators
from impl import build_files, cli
from impl.build_tasks import STAGING_DIR, build_task, commit_build, task_from_env, tasks_progress
from impl.errors import BuildCommitError, BuildTaskError, ConfigError
from impl.store import TokenStore

DOCS_PER_FILE = 3
OPTS = {"docs_per_file": DOCS_PER_FILE}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "word"
    word_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture
def source(tmp_path):
    generators.write_jsonl_shards(make_docs(23, seed=5), tmp_path / "src", num_shards=2)
    return tmp_path / "src"


@pytest.fixture
def local(source, tok_dir, tmp_path):
    return TokenStore.build(source, tok_dir, tmp_path / "local", num_proc=1, progress=False, **OPTS)


def run_tasks(source, tok_dir, out, n, only=None):
    return [build_task(source, tok_dir, out, task=i, tasks=n, **OPTS) for i in (range(n) if only is None else only)]


def published(path: Path) -> dict[str, object]:
    """Every file of the store, byte for byte, and its meta without the build's id and time."""
    meta = json.loads((path / "meta.json").read_text())
    for key in ("build_id", "created"):
        meta.pop(key)
    files = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "meta.json"}
    return {"meta": meta, "files": files}


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_the_committed_store_is_byte_identical_to_a_local_build_for_any_task_count(source, tok_dir, local, tmp_path,
                                                                                   n):
    out = tmp_path / f"out{n}"
    run_tasks(source, tok_dir, out, n)
    store = commit_build(out)
    assert store.fingerprint == local.fingerprint
    assert published(out) == published(local.path)
    assert len(local.meta["files"]) == 8 and not (out / STAGING_DIR).exists()


def test_a_token_file_corrupted_after_its_task_finished_is_refused_at_commit_naming_it(source, tok_dir, tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 2)
    victim = out / STAGING_DIR / "tokens-00003.arrow"
    data = bytearray(victim.read_bytes())
    data[-40] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(BuildCommitError, match=r"task-00001-of-00002\.json: token file .*tokens-00003\.arrow does not "
                                               r"match its record.*relaunch that task"):
        commit_build(out)
    assert not (out / "meta.json").exists()


def test_a_source_file_changed_between_tasks_is_refused_at_commit(source, tok_dir, tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 2, only=[0])
    shard = min(source.iterdir())
    shard.write_text(shard.read_text().replace("alpha", "beta"))
    os.utime(shard, ns=(1, 1))
    run_tasks(source, tok_dir, out, 2, only=[1])
    with pytest.raises(BuildCommitError, match=r"source changed between tasks.*\[\[0\], \[1\]\]"):
        commit_build(out)


def test_a_missing_fragment_is_refused_at_commit_naming_the_task(source, tok_dir, tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 3, only=[0, 2])
    with pytest.raises(BuildCommitError, match=r"tasks \[1\] of 3 have no fragment"):
        commit_build(out)


def test_a_relaunch_skips_the_tasks_whose_fragment_validates_and_reruns_the_killed_one(source, tok_dir, local,
                                                                                        tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 3)
    (out / STAGING_DIR / "task-00001-of-00003.json").unlink()   # task 1 was killed before its fragment
    (out / STAGING_DIR / "tokens-00004.arrow").write_bytes(b"half a file")
    results = run_tasks(source, tok_dir, out, 3)
    assert [r.skipped for r in results] == [True, False, True]
    assert results[1].files == (1, 4, 7)
    commit_build(out)
    assert published(out) == published(local.path)


@pytest.mark.parametrize("kill_at", [0, 1, 2])
def test_a_task_that_dies_mid_write_then_relaunched_gives_the_identical_store(source, tok_dir, local, tmp_path,
                                                                              monkeypatch, kill_at):
    out = tmp_path / "out"
    real = build_files.write_token_file
    written = [0]

    def dying(path, values, offsets):
        if written[0] == kill_at:
            Path(path).write_bytes(b"\0" * 100)   # a partial file, then the process "dies"
            raise KeyboardInterrupt
        written[0] += 1
        real(path, values, offsets)

    monkeypatch.setattr(build_files, "write_token_file", dying)
    with pytest.raises(KeyboardInterrupt):
        run_tasks(source, tok_dir, out, 2, only=[1])
    monkeypatch.setattr(build_files, "write_token_file", real)
    assert [r.skipped for r in run_tasks(source, tok_dir, out, 2)] == [False, False]
    commit_build(out)
    assert published(out) == published(local.path)


KILL_POINTS = range(13)
"""Task 0 of 2 owns files 0, 2, 4, 6; for each: a partial file is on disk, the file is written, its progress is
reported (3 points a file, 12 in all); point 12 is after its fragment (the relaunch skips it)."""


def _task_killed_at(source: str, tok_dir: str, out: str, point: int) -> None:
    from impl import build_files as files_module
    from impl import build_tasks as tasks_module

    events = [0]

    def tick() -> None:
        if events[0] == point:
            os.kill(os.getpid(), 9)
        events[0] += 1

    real_write, real_json = files_module.write_token_file, tasks_module.atomic_write_json

    def write(path, values, offsets):
        Path(path).write_bytes(b"\0" * 64)
        tick()
        real_write(path, values, offsets)
        tick()

    def write_json(path, obj, **kwargs):
        real_json(path, obj, **kwargs)
        tick()

    files_module.write_token_file = write
    tasks_module.atomic_write_json = write_json
    build_task(source, tok_dir, out, task=0, tasks=2, **OPTS)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_task_killed_by_sigkill_at_any_point_then_relaunched_gives_the_identical_store(source, tok_dir, local,
                                                                                         tmp_path, point):
    out = tmp_path / "out"
    proc = multiprocessing.get_context("spawn").Process(target=_task_killed_at,
                                                        args=(str(source), str(tok_dir), str(out), point))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -9
    assert (out / STAGING_DIR / "task-00000-of-00002.json").exists() == (point == 12)
    assert [r.skipped for r in run_tasks(source, tok_dir, out, 2)] == [point == 12, False]
    commit_build(out)
    assert published(out) == published(local.path)


def test_a_full_disk_in_one_task_is_a_typed_error_naming_the_path_and_leaves_the_other_fragments_usable(
        source, tok_dir, local, tmp_path, monkeypatch):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 3, only=[0, 2])
    real = build_files.write_token_file

    def full(path, values, offsets):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(build_files, "write_token_file", full)
    with pytest.raises(BuildTaskError, match=r"task 1 of 3 failed writing '.*tokens-00001\.arrow': No space left"):
        run_tasks(source, tok_dir, out, 3, only=[1])
    monkeypatch.setattr(build_files, "write_token_file", real)
    assert [r.skipped for r in run_tasks(source, tok_dir, out, 3)] == [True, False, True]
    commit_build(out)
    assert published(out) == published(local.path)


def test_of_two_concurrent_committers_exactly_one_wins_and_the_other_is_told(source, tok_dir, local, tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 2)
    outcomes: list[object] = []

    def commit() -> None:
        try:
            outcomes.append(commit_build(out).fingerprint)
        except BuildCommitError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(map(type, outcomes), key=str) == sorted([str, BuildCommitError], key=str)
    (error,) = [o for o in outcomes if isinstance(o, BuildCommitError)]
    assert "already committed by another committer" in str(error)
    assert local.fingerprint in outcomes


def test_the_task_comes_from_torchrun_or_a_slurm_array_or_is_asked_for():
    assert task_from_env(environ={"RANK": "2", "WORLD_SIZE": "3"}) == (2, 3)
    assert task_from_env(environ={"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "5"}) == (4, 5)
    assert task_from_env(1, 2, environ={"RANK": "0", "WORLD_SIZE": "3"}) == (1, 2)
    with pytest.raises(ConfigError, match="torchrun"):
        task_from_env(environ={})
    with pytest.raises(ConfigError, match="0 <= task < tasks"):
        task_from_env(3, 3, environ={})


def test_the_cli_runs_tasks_from_the_environment_and_commits(source, tok_dir, local, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert cli.main(["build", str(source), str(out), "--tokenizer", str(tok_dir), "--task-from-env"]) == 0
    # the CLI's docs_per_file is the default: compare with a local build of the same default
    assert cli.main(["build", "--commit", str(out)]) == 0
    assert "committed store" in capsys.readouterr().out
    default = TokenStore.build(source, tok_dir, tmp_path / "default", num_proc=1, progress=False)
    assert TokenStore.open(out).fingerprint == default.fingerprint


def test_with_commit_when_done_the_last_task_to_finish_commits_the_identical_store(source, tok_dir, local, tmp_path):
    out = tmp_path / "out"
    results = [build_task(source, tok_dir, out, task=i, tasks=3, commit_when_done=True, **OPTS) for i in (2, 0, 1)]
    assert [r.committed for r in results] == [False, False, True]
    assert published(out) == published(local.path)


def test_each_task_reports_its_tokens_so_the_progress_of_all_tasks_is_their_sum(source, tok_dir, local, tmp_path):
    out = tmp_path / "out"
    run_tasks(source, tok_dir, out, 3, only=[0, 2])
    total, rate = tasks_progress(out, 3)
    owned = [f for f in range(len(local.meta["files"])) if f % 3 in (0, 2)]
    assert total == sum(local.meta["files"][f]["num_tokens"] for f in owned) and rate > 0


def test_the_cli_task_with_commit_when_done_commits_when_it_is_the_last(source, tok_dir, tmp_path, monkeypatch,
                                                                         capsys):
    out = tmp_path / "out"
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert cli.main(["build", str(source), str(out), "--tokenizer", str(tok_dir), "--task-from-env",
                         "--commit-when-done"]) == 0
    assert "it was the last task and committed the store" in capsys.readouterr().out
    assert TokenStore.open(out).num_tokens > 0


def test_a_task_parses_only_the_records_of_the_files_it_owns(source, tok_dir, tmp_path, monkeypatch):
    from impl import sources

    real = sources._jsonl_texts
    parsed = [0]

    def counting(*args, **kwargs):
        for text in real(*args, **kwargs):
            parsed[0] += 1
            yield text

    monkeypatch.setattr(sources, "_jsonl_texts", counting)
    (result,) = run_tasks(source, tok_dir, tmp_path / "out", 2, only=[1])
    assert result.files == (1, 3, 5, 7) and parsed[0] == 3 + 3 + 3 + 2   # of 23 documents


def _write_formats(docs: list[str], root: Path, kind: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir()
    halves = [docs[:10], docs[10:]]
    for i, part in enumerate(halves):
        if kind == "parquet":
            pq.write_table(pa.table({"text": part}), root / f"{i}.parquet", row_group_size=4)
        elif kind == "arrow":
            with pa.ipc.new_file(str(root / f"{i}.arrow"), pa.schema([("text", pa.string())])) as w:
                for s in range(0, len(part), 4):
                    w.write_table(pa.table({"text": part[s:s + 4]}))
        else:   # txt with a BOM, CRLF endings and no final newline; jsonl with blank lines between records
            if kind == "txt":
                (root / f"{i}.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(part).encode())
            else:
                (root / f"{i}.jsonl").write_text("\n\n".join(json.dumps({"text": d}) for d in part) + "\n \n")
    return root


@pytest.mark.parametrize("kind", ["parquet", "arrow", "txt", "jsonl"])
def test_tasks_that_read_only_their_share_commit_the_local_build_of_every_format(tok_dir, tmp_path, kind):
    docs = [" ".join(d.split()) or "alpha" for d in make_docs(23, seed=9)]
    src = _write_formats(docs, tmp_path / "src", kind)
    local = TokenStore.build(src, tok_dir, tmp_path / "local", num_proc=1, progress=False, **OPTS)
    out = tmp_path / "out"
    run_tasks(src, tok_dir, out, 3)
    commit_build(out)
    assert published(out) == published(local.path) and len(local) == 23


def test_a_commit_with_no_task_run_says_to_run_the_tasks_first(tmp_path):
    from impl.build_tasks import commit_build
    from impl.errors import BuildCommitError

    with pytest.raises(BuildCommitError, match="holds no build fragment: run the build's tasks first"):
        commit_build(tmp_path / "out")
