"""The fault suite: the job runner under killed workers, a lost or stopped broker, killed database
connections, a full disk, cancellations and duplicated messages, and streamed jobs resuming from
their block checkpoints through a storm of killed and stopped workers and a wiped broker — each case
against the real PostgreSQL, a private ``redis-server`` and real ``liar worker`` processes on a tiny
model.

Where a kill or a cancel must land inside a stage, the worker pauses at the start of each step of
that stage (``LIAR_STAGE_PAUSE``, see ``jobs.settings``) after recording it, so the test can see the
step begin and act while the job is in it. Nothing waits a fixed time: every wait polls the database
(or the processes) with a generous timeout. The recovery times the cases measure are printed
(``pytest -s``) and reported in ``docs/results/reliability.md``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import random
import shutil
import signal
import socket
import time

import pytest

from jobs.db import Job, utcnow
from tests.jobs.conftest import _pg_available, postgres_database, recipe, wait_for
from tests.jobs.faults import (
    FINISHED,
    ROOT,
    STOP_SECONDS,
    STORM_BLOCKS,
    FaultStack,
    RedisServer,
    Storm,
    alive,
    check_blocks,
    children,
    files,
    finished,
    in_layer,
    job_pid,
    job_rows,
    kill,
    parent,
    pause,
    prune_result,
    rss_mb,
    snapshot,
    started_lines,
    storm_plan,
    terminate_backends,
    wait_job,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def faults(tmp_path):
    """A fresh PostgreSQL database and a private Redis; workers are started by each test."""
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    if shutil.which("redis-server") is None:
        pytest.fail("the redis-server program is required: each case starts its own (.ci/run installs it)")
    with postgres_database("liar_fault") as url:
        redis = RedisServer(tmp_path / "redis")
        redis.start()
        data = tmp_path / "data"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
        env.update(
            LIAR_DATA_DIR=str(data),
            LIAR_DATABASE_URL=url,
            LIAR_BROKER_URL=redis.url,
            LIAR_LEASE_SECONDS="3",
            LIAR_MAX_ATTEMPTS="2",
            LIAR_WORKER_MAX_TASKS_PER_CHILD="1",  # as in production: a fresh process per job
            OMP_NUM_THREADS="1",  # several workers share two cores: spinning OpenMP threads would stall them
            PYTHONPATH=str(ROOT),
        )
        stack = FaultStack(env, data, redis)
        saved = {k: v for k, v in os.environ.items() if k.startswith("LIAR_")}
        os.environ.update({k: v for k, v in env.items() if k.startswith("LIAR_")})
        try:
            yield stack
        finally:
            stack.stop()
            for k in [k for k in os.environ if k.startswith("LIAR_")]:
                del os.environ[k]
            os.environ.update(saved)


def report(case: str, **figures: float) -> None:
    """One line per measured figure, for docs/results/reliability.md (shown with ``pytest -s``)."""
    print(f"\n[fault] {case}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


def assert_checkpoint_is_this_attempts(stack: FaultStack, service, job_id: int) -> None:
    """The files offered are exactly the job folder's files, with the recorded digests: nothing left
    from a killed attempt (its own folder, ``attempt-K``, removed by the attempt that succeeded)."""
    offered = {f.name: f for f in service.served(job_id)}
    folder = stack.data_dir / "artifacts" / f"job-{job_id}"
    on_disk = {p.resolve() for p in folder.rglob("*") if p.is_file()}
    recorded = {f.path.resolve() for f in offered.values()}
    assert on_disk == recorded, sorted(map(str, on_disk ^ recorded))
    for f in offered.values():
        assert hashlib.sha256(f.path.read_bytes()).hexdigest() == f.sha256, f.name


def act_when(service, jobs: list[int], predicate, action, what: str, timeout: float = 240) -> dict:
    """Poll the jobs together and call ``action(info)`` on each once ``predicate(info)`` holds (each
    job's moment may come at any time: none is missed while another is waited for); the results."""
    results: dict[int, object] = {}

    def step() -> bool:
        for job in [j for j in jobs if j not in results]:
            info = service.show(job)
            if predicate(info):
                results[job] = action(info)
        return len(results) == len(jobs)

    wait_for(step, timeout=timeout, every=0.1, what=what)
    return results


def test_worker_killed_mid_layer_reruns_or_fails_after_max_attempts(faults, job_models):
    """Two jobs on two workers. Attempt 1 of each: the pool process running it is SIGKILLed inside
    layer 1 (its worker sees nothing; the lease expires and the job is re-queued). Attempt 2: one job
    runs to success and offers only its own files; the other's whole worker is SIGKILLed, and the
    job, out of attempts, ends FAILED with the reason, its partial output removed."""
    faults.env["LIAR_LEASE_SECONDS"] = "6"  # two jobs on two busy cores: no false "lost worker" for the re-run
    service = faults.service()
    for _ in range(2):
        faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=2")
    rerun, doomed = jobs = [service.submit(recipe(job_models)) for _ in range(2)]
    folder = {job: faults.data_dir / "artifacts" / f"job-{job}" for job in jobs}

    def kill_job_process(info: dict) -> dt.datetime:
        assert list(folder[info["id"]].rglob("*.safetensors")), "the attempt has written part of its checkpoint"
        kill(job_pid(info))
        return utcnow()

    killed = act_when(service, jobs, in_layer(1), kill_job_process, what="attempt 1 of each inside layer 1")
    info = wait_job(service, doomed, lambda i: i["attempts"] == 2 and in_layer(1)(i), what="attempt 2 in layer 1")
    rerun_after = (dt.datetime.fromisoformat(info["started_at"]) - killed[doomed]).total_seconds()
    worker = next(p for p in faults.workers if p.pid == parent(job_pid(info)))
    killed_worker = kill(worker.pid, group=True)  # parent and pool process
    worker.wait(timeout=30)

    failed = wait_job(service, doomed, finished, what="the job out of attempts to end")
    gave_up = time.monotonic() - killed_worker
    assert failed["status"] == "FAILED" and failed["attempts"] == 2
    assert failed["error"] == f"worker {info['worker']} lost (no heartbeat for 6 s)"
    assert service.downloads(doomed) == [] and not folder[doomed].exists()
    done = wait_job(service, rerun, finished, what="the re-run to finish")
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 2 and started_lines(done) == 2, done["error"]
    assert any(line["message"].endswith("re-queued") for line in done["log"])
    assert_checkpoint_is_this_attempts(faults, service, rerun)
    rerun_after = max(rerun_after, (dt.datetime.fromisoformat(done["started_at"]) - killed[rerun]).total_seconds())
    report("worker killed mid-layer", rerun_started_after_s=rerun_after, failed_after_s=gave_up)


def test_a_worker_paused_past_its_lease_writes_nothing_once_resumed(faults, job_models):
    """Attempt 1's process is paused (SIGSTOP) inside layer 1, past its lease: the reaper re-queues the
    job and a second worker runs attempt 2 to success. Resumed (SIGCONT), attempt 1 runs on until its
    next write is refused (``jobs.fencing``), then stops: the job stays as attempt 2 left it — status,
    metrics, artifacts, log lines, files — attempt 1's folder is gone, and its worker's log says why."""
    service = faults.service()
    faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=2")
    job = service.submit(recipe(job_models))
    pid = job_pid(wait_job(service, job, in_layer(1), what="attempt 1 inside layer 1"))
    folder = faults.data_dir / "artifacts" / f"job-{job}"
    assert list((folder / "attempt-1").rglob("*.safetensors")), "attempt 1 has written part of its checkpoint"
    pause(pid, faults.env["LIAR_DATABASE_URL"])
    paused = time.monotonic()
    faults.start_worker()
    done = wait_job(service, job, finished, what="attempt 2 to finish")
    rerun = time.monotonic() - paused
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 2, done["error"]
    assert job_pid(done) != pid and any(line["message"].endswith("re-queued") for line in done["log"])
    rows, written = snapshot(service), files(folder)
    assert written and all(name.startswith("attempt-2/checkpoint/") for name in written), sorted(written)

    os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    said = f"job {job}: attempt 1 superseded (attempt 1 of job {job} no longer owns it: the job is SUCCEEDED at "
    wait_for(lambda: said in faults.worker_log(), timeout=120, what="attempt 1 to find it was superseded")
    wait_for(lambda: not alive(pid), timeout=60, what=f"attempt 1's process {pid} to exit")
    stopped = time.monotonic() - resumed
    assert snapshot(service) == rows  # not a row written, changed or added: status, metrics, artifacts, log
    assert files(folder) == written and not (folder / "attempt-1").exists()
    info = service.show(job, internal=True)
    assert info["status"] == "SUCCEEDED" and len(info["metrics"]) == len(rows["metrics"])  # one of each
    mine = [line["message"] for line in info["log"] if line["message"].endswith(f":{pid}")]
    assert mine == [f"started on {socket.gethostname()}:{pid}"]  # attempt 1's lines end with its pid: one
    assert_checkpoint_is_this_attempts(faults, service, job)
    report("worker paused past its lease, resumed", rerun_done_s=rerun, superseded_stopped_after_s=stopped)


def test_broker_restarted_without_persistence_while_jobs_are_queued(faults, job_models):
    """Redis loses its queues while one job runs and three wait: the workers' maintenance re-sends
    the three (their rows say QUEUED, the broker has no message), and each runs exactly once."""
    service = faults.service()
    faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=1", LIAR_WORKER_MAX_TASKS_PER_CHILD="100")
    ids = [service.submit(recipe(job_models)) for _ in range(4)]
    wait_job(service, ids[0], in_layer(0), what="the first job to run")
    assert service.queued_in_broker() == set(ids[1:])
    restarted, restarted_at = time.monotonic(), utcnow()
    faults.redis.restart()
    jobs = [wait_job(service, i, finished, what="every job to finish") for i in ids]
    drained = time.monotonic() - restarted
    assert [(j["status"], j["attempts"], started_lines(j)) for j in jobs] == [("SUCCEEDED", 1, 1)] * 4
    for job in jobs[1:]:  # their messages were lost with the broker, and sent again
        assert any(line["message"].endswith("re-sent") for line in job["log"]), job["id"]
    first = min(dt.datetime.fromisoformat(j["started_at"]) for j in jobs[1:])
    resumed = (first - restarted_at).total_seconds()
    report("broker restarted, jobs queued", first_lost_job_started_s=resumed, all_done_s=drained)


def test_broker_down_while_a_worker_runs_a_job(faults, job_models):
    """The job's outcome goes to the database while Redis is down; once Redis is back the worker
    takes the next job."""
    service = faults.service()
    worker = faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=1", LIAR_WORKER_MAX_TASKS_PER_CHILD="100")
    job = service.submit(recipe(job_models))
    wait_job(service, job, in_layer(0), what="the job to run")
    faults.redis.stop()
    down = time.monotonic()
    done = wait_job(service, job, finished, what="the job to finish without a broker")
    recorded = time.monotonic() - down
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1, done["error"]
    assert not faults.redis.ping() and worker.poll() is None
    faults.redis.start()
    back = time.monotonic()
    follow = service.submit(recipe(job_models))
    wait_job(service, follow, lambda i: i["status"] != "QUEUED", timeout=180, what="the worker to take new work")
    resumed = time.monotonic() - back
    info = wait_job(service, follow, finished, what="the next job")
    assert info["status"] == "SUCCEEDED" and info["attempts"] == 1, info["error"]
    report("broker down during a job", outcome_recorded_s=recorded, new_job_started_after_broker_back_s=resumed)


def test_database_connections_killed_mid_job(faults, job_models):
    """``pg_terminate_backend`` twice while the job runs: on every connection to its database while
    they idle (the pool's pre-ping replaces them), then on the job's own connection in the middle of
    its progress write, held up by a row lock the test takes (the write is tried again on a fresh
    connection). The job succeeds, in its first attempt."""
    import sqlalchemy as sa

    faults.env["LIAR_LEASE_SECONDS"] = "30"  # the lock holds up the heartbeat too: not a lost worker
    url = faults.env["LIAR_DATABASE_URL"]
    service = faults.service()
    faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=2")
    job = service.submit(recipe(job_models))
    wait_job(service, job, in_layer(0), what="the job inside layer 0")
    assert terminate_backends(url) >= 2  # the job's, the worker's maintenance thread's (and ours)
    engine = sa.create_engine(url)
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job})
        wait_for(lambda: terminate_backends(url, waiting="UPDATE jobs SET stage%"), what="the job's write to wait")
        killed = time.monotonic()
        holder.rollback()
    engine.dispose()
    done = wait_job(service, job, finished, what="the job to end")
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1, done["error"]
    report("database connections killed mid-job", job_recorded_after_s=time.monotonic() - killed)


