"""What a New-run form will do, shown before it is submitted: the Advanced section's title (its
current choices) and the engine's estimate of the run (``core.pipeline.estimate``) above Submit."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from app.web.forms import NO_EVALUATION, RECIPE_FIELDS, build_recipe, evaluations_for, parse_amount
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
    class (``LIAR_WORKER_CLASS``), at the GEMM rate its workers reported at their start
    (:func:`reported_rate`), as one line above Submit; empty while the form cannot make a recipe
    (Validate says why), or names a job's checkpoint or a folder this server may not read. A sweep is
    estimated at its first ratio."""
    found = _estimate(service, form)
    if isinstance(found, str):
        return found
    result, amount, queue = found
    if not result.ok:
        return f"Estimate: {result.error}"
    first = (
        f" (for ratio {amount[0]:g}, the first of {len(amount)})"
        if isinstance(amount, list) and len(amount) > 1
        else ""
    )
    line = f"Estimate{first}: {result.summary()}" + (f" (queue {queue})" if queue else "")
    return line + (f" — ⚠ {result.fit_note}" if result.fits is False and result.fit_note else "")


def estimate_seconds(service: JobService, form) -> float | None:
    """The estimated seconds of the form's job (None where :func:`estimate_line` shows none)."""
    found = _estimate(service, form)
    return None if isinstance(found, str) or not found[0].ok else found[0].seconds


def _estimate(service: JobService, form):
    """(the estimate, the ratio box's amount, the queue) of the form's run, or the line to show instead."""
    from core.pipeline.estimate import estimate

    *fields, evaluate, _tasks, _task_dir, methods = form
    values = dict(zip(RECIPE_FIELDS, fields, strict=True))
    try:
        amount = parse_amount(values["ratio"])
        recipe = build_recipe(**values)
        evaluations = evaluations_for(evaluate, recipe["calibration"]["max_seq_length"])
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
    return estimate(recipe, worker, evaluations=evaluations), amount, queue


# how often the web process asks the workers for their GEMM rates (one broadcast, ASK_SECONDS long); a
# worker still probing is asked again sooner. The filesystem broker (the default, no server) polls its
# folders once a second on each side, so its answers take up to two: asked for 0.5 s, no worker was
# ever heard there, and the estimate fell back to timing this process's own CPU
ASK_EVERY, ASK_AGAIN, ASK_SECONDS, ASK_SECONDS_POLLED = 60.0, 5.0, 0.5, 2.5
_asked: dict[str, tuple[float, dict[str, Any]]] = {}  # broker URL → (when, the workers' answers)


def reported_rate(service: JobService, queue: str | None = None) -> float | None:
    """The float32 GEMM rate (FLOP/s) the CPU workers (of ``queue``, when given) reported at their
    start (``jobs.workerinfo``); None when none has."""
    from jobs.health import BrokerDown, ask_workers
    from jobs.workerinfo import COMMAND, gemm_rate_of

    url, now = service.settings.broker_url, time.monotonic()
    at, answers = _asked.get(url, (-math.inf, {}))
    again = ASK_AGAIN if any((a.get("device") or {}).get("kind") == "probing" for a in answers.values()) else ASK_EVERY
    if now - at > again:
        try:
            polled = url.startswith("filesystem://")
            answers = ask_workers(service.celery, COMMAND, ASK_SECONDS_POLLED if polled else ASK_SECONDS)
        except BrokerDown:
            answers = {}
        _asked[url] = (now, answers)
    return gemm_rate_of(answers, queue)


def _worker_for(service: JobService, recipe: dict[str, Any]):
    """(the worker class to estimate on, the queue's name or None): the queue routing would pick, or
    the server's one worker class; a CPU class at its workers' reported GEMM rate. Raises SubmitError
    when no queue has the memory."""
    from core.pipeline.estimate import worker_class
    from jobs import routing

    queues = service.settings.queues
    if not queues:
        name = service.settings.worker_class
        rate = reported_rate(service) if name == "cpu" else None
        return (worker_class(name, gemm_rate=rate) if rate else name), None
    name, _ = routing.route(queues, recipe)
    queue = next(q for q in queues if q.name == name)
    rate = reported_rate(service, name) if queue.klass == "cpu" else None
    return routing.queue_worker(queue, gemm_rate=rate), name
