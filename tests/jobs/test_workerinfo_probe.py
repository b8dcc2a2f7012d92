"""What a worker reports about itself from its start (``jobs.workerinfo``), without a broker: the
device probe starts when the worker is ready, resolves even when it fails, and carries the GEMM rate
the New-run estimate uses; the Workers tab keeps a device once reported."""

from __future__ import annotations

import pytest

from app.web.workers import Roster, worker_row
from jobs import workerinfo

CPU = {"kind": "cpu", "name": "CPU", "memory_bytes": 8 * 2**30, "gemm_flops": 2e11}


@pytest.fixture()
def fresh(monkeypatch):
    """The module as in a worker that has just started: nothing probed, no probe thread."""
    monkeypatch.setattr(workerinfo, "_device", {})
    monkeypatch.setattr(workerinfo, "_probe_thread", None)
    return workerinfo


def _join(module) -> None:
    module._probe_thread.join(timeout=60)


def test_the_probe_starts_when_the_worker_is_ready(fresh, monkeypatch):
    monkeypatch.setattr(fresh, "probe_device", lambda: dict(CPU))
    fresh._mark_started()  # celery's worker_ready signal
    assert fresh._probe_thread is not None, "the probe waits for a first question"
    _join(fresh)
    assert fresh.device() == CPU  # the first question already has the answer


def test_a_probe_that_breaks_still_reports_the_host(fresh, monkeypatch):
    def broken():
        raise RuntimeError("an unexpected failure in the probe")

    monkeypatch.setattr(fresh, "probe_device", broken)
    assert fresh.device() == workerinfo.PROBING
    _join(fresh)
    answer = fresh.device()
    assert answer["kind"] == "cpu" and answer["memory_bytes"] == workerinfo.host_memory_bytes() > 0


def test_the_real_probe_times_a_gemm():
    found = workerinfo.probe_device()
    assert found["kind"] in ("cpu", "gpu") and found["memory_bytes"] > 0
    assert found["gemm_flops"] > 1e8


def test_the_estimate_rate_is_the_median_of_the_cpu_workers_of_the_queue():
    def answer(queues, device):
        return {"queues": queues, "device": device}

    answers = {
        "a": answer(["liar"], {**CPU, "gemm_flops": 1e11}),
        "b": answer(["liar"], {**CPU, "gemm_flops": 3e11}),
        "c": answer(["liar"], {**CPU, "gemm_flops": 2e11}),
        "d": answer(["big"], {**CPU, "gemm_flops": 9e11}),
        "e": answer(["liar"], dict(workerinfo.PROBING)),
        "f": answer(["liar"], {"kind": "gpu", "name": "H100", "memory_bytes": 1, "gemm_flops": 5e13}),
        "g": "not an answer",
    }
    assert workerinfo.gemm_rate_of(answers, "liar") == 2e11
    assert workerinfo.gemm_rate_of(answers, "big") == 9e11
    assert workerinfo.gemm_rate_of({"e": answers["e"]}) is None


def test_the_workers_tab_keeps_the_device_a_worker_reported():
    now = [0.0]
    roster = Roster(clock=lambda: now[0])
    first = {"queues": ["liar"], "device": dict(CPU), "jobs": [], "pid": 1, "started_at": "t"}
    roster.update({"w@h": first})
    now[0] += 900
    later = {**first, "device": dict(workerinfo.PROBING), "jobs": [9]}
    ((name, age, info),) = roster.update({"w@h": later})
    row = worker_row(name, age, info)
    assert row[2:5] == ["CPU", "8 GiB", "#9"], row
