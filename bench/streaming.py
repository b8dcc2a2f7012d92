"""Peak memory of pruning against model size: in-memory vs streaming execution, on random LLaMA checkpoints.

Writes LLaMA-shaped checkpoints of random weights to disk (one block per safetensors shard, never the
whole model in memory), then runs ``liar prune`` on each in a fresh child process per mode and records
the child's peak RSS (``os.wait4``'s rusage of that one child), on CUDA also the engine's peak device
memory, the wall time, and the size of the pruned checkpoint. Also measures how fast the checkpoint's
files read from disk (cold: evicted from the page cache with ``posix_fadvise``; warm: read again).

Modes are passed to the CLI as ``--execution memory|stream|auto``. A CLI without that flag runs the
in-memory path by default: ``memory`` then runs without the flag, and ``stream``/``auto`` are reported
as "n/a (flag missing)".

    python bench/streaming.py                                  # CPU: 135m and 1.1b, memory and stream
    python bench/streaming.py --shapes 135m --compare          # + tensor-by-tensor equality of the two outputs
    python bench/streaming.py --shapes 1.1b --modes stream --criteria magnitude flap
    python bench/streaming.py --write-only --shapes 135m       # just generate a checkpoint (kept)
    python bench/streaming.py --engine-root /tmp/liar-HEAD     # run the CLI of another source tree
    python bench/streaming.py --cuda-only                      # GPU machine: 7b, 13b on disk (70b: gpu_stream.py)

``--compare`` compares the outputs of every shape run in both modes (key sets, shapes, max |Δ| per
tensor); the 1.1b comparison decides the target's "equal" half. Each run's RSS is also polled from
/proc (anonymous vs file-backed pages at the peak, and when it came).

Rows accumulate in docs/results/streaming.json across invocations (a row is replaced by a new run of
the same shape/dtype/device/mode/criterion); ``--fresh`` starts the table over. Checkpoints go under
``--workdir`` (default /tmp/liar-bench) and are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.random_llama import (  # noqa: E402
    SHAPES,
    dtype_of,
    param_count,
    verify_checkpoint,
    write_random_llama,
)
from bench.rss import dir_bytes, evict, read_throughput, run_measured, weight_files  # noqa: E402
from bench.streaming_report import GB, HEADER, fmt_row, write_report  # noqa: E402

# LLaMA-family shapes (the real models' widths; random weights)
LABELS = {"135m": "SmolLM2-135M", "1.1b": "TinyLlama-1.1B", "7b": "LLaMA-7B", "13b": "LLaMA-13B", "70b": "LLaMA-2-70B"}


# ----------------------------------------------------------------------------- measurements


def engine_label(root: Path) -> str:
    """``root`` and its git commit (+ whether its core/ or app/ has uncommitted changes), if it is a checkout."""
    git = lambda *a: subprocess.run(  # noqa: E731  (read-only: no index refresh, no locks)
        ["git", "--no-optional-locks", "-C", str(root), *a], capture_output=True, text=True
    )
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode or Path(git("rev-parse", "--show-toplevel").stdout.strip() or "/") != Path(root).resolve():
        return f"`{root}`"
    dirty = git("status", "--porcelain", "--", "core", "app/cli").stdout.strip()
    return f"`{root}` at {head.stdout.strip()}" + (" with uncommitted changes in core/ or app/cli/" if dirty else "")


def liar_command() -> list[str]:
    script = Path(sys.executable).with_name("liar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def cli_has_execution_flag(env: dict) -> bool:
    proc = subprocess.run(liar_command() + ["prune", "--help"], capture_output=True, text=True, env=env)
    return "--execution" in proc.stdout


def flag_rejected(res: dict) -> bool:
    return res["rc"] == 2 and "unrecognized arguments" in res["stderr"] and "--execution" in res["stderr"]


def parse_summary(stdout: str) -> dict:
    start = stdout.find("{")
    if start < 0:
        return {}
    try:
        return json.loads(stdout[start:])
    except json.JSONDecodeError:
        return {}


def child_env(engine_root: Path = ROOT) -> dict:
    """The children's environment: offline, and ``engine_root``'s ``core``/``app`` first on the path."""
    return {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(engine_root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def baseline_rss(env: dict, cwd: Path) -> float:
    """Peak RSS of a child that only imports the CLI's engine modules (the floor under every run)."""
    code = "import torch, transformers, safetensors; import core.pipeline.sequential, app.cli"
    res = run_measured([sys.executable, "-c", code], 300, env, cwd)
    return res["peak_rss_mb"] if res["rc"] == 0 else float("nan")


