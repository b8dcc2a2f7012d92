"""A server keeps its records: a job id is never given twice (SQLite and PostgreSQL, and databases made
before revision 0007), and a deleted job leaves a tombstone that every route names."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

from jobs.db import Job, Metric, Status
from jobs.service import JobService, QueueError
from jobs.settings import Settings
from jobs.tombstones import JobDeleted
from tests.jobs.conftest import _pg_available, postgres_database, recipe
from tests.jobs.test_service import _FakeCelery

INTERLEAVINGS = 50


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    with postgres_database("liar_records") as url:
        yield url


def _service(tmp_path, url: str, celery=None) -> JobService:
    settings = Settings(data_dir=tmp_path, database_url=url, broker_url="memory://", lease_seconds=60)
    return JobService(settings, celery_app=celery or _FakeCelery())


class _Down(_FakeCelery):
    def send_task(self, name, args):
        raise ConnectionError("broker down")


def test_no_id_is_given_twice_whatever_is_deleted(database_url, tmp_path, job_models):
    """50 seeded random interleavings of submit, delete (the newest job most often: the one SQLite
    used to hand out again), re-run and a submission the broker refuses (its row is removed):
    every id the service returns is new, and a deleted job's id keeps naming its tombstone."""
    service = _service(tmp_path, database_url)
    refused = _service(tmp_path, database_url, _Down())
    rng = random.Random(58)
    given: list[int] = []
    live: list[int] = []
    deleted: set[int] = set()

    def new(job_id: int) -> None:
        assert job_id not in given, f"job id {job_id} given twice"
        given.append(job_id)
        live.append(job_id)

    for _ in range(INTERLEAVINGS):
        for op in rng.choices(["submit", "delete", "rerun", "refused"], weights=[3, 3, 2, 1], k=4):
            if op == "submit" or not live:
                new(service.submit(recipe(job_models), submitted_by="alice"))
            elif op == "delete":
                victim = live[-1] if rng.random() < 0.7 else rng.choice(live)
                service.cancel(victim)  # a queued job is cancelled at once, then it may go
                service.delete(victim)
                live.remove(victim)
                deleted.add(victim)
            elif op == "rerun":
                new(service.rerun(rng.choice(live), confine=False))
            else:
                with pytest.raises(QueueError):
                    refused.submit(recipe(job_models))
    assert deleted and len(given) == len(set(given))
    victim = max(deleted)
    with pytest.raises(JobDeleted, match=f"job {victim} was deleted on "):
        service.rerun(victim, confine=False)
    listed = {j["id"] for j in service.list(limit=1000)}
    assert listed == set(live) and not listed & deleted  # tombstones are no jobs of any list
    assert {j["id"] for j in service.list(limit=1000, deleted=True)} == deleted


def test_a_deleted_job_is_a_tombstone_that_every_route_names(tmp_path, job_models):
    from jobs.access import Actor
    from jobs.submission import SubmitError
    from jobs.tasks import execute

    service = _service(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}")
    done = service.submit(recipe(job_models), submitted_by="alice")
    assert execute(done, service.settings) == "SUCCEEDED"
    folder = service.artifact(done)
    metrics = service.show(done)["metrics"]
    gone = [f["name"] for f in service.deletion(done, Actor("carol", admin=True))]
    assert "config.json" in gone and folder.is_dir()  # what a page names before it asks

    service.delete(done, Actor("carol", admin=True))
    assert not folder.exists()
    sentence = rf"job {done} was deleted by carol on \d{{4}}-\d\d-\d\d \d\d:\d\d UTC"
    carol = Actor("carol", admin=True)
    for action in (
        lambda: service.show(done),
        lambda: service.owner(done),
        lambda: service.downloads(done),
        lambda: service.file(done, "config.json"),
        lambda: service.cancel(done, carol),
        lambda: service.rerun(done, carol, confine=False),
        lambda: service.reevaluate(done, carol, confine=False),
        lambda: service.delete(done, carol),
        lambda: service.deletion(done, carol),
    ):
        with pytest.raises(JobDeleted, match=f"^{sentence}$"):
            action()
    with pytest.raises(SubmitError, match=f"model job:{done}: {sentence}"):
        service.submit(recipe(job_models, model=f"job:{done}", ratio=0.2))

    tomb = service.show(done, internal=True)  # the operator's view keeps the record
    assert tomb["status"] == "DELETED" and tomb["deleted_by"] == "carol" and tomb["artifacts"] == []
    assert tomb["metrics"] == metrics and tomb["log"][-1]["message"].startswith("deleted by carol on ")
    assert done not in {j["id"] for j in service.list()}
    assert service.list(status="DELETED") == []  # a status filter does not bring them back either


