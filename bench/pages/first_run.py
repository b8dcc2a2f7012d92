"""docs/results/first_run.md (``bench/first_run.py``): the first run's jobs, each estimate before Submit
against its real time, and what the job showed."""

from __future__ import annotations

from bench.pages.page import renderer
from bench.pages.values import data, num, ppl, table, times


def first_run_ratio(row: int) -> str:
    r = data("first_run.json")["rows"][row]
    return f"{num(r['real_s'])} s against ≈ {num(r['estimate_s'])} s ({times(r['real_over_estimate'])})"


@renderer("first-run")
def first_run_table() -> str:
    """docs/results/first_run.md's table: each job's estimate against its real time, and what it showed."""
    d = data("first_run.json")
    rows = [
        [
            r["run"], f"{r['samples']} × {r['seq_len']}", r["status"], f"{num(r['estimate_s'])} s",
            f"{num(r['estimate_gflops'])} GFLOP/s" if r.get("estimate_gflops") else "this process's own",
            f"{num(r['real_s'])} s", times(r["real_over_estimate"]),
            f"{ppl(r['perplexity_dense'])} → {ppl(r['perplexity'])}" if r.get("perplexity") else "–",
            r["speedup_text"],
        ]
        for r in d["rows"]
    ]  # fmt: skip
    header = [
        "job", "samples × tokens", "status", "estimate", "estimated at", "real", "real / estimate", "perplexity",
        "speed-up",
    ]  # fmt: skip
    note = f"{d['date']}, {d['machine']}, worker's float32 GEMM rate {num(d['gemm_gflops'])} GFLOP/s"
    return f"{note}\n\n{table(header, rows)}\n"
