"""Integration tests of the job runner with real worker processes, on both stacks."""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import func, select

from jobs.db import Job
from jobs.service import SubmitError
from tests.jobs.conftest import recipe, wait_for
from tests.jobs.faults import RedisServer

pytestmark = pytest.mark.integration


def _status(service, job_id):
    return service.show(job_id)["status"]


def test_submit_runs_to_success_with_metrics_and_loadable_checkpoint(stack, job_models):
    service = stack.service()
    stack.start_worker()
    seen_stages = set()
    job_id = service.submit(
        recipe(job_models),
        submitted_by="ada",
        evaluations=[{"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}],
    )

    def done():
        info = service.show(job_id)
        seen_stages.add(info["stage"])
        return info["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") and info

    info = wait_for(done, what=f"job {job_id} to finish")
    assert info["status"] == "SUCCEEDED", info["error"]
    info = service.show(job_id, internal=True)  # with the files' server paths
    assert info["submitted_by"] == "ada" and info["layer"] == info["n_layers"] == 2
    # submitted with the default criterion; the job shows what it resolved to and ran
    assert info["recipe"]["criterion"]["name"] == "auto" and info["recipe_as_run"]["criterion"]["name"] == "obs"
    assert info["criterion"] == "obs" and info["allocation"] == "global"
    assert [j["criterion"] for j in service.list() if j["id"] == job_id] == ["obs"]
    assert info["metrics"]["perplexity"] > 1 and 0.25 < info["metrics"]["achieved_ratio"] < 0.35
    m = info["metrics"]  # streamed; the realised speed, every block timed on the worker before and after
    assert m["block_seconds_dense"] > 0 and m["block_seconds_pruned"] > 0
    assert m["block_speedup_low"] <= m["block_speedup"] <= m["block_speedup_high"]  # the median and its spread
    assert len(info["report"]) > 0 and info["log"][0]["message"] == "submitted by ada"
    import hashlib

    from core import load_pruned

    checkpoint = next(a for a in info["artifacts"] if a["kind"] == "checkpoint")
    files = [a for a in info["artifacts"] if a["kind"] == "file"]
    assert {"config.json", "SHA256SUMS"} <= {a["name"] for a in files}
    shards = {a["name"] for a in files if a["name"].startswith("model-0")}  # streamed: one per block + 1
    assert len(shards) == info["n_layers"] + 1
    assert "archive" not in {a["kind"] for a in info["artifacts"]}
    for a in files:  # the digests recorded (from SHA256SUMS) are those of the files
        assert hashlib.sha256(open(a["path"], "rb").read()).hexdigest() == a["sha256"], a["name"]
    stages = [e["stage"] for e in info["timings"]["stages"]]
    assert stages[:2] == ["starting", "load"] and stages[-2:] == ["evaluate", "export"] and info["timings"]["total"] > 0
    model, tok = load_pruned(checkpoint["path"])
    assert sum(p.numel() for p in model.parameters()) == info["metrics"]["params_after"]


def test_invalid_recipe_is_rejected_and_creates_no_job(stack, job_models):
    service = stack.service()
    with pytest.raises(SubmitError, match="ratio must lie strictly between 0 and 1"):
        service.submit(recipe(job_models, ratio=1.5))
    with pytest.raises(SubmitError, match="unknown reconstruction method"):
        service.submit(recipe(job_models, reconstruction={"method": "magic"}))
    with pytest.raises(SubmitError, match="colour: unknown key"):
        service.submit(recipe(job_models), evaluations=[{"dataset": "x", "colour": "red"}])
    with service.sessions() as s:
        assert s.scalar(select(func.count(Job.id))) == 0


def test_cancel_running_job_stops_within_a_layer(stack, job_models):
    service = stack.service()
    # each of the 8 layers waits 2 s as it begins (LIAR_STAGE_PAUSE): the job runs on long enough to be
    # cancelled in a layer on a machine of any speed, without a model big enough to take that long
    stack.start_worker(LIAR_STAGE_PAUSE="reconstruct=2")
    job_id = service.submit(recipe(job_models, "deep"))
    running = wait_for(
        lambda: (i := service.show(job_id))["status"] == "RUNNING" and (i["layer"] or 0) >= 1 and i,
        what="the job to reach layer 1",
    )
    assert service.cancel(job_id) == "RUNNING"
    info = wait_for(lambda: (i := service.show(job_id))["status"] != "RUNNING" and i, timeout=60, what="cancel")
    assert info["status"] == "CANCELLED"
    assert info["layer"] <= running["layer"] + 2  # stopped at the next layer boundary or the one after
    assert info["layer"] < info["n_layers"] == 8  # so before its last layer
    assert info["artifacts"] == []
    assert not (stack.data_dir / "artifacts" / f"job-{job_id}").exists()


def test_cancel_queued_job(stack, job_models):
    service = stack.service()  # no worker: the job stays queued
    job_id = service.submit(recipe(job_models))
    assert service.cancel(job_id) == "CANCELLED"
    stack.start_worker()
    follow = service.submit(recipe(job_models))
    wait_for(lambda: _status(service, follow) == "SUCCEEDED", what="the follow-up job")
    assert _status(service, job_id) == "CANCELLED"  # the worker skipped it


# embedded only: on PostgreSQL + Redis, test_faults.py's twenty resumed jobs (four workers SIGKILLed in
# a block, a fresh one in each one's place, every job succeeding) and its killed-worker test check it
@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_killed_worker_job_is_requeued_and_finishes(stack, job_models):
    service = stack.service()
    # the first worker waits 3 s as each layer begins (LIAR_STAGE_PAUSE): it is killed inside layer 1
    # on a machine of any speed; the second, which reruns the job, does not wait
    worker = stack.start_worker(LIAR_STAGE_PAUSE="reconstruct=3")
    job_id = service.submit(recipe(job_models))
    wait_for(
        lambda: (i := service.show(job_id))["status"] == "RUNNING" and (i["layer"] or 0) >= 1,
        what="the job to reach layer 1",
    )
    stack.kill_worker(worker)  # SIGKILL the whole worker: parent and child
    # after the lease (3 s) the job is no longer RUNNING: re-queued (attempt 1 of 2)
    wait_for(lambda: service.reap() or _status(service, job_id) != "RUNNING", timeout=30, what="the lease to expire")
    assert _status(service, job_id) == "QUEUED"
    stack.start_worker()
    info = wait_for(lambda: (i := service.show(job_id))["status"] in ("SUCCEEDED", "FAILED") and i, what="the rerun")
    assert info["status"] == "SUCCEEDED" and info["attempts"] == 2
    assert any("re-queued" in line["message"] for line in info["log"])


# embedded only: on PostgreSQL + Redis, test_faults.py's twenty clients (4 processes × 5 threads, 100
# jobs, two workers, each started once and succeeded in one attempt) checks the same, and more
@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_concurrent_submissions(stack, job_models):
    service = stack.service()
    ids, errors = [], []

    def submit_five():
        try:
            for _ in range(5):
                ids.append(service.submit(recipe(job_models)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit_five) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(ids) == 20 == len(set(ids))
    stack.start_worker()
    stack.start_worker()
    wait_for(lambda: all(_status(service, i) in ("SUCCEEDED", "FAILED") for i in ids), timeout=300, what="20 jobs")
    rows = service.list(limit=100)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    bad = [(r["id"], r["status"], r["attempts"]) for r in rows if r["status"] != "SUCCEEDED" or r["attempts"] != 1]
    assert not bad, [service.show(b[0])["error"] for b in bad[:2]]  # each job ran exactly once


def test_sweep_creates_a_group(stack, job_models):
    service = stack.service()
    group, ids = service.submit_sweep(recipe(job_models), ratios=[0.2, 0.4], methods=["bias", "ls"])
    assert len(ids) == 4
    rows = service.list(group_id=group)
    assert {(r["ratio"], r["method"]) for r in rows} == {(0.2, "bias"), (0.2, "ls"), (0.4, "bias"), (0.4, "ls")}
    with pytest.raises(SubmitError, match="unknown reconstruction method"):
        service.submit_sweep(recipe(job_models), methods=["ls", "magic"])
    assert len(service.list(limit=100)) == 4  # the invalid sweep created nothing


def test_queued_jobs_survive_losing_the_broker(stack, job_models, tmp_path):
    """Redis restarted without persistence (or the filesystem queue wiped): queued jobs still run,
    because the database knows them and the worker re-sends messages that went missing. The Redis
    restarted is a private one: the shared server's other databases serve other tests at the time."""
    redis = None
    if stack.kind == "postgres+redis":
        redis = RedisServer(tmp_path / "redis")
        redis.start()
        stack.env["LIAR_BROKER_URL"] = os.environ["LIAR_BROKER_URL"] = redis.url
    service = stack.service()
    ids = [service.submit(recipe(job_models)) for _ in range(2)]
    assert service.queued_in_broker() == set(ids)
    if redis is not None:
        redis.restart()
    else:
        for msg in (stack.data_dir / "broker" / "queue").glob("*.msg"):
            msg.unlink()
    assert service.queued_in_broker() == set()
    stack.start_worker()
    try:
        wait_for(lambda: all(_status(service, i) == "SUCCEEDED" for i in ids), timeout=120, what="re-sent jobs")
    finally:
        stack.stop()
        if redis is not None:
            redis.stop()


def test_model_dependent_errors_are_caught_at_submission(stack, job_models):
    """What the model's config can tell (sequence length, positions on a decoder) fails the submission,
    not a queued job."""
    service = stack.service()
    with pytest.raises(SubmitError, match="exceeds the model's limit"):
        service.submit(recipe(job_models, calibration={"dataset": str(job_models["calib"]), "max_seq_length": 100000}))
    with pytest.raises(SubmitError, match="decoder"):
        service.submit(recipe(job_models, reconstruction={"method": "bias", "positions": "first"}))
    with service.sessions() as s:
        assert s.scalar(select(func.count(Job.id))) == 0
