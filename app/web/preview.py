"""What a New-run form will do, shown before it is submitted: the Advanced section's title (its
current choices) and the engine's estimate of the run (``core.pipeline.estimate``) above Submit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.web.forms import NO_EVALUATION, RECIPE_FIELDS, build_recipe, parse_amount
from jobs.references import job_reference
from jobs.service import JobService, SubmitError


def advanced_title(values: dict[str, Any]) -> str:
    """The Advanced accordion's title: its current choices, so a glance shows what a run will do
    (``values``: the boxes of ``new_run.SUMMARY_FIELDS``)."""
    methods = values.get("methods") or []
    parts = [f"prune {values.get('modules')}", f"allocation {values.get('allocation')}"]
    parts.append(f"reconstruction {' + '.join(methods) if methods else '(none picked)'}")
    parts.append(f"damping {values.get('damp')}")
    parts.append(f"{values.get('samples')} samples × {values.get('seq_len')} tokens")
    evaluate, tasks = values.get("evaluate"), str(values.get("tasks") or "").strip()
    evaluations = [f"perplexity on {Path(str(evaluate)).name}"] if evaluate and evaluate != NO_EVALUATION else []
    evaluations += [f"lm-eval {tasks}"] if tasks else []
    parts.append(" and ".join(evaluations) if evaluations else "no evaluation")
    export = values.get("export") or []
    parts.append(f"serving files: {', '.join(export)}" if export else "no serving files")
    return "Advanced · " + " · ".join(parts)


def estimate_line(service: JobService, form) -> str:
    """The engine's estimate of the run the form describes (``core.pipeline.estimate``) on the queue
    the job would be routed to (``LIAR_QUEUES``, :mod:`jobs.routing`), or else on this server's worker
    class (``LIAR_WORKER_CLASS``), as one line above Submit; empty while the form
    cannot make a recipe (Validate says why), or names a job's checkpoint or a folder this server
    may not read. A sweep is estimated at its first ratio."""
    from core.pipeline.estimate import estimate

    *fields, _evaluate, _tasks, _task_dir, methods = form
    values = dict(zip(RECIPE_FIELDS, fields, strict=True))
    try:
        amount = parse_amount(values["ratio"])
        recipe = build_recipe(**values)
    except SubmitError:
        return ""
    recipe = service.names.recipe(recipe, service.names.path)  # models/NAME: the folder it names here
    model = recipe["model"]
    local = Path(model).expanduser()
    if job_reference(model) is not None or (local.exists() and not service.readable(str(local))):
        return ""
    if methods:
        recipe["reconstruction"]["method"] = methods[0]
    try:
        worker, queue = _worker_for(service, recipe)
    except SubmitError as exc:  # no queue has the memory: said before Submit
        return f"Estimate: ⚠ {exc}"
    result = estimate(recipe, worker)
    if not result.ok:
        return f"Estimate: {result.error}"
    first = (
        f" (for ratio {amount[0]:g}, the first of {len(amount)})"
        if isinstance(amount, list) and len(amount) > 1
        else ""
    )
    line = f"Estimate{first}: {result.summary()}" + (f" (queue {queue})" if queue else "")
    return line + (f" — ⚠ {result.fit_note}" if result.fits is False and result.fit_note else "")


def _worker_for(service: JobService, recipe: dict[str, Any]):
    """(the worker class to estimate on, the queue's name or None): the queue routing would pick, or
    the server's one worker class; raises SubmitError when no queue has the memory."""
    from jobs import routing

    queues = service.settings.queues
    if not queues:
        return service.settings.worker_class, None
    name, _ = routing.route(queues, recipe)
    return routing.queue_worker(next(q for q in queues if q.name == name)), name
