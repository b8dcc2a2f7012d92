"""Re-running only a job's evaluations on its kept checkpoint (``jobs.reevaluation``): the job service
and the worker's task in-process, on SQLite and on PostgreSQL; a real worker end to end."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select

from jobs.access import Actor, Forbidden, NotNow
from jobs.db import Artifact, Job, JobLog, Metric, Status
from jobs.service import JobService, SubmitError
from jobs.settings import Settings
from jobs.tasks import execute
from tests.jobs.conftest import _pg_available, postgres_database, recipe, wait_for
from tests.jobs.test_service import _FakeCelery

ADMIN, OWNER, OTHER = Actor("alice", admin=True), Actor("bob"), Actor("carol")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def service(request, tmp_path):
    """A job service whose messages are recorded (the tests run them with ``execute``), on SQLite or
    on a fresh PostgreSQL database; web-confined reads may name the test's folder."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        yield _service(tmp_path, url)
        return
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    with postgres_database("liar_reeval") as url:
        yield _service(tmp_path, url)


def _service(tmp_path: Path, url: str) -> JobService:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=url,
        broker_url="memory://",
        max_attempts=2,
        data_roots=(tmp_path / "texts",),
    )
    return JobService(settings, celery_app=_FakeCelery())


def _held_out(tmp_path: Path, job_models) -> Path:
    held = tmp_path / "texts" / "held-out.txt"
    held.parent.mkdir(parents=True, exist_ok=True)
    held.write_text(job_models["calib"].read_text())
    return held


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _count(service: JobService) -> int:
    with service.sessions() as s:
        return s.scalar(select(func.count(Job.id)))


def _snapshot(service: JobService) -> tuple:
    """Every row of the job tables: what a refused request must not change."""
    with service.sessions() as s:
        return tuple(
            tuple(tuple(getattr(r, c.name) for c in t.__table__.c) for r in s.scalars(select(t).order_by(t.id)))
            for t in (Job, JobLog, Metric, Artifact)
        )


def test_a_failed_evaluation_is_run_again_on_the_kept_checkpoint(service, job_models, tmp_path, monkeypatch):
    """The held-out text is gone when the job evaluates: the job keeps its checkpoint. Once the text
    is back, a re-evaluation records the perplexity on the job (and the dense baseline that failed
    with it), clears the failure, and leaves every file of the checkpoint as it was: nothing pruned."""
    import core.pipeline.sequential
    from core.evaluation.run import evaluate

    held = _held_out(tmp_path, job_models)
    ev = {"type": "perplexity", "dataset": str(held), "seq_len": 32, "max_windows": 4}
    job_id = service.submit(recipe(job_models), "bob", evaluations=[ev])
    text = held.read_text()
    held.unlink()
    assert execute(job_id, service.settings) == "SUCCEEDED"
    before = service.show(job_id)
    assert before["metrics"]["evaluations_failed"] == 1 and "perplexity" not in before["metrics"]
    checkpoint = service.artifact(job_id)
    digests = _digests(checkpoint)

    with pytest.raises(SubmitError, match="invalid evaluation: .*neither a named set .* nor an existing file"):
        service.reevaluate(job_id, OWNER)  # the cause is not fixed yet: said now, nothing queued
    assert _count(service) == 1
    held.write_text(text)
    new = service.reevaluate(job_id, OWNER)
    assert service.celery.sent[-1] == ("liar.run_job", [new])
    queued = service.show(new)
    assert queued["source_job"] == job_id and queued["submitted_by"] == "bob"
    assert queued["evaluations"] == before["evaluations"] and queued["status"] == "QUEUED"
    assert queued["log"][0]["message"] == f"submitted by bob (re-evaluation of job {job_id}: evaluation 1; no pruning)"

    def never(*args, **kwargs):
        raise AssertionError("a re-evaluation pruned")

    monkeypatch.setattr(core.pipeline.sequential, "prune", never)
    assert execute(new, service.settings) == "SUCCEEDED", service.show(new)["error"]
    after = service.show(job_id)
    measured = evaluate(str(checkpoint), ev)  # the whole model in memory, not block by block
    assert after["metrics"]["perplexity"] == pytest.approx(measured["perplexity"], rel=1e-4)
    assert after["metrics"]["evaluations_failed"] == 0 and after["metrics"]["perplexity_dense"] > 1
    assert after["metrics"]["params_after"] == before["metrics"]["params_after"]  # the prune's numbers stand
    assert after["status"] == "SUCCEEDED" and after["artifacts"] == before["artifacts"]
    assert after["log"][-1]["message"] == (
        f"re-evaluated by job {new} (bob): evaluation 1 (perplexity on held-out.txt) recorded; evaluations_failed 0"
    )
    assert _digests(checkpoint) == digests  # byte for byte: nothing re-pruned or rewritten
    own = service.show(new)
    assert own["metrics"]["perplexity"] == after["metrics"]["perplexity"] and own["progress"] == 1.0
    assert any("no pruning" in x["message"] for x in own["log"]) and own["artifacts"] == []
    assert [e["stage"] for e in own["timings"]["stages"]] == ["starting", "evaluate"]
    assert not (service.settings.artifacts_dir / f"job-{new}").exists()
    with pytest.raises(NotNow, match=f"job {new} is a re-evaluation of job {job_id}: re-evaluate job {job_id}"):
        service.rerun(new, OWNER)  # its recipe is the source's: a re-run would prune


