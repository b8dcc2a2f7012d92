"""The job service and task logic in-process (no worker): failures, retries, leases, queries."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import update

from jobs.db import Job, Status, utcnow
from jobs.service import JobService
from jobs.settings import Settings
from jobs.tasks import execute
from tests.jobs.conftest import recipe


class _FakeCelery:
    """Records sent messages instead of talking to a broker."""

    def __init__(self):
        self.sent = []

    def send_task(self, name, args):
        self.sent.append((name, args))

        class R:
            id = f"msg-{len(self.sent)}"

        return R()


@pytest.fixture()
def service(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        broker_url="memory://",
        lease_seconds=5,
        max_attempts=2,
    )
    return JobService(settings, celery_app=_FakeCelery())


def test_failed_job_records_error_and_traceback(service, job_models):
    job_id = service.submit(recipe(job_models, calibration={"texts": ["too short"], "max_seq_length": 32}))
    assert execute(job_id, service.settings) == "FAILED"
    info = service.show(job_id)
    assert info["status"] == "FAILED" and "fewer than the" in info["error"]
    assert "Traceback" in info["traceback"] and info["artifacts"] == []
    assert execute(job_id, service.settings) == "skipped"  # a duplicate message does not run it again


def test_transient_error_requeues_then_fails(service, job_models, monkeypatch):
    import core.pipeline.sequential

    def flaky(*a, **k):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(core.pipeline.sequential, "prune", flaky)
    job_id = service.submit(recipe(job_models))
    with pytest.raises(ConnectionError):
        execute(job_id, service.settings)
    assert service.show(job_id)["status"] == "QUEUED"  # attempt 1 of 2: back in the queue
    with pytest.raises(ConnectionError):
        execute(job_id, service.settings)
    info = service.show(job_id)
    assert info["status"] == "FAILED" and "transient error" in info["error"] and info["attempts"] == 2


def test_stale_heartbeat_requeues_then_fails(service, job_models):
    job_id = service.submit(recipe(job_models))
    old = utcnow() - dt.timedelta(seconds=60)
    for attempt in (1, 2):
        with service.sessions.begin() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(status=Status.RUNNING.value, heartbeat_at=old, attempts=attempt, worker="gone:1")
            )
        assert service.reap() == [job_id]
    info = service.show(job_id)
    assert info["status"] == "FAILED" and "worker gone:1 lost" in info["error"]
    assert [m for _, m in service.celery.sent].count([job_id]) == 2  # submitted, then re-sent once


def test_cancel_request_is_honoured_at_layer_boundary(service, job_models):
    job_id = service.submit(recipe(job_models))
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
    # the claim succeeds (it was still QUEUED in the row) and the first progress call stops the run
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=Status.QUEUED.value))
    assert execute(job_id, service.settings) == "CANCELLED"
    assert service.show(job_id)["artifacts"] == []


def test_unknown_job(service):
    with pytest.raises(KeyError, match="no job 99"):
        service.show(99)
    with pytest.raises(KeyError, match="no job 99"):
        service.cancel(99)


def test_broker_failure_creates_no_job(tmp_path, job_models):
    class Down(_FakeCelery):
        def send_task(self, name, args):
            raise ConnectionError("connection refused")

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'j.db'}", broker_url="memory://")
    service = JobService(settings, celery_app=Down())
    with pytest.raises(RuntimeError, match="could not queue the job"):
        service.submit(recipe(job_models))
    assert service.list() == []
