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

import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from core.adapters import Adapter, block_parameters, load_model, max_positions, unit_costs
from core.allocation import Plan, allocate
from core.calibration import CalibrationBatch, decoder_windows, encoder_samples, load_labels, load_texts
from core.criteria import CRITERIA, FINALIZE, NEEDS_GRADIENTS, NEEDS_INPUTS, ChannelStats, LayerInputs, Scores
from core.gradients import check_loss_data, mask_gradients, weight_gradients
from core.modeling.modeling_liar import ensure_bias, prune_heads_, prune_neurons_, set_module
from core.recipe import Recipe
from core.reconstruct import reconstruct_from_stats, relative_output_errors
from core.stats import InputStats

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``; raising from it aborts the run (cooperative cancellation)."""


class _Stop(Exception):
    """Raised from a hook to skip the rest of a forward pass."""


@dataclass
class LayerReport:
    layer: int
    module: str  # "attention" | "ffn"
    kept: int  # heads or neurons kept
    total: int
    error_before: float  # relative output error of the projection, pruned without reconstruction
    error_after: float  # ... after reconstruction
    measured_on: str  # "held-aside" calibration samples, or the fit samples when none are held aside
    seconds: float
    peak_memory_mb: float


@dataclass
class PruneResult:
    model: nn.Module
    tokenizer: Any
    recipe: Recipe
    adapter: Adapter
    plan: Plan
    report: list[LayerReport]
    params_before: int
    params_after: int
    block_params_before: int
    block_params_after: int
    seconds: float
    peak_memory_mb: float
    metrics: dict[str, Any] = field(default_factory=dict)
    scores: list[Scores] = field(default_factory=list, repr=False)  # the criterion's scores (reusable)

    @property
    def achieved_ratio(self) -> float:
        """Fraction of the transformer blocks' parameters removed (added biases counted)."""
        return 1.0 - self.block_params_after / self.block_params_before

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.recipe.model,
            "target_ratio": self.recipe.ratio,
            "achieved_ratio": round(self.achieved_ratio, 6),
            "ratio_deviation": round(self.achieved_ratio - self.recipe.ratio, 6),
            "params_before": self.params_before,
            "params_after": self.params_after,
            "block_params_before": self.block_params_before,
            "block_params_after": self.block_params_after,
            "prune_seconds": round(self.seconds, 3),
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            **self.metrics,
        }

    def save(self, output_dir: str | Path, overwrite: bool = False) -> Path:
        from core.export import save_pruned

        return save_pruned(self, output_dir, overwrite=overwrite)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (KiB on Linux)


def _as_recipe(recipe: Recipe | dict | str | Path) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.model_validate(recipe)
    return Recipe.load(recipe)


