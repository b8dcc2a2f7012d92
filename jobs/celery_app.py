"""The Celery application, configured from the environment (see ``jobs.settings``).

Long GPU jobs: late acks, prefetch 1, one process per GPU (concurrency 1), a fresh child process
per job (``worker_max_tasks_per_child=1``) so every job starts with clean GPU memory. The parent
process never imports torch: a prefork parent that ran a torch operation hangs its children. Each
pool process starts importing it, and the rest of the engine, as it starts (``jobs.engine``), so that
a job arriving at an idle worker does not wait for the imports.
"""

from __future__ import annotations

import os

from celery import Celery

from jobs.settings import Settings
from jobs.watchdog import hard_time_limit

QUEUE = "liar"


def result_backend(settings: Settings) -> str:
    """Where a task that returns a value (``jobs.generation``'s) leaves it: a folder beside the
    filesystem broker's, or the Redis that is the broker (in memory for an in-process broker)."""
    if settings.broker_url.startswith("filesystem://"):
        folder = settings.broker_dir / "results"
        folder.mkdir(parents=True, exist_ok=True)
        return f"file://{folder.resolve()}"
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return settings.broker_url
    # an in-process broker (tests) keeps results in memory too; another broker answers over its own queues
    return "cache+memory://" if settings.broker_url.startswith("memory://") else "rpc://"


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("liar", broker=settings.broker_url, include=["jobs.tasks", "jobs.workerinfo"])
    options: dict = {}
    if settings.broker_url.startswith("filesystem://"):
        settings.ensure_dirs()
        queue = str(settings.broker_dir / "queue")
        options = {
            "data_folder_in": queue,
            "data_folder_out": queue,
            "control_folder": str(settings.broker_dir / "control"),
            "processed_folder": str(settings.broker_dir / "processed"),
            "store_processed": False,
        }
    elif settings.broker_url.startswith(("redis://", "rediss://")):
        # a job can run for hours: do not let Redis hand an unacked job to a second worker meanwhile;
        # lost workers are detected by the database lease instead (jobs.service.JobService.reap)
        options = {"visibility_timeout": 24 * 3600}
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        # a fresh process per job frees all GPU memory; CPU-only workers may reuse processes
        worker_max_tasks_per_child=int(os.environ.get("LIAR_WORKER_MAX_TASKS_PER_CHILD", 1)),
        worker_concurrency=1,
        task_serializer="json",
        accept_content=["json"],
        # jobs store nothing there (SQL is their record); the prompt box's answers travel back this way
        result_backend=result_backend(settings),
        result_expires=3600,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        # operators' view: task events for Flower or an exporter (sent/started/succeeded…, a few small
        # messages per job), and the liar_worker_info remote-control command (jobs.workerinfo, above)
        worker_send_task_events=True,
        task_send_sent_event=True,
        # LIAR_TASK_TIME_LIMIT: the backstop kill, after the reaper has failed the job (jobs.watchdog)
        task_time_limit=hard_time_limit(settings),
    )
    app.conf.liar_settings = settings
    return app


app = make_celery()