def test_an_evaluation_that_fails_again_leaves_the_job_as_it_was(service, job_models, tmp_path):
    held = _held_out(tmp_path, job_models)
    ev = {"type": "perplexity", "dataset": str(held), "seq_len": 32, "max_windows": 4}
    job_id = service.submit(recipe(job_models), "bob", evaluations=[ev, {**ev, "seq_len": 16}])
    text = held.read_text()
    held.unlink()
    assert execute(job_id, service.settings) == "SUCCEEDED"
    held.write_text(text)
    with pytest.raises(SubmitError, match="the job has 2 evaluations: there is no evaluation 3"):
        service.reevaluate(job_id, OWNER, "1,3")
    new = service.reevaluate(job_id, OWNER, "2")  # one of the two failed ones
    held.unlink()  # gone again before the worker reads it
    assert execute(new, service.settings) == "SUCCEEDED"
    info = service.show(job_id)
    assert info["metrics"]["evaluations_failed"] == 2 and "perplexity" not in info["metrics"]
    line = info["log"][-1]
    assert line["level"] == "WARNING" and line["message"] == (
        f"re-evaluated by job {new} (bob): evaluation 2 (perplexity on held-out.txt) failed again "
        f"(job {new}'s log says why); evaluations_failed 2"
    )
    held.write_text(text)
    both = service.reevaluate(job_id, OWNER)  # by default: the ones that failed, both
    first = service.show(both)["log"][0]["message"]
    assert first.endswith(f"re-evaluation of job {job_id}: evaluation 1, 2; no pruning)")
    assert execute(both, service.settings) == "SUCCEEDED"
    assert service.show(job_id)["metrics"]["evaluations_failed"] == 0
    with service.sessions() as s:
        assert s.get(Job, job_id).failed_evaluations == []


def test_by_default_only_the_failed_task_evaluation_runs_again(service, job_models, tmp_path):
    """The perplexity succeeded, the lm-eval task's data vanished before the job evaluated: the
    re-evaluation runs the task alone (evaluation 2) and records its numbers beside the perplexity,
    which stands as it was measured."""
    from core.evaluation.lmeval import evaluate_lm_eval, write_rt_sentiment_task
    from core.evaluation.tasks import TASKS_ACC_MEAN
    from core.models.tiny import tiny_corpus

    held, tasks = _held_out(tmp_path, job_models), tmp_path / "tasks"
    reviews = [{"text": t, "label": i % 2} for i, t in enumerate(tiny_corpus(6))]
    write_rt_sentiment_task(tasks, reviews)
    evaluations = [
        {"type": "perplexity", "dataset": str(held), "seq_len": 32, "max_windows": 4},
        {"type": "lm_eval", "tasks": "rt_sentiment", "task_dir": str(tasks), "limit": 5},
    ]
    job_id = service.submit(recipe(job_models), "bob", evaluations=evaluations)
    for data in tasks.glob("*.jsonl"):
        data.unlink()
    assert execute(job_id, service.settings) == "SUCCEEDED"
    before = service.show(job_id)["metrics"]
    assert before["evaluations_failed"] == 1 and "rt_sentiment.acc" not in before
    write_rt_sentiment_task(tasks, reviews)
    new = service.reevaluate(job_id, OWNER, confine=False)  # the operator's: any task folder
    assert service.show(new)["evaluations"] == [service.show(job_id)["evaluations"][1]]
    assert execute(new, service.settings) == "SUCCEEDED", service.show(new)["error"]
    after = service.show(job_id)
    expected = evaluate_lm_eval(str(service.artifact(job_id)), None, "rt_sentiment", task_dir=tasks, limit=5)
    acc = expected["summary"]["rt_sentiment"]["acc"]
    assert after["metrics"]["rt_sentiment.acc"] == pytest.approx(acc) and after["metrics"][
        TASKS_ACC_MEAN
    ] == pytest.approx(acc)
    assert after["metrics"]["perplexity"] == before["perplexity"] and after["metrics"]["evaluations_failed"] == 0
    assert "perplexity" not in service.show(new)["metrics"]  # not measured again
    assert after["log"][-1]["message"].endswith(
        ": evaluation 2 (lm_eval on rt_sentiment) recorded; evaluations_failed 0"
    )


