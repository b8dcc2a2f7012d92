"""The pruning task: a thin shell over ``core.pipeline.sequential.prune`` that keeps the job row up to date.

Each run is one attempt at the job: it writes only while it owns the job (``jobs.fencing``), into a
folder of its own (``jobs.artifacts.attempt_dir``), and stops quietly once it does not."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import socket
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select

from core.models.manifest import FileEntry
from core.pipeline.checkpoint import StopRequested
from jobs import baseline, export_jobs, reevaluation, stopping
from jobs.access import public_error, public_message, public_text
from jobs.artifacts import (
    attempt_dir,
    attempt_key,
    is_no_space,
    job_dir,
    publish,
    remove_earlier_attempts,
    stored_key,
)
from jobs.celery_app import app
from jobs.checkpoints import RESUME
from jobs.db import Artifact, Job, JobLog, Status, connect, retry_on_disconnect, server_utcnow
from jobs.disk import DiskFull, no_space_message, short_of_disk
from jobs.engine import wait_for_engine
from jobs.exporting import ExportRefused, check_export, export
from jobs.fencing import (
    Heartbeat,
    Superseded,
    claim,
    finish,
    job_log,
    record_success,
    requeue_or_fail,
    write_progress,
)
from jobs.names import Names
from jobs.progress import Overall
from jobs.reevaluation import evaluation_name
from jobs.references import JobInputError, job_reference, owner_and_checkpoint, with_local_uploads
from jobs.settings import Settings
from jobs.timings import StageClock

logger = logging.getLogger(__name__)


class JobCancelled(Exception):
    """Raised from the progress callback when the job's cancel flag is set."""


TRANSIENT = (ConnectionError, TimeoutError)  # e.g. the hub or a network file system hiccups


def _settings() -> Settings:
    return app.conf.liar_settings


def _artifacts(job_id: int, key: str, files: list[FileEntry]) -> list[Artifact]:
    """The rows of an exported checkpoint, stored under ``key``: the directory, then one per file (sizes
    and sha256 from its ``SHA256SUMS``; see ``jobs.artifacts``)."""
    rows = [Artifact(job_id=job_id, kind="checkpoint", path=key, size=sum(f.size for f in files), sha256=None)]
    rows += [
        Artifact(job_id=job_id, kind="file", name=f.name, path=f"{key}/{f.name}", size=f.size, sha256=f.sha256)
        for f in files
    ]
    return rows


def execute(job_id: int, settings: Settings | None = None) -> str:
    """Run one job to completion (used by the Celery task; callable directly for tests and debugging):
    the status it ended the job in, "skipped" if it could not claim the job, or "superseded" if this
    attempt lost the job while it ran (``jobs.fencing``: it then stopped without writing more)."""
    settings = settings or _settings()
    sf = connect(settings.database_url)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    token = claim(sf, job_id, worker)
    if token is None:
        return "skipped"
    beat = Heartbeat(sf, job_id, token, max(settings.lease_seconds / 6, 0.5))
    beat.start()
    try:
        wait_for_engine()  # claimed and beating first: the row is RUNNING while a slow import ends
        return _attempt(sf, job_id, token, worker, settings, beat.refused)
    except Superseded as exc:  # raised by a fenced write, or by the progress callback for the heartbeat
        _stand_down(sf, job_id, token, settings, exc)
        return "superseded"
    finally:
        stopping.release()
        beat.stop.set()
        gc.collect()
        _empty_cuda_cache()


