"""Resuming a stopped prune (docs/results/resume.md): SmolLM2-135M streamed with the default recipe, once
uninterrupted (T) and once SIGKILLed when 70% of its blocks are done and then resumed from its checkpoint
(target: T + one checkpoint interval + the time to load it), each run a fresh process; the results must
be the same shards (sha256) and kept units. The save's size and time for Llama-2-7B and 70B shapes are
computed from the same arithmetic, at the write rate measured here and at an assumed NVMe rate.

    python bench/resume.py                 # SmolLM2-135M, about 3-4 min on 2 cores: resume.json and resume.md
    python bench/resume.py --model tiny    # the tiny random decoder, a few seconds: prints the page, writes no docs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import header, quiet_transformers  # noqa: E402

OUT = ROOT / "docs" / "results" / "resume.json"
PAGE = OUT.with_suffix(".md")
PAGE_TEXT = """# Resuming a stopped prune: SmolLM2-135M killed at 70% of its blocks

Produced by `python bench/resume.py` (`--model tiny`: the same procedure on the tiny random decoder).

<!-- results:resume -->
<!-- /results -->
"""
KILL_AT = 0.7  # the share of blocks done when the run is killed
RATIO = 0.3
NVME_GBS = 2.0  # an assumed NVMe write rate, not measured
SHAPES = {"Llama-2-7B": 4096, "Llama-2-70B": 8192}  # hidden sizes: a save holds one block's inputs
DTYPES = {"float16": 2, "float32": 4}  # a GPU worker's, the CPU's
# the other recipes of the "same result" target, each killed at a random block and resumed
# (their times are not the page's question); a speed target's resume is tested on the tiny model
# only: its choice rests on timings taken in the run, so two uninterrupted runs may keep different prunes
CASES = {
    "paper": {"head_ratio": "same", "reconstruction": {"method": "liar", "select": "criterion"}},
    "depth+width": {"ratio": 0.5, "depth": {"blocks": 8}},
}
KEPT = (
    "checkpoint_saves",
    "checkpoint_seconds",
    "checkpoint_bytes",
    "checkpoint_state_bytes",
    "resumed_at_block",
    "scores_kept_from",
)


def recipe(model: str, workdir: Path) -> dict:
    """The default recipe at ``RATIO``, streamed on the CPU: SmolLM2 on the Wikipedia text, or the tiny
    random decoder (10 blocks) on its own text."""
    if model == "tiny":
        from core.models.tiny import tiny_corpus, tiny_decoder

        path, text = tiny_decoder(workdir / "tiny", num_hidden_layers=10), workdir / "tiny.txt"
        text.write_text("\n\n".join(tiny_corpus(80)))
        calibration = {"dataset": str(text), "num_calibration_samples": 16, "max_seq_length": 32}
    else:
        from bench.assets import smollm2_dir, wikipedia_split

        path, calibration = smollm2_dir(), {"dataset": str(wikipedia_split()[0])}
    return {"model": str(path), "ratio": RATIO, "execution": "stream", "device": "cpu", "calibration": calibration}


def child(args: argparse.Namespace) -> None:
    """One prune in this process: a line per block on stdout (``block DONE TOTAL``), the result's
    shards, kept units, checkpoint metrics and the resume's times in ``args.result``."""
    from bench.common import configure_as_cli

    configure_as_cli()
    quiet_transformers()
    from core.pipeline.checkpoint import FolderCheckpoints
    from core.pipeline.sequential import prune

    stamps: dict[str, float] = {}

    class Timed(FolderCheckpoints):  # when the resume starts reading, and when it is done (its note)
        def load(self, into):
            stamps["load"] = time.time()
            return super().load(into)

        def note(self, message):
            stamps["loop"] = time.time()
            super().note(message)

    def progress(stage, done, total):
        if stage == "reconstruct":
            print(f"block {done} {total}", flush=True)
            time.sleep(args.pause)

    saves = Timed(args.checkpoints, every_seconds=args.interval)
    result = prune(json.loads(args.recipe.read_text()), output_dir=args.out, checkpoints=saves, progress=progress)
    kept = json.dumps([[lp.heads, lp.kv_heads, lp.neurons.tolist()] for lp in result.plan.layers])
    out = {"digests": result.digests, "kept": hashlib.sha256(kept.encode()).hexdigest(), "prune_s": result.seconds}
    out |= {"blocks": len(result.plan.layers), "stamps": stamps} | {k: result.metrics.get(k) for k in KEPT}
    args.result.write_text(json.dumps(out))
    result.discard()


