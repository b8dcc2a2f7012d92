"""Correctness of the GPU paths that the CPU test suite cannot reach, on a tiny random model.

The test suite runs on CPUs, where activations in "host memory" are the device's own memory, a block
moved "to the host" is the block itself, and no copy is asynchronous. On a CUDA device the same code
issues asynchronous copies whose order only the device's stream keeps: a missing wait would change
results without an error. This script runs, on the device, the comparisons the tests make on the CPU:

- a streamed run (blocks read, pruned, moved to the host and written by background threads) against
  the same recipe in memory: the saved checkpoints tensor by tensor (paper recipe and the default);
- activations in pinned host memory, and the FFN's inputs recomputed, against everything on the
  device: the same kept units and the same outputs of the pruned models on random tokens;
- the OBS paths' inverse from a Cholesky factor computed in place (``core/stats/spd_inverse.py``,
  what a GPU runs) against ``torch.cholesky_inverse`` at LLaMA-7B's widths (4,096 and 11,008), with
  the time and the memory beyond the factor of each;
- the refits' solve in the matrix's own memory (``solve_spd_in_place``) against ``torch.cholesky_solve``
  at the kept width of LLaMA-7B's FFN (8,832), with time and memory.

    python bench/gpu_check.py --out OUT/gpu_check.md     # on a CUDA machine; exit 1 on a mismatch
    python bench/gpu_check.py --device cpu               # the same comparisons on the CPU (smoke test)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.streaming import compare_outputs  # noqa: E402

# a float32 model: a synchronisation bug shows as a large difference, not as bf16 rounding
MODEL = {"hidden_size": 128, "intermediate_size": 320, "num_hidden_layers": 6}
TOLERANCE = 1e-4  # largest |Δ| of a weight (values ~0.1), and relative on the outputs


def _recipe(model_dir: Path, device: str, **kw) -> dict:
    from core.models.tiny import tiny_corpus

    recipe = {
        "model": str(model_dir),
        "ratio": 0.3,
        "dtype": "float32",
        "device": device,
        "criterion": {"name": "magnitude"},
        "reconstruction": {"method": "liar", "select": "criterion"},
        "calibration": {
            "texts": tiny_corpus(60),
            "num_calibration_samples": 24,
            "max_seq_length": 32,
            "holdout_samples": 4,
            "batch_size": 5,
        },
    }
    recipe.update(kw)
    return recipe


def _saved(recipe: dict, out: Path) -> Path:
    from core import prune

    result = prune(recipe, output_dir=out if recipe.get("execution") == "stream" else None)
    return result.save(out, overwrite=True)


def compare_checkpoints(a: Path, b: Path) -> tuple[bool, str]:
    """``bench/streaming.py``'s tensor-by-tensor comparison of two saved checkpoints, judged."""
    c = compare_outputs(a, b)
    if not (c["keys_equal"] and c["shapes_equal"]):
        differ = c["only_in_memory"] + c["only_in_stream"] + c["shape_mismatch"]
        return False, f"tensor names or shapes differ: {differ}"
    worst = c["max_abs_diff"]
    detail = f"{c['tensors']} tensors, {c['bitwise_equal_tensors']} bitwise equal, max abs difference {worst:.2e}"
    return worst <= TOLERANCE and not c["config_keys_differing"], detail


