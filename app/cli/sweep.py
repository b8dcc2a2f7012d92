"""``liar sweep GRID.yaml --out DIR [--isolate]``: a resumable grid of runs → tables and plots."""

from __future__ import annotations

import argparse
import sys

from app.cli.common import fail


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a grid of pruning runs (resumable) and write results.jsonl / .csv / .md and plots."""
    from core.sweep.run import GridError, load_grid, run_sweep, write_reports

    try:
        sweep = load_grid(args.grid)
    except GridError as exc:
        return fail(str(exc))
    if args.dry_run:
        for cell in sweep.cells:
            print(f"{cell.id}  {cell.describe()}")
        print(f"{len(sweep.cells)} cells; the grid is valid")
        return 0
    if args.report_only:
        for path in write_reports(sweep, args.out):
            print(f"wrote {path}")
        return 0
    try:
        outcome = run_sweep(args.grid, args.out, isolate=args.isolate)
    except RuntimeError as exc:
        return fail(str(exc))
    if outcome.failed:
        print(f"liar: {outcome.failed} cell(s) failed; run the same command again to retry them", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    """Add ``sweep`` to the ``liar`` subcommands."""
    w = sub.add_parser("sweep", help="run a grid of pruning runs from a YAML file (resumable), tabulate and plot")
    w.add_argument("grid", help="grid YAML: base recipe, lists to vary, evaluation (see core/spec/sweep.py)")
    w.add_argument("--out", "-o", required=True, help="results directory (re-running skips finished cells)")
    w.add_argument("--isolate", action="store_true", help="run each cell in its own process")
    w.add_argument("--dry-run", action="store_true", help="validate the grid and list its cells, run nothing")
    w.add_argument("--report-only", action="store_true", help="rewrite the tables and plots from results.jsonl")
    w.set_defaults(func=cmd_sweep)
