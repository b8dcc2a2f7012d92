"""A worker stopped politely (SIGTERM: a deploy, an autoscaler, a preemption notice) hands its job back
instead of losing it.

The job's process, from the moment its run may take checkpoints (:func:`watch`), answers SIGTERM by
asking the run to stop at its next block boundary: the block under way is finished, a checkpoint is
saved (``jobs.checkpoints``), the job goes back to the queue with its attempt not counted, and the
process ends; the next attempt resumes on any worker. If that has not happened within
``LIAR_STOP_SECONDS`` the process exits anyway: the job is then requeued as a lost worker's is (its
lease runs out) and resumes from its last periodic checkpoint.

Celery's parent process gets the signal first (a warm shutdown: it waits for the running job) and
passes it on to the job's process (:func:`forward_to_children`, from ``jobs.worker``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)
_watched: dict[str, object] = {}  # "saves": the running job's checkpoints, "previous": the handler replaced


def watch(saves, stop_seconds: float) -> None:
    """From now until :func:`release`, SIGTERM sets ``saves.stop`` and starts the ``stop_seconds`` clock.
    Only the main thread may install a handler: elsewhere (a test calling the task in a thread) nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    _watched["saves"], _watched["seconds"] = saves, stop_seconds
    if "previous" not in _watched:
        _watched["previous"] = signal.signal(signal.SIGTERM, _on_term)


def release() -> None:
    """The handler that was there before :func:`watch` back, and the exit clock stopped (the job's run
    is over: the process goes on to its next job, or ends as Celery's shutdown says)."""
    _watched.pop("saves", None)
    timer = _watched.pop("timer", None)
    if timer is not None:  # the run ended (stopped in time, or finished): no exit is due
        timer.cancel()
    if "previous" in _watched and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _watched.pop("previous"))


def _on_term(signum, frame) -> None:
    saves = _watched.get("saves")
    if saves is None or getattr(saves, "stop", False):
        return
    saves.stop = True
    seconds = float(_watched.get("seconds", 60.0))
    logger.warning("SIGTERM: stopping at the next block boundary (at most %.0f s)", seconds)
    timer = threading.Timer(seconds, _give_up, args=(seconds,))
    timer.daemon = True
    _watched["timer"] = timer
    timer.start()


def _give_up(seconds: float) -> None:
    logger.error("could not stop within %.0f s; exiting (the job is requeued when its lease runs out)", seconds)
    logging.shutdown()
    os._exit(143)


def forward_to_children() -> None:
    """SIGTERM to this process's children (the pool's job process), read from ``/proc``; nothing where
    there is no ``/proc``."""
    me = os.getpid()
    for task in Path(f"/proc/{me}/task").glob("*/children"):
        try:
            pids = task.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def attempt_checkpoints(sf, job_id: int, token: int, settings, refused: Callable[[], str | None]):
    """The attempt's resume checkpoints in the job's store (``jobs.checkpoints``); None when
    ``LIAR_CHECKPOINT_MINUTES`` is 0. A SIGTERM from now on asks the run to stop at its next block."""
    from functools import partial

    from jobs.checkpoints import StoreCheckpoints
    from jobs.fencing import Superseded, job_log

    if settings.checkpoint_minutes <= 0:
        return None

    def lost() -> Exception | None:
        why = refused()
        return Superseded(why) if why else None

    saves = StoreCheckpoints(
        settings.store(), job_id, token, settings.checkpoint_minutes * 60, lost, partial(job_log, sf, job_id, token)
    )
    watch(saves, settings.stop_seconds)
    return saves
