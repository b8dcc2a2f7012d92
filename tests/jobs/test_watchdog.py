"""The progress watchdog (jobs.watchdog): a job whose heartbeat goes on but whose progress stopped ends
FAILED with its reason, and the hung process is killed; the time limit likewise."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import pytest
from sqlalchemy import update

from jobs.db import Job, Status
from jobs.fencing import Superseded, claim, job_log
from jobs.service import JobService
from jobs.settings import Settings
from tests.jobs.conftest import recipe, wait_for
from tests.jobs.faults import alive, job_pid
from tests.jobs.test_faults import faults  # noqa: F401  (the fixture: PostgreSQL, a private Redis)


class _Celery:
    def __init__(self):
        self.revoked: list[str] = []
        self.control = self

    def send_task(self, name, args, queue=None):
        return type("R", (), {"id": f"task-{args[0]}"})()

    def revoke(self, task_id, terminate=False, signal=None):
        self.revoked.append(task_id)


def _running(service: JobService, job_models, minutes_ago: float, **values) -> tuple[int, int]:
    """A job claimed by a worker whose progress was last stamped ``minutes_ago`` (heartbeat fresh)."""
    job_id = service.submit(recipe(job_models))
    token = claim(service.sessions, job_id, "host:1")
    then = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(minutes=minutes_ago)
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(progress_at=then, started_at=then, **values))
    return job_id, token


def test_a_stalled_job_fails_with_its_reason_and_its_writes_are_fenced(tmp_path, job_models):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'j.db'}", broker_url="memory://")
    service = JobService(dataclasses.replace(settings, stall_minutes=30), celery_app=_Celery())
    hung, token = _running(service, job_models, 31, stage="reconstruct", layer=3, n_layers=24)
    moving, _ = _running(service, job_models, 5, stage="scoring")
    assert service.reap() == [hung]
    info = service.show(hung)
    assert info["status"] == "FAILED"
    assert info["error"] == "no progress for 30 minutes (stage reconstruct, layer 3/24)"
    assert service.celery.revoked == [f"task-{hung}"]  # its process is asked to die
    assert service.show(moving)["status"] == "RUNNING"
    with pytest.raises(Superseded):  # the stalled attempt, waking up, writes nothing more
        job_log(service.sessions, hung, token, "late line")
    off = JobService(dataclasses.replace(settings, stall_minutes=0), celery_app=_Celery())
    assert off.reap() == []


def test_a_job_past_the_time_limit_fails(tmp_path, job_models):
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'j.db'}",
        broker_url="memory://",
        task_time_limit_hours=2,
    )
    service = JobService(settings, celery_app=_Celery())
    job_id, _ = _running(service, job_models, 121)
    with service.sessions.begin() as s:  # progressing all along
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(progress_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
        )
    assert service.reap() == [job_id]
    assert service.show(job_id)["error"] == "ran longer than the time limit of 2 hours (LIAR_TASK_TIME_LIMIT)"


@pytest.mark.integration
def test_a_hung_job_on_a_real_worker_ends_failed_within_the_watchdog_and_a_lease(faults, job_models):  # noqa: F811
    """A worker whose job sleeps in its first layer (``LIAR_STAGE_PAUSE``) while its heartbeat thread
    beats on: its own maintenance thread fails the job within the stall time and a lease, and the job's
    process is killed. The stall time, 30 s, is long enough for the worker to import the engine on busy
    cores (the stages before the first layer report no steps meanwhile: 4 to 6 s on two idle cores, 11 s
    seen with both cores busy elsewhere, over 18 s in `make test`'s three processes on two cores)."""
    faults.env["LIAR_LEASE_SECONDS"] = "6"  # no false "lost worker" on busy cores: only the watchdog acts
    service = faults.service()
    faults.start_worker(LIAR_STAGE_PAUSE="reconstruct=600", LIAR_STALL_MINUTES="0.5")
    job_id = service.submit(recipe(job_models))
    info = wait_for(lambda: (i := service.show(job_id))["stage"] == "reconstruct" and i, timeout=120, what="layer 0")
    began = time.monotonic()
    info = wait_for(lambda: (i := service.show(job_id))["status"] != Status.RUNNING.value and i, timeout=60)
    took = time.monotonic() - began
    assert info["status"] == "FAILED", info
    assert info["error"] == "no progress for 0.5 minutes (stage reconstruct, layer 0/2)"
    assert took < 30 + 6 + 5, took  # the stall time, one lease, and the test's polling
    wait_for(lambda: not alive(job_pid(info)), timeout=30, what="the hung process to be killed")
    assert service.show(job_id)["status"] == "FAILED"
