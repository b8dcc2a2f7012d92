"""Deleted jobs: the row stays as a tombstone, so that a job's id is never given to another run and
whatever still names it (a shared ``?job=N`` link, a ``jobs/N/files/…`` address, a ``model: job:N``
recipe, a re-run) is told what happened to it rather than shown another run or a bare "no job".

Deleting a job (``JobService.delete``) removes its files and its artifact rows as before, and turns
its row into a tombstone: status ``DELETED``, ``deleted_at``, ``deleted_by``; it keeps its recipe, its
metrics and its log, and a line in the log says who deleted it. Every query that lists jobs leaves
tombstones out (the dashboard, the Jobs table, the API's list); the operator's ``liar jobs list
--deleted`` lists them and ``liar jobs show N`` shows one. Everything else that looks a job up by its
id goes through :func:`find`, which raises :class:`JobDeleted` for a tombstone: a ``KeyError`` whose
sentence is ``job 9 was deleted by carol on 2026-12-03 14:05 UTC``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete
from sqlalchemy.orm import Session

from jobs.db import Artifact, Job, JobLog, Status

DELETED = Status.DELETED.value


def said(job_id: int, deleted_by: str | None, deleted_at: dt.datetime | None) -> str:
    """``job 9 was deleted by carol on 2026-12-03 14:05 UTC``: one sentence for every route (without a
    login, or by the operator at the database, there is no name to give)."""
    who = f" by {deleted_by}" if deleted_by else ""
    when = f" on {deleted_at:%Y-%m-%d %H:%M} UTC" if deleted_at else ""
    return f"job {job_id} was deleted{who}{when}"


class JobDeleted(KeyError):
    """The job was deleted: its id names a tombstone. A ``KeyError`` (every route already answers an
    unknown job in one sentence), whose only argument is that sentence (:func:`said`)."""

    def __init__(self, job_id: int, deleted_by: str | None, deleted_at: dt.datetime | None):
        super().__init__(said(job_id, deleted_by, deleted_at))
        self.job_id, self.deleted_by, self.deleted_at = job_id, deleted_by, deleted_at

    def __str__(self) -> str:
        return self.args[0]


def check(job: Job | None, job_id: int) -> Job:
    """``job`` (a row read by id): ``KeyError`` when there is none, :class:`JobDeleted` for a tombstone."""
    if job is None:
        raise KeyError(f"no job {job_id}")
    if job.status == DELETED:
        raise JobDeleted(job_id, job.deleted_by, job.deleted_at)
    return job


def find(session: Session, job_id: int, for_update: bool = False) -> Job:
    """The job with this id that has not been deleted (:func:`check`); ``for_update``: its row locked."""
    job = session.get(Job, job_id, with_for_update=True) if for_update else session.get(Job, job_id)
    return check(job, job_id)


def bury(session: Session, job: Job, who: str | None, when: dt.datetime) -> None:
    """Turn ``job`` (a finished one, its row locked in ``session``) into a tombstone: its artifact rows
    go (its files are the caller's to remove), its traceback too; who deleted it and when are kept,
    with a line in its log."""
    session.execute(delete(Artifact).where(Artifact.job_id == job.id))
    job.status, job.stage, job.deleted_at, job.deleted_by = DELETED, "deleted", when, who
    job.traceback = None
    session.add(JobLog(job_id=job.id, message=said(job.id, who, when).replace(f"job {job.id} was ", "", 1)))