def compare_models(a, b, device: str) -> tuple[bool, str]:
    import torch

    for la, lb in zip(a.plan.layers, b.plan.layers, strict=True):
        if (la.heads, list(map(int, la.neurons))) != (lb.heads, list(map(int, lb.neurons))):
            return False, "different kept units"
    ids = torch.randint(0, a.model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        ya, yb = a.model(input_ids=ids)[0].double(), b.model(input_ids=ids)[0].double()
    rel = ((ya - yb).norm() / ya.norm()).item()
    return rel <= TOLERANCE, f"same kept units; outputs' relative difference {rel:.2e}"


def _compare_timed(name: str, runs: dict, device: str) -> tuple[str, bool, str]:
    """Run each of ``runs`` (label -> a function of nothing) once: their results' relative difference
    (torch's first against ours), each one's seconds and, on a GPU, the memory it took beyond what was
    allocated before it."""
    import time

    import torch

    cuda = device.startswith("cuda")
    done = {}
    for label, fn in runs.items():
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
        done[label] = (out, time.perf_counter() - t0, extra)
    ref, ours = (v[0] for v in done.values())
    rel = ((ours - ref).norm() / ref.norm()).item()
    times = ", ".join(f"{k} {v[1]:.2f} s" + (f" / +{v[2]:.0f} MB" if cuda else "") for k, v in done.items())
    return name, rel <= 1e-9, f"relative difference {rel:.1e}; {times}"


def check_inverse(n: int, device: str) -> tuple[str, bool, str]:
    """The in-place inverse against torch's on a damped random covariance of size n: relative
    difference, seconds and memory beyond the factor (a GPU's peak; on a CPU not measured)."""
    import torch

    from core.stats.spd_inverse import cholesky_inverse_

    gen = torch.Generator(device=device).manual_seed(n)
    a = torch.randn(n, n + 64, dtype=torch.float64, device=device, generator=gen)
    chol = torch.linalg.cholesky(a @ a.T / n + 1e-3 * torch.eye(n, dtype=torch.float64, device=device))
    del a
    inverses = {"torch": lambda t: torch.cholesky_inverse(t, out=t), "in place": cholesky_inverse_}
    for invert in inverses.values():
        invert(chol[:600, :600].clone())  # libraries' first-call set-up out of the timing
    runs = {label: (lambda invert=invert: invert(chol.clone())) for label, invert in inverses.items()}
    return _compare_timed(f"in-place inverse, n = {n}", runs, device)


def check_solve(n: int, device: str) -> tuple[str, bool, str]:
    """The in-place solve (factor in the matrix's memory, two triangular solves) against
    ``torch.cholesky_solve`` on a factor beside the matrix, for a damped random covariance of size n
    (the kept width of an FFN) and a right-hand side a quarter as wide: relative difference, seconds
    and memory beyond the matrix and right-hand side (a GPU's peak)."""
    import torch

    from core.stats.spd_inverse import solve_spd_in_place

    gen = torch.Generator(device=device).manual_seed(n)
    a = torch.randn(n, n + 64, dtype=torch.float64, device=device, generator=gen)
    cov = a @ a.T / n
    del a
    rhs = torch.randn(n, n // 4, dtype=torch.float64, device=device, generator=gen)
    damped = 1e-3 * cov.diagonal().mean() * torch.eye(n, dtype=cov.dtype, device=cov.device)

    def ours():
        first = [cov.clone()]  # a failed factorisation would ask for the matrix again
        return solve_spd_in_place(lambda: first.pop() if first else cov.clone(), rhs, 1e-3)

    runs = {"torch": lambda: torch.cholesky_solve(rhs, torch.linalg.cholesky(cov + damped)), "in place": ours}
    return _compare_timed(f"in-place solve, n = {n}", runs, device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args()
    import torch

    from core import prune
    from core.models.tiny import tiny_decoder

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu for the smoke test")
    rows = []
    with tempfile.TemporaryDirectory(prefix="liar-gpu-check-") as tmp:
        work = Path(tmp)
        model_dir = tiny_decoder(work / "model", "llama", **MODEL)
        default = {"criterion": {"name": "auto"}, "reconstruction": {"method": "ls", "select": "auto"}}
        for label, kw in (("paper recipe", {}), ("default recipe", default)):
            mem = _saved(_recipe(model_dir, args.device, execution="memory", **kw), work / f"{label}-memory")
            streamed = _saved(_recipe(model_dir, args.device, execution="stream", **kw), work / f"{label}-stream")
            rows.append((f"{label}: streamed against in memory", *compare_checkpoints(mem, streamed)))
        on_device = prune(_recipe(model_dir, args.device, activations="device"))
        for place in ("recompute", "host"):
            other = prune(_recipe(model_dir, args.device, activations=place))
            ok, detail = compare_models(on_device, other, args.device)
            ran = other.metrics["activations"]  # on a CPU, host is the device and recomputes
            rows.append((f"activations {place}{'' if ran == place else f' (ran as {ran})'} against device", ok, detail))
    for n in (4096, 11008) if args.device.startswith("cuda") else (1024,):
        rows.append(check_inverse(n, args.device))
    for n in (8832,) if args.device.startswith("cuda") else (1024,):
        rows.append(check_solve(n, args.device))
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    lines = [
        f"# GPU path checks on {device}, torch {torch.__version__}",
        "",
        "`python bench/gpu_check.py`: a 6-block random LLaMA-shaped float32 model (hidden 128, FFN 320), ratio 0.3.",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *[f"| {name} | {'ok' if ok else '**FAILED**'} | {detail} |" for name, ok, detail in rows],
    ]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if not all(ok for _, ok, _ in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
