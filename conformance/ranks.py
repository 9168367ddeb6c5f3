"""A per-rank multi-process harness for any adapter: one process per rank, a file rendezvous, a timeout on every join.

Why: the in-process suite simulates ranks by building one loader per rank in
one interpreter. That cannot grade a loader that needs one process per rank
(it reads ``RANK``/``WORLD_SIZE`` or joins ``torch.distributed``, shares memory
between local ranks, starts workers per process), and it cannot show what a
real job sees when ranks disagree: a hang. Here every rank is its own process
(``python -m conformance.ranks JOB.json RANK``) that

1. has ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` set (as
   ``torchrun`` sets them) and imports the adapter by its spec
   (``module:factory``, the same string as ``--loadspec-loader``);
2. joins a gloo process group through a ``file://`` rendezvous under the
   job's directory when the adapter sets ``process_group = True`` (its loader
   reads ``torch.distributed``; traffic stays on loopback), and builds the
   loader for its rank in a workdir of its own; ``LOADSPEC_NODE_DIR`` names a
   directory all ranks of the job share, as a node-local disk (for peers
   whose local ranks must open the same files);
3. optionally loads a checkpointed state (its own, or rank 0's);
4. "trains": logs every batch's provenance rows to ``log/rank{r}.jsonl`` and
   joins the other ranks after every step, in lockstep like a collective;
5. at ``stop_at`` steps writes its state to ``checkpoint/rank{r}.json``
   (atomically) and stops; otherwise runs to the end of the epoch.

The join is a file rendezvous (``sync/rank{r}.json``: each rank's step,
phase and whether it is done), so when ranks disagree the harness can say
who waited for whom: a rank with a batch for step s while another rank
already finished after fewer steps is recorded as *unmatched* (PART-1: its
collective would hang), and a rank that waits longer than
``RankJob.wait_timeout`` gives up naming the ranks it waited for and what
they were doing. The parent (:func:`launch`) has its own deadline, kills
every rank when one fails or time runs out, and raises :class:`RankTimeout`
or :class:`RankFailed` whose message names each rank's phase.

A loader's explicit refusal of a state (an exception of a type the adapter
declares in ``refusal_types``, ``conformance.adapter.is_refusal``, at
``load_state_dict`` or at the first batch after it) is an outcome, not a
crash: the rank records it and stops, and so do the others at their next
join, as a job whose rank raised would. Any other exception there is
recorded the same way and graded as a failure that shows it.

Lockstep skew (``RankJob.ahead``): at ``stop_at`` one rank, 0 or any other,
takes one more batch before every rank writes its state (the loop fetched
its next batch before the checkpoint callback ran). Each rank's state must
count what that rank was handed (RES-6), never rank 0's count scaled by the
number of ranks: restored by every rank from its own state on the same
topology, each rank continues its own stream exactly; restored from rank 0's
state (``restore="rank0"``: the checkpoint is rank 0's cut), a rank that was
ahead of rank 0 redoes the batches past the cut, as after a crash, and
nothing else is repeated or lost (:func:`grade_resume`,
:func:`grade_topology_change` count only the batches up to the cut).

Time limits (a job's deadline, a rank's wait at a join, the grace after a
refusal) are multiplied by ``LOADSPEC_TIMEOUT_SCALE`` (default 1; e.g. 4 on
a loaded CI machine), read by :func:`scaled` when a job is launched, so a
slow machine is given time rather than reported as a hang; a job that still
runs out raises :class:`RankTimeout`, which ``conformance.matrix`` reports
as ``timeout``, never as a defect caught.

Worked example (what ``conformance/tests/test_any_loader_processes.py`` does)::

    job = RankJob(loader="conformance.adapters.reference:adapter", corpus=corpus, config=config.to_json(),
                  world_size=2, batch_size=2)
    whole = launch(job, tmp / "whole")                        # every rank's batches of the epoch
    head = launch(replace(job, stop_at=3), tmp / "head")      # 3 steps, then checkpoint/rank{r}.json
    rest = launch(replace(job, resume_from=str(head.checkpoint_dir)), tmp / "rest")
    assert [h + r for h, r in zip(head.batches, rest.batches)] == whole.batches   # RES-1, checked per rank
    grown = launch(replace(job, world_size=3, batch_size=1, resume_from=str(head.checkpoint_dir)), tmp / "grown")
    grade_topology_change(head, grown, ...)                   # refused, or every pair at most once and < 1 batch lost
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from conformance.adapter import CanonicalRow, close, describe_exception, is_refusal
from conformance.assertions import assert_equal, check
from conformance.provenance import EpochCoverage, check_epoch_coverage, check_provenance, pair_counts, promised_pairs

REPO_ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT = 180.0
"""Seconds a whole job may take (start-up included) before the parent kills every rank (times the scale)."""
TIMEOUT_SCALE_ENV = "LOADSPEC_TIMEOUT_SCALE"
"""The environment variable whose value multiplies every time limit of the kit's multi-process harnesses."""
EXIT_JOIN_TIMEOUT = 3
"""A rank's exit code when it gave up waiting at a join."""
REFUSAL_GRACE = 10.0
"""Seconds the other ranks get to stop after one refused a state, before the launcher kills them."""


