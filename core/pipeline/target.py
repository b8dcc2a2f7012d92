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
from collections.abc import Iterator
from typing import Any

import torch

from core.data.calibration import calibration_batches
from core.depth.select import held_loss
from core.evaluation.latency import LatencyTable, interleaved_seconds, measure_table
from core.pipeline.depth import split_held
from core.pipeline.preflight import MIN_WIDTH_RATIO, TARGET_MAX_DEPTH, TARGET_MAX_WIDTH, check_model_fit
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


def candidate_results(
    recipe: Recipe, source: Any, table: LatencyTable, run: Any, prune_fn
) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each candidate pruned in full on a copy of ``source.model`` (the same calibration for all):
    ``(row, result)`` with the row's blocks, width, ratio, predicted speed-up and held-aside loss."""
    fit, held = run.calibration or calibration_batches(recipe.calibration, source.tokenizer, source.adapter.kind)
    held_batches = split_held(held, fit, recipe.calibration.batch_size)
    options = {"calibration": (fit, held), "progress": run.progress, "show_progress": run.show_progress}
    for d, w in candidates(table, recipe):
        cand = concrete(recipe, d, w, table.layers)
        result = prune_fn(cand, model=copy.deepcopy(source.model), tokenizer=source.tokenizer, **options)
        loss = held_loss(result.model, result.adapter, held_batches)
        yield (
            {"blocks": d, "width": round(w, 4), "ratio": cand.ratio, "predicted": table.speedup(d, w), "loss": loss},
            result,
        )


def prune_to_speed(recipe: Recipe, source: Any, run: Any, prune_fn) -> Any:
    """Run a speed-target recipe (module docstring) on ``source`` (the whole model in memory, as
    ``sequential.MemorySource`` loads it); ``prune_fn`` is :func:`core.prune` for one concrete
    candidate. Returns the kept candidate's result, the target, the table and every candidate in its
    metrics."""
    model = source.model
    check_model_fit(recipe, model.config)  # the submit-time checks, the bound on the speed-up among them
    report = run.report
    report("latency", 0, 1)
    table = measure_table(model, recipe.target.workload)
    report("latency", 1, 1)
    best, rows = None, []
    for row, result in candidate_results(recipe, source, table, run, prune_fn):
        rows.append(row)
        if best is None or row["loss"] < best[0]["loss"]:
            best = (row, result)
        del result
    row, result = best
    times = interleaved_seconds({"dense": model, "pruned": result.model}, recipe.target.workload, rounds=3)
    result.metrics.update(
        target_speedup=recipe.target.speedup,
        target_workload=recipe.target.workload,
        predicted_speedup=round(row["predicted"], 4),
        **realised(times["dense"], times["pruned"]),
        target_device=table.device,
        target_candidates=rows,
        latency_table=table.to_dict(),
        heldout_loss=round(row["loss"], 6),
    )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def realised(dense: list[float], pruned: list[float]) -> dict[str, float]:
    """The realised speed-up of interleaved rounds (``dense[i]`` and ``pruned[i]`` timed side by side):
    the ratio of the medians, and as its spread the least and greatest ratio of one round's pair (the
    web app shows a figure whose spread swamps its effect as not measurable)."""
    median = round(statistics.median(dense) / statistics.median(pruned), 4)
    pairs = [d / p for d, p in zip(dense, pruned, strict=True)]
    return {
        "realised_speedup": median,
        "realised_speedup_low": round(min(*pairs, median), 4),
        "realised_speedup_high": round(max(*pairs, median), 4),
        "realised_speedup_repeats": len(pairs),
    }
