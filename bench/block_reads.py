"""How fast a streamed run reads a block's tensors from a checkpoint, with one or several threads.

A streamed run reads every block twice (the criterion's scoring pass, then the prune pass); with a
weight criterion the first pass does nothing but read, and reads only the tensors the criterion
scores (magnitude: o_proj and down_proj, ``Criterion.reads``). ``StreamedModel`` reads a block's tensors with
``read_threads`` threads (``host_io_threads``: one on a CPU, up to 4 on a GPU worker). This times
``StreamedModel._read_block`` — the engine's own read — over every block of a LLaMA-shaped random
checkpoint with only a few blocks (their size is the real model's), from the page cache (warm) and
after the files were synced and evicted from it (cold, ``bench/streaming.py``'s ``evict``): whole
blocks (the prune pass) and magnitude's part of them (its scoring pass).

    python bench/block_reads.py                              # 7B-shaped blocks, bf16, 1 / 2 / 4 threads
    python bench/block_reads.py --shape 1.1b --threads 1 2   # smaller blocks
    python bench/block_reads.py --device cuda                # a GPU worker: pinned buffers

On a CPU the buffers are fresh anonymous memory (their pages are faulted in while read); on a GPU they
are pinned buffers that torch's host allocator reuses, so the rate there is the read's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine, today  # noqa: E402
from bench.random_llama import write_random_llama  # noqa: E402
from bench.rss import evict, weight_files  # noqa: E402
from bench.shapes import LLAMA_SHAPES  # noqa: E402


def warm(directory: Path) -> None:
    for f in weight_files(directory):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def time_blocks(directory: Path, threads: int, dtype, device: str, part: str) -> tuple[float, int]:
    """Seconds to read every block (``part``: "block", whole, or "magnitude", the tensors that
    criterion scores) once into host memory (pinned for a CUDA device), and the bytes read."""
    from core import criteria
    from core.models.streaming import StreamedModel
    from core.pipeline.streamed import scored_parameters

    sm = StreamedModel(directory, dtype, device, prefetch=False, read_threads=threads)
    names = None if part == "block" else scored_parameters(criteria.get(part), sm.adapter, sm.layers[0])
    try:
        total, t0 = 0, time.perf_counter()
        for i in range(len(sm.layers)):
            block = sm._read_block(i, names)
            total += sum(t.numel() * t.element_size() for t in block.values())
            del block
        return time.perf_counter() - t0, total
    finally:
        sm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="7b", choices=sorted(LLAMA_SHAPES))
    p.add_argument("--layers", type=int, default=4, help="blocks in the checkpoint (each of the shape's size)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cuda: read into pinned buffers, as a GPU worker does")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/liar-bench"))
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "block_reads.md")
    args = p.parse_args()
    import torch

    name = f"{args.shape}-{args.layers}blocks"
    LLAMA_SHAPES[name] = {**LLAMA_SHAPES[args.shape], "num_hidden_layers": args.layers}
    directory = args.workdir / f"reads-{name}-{args.dtype}"
    if not (directory / "model.safetensors.index.json").is_file():
        print(f"writing {directory} ...", flush=True)
        write_random_llama(directory, name, args.dtype)
    dtype = getattr(torch, args.dtype)
    rows = []
    for threads in args.threads:
        for part in ("block", "magnitude"):
            for label in ("cold", "warm"):
                times = []
                for _ in range(args.repeats):
                    evict(directory) if label == "cold" else warm(directory)
                    seconds, total = time_blocks(directory, threads, dtype, args.device, part)
                    times.append(seconds / args.layers)
                s = statistics.median(times)
                row = {"threads": threads, "read": part, "cache": label, "ms_per_block": round(s * 1e3)}
                row.update(gb_s=round(total / args.layers / s / 1e9, 2), mb=round(total / args.layers / 1e6))
                rows.append({**row, "runs_s": times})
                print(json.dumps(row), flush=True)
    base = {(r["read"], r["cache"]): r["gb_s"] for r in rows if r["threads"] == rows[0]["threads"]}
    whole = {(r["threads"], r["cache"]): r["ms_per_block"] for r in rows if r["read"] == "block"}
    lines = [
        "# Reading a block's tensors: one thread against several",
        "",
        f"Measured {today()} on {machine(1)['cpu']}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}; "
        f"`python bench/block_reads.py --shape {args.shape} --layers {args.layers} --dtype {args.dtype}`: "
        f"`StreamedModel._read_block` over {args.layers} {args.shape}-shaped blocks of {rows[0]['mb']} MB "
        f"({args.dtype}) into {'pinned' if args.device.startswith('cuda') else 'fresh anonymous'} host memory, "
        f"median of {args.repeats}; cold = after the files were synced and dropped from the page cache. "
        "*block*: every tensor (the prune pass); *magnitude*: the tensors that criterion scores (its "
        "scoring pass).",
        "",
        "| threads | read | MB | page cache | ms per block | GB/s | × one thread | × the whole block's time |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['threads']} | {r['read']} | {r['mb']} | {r['cache']} | {r['ms_per_block']} | {r['gb_s']} | "
            f"{r['gb_s'] / base[r['read'], r['cache']]:.2f} | "
            f"{r['ms_per_block'] / whole[r['threads'], r['cache']]:.2f} |"
            for r in rows
        ],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