def run(
    args: argparse.Namespace, workdir: Path, name: str, ckpt: str, kill: float | None = None, spec: str = "recipe"
) -> dict:
    """A prune of ``workdir/{spec}.json`` in a child process: its wall seconds and start, and its result,
    or (``kill``) the blocks it had done when it was SIGKILLed once that share of them was done."""
    result = workdir / f"{name}.json"
    cmd = [sys.executable, __file__, "--child", "--recipe", str(workdir / f"{spec}.json"), "--result", str(result)]
    cmd += ["--checkpoints", str(workdir / ckpt), "--out", str(workdir / name), "--interval", str(args.interval)]
    start, t0, done = time.time(), time.perf_counter(), 0
    proc = subprocess.Popen(cmd + ["--pause", str(args.pause)], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if not line.startswith("block "):
            print(line, end="")
            continue
        done, total = map(int, line.split()[1:])
        if kill is not None and done >= min(max(math.ceil(kill * total), 1), total - 1):
            proc.send_signal(signal.SIGKILL)
            break
    proc.stdout.close()
    code, wall = proc.wait(), time.perf_counter() - t0
    killed = kill is not None
    if code != (-signal.SIGKILL if killed else 0):
        sys.exit(f"the {name} run ended with exit status {code}" + (" before it was killed; raise --pause" * killed))
    print(f"{name}: {wall:.1f} s" + (f", killed after {done} blocks" if killed else ""), flush=True)
    out = {"wall_s": round(wall, 3), "start": start, "blocks_done": done}
    return out if killed else out | json.loads(result.read_text())


def same(a: dict, b: dict) -> bool:
    """The same shards (sha256) and the same kept heads and neurons."""
    return a["digests"] == b["digests"] and a["kept"] == b["kept"]


def three_runs(args: argparse.Namespace, workdir: Path, spec: str, kill: float, prefix: str = "") -> tuple[dict, ...]:
    """``workdir/{spec}.json`` uninterrupted, then killed when ``kill`` of its blocks are done, then
    resumed from the killed run's checkpoint: the three :func:`run` results."""
    whole = run(args, workdir, f"{prefix}whole", f"{prefix}ckpt-whole", spec=spec)
    killed = run(args, workdir, f"{prefix}killed", f"{prefix}ckpt", kill=kill, spec=spec)
    return whole, killed, run(args, workdir, f"{prefix}resumed", f"{prefix}ckpt", spec=spec)


def case(args: argparse.Namespace, workdir: Path, spec: dict, name: str, share: float) -> dict:
    """One of ``CASES``: uninterrupted, then killed when ``share`` of its blocks are done and resumed."""
    over = CASES[name] | ({"depth": {"blocks": 2}} if args.model == "tiny" and "depth" in CASES[name] else {})
    (workdir / f"{name}.json").write_text(json.dumps(spec | over))
    whole, killed, resumed = three_runs(args, workdir, name, share, prefix=f"{name}-")
    return {
        "case": name,
        "recipe": over,
        "blocks": whole["blocks"],
        "killed_after": killed["blocks_done"],
        "resumed_at_block": resumed.get("resumed_at_block"),
        "same_result": same(whole, resumed),
    }


def shapes(samples_held: int, rate: float) -> list[dict]:
    """One save's bytes for the 7B and 70B shapes: (samples + held aside) × 2048 tokens × hidden × bytes."""
    return [
        {"model": model, "hidden": hidden, "dtype": dtype, "samples": n, "tokens": 2048}
        | {"state_bytes": (n + samples_held) * 2048 * hidden * size}
        for model, hidden in SHAPES.items()
        for dtype, size in DTYPES.items()
        for n in (128, 1024)
    ]


def measure(args: argparse.Namespace) -> dict:
    """The three runs and the page's numbers."""
    from core.spec.recipe import CalibrationConfig, Recipe

    quiet_transformers()
    workdir = Path(tempfile.mkdtemp(prefix="liar-resume-"))
    try:
        spec = recipe(args.model, workdir)
        cal = Recipe.model_validate(spec).calibration
        (workdir / "recipe.json").write_text(json.dumps(spec))
        whole, killed, resumed = three_runs(args, workdir, "recipe", KILL_AT)
        rng = random.Random(args.seed)  # the block each case is killed at
        cases = [case(args, workdir, spec, name, rng.uniform(0.1, 0.9)) for name in args.cases]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not resumed.get("resumed_at_block"):
        sys.exit("the second run did not resume from the killed run's checkpoint")
    stamps = resumed["stamps"]
    load_s = stamps["loop"] - stamps["load"]
    calibration = {"samples": cal.num_calibration_samples, "tokens": cal.max_seq_length, "holdout": cal.holdout_samples}
    rate = whole["checkpoint_state_bytes"] * whole["checkpoint_saves"] / whole["checkpoint_seconds"] / 1e9
    return header() | {
        "model": "tiny random decoder" if args.model == "tiny" else "SmolLM2-135M",
        "dtype": "float32",
        "blocks": whole["blocks"],
        "interval_s": args.interval,
        "recipe": {"ratio": RATIO, "calibration": calibration},
        "uninterrupted": {k: whole[k] for k in ("wall_s", "prune_s", *KEPT[:4])},
        "killed": {k: killed[k] for k in ("wall_s", "blocks_done")},
        "resumed": {k: resumed[k] for k in ("wall_s", "prune_s", "resumed_at_block", "scores_kept_from")}
        | {"before_loop_s": round(stamps["load"] - resumed["start"], 3), "load_s": round(load_s, 3)},
        "total_s": round(killed["wall_s"] + resumed["wall_s"], 3),
        "target_s": round(whole["wall_s"] + args.interval + load_s, 3),
        "same_result": same(whole, resumed),
        "cases": cases,
        "write_rate_gbs": round(rate, 3),
        "nvme_gbs": NVME_GBS,
        "default_tokens": CalibrationConfig.model_fields["max_seq_length"].default,
        "shapes": shapes(cal.holdout_samples, rate),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--interval", type=float, help="seconds between checkpoints (default: 5; tiny: every block)")
    ap.add_argument("--pause", type=float, help="seconds each block waits (default: 0; tiny: 0.1, so the kill lands)")
    ap.add_argument("--cases", help=f"other recipes, killed at a random block: {', '.join(CASES)} (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="the random blocks the cases are killed at")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("recipe", "result", "checkpoints", "out"):
        ap.add_argument(f"--{name}", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    tiny = args.model == "tiny"
    args.interval = (0.0 if tiny else 5.0) if args.interval is None else args.interval
    args.pause = (0.1 if tiny else 0.0) if args.pause is None else args.pause
    if not (args.interval >= 0 and args.pause >= 0):
        ap.error("--interval and --pause are seconds, 0 or more")
    args.cases = list(CASES) if args.cases is None else [c for c in args.cases.split(",") if c]
    if unknown := [c for c in args.cases if c not in CASES]:
        ap.error(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    if args.child:
        return child(args)
    results = measure(args)
    from bench.pages.resume import render

    if tiny:  # proves the procedure; the docs keep SmolLM2's numbers only
        print(render(results))
        return None
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    if not PAGE.exists():
        PAGE.write_text(PAGE_TEXT)
    subprocess.run([sys.executable, str(ROOT / "bench" / "render_docs.py")], check=True)
    print(f"wrote {OUT} and {PAGE}")
    return None


if __name__ == "__main__":
    main()
