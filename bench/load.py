"""Load on the job database: the job list, a job's page and the dashboard with 10,000 jobs and 8
concurrent clients.

Fabricates ``--jobs`` jobs straight into a fresh database — PostgreSQL (a new database on the local
server, dropped afterwards) and SQLite (a file) — shaped like real ones on a 30-layer model: the
stored recipe and evaluation, a per-layer report (60 rows), stage timings with a step per layer, 16
metrics, 43 artifact rows (the checkpoint and each of its files), 12 log lines; 85% succeeded, the
rest failed (with a traceback), cancelled, queued or running. Then ``--clients`` threads — as the web
server's worker threads would — each call in turn, ``--rounds`` times, what the pages and the API call:

- ``list_jobs``: the API's job list, ``json.dumps(service.list())`` (the 100 newest jobs)
- ``jobs_tab``: the Jobs tab's table, ``app.web.views.job_rows(service)`` (the 200 newest)
- ``show_job``: the API's job page, ``json.dumps(service.show(id))``, for a random job (the Model
  page reads the same)
- ``dashboard``: the Dashboard's rows, ``app.web.charts.run_rows(service)`` (the 1,000 newest
  succeeded jobs and their metrics)

and reports each call's latency (p50 / p95 / max) and the calls per second. Target: p95 ≤ 1 s.
Writes ``docs/results/load.json`` and ``docs/results/load.md``.

    python bench/load.py                                   # both databases, 10,000 jobs, 8 clients
    python bench/load.py --backends postgres --jobs 10000 --clients 8 --rounds 20
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_P95_S = 1.0
LAYERS = 30
METRIC_NAMES = (
    "target_ratio achieved_ratio ratio_deviation params_before params_after block_params_before block_params_after "
    "prune_seconds peak_memory_mb block_seconds_dense block_seconds_pruned block_speedup perplexity eval_tokens "
    "perplexity_dense round_to_heads"
).split()
FILES = ["config.json", "generation_config.json", "model.safetensors.index.json", "modeling_liar.py"]
FILES += ["liar_families.py", "recipe.yaml", "metrics.json", "README.md", "tokenizer.json", "tokenizer_config.json"]
FILES += [f"model-{i:05d}-of-{LAYERS + 1:05d}.safetensors" for i in range(1, LAYERS + 2)] + ["SHA256SUMS"]
STATUSES = ["SUCCEEDED"] * 85 + ["FAILED"] * 8 + ["CANCELLED"] * 4 + ["QUEUED"] * 2 + ["RUNNING"]


@contextmanager
def database(backend: str, folder: Path) -> Iterator[str]:
    """A fresh, empty database's URL (PostgreSQL: dropped afterwards)."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'load.db'}"
        return
    from tests.jobs.conftest import postgres_database  # the test suite's scratch database

    with postgres_database("liar_load") as url:
        yield url