def test_a_checkpoint_another_job_still_reads_is_not_deleted(tmp_path, job_models):
    """An export-only job (``model: job:N``), queued or running, holds its source: deleting the source
    is refused in one sentence until it has finished (the page's question first, then the delete)."""
    from core.models.tiny import tiny_decoder
    from jobs import export_jobs
    from jobs.access import NotNow
    from jobs.tasks import execute

    bpe = tiny_decoder(tmp_path / "models" / "bpe", tokenizer="bpe")  # a GGUF holds a byte-level BPE tokenizer
    service = _service(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}")
    done = service.submit(recipe(job_models, model=str(bpe)), submitted_by="alice")
    assert execute(done, service.settings) == "SUCCEEDED"
    export = export_jobs.submit(service, done, ["gguf-f16"])
    for action in (service.delete, service.deletion):
        with pytest.raises(NotNow, match=rf"^job {export} reads job {done}'s checkpoint \(model: job:{done}\) and "):
            action(done)
    assert execute(export, service.settings) == "SUCCEEDED"
    service.delete(done)  # both finished: the source goes
    assert service.show(done, internal=True)["status"] == "DELETED"


def _at_0006(url: str) -> None:
    """A database at revision 0006 with jobs 1–3 (job 3 deleted the old way: its row gone), job 4's
    re-evaluation of job 5 (deleted too) and job 2 naming ``model: job:6``, each with rows beside it."""
    from alembic import command

    from jobs.db import _alembic_config

    command.upgrade(_alembic_config(url), "0006")
    engine = sa.create_engine(url)
    insert = sa.text(
        "INSERT INTO jobs (id, recipe, evaluations, status, stage, progress, created_at, attempts, cancel_requested, "
        "submitted_by, source_job_id, queue) VALUES (:id, :recipe, '[]', 'SUCCEEDED', 'done', 1.0, "
        "'2026-11-01 10:00:00', 1, false, :by, :source, :queue)"
    )
    with engine.begin() as c:
        c.execute(
            insert,
            [
                {"id": 1, "recipe": '{"model": "m", "ratio": 0.3}', "by": "alice", "source": None, "queue": "a100"},
                {"id": 2, "recipe": '{"model": "job:6", "ratio": 0.2}', "by": "bob", "source": None, "queue": None},
                {"id": 4, "recipe": '{"model": "m", "ratio": 0.3}', "by": "bob", "source": 5, "queue": None},
            ],
        )
        c.execute(sa.text("INSERT INTO metrics (job_id, name, value) VALUES (1, 'perplexity', 12.5), (4, 'x', 1)"))
        c.execute(sa.text("INSERT INTO job_logs (job_id, at, level, message) VALUES (1, '2026-11-01', 'INFO', 'hi')"))
        artifact = "INSERT INTO artifacts (job_id, kind, path, name, size) "
        artifact += "VALUES (1, 'file', 'artifacts/job-1/a', 'a', 3)"
        c.execute(sa.text(artifact))
    engine.dispose()


def test_revision_0007_keeps_every_row_and_never_gives_an_old_id_again(database_url, tmp_path, job_models):
    from jobs.db import upgrade

    _at_0006(database_url)
    engine = sa.create_engine(database_url)
    before = {t: _rows(engine, t) for t in ("jobs", "metrics", "job_logs", "artifacts")}
    indexes = {i["name"] for i in sa.inspect(engine).get_indexes("jobs")}
    engine.dispose()
    assert upgrade(database_url) == "0008"  # the head: 0007, then 0008 (a column at the end)

    engine = sa.create_engine(database_url)
    inspector = sa.inspect(engine)
    assert {i["name"] for i in inspector.get_indexes("jobs")} == indexes
    for table in ("metrics", "job_logs", "artifacts"):
        assert _rows(engine, table) == before[table]
        (fk,) = inspector.get_foreign_keys(table)
        assert fk["referred_table"] == "jobs" and fk["options"].get("ondelete") == "CASCADE"
    after = _rows(engine, "jobs")
    assert [r[: len(before["jobs"][0])] for r in after] == before["jobs"]  # the new columns come last, empty
    if engine.dialect.name == "sqlite":
        with engine.connect() as c:
            assert "AUTOINCREMENT" in c.scalar(sa.text("SELECT sql FROM sqlite_master WHERE name = 'jobs'"))
    engine.dispose()

    service = _service(tmp_path, database_url)
    new = service.submit(recipe(job_models))
    assert new == 7  # past job 6, which job 2 still names (and 5, which job 4 does)
    service.delete(1)
    assert service.submit(recipe(job_models)) == 8
    with service.sessions() as s:  # the tombstone keeps its metrics
        assert s.scalar(sa.select(Metric.value).where(Metric.job_id == 1)) == 12.5
        assert s.get(Job, 1).status == Status.DELETED.value


def _rows(engine, table: str) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(sa.text(f"SELECT * FROM {table} ORDER BY id"))]
