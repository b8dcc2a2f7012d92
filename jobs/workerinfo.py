"""What a worker is, answered over Celery's remote control: the ``liar_worker_info`` command.

Broadcast it (``app.control.broadcast(COMMAND, reply=True, timeout=1)``) and every live worker says
its name, the queues it consumes, its device (GPU name and memory, or "CPU" and the host's memory),
the jobs it is running, its process id and when it started. The web app's Workers tab and operators'
scripts read it; Flower and exporters read the task events that ``jobs.celery_app`` turns on.

The command runs in the worker's parent process, inside its event loop, so it must answer at once and
must not touch torch: a prefork parent that initialised CUDA (or ran any torch operation) hangs or
breaks the children it forks for jobs. The device is therefore probed by a short-lived ``python -c``
subprocess that imports torch, started in a background thread as soon as the worker is ready (and by
the first question if that comes earlier); only for those few seconds does the answer say
``probing``. The probe also times a float32 GEMM (``gemm_flops``, FLOP/s): the web app's estimate
before Submit runs at the rate of the worker that will run the job (:func:`reported_gemm_rate`).
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

from jobs.engine import probed

COMMAND = "liar_worker_info"
TASK = "liar.run_job"
PROBING = {"kind": "probing", "name": "probing", "memory_bytes": None}
# the size core.pipeline.estimate's CPU rate (docs/results/time.json) is measured at: a second at most
GEMM_N = 2048
# the device as the job's own process will see it (CUDA_VISIBLE_DEVICES applies to the subprocess
# too), and this machine's float32 GEMM rate, best of three
_PROBE = (
    "import json, time, torch\n"
    f"n = {GEMM_N}\n"
    "p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None\n"
    "gpu = p and {'name': p.name, 'memory_bytes': int(p.total_memory), 'count': torch.cuda.device_count()}\n"
    "x = torch.randn(n, n)\n"
    "x @ x\n"
    "best = float('inf')\n"
    "for _ in range(3):\n"
    "    t0 = time.perf_counter(); x @ x; best = min(best, time.perf_counter() - t0)\n"
    "print(json.dumps({'gpu': gpu, 'gemm_flops': 2 * n**3 / best}))"
)

_started_at = dt.datetime.now(dt.timezone.utc)
_device: dict[str, Any] = {}
_probe_lock = threading.Lock()
_probe_thread: threading.Thread | None = None


@worker_ready.connect
def _mark_started(sender=None, **_kwargs) -> None:
    """ "Started at" is when the worker could first take a job, not when this module was imported; the
    device probe starts then, so the first question already finds its answer."""
    global _started_at
    _started_at = dt.datetime.now(dt.timezone.utc)
    start_probe()


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where ``sysconf`` cannot say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def probe_device(timeout: float = 120.0) -> dict[str, Any]:
    """The first visible GPU (``kind: gpu``, its name, total memory and how many are visible), or the
    CPU and the host's memory when torch is absent, sees no GPU or the probe fails; with
    ``gemm_flops``, this machine's float32 GEMM rate (None when the probe could not time it)."""
    cpu = {"kind": "cpu", "name": "CPU", "memory_bytes": host_memory_bytes(), "gemm_flops": None}
    if find_spec("torch") is None:
        return cpu
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
        probed = json.loads(out.strip().splitlines()[-1])
        gpu, rate = probed.get("gpu"), float(probed["gemm_flops"])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError, KeyError, TypeError, AttributeError):
        return cpu
    return {**cpu, "gemm_flops": rate} if not gpu else {"kind": "gpu", **gpu, "gemm_flops": rate}


def _probe_in_background() -> None:
    try:
        found = probe_device()
    except Exception:  # never leave the answer at "probing"
        found = {"kind": "cpu", "name": "CPU", "memory_bytes": host_memory_bytes(), "gemm_flops": None}
    finally:
        probed()  # the pool process may import the engine now, off the probe's cores (jobs.engine)
    _device.update(found)


def start_probe() -> None:
    """Start the device probe in a background thread, once per process."""
    global _probe_thread
    with _probe_lock:
        if _probe_thread is None:
            _probe_thread = threading.Thread(target=_probe_in_background, daemon=True, name="liar-device-probe")
            _probe_thread.start()


def device() -> dict[str, Any]:
    """The probed device, or ``PROBING`` while the probe runs (started here if the worker's start did
    not start it)."""
    if _device:
        return dict(_device)
    start_probe()
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


def gemm_rate_of(answers: dict[str, Any], queue: str | None = None) -> float | None:
    """The median float32 GEMM rate (FLOP/s) that the CPU workers among ``answers`` (by worker name, as
    :func:`jobs.health.ask_workers` gives them) reported, of those serving ``queue`` when given; None
    when none has reported one yet."""
    rates = sorted(
        float(rate)
        for answer in answers.values()
        if isinstance(answer, dict)
        and (queue is None or queue in (answer.get("queues") or []))
        and (device := answer.get("device") or {}).get("kind") == "cpu"
        and isinstance(rate := device.get("gemm_flops"), (int, float))
        and rate > 0
    )
    return rates[len(rates) // 2] if rates else None
