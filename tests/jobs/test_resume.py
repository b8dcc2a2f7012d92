"""A job whose attempt stopped at a block resumes there in its next attempt (``jobs.checkpoints``):
after a lost connection (a transient error, as a killed worker's job is requeued) and after SIGTERM
(``jobs.stopping``), with the same weights as a job never stopped. In-process, on SQLite; the
checkpoint lives in the job's store."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal

import pytest
from sqlalchemy import update

import jobs.tasks
from core.pipeline.checkpoint import CheckpointError, sha256_file
from jobs.checkpoints import StoreCheckpoints, attempts
from jobs.db import Job, Status, utcnow
from jobs.service import JobService
from jobs.settings import Settings
from jobs.store import Store
from jobs.tasks import execute
from tests.jobs.conftest import recipe
from tests.jobs.test_service import _FakeCelery

STOP_AT = 3  # the block (0-based) at whose start the first attempt is stopped


@pytest.fixture()
def service(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}", broker_url="memory://")
    settings = dataclasses.replace(settings, checkpoint_minutes=1e-9, stop_seconds=60)  # a save after every block
    return JobService(settings, celery_app=_FakeCelery())


def _weights(service: JobService, job_id: int) -> dict[str, str]:
    files = service.show(job_id, internal=True)["artifacts"]
    return {a["name"]: a["sha256"] for a in files if (a.get("name") or "").endswith(".safetensors")}


def _log(service: JobService, job_id: int) -> str:
    return "\n".join(line["message"] for line in service.show(job_id)["log"])


def _stopping_at(monkeypatch, stop, once=True):
    """The first attempt's progress callback calls ``stop()`` when block ``STOP_AT`` starts (the first
    time, or every time unless ``once``)."""
    real, calls = jobs.tasks._progress_callback, []

    def wrapped(sf, job_id, token, *args):
        progress = real(sf, job_id, token, *args)

        def hook(stage, done, total):
            if token == 1 and stage == "reconstruct" and done == STOP_AT and not (calls and once):
                calls.append(done)
                stop()
            progress(stage, done, total)

        return hook

    monkeypatch.setattr(jobs.tasks, "_progress_callback", wrapped)


@pytest.mark.parametrize("execution", ["stream"])  # in memory: tests/core/pipeline/test_resume.py
def test_a_requeued_job_resumes_at_the_block_after_its_checkpoint(service, job_models, monkeypatch, execution):
    r = recipe(job_models, "deep", criterion={"name": "magnitude"}, execution=execution)
    whole = service.submit(r)
    assert execute(whole, service.settings) == "SUCCEEDED", service.show(whole)["error"]

    job = service.submit(r)

    def lose_the_connection():
        raise ConnectionError("connection to the database lost")

    _stopping_at(monkeypatch, lose_the_connection)
    with pytest.raises(ConnectionError):
        execute(job, service.settings)
    assert service.show(job)["status"] == Status.QUEUED.value
    store = service.settings.store()
    assert store.exists(f"artifacts/job-{job}/attempt-1/resume/manifest.json")

    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]
    resumed = f"resumed at block {STOP_AT + 1} of 8, {STOP_AT} blocks kept from attempt 1, scores kept from attempt 1"
    assert resumed in _log(service, job)
    assert _weights(service, job) == _weights(service, whole)  # bit for bit
    assert store.children(f"artifacts/job-{job}") == ["attempt-2"]  # no checkpoint left behind
    assert "resume" not in store.children(f"artifacts/job-{job}/attempt-2")


def test_sigterm_saves_at_the_next_block_requeues_and_the_next_attempt_resumes(service, job_models, monkeypatch):
    r = recipe(job_models, "deep", criterion={"name": "magnitude"}, execution="stream")
    whole = service.submit(r)
    assert execute(whole, service.settings) == "SUCCEEDED", service.show(whole)["error"]

    job = service.submit(r)
    _stopping_at(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))  # as a deploy stops a worker
    assert execute(job, service.settings) == Status.QUEUED.value
    shown = service.show(job)
    assert shown["status"] == Status.QUEUED.value and shown["attempts"] == 1
    assert f"stopped after block {STOP_AT + 1} of 8" in _log(service, job)
    assert signal.getsignal(signal.SIGTERM) is not jobs.tasks.stopping._on_term  # the handler is put back

    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]
    assert f"resumed at block {STOP_AT + 2} of 8, {STOP_AT + 1} blocks kept from attempt 1" in _log(service, job)
    assert _weights(service, job) == _weights(service, whole)
    first, second = attempts(service.show(job)["log"])
    assert (first["attempt"], first["from_block"], first["saved_block"], first["blocks"]) == (1, 1, STOP_AT + 1, 8)
    assert (second["from_block"], second["blocks"]) == (STOP_AT + 2, 8) and second["saved_block"] == 7


def test_a_peek_downloads_the_manifest_and_the_one_file_asked_for(tmp_path):
    store = Store(f"memory://liar-peek-{tmp_path.name}", tmp_path / "cache")  # a remote store: files are downloaded
    files = {"state.pt": tmp_path / "state.pt", "scores.pt": tmp_path / "scores.pt"}
    files["state.pt"].write_bytes(b"activations" * 1000)
    files["scores.pt"].write_bytes(b"scores")
    manifest = {"files": {name: sha256_file(path) for name, path in files.items()}, "next_block": 3, "blocks": 8}
    StoreCheckpoints(store, 7, 1, every_seconds=0).save(files, manifest)
    again = StoreCheckpoints(store, 7, 2, every_seconds=0)
    found = again.peek("scores.pt", tmp_path / "peek")
    assert found is not None and found[1].read_bytes() == b"scores" and found[0]["next_block"] == 3
    assert sorted(p.name for p in (tmp_path / "peek").iterdir()) == ["manifest.json", "scores.pt"]
    assert again.peek("other.pt", tmp_path / "none")[1] is None
    assert (
        StoreCheckpoints(store, 7, 1, every_seconds=0).peek("scores.pt", tmp_path / "own") is None
    )  # no earlier attempt
    with store.fs.open(
        store._full(f"artifacts/job-7/attempt-1/resume/files/{manifest['files']['scores.pt']}"), "wb"
    ) as f:
        f.write(b"changed")
    with pytest.raises(CheckpointError, match="does not match its recorded sha256"):
        again.peek("scores.pt", tmp_path / "changed")


def test_a_stopped_attempt_is_not_counted_against_the_jobs_attempts(service, job_models, monkeypatch):
    """LIAR_MAX_ATTEMPTS (2 here) counts lost and failed attempts, not stopped ones: a job stopped by
    SIGTERM in attempt 1 and lost with its worker in attempt 2 goes back to the queue (it was failed,
    the stop counted as an attempt), and attempt 3 resumes from attempt 1's checkpoint."""
    r = recipe(job_models, "deep", criterion={"name": "magnitude"}, execution="stream")
    job = service.submit(r)
    _stopping_at(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert execute(job, service.settings) == Status.QUEUED.value
    old = utcnow() - dt.timedelta(seconds=600)
    lost = dict(status=Status.RUNNING.value, heartbeat_at=old, attempts=2, worker="gone:1")
    with service.sessions.begin() as s:  # attempt 2 claimed by a worker that then vanished
        s.execute(update(Job).where(Job.id == job).values(**lost))
    assert service.reap() == [job]
    shown = service.show(job)
    assert shown["status"] == Status.QUEUED.value, shown["error"]
    with service.sessions() as s:
        assert (s.get(Job, job).attempts, s.get(Job, job).stops) == (2, 1)

    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]
    assert f"resumed at block {STOP_AT + 2} of 8, {STOP_AT + 1} blocks kept from attempt 1" in _log(service, job)
    assert service.show(job)["attempts"] == 3


