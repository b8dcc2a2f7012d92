"""What a running job's row shows (stage, the stage's progress, a pending cancel) and the dense
baseline perplexity recorded beside the pruned model's — in-process, no worker."""

from __future__ import annotations

import pytest
from sqlalchemy import update

import jobs.tasks
from jobs.baseline import DENSE
from jobs.db import Job, Status
from jobs.service import JobService, SubmitError
from jobs.settings import Settings
from jobs.tasks import execute
from tests.jobs.conftest import recipe


class _FakeCelery:
    def send_task(self, name, args):
        class R:
            id = "msg"

        return R()


@pytest.fixture()
def service(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}", broker_url="memory://")
    return JobService(settings, celery_app=_FakeCelery())


@pytest.fixture()
def rows_seen(monkeypatch):
    """(stage reported, done, total, the row's stage and progress right after) for every progress call."""
    seen = []
    real = jobs.tasks._progress_callback

    def recording(sf, job_id, *args, **kwargs):
        progress = real(sf, job_id, *args, **kwargs)

        def call(stage, done, total):
            progress(stage, done, total)
            with sf() as s:
                job = s.get(Job, job_id)
                seen.append((stage, done, total, job.stage, job.progress))

        return call

    monkeypatch.setattr(jobs.tasks, "_progress_callback", recording)
    return seen


def _overall(rows_seen, stage, done, total) -> float:
    """The figure the row should show after this call: the stage's place in the job, never below an
    earlier one (the slow, obvious version of ``jobs.progress.Overall``)."""
    from jobs.progress import LAST_BEFORE_SUCCESS, STAGE_SHARES

    names = [name for name, _ in STAGE_SHARES]
    start = sum(share for name, share in STAGE_SHARES[: names.index(stage)])
    here = min(start + dict(STAGE_SHARES)[stage] * done / total, LAST_BEFORE_SUCCESS)
    earlier = [row for row in rows_seen[: [r[:3] for r in rows_seen].index((stage, done, total))]]
    return max([here] + [row[4] for row in earlier])


