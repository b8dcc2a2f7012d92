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
import platform
import shutil
import subprocess
import sys
import threading
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

GB = 1e9
MB = 2**20

# LLaMA-family shapes (the real models' widths; random weights)
LABELS = {"135m": "SmolLM2-135M", "1.1b": "TinyLlama-1.1B", "7b": "LLaMA-7B", "13b": "LLaMA-13B", "70b": "LLaMA-2-70B"}
TARGET = (
    "CPU, TinyLlama-1.1B-shaped float32 checkpoint (≈4.4 GB), 16×128 calibration: peak RSS ≤ 1.5 GB in "
    "streaming mode, result equal to the in-memory path"
)
TARGET_RSS_MB = 1.5 * GB / MB


# ----------------------------------------------------------------------------- measurements


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def weight_files(path: Path) -> list[Path]:
    return sorted(Path(path).glob("*.safetensors"))


def evict(path: Path) -> None:
    """Drop the checkpoint's files from the page cache (fsync first: dirty pages are not dropped)."""
    for f in weight_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_throughput(path: Path, chunk: int = 16 * MB) -> dict:
    """Sequential read MB/s of the weight files: cold (after eviction) and warm (again, from the cache)."""
    out = {}
    for label in ("cold", "warm"):
        if label == "cold":
            evict(path)
        total, t0 = 0, time.perf_counter()
        for f in weight_files(path):
            with open(f, "rb", buffering=0) as fh:
                buf = bytearray(chunk)
                view = memoryview(buf)
                while n := fh.readinto(view):
                    total += n
        seconds = time.perf_counter() - t0
        out[f"read_{label}_mb_s"] = round(total / MB / seconds, 1) if seconds > 0 else None
        out[f"read_{label}_s"] = round(seconds, 2)
    return out


_RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


class RssSampler(threading.Thread):
    """Polls /proc/PID/status: the largest sampled VmRSS, its anonymous / file-backed split, and when.

    Sampling can miss a short spike (``os.wait4``'s ``ru_maxrss`` is the exact peak); it tells whether the
    peak is heap (RssAnon) or mapped checkpoint pages (RssFile), and at which second of the run it came.
    """

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval, self.t0 = pid, interval, time.perf_counter()
        self.peak = {"rss": 0, "anon": 0, "file": 0, "at_s": 0.0}
        self.max_anon = self.max_file = 0
        self.timeline: list[tuple[float, float, float]] = []  # (s, RSS MB, anon MB), about once a second
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines())
                rss, anon, file, shmem = (int(fields.get(k, "0 kB").split()[0]) for k in _RSS_FIELDS)
                file += shmem
            except (OSError, ValueError):
                return
            self.max_anon, self.max_file = max(self.max_anon, anon), max(self.max_file, file)
            now = time.perf_counter() - self.t0
            if not self.timeline or now - self.timeline[-1][0] >= 1.0:
                self.timeline.append((round(now, 1), round(rss / 1024, 1), round(anon / 1024, 1)))
            if rss > self.peak["rss"]:
                self.peak = {"rss": rss, "anon": anon, "file": file, "at_s": time.perf_counter() - self.t0}
            self.done.wait(self.interval)

    def result(self) -> dict:
        mb = lambda kb: round(kb / 1024, 1)  # noqa: E731
        return {
            "sampled_peak_rss_mb": mb(self.peak["rss"]),
            "sampled_peak_anon_mb": mb(self.peak["anon"]),
            "sampled_peak_file_mb": mb(self.peak["file"]),
            "sampled_peak_at_s": round(self.peak["at_s"], 1),
            "max_anon_mb": mb(self.max_anon),
            "max_file_mb": mb(self.max_file),
            "rss_timeline": self.timeline,
        }


