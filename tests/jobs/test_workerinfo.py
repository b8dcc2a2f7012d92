"""The operator's view against real workers: the ``liar_worker_info`` remote-control command, the
Workers tab's plain function (``app.web.workers``) while a job runs and after its worker stops, and
``liar health`` against the PostgreSQL + Redis stack (``tests.jobs.conftest``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.web.workers import NO_WORKERS, Roster, worker_view
from jobs.health import ask_workers
from jobs.workerinfo import COMMAND
from tests.jobs.conftest import recipe, wait_for

pytestmark = pytest.mark.integration


def _liar_health(env: dict[str, str], *args: str) -> subprocess.Popen:
    """``liar health`` started (a Python process: seconds to import); :func:`_result` waits for it."""
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "health", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("stack", ["postgres+redis"], indirect=True)
def test_workers_are_listed_with_their_job_then_remembered_then_dropped(stack, job_models):
    service = stack.service()
    # the job waits in its first step ("starting", right after the worker claims it) while we look
    stack.env["LIAR_STAGE_PAUSE"] = "starting=60"
    worker = stack.start_worker()
    job_id = service.submit(recipe(job_models))
    celery = service.celery
    wait_for(lambda: service.show(job_id)["status"] == "RUNNING", what="the worker to claim the job")
    healthy = _liar_health(stack.env, "--workers")  # read below, while the worker still runs
    ((name, info),) = ask_workers(celery, COMMAND, 1.0).items()
    assert info["hostname"] == name and info["queues"] and info["jobs"] == [job_id]
    assert info["pid"] == worker.pid and info["started_at"]
    now = [1000.0]
    roster = Roster(forget_after=60, clock=lambda: now[0])
    note, rows = worker_view(celery, roster)
    assert [row[0] for row in rows] == [name], note
    row = dict(zip(["worker", "queues", "device", "memory", "job", "seen"], rows[0]))
    assert row["queues"] == ", ".join(info["queues"]) and row["job"] == f"#{job_id}" and row["seen"] == "now"

    # the device is probed once (the first question started it), outside the worker's process: no
    # torch in a prefork parent
    info = wait_for(
        lambda: (a := ask_workers(celery, COMMAND, 1.0).get(name)) and a["device"]["kind"] != "probing" and a,
        timeout=60,
        what="the device probe",
    )
    assert info["device"]["name"] and info["device"]["memory_bytes"] > 0
    result = _result(healthy)
    assert result.returncode == 0 and name in result.stdout, result.stdout + result.stderr

    stack.kill_worker(worker)
    now[0] += 40
    note, rows = worker_view(celery, roster)
    assert rows[0][0] == name and rows[0][5] == "last seen 40 s ago", rows
    now[0] += 30
    assert worker_view(celery, roster) == (NO_WORKERS, [])

    asked, plain = _liar_health(stack.env, "--workers"), _liar_health(stack.env)  # side by side
    result = _result(asked)  # no worker answers: unhealthy only when asked for one
    assert result.returncode == 1 and "workers   FAIL" in result.stdout, result.stdout
    assert _result(plain).returncode == 0
