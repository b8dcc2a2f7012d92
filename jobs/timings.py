"""Wall time per stage of a job, measured from the engine's ``progress(stage, done, total)`` calls.

The engine reports a stage's start (``done`` below ``total``) and its end (``done == total``); some
stages report steps in between — ``reconstruct`` once at the start of every layer (``done`` = the
layer's index), the job's ``evaluate`` once per evaluation. :class:`StageClock` turns those calls
into seconds without knowing the stage names, so a stage the engine adds later (e.g. ``write``) is
timed the same way:

- a stage runs from its first call until its ``done == total`` call or the first call of another
  stage; a stage whose first call already has ``done == total`` (the engine's ``done``) is a marker
  and takes no time;
- a stage that comes back (the job's ``load`` before the engine's) adds to its first entry;
- a step is the time between two calls of a stage whose ``done`` differ by one: ``steps[i]`` is the
  time of layer / evaluation ``i``. Steps are kept only for stages with more than one unit.

The stored form (the job's ``timings`` column)::

    {"stages": [{"stage": "load", "seconds": 3.2},
                {"stage": "reconstruct", "seconds": 30.1, "steps": [1.4, 1.3, ...]},
                {"stage": "export", "seconds": 5.0, "stopped": true}],   # stopped: the job failed in it
     "total": 45.0}                                                     # first call → finish()

Time between stages (e.g. building the result after the last layer) counts in ``total`` only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STEP_LABELS = {"reconstruct": "layer", "evaluate": "evaluation"}  # how a stage's steps are named
MIN_LOGGED = 0.05  # a stage that comes back for less than this (s) logs no second line


def step_label(stage: str) -> str:
    return STEP_LABELS.get(stage, "step")


@dataclass
class Event:
    """A finished stage or step, for the job's log."""

    message: str
    level: str = "INFO"


@dataclass
class _Open:
    stage: str
    since: float
    done: int
    total: int
    step_since: float


class StageClock:
    """Stage and step times of one run, from its ``progress`` calls (see the module docstring)."""

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.start = now()
        self._stages: dict[str, dict[str, Any]] = {}  # in order of first appearance
        self._open: _Open | None = None

    def update(self, stage: str, done: int, total: int) -> list[Event]:
        """Feed one ``progress`` call; returns what it finished (stages, steps) as log events."""
        t = self.now()
        events: list[Event] = []
        cur = self._open
        if cur is not None and cur.stage != stage:
            events += self._close(t, stopped=False)
            cur = None
        if cur is None:
            if total > 0 and done >= total:
                return events  # a marker ("done"): ends the stage before it, takes no time
            self._open = _Open(stage, t, done, total, t)
            return events
        if done > cur.done:
            events += self._step(cur, t, done)
        cur.total = total
        if total > 0 and done >= total:
            events += self._close(t, stopped=False)
        return events

    def finish(self, stopped: bool = True) -> tuple[dict[str, Any], list[Event]]:
        """Close the stage still open (``stopped``: the job ended inside it) and return
        (the stored form with ``total``, the events of what was closed)."""
        t = self.now()
        events = self._close(t, stopped=stopped) if self._open is not None else []
        return {**self.snapshot(), "total": round(t - self.start, 3)}, events

    def snapshot(self) -> dict[str, Any]:
        """The finished stages so far (no ``total``)."""
        return {"stages": [dict(entry) for entry in self._stages.values()]}

    def _step(self, cur: _Open, t: float, done: int) -> list[Event]:
        events = []
        if done == cur.done + 1 and cur.total > 1:
            seconds = round(t - cur.step_since, 3)
            entry = self._entry(cur.stage)
            entry.setdefault("steps", []).append(seconds)
            label = step_label(cur.stage)
            events.append(Event(f"{label} {done}/{cur.total}: {seconds:.1f} s", "DEBUG"))
        cur.done, cur.step_since = done, t
        return events

    def _close(self, t: float, stopped: bool) -> list[Event]:
        cur, self._open = self._open, None
        assert cur is not None
        events = []
        if not stopped and cur.total > 1 and cur.done == cur.total - 1:
            events += self._step(cur, t, cur.total)  # the last step ran until the next stage began
        seconds = t - cur.since
        again = cur.stage in self._stages
        entry = self._entry(cur.stage)
        entry["seconds"] = round(entry["seconds"] + seconds, 3)
        if stopped:
            entry["stopped"] = True
        if not again or seconds >= MIN_LOGGED or stopped:
            events.append(Event(_stage_line(cur.stage, seconds, entry.get("steps"), stopped)))
        return events

    def _entry(self, stage: str) -> dict[str, Any]:
        return self._stages.setdefault(stage, {"stage": stage, "seconds": 0.0})


def _stage_line(stage: str, seconds: float, steps: list[float] | None, stopped: bool) -> str:
    line = f"{stage} {seconds:.1f} s"
    if steps:
        slowest = max(range(len(steps)), key=steps.__getitem__)
        label = step_label(stage)
        plural = "s" if len(steps) != 1 else ""
        line += f" ({len(steps)} {label}{plural}; slowest: {label} {slowest + 1} at {steps[slowest]:.1f} s)"
    return line + (" — stopped" if stopped else "")


def rows(timings: dict[str, Any] | None, steps: bool = True) -> list[tuple[str, float | None]]:
    """A timings record as (label, seconds) rows for a table: each stage, its steps indented
    (``steps``), the time outside every stage, and the total."""
    if not timings:
        return []
    out: list[tuple[str, float | None]] = []
    for entry in timings.get("stages", []):
        stage = entry["stage"]
        out.append((stage + (" (stopped)" if entry.get("stopped") else ""), entry["seconds"]))
        if steps:
            n = len(entry.get("steps") or [])
            out += [(f"  {step_label(stage)} {i + 1}/{n}", s) for i, s in enumerate(entry.get("steps") or [])]
    total = timings.get("total")
    if total is not None:
        other = total - sum(e["seconds"] for e in timings.get("stages", []))
        if other >= MIN_LOGGED:
            out.append(("(between stages)", round(other, 3)))
        out.append(("total", total))
    return out