def _attempt(sf, job_id: int, token: int, worker: str, settings: Settings, refused: Callable[[], str | None]) -> str:
    """Attempt ``token`` at the job, written into its own folder (``jobs.artifacts.attempt_dir``);
    the status it ends the job in. Every write is fenced: :class:`Superseded` passes through."""
    clock = StageClock()
    progress = _progress_callback(sf, job_id, token, clock, dict(settings.stage_pause), refused)
    out_dir = attempt_dir(settings.artifacts_dir, job_id, token)
    result = saves = None
    try:
        progress("starting", 0, 1)  # until "load": reading the job, importing the engine
        if retry_on_disconnect(partial(reevaluation.source_of, sf, job_id)) is not None:
            return _reevaluate(sf, job_id, token, worker, progress, clock, settings)
        recipe, evaluations, named = retry_on_disconnect(partial(_load_job, sf, job_id, settings))
        if export_jobs.is_export(recipe):  # a finished job's checkpoint in serving forms, nothing pruned
            if not export_jobs.run(sf, job_id, token, worker, recipe, out_dir, progress, clock, settings):
                raise JobCancelled
            return Status.SUCCEEDED.value
        job_log(sf, job_id, token, f"started on {worker}")
        _fresh_dir(out_dir)
        forms = list(recipe.get("export") or [])
        check_export(recipe["model"], forms, recipe)  # on this worker (its llama.cpp), a hub model once downloaded
        saves = stopping.attempt_checkpoints(sf, job_id, token, settings, refused)
        result = _prune(recipe, progress, out_dir / "checkpoint", saves)
        names = Names(settings)
        _run_evaluations(sf, job_id, token, recipe, result, evaluations, progress, names)
        metrics = result.summary()
        progress("export", 0, 1 + len(forms))
        checkpoint, files = export(sf, job_id, token, result, out_dir, forms, progress, metrics, names)
        progress("export", 1 + len(forms), 1 + len(forms))
        store = settings.store()
        key = publish(store, settings.data_dir, checkpoint, files, partial(progress, "upload"))
        success = partial(record_success, sf, job_id, token, result, metrics, _artifacts(job_id, key, files), clock)
        if not retry_on_disconnect(partial(success, model=named)):
            raise JobCancelled
        if not store.in_place(settings.data_dir):
            _discard_local(settings, job_id, token)  # this host's copy: the store has the checkpoint
        remove_earlier_attempts(store, settings.artifacts_dir, job_id, token)
        if saves is not None:  # the job's checkpoint is its result now
            with contextlib.suppress(OSError):
                store.delete(saves.prefix)
        return Status.SUCCEEDED.value
    except Superseded:
        raise
    except StopRequested as exc:  # the worker is stopping: the checkpoint is saved, the job goes back
        _discard(settings, job_id, token, keep=RESUME)
        # requeued whatever the attempt count, and not counted: a polite stop is not the job's failure
        requeue_or_fail(sf, job_id, token, settings.max_attempts, f"worker {worker} stopping: {exc}", stopped=True)
        _send_again(settings, job_id)
        return Status.QUEUED.value
    except JobCancelled:
        _discard(settings, job_id, token)
        end = partial(finish, sf, job_id, token, Status.CANCELLED, _cancelled_by(sf, job_id), clock=clock)
        retry_on_disconnect(end)
        _clear_job_dir(settings, job_id, token)
        return Status.CANCELLED.value
    except TRANSIENT as exc:
        _discard(settings, job_id, token, keep=RESUME)  # the next attempt resumes from the checkpoint, if any
        reason = f"transient error: {type(exc).__name__}: {exc}"
        if requeue_or_fail(sf, job_id, token, settings.max_attempts, reason):
            _clear_job_dir(settings, job_id, token)
        raise
    except Exception as exc:
        _discard(settings, job_id, token)
        # what users read: one sentence, no server path or class name (jobs.access); the unexpected
        # ones carry an error id, under which the worker's log has the traceback
        if isinstance(exc, (DiskFull, ExportRefused, JobInputError)):
            error = public_text(str(exc))
        elif short_of_disk(exc):  # a streamed run's check before its first shard
            error = public_text(short_of_disk(exc))
        elif is_no_space(exc):  # while the engine wrote (a streamed run writes its shards as it goes)
            filename = getattr(exc, "filename", None)
            error = public_text(no_space_message(exc, Path(filename).parent if filename else out_dir.parent))
        else:
            error = public_error(exc, f"job {job_id}, attempt {token}")
        end = partial(finish, sf, job_id, token, Status.FAILED, error, traceback.format_exc(), clock=clock)
        retry_on_disconnect(end)
        _clear_job_dir(settings, job_id, token)
        return Status.FAILED.value
    finally:
        del result


