"""The Workers tab's content, as plain functions (no Gradio): who is working, on what, on which device.

Each refresh broadcasts ``liar_worker_info`` (``jobs.workerinfo``) and waits about a second for the
answers. A worker that stops answering (stopped, killed, cut off from the broker) is not dropped at
once: a :class:`Roster` remembers each worker's last answer and when it came, so the table shows
"last seen 40 s ago" for ``forget_after`` seconds before the row goes. A broker that cannot be
reached gives one sentence instead of the table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from jobs.health import BrokerDown, ask_workers
from jobs.workerinfo import COMMAND

COLUMNS = ["Worker", "Queues", "Device", "Memory", "Job", "Last seen", "Started", "PID"]
ASK_SECONDS = 1.0
FORGET_AFTER = 120.0  # seconds a silent worker stays listed, marked by how long ago it answered
NO_WORKERS = "No worker answered. Start one with `liar worker` (jobs wait in the queue until one does)."


def _gib(n: int | None) -> str:
    return "?" if not n else f"{n / 2**30:.0f} GiB"


def _ago(seconds: float) -> str:
    return "now" if seconds < 2 else f"last seen {seconds:.0f} s ago"


class Roster:
    """The workers heard from lately: their last answer and when it came (``clock`` seconds, injectable
    for tests). One per app process; refreshes from several browsers share it."""

    def __init__(self, forget_after: float = FORGET_AFTER, clock: Callable[[], float] = time.monotonic):
        self.forget_after = forget_after
        self.clock = clock
        self._seen: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def update(self, answers: dict[str, dict[str, Any]]) -> list[tuple[str, float, dict[str, Any]]]:
        """Record ``answers`` (by worker name); returns (name, seconds since its last answer, answer) for
        every worker heard from within ``forget_after``, by name. Silent ones past it are forgotten."""
        now = self.clock()
        with self._lock:
            for name, answer in answers.items():
                if isinstance(answer, dict):
                    self._seen[name] = (now, self._with_known_device(name, answer))
            self._seen = {n: v for n, v in self._seen.items() if now - v[0] <= self.forget_after}
            return [(name, now - at, answer) for name, (at, answer) in sorted(self._seen.items())]

    def _with_known_device(self, name: str, answer: dict[str, Any]) -> dict[str, Any]:
        """``answer``, but with the device this worker reported before when it now says ``probing``
        (a device does not change while its worker runs)."""
        known = self._seen.get(name, (0.0, {}))[1].get("device") or {}
        if (answer.get("device") or {}).get("kind") == "probing" and known.get("kind") not in (None, "probing"):
            return {**answer, "device": known}
        return answer


def worker_row(name: str, age: float, info: dict[str, Any]) -> list[str]:
    """One table row: queues, device, its memory, the running job(s) as ``#N``, when last seen."""
    device = info.get("device") or {}
    jobs = info.get("jobs") or []
    return [
        name,
        ", ".join(info.get("queues") or []) or "-",
        str(device.get("name", "?")),
        _gib(device.get("memory_bytes")),
        ", ".join(f"#{j}" for j in jobs) or "idle",
        _ago(age),
        str(info.get("started_at", "?")),
        str(info.get("pid", "?")),
    ]


def worker_view(celery, roster: Roster, timeout: float = ASK_SECONDS) -> tuple[str, list[list[str]]]:
    """The tab's note and rows: ask the workers, merge into ``roster``. A broker that is down gives
    its one sentence and the rows still remembered (each marked by how long ago it answered)."""
    try:
        answers = ask_workers(celery, COMMAND, timeout)
    except BrokerDown as exc:
        rows = [worker_row(*seen) for seen in roster.update({})]
        return f"{exc}. The workers cannot be asked until it is back.", rows
    rows = [worker_row(*seen) for seen in roster.update(answers)]
    if not rows:
        return NO_WORKERS, []
    live = sum(1 for row in rows if row[5] == "now")
    return f"{live} of {len(rows)} workers answered just now.", rows
