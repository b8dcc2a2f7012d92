"""What the fault suite (``test_faults.py``) runs against: a fresh PostgreSQL database and a private
``redis-server`` per test (on a free port, stopped and restarted at will), real ``liar worker``
processes, and readings of their processes (pids, resident memory) from ``/proc``; the resume case's
storm of killed and stopped workers (:class:`Storm`) and what it checks of each job's log
(:func:`blocks_begun`, :func:`check_blocks`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from jobs.checkpoints import attempts
from tests.jobs.conftest import PG_ADMIN, Stack, wait_for

ROOT = Path(__file__).resolve().parents[2]
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A ``redis-server`` of one test's own, without persistence: stopping it loses every queue."""

    def __init__(self, folder: Path):
        self.folder, self.port, self.proc = folder, free_port(), None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.exceptions.RedisError:
            return False

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.ping, timeout=30, every=0.05, what=f"redis-server on port {self.port}")

    def stop(self) -> None:
        """Kill it (SIGKILL: nothing is saved, the queues are gone)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def terminate_backends(url: str, waiting: str | None = None) -> int:
    """``pg_terminate_backend`` on the connections to ``url``'s database (all but the caller's, or only
    those waiting on a lock in a statement ``LIKE waiting``); how many."""
    import sqlalchemy as sa

    where = "datname = :name AND pid <> pg_backend_pid()"
    if waiting is not None:
        where += " AND wait_event_type = 'Lock' AND query LIKE :waiting"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            found = c.execute(
                sa.text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where}"),
                {"name": url.rsplit("/", 1)[1], "waiting": waiting},
            )
            return len(found.all())
    finally:
        admin.dispose()


def open_transactions(url: str) -> int:
    """Connections to ``url``'s database (but the caller's) idle inside a transaction."""
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            return c.scalar(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid() "
                    "AND state LIKE 'idle in transaction%'"
                ),
                {"name": url.rsplit("/", 1)[1]},
            )
    finally:
        admin.dispose()


def pause(pid: int, url: str, tries: int = 20) -> None:
    """SIGSTOP a process at a moment no transaction is open on ``url``'s database: one paused inside
    its transaction would hold the job's row lock, which the reaper skips (its heartbeat thread
    writes twice a second, so a few tries are enough)."""
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)
        if not open_transactions(url):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"process {pid} kept a transaction open on every try")


def rss_mb(pid: int) -> float:
    """Resident memory of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


class FaultStack(Stack):
    """PostgreSQL + a private Redis + real workers, each worker with its own extra environment."""

    def __init__(self, env: dict[str, str], data_dir: Path, redis: RedisServer):
        super().__init__(env=env, data_dir=data_dir)
        self.redis = redis

    def start_worker(self, file_size_limit: int | None = None, **env: str) -> subprocess.Popen:
        """A ``liar worker`` (prefork parent + one pool process), with ``env`` added to the stack's
        (e.g. ``LIAR_STAGE_PAUSE``) and, if given, a file-size limit (``ulimit -f``) in bytes."""

        def limit() -> None:
            if file_size_limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

        log = open(self.data_dir / f"worker-{len(self.workers)}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--loglevel", "INFO"],
            env={**self.env, **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=limit,
        )
        log.close()
        self.workers.append(proc)
        return proc

    def worker_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.data_dir.glob("worker-*.log")))

    def stop(self) -> None:
        """SIGKILL every worker (no warm shutdown waiting for a paused job), then the broker."""
        for proc in self.workers:
            if proc.poll() is None:
                self.kill_worker(proc)
        self.redis.stop()


def job_pid(info: dict) -> int:
    """The pid of the process running a job (its ``worker`` is ``host:pid``)."""
    return int(info["worker"].rsplit(":", 1)[1])


def wait_job(service, job_id: int, predicate, timeout: float = 120.0, what: str = "") -> dict:
    """The job's ``show`` once ``predicate(info)`` holds (AssertionError with its state otherwise)."""
    last: dict = {}

    def check():
        last.update(service.show(job_id))
        return predicate(last) and dict(last)

    try:
        return wait_for(check, timeout=timeout, every=0.1, what=what or f"job {job_id}")
    except AssertionError as exc:
        state = {k: last.get(k) for k in ("status", "stage", "layer", "attempts", "error")}
        raise AssertionError(f"{exc}; job {job_id} is {state}") from None


