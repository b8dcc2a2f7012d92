"""Is the deployment up? The checks behind ``liar health``, the app's ``GET /healthz`` and the
Workers tab: the database answers a query, the broker takes a connection, the store lists its root,
a worker answers.

Each check gives a :class:`Check` whose ``detail`` is one sentence fit for a terminal or a log: the
URLs' passwords are masked (``jobs.settings.scrub``) and no traceback is kept. Every check is bounded
(a few seconds at most), so a container's healthcheck or a refresh timer never hangs on a dead server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.settings import Settings, redact_url, scrub

CONNECT_SECONDS = 3  # how long the database and broker checks wait for a connection


class BrokerDown(Exception):
    """The broker refused or did not answer; the message is one sentence without a password."""


@dataclass(frozen=True)
class Check:
    name: str  # "database", "broker", "store", "workers"
    ok: bool
    detail: str  # one sentence, passwords masked

    def line(self) -> str:
        return f"{self.name:<9} {'ok' if self.ok else 'FAIL'}  {self.detail}"


def _reason(exc: BaseException, *urls: str) -> str:
    """An exception as one line without passwords (driver messages may quote the URL)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return scrub(text, *urls)


def check_database(settings: Settings) -> Check:
    """A query on the jobs table: the server answers and the schema is there."""
    import sqlalchemy as sa

    url = settings.database_url
    options: dict[str, Any] = {}
    if url.startswith("postgresql"):
        options["connect_args"] = {"connect_timeout": CONNECT_SECONDS}
    elif url.startswith("sqlite"):
        options["connect_args"] = {"timeout": CONNECT_SECONDS}
    where = redact_url(url).split("?")[0]
    try:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool, **options)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT count(*) FROM (SELECT 1 FROM jobs LIMIT 1) AS one"))
        finally:
            engine.dispose()
    except Exception as exc:
        reason = _reason(exc, url)
        if "jobs" in reason and ("no such table" in reason or "does not exist" in reason):
            reason = "reachable, but it has no jobs table: run `liar db upgrade`"
        return Check("database", False, f"{where}: {reason}")
    return Check("database", True, where)


def check_store(settings: Settings, timeout: float = CONNECT_SECONDS) -> Check:
    """The store (``jobs.store``) answers within ``timeout`` seconds: its folder exists, or its bucket
    lists with these credentials (a new deployment's prefix has no object yet)."""
    import concurrent.futures

    where = redact_url(settings.store_url or str(settings.data_dir))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        store = settings.store()
        top = store.root if store.local is not None else store.root.split("/")[0]
        pool.submit(lambda: store.fs.ls(top, detail=False, refresh=True)).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return Check("store", False, f"{where}: no answer within {timeout:g} s")
    except FileNotFoundError:
        return Check("store", False, f"{where}: there is no such folder or bucket")
    except Exception as exc:
        return Check("store", False, f"{where}: {_reason(exc, where)}")
    finally:
        pool.shutdown(wait=False)
    return Check("store", True, where)


def broker_connection(celery, timeout: float = CONNECT_SECONDS):
    """An open connection to ``celery``'s broker (the caller closes it); :class:`BrokerDown` when the
    broker refuses or does not answer within about ``timeout`` seconds (Celery would retry forever)."""
    url = celery.conf.broker_url or ""
    conn = celery.connection_for_write()
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
    except Exception as exc:
        conn.release()
        raise BrokerDown(f"the job broker at {redact_url(url)} is not reachable: {_reason(exc, url)}") from None
    return conn


def ask_workers(celery, command: str, timeout: float = 1.0) -> dict[str, Any]:
    """Every live worker's answer to the remote-control ``command``, by worker name (waits ``timeout``
    seconds for answers); :class:`BrokerDown` when the broker cannot be reached."""
    conn = broker_connection(celery)
    try:
        replies = celery.control.broadcast(command, reply=True, timeout=timeout, connection=conn) or []
    except Exception as exc:
        url = celery.conf.broker_url or ""
        raise BrokerDown(f"the job broker at {redact_url(url)} failed: {_reason(exc, url)}") from None
    finally:
        conn.release()
    return {name: answer for reply in replies for name, answer in reply.items()}


def check_broker(celery) -> Check:
    url = celery.conf.broker_url or ""
    try:
        broker_connection(celery).release()
    except BrokerDown as exc:
        return Check("broker", False, str(exc))
    return Check("broker", True, redact_url(url))


def check_workers(celery, timeout: float = 1.0) -> Check:
    """At least one worker answers a ping within ``timeout`` seconds."""
    try:
        names = sorted(ask_workers(celery, "ping", timeout))
    except BrokerDown as exc:
        return Check("workers", False, str(exc))
    if not names:
        return Check("workers", False, f"no worker answered within {timeout:g} s")
    return Check("workers", True, f"{len(names)} answered: {', '.join(names)}")
