"""The pruning task: a thin shell over ``core.pipeline.sequential.prune`` that keeps the job row up to date."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import socket
import tarfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import update

from jobs.celery_app import app
from jobs.db import Artifact, Job, JobLog, Metric, Status, connect, utcnow
from jobs.settings import Settings


class JobCancelled(Exception):
    """Raised from the progress callback when the job's cancel flag is set."""


TRANSIENT = (ConnectionError, TimeoutError)  # e.g. the hub or a network file system hiccups


def _settings() -> Settings:
    return app.conf.liar_settings


def _log(session_factory, job_id: int, message: str, level: str = "INFO") -> None:
    with session_factory.begin() as s:
        s.add(JobLog(job_id=job_id, message=message, level=level))


def _claim(session_factory, job_id: int, worker: str) -> bool:
    """Atomically move the job QUEUED → RUNNING; False if someone else has it or it was cancelled."""
    with session_factory.begin() as s:
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == Status.QUEUED.value)
            .values(
                status=Status.RUNNING.value,
                worker=worker,
                started_at=utcnow(),
                heartbeat_at=utcnow(),
                attempts=Job.attempts + 1,
                stage="starting",
                error=None,
                traceback=None,
            )
        )
        return res.rowcount == 1


class _Heartbeat(threading.Thread):
    def __init__(self, session_factory, job_id: int, every: float):
        super().__init__(daemon=True, name=f"heartbeat-{job_id}")
        self.sf, self.job_id, self.every, self.stop = session_factory, job_id, every, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                with self.sf.begin() as s:
                    s.execute(update(Job).where(Job.id == self.job_id).values(heartbeat_at=utcnow()))
            except Exception:  # a missed beat is not fatal; the lease tolerates several
                pass


def _archive(checkpoint: Path, dest: Path) -> tuple[int, str]:
    """Write ``dest`` (.tar.gz of the checkpoint) atomically; returns (size, sha256)."""
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(checkpoint, arcname=checkpoint.name)
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    os.replace(tmp, dest)
    return dest.stat().st_size, digest.hexdigest()


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Exported(NamedTuple):
    """What :func:`_export` wrote: the checkpoint directory and its archive."""

    checkpoint: Path
    archive: Path
    size: int
    sha256: str

    def artifacts(self, job_id: int) -> list[Artifact]:
        return [
            Artifact(
                job_id=job_id,
                kind="checkpoint",
                path=str(self.checkpoint),
                size=_dir_size(self.checkpoint),
                sha256=None,
            ),
            Artifact(job_id=job_id, kind="archive", path=str(self.archive), size=self.size, sha256=self.sha256),
        ]


