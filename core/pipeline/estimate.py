"""The engine's own estimate of a run before it is submitted: parameters after pruning, the execution
mode, peak memory and time on a worker class — from the recipe and the model's ``config.json`` only.

Torch-free like :mod:`core.pipeline.preflight`, whose config reading it reuses (a local directory or the
local Hugging Face cache, never a download), so the web form can call it as the recipe changes; only
the ``cpu`` class measures this machine's GEMM rate, once per process, with torch.

- **Parameters**: the blocks lose ``ratio`` of their parameters, everything outside them stays, and a
  refit that gives a pruned projection a bias adds its output width (:mod:`core.pipeline.costs`).
- **Mode** as :func:`core.pipeline.sequential.execution_mode` picks it for a job (the result saved).
- **Peak memory** by the sizing the engine itself uses to place its activations
  (``core/models/offload.py``) beside what stays resident: the whole model in memory, one block streamed.
- **Time**: the run's work counted from the shapes in three kinds that run at very different rates
  (model-dtype products, float64 solves, the error report), each over the worker class's effective
  rate: for GPUs fitted to the project's H100 measurements (``docs/results/gpu_liar.md``), for the CPU
  this machine's GEMM rate times the share of a prune spent in its products (``docs/results/time.json``).
  Not counted: loading or reading the weights, writing the checkpoint, the job's speed measurements.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from core.pipeline.costs import Place, Shape, depth_peak, dtype_of, run_of, shape_of, width_peak, work
from core.pipeline.preflight import (
    TARGET_MAX_DEPTH,
    TARGET_MAX_WIDTH,
    _cached_config,
    as_recipe,
    check_model_fit,
    width_ratio,
)
from core.spec.criteria import streaming_refusal
from core.spec.errors import validation_message
from core.spec.recipe import Recipe

GiB = 2**30
# output projections given a bias by a refit (core/stats/reconstruct.py: bias, liar and ls return one)
BIAS_METHODS = ("bias", "liar", "ls")
SAFETENSORS = ("model.safetensors.index.json", "model.safetensors")  # core/models/safetensors_io.py
CUDA_RESERVE = 1 * GiB  # beside torch's allocations on a card: the CUDA context and the allocator's slack


@dataclass(frozen=True)
class Worker:
    """A worker class: where a run executes and how fast each kind of work goes there (FLOP/s)."""

    name: str
    label: str  # for people: "an H100 80 GB"
    device: str  # "cuda" | "cpu"
    memory: int  # bytes a run may use: the card's memory, or the host's
    dense_rate: float  # model-dtype products: block passes and Gram products
    fp64_rate: float  # float64 factorisations, solves and OBS paths
    report_rate: float  # the per-layer error report (GPU: TF32 / float32 products; CPU: float64)
    baseline: int = 0  # memory the process holds before any model (CPU: interpreter, torch, transformers)


# docs/results/gpu_liar.md, first table (NVIDIA H100 80GB HBM3, 2026-11-23, `bench/gpu_liar.py`): a LLaMA-7B-
# shaped bf16 model already on the device, ratio 0.2, heads + neurons, magnitude, liar, select criterion,
# 128-token samples, batch 16, stats float32. (samples, holdout, seconds): 4.3 s with the recipe's
# default 8 held-aside samples, 6.0 / 9.3 s with the report on the fit statistics.
H100_RECORDS = ((128, 8, 4.3), (128, 0, 6.0), (1024, 0, 9.3))
LLAMA_7B = dict(
    model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096,
    dtype="bfloat16",
)  # fmt: skip
# published dense bf16 tensor-core peaks (NVIDIA's data sheets, without sparsity): A100 312, H100 SXM 989 TFLOP/s
A100_OVER_H100 = 312 / 989
# docs/results/time.json (SmolLM2-135M on 2 Intel Xeon cores with AVX-512, 2026-11-28): the share of a
# CPU prune spent in its matrix products at the measured GEMM rate (product_seconds / prune_seconds), mean
# of its four rows. The share depends on the CPU's GEMM rate against its memory: 0.80 on the AMD EPYC
# measured on 2026-11-27, so there the estimate runs about a quarter long.
CPU_PRODUCT_SHARE = (13.79 / 26.22 + 28.91 / 46.86 + 58.43 / 93.24 + 101.10 / 177.33) / 4
# the job around the prune: a fresh process that imports torch and transformers and opens the job, and
# the checkpoint read and written. Provisional: a default SmolLM2 job's log on a 2-core machine at load
# average 7 read "starting 19.9 s, load 5.3 s"; these are that machine's share when idle, until
# bench/first_run.py measures them (docs/results/first_run.md). BYTES_PER_TOKEN: the bundled Wikipedia
# text's 3.09 MB are ≈ 720k SmolLM2 tokens, for the windows a text's size caps
JOB_START_S = 8.0
CHECKPOINT_BYTES_PER_S = 200 * 2**20
BYTES_PER_TOKEN = 4.3
# a CPU process's memory before any model: docs/results/streaming.md measured ≈ 387 MB for one that only
# imports torch, transformers and the engine; an in-memory run also maps the checkpoint's pages (same page)
CPU_BASELINE = 387 * 2**20
# the engine's sizing of a run's work (everything but the resident weights) against the measured peaks of
# docs/results/gpu_stream.json: measured / sized 1.05–1.28 (the most at 70B's 28,672-wide FFN); a run is
# said to fit a card only with this headroom on that part (tests/core/pipeline/test_estimate.py recomputes it)
WORK_HEADROOM = 1.3


def bench_recipe(samples: int, holdout: int, model: str = "random-llama-7b", **kw: Any) -> Recipe:
    """The recipe of ``bench/gpu_liar.py`` (the records above)."""
    cal = dict(texts=["(pre-tokenised)"], num_calibration_samples=samples, max_seq_length=128, batch_size=16)
    recipe = dict(
        model=model, ratio=0.2, dtype="bfloat16", device="cuda", criterion={"name": "magnitude"},
        reconstruction={"method": "liar", "select": "criterion"}, calibration={**cal, "holdout_samples": holdout},
    )  # fmt: skip
    return Recipe.model_validate({**recipe, **kw})


@cache
def h100_rates() -> tuple[float, float, float]:
    """``(dense, fp64, report)`` effective FLOP/s of an H100: the rates for which this module's work count
    gives exactly the three :data:`H100_RECORDS` times (three equations, three unknown 1/rate)."""
    shape = shape_of(LLAMA_7B)
    rows = [work(bench_recipe(n, held), shape, "cuda") for n, held, _ in H100_RECORDS]
    inverse = _solve3([[r["dense"], r["fp64"], r["report"]] for r in rows], [s for _, _, s in H100_RECORDS])
    return tuple(1 / x for x in inverse)


def _solve3(a: list[list[float]], b: list[float]) -> list[float]:
    """``x`` with ``a x = b`` for a 3 × 3 ``a`` (Cramer's rule)."""

    def det(m):
        return (
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        )

    d = det(a)
    return [det([[b[i] if j == c else a[i][j] for j in range(3)] for i in range(3)]) / d for c in range(3)]


@cache
def cpu_gemm_rate(n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of one ``n × n`` float32 product on this machine, best of ``repeats`` (once per process):
    the size ``docs/results/time.json`` measured its GEMM rate at."""
    import torch

    x = torch.randn(n, n)
    x @ x
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        x @ x
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


# the worker classes, for people (a form's choices need no rate measured)
WORKERS = {"cpu": "this server's CPU", "a100-80gb": "an A100 80 GB", "h100-80gb": "an H100 80 GB"}


def worker_class(name: str, gemm_rate: float | None = None) -> Worker:
    """A worker class by name (:data:`WORKERS`); ``cpu``'s rate is ``gemm_rate`` or measured here."""
    if name not in WORKERS:
        raise ValueError(f"unknown worker class {name!r}; choose one of {', '.join(WORKERS)}")
    label = WORKERS[name]
    if name == "cpu":
        rate = (gemm_rate or cpu_gemm_rate()) * CPU_PRODUCT_SHARE
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # float64 products at half the float32 rate: half as many lanes per vector instruction
        return Worker(name, label, "cpu", memory, rate, rate / 2, rate / 2, CPU_BASELINE)
    dense, fp64, report = h100_rates()
    if name == "h100-80gb":  # nvidia-smi's total for an H100 80GB HBM3
        return Worker(name, label, "cuda", 81559 * 2**20, dense, fp64, report)
    s = A100_OVER_H100  # the A100 80GB (nvidia-smi's total): the H100 scaled by the published bf16 peaks
    return Worker(name, label, "cuda", 81920 * 2**20, dense * s, fp64 * s, report * s)


def execution_of(recipe: Recipe) -> str:
    """``stream`` or ``memory``, as :func:`core.pipeline.sequential.execution_mode` decides for a job
    (the result saved): memory for gradient criteria and speed targets, and for a model without
    safetensors weights; a hub id whose weights are not cached is downloaded as safetensors."""
    if recipe.execution != "auto":
        return recipe.execution
    if streaming_refusal(recipe.criterion.name) or recipe.auto_may_use_gradients or recipe.target is not None:
        return "memory"
    local = Path(recipe.model).expanduser()
    if local.is_dir():
        return "stream" if any((local / name).is_file() for name in SAFETENSORS) else "memory"
    return "stream"


@dataclass(frozen=True)
class Estimate:
    """What a run will take on a worker class; ``error`` (a ``cannot estimate: …`` sentence) instead
    when the recipe or the model's config cannot be read offline. Byte and parameter counts are exact
    integers of the model as the estimate sees it; what they stand for is an estimate (``basis``)."""

    model: str
    worker: str
    worker_label: str = ""
    params_before: int | None = None
    params_after: int | None = None  # None where the run decides it (a speed target: params_range)
    params_range: tuple[int, int] | None = None
    params_note: str = ""  # why params_after is a range, when it is
    execution: str | None = None  # "stream" | "memory"
    device: str | None = None  # "cuda" | "cpu"
    dtype: str | None = None
    activations: str | None = None  # where the calibration activations live: device | recompute | host
    peak_bytes: int | None = None
    memory_bytes: int | None = None  # the worker class's
    seconds: float | None = None
    flops: tuple[tuple[str, float], ...] = ()  # by kind: dense, fp64, report
    fits: bool | None = None
    fit_note: str = ""  # one sentence when the run does not fit the worker class
    basis: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        """One line for people: ``≈ 5.4 B parameters after pruning (from 6.7 B) · peak ≈ 17 GiB · ≈ 10 s
        on an H100 80 GB`` (or the error)."""
        if self.error is not None:
            return self.error
        if self.params_after is not None:
            params = f"≈ {count(self.params_after)} parameters after pruning (from {count(self.params_before)})"
        else:
            low, high = self.params_range
            params = f"{count(low)}–{count(high)} parameters after pruning (from {count(self.params_before)})"
        peak = f"peak ≈ {size(self.peak_bytes)}" + ("" if self.fits else " (does not fit)")
        return f"{params} · {peak} · ≈ {duration(self.seconds)} on {self.worker_label}"


def count(n: int) -> str:
    """``6.7 B``, ``135 M``, ``51.8 k``: three significant figures at most."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{_sig(n / scale)} {unit}"
    return str(n)


def size(n: int) -> str:
    return f"{_sig(n / GiB)} GiB" if n >= GiB else f"{_sig(n / 2**20)} MiB"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{_sig(max(seconds, 0.1))} s"
    return f"{_sig(seconds / 60)} min" if seconds < 90 * 60 else f"{_sig(seconds / 3600)} h"


def _sig(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def params_after(recipe: Recipe, shape: Shape, heads_cut: float) -> int:
    """The blocks less ``ratio`` of their parameters (the whole removed blocks for ``modules: blocks``),
    everything outside them, and the bias a refit gives each pruned output projection that had none
    (``heads_cut``: the share of heads the width pruning removes; no heads, no o_proj refit)."""
    n, per_block = shape.layers, shape.block_params
    if recipe.modules == "blocks":
        return shape.params - recipe.depth_blocks(n) * per_block
    left = n - (recipe.depth_blocks(n) if recipe.removes_blocks else 0)
    after = shape.outer_params + n * per_block - round(recipe.ratio * n * per_block)
    if recipe.reconstruction.method in BIAS_METHODS:
        o_bias, down_bias = shape.out_biases
        pruned = (heads_cut > 0 and not o_bias) + (recipe.modules != "heads" and not down_bias)
        after += left * pruned * shape.hidden
    return after


def estimate(recipe: Recipe | dict | str | Path, worker: str | Worker, evaluations: list | None = None) -> Estimate:
    """The :class:`Estimate` of ``recipe`` run as a job (its result saved) on ``worker`` (a name of
    :data:`WORKERS`, or a :class:`Worker`). Never raises for a bad recipe, model or worker name: the
    result then carries ``error``, one sentence the web form shows."""
    model = recipe.get("model", "?") if isinstance(recipe, dict) else str(getattr(recipe, "model", recipe))
    name = worker.name if isinstance(worker, Worker) else str(worker)
    try:
        recipe = as_recipe(recipe)
        model = recipe.model
        w = worker if isinstance(worker, Worker) else worker_class(worker)
        raw = _config(recipe.model)
        check_model_fit(recipe, SimpleNamespace(**raw))
        shape = shape_of(raw)
        device = _device(recipe, w)
    except ValidationError as exc:
        return Estimate(model, name, error=f"cannot estimate: {validation_message(exc)}")
    except (ValueError, OSError) as exc:
        return Estimate(model, name, error=f"cannot estimate: {exc}")
    if recipe.target is not None:
        result = _target_estimate(recipe, shape, w, device)
    else:
        result = _ratio_estimate(recipe, shape, w, device)
    # the job around the prune is measured on CPU workers only (a GPU class's rates time the prune alone)
    return with_job_time(result, shape, w, evaluations or []) if w.device == "cpu" else result


def evaluation_flops(evaluations: list, params_before: int, params_after: int) -> float:
    """FLOPs of a job's perplexity evaluations: a forward pass of the pruned model over each one's
    tokens, and of the dense model over the last one's (the baseline, ``jobs.baseline``), two FLOPs
    per parameter and token. Tokens: ``max_windows × seq_len``, capped by a local text's size at
    :data:`BYTES_PER_TOKEN`; a named set without ``max_windows`` is not counted (its size is not known
    offline)."""
    tokens = []
    for ev in evaluations:
        if not isinstance(ev, dict) or ev.get("type", "perplexity") != "perplexity":
            continue
        seq, windows = int(ev.get("seq_len") or 512), ev.get("max_windows")
        text = Path(str(ev.get("dataset", ""))).expanduser()
        in_text = text.stat().st_size / BYTES_PER_TOKEN // seq if text.is_file() else math.inf
        tokens.append(min(windows or math.inf, in_text) * seq)
    tokens = [t for t in tokens if math.isfinite(t)]
    if not tokens:
        return 0.0
    return 2.0 * (params_after * sum(tokens) + params_before * tokens[-1])


def with_job_time(result: Estimate, shape: Shape, worker: Worker, evaluations: list) -> Estimate:
    """``result`` with the job's time around the prune added: a fresh process's start, reading the
    model and writing the checkpoint (:data:`JOB_START_S`, :data:`CHECKPOINT_BYTES_PER_S`), and the
    perplexity evaluations at the worker's rate for model-dtype products."""
    if not result.ok:
        return result
    after = result.params_after if result.params_after is not None else result.params_range[1]
    size = (shape.params + after) * _bytes(result.dtype or "float32")
    evaluation = evaluation_flops(evaluations, shape.params, after) / worker.dense_rate
    extra = JOB_START_S + size / CHECKPOINT_BYTES_PER_S + evaluation
    basis = (
        f"{result.basis}; plus the job around it (bench/first_run.py): {JOB_START_S:g} s to start, the "
        f"checkpoint read and written at {CHECKPOINT_BYTES_PER_S / 2**20:.0f} MiB/s, {evaluation:.3g} s of perplexity"
    )
    return replace(result, seconds=result.seconds + extra, basis=basis)


def _config(model: str) -> dict[str, Any]:
    raw = _cached_config(model)
    if raw is None:
        raise ValueError(
            f"the config of {model!r} is not in a local directory or the local Hugging Face cache, and an estimate "
            "never downloads: download the model first or name a local directory"
        )
    return raw


def _device(recipe: Recipe, worker: Worker) -> str:
    if recipe.device.startswith("cuda") and worker.device != "cuda":
        raise ValueError(f"the recipe asks for device {recipe.device} and the {worker.name} class has no GPU")
    return "cpu" if recipe.device == "cpu" else worker.device


def _ratio_estimate(recipe: Recipe, shape: Shape, worker: Worker, device: str) -> Estimate:
    """A recipe with a ratio: the depth phase's peak (blocks removed first) against the width phase's on
    the blocks that remain, and the work of both."""
    mode, run = execution_of(recipe), run_of(recipe, shape, device)
    layers, peaks, where, width = shape.layers, [], None, recipe.modules != "blocks"
    if recipe.removes_blocks:
        blocks = recipe.depth_blocks(shape.layers)
        peaks.append(depth_peak(recipe, shape, run, blocks, mode, device))
        layers -= blocks
    if width:
        wrun = run_of(recipe, shape, device, _width_ratio(recipe, shape))
        free = worker.memory - CUDA_RESERVE
        peak, where = width_peak(shape, wrun, mode, layers, recipe.activations, Place(device, free))
        peaks.append(peak)
    flops = work(recipe, shape, device, recompute=where in ("recompute", "host"))
    weights = shape.params * run.itemsize if mode == "memory" else 0
    mapped = shape.params * _bytes(shape.dtype or "float32") if device == "cpu" and mode == "memory" else 0
    peak = worker.baseline + mapped + max(peaks)
    fits, note = _fits(peak, weights + mapped, worker, mode, recipe)
    dtype = dtype_of(recipe, shape, device)
    return Estimate(
        recipe.model, worker.name, worker.label, shape.params, params_after(recipe, shape, run.heads_cut),
        execution=mode, device=device, dtype=dtype, activations=where, peak_bytes=peak, memory_bytes=worker.memory,
        seconds=seconds_of(flops, worker), flops=tuple(flops.items()), fits=fits, fit_note=note,
        basis=_basis(mode, device, dtype, where, flops, worker),
    )  # fmt: skip


def _width_ratio(recipe: Recipe, shape: Shape) -> float:
    if not recipe.removes_blocks:
        return recipe.ratio
    return width_ratio(recipe.ratio, recipe.depth_blocks(shape.layers) / shape.layers)


def _target_estimate(recipe: Recipe, shape: Shape, worker: Worker, device: str) -> Estimate:
    """A speed target: the run chooses the depth and widths on the worker's own latency table, so the
    parameters are a range — at least ``1 − 1/speed-up`` of the blocks' parameters go (a call's time
    cannot fall faster than them: the engine's own bound in :func:`check_target_bound`), at most the
    target's reach. Time: ``target.candidates`` prunes at the least ratio, beside the dense model and
    the best candidate so far (the latency table's timing is not counted)."""
    n, per_block, s = shape.layers, shape.block_params, recipe.target.speedup
    depth = int(n * TARGET_MAX_DEPTH) if recipe.target.depth or recipe.modules == "blocks" else 0
    most = depth / n + (1 - depth / n) * (0.0 if recipe.modules == "blocks" else TARGET_MAX_WIDTH)
    least = min(1 - 1 / s, most)
    low, high = (shape.outer_params + round(n * per_block * (1 - r)) for r in (most, least))
    one = Recipe.model_validate({**recipe.model_dump(), "target": None, "ratio": least, "execution": "memory"})
    single = _ratio_estimate(one, shape, worker, device)
    weights = (shape.params + high) * _bytes(single.dtype)  # the dense model, and the best candidate so far
    peak = single.peak_bytes + weights
    # resident: those, and the candidate's own copy of the dense model (in the single prune's peak)
    fits, note = _fits(peak, weights + shape.params * _bytes(single.dtype), worker, "memory", recipe)
    k = recipe.target.candidates
    return Estimate(
        recipe.model, worker.name, worker.label, shape.params, None, (low, high),
        f"a {s:g}× speed-up keeps between {count(low)} and {count(high)}: the run picks depth and widths on "
        "the worker's latency table", "memory", device, single.dtype, single.activations, peak, worker.memory,
        k * single.seconds, tuple((key, k * v) for key, v in single.flops), fits, note,
        f"up to {k} candidate prunes at ratio {least:.2f} in memory, beside the dense model and the best "
        f"candidate; the latency table's timing not counted. Each: {single.basis}",
    )  # fmt: skip


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _fits(peak: int, resident: int, worker: Worker, mode: str, recipe: Recipe) -> tuple[bool, str]:
    """Whether the peak fits the worker class (on a card with :data:`WORK_HEADROOM` on what is not
    ``resident`` weights), and the sentence saying what to change when it does not."""
    gpu = worker.device == "cuda"
    room = worker.memory - (CUDA_RESERVE if gpu else 0)
    need = resident + (peak - resident) * (WORK_HEADROOM if gpu else 1)
    if need <= room:
        return True, ""
    if mode == "memory" and execution_of(recipe.model_copy(update={"execution": "auto"})) == "stream":
        hint = "let it stream (execution: auto) to hold one block at a time"
    elif mode == "memory":
        hint = "it holds the whole model, so choose a class with more memory"
    else:
        hint = "lower num_calibration_samples or max_seq_length, or keep the activations on the host"
    where = worker.label if gpu else "this server"
    extra = " with headroom" if gpu else ""
    return False, f"the run needs ≈ {size(need)}{extra}, more than the {size(room)} {where} has: {hint}"


def _basis(mode: str, device: str, dtype: str, where: str | None, flops: dict[str, float], worker: Worker) -> str:
    tf = {k: v / 1e12 for k, v in flops.items()}
    kept = f", activations {where}" if where else ""
    rates = (
        "fitted to the H100 runs of docs/results/gpu_liar.md"
        + (" and scaled by the A100's published bf16 peak" if worker.name == "a100-80gb" else "")
        if worker.device == "cuda"
        else "this CPU's GEMM rate times the product share of docs/results/time.json"
    )
    return (
        f"{'streamed' if mode == 'stream' else 'in memory'} on {device} in {dtype}{kept}; peak = resident weights, "
        f"calibration activations and one block's work with its float64 statistics (core/models/offload.py's "
        f"sizing); time = {tf['dense']:.3g} TFLOP of {dtype} products, {tf['fp64']:.3g} float64, "
        f"{tf['report']:.3g} in the error report, at {worker.name}'s rates {rates}"
    )


def seconds_of(flops: dict[str, float], worker: Worker) -> float:
    """The work's time on ``worker``: each kind of FLOPs over its effective rate."""
    rates = {"dense": worker.dense_rate, "fp64": worker.fp64_rate, "report": worker.report_rate}
    return sum(flops[k] / rates[k] for k in flops)
