"""Queues by memory: which worker queue a job goes to, decided at submission from the engine's estimate.

Without ``LIAR_QUEUES`` there is one queue, ``liar``, and nothing is routed: every worker takes every
job, as a single machine wants. A team with machines of different kinds declares its queues, each a
name, the worker class whose rates apply (``core.pipeline.estimate.WORKERS``) and the memory a run may
use there (a card's, or a CPU host's)::

    LIAR_QUEUES="cpu:cpu:64, a100-40g:a100-80gb:40, a100-80g:a100-80gb:80, h100-80g:h100-80gb:80"

and starts each worker on the queues it can serve (``liar worker --queues a100-80g --gpu 0``). A job
then goes to the smallest queue whose memory fits its estimated peak (``core.pipeline.estimate``: the
same figure the New-run page shows), so a CPU worker no longer takes a GPU job and a job that cannot
fit a worker is not downloaded there only to fail. A job that fits no queue is refused at submission,
in one sentence; one whose estimate cannot be made offline (a hub id not cached on the server) goes
to the largest queue, and its log says so (the worker checks again as it loads the model).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jobs.settings import Queue

DEFAULT_QUEUE = "liar"  # the one queue of an unrouted setup (jobs.celery_app.QUEUE)
# the cpu class measures its matrix-product rate on first use (importing torch); routing compares
# memory only, so a nominal rate keeps the web app's process torch-free
_NOMINAL_GEMM = 1e11


def queue_names(queues: tuple[Queue, ...]) -> tuple[str, ...]:
    """The broker queues jobs wait in: the routed ones, or the single default."""
    return tuple(q.name for q in queues) or (DEFAULT_QUEUE,)


def queue_worker(queue: Queue, gemm_rate: float | None = None):
    """The estimate's worker class for ``queue``, with the queue's memory (a CPU queue at ``gemm_rate``,
    what its workers reported, else a nominal rate)."""
    from core.pipeline.estimate import worker_class

    w = worker_class(queue.klass, gemm_rate=(gemm_rate or _NOMINAL_GEMM) if queue.klass == "cpu" else None)
    return dataclasses.replace(w, memory=queue.memory) if queue.memory is not None else w


def route(
    queues: tuple[Queue, ...], recipe: dict[str, Any], source: str | None = None
) -> tuple[str | None, str | None]:
    """The queue for a validated ``recipe`` and the line its job's log gets about it; ``(None, None)``
    without routed queues (the default queue, nothing said). The smallest queue (by memory) whose
    estimate fits; the largest where no queue's estimate can be made. Raises
    ``jobs.submission.SubmitError`` when estimates exist and none fits. ``source``: the queue of the
    job whose checkpoint the recipe prunes again (``model: job:N``, which no estimate reads), taken
    while it is still one of ``queues``."""
    if not queues:
        return None, None
    if source is not None and source in queue_names(queues):
        return source, f"queue {source}, where the job whose checkpoint it prunes ran"
    from core.pipeline.estimate import estimate, size

    sized = sorted(((q, queue_worker(q)) for q in queues), key=lambda qw: qw[1].memory)
    estimates = [(q, w, estimate(recipe, w)) for q, w in sized]
    made = [(q, w, e) for q, w, e in estimates if e.ok]
    if not made:
        q, _, e = estimates[-1]
        return q.name, f"queue {q.name}, the largest: {e.error}; the worker checks again as it loads the model"
    for q, w, e in made:
        if e.fits:
            return q.name, f"queue {q.name}: peak ≈ {size(e.peak_bytes)} of its {size(w.memory)}"
    raise _refusal(*made[-1])


def _refusal(queue: Queue, worker, est) -> Exception:
    """The one-sentence refusal of a job no queue fits, from the largest queue's estimate."""
    from core.pipeline.estimate import size
    from jobs.submission import SubmitError

    mode = {"stream": "streamed", "memory": "held in memory"}.get(est.execution, est.execution)
    headroom = ", with headroom for the GPU's work" if worker.device == "cuda" else ""
    hint = est.fit_note.rpartition(": ")[2] if ": " in est.fit_note else ""
    return SubmitError(
        f"no queue has the memory for this job: it needs about {size(est.peak_bytes)} at peak ({mode}{headroom}), "
        f"and the largest queue, {queue.name}, has {size(worker.memory)}" + (f"; {hint}" if hint else "")
    )


def send_options(queue: str | None) -> dict[str, Any]:
    """``send_task`` options for a job stored with ``queue`` (None: Celery's default queue)."""
    return {"queue": queue} if queue else {}
