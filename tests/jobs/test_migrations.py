"""Schema upgrades run exactly once, however many processes start together on an empty database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.conftest import _pg_available, postgres_database

ROOT = Path(__file__).resolve().parents[2]
# Each child connects (which migrates), then counts the rows of a table the migration created.
CHILD = (
    "import sys; from sqlalchemy import select, func; from jobs.db import connect, Job; "
    "sf = connect(sys.argv[1]); s = sf(); print(s.scalar(select(func.count()).select_from(Job))); s.close()"
)


def _start_together(url: str, n: int = 8) -> list[subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env["PYTHONPATH"] = str(ROOT)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def _assert_all_succeeded(results) -> None:
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == "0"


def test_eight_processes_on_an_empty_sqlite_file(tmp_path):
    _assert_all_succeeded(_start_together(f"sqlite:///{tmp_path / 'fresh.db'}"))


@pytest.mark.integration
def test_eight_processes_on_an_empty_postgres_database():
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    with postgres_database("liar_migrate") as url:
        _assert_all_succeeded(_start_together(url))


def test_schema_older_or_newer_than_the_code_is_one_sentence(tmp_path, monkeypatch):
    import sqlalchemy as sa

    from jobs.db import SchemaError, dispose_all, upgrade

    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(SchemaError, match="older than this code's .*run `liar db upgrade`"):
        upgrade(url, auto=False)
    head = upgrade(url)
    assert upgrade(url, auto=False) == head  # at head: nothing to do, even without auto-migration
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
    engine.dispose()
    with pytest.raises(SchemaError, match="revision ffffffffffff, newer than this code knows"):
        upgrade(url)
    dispose_all()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def empty_database(request, tmp_path):
    """The URL of an empty database of each kind (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    with postgres_database("liar_old") as url:
        yield url


def test_upgrade_keeps_a_finished_job_and_its_archive(empty_database, tmp_path):
    """A job finished under revision 0001 (a checkpoint folder and a .tar.gz) still shows and downloads
    after the upgrades that bring per-file artifacts, BIGINT sizes, stage timings and the recipe as run."""
    import sqlalchemy as sa
    from alembic import command

    from jobs.db import Artifact, _alembic_config, upgrade
    from jobs.service import JobService
    from jobs.settings import Settings
    from tests.jobs.test_service import _FakeCelery

    url = empty_database
    command.upgrade(_alembic_config(url), "0001")
    folder = tmp_path / "artifacts" / "job-1"
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "liar-job-1.tar.gz").write_bytes(b"old archive")
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO jobs (id, recipe, evaluations, status, stage, progress, created_at, attempts, "
                "cancel_requested) VALUES (1, :recipe, '[]', 'SUCCEEDED', 'done', 1.0, :now, 1, false)"
            ),
            {"recipe": '{"model": "m", "ratio": 0.3}', "now": "2026-11-01 10:00:00"},
        )
        c.execute(
            sa.text("INSERT INTO artifacts (job_id, kind, path, size, sha256) VALUES (1, :k, :p, :s, :h)"),
            [
                {"k": "checkpoint", "p": str(folder / "checkpoint"), "s": 0, "h": None},
                {"k": "archive", "p": str(folder / "liar-job-1.tar.gz"), "s": 11, "h": "ab" * 32},
            ],
        )
    engine.dispose()
    assert upgrade(url) == "0008"

    service = JobService(Settings(data_dir=tmp_path, database_url=url, broker_url="memory://"), _FakeCelery())
    info = service.show(1)
    assert [(a["kind"], a["name"]) for a in info["artifacts"]] == [("checkpoint", None), ("archive", None)]
    assert info["timings"] is None and info["status"] == "SUCCEEDED"
    assert info["source_job"] is None  # a pruning job, not a re-evaluation (revision 0004)
    assert info["queue"] is None  # queued before routing: the default queue (revision 0005)
    assert info["recipe_as_run"] is None and info["ratio"] == 0.3  # ran before it was recorded: as submitted
    assert service.downloads(1) == [{"name": "liar-job-1.tar.gz", "size": 11, "sha256": "ab" * 32, "kind": "archive"}]
    served = service.file(1, "liar-job-1.tar.gz")
    assert served.key == "artifacts/job-1/liar-job-1.tar.gz"  # a key in the store (revision 0006)
    assert service.local_path(served).read_bytes() == b"old archive"
    with service.sessions.begin() as s:  # a 70B checkpoint's size does not fit a 32-bit INTEGER
        s.add(Artifact(job_id=1, kind="file", name="big.safetensors", path=str(folder / "x"), size=140 * 10**9))
    with service.sessions() as s:
        assert s.query(Artifact).filter_by(name="big.safetensors").one().size == 140 * 10**9
