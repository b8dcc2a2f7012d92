"""Export after the fact: a finished job's checkpoint written in a serving form by a job of its own.

A recipe's ``export`` writes serving forms while the job runs; a team often knows only later which
engine it will serve with. An export-only job takes a SUCCEEDED job's kept checkpoint and writes the
forms asked for, nothing pruned. Its stored recipe is ``{model: job:N, export_only: true, export:
[forms]}``: ``model: job:N`` is the same reference a prune of that checkpoint uses (``jobs.references``:
resolved to the checkpoint on the worker, fetched from the store when it is elsewhere), so queueing,
fenced attempts, heartbeats, cancel, the log, re-run and delete work as for any job. It goes to the
queue its source ran on.

Its files are its own: ``artifacts/job-M/attempt-K/export/`` holds one GGUF file per GGUF form
(``liar-job-N-<quant>.gguf``, written by ``core.serving.write_form`` as a recipe's export is), the
importance matrix its quantized forms were weighted by (``imatrix.gguf``: gathered once, here rather
than in the source's checkpoint, whose listed files other jobs read), the vLLM form's ``vllm/``
folder, a short model card (each file's held-out perplexity where the source evaluated one:
``jobs.export_quality``) and a ``SHA256SUMS``; they are rows of kind ``file`` beside a row of kind
``export`` (not ``checkpoint``: an export is no checkpoint to prune or evaluate again), so the Model
page and the API list and serve them, with their sha256, exactly as a checkpoint's.

Which forms a checkpoint can take is the exporter's own decision (``core.serving``: the family, the
rotary scaling and the tokenizer for GGUF, through llama.cpp's architectures; vLLM's DeciLM form
states one query-head count for every layer), asked of the checkpoint's small files before anything
is queued (:func:`choices`, :func:`problem`), and asked again by the worker with its own engines before
anything is written (a quantized GGUF needs llama.cpp's quantizer there). A form that cannot be
written is refused in one sentence, saying why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from core.spec.recipe import GGUF_FORMATS
from jobs.access import OPEN, Actor, Forbidden, NotNow, public_text, require_owner
from jobs.artifacts import checkpoint_files, job_dir, publish, remove_earlier_attempts
from jobs.db import Artifact, Job, Status, retry_on_disconnect
from jobs.export_quality import (
    EVAL_WINDOWS,
    REFERENCE_BYTES,
    REFERENCE_PERPLEXITY,
    Quality,
    Source,
    form_rows,
    read_source,
)
from jobs.exporting import ExportRefused
from jobs.fencing import add_metrics, fenced, job_log, mark_succeeded
from jobs.references import job_reference, local_checkpoint
from jobs.submission import SubmitError
from jobs.timings import StageClock

EXPORT_ONLY = "export_only"  # the stored recipe's mark
KIND = "export"  # the artifact row of an export job's folder
FOLDER = "export"
# the forms, in the order the page offers them (core.serving.FORMATS; torch-free names here)
GGUF_QUANT = GGUF_FORMATS
LABELS = {**{f: f"GGUF {quant} (llama.cpp)" for f, quant in GGUF_QUANT.items()}, "vllm": "vLLM (DeciLM form)"}
UNFINISHED = (Status.QUEUED.value, Status.RUNNING.value)


def is_export(recipe: object) -> bool:
    """Whether a stored recipe is an export-only job's."""
    return isinstance(recipe, dict) and recipe.get(EXPORT_ONLY) is True


def problem(checkpoint: Path, form: str, engines: bool = False) -> str | None:
    """Why the checkpoint folder cannot be written as ``form`` (one sentence), or None: the
    exporter's own checks (``core.serving.preflight``, and for vLLM the query heads per layer), read
    from its config, tokenizer and weight headers; ``engines``: also that this machine has the
    engine a quantized GGUF needs (the worker's check). Where the weights are not on this host (a
    remote store: the web host fetches a checkpoint's small files only), a GGUF form is checked from
    the config and the tokenizer, and the worker checks the rest before writing."""
    from core.models.config_file import read_config
    from core.models.safetensors_io import CheckpointError, CheckpointReader
    from core.serving import ExportError, preflight
    from core.serving.gguf_export import plan
    from core.serving.gguf_vocab import read_vocab
    from core.serving.vllm_form import vllm_layers

    try:
        if form in GGUF_QUANT and not engines:
            try:
                CheckpointReader(checkpoint)
            except CheckpointError:  # no weights here: what the config and the tokenizer tell
                config = plan(checkpoint).config
                try:
                    read_vocab(checkpoint, int(config.get("vocab_size") or 0))
                except ValueError as exc:
                    raise ExportError(f"cannot write the tokenizer into the GGUF: {exc}") from None
                return None
        preflight(checkpoint, [form], engines=engines)
        if form == "vllm":
            vllm_layers(read_config(checkpoint))
    except (ExportError, ValueError, OSError) as exc:
        return public_text(str(exc))
    return None


