"""Where the suite's time goes: each test's time (setup + call + teardown) summed per marker class, printed
after ``--durations`` (``make test``), written as JSON with ``--test-time PATH``.

A test counts once, under the first of ``MARKERS`` it carries (``unmarked`` if none), so the classes add
up to the whole; ``python bench/test_time.py --report-only`` renders the JSON as docs/results/test_time.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

# the order a test with several markers is counted in: the costliest stack it needs first
MARKERS = ("deploy", "browser", "integration", "slow")
SLOWEST = 25


def marker_class(item) -> str:
    names = {m.name for m in item.iter_markers()}
    return next((m for m in MARKERS if m in names), "unmarked")


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


class TestTimes:
    """Collects per-test seconds while the session runs."""

    def __init__(self, config) -> None:
        self.config, self.started = config, time.monotonic()
        self.classes: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.done: dict[str, float] = {}  # each test process: seconds from the start to its last report

    def pytest_collection_modifyitems(self, items) -> None:
        self.classes.update({item.nodeid: marker_class(item) for item in items})

    def pytest_runtest_logreport(self, report) -> None:
        # under xdist the controlling process collects nothing: the report's keywords carry the markers
        if report.nodeid not in self.classes:
            self.classes[report.nodeid] = next((m for m in MARKERS if m in report.keywords), "unmarked")
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        node = getattr(report, "node", None)  # under xdist: the process that ran it
        self.done[getattr(getattr(node, "gateway", None), "id", "main")] = time.monotonic() - self.started

    def summary(self) -> dict:
        rows: dict[str, list[float]] = {}
        files: dict[str, list[float]] = {}
        for nodeid, seconds in self.seconds.items():
            rows.setdefault(self.classes.get(nodeid, "unmarked"), []).append(seconds)
            files.setdefault(nodeid.split("::", 1)[0], []).append(seconds)
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SLOWEST]
        heaviest = sorted(files.items(), key=lambda kv: -sum(kv[1]))
        return {
            "date": dt.date.today().isoformat(),
            "machine": f"{cpu_model()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "wall_seconds": round(time.monotonic() - self.started, 1),
            # test processes side by side (`make test`: pytest-xdist's -n); the marker sums add them up
            "processes": int(getattr(self.config.option, "numprocesses", None) or 1),
            "markers": [
                {"marker": m, "tests": len(rows[m]), "seconds": round(sum(rows[m]), 1)}
                for m in (*MARKERS, "unmarked")
                if m in rows
            ],
            "slowest": [
                {"test": n, "marker": self.classes.get(n, "unmarked"), "seconds": round(s, 2)} for n, s in slowest
            ],
            # when each process ran out of files (a late one: a long file left for the end)
            "processes_done": sorted(round(s, 1) for s in self.done.values()),
            # `--dist loadfile` gives each file to one process: the longest file bounds the wall time;
            # every file, heaviest first
            "files": [{"file": f, "tests": len(s), "seconds": round(sum(s), 1)} for f, s in heaviest],
        }

    def pytest_terminal_summary(self, terminalreporter) -> None:
        path = self.config.getoption("--test-time")
        if not (self.seconds and (path or self.config.getoption("durations"))):
            return
        result = self.summary()
        terminalreporter.write_sep(
            "=", "time per marker (a test counts under its first of: " + ", ".join(MARKERS) + ")"
        )
        for row in result["markers"]:
            terminalreporter.write_line(f"{row['marker']:>12} {row['tests']:6d} tests {row['seconds']:9.1f} s")
        terminalreporter.write_line(f"{'wall':>12} {len(self.seconds):6d} tests {result['wall_seconds']:9.1f} s")
        if path:
            Path(path).write_text(json.dumps(result, indent=2) + "\n")
            terminalreporter.write_line(f"wrote {path}")
