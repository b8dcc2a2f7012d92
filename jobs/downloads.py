"""The files a job offers, as ``JobService`` serves them (a part of it: ``JobService`` inherits
:class:`JobFiles`): listed from the job's rows, each checked to lie in the job's folder of the store
(``jobs.artifacts``, ``jobs.store``), sent from this host's folder, streamed from the store, or handed
to the store as a signed address; and the retention that removes old jobs' files.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from jobs import reevaluation
from jobs.access import OPEN, Actor, require_owner
from jobs.artifacts import Served, TarStream, check_name, confined, inside_job, job_key, remove_job, stored_key
from jobs.db import Artifact, Job, JobLog, Status, db_now
from jobs.store import check_key
from jobs.tombstones import find

logger = logging.getLogger(__name__)


class JobFiles:
    """What ``JobService`` does with jobs' files (it provides ``settings`` and ``sessions``)."""

    def artifact(self, job_id: int, kind: str = "checkpoint") -> Path:
        """Where the job's first artifact of ``kind`` ("checkpoint", or "archive" for old jobs) is on this
        host: in the store's folder, or (a remote store) where this host caches it."""
        with self.sessions() as s:
            row = s.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind == kind)).first()
        if row is None:
            raise KeyError(f"job {job_id} has no {kind}")
        return self.settings.store().path(stored_key(row.path))

    def served(self, job_id: int, actor: Actor = OPEN) -> list[Served]:
        """The files a job offers for download, in the order written: each checkpoint file, or the
        ``.tar.gz`` of a job finished before per-file artifacts (its file name as its name).
        :class:`Forbidden` when downloads are for owners and admins (``LIAR_DOWNLOADS=owners``) and
        ``actor`` is neither."""
        with self.sessions() as s:
            job = find(s, job_id)
            if self.settings.downloads == "owners":
                require_owner(actor, job_id, job.submitted_by, "download")
            rows = s.scalars(
                select(Artifact)
                .where(Artifact.job_id == job_id, Artifact.kind.in_(("file", "archive")))
                .order_by(Artifact.id)
            ).all()
        return [self._listed(r) for r in rows]

    def _listed(self, row: Artifact) -> Served:
        """A row as served: its key, and, in a folder store, where that is here (not yet checked to lie
        in the job's folder: :meth:`file` does that before anything is sent)."""
        store, key = self.settings.store(), stored_key(row.path)
        try:
            here = store.path(key) if store.local is not None else None
        except ValueError:  # no plain key: refused when asked for
            here = None
        return Served(row.name or key.rpartition("/")[2], key, row.size, row.sha256, row.kind, here)

    def downloads(self, job_id: int, actor: Actor = OPEN) -> list[dict[str, Any]]:
        """:meth:`served` as plain values: name, size, sha256, kind."""
        return [
            {"name": f.name, "size": f.size, "sha256": f.sha256, "kind": f.kind} for f in self.served(job_id, actor)
        ]

    def file(self, job_id: int, name: str, actor: Actor = OPEN) -> Served:
        """One file the job offers, by name, its key checked to lie in the job's folder: ``ValueError``
        for a name that is no plain relative path (``../x``), ``KeyError`` for one the job does not
        have (or no longer in the store), ``PermissionError`` for a recorded key outside the folder."""
        check_name(name)
        match = next((f for f in self.served(job_id, actor) if f.name == name), None)
        if match is None:
            raise KeyError(f"job {job_id} has no file {name!r}")
        return self._confined(job_id, match)

    def _confined(self, job_id: int, f: Served) -> Served:
        store, path = self.settings.store(), None
        inside_job(f.key, job_id)
        try:
            if store.local is not None:  # and no link out of the folder
                path = confined(store.path(f.key), store.path(job_key(job_id)))
            elif not store.exists(f.key):
                raise FileNotFoundError(f.key)
        except FileNotFoundError:
            raise KeyError(f"the file {f.name!r} of job {job_id} is no longer on the server") from None
        return Served(f.name, f.key, f.size, f.sha256, f.kind, path)

    def _where(self, key: str) -> str:
        """Where ``key`` is, for the operator (``liar jobs show``): a path here, or the store's URL (a
        row that holds no key, as is)."""
        store = self.settings.store()
        try:
            return str(store.path(key)) if store.local is not None else f"{store.location.rstrip('/')}/{check_key(key)}"
        except ValueError:
            return key

    def text_file(self, job_id: int, name: str) -> str | None:
        """The text of a small file of the job's checkpoint (its model card), or None if it has none;
        from a remote store, fetched into this host's cache once."""
        with self.sessions() as s:
            row = s.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name)).first()
        if row is None:
            return None
        try:
            key = inside_job(stored_key(row.path), job_id)
            return self.settings.store().fetch(key, row.size, row.sha256).read_text()
        except (OSError, ValueError):
            return None

    @staticmethod
    def local_path(f: Served) -> Path | None:
        """Where a served file (from :meth:`file`) is on this host, when the store is a folder here."""
        return f.path

    def checkpoint_tar(self, job_id: int, actor: Actor = OPEN) -> TarStream:
        """The job's checkpoint files as one uncompressed tar under ``liar-job-N/``, produced while it is
        read; ``KeyError`` if the job has none (not finished, or an old job: see :meth:`served`)."""
        files = [self._confined(job_id, f) for f in self.served(job_id, actor) if f.kind == "file"]
        if not files:
            raise KeyError(f"job {job_id} has no checkpoint files (is the job finished?)")
        with self.sessions() as s:
            finished = s.scalar(select(Job.finished_at).where(Job.id == job_id))
        mtime = finished.replace(tzinfo=finished.tzinfo or dt.timezone.utc).timestamp() if finished else 0.0
        return TarStream(files, f"liar-job-{job_id}", self.settings.store(), mtime)

    def remove_files(self, job_id: int) -> None:
        """Every file of the job removed, on this host and in the store (the rows are the caller's)."""
        remove_job(self.settings.store(), self.settings.artifacts_dir, job_id)

    def expire(self, days: float | None = None) -> list[int]:
        """Retention (``LIAR_RETENTION_DAYS``, or ``days``): the files of jobs finished more than that
        many days ago removed, their artifact rows with them; each job keeps its record, metrics and
        log, with a line saying its files were removed. The ids of the jobs it touched."""
        days = self.settings.retention_days if days is None else days
        if not days:
            return []
        with self.sessions.begin() as s:
            cutoff = db_now(s) - dt.timedelta(days=days)
            ended = [status.value for status in Status if status.finished]
            old = select(Artifact.job_id).join(Job).where(Job.finished_at < cutoff, Job.status.in_(ended))
            # not one whose checkpoint a re-evaluation is reading
            expired = sorted(job_id for job_id in set(s.scalars(old)) if reevaluation.pending(s, job_id) is None)
        touched = []
        for job_id in expired:
            with self.sessions.begin() as s:  # the rows first: a download now finds no file, not a broken one
                if not s.execute(delete(Artifact).where(Artifact.job_id == job_id)).rowcount:
                    continue  # another worker's maintenance took it meanwhile
                s.add(JobLog(job_id=job_id, level="INFO", message=f"files removed after {days:g} days (retention)"))
            self.remove_files(job_id)
            touched.append(job_id)
            logger.info("job %d: files removed after %g days (retention)", job_id, days)
        return touched