def prune_once(args, model_dir: Path, out_dir: Path, mode: str, criterion: str, flag: bool, env: dict) -> dict:
    """One ``liar prune`` in a fresh process; the row for the table."""
    cmd = liar_command() + ["prune", "--model", str(model_dir), "--output", str(out_dir), "--overwrite"]
    cmd += ["--criterion", criterion, "--ratio", str(args.ratio), "--reconstruction", args.reconstruction]
    cmd += ["--calibration", str(args.calibration), "--samples", str(args.samples), "--seq-len", str(args.seq_len)]
    cmd += ["--dtype", args.dtype, "--device", args.device, "--json", "--quiet"]
    if args.holdout is not None:
        cmd += ["--holdout", str(args.holdout)]
    note = ""
    if flag:
        cmd += ["--execution", mode]
    elif mode == "memory":
        note = "no --execution flag: the CLI's default (in-memory) path"
    else:
        return {"status": "n/a (flag missing)"}
    shutil.rmtree(out_dir, ignore_errors=True)
    if not args.warm:
        evict(model_dir)
    res = run_measured(cmd, args.timeout, env, args.engine_root)
    if flag_rejected(res):
        if mode != "memory":
            return {"status": "n/a (flag missing)"}
        cmd = cmd[: cmd.index("--execution")]
        note = "no --execution flag: the CLI's default (in-memory) path"
        if not args.warm:
            evict(model_dir)
        res = run_measured(cmd, args.timeout, env, args.engine_root)
    row = {"command": " ".join(cmd), **{k: res[k] for k in ("wall_s", "cpu_s", "load_avg_1m_at_end", "peak_rss_mb")}}
    row.update(res["rss_profile"])
    if res["timed_out"]:
        row["status"] = f"timed out after {args.timeout:.0f} s"
        return row
    if res["rc"] != 0:
        row["status"] = f"failed (exit {res['rc']})"
        row["error"] = res["stderr"][-2000:]
        print(res["stderr"][-2000:], file=sys.stderr)
        return row
    summary = parse_summary(res["stdout"])
    row.update(
        status="ok",
        note=note,
        prune_s=summary.get("prune_seconds"),
        engine_peak_mb=summary.get("peak_memory_mb"),  # CUDA: max allocated on the device; CPU: its own RSS
        achieved_ratio=summary.get("achieved_ratio"),
        params_after=summary.get("params_after"),
        output_bytes=dir_bytes(out_dir),
        output_weight_bytes=sum(f.stat().st_size for f in weight_files(out_dir)),
    )
    return row


# ----------------------------------------------------------------------------- comparison


def _key_files(path: Path) -> dict[str, Path]:
    from safetensors import safe_open

    keys = {}
    for f in weight_files(path):
        with safe_open(f, "pt") as fh:
            for k in fh.keys():
                keys[k] = f
    return keys


def compare_outputs(a: Path, b: Path) -> dict:
    """Tensor by tensor (one pair in memory at a time): key sets, shapes, dtypes and max |a − b|."""
    from safetensors import safe_open

    ka, kb = _key_files(a), _key_files(b)
    common = sorted(set(ka) & set(kb))
    shape_mismatch, dtype_mismatch, diffs = [], [], {}
    for k in common:
        with safe_open(ka[k], "pt") as fa, safe_open(kb[k], "pt") as fb:
            ta, tb = fa.get_tensor(k), fb.get_tensor(k)
        if ta.shape != tb.shape:
            shape_mismatch.append(f"{k}: {tuple(ta.shape)} vs {tuple(tb.shape)}")
            continue
        if ta.dtype != tb.dtype:
            dtype_mismatch.append(f"{k}: {ta.dtype} vs {tb.dtype}")
        diffs[k] = float((ta.double() - tb.double()).abs().max()) if ta.numel() else 0.0
    cfg = lambda p: json.loads((p / "config.json").read_text()) if (p / "config.json").exists() else {}  # noqa: E731
    ca, cb = cfg(a), cfg(b)
    worst = max(diffs.items(), key=lambda kv: kv[1]) if diffs else (None, 0.0)
    return {
        "tensors": len(common),
        "keys_equal": set(ka) == set(kb),
        "only_in_memory": sorted(set(ka) - set(kb))[:20],
        "only_in_stream": sorted(set(kb) - set(ka))[:20],
        "shapes_equal": not shape_mismatch,
        "shape_mismatch": shape_mismatch[:20],
        "dtype_mismatch": dtype_mismatch[:20],
        "max_abs_diff": worst[1],
        "worst_tensor": worst[0],
        "bitwise_equal_tensors": sum(1 for v in diffs.values() if v == 0.0),
        "max_abs_diff_per_tensor": diffs,
        "config_keys_differing": sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)),
    }


# ----------------------------------------------------------------------------- the runs