def _job(i: int, rng: random.Random, now: dt.datetime, folder: Path) -> dict:
    """One fabricated ``jobs`` row (with its children under ``_children``)."""
    from core.spec.recipe import Recipe

    status = rng.choice(STATUSES)
    ratio, method = rng.choice([0.1, 0.2, 0.3, 0.4, 0.5]), rng.choice(["liar", "ls", "bias", "none"])
    criterion = rng.choice(["magnitude", "flap", "random", "snip"])
    recipe = Recipe.model_validate(
        {
            "model": rng.choice(["HuggingFaceTB/SmolLM2-135M", "TinyLlama/TinyLlama-1.1B", "meta-llama/Llama-2-7b"]),
            "ratio": ratio,
            "criterion": {"name": criterion},
            "reconstruction": {"method": method},
            "calibration": {"dataset": "wikitext2", "num_calibration_samples": 64, "max_seq_length": 128},
        }
    ).model_dump(mode="json", exclude_none=True)
    created = now - dt.timedelta(seconds=60 * (10**5 - i))
    started = created + dt.timedelta(seconds=5)
    finished = status not in ("QUEUED", "RUNNING")
    steps = [round(rng.uniform(1, 3), 3) for _ in range(LAYERS)]
    row = {
        "id": i,
        "recipe": recipe,
        "evaluations": [{"type": "perplexity", "dataset": "wikitext2", "seq_len": 512, "max_windows": None}],
        "status": status,
        "stage": "done" if status == "SUCCEEDED" else ("queued" if status == "QUEUED" else "reconstruct"),
        "layer": None if status == "QUEUED" else LAYERS,
        "n_layers": None if status == "QUEUED" else LAYERS,
        "progress": 1.0 if status == "SUCCEEDED" else 0.5,
        "created_at": created,
        "started_at": None if status == "QUEUED" else started,
        "finished_at": started + dt.timedelta(seconds=120) if finished else None,
        "heartbeat_at": now if status == "RUNNING" else None,
        "worker": None if status == "QUEUED" else f"gpu-node-{i % 8}:{1000 + i}",
        "attempts": 0 if status == "QUEUED" else 1,
        "cancel_requested": status == "CANCELLED",
        "celery_id": uuid.UUID(int=rng.getrandbits(128)).hex,
        "submitted_by": f"user{i % 20}",
        "group_id": f"sweep{i // 8:06d}",
        "error": "RuntimeError: CUDA out of memory" if status == "FAILED" else None,
        "traceback": "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 40
        if status == "FAILED"
        else None,
        "report": [
            {
                "layer": layer,
                "module": module,
                "kept": 6 if module == "attention" else 1075,
                "total": 9 if module == "attention" else 1536,
                "error_before": rng.random(),
                "error_after": rng.random() / 4,
                "measured_on": "held-aside",
                "seconds": rng.uniform(0.5, 2),
                "peak_memory_mb": rng.uniform(500, 900),
            }
            for layer in range(LAYERS)
            for module in ("attention", "ffn")
        ]
        if status == "SUCCEEDED"
        else None,
        "timings": {
            "stages": [
                {"stage": "starting", "seconds": 4.1},
                {"stage": "load", "seconds": 2.0},
                {"stage": "calibration", "seconds": 1.2},
                {"stage": "scoring", "seconds": 3.3},
                {"stage": "reconstruct", "seconds": sum(steps), "steps": steps},
                {"stage": "evaluate", "seconds": 30.5, "steps": [30.5]},
                {"stage": "export", "seconds": 1.0},
            ],
            "total": 100.0,
        },
        "_children": _children(i, status, rng),
    }
    return row


def _children(i: int, status: str, rng: random.Random) -> dict[str, list[dict]]:
    """The job's metrics, artifacts and log lines."""
    succeeded = status == "SUCCEEDED"
    metrics = [{"job_id": i, "name": n, "value": rng.uniform(0, 100)} for n in METRIC_NAMES] if succeeded else []
    checkpoint = f"artifacts/job-{i}/attempt-1/checkpoint"  # keys in the store (jobs.store), as workers write them
    artifacts = [{"job_id": i, "kind": "checkpoint", "path": checkpoint, "name": None, "size": 10**9}]
    artifacts += [
        {"job_id": i, "kind": "file", "path": f"{checkpoint}/{f}", "name": f, "size": 10**7, "sha256": "ab" * 32}
        for f in FILES
    ]
    lines = ["submitted by someone", f"started on gpu-node-{i % 8}:{1000 + i}", "load 2.0 s", "calibration 1.2 s"]
    lines += ["scoring 3.3 s", "reconstruct 61.2 s (30 layers; slowest: layer 4 at 2.9 s)", "evaluate 30.5 s"]
    lines += ["dense model perplexity 20.1 (measured)", "export 1.0 s", "total 100.0 s", "succeeded", "cleaned up"]
    logs = [{"job_id": i, "level": "INFO", "message": m} for m in lines]
    return {"metrics": metrics, "artifacts": artifacts if succeeded else [], "job_logs": logs}


def fabricate(url: str, n_jobs: int, folder: Path, batch: int = 500) -> dict[str, int]:
    """Insert ``n_jobs`` jobs and their children (bulk inserts, ``batch`` jobs at a time); row counts."""
    import sqlalchemy as sa

    from jobs.db import Base, connect

    engine = connect(url).kw["bind"]
    tables = Base.metadata.tables
    rng, now = random.Random(0), dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    counts = {"jobs": 0, "metrics": 0, "artifacts": 0, "job_logs": 0}
    for start in range(1, n_jobs + 1, batch):
        jobs = [_job(i, rng, now, folder) for i in range(start, min(start + batch, n_jobs + 1))]
        children = {name: [r for j in jobs for r in j["_children"][name]] for name in counts if name != "jobs"}
        with engine.begin() as c:
            c.execute(sa.insert(tables["jobs"]), [{k: v for k, v in j.items() if k != "_children"} for j in jobs])
            for name, rows in children.items():
                if rows:
                    c.execute(sa.insert(tables[name]), rows)
        counts["jobs"] += len(jobs)
        for name, rows in children.items():
            counts[name] += len(rows)
    if engine.dialect.name == "postgresql":
        with engine.begin() as c:
            c.execute(sa.text("SELECT setval('jobs_id_seq', (SELECT max(id) FROM jobs))"))
            c.execute(sa.text("ANALYZE"))
    return counts