def test_attempts_are_read_from_the_log():
    log = [
        ("2026-01-01T10:00:00", "started on gpu-1:11"),
        ("2026-01-01T10:05:00", "checkpoint saved after block 36 of 80 (3.0 MB)"),
        ("2026-01-01T10:06:00", "worker gpu-1:11 lost (no heartbeat for 60 s); re-queued"),
        ("2026-01-01T10:07:00", "started on gpu-2:12"),
        ("2026-01-01T10:07:30", "resumed at block 37 of 80, 36 blocks kept from attempt 1"),
        ("2026-01-01T10:17:00", "succeeded"),
    ]
    rows = attempts([{"at": at, "level": "INFO", "message": m} for at, m in log])
    assert rows == [
        {"attempt": 1, "worker": "gpu-1:11", "from_block": 1, "saved_block": 36, "blocks": 80, "minutes": 7.0},
        {"attempt": 2, "worker": "gpu-2:12", "from_block": 37, "saved_block": None, "blocks": 80, "minutes": 10.0},
    ]


def test_without_checkpoints_a_requeued_job_starts_over(service, job_models, monkeypatch):
    service.settings = dataclasses.replace(service.settings, checkpoint_minutes=0)
    job = service.submit(recipe(job_models, "deep", criterion={"name": "magnitude"}, execution="stream"))

    def lose_the_connection():
        raise ConnectionError("connection to the database lost")

    _stopping_at(monkeypatch, lose_the_connection)
    with pytest.raises(ConnectionError):
        execute(job, service.settings)
    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]
    assert "resumed at" not in _log(service, job)


