"""The progress watchdog and the time limit: a RUNNING job that is alive but going nowhere is failed.

A job's heartbeat is stamped by a thread of its own (``jobs.fencing.Heartbeat``), so a job whose main
thread hangs — a deadlocked collective, a read from a dead network mount, a kernel that never returns —
keeps a fresh heartbeat and looked healthy forever, holding its worker. Its progress, though, stops:
each new stage or step the engine reports stamps ``progress_at`` (``jobs.tasks``; the claim stamps it
first). The reaper (``jobs.service.JobService.reap``, every few seconds in each worker's maintenance
thread) fails a job whose ``progress_at`` is older than ``LIAR_STALL_MINUTES``, or whose run is older
than ``LIAR_TASK_TIME_LIMIT`` hours, in the same transaction as it judges lost workers, and then asks
the job's worker to kill the process (a Celery revoke with ``terminate``). The job's row is no
longer RUNNING at that attempt, so whatever the stalled process still writes is fenced out
(``jobs.fencing.fenced``); if it wakes up before the kill, its next progress call stands down.

Both are judged by the database server's clock, the one ``progress_at`` is stamped with. A stalled
job is not retried: a hang that is a property of the job would hang again, for as long again.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from jobs.db import Job, JobLog, Status
from jobs.settings import Settings

logger = logging.getLogger(__name__)

# the Celery hard limit comes this long after the reaper's own: the reaper fails the job first, with its
# reason, and Celery's kill is the backstop where no reaper runs or the revoke was lost
HARD_LIMIT_MARGIN_S = 300.0


def hard_time_limit(settings: Settings) -> float | None:
    """Celery's ``task_time_limit`` in seconds for ``LIAR_TASK_TIME_LIMIT`` (None: no limit)."""
    if not settings.task_time_limit_hours:
        return None
    return settings.task_time_limit_hours * 3600 + HARD_LIMIT_MARGIN_S


def stalled(session: Session, now: dt.datetime, settings: Settings, skip: list[int]) -> list[tuple[int, str | None]]:
    """Inside the reaper's transaction: fail the RUNNING jobs (not in ``skip``) without progress for
    ``stall_minutes`` or running past the time limit, each with a reason and a log line; their ids
    and Celery task ids. Rows another reaper holds are skipped."""
    conditions = []
    if settings.stall_minutes > 0:
        conditions.append(Job.progress_at < now - dt.timedelta(minutes=settings.stall_minutes))
    if settings.task_time_limit_hours:
        conditions.append(Job.started_at < now - dt.timedelta(hours=settings.task_time_limit_hours))
    if not conditions:
        return []
    query = select(Job).where(Job.status == Status.RUNNING.value, or_(*conditions))
    if skip:
        query = query.where(Job.id.not_in(skip))
    failed = []
    for job in session.scalars(query.with_for_update(skip_locked=True)):
        reason = _reason(job, now, settings)
        job.status, job.finished_at, job.error = Status.FAILED.value, now, reason
        session.add(JobLog(job_id=job.id, level="ERROR", message=f"{reason}; stopped by the watchdog"))
        logger.warning("job %d: %s; failed, its worker %s asked to kill it", job.id, reason, job.worker)
        failed.append((job.id, job.celery_id))
    return failed


def _reason(job: Job, now: dt.datetime, settings: Settings) -> str:
    """``no progress for 30 minutes (stage reconstruct, layer 3/24)``, or the time limit's."""
    limit = settings.task_time_limit_hours
    if limit and job.started_at is not None and job.started_at < now - dt.timedelta(hours=limit):
        return f"ran longer than the time limit of {limit:g} hours (LIAR_TASK_TIME_LIMIT)"
    where = f"stage {job.stage}"
    if job.stage == "reconstruct" and job.layer is not None:
        where += f", layer {job.layer}/{job.n_layers}"
    return f"no progress for {settings.stall_minutes:g} minutes ({where})"


def stop_processes(celery, task_ids: list[str | None]) -> None:
    """Ask the workers to kill the processes running these tasks (best effort: a worker that does not
    hear it is stopped by its own next fenced write, or by Celery's hard time limit)."""
    for task_id in filter(None, task_ids):
        try:
            celery.control.revoke(task_id, terminate=True, signal="SIGKILL")
        except Exception:  # the broker is down: the fencing already keeps the job's row safe
            logger.warning("could not ask a worker to kill task %s", task_id, exc_info=True)
