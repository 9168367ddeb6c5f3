"""kill -9 of a build at seeded points: ``open`` finds no store or a complete one, never a half-written one.

Why: a build is minutes to hours of work on a shared machine; it gets killed
(OOM killer, preemption, Ctrl-C twice). Whatever the moment, the next reader
must see either no store (a fresh build) or a complete valid store (the old
one or the new one, for a replacing build), and the next build must succeed
and clean up. Each run is a child process (forked from a forkserver that has
loadspec imported, so a run takes well under a second) that SIGKILLs itself
at its k-th "event": just before or just after a file write, a rename, the
directory exchange, an fsync, a marker write or an unlink of the build. The
seeds pick k among all events a full build has, so every run is repeatable.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
from pathlib import Path

import pytest

from conformance.impl_tests.test_store import make_docs, word_tokenizer
from impl._atomic import atomic_write_json
from impl.errors import StoreNotFoundError
from impl.store import TokenStore

RUNS = 20
OLD_DOCS = make_docs(14, seed=11)
NEW_DOCS = make_docs(17, seed=12)
BUILD_ARGS = {"docs_per_file": 5, "num_proc": 1, "progress": False}
TOKENIZER = word_tokenizer()  # built once, at import, so forked children start with it (runs stay < 1 s)


def _build_until_killed(out: str, overwrite: bool, kill_at: int | None, count_file: str) -> None:
    """Child: build NEW_DOCS at ``out``, SIGKILLing itself at event ``kill_at`` (None: count the events)."""
    import impl._atomic as atomic
    from impl import build_files, build_publish

    events = [0]

    def tick() -> None:
        if events[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        events[0] += 1

    def wrap(owner, name):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            tick()
            result = real(*args, **kwargs)
            tick()
            return result

        setattr(owner, name, wrapped)

    wrap(build_files, "write_token_file")
    for name in ("atomic_write_json", "exchange_dirs", "fsync_dir", "_remove_own_dir", "_remove_stale_temp_dirs"):
        wrap(build_publish, name)
    wrap(atomic, "fsync_dir")
    for name in ("rename", "replace", "unlink", "rmdir", "mkdir"):
        wrap(os, name)
    TokenStore.build(NEW_DOCS, TOKENIZER, out, overwrite=overwrite, **BUILD_ARGS)
    Path(count_file).write_text(str(events[0]))


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["impl.build", "impl.build_publish", "conformance.impl_tests.test_store", __name__])
    return ctx


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    tok = TOKENIZER
    old = TokenStore.build(OLD_DOCS, tok, root / "old", **BUILD_ARGS)
    new = TokenStore.build(NEW_DOCS, tok, root / "new", **BUILD_ARGS)
    return {"old": old, "new": new, "tok": tok}


def run_child(ctx, out: Path, overwrite: bool, kill_at: int | None) -> tuple[int | None, Path]:
    count_file = out.parent / f"{out.name}.count"
    proc = ctx.Process(target=_build_until_killed, args=(str(out), overwrite, kill_at, str(count_file)))
    proc.start()
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
        pytest.fail(f"build child with kill_at={kill_at} did not finish within 60 s")
    return proc.exitcode, count_file


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def check_after_kill(out: Path, allowed: set[str], stores, *, may_be_missing: bool) -> None:
    try:
        store = TokenStore.open(out, verify=True)
    except StoreNotFoundError:
        assert may_be_missing, f"no store at {out} after the kill; the old one should have stayed"
    else:
        assert store.fingerprint in allowed, "open returned a store that is neither the old nor the new one"
        assert len(store) in {len(OLD_DOCS), len(NEW_DOCS)}
    rebuilt = TokenStore.build(NEW_DOCS, stores["tok"], out, overwrite=True, **BUILD_ARGS)
    assert rebuilt.fingerprint == stores["new"].fingerprint
    TokenStore.open(out, verify=True)
    assert leftovers(out) == [], "the rebuild did not clean up after the killed builder"


def kill_points(ctx, tmp_path: Path, overwrite: bool, stores, seed: int) -> list[int]:
    probe = tmp_path / "probe"
    if overwrite:
        shutil.copytree(stores["old"].path, probe)
    code, count_file = run_child(ctx, probe, overwrite, None)
    assert code == 0
    total = int(count_file.read_text())
    assert total >= 20, f"only {total} kill points in a build"
    rng = random.Random(seed)
    return sorted(rng.sample(range(total), RUNS))


def test_a_fresh_build_killed_at_20_seeded_points_leaves_no_store_or_the_complete_one(tmp_path, forkserver,
                                                                                      stores):
    points = kill_points(forkserver, tmp_path, False, stores, seed=2026)
    for k in points:
        out = tmp_path / f"fresh-{k}" / "store"
        out.parent.mkdir()
        code, _ = run_child(forkserver, out, False, k)
        assert code == -signal.SIGKILL, f"kill point {k} was not reached (exit code {code})"
        check_after_kill(out, {stores["new"].fingerprint}, stores, may_be_missing=True)


def test_a_replacing_build_killed_at_20_seeded_points_leaves_the_old_or_the_new_store(tmp_path, forkserver,
                                                                                      stores):
    points = kill_points(forkserver, tmp_path, True, stores, seed=8)
    for k in points:
        out = tmp_path / f"replace-{k}" / "store"
        shutil.copytree(stores["old"].path, out)
        code, _ = run_child(forkserver, out, True, k)
        assert code == -signal.SIGKILL, f"kill point {k} was not reached (exit code {code})"
        check_after_kill(out, {stores["old"].fingerprint, stores["new"].fingerprint}, stores,
                         may_be_missing=False)


def _write_then_die(target: str) -> None:
    import impl._atomic as atomic

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    atomic.os.replace = die
    atomic_write_json(target, {"version": "new"})


def test_a_crash_between_the_temp_write_and_the_rename_leaves_the_old_file(tmp_path, forkserver):
    target = tmp_path / "state.json"
    atomic_write_json(target, {"version": "old"})
    proc = forkserver.Process(target=_write_then_die, args=(str(target),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert json.loads(target.read_text()) == {"version": "old"}
    temps = [p.name for p in tmp_path.iterdir() if p.name != "state.json"]
    assert len(temps) == 1 and temps[0].startswith(".state.json.") and temps[0].endswith(".tmp")
