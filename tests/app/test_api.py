"""The web app's named API endpoints through gradio_client, against `liar app` with its embedded worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from tests.jobs.conftest import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("app") / "data"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env.update(
        LIAR_DATA_DIR=str(data),
        LIAR_WORKER_MAX_TASKS_PER_CHILD="20",
        GRADIO_ANALYTICS_ENABLED="False",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    log = open(data.parent / "app.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "app", "--port", str(port)],
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
            assert proc.poll() is None, (data.parent / "app.log").read_text()[-3000:]
            return False

    wait_for(up, timeout=120, what="the app to listen")
    time.sleep(1)
    yield {"url": f"http://127.0.0.1:{port}/", "data": data}
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_named_endpoints(app_server, tmp_path):
    from gradio_client import Client

    client = Client(app_server["url"], verbose=False, download_files=str(tmp_path))
    data = app_server["data"]
    recipe = {
        "model": str(data / "models" / "tiny-llama-demo"),
        "ratio": 0.3,
        "calibration": {
            "dataset": str(data / "texts" / "tiny-demo.txt"),
            "num_calibration_samples": 8,
            "max_seq_length": 32,
        },
    }
    job = client.predict(yaml.safe_dump(recipe), "ada", api_name="/submit")
    assert isinstance(job["id"], int)

    with pytest.raises(Exception, match="ratio must lie strictly between 0 and 1"):
        client.predict(yaml.safe_dump({**recipe, "ratio": 1.5}), "ada", api_name="/submit")

    info = wait_for(
        lambda: (
            (i := json.loads(client.predict(job["id"], api_name="/show_job")))["status"] in ("SUCCEEDED", "FAILED")
            and i
        ),
        timeout=180,
        what="the job",
    )
    assert info["status"] == "SUCCEEDED" and info["submitted_by"] == "ada"
    rows = json.loads(client.predict("", api_name="/list_jobs"))
    assert [r["id"] for r in rows] == [job["id"]]  # the invalid submission created nothing

    path = client.predict(job["id"], api_name="/download")
    with tarfile.open(path) as tar:
        assert "checkpoint/config.json" in tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    from core import load_pruned

    model, _ = load_pruned(tmp_path / "x" / "checkpoint")
    assert sum(p.numel() for p in model.parameters()) == info["metrics"]["params_after"]

    assert client.predict(job["id"], api_name="/cancel_job") == "SUCCEEDED"  # finished jobs stay finished
    with pytest.raises(Exception, match="no job 999"):
        client.predict(999, api_name="/show_job")
