"""The job API used by the CLI and the web app: submit, sweep, list, show, cancel, reap.

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
import shutil
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update

from jobs.artifacts import Served, TarStream, check_name, confined, job_dir
from jobs.db import Artifact, Job, JobLog, Metric, Status, connect, utcnow
from jobs.settings import Settings, redact_url, scrub

# what a list reads: plain rows of every column but the large ones no summary shows (building ORM
# objects and parsing a thousand reports and timings was most of the dashboard's time: bench/load.py)
_LISTED = tuple(c for c in Job.__table__.c if c.name not in ("report", "timings", "traceback", "evaluations"))


class SubmitError(ValueError):
    """The submission is invalid; nothing was created."""


def _check_tasks(model: str, evaluations: list[dict]) -> None:
    """lm-eval evaluations name tasks that exist (registry, or the task directory's YAMLs) and a causal
    language model (when its config is readable here): a typo fails at submission, not after pruning."""
    tasks = [e for e in evaluations if e.get("type") == "lm_eval"]
    if not tasks:
        return
    from core.evaluation.tasks import select_tasks
    from core.pipeline.preflight import model_kind

    kind = model_kind(model)
    if kind is not None and kind[0] != "decoder":
        raise ValueError(f"lm-eval tasks need a causal language model; {model!r} is an {kind[0]}")
    for e in tasks:
        select_tasks(e["tasks"], e.get("task_dir"))


def _check_export(model: str, forms: list[str]) -> None:
    """The serving forms a recipe asks for can be written from its model (``core.serving.preflight``:
    family, rotary scaling, tokenizer, and the engine a quantized form needs): a model that cannot is
    refused here rather than after hours of pruning. A local folder is checked now; a hub id by the
    worker, once downloaded and before pruning."""
    if not forms or not Path(model).expanduser().is_dir():  # (core.serving imports torch: only when needed)
        return
    from core.serving import ExportError, preflight_model

    try:
        # the engines are the worker's business (it checks again before pruning): this host may lack them
        preflight_model(model, forms, engines=False, download=False)
    except ExportError as exc:
        raise SubmitError(f"invalid recipe: export: {exc}") from None


class JobService:
    def __init__(self, settings: Settings | None = None, celery_app=None):
        self.settings = settings or Settings.from_env()
        self.settings.ensure_dirs()
        self.sessions = connect(self.settings.database_url)
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
        check_export: bool = True,
    ) -> tuple[dict, list[dict]]:
        """The recipe and evaluations as stored, validated (and preflighted against the model's config,
        and against the serving forms its ``export`` asks for); raises :class:`SubmitError`. ``confine``:
        a web or API submission, whose server-side paths must lie in :meth:`Settings.readable_roots`
        (checked before anything reads them). ``check_export=False`` skips the serving forms' check
        (about half a second: it reads the tokenizer) for the cells of a grid whose model and forms
        were checked once."""
        from core.pipeline.preflight import preflight
        from core.spec.errors import validation_message
        from core.spec.evaluation import job_evaluation
        from core.spec.recipe import Recipe

        try:
            if isinstance(recipe, (str, Path)) and Path(recipe).suffix in (".yaml", ".yml", ".json"):
                if confine:
                    raise SubmitError("a web submission passes the recipe itself, not a server-side file")
                parsed = Recipe.load(recipe)
            else:
                data = Recipe.parse_yaml(recipe) if isinstance(recipe, str) else recipe
                if confine and isinstance(data, dict):
                    self._check_paths(data, evaluations)
                parsed = Recipe.model_validate(data)
        except ValidationError as exc:
            raise SubmitError(f"invalid recipe: {validation_message(exc)}") from None
        except (ValueError, FileNotFoundError) as exc:
            raise SubmitError(f"invalid recipe: {exc}") from None
        try:
            evals = [job_evaluation(e) for e in evaluations or []]
            _check_tasks(parsed.model, evals)
        except ValidationError as exc:
            raise SubmitError(f"invalid evaluation: {validation_message(exc)}") from None
        except (ValueError, FileNotFoundError) as exc:
            raise SubmitError(f"invalid evaluation: {exc}") from None
        try:  # what the model's config can tell before anything is queued (evaluation lengths included)
            preflight(parsed, [int(e["seq_len"]) for e in evals if e.get("seq_len") is not None])
        except ValueError as exc:
            raise SubmitError(f"invalid recipe: {exc}") from None
        if check_export:
            _check_export(parsed.model, parsed.export)
        return parsed.model_dump(mode="json", exclude_none=True), evals

    def _check_paths(self, recipe: dict, evaluations: list[dict] | None) -> None:
        """Every server-side path a recipe or evaluation names lies inside a readable root."""
        from core.spec.recipe import NAMED_DATASETS

        calibration = recipe.get("calibration") if isinstance(recipe.get("calibration"), dict) else {}
        named = [("model", recipe.get("model")), ("calibration.dataset", calibration.get("dataset"))]
        named += [("evaluation dataset", e.get("dataset")) for e in evaluations or [] if isinstance(e, dict)]
        named += [("task_dir", e.get("task_dir")) for e in evaluations or [] if isinstance(e, dict)]
        roots = self.settings.readable_roots()
        for field, value in named:
            if not isinstance(value, str) or value in NAMED_DATASETS:
                continue
            path = Path(value).expanduser()
            local = value.startswith((".", "/", "~")) or value.count("/") > 1 or path.exists()
            if field != "model" or local:  # a model may be a hub id; a dataset that is not named is a file
                resolved = path.resolve()
                if not any(resolved == r or r in resolved.parents for r in roots):
                    raise SubmitError(
                        f"{field} {value!r} is outside the folders this server reads from; upload the file, "
                        "or ask the administrator to add its folder to LIAR_DATA_ROOTS"
                    )

    def submit(
        self,
        recipe: dict | str | Path,
        submitted_by: str | None = None,
        group_id: str | None = None,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        note: str | None = None,
        check_export: bool = True,
    ) -> int:
        """Validate and queue one job; ``confine``, ``check_export``: see :meth:`validate`; ``note``:
        said in the job's first log line beside who submitted it (``re-run of job 3``)."""
        data, evals = self.validate(recipe, evaluations, confine, check_export)
        with self.sessions.begin() as s:
            job = Job(
                recipe=data,
                evaluations=evals,
                submitted_by=submitted_by,
                group_id=group_id,
                status=Status.QUEUED.value,
                stage="queued",
            )
            s.add(job)
            s.flush()
            job_id = job.id
            said = f"submitted by {submitted_by or 'anonymous'}" + (f" ({note})" if note else "")
            s.add(JobLog(job_id=job_id, message=said))
        try:
            self._send(job_id)
        except Exception as exc:
            with self.sessions.begin() as s:
                s.delete(s.get(Job, job_id))
            url = self.settings.broker_url
            # the broker's URL may carry its password: the message reaches users (the web app, the API)
            reason = scrub(str(exc), url) or "no reason given"
            broker = redact_url(url)
            raise RuntimeError(f"could not queue the job: the broker at {broker} did not take it ({reason})") from exc
        return job_id

    def _send(self, job_id: int) -> None:
        result = self.celery.send_task("liar.run_job", args=[job_id])
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
    ) -> tuple[str, list[int]]:
        """One job per cell of ratios × methods × criteria (axes left out take the recipe's value),
        sharing a group id; the cells are those of a sweep grid (``core.spec.sweep.expand_grid``).
        All cells are validated before any job is created."""
        from core.spec.sweep import GridError, expand_grid

        base, evals = self.validate(recipe, evaluations, confine)
        if base.get("target") is not None:  # a speed target: no ratio axis, one job per method × criterion
            if ratios:
                raise SubmitError("a speed-target recipe has no ratio to sweep: sweep methods or criteria")
            recipes = [self.validate(r, evals, check_export=False)[0] for r in _target_cells(base, methods, criteria)]
            group = uuid.uuid4().hex[:12]
            return group, [self.submit(r, submitted_by, group, evals, check_export=False) for r in recipes]
        axes: dict[str, Any] = {}
        if ratios:
            axes["ratio"] = list(ratios)
        if methods:
            axes["reconstruction"] = list(methods)
        if criteria:  # another criterion name keeps the recipe's criterion options
            axes["criterion"] = [{"name": name, "options": base["criterion"]["options"]} for name in criteria]
        try:
            cells = expand_grid(base, axes)
        except GridError as exc:
            raise SubmitError(f"invalid recipe: {'; '.join(exc.problems)}") from None
        # every cell has the base's model and serving forms, checked above
        recipes = [self.validate(cell.recipe, evals, check_export=False)[0] for cell in cells]
        group = uuid.uuid4().hex[:12]
        return group, [self.submit(r, submitted_by, group, evals, check_export=False) for r in recipes]

    # --- queries --------------------------------------------------------------------------
    def list(
        self, status: str | None = None, group_id: str | None = None, submitted_by: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        self.reap()
        q = select(*_LISTED).order_by(Job.id.desc()).limit(limit)
        if status:
            q = q.where(Job.status == status.upper())
        if group_id:
            q = q.where(Job.group_id == group_id)
        if submitted_by:
            q = q.where(Job.submitted_by == submitted_by)
        with self.sessions() as s:
            return [self._summary(row) for row in s.execute(q)]

    def show(self, job_id: int) -> dict[str, Any]:
        self.reap()
        with self.sessions() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise KeyError(f"no job {job_id}")
            out = self._summary(job)
            out.update(
                recipe=job.recipe,
                recipe_as_run=job.recipe_as_run,
                evaluations=job.evaluations,
                error=job.error,
                traceback=job.traceback,
                metrics={m.name: m.value for m in job.metrics},
                report=job.report,
                artifacts=[
                    {"kind": a.kind, "name": a.name, "path": a.path, "size": a.size, "sha256": a.sha256}
                    for a in job.artifacts
                ],
                timings=job.timings,
                log=[{"at": lg.at.isoformat(), "level": lg.level, "message": lg.message} for lg in job.logs],
            )
            return out

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
            "worker": job.worker,
            "attempts": job.attempts,
            "created_at": iso(job.created_at),
            "started_at": iso(job.started_at),
            "finished_at": iso(job.finished_at),
            "elapsed_s": (end - job.started_at).total_seconds() if job.started_at and end else None,
        }

    def metrics(self, job_ids: list[int]) -> dict[int, dict[str, float]]:
        """Metrics of many jobs in one query: {job id: {name: value}}."""
        out: dict[int, dict[str, float]] = {i: {} for i in job_ids}
        with self.sessions() as s:
            rows = s.execute(select(Metric.job_id, Metric.name, Metric.value).where(Metric.job_id.in_(job_ids)))
            for job_id, name, value in rows:  # plain rows: no ORM object per metric
                out[job_id][name] = value
        return out

    def artifact(self, job_id: int, kind: str = "checkpoint") -> Path:
        """The path of the job's first artifact of ``kind`` ("checkpoint", or "archive" for old jobs)."""
        with self.sessions() as s:
            row = s.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind == kind)).first()
        if row is None:
            raise KeyError(f"job {job_id} has no {kind}")
        return Path(row.path)

    # --- downloads (see jobs.artifacts) -----------------------------------------------------
    def served(self, job_id: int) -> list[Served]:
        """The files a job offers for download, in the order written: each checkpoint file, or the
        ``.tar.gz`` of a job finished before per-file artifacts (its file name as its name)."""
        with self.sessions() as s:
            if s.get(Job, job_id) is None:
                raise KeyError(f"no job {job_id}")
            rows = s.scalars(
                select(Artifact)
                .where(Artifact.job_id == job_id, Artifact.kind.in_(("file", "archive")))
                .order_by(Artifact.id)
            ).all()
        return [Served(r.name or Path(r.path).name, Path(r.path), r.size, r.sha256, r.kind) for r in rows]

    def downloads(self, job_id: int) -> list[dict[str, Any]]:
        """:meth:`served` as plain values: name, size, sha256, kind."""
        return [{"name": f.name, "size": f.size, "sha256": f.sha256, "kind": f.kind} for f in self.served(job_id)]

    def file(self, job_id: int, name: str) -> Served:
        """One file the job offers, by name, its path checked to lie in the job's folder: ``ValueError``
        for a name that is no plain relative path (``../x``), ``KeyError`` for one the job does not
        have, ``PermissionError`` for a recorded path outside the folder."""
        check_name(name)
        match = next((f for f in self.served(job_id) if f.name == name), None)
        if match is None:
            raise KeyError(f"job {job_id} has no file {name!r}")
        return self._confined(job_id, match)

    def _confined(self, job_id: int, f: Served) -> Served:
        try:
            path = confined(f.path, job_dir(self.settings.artifacts_dir, job_id))
        except FileNotFoundError:
            raise KeyError(f"the file {f.name!r} of job {job_id} is no longer on the server") from None
        return Served(f.name, path, f.size, f.sha256, f.kind)

    def checkpoint_tar(self, job_id: int) -> TarStream:
        """The job's checkpoint files as one uncompressed tar under ``liar-job-N/``, produced while it is
        read; ``KeyError`` if the job has none (not finished, or an old job: see :meth:`served`)."""
        files = [self._confined(job_id, f) for f in self.served(job_id) if f.kind == "file"]
        if not files:
            raise KeyError(f"job {job_id} has no checkpoint files (is the job finished?)")
        return TarStream(files, f"liar-job-{job_id}")

    # --- control --------------------------------------------------------------------------
    def cancel(self, job_id: int) -> str:
        """QUEUED → CANCELLED at once; RUNNING → cancel flag, honoured at the next layer boundary."""
        with self.sessions.begin() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise KeyError(f"no job {job_id}")
            if Status(job.status).finished:
                return job.status
            job.cancel_requested = True
            if job.status == Status.QUEUED.value:
                job.status, job.finished_at, job.stage = Status.CANCELLED.value, utcnow(), "cancelled"
            s.add(JobLog(job_id=job_id, message="cancel requested"))
            status, celery_id = job.status, job.celery_id
        if status == Status.CANCELLED.value and celery_id:
            try:  # the worker would skip it anyway (claim fails); revoking saves it the trip
                self.celery.control.revoke(celery_id)
            except Exception:
                pass
        return status

    def force_cancel(self, job_id: int) -> None:
        """Fallback when a running job does not stop: terminate its worker process."""
        with self.sessions() as s:
            job = s.get(Job, job_id)
        if job and job.celery_id:
            self.celery.control.revoke(job.celery_id, terminate=True, signal="SIGKILL")
        with self.sessions.begin() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == Status.RUNNING.value)
                .values(status=Status.CANCELLED.value, finished_at=utcnow(), error="terminated")
            )

    def queued_in_broker(self) -> set[int] | None:
        """Job ids of the messages waiting in the broker queue (None if the broker cannot be read)."""
        import ast
        import json

        try:
            if self.settings.broker_url.startswith("filesystem://"):
                raw = [p.read_text() for p in (self.settings.broker_dir / "queue").glob("*.msg")]
            elif self.settings.broker_url.startswith(("redis://", "rediss://")):
                import redis

                client = redis.Redis.from_url(self.settings.broker_url)
                raw = client.lrange("liar", 0, -1)
                client.close()
            else:
                return None
            ids = set()
            for item in raw:
                headers = json.loads(item).get("headers", {})
                args = ast.literal_eval(headers.get("argsrepr", "()"))
                if headers.get("task") == "liar.run_job" and args:
                    ids.add(int(args[0]))
            return ids
        except Exception:
            return None

    def resend_lost(self, older_than: float = 10.0) -> list[int]:
        """Re-send QUEUED jobs that have no message in the broker (e.g. Redis restarted without
        persistence), with a line in each one's log. A duplicate message is harmless: only one run
        can claim a job."""
        in_broker = self.queued_in_broker()
        if in_broker is None:
            return []
        cutoff = utcnow() - dt.timedelta(seconds=older_than)
        with self.sessions() as s:
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
        written is no checkpoint. Rows another reaper holds are skipped (no double re-queue)."""
        now = utcnow()
        stale = now - dt.timedelta(seconds=self.settings.lease_seconds)
        touched, resend, ended = [], [], []
        lost = select(Job).where(Job.status == Status.RUNNING.value, Job.heartbeat_at < stale)
        with self.sessions.begin() as s:
            for job in s.scalars(lost.with_for_update(skip_locked=True)):
                touched.append(job.id)
                reason = f"worker {job.worker} lost (no heartbeat for {self.settings.lease_seconds:.0f} s)"
                if job.cancel_requested:
                    job.status, job.finished_at, job.error = Status.CANCELLED.value, now, reason
                    ended.append(job.id)
                elif job.attempts < self.settings.max_attempts:
                    job.status, job.stage, job.heartbeat_at = Status.QUEUED.value, "requeued", None
                    s.add(JobLog(job_id=job.id, level="WARNING", message=f"{reason}; re-queued"))
                    resend.append(job.id)
                else:
                    job.status, job.finished_at, job.error = Status.FAILED.value, now, reason
                    s.add(JobLog(job_id=job.id, level="ERROR", message=f"{reason}; giving up"))
                    ended.append(job.id)
        for job_id in ended:
            shutil.rmtree(job_dir(self.settings.artifacts_dir, job_id), ignore_errors=True)
        for job_id in resend:
            self._send(job_id)
        return touched


def _target_cells(base: dict[str, Any], methods: list[str] | None, criteria: list[str] | None) -> list[dict]:
    """The recipes of a speed-target sweep: ``base`` with each method × criterion."""
    cells = []
    for method in methods or [None]:
        for name in criteria or [None]:
            cell = dict(base)
            if method is not None:
                cell["reconstruction"] = {**base.get("reconstruction", {}), "method": method}
            if name is not None:
                cell["criterion"] = {"name": name, "options": base.get("criterion", {}).get("options", {})}
            cells.append(cell)
    return cells
