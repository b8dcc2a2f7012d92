"""A job's checkpoint as another job's model: ``model: job:42``.

A web or API submission may not name a server path inside the artifacts folder (the data roots
exclude it: every job's files and the database live there), so a pruned model is pruned again, or
evaluated, through its job's id. The reference is stored as written (the job page shows ``job:42``,
never the server's folder) and resolved twice: at submission, to check the recipe against the
checkpoint's config, and by the worker, to load it.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import select

from jobs.db import Artifact, Job, Status


class JobInputError(ValueError):
    """What a job names cannot be had any more (another job's checkpoint, deleted since); one sentence."""


_REFERENCE = re.compile(r"\s*job:\s*(\d+)\s*")


def job_reference(model: object) -> int | None:
    """The job id ``model`` names (``job:42``), or None when it names a folder or a hub id."""
    match = _REFERENCE.fullmatch(model) if isinstance(model, str) else None
    return int(match.group(1)) if match else None


def owner_and_checkpoint(session, job_id: int) -> tuple[str | None, Path]:
    """The job's owner and the folder of its checkpoint; ``ValueError`` (one sentence) for a job that
    does not exist, has not succeeded, or has no checkpoint on the server."""
    job = session.get(Job, job_id)
    if job is None:
        raise ValueError(f"model job:{job_id}: there is no job {job_id}")
    if job.status != Status.SUCCEEDED.value:
        raise ValueError(f"model job:{job_id}: that job is {job.status}; only a finished job's checkpoint can be used")
    path = session.scalars(
        select(Artifact.path).where(Artifact.job_id == job_id, Artifact.kind == "checkpoint")
    ).first()
    if path is None or not Path(path, "config.json").is_file():
        raise ValueError(f"model job:{job_id}: that job's checkpoint is no longer on the server")
    return job.submitted_by, Path(path)


def queue_of(sessions, model: object) -> str | None:
    """The queue of the job whose checkpoint ``model`` names (``job:42``), if it was routed: a job that
    prunes a checkpoint again needs less than the job that made it, so it may go where that one ran
    (``jobs.routing``); None for a folder or a hub id."""
    job_id = job_reference(model)
    if job_id is None:
        return None
    with sessions() as s:
        job = s.get(Job, job_id)
        return job.queue if job is not None else None
