"""SIGTERM against a real worker (Celery, Redis and PostgreSQL): it finishes its block, saves a
checkpoint, hands the job back and exits within ``LIAR_STOP_SECONDS``; a second worker resumes the
job at the block after the checkpoint and it succeeds."""

from __future__ import annotations

import signal
import time

import pytest

from tests.jobs.conftest import recipe, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("stack", ["postgres+redis"], indirect=True)
def test_a_sigtermed_worker_requeues_its_job_and_another_resumes_it(stack, job_models):
    service = stack.service()
    env = {"LIAR_CHECKPOINT_MINUTES": "0.0001", "LIAR_STOP_SECONDS": "30"}
    first = stack.start_worker(LIAR_STAGE_PAUSE="reconstruct=1", **env)  # a second at each block's start
    job_id = service.submit(recipe(job_models, "deep", criterion={"name": "magnitude"}, execution="stream"))
    wait_for(
        lambda: (i := service.show(job_id))["status"] == "RUNNING" and (i["layer"] or 0) >= 3,
        what="the job to reach block 3",
    )
    t0 = time.monotonic()
    stack.kill_worker(first, signal.SIGTERM)  # as a deploy stops it: the worker's parent and its job's process
    assert time.monotonic() - t0 < 30
    info = service.show(job_id)
    assert info["status"] == "QUEUED" and info["attempts"] == 1, info
    stopped = next(line["message"] for line in info["log"] if "stopping" in line["message"])
    assert "the checkpoint resumes at block" in stopped

    stack.start_worker(**env)
    info = wait_for(lambda: (i := service.show(job_id))["status"] in ("SUCCEEDED", "FAILED") and i, what="the rerun")
    assert info["status"] == "SUCCEEDED" and info["attempts"] == 2, info.get("error")
    assert any(line["message"].startswith("resumed at block") for line in info["log"])