def calls(service, n_jobs: int) -> dict[str, Callable[[random.Random], object]]:
    """The calls a client makes, by name (see the module docstring)."""
    from app.web import charts, views

    return {
        "list_jobs": lambda rng: json.dumps(service.list()),
        "jobs_tab": lambda rng: views.job_rows(service),
        "show_job": lambda rng: json.dumps(service.show(rng.randint(1, n_jobs))),
        "dashboard": lambda rng: charts.run_rows(service),
    }


def run_clients(service, n_jobs: int, clients: int, rounds: int) -> tuple[dict[str, list[float]], float]:
    """Each client thread calls every kind once per round, in its own random order; latencies by
    kind and the wall time of the whole run."""
    kinds = calls(service, n_jobs)
    for call in kinds.values():  # warm-up: imports, connections, the database's caches
        call(random.Random(0))
    latencies: dict[str, list[float]] = {k: [] for k in kinds}
    lock, start = threading.Lock(), threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        try:
            for _ in range(rounds):
                for name in rng.sample(list(kinds), len(kinds)):
                    t = time.perf_counter()
                    kinds[name](rng)
                    with lock:
                        latencies[name].append(time.perf_counter() - t)
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return latencies, time.perf_counter() - t0


def server_version(service) -> str:
    """The database's name and version."""
    import sqlalchemy as sa

    with service.sessions() as s:
        if s.bind.dialect.name == "postgresql":
            return "PostgreSQL " + s.execute(sa.text("SHOW server_version")).scalar().split()[0]
        return "SQLite " + s.execute(sa.text("SELECT sqlite_version()")).scalar()


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def bench_backend(backend: str, args: argparse.Namespace) -> list[dict]:
    from jobs.service import JobService
    from jobs.settings import Settings

    with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
        t = time.perf_counter()
        counts = fabricate(url, args.jobs, Path(tmp) / "artifacts")
        made = time.perf_counter() - t
        print(f"{backend}: fabricated {counts} in {made:.1f} s", flush=True)
        settings = Settings(data_dir=Path(tmp), database_url=url, broker_url="memory://", lease_seconds=3600)
        service = JobService(settings)
        server = server_version(service)
        latencies, wall = run_clients(service, args.jobs, args.clients, args.rounds)
    n_calls = sum(len(v) for v in latencies.values())
    rows = []
    for name, values in latencies.items():
        p95 = percentile(values, 95)
        rows.append(
            {
                "backend": backend,
                "server": server,
                "call": name,
                "jobs": args.jobs,
                "clients": args.clients,
                "calls": len(values),
                "p50_s": round(percentile(values, 50), 4),
                "p95_s": round(p95, 4),
                "max_s": round(max(values), 4),
                "calls_per_s": round(n_calls / wall, 1),
                "target_met": p95 <= TARGET_P95_S,
                "rows": counts,
            }
        )
        print(f"{backend:8s} {name:10s} p50 {rows[-1]['p50_s']:.3f} s  p95 {p95:.3f} s  max {max(values):.3f} s")
    return rows


def write(rows: list[dict], args: argparse.Namespace) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    stamp, load = dt.date.today().isoformat(), os.getloadavg()
    payload = {"date": stamp, "machine": machine, "load_average": load, "rows": rows}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Job database under load: 10,000 jobs, 8 concurrent clients",
        "",
        f"Measured {stamp} on {machine} ({', '.join(sorted({r['server'] for r in rows}))}); load average "
        f"{load[0]:.1f} at the end (other work shared the cores). Produced by `python bench/load.py` (see its "
        "docstring): each client thread calls every kind once per round, in its own random order.",
        "",
        f"**Target**: p95 ≤ {TARGET_P95_S:g} s per call for the job list, the job page and the dashboard.",
        "",
        "| database | call | jobs | clients | calls | p50 s | p95 s | max s | calls/s (all kinds) | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['call']} | {r['jobs']:,} | {r['clients']} | {r['calls']} | {r['p50_s']:.3f} | "
            f"{r['p95_s']:.3f} | {r['max_s']:.3f} | {r['calls_per_s']} | {'met' if r['target_met'] else 'missed'} |"
        )
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=["postgres", "sqlite"], choices=["postgres", "sqlite"])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=20, help="calls of each kind per client")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "load.md"))
    args = p.parse_args()
    rows = [row for backend in args.backends for row in bench_backend(backend, args)]
    write(rows, args)


if __name__ == "__main__":
    main()
