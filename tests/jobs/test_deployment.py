"""A deployment across machines, with nothing shared on disk (docs/deploy-cluster.md): a web process and two
workers, each with a data folder of its own; a real S3-compatible store (moto's server, a process on
127.0.0.1), PostgreSQL and a Redis. One worker serves a small queue and one a big one (CPU workers
standing in for GPU kinds).

One run of the module: 20 jobs of two estimated sizes, each routed to its queue and finished; every
checkpoint downloaded through the web process and reloaded; a worker killed in the middle of an upload
leaves nothing listed; the Workers tab lists both workers; a stalled job is failed by the watchdog; a
worker SIGTERMed inside a streamed job hands it, through a checkpoint in the store, to another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.pipeline.estimate import estimate
from jobs.db import Job
from jobs.routing import queue_worker, route
from jobs.service import JobService
from jobs.settings import Queue, Settings, parse_queues
from tests.jobs.conftest import _pg_available, postgres_database, recipe, wait_for
from tests.jobs.faults import RedisServer, free_port
from tests.s3server import new_bucket, objects, s3_server

pytestmark = [pytest.mark.integration, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 8  # seconds: two workers and a web process on two cores, without false "lost worker" verdicts


@dataclasses.dataclass
class Deployment:
    root: Path
    env: dict[str, str]
    service: JobService  # the submitter's (as `liar jobs submit` on an operator's machine)
    web: str  # the web process's address
    endpoint: str  # the store's
    bucket: str
    recipes: dict[str, dict]  # queue → a recipe the router sends there
    procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)
    started: int = 0

    def start(self, name: str, argv: list[str], data: str, **env: str) -> subprocess.Popen:
        self.started += 1
        folder = self.root / data
        folder.mkdir(exist_ok=True)
        log = open(self.root / f"{name}-{self.started}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *argv],
            env={**self.env, "LIAR_DATA_DIR": str(folder), **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def worker(self, queue: str, folder: str | None = None, **env: str) -> subprocess.Popen:
        """A worker of ``queue``, in a data folder of its own: ``folder``, by default the queue's
        (``worker-<queue>``); the folder names the process (``stop``) and the worker (``<queue>@host``)."""
        folder = folder or f"worker-{queue}"
        argv = ["worker", "--loglevel", "INFO", "--queues", queue, "--name", f"{folder.removeprefix('worker-')}@%h"]
        return self.start(folder, argv, folder, **env)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.web}/{path}", timeout=60) as answer:  # follows a store's 307
            return answer.read()

    def status(self, job_id: int) -> str:
        with self.service.sessions() as s:
            return s.get(Job, job_id).status


def _peak(r: dict) -> int:
    return estimate(r, queue_worker(Queue("probe", "cpu"))).peak_bytes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, job_models):
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    root = tmp_path_factory.mktemp("deployment")
    small = recipe(job_models, "quick")
    big = recipe(job_models, "quick", calibration=dict(small["calibration"], num_calibration_samples=64))
    low, high = _peak(small), _peak(big)
    assert low < high
    queues = f"small:cpu:{(low + high) / 2e9}, big:cpu:{(high + 10**6) / 1e9}"
    with s3_server(process=True) as endpoint, postgres_database("liar_deploy") as url:
        redis = RedisServer(root / "redis")
        redis.start()
        bucket = new_bucket(endpoint)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
        env.update(
            LIAR_DATABASE_URL=url,
            LIAR_BROKER_URL=redis.url,
            LIAR_STORE=f"s3://{bucket}/liar",
            LIAR_STORE_ENDPOINT=endpoint,
            LIAR_QUEUES=queues,
            LIAR_LEASE_SECONDS=str(LEASE),
            LIAR_MAX_ATTEMPTS="2",
            LIAR_WORKER_MAX_TASKS_PER_CHILD="100",
            LIAR_BUNDLED="tiny",  # the web process offers the tiny demo only: no SmolLM2 prepared here
            LIAR_DATA_ROOTS=str(job_models["quick"].parent),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(ROOT),
        )
        settings = Settings(
            data_dir=root / "submitter",
            database_url=url,
            broker_url=redis.url,
            lease_seconds=LEASE,
            queues=parse_queues(queues),
            store_url=env["LIAR_STORE"],
            store_endpoint=endpoint,
        )
        port = free_port()
        d = Deployment(root, env, JobService(settings), f"http://127.0.0.1:{port}", endpoint, bucket, {})
        d.recipes = {"small": small, "big": big}
        try:
            d.start("web", ["app", "--no-worker", "--port", str(port)], "web")
            for queue in ("small", "big"):
                d.worker(queue)
            wait_for(lambda: _answers(f"{d.web}/healthz"), timeout=180, what="the web process")
            yield d
        finally:
            for name in list(d.procs):
                d.stop(name)
            redis.proc.terminate()
            redis.proc.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _checkpoint_through_the_web(d: Deployment, job_id: int, into: Path) -> Path:
    """The job's checkpoint as its tar from the web process, each file checked against SHA256SUMS, and
    one file by its own URL (a signed address of the store, followed); the folder it was unpacked to."""
    with tarfile.open(fileobj=io.BytesIO(d.get(f"jobs/{job_id}/checkpoint.tar"))) as tar:
        tar.extractall(into, filter="data")
    folder = into / f"liar-job-{job_id}"
    sums = dict(line.split("  ", 1)[::-1] for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert sums, job_id
    for name, digest in sums.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, (job_id, name)
    assert d.get(f"jobs/{job_id}/files/config.json") == (folder / "config.json").read_bytes()
    return folder


def _ran_on(d: Deployment, job_id: int) -> list[str]:
    """The queues whose worker logs say they received the job's message."""
    with d.service.sessions() as s:
        task = s.get(Job, job_id).celery_id
    logs = {p.name.split("-")[1]: p.read_text() for p in d.root.glob("worker-*.log")}
    return sorted({queue for queue, log in logs.items() if f"[{task}] received" in log})