def in_layer(n: int = 1):
    """Predicate: the job runs, inside reconstructed layer ``n`` or later."""
    return lambda i: i["status"] == "RUNNING" and i["stage"] == "reconstruct" and (i["layer"] or 0) >= n


def finished(info: dict) -> bool:
    return info["status"] in FINISHED


def started_lines(info: dict) -> int:
    """How many times a job started (its "started on …" log lines)."""
    return sum(line["message"].startswith("started on ") for line in info["log"])


def snapshot(service) -> dict[str, list[tuple]]:
    """Every row of the job tables (jobs, their log lines, metrics, artifacts), in id order: what a
    write that must not land would change."""
    from sqlalchemy import select

    from jobs.db import Base

    with service.sessions() as s:
        return {
            name: [tuple(row) for row in s.execute(select(table).order_by(table.c.id))]
            for name, table in Base.metadata.tables.items()
            if name in ("jobs", "job_logs", "metrics", "artifacts")
        }


def files(folder: Path) -> dict[str, str]:
    """The files under ``folder`` (relative paths) and their sha256."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def kill(pid: int, group: bool = False) -> float:
    """SIGKILL a process (or its whole process group); the monotonic time it was sent."""
    t = time.monotonic()
    try:
        os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return t


_LAYER_TIMED = re.compile(r"^layer (\d+)/(\d+): ")
_RESUMED_AT = re.compile(r"^resumed at block (\d+) of \d+")


def blocks_begun(log: list[dict]) -> list[list[int]]:
    """The blocks (1-based) each attempt of a job began, read from its log. An attempt ("started on …")
    begins at block 1, or where it resumed ("resumed at block R of n"); each "layer k/n: …" line (block
    k's time, written in the transaction that moves the job to block k + 1, before that block is
    computed) says block k + 1 began, up to n. An upper bound: an attempt that ended before its block
    loop counts its first block as begun."""
    found: list[list[int]] = []
    for line in log:
        message = line["message"]
        if message.startswith("started on "):
            found.append([1])
        elif found and (m := _RESUMED_AT.match(message)):
            found[-1] = [int(m[1])]
        elif found and (m := _LAYER_TIMED.match(message)) and int(m[1]) < int(m[2]):
            found[-1].append(int(m[1]) + 1)
    return found


def job_rows(service) -> dict[int, dict]:
    """Every job's status, stage, block in progress (0-based ``layer``), attempts and process
    (``host:pid``), in one query: what a test polling many jobs at once reads."""
    from sqlalchemy import select

    from jobs.db import Job

    columns = (Job.id, Job.status, Job.stage, Job.layer, Job.attempts, Job.worker)
    with service.sessions() as s:
        return {row.id: row._asdict() for row in s.execute(select(*columns))}


STORM_BLOCKS = 10  # the storm's model: enough blocks for a fault to land well inside its block loop
STOP_SECONDS = 20  # LIAR_STOP_SECONDS of the storm's workers


def storm_plan(rng: random.Random) -> list[tuple[str, int, int]]:
    """Four SIGKILLs and four SIGTERMs in a seeded order, the broker wiped once among them: each
    ``(kind, jobs finished before it, the least block (0-based) its victim must be in)``."""
    kinds = ["kill"] * 4 + ["term"] * 4
    rng.shuffle(kinds)
    kinds.insert(rng.randrange(1, len(kinds)), "wipe")
    after = sorted(rng.randrange(0, 11) for _ in kinds)
    return [(kind, n, rng.randrange(1, STORM_BLOCKS - 3)) for kind, n in zip(kinds, after)]


@dataclasses.dataclass
class Storm:
    """The faults of one storm and what they hit: jobs whose worker was SIGKILLed (how often), the
    attempts whose worker was SIGTERMed (``(job, attempt)`` → seconds the worker took to exit)."""

    faults: FaultStack
    rng: random.Random
    spared: set[int]  # never a victim
    killed: Counter = dataclasses.field(default_factory=Counter)
    stopped: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)
    wiped: int = 0

    def victim(self, rows: dict[int, dict], kind: str, at: int) -> tuple | None:
        """``(job, its row, its worker)``: a live worker whose job (not spared) is inside block ``at``
        or later; for a SIGTERM, early enough that the stop lands before the last block (which runs to
        its end); for a SIGKILL, a job not killed before (``LIAR_MAX_ATTEMPTS=2`` allows one lost
        worker per job) and, until one is, a job stopped before while one is unfinished: its stop must
        not count as an attempt, or losing its worker now would fail it."""
        live = {p.pid: p for p in self.faults.workers if p.poll() is None}
        last = STORM_BLOCKS - 1 if kind == "kill" else STORM_BLOCKS - 3
        found = []
        for job, row in rows.items():
            if row["status"] != "RUNNING" or row["stage"] != "reconstruct" or job in self.spared:
                continue
            if not at <= (row["layer"] or 0) <= last or (kind == "kill" and job in self.killed):
                continue
            try:
                worker = live.get(parent(job_pid(row)))
            except (FileNotFoundError, ProcessLookupError, AttributeError):  # its process has just ended
                continue
            if worker is not None:
                found.append((job, row, worker))
        stopped = {job for job, _ in self.stopped}
        if kind == "kill" and not stopped & set(self.killed):  # the first kill after a stop waits for its job
            waiting = {job for job in stopped if rows[job]["status"] != "SUCCEEDED"}
            found = [f for f in found if f[0] in waiting] if waiting else found
        return self.rng.choice(found) if found else None

    def strike(self, kind: str, job: int, row: dict, worker) -> None:
        """SIGKILL (the worker's process group) or SIGTERM the worker, wait for it to exit and start a
        fresh one in its place."""
        sent = time.monotonic()
        if kind == "kill":
            kill(worker.pid, group=True)
        else:
            os.killpg(worker.pid, signal.SIGTERM)  # as a deploy stops it: the parent and its job's process
        worker.wait(timeout=STOP_SECONDS + 30)
        took = time.monotonic() - sent
        self.faults.start_worker()
        if kind == "kill":
            self.killed[job] += 1
        else:
            assert took < STOP_SECONDS, f"the SIGTERMed worker took {took:.1f} s to exit"
            self.stopped[(job, row["attempts"])] = took


def prune_result(info: dict) -> tuple:
    """What a prune made: its weights and config (each file's sha256) and the units each layer kept."""
    files = {a["name"]: a["sha256"] for a in info["artifacts"] if a.get("name")}
    kept = [(r["layer"], r["module"], r["kept"], r["total"]) for r in info["report"]]
    return {n: d for n, d in files.items() if n.endswith(".safetensors") or n == "config.json"}, kept


def check_blocks(info: dict, lost: int, stopped: list[int]) -> int:
    """No block begun more than twice, and no more extra blocks than attempts lost with their worker
    (a SIGKILL loses the block under way; a stop finishes it): every later attempt resumes after the
    last checkpoint an earlier one logged; attempts ``stopped`` (SIGTERM) said so, and the next one
    resumed at the block after the one they stopped at. How many blocks were begun again."""
    begun = Counter(b for run in blocks_begun(info["log"]) for b in run)
    assert sorted(begun) == list(range(1, STORM_BLOCKS + 1)) and max(begun.values()) <= 2, (info["id"], begun)
    assert sum(begun.values()) <= STORM_BLOCKS + lost, (info["id"], begun, lost)
    runs = attempts(info["log"])
    for k, run in enumerate(runs[1:], 1):
        assert run["from_block"] >= max(r["saved_block"] or 0 for r in runs[:k]) + 1, (info["id"], runs)
    stops = [line["message"] for line in info["log"] if "stopping: stopped after block" in line["message"]]
    assert len(stops) == len(stopped), (info["id"], stops, stopped)
    for attempt in stopped:
        assert runs[attempt]["from_block"] == runs[attempt - 1]["saved_block"] + 1, (info["id"], runs)
    return sum(begun.values()) - STORM_BLOCKS
