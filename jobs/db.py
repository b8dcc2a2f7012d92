"""The job database (SQLAlchemy 2, typed models). SQL is the source of truth for every job.

Migrations (Alembic, ``jobs/migrations``) are applied by :func:`connect` on start.
"""

from __future__ import annotations

import datetime as dt
import enum
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    event,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker
from sqlalchemy.sql.functions import FunctionElement


class Status(str, enum.Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # a tombstone: the job was deleted (its files are gone); its row keeps its id taken, who deleted
    # it and when, and its metrics (jobs.tombstones). No list, chart or action shows it as a job.
    DELETED = "DELETED"

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.DELETED)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class server_utcnow(FunctionElement):
    """Now, in UTC, naive, on the database server's clock: what leases are written and judged by
    (heartbeats, a worker's ``started_at`` and ``finished_at``, the reaper's cutoff), so that a host
    whose clock is off neither loses its lease early nor keeps a dead worker's job. Works in any
    statement (``values(heartbeat_at=server_utcnow())``); :func:`db_now` reads it."""

    type = DateTime()
    inherit_cache = True


@compiles(server_utcnow, "postgresql")
def _server_utcnow_postgresql(_element, _compiler, **_kw) -> str:
    # clock_timestamp(), not now(): now() is when the transaction began, and a write that waited for a
    # row lock (the reaper's, a slow cancel's) would record a heartbeat already older than when it
    # landed; the reaper's cutoff, too, must be the time it looks, not when its transaction began
    return "timezone('utc', clock_timestamp())"


@compiles(server_utcnow, "sqlite")
def _server_utcnow_sqlite(_element, _compiler, **_kw) -> str:
    # SQLAlchemy stores a DateTime in SQLite as text, "YYYY-MM-DD HH:MM:SS.ffffff": the same form here
    # (SQLite has milliseconds; "000" pads them to microseconds), so stored values and this one
    # compare as strings in time order and read back as datetimes. SQLite is embedded: its clock is
    # the host's, the one every process on the database file shares.
    return "strftime('%Y-%m-%d %H:%M:%f000', 'now')"


