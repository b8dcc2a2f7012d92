"""A sweep's ``results.jsonl``: one JSON line per finished cell, and the lock of its directory.

Each record is appended (and flushed to disk) as soon as its cell finishes; reading keeps the last
record of each cell id, so a retried cell's new record replaces its failed one and a cut-off last
line (an interrupted write) is skipped.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = "results.jsonl"


def now() -> str:
    """The current UTC time, ISO 8601 to the second (a record's ``started`` / ``finished``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def read_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """The last record of each cell id in a results.jsonl (unreadable lines, e.g. a cut-off write, skipped)."""
    path = Path(path)
    records: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            records[rec["id"]] = rec
    return records


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record as one JSON line, flushed to disk before returning."""
    line = json.dumps(record, default=json_default, allow_nan=True) + "\n"
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def json_default(obj: Any) -> Any:
    """``json.dumps``'s fallback for a record: numpy / torch scalars and paths."""
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@contextlib.contextmanager
def lock(out: Path) -> Iterator[None]:
    """Refuse to run two sweeps into the same directory at once."""
    import fcntl

    with (out / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another sweep is running into {out}") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