@pytest.mark.parametrize("name", ["LIAR_CHECKPOINT_MINUTES", "LIAR_STOP_SECONDS"])
@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_duration_setting_is_refused_in_one_sentence(monkeypatch, tmp_path, name, value):
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name} is '{value}'; give a number, 0 or more$"):
        Settings.from_env()
    monkeypatch.setenv(name, "0")
    assert getattr(Settings.from_env(), name.removeprefix("LIAR_").lower()) == 0


@pytest.mark.slow
def test_a_requeued_speed_target_job_goes_on_with_its_finished_prunes(service, job_models, monkeypatch):
    from core.evaluation.latency import LatencyTable
    from core.pipeline import target as target_mod

    table = LatencyTable("decode_b1", 8, [0.0, 0.3, 0.6], [1.0] * 3, [1.0, 0.8, 0.5], "cpu")
    monkeypatch.setattr(target_mod, "measure_table", lambda model, workload: table)

    def seconds(models, workload, rounds):  # a function of the pruned model: both jobs time alike
        dense, pruned = (sum(p.numel() for p in models[k].model.layers.parameters()) for k in ("dense", "pruned"))
        return {"dense": [1.0], "pruned": [(pruned / dense) ** 0.4]}  # short of the table: corrected

    monkeypatch.setattr(target_mod, "interleaved_seconds", seconds)
    target = {"speedup": 1.4, "candidates": 1, "depth": False}  # width only, then its corrections
    r = recipe(job_models, "deep", ratio=None, target=target, criterion={"name": "magnitude"})
    whole = service.submit(r)
    assert execute(whole, service.settings) == "SUCCEEDED", service.show(whole)["error"]

    job = service.submit(r)
    prunes = []

    def lose_the_connection_in_the_second_prune():  # the first prune finished and was saved
        prunes.append(1)
        if len(prunes) == 2:
            raise ConnectionError("connection to the database lost")

    _stopping_at(monkeypatch, lose_the_connection_in_the_second_prune, once=False)
    with pytest.raises(ConnectionError):
        execute(job, service.settings)
    assert service.show(job)["status"] == Status.QUEUED.value
    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]
    log = _log(service, job)
    assert "checkpoint saved after candidate prune 1 (" in log
    assert "speed target resumed: the latency table and 1 finished prunes kept from attempt 1; prune 2 goes on" in log
    assert _weights(service, job) == _weights(service, whole)
    assert service.show(job)["metrics"]["resumed_prunes_kept"] == 1
