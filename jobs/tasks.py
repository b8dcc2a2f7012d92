"""The pruning task: a thin shell over ``core.pipeline.sequential.prune`` that keeps the job row up to date."""

from __future__ import annotations

import errno
import gc
import logging
import os
import shutil
import socket
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import update

from core.models.manifest import FileEntry
from jobs import baseline
from jobs.artifacts import checkpoint_files, is_no_space, job_dir, no_space_errno
from jobs.celery_app import app
from jobs.db import Artifact, Job, JobLog, Metric, Status, connect, retry_on_disconnect, utcnow
from jobs.settings import Settings
from jobs.timings import Event, StageClock

logger = logging.getLogger(__name__)


class JobCancelled(Exception):
    """Raised from the progress callback when the job's cancel flag is set."""


TRANSIENT = (ConnectionError, TimeoutError)  # e.g. the hub or a network file system hiccups


def _settings() -> Settings:
    return app.conf.liar_settings


def _log(session_factory, job_id: int, message: str, level: str = "INFO") -> None:
    def write() -> None:
        with session_factory.begin() as s:
            s.add(JobLog(job_id=job_id, message=message, level=level))

    retry_on_disconnect(write)


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
                timings=None,
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


class DiskFull(Exception):
    """The export ran out of disk space or quota; the message names the folder, in one sentence."""


class ExportRefused(Exception):
    """The worker found, before pruning, that the model cannot be written in the serving forms asked
    for; the message says why, in one sentence."""


def _artifacts(job_id: int, checkpoint: Path, files: list[FileEntry]) -> list[Artifact]:
    """The rows of an exported checkpoint: the directory, then one per file (sizes and sha256 from
    its ``SHA256SUMS``; see ``jobs.artifacts``)."""
    rows = [
        Artifact(job_id=job_id, kind="checkpoint", path=str(checkpoint), size=sum(f.size for f in files), sha256=None)
    ]
    rows += [
        Artifact(job_id=job_id, kind="file", name=f.name, path=str(checkpoint / f.name), size=f.size, sha256=f.sha256)
        for f in files
    ]
    return rows


def execute(job_id: int, settings: Settings | None = None) -> str:
    """Run one job to completion (used by the Celery task; callable directly for tests and debugging)."""
    settings = settings or _settings()
    sf = connect(settings.database_url)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if not _claim(sf, job_id, worker):
        return "skipped"
    beat = _Heartbeat(sf, job_id, max(settings.lease_seconds / 6, 0.5))
    beat.start()
    clock = StageClock()
    progress = _progress_callback(sf, job_id, clock, dict(settings.stage_pause))
    out_dir = job_dir(settings.artifacts_dir, job_id)
    result = None
    try:
        progress("starting", 0, 1)  # until "load": reading the job, importing the engine
        recipe, evaluations = retry_on_disconnect(partial(_load_job, sf, job_id))
        _log(sf, job_id, f"started on {worker}")
        _fresh_dir(out_dir)
        forms = list(recipe.get("export") or [])
        _check_export(recipe["model"], forms)  # on this worker (its llama.cpp), a hub model once downloaded
        result = _prune(recipe, progress, out_dir / "checkpoint")
        _run_evaluations(sf, job_id, recipe, result, evaluations, progress)
        metrics = result.summary()
        progress("export", 0, 1 + len(forms))
        checkpoint, files = _export(sf, job_id, result, out_dir, forms, progress, metrics)
        progress("export", 1 + len(forms), 1 + len(forms))
        artifacts = _artifacts(job_id, checkpoint, files)
        retry_on_disconnect(partial(_record_success, sf, job_id, result, metrics, artifacts, clock))
        _log(sf, job_id, "succeeded")
        return Status.SUCCEEDED.value
    except JobCancelled:
        shutil.rmtree(out_dir, ignore_errors=True)
        retry_on_disconnect(partial(_finish, sf, job_id, Status.CANCELLED, "cancelled by request", clock=clock))
        return Status.CANCELLED.value
    except TRANSIENT as exc:
        _requeue_or_fail(sf, job_id, settings, f"transient error: {type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(exc, (DiskFull, ExportRefused)):
            error = str(exc)
        elif is_no_space(exc):  # while the engine wrote (a streamed run writes its shards as it goes)
            filename = getattr(exc, "filename", None)
            error = _no_space_message(exc, Path(filename).parent if filename else out_dir)
        else:
            error = f"{type(exc).__name__}: {exc}"
        retry_on_disconnect(partial(_finish, sf, job_id, Status.FAILED, error, traceback.format_exc(), clock=clock))
        return Status.FAILED.value
    finally:
        beat.stop.set()
        del result
        gc.collect()
        _empty_cuda_cache()


def _progress_callback(
    sf, job_id: int, clock: StageClock, pause: dict[str, float] | None = None
) -> Callable[[str, int, int], None]:
    """The ``progress`` hook handed to ``prune``: records the stage, its progress (``done / total``) and
    the layer on the job row (throttled to one write per 0.5 s, except per reconstructed layer and
    whenever a stage begins or a stage or step ends; the engine's closing "done" leaves the stage as it
    is: evaluation and export follow), times the stages (``clock``: the job's ``timings`` and one log
    line per finished stage, DEBUG per layer), and raises :class:`JobCancelled` once the job's cancel
    flag is set. ``pause``: seconds to wait at the start of each step of a stage
    (``Settings.stage_pause``, for the fault tests)."""
    last, shown = 0.0, None

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal last, shown
        now = time.monotonic()
        events = clock.update(stage, done, total)
        values: dict[str, Any] = {"heartbeat_at": utcnow()}
        if stage != "done":
            values.update(stage=stage, progress=done / max(total, 1))
        if stage == "reconstruct":
            values.update(layer=done, n_layers=total)
        if events:
            values["timings"] = clock.snapshot()
        wait = pause.get(stage, 0.0) if pause and done < total else 0.0
        if events or stage != shown or stage == "reconstruct" or now - last > 0.5 or wait:
            last, shown = now, stage
            if retry_on_disconnect(partial(_write_progress, sf, job_id, values, events)):
                raise JobCancelled
        if wait:
            time.sleep(wait)

    return progress


def _write_progress(sf, job_id: int, values: dict[str, Any], events: list[Event]) -> bool:
    """Store a progress update and the events it finished; whether the job's cancel flag is set."""
    with sf.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))
        _add_events(s, job_id, events)
        return s.get(Job, job_id).cancel_requested