def db_now(session: Session) -> dt.datetime:
    """The database server's :class:`server_utcnow`, read in ``session``."""
    return session.scalar(select(server_utcnow()))


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    # SQLite: ids come from sqlite_sequence, never the largest one + 1, so an id once given is never
    # given again, whatever is deleted (revision 0007); PostgreSQL's sequence never goes back anyway
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    recipe: Mapped[dict[str, Any]] = mapped_column(JSON)  # as submitted
    # as it ran, once it has: ``auto`` criterion / allocation / select resolved (``Recipe.resolved``)
    recipe_as_run: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    evaluations: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default=Status.QUEUED.value, index=True)
    stage: Mapped[str | None] = mapped_column(String(32))
    layer: Mapped[int | None] = mapped_column(Integer)
    n_layers: Mapped[int | None] = mapped_column(Integer)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    worker: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # attempts that ended in a polite stop (SIGTERM: a checkpoint saved, the job handed back,
    # jobs.stopping); they do not count against LIAR_MAX_ATTEMPTS (revision 0008)
    stops: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    celery_id: Mapped[str | None] = mapped_column(String(64))
    submitted_by: Mapped[str | None] = mapped_column(String(255), index=True)
    group_id: Mapped[str | None] = mapped_column(String(64), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    report: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # wall time per stage (``jobs.timings.StageClock.snapshot``): {"stages": [...], "total": s}
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # positions in ``evaluations`` of those that failed in the run whose metrics the job records (None:
    # finished before revision 0004, or no evaluations); a re-evaluation rewrites them (jobs.reevaluation)
    failed_evaluations: Mapped[list[int] | None] = mapped_column(JSON)
    # a re-evaluation: the job whose checkpoint it evaluates, and the positions in that job's
    # ``evaluations`` of its own evaluations (jobs.reevaluation); None for a pruning job
    source_job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    source_evaluations: Mapped[list[int] | None] = mapped_column(JSON)
    # the worker queue the job was routed to (jobs.routing); None: the one default queue
    queue: Mapped[str | None] = mapped_column(String(64))
    # when the attempt's progress last moved (its claim, then each new stage or step): what the
    # watchdog judges a hung job by, the heartbeat being a thread of its own (jobs.watchdog)
    progress_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    # a tombstone's (status DELETED): when, and by whom (None: the operator, or a server without login)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime)
    deleted_by: Mapped[str | None] = mapped_column(String(255))

    metrics: Mapped[list[Metric]] = relationship(back_populates="job", cascade="all, delete-orphan")
    artifacts: Mapped[list[Artifact]] = relationship(back_populates="job", cascade="all, delete-orphan")
    logs: Mapped[list[JobLog]] = relationship(back_populates="job", cascade="all, delete-orphan", order_by="JobLog.id")


class Metric(Base):
    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    job: Mapped[Job] = relationship(back_populates="metrics")


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # "checkpoint" (the directory) | "file" (one file of it, named as in its SHA256SUMS) | "archive" (a
    # .tar.gz, written by jobs before revision 0002: still listed and downloadable)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)  # a file's path inside the checkpoint, "/"-separated
    size: Mapped[int] = mapped_column(BigInteger)  # checkpoints and shards pass 2 GiB
    sha256: Mapped[str | None] = mapped_column(String(64))
    job: Mapped[Job] = relationship(back_populates="artifacts")


class JobLog(Base):
    __tablename__ = "job_logs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    level: Mapped[str] = mapped_column(String(16), default="INFO")
    message: Mapped[str] = mapped_column(Text)
    job: Mapped[Job] = relationship(back_populates="logs")


MIGRATIONS = Path(__file__).with_name("migrations")
_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_owner_pid: dict[str, int] = {}


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


# A process stopped (SIGSTOP, a frozen VM) inside one of its short transactions would hold the job's row
# lock for as long as its connection lives, and the reaper skips locked rows: PostgreSQL ends such a
# session after this long (none of this code leaves a transaction idle: every one is a few statements),
# so the job is reaped within this plus one lease. The stopped process, resumed, finds its connection
# gone and, through jobs.fencing, that it no longer owns the job.
IDLE_IN_TRANSACTION_MS = 60_000

MIGRATION_LOCK_KEY = 0x4C494152  # "LIAR": the PostgreSQL advisory lock that serialises schema upgrades


class SchemaError(RuntimeError):
    """The database's schema does not match this code, in one sentence."""


def _alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@contextmanager
def _migration_lock(url: str, engine: Engine) -> Iterator[None]:
    """One schema upgrade at a time across processes: a PostgreSQL advisory lock (held on its own
    connection for the duration), or an exclusive file lock beside a SQLite database."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            # this connection only holds the lock while others migrate: idle in its transaction on purpose
            conn.execute(text("SET idle_in_transaction_session_timeout = 0"))
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
                conn.execute(text("RESET idle_in_transaction_session_timeout"))  # back to the pool as it came
                conn.commit()
    elif engine.dialect.name == "sqlite" and url.startswith("sqlite:///"):
        import fcntl

        lock_path = Path(url[len("sqlite:///") :] + ".migrate-lock")
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    else:
        yield


def _current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str, engine: Engine | None = None, auto: bool = True) -> str:
    """Apply every Alembic migration up to head, one process at a time, and return the revision; a
    database whose schema is newer than this code (a revision it does not know) is refused with
    :class:`SchemaError`, and so is an older one when ``auto`` is off (``LIAR_AUTO_MIGRATE=0``: a
    deployment that migrates once, with ``liar db upgrade``, before starting the app and workers)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    cfg = _alembic_config(url)
    own = engine is None
    engine = engine or create_engine(url, future=True)
    try:
        with _migration_lock(url, engine):
            script = ScriptDirectory.from_config(cfg)
            current, head = _current_revision(engine), script.get_current_head()
            if current is not None and current != head and current not in {r.revision for r in script.walk_revisions()}:
                raise SchemaError(
                    f"the database schema is at revision {current}, newer than this code knows (its latest is "
                    f"{head}): upgrade liar-prune on this machine"
                )
            if current != head and not auto:
                raise SchemaError(
                    f"the database schema is at revision {current or 'none (empty)'}, older than this code's "
                    f"{head}: run `liar db upgrade` first (or unset LIAR_AUTO_MIGRATE=0)"
                )
            if current != head:
                command.upgrade(cfg, "head")
            return head
    finally:
        if own:
            engine.dispose()


def connect(url: str) -> sessionmaker:
    """A session factory for ``url``, with the schema migrated to the latest revision (once per process)."""
    with _lock:
        if url not in _engines:
            if url.startswith("sqlite:///"):
                Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
            options = {}
            if url.startswith("postgresql"):  # see IDLE_IN_TRANSACTION_MS
                idle = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
                options["connect_args"] = {"options": idle}
            engine = create_engine(url, pool_pre_ping=True, future=True, **options)
            if engine.dialect.name == "sqlite":
                event.listen(engine, "connect", _sqlite_pragmas)
            upgrade(url, engine, auto=os.environ.get("LIAR_AUTO_MIGRATE", "1") != "0")
            _engines[url], _owner_pid[url] = engine, os.getpid()
        elif _owner_pid[url] != os.getpid():
            # a forked worker child must not share its parent's pooled connections
            _engines[url].dispose(close=False)
            _owner_pid[url] = os.getpid()
        return sessionmaker(_engines[url], expire_on_commit=False)


T = TypeVar("T")


def retry_on_disconnect(work: Callable[[], T]) -> T:
    """``work()``, which runs its own transaction, run once more if the database dropped the connection
    under it (a restart, a failover, ``pg_terminate_backend``): the second try gets a fresh connection
    from the pool. For a worker's bookkeeping, which must not fail a long job over one lost
    connection; ``work`` must be safe to repeat after its transaction was rolled back."""
    try:
        return work()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    return work()


def dispose_all() -> None:
    """Drop pooled connections (after fork, or in tests)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _owner_pid.clear()
