"""Queues by memory (jobs.routing): the routing table at submission, with queue sizes set from the tiny
models' own estimates (so the test follows the estimator), and two real workers each serving one queue
on PostgreSQL + Redis."""

from __future__ import annotations

import dataclasses

import pytest

from core.pipeline.estimate import estimate
from jobs.db import Job
from jobs.routing import queue_worker, route
from jobs.service import JobService
from jobs.settings import Queue, Settings, parse_queues
from jobs.submission import SubmitError
from tests.jobs.conftest import recipe, wait_for
from tests.jobs.test_faults import faults  # noqa: F401  (the fixture: PostgreSQL, a private Redis)


class _QueueCelery:
    """Records each message and the queue it was sent to."""

    def __init__(self):
        self.sent: list[tuple[list, str | None]] = []

    def send_task(self, name, args, queue=None):
        self.sent.append((args, queue))
        return type("R", (), {"id": f"msg-{len(self.sent)}"})()


def _peak(r: dict) -> int:
    return estimate(r, queue_worker(Queue("probe", "cpu"))).peak_bytes


@pytest.fixture(scope="module")
def sized(job_models):
    """Two recipes whose estimates differ (more calibration tokens: a larger peak, by a few MiB on the
    tiny model) and queue settings between them: ``small`` holds the first only, ``big`` both; the
    settings string and the two recipes."""
    small_job = recipe(job_models, "quick")
    calibration = dict(small_job["calibration"], num_calibration_samples=64, max_seq_length=64)
    big_job = recipe(job_models, "quick", calibration=calibration)
    low, high = _peak(small_job), _peak(big_job)
    assert low < high
    setting = f"small:cpu:{(low + high) / 2e9}, big:cpu:{(high + 10**6) / 1e9}"
    return setting, small_job, big_job


def _service(tmp_path, queues: str = "") -> JobService:
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        broker_url="memory://",
        queues=parse_queues(queues),
    )
    return JobService(settings, celery_app=_QueueCelery())


def test_the_smallest_queue_that_fits_takes_the_job(tmp_path, sized):
    setting, small_job, big_job = sized
    service = _service(tmp_path, setting)
    a, b = service.submit(small_job), service.submit(big_job)
    assert [q for _, q in service.celery.sent] == ["small", "big"]
    assert service.show(a)["queue"] == "small" and service.show(b)["queue"] == "big"
    assert "queue big: peak ≈" in service.show(b)["log"][0]["message"]
    service.rerun(b, confine=False)  # a re-run is routed as its job was; a message sent again goes to the job's queue
    service._send(a)
    assert [q for _, q in service.celery.sent[-2:]] == ["big", "small"]


def test_a_job_no_queue_fits_is_refused_in_one_sentence(tmp_path, sized, job_models):
    setting, small_job, _ = sized
    service = _service(tmp_path, setting.partition(",")[0])  # the small queue alone
    deeper = recipe(job_models, "slow")
    with pytest.raises(SubmitError) as err:
        service.submit(deeper)
    message = str(err.value)
    assert message.startswith("no queue has the memory for this job: it needs about ")
    assert "the largest queue, small, has" in message and "\n" not in message
    with service.sessions() as s:
        assert s.query(Job).count() == 0
    assert service.celery.sent == []


def test_an_uncached_hub_model_goes_to_the_largest_queue(sized):
    setting, small_job, _ = sized
    hub = dict(small_job, model="someone/not-cached-anywhere")
    queue, said = route(parse_queues(setting), hub)
    assert queue == "big"
    assert said.startswith("queue big, the largest: cannot estimate:") and "the worker checks again" in said


def test_without_queues_nothing_is_routed(tmp_path, sized):
    _, small_job, _ = sized
    service = _service(tmp_path)
    job = service.submit(small_job)
    assert service.celery.sent == [([job], None)]  # Celery's default queue, as before
    info = service.show(job)
    assert info["queue"] is None and info["log"][0]["message"] == "submitted by anonymous"


@pytest.mark.parametrize(
    "value, problem",
    [
        ("gpu:a100-40gb:40", "the class is one of"),
        ("a:cpu:0", "positive number of GB"),
        ("a:cpu, a:cpu", "twice"),
        ("just-a-name", r"is not name:class\[:GB\]"),
    ],
)
def test_queue_settings_are_checked(value, problem):
    with pytest.raises(ValueError, match=problem):
        parse_queues(value)


def test_worker_queues_must_be_declared(monkeypatch):
    from jobs.worker import worker_queues

    settings = Settings(data_dir=None, database_url="", broker_url="", queues=parse_queues("a:cpu:1,b:cpu:2"))
    monkeypatch.delenv("LIAR_WORKER_QUEUES", raising=False)
    assert worker_queues("a, b", settings) == ["a", "b"]
    assert worker_queues(None, dataclasses.replace(settings, queues=())) == ["liar"]
    with pytest.raises(ValueError, match="no queue c in LIAR_QUEUES"):
        worker_queues("c", settings)


@pytest.mark.integration
def test_two_workers_each_run_the_jobs_of_their_queue(faults, sized):  # noqa: F811
    """Real workers on PostgreSQL + Redis, one per queue (CPU workers standing in for GPU kinds): each
    job is taken by the worker of the queue its estimate chose, and by no other."""
    setting, small_job, big_job = sized
    faults.env["LIAR_LEASE_SECONDS"] = "20"  # two workers on two busy cores: no false "lost worker"
    env = {"LIAR_QUEUES": setting, "LIAR_WORKER_MAX_TASKS_PER_CHILD": "10"}
    service = JobService(dataclasses.replace(faults.settings(), queues=parse_queues(setting)))
    workers = {q: faults.start_worker(LIAR_WORKER_QUEUES=q, **env) for q in ("small", "big")}
    jobs = {service.submit(r): q for r, q in ((small_job, "small"), (big_job, "big"), (small_job, "small"))}
    wait_for(lambda: all(service.show(j)["status"] == "SUCCEEDED" for j in jobs), timeout=240, what="the jobs")
    logs = {q: (faults.data_dir / f"worker-{i}.log").read_text() for i, q in enumerate(workers)}
    for job, queue in jobs.items():
        with service.sessions() as s:
            task = s.get(Job, job).celery_id
        assert service.show(job)["queue"] == queue
        assert [q for q, log in logs.items() if f"[{task}] received" in log] == [queue], job


def test_a_checkpoint_pruned_again_goes_where_its_job_ran(tmp_path, sized):
    """``model: job:N`` names a checkpoint no estimate reads; pruning it again needs less than the job
    that made it, so it goes to that job's queue while the queue still exists."""
    from jobs.references import queue_of

    setting, small_job, _ = sized
    queues = parse_queues(setting)
    again = dict(small_job, model="job:1")
    assert route(queues, again, "small") == ("small", "queue small, where the job whose checkpoint it prunes ran")
    assert route(queues, dict(small_job), "gone")[0] == "small"  # a queue since removed: routed afresh
    service = _service(tmp_path, setting)
    job = service.submit(small_job)
    assert queue_of(service.sessions, f"job:{job}") == "small"
    assert queue_of(service.sessions, "job:99") is None and queue_of(service.sessions, small_job["model"]) is None
