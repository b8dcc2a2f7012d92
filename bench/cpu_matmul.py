"""Float32 matrix products on this CPU: torch's BLAS against oneDNN (``core/kernels/cpu_matmul.py``).

For the products a CPU prune of SmolLM2-135M runs (2048-token batches: the q/k/v, gate/up, o_proj
and down_proj projections at 20% pruning, and the Gram blocks of ``core/stats/accumulate.py`` at 576
and 1,536 channels), the best time of repeated runs with each library, the rate, and each result's
relative error against a float64 product (both are float32 products; only the order of the sums
differs). Writes docs/results/cpu_matmul.md + .json.

    python bench/cpu_matmul.py [--threads N] [--tokens 2048] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import best_time, machine, today  # noqa: E402
from bench.speed_report import _machine_line  # noqa: E402
from core.kernels import cpu_matmul  # noqa: E402
from core.stats.accumulate import _edges  # noqa: E402

# (name, input channels, output channels) of SmolLM2-135M's projections, 20% pruned where they are
PROJECTIONS = (
    ("q_proj (576 → 576)", 576, 576),
    ("k/v_proj (576 → 192)", 576, 192),
    ("gate/up_proj (576 → 1536)", 576, 1536),
    ("o_proj replay (448 → 576)", 448, 576),
    ("down_proj replay (1229 → 576)", 1229, 576),
    ("lm_head (576 → 49152)", 576, 49152),
)
GRAMS = (("Gram, 576 channels", 576), ("Gram, 1536 channels", 1536))


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def _blocks_blas(x: torch.Tensor, edges: list[int]) -> list[torch.Tensor]:
    return [x[:, a:b].T @ x[:, a:] for a, b in zip(edges[:-1], edges[1:])]


def _blocks_onednn(x: torch.Tensor, edges: list[int]) -> list[torch.Tensor]:
    return cpu_matmul.gram_tn(x, rows=list(zip(edges[:-1], edges[1:])))


def measure(tokens: int, repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for name, c_in, c_out in PROJECTIONS:
            x, w = torch.randn(tokens, c_in, generator=g), torch.randn(c_out, c_in, generator=g) / c_in**0.5
            ref = F.linear(x.double(), w.double())
            blas, fast = partial(F.linear, x, w), partial(cpu_matmul.linear, x, w)
            flop = 2 * tokens * c_in * c_out
            rows.append(_row(name, flop, blas, fast, _rel(blas(), ref), _rel(fast(), ref), repeats))
        for name, c in GRAMS:
            x, edges = torch.randn(tokens, c, generator=g), _edges(c)
            ref = x.double().T @ x.double()
            flop = sum(2 * tokens * (b - a) * (c - a) for a, b in zip(edges[:-1], edges[1:]))

            rows.append(
                _row(
                    f"{name} ({len(edges) - 1} block rows of the upper triangle)",
                    flop,
                    partial(_blocks_blas, x, edges),
                    partial(_blocks_onednn, x, edges),
                    _upper_error(_blocks_blas(x, edges), edges, ref),
                    _upper_error(_blocks_onednn(x, edges), edges, ref),
                    repeats,
                )
            )
    return rows


def _upper_error(blocks: list[torch.Tensor], edges: list[int], ref: torch.Tensor) -> float:
    """Relative error of the upper block triangle the blocks cover, against the same part of ``ref``."""
    got = torch.cat([blk.double().reshape(-1) for blk in blocks])
    want = torch.cat([ref[a:b, a:].reshape(-1) for a, b in zip(edges[:-1], edges[1:])])
    return float((got - want).norm() / want.norm())


def _row(name: str, flop: int, blas, fast, err_blas: float, err_fast: float, repeats: int) -> dict:
    t_blas, t_fast = best_time(blas, repeats, warmup=2), best_time(fast, repeats, warmup=2)
    return {
        "product": name,
        "gflop": flop / 1e9,
        "blas_ms": t_blas * 1e3,
        "onednn_ms": t_fast * 1e3,
        "blas_gflops": flop / t_blas / 1e9,
        "onednn_gflops": flop / t_fast / 1e9,
        "speedup": t_blas / t_fast,
        "blas_error": err_blas,
        "onednn_error": err_fast,
    }


def write(rows: list[dict], args: argparse.Namespace, mach: dict, auto: cpu_matmul.Decision) -> Path:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Float32 CPU matrix products: torch's BLAS against oneDNN",
        "",
        f"Measured {today()} on {_machine_line(mach)}. Produced by `python bench/cpu_matmul.py"
        f" --threads {args.threads} --tokens {args.tokens}`.",
        "",
        f"Each product of a {args.tokens}-token batch, best of {args.repeats} runs after two warm-ups: `F.linear` "
        "(torch's BLAS, MKL in this wheel) against `core.kernels.cpu_matmul` (oneDNN's kernels, what the engine "
        "runs on a CPU), and each result's relative error ‖Y − Y₆₄‖ / ‖Y₆₄‖ against the float64 product. The Gram "
        "rows multiply the block rows of XᵀX's upper triangle as `core/stats/accumulate.py` does (oneDNN: in "
        f"chunks of {cpu_matmul.REDUCE_CHUNK} tokens, each transposed, whose partial products are summed; the copies "
        "are in its time).",
        "",
        f"`LIAR_CPU_MATMUL=auto` chose **{auto.backend}** here: {auto.reason} (its one-time timing, "
        f"{cpu_matmul.TIMED_REPEATS} runs of each product after a warm-up; oneDNN is taken when ≥ "
        f"{cpu_matmul.MIN_GAIN - 1:.0%} faster).",
        "",
        "| product | GFLOP | BLAS ms | oneDNN ms | BLAS GFLOP/s | oneDNN GFLOP/s | speed-up | BLAS error "
        "| oneDNN error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['product']} | {r['gflop']:.2f} | {r['blas_ms']:.2f} | {r['onednn_ms']:.2f} | "
            f"{r['blas_gflops']:.0f} | {r['onednn_gflops']:.0f} | {r['speedup']:.2f}× | "
            f"{r['blas_error']:.1e} | {r['onednn_error']:.1e} |"
        )
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"machine": mach, "tokens": args.tokens, "auto": auto.metrics(), "rows": rows}, indent=1)
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "cpu_matmul.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu_matmul.configure("auto")  # what the liar CLI chooses on this CPU, and the rates it chose by
    auto = cpu_matmul.decision()
    print(f"auto: {auto.backend} ({auto.reason})")
    cpu_matmul.configure("onednn")  # the table compares both libraries product by product
    if cpu_matmul.backend() != "onednn":
        sys.exit("oneDNN is not available to this torch: nothing to compare")
    rows = measure(args.tokens, args.repeats)
    print(f"{'product':<58} {'BLAS ms':>9} {'oneDNN ms':>10} {'speed-up':>9} {'errors':>20}")
    for r in rows:
        print(
            f"{r['product']:<58} {r['blas_ms']:>9.2f} {r['onednn_ms']:>10.2f} {r['speedup']:>8.2f}× "
            f"{r['blas_error']:>9.1e} {r['onednn_error']:>9.1e}"
        )
    print(f"wrote {write(rows, args, machine(args.threads), auto)}")


if __name__ == "__main__":
    main()
