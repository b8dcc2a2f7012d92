"""Schema upgrades run exactly once, however many processes start together on an empty database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.jobs.conftest import PG_ADMIN, _pg_available

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


def test_eight_processes_on_an_empty_postgres_database():
    if not _pg_available():
        pytest.fail("PostgreSQL on 127.0.0.1:5432 is required (.ci/run starts it)")
    import sqlalchemy as sa

    name = f"liar_migrate_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        _assert_all_succeeded(_start_together(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"))
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


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
