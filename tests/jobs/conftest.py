"""Job-runner stacks for integration tests: the embedded default (SQLite + filesystem broker) and the
team setup (PostgreSQL + Redis, both running on development and CI machines), each with real worker
processes started from the `liar worker` command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.models.tiny import tiny_corpus, tiny_decoder

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS = "redis://127.0.0.1:6379"


@contextmanager
def postgres_database(prefix: str = "liar_test") -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database, dropped afterwards (with this process's pooled
    connections to it)."""
    import sqlalchemy as sa

    from jobs.db import dispose_all

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        dispose_all()
        with admin.connect() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _pg_available() -> bool:
    try:
        import sqlalchemy as sa

        with sa.create_engine(PG_ADMIN).connect() as c:
            c.execute(sa.text("select 1"))
        return True
    except Exception:
        return False


def _redis_available() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS).ping())
    except Exception:
        return False


@dataclass
class Stack:
    env: dict[str, str]
    data_dir: Path
    workers: list[subprocess.Popen] = field(default_factory=list)

    def settings(self):
        from jobs.settings import Settings

        return Settings(
            data_dir=self.data_dir,
            database_url=self.env["LIAR_DATABASE_URL"],
            broker_url=self.env["LIAR_BROKER_URL"],
            lease_seconds=float(self.env["LIAR_LEASE_SECONDS"]),
            max_attempts=2,
        )

    def service(self):
        from jobs.service import JobService

        return JobService(self.settings())

    def start_worker(self, **env: str) -> subprocess.Popen:
        """A ``liar worker`` with ``env`` added to the stack's (e.g. ``LIAR_STAGE_PAUSE``)."""
        log = open(self.data_dir / f"worker-{len(self.workers)}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--loglevel", "INFO"],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGKILL every worker's process group at once: a warm shutdown (SIGTERM) let an idle worker
        linger up to the 5 s it was given before the kill anyway, and nothing after a test reads what
        a worker does while it stops."""
        for proc in self.workers:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.workers:
            proc.wait(timeout=30)


def wait_for(predicate, timeout: float = 120.0, every: float = 0.3, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="session")
def job_models(tmp_path_factory):
    base = tmp_path_factory.mktemp("job_models")
    quick = tiny_decoder(base / "quick")
    # the quick model's shape with more layers: a job stopped a layer or two after its cancel has not
    # run to its end (the tests that stop a job pause each of its layers: LIAR_STAGE_PAUSE)
    deep = tiny_decoder(base / "deep", num_hidden_layers=8)
    # big enough that its estimated memory exceeds a small queue's (test_routing)
    slow = tiny_decoder(
        base / "slow",
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    calib = base / "calib.txt"
    calib.write_text("\n\n".join(tiny_corpus(80)))
    return {"quick": quick, "deep": deep, "slow": slow, "calib": calib}


def recipe(job_models, which="quick", **kw):
    samples = 64 if which == "slow" else 8
    r = {
        "model": str(job_models[which]),
        "ratio": 0.3,
        "calibration": {
            "dataset": str(job_models["calib"]),
            "num_calibration_samples": samples,
            "max_seq_length": 64 if which == "slow" else 32,
            "batch_size": 8,
        },
    }
    r.update(kw)
    return r


@pytest.fixture(params=["embedded", "postgres+redis"])
def stack(request, tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env.update(
        LIAR_DATA_DIR=str(data),
        LIAR_LEASE_SECONDS="3",
        LIAR_MAX_ATTEMPTS="2",
        LIAR_WORKER_MAX_TASKS_PER_CHILD="50",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    cleanup = []
    if request.param == "embedded":
        env.update(LIAR_DATABASE_URL=f"sqlite:///{data / 'liar.db'}", LIAR_BROKER_URL="filesystem://")
    else:
        if not (_pg_available() and _redis_available()):
            pytest.fail("PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 are required (.ci/run starts them)")
        import redis

        database = postgres_database()
        # one database per test process (`make test` runs several): a process runs one stack at a time
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        broker = f"{REDIS}/{1 + int(worker.removeprefix('gw')) % 15}"
        redis.Redis.from_url(broker).flushdb()
        env.update(LIAR_DATABASE_URL=database.__enter__(), LIAR_BROKER_URL=broker)

        def drop():
            database.__exit__(None, None, None)
            redis.Redis.from_url(broker).flushdb()

        cleanup.append(drop)
    s = Stack(env=env, data_dir=data)
    s.kind = request.param
    os.environ.update({k: v for k, v in env.items() if k.startswith("LIAR_")})
    yield s
    s.stop()
    for k in list(os.environ):
        if k.startswith("LIAR_"):
            del os.environ[k]
    for fn in cleanup:
        fn()
