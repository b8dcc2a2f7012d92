"""A worker's pool process imports the engine as it starts, before a job comes; its parent never does."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import jobs.tasks
from jobs import worker
from jobs.celery_app import PROC_ALIVE_SECONDS, app

ROOT = Path(__file__).resolve().parents[2]
ENGINE = [
    "torch",
    "transformers.modeling_utils",
    "core.pipeline.sequential",
    "core.models.loading",
    "core.evaluation.run",
    "core.evaluation.generate",
]


def test_the_pool_process_imports_the_engine_and_the_parent_does_not():
    """In a fresh interpreter: importing the worker's modules (what its parent runs) leaves torch out;
    the ``worker_process_init`` signal a new pool process sends brings in everything a job runs on."""
    code = (
        "import json, sys\n"
        "import jobs.worker, jobs.celery_app\n"
        f"engine = {ENGINE!r}\n"
        "parent = [m for m in engine if m in sys.modules]\n"
        "from celery.signals import worker_process_init\n"
        "worker_process_init.send(sender='test')\n"
        "print(json.dumps({'parent': parent, 'child': [m for m in engine if m in sys.modules]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"parent": [], "child": ENGINE}


def test_a_slow_import_is_not_taken_for_a_dead_process():
    """Celery kills a pool process that has not reported up within ``worker_proc_alive_timeout``
    (4 s by default): the engine's imports take longer on a loaded host, so the worker allows more."""
    assert app.conf.worker_proc_alive_timeout == PROC_ALIVE_SECONDS >= 60


def test_a_failed_import_is_logged_and_the_process_still_starts(monkeypatch, caplog):
    def broken():
        raise ImportError("no module named 'flash_attn'")

    monkeypatch.setattr(jobs.tasks, "import_engine", broken)
    with caplog.at_level(logging.INFO, logger="jobs.worker"):
        worker._import_the_engine(sender="test")  # does not raise: the job imports again and says why
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "importing the engine ahead of the next job failed" in caplog.records[0].getMessage()
    assert "flash_attn" in caplog.text