def write_calibration(path: Path) -> Path:
    """Blank-line separated documents over the tiny tokenizer's words (≈40k tokens: enough for 16+8 × 128)."""
    from core.models.tiny import tiny_corpus

    path.write_text("\n\n".join(tiny_corpus(n_docs=300, words_per_doc=120, seed=0)) + "\n")
    return path


def ensure_checkpoint(args, shape: str, dtype: str, device: str = "cpu", weights: bool = True) -> tuple[Path, dict]:
    """Write (or reuse) the checkpoint; returns its path and facts (size, write time, read throughput)."""
    path = Path(args.workdir) / (f"llama-{shape}-{dtype}-seed{args.seed}" + ("" if weights else "-noweights"))
    facts: dict = {"params": param_count(shape)}
    if not (path / "config.json").exists():
        need = param_count(shape) * dtype_of(dtype).itemsize if weights else 0
        need *= 1.05 if args.write_only else 1.9  # + the pruned output (≈0.8 of it at ratio 0.2)
        free = shutil.disk_usage(Path(args.workdir)).free
        if need > free:
            raise OSError(f"disk: checkpoint and output need {need / GB:.1f} GB, {free / GB:.1f} GB free")
        t0 = time.perf_counter()
        write_random_llama(path, shape, dtype, args.seed, args.blocks_per_shard, device=device, weights=weights)
        facts["write_s"] = round(time.perf_counter() - t0, 1)
        print(f"wrote {path} in {facts['write_s']} s", flush=True)
    facts["checkpoint_bytes"] = sum(f.stat().st_size for f in weight_files(path))
    if weights and not args.no_read_test:
        facts.update(read_throughput(path))
    return path, facts


def measure_shape(args, shape: str, flag: bool, env: dict, outputs: dict) -> list[dict]:
    rows = []
    try:
        gen_device = "cuda" if args.device.startswith("cuda") else "cpu"  # CUDA: generate on the GPU (faster)
        model_dir, facts = ensure_checkpoint(args, shape, args.dtype, device=gen_device)
    except OSError as exc:
        skipped = {"status": f"n/a ({exc})"}
        return [_row(args, shape, mode, crit, {}, skipped) for mode in args.modes for crit in args.criteria]
    print(f"{shape}: {facts['checkpoint_bytes'] / GB:.2f} GB on disk, {json.dumps(facts)}", flush=True)
    if args.verify and shape == min(args.shapes, key=param_count):
        proc = subprocess.run(
            [sys.executable, __file__, "--verify-one", str(model_dir)], capture_output=True, text=True, env=env
        )
        line = [x for x in proc.stdout.splitlines() if x.startswith("VERIFY ")]
        facts["verify"] = json.loads(line[0][7:]) if line else {"error": proc.stderr[-2000:]}
        print(f"verify {shape}: {facts['verify']}", flush=True)
    for crit in args.criteria:
        for mode in args.modes:
            out_dir = Path(args.workdir) / f"out-{shape}-{args.dtype}-{args.device}-{crit}-{mode}"
            print(f"  {shape} {mode} {crit} ...", flush=True)
            row = _row(args, shape, mode, crit, facts, prune_once(args, model_dir, out_dir, mode, crit, flag, env))
            if row["status"] == "ok":
                outputs[(shape, crit, mode)] = out_dir
            rows.append(row)
            print(fmt_row(row), flush=True)
    return rows


def _row(args, shape: str, mode: str, criterion: str, facts: dict, run: dict) -> dict:
    return {
        "date": dt.date.today().isoformat(),
        "shape": shape,
        "dtype": args.dtype,
        "device": args.device,
        "mode": mode,
        "criterion": criterion,
        "samples": args.samples,
        "seq_len": args.seq_len,
        "ratio": args.ratio,
        "reconstruction": args.reconstruction,
        "engine": args.engine_label,
        "child_env": " ".join(args.child_env),
        **{k: v for k, v in facts.items() if k != "verify"},
        **run,
    }


def run_cuda_section(args, flag: bool, env: dict, outputs: dict) -> list[dict]:
    """7b / 13b from checkpoints on disk, through the CLI as a user runs it. A 70b checkpoint does not
    fit a 64 GB disk: ``bench/gpu_stream.py`` measures that shape from weights held in host memory."""
    import copy

    cargs = copy.copy(args)
    cargs.device, cargs.dtype, cargs.verify = "cuda", args.cuda_dtype, False
    rows = []
    for shape in args.cuda_shapes:
        if shape == "70b":
            print("70b: no disk here holds it; run bench/gpu_stream.py --runs 70b:128:stream:discard", flush=True)
            continue
        cargs.shapes = [shape]
        rows += measure_shape(cargs, shape, flag, env, outputs)
        if not args.keep:
            _cleanup(Path(args.workdir), shape)
    return rows


