"""What a job names in the store (``jobs.store``) rather than by a path: another job's checkpoint as
its model, ``model: job:42``, and an uploaded calibration file, ``dataset: upload:4ae1….jsonl``.

A web or API submission may not name a server path inside the artifacts folder (the data roots
exclude it: every job's files and the database live there), so a pruned model is pruned again, or
evaluated, through its job's id. The reference is stored as written (the job page shows ``job:42``,
never the server's folder) and resolved twice: at submission, to check the recipe against the
checkpoint's config (from its small files: the web host does not download weights), and by the
worker, to load it (downloaded to its cache once when the store is not its data folder).

An upload is kept in the store under ``uploads/`` (named by its sha256), so a worker on another host
reads it; the recipe names it ``upload:<name>``, and each host resolves that to a file of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import select

from jobs.artifacts import stored_key
from jobs.db import Artifact, Job, Status
from jobs.store import Store
from jobs.tombstones import said


class JobInputError(ValueError):
    """What a job names cannot be had any more (another job's checkpoint, deleted since); one sentence."""


_REFERENCE = re.compile(r"\s*job:\s*(\d+)\s*")


def job_reference(model: object) -> int | None:
    """The job id ``model`` names (``job:42``), or None when it names a folder or a hub id."""
    match = _REFERENCE.fullmatch(model) if isinstance(model, str) else None
    return int(match.group(1)) if match else None


WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth")  # what a host checking a recipe need not download


def local_checkpoint(session, store: Store, job_id: int, weights: bool = True) -> Path | None:
    """The job's checkpoint as a folder on this host, or None if it is no longer in the store: the
    folder itself when the store is a folder; otherwise its files downloaded to this host's cache
    (once, each checked against its sha256), the weights only when ``weights``."""
    key = session.scalars(select(Artifact.path).where(Artifact.job_id == job_id, Artifact.kind == "checkpoint")).first()
    if key is None:
        return None
    key = stored_key(key)
    files = session.execute(
        select(Artifact.name, Artifact.path, Artifact.size, Artifact.sha256).where(
            Artifact.job_id == job_id, Artifact.kind == "file"
        )
    ).all()
    try:
        for name, file_key, size, sha256 in files:
            if store.local is None and (weights or not (name or "").endswith(WEIGHTS)):
                store.fetch(stored_key(file_key), size, sha256)
        folder = store.path(key)
    except (FileNotFoundError, ValueError):
        return None
    return folder if (folder / "config.json").is_file() else None


def owner_and_checkpoint(session, job_id: int, store: Store, weights: bool = True) -> tuple[str | None, Path]:
    """The job's owner and its checkpoint as a folder on this host (:func:`local_checkpoint`);
    ``ValueError`` (one sentence) for a job that does not exist, has not succeeded, or has no
    checkpoint in the store."""
    job = session.get(Job, job_id)
    if job is None:
        raise ValueError(f"model job:{job_id}: there is no job {job_id}")
    if job.status == Status.DELETED.value:
        raise ValueError(f"model job:{job_id}: {said(job_id, job.deleted_by, job.deleted_at)}")
    if job.status != Status.SUCCEEDED.value:
        raise ValueError(f"model job:{job_id}: that job is {job.status}; only a finished job's checkpoint can be used")
    if (job.recipe or {}).get("export_only") is True:  # jobs.export_jobs: serving files, no checkpoint
        raise ValueError(
            f"model job:{job_id}: that job exported {job.recipe['model']} for serving: name {job.recipe['model']}"
        )
    path = local_checkpoint(session, store, job_id, weights)
    if path is None:
        raise ValueError(f"model job:{job_id}: that job's checkpoint is no longer on the server")
    return job.submitted_by, path


UPLOAD = "upload:"
UPLOADS = "uploads"  # the store's folder of uploaded files


def upload_reference(value: object) -> str | None:
    """The key of the upload ``value`` names (``upload:4ae1.jsonl`` → ``uploads/4ae1.jsonl``), or None."""
    if not isinstance(value, str) or not value.startswith(UPLOAD):
        return None
    name = value[len(UPLOAD) :].strip()
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"{value!r} names no uploaded file")
    return f"{UPLOADS}/{name}"


def uploaded_file(store: Store, value: str) -> str:
    """The uploaded file ``value`` (``upload:…``) names, as a path on this host (fetched from the
    store once); ``ValueError`` (one sentence) if the store no longer has it."""
    key = upload_reference(value)
    try:
        return str(store.fetch(key))
    except FileNotFoundError:
        raise ValueError(f"the uploaded file {value!r} is no longer on the server: upload it again") from None


def with_local_uploads(recipe: dict, store: Store) -> dict:
    """``recipe`` with an ``upload:…`` calibration set replaced by its file on this host."""
    calibration = recipe.get("calibration")
    if isinstance(calibration, dict) and upload_reference(calibration.get("dataset")) is not None:
        return {**recipe, "calibration": {**calibration, "dataset": uploaded_file(store, calibration["dataset"])}}
    return recipe


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
