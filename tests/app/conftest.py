"""A running `liar app` (with its embedded worker) on a free port, shared by the app tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobs.conftest import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(data: Path, *args: str, **extra_env: str):
    """Start `liar app` on a free port with its data under ``data``; returns (process, url)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env.update(
        LIAR_DATA_DIR=str(data),
        LIAR_WORKER_MAX_TASKS_PER_CHILD="20",
        GRADIO_ANALYTICS_ENABLED="False",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        **extra_env,
    )
    data.mkdir(parents=True, exist_ok=True)
    log = open(data.parent / f"app-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "app", "--port", str(port), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            assert proc.poll() is None, (data.parent / f"app-{port}.log").read_text()[-3000:]
            return False

    wait_for(up, timeout=120, what="the app to listen")
    time.sleep(1)
    return proc, f"http://127.0.0.1:{port}/"


def stop_app(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    from core.models.tiny import tiny_bert

    data = tmp_path_factory.mktemp("app") / "data"
    tiny_bert(data / "models" / "tiny-bert")  # an encoder to pick in the form
    proc, url = start_app(data)
    yield {"url": url, "data": data}
    stop_app(proc)


@pytest.fixture()
def job_service(tmp_path, tmp_path_factory):
    """A JobService on SQLite and the filesystem broker under ``tmp_path`` (jobs queue; no worker runs
    them) whose web submissions may read the session's test models and texts (pytest's base temp dir)."""
    from jobs.service import JobService
    from jobs.settings import Settings

    data = tmp_path / "data"
    settings = Settings(
        data_dir=data,
        database_url=f"sqlite:///{data / 'liar.db'}",
        broker_url="filesystem://",
        data_roots=(tmp_path_factory.getbasetemp(),),
        task_dirs=(data / "tasks",),  # the folders of lm-eval YAMLs an administrator allows
    )
    settings.ensure_dirs()
    return JobService(settings)