def _cleanup(workdir: Path, shape: str | None = None) -> None:
    for p in workdir.glob("*"):
        if shape is None or f"-{shape}-" in p.name:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


# ------------------------------------------------------------------------ the command (the page: streaming_report.py)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["135m", "1.1b"], choices=list(SHAPES))
    p.add_argument("--modes", nargs="+", default=["memory", "stream"], choices=["memory", "stream", "auto"])
    p.add_argument("--criteria", nargs="+", default=["magnitude"], help="magnitude, flap, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--holdout", type=int, help="held-aside windows (default: the recipe's)")
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--reconstruction", default="liar")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocks-per-shard", type=int, default=1)
    p.add_argument("--calibration", type=Path, help="calibration .txt (default: written from the tokenizer's words)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/liar-bench"))
    p.add_argument(
        "--engine-root",
        type=Path,
        default=ROOT,
        help="source tree whose core/ and app/ the liar children run (default: this checkout; e.g. an "
        "exported commit while the working tree is mid-edit)",
    )
    p.add_argument("--keep", action="store_true", help="keep checkpoints and outputs in --workdir")
    p.add_argument("--warm", action="store_true", help="do not evict the checkpoint from the page cache before a run")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per prune run")
    p.add_argument("--compare", action="store_true", help="compare in-memory and streaming outputs, tensor by tensor")
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="load the smallest checkpoint with AutoModelForCausalLM and check finite logits",
    )
    p.add_argument("--no-read-test", action="store_true", help="skip the read-throughput measurement")
    p.add_argument("--write-only", action="store_true", help="only write the checkpoints (implies --keep)")
    p.add_argument(
        "--cuda",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the CUDA section (default: when torch.cuda.is_available())",
    )
    p.add_argument("--cuda-only", action="store_true", help="skip the --shapes section, run only the CUDA one")
    p.add_argument("--cuda-shapes", nargs="+", default=["7b", "13b"], choices=list(SHAPES))
    p.add_argument("--cuda-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--fresh", action="store_true", help="start the table over instead of merging into the JSON")
    p.add_argument("--report-only", action="store_true", help="only rewrite the .md from the .json's rows")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "streaming.md"))
    p.add_argument(
        "--child-env",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment of the liar children (e.g. MALLOC_MMAP_THRESHOLD_=1048576)",
    )
    p.add_argument("--engine-label", help="how the report names --engine-root (default: its git commit)")
    p.add_argument("--verify-one", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = _parser().parse_args()
    if args.verify_one:
        print("VERIFY " + json.dumps(verify_checkpoint(args.verify_one)))
        return
    if args.report_only:
        write_report(args, [], {}, {})
        return

    import torch

    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.write_only:
        for shape in args.shapes:
            path, facts = ensure_checkpoint(args, shape, args.dtype)
            print(f"{path}: {json.dumps(facts)}")
        return
    if args.calibration is None:
        args.calibration = write_calibration(args.workdir / "calibration.txt")
    env = child_env(args.engine_root.resolve())
    env.update(dict(kv.split("=", 1) for kv in args.child_env))
    args.engine_label = args.engine_label or engine_label(args.engine_root)
    flag = cli_has_execution_flag(env)
    print(f"liar prune --execution: {'present' if flag else 'missing (stream/auto rows are n/a)'}", flush=True)
    extra = {"baseline_rss_mb": baseline_rss(env, args.engine_root)}
    print(f"baseline RSS (imports only): {extra['baseline_rss_mb']:,.0f} MB", flush=True)
    print(HEADER, flush=True)
    rows, outputs, comparisons = [], {}, {}
    try:
        if not args.cuda_only:
            for shape in sorted(args.shapes, key=param_count):
                rows += measure_shape(args, shape, flag, env, outputs)
                if args.compare:
                    for crit in args.criteria:
                        a, b = outputs.get((shape, crit, "memory")), outputs.get((shape, crit, "stream"))
                        if a and b:
                            c = compare_outputs(a, b)
                            comparisons[f"{shape}/{crit}"] = c
                            brief = {k: v for k, v in c.items() if k != "max_abs_diff_per_tensor"}
                            print(f"compare {shape}/{crit}: {json.dumps(brief)}", flush=True)
                        else:
                            print(f"compare {shape}/{crit}: needs both a memory and a stream output", flush=True)
                if not args.keep:
                    _cleanup(args.workdir, shape)
        if args.cuda_only or args.cuda or (args.cuda is None and torch.cuda.is_available()):
            if not torch.cuda.is_available():
                print("--cuda: no CUDA device here, skipped", flush=True)
            else:
                rows += run_cuda_section(args, flag, env, outputs)
    finally:
        if rows:
            write_report(args, rows, comparisons, extra)
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