def execute(job_id: int, settings: Settings | None = None) -> str:
    """Run one job to completion (used by the Celery task; callable directly for tests and debugging)."""
    settings = settings or _settings()
    sf = connect(settings.database_url)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if not _claim(sf, job_id, worker):
        return "skipped"
    beat = _Heartbeat(sf, job_id, max(settings.lease_seconds / 6, 0.5))
    beat.start()
    progress = _progress_callback(sf, job_id)
    out_dir = settings.artifacts_dir / f"job-{job_id}"
    result = None
    try:
        recipe, evaluations = _load_job(sf, job_id)
        _log(sf, job_id, f"started on {worker}")
        result = _prune(recipe, progress)
        _run_evaluations(result, evaluations, progress)
        metrics = result.summary()
        progress("export", 0, 1)
        exported = _export(result, out_dir, job_id)
        _record_success(sf, job_id, result, metrics, exported)
        _log(sf, job_id, "succeeded")
        return Status.SUCCEEDED.value
    except JobCancelled:
        shutil.rmtree(out_dir, ignore_errors=True)
        _finish(sf, job_id, Status.CANCELLED, "cancelled by request")
        return Status.CANCELLED.value
    except TRANSIENT as exc:
        _requeue_or_fail(sf, job_id, settings, f"transient error: {type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        shutil.rmtree(out_dir, ignore_errors=True)
        _finish(sf, job_id, Status.FAILED, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        return Status.FAILED.value
    finally:
        beat.stop.set()
        del result
        gc.collect()
        _empty_cuda_cache()


def _progress_callback(sf, job_id: int) -> Callable[[str, int, int], None]:
    """The ``progress`` hook handed to ``prune``: records stage and layer on the job row (throttled to
    one write per 0.5 s, except per reconstructed layer and at "done") and raises :class:`JobCancelled`
    once the job's cancel flag is set."""
    last = 0.0

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        values: dict[str, Any] = {"stage": stage, "heartbeat_at": utcnow()}
        if stage == "reconstruct":
            values.update(layer=done, n_layers=total, progress=done / max(total, 1))
        if stage == "reconstruct" or now - last > 0.5 or stage == "done":
            last = now
            with sf.begin() as s:
                s.execute(update(Job).where(Job.id == job_id).values(**values))
                cancel = s.get(Job, job_id).cancel_requested
            if cancel:
                raise JobCancelled

    return progress


def _load_job(sf, job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's stored recipe and evaluations."""
    with sf() as s:
        job = s.get(Job, job_id)
        return job.recipe, list(job.evaluations or [])


def _prune(recipe: dict[str, Any], progress: Callable[[str, int, int], None]):
    """Run ``core.pipeline.sequential.prune`` on the recipe, reporting through ``progress``; the
    dense model's prefill speed is measured first and the pruned model's after, on this worker, and
    stored with the metrics (``prefill_tok_s_dense``, ``prefill_tok_s``, ``prefill_speedup``)."""
    from transformers.utils import logging as hf_logging

    # imported in the child only (see jobs.celery_app)
    from core.evaluation.speed import prefill_tokens_per_second
    from core.models.loading import load_model
    from core.pipeline.sequential import prune

    hf_logging.disable_progress_bar()
    progress("load", 0, 1)
    model, tokenizer, _ = load_model(recipe["model"], recipe.get("dtype", "auto"), recipe.get("device", "auto"))
    dense = prefill_tokens_per_second(model)
    result = prune(recipe, model=model, tokenizer=tokenizer, progress=progress)
    pruned = prefill_tokens_per_second(result.model)
    result.metrics.update(
        prefill_tok_s_dense=round(dense, 1), prefill_tok_s=round(pruned, 1), prefill_speedup=round(pruned / dense, 4)
    )
    return result


def _run_evaluations(result, evaluations: list[dict[str, Any]], progress: Callable[[str, int, int], None]) -> None:
    """Run each stored evaluation on the pruned model, adding its numbers to ``result.metrics``."""
    for ev in evaluations:
        progress("evaluate", 0, 1)
        result.metrics.update(_evaluate(result, ev))


def _export(result, out_dir: Path, job_id: int) -> _Exported:
    """Save the checkpoint into a fresh ``out_dir`` and archive it next to it."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    checkpoint = result.save(out_dir / "checkpoint")
    archive = out_dir / f"liar-job-{job_id}.tar.gz"
    size, sha = _archive(checkpoint, archive)
    return _Exported(checkpoint, archive, size, sha)


def _record_success(sf, job_id: int, result, metrics: dict[str, Any], exported: _Exported) -> None:
    """Store metrics, artifacts and the layer report and mark the job SUCCEEDED, in one transaction;
    raises :class:`JobCancelled` (storing nothing) if a cancel arrived meanwhile."""
    with sf.begin() as s:
        job = s.get(Job, job_id)
        if job.cancel_requested:
            raise JobCancelled
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                s.add(Metric(job_id=job_id, name=name, value=float(value)))
        for artifact in exported.artifacts(job_id):
            s.add(artifact)
        job.report = result.layer_rows()
        job.status, job.stage, job.progress, job.finished_at = Status.SUCCEEDED.value, "done", 1.0, utcnow()


def _empty_cuda_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _evaluate(result, ev: dict[str, Any]) -> dict[str, float]:
    """One stored evaluation, validated at submission (``core.spec.evaluation.JobEvaluation``)."""
    kind = ev.get("type")
    if kind == "perplexity":
        from core.evaluation.perplexity import perplexity

        out = perplexity(
            result.model,
            result.tokenizer,
            ev["dataset"],
            seq_len=int(ev.get("seq_len", 512)),
            batch_size=int(ev.get("batch_size", 4)),  # absent from jobs stored before it was accepted
            max_windows=ev.get("max_windows"),
        )
        return {"perplexity": out["perplexity"], "eval_tokens": out["tokens"]}
    raise ValueError(f"unknown evaluation type {kind!r}")


def _finish(sf, job_id: int, status: Status, error: str | None, tb: str | None = None) -> None:
    with sf.begin() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=status.value, finished_at=utcnow(), error=error, traceback=tb)
        )
        s.add(
            JobLog(
                job_id=job_id,
                level="ERROR" if status == Status.FAILED else "INFO",
                message=f"{status.value.lower()}: {error}",
            )
        )


def _requeue_or_fail(sf, job_id: int, settings: Settings, reason: str) -> None:
    with sf.begin() as s:
        job = s.get(Job, job_id)
        if job.attempts < settings.max_attempts:
            job.status, job.stage = Status.QUEUED.value, "requeued"
            s.add(JobLog(job_id=job_id, level="WARNING", message=f"{reason}; will retry"))
        else:
            job.status, job.finished_at, job.error = Status.FAILED.value, utcnow(), reason
            s.add(JobLog(job_id=job_id, level="ERROR", message=f"failed after {job.attempts} attempts: {reason}"))


@app.task(name="liar.run_job", bind=True, autoretry_for=TRANSIENT, retry_backoff=10, max_retries=2)
def run_job(self, job_id: int) -> str:
    return execute(job_id)