@dataclass(frozen=True)
class Choice:
    """One serving form as the Model page offers it."""

    form: str
    label: str
    problem: str | None  # why it cannot be written; None: it can
    done_by: int | None = None  # the export job that has written it, or is writing it
    in_checkpoint: bool = False  # the job's own recipe wrote it into the checkpoint

    @property
    def offered(self) -> bool:
        return self.problem is None and self.done_by is None and not self.in_checkpoint


def _source(session, service, job_id: int, actor: Actor) -> tuple[Job, Path]:
    """The job whose checkpoint is exported and that checkpoint on this host (its small files);
    refusals in one sentence (``KeyError``, ``Forbidden``, :class:`NotNow`)."""
    job = session.get(Job, job_id)
    if job is None:
        raise KeyError(f"no job {job_id}")
    if service.settings.downloads == "owners":  # the rule of a download, and of model: job:N
        require_owner(actor, job_id, job.submitted_by, "export")
    if is_export(job.recipe):
        raise NotNow(f"job {job_id} is an export of {job.recipe['model']}: export that job's checkpoint instead")
    if job.status != Status.SUCCEEDED.value:
        raise NotNow(f"job {job_id} is {job.status}: only a finished job's checkpoint can be exported")
    kinds = set(session.scalars(select(Artifact.kind).where(Artifact.job_id == job_id)))
    checkpoint = local_checkpoint(session, service.settings.store(), job_id, weights=False)
    if "checkpoint" not in kinds:
        raise NotNow(f"job {job_id} wrote no checkpoint of its own: export the job whose checkpoint it used")
    if checkpoint is None:
        raise NotNow(f"job {job_id}'s checkpoint is no longer on the server")
    return job, checkpoint


def export_jobs(session, job_id: int) -> list[Job]:
    """The export-only jobs of job ``job_id``'s checkpoint, oldest first."""
    named = Job.recipe["model"].as_string() == f"job:{job_id}"
    return [j for j in session.scalars(select(Job).where(named).order_by(Job.id)) if is_export(j.recipe)]


def _done_by(session, job_id: int) -> dict[str, int]:
    """Each form an export job of ``job_id`` has written (and still has) or is writing → that job."""
    done: dict[str, int] = {}
    for j in export_jobs(session, job_id):
        has_files = session.scalar(select(Artifact.id).where(Artifact.job_id == j.id, Artifact.kind == KIND))
        if j.status in UNFINISHED or (j.status == Status.SUCCEEDED.value and has_files is not None):
            done.update({form: j.id for form in j.recipe.get("export") or []})
    return done


def choices(service, job_id: int, actor: Actor = OPEN) -> list[Choice]:
    """Every serving form for job ``job_id``'s checkpoint: possible or not (and why), already written
    into it by its recipe, or exported by a job (:class:`Choice`); refusals as :func:`submit`'s."""
    with service.sessions() as s:
        job, checkpoint = _source(s, service, job_id, actor)
        done = _done_by(s, job_id)
        own = set((job.recipe_as_run or job.recipe).get("export") or [])
    gguf = problem(checkpoint, "gguf-f16")  # the same checks for every GGUF type here (no engines)
    why = {form: gguf if form in GGUF_QUANT else problem(checkpoint, form) for form in LABELS}
    return [Choice(form, label, why[form], done.get(form), form in own) for form, label in LABELS.items()]


def check_forms(forms: object) -> list[str]:
    """The forms asked for, known and without repeats; :class:`SubmitError` in one sentence."""
    if isinstance(forms, str):
        forms = [f.strip() for f in forms.split(",") if f.strip()]
    if not isinstance(forms, (list, tuple)) or not forms:
        raise SubmitError(f"name a serving form to export: {', '.join(LABELS)}")
    unknown = [f for f in forms if f not in LABELS]
    if unknown:
        raise SubmitError(f"unknown serving form {unknown[0]!r}: the forms are {', '.join(LABELS)}")
    return list(dict.fromkeys(forms))


