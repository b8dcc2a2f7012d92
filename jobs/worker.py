"""Starting a correctly configured worker, and its maintenance thread.

The worker's parent process only talks to the broker and the database; each job runs in a fresh
child process that imports torch (see ``jobs.celery_app``). A maintenance thread in the parent
re-queues jobs of dead workers (heartbeat lease) and re-sends jobs whose broker message was lost.
"""

from __future__ import annotations

import os
import socket
import threading

from celery.signals import worker_ready

from jobs.settings import Settings


def _maintain(settings: Settings, stop: threading.Event) -> None:
    from jobs.service import JobService

    service = JobService(settings)
    every = max(min(settings.lease_seconds / 2, 10.0), 0.5)
    while not stop.wait(every):
        try:
            service.reap()
            service.resend_lost(older_than=every)
        except Exception:  # keep maintaining through database / broker hiccups
            pass


_stop = threading.Event()


@worker_ready.connect
def _start_maintenance(sender=None, **_kwargs) -> None:
    settings = Settings.from_env()
    threading.Thread(target=_maintain, args=(settings, _stop), daemon=True, name="liar-maintenance").start()


def run_worker(gpu: str | None = None, name: str | None = None, loglevel: str = "INFO") -> None:
    """Run one worker in the foreground: one job at a time, a fresh process per job."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from jobs.celery_app import QUEUE, app

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
            QUEUE,
            "-n",
            name or f"liar-{suffix}-{os.getpid()}@{socket.gethostname()}",
            "--without-gossip",
            "--without-mingle",
        ]
    )
