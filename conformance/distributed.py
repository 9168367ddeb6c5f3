"""Real multi-process jobs for the gloo tests: launch W ranks, train in lockstep, checkpoint, crash, resume.

Why real processes: "resumes on another world size" and "survives kill -9"
are claims about separate address spaces, a real process group and files on
disk. Mocks would test the mock. Each rank here is ``python -m
conformance.distributed JOB.json RANK`` (a fresh interpreter, as under
``spawn``): it joins a gloo process group through a ``file://`` rendezvous in
the test's directory (traffic stays on loopback), builds its loader with
rank and world size taken from the process group, and "trains": per step it
appends one JSON line to its own log (the step and what ``Job.record`` makes
of the batch), flushes, and joins an ``all_reduce`` so ranks move in
lockstep. Every ``checkpoint_every`` steps (and at ``stop_at``) the ranks
take a checkpoint and rank 0 writes ``{"step", "world_size", "state"}``
atomically (``impl._atomic.atomic_write_json``): a reader sees the previous
checkpoint or the new one, never a torn file.

One rank body serves every gloo test: what differs between them is only
what each rank loads and what it logs, named in the job as ``module:function``
strings (``Job.build``, ``Job.record``; by default a ``PackedDataset`` over
``store`` with ``config``, logging each sample's epoch, global index and token
sum), and how a checkpoint is taken (``Job.gather_state``): by default the
ranks check they agree on the position, meet at a barrier and rank 0 alone
calls ``state_dict()``; a loader whose ``state_dict()`` is a collective
(streaming lanes, STREAM-14; a lane mixture, MIX-24) has every rank call it
and log its hash (:func:`state_hash`), so a test can check every rank got
the same JSON.

The launcher (:func:`run_job`) puts a timeout on every wait and kills every
rank it started when one fails or time runs out, as a job scheduler tears a
job down, so CI never hangs. Both limits (the job's ``timeout``, default
:data:`JOIN_TIMEOUT`, and gloo's ``Job.timeout``) are multiplied by the
environment variable ``LOADSPEC_TIMEOUT_SCALE`` (default 1; e.g. 4 on a
loaded machine, ``conformance.ranks.scaled``), so a slow machine gets more
time instead of a ``TimeoutError`` that reads like a failure.

Worked example (what ``conformance/tests/test_distributed_gloo.py`` does)::

    job = Job(store="…/store", config=config.to_json(), batch_size=4, stop_at=3, checkpoint_every=3,
              checkpoint="…/ckpt.json", log_dir="…/run1")
    run_job(job, world_size=2, workdir=tmp).check_ok("2 ranks")   # 2 ranks, 3 steps, checkpoint
    run_job(dataclasses.replace(job, stop_at=None, resume_from="…/ckpt.json", log_dir="…/run2"),
            world_size=3, workdir=tmp)                     # the rest of the epoch on 3 ranks
    read_logs("…/run1"), read_logs("…/run2")               # {rank: [{"step", "epoch", "indices", "sums"}, …]}
    reference_batches(corpus, config, Topology(world_size=2, rank=0, batch_size=4), steps=3)  # what rank 0 owes
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
JOIN_TIMEOUT = 120.0
"""Seconds a whole job may take before every rank is killed (CI must never hang), times ``LOADSPEC_TIMEOUT_SCALE``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """What every rank of one launch runs (written as JSON for the rank processes)."""

    batch_size: int
    log_dir: str
    checkpoint: str
    store: str | None = None
    """The store the default ``build`` opens (a path or URL)."""
    config: dict[str, Any] | None = None
    """The default ``build``'s ``PipelineConfig``, as ``to_json()`` writes it."""
    checkpoint_every: int = 1
    stop_at: int | None = None
    """Stop after this global step (None: at the end of the epoch); a checkpoint is taken there too."""
    resume_from: str | None = None
    die_at: tuple[int, int] | None = None
    """``(rank, step)``: that rank SIGKILLs itself right after logging that step (before its all_reduce)."""
    num_workers: int = 0
    timeout: float = 60.0
    """Seconds a collective waits for a peer (gloo's timeout)."""
    open_kwargs: dict[str, Any] | None = None
    """Keyword arguments of ``TokenStore.open(store, ...)``: a URL store's ``local`` cache, ``cache_limit``, ..."""
    plans_dir: str | None = None
    """Where the plan cache lives (default: beside a local ``store``)."""
    die_downloading_after: int | None = None
    """Every rank SIGKILLs itself halfway through its first remote token-file download after logging this step."""
    build: str = "conformance.distributed:packed_loader"
    """``module:function`` called in each rank as ``function(job)``: the rank's loader (in the process group)."""
    record: str = "conformance.distributed:packed_record"
    """``module:function`` called on every batch: the JSON fields of that step's log line besides ``step``."""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What a test's own ``build`` reads (file lists, store paths, options): JSON, as the job travels as JSON."""
    gather_state: bool = False
    """Every rank calls ``state_dict()`` at a checkpoint (a collective) and logs ``{"checkpoint", "sha"}``."""


