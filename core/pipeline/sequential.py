"""The sequential pruning pipeline (the paper's Algorithm 1, generalised).

    load model → calibration windows → criterion scores → plan (keep-sets per layer)
    → for each block ℓ, on the *pruned* model's own inputs to ℓ:
          attention:  stream the inputs of the output projection (o_proj) into G, s, n
                      → surgery (drop heads) → reconstruct o_proj from the statistics
          FFN:        stream the inputs of the FFN output projection (down_proj) on the block
                      whose attention is already pruned → surgery (drop neurons) → reconstruct
          outputs:    run the pruned block → inputs of block ℓ+1
    → PruneResult (the pruned model in memory, the plan, a per-layer report; ``.save(dir)``)

Only two kinds of tensors are ever kept: the hidden states entering the current block (n × L × d in
the model's dtype) and the statistics of one projection (C_in² in float32/float64).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.allocation import Plan
from core.allocation.groups import kv_index_layers
from core.criteria import Scores
from core.data.calibration import CalibrationBatch, calibration_batches
from core.kernels.cpu_matmul import route_linears
from core.models.adapter import adapter_for, block_parameters
from core.models.host_memory import reuse_freed_memory
from core.models.liar_families import pools_first_token
from core.models.loading import ensure_pad_token, load_model
from core.models.offload import OBS_MATRICES, REFIT_MATRICES, Offload, Workload, offload_for
from core.models.safetensors_io import INDEX, SINGLE
from core.models.streaming import checkpoint_directory
from core.pipeline.blocks import reconstruct_blocks
from core.pipeline.context import BlockIO, ModelSource, Progress, RunContext, RunOptions
from core.pipeline.depth import kept_plan, remove_depth
from core.pipeline.measure import BlockSpeed, peak_memory_mb
from core.pipeline.planning import make_plan, obs_split, resolved_kv_groups, round_to
from core.pipeline.preflight import as_recipe, check_model_fit, width_ratio
from core.pipeline.result import PruneResult
from core.pipeline.resume import RunScores, kept_scores, made_by
from core.pipeline.scoring import BlockPass, score_layers, split_batches
from core.pipeline.streamed import StreamSource, check_streamable
from core.pipeline.target import prune_to_speed
from core.spec.criteria import streaming_refusal
from core.spec.recipe import Recipe


class MemorySource:
    """The whole model on its device (loaded from ``recipe.model`` or passed in)."""

    def __init__(self, recipe: Recipe, model, tokenizer, calibration):
        if model is None:
            model, tokenizer, adapter = load_model(recipe.model, recipe.dtype, recipe.device)
        else:
            adapter = adapter_for(model)
            model.eval()
        if tokenizer is None and calibration is None:
            raise ValueError("a tokenizer is needed when a model object is passed")
        ensure_pad_token(tokenizer)
        self.model, self.tokenizer, self.adapter = model, tokenizer, adapter
        self.device = next(model.parameters()).device
        self.io = BlockIO()
        self.reuses_memory = True  # the whole model is held anyway

    def score(
        self, recipe: Recipe, batches: list[CalibrationBatch], progress: Callable[[int], None] | None, offload: Offload
    ) -> list[Scores]:
        blocks = BlockPass(offload=offload, progress=progress)
        return score_layers(self.model, self.adapter, recipe, batches, self.device, blocks)

    def remove_depth(
        self,
        recipe: Recipe,
        calibration: tuple[CalibrationBatch, CalibrationBatch],
        report: Progress,
        speed: BlockSpeed | None = None,
    ) -> dict[str, Any]:
        metrics = remove_depth(self.model, self.adapter, recipe, calibration, report, speed)
        self.adapter = adapter_for(self.model)
        return metrics

    def finish(self, result: PruneResult, report: Progress) -> PruneResult:
        return result  # the pruned model is the result's

    def abort(self) -> None:
        pass


def execution_mode(recipe: Recipe, model: nn.Module | None, output_dir) -> tuple[str, Path | None]:
    """``("stream", checkpoint directory)`` or ``("memory", None)`` for this run (see ``Recipe.execution``)."""
    if recipe.execution == "memory":
        return "memory", None
    explicit = recipe.execution == "stream"
    if explicit:
        if model is not None:
            raise ValueError("execution: stream reads the model from its checkpoint; do not pass a model object")
        if output_dir is None:
            raise ValueError("execution: stream writes the pruned model as it goes; give an output directory")
        check_streamable(recipe)
    elif (
        model is not None
        or output_dir is None
        or streaming_refusal(recipe.criterion.name)
        or recipe.auto_may_use_gradients  # auto may pick Kwon et al.'s Fisher: whole-model gradients
        or recipe.target is not None  # whole candidates are compared
    ):
        return "memory", None
    directory = checkpoint_directory(recipe.model)
    if directory is None or not ((directory / INDEX).is_file() or (directory / SINGLE).is_file()):
        if explicit:
            raise ValueError(f"execution: stream needs safetensors weights; {recipe.model!r} has none")
        return "memory", None
    return "stream", directory


@torch.no_grad()
def prune(
    recipe: Recipe | dict | str | Path,
    *,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    output_dir: str | Path | None = None,
    overwrite: bool = False,
    **options: Any,
) -> PruneResult:
    """Prune and reconstruct a model as the recipe says.

    ``model`` / ``tokenizer`` may be passed to skip loading ``recipe.model``. With ``output_dir``
    (where :meth:`PruneResult.save` will write the result) a model read from a directory or the hub
    is *streamed* (``recipe.execution``, default ``auto``): one block at a time from its shards,
    written out as it is pruned; the result then holds no model, its checkpoint does. Without it, or
    for a model object, the whole model is pruned in memory.

    ``options`` are the fields of :class:`RunOptions` (any other keyword is refused):
    ``calibration`` — pre-tokenised ``(fit, held_aside)`` batches — skips the recipe's calibration
    source; ``scores`` — the :attr:`PruneResult.scores` of an earlier run of the same model and
    criterion — skips scoring (criteria do not depend on the ratio or the reconstruction method, so
    sweeps score once); ``progress(stage, i, n)`` is called at every stage and after every block;
    ``show_progress`` draws a progress bar; ``measure_speed`` times every block on one calibration
    batch, dense and pruned side by side (:class:`~core.pipeline.measure.BlockSpeed`: ``block_speedup``
    and its spread ``block_speedup_low`` / ``_high`` over ``block_speedup_repeats`` repeats,
    ``block_seconds_dense`` / ``block_seconds_pruned`` in the metrics); ``checkpoints`` (a
    :class:`~core.pipeline.checkpoint.Checkpoints`, e.g. ``FolderCheckpoints("ckpt/")``) saves the block
    loop's state at block boundaries and resumes from the one it holds (``core/pipeline/resume.py``).
    """
    run = RunOptions.of(options)
    recipe = as_recipe(recipe)
    report = run.report
    t_start = time.perf_counter()
    if recipe.target is not None:  # the recipes that reach the speed-up, each pruned in memory
        result = prune_to_speed(recipe, MemorySource(recipe, model, tokenizer, run.calibration), run, prune)
        result.seconds = time.perf_counter() - t_start
        report("done", 1, 1)
        return result
    mode, directory = execution_mode(recipe, model, output_dir)

    report("load", 0, 1)
    source: ModelSource
    if mode == "stream":
        source = StreamSource(recipe, directory, output_dir, overwrite, tokenizer)
    else:
        source = MemorySource(recipe, model, tokenizer, run.calibration)
    try:
        # where the application opted in: freed activations reused rather than faulted in again, unless memory
        # is bounded (core/models/host_memory.py); on a CPU, the model's float32 projections through the faster
        # of its two matrix libraries (core/kernels/cpu_matmul.py), removed again on exit
        with (
            reuse_freed_memory() if source.reuses_memory else nullcontext(),
            route_linears(source.model, source.device),
        ):
            result = source.finish(_run(recipe, source, run), report)
    except BaseException:
        source.abort()
        raise
    result.seconds = time.perf_counter() - t_start
    result.metrics["execution"] = mode
    result.metrics["host_memory"] = "reused" if source.reuses_memory else "bounded"
    report("done", 1, 1)
    return result


def _offload(recipe: Recipe, source: ModelSource, fit: CalibrationBatch, held: CalibrationBatch) -> Offload:
    """Where this run keeps its calibration activations (``recipe.activations``)."""
    obs = recipe.reconstruction.resolved_select() == "obs" or recipe.head_ratio == "obs"
    dense = recipe.reconstruction.target == "dense"
    work = Workload(
        tokens=fit.input_ids.numel() + held.input_ids.numel(),
        batch_tokens=recipe.calibration.batch_size * fit.input_ids.shape[1],
        held_tokens=held.input_ids.numel(),
        dense=dense,
        matrices=OBS_MATRICES if obs or dense else REFIT_MATRICES,
    )
    return offload_for(recipe.activations, source.model, source.adapter, source.device, work)


def _metrics(ctx: RunContext, plan: Plan, rounding: tuple[int, int]) -> dict[str, Any]:
    """The run's choices as the result's metrics (what ``auto`` settings resolved to, the realised
    plan's means)."""
    recipe, adapter = ctx.recipe, ctx.adapter
    return {
        # what criterion / allocation auto resolved to (the recipe records them too)
        "criterion": recipe.criterion.name,
        "allocation": recipe.allocation,
        "round_to_heads": rounding[0],
        "round_to_neurons": rounding[1],
        "round_to_kv_groups": ctx.kv_groups,
        "activations": ctx.offload.name,
        "kv_index_layers": kv_index_layers(plan, adapter),
        # the split the allocation chose (head_ratio), as numbers the job record keeps
        "kept_heads_mean": round(sum(len(lp.heads) for lp in plan.layers) / len(plan.layers), 3),
        "kept_neurons_mean": round(sum(len(lp.neurons) for lp in plan.layers) / len(plan.layers), 3),
        **(ctx.speed.metrics() if ctx.speed else {}),
    }


def _run(recipe: Recipe, source: ModelSource, options: RunOptions) -> PruneResult:
    model, tokenizer = source.model, source.tokenizer
    report = options.report
    check_model_fit(recipe, model.config)
    report("load", 1, 1)

    report("calibration", 0, 1)
    cal = options.calibration
    fit, held = cal if cal is not None else calibration_batches(recipe.calibration, tokenizer, source.adapter.kind)
    report("calibration", 1, 1)
    before = (sum(p.numel() for p in model.parameters()), block_parameters(model, source.adapter))
    if source.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(source.device)
    depth: dict[str, Any] = {}
    width = recipe
    speed = BlockSpeed() if options.measure_speed else None  # the removed blocks' times, then the kept ones'
    if recipe.removes_blocks:
        depth = source.remove_depth(recipe, (fit, held), report, speed)
        if recipe.modules == "blocks":
            return _depth_only(recipe, source, before, depth | (speed.metrics() if speed else {}))
        share = 1.0 - block_parameters(model, source.adapter) / before[1]
        width = recipe.model_copy(update={"ratio": width_ratio(recipe.ratio, share)})
        depth["width_ratio"] = round(width.ratio, 6)
    result = _prune_width(width, source, options, (fit, held), before, speed)
    # the result records the recipe as asked (ratio: depth and width together), auto settings resolved
    result.recipe = result.recipe.model_copy(update={"ratio": recipe.ratio})
    result.metrics.update(depth)
    return result


def _depth_only(recipe: Recipe, source: ModelSource, before: tuple[int, int], depth: dict[str, Any]) -> PruneResult:
    """The result of a run that removes whole blocks only: every kept block keeps its units."""
    plan, layout = kept_plan(source.model, source.adapter, before[1])
    return _result(recipe, source, before, (plan, plan, [], layout), metrics=depth)


def _prune_width(
    recipe: Recipe,
    source: ModelSource,
    options: RunOptions,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    before: tuple[int, int],
    speed: BlockSpeed | None = None,
) -> PruneResult:
    """Heads and neurons: score, plan, and the block loop (on a model that may have lost blocks);
    ``speed``: times every block dense and pruned (with ``measure_speed``), beside the removed ones'."""
    model, adapter, device, report = source.model, source.adapter, source.device, options.report
    # what runs is what the result (and the checkpoint's recipe.yaml) records: criterion, allocation
    # and select's auto resolved
    recipe = recipe.resolved(adapter.kind, pools_first_token([type(model).__name__]))
    select = recipe.reconstruction.resolved_select()
    recipe = recipe.model_copy(update={"reconstruction": recipe.reconstruction.model_copy(update={"select": select})})
    fit, held = calibration
    offload = _offload(recipe, source, fit, held)

    n_layers = adapter.n_layers
    scores, kept = _scores(recipe, source, options, calibration, offload)
    rounding, groups = round_to(recipe, adapter, device), resolved_kv_groups(recipe, device, model, adapter, scores)
    plan = make_plan(model, adapter, recipe, scores, rounding, groups)
    split = obs_split(model, adapter, recipe, scores, rounding, groups)
    report("scoring", n_layers, n_layers)

    ctx = RunContext(
        model=model,
        adapter=adapter,
        recipe=recipe,
        device=device,
        offload=offload,
        io=source.io,
        kv_groups=groups,
        report=report,
        show_progress=options.show_progress,
        speed=speed,
        checkpoints=options.checkpoints,
        scores=kept,
    )
    done = reconstruct_blocks(ctx, plan, (fit, held), split)
    metrics = _metrics(ctx, done.plan, rounding) | done.checkpoints
    if kept is not None and kept.kept_from is not None:
        metrics["scores_kept_from"] = kept.kept_from
    return _result(recipe, source, before, (done.plan, plan, done.reports, done.layout), scores, metrics)


def _scores(
    recipe: Recipe,
    source: ModelSource,
    options: RunOptions,
    calibration: tuple[CalibrationBatch, CalibrationBatch],
    offload: Offload,
) -> tuple[list[Scores], RunScores | None]:
    """The finalized scores the plan is made from, and what the run's checkpoints keep of them: given
    (``options.scores``, not kept), lent by the checkpoint the run resumes from when it was made by
    this format, code, recipe and windows (``core/pipeline/resume.py``), or scored."""
    n_layers, report = source.adapter.n_layers, options.report
    report("scoring", 0, n_layers)
    if options.scores is not None:
        if len(options.scores) != n_layers:
            raise ValueError(f"scores cover {len(options.scores)} layers but the model has {n_layers}")
        return options.scores, None
    if options.checkpoints is not None:
        kept = kept_scores(options.checkpoints, made_by(recipe, calibration), n_layers)
        if kept is not None:  # no scoring pass: the checkpoint's plan is made again from its own scores
            return kept.scores, kept
    batches = split_batches(calibration[0], recipe.calibration.batch_size)
    scores = source.score(recipe, batches, lambda i: report("scoring", i, n_layers), offload)
    return scores, RunScores(scores)


def _result(
    recipe: Recipe,
    source: ModelSource,
    before: tuple[int, int],
    done: tuple[Plan, Plan, list, list[dict[str, Any]]],
    scores: list[Scores] | None = None,
    metrics: dict[str, Any] | None = None,
) -> PruneResult:
    """The result of a run whose model is pruned: ``done`` is (the realised plan, the planned one, the
    per-layer report, the layout written into the config)."""
    model, adapter = source.model, source.adapter
    plan, planned, reports, layout = done
    model.config.liar_layout = layout
    model.config.liar_family = adapter.name
    return PruneResult(
        model=model,
        tokenizer=source.tokenizer,
        recipe=recipe,
        adapter=adapter,
        plan=plan,
        planned=planned,
        report=reports,
        params_before=before[0],
        params_after=sum(p.numel() for p in model.parameters()),
        block_params_before=before[1],
        block_params_after=block_parameters(model, adapter),
        seconds=0.0,
        peak_memory_mb=peak_memory_mb(source.device),
        scores=scores or [],
        metrics=metrics or {},
    )