def _add_events(session, job_id: int, events: list[Event]) -> None:
    """The clock's finished stages and steps as job log lines (and in the worker's log)."""
    for ev in events:
        session.add(JobLog(job_id=job_id, level=ev.level, message=ev.message))
        logger.log(logging.getLevelName(ev.level), "job %d: %s", job_id, ev.message)


def _load_job(sf, job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's stored recipe and evaluations."""
    with sf() as s:
        job = s.get(Job, job_id)
        return job.recipe, list(job.evaluations or [])


def _fresh_dir(out_dir: Path) -> None:
    """An empty job folder (a previous attempt's leftovers removed)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)


def _prune(recipe: dict[str, Any], progress: Callable[[str, int, int], None], checkpoint: Path):
    """Run ``core.pipeline.sequential.prune`` on the recipe, reporting through ``progress``.

    A model read from disk or the hub is streamed (one block at a time; its shards are written under
    ``checkpoint``'s temporary sibling as they are pruned), so the worker never holds the whole model;
    every block is timed before and after pruning on one calibration batch (``block_speedup``). A
    model pruned in memory (a criterion that needs whole-model gradients) also gets its end-to-end
    prefill speed before and after (stage ``speed``: ``prefill_tok_s_dense``, ``prefill_tok_s``,
    ``prefill_speedup``)."""
    from transformers.utils import logging as hf_logging

    # imported in the child only (see jobs.celery_app)
    from core.kernels import cpu_matmul
    from core.pipeline.preflight import as_recipe
    from core.pipeline.sequential import execution_mode, prune
    from core.process import configure_engine

    hf_logging.disable_progress_bar()
    configure_engine()  # as the liar command does (core/process.py); the choice goes into the metrics
    mode, _ = execution_mode(as_recipe(recipe), None, checkpoint)
    if mode == "stream":
        result = prune(recipe, progress=progress, output_dir=checkpoint, measure_speed=True)
    else:
        result = _prune_in_memory(recipe, progress)
    result.metrics.update(cpu_matmul.decision().metrics())
    return result


def _prune_in_memory(recipe: dict[str, Any], progress: Callable[[str, int, int], None]):
    """The model loaded whole, with its end-to-end prefill speed measured before and after pruning."""
    from core.evaluation.speed import prefill_tokens_per_second
    from core.models.loading import load_model
    from core.pipeline.sequential import prune

    progress("load", 0, 1)
    model, tokenizer, _ = load_model(recipe["model"], recipe.get("dtype", "auto"), recipe.get("device", "auto"))
    progress("load", 1, 1)
    progress("speed", 0, 1)
    dense = prefill_tokens_per_second(model)
    progress("speed", 1, 1)
    result = prune(recipe, model=model, tokenizer=tokenizer, progress=progress, measure_speed=True)
    progress("speed", 0, 1)
    pruned = prefill_tokens_per_second(result.model)
    progress("speed", 1, 1)
    result.metrics.update(
        prefill_tok_s_dense=round(dense, 1), prefill_tok_s=round(pruned, 1), prefill_speedup=round(pruned / dense, 4)
    )
    return result


def _run_evaluations(
    sf, job_id: int, recipe: dict[str, Any], result, evaluations: list[dict[str, Any]], progress: Callable
) -> None:
    """Run each stored evaluation on the pruned model, adding its numbers to ``result.metrics``
    (stage ``evaluate``, one step per evaluation), and the dense model's perplexity beside them
    (``jobs.baseline``: copied from the job that measured it, else measured in one more step)."""
    last = baseline.last_perplexity(evaluations)
    dense = baseline.known(sf, recipe, last) if last is not None else None
    steps = len(evaluations) + int(last is not None and dense is None)
    for i, ev in enumerate(evaluations):
        progress("evaluate", i, steps)
        result.metrics.update(_evaluate(result, ev))
    if last is not None and dense is None:
        progress("evaluate", len(evaluations), steps)
        try:
            dense = baseline.measure(result, last), job_id
        except Exception as exc:  # the pruned model's numbers stand without it
            _log(sf, job_id, f"no dense baseline perplexity: {type(exc).__name__}: {exc}", "WARNING")
    if dense is not None:
        result.metrics[baseline.DENSE] = dense[0]
        source = "measured" if dense[1] == job_id else f"from job {dense[1]}"
        _log(sf, job_id, f"dense model perplexity {dense[0]:.4g} ({source})")
    if evaluations:
        progress("evaluate", steps, steps)


def _check_export(model: str, forms: list[str]) -> None:
    """Before any pruning, ``core.serving.preflight`` on this worker: the submission checked a local
    folder on the machine that took it, but a quantized form needs llama.cpp *here*, and a hub model is
    first seen here (downloaded now, as the streamed prune would, into the same cache). A model whose
    files cannot be had (the prune will say why) is left to the prune. Raises :class:`ExportRefused`."""
    from core.serving import ExportError, preflight_model

    try:
        preflight_model(model, forms)
    except ExportError as exc:
        raise ExportRefused(f"export {', '.join(forms)} refused before pruning: {exc}") from None


def _export(
    sf, job_id: int, result, out_dir: Path, forms: list[str], progress: Callable, metrics: dict[str, Any]
) -> tuple[Path, list[FileEntry]]:
    """Save the checkpoint into ``out_dir`` (emptied before pruning), then write the serving ``forms``
    into it (:func:`_serving_files`); returns it and its files (from its SHA256SUMS, the serving files
    included). Running out of disk space or quota while saving raises :class:`DiskFull` (the caller
    removes ``out_dir``)."""
    try:
        _check_free_space(result, out_dir)
        checkpoint = result.save(out_dir / "checkpoint")
    except DiskFull:
        raise
    except Exception as exc:
        if not is_no_space(exc):
            raise
        raise DiskFull(_no_space_message(exc, out_dir)) from exc
    if forms:
        _serving_files(sf, job_id, checkpoint, forms, progress, metrics)
    try:
        files, hashed = checkpoint_files(checkpoint)
    except Exception as exc:
        if not is_no_space(exc):
            raise
        raise DiskFull(_no_space_message(exc, out_dir)) from exc
    if hashed:
        _log(sf, job_id, f"{checkpoint} had no SHA256SUMS: its files were hashed after writing", "WARNING")
    return checkpoint, files


def _serving_files(
    sf, job_id: int, checkpoint: Path, forms: list[str], progress: Callable, metrics: dict[str, Any]
) -> None:
    """Write each serving form into the saved checkpoint (``core.serving.export``: inside it, listed in
    its SHA256SUMS and model card), one step of the ``export`` stage each (step 0 saved the
    checkpoint). A form that fails costs neither the checkpoint nor the job: a WARNING line names the
    form and the reason, and the metrics count the forms written (``export_written``) and failed
    (``export_failed``)."""
    from core.serving import export

    written = failed = 0
    for i, form in enumerate(forms, start=1):
        progress("export", i, 1 + len(forms))
        try:
            (path,) = export(checkpoint, [form], threads=len(os.sched_getaffinity(0)))
        except Exception as exc:  # ExportError, llama.cpp's EngineError, a full disk: the prune stands
            failed += 1
            reason = str(exc) or type(exc).__name__
            _log(sf, job_id, f"export {form} failed; the checkpoint is kept: {reason}", "WARNING")
        else:
            written += 1
            _log(sf, job_id, f"export {form}: {path.name} ({path.stat().st_size / 2**20:,.1f} MiB)")
    metrics.update(export_written=written, export_failed=failed)


def _no_space_message(exc: BaseException, directory: Path) -> str:
    """One sentence for a write that ran out of disk space or quota in ``directory``, or made a file
    larger than the worker's file-size limit (``ulimit -f``) or the file system allow."""
    code = no_space_errno(exc)
    if code == errno.EFBIG:
        return (
            f"file too large while writing the checkpoint to {directory} (past the worker's file-size limit, "
            "ulimit -f, or the file system's largest file); the partial output was removed (raise the limit, or "
            "point LIAR_DATA_DIR at another file system, and re-run the job)"
        )
    what = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
    return (
        f"{what} while writing the checkpoint to {directory}; the partial output was removed (free some "
        "space there, or point LIAR_DATA_DIR at a larger disk, and re-run the job)"
    )


def _check_free_space(result, out_dir: Path) -> None:
    """Refuse before writing when the disk has less room than the weights need."""
    model = getattr(result, "model", None)
    if model is None:
        return
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    free = shutil.disk_usage(out_dir).free
    if free < need:
        raise DiskFull(
            f"not enough disk space to write the checkpoint to {out_dir}: the weights need "
            f"{need / 1e9:.2f} GB and {free / 1e9:.2f} GB are free (free some space there, or point "
            "LIAR_DATA_DIR at a larger disk, and re-run the job)"
        )


def _record_success(
    sf, job_id: int, result, metrics: dict[str, Any], artifacts: list[Artifact], clock: StageClock
) -> None:
    """Store metrics, artifacts, timings and the layer report and mark the job SUCCEEDED, in one
    transaction; raises :class:`JobCancelled` (storing nothing) if a cancel arrived meanwhile."""
    with sf.begin() as s:
        job = s.get(Job, job_id)
        if job.cancel_requested:
            raise JobCancelled
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                s.add(Metric(job_id=job_id, name=name, value=float(value)))
        for artifact in artifacts:
            s.add(artifact)
        timings, events = clock.finish(stopped=False)
        _add_events(s, job_id, [*events, Event(f"total {timings['total']:.1f} s")])
        job.report, job.timings = result.layer_rows(), timings
        job.recipe_as_run = result.recipe.model_dump(mode="json")
        job.status, job.stage, job.progress, job.finished_at = Status.SUCCEEDED.value, "done", 1.0, utcnow()


def _empty_cuda_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _evaluate(result, ev: dict[str, Any]) -> dict[str, float]:
    """One stored evaluation (validated at submission, ``core.spec.evaluation``) of the pruned model,
    through ``core.evaluate`` (in memory, or block by block from a streamed run's checkpoint): a
    perplexity's ``perplexity`` and ``eval_tokens``, lm-eval's ``<task>.<metric>`` and their mean
    accuracy."""
    from core.evaluation.run import evaluate

    out = evaluate(result, ev)
    if ev.get("type") == "lm_eval":
        from core.evaluation.lmeval import task_metrics

        return task_metrics(out["summary"])
    return {"perplexity": out["perplexity"], "eval_tokens": out["tokens"]}


def _finish(
    sf, job_id: int, status: Status, error: str | None, tb: str | None = None, clock: StageClock | None = None
) -> None:
    """Mark the job finished without success; the timings so far (the stage it stopped in last) are kept."""
    values: dict[str, Any] = {"status": status.value, "finished_at": utcnow(), "error": error, "traceback": tb}
    events: list[Event] = []
    if clock is not None:
        values["timings"], events = clock.finish(stopped=True)
    with sf.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(**values))
        _add_events(s, job_id, events)
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