def submit(
    service, job_id: int, forms: object, actor: Actor = OPEN, submitted_by: str | None = None, note: str | None = None
) -> int:
    """Queue an export-only job writing ``forms`` from job ``job_id``'s checkpoint, as a job of
    ``submitted_by`` (default: the actor's account); its id. Refused in one sentence, nothing created:
    an unknown job (``KeyError``), who may not download it (``Forbidden``), a job without a finished
    checkpoint (:class:`NotNow`), a form that is unknown, impossible (the exporter's reason), written
    into the checkpoint already or exported by another job (:class:`SubmitError`)."""
    forms = check_forms(forms)
    by = submitted_by or actor.name
    for choice in choices(service, job_id, actor):
        if choice.form not in forms:
            continue
        if choice.problem is not None:
            raise SubmitError(f"{choice.form} cannot be written from job {job_id}'s checkpoint: {choice.problem}")
        if choice.in_checkpoint:
            raise SubmitError(f"job {job_id}'s checkpoint already has {choice.form}: it is among its files")
        if choice.done_by is not None:
            raise SubmitError(f"job {choice.done_by} already exports job {job_id}'s checkpoint as {choice.form}")

    def build(s):
        source = s.get(Job, job_id)
        if source is None:  # deleted meanwhile
            raise KeyError(f"no job {job_id}")
        recipe = {"model": f"job:{job_id}", EXPORT_ONLY: True, "export": forms}
        job = Job(recipe=recipe, evaluations=[], submitted_by=by, status=Status.QUEUED.value)
        job.queue = source.queue  # where its source ran
        said = f"export of job {job_id}'s checkpoint as {', '.join(forms)}; no pruning"
        return job, "; ".join(x for x in (note, said) if x)

    return service._queue(build)


def listing(service, job_id: int, actor: Actor = OPEN) -> list[dict[str, Any]]:
    """The export jobs of job ``job_id``'s checkpoint, oldest first: id, status, forms, who, error,
    and their files (name, size, sha256, kind; ``None`` where ``actor`` may not download them)."""
    with service.sessions() as s:
        jobs = [
            {
                "id": j.id,
                "status": j.status,
                "forms": list(j.recipe.get("export") or []),
                "by": j.submitted_by,
                "error": public_text(j.error) if j.error else None,
            }  # fmt: skip
            for j in export_jobs(s, job_id)
        ]
    for j in jobs:
        try:
            j["files"] = service.downloads(j["id"], actor) if j["status"] == Status.SUCCEEDED.value else []
        except (Forbidden, KeyError):
            j["files"] = None
    return jobs


# --- on the worker -------------------------------------------------------------------------------


def _write(checkpoint: Path, folder: Path, form: str, source: int, matrices, log: Callable[[str], None]):
    """One form from ``checkpoint`` into ``folder`` (``core.serving.write_form``, the writer a recipe's
    ``export`` uses), its quantized forms weighted by ``matrices``; its ``core.serving.Written``."""
    from core.serving import write_form

    quant = GGUF_QUANT.get(form)
    out = folder / "vllm" if form == "vllm" else folder / f"liar-job-{source}-{quant}.gguf"
    return write_form(checkpoint, form, out, threads=len(os.sched_getaffinity(0)), log=log, matrices=matrices)


def _card(folder: Path, source: int, forms: list[str], quality: Quality) -> None:
    """A short model card: what the files are, how much each loses where it was measured, and the
    command that serves each (``core.serving.card``)."""
    from core.serving.card import IMATRIX, list_forms

    text = (
        f"# Job {source}'s checkpoint for serving\n\nExported after the fact as {', '.join(forms)}; the "
        f"weights are those of job {source}'s checkpoint, nothing pruned again. `sha256sum -c SHA256SUMS` "
        "checks a download.\n"
    )
    if (folder / IMATRIX).is_file():
        text += (
            f"\nThe quantized files were weighted by `{IMATRIX}`, the importance matrix of job {source}'s "
            f"calibration text: `llama-quantize --imatrix {IMATRIX}` quantizes the checkpoint to another type.\n"
        )
    m = quality.metrics
    rows = [(form, row["bytes"], row["perplexity"]) for form, row in form_rows(m).items() if "perplexity" in row]
    if rows:
        if REFERENCE_PERPLEXITY in m:
            rows.insert(0, (f"job {source}'s checkpoint (torch)", m[REFERENCE_BYTES], m[REFERENCE_PERPLEXITY]))
        text += f"\n## Held-out perplexity (llama.cpp, {m[EVAL_WINDOWS]:.0f} windows)\n\n| form | MiB | perplexity |\n"
        text += "|---|---:|---:|\n" + "".join(f"| {f} | {b / 2**20:,.1f} | {p:.4g} |\n" for f, b, p in rows)
    (folder / "README.md").write_text(text)
    list_forms(folder)


