"""Writing an attempt's checkpoint on the worker: the serving forms checked before pruning, the
checkpoint saved into the attempt's folder, then each serving form written into it (``jobs.tasks``
calls these; the upload to the store follows, ``jobs.artifacts.publish``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.models.manifest import FileEntry
from jobs.access import public_message
from jobs.artifacts import checkpoint_files, is_no_space
from jobs.disk import DiskFull, check_free_space, no_space_message
from jobs.fencing import job_log


class ExportRefused(Exception):
    """The worker found, before pruning, that the model cannot be written in the serving forms asked
    for; the message says why, in one sentence."""


def check_export(model: str, forms: list[str], recipe: dict | None = None) -> None:
    """Before any pruning, ``core.serving.preflight`` on this worker: the submission checked a local
    folder on the machine that took it, but a quantized form needs llama.cpp *here*, and a hub model is
    first seen here (downloaded now, as the streamed prune would, into the same cache). Given the job's
    ``recipe``, also that the checkpoint it prunes can be written in the forms. A model whose files cannot
    be had (the prune will say why) is left to the prune. Raises :class:`ExportRefused`."""
    from core.serving import ExportError, preflight_model
    from core.spec.recipe import Recipe

    try:
        parsed = None if recipe is None else Recipe.model_validate(recipe)
    except ValueError:  # (a pydantic ValidationError) the prune says what is wrong with the recipe
        parsed = None
    try:
        preflight_model(model, forms, recipe=parsed)
    except ExportError as exc:
        raise ExportRefused(f"export {', '.join(forms)} refused before pruning: {exc}") from None


def export(
    sf,
    job_id: int,
    token: int,
    result,
    out_dir: Path,
    forms: list[str],
    progress: Callable,
    metrics: dict[str, Any],
    names=None,
) -> tuple[Path, list[FileEntry]]:
    """Save the checkpoint into ``out_dir`` (the attempt's folder, emptied before pruning), its files
    naming the server's models and texts as users do (``names``, ``jobs.names``: ``config.json``'s
    ``_name_or_path``, the model card's ``base_model``, ``recipe.yaml``, ``metrics.json``), then write
    the serving ``forms`` into it (:func:`serving_files`); returns it and its files (from its
    SHA256SUMS, the serving files included). Running out of disk space or quota while saving raises
    :class:`DiskFull`, naming the job's folder (the caller removes ``out_dir``)."""
    folder = out_dir.parent
    try:
        check_free_space(result, folder)
        checkpoint = result.save(out_dir / "checkpoint")
        if names is not None:
            names.checkpoint(checkpoint)
    except DiskFull:
        raise
    except Exception as exc:
        if not is_no_space(exc):
            raise
        raise DiskFull(no_space_message(exc, folder)) from exc
    if forms:
        text = calibration_file(result.recipe.calibration.dataset)
        serving_files(sf, job_id, token, checkpoint, forms, progress, metrics, text)
    try:
        files, hashed = checkpoint_files(checkpoint)
    except Exception as exc:
        if not is_no_space(exc):
            raise
        raise DiskFull(no_space_message(exc, folder)) from exc
    if hashed:
        job_log(sf, job_id, token, f"{checkpoint} had no SHA256SUMS: its files were hashed after writing", "WARNING")
    return checkpoint, files


def calibration_file(dataset: str | None) -> str | None:
    """The calibration text's file on this host, where the recipe (as the worker resolved it) names
    one: the importance matrix is gathered over it. The checkpoint's ``recipe.yaml`` names the file as
    users do (``texts/NAME``, ``jobs.names``), which no folder here is called."""
    return dataset if dataset and Path(dataset).is_absolute() and Path(dataset).is_file() else None


def serving_files(
    sf,
    job_id: int,
    token: int,
    checkpoint: Path,
    forms: list[str],
    progress: Callable,
    metrics: dict[str, Any],
    text: str | None = None,
) -> None:
    """Write each serving form into the saved checkpoint (``core.serving.write_form``: inside it, listed in
    its SHA256SUMS and model card), one step of the ``export`` stage each (step 0 saved the
    checkpoint). A form that fails costs neither the checkpoint nor the job: a WARNING line names the
    form and the reason, and the metrics count the forms written (``export_written``) and failed
    (``export_failed``). The quantized forms share one importance matrix, gathered by the first that
    wants it (``core.serving.Matrices``) over the calibration text (``text``: that file on this host)."""
    from core.serving import Matrices, verify_checkpoint, write_form

    written = failed = 0
    matrices = Matrices(checkpoint, text=text, hint=None)
    for i, form in enumerate(forms, start=1):
        progress("export", i, 1 + len(forms))
        try:
            verify_checkpoint(checkpoint)  # each form checks the weights; hashed once (core.serving.card)
            path = write_form(
                checkpoint,
                form,
                threads=len(os.sched_getaffinity(0)),
                log=lambda line, form=form: job_log(sf, job_id, token, f"export {form}: {line}"),
                matrices=matrices,
            ).path
        except Exception as exc:  # ExportError, llama.cpp's EngineError, a full disk: the prune stands
            failed += 1
            reason = public_message(exc)
            job_log(sf, job_id, token, f"export {form} failed; the checkpoint is kept: {reason}", "WARNING")
        else:
            written += 1
            job_log(sf, job_id, token, f"export {form}: {path.name} ({path.stat().st_size / 2**20:,.1f} MiB)")
    metrics.update(export_written=written, export_failed=failed)
