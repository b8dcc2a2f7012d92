"""The operator's view without workers: the Workers tab's roster and its broker-down sentence,
``/healthz`` on the running app and with a dead broker, and ``liar health``'s exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.web import health
from app.web.workers import Roster, worker_row, worker_view
from jobs.celery_app import make_celery
from jobs.service import JobService

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-not-a-real-password"
DEAD_BROKER = f"redis://:{SECRET}@127.0.0.1:1/0"  # nothing listens on port 1


def test_roster_remembers_a_silent_worker_then_forgets_it():
    now = [0.0]
    roster = Roster(forget_after=60, clock=lambda: now[0])
    info = {"queues": ["liar"], "device": {"name": "CPU", "memory_bytes": 8 * 2**30}, "jobs": [7], "pid": 1}
    assert worker_row(*roster.update({"w1@a": info})[0])[1:6] == ["liar", "CPU", "8 GiB", "#7", "now"]
    now[0] = 40
    ((name, age, _),) = roster.update({})
    assert (name, worker_row(name, age, info)[5]) == ("w1@a", "last seen 40 s ago")
    now[0] = 61
    assert roster.update({}) == []


def test_a_dead_broker_is_one_sentence_without_its_password(job_service):
    celery = make_celery(job_service.settings.__class__(**{**job_service.settings.__dict__, "broker_url": DEAD_BROKER}))
    note, rows = worker_view(celery, Roster())
    assert rows == [] and note.count(".") >= 1 and "\n" not in note
    assert "not reachable" in note and SECRET not in note and "Traceback" not in note


def test_healthz_is_503_with_a_dead_broker_and_names_nothing(job_service):
    settings = job_service.settings.__class__(**{**job_service.settings.__dict__, "broker_url": DEAD_BROKER})
    code, body = health.status(JobService(settings))
    assert (code, body) == (503, {"database": "ok", "broker": "down", "store": "ok"})


@pytest.mark.integration
def test_healthz_on_the_running_app(app_server):
    with urllib.request.urlopen(app_server["url"] + "healthz", timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    assert json.loads(text) == {"database": "ok", "broker": "ok", "store": "ok"}
    assert str(app_server["data"]) not in text and "://" not in text


def _health(data: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "health"],
        env={**base, "LIAR_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_liar_health_exit_codes(job_service):
    data = job_service.settings.data_dir  # SQLite, migrated by the service; the filesystem broker
    ok = _health(data)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert [line.split()[:2] for line in ok.stdout.splitlines()] == [
        ["database", "ok"],
        ["broker", "ok"],
        ["store", "ok"],
    ]
    bad = _health(data, LIAR_BROKER_URL=DEAD_BROKER)
    assert bad.returncode == 1 and "broker    FAIL" in bad.stdout and SECRET not in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr
