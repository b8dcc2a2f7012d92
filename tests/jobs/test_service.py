"""The job service and task logic in-process (no worker): failures, retries, leases, queries."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import update

from jobs.db import Job, Status, utcnow
from jobs.service import JobService, SubmitError
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


def test_a_broker_failure_never_shows_the_brokers_password(tmp_path, job_models):
    url = "redis://:s3cret-pw@broker.internal:6379/0"

    class Down(_FakeCelery):
        def send_task(self, name, args):  # a client error that quotes what it was given
            raise ConnectionError(f"Error 111 connecting to {url} (password s3cret-pw)")

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'j.db'}", broker_url=url)
    service = JobService(settings, celery_app=Down())
    with pytest.raises(RuntimeError) as caught:
        service.submit(recipe(job_models))
    message = str(caught.value)
    assert "s3cret-pw" not in message
    assert "redis://:***@broker.internal:6379/0" in message
    assert message.startswith("could not queue the job: the broker at")
    assert service.list() == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/1", "redis://user:***@h/1"),
        ("postgresql+psycopg://liar:p%40ss@db:5432/liar", "postgresql+psycopg://liar:***@db:5432/liar"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("filesystem://", "filesystem://"),
    ],
)
def test_redact_url_hides_only_the_password(url, shown):
    from jobs.settings import redact_url

    assert redact_url(url) == shown


def test_sweep_cells_are_the_grid_expansion(service, job_models):
    from core.spec.sweep import expand_grid

    evaluation = {"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 16}
    base = recipe(job_models, reconstruction={"method": "liar", "damp": 0.01})
    group, ids = service.submit_sweep(base, ratios=[0.2, 0.4], methods=["bias", "ls"], evaluations=[evaluation])
    assert len(ids) == 4 and len(service.celery.sent) == 4
    jobs = [service.show(i) for i in ids]
    assert all(j["group_id"] == group for j in jobs)
    assert [(j["ratio"], j["method"]) for j in jobs] == [(0.2, "bias"), (0.2, "ls"), (0.4, "bias"), (0.4, "ls")]
    assert all(j["recipe"]["reconstruction"]["damp"] == 0.01 for j in jobs)  # other base fields are kept
    full = service.validate(base)[0]
    cells = expand_grid(full, {"ratio": [0.2, 0.4], "reconstruction": ["bias", "ls"]})
    expected = [service.validate(c.recipe)[0] for c in cells]
    assert [j["recipe"] for j in jobs] == expected
    assert jobs[0]["evaluations"] == [{**evaluation, "max_windows": None, "batch_size": 4}]


def test_invalid_sweep_creates_no_job(service, job_models):
    calib = str(job_models["calib"])
    for kwargs, message in (
        ({"methods": ["liar", "liar"]}, "grid.reconstruction: duplicated entries"),
        ({"ratios": [0.2, 1.5]}, "ratio 1.5 is not strictly between 0 and 1"),
        ({"criteria": ["magnitude", "nonsense"]}, "unknown criterion 'nonsense'"),
        ({"evaluations": [{"dataset": calib, "seq_len": 1}]}, "seq_len: Input should be greater than or equal to 2"),
        ({"evaluations": [{"dataset": calib + ".missing"}]}, "is neither a named set"),
        ({"evaluations": [{"dataset": calib, "type": "accuracy"}]}, "unknown evaluation type 'accuracy'"),
    ):
        with pytest.raises(SubmitError, match=message):
            service.submit_sweep(recipe(job_models), **{"ratios": [0.2], **kwargs})
    assert service.list() == [] and service.celery.sent == []
