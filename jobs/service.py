"""The job API used by the CLI and the web app: submit, sweep, list, show, cancel, re-run, re-evaluate
(``jobs.reevaluation``), delete, reap.

SQL is the source of truth; Celery only carries "run job N" messages. Every state change goes
through the database, so a job is never silently lost:

- submit validates the recipe first (an invalid one creates no row), inserts a QUEUED row, then
  sends the message; if the broker refuses, the row is deleted and the error raised.
- a worker claims a job with an atomic QUEUED → RUNNING update (duplicates are skipped) and
  heartbeats while it runs.
- :meth:`JobService.reap` finds RUNNING jobs whose heartbeat is older than the lease (killed worker,
  lost machine) and re-queues them, or marks them FAILED after ``max_attempts`` runs; it also re-sends
  QUEUED jobs whose message was lost (broker restarted without persistence).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs import export_jobs, reevaluation, routing, tombstones, watchdog
from jobs.access import OPEN, Actor, NotNow, new_error_id, public_text, require_owner
from jobs.broker import queued_job_ids
from jobs.db import Artifact, Job, JobLog, Metric, Status, connect, db_now, server_utcnow, utcnow
from jobs.downloads import JobFiles
from jobs.references import job_reference, queue_of
from jobs.settings import Settings, redact_url, scrub
from jobs.submission import SubmitError, Validator, target_cells

logger = logging.getLogger(__name__)

# what a list reads: plain rows of every column but the large ones no summary shows (building ORM
# objects and parsing a thousand reports and timings was most of the dashboard's time: bench/load.py)
_LISTED = tuple(c for c in Job.__table__.c if c.name not in ("report", "timings", "traceback", "evaluations"))


class QueueError(RuntimeError):
    """The broker did not take the job; nothing was created. The message names no URL or host (the
    server log has them, under the error id it gives)."""


class JobService(JobFiles):
    def __init__(self, settings: Settings | None = None, celery_app=None):
        self.settings = settings or Settings.from_env()
        self.settings.ensure_dirs()
        self.sessions = connect(self.settings.database_url)
        self.validator = Validator(self.settings, self.sessions)
        self.names = self.validator.names  # jobs.names: the server's models and texts as users name them
        self._celery = celery_app

    @property
    def celery(self):
        if self._celery is None:
            from jobs.celery_app import make_celery

            self._celery = make_celery(self.settings)
        return self._celery

    # --- submission -----------------------------------------------------------------------
    def validate(
        self,
        recipe: dict | str | Path,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        check_export: bool | None = True,
        actor: Actor = OPEN,
    ) -> tuple[dict, list[dict]]:
        """The recipe and evaluations as stored, validated: :meth:`jobs.submission.Validator.validate`."""
        return self.validator.validate(recipe, evaluations, confine, check_export, actor)

    def readable(self, value: str) -> bool:
        """Whether a web or API submission may name this server path (``Settings.readable_roots``)."""
        return self.validator.readable(value)

    def submit(
        self,
        recipe: dict | str | Path,
        submitted_by: str | None = None,
        group_id: str | None = None,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        note: str | None = None,
        check_export: bool = True,
        actor: Actor = OPEN,
    ) -> int:
        """Validate and queue one job; ``confine``, ``check_export``, ``actor``: see :meth:`validate`;
        ``note``: said in the job's first log line beside who submitted it (``re-run of job 3``).
        Raises :class:`SubmitError`, or :class:`QueueError` when the broker does not take the job."""
        data, evals = self.validate(recipe, evaluations, confine, check_export, actor)
        source = queue_of(self.sessions, data.get("model"))  # model: job:N
        local = self.names.recipe(data, self.names.path)  # the estimate reads the model's files on this host
        queue, routed = routing.route(self.settings.queues, local, source)  # may refuse: nothing created yet
        note = "; ".join(n for n in (note, routed) if n) or None
        queued = Status.QUEUED.value
        job = Job(recipe=data, evaluations=evals, submitted_by=submitted_by, group_id=group_id, status=queued)
        job.queue = queue
        return self._queue(lambda s: (job, note))

    def _queue(self, build: Callable[[Session], tuple[Job, str | None]]) -> int:
        """Insert the job ``build`` makes (in the transaction it checks in: a re-evaluation holds its
        source's row) with its first log line, ``submitted by … (note)``, then send its message; if the
        broker does not take it, the row is deleted again and :class:`QueueError` raised."""
        with self.sessions.begin() as s:
            job, note = build(s)
            job.stage = "queued"
            s.add(job)
            s.flush()
            job_id = job.id
            said = f"submitted by {job.submitted_by or 'anonymous'}" + (f" ({note})" if note else "")
            s.add(JobLog(job_id=job_id, message=said))
        try:
            self._send(job_id)
        except Exception as exc:
            with self.sessions.begin() as s:
                s.delete(s.get(Job, job_id))
            url = self.settings.broker_url
            # the message reaches users (the web app, the API): no URL, host or password in it; the
            # server log has the broker (its password masked) and the reason under the error id
            error_id = new_error_id()
            reason = scrub(str(exc), url) or type(exc).__name__
            logger.error(
                "error %s: the broker at %s did not take job %d: %s", error_id, redact_url(url), job_id, reason
            )
            raise QueueError(
                "could not queue the job: the job broker did not take it, so nothing was created; try again, "
                f"or tell the administrator (error id {error_id})"
            ) from exc
        return job_id

    def _send(self, job_id: int) -> None:
        """Send the job's message to the queue it was routed to (the default queue where none)."""
        with self.sessions() as s:
            queue = s.scalar(select(Job.queue).where(Job.id == job_id))
        result = self.celery.send_task("liar.run_job", args=[job_id], **routing.send_options(queue))
        with self.sessions.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(celery_id=result.id))

    def submit_sweep(
        self,
        recipe: dict | str | Path,
        ratios: list[float] | None = None,
        methods: list[str] | None = None,
        criteria: list[str] | None = None,
        submitted_by: str | None = None,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        actor: Actor = OPEN,
    ) -> tuple[str, list[int]]:
        """One job per cell of ratios × methods × criteria (axes left out take the recipe's value),
        sharing a group id; the cells are those of a sweep grid (``core.spec.sweep.expand_grid``).
        All cells are validated before any job is created."""
        from core.spec.sweep import GridError, expand_grid

        # the serving forms are checked on the cells, not on the base (a sweep of reconstruction methods
        # may leave out the base's): the model once, with the first cell, and each cell's own recipe
        base, evals = self.validate(recipe, evaluations, confine, check_export=None, actor=actor)
        if base.get("target") is not None:  # a speed target: no ratio axis, one job per method × criterion
            if ratios:
                raise SubmitError("a speed-target recipe has no ratio to sweep: sweep methods or criteria")
            cells = target_cells(base, methods, criteria)
            recipes = [self.validate(r, evals, check_export=i == 0, actor=actor)[0] for i, r in enumerate(cells)]
            group = uuid.uuid4().hex[:12]
            return group, [self.submit(r, submitted_by, group, evals, check_export=False, actor=actor) for r in recipes]
        axes: dict[str, Any] = {}
        if ratios:
            axes["ratio"] = list(ratios)
        if methods:
            axes["reconstruction"] = list(methods)
        if criteria:  # another criterion name keeps the recipe's criterion options
            axes["criterion"] = [{"name": name, "options": base["criterion"]["options"]} for name in criteria]
        try:  # the cells are validated as recipes: on this host's files, not on the stored names
            cells = expand_grid(self.validator.names.recipe(base, self.validator.names.path), axes)
        except GridError as exc:
            raise SubmitError(f"invalid recipe: {'; '.join(exc.problems)}") from None
        recipes = [
            self.validate(cell.recipe, evals, check_export=i == 0, actor=actor)[0] for i, cell in enumerate(cells)
        ]
        group = uuid.uuid4().hex[:12]
        return group, [self.submit(r, submitted_by, group, evals, check_export=False, actor=actor) for r in recipes]

    # --- queries --------------------------------------------------------------------------
    def list(
        self,
        status: str | None = None,
        group_id: str | None = None,
        submitted_by: str | None = None,
        limit: int = 100,
        deleted: bool = False,
    ) -> list[dict[str, Any]]:
        """The newest jobs first; never a deleted job's tombstone, unless ``deleted`` (the operator's
        ``liar jobs list --deleted``): then those only."""
        self.reap()
        q = select(*_LISTED).order_by(Job.id.desc()).limit(limit)
        q = q.where(Job.status == tombstones.DELETED) if deleted else q.where(Job.status != tombstones.DELETED)
        if status:
            q = q.where(Job.status == status.upper())
        if group_id:
            q = q.where(Job.group_id == group_id)
        if submitted_by:
            q = q.where(Job.submitted_by == submitted_by)
        with self.sessions() as s:
            return [self.validator.names.public(self._summary(row)) for row in s.execute(q)]

    def show(self, job_id: int, internal: bool = False) -> dict[str, Any]:
        """One job: its summary, recipe, evaluations, error, metrics, report, artifacts, timings and
        log, as users may see them: no traceback, no server paths (an artifact has its name, size and
        sha256; the error and log lines are scrubbed, ``jobs.access.public_text``, which also covers
        rows written before errors were made public). ``internal``: the operator's view (the
        ``liar jobs`` command at the database), with the traceback and the artifacts' paths, and a
        deleted job's tombstone, which users are told of (``jobs.tombstones.JobDeleted``)."""
        self.reap()
        clean = (lambda text: text) if internal else (lambda text: public_text(text) if text else text)
        with self.sessions() as s:
            job = s.get(Job, job_id)
            if not (internal and job is not None and job.status == tombstones.DELETED):
                tombstones.check(job, job_id)
            out = self._summary(job)
            out.update(
                recipe=job.recipe,
                recipe_as_run=job.recipe_as_run,
                evaluations=job.evaluations,
                error=clean(job.error),
                metrics={m.name: m.value for m in job.metrics},
                report=job.report,
                artifacts=[
                    {"kind": a.kind, "name": a.name, "size": a.size, "sha256": a.sha256}
                    | ({"key": a.path, "path": self._where(a.path)} if internal else {})
                    for a in job.artifacts
                ],
                timings=job.timings,
                log=[{"at": lg.at.isoformat(), "level": lg.level, "message": clean(lg.message)} for lg in job.logs],
            )
            if internal:
                out["traceback"] = job.traceback
                return out
            return self.validator.names.public(out)  # jobs.names: models/NAME, never the server's path

    def owner(self, job_id: int) -> str | None:
        """Who submitted the job (``KeyError`` if there is no such job, or it was deleted)."""
        with self.sessions() as s:
            return tombstones.find(s, job_id).submitted_by

    @staticmethod
    def _summary(job: Job) -> dict[str, Any]:
        iso = lambda t: t.isoformat() if t else None  # noqa: E731
        end = job.finished_at or (utcnow() if job.started_at else None)
        ran = job.recipe_as_run or job.recipe
        return {
            "id": job.id,
            "status": job.status,
            "stage": job.stage,
            "layer": job.layer,
            "n_layers": job.n_layers,
            "progress": job.progress,
            "cancel_requested": bool(job.cancel_requested),
            "model": job.recipe.get("model"),
            "ratio": job.recipe.get("ratio"),
            "target": job.recipe.get("target"),  # a speed target in place of the ratio
            "method": job.recipe.get("reconstruction", {}).get("method"),
            # what ran once the job has (``auto`` resolved), else what was asked for
            "criterion": ran.get("criterion", {}).get("name"),
            "allocation": ran.get("allocation"),
            "submitted_by": job.submitted_by,
            "group_id": job.group_id,
            "source_job": job.source_job_id,  # a re-evaluation's: the job whose checkpoint it evaluates
            # an export-only job's forms (jobs.export_jobs): a finished checkpoint written for serving, no run
            "export_only": job.recipe.get("export") if export_jobs.is_export(job.recipe) else None,
            "worker": job.worker,
            "queue": job.queue,
            "attempts": job.attempts,
            "created_at": iso(job.created_at),
            "started_at": iso(job.started_at),
            "finished_at": iso(job.finished_at),
            "elapsed_s": (end - job.started_at).total_seconds() if job.started_at and end else None,
        } | ({"deleted_by": job.deleted_by, "deleted_at": iso(job.deleted_at)} if job.status == "DELETED" else {})

    def metrics(self, job_ids: list[int]) -> dict[int, dict[str, float]]:
        """Metrics of many jobs in one query: {job id: {name: value}}."""
        out: dict[int, dict[str, float]] = {i: {} for i in job_ids}
        with self.sessions() as s:
            rows = s.execute(select(Metric.job_id, Metric.name, Metric.value).where(Metric.job_id.in_(job_ids)))
            for job_id, name, value in rows:  # plain rows: no ORM object per metric
                out[job_id][name] = value
        return out

    def evaluations(self, job_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """The stored evaluations of many jobs in one query: {job id: [evaluation, …]} (the dashboard
        reads each run's perplexity windows from them)."""
        with self.sessions() as s:
            rows = s.execute(select(Job.id, Job.evaluations).where(Job.id.in_(job_ids)))
            return {job_id: list(evs or []) for job_id, evs in rows}

    # --- control --------------------------------------------------------------------------
    def cancel(self, job_id: int, actor: Actor = OPEN) -> str:
        """QUEUED → CANCELLED at once; RUNNING → cancel flag, honoured at the next layer boundary; a
        finished job stays as it is. Only the job's owner or an admin (:class:`Forbidden` otherwise,
        nothing changed); the job's log and error say who cancelled."""
        with self.sessions.begin() as s:
            job = tombstones.find(s, job_id, for_update=True)
            require_owner(actor, job_id, job.submitted_by, "cancel")
            if Status(job.status).finished:
                return job.status
            who = f"cancelled by {actor.name}" if actor.name else "cancelled by request"
            job.cancel_requested = True
            if job.status == Status.QUEUED.value:
                job.status, job.finished_at, job.stage, job.error = Status.CANCELLED.value, utcnow(), "cancelled", who
            s.add(
                JobLog(job_id=job_id, message=f"cancel requested by {actor.name}" if actor.name else "cancel requested")
            )
            status, celery_id = job.status, job.celery_id
        if status == Status.CANCELLED.value and celery_id:
            try:  # the worker would skip it anyway (claim fails); revoking saves it the trip
                self.celery.control.revoke(celery_id)
            except Exception:
                pass
        return status

    def rerun(self, job_id: int, actor: Actor = OPEN, confine: bool = True) -> int:
        """Submit the job's recipe and evaluations again, as a new job of ``actor`` (without a login, of
        the original submitter: there is nobody else to credit), through the same validation and
        path confinement as a fresh submission; only the job's owner or an admin may."""
        with self.sessions() as s:
            job = tombstones.find(s, job_id)
            owner, recipe, evaluations = job.submitted_by, job.recipe, list(job.evaluations or [])
            source = job.source_job_id
        require_owner(actor, job_id, owner, "re-run")
        if source is not None:  # its recipe is its source's: re-running it would prune again
            raise NotNow(f"job {job_id} is a re-evaluation of job {source}: re-evaluate job {source} instead")
        by = actor.name or owner
        if export_jobs.is_export(recipe):  # the same forms from the same checkpoint, if it is still there
            note = f"re-run of job {job_id}"
            return export_jobs.submit(self, job_reference(recipe["model"]), recipe["export"], actor, by, note)
        return self.submit(
            recipe, by, evaluations=evaluations, confine=confine, note=f"re-run of job {job_id}", actor=actor
        )

    def reevaluate(
        self, job_id: int, actor: Actor = OPEN, evaluations: str | list[int] | None = None, confine: bool = True
    ) -> int:
        """Run a succeeded job's evaluations again on its checkpoint, without pruning, as a new job of
        ``actor`` (without a login, of the original submitter) whose results complete this job's
        metrics (:mod:`jobs.reevaluation`); ``evaluations``: None the failed ones (all if none
        failed), ``"all"``, or their numbers (``"1,3"``). Only the job's owner or an admin; every
        refusal is one sentence (:class:`NotNow`, :class:`SubmitError`, ``Forbidden``)."""

        def build(s: Session) -> tuple[Job, str]:
            job, note = reevaluation.request(s, self.validator, job_id, actor, evaluations, confine)
            job.queue = s.scalar(select(Job.queue).where(Job.id == job_id))  # where its source ran
            return job, note

        return self._queue(build)

    def export(self, job_id: int, forms: str | list[str], actor: Actor = OPEN) -> int:
        """Queue an export-only job writing ``forms`` from a succeeded job's checkpoint, nothing pruned
        again (:mod:`jobs.export_jobs`); its id. Refusals in one sentence, nothing created."""
        return export_jobs.submit(self, job_id, forms, actor)

    def delete(self, job_id: int, actor: Actor = OPEN) -> None:
        """Delete a finished job: every file it wrote, and its row becomes a tombstone that keeps its
        id, its metrics, who deleted it and when (``jobs.tombstones``). Only its owner or an admin
        (:class:`Forbidden`); a queued or running job is cancelled first, and so is one that is
        evaluating the job again (:class:`NotNow`); a job deleted already says by whom."""
        with self.sessions.begin() as s:
            job = self._deletable(s, job_id, actor, for_update=True)
            tombstones.bury(s, job, actor.name, db_now(s))
        logger.info("job %d deleted by %s", job_id, actor)
        self.remove_files(job_id)

    def deletion(self, job_id: int, actor: Actor = OPEN) -> list[dict[str, Any]]:
        """What deleting the job would remove, for a page to ask first: its files (name, size, kind),
        checked as :meth:`delete` checks (the same refusals, nothing changed)."""
        with self.sessions() as s:
            self._deletable(s, job_id, actor)
            rows = s.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.id)).all()
            return [{"name": a.name or Path(a.path).name, "size": a.size, "kind": a.kind} for a in rows]

    @staticmethod
    def _deletable(s: Session, job_id: int, actor: Actor, for_update: bool = False) -> Job:
        job = tombstones.find(s, job_id, for_update=for_update)
        require_owner(actor, job_id, job.submitted_by, "delete")
        if not Status(job.status).finished:
            raise NotNow(f"job {job_id} is {job.status}: cancel it first, then delete it")
        busy = reevaluation.pending(s, job_id)
        if busy is not None:
            raise NotNow(
                f"job {busy} is evaluating job {job_id}'s checkpoint: cancel it first, then delete job {job_id}"
            )
        unfinished = Job.status.in_((Status.QUEUED.value, Status.RUNNING.value))
        named = Job.recipe["model"].as_string() == f"job:{job_id}"
        reader = s.scalar(select(Job.id).where(named, unfinished).order_by(Job.id).limit(1))
        if reader is not None:  # an export-only job (or any other that names model: job:N), not yet done
            raise NotNow(
                f"job {reader} reads job {job_id}'s checkpoint (model: job:{job_id}) and has not finished: "
                f"wait for it or cancel it, then delete job {job_id}"
            )
        return job

    def force_cancel(self, job_id: int) -> None:
        """Fallback when a running job does not stop: terminate its worker process, and end the
        attempt it ran (its folder goes: the process cannot clean up). Only that attempt: if the job
        was re-queued and another attempt took it meanwhile (``jobs.fencing``), it is left running."""
        with self.sessions() as s:
            job = s.get(Job, job_id)
        if job is None:
            return
        if job.celery_id:
            self.celery.control.revoke(job.celery_id, terminate=True, signal="SIGKILL")
        with self.sessions.begin() as s:
            ended = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == Status.RUNNING.value, Job.attempts == job.attempts)
                .values(status=Status.CANCELLED.value, finished_at=server_utcnow(), error="terminated")
            )
        if ended.rowcount == 1:
            self.remove_files(job_id)

    def queued_in_broker(self) -> set[int] | None:
        """Job ids of the messages waiting in the broker queue (None if the broker cannot be read)."""
        return queued_job_ids(self.settings)

    def resend_lost(self, older_than: float = 10.0) -> list[int]:
        """Re-send QUEUED jobs that have no message in the broker (e.g. Redis restarted without
        persistence), with a line in each one's log. A duplicate message is harmless: only one run
        can claim a job."""
        in_broker = self.queued_in_broker()
        if in_broker is None:
            return []
        with self.sessions() as s:
            cutoff = db_now(s) - dt.timedelta(seconds=older_than)  # the clock every maintainer shares
            queued = s.scalars(select(Job.id).where(Job.status == Status.QUEUED.value, Job.created_at < cutoff))
            lost = [job_id for job_id in queued if job_id not in in_broker]
        for job_id in lost:
            self._send(job_id)
        if lost:
            with self.sessions.begin() as s:
                s.add_all(
                    JobLog(job_id=job_id, level="WARNING", message="no message in the broker (lost?); re-sent")
                    for job_id in lost
                )
        return lost

    def reap(self) -> list[int]:
        """Recover jobs of dead workers (see module docstring). Returns the ids it touched. A job it
        ends (FAILED, or CANCELLED if a cancel was pending) loses its folder: what the lost run had
        written is no checkpoint. Rows another reaper holds are skipped (no double re-queue). The lease
        is judged by the database server's clock, the one heartbeats are stamped with (``jobs.fencing``):
        a host whose clock is off neither reaps a live job nor spares a dead one."""
        touched, resend, ended = [], [], []
        with self.sessions.begin() as s:
            now = db_now(s)
            stale = now - dt.timedelta(seconds=self.settings.lease_seconds)
            lost = select(Job).where(Job.status == Status.RUNNING.value, Job.heartbeat_at < stale)
            for job in s.scalars(lost.with_for_update(skip_locked=True)):
                touched.append(job.id)
                reason = f"worker {job.worker} lost (no heartbeat for {self.settings.lease_seconds:.0f} s)"
                if job.cancel_requested:
                    job.status, job.finished_at, job.error = Status.CANCELLED.value, now, reason
                    ended.append(job.id)
                elif job.attempts - job.stops < self.settings.max_attempts:  # stopped attempts do not count
                    job.status, job.stage, job.heartbeat_at = Status.QUEUED.value, "requeued", None
                    s.add(JobLog(job_id=job.id, level="WARNING", message=f"{reason}; re-queued"))
                    resend.append(job.id)
                else:
                    job.status, job.finished_at, job.error = Status.FAILED.value, now, reason
                    s.add(JobLog(job_id=job.id, level="ERROR", message=f"{reason}; giving up"))
                    ended.append(job.id)
            hung = watchdog.stalled(s, now, self.settings, skip=touched)
        touched += [job_id for job_id, _ in hung]
        ended += [job_id for job_id, _ in hung]
        watchdog.stop_processes(self.celery, [celery_id for _, celery_id in hung])
        for job_id in ended:
            self.remove_files(job_id)
        for job_id in resend:
            self._send(job_id)
        return touched
