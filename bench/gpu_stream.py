"""Device memory and time of streamed against in-memory pruning on a GPU, up to 70B-shaped models.

A 70B bf16 checkpoint (138 GB) does not fit a 64 GB disk, and neither does its pruned output, so the
weights come from a :class:`PoolReader` instead of safetensors shards: every tensor of a LLaMA-shaped
model is a window of one random normal(0, 0.02) pool in host memory (norms are ones), read into a
fresh (pinned) host buffer exactly as :class:`core.models.safetensors_io.CheckpointReader` reads a
shard. Only the reader is replaced — the skeleton, block loading with prefetch, scoring, pruning,
reconstruction, activation spill and shard writing are the engine's. With a run's ``:discard`` the output
shards are moved to the host and dropped instead of written (each file is left empty), for shapes
whose pruned checkpoint does not fit the disk either; an in-memory run's "save" then moves every
pruned weight to the host the same way, so both modes pay the same for their output. Random weights
are fine for memory and time: the work does not depend on the values. Disk read throughput is
``bench/streaming.py``'s business.

Each row runs in a fresh child process (``os.wait4``'s peak RSS of that child alone):

- ``memory``: every tensor read from the pool onto the device (``load s``), ``core.prune`` in memory,
  ``PruneResult.save`` (a real checkpoint, unless ``--discard``);
- ``stream``: ``core.prune`` with ``execution: stream`` and an output directory (blocks read,
  pruned, written and freed one at a time), then ``PruneResult.save``.

Peak device memory is ``torch.cuda.max_memory_allocated`` over the whole run (read at every progress
report, since the engine resets the counter before its reconstruction pass). ``prune s`` splits into
``scoring s`` (the criterion's pass: a streamed run's first read of every block) and ``blocks s``
(the prune pass, up to the last shard handed to the writer), from the engine's progress reports.
``--profile FILE`` profiles the streamed runs with torch.profiler: operators by device time, and
the engine's ``liar.*`` ranges by host time (waits for a block's read, copies to and from the
device, waits for the shard writer), to tell where a streamed run loses time against one in memory.

    python bench/gpu_stream.py --runs 7b:128:memory 7b:128:stream 70b:128:stream:discard 30b:1024:stream:discard
    python bench/gpu_stream.py --runs small:16:memory small:16:stream --device cpu   # smoke test anywhere

A run is ``shape:samples:mode[:discard]``; rows accumulate in ``--json`` (default
docs/results/gpu_stream.json, replaced per run key) and the table is written beside it as .md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import flags, today  # noqa: E402
from bench.random_llama import INIT_STD, random_calibration, tensor_specs, write_config_and_tokenizer  # noqa: E402
from bench.rss import run_measured  # noqa: E402
from bench.shapes import LLAMA_SHAPES  # noqa: E402
from core.spec.recipe import ACTIVATIONS  # noqa: E402

TARGETS = {  # the big-model issue's device-memory targets (GB) for streamed runs
    ("70b", 128): 24.0,
    ("30b", 1024): 30.0,
}


class PoolReader:
    """``CheckpointReader``'s interface (``entries``, ``in``, ``read``, ``read_host``) over weights cut
    from one random pool: tensor ``name`` is the window of the pool at an offset hashed from its name,
    the same for the same (shape, seed, name)."""

    def __init__(self, shape: str, dtype, seed: int = 0):
        import torch

        from core.models.safetensors_io import _Entry

        specs = [(name, dims) for _, name, dims in tensor_specs(shape)]
        largest = max(math.prod(d) for _, d in specs)
        gen = torch.Generator().manual_seed(seed)
        self.pool = torch.randn(largest + 65_537, generator=gen).mul_(INIT_STD).to(dtype)
        self.entries = {
            name: _Entry(Path("<generated>"), dtype, tuple(dims), 0, math.prod(dims) * dtype.itemsize)
            for name, dims in specs
        }

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read_host(self, name: str, pinned: bool = False):
        import torch

        e = self.entries[name]
        host = torch.empty(e.shape, dtype=e.dtype, pin_memory=pinned)
        n = host.numel()
        if len(e.shape) == 1:
            host.fill_(1.0)
        elif n:
            offset = zlib.crc32(name.encode()) % (self.pool.numel() - n + 1)
            host.view(-1).copy_(self.pool[offset : offset + n])
        return host

    def read(self, name: str, device="cpu", dtype=None):
        import torch

        from core.models.safetensors_io import place

        device = torch.device(device)
        return place(self.read_host(name, pinned=device.type == "cuda"), device, dtype)


def discard_shard(path, tensors) -> str:
    """Stand-in for ``write_shard`` that moves each tensor to the host (as writing does) and drops it."""
    from core.models.safetensors_io import LazyTensor

    for _, t in tensors:
        if t.numel():
            (t.load() if isinstance(t, LazyTensor) else t.detach()).to("cpu")
    Path(path).touch()
    return "0" * 64


def fake_checkpoint(directory: Path, shape: str, reader: PoolReader) -> None:
    """config.json, the tiny tokenizer and an index naming every tensor (the reader supplies them)."""
    write_config_and_tokenizer(directory, shape, "bfloat16")
    index = {"metadata": {"total_size": 0}, "weight_map": {n: "generated.safetensors" for n in reader.entries}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def recipe_for(args, shape: str, samples: int, mode: str, directory: Path) -> dict:
    criterion = {"name": args.criterion}
    reconstruction = {"method": args.method, "select": args.select} if args.criterion != "auto" else {}
    return {
        "model": str(directory),
        "ratio": args.ratio,
        "dtype": "bfloat16",
        "device": args.device,
        "criterion": criterion,
        "reconstruction": reconstruction,
        "stats_dtype": "float32",
        "activations": args.activations,
        "execution": mode,
        "calibration": {
            "texts": ["(pre-tokenised)"],
            "num_calibration_samples": samples,
            "max_seq_length": args.seq_len,
            "holdout_samples": args.holdout,
            "batch_size": 16,
        },
    }


def reader_patches(reader, discard: bool) -> list:
    """The engine reads the pool's weights for the checkpoint's; with ``discard`` it writes no shard."""
    patches = [mock.patch("core.models.streaming.CheckpointReader", lambda directory: reader)]
    if discard:
        patches.append(mock.patch("core.pipeline.streamed.write_shard", discard_shard))
        patches.append(mock.patch("core.pipeline.streamed._check_free_space", lambda *a: None))
    return patches


def child(args) -> None:
    """One run, in this process; prints its row as JSON on the last line."""
    import torch

    from core import prune

    shape, samples, mode, *flags = args.child.split(":")
    samples, discard = int(samples), "discard" in flags
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16
    work = Path(tempfile.mkdtemp(prefix=f"liar-gpu-{shape}-", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        reader = PoolReader(shape, dtype)
        pool_s = time.perf_counter() - t0
        (src := work / "model").mkdir()
        fake_checkpoint(src, shape, reader)
        calibration = random_calibration(LLAMA_SHAPES[shape]["vocab_size"], samples, args.seq_len, args.holdout)
        peak = [0.0]
        first_report: dict[str, float] = {}  # when each stage was first reported (host clock)

        def progress(stage, i, n) -> None:  # the engine resets the peak before reconstruction: read it first
            if cuda:
                peak[0] = max(peak[0], torch.cuda.max_memory_allocated() / 1e6)
            first_report.setdefault(stage, time.perf_counter())

        recipe = recipe_for(args, shape, samples, mode, src)
        out = work / "out"
        for p in reader_patches(reader, discard):
            p.start()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        load_s = 0.0
        t0 = time.perf_counter()
        if mode == "memory":
            model = load_in_memory(src, args.device, dtype)
            if cuda:
                torch.cuda.synchronize()
            load_s = time.perf_counter() - t0
            result = prune(recipe, model=model, calibration=calibration, progress=progress)
        else:
            with profiled(args.profile, cuda):
                result = prune(recipe, calibration=calibration, progress=progress, output_dir=out, overwrite=True)
        if cuda:
            torch.cuda.synchronize()
        prune_s = time.perf_counter() - t0 - load_s
        progress("done", 1, 1)
        stages = ("load", "scoring", "reconstruct", "done")  # scoring: a streamed run's first read
        at = [first_report.get(k) for k in stages]
        t1 = time.perf_counter()
        if not discard:
            result.save(out, overwrite=True)
        elif mode == "memory":  # what saving costs besides the disk: every weight moved to the host
            out.mkdir(parents=True, exist_ok=True)
            discard_shard(out / "discarded.safetensors", list(result.model.state_dict().items()))
        save_s = time.perf_counter() - t1
        row = {
            "run": args.child,
            "shape": shape,
            "samples": samples,
            "mode": mode,
            "discard": discard,
            "criterion": result.metrics.get("criterion"),
            "activations": result.metrics.get("activations"),
            "execution": result.metrics.get("execution"),
            "achieved_ratio": round(result.achieved_ratio, 4),
            "pool_s": round(pool_s, 1),
            "load_s": round(load_s, 1),
            "prune_s": round(prune_s, 1),
            "save_s": round(save_s, 1),
            "total_s": round(load_s + prune_s + save_s, 1),
            "score_s": round(at[2] - at[1], 1) if all(at[1:3]) else None,
            "reconstruct_s": round(at[3] - at[2], 1) if all(at[2:]) else None,
            "peak_device_mb": round(peak[0]),
            "weights_gb": round(sum(e.nbytes for e in reader.entries.values()) / 1e9, 1),
            "device": machine(),
        }
        print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def profiled(path: str | None, cuda: bool):
    """Profile the block inside with torch.profiler when ``path`` is given and write two tables there:
    operators by device time, and the engine's host-side ranges (``liar.*``: waits for a block's read,
    its copies to and from the device, waits for the shard writer) by host time."""
    if not path:
        yield
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    by_device = events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=30)
    ranges = [e for e in events if e.key.startswith("liar.")]
    lines = ["| range | calls | host s (total) |", "|---|---|---|"]
    lines += [f"| {e.key} | {e.count} | {e.cpu_time_total / 1e6:.2f} |" for e in sorted(ranges, key=lambda e: e.key)]
    Path(path).write_text(by_device + "\n\nEngine ranges (host time, including waits):\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def load_in_memory(directory: Path, device: str, dtype):
    """The whole model on the device, read block by block through the engine's streamed model (whose
    checkpoint reader is the pool while the child's patches are active)."""
    from core.models.streaming import StreamedModel

    sm = StreamedModel(directory, dtype, device, prefetch=False)
    sm.load_outer()
    for i in range(len(sm.layers)):
        sm.load_block(i)
    return sm.model