def _write_all(
    sf, job_id: int, token: int, checkpoint: Path, folder: Path, forms: list[str], source: Source, progress: Callable
) -> Quality:
    """Every form written into ``folder`` and scored (:class:`jobs.export_quality.Quality`); the
    quantized forms share one importance matrix, gathered into ``folder`` (the checkpoint is the source
    job's, its files listed with their sha256: nothing is added to it) and shipped as one of the
    export's files."""
    from core.serving import ExportError, Matrices, verify_checkpoint
    from core.serving.card import IMATRIX
    from core.serving.engines import EngineError

    def log(form: str) -> Callable[[str], None]:
        return lambda line: job_log(sf, job_id, token, f"export {form}: {line}")

    matrices = Matrices(checkpoint, text=source.calibration, folder=folder, hint=None)
    quality = Quality(sf, job_id, token, source, checkpoint, threads=len(os.sched_getaffinity(0)))
    try:
        verify_checkpoint(checkpoint)
        _matrix_first(matrices, forms, source.id)
        quality.prepare()
        for i, form in enumerate(forms):
            progress("export", i, len(forms))
            written = _write(checkpoint, folder, form, source.id, matrices, log(form))
            job_log(sf, job_id, token, f"export {form}: {written.path.name} ({written.size / 2**20:,.1f} MiB)")
            quality.score(written)
    except (ExportError, EngineError) as exc:
        raise ExportRefused(f"export of job {source.id}'s checkpoint failed: {exc}") from None
    if matrices.gathered is not None:
        job_log(sf, job_id, token, f"{IMATRIX}: the importance matrix the quantized files were made with")
    return quality


def _matrix_first(matrices, forms: list[str], source: int) -> None:
    """The importance matrix gathered before any file is written where a form cannot go without one (an
    i-quant); :class:`ExportRefused` in one sentence where it cannot be."""
    from core.serving import ExportError
    from core.serving.imatrix import NEEDS_IMATRIX

    needs = [f for f in forms if GGUF_QUANT.get(f) in NEEDS_IMATRIX]
    if not needs:
        return
    try:
        matrices.resolve(GGUF_QUANT[needs[0]])
    except ExportError as exc:
        raise ExportRefused(
            f"export {needs[0]} refused before anything was written: it needs an importance matrix, gathered "
            f"over job {source}'s calibration text, and {exc}"
        ) from None


def run(
    sf,
    job_id: int,
    token: int,
    worker: str,
    recipe: dict,
    out_dir: Path,
    progress: Callable,
    clock: StageClock,
    settings,
) -> bool:
    """Attempt ``token`` at export-only job ``job_id`` (``jobs.tasks``, in place of the prune): every
    form checked with this worker's engines before anything is written (:class:`ExportRefused`, one
    sentence), then written into ``out_dir/export`` (:func:`_write_all`: each GGUF file scored where
    the source job evaluated perplexity), hashed, sent to the store and recorded; False if a cancel
    arrived meanwhile. ``recipe["model"]`` is the source's checkpoint on this host."""
    checkpoint, forms = Path(recipe["model"]), list(recipe["export"])
    with sf() as s:
        source = read_source(s, job_reference(s.get(Job, job_id).recipe["model"]), settings)
    said = f"job {source.id}'s checkpoint as {', '.join(forms)}, no pruning"
    job_log(sf, job_id, token, f"started on {worker}: {said}")
    for form in forms:
        why = problem(checkpoint, form, engines=True)
        if why is not None:
            raise ExportRefused(f"export {form} refused before anything was written: {why}")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    folder = out_dir / FOLDER
    folder.mkdir(parents=True)
    quality = _write_all(sf, job_id, token, checkpoint, folder, forms, source, progress)
    progress("export", len(forms), len(forms))
    _card(folder, source.id, forms, quality)
    files, _ = checkpoint_files(folder)
    store = settings.store()
    key = publish(store, settings.data_dir, folder, files, lambda done, total: progress("upload", done, total))
    metrics = {"export_written": len(forms), **quality.metrics}
    if not retry_on_disconnect(lambda: _record(sf, job_id, token, key, files, metrics, clock)):
        return False
    if not store.in_place(settings.data_dir):  # this host's copy: the store has the files
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            job_dir(settings.artifacts_dir, job_id).rmdir()
    remove_earlier_attempts(store, settings.artifacts_dir, job_id, token)
    return True


def _record(sf, job_id: int, token: int, key: str, files: list, metrics: dict, clock: StageClock) -> bool:
    """Attempt ``token``'s success in one fenced transaction: the files' rows (the folder's, kind
    ``export``, then one per file), its metrics (the forms written, each file's row:
    ``jobs.export_quality``), and SUCCEEDED; False, writing nothing, if a cancel arrived meanwhile."""
    size = sum(f.size for f in files)
    with fenced(sf, job_id, token) as s:
        if s.scalar(select(Job.cancel_requested).where(Job.id == job_id)):
            return False
        add_metrics(s, job_id, {**metrics, "export_bytes": size})
        s.add(Artifact(job_id=job_id, kind=KIND, path=key, size=size, sha256=None))
        s.add_all(
            Artifact(job_id=job_id, kind="file", name=f.name, path=f"{key}/{f.name}", size=f.size, sha256=f.sha256)
            for f in files
        )
        mark_succeeded(s, job_id, clock)
    return True
