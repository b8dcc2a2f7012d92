"""The engine imported ahead of the job, in each fresh pool process.

A job's process imports torch, transformers' model code and the pruning, evaluation and generation
modules: seconds of work (3.4 s on two idle cores, over 10 s on busy ones). A fresh pool process
starts these imports in a background thread as it starts (``jobs.worker`` connects
:func:`start_import` to Celery's ``worker_process_init``), so a job that finds its worker idle does not
wait for them. The process reports up at once and takes its job: the job claims its row and starts its
heartbeat at once too (nothing heavy needed), then waits for the imports (:func:`wait_for_engine`)
before anything else imports, so no two threads import at the same time. Claiming first keeps the
job's row from looking lost to the maintenance thread (QUEUED, with its message already taken from the
broker) while a slow import runs. The imports wait for the worker's device probe, which times GEMMs, to
end first: the parent makes the event before its pool forks (:func:`hold_until_probed`) and sets it
when the probe ends (:func:`probed`); it never imports the engine itself (``jobs.celery_app``).
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

_importing: threading.Thread | None = None
_probed = None  # a multiprocessing Event the worker's parent makes before its pool forks (hold_until_probed)
PROBE_WAIT_S = 120.0  # the longest a pool process waits for the device probe before importing anyway


def hold_until_probed() -> None:
    """In the worker's parent, before its pool forks: pool processes start their imports only once the
    device probe has ended (:func:`probed`). The probe times float32 GEMMs for the estimate before
    Submit (``jobs.workerinfo``); an import beside it on the same cores slowed them (115 against 173
    GFLOP/s on two cores), and the estimates read the worker as that much slower than it is."""
    global _probed
    import multiprocessing

    _probed = multiprocessing.get_context("fork").Event()


def probed() -> None:
    """The device probe has ended (or failed): waiting pool processes may import."""
    if _probed is not None:
        _probed.set()


def import_engine() -> None:
    """Import what a job runs on. Imports only, no torch operation."""
    import transformers.modeling_utils  # noqa: F401  (the model classes' base; the families load on demand)

    import core.evaluation.generate  # noqa: F401
    import core.evaluation.run  # noqa: F401
    import core.evaluation.speed  # noqa: F401
    import core.models.loading  # noqa: F401
    import core.pipeline.sequential  # noqa: F401
    import core.process  # noqa: F401


def _import_and_log() -> None:
    if _probed is not None:
        _probed.wait(PROBE_WAIT_S)
    start = time.monotonic()
    try:
        import_engine()
    except Exception:  # the job imports again, and reports what fails, in its own log
        logger.exception("importing the engine ahead of the next job failed; the job will try again")
    else:
        took = time.monotonic() - start
        logger.info("pool process %d: engine imported in %.1f s, ready for a job", os.getpid(), took)


def start_import(**_signal) -> None:
    """Start importing the engine in a background thread (a fresh pool process, once)."""
    global _importing
    if _importing is None:
        _importing = threading.Thread(target=_import_and_log, name="liar-import-engine", daemon=True)
        _importing.start()


def wait_for_engine() -> None:
    """Return once the background import (if this process started one) has finished."""
    if _importing is not None:
        _importing.join()