def test_disk_full_while_the_checkpoint_is_written(faults, job_models, tmp_path):
    """A file-size limit on the worker (``ulimit -f``) below the size of one block's shard: the write
    fails with EFBIG, the job is FAILED with that reason, and nothing partial is left or offered."""
    from core.models.tiny import tiny_decoder

    wide = tiny_decoder(tmp_path / "wide", hidden_size=256, intermediate_size=1024)  # 3 MB per block
    service = faults.service()
    worker = faults.start_worker(file_size_limit=1 << 20)
    job = service.submit(recipe(job_models, model=str(wide)))
    submitted = time.monotonic()
    done = wait_job(service, job, finished, what="the job to fail")
    report("disk full (file-size limit)", failed_after_submission_s=time.monotonic() - submitted)
    assert done["status"] == "FAILED"
    assert done["error"].startswith("file too large while writing the checkpoint on the worker"), done["error"]
    assert "the partial output was removed" in done["error"] and done["artifacts"] == []
    assert service.downloads(job) == [] and not (faults.data_dir / "artifacts" / f"job-{job}").exists()
    assert worker.poll() is None  # the worker ignores SIGXFSZ and lives on


def test_cancel_during_calibration_a_layer_and_evaluation(faults, job_models):
    """Three workers, each pausing in another stage, and three jobs: each job is cancelled while in
    its worker's stage and ends CANCELLED at that stage's end; its process exits (a fresh one takes
    its place, with the engine imported and nothing of the job) and its memory goes with it."""
    service = faults.service()
    pauses = {"calibration": 3, "reconstruct": 2, "evaluate": 3}
    stage_of = {faults.start_worker(LIAR_STAGE_PAUSE=f"{k}={v}").pid: k for k, v in pauses.items()}
    # all three consuming before any job is queued: a worker up first would otherwise take a second job
    # once its first is cancelled (seen on a loaded machine), and no job would reach the third's stage
    wait_for(lambda: faults.worker_log().count(" ready.") >= len(pauses), timeout=120, what="three ready workers")
    evaluation = [{"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}]
    jobs = [service.submit(recipe(job_models), evaluations=evaluation) for _ in pauses]
    in_stage = {"calibration": lambda i: i["stage"] == "calibration", "reconstruct": in_layer(1)}
    in_stage["evaluate"] = lambda i: i["stage"] == "evaluate"
    running: dict[int, tuple[str, int, int, float]] = {}  # job → (stage, pid, worker pid, RSS)

    def cancel_when_in_stage() -> bool:
        for job in set(jobs) - set(running):
            info = service.show(job)
            if info["status"] == "RUNNING" and info["worker"]:
                pid = job_pid(info)
                stage = stage_of[parent(pid)]
                if in_stage[stage](info):
                    running[job] = (stage, pid, parent(pid), rss_mb(pid))
                    assert service.cancel(job) == "RUNNING"
        return len(running) == len(jobs)

    wait_for(cancel_when_in_stage, timeout=240, every=0.1, what="each job to reach its worker's stage")
    assert sorted(stage for stage, *_ in running.values()) == sorted(pauses)
    for job, (stage, pid, worker_pid, rss) in running.items():
        info = wait_job(service, job, finished, what=f"the cancel in {stage}")
        assert info["status"] == "CANCELLED" and info["artifacts"] == []
        assert info["timings"]["stages"][-1]["stage"] == stage, info["timings"]  # the last it ran
        wait_for(lambda pid=pid: not alive(pid), timeout=60, what=f"process {pid} to exit")
        after = wait_for(lambda w=worker_pid: fresh_process_mb(faults, w), timeout=120, what="a fresh pool process")
        assert after < rss, (stage, rss, after)  # the job's process held the same code and the model, the data
        assert not (faults.data_dir / "artifacts" / f"job-{job}").exists()
        requested = next(dt.datetime.fromisoformat(x["at"]) for x in info["log"] if x["message"] == "cancel requested")
        stopped = (dt.datetime.fromisoformat(info["finished_at"]) - requested).total_seconds()
        report(f"cancel in {stage}", cancelled_after_s=stopped, job_process_mb=rss, fresh_process_mb=after)


def fresh_process_mb(stack: FaultStack, worker_pid: int) -> float | None:
    """The resident MB of a pool process of the worker that has imported the engine (a fresh pool process
    does so before it takes a job, ``jobs.worker``), or None while there is none. One that has since
    taken a job and exited (a message of a job another worker claimed: "skipped") is passed over."""
    log = stack.worker_log()
    for pid in children(worker_pid):
        if f"pool process {pid}: engine imported" in log and (mb := rss_mb(pid)) > 0:
            return mb
    return None


def test_the_same_message_delivered_twice_runs_the_job_once(faults, job_models):
    """The job's message published twice (same task id) to two idle workers: both take it, one
    claims the job, the other skips it."""
    faults.env["LIAR_LEASE_SECONDS"] = "30"  # no re-send by the maintenance thread: two deliveries only
    service = faults.service()
    for _ in range(2):
        faults.start_worker()
    wait_for(lambda: faults.worker_log().count(" ready.") == 2, timeout=120, what="both workers to be ready")
    job = service.submit(recipe(job_models))
    with service.sessions() as s:
        celery_id = s.get(Job, job).celery_id
    service.celery.send_task("liar.run_job", args=[job], task_id=celery_id)
    done = wait_job(service, job, finished, what="the job")
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 1 and started_lines(done) == 1
    outcomes = lambda: [line.rsplit(": ", 1)[1] for line in faults.worker_log().splitlines() if "succeeded in" in line]  # noqa: E731
    wait_for(lambda: len(outcomes()) == 2, timeout=60, what="both deliveries to be handled")
    assert sorted(outcomes()) == ["'SUCCEEDED'", "'skipped'"]


# One client process: five clients (threads) that submit five jobs each once released ("go" on stdin).
CLIENT = """
import json, sys, threading
from jobs.service import JobService
service = JobService()
service.celery  # the broker connection, made once
recipe, ids, start = json.loads(sys.argv[1]), {}, threading.Barrier(6)
def client(n):
    start.wait()
    ids[n] = [service.submit(recipe, submitted_by=f"{sys.argv[2]}-{n}") for _ in range(5)]
threads = [threading.Thread(target=client, args=(n,)) for n in range(5)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.readline()
start.wait()
for t in threads:
    t.join()
print(json.dumps([i for n in sorted(ids) for i in ids[n]]), flush=True)
"""


def test_twenty_clients_submitting_five_jobs_each_at_once(faults, job_models):
    """20 clients (5 threads in each of 4 processes, which race to create the fresh database's
    schema), released together, submit 5 jobs each while two workers start: 100 rows, 100 distinct
    ids, every job started exactly once (one "started on" log line) and succeeded in one attempt."""
    import json
    import subprocess
    import sys

    from sqlalchemy import func, select

    from jobs.db import JobLog

    faults.env["LIAR_LEASE_SECONDS"] = "20"  # many processes on two cores: no false "lost worker"
    payload = json.dumps(recipe(job_models))
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, payload, f"client-{n}"],
            env=faults.env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for c in clients:
        assert c.stdout.readline().strip() == "ready"
    for _ in range(2):
        faults.start_worker(LIAR_WORKER_MAX_TASKS_PER_CHILD="100")
    released = time.monotonic()
    for c in clients:
        c.stdin.write("go\n")
        c.stdin.flush()
    ids = [i for c in clients for i in json.loads(c.communicate(timeout=120)[0])]
    submitted = time.monotonic() - released
    assert all(c.returncode == 0 for c in clients)
    assert len(ids) == 100 == len(set(ids))
    service = faults.service()
    with service.sessions() as s:
        assert s.scalar(select(func.count(Job.id))) == 100
        assert s.scalar(select(func.count(func.distinct(Job.submitted_by)))) == 20

    def all_finished():
        with service.sessions() as s:
            return s.scalar(select(func.count(Job.id)).where(Job.finished_at.is_not(None))) == 100

    wait_for(all_finished, timeout=300, every=0.5, what="100 jobs to finish")
    with service.sessions() as s:
        states = s.execute(select(Job.status, Job.attempts, func.count()).group_by(Job.status, Job.attempts)).all()
        starts = s.execute(
            select(JobLog.job_id, func.count()).where(JobLog.message.like("started on %")).group_by(JobLog.job_id)
        ).all()
    assert [tuple(row) for row in states] == [("SUCCEEDED", 1, 100)]
    assert sorted(job for job, n in starts if n == 1) == sorted(ids)
    report("20 clients x 5 submissions", submitted_s=submitted, all_done_s=time.monotonic() - released)


STORM_RECIPES = (  # four recipes, five jobs each: the first job of each runs untouched, the reference
    {"ratio": 0.3},  # the default criterion: obs selection, its head split carried from block to block
    {"ratio": 0.5},
    {"ratio": 0.3, "criterion": {"name": "magnitude"}},
    {"ratio": 0.4, "reconstruction": {"target": "dense"}},  # error feedback: the dense activations saved too
)


def test_twenty_jobs_resume_through_killed_and_stopped_workers_and_a_wiped_broker(faults, job_models, tmp_path):
    """20 streamed jobs (four recipes on a ten-block model, a checkpoint after every block) on three
    workers, through a seeded storm: four workers SIGKILLed and four SIGTERMed while their job is inside
    a block, a fresh worker started in each one's place, and the broker wiped once (restarted without
    persistence). Every job succeeds with the weights, config and kept units of its recipe's untouched
    run; a SIGTERMed worker exits within LIAR_STOP_SECONDS, its job resumed at the next block; no block
    is begun more than twice (the job's log: ``blocks_begun``)."""
    from core.models.tiny import tiny_decoder

    rng = random.Random(20240611)
    model = tiny_decoder(tmp_path / "ten", num_hidden_layers=STORM_BLOCKS)
    faults.env.update(
        LIAR_CHECKPOINT_MINUTES="0.0001",  # a save after every block
        LIAR_STOP_SECONDS=str(STOP_SECONDS),
        LIAR_STAGE_PAUSE="reconstruct=0.4",  # each block long enough for a fault to land inside it
        LIAR_LEASE_SECONDS="6",  # three workers and a busy machine: no false "lost worker"
        LIAR_WORKER_MAX_TASKS_PER_CHILD="100",
    )
    service = faults.service()
    for _ in range(3):
        faults.start_worker()
    started = time.monotonic()
    ids = [
        service.submit(recipe(job_models, model=str(model), execution="stream", **STORM_RECIPES[n % 4]))
        for n in range(20)
    ]
    storm = Storm(faults, rng, spared=set(ids[: len(STORM_RECIPES)]))  # the references: never a victim
    for kind, after, at in storm_plan(rng):

        def moment(kind=kind, after=after, at=at):
            rows = job_rows(service)
            if sum(r["status"] == "SUCCEEDED" for r in rows.values()) < after:
                return None
            if kind == "wipe":  # while jobs wait: their messages are lost with it
                return any(r["status"] == "QUEUED" for r in rows.values())
            return storm.victim(rows, kind, at)

        found = wait_for(moment, timeout=180, every=0.1, what=f"a moment for the {kind}")
        if kind == "wipe":
            faults.redis.restart()
            storm.wiped += 1
        else:
            storm.strike(kind, *found)

    wait_for(lambda: all(r["status"] in FINISHED for r in job_rows(service).values()), timeout=300, what="20 jobs")
    done = time.monotonic() - started
    infos = {job: service.show(job, internal=True) for job in ids}
    assert {j: i["status"] for j, i in infos.items()} == dict.fromkeys(ids, "SUCCEEDED"), {
        j: i["error"] for j, i in infos.items() if i["error"]
    }
    assert (len(storm.killed), len(storm.stopped), storm.wiped) == (4, 4, 1)
    assert set(storm.killed) & {job for job, _ in storm.stopped}, "no job was stopped and then lost its worker"
    assert any(line["message"].endswith("re-sent") for i in infos.values() for line in i["log"])
    reference = {n: prune_result(infos[ids[n]]) for n in range(len(STORM_RECIPES))}
    again = 0
    for n, job in enumerate(ids):
        info = infos[job]
        if job in storm.spared:
            assert info["attempts"] == 1 and "resumed_at_block" not in info["metrics"], job
        assert prune_result(info) == reference[n % 4], job
        again += check_blocks(info, storm.killed[job], sorted(a for j, a in storm.stopped if j == job))
    figures = {"all_done_s": done, "slowest_stop_s": max(storm.stopped.values()), "blocks_begun_again": again}
    report("20 jobs, 4 workers killed, 4 stopped, the broker wiped", **figures)
