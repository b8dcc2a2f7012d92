"""Fencing of job attempts (``jobs.fencing``): once a later attempt owns a job, every write of an
earlier one is refused whole; each attempt writes into a folder of its own; leases are stamped and
judged on the database server's clock — on SQLite and PostgreSQL, in-process (no worker). The case
with real workers (one paused past its lease, then resumed) is in ``test_faults.py``."""

from __future__ import annotations

import datetime as dt
import logging
import time
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

import core.pipeline.sequential
import jobs.db
import jobs.service
import jobs.tasks
from jobs.artifacts import attempt_dir, job_dir
from jobs.db import Artifact, Job, Status, db_now, server_utcnow, utcnow
from jobs.fencing import (
    Heartbeat,
    Superseded,
    claim,
    fenced,
    finish,
    job_log,
    record_success,
    requeue_or_fail,
    write_progress,
)
from jobs.service import JobService
from jobs.settings import Settings
from jobs.tasks import execute
from jobs.timings import Event, StageClock
from tests.jobs.conftest import _pg_available, postgres_database, recipe, wait_for
from tests.jobs.faults import snapshot
from tests.jobs.test_service import _FakeCelery


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def service(request, tmp_path):
    """A job service on an empty database of each kind (a PostgreSQL one is dropped afterwards)."""

    def on(url: str) -> JobService:
        return JobService(Settings(tmp_path, url, "memory://", lease_seconds=5), _FakeCelery())

    if request.param == "sqlite":
        yield on(f"sqlite:///{tmp_path / 'jobs.db'}")
        return
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    with postgres_database("liar_fence") as url:
        yield on(url)


def _job(service: JobService) -> int:
    """A QUEUED job row (no broker message: these tests claim it themselves)."""
    with service.sessions.begin() as s:
        job = Job(recipe={"model": "m", "ratio": 0.3}, evaluations=[], status=Status.QUEUED.value)
        s.add(job)
        s.flush()
        return job.id


def _requeue(service: JobService, job_id: int) -> None:
    """What the reaper does to a job whose worker it declared lost."""
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=Status.QUEUED.value, heartbeat_at=None))


def _result():
    """What ``record_success`` reads of a prune's result."""
    return SimpleNamespace(layer_rows=lambda: [{"layer": 0}], recipe=SimpleNamespace(model_dump=lambda mode: {"m": 1}))


def _writes(service: JobService, job_id: int, token: int) -> dict:
    """Each write an attempt makes, as a call."""
    sf, tmp = service.sessions, service.settings.artifacts_dir
    artifact = lambda: Artifact(job_id=job_id, kind="checkpoint", path=str(tmp / f"a{token}"), size=1)  # noqa: E731
    return {
        "progress": lambda: write_progress(sf, job_id, token, {"stage": "reconstruct", "layer": 1}, [Event("x")]),
        "progress callback": lambda: jobs.tasks._progress_callback(sf, job_id, token, StageClock(), None, lambda: None)(
            "reconstruct", 1, 2
        ),
        "log": lambda: job_log(sf, job_id, token, f"from attempt {token}"),
        "success": lambda: record_success(sf, job_id, token, _result(), {"m": 1.0}, [artifact()], StageClock()),
        "failure": lambda: finish(sf, job_id, token, Status.FAILED, "boom", "tb", StageClock()),
        "cancel": lambda: finish(sf, job_id, token, Status.CANCELLED, "cancelled by request"),
        "requeue": lambda: requeue_or_fail(sf, job_id, token, 3, "transient error"),
        "out of attempts": lambda: requeue_or_fail(sf, job_id, token, 1, "transient error"),
        "stop": lambda: requeue_or_fail(sf, job_id, token, 1, "worker stopping", stopped=True),
    }


def _beat(service: JobService, job_id: int, token: int) -> str | None:
    """Run attempt ``token``'s heartbeat thread until a beat lands or is refused; why it was refused."""

    def stamp() -> dt.datetime | None:
        with service.sessions() as s:
            return s.scalar(select(Job.heartbeat_at).where(Job.id == job_id))

    before = stamp()
    beat = Heartbeat(service.sessions, job_id, token, every=0.02)
    beat.start()
    wait_for(lambda: beat.lost.is_set() or stamp() != before, timeout=10, every=0.02, what="a heartbeat")
    beat.stop.set()
    beat.join(10)
    return beat.refused()