def _reevaluate(sf, job_id: int, token: int, worker: str, progress: Callable, clock: StageClock, settings) -> str:
    """Attempt ``token`` at a re-evaluation (``jobs.reevaluation``): the evaluations again on its
    source job's checkpoint, nothing pruned and no folder written; its failures are :func:`_attempt`'s
    to end the job with, as a prune's are."""
    job_log(sf, job_id, token, f"started on {worker}")
    names = Names(settings)
    run_evaluations = partial(_run_evaluations, names=names)
    if not reevaluation.run(sf, job_id, token, progress, clock, run_evaluations, settings.store(), names):
        raise JobCancelled
    return Status.SUCCEEDED.value


def _discard_local(settings: Settings, job_id: int, token: int) -> None:
    """Attempt ``token``'s folder on this host removed, and the job's folder if that left it empty."""
    shutil.rmtree(attempt_dir(settings.artifacts_dir, job_id, token), ignore_errors=True)
    with contextlib.suppress(OSError):
        job_dir(settings.artifacts_dir, job_id).rmdir()


def _discard(settings: Settings, job_id: int, token: int, keep: str | None = None) -> None:
    """What attempt ``token`` wrote, removed: its folder on this host, and what it sent to the store;
    ``keep``: but that folder of it (its resume checkpoint, for the attempt that follows)."""
    folder = attempt_dir(settings.artifacts_dir, job_id, token)
    store = settings.store()
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        for child in folder.iterdir() if folder.is_dir() else ():
            if child.name != keep or not store.in_place(settings.data_dir):
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
    if not store.in_place(settings.data_dir):
        with contextlib.suppress(OSError):  # an unreachable store: objects no row lists, removed later
            for name in store.children(attempt_key(job_id, token)):
                if name != keep:
                    store.delete(f"{attempt_key(job_id, token)}/{name}")


def _send_again(settings: Settings, job_id: int) -> None:
    """The requeued job's message to the broker now (the maintenance thread re-sends it otherwise)."""
    from jobs.service import JobService

    with contextlib.suppress(Exception):
        JobService(settings)._send(job_id)


def _clear_job_dir(settings: Settings, job_id: int, token: int) -> None:
    """Once attempt ``token`` ended the job without success (its own folder already removed): the
    folders earlier attempts left removed too (nothing there is a checkpoint), then the job's folder
    if that left it empty."""
    remove_earlier_attempts(settings.store(), settings.artifacts_dir, job_id, token)
    with contextlib.suppress(OSError):
        job_dir(settings.artifacts_dir, job_id).rmdir()


def _stand_down(sf, job_id: int, token: int, settings: Settings, exc: Superseded) -> None:
    """What a superseded attempt does: nothing more in the database, one line in the worker's log,
    and its own folder removed — unless the job records that folder's checkpoint (a success whose
    commit was acknowledged only after the connection dropped: the retry found the job finished)."""
    own = attempt_key(job_id, token)
    try:
        with sf() as s:
            recorded = s.scalars(select(Artifact.path).where(Artifact.job_id == job_id, Artifact.kind == "checkpoint"))
            kept = any(stored_key(key).startswith(f"{own}/") for key in recorded)
    except Exception:  # the database cannot say: keep what may be the job's checkpoint
        kept = True
    if not kept:
        _discard(settings, job_id, token)
    folder = f"{'kept' if kept else 'removed'} its folder {attempt_dir(settings.artifacts_dir, job_id, token)}"
    logger.warning("job %d: attempt %d superseded (%s); stopped, writing nothing more; %s", job_id, token, exc, folder)