def passthrough(args) -> list[str]:
    passed = ("device", "ratio", "criterion", "method", "select", "activations", "seq_len", "holdout", "profile")
    return flags(args, *passed, "workdir")


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} (CPU)"


def _cell(value) -> str:
    return "–" if value is None else str(value)


def _measured(row: dict) -> str:
    return f"{row.get('date', '–')}, {row.get('device', '–')}"


def write_report(path: Path, rows: list[dict], header: str) -> None:
    lines = [
        "# Streamed against in-memory pruning on a GPU: device memory and time",
        "",
        header,
        "",
        "| shape | samples | mode | output | criterion | activations | load s | prune s | scoring s | blocks s "
        "| save s | total s | peak device GB | bf16 weights GB | peak RSS GB | target | status | measured on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['run']} | | | | | | | | | | | | | | | | {r.get('status')} | {_measured(r)} |")
            continue
        target = TARGETS.get((r["shape"], r["samples"])) if r["mode"] == "stream" else None
        met = (
            "–"
            if target is None
            else f"≤ {target:.0f} GB: {'met' if r['peak_device_mb'] / 1e3 <= target else 'missed'}"
        )
        lines.append(
            f"| {r['shape']} | {r['samples']} | {r['mode']} | {'discarded' if r['discard'] else 'written'} | "
            f"{r['criterion']} | {r['activations']} | {r['load_s']} | {r['prune_s']} | "
            f"{_cell(r.get('score_s'))} | {_cell(r.get('reconstruct_s'))} | {r['save_s']} | "
            f"{r['total_s']} | "
            f"{r['peak_device_mb'] / 1e3:.1f} | {r['weights_gb']} | {r.get('peak_rss_mb', 0) / 1e3:.1f} | {met} | ok | "
            f"{_measured(r)} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=["7b:128:memory", "7b:128:stream", "70b:128:stream:discard"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--criterion", default="magnitude", help="magnitude (as bench/gpu_liar.py) or auto (the default)")
    p.add_argument("--method", default="liar")
    p.add_argument("--select", default="criterion", choices=["criterion", "obs", "auto"])
    p.add_argument("--activations", default="auto", choices=ACTIVATIONS)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--holdout", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--workdir", default=None, help="where checkpoints are written (default: the system temp)")
    p.add_argument("--json", default=str(ROOT / "docs" / "results" / "gpu_stream.json"))
    p.add_argument("--profile", help="profile each streamed run with torch.profiler; the tables are written here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    path = Path(args.json)
    rows = json.loads(path.read_text()) if path.is_file() else []
    for run in args.runs:
        key = f"{run}|{args.criterion}|{args.activations}"
        row = measured_child(args, run)
        row.update(key=key, date=today())
        print(json.dumps(row), flush=True)
        rows = [r for r in rows if r.get("key") != key] + [row]
        path.write_text(json.dumps(rows, indent=1) + "\n")
        header = (
            "Each row's date and machine in its last column; `python bench/gpu_stream.py` (see its "
            "docstring): LLaMA-shaped random bf16 weights from a host-memory pool (no disk), ratio "
            f"{args.ratio}, heads + neurons, {args.seq_len}-token samples + {args.holdout} held aside, batch 16, "
            "`stats_dtype: float32`. Peak device memory over the whole run; peak RSS of the run's process."
        )
        write_report(path.with_suffix(".md"), rows, header)
    print(f"wrote {path.with_suffix('.md')}")


def measured_child(args, run: str) -> dict:
    """One run in a child process (``bench/rss.py``'s ``run_measured``: its own peak RSS from ``os.wait4``)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", run, *passthrough(args)]
    res = run_measured(cmd, args.timeout, dict(os.environ), ROOT)
    if res["timed_out"]:
        return {"run": run, "status": f"timeout after {args.timeout:.0f} s", "stderr": res["stderr"][-2000:]}
    rows = [line for line in res["stdout"].splitlines() if line.startswith("{")]
    if res["rc"] != 0 or not rows:
        return {"run": run, "status": f"failed (exit {res['rc']})", "stderr": res["stderr"][-3000:]}
    row = json.loads(rows[-1])
    row.update(status="ok", wall_s=round(res["wall_s"], 1), peak_rss_mb=round(res["peak_rss_mb"]))
    return row


if __name__ == "__main__":
    main()
