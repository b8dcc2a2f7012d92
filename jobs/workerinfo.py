"""What a worker is, answered over Celery's remote control: the ``liar_worker_info`` command.

Broadcast it (``app.control.broadcast(COMMAND, reply=True, timeout=1)``) and every live worker says
its name, the queues it consumes, its device (GPU name and memory, or "CPU" and the host's memory),
the jobs it is running, its process id and when it started. The web app's Workers tab and operators'
scripts read it; Flower and exporters read the task events that ``jobs.celery_app`` turns on.

The command runs in the worker's parent process, inside its event loop, so it must answer at once and
must not touch torch: a prefork parent that initialised CUDA (or ran any torch operation) hangs or
breaks the children it forks for jobs. The device is therefore probed once, by a short-lived
``python -c`` subprocess that imports torch, started in a background thread by the first question;
until it reports, the answer says ``probing``. Workers nobody asks never pay for the probe.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from importlib.util import find_spec
from typing import Any

from celery.signals import worker_ready
from celery.worker.control import control_command

COMMAND = "liar_worker_info"
TASK = "liar.run_job"
PROBING = {"kind": "probing", "name": "probing", "memory_bytes": None}
# the device as the job's own process will see it (CUDA_VISIBLE_DEVICES applies to the subprocess too)
_PROBE = (
    "import json, torch\n"
    "p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None\n"
    "print(json.dumps(p and {'name': p.name, 'memory_bytes': int(p.total_memory), 'count': torch.cuda.device_count()}))"
)

_started_at = dt.datetime.now(dt.timezone.utc)
_device: dict[str, Any] = {}
_probe_lock = threading.Lock()
_probe_thread: threading.Thread | None = None


@worker_ready.connect
def _mark_started(sender=None, **_kwargs) -> None:
    """ "Started at" is when the worker could first take a job, not when this module was imported."""
    global _started_at
    _started_at = dt.datetime.now(dt.timezone.utc)


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where ``sysconf`` cannot say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def probe_device(timeout: float = 120.0) -> dict[str, Any]:
    """The first visible GPU (``kind: gpu``, its name, total memory and how many are visible), or the
    CPU and the host's memory when torch is absent, sees no GPU or the probe fails."""
    cpu = {"kind": "cpu", "name": "CPU", "memory_bytes": host_memory_bytes()}
    if find_spec("torch") is None:
        return cpu
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
        gpu = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return cpu
    return cpu if not gpu else {"kind": "gpu", **gpu}


def _probe_in_background() -> None:
    _device.update(probe_device())


def device() -> dict[str, Any]:
    """The probed device, or ``PROBING`` while the first probe runs (which this call starts)."""
    global _probe_thread
    if _device:
        return dict(_device)
    with _probe_lock:
        if _probe_thread is None:
            _probe_thread = threading.Thread(target=_probe_in_background, daemon=True, name="liar-device-probe")
            _probe_thread.start()
    return dict(PROBING)


def running_jobs() -> list[int]:
    """The job ids of the ``liar.run_job`` tasks this worker is executing (its task's only argument is
    the job id; the parent knows them from the requests it handed to its child process)."""
    from celery.worker import state

    ids = []
    for request in list(state.active_requests):
        if request.task_name != TASK:
            continue
        try:
            ids.append(int(request.args[0]))
        except (TypeError, ValueError, IndexError):
            continue
    return sorted(ids)


@control_command()
def liar_worker_info(state) -> dict[str, Any]:
    """What this worker is: hostname, queues, device, running jobs, pid and start time."""
    consumer = state.consumer
    queues = sorted(q.name for q in consumer.task_consumer.queues) if consumer.task_consumer else []
    return {
        "hostname": consumer.hostname,
        "queues": queues,
        "device": device(),
        "jobs": running_jobs(),
        "pid": os.getpid(),
        "started_at": _started_at.isoformat(timespec="seconds"),
    }
