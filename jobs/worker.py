"""Starting a correctly configured worker, and its maintenance thread.

The worker's parent process only talks to the broker and the database; each job runs in a fresh
child process that imports torch (see ``jobs.celery_app``), as soon as it is started, before a job
arrives (``jobs.engine``). A maintenance thread in the parent
re-queues jobs of dead workers (heartbeat lease) and re-sends jobs whose broker message was lost.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from celery.signals import worker_process_init, worker_ready, worker_shutting_down

from jobs.engine import hold_until_probed, start_import
from jobs.settings import Settings

EXPIRE_EVERY = 600.0  # seconds between two looks for files past the retention period


def _maintain(settings: Settings, stop: threading.Event) -> None:
    from jobs.service import JobService

    service = JobService(settings)
    every = max(min(settings.lease_seconds / 2, 10.0), 0.5)
    expired_at = 0.0
    while not stop.wait(every):
        try:
            service.reap()
            service.resend_lost(older_than=every)
            if time.monotonic() - expired_at > EXPIRE_EVERY:  # retention (LIAR_RETENTION_DAYS)
                expired_at = time.monotonic()
                service.expire()
        except Exception:  # keep maintaining through database / broker hiccups
            pass


_stop = threading.Event()


@worker_ready.connect
def _start_maintenance(sender=None, **_kwargs) -> None:
    settings = Settings.from_env()
    threading.Thread(target=_maintain, args=(settings, _stop), daemon=True, name="liar-maintenance").start()


# a fresh pool process starts importing the engine at once, before a job comes (jobs.engine)
worker_process_init.connect(start_import, weak=False)


@worker_shutting_down.connect
def _stop_the_job(sender=None, sig=None, how=None, **_kwargs) -> None:
    """A warm shutdown (SIGTERM): the running job's process is told too, so that it saves a checkpoint
    at its next block boundary and hands the job back (jobs.stopping)."""
    from jobs.stopping import forward_to_children

    if how == "Warm":
        forward_to_children()


def worker_queues(queues: str | None, settings: Settings) -> list[str]:
    """The broker queues a worker serves: ``queues`` (comma-separated; ``LIAR_WORKER_QUEUES`` where not
    given), else the default queue. With routed queues (``LIAR_QUEUES``), a name not among them is
    refused with ``ValueError``: its worker would wait forever, for jobs nothing sends there."""
    from jobs.celery_app import QUEUE

    names = [q.strip() for q in (queues or os.environ.get("LIAR_WORKER_QUEUES", "")).split(",") if q.strip()]
    known = [q.name for q in settings.queues]
    unknown = [q for q in names if known and q not in known]
    if unknown:
        raise ValueError(f"no queue {', '.join(unknown)} in LIAR_QUEUES (its queues: {', '.join(known)})")
    return names or [QUEUE]


def run_worker(
    gpu: str | None = None, name: str | None = None, loglevel: str = "INFO", queues: str | None = None
) -> None:
    """Run one worker in the foreground: one job at a time, a fresh process per job, taking jobs from
    ``queues`` (:func:`worker_queues`). ``gpu`` is set as ``CUDA_VISIBLE_DEVICES`` before anything
    can import torch, so the worker's jobs see that card alone, as device 0."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from jobs.celery_app import app

    serve = worker_queues(queues, app.conf.liar_settings)
    hold_until_probed()  # before the pool forks: its processes import once the GEMM probe is done

    suffix = f"gpu{gpu}" if gpu is not None else "cpu"
    app.worker_main(
        [
            "worker",
            f"--loglevel={loglevel}",
            "--pool=prefork",
            "--concurrency=1",
            f"--max-tasks-per-child={os.environ.get('LIAR_WORKER_MAX_TASKS_PER_CHILD', 1)}",
            "--prefetch-multiplier=1",
            "-Q",
            ",".join(serve),
            "-n",
            name or f"liar-{suffix}-{os.getpid()}@{socket.gethostname()}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