def test_twenty_jobs_routed_finished_and_downloaded_through_the_web(deployment, tmp_path):
    from core.models.loading import load_pruned

    d = deployment
    wanted = {d.service.submit(d.recipes[q]): q for q in ["small", "big"] * 10}
    assert len(wanted) == 20
    wait_for(
        lambda: all(d.status(j) in ("SUCCEEDED", "FAILED", "CANCELLED") for j in wanted),
        timeout=900,
        every=1.0,
        what="20 jobs",
    )
    finished = [j for j in wanted if d.status(j) == "SUCCEEDED"]
    assert len(finished) == 20, {j: d.service.show(j)["error"] for j in wanted if j not in finished}
    for job_id, queue in wanted.items():
        assert d.service.show(job_id)["queue"] == queue and _ran_on(d, job_id) == [queue], job_id
        folder = _checkpoint_through_the_web(d, job_id, tmp_path)
        model, _ = load_pruned(folder)
        assert sum(p.numel() for p in model.parameters()) > 0
    for host in ("worker-small", "worker-big", "web"):  # no host keeps a checkpoint: the store has them
        assert not [p for p in (d.root / host / "artifacts").rglob("*") if p.is_file()], host
    stored = objects(d.endpoint, d.bucket, "liar/artifacts/")
    listed = {f"liar/{f.key}" for j in wanted for f in d.service.served(j)}
    assert set(stored) == listed  # every object is a file some job lists, and the reverse


def test_the_workers_tab_lists_both_workers(deployment):
    from app.web.workers import Roster, worker_view

    d = deployment
    roster = Roster()
    note, rows = wait_for(
        lambda: (lambda v: v if len(v[1]) == 2 else None)(worker_view(d.service.celery, roster)),
        timeout=60,
        what="both workers to answer",
    )
    assert note == "2 of 2 workers answered just now."
    assert sorted(row[1] for row in rows) == ["big", "small"]
    assert all(row[0].split("@")[0] in ("small", "big") and row[5] == "now" for row in rows)


def test_a_worker_killed_mid_upload_leaves_no_partial_artifact(deployment, tmp_path):
    d = deployment
    d.stop("worker-big")
    d.worker("big", LIAR_STAGE_PAUSE="upload=120")  # waits after its first file has reached the store
    job_id = d.service.submit(d.recipes["big"])
    prefix = f"liar/artifacts/job-{job_id}/attempt-1/"
    wait_for(lambda: objects(d.endpoint, d.bucket, prefix), timeout=300, what="the first uploaded file")
    d.stop("worker-big", signal.SIGKILL)
    partial = objects(d.endpoint, d.bucket, prefix)
    assert partial and d.status(job_id) == "RUNNING"
    assert d.service.downloads(job_id) == []  # nothing listed: the files are recorded after the last one
    with pytest.raises(urllib.error.HTTPError) as refused:
        d.get(f"jobs/{job_id}/checkpoint.tar")
    assert refused.value.code == 404
    d.worker("big")  # a healthy worker; a reaper re-queues the job once its lease has expired
    wait_for(lambda: d.status(job_id) == "SUCCEEDED", timeout=300, what="the job's second attempt")
    assert d.service.show(job_id)["attempts"] == 2
    left = objects(d.endpoint, d.bucket, f"liar/artifacts/job-{job_id}/")
    assert left and all(k.startswith(f"liar/artifacts/job-{job_id}/attempt-2/") for k in left)  # the orphans went
    _checkpoint_through_the_web(d, job_id, tmp_path)


