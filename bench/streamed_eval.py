"""Peak memory and time of evaluating a checkpoint in memory vs block by block (``liar eval --stream``).

Writes (or reuses) a LLaMA-shaped checkpoint of random weights (``bench/random_llama.py``), builds a
local lm-eval cloze task from the tiny tokenizer's corpus, then runs ``liar eval`` in a fresh child
process per mode — perplexity and the task together — and records the child's peak RSS, wall time,
the scores (which must agree between the modes) and how many times the streamed run read the model.

    python bench/streamed_eval.py                         # 1.1b float32, CPU
    python bench/streamed_eval.py --shape 135m --keep

Results: docs/results/streamed_eval.md / .json (rows replaced per shape, dtype and mode).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.random_llama import param_count, write_random_llama  # noqa: E402
from bench.rss import run_measured  # noqa: E402
from bench.streaming import LABELS, child_env, write_calibration  # noqa: E402
from bench.streaming_report import machine_line  # noqa: E402

OUT = ROOT / "docs" / "results" / "streamed_eval"


def task_dir(workdir: Path, items: int) -> Path:
    """A wiki_cloze task over the tiny tokenizer's words (the random model's vocabulary)."""
    from core.evaluation.lmeval import write_wiki_cloze_task
    from core.models.tiny import tiny_corpus

    d = workdir / f"tasks-cloze-{items}"
    if not (d / "wiki_cloze.yaml").exists():
        passages = tiny_corpus(n_docs=items // 2, words_per_doc=120, seed=1)
        write_wiki_cloze_task(d, passages, items_per_passage=2, seed=0)
    return d


def eval_once(model: Path, tasks: Path, text: Path, stream: bool, env: dict) -> dict:
    cmd = [sys.executable, "-m", "app.cli", "eval", str(model), "--tasks", "wiki_cloze", "--task-dir", str(tasks)]
    cmd += ["--ppl", str(text), "--seq-len", "128", "--max-windows", "32", "--batch-size", "8"]
    cmd += ["--device", "cpu", "--json"] + (["--stream"] if stream else [])
    res = run_measured(cmd, timeout=3600, env=env, cwd=ROOT)
    if res["rc"] != 0:
        raise RuntimeError(f"liar eval failed ({res['rc']}): {res['stderr'][-2000:]}")
    out = json.loads(res["stdout"])
    return {
        "mode": "stream" if stream else "memory",
        "wall_s": res["wall_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "perplexity": out["perplexity"],
        "acc": out["tasks"]["wiki_cloze"]["acc"],
        "acc_norm": out["tasks"]["wiki_cloze"]["acc_norm"],
        "model_reads": out.get("model_reads"),
        "load_avg_1m_at_end": res["load_avg_1m_at_end"],
    }


def write_report(rows: list[dict], facts: dict) -> None:
    lines = [
        "# Evaluating a checkpoint bigger than the device: in memory vs block by block",
        "",
        f"Measured {dt.date.today()} on {machine_line()}. Produced by `python bench/streamed_eval.py`.",
        "",
        "`liar eval MODEL --ppl TEXT --seq-len 128 --max-windows 32 --tasks wiki_cloze --batch-size 8`, with and",
        "without `--stream`, each in a fresh process: LLaMA-shaped checkpoints of random weights (float32 on",
        f"disk, one block per shard), the tiny word-level tokenizer, a local cloze task of {facts['items']} items ×",
        "5 choices. Peak RSS is the child's own (`os.wait4`); `reads`: times the streamed run read the whole",
        "model for the task (perplexity reads it once more). The scores must agree between the modes.",
        "",
        "| model | params | checkpoint | mode | wall s | peak RSS MB | perplexity | acc | acc_norm | reads |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {LABELS.get(r['shape'], r['shape'])}-shaped | {r['params'] / 1e9:.2f} B | "
            f"{r['checkpoint_gb']:.2f} GB | {r['mode']} | {r['wall_s']:.1f} | "
            f"{r['peak_rss_mb']:,.0f} | {r['perplexity']:.4f} | {r['acc']:.4f} | {r['acc_norm']:.4f} | "
            f"{r['model_reads'] or '–'} |"
        )
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1.1b", choices=sorted(LABELS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--items", type=int, default=200, help="cloze items of the task")
    ap.add_argument("--workdir", default="/tmp/liar-bench")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / f"llama-{args.shape}-{args.dtype}-seed0"
    if not (model / "config.json").exists():
        write_random_llama(model, args.shape, args.dtype, 0)
    checkpoint = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 1e9
    tasks, text = task_dir(workdir, args.items), write_calibration(workdir / "eval.txt")
    env = child_env()
    rows = []
    for stream in (False, True):
        row = eval_once(model, tasks, text, stream, env)
        row.update(shape=args.shape, dtype=args.dtype, params=param_count(args.shape), checkpoint_gb=checkpoint)
        print(json.dumps(row), flush=True)
        rows.append(row)
    path = OUT.with_suffix(".json")
    old = json.loads(path.read_text()) if path.exists() else []
    keys = {(r["shape"], r["dtype"], r["mode"]) for r in rows}
    merged = [r for r in old if (r["shape"], r["dtype"], r["mode"]) not in keys] + rows
    path.write_text(json.dumps(merged, indent=2) + "\n")
    write_report(merged, {"items": args.items})
    if not args.keep:
        import shutil

        shutil.rmtree(model, ignore_errors=True)
    reference = rows[0]
    for r in rows[1:]:
        same = abs(r["acc"] - reference["acc"]) < 1e-9 and abs(r["perplexity"] / reference["perplexity"] - 1) < 1e-4
        print(f"{r['mode']}: {'same scores' if same else 'SCORES DIFFER'} as in memory")


if __name__ == "__main__":
    main()