def _seeded(service: JobService, job_models, tmp_path: Path, owner: str = "bob", **row) -> int:
    return seed_failed_evaluation(service, job_models["quick"], _held_out(tmp_path, job_models), owner, **row)


def seed_failed_evaluation(service: JobService, model: Path, held: Path, owner: str = "bob", **row) -> int:
    """A pruning job of ``owner`` that SUCCEEDED with a checkpoint (``model`` copied) and one failed
    perplexity evaluation on ``held``, recorded as a worker would; ``row``: other column values."""
    ev = {"type": "perplexity", "dataset": str(held), "seq_len": 32, "batch_size": 4, "max_windows": 4}
    ran = {"model": str(model), "ratio": 0.3, "calibration": {"dataset": str(held)}}
    with service.sessions.begin() as s:
        job = Job(recipe=ran, evaluations=[ev], status=Status.SUCCEEDED.value, submitted_by=owner)
        job.failed_evaluations = [0]
        for name, value in row.items():
            setattr(job, name, value)
        s.add(job)
        s.flush()
        checkpoint = service.settings.artifacts_dir / f"job-{job.id}" / "attempt-1" / "checkpoint"
        shutil.copytree(model, checkpoint)
        key = f"artifacts/job-{job.id}/attempt-1/checkpoint"  # a key in the store (the data folder)
        s.add(Artifact(job_id=job.id, kind="checkpoint", path=key, size=1))
        s.add(Metric(job_id=job.id, name="evaluations_failed", value=1.0))
        s.add(JobLog(job_id=job.id, message=f"submitted by {owner}"))
        return job.id


@pytest.mark.parametrize("actor", [OWNER, ADMIN, OTHER, Actor(None)], ids=["owner", "admin", "other", "nobody"])
def test_only_the_owner_or_an_admin_may_re_evaluate(service, job_models, tmp_path, actor):
    job_id = _seeded(service, job_models, tmp_path)
    before = _snapshot(service)
    if actor in (OWNER, ADMIN):
        new = service.reevaluate(job_id, actor, confine=True)
        info = service.show(new)
        assert info["submitted_by"] == actor.name and info["source_job"] == job_id and info["status"] == "QUEUED"
        return
    with pytest.raises(Forbidden) as refused:
        service.reevaluate(job_id, actor, confine=True)
    assert str(refused.value) == f"job {job_id} is bob's: only its owner or an administrator may re-evaluate it"
    assert _snapshot(service) == before and service.celery.sent == []