class _Runner:
    """Runs blocks on stored inputs; ``hidden[i]`` / ``extra[i]`` are batch i's block inputs."""

    def __init__(
        self, model: nn.Module, adapter: Adapter, batches: list[CalibrationBatch], device, positions: str = "all"
    ):
        self.model, self.adapter, self.device = model, adapter, device
        self.masks = [b.token_mask(adapter.kind, device) for b in batches]
        if positions == "first":  # statistics of each sequence's first token only
            self.masks = [_first_only(m) for m in self.masks]
        self.hidden: list[torch.Tensor] = []
        self.extra: list[tuple[tuple, dict]] = []
        self.kept: dict[str, list[torch.Tensor]] = {}
        self.replays: dict[str, tuple[nn.Module, nn.Module]] = {}
        self.batch = 0
        layer0 = adapter.layers(model)[0]

        def grab(_mod, args, kwargs):
            kwargs = dict(kwargs)
            hs = args[0] if args else kwargs.pop("hidden_states")
            self.hidden.append(hs.detach())
            self.extra.append((tuple(args[1:]), kwargs))
            raise _Stop

        handle = layer0.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for b in batches:
                try:
                    model.base_model(**b.model_inputs(adapter.kind, device))
                except _Stop:
                    pass
        finally:
            handle.remove()

    def run(self, layer: nn.Module, i: int) -> torch.Tensor:
        self.batch = i
        args, kwargs = self.extra[i]
        out = layer(self.hidden[i], *args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def collect(self, layer: nn.Module, path: str, sinks: list[InputStats], keep_inputs: bool = False) -> None:
        """Stream the inputs of ``layer.<path>`` into ``sinks[i]`` for each batch i, then stop the block.

        With ``keep_inputs`` the inputs are also kept (model dtype) so that :meth:`replay` can stand in
        for the module computing them instead of recomputing it.
        """
        current: list[int] = [0]
        kept: list[torch.Tensor] = []

        def hook(_mod, args):
            sinks[current[0]].add_batch(args[0], self.masks[current[0]])
            if keep_inputs:
                kept.append(args[0].detach())
            raise _Stop

        handle = layer.get_submodule(path).register_forward_pre_hook(hook)
        try:
            for i in range(len(self.hidden)):
                current[0] = i
                try:
                    self.run(layer, i)
                except _Stop:
                    pass
        finally:
            handle.remove()
        if keep_inputs:
            self.kept[path] = kept

    def replay(self, layer: nn.Module, block: str, path: str, keep: torch.Tensor, returns_tuple: bool) -> None:
        """Replace ``layer.<block>`` by a module replaying its (pruned) output from the kept inputs of
        ``path``: ``path(X[..., keep])`` if the projection lives inside the block, else ``X[..., keep]``."""
        inputs = self.kept[path]
        proj = layer.get_submodule(path) if path.startswith(block + ".") else None
        self.replays[block] = (layer.get_submodule(block), _Replay(inputs, keep, proj, returns_tuple, self))
        set_module(layer, block, self.replays[block][1])

    def restore(self, layer: nn.Module) -> None:
        for block, (original, _) in self.replays.items():
            set_module(layer, block, original)
        self.replays.clear()
        self.kept.clear()

    def advance(self, layer: nn.Module) -> None:
        self.hidden = [self.run(layer, i).detach() for i in range(len(self.hidden))]


def _first_only(mask: torch.Tensor) -> torch.Tensor:
    first = torch.zeros_like(mask)
    first[:, 0] = mask[:, 0]
    return first


class _Replay(nn.Module):
    """Stands in for a block whose output is a function of stored projection inputs."""

    def __init__(self, inputs, keep, proj, returns_tuple: bool, runner: _Runner):
        super().__init__()
        self.inputs, self.proj, self.returns_tuple, self.runner = inputs, proj, returns_tuple, [runner]
        self.keep = keep.nonzero().squeeze(1).to(inputs[0].device)

    def forward(self, *args, **kwargs):
        x = self.inputs[self.runner[0].batch].index_select(-1, self.keep)
        y = self.proj(x) if self.proj is not None else x
        return (y, None) if self.returns_tuple else y


@torch.no_grad()
def _dense_inputs(model: nn.Module, adapter: Adapter, batches: list[CalibrationBatch], device) -> list[LayerInputs]:
    """Per-channel statistics of every layer's o_proj / down_proj inputs on the dense model."""
    fam = adapter.family
    stats, handles, mask = [], [], [None]
    for layer in adapter.layers(model):
        entry = LayerInputs(
            ChannelStats(layer.get_submodule(fam.o).in_features, device),
            ChannelStats(layer.get_submodule(fam.ffn_out).in_features, device),
        )
        stats.append(entry)
        for path, sink in ((fam.o, entry.attn), (fam.ffn_out, entry.ffn)):
            handles.append(
                layer.get_submodule(path).register_forward_pre_hook(
                    lambda _m, a, sink=sink: sink.add_batch(a[0], mask[0])
                )
            )
    try:
        for b in batches:
            mask[0] = b.token_mask(adapter.kind, device)
            model.base_model(**b.model_inputs(adapter.kind, device))
    finally:
        for h in handles:
            h.remove()
    return stats


def _calibration(recipe: Recipe, tokenizer, adapter: Adapter) -> tuple[CalibrationBatch, CalibrationBatch]:
    texts = load_texts(recipe.calibration)
    if adapter.kind == "decoder":
        if recipe.calibration.label_field is not None:
            raise ValueError("calibration.label_field applies to encoder models; decoders use the language-model loss")
        return decoder_windows(texts, tokenizer, recipe.calibration)
    return encoder_samples(texts, tokenizer, recipe.calibration, load_labels(recipe.calibration))


def _score(model: nn.Module, adapter: Adapter, recipe: Recipe, batches: list[CalibrationBatch], device) -> list:
    """Every layer's criterion scores, with the data the criterion needs collected on the dense model."""
    name, options = recipe.criterion.name, recipe.criterion.options
    layers = adapter.layers(model)
    data: list[Any] = [None] * len(layers)
    if name in NEEDS_INPUTS:
        data = _dense_inputs(model, adapter, batches, device)
    elif name in NEEDS_GRADIENTS:
        kind, flag = NEEDS_GRADIENTS[name](options)
        available = sum(len(b) for b in batches)
        wanted = options.get("samples") or available
        if wanted > available:
            raise ValueError(
                f"{name}: samples={wanted} but the calibration has {available}; raise "
                "calibration.num_calibration_samples or lower samples"
            )
        chosen = _split(CalibrationBatch.concat(batches).slice(0, wanted), recipe.calibration.batch_size)
        check_loss_data(model, adapter, chosen[0], name)
        ckpt = bool(options.get("checkpointing", False))
        if kind == "mask":
            data = mask_gradients(model, adapter, chosen, keep_samples=flag, checkpointing=ckpt)
        else:
            data = weight_gradients(model, adapter, chosen, second_order=flag, checkpointing=ckpt)
    scores = [CRITERIA[name](layer, adapter, i, options, data[i]) for i, layer in enumerate(layers)]
    if name in FINALIZE:
        scores = FINALIZE[name](scores, options)
    return scores


def _split(batch: CalibrationBatch, size: int) -> list[CalibrationBatch]:
    return [batch.slice(i, i + size) for i in range(0, len(batch), size)]


def check_model_fit(recipe: Recipe, config: Any, adapter: Adapter | None = None) -> None:
    """The recipe checks that need the model's config (``ValueError`` with the reason): sequence length
    within the model's positions, ``positions: first`` only for encoders, not an already pruned model.
    :func:`prune` runs them after loading; :func:`preflight` before a job is queued."""
    if getattr(config, "liar_layout", None) is not None or str(getattr(config, "model_type", "")).startswith("liar_"):
        raise ValueError("this model is already pruned; prune the original model with a larger ratio instead")
    if adapter is None:
        from core.adapters import adapter_for

        adapter = adapter_for(config)
    limit = max_positions(config)
    if limit is not None and recipe.calibration.max_seq_length > limit:
        raise ValueError(
            f"max_seq_length {recipe.calibration.max_seq_length} exceeds the model's limit of {limit} positions"
        )
    if recipe.reconstruction.positions == "first" and adapter.kind != "encoder":
        raise ValueError(
            "reconstruction.positions 'first' fits only each sequence's first ([CLS]) token, which is meant for "
            f"encoder classifiers; {adapter.name} is a decoder scored at every position: use 'all'"
        )


def preflight(recipe: Recipe | dict | str | Path) -> None:
    """:func:`check_model_fit` with the model's config, when it can be read without downloading (a local
    directory, or a hub id already in the local cache); otherwise nothing — :func:`prune` checks again."""
    from transformers import AutoConfig, PretrainedConfig

    recipe = _as_recipe(recipe)
    local = Path(recipe.model).expanduser() / "config.json"
    try:
        config = AutoConfig.from_pretrained(recipe.model, local_files_only=True)
    except Exception:  # a pruned (liar_) or unknown local type still has its fields; else the worker checks
        if not local.is_file():
            return
        config = PretrainedConfig.from_json_file(local)
    check_model_fit(recipe, config)


@torch.no_grad()
def prune(
    recipe: Recipe | dict | str | Path,
    *,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    calibration: tuple[CalibrationBatch, CalibrationBatch] | None = None,
    scores: list[Scores] | None = None,
    progress: Progress | None = None,
    show_progress: bool = False,
) -> PruneResult:
    """Prune and reconstruct a model as the recipe says; returns the pruned model in memory.

    ``model`` / ``tokenizer`` may be passed to skip loading ``recipe.model``; ``calibration`` —
    pre-tokenised ``(fit, held_aside)`` batches — to skip the recipe's calibration source; ``scores`` —
    the :attr:`PruneResult.scores` of an earlier run of the same model and criterion — to skip scoring
    (criteria do not depend on the ratio or the reconstruction method, so sweeps score once).
    ``progress(stage, i, n)`` is called at every stage and after every block.
    """
    recipe = _as_recipe(recipe)
    report = progress or (lambda stage, done, total: None)
    t_start = time.perf_counter()

    report("load", 0, 1)
    if model is None:
        model, tokenizer, adapter = load_model(recipe.model, recipe.dtype, recipe.device)
    else:
        from core.adapters import adapter_for

        adapter = adapter_for(model)
        model.eval()
    if tokenizer is None and calibration is None:
        raise ValueError("a tokenizer is needed when a model object is passed")
    if tokenizer is not None and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = next(model.parameters()).device
    check_model_fit(recipe, model.config, adapter)
    report("load", 1, 1)

    report("calibration", 0, 1)
    fit, held = calibration if calibration is not None else _calibration(recipe, tokenizer, adapter)
    report("calibration", 1, 1)

    layers = adapter.layers(model)
    n_layers = len(layers)
    report("scoring", 0, n_layers)
    if scores is None:
        scores = _score(model, adapter, recipe, _split(fit, recipe.calibration.batch_size), device)
    elif len(scores) != n_layers:
        raise ValueError(f"scores cover {len(scores)} layers but the model has {n_layers}")
    costs = [unit_costs(layer, adapter) for layer in layers]
    layer_params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    plan = allocate(
        scores,
        adapter,
        costs,
        layer_params,
        recipe.ratio,
        recipe.modules,
        recipe.allocation,
        round_to=(recipe.round_to.heads, recipe.round_to.neurons),
    )
    report("scoring", n_layers, n_layers)

    params_before = sum(p.numel() for p in model.parameters())
    block_before = block_parameters(model, adapter)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    bs = recipe.calibration.batch_size
    n_fit = len(_split(fit, bs))
    runner = _Runner(model, adapter, _split(fit, bs) + _split(held, bs), device, recipe.reconstruction.positions)
    stats_dtype = getattr(torch, recipe.stats_dtype)
    method, damp = recipe.reconstruction.method, recipe.reconstruction.damp
    fam = adapter.family
    reports: list[LayerReport] = []
    layout: list[dict[str, Any]] = []
    bar = tqdm(total=n_layers, desc=f"prune+{method}", unit="layer", disable=not show_progress)

    def rebuild(
        layer: nn.Module,
        path: str,
        keep: torch.Tensor,
        group: int,
        shrink: Callable[[], None],
        added: list[str],
        li: int,
        module: str,
        kept: int,
        total: int,
    ) -> None:
        t0 = time.perf_counter()
        lin = layer.get_submodule(path)
        fit_stats = InputStats(lin.in_features, stats_dtype, device)
        held_stats = InputStats(lin.in_features, stats_dtype, device) if len(held) else fit_stats
        n_held = len(runner.hidden) - n_fit
        runner.collect(layer, path, [fit_stats] * n_fit + [held_stats] * n_held, keep_inputs=True)
        w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
        keep = keep.to(w.device)
        new_w, new_b = reconstruct_from_stats(method, w, b, keep, fit_stats, damp, group)
        naive_w, naive_b = reconstruct_from_stats("none", w, b, keep, fit_stats)
        err_before, err_after = relative_output_errors(w, b, keep, [(naive_w, naive_b), (new_w, new_b)], held_stats)
        del fit_stats, held_stats
        shrink()
        lin = layer.get_submodule(path)
        lin.weight.copy_(new_w.to(lin.weight.dtype))
        if new_b is not None:
            if lin.bias is None:
                ensure_bias(lin)
                added.append(path)
            lin.bias.copy_(new_b.to(lin.bias.dtype))
        reports.append(
            LayerReport(
                layer=li,
                module=module,
                kept=kept,
                total=total,
                error_before=err_before,
                error_after=err_after,
                measured_on="held-aside" if len(held) else "calibration",
                seconds=time.perf_counter() - t0,
                peak_memory_mb=_peak_memory_mb(device),
            )
        )

    last_pruned = max(
        (
            i
            for i, lp in enumerate(plan.layers)
            if len(lp.heads) < adapter.n_heads or len(lp.neurons) < adapter.n_neurons
        ),
        default=-1,
    )
    for li, layer in enumerate(layers):
        report("reconstruct", li, n_layers)
        lp = plan.layers[li]
        added: list[str] = []
        if len(lp.heads) < adapter.n_heads:
            keep = torch.zeros(adapter.n_heads, dtype=torch.bool)
            keep[lp.heads] = True
            keep = keep.repeat_interleave(adapter.head_dim)
            rebuild(
                layer,
                fam.o,
                keep,
                adapter.head_dim,
                partial(prune_heads_, layer, fam, model.config, lp.heads, lp.kv_heads),
                added,
                li,
                "attention",
                len(lp.heads),
                adapter.n_heads,
            )
            # later passes over this block replay the pruned attention instead of recomputing it
            runner.replay(layer, fam.attn, fam.o, keep, returns_tuple=True)
        if len(lp.neurons) < adapter.n_neurons:
            keep = torch.zeros(adapter.n_neurons, dtype=torch.bool)
            keep[lp.neurons] = True
            rebuild(
                layer,
                fam.ffn_out,
                keep,
                1,
                partial(prune_neurons_, layer, fam, lp.neurons),
                added,
                li,
                "ffn",
                len(lp.neurons),
                adapter.n_neurons,
            )
            runner.replay(layer, fam.ffn_block, fam.ffn_out, keep, returns_tuple=False)
        if li < last_pruned:  # the next block still has something to prune: feed it
            runner.advance(layer)
        runner.restore(layer)
        layout.append({"heads": lp.heads, "kv_heads": lp.kv_heads, "neurons": len(lp.neurons), "bias": added})
        bar.update(1)
        if reports and show_progress:
            errs = [r for r in reports if r.layer == li]
            bar.set_postfix_str(" ".join(f"{r.module[:4]} err {r.error_before:.3f}→{r.error_after:.3f}" for r in errs))
    bar.close()
    runner.hidden, runner.extra = [], []  # free the stored activations
    report("reconstruct", n_layers, n_layers)

    model.config.liar_layout = layout
    model.config.liar_family = adapter.name
    result = PruneResult(
        model=model,
        tokenizer=tokenizer,
        recipe=recipe,
        adapter=adapter,
        plan=plan,
        report=reports,
        params_before=params_before,
        params_after=sum(p.numel() for p in model.parameters()),
        block_params_before=block_before,
        block_params_after=block_parameters(model, adapter),
        seconds=time.perf_counter() - t_start,
        peak_memory_mb=_peak_memory_mb(device),
        scores=scores,
    )
    report("done", 1, 1)
    return result


def report_rows(result: PruneResult) -> list[dict[str, Any]]:
    return [asdict(r) for r in result.report]
