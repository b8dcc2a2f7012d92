"""A worker's pool process imports the engine as it starts, before a job comes (``jobs.engine``); its
parent never does."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from jobs import engine

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
    the ``worker_process_init`` signal a new pool process sends starts the import, in the background
    (the signal returns before torch is in), and a job's ``wait_for_engine`` returns once all is in."""
    code = (
        "import json, sys\n"
        "import jobs.worker, jobs.celery_app, jobs.tasks\n"
        f"engine = {ENGINE!r}\n"
        "parent = [m for m in engine if m in sys.modules]\n"
        "from celery.signals import worker_process_init\n"
        "worker_process_init.send(sender='test')\n"
        "at_signal = [m for m in engine if m in sys.modules]\n"
        "from jobs.engine import wait_for_engine\n"
        "wait_for_engine()\n"
        "job = [m for m in engine if m in sys.modules]\n"
        "print(json.dumps({'parent': parent, 'at_signal': at_signal, 'job': job}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["parent"] == [] and seen["job"] == ENGINE
    assert "core.pipeline.sequential" not in seen["at_signal"]  # the process reports up before the imports end


def test_a_failed_import_is_logged_and_the_job_goes_on(monkeypatch, caplog):
    def broken():
        raise ImportError("no module named 'flash_attn'")

    monkeypatch.setattr(engine, "import_engine", broken)
    monkeypatch.setattr(engine, "_importing", None)
    with caplog.at_level(logging.INFO, logger="jobs.engine"):
        engine.start_import()
        engine.wait_for_engine()  # returns: the job imports again and says why
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert "importing the engine ahead of the next job failed" in caplog.records[0].getMessage()
    assert "flash_attn" in caplog.text


def test_without_a_background_import_a_job_does_not_wait(monkeypatch):
    monkeypatch.setattr(engine, "_importing", None)  # a direct execute(), or a worker started otherwise
    engine.wait_for_engine()


def test_the_imports_wait_for_the_device_probe():
    """The worker's parent holds its pool processes' imports until its GEMM probe has ended (an import
    beside the probe on the same cores made the worker look a third slower to the estimates)."""
    code = (
        "import sys, time\n"
        "import jobs.engine as e\n"
        "e.hold_until_probed()\n"
        "e.start_import()\n"
        "time.sleep(1.0)\n"
        "held = 'torch' in sys.modules\n"
        "e.probed()\n"
        "e.wait_for_engine()\n"
        "print(held, 'core.pipeline.sequential' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