def _progress_callback(
    sf,
    job_id: int,
    token: int,
    clock: StageClock,
    pause: dict[str, float] | None,
    refused: Callable[[], str | None],
) -> Callable[[str, int, int], None]:
    """The ``progress`` hook handed to ``prune``: records the stage, the job's overall progress
    (``jobs.progress.Overall``: it never goes back) and the layer on the job row (throttled to one write
    per 0.5 s, except per reconstructed layer and whenever a stage begins or a stage or step ends; the
    engine's closing "done" leaves the stage as it is: evaluation and export follow), times the stages
    (``clock``: the job's ``timings`` and one log line per finished stage, DEBUG per layer), and raises
    :class:`JobCancelled` once the job's cancel flag is set. ``pause``: seconds to wait at the start of
    each step of a stage (``Settings.stage_pause``, for the fault tests). Its writes are attempt
    ``token``'s (fenced); it raises :class:`Superseded` once one is refused, or once ``refused()`` (the
    heartbeat thread's) says why a beat was. A write at a new stage or step stamps ``progress_at``, the
    watchdog's sign of life (``jobs.watchdog``)."""
    last, shown, at = 0.0, None, None
    overall = Overall()  # the row's progress: the whole job's, only ever forward (jobs.progress)

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal last, shown, at
        why = refused()
        if why is not None:
            raise Superseded(why)
        now = time.monotonic()
        events = clock.update(stage, done, total)
        values: dict[str, Any] = {}
        if stage != "done":
            values.update(stage=stage, progress=overall.update(stage, done, total))
        if stage == "reconstruct":
            values.update(layer=done, n_layers=total)
        if events:
            values["timings"] = clock.snapshot()
        wait = pause.get(stage, 0.0) if pause and done < total else 0.0
        if events or stage != shown or stage == "reconstruct" or now - last > 0.5 or wait:
            last, shown = now, stage
            if (stage, done) != at:
                at, values["progress_at"] = (stage, done), server_utcnow()
            if retry_on_disconnect(partial(write_progress, sf, job_id, token, values, events)):
                raise JobCancelled
        if wait:
            time.sleep(wait)

    return progress


def _load_job(sf, job_id: int, settings: Settings) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The job's stored recipe (a ``model: job:N`` resolved to that job's checkpoint folder, an
    ``upload:…`` calibration set to its file, both on this host: ``jobs.references``; the server's
    models and texts, ``models/NAME``, to this host's files: ``jobs.names``), its evaluations (named
    as stored: :func:`_run_evaluations` resolves them), and the model as the job names it."""
    store, names = settings.store(), Names(settings)
    with sf() as s:
        job = s.get(Job, job_id)
        recipe, named = names.recipe(dict(job.recipe), names.path), names.name(job.recipe["model"])
        reference = job_reference(named)
        try:
            if reference is not None:
                recipe["model"] = str(owner_and_checkpoint(s, reference, store)[1])
            recipe = with_local_uploads(recipe, store)
        except ValueError as exc:
            raise JobInputError(str(exc)) from None
        return recipe, list(job.evaluations or []), named


def _cancelled_by(sf, job_id: int) -> str:
    """``cancelled by alice`` from the job's log (``JobService.cancel`` says who asked), or
    ``cancelled by request``."""
    with sf() as s:
        line = s.scalar(
            select(JobLog.message)
            .where(JobLog.job_id == job_id, JobLog.message.like("cancel requested by %"))
            .order_by(JobLog.id.desc())
        )
    return f"cancelled by {line.removeprefix('cancel requested by ')}" if line else "cancelled by request"


def _fresh_dir(out_dir: Path) -> None:
    """An empty attempt folder (leftovers removed)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)


def _prune(recipe: dict[str, Any], progress: Callable[[str, int, int], None], checkpoint: Path, saves=None):
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
        result = prune(recipe, progress=progress, output_dir=checkpoint, measure_speed=True, checkpoints=saves)
    else:
        result = _prune_in_memory(recipe, progress, saves)
    result.metrics.update(cpu_matmul.decision().metrics())
    return result


PREFILL_REPEATS = 5  # timed prefills a side, each one forward over 4 × 128 tokens: a median and a spread