def test_claims_count_the_attempts(service):
    job = _job(service)
    assert claim(service.sessions, job, "a:1") == 1
    assert claim(service.sessions, job, "b:2") is None  # RUNNING: someone has it
    _requeue(service, job)
    assert claim(service.sessions, job, "b:2") == 2
    with service.sessions() as s:
        row = s.get(Job, job)
        assert (row.status, row.attempts, row.worker, row.stage) == ("RUNNING", 2, "b:2", "starting")
        assert abs(row.heartbeat_at - row.started_at) < dt.timedelta(seconds=1)
        assert abs(row.started_at - db_now(s)) < dt.timedelta(seconds=5)
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status=Status.CANCELLED.value))
    assert claim(service.sessions, job, "c:3") is None


def test_a_stop_is_not_counted_against_the_attempts(service):
    """With two attempts allowed: attempt 1 stopped politely goes back to the queue uncounted, attempt
    2's transient error requeues the job (one attempt counted), attempt 3's ends it (two)."""
    job, sf = _job(service), service.sessions
    assert requeue_or_fail(sf, job, claim(sf, job, "a:1"), 2, "worker a:1 stopping", stopped=True) is False
    assert requeue_or_fail(sf, job, claim(sf, job, "b:2"), 2, "transient error") is False
    assert requeue_or_fail(sf, job, claim(sf, job, "c:3"), 2, "transient error") is True
    with service.sessions() as s:
        row = s.get(Job, job)
        assert (row.status, row.attempts, row.stops) == ("FAILED", 3, 1)
        assert row.error == "transient error"


def test_a_superseded_attempt_writes_nothing(service):
    """Attempt 1 loses its job twice over — re-queued by the reaper, then claimed by attempt 2 — and
    each of its writes is refused whole; attempt 2's land, until it has finished the job."""
    job = _job(service)
    assert claim(service.sessions, job, "a:1") == 1
    job_log(service.sessions, job, 1, "attempt 1 runs")
    for state in ("re-queued", "claimed by attempt 2"):
        if state == "re-queued":
            _requeue(service, job)
        else:
            assert claim(service.sessions, job, "b:2") == 2
        before = snapshot(service)
        for name, write in _writes(service, job, 1).items():
            with pytest.raises(Superseded, match="attempt 1 of job .* no longer owns it"):
                write()
            assert snapshot(service) == before, (state, name)
        assert _beat(service, job, 1).startswith("attempt 1 of job ")
        refused = jobs.tasks._progress_callback(service.sessions, job, 1, StageClock(), None, lambda: "refused")
        with pytest.raises(Superseded, match="^refused$"):  # what the heartbeat thread found, in the main thread
            refused("reconstruct", 1, 2)
        assert snapshot(service) == before, state

    second = _writes(service, job, 2)
    assert second["progress"]() is False  # written; no cancel pending
    second["log"]()
    assert _beat(service, job, 2) is None
    assert second["success"]() is True
    info = service.show(job, internal=True)
    assert info["status"] == "SUCCEEDED" and info["attempts"] == 2 and info["layer"] == 1
    assert info["metrics"] == {"m": 1.0} and [a["path"] for a in info["artifacts"]] == [
        str(service.settings.artifacts_dir / "a2")
    ]
    messages = [line["message"] for line in info["log"]]
    assert messages[:2] == ["attempt 1 runs", "x"] and "from attempt 2" in messages and messages[-1] == "succeeded"
    assert "from attempt 1" not in messages
    done = snapshot(service)
    for write in second.values():  # the job is finished: no attempt writes to it any more
        with pytest.raises(Superseded, match="the job is SUCCEEDED at attempt 2"):
            write()
    assert snapshot(service) == done


def test_a_pending_cancel_stops_the_success_from_being_recorded(service):
    job = _job(service)
    token = claim(service.sessions, job, "a:1")
    service.cancel(job)
    assert _writes(service, job, token)["success"]() is False
    info = service.show(job)
    assert info["status"] == "RUNNING" and info["metrics"] == {} and info["artifacts"] == []


def test_the_clock_is_the_database_servers(service):
    """Heartbeats are stamped by the database and read back as naive UTC datetimes that compare with
    its clock in SQL."""
    job = _job(service)
    token = claim(service.sessions, job, "a:1")
    with fenced(service.sessions, job, token):
        pass
    with service.sessions() as s:
        now, beat = db_now(s), s.get(Job, job).heartbeat_at
        assert isinstance(now, dt.datetime) and now.tzinfo is None and beat.tzinfo is None
        assert abs(now - utcnow()) < dt.timedelta(seconds=5)  # the test and the database share a host
        assert dt.timedelta(0) <= now - beat < dt.timedelta(seconds=5)
        assert s.scalar(select(Job.id).where(Job.heartbeat_at <= server_utcnow())) == job
        assert s.scalar(select(Job.id).where(Job.heartbeat_at > server_utcnow())) is None


