"""The Model page lists a job's attempts (the worker, the block each started at, its last checkpoint,
its minutes) and what one checkpoint save cost: a streamed job that lost its database connection at
its third block and resumed there in its second attempt."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

import jobs.tasks
from app.web import listings, views
from core.models.tiny import tiny_decoder
from jobs.db import JobLog, Metric
from jobs.tasks import execute


def _losing_the_connection_at_block(monkeypatch, block: int) -> None:
    """The first attempt's progress callback raises ConnectionError (transient: the job is requeued)
    when block ``block`` (0-based) starts."""
    real = jobs.tasks._progress_callback

    def wrapped(sf, job_id, token, *args):
        progress = real(sf, job_id, token, *args)

        def hook(stage, done, total):
            if token == 1 and stage == "reconstruct" and done == block:
                raise ConnectionError("connection to the database lost")
            progress(stage, done, total)

        return hook

    monkeypatch.setattr(jobs.tasks, "_progress_callback", wrapped)


@pytest.mark.slow
def test_the_model_page_lists_attempts_and_the_cost_of_a_checkpoint_save(job_service, corpus, tmp_path, monkeypatch):
    service = job_service
    service.settings = dataclasses.replace(service.settings, checkpoint_minutes=1e-9)  # a save after every block
    model = tiny_decoder(tmp_path / "four", num_hidden_layers=4)
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    recipe = {"model": str(model), "ratio": 0.3, "calibration": calibration, "execution": "stream"}
    job = service.submit(recipe | {"criterion": {"name": "magnitude"}})
    _losing_the_connection_at_block(monkeypatch, 2)
    with pytest.raises(ConnectionError):
        execute(job, service.settings)
    assert execute(job, service.settings) == "SUCCEEDED", service.show(job)["error"]

    info = service.show(job)
    head = views.model_page(service, job).head
    assert "#### Attempts" in head
    rows = [line for line in head.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    first, second = rows
    assert first.split(" | ")[2:4] == ["1 of 4", "after block 2 of 4"]  # started at 1, saved after 2
    assert second.split(" | ")[2:4] == ["3 of 4", "after block 3 of 4"]  # resumed at 3
    assert all(float(r.rstrip(" |").rsplit("| ", 1)[1]) >= 0 for r in rows)  # minutes
    m = info["metrics"]
    assert m["resumed_at_block"] == 3 and m["checkpoint_saves"] == 1
    per_save = f"{m['checkpoint_seconds'] / m['checkpoint_saves']:.2f} s per save"
    assert f"Checkpoints: {listings.size_text(m['checkpoint_bytes'])} per save" in head and per_save in head
    assert f"{listings.size_text(m['checkpoint_state_bytes'])} of it activations and loop state" in head


def test_the_page_reads_attempts_from_the_log_and_saves_from_the_metrics(job_service, llama_dir):
    job = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}})
    log = [
        ("10:00:00", "started on gpu-1:11"),
        ("10:05:00", "checkpoint saved after block 36 of 80 (3000.0 MB)"),
        ("10:06:00", "worker gpu-1:11 lost (no heartbeat for 60 s); re-queued"),
        ("10:07:00", "started on gpu-2:12"),
        ("10:07:30", "resumed at block 37 of 80, 36 blocks kept from attempt 1"),
        ("10:17:00", "succeeded"),
    ]
    metrics = {
        "checkpoint_bytes": 3.2e9,
        "checkpoint_state_bytes": 2.28e9,
        "checkpoint_saves": 4,
        "checkpoint_seconds": 6,
    }
    with job_service.sessions.begin() as s:
        for at, message in log:
            s.add(JobLog(job_id=job, at=dt.datetime.fromisoformat(f"2026-01-01T{at}"), message=message))
        s.add_all(Metric(job_id=job, name=k, value=v) for k, v in metrics.items())
    head = views.model_page(job_service, job).head
    assert "| 1 | gpu-1:11 | 1 of 80 | after block 36 of 80 | 7.0 |" in head
    assert "| 2 | gpu-2:12 | 37 of 80 | – | 10.0 |" in head
    assert "Checkpoints: 3.2 GB per save (2.3 GB of it activations and loop state" in head
    assert "1.50 s per save (4 saves, 6.0 s in all)" in head


def test_a_job_without_attempts_shows_none():
    assert listings.attempts_markdown([], {"checkpoint_bytes": 10, "checkpoint_saves": 1}) == ""
    log = [{"at": "2026-01-01T10:00:00", "level": "INFO", "message": "started on w:1"}]
    text = listings.attempts_markdown(log, None)
    assert "| 1 | w:1 | 1 | – | 0.0 |" in text and "Checkpoints" not in text