def timeout_scale() -> float:
    """``LOADSPEC_TIMEOUT_SCALE`` as a number > 0 (1 when unset); anything else raises ``ConfigError`` naming it.

    >>> import os; os.environ[TIMEOUT_SCALE_ENV] = "2.5"; timeout_scale()
    2.5
    >>> del os.environ[TIMEOUT_SCALE_ENV]; timeout_scale()
    1.0
    """
    from reference.errors import ConfigError

    raw = os.environ.get(TIMEOUT_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{TIMEOUT_SCALE_ENV}={raw!r} must be a finite number > 0 that multiplies the kit's "
                          "time limits (e.g. 4 on a loaded machine); unset it for 1")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` times :func:`timeout_scale`: every limit a launcher waits on goes through this."""
    return seconds * timeout_scale()


class RankTimeout(Exception):
    """A job did not finish in time: a rank waited too long at a join, or the job passed its deadline."""


class RankFailed(Exception):
    """A rank raised (outside a refusal of a state); the message carries its phase and traceback."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankJob:
    """What every rank of one launch runs (written as JSON for the rank processes)."""

    loader: str
    """The adapter's spec, ``module:factory`` (as for ``--loadspec-loader``)."""
    corpus: list[list[list[int]]]
    config: dict[str, Any]
    """``PipelineConfig.to_json()``."""
    world_size: int
    batch_size: int
    num_workers: int = 0
    stop_at: int | None = None
    """Checkpoint and stop after this many steps of this job (None: run to the end of the epoch)."""
    resume_from: str | None = None
    """A checkpoint directory written by an earlier job (``rank{r}.json`` per rank)."""
    restore: str = "own"
    """``own``: rank r loads the state of rank ``r % saved world size``; ``rank0``: every rank loads rank 0's."""
    ahead: int | None = None
    """Lockstep skew: with ``stop_at``, this rank takes one batch more than the others before every rank writes
    its state (None: none does)."""
    node_dir: str | None = None
    """``LOADSPEC_NODE_DIR`` of the ranks (default: ``<job directory>/work/node``); keep it across the jobs of
    one test when a peer records its data path in its state (a restarted job reads the same path)."""
    wait_timeout: float = 60.0
    """Seconds a rank waits at a join (the rendezvous, a step, the end) before giving up and naming whom it waited for."""
    process_group: bool | None = None
    """Join a gloo ``torch.distributed`` group (file rendezvous) before building, for loaders that read it
    (None: when the adapter sets ``process_group = True``)."""
    global_state: bool = False
    """The adapter declares ``state:global``: every rank's checkpoint holds the job's one state, where every rank
    stood (:meth:`RankRun.cut`)."""


@dataclasses.dataclass
class RankRun:
    """What one launch produced, read back by the parent."""

    job: RankJob
    directory: Path
    batches: list[list[list[CanonicalRow]]]
    """Per rank, the batches it trained, in order."""
    results: list[dict[str, Any]]
    """Per rank: ``steps``, and ``refused`` (phase, error, is_refusal) or ``unmatched`` (why it stopped early)."""
    seconds: float

    @property
    def checkpoint_dir(self) -> Path:
        return self.directory / "checkpoint"

    @property
    def checkpointed(self) -> bool:
        """Whether every rank wrote its state (the job reached ``stop_at``)."""
        return all((self.checkpoint_dir / f"rank{r}.json").exists() for r in range(self.job.world_size))

    @property
    def steps(self) -> list[int]:
        return [len(b) for b in self.batches]

    def rows(self) -> list[CanonicalRow]:
        return [row for batches in self.batches for batch in batches for row in batch]

    def refusals(self) -> dict[int, dict[str, Any]]:
        return {r: res["refused"] for r, res in enumerate(self.results) if res.get("refused")}

    def unmatched(self) -> dict[int, str]:
        return {r: res["unmatched"] for r, res in enumerate(self.results) if res.get("unmatched")}

    def saved_steps(self) -> list[int]:
        """Per rank, the batches its checkpointed state counts (the rank's steps when it wrote it)."""
        return [int(json.loads((self.checkpoint_dir / f"rank{r}.json").read_text(encoding="utf-8"))["steps"])
                for r in range(self.job.world_size)]

    def cut(self, after: RankJob, rank: int) -> int:
        """How many of ``rank``'s batches of this job count as trained once ``after`` restored its checkpoint.

        The state a rank of ``after`` loads is the cut: with ``restore="own"`` each rank's own (all it
        trained); with ``restore="rank0"`` rank 0's, so a rank that was ahead of rank 0 redoes its batches past
        rank 0's count (they came after the checkpoint, as batches trained after a checkpoint and lost in a crash).
        With a global state (``job.global_state``) rank 0's copy holds every rank's own position, so each rank's
        cut is its own count whichever copy it restores (:meth:`check_global_state` checks the copies are equal).
        """
        saved = self.saved_steps()
        if self.job.global_state:
            return saved[rank]
        return saved[0] if after.restore == "rank0" else saved[rank % len(saved)]

    def check_global_state(self, repro: dict[str, Any]) -> None:
        """With ``job.global_state``, fail unless every rank saved the same state (the declared ``state:global``)."""
        __tracebackhide__ = True
        if not self.job.global_state:
            return
        states = [json.loads((self.checkpoint_dir / f"rank{r}.json").read_text(encoding="utf-8"))["state"]
                  for r in range(self.job.world_size)]
        differ = [r for r, state in enumerate(states) if state != states[0]]
        check(not differ, clause="RES-6", what=f"the adapter declares state:global, but rank(s) {differ} saved a "
                                               f"state other than rank 0's: {states[differ[0]] if differ else ''!r} "
                                               f"vs {states[0]!r}", repro=repro)

    def kept(self, after: RankJob) -> list[list[list[CanonicalRow]]]:
        """Per rank, its batches up to the cut that ``after`` restores (:meth:`cut`).

        A cut past a rank's batches (every rank restoring rank 0's state while rank 0 was ahead) skips that
        rank's batch for every loader, so nothing can be graded exactly: ``ValueError``, naming the fix.
        """
        short = [r for r, b in enumerate(self.batches) if self.cut(after, r) > len(b)]
        if short:
            raise ValueError(f"rank(s) {short} trained fewer batches than the state they restore counts (rank 0 was "
                             "ahead and every rank restores its state): any loader skips their batch; grade that "
                             "skew with restore='own'")
        return [b[:self.cut(after, r)] for r, b in enumerate(self.batches)]


# --------------------------------------------------------------------------- the rank side


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


class _Sync:
    """One rank's view of the file rendezvous: its own progress file, and joins on everyone's."""

    def __init__(self, directory: Path, rank: int, world_size: int, wait_timeout: float) -> None:
        self.dir, self.rank, self.world_size, self.wait_timeout = directory, rank, world_size, wait_timeout
        self.state: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "step": 0, "phase": "starting",
                                      "since": time.time(), "done": False, "refused": None}

    def path(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.json"

    def set(self, phase: str, **fields: Any) -> None:
        self.state.update(fields, phase=phase, since=time.time())
        _write_json(self.path(self.rank), self.state)

    def others(self) -> dict[int, dict[str, Any]]:
        return {q: _read_json(self.path(q)) or {"phase": "not started", "step": 0, "done": False, "since": None}
                for q in range(self.world_size) if q != self.rank}

    def join(self, step: int, what: str) -> str | None:
        """Wait until every other rank reached ``step`` or is done; None, or why this rank must stop.

        A rank that finished after fewer steps means this rank's collective
        would hang (unmatched); a rank that refused a state stops the job.
        """
        self.set(f"waiting at the join {what}", step=step)
        start, pause = time.monotonic(), 0.002
        while True:
            others = self.others()
            refused = {q: s for q, s in others.items() if s.get("refused")}
            if refused:
                return f"rank {min(refused)} refused the state"
            short = {q: s["step"] for q, s in others.items() if s.get("done") and s["step"] < step}
            if short:
                return (f"rank {self.rank} has a batch for step {step} but rank(s) "
                        + ", ".join(f"{q} finished after {n} steps" for q, n in sorted(short.items()))
                        + ": in a real job its collective would hang")
            missing = [q for q, s in others.items() if not s.get("done") and s["step"] < step]
            if not missing:
                return None
            waited = time.monotonic() - start
            if waited > self.wait_timeout:
                raise RankTimeout(f"rank {self.rank} waited {waited:.0f}s at the join {what} for rank(s) "
                                  f"{missing}: " + _phases({q: others[q] for q in missing}))
            time.sleep(pause)
            pause = min(0.05, pause * 2)

    def barrier(self, what: str) -> None:
        """Wait until every other rank reached this barrier (or stopped: refused, done) before going on."""
        self.set(f"waiting at {what}", barrier=what)
        start = time.monotonic()
        while True:
            others = self.others()
            missing = [q for q, s in others.items() if s.get("barrier") != what and not s.get("done")]
            if not missing:
                return
            waited = time.monotonic() - start
            if waited > self.wait_timeout:
                raise RankTimeout(f"rank {self.rank} waited {waited:.0f}s at {what} for rank(s) {missing}: "
                                  + _phases({q: others[q] for q in missing}))
            time.sleep(0.01)

    def finish(self, step: int, **fields: Any) -> None:
        self.set("done", step=step, done=True, **fields)

    def wait_all_done(self) -> None:
        """The end-of-job join: every rank done (so none tears the process group down under another)."""
        self.set("waiting at the end of the job for the other ranks")
        start = time.monotonic()
        while True:
            others = self.others()
            missing = [q for q, s in others.items() if not s.get("done")]
            if not missing:
                return
            waited = time.monotonic() - start
            if waited > self.wait_timeout:
                raise RankTimeout(f"rank {self.rank} waited {waited:.0f}s at the end of the job for rank(s) "
                                  f"{missing}: " + _phases({q: others[q] for q in missing}))
            time.sleep(0.02)


def _phases(statuses: Mapping[int, Mapping[str, Any] | None]) -> str:
    now = time.time()
    parts = []
    for q, s in sorted(statuses.items()):
        if not s or s.get("since") is None:
            parts.append(f"rank {q} never started")
        else:
            parts.append(f"rank {q} was {s['phase']!r} for {now - s['since']:.1f}s ({s.get('step', 0)} steps done)")
    return "; ".join(parts)


def _finished(statuses: Mapping[int, Mapping[str, Any] | None], codes: Sequence[int | None]) -> str:
    """The ranks that had exited by themselves, and how (refused a state, finished after n steps)."""
    parts = []
    for r, s in sorted(statuses.items()):
        if codes[r] != 0 or not s or not s.get("done"):
            continue
        if s.get("refused"):
            parts.append(f"rank {r} refused the state at {s['refused']['phase']} ({s['refused']['error'][:300]})")
        else:
            parts.append(f"rank {r} finished after {s.get('step', 0)} steps")
    return (". Already exited: " + "; ".join(parts)) if parts else ""


def _pipeline_config(data: dict[str, Any]) -> Any:
    from reference.ordering import OrderingConfig
    from reference.packing import PackingConfig
    from reference.resume import PipelineConfig

    split = data.get("split")
    return PipelineConfig(packing=PackingConfig(**data["packing"]), ordering=OrderingConfig(**data["ordering"]),
                          end=data["end"], split=tuple(split) if split is not None else None)


def _row_json(row: CanonicalRow) -> list[Any]:
    return [row.epoch, row.sample_index, row.input_ids, row.labels, row.position_ids, row.doc_ids, row.token_offsets]


def _row_from_json(data: Sequence[Any]) -> CanonicalRow:
    return CanonicalRow(int(data[0]), int(data[1]), *(tuple(int(v) for v in col) for col in data[2:]))


def _saved_state(job: RankJob, rank: int) -> Any:
    directory = Path(str(job.resume_from))
    saved = sorted(directory.glob("rank*.json"), key=lambda p: int(p.stem.removeprefix("rank")))
    if not saved:
        raise FileNotFoundError(f"no rank*.json checkpoint in {directory}")
    source = 0 if job.restore == "rank0" else rank % len(saved)
    return json.loads((directory / f"rank{source}.json").read_text(encoding="utf-8"))["state"]


def run_rank(job: RankJob, rank: int, directory: Path) -> int:
    """The body of rank ``rank``; returns its exit code (0 also for a refusal or an unmatched step)."""
    from conformance.plugin import load_adapter
    from reference.resume import Topology

    sync = _Sync(directory / "sync", rank, job.world_size, job.wait_timeout)
    log_path = directory / "log" / f"rank{rank}.jsonl"
    workdir = directory / "work" / f"rank{rank}"
    workdir.mkdir(parents=True, exist_ok=True)
    dist = None
    loader = None
    step = 0
    try:
        sync.set("importing the adapter")
        adapter = load_adapter(job.loader)
        if job.process_group if job.process_group is not None else getattr(adapter, "process_group", False):
            sync.set("at the rendezvous (torch.distributed gloo, file://)")
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"file://{directory / 'rendezvous'}", rank=rank,
                                    world_size=job.world_size, timeout=timedelta(seconds=job.wait_timeout))
        topology = Topology(world_size=job.world_size, rank=rank, batch_size=job.batch_size,
                            num_workers=job.num_workers)
        sync.set("building the loader")
        loader = adapter.build(job.corpus, _pipeline_config(job.config), topology, workdir=workdir)
        resumed = job.resume_from is not None
        phase = "load_state_dict"
        with open(log_path, "a", encoding="utf-8") as log:
            try:
                if resumed:
                    sync.set(phase)
                    loader.load_state_dict(_saved_state(job, rank))
                it = iter(loader)
                phase = "the first batch after load_state_dict"
                sync.set(f"next batch (step {step + 1})")
                batch = next(it, None)
            except Exception as exc:
                if not resumed:
                    raise
                sync.finish(step, refused={"phase": phase, "error": describe_exception(exc)[:2000],
                                           "is_refusal": is_refusal(adapter, exc),
                                           "where": "".join(traceback.format_exception(exc)[-3:])[-1500:]})
                return 0
            unmatched = None
            while batch is not None:
                step += 1
                log.write(json.dumps({"step": step, "rows": [_row_json(r) for r in batch]}) + "\n")
                log.flush()
                unmatched = sync.join(step, f"after step {step}")
                if unmatched is not None:
                    break
                if job.stop_at is not None and step >= job.stop_at:
                    from impl._atomic import atomic_write_json

                    if job.ahead is not None:
                        if job.ahead == rank:
                            sync.set(f"next batch (step {step + 1}, one ahead of the other ranks)")
                            extra = next(it, None)
                            if extra is not None:
                                step += 1
                                log.write(json.dumps({"step": step, "rows": [_row_json(r) for r in extra]}) + "\n")
                                log.flush()
                        sync.barrier("the checkpoint")  # every rank's batches handed out before any state is taken
                    sync.set("state_dict")
                    state = json.loads(json.dumps(loader.state_dict()))
                    atomic_write_json(directory / "checkpoint" / f"rank{rank}.json",
                                      {"rank": rank, "world_size": job.world_size, "steps": step, "state": state})
                    break
                sync.set(f"next batch (step {step + 1})")
                batch = next(it, None)
        sync.finish(step, unmatched=unmatched)
        sync.wait_all_done()
        return 0
    except RankTimeout as exc:
        sync.set("gave up", error=str(exc))
        print(str(exc), file=sys.stderr, flush=True)
        return EXIT_JOIN_TIMEOUT
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher's report, then the rank exits 1
        sync.set(f"raised in {sync.state['phase']!r}", error=describe_exception(exc)[:2000])
        traceback.print_exc()
        return 1
    finally:
        if loader is not None:
            close(loader)
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    job_path, rank = Path(argv[0]), int(argv[1])
    raw = json.loads(job_path.read_text(encoding="utf-8"))
    return run_rank(RankJob(**raw), rank, job_path.parent)


# --------------------------------------------------------------------------- the parent side


def _env(job: RankJob, rank: int, directory: Path) -> dict[str, str]:
    path = [str(REPO_ROOT), *(p for p in sys.path if p), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), RANK=str(rank),
                LOADSPEC_NODE_DIR=job.node_dir or str(directory / "work" / "node"),
                WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(job.world_size),
                GROUP_RANK="0", NODE_RANK="0", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo",
                OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def reap(procs: Sequence[subprocess.Popen[bytes]], errs: Sequence[IO[bytes]]) -> list[str]:
    """Kill the ranks still running, wait for each (30 s at most) and return each rank's stderr, closing ``errs``.

    One teardown for every multi-process launcher of the kit (this harness and
    impl's gloo jobs in ``conformance.distributed``): no rank outlives its job.
    """
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
    stderr = []
    for f in errs:
        f.seek(0)
        stderr.append(f.read().decode("utf-8", "replace"))
        f.close()
    return stderr


def launch(job: RankJob, directory: Path, *, timeout: float = JOB_TIMEOUT) -> RankRun:
    """Run every rank of ``job`` as its own process under ``directory`` (which must not exist yet).

    Raises :class:`RankTimeout` when a rank gave up at a join or ``timeout``
    passed, :class:`RankFailed` when a rank raised; every rank still running
    is killed first (as a scheduler tears a job down), so a hang never hangs
    the caller. The message names every rank's phase. ``timeout``,
    ``job.wait_timeout`` and the grace after a refusal are multiplied by
    ``LOADSPEC_TIMEOUT_SCALE`` (:func:`scaled`); the returned run's ``job``
    is ``job`` as given.
    """
    directory = Path(directory)
    given, grace = job, scaled(REFUSAL_GRACE)
    timeout = scaled(timeout)
    job = dataclasses.replace(job, wait_timeout=scaled(job.wait_timeout))
    if job.resume_from is not None and not any(Path(job.resume_from).glob("rank*.json")):
        raise FileNotFoundError(f"resume_from={job.resume_from!r} holds no rank*.json checkpoint: the job that was "
                                "to write it ended before its stop_at step")
    for sub in ("sync", "log", "checkpoint", "work"):
        (directory / sub).mkdir(parents=True, exist_ok=sub != "sync")
    job_file = directory / "job.json"
    job_file.write_text(json.dumps(dataclasses.asdict(job)), encoding="utf-8")
    errs = [open(directory / f"stderr-rank{r}.txt", "w+b") for r in range(job.world_size)]  # noqa: SIM115 (closed below)
    start = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    timed_out, refused_at, scanned = False, None, 0.0

    def read_statuses() -> dict[int, Any]:
        return {r: _read_json(directory / "sync" / f"rank{r}.json") for r in range(job.world_size)}

    try:
        for r in range(job.world_size):
            procs.append(subprocess.Popen([sys.executable, "-m", "conformance.ranks", str(job_file), str(r)],
                                          cwd=directory, env=_env(job, r, directory), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=errs[r]))
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            now = time.monotonic()
            if now - start > timeout:
                timed_out = True
                break
            if refused_at is None and now - scanned > 0.25:
                scanned = now
                if any(s and s.get("refused") for s in read_statuses().values()):
                    refused_at = now
            if refused_at is not None and now - refused_at > grace:
                break  # a rank refused the state and exited; a launcher tears the rest of the job down
            time.sleep(0.02)
        statuses = read_statuses()
    finally:
        stderr = reap(procs, errs)
    seconds = time.monotonic() - start
    codes = [p.returncode for p in procs]
    if timed_out:
        running = {r: s for r, s in statuses.items() if codes[r] is None or codes[r] < 0}
        raise RankTimeout(f"the job of {job.world_size} ranks ({job.loader}) did not finish within {timeout:.0f}s; "
                          f"every rank was killed. Still running: {_phases(running)}" + _finished(statuses, codes))
    if refused_at is not None:
        codes = [0 if c is not None and c < 0 else c for c in codes]
    if any(c != 0 for c in codes):
        gave_up = [r for r, c in enumerate(codes) if c == EXIT_JOIN_TIMEOUT]
        failed = [r for r, c in enumerate(codes) if c not in (0, EXIT_JOIN_TIMEOUT, None) and c > 0]
        others = {r: s for r, s in statuses.items() if r not in gave_up + failed and codes[r] != 0}
        if gave_up and not failed:
            why = "; ".join(str((statuses.get(r) or {}).get("error", "")) for r in gave_up)
            raise RankTimeout(f"{why}. The other ranks were killed: {_phases(others)}" + _finished(statuses, codes))
        detail = "\n".join(f"--- rank {r} (exit {codes[r]}), {(statuses.get(r) or {}).get('phase', '?')}:\n"
                           f"{stderr[r][-3000:]}" for r in failed or range(job.world_size))
        raise RankFailed(f"rank(s) {failed} of {job.world_size} failed ({job.loader}); the others were killed: "
                         f"{_phases(others)}" + _finished(statuses, codes) + f"\n{detail}")
    batches: list[list[list[CanonicalRow]]] = []
    for r in range(job.world_size):
        path = directory / "log" / f"rank{r}.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        batches.append([[_row_from_json(row) for row in json.loads(line)["rows"]] for line in lines])
    results = [{"steps": (statuses.get(r) or {}).get("step", 0), "refused": (statuses.get(r) or {}).get("refused"),
                "unmatched": (statuses.get(r) or {}).get("unmatched")} for r in range(job.world_size)]
    return RankRun(given, directory, batches, results, seconds)


# --------------------------------------------------------------------------- grading, across ranks


def universe(adapter: Any, corpus: Any, config: Any, workdir: Path) -> Counter[tuple[int, int]]:
    """The pairs the loader trains in one uninterrupted epoch on one rank with batch size 1, built in this process."""
    from reference.resume import Topology

    loader = adapter.build(corpus, config, Topology(), workdir=Path(workdir))
    try:
        return pair_counts(row for batch in loader for row in batch)
    finally:
        close(loader)


def _repro(job: RankJob, **extra: Any) -> dict[str, Any]:
    return {"loader": job.loader, "corpus": job.corpus, "config": job.config,
            "world_size": job.world_size, "batch_size": job.batch_size, **extra}


def grade_epoch(run: RankRun, *, universe: Counter[tuple[int, int]] | None = None,
                coverage: EpochCoverage | None = None) -> None:
    """One uninterrupted epoch on separate processes: provenance, lockstep, at most once, < 1 global batch lost.

    With ``coverage``, the account an adapter declares for its own end rule
    (``conformance.provenance.declared_coverage``), the epoch must train
    exactly the samples it keeps (:func:`check_epoch_coverage`), and the pairs
    lost are bounded by the samples it drops instead of one global batch.
    """
    __tracebackhide__ = True
    from reference.packing import PackingConfig

    job = run.job
    packing = PackingConfig(**job.config["packing"])
    repro = _repro(job)
    unmatched = run.unmatched()
    check(not unmatched and len(set(run.steps)) <= 1, clause="PART-1",
          what=f"ranks ran {run.steps} steps: " + ("; ".join(unmatched.values()) or "a collective would hang"),
          repro=repro)
    rows = run.rows()
    check_provenance(rows, job.corpus, packing, clause="PACK-4", repro=repro)
    counts = pair_counts(rows)
    twice = sorted(p for p, c in counts.items() if c > 1)
    check(not twice, clause="PART-1", what=f"{len(twice)} (doc, offset) pairs were trained by more than one step or "
                                           f"rank in the epoch, e.g. {twice[:8]}", repro=repro)
    room = job.world_size * job.batch_size * packing.seq_len
    streams = 1
    if coverage is not None:
        from reference.resume import Topology

        check_epoch_coverage(run.batches, job.corpus, _pipeline_config(job.config),
                             Topology(world_size=job.world_size, batch_size=job.batch_size,
                                      num_workers=job.num_workers), coverage, repro=repro)
        room, streams = (coverage.samples - coverage.kept) * packing.seq_len + 1, coverage.streams
    if universe is not None:
        lost = sorted(set(universe) - set(counts))
        check(len(lost) < room, clause=coverage.clause if coverage is not None else "PART-1",
              what=f"{len(lost)} pairs the loader trains on one rank were left untrained on {job.world_size} "
                   f"processes (allowed: fewer than {room}), e.g. {lost[:8]}", repro=repro)
    promise = promised_pairs(job.corpus, packing)
    if promise is not None:
        pairs, tail = promise
        missing = sorted(pairs - set(counts))
        allowed = room + streams * tail - (streams - 1)
        check(len(missing) < allowed, clause="PACK-7" if packing.mode == "concat" else "PACK-18",
              what=f"{len(missing)} within-document pairs that {packing.mode!r} promises were never trained "
                   f"(allowed: fewer than {allowed}), e.g. {missing[:8]}", repro=repro)


def grade_resume(whole: RankRun, parts: Sequence[RankRun]) -> None:
    """Checkpointed and restarted on the same topology, each rank's batches are the uninterrupted run's (RES-1).

    Each job's batches count up to the cut the next job restores (:meth:`RankRun.cut`): all of them when every
    rank restores its own state, even with a rank ahead of the others (RES-6: its state counts its own batches),
    and up to rank 0's count when every rank restores rank 0's state (a rank that was ahead redoes the rest).
    """
    __tracebackhide__ = True
    stops = [p.job.stop_at for p in parts]
    repro = _repro(whole.job, steps_per_job=stops, ahead=[p.job.ahead for p in parts],
                   restore=[p.job.restore for p in parts[1:]])
    for p in parts:
        check(not p.refusals(), clause="RES-1", what=f"a state was refused on the topology that wrote it: "
                                                     f"{p.refusals()}", repro=repro)
        if p.checkpointed:
            p.check_global_state(repro)
    kept = [p.kept(nxt.job) for p, nxt in itertools.pairwise(parts)] + [parts[-1].batches]
    for r in range(whole.job.world_size):
        joined = [b for k in kept for b in k[r]]
        assert_equal(joined, whole.batches[r], clause="RES-6" if any(p.job.ahead is not None for p in parts)
                     else "RES-1",
                     what=f"rank {r}'s batches over {len(parts)} jobs (stopping after {stops} steps, rank(s) "
                          f"{[p.job.ahead for p in parts]} one batch ahead at the checkpoint; counted up to the cut "
                          f"each restart restores: {[len(k[r]) for k in kept[:-1]]} batches), each a new set of "
                          "processes restarted from the last one's checkpoint", repro=repro)


def grade_topology_change(head: RankRun, after: RankRun, *, universe: Counter[tuple[int, int]],
                          coverage: EpochCoverage | None = None) -> str:
    """A checkpoint of ``head`` loaded by a job of another topology: an explicit refusal, or exactly once.

    Returns ``"refused"`` or ``"continued"``; an exception on the load that is
    not of the adapter's declared ``refusal_types`` (shown with its type and
    message), silent duplicates, a loss of a global batch or more, or ranks
    out of lockstep fail with the clause. With a rank ahead at the checkpoint
    (``head.job.ahead``) every rank must restore rank 0's state, and the
    batches past rank 0's count are not counted as trained (:meth:`RankRun.cut`).
    ``coverage``: the account an adapter declares for the rest of the
    checkpoint's epoch on ``after``'s topology (``declared_coverage`` with the
    state); the pairs lost are then bounded by the samples it drops.
    """
    __tracebackhide__ = True
    from reference.packing import PackingConfig

    j1, j2 = head.job, after.job
    if j1.ahead is not None and j2.restore != "rank0":
        raise ValueError("a checkpoint whose ranks were out of lockstep (ahead=...) is one consistent cut only when "
                         "every rank restores rank 0's state: pass restore='rank0'")
    packing = PackingConfig(**j1.config["packing"])
    repro = _repro(j1, workers=j1.num_workers, after=f"world_size={j2.world_size}, batch_size={j2.batch_size}, "
                   f"workers={j2.num_workers}", restore=j2.restore, steps=j1.stop_at, ahead=j1.ahead)
    refusals = after.refusals()
    if refusals:
        bad = {r: v for r, v in refusals.items() if not v["is_refusal"]}
        shown = "; ".join(f"rank {r} at {v['phase']}: {v['error']}\n{v.get('where', '')}" for r, v in bad.items())
        check(not bad, clause="RES-4", what=f"loading the state raised an exception that is not one of the adapter's "
                                            f"declared refusal_types, a failure: {shown}", repro=repro)
        return "refused"
    head.check_global_state(repro)
    kept = [row for batches in head.kept(j2) for batch in batches for row in batch]
    trained = pair_counts(kept, epoch=0) + pair_counts(after.rows(), epoch=0)
    twice = sorted(p for p, c in trained.items() if c > 1)
    check(not twice, clause="RES-4", what=f"after resuming on {j2.world_size} processes x batch {j2.batch_size} x "
                                          f"{j2.num_workers} workers, {len(twice)} pairs were trained twice in the "
                                          f"epoch, e.g. {twice[:8]}", repro=repro)
    g1, g2 = j1.world_size * j1.batch_size, j2.world_size * j2.batch_size
    room = max(g1, g2) * packing.seq_len
    if coverage is not None:
        room = (coverage.samples - coverage.kept) * packing.seq_len + 1
    lost = sorted(set(universe) - set(trained))
    check(len(lost) < room, clause="RES-4", what=f"after resuming on {j2.world_size} processes x batch "
                                                 f"{j2.batch_size} x {j2.num_workers} workers, {len(lost)} pairs were never trained (allowed: "
                                                 f"fewer than {room}), e.g. {lost[:8]}", repro=repro)
    unmatched = after.unmatched()
    check(not unmatched and len(set(after.steps)) <= 1, clause="PART-1",
          what=f"resumed ranks ran {after.steps} steps: " + ("; ".join(unmatched.values()) or "a collective would hang"),
          repro=repro)
    return "continued"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