def test_every_refusal_is_one_sentence_and_changes_nothing(service, job_models, tmp_path):
    done = _seeded(service, job_models, tmp_path)
    queued = service.submit(recipe(job_models), "bob")
    failed = _seeded(service, job_models, tmp_path, status=Status.FAILED.value)
    bare = _seeded(service, job_models, tmp_path, evaluations=[])
    gone = _seeded(service, job_models, tmp_path)
    shutil.rmtree(service.artifact(gone))
    outside = _seeded(service, job_models, tmp_path)
    with service.sessions.begin() as s:  # a job the CLI submitted, reading a file outside the data roots
        s.get(Job, outside).evaluations = [{**s.get(Job, outside).evaluations[0], "dataset": str(job_models["calib"])}]
    only = "only a succeeded job's checkpoint can be evaluated again"
    cases = [
        (999, None, KeyError, "no job 999"),
        (queued, None, NotNow, f"job {queued} is QUEUED: {only}"),
        (failed, None, NotNow, f"job {failed} is FAILED: {only}; re-run it instead"),
        (bare, None, NotNow, f"job {bare} was submitted without evaluations: there is nothing to evaluate again"),
        (gone, None, NotNow, f"job {gone}'s checkpoint is no longer on the server: re-run the job instead"),
        (done, "x", SubmitError, "evaluations: 'all', or numbers as the job's log gives them (1,3), not 'x'"),
        (done, [0], SubmitError, "the job has 1 evaluation: there is no evaluation 0"),
        (outside, None, SubmitError, "is outside the folders this server reads from"),
    ]
    before, sent = _snapshot(service), list(service.celery.sent)
    for job_id, which, kind, message in cases:
        with pytest.raises(kind) as refused:
            service.reevaluate(job_id, OWNER, which, confine=True)
        said = str(refused.value.args[0]) if kind is KeyError else str(refused.value)
        assert message in said, (job_id, said)
    assert _snapshot(service) == before and service.celery.sent == sent
    new = service.reevaluate(done, OWNER, "all")
    with pytest.raises(NotNow, match=f"job {done} is already being re-evaluated by job {new}: wait for it, or"):
        service.reevaluate(done, ADMIN)
    with pytest.raises(NotNow, match=f"job {new} is a re-evaluation of job {done}: re-evaluate that job instead"):
        service.reevaluate(new, ADMIN)
    with pytest.raises(NotNow, match=f"job {new} is evaluating job {done}'s checkpoint: cancel it first"):
        service.delete(done, OWNER)
    assert service.cancel(new, OWNER) == "CANCELLED"
    service.delete(done, OWNER)  # nothing evaluates it any more
    assert service.show(new)["source_job"] == done  # the re-evaluation's record outlives its source


def test_a_source_gone_before_the_worker_starts_fails_the_re_evaluation_in_one_sentence(service, job_models, tmp_path):
    job_id = _seeded(service, job_models, tmp_path)
    new = service.reevaluate(job_id, OWNER)
    checkpoint = service.artifact(job_id)
    shutil.rmtree(checkpoint)  # removed on the server behind the service's back
    assert execute(new, service.settings) == "FAILED"
    assert service.show(new)["error"] == f"job {job_id}'s checkpoint is no longer on the server: nothing to evaluate"
    info = service.show(job_id)
    assert info["status"] == "SUCCEEDED" and info["metrics"]["evaluations_failed"] == 1


def test_a_cancelled_re_evaluation_writes_nothing_on_its_source(service, job_models, tmp_path):
    job_id = _seeded(service, job_models, tmp_path)
    before = service.show(job_id)
    new = service.reevaluate(job_id, OWNER)
    with service.sessions.begin() as s:  # the cancel arrives while it runs: honoured at its next step
        s.get(Job, new).cancel_requested = True
    assert execute(new, service.settings) == "CANCELLED"
    assert service.show(new)["error"] == "cancelled by request"
    after = service.show(job_id)
    assert after["metrics"] == before["metrics"] and after["log"] == before["log"]


@pytest.mark.integration
def test_a_worker_re_evaluates_a_job_end_to_end(stack, job_models, tmp_path):
    """Through a real worker on each stack: the evaluation fails, the job keeps its checkpoint; once
    the text is back, the re-evaluation runs on the worker and completes the job's metrics."""
    service = stack.service()
    stack.start_worker()
    held = tmp_path / "held-out.txt"
    held.write_text(job_models["calib"].read_text())
    ev = [{"type": "perplexity", "dataset": str(held), "seq_len": 32, "max_windows": 4}]
    job_id = service.submit(recipe(job_models), "ada", evaluations=ev)
    text = held.read_text()
    held.unlink()

    def finished(which):
        return lambda: (i := service.show(which))["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") and i

    assert wait_for(finished(job_id), what="the job")["status"] == "SUCCEEDED"
    digests = _digests(service.artifact(job_id))
    held.write_text(text)
    new = service.reevaluate(job_id, confine=False)
    info = wait_for(finished(new), what="the re-evaluation")
    assert info["status"] == "SUCCEEDED", info["error"]
    metrics = service.show(job_id)["metrics"]
    assert metrics["perplexity"] > 1 and metrics["evaluations_failed"] == 0
    assert _digests(service.artifact(job_id)) == digests