def run_measured(cmd: list[str], timeout: float, env: dict, cwd: Path) -> dict:
    """Run ``cmd``; its own peak RSS from ``os.wait4`` (this child only), wall time, stdout, stderr."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        sampler = RssSampler(proc.pid)
        sampler.start()
        killed = []
        timer = threading.Timer(timeout, lambda: (killed.append(True), proc.kill()))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            sampler.done.set()
            sampler.join()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "timed_out": bool(killed),
            "wall_s": round(wall, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "rss_profile": sampler.result(),
            "stdout": out.read(),
            "stderr": err.read(),
        }


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


def machine_line() -> str:
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    line = f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, torch {torch.__version__}"
    if torch.cuda.is_available():
        line += f", {torch.cuda.get_device_name()}"
    return line


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


# ----------------------------------------------------------------------------- the report


def _mb(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) and x == x else "–"


def _mode(r: dict) -> str:
    return r["mode"] + (f" ({r['child_env']})" if r.get("child_env") else "")


def fmt_row(r: dict) -> str:
    size = f"{r['checkpoint_bytes'] / GB:.2f}" if r.get("checkpoint_bytes") else "–"
    out = f"{r['output_weight_bytes'] / GB:.2f}" if r.get("output_weight_bytes") else "–"
    dev = _mb(r.get("engine_peak_mb")) if r.get("device", "cpu").startswith("cuda") else "–"
    wall = f"{r['wall_s']:.1f}" if r.get("status") == "ok" else "–"
    prune_s = f"{r['prune_s']:.1f}" if r.get("prune_s") is not None else "–"
    rss = _mb(r.get("peak_rss_mb")) if r.get("status") == "ok" else "–"
    read = f"{r['read_cold_mb_s']:,.0f} / {r['read_warm_mb_s']:,.0f}" if r.get("read_cold_mb_s") else "–"
    return (
        f"| {r['shape']} | {r['dtype']} | {r['device']} | {size} | {read} | {_mode(r)} | {r['criterion']} | "
        f"{rss} | {dev} | {wall} | {prune_s} | {out} | {r['status']} |"
    )


HEADER = (
    "| shape | dtype | device | checkpoint GB | read MB/s cold / warm | mode | criterion | peak RSS MB | "
    "peak device MB | wall s | prune s | output GB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def target_status(rows: list[dict], comparisons: dict) -> str:
    sel = lambda mode: [  # noqa: E731
        r
        for r in rows
        if r["shape"] == "1.1b"
        and r["dtype"] == "float32"
        and r["device"] == "cpu"
        and r["mode"] == mode
        and r["samples"] == 16
        and r["seq_len"] == 128
        and not r.get("child_env")
    ]
    stream = [r for r in sel("stream") if r["status"] == "ok"]
    memory = [r for r in sel("memory") if r["status"] == "ok"]
    parts = []
    if stream:
        worst = max(stream, key=lambda r: r["peak_rss_mb"])  # the target holds for every criterion or not at all
        rss = worst["peak_rss_mb"]
        verdict = "met" if rss <= TARGET_RSS_MB else "NOT met"
        parts.append(f"streaming peak RSS {rss:,.0f} MB with {worst['criterion']}, the highest of the rows ({verdict})")
        for r in rows:
            if r.get("child_env") and r["shape"] == "1.1b" and r["mode"] == "stream" and r["status"] == "ok":
                parts.append(f"with {r['child_env']}: {r['peak_rss_mb']:,.0f} MB")
    else:
        why = sel("stream")[0]["status"] if sel("stream") else "not run"
        parts.append(f"streaming not measured: {why}")
    if memory:
        parts.append(f"in-memory peak RSS {min(r['peak_rss_mb'] for r in memory):,.0f} MB")
    comp = [c for k, c in comparisons.items() if k.startswith("1.1b/")]
    if comp:
        ok = all(c["keys_equal"] and c["shapes_equal"] and c["max_abs_diff"] == 0 for c in comp)
        worst = max(c["max_abs_diff"] for c in comp)
        parts.append(f"result equal to in-memory: {'yes' if ok else 'NO'} (max |Δ| {worst:.3g})")
    else:
        parts.append("equality with the in-memory result: not compared")
    return "; ".join(parts)


def write_report(args, rows: list[dict], comparisons: dict, extra: dict) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_suffix(".json")
    old = {} if args.fresh or not json_path.exists() else json.loads(json_path.read_text())
    key = lambda r: (r["shape"], r["dtype"], r["device"], r["mode"], r["criterion"], r.get("child_env", ""))  # noqa: E731
    merged = {key(r): r for r in old.get("rows", [])}
    merged.update({key(r): r for r in rows})
    order = list(SHAPES)
    all_rows = sorted(merged.values(), key=lambda r: (r["device"], order.index(r["shape"]), r["criterion"], r["mode"]))
    all_comp = {**old.get("comparisons", {}), **comparisons}
    machines = {**old.get("machines", {}), dt.date.today().isoformat(): machine_line()}
    baseline = extra.get("baseline_rss_mb", old.get("baseline_rss_mb"))
    status = target_status(all_rows, all_comp)
    engines = sorted({str(r.get("engine") or f"`{r.get('engine_root')}`") for r in all_rows})
    lines = [
        "# Peak memory of pruning against model size: in-memory vs streaming",
        "",
        f"Measured {', '.join(f'{d} on {m}' for d, m in sorted(machines.items()))}. "
        "Produced by `python bench/streaming.py` (see its docstring for the options).",
        "",
        "- Checkpoints: LLaMA-shaped, random weights (normal(0, 0.02), norms 1, per-tensor seeded generators), "
        "written to disk one transformer block per safetensors shard; the project's tiny word-level tokenizer.",
        "  Shapes: 135m = SmolLM2-135M (576/1536, 30 layers, 9/3 heads, vocab 49152, tied), 1.1b = TinyLlama-1.1B "
        "(2048/5632, 22 layers, 32/4 heads, vocab 32000), 7b, 13b, 70b = LLaMA(-2) widths.",
        f"- Each run: `liar prune` in a fresh process, {args.samples} calibration windows × {args.seq_len} tokens "
        "(plus the recipe's held-aside windows) from a local text file over the tokenizer's words, "
        f"ratio {args.ratio}, reconstruction `{args.reconstruction}`, `--execution MODE` "
        "(a CLI without that flag runs in memory: `stream` is then n/a).",
        "- peak RSS: `ru_maxrss` of that child alone (`os.wait4`), including the interpreter and imports"
        + (
            f" (≈{baseline:,.0f} MB for a process that only imports torch, transformers and the engine)"
            if baseline
            else ""
        )
        + "; mmap'ed checkpoint pages count once touched. "
        "peak device MB: the engine's `torch.cuda.max_memory_allocated`.",
        "- wall s: the whole child (start, imports, load, calibration, prune, save); prune s: the engine's own time. "
        "The checkpoint's pages are evicted from the page cache before every run (`posix_fadvise`), unless `--warm`. "
        "Wall times suffer from other load on the machine; the JSON has each child's CPU seconds and the 1-minute "
        "load average at its end.",
        "- read MB/s: sequential read of the checkpoint's weight files, cold (evicted) / warm (from the page cache).",
        f"- Engine the children ran (`--engine-root`): {'; '.join(engines)}.",
        "- output GB: the pruned checkpoint's weight files.",
        "",
        f"**Target**: {TARGET}.  ",
        f"**Status**: {status}.",
        "",
        HEADER,
        *[fmt_row(r) for r in all_rows],
        "",
    ]
    if all_comp:
        lines += [
            "## In-memory vs streaming outputs",
            "",
            "| shape / criterion | tensors | keys equal | shapes equal | bitwise-equal tensors | max abs diff "
            "| worst tensor |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, c in sorted(all_comp.items()):
            lines.append(
                f"| {k} | {c['tensors']} | {c['keys_equal']} | {c['shapes_equal']} | {c['bitwise_equal_tensors']} | "
                f"{c['max_abs_diff']:.3g} | {c['worst_tensor'] or '–'} |"
            )
        lines.append("")
    sampled = [r for r in all_rows if r.get("sampled_peak_rss_mb")]
    if sampled:
        lines += [
            "## Where the peak is",
            "",
            "/proc/PID/status polled every 50 ms: the largest sampled VmRSS split into anonymous memory (heap,",
            "tensors) and file-backed pages (the mmap'ed safetensors), the second of the run it came at, and",
            "the largest of each part alone.",
            "",
            "| shape | mode | criterion | peak RSS MB (wait4) | sampled peak MB | anon MB | file MB | at s | "
            "max anon MB | max file MB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sampled:
            lines.append(
                f"| {r['shape']} | {_mode(r)} | {r['criterion']} | {_mb(r['peak_rss_mb'])} | "
                f"{_mb(r['sampled_peak_rss_mb'])} | {_mb(r['sampled_peak_anon_mb'])} | "
                f"{_mb(r['sampled_peak_file_mb'])} | {r['sampled_peak_at_s']:.0f} | {_mb(r['max_anon_mb'])} | "
                f"{_mb(r['max_file_mb'])} |"
            )
        lines.append("")
    notes = [r for r in all_rows if r.get("note")]
    if notes:
        lines += ["Notes: " + "; ".join(sorted({f"{r['shape']} {r['mode']}: {r['note']}" for r in notes})), ""]
    out.write_text("\n".join(lines))
    payload = {"machines": machines, "baseline_rss_mb": baseline, "target": TARGET, "target_status": status}
    run_args = vars(args) | {"calibration": str(args.calibration)} if rows else old.get("args")
    payload.update(args=run_args, rows=all_rows, comparisons=all_comp)
    json_path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out} and {json_path.name}")


def main() -> None:
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
    args = p.parse_args()
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
