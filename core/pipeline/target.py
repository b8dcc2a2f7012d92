"""A speed target in place of a ratio: the depth and widths that reach a measured speed-up with the
least held-aside loss.

1. The latency table of the model on its own device (``core/evaluation/latency.py``) predicts the
   speed-up of every (blocks removed ``d``, width ratio ``w``) pair.
2. A target the table cannot reach (at most half the blocks removed, at most the table's widest ratio
   of every remaining block) is refused with the best speed-up it can reach, before any pruning.
3. For each ``d`` the least ``w`` that reaches the target; up to ``target.candidates`` of these pairs,
   spread from width only to depth only, become concrete recipes (ratio ``d/L + (1 − d/L) w``, with
   ``depth.blocks: d``), each pruned in full on the same calibration windows.
4. The pruned model with the least next-token loss on the held-aside windows is kept; its speed and
   the dense model's are timed again, interleaved, so the result records the predicted and the
   realised speed-up.

ZipLM and ModelOpt's FastNAS pick structures against a latency table too, but search over retrained
candidates; here every candidate is a retraining-free prune of a few seconds to minutes.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch
from torch import nn

from core.data.calibration import calibration_batches
from core.depth.select import held_loss
from core.evaluation.latency import LatencyTable, measure_table, time_workload
from core.models.loading import ensure_pad_token, load_model
from core.pipeline.preflight import MIN_WIDTH_RATIO, TARGET_MAX_DEPTH, TARGET_MAX_WIDTH, check_model_fit
from core.pipeline.scoring import split_batches
from core.spec.recipe import Recipe


def reach(table: LatencyTable, recipe: Recipe) -> tuple[float, int, float]:
    """The best speed-up the table reaches for this recipe's units: ``(speed-up, blocks, width)``."""
    max_blocks = int(table.layers * TARGET_MAX_DEPTH) if recipe.target.depth or recipe.modules == "blocks" else 0
    max_width = 0.0 if recipe.modules == "blocks" else min(table.widths[-1], TARGET_MAX_WIDTH)
    return max(((table.speedup(d, max_width), d, max_width) for d in range(max_blocks + 1)), key=lambda x: x[0])


def candidates(table: LatencyTable, recipe: Recipe) -> list[tuple[int, float]]:
    """``(blocks, width)`` pairs that reach the target (module docstring, step 3)."""
    speedup = recipe.target.speedup
    best, blocks, width = reach(table, recipe)
    if best < speedup:
        how = f"{blocks} of {table.layers} blocks removed" + (f" and {width:.0%} of each other block" if width else "")
        raise ValueError(
            f"a {speedup:g}× {recipe.target.workload} speed-up is out of reach on {table.device}: the latency table's "
            f"best is {best:.2f}× ({how}); ask for {best:.2f}× or less"
        )
    pairs = []
    for d in range(blocks + 1):
        w = 0.0 if recipe.modules == "blocks" else table.width_for(speedup, d)
        if w is None or (recipe.modules == "blocks" and table.speedup(d, 0.0) < speedup):
            continue
        if 0 < w < MIN_WIDTH_RATIO:
            w = MIN_WIDTH_RATIO
        pairs.append((d, w))
        if w == 0.0:  # depth only reaches it: more blocks would only cost quality
            break
    k = recipe.target.candidates
    if len(pairs) <= k:
        return pairs
    picks = sorted({round(i * (len(pairs) - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]
    return [pairs[i] for i in picks]


def concrete(recipe: Recipe, blocks: int, width: float, layers: int) -> Recipe:
    """The recipe with ``blocks`` removed and ``width`` of every other block's parameters (in place of
    the target)."""
    share = blocks / layers
    ratio = round(share + (1 - share) * width, 6)
    update: dict[str, Any] = {"target": None, "ratio": ratio}
    if recipe.modules != "blocks":
        if width == 0.0:
            update["modules"] = "blocks"
        else:
            update["depth"] = recipe.depth.model_copy(update={"blocks": blocks})
    return Recipe.model_validate(recipe.model_copy(update=update).model_dump())


def _realised(dense: nn.Module, pruned: nn.Module, workload: str, rounds: int = 3) -> tuple[float, float]:
    """Median seconds of ``workload`` on the dense and the pruned model, in interleaved rounds (after one
    warm-up round)."""
    times: dict[str, list[float]] = {"dense": [], "pruned": []}
    for r in range(rounds + 1):
        for name, m in (("dense", dense), ("pruned", pruned)):
            t = time_workload(m, workload)
            if r:
                times[name].append(t)
    return statistics.median(times["dense"]), statistics.median(times["pruned"])


def prune_to_speed(recipe: Recipe, model: nn.Module | None, tokenizer: Any, run: Any, prune_fn) -> Any:
    """Run a speed-target recipe (module docstring); ``prune_fn`` is :func:`core.prune` for one concrete
    candidate. Returns the kept candidate's result, the target, the table and every candidate in its
    metrics."""
    if model is None:
        model, tokenizer, _ = load_model(recipe.model, recipe.dtype, recipe.device)
    model.eval()
    check_model_fit(recipe, model.config)  # the submit-time checks, the bound on the speed-up among them
    if tokenizer is None and run.calibration is None:
        raise ValueError("a tokenizer is needed when a model object is passed")
    ensure_pad_token(tokenizer)
    from core.models.adapter import adapter_for

    adapter = adapter_for(model)
    report = run.report
    report("latency", 0, 1)
    table = measure_table(model, recipe.target.workload)
    report("latency", 1, 1)
    pairs = candidates(table, recipe)
    fit, held = run.calibration or calibration_batches(recipe.calibration, tokenizer, adapter.kind)
    held_batches = split_batches(held if len(held) else fit, recipe.calibration.batch_size)
    best, rows = None, []
    options = {"calibration": (fit, held), "progress": run.progress, "show_progress": run.show_progress}
    for d, w in pairs:
        cand = concrete(recipe, d, w, table.layers)
        result = prune_fn(cand, model=copy.deepcopy(model), tokenizer=tokenizer, **options)
        loss = held_loss(result.model, adapter_for(result.model), held_batches)
        rows.append(
            {"blocks": d, "width": round(w, 4), "ratio": cand.ratio, "predicted": table.speedup(d, w), "loss": loss}
        )
        if best is None or loss < best[1]:
            best = (result, loss, d, w)
        del result
    result, loss, d, w = best
    dense_s, pruned_s = _realised(model, result.model, recipe.target.workload)
    result.metrics.update(
        target_speedup=recipe.target.speedup,
        target_workload=recipe.target.workload,
        predicted_speedup=round(table.speedup(d, w), 4),
        realised_speedup=round(dense_s / pruned_s, 4),
        target_device=table.device,
        target_candidates=rows,
        latency_table=table.to_dict(),
        heldout_loss=round(loss, 6),
    )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result
