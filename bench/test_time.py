"""docs/results/test_time.md from docs/results/test_time.json: where `make test`'s time goes, per marker.

make test TEST_TIME=docs/results/test_time.json   # the whole suite, writing the JSON (tests/timing.py)
python bench/test_time.py                         # the page from the JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
TARGETS = "`make test` ≤ 15 min on a quiet 2-core machine; `.ci/run` from nothing ≤ 35 min, engines included"


HEAVIEST = 25  # files on the page (the JSON lists every file: the next run's order)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def render(r: dict) -> str:
    """The page's markdown from the JSON ``tests/timing.py`` writes (``ci_run_seconds`` optional)."""
    ci = f"; `.ci/run` from nothing: {minutes(r['ci_run_seconds'])}" if "ci_run_seconds" in r else ""
    lines = [
        "# Test suite time, per marker",
        "",
        f"Measured {r['date']} on {r['machine']}, Python {r['python']}. Produced by "
        "`make test TEST_TIME=docs/results/test_time.json` and `python bench/test_time.py`.",
        "",
        f"`make test`'s tests: {minutes(r['wall_seconds'])} wall in {r.get('processes', 1)} processes{ci}. "
        f"Targets: {TARGETS}.",
        *([f"Conditions: {r['conditions']}.", ""] if r.get("conditions") else []),
        *(
            [
                "Each process ran out of files at " + ", ".join(f"{s:.0f}" for s in r["processes_done"]) + " s.",
                "",
            ]
            if len(r.get("processes_done", [])) > 1
            else []
        ),
        "A test counts once, under the first of deploy, browser, integration, slow it carries; the seconds are "
        "each test's own, so with several processes they add up to more than the wall time.",
        "",
        "| marker | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    total = sum(row["seconds"] for row in r["markers"]) or 1.0
    lines += [
        f"| {m['marker']} | {m['tests']} | {m['seconds']:.1f} | {100 * m['seconds'] / total:.0f}% |"
        for m in r["markers"]
    ]
    lines += ["", f"## The {len(r['slowest'])} slowest tests", "", "| test | marker | seconds |", "|---|---|---:|"]
    lines += [f"| `{t['test']}` | {t['marker']} | {t['seconds']:.1f} |" for t in r["slowest"]]
    if r.get("files"):  # a file runs in one process (`--dist loadfile`): the longest one bounds the wall
        files = r["files"][:HEAVIEST]
        lines += ["", f"## The {len(files)} heaviest files", "", "A file's tests run in one process, one after "
                  "another, so no run is shorter than its heaviest file.", "", "| file | tests | seconds |",
                  "|---|---:|---:|"]  # fmt: skip
        lines += [f"| `{f['file']}` | {f['tests']} | {f['seconds']:.1f} |" for f in files]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=RESULTS / "test_time.json", help="what `--test-time` wrote")
    p.add_argument("--out", type=Path, help="the page (default: the JSON's path with .md)")
    args = p.parse_args(argv)
    try:
        r = json.loads(args.json.read_text())
        text = render(r)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(
            f"{args.json}: not a test-time JSON from `make test TEST_TIME=…` ({type(e).__name__}: {e})", file=sys.stderr
        )
        return 1
    out = args.out or args.json.with_suffix(".md")
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