def test_a_stalled_job_is_failed_by_the_watchdog(deployment):
    d = deployment
    d.stop("worker-small")
    # a worker whose job hangs in its first layer, and whose maintenance thread judges stalls after 30 s
    # (a job's start, importing the engine on two busy cores, must not look like one)
    d.worker("small", LIAR_STAGE_PAUSE="reconstruct=600", LIAR_STALL_MINUTES="0.5")
    job_id = d.service.submit(d.recipes["small"])
    info = wait_for(lambda: (i := d.service.show(job_id))["stage"] == "reconstruct" or i["status"] == "FAILED" and i,
                    timeout=300, what="the job to reach a layer")  # fmt: skip
    assert info is True or info["stage"] == "reconstruct", f"failed before its first layer: {info['error']}"
    hung = time.monotonic()
    wait_for(lambda: d.status(job_id) == "FAILED", timeout=180, what="the watchdog")
    assert time.monotonic() - hung < 30 + LEASE + 20  # the watchdog's interval plus one lease, and a margin
    info = d.service.show(job_id)
    assert info["error"].startswith("no progress for 0.5 minutes (stage reconstruct") and info["artifacts"] == []
    assert any("stopped by the watchdog" in line["message"] for line in info["log"])
    d.stop("worker-small")
    d.worker("small")


STOP_SECONDS = 30  # LIAR_STOP_SECONDS of the SIGTERM case's workers


def _weights(d: Deployment, job_id: int) -> dict[str, str]:
    files = d.service.show(job_id)["artifacts"]
    return {a["name"]: a["sha256"] for a in files if (a.get("name") or "").endswith(".safetensors")}


def test_a_sigtermed_worker_hands_its_streamed_job_to_another_through_the_store(deployment, job_models):
    """A worker of the job's queue is SIGTERMed inside block 4 of a streamed 8-block job: it finishes
    the block, keeps a checkpoint in the S3 store (nothing in its own data folder), requeues the job
    and exits within LIAR_STOP_SECONDS. A second worker of the queue, in a data folder of its own,
    resumes the job at the next block from the store's checkpoint; the weights equal those of the same
    recipe run without a stop, and the store keeps the finished attempt's files only."""
    d = deployment
    r = recipe(job_models, "deep", criterion={"name": "magnitude"}, execution="stream")
    queue, _ = route(d.service.settings.queues, r)
    saves = {"LIAR_CHECKPOINT_MINUTES": "0.0001", "LIAR_STOP_SECONDS": str(STOP_SECONDS)}  # one after each block
    first, second = f"worker-{queue}", f"worker-{queue}-2"
    d.stop(first)
    d.worker(queue, LIAR_STAGE_PAUSE="reconstruct=1", **saves)  # a second at each block's start
    job_id = d.service.submit(r)
    wait_for(
        lambda: (i := d.service.show(job_id))["stage"] == "reconstruct" and (i["layer"] or 0) >= 3,
        timeout=300,
        what="the job inside block 4",
    )
    sent = time.monotonic()
    d.stop(first, signal.SIGTERM)  # the worker's parent and its job's process, as a deploy stops them
    assert time.monotonic() - sent < STOP_SECONDS
    info = d.service.show(job_id)
    assert info["status"] == "QUEUED" and info["attempts"] == 1, info
    stop = next(line["message"] for line in info["log"] if "stopping: stopped after block" in line["message"])
    stopped_at = int(stop.split("stopped after block ")[1].split()[0])
    held = objects(d.endpoint, d.bucket, f"liar/artifacts/job-{job_id}/attempt-1/resume/")
    assert f"liar/artifacts/job-{job_id}/attempt-1/resume/manifest.json" in held
    assert not [p for p in (d.root / first / "artifacts").rglob("*") if p.is_file()]  # the store holds it all

    d.worker(queue, folder=second, **saves)
    wait_for(lambda: d.status(job_id) in ("SUCCEEDED", "FAILED"), timeout=300, what="the resumed attempt")
    info = d.service.show(job_id)
    assert info["status"] == "SUCCEEDED" and info["attempts"] == 2, info["error"]
    assert info["metrics"]["resumed_at_block"] == stopped_at + 1 > 1
    kept = f"resumed at block {stopped_at + 1} of 8, {stopped_at} blocks kept from attempt 1, scores kept from attempt"
    assert any(line["message"].startswith(kept) for line in info["log"]), info["log"]
    ours = f"liar/artifacts/job-{job_id}/attempt-2/checkpoint/"

    def only_the_result() -> bool:  # attempt 1's folder and both checkpoints go once the success is recorded
        left = objects(d.endpoint, d.bucket, f"liar/artifacts/job-{job_id}/")
        return bool(left) and all(k.startswith(ours) for k in left)

    wait_for(only_the_result, timeout=60, what="the store to keep the finished attempt's checkpoint only")

    whole = d.service.submit(r)  # the same recipe, run whole on the second worker
    wait_for(lambda: d.status(whole) in ("SUCCEEDED", "FAILED"), timeout=300, what="the run without a stop")
    assert d.service.show(whole)["attempts"] == 1 and "resumed_at_block" not in d.service.show(whole)["metrics"]
    assert _weights(d, job_id) == _weights(d, whole)
    d.stop(second)
    d.worker(queue)  # the deployment as the module set it up