@pytest.mark.parametrize("skew", [dt.timedelta(hours=1), -dt.timedelta(hours=1)], ids=["ahead", "behind"])
def test_a_host_clock_an_hour_off_reaps_the_stale_job_only(service, monkeypatch, skew):
    """With this host's clock an hour ahead (it would reap every job) or behind (it would reap none),
    the reaper still re-queues the job without a heartbeat for longer than the lease, and only it."""
    real = jobs.db.utcnow
    for module in (jobs.db, jobs.service):
        monkeypatch.setattr(module, "utcnow", lambda: real() + skew)
    fresh, stale = _job(service), _job(service)
    for job in (fresh, stale):
        assert claim(service.sessions, job, f"w:{job}") == 1
    with service.sessions.begin() as s:
        old = db_now(s) - dt.timedelta(seconds=3 * service.settings.lease_seconds)
        s.execute(update(Job).where(Job.id == stale).values(heartbeat_at=old))
    assert service.reap() == [stale]
    assert service.show(fresh)["status"] == "RUNNING" and service.show(stale)["status"] == "QUEUED"


def test_force_cancel_ends_only_the_attempt_it_saw(service):
    job = _job(service)
    claim(service.sessions, job, "a:1")
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(celery_id="msg-1"))

    def revoke(celery_id, **_kw):  # meanwhile the reaper re-queued the job and attempt 2 took it
        _requeue(service, job)
        claim(service.sessions, job, "b:2")

    service.celery.control = SimpleNamespace(revoke=revoke)
    service.force_cancel(job)
    assert service.show(job)["status"] == "RUNNING" and service.show(job)["attempts"] == 2
    folder = attempt_dir(service.settings.artifacts_dir, job, 2)
    folder.mkdir(parents=True)
    service.celery.control = SimpleNamespace(revoke=lambda celery_id, **_kw: None)
    service.force_cancel(job)
    info = service.show(job)
    assert (info["status"], info["error"], info["attempts"]) == ("CANCELLED", "terminated", 2)
    assert not job_dir(service.settings.artifacts_dir, job).exists()


def _superseded_at_first_layer(monkeypatch, service: JobService, job: int) -> list:
    """Wraps the progress callback: at the first reconstructed layer, the reaper re-queues the job
    and attempt 2 claims it (leaving a file in its folder). Returns the snapshot taken then."""
    taken: list = []
    real = jobs.tasks._progress_callback

    def wrapped(sf, job_id, *args, **kwargs):
        progress = real(sf, job_id, *args, **kwargs)

        def call(stage, done, total):
            if stage == "reconstruct" and not taken:
                _requeue(service, job)
                assert claim(service.sessions, job, "other:2") == 2
                later = attempt_dir(service.settings.artifacts_dir, job, 2)
                later.mkdir(parents=True)
                (later / "mine").write_text("attempt 2")
                taken.append(snapshot(service))
            progress(stage, done, total)

        return call

    monkeypatch.setattr(jobs.tasks, "_progress_callback", wrapped)
    return taken


def test_a_superseded_run_stops_quietly(service, job_models, monkeypatch, caplog):
    """``execute`` whose job is taken over mid-prune: it returns "superseded", writes nothing more,
    removes its own folder only, and says so in the worker's log (not the job's)."""
    job = service.submit(recipe(job_models))
    taken = _superseded_at_first_layer(monkeypatch, service, job)
    with caplog.at_level(logging.WARNING, logger="jobs.tasks"):
        assert execute(job, service.settings) == "superseded"
    assert snapshot(service) == taken[0]
    assert not attempt_dir(service.settings.artifacts_dir, job, 1).exists()
    assert (attempt_dir(service.settings.artifacts_dir, job, 2) / "mine").read_text() == "attempt 2"
    (line,) = [r.getMessage() for r in caplog.records if "superseded" in r.getMessage()]
    mine = attempt_dir(service.settings.artifacts_dir, job, 1)
    assert line == (
        f"job {job}: attempt 1 superseded (attempt 1 of job {job} no longer owns it: the job is RUNNING at "
        f"attempt 2); stopped, writing nothing more; removed its folder {mine}"
    )


