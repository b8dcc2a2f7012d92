"""Fencing: a job's results are written only by the attempt that owns the job.

A worker that claims a job (:func:`claim`: the atomic QUEUED → RUNNING update that counts the
attempt) gets a token, the job's new attempt number. Every write it then makes for the job —
heartbeats, progress, log lines, metrics, artifacts, its final status — goes through :func:`fenced`:
a transaction whose first statement updates the job row only where the row is RUNNING at that very
attempt, and raises :class:`Superseded` where it is not; the rest of the transaction is then written
under that row's lock (PostgreSQL) or the database's write lock (SQLite), or not at all. A worker the
reaper declared lost (``JobService.reap``: no heartbeat within the lease; the job re-queued, and
perhaps claimed by another worker since) that comes back — a paused process, a machine that was off
the network — thus writes nothing over the attempt that replaced it: it stops quietly
(``jobs.tasks.execute``). Heartbeats are stamped with the database server's clock
(``jobs.db.server_utcnow``), the clock the reaper judges them by.

Every write of an attempt is here: the claim, the heartbeat (:class:`Heartbeat`), log lines
(:func:`job_log`), progress (:func:`write_progress`), and the end — :func:`record_success`,
:func:`finish`, :func:`requeue_or_fail` — but a re-evaluation's success, which also completes its
source job's metrics in the same fenced transaction (``jobs.reevaluation.record``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from jobs.db import Artifact, Job, JobLog, Metric, Status, retry_on_disconnect, server_utcnow
from jobs.timings import Event, StageClock

logger = logging.getLogger(__name__)


class Superseded(Exception):
    """The attempt no longer owns its job (the reaper re-queued or ended it, a later attempt claimed
    it, it was force-cancelled or deleted): it must stop and write nothing more."""


def claim(sf: sessionmaker, job_id: int, worker: str) -> int | None:
    """Atomically move the job QUEUED → RUNNING for ``worker`` and count the attempt; the attempt's
    token (its number: the new ``attempts``), or None if someone else has the job or it was cancelled.
    The update is guarded by the attempt count read just before, so the token is the value this very
    update wrote, on PostgreSQL and SQLite alike (a rival claim between the two makes it match no row)."""
    queued = (Job.id == job_id, Job.status == Status.QUEUED.value)
    with sf.begin() as s:
        seen = s.scalar(select(Job.attempts).where(*queued))
        if seen is None:
            return None
        now = server_utcnow()
        res = s.execute(
            update(Job)
            .where(*queued, Job.attempts == seen)
            .values(
                status=Status.RUNNING.value,
                worker=worker,
                started_at=now,
                heartbeat_at=now,
                progress_at=now,  # the watchdog's clock starts at the claim (jobs.watchdog)
                attempts=seen + 1,
                stage="starting",
                error=None,
                traceback=None,
                timings=None,
            )
        )
        return seen + 1 if res.rowcount == 1 else None


@contextmanager
def fenced(sf: sessionmaker, job_id: int, token: int, **values: Any) -> Iterator[Session]:
    """A transaction for attempt ``token``'s writes to its job. Its first statement stamps the
    heartbeat (and sets ``values`` on the job row) where the job is RUNNING at that attempt — the
    check and the write are one statement — and raises :class:`Superseded`, writing nothing, where it
    is not; what the caller adds in the ``with`` block commits with it, under the row's lock, or not
    at all."""
    with sf.begin() as s:
        done = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.attempts == token, Job.status == Status.RUNNING.value)
            .values(heartbeat_at=server_utcnow(), **values)
        )
        if done.rowcount != 1:
            now = s.execute(select(Job.status, Job.attempts).where(Job.id == job_id)).one_or_none()
            state = f"the job is {now[0]} at attempt {now[1]}" if now else "the job was deleted"
            raise Superseded(f"attempt {token} of job {job_id} no longer owns it: {state}")
        yield s


def job_log(sf: sessionmaker, job_id: int, token: int, message: str, level: str = "INFO") -> None:
    """One line in the job's log from attempt ``token`` (fenced; tried again on a dropped connection)."""

    def write() -> None:
        with fenced(sf, job_id, token) as s:
            s.add(JobLog(job_id=job_id, message=message, level=level))

    retry_on_disconnect(write)


class Heartbeat(threading.Thread):
    """Stamps attempt ``token``'s heartbeat every ``every`` seconds while the job runs. Once a beat is
    refused (the attempt was superseded) it stops, and :meth:`refused` says why: the job's progress
    callback, in the main thread, raises :class:`Superseded` on seeing it."""

    def __init__(self, sf: sessionmaker, job_id: int, token: int, every: float):
        super().__init__(daemon=True, name=f"heartbeat-{job_id}")
        self.sf, self.job_id, self.token, self.every = sf, job_id, token, every
        self.stop, self.lost, self._why = threading.Event(), threading.Event(), ""

    def refused(self) -> str | None:
        """Why the attempt's heartbeat was refused (the :class:`Superseded` message), or None."""
        return self._why if self.lost.is_set() else None

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                with fenced(self.sf, self.job_id, self.token):
                    pass
            except Superseded as exc:
                self._why = str(exc)
                self.lost.set()
                return
            except Exception:  # a missed beat is not fatal; the lease tolerates several
                pass


