"""A multi-task build written to an S3 bucket (moto's server on 127.0.0.1) and committed there.

Why: at scale the tasks run on machines that share no filesystem, only a
bucket. The committed store must equal a local build byte for byte, never
be readable half built, refuse a corrupted or missing token file by name,
rerun only a killed task, and let exactly one of two committers publish.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import traceback
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from conformance.impl_tests.remote_servers import CREDENTIALS, S3Server, s3_options
from conformance.impl_tests.test_build_tasks import OPTS, published
from conformance.impl_tests.test_store import make_docs, word_tokenizer
from fixtures import generators
from impl import build_remote, cli
from impl.build_remote import RemoteCommit
from impl.build_tasks import STAGING_DIR, build_task, commit_build, tasks_progress
from impl.errors import BuildCommitError, BuildTaskError, ConfigError, StoreNotFoundError
from impl.store import TokenStore

BUCKET = "builds"


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "word"
    word_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "src"
    generators.write_jsonl_shards(make_docs(23, seed=5), root, num_shards=2)
    return root


@pytest.fixture(scope="module")
def local(source, tok_dir, tmp_path_factory):
    return TokenStore.build(source, tok_dir, tmp_path_factory.mktemp("local") / "store", num_proc=1, progress=False,
                            **OPTS)


@pytest.fixture
def prefix():
    return f"store-{uuid.uuid4().hex[:8]}"


def run_tasks(s3, source, tok_dir, url, n, only=None):
    return [build_task(source, tok_dir, url, task=i, tasks=n, storage_options=s3_options(s3.url), **OPTS)
            for i in (range(n) if only is None else only)]


def keys(s3, prefix: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    return sorted(o["Key"][len(prefix) + 1:] for o in listed)


def downloaded(s3, prefix: str, into: Path) -> Path:
    """Every object under ``prefix`` copied into the directory ``into`` (to compare with a local store)."""
    into.mkdir()
    client = s3.client()
    for key in keys(s3, prefix):
        (into / key).write_bytes(client.get_object(Bucket=BUCKET, Key=f"{prefix}/{key}")["Body"].read())
    return into


def flip_a_byte(s3, key: str) -> None:
    client = s3.client()
    data = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[-40] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))


@pytest.mark.parametrize("n", [1, 3])
def test_a_store_built_by_tasks_into_s3_and_committed_there_is_byte_identical_to_a_local_build(
        s3, source, tok_dir, local, tmp_path, prefix, n):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, n)
    committed = commit_build(url, storage_options=s3_options(s3.url))
    assert isinstance(committed, RemoteCommit) and committed.fingerprint == local.fingerprint
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)
    assert not any(k.startswith(STAGING_DIR) for k in keys(s3, prefix))
    reader = TokenStore.open(url, local=tmp_path / "cache", storage_options=s3_options(s3.url))
    assert reader.fingerprint == local.fingerprint and len(reader) == len(local) == 23
    assert all(np.array_equal(reader[i], local[i]) for i in range(len(local)))


def test_until_the_commit_the_bucket_holds_no_meta_json_so_a_reader_refuses_the_half_built_store(
        s3, source, tok_dir, tmp_path, prefix):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 2)
    names = keys(s3, prefix)
    assert names == sorted([*(f"{STAGING_DIR}/{kind}-0000{i}-of-00002.json" for kind in ("task", "progress")
                              for i in range(2)), *(f"tokens-{f:05d}.arrow" for f in range(8))])
    with pytest.raises(StoreNotFoundError, match=r"has no meta\.json"):
        TokenStore.open(url, local=tmp_path / "cache", storage_options=s3_options(s3.url))


def test_a_token_file_corrupted_in_the_bucket_after_its_task_finished_is_refused_at_commit_naming_it(
        s3, source, tok_dir, local, tmp_path, prefix):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 2)
    flip_a_byte(s3, f"{prefix}/tokens-00003.arrow")
    with pytest.raises(BuildCommitError, match=rf"task-00001-of-00002\.json: token file s3://{BUCKET}/{prefix}/"
                                               r"tokens-00003\.arrow does not match its record.*relaunch that task"):
        commit_build(url, storage_options=s3_options(s3.url))
    assert "meta.json" not in keys(s3, prefix)
    assert [r.skipped for r in run_tasks(s3, source, tok_dir, url, 2)] == [True, False]
    commit_build(url, storage_options=s3_options(s3.url))
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)


def test_a_token_file_missing_from_the_bucket_is_refused_at_commit_naming_it_and_its_task_alone_reruns(
        s3, source, tok_dir, local, tmp_path, prefix):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 3)
    s3.client().delete_object(Bucket=BUCKET, Key=f"{prefix}/tokens-00005.arrow")
    with pytest.raises(BuildCommitError, match=rf"task-00002-of-00003\.json: token file s3://{BUCKET}/{prefix}/"
                                               r"tokens-00005\.arrow is missing: relaunch task 2 of 3"):
        commit_build(url, storage_options=s3_options(s3.url))
    results = run_tasks(s3, source, tok_dir, url, 3)
    assert [r.skipped for r in results] == [True, True, False] and results[2].files == (2, 5)
    commit_build(url, storage_options=s3_options(s3.url))
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)


def test_a_task_killed_mid_upload_leaves_no_fragment_and_a_relaunch_reruns_it_alone(
        s3, source, tok_dir, local, tmp_path, prefix, monkeypatch):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 3, only=[0, 2])
    real = build_remote._upload
    uploads = [0]

    def killed_on_the_second(out, local_path, name, size, who, hint):
        if uploads[0] == 1:   # half of the file reaches the bucket, then the process dies
            out.fs.pipe_file(out.path(name), Path(local_path).read_bytes()[: size // 2])
            raise KeyboardInterrupt
        uploads[0] += 1
        real(out, local_path, name, size, who, hint)

    monkeypatch.setattr(build_remote, "_upload", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_tasks(s3, source, tok_dir, url, 3, only=[1])
    monkeypatch.setattr(build_remote, "_upload", real)
    names = keys(s3, prefix)
    assert f"{STAGING_DIR}/task-00001-of-00003.json" not in names and "tokens-00004.arrow" in names
    with pytest.raises(BuildCommitError, match=r"tasks \[1\] of 3 have no fragment"):
        commit_build(url, storage_options=s3_options(s3.url))
    results = run_tasks(s3, source, tok_dir, url, 3)
    assert [r.skipped for r in results] == [True, False, True] and results[1].files == (1, 4, 7)
    commit_build(url, storage_options=s3_options(s3.url))
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)


def _task_killed_by_sigkill(source: str, tok_dir: str, url: str, endpoint: str, point: str) -> None:
    """Task 1 of 3 killed with SIGKILL: half way through uploading its second file, or after its last file."""
    from impl import build_remote as remote_module

    real = remote_module._upload
    uploads = [0]

    def upload(out, local_path, name, size, who, hint):
        if point == "mid-upload" and uploads[0] == 1:
            out.fs.pipe_file(out.path(name), Path(local_path).read_bytes()[: size // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real(out, local_path, name, size, who, hint)
        uploads[0] += 1
        if point == "before-fragment" and uploads[0] == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    remote_module._upload = upload
    build_task(source, tok_dir, url, task=1, tasks=3, storage_options=s3_options(endpoint), **OPTS)


@pytest.mark.parametrize("point", ["mid-upload", "before-fragment"])
def test_a_task_killed_by_sigkill_while_uploading_is_rerun_alone_and_the_store_is_identical(
        s3, source, tok_dir, local, tmp_path, prefix, point):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 3, only=[0, 2])
    proc = multiprocessing.get_context("spawn").Process(
        target=_task_killed_by_sigkill, args=(str(source), str(tok_dir), url, s3.url, point))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    names = keys(s3, prefix)
    assert f"{STAGING_DIR}/task-00001-of-00003.json" not in names
    assert ("tokens-00007.arrow" in names) == (point == "before-fragment") and "tokens-00004.arrow" in names
    results = run_tasks(s3, source, tok_dir, url, 3)
    assert [r.skipped for r in results] == [True, False, True]
    commit_build(url, storage_options=s3_options(s3.url))
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)


def test_a_commit_killed_before_meta_json_publishes_nothing_and_a_second_commit_publishes_the_identical_store(
        s3, source, tok_dir, local, tmp_path, prefix, monkeypatch):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 2)

    def killed() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(build_remote, "_before_meta", killed)
    with pytest.raises(KeyboardInterrupt):
        commit_build(url, storage_options=s3_options(s3.url))
    assert "blocks.crc32" in keys(s3, prefix) and "meta.json" not in keys(s3, prefix)
    with pytest.raises(StoreNotFoundError):
        TokenStore.open(url, local=tmp_path / "cache", storage_options=s3_options(s3.url))
    monkeypatch.setattr(build_remote, "_before_meta", lambda: None)
    assert commit_build(url, storage_options=s3_options(s3.url)).fingerprint == local.fingerprint
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)


def test_of_two_concurrent_committers_to_s3_exactly_one_publishes_and_the_other_is_told(
        s3, source, tok_dir, local, prefix, monkeypatch):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 2)
    both_validated = threading.Barrier(2, timeout=60)
    monkeypatch.setattr(build_remote, "_before_meta", both_validated.wait)   # both reach the create, then race
    outcomes: list[object] = []

    def commit() -> None:
        try:
            outcomes.append(commit_build(url, storage_options=s3_options(s3.url)))
        except BuildCommitError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    (won,) = [o for o in outcomes if isinstance(o, RemoteCommit)]
    (lost,) = [o for o in outcomes if isinstance(o, BuildCommitError)]
    assert "already committed by another committer" in str(lost)
    meta = json.loads(s3.client().get_object(Bucket=BUCKET, Key=f"{prefix}/meta.json")["Body"].read())
    assert meta["build_id"] == won.meta["build_id"] and won.fingerprint == local.fingerprint
    with pytest.raises(BuildCommitError, match="already committed by another committer"):
        commit_build(url, storage_options=s3_options(s3.url))


class _NoCreateFileSystem(MemoryFileSystem):
    """A store whose writes ignore create-if-absent (as an S3-compatible server that drops If-None-Match)."""

    protocol = "loadspec-nocreate"

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        return super().pipe_file(path, value, **kwargs)


def test_a_filesystem_without_conditional_create_is_refused_at_commit_and_nothing_is_published(source, tok_dir,
                                                                                                 prefix):
    fsspec.register_implementation("loadspec-nocreate", _NoCreateFileSystem, clobber=True)
    url = f"loadspec-nocreate://{prefix}"
    for i in range(2):
        build_task(source, tok_dir, url, task=i, tasks=2, **OPTS)
    with pytest.raises(BuildCommitError, match=r"loadspec-nocreate:// has no create-if-absent.*accepted a second "
                                               r"conditional create.*two concurrent committers could both publish"):
        commit_build(url)
    stored = sorted(k.rsplit(prefix, 1)[1] for k in _NoCreateFileSystem.store if prefix in k)
    assert stored == sorted([*(f"/{STAGING_DIR}/{kind}-0000{i}-of-00002.json" for kind in ("task", "progress")
                               for i in range(2)), *(f"/tokens-{f:05d}.arrow" for f in range(8))])


def test_with_commit_when_done_the_last_task_into_s3_commits_the_identical_store(s3, source, tok_dir, local, tmp_path,
                                                                                  prefix):
    url = f"s3://{BUCKET}/{prefix}"
    first, last = (build_task(source, tok_dir, url, task=i, tasks=2, storage_options=s3_options(s3.url),
                              commit_when_done=True, **OPTS) for i in (1, 0))
    assert (first.committed, last.committed) == (False, True)
    assert published(downloaded(s3, prefix, tmp_path / "copy")) == published(local.path)
    with pytest.raises(BuildCommitError, match="is already a committed store"):
        run_tasks(s3, source, tok_dir, url, 2, only=[1])


def test_each_task_into_s3_reports_its_tokens_so_the_progress_of_all_tasks_is_their_sum(s3, source, tok_dir, local,
                                                                                       prefix):
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 3, only=[0, 2])
    total, rate = tasks_progress(url, 3, storage_options=s3_options(s3.url))
    owned = [f for f in range(len(local.meta["files"])) if f % 3 in (0, 2)]
    assert total == sum(local.meta["files"][f]["num_tokens"] for f in owned) and rate > 0


def test_no_message_shows_the_credentials_of_the_storage_options(s3, source, tok_dir, prefix):
    secret_options = {**s3_options(s3.url), "key": CREDENTIALS["key"], "secret": "sekrit-do-not-print"}
    with pytest.raises(BuildTaskError) as missing_bucket:
        build_task(source, tok_dir, f"s3://no-such-bucket-{prefix}/store", task=0, tasks=2,
                   storage_options=secret_options, **OPTS)
    assert f"s3://no-such-bucket-{prefix}/store/tokens-00000.arrow" in str(missing_bucket.value)
    url = f"s3://{BUCKET}/{prefix}"
    run_tasks(s3, source, tok_dir, url, 2)
    flip_a_byte(s3, f"{prefix}/tokens-00000.arrow")
    with pytest.raises(BuildCommitError) as corrupted:
        commit_build(url, storage_options=secret_options)
    for exc in (missing_bucket.value, corrupted.value):
        shown = "".join(traceback.format_exception(exc))   # the message and every chained cause a log would print
        assert "sekrit-do-not-print" not in shown and CREDENTIALS["key"] not in shown


def test_the_cli_builds_tasks_into_s3_with_storage_options_and_commits(s3, source, tok_dir, local, tmp_path, prefix,
                                                                        capsys):
    url = f"s3://{BUCKET}/{prefix}"
    options = ["--storage-option", f"endpoint_url={s3.url}",
               "--storage-option", 'client_kwargs={"region_name": "us-east-1"}']
    for i in range(2):
        assert cli.main(["build", str(source), url, "--tokenizer", str(tok_dir), "--task", str(i), "--tasks", "2",
                         *options]) == 0
    assert f"when every task is done: loadspec build --commit {url}" in capsys.readouterr().out
    assert "meta.json" not in keys(s3, prefix)
    assert cli.main(["build", "--commit", url, *options]) == 0
    assert f"committed store {url}: 23 documents" in capsys.readouterr().out
    copy = TokenStore.open(downloaded(s3, prefix, tmp_path / "copy"))   # the CLI's docs_per_file: other files
    assert [np.asarray(copy[i]).tolist() for i in range(23)] == [np.asarray(local[i]).tolist() for i in range(23)]


def test_a_file_url_builds_and_commits_through_the_local_protocol_identically(source, tok_dir, local, tmp_path):
    out = tmp_path / "out"
    for i in range(3):
        build_task(source, tok_dir, f"file://{out}", task=i, tasks=3, **OPTS)
    assert (out / STAGING_DIR).is_dir()
    store = commit_build(f"file://{out}")
    assert isinstance(store, TokenStore) and published(out) == published(local.path)


def test_a_url_folded_by_pathlib_or_storage_options_for_a_local_path_are_refused(source, tok_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"looks like a URL that pathlib folded.*pass the URL as a str"):
        build_task(source, tok_dir, Path("s3://bucket/store"), task=0, tasks=2, **OPTS)
    with pytest.raises(ConfigError, match=r"storage_options were given but out_dir .* is a local path"):
        commit_build(tmp_path / "out", storage_options={"anon": True})


def test_a_one_machine_build_into_a_url_is_refused_naming_the_one_task_build_and_writes_nothing_local(
        source, tok_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in ("s3://bucket/store", Path("s3://bucket/store"), "memory://builds/store"):
        with pytest.raises(ConfigError, match=r"is a URL, but a one-machine build writes a local directory.*"
                                              r"--task 0 --tasks 1 --commit-when-done"):
            TokenStore.build(source, tok_dir, out, num_proc=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []     # no ./s3: or ./memory: directory