def _pipeline_config(data: dict[str, Any]):
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig
    from reference.resume import PipelineConfig

    return PipelineConfig(packing=PackingConfig(**data["packing"]), ordering=OrderingConfig(**data["ordering"]),
                          end=data["end"])


# --------------------------------------------------------------------------- one rank

_LOGGED = [0]
"""The last step this rank logged (what ``die_downloading_after`` compares with)."""


def _die_in_downloads(after_step: int) -> None:
    """Make this process SIGKILL itself halfway through its first token-file download once ``after_step`` is logged.

    The partial file then holds half the object and the download lock names
    a dead holder: what a node sees when a rank dies mid-download.
    """
    from impl.remote import RemoteFiles

    original = RemoteFiles._download_once

    def download_once(self: Any, name: str, st: Any, partial: str) -> None:
        if _LOGGED[0] >= after_step and not name.endswith((".json", ".crc32")):
            data = self._fs.cat_file(self._path(name))
            with open(partial, "wb") as out:
                out.write(data[: len(data) // 2])
                out.flush()
                os.fsync(out.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, name, st, partial)

    RemoteFiles._download_once = download_once  # type: ignore[method-assign]



def _resolve(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def packed_loader(job: Job) -> Any:
    """The default ``Job.build``: ``build_dataloader`` over a ``PackedDataset`` of ``job.store`` with ``job.config``."""
    from impl.dataset import PackedDataset
    from impl.loader import build_dataloader
    from impl.store import TokenStore

    if job.store is None or job.config is None:
        raise ValueError("the default Job.build needs Job.store and Job.config; or name a build of your own")
    dataset = PackedDataset.from_config(TokenStore.open(job.store, **(job.open_kwargs or {})),
                                        _pipeline_config(job.config),
                                        cache_dir=job.plans_dir or Path(job.store).parent / "plans")
    return build_dataloader(dataset, batch_size=job.batch_size, num_workers=job.num_workers)


def packed_record(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The default ``Job.record``: each sample's epoch, global index and token sum (what the reference checks)."""
    return {"epoch": batch["epoch"].tolist(), "indices": batch["sample_index"].tolist(),
            "sums": batch["input_ids"].sum(dim=1).tolist()}


def state_hash(state: Any) -> str:
    """The hash a ``gather_state`` rank logs for its ``state_dict()`` (SHA-256 of the JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def run_rank(job: Job, rank: int, world_size: int, init_method: str) -> None:
    """The body of rank ``rank``: join the group, build, resume if asked, train, log and checkpoint."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=job.timeout))
    try:
        if job.die_downloading_after is not None:
            _die_in_downloads(job.die_downloading_after)
        loader = _resolve(job.build)(job)
        _train(job, loader, _resolve(job.record), rank, world_size)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(job: Job, loader: Any, record: Callable[[Any], dict[str, Any]], rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    from impl._atomic import atomic_write_json

    step = 0
    if job.resume_from:
        saved = json.loads(Path(job.resume_from).read_text())
        loader.load_state_dict(saved["state"])
        step = saved["step"]
    log_path = Path(job.log_dir) / f"rank{rank}.jsonl"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:

        def write(line: dict[str, Any]) -> None:
            log.write(json.dumps(line) + "\n")
            log.flush()

        for batch in loader:
            step += 1
            _LOGGED[0] = step
            write({"step": step, **record(batch)})
            if job.die_at is not None and tuple(job.die_at) == (rank, step):
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(torch.ones(1))
            if step % job.checkpoint_every == 0 or step == job.stop_at:
                if job.gather_state:
                    state = loader.state_dict()          # every rank: a collective (STREAM-14, MIX-24)
                    write({"checkpoint": step, "sha": state_hash(state)})
                else:
                    position = torch.tensor([loader.epoch, loader.consumed, -loader.epoch, -loader.consumed])
                    dist.all_reduce(position, op=dist.ReduceOp.MAX)
                    if position[:2].tolist() != (-position[2:]).tolist():
                        raise RuntimeError(f"ranks disagree on the position at step {step}: max {position.tolist()}")
                    dist.barrier()
                    state = loader.state_dict() if rank == 0 else None
                if rank == 0:
                    atomic_write_json(job.checkpoint, {"step": step, "world_size": world_size, "state": state})
            if job.stop_at is not None and step >= job.stop_at:
                break


def main(argv: list[str]) -> int:
    job_path, rank = argv[0], int(argv[1])
    raw = json.loads(Path(job_path).read_text())
    job = Job(**{k: (tuple(v) if k == "die_at" and v is not None else v) for k, v in raw["job"].items()})
    run_rank(job, rank, raw["world_size"], raw["init_method"])
    return 0


# --------------------------------------------------------------------------- the launcher


@dataclasses.dataclass
class JobResult:
    returncodes: list[int]
    stderr: list[str]
    seconds: float

    def describe(self) -> str:
        tails = "\n".join(f"--- rank {r} (exit {c}):\n{e[-1500:]}" for r, (c, e) in enumerate(zip(self.returncodes, self.stderr)))
        return f"exit codes {self.returncodes} after {self.seconds:.1f}s\n{tails}"

    def check_ok(self, what: str, *, clause: str = "RES-4") -> None:
        """Every rank exited 0, or a failure citing ``clause`` that shows each rank's exit code and stderr."""
        from conformance.assertions import check

        check(all(code == 0 for code in self.returncodes), clause=clause, what=f"{what}: {self.describe()}")


def run_job(job: Job, world_size: int, workdir: Path, *, timeout: float = JOIN_TIMEOUT) -> JobResult:
    """Run every rank of ``job`` as its own process; kill them all when one fails or ``timeout`` passes.

    Returns exit codes (``-9``: killed by SIGKILL) and each rank's stderr. A
    rank that exits non-zero makes the launcher kill the others at once, as a
    job scheduler would; the caller decides whether that was expected.
    ``timeout`` and ``job.timeout`` are multiplied by ``LOADSPEC_TIMEOUT_SCALE``.
    """
    from conformance.ranks import reap, scaled  # the launcher's side only: a rank process never imports the kit

    timeout = scaled(timeout)
    job = dataclasses.replace(job, timeout=scaled(job.timeout))
    workdir = Path(workdir)
    launch = uuid.uuid4().hex[:12]
    job_file = workdir / f"job-{launch}.json"
    rendezvous = workdir / f"rendezvous-{launch}"
    job_file.write_text(json.dumps({"job": dataclasses.asdict(job), "world_size": world_size,
                                    "init_method": f"file://{rendezvous}"}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    errs = [open(workdir / f"stderr-{launch}-rank{r}.txt", "w+b") for r in range(world_size)]  # noqa: SIM115 (closed in the finally below)
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world_size):
            procs.append(subprocess.Popen([sys.executable, "-m", "conformance.distributed", str(job_file), str(r)],
                                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=errs[r]))
        deadline = start + timeout
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        timed_out = time.monotonic() > start + timeout
        stderr = reap(procs, errs)
    result = JobResult([p.returncode for p in procs], stderr, time.monotonic() - start)
    if timed_out:
        raise TimeoutError(f"job did not finish within {timeout}s; every rank was killed. {result.describe()}")
    return result


def read_logs(log_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Each rank's step records, in order (a torn last line of a killed rank is ignored)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(log_dir).glob("rank*.jsonl")):
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        out[int(path.stem.removeprefix("rank"))] = records
    return out


# --------------------------------------------------------------------------- what the reference says


def reference_batches(corpus: Any, config: Any, topology: Any, *, consumed: int = 0, steps: int = -1) -> list[list[int]]:
    """The reference's batches (global sample indices) of epoch 0 for one rank's ``topology``, from ``consumed``.

    ``steps`` (>= 0) stops after that many batches: what a job that stopped
    at ``stop_at`` owes. Compared with ``[rec["indices"] for rec in read_logs(...)[rank]]``.
    """
    from reference.loader import ReferenceLoader
    from reference.resume import make_state

    ref = ReferenceLoader(corpus, config, topology)
    ref.load_state_dict(make_state(ref.fingerprint, 0, consumed))
    out: list[list[int]] = []
    for batch in ref:
        if steps >= 0 and len(out) == steps:
            break
        out.append([row.sample_index for row in batch])
    return out


def check_token_sums(corpus: Any, config: Any, logs: Mapping[int, list[dict[str, Any]]], *,
                     epoch: int | None = None) -> None:
    """The token sum of every logged sample equals the reference sample's of epoch 0 (RES-1).

    With ``epoch``, every logged sample must also be of that epoch (a job that
    runs on past the epoch it was meant to finish would fail here first).
    """
    from conformance.assertions import assert_equal, check
    from reference.loader import ReferenceLoader

    samples = ReferenceLoader(corpus, config).samples(0)
    for rank, records in logs.items():
        for rec in records:
            if epoch is not None:
                check(rec["epoch"] == [epoch] * len(rec["indices"]), clause="RES-1",
                      what=f"rank {rank} step {rec['step']} left epoch {epoch}")
            assert_equal(rec["sums"], [sum(samples[i].input_ids) for i in rec["indices"]], clause="RES-1",
                         what=f"rank {rank} step {rec['step']} token sums")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