def test_a_transient_error_after_losing_the_job_is_not_retried(service, job_models, monkeypatch):
    """The transient-error path re-queues the job for a retry (the Celery task's autoretry): an
    attempt superseded meanwhile returns "superseded" instead of raising, so nothing re-runs it."""
    job = service.submit(recipe(job_models))

    def lose_then_fail(*_a, **_kw):
        _requeue(service, job)
        claim(service.sessions, job, "other:2")
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(core.pipeline.sequential, "prune", lose_then_fail)
    assert execute(job, service.settings) == "superseded"
    info = service.show(job)
    assert (info["status"], info["attempts"]) == ("RUNNING", 2)
    assert not any("will retry" in line["message"] for line in info["log"])


def test_each_attempt_writes_its_own_folder_and_a_success_removes_earlier_ones(service, job_models):
    """Attempt 2 succeeds into ``job-N/attempt-2/checkpoint``, removes attempt 1's leftovers and keeps
    a later attempt's folder; its files download, confined to the job's folder."""
    job = service.submit(recipe(job_models))
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(attempts=1))
    folders = {k: attempt_dir(service.settings.artifacts_dir, job, k) for k in (1, 2, 3)}
    for k in (1, 3):
        folders[k].mkdir(parents=True)
        (folders[k] / "left").write_text(str(k))
    assert execute(job, service.settings) == "SUCCEEDED"
    info = service.show(job, internal=True)
    checkpoint = next(a["path"] for a in info["artifacts"] if a["kind"] == "checkpoint")
    assert checkpoint == str(folders[2] / "checkpoint") and info["attempts"] == 2
    assert not folders[1].exists() and (folders[3] / "left").read_text() == "3"
    config = service.file(job, "config.json")
    assert config.path == (folders[2] / "checkpoint" / "config.json").resolve()
    assert len(b"".join(service.checkpoint_tar(job))) > config.size


def test_a_job_finished_before_attempt_folders_still_downloads(service):
    """A checkpoint written directly under ``job-N/checkpoint`` (before this layout) is still served."""
    job = _job(service)
    checkpoint = job_dir(service.settings.artifacts_dir, job) / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    with service.sessions.begin() as s:
        s.add(Artifact(job_id=job, kind="checkpoint", path=str(checkpoint), size=2))
        s.add(Artifact(job_id=job, kind="file", name="config.json", path=str(checkpoint / "config.json"), size=2))
        s.execute(update(Job).where(Job.id == job).values(status=Status.SUCCEEDED.value))
    assert service.file(job, "config.json").path.read_text() == "{}"
    assert b"{}" in b"".join(service.checkpoint_tar(job))


def test_a_superseded_attempt_keeps_a_checkpoint_the_job_records(service, caplog):
    """A success whose commit was acknowledged only after the connection dropped: the retried write
    finds the job finished, but the folder it recorded is the job's checkpoint, and stays."""
    job = _job(service)
    token = claim(service.sessions, job, "a:1")
    folder = attempt_dir(service.settings.artifacts_dir, job, token)
    (folder / "checkpoint").mkdir(parents=True)
    with service.sessions.begin() as s:
        s.add(Artifact(job_id=job, kind="checkpoint", path=str(folder / "checkpoint"), size=0))
    assert record_success(service.sessions, job, token, _result(), {}, [], StageClock())
    with caplog.at_level(logging.WARNING, logger="jobs.tasks"), pytest.raises(Superseded) as exc:
        record_success(service.sessions, job, token, _result(), {}, [], StageClock())
    jobs.tasks._stand_down(service.sessions, job, token, service.settings, exc.value)
    assert (folder / "checkpoint").is_dir()
    assert caplog.records[-1].getMessage().endswith(f"kept its folder {folder}")


@pytest.mark.integration
def test_postgresql_ends_a_transaction_left_idle_by_a_stopped_process():
    """A worker stopped inside a transaction would hold its job's row lock (the reaper skips locked rows)
    until its connection died: the job database's sessions end such a transaction after
    ``IDLE_IN_TRANSACTION_MS``, so the job is reaped within that plus a lease."""
    from sqlalchemy import text

    from jobs.db import IDLE_IN_TRANSACTION_MS, connect

    with postgres_database("liar_idle") as url:
        with connect(url)() as s:
            shown = s.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
            assert shown == f"{IDLE_IN_TRANSACTION_MS // 60_000}min"
            s.execute(text("SET idle_in_transaction_session_timeout = 200"))  # the same rule, in a test's time
            s.execute(text("SELECT 1"))
            time.sleep(0.6)  # stopped inside the transaction
            with pytest.raises(Exception, match="idle-in-transaction timeout|terminat|closed"):  # noqa: B017
                s.execute(text("SELECT 1"))