def test_progress_only_moves_forward_over_a_sweep(service, job_models, rows_seen):
    """Every progress call of every job of a sweep (a streamed and an in-memory job, each with an
    evaluation): the row's figure never decreases, and is 1 only once the job succeeded."""
    evaluation = [{"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}]
    _, ids = service.submit_sweep(recipe(job_models), ratios=[0.2, 0.4], evaluations=evaluation)
    in_memory = service.submit(recipe(job_models, criterion={"name": "taylor"}), evaluations=evaluation)
    for job in [*ids, in_memory]:
        rows_seen.clear()
        assert execute(job, service.settings) == "SUCCEEDED"
        figures = [row_progress for *_, row_progress in rows_seen]
        assert figures == sorted(figures), (job, [(r[0], r[1], r[2], r[4]) for r in rows_seen])
        assert figures[-1] < 1 and service.show(job)["progress"] == 1.0
        stages = [r[3] for r in rows_seen]
        assert "reconstruct" in stages and "evaluate" in stages  # each stage's name stays on the row
    assert "speed" in stages  # the in-memory job times the dense model: a stage that comes back later


def test_evaluate_and_export_are_stages_of_their_own(service, job_models, rows_seen):
    evaluation = [{"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}]
    job = service.submit(recipe(job_models), evaluations=evaluation)
    assert execute(job, service.settings) == "SUCCEEDED"
    shown = [(row_stage, row_progress) for _, _, _, row_stage, row_progress in rows_seen]
    assert "done" not in [stage for stage, _ in shown]  # the engine's end marker is no stage of the job
    assert {"evaluate", "export"} <= {stage for stage, _ in shown}
    # a call that starts or ends a stage shows it on the row at once, with the job's overall progress
    previous = None
    for stage, done, total, row_stage, row_progress in rows_seen:
        if stage != "done" and (stage != previous or done == total):
            assert row_stage == stage and row_progress == pytest.approx(_overall(rows_seen, stage, done, total))
        previous = stage
    figures = [row_progress for *_, row_progress in rows_seen]
    assert figures == sorted(figures) and figures[-1] < 1  # forward only; 1 is the success
    evaluate = [(done, total) for stage, done, total, *_ in rows_seen if stage == "evaluate"]
    assert evaluate == [(0, 2), (1, 2), (2, 2)]  # the pruned model, then the dense one
    info = service.show(job)
    assert info["stage"] == "done" and info["progress"] == 1.0
    assert info["metrics"][DENSE] > 1
    assert any(line["message"].startswith("dense model perplexity") for line in info["log"])


def test_the_dense_baseline_is_measured_once_per_model_and_text(service, job_models, rows_seen):
    evaluation = [{"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}]
    first = service.submit(recipe(job_models), evaluations=evaluation)
    execute(first, service.settings)
    rows_seen.clear()
    second = service.submit(recipe(job_models, ratio=0.5), evaluations=evaluation)
    assert execute(second, service.settings) == "SUCCEEDED"
    assert [(d, t) for stage, d, t, *_ in rows_seen if stage == "evaluate"] == [(0, 1), (1, 1)]  # copied
    a, b = service.show(first), service.show(second)
    assert b["metrics"][DENSE] == a["metrics"][DENSE] and b["metrics"]["perplexity"] != a["metrics"]["perplexity"]
    assert any(line["message"].endswith(f"(from job {first})") for line in b["log"])
    # other windows: measured again
    longer = service.submit(recipe(job_models), evaluations=[{**evaluation[0], "seq_len": 64}])
    execute(longer, service.settings)
    assert any(line["message"].endswith("(measured)") for line in service.show(longer)["log"])


def test_a_pending_cancel_shows(service, job_models):
    job = service.submit(recipe(job_models))
    assert service.list()[0]["cancel_requested"] is False
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status=Status.RUNNING.value))
    assert service.cancel(job) == "RUNNING"
    row = service.list()[0]
    assert row["status"] == "RUNNING" and row["cancel_requested"] is True
    assert service.show(job)["cancel_requested"] is True


@pytest.mark.parametrize("execution", ["stream", "memory"])
def test_lm_eval_tasks_as_a_job_evaluation(service, job_models, tmp_path, execution):
    """A job runs lm-eval tasks on its pruned model — block by block after a streamed run, in memory
    otherwise — and records each task's metrics and their mean accuracy, the same numbers as an
    evaluation of the checkpoint it saved."""
    from core.evaluation.lmeval import evaluate_lm_eval, write_rt_sentiment_task
    from core.evaluation.tasks import TASKS_ACC_MEAN
    from core.models.tiny import tiny_corpus

    reviews = [{"text": t, "label": i % 2} for i, t in enumerate(tiny_corpus(6))]
    write_rt_sentiment_task(tmp_path / "tasks", reviews)
    evaluation = [{"type": "lm_eval", "tasks": "rt_sentiment", "task_dir": str(tmp_path / "tasks"), "limit": 5}]
    job = service.submit(recipe(job_models, execution=execution), evaluations=evaluation)
    assert service.show(job)["evaluations"][0]["tasks"] == ["rt_sentiment"]  # stored as a list
    assert execute(job, service.settings) == "SUCCEEDED"
    metrics = service.show(job)["metrics"]
    checkpoint = service.artifact(job)
    expected = evaluate_lm_eval(str(checkpoint), None, "rt_sentiment", task_dir=tmp_path / "tasks", limit=5)
    acc = expected["summary"]["rt_sentiment"]["acc"]
    assert metrics["rt_sentiment.acc"] == pytest.approx(acc) and metrics[TASKS_ACC_MEAN] == pytest.approx(acc)
    assert "rt_sentiment.acc_stderr" in metrics and DENSE not in metrics  # no perplexity asked for


def test_lm_eval_evaluations_are_checked_at_submission(service, job_models, tmp_path):
    calib = str(job_models["calib"])
    for ev, message in (
        ({"type": "lm_eval", "tasks": "no_such_task_here"}, "invalid evaluation: unknown task 'no_such_task_here'"),
        ({"type": "lm_eval", "tasks": " , "}, "invalid evaluation: tasks: List should have at least 1 item"),
        ({"type": "lm_eval", "tasks": "piqa", "limit": 0}, "limit: Input should be greater than 0"),
        ({"type": "lm_eval", "tasks": "piqa", "task_dir": str(tmp_path / "none")}, "task directory .* does not exist"),
        ({"type": "lm_eval", "tasks": "piqa", "dataset": calib}, "dataset: unknown key"),
    ):
        with pytest.raises(SubmitError, match=message):
            service.submit(recipe(job_models), evaluations=[ev])
    assert service.list() == []