def _prune_in_memory(recipe: dict[str, Any], progress: Callable[[str, int, int], None], saves=None):
    """The model loaded whole, with its end-to-end prefill speed measured before and after pruning:
    ``PREFILL_REPEATS`` timed runs a side (the model is pruned in place, so the two sides cannot be
    interleaved), the speed-up's median and its conservative spread (``core.evaluation.speed``)."""
    from core.evaluation.speed import prefill_speedup, prefill_timing
    from core.models.loading import load_model
    from core.pipeline.sequential import prune

    progress("load", 0, 1)
    model, tokenizer, _ = load_model(recipe["model"], recipe.get("dtype", "auto"), recipe.get("device", "auto"))
    progress("load", 1, 1)
    progress("speed", 0, 1)
    dense = prefill_timing(model, repeats=PREFILL_REPEATS)
    progress("speed", 1, 1)
    result = prune(recipe, model=model, tokenizer=tokenizer, progress=progress, measure_speed=True, checkpoints=saves)
    progress("speed", 0, 1)
    pruned = prefill_timing(result.model, repeats=PREFILL_REPEATS)
    progress("speed", 1, 1)
    median, low, high = prefill_speedup(dense, pruned)
    result.metrics.update(
        prefill_tok_s_dense=round(dense.tokens_per_second, 1),
        prefill_tok_s=round(pruned.tokens_per_second, 1),
        prefill_speedup=round(median, 4),
        prefill_speedup_low=round(low, 4),
        prefill_speedup_high=round(high, 4),
        prefill_speedup_repeats=PREFILL_REPEATS,
    )
    return result


def _run_evaluations(
    sf,
    job_id: int,
    token: int,
    recipe: dict[str, Any],
    result,
    evaluations: list[dict[str, Any]],
    progress: Callable,
    names: Names | None = None,
) -> list[int]:
    """Run each stored evaluation on the pruned model, adding its numbers to ``result.metrics``
    (stage ``evaluate``, one step per evaluation), and the dense model's perplexity beside them
    (``jobs.baseline``: copied from the job that measured it, else measured in one more step). An
    evaluation that fails costs neither the pruned model nor the job: a WARNING line says which and
    why (with an error id), ``evaluations_failed`` counts them, the job's ``failed_evaluations``
    says which (what ``jobs.reevaluation`` runs again), and the job goes on to export. Returns
    their positions in ``evaluations``. ``names``: the server's (``jobs.names``), to read the texts
    the evaluations name and to look the dense perplexity up by the names jobs are stored with."""
    if names is not None:
        recipe, stored = names.recipe(recipe, names.name), names.evaluations(evaluations, names.name)
        evaluations = names.evaluations(evaluations, names.path)
    else:
        stored = evaluations
    last = baseline.last_perplexity(evaluations)
    dense = baseline.known(sf, recipe, baseline.last_perplexity(stored)) if last is not None else None
    steps = len(evaluations) + int(last is not None and dense is None)
    failed: list[int] = []
    for i, ev in enumerate(evaluations):
        progress("evaluate", i, steps)
        try:
            result.metrics.update(_evaluate(result, ev))
        except Exception as exc:  # a hub outage, a broken task file, memory: the prune stands
            failed.append(i)
            what = evaluation_name(i, ev)
            reason = public_error(exc, f"job {job_id}, {what}")
            job_log(sf, job_id, token, f"{what} failed; the checkpoint is kept: {reason}", "WARNING")
    if evaluations:
        result.metrics["evaluations_failed"] = len(failed)
        retry_on_disconnect(partial(write_progress, sf, job_id, token, {"failed_evaluations": failed}, []))
    if last is not None and dense is None:
        progress("evaluate", len(evaluations), steps)
        try:
            dense = baseline.measure(result, last), job_id
        except Exception as exc:  # the pruned model's numbers stand without it
            job_log(sf, job_id, token, f"no dense baseline perplexity: {public_message(exc)}", "WARNING")
    if dense is not None:
        result.metrics[baseline.DENSE] = dense[0]
        source = "measured" if dense[1] == job_id else f"from job {dense[1]}"
        job_log(sf, job_id, token, f"dense model perplexity {dense[0]:.4g} ({source})")
    if evaluations:
        progress("evaluate", steps, steps)
    return failed


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


@app.task(name="liar.run_job", bind=True, autoretry_for=TRANSIENT, retry_backoff=10, max_retries=2)
def run_job(self, job_id: int) -> str:
    return execute(job_id)


@app.task(name="liar.generate", ignore_result=False)
def generate(job_id: int, prompt: str, max_new_tokens: int) -> dict:
    """The Model page's prompt box, on this worker (``jobs.generation``)."""
    wait_for_engine()
    from jobs import generation

    return generation.answer(_settings(), job_id, prompt, max_new_tokens)