# --- what an attempt writes: each in one fenced transaction -------------------------------------
def write_progress(sf: sessionmaker, job_id: int, token: int, values: dict[str, Any], events: list[Event]) -> bool:
    """Store attempt ``token``'s progress update (``values`` on the job row) and the events it
    finished; whether the job's cancel flag is set."""
    with fenced(sf, job_id, token, **values) as s:
        _add_events(s, job_id, events)
        return bool(s.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def _add_events(session: Session, job_id: int, events: list[Event]) -> None:
    """The clock's finished stages and steps as job log lines (and in the worker's log)."""
    for ev in events:
        session.add(JobLog(job_id=job_id, level=ev.level, message=ev.message))
        logger.log(logging.getLevelName(ev.level), "job %d: %s", job_id, ev.message)


def record_success(
    sf: sessionmaker,
    job_id: int,
    token: int,
    result,
    metrics: dict[str, Any],
    artifacts: list[Artifact],
    clock: StageClock,
    model: str | None = None,
) -> bool:
    """Store metrics, artifacts, timings, the layer report and a last log line and mark the job
    SUCCEEDED, in one transaction; False, storing nothing but the heartbeat, if a cancel arrived
    meanwhile. ``model``: the model as the job names it in ``recipe_as_run`` (``job:42``, not the
    server folder it was resolved to)."""
    as_run = result.recipe.model_dump(mode="json")
    if model is not None:
        as_run["model"] = model
    with fenced(sf, job_id, token) as s:
        if s.scalar(select(Job.cancel_requested).where(Job.id == job_id)):
            return False
        add_metrics(s, job_id, metrics)
        s.add_all(artifacts)
        mark_succeeded(s, job_id, clock, report=result.layer_rows(), recipe_as_run=as_run)
    return True


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a job records: the numbers (a flag or a text in the engine's summary is not one)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def add_metrics(session: Session, job_id: int, metrics: dict[str, Any]) -> None:
    """Inside an attempt's fenced transaction: the job's metrics (:func:`numeric`)."""
    session.add_all(Metric(job_id=job_id, name=name, value=value) for name, value in numeric(metrics).items())


def mark_succeeded(session: Session, job_id: int, clock: StageClock, **values: Any) -> None:
    """Inside an attempt's fenced transaction (:func:`record_success`, ``jobs.reevaluation.record``):
    the job SUCCEEDED with its timings, ``values`` on its row, and its last log lines."""
    timings, events = clock.finish(stopped=False)
    _add_events(session, job_id, [*events, Event(f"total {timings['total']:.1f} s"), Event("succeeded")])
    done = {"status": Status.SUCCEEDED.value, "stage": "done", "progress": 1.0, "finished_at": server_utcnow()}
    session.execute(update(Job).where(Job.id == job_id).values(timings=timings, **done, **values))


def finish(
    sf: sessionmaker,
    job_id: int,
    token: int,
    status: Status,
    error: str | None,
    tb: str | None = None,
    clock: StageClock | None = None,
) -> None:
    """Mark the job finished without success; the timings so far (the stage it stopped in last) are
    kept."""
    values: dict[str, Any] = {"status": status.value, "finished_at": server_utcnow(), "error": error, "traceback": tb}
    events: list[Event] = []
    if clock is not None:
        values["timings"], events = clock.finish(stopped=True)
    with fenced(sf, job_id, token, **values) as s:
        _add_events(s, job_id, events)
        level = "ERROR" if status == Status.FAILED else "INFO"
        s.add(JobLog(job_id=job_id, level=level, message=f"{status.value.lower()}: {error}"))


def requeue_or_fail(
    sf: sessionmaker, job_id: int, token: int, max_attempts: int, reason: str, stopped: bool = False
) -> bool:
    """After a transient error in attempt ``token``: the job back in the queue for another attempt,
    or FAILED once ``max_attempts`` of its attempts have counted; whether it ended the job. A polite
    stop (``stopped``: the attempt saved a checkpoint and hands the job back) always requeues it and
    is not counted, then or later (the job's ``stops``)."""
    with fenced(sf, job_id, token) as s:
        counted = token - s.scalar(select(Job.stops).where(Job.id == job_id))
        if stopped or counted < max_attempts:
            values = {"status": Status.QUEUED.value, "stage": "requeued", "stops": Job.stops + int(stopped)}
            s.execute(update(Job).where(Job.id == job_id).values(**values))
            s.add(JobLog(job_id=job_id, level="WARNING", message=f"{reason}; will retry"))
            return False
        ended = {"status": Status.FAILED.value, "finished_at": server_utcnow(), "error": reason}
        s.execute(update(Job).where(Job.id == job_id).values(**ended))
        s.add(JobLog(job_id=job_id, level="ERROR", message=f"failed after {token} attempts: {reason}"))
    return True
