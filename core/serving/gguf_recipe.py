"""The GGUF architecture of the checkpoint a recipe will write, known before any pruning.

llama.cpp's ``qwen3``, ``gemma2`` and ``gemma3`` state one width for every layer and no bias on the
attention output or the FFN, and its ``phi3`` needs every query head as well; the default recipe
(allocation global, a least-squares refit that adds output biases) gives neither. What a recipe will give
is read from its settings, the same way for every model of a family, and put to the same decision the
writer takes on the finished checkpoint (``core.models.serving_forms.gguf_architecture``), so a recipe
this check passes writes a checkpoint the writer takes.

The reading errs on the side of refusing: a setting that may give layers of different widths (a rounding
multiple above 1, key/value groups pruned one head at a time, an allocation that resolves to global)
counts as giving them, since a refusal after hours of pruning is what this check is for.
"""

from __future__ import annotations

from dataclasses import replace

from core.allocation.plan import auto_multiple
from core.models.serving_forms import BIAS_FREE_METHODS, NO_BIAS_RECIPE, SHARED, Form, gguf_architecture
from core.serving.layout import check_rope
from core.spec.recipe import Recipe

# a speed target's candidates are pruned at ratios from near 0 up; ``allocation: auto`` resolves to global
# at low ratios if at any (``Recipe.resolved``), so the check reads it there
_TARGET_PROBE_RATIO = 0.01


def _neuron_multiple(recipe: Recipe, n_ff: int) -> int:
    """The FFN width multiple the recipe rounds to on any device (``auto``: the coarser of a CPU's and a
    GPU's, which are both 1 for FFNs narrower than 128)."""
    m = recipe.round_to.neurons
    if recipe.round_to.k_quant and n_ff >= 256:
        return 256
    return m if m != "auto" else max(auto_multiple(n_ff, "cpu"), auto_multiple(n_ff, "cuda"))


def recipe_form(recipe: Recipe, config: dict) -> Form:
    """The form of the checkpoint ``recipe`` prunes from the unpruned model of ``config``."""
    says = dict(subject="this recipe would give", verb="prune with")
    if recipe.modules == "blocks":  # whole blocks go: the others keep their widths, no refit adds a bias
        return Form(widths=None, bias=None, heads=None, **says)
    probe = recipe if recipe.ratio is not None else recipe.model_copy(update={"ratio": _TARGET_PROBE_RATIO})
    resolved = probe.resolved("decoder")  # every family with a GGUF form is a decoder
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    no_heads = resolved.allocation == "uniform" and not isinstance(recipe.head_ratio, str) and recipe.head_ratio == 0
    heads = recipe.modules in ("heads", "both") and not (recipe.modules == "both" and no_heads)
    fixes = ["allocation: uniform"] * (resolved.allocation != "uniform")
    if heads:
        fixes += ["a head_ratio other than obs"] * (recipe.head_ratio == "obs")
        # several key/value groups of several heads: heads pruned one at a time leave groups of unequal
        # size, stated by repeating key/value heads, differently in each layer
        fixes += ["round_to.kv_groups: whole"] * (1 < n_kv < n_heads and recipe.round_to.kv_groups != "whole")
        fixes += ["round_to.heads: 1"] * (recipe.round_to.heads != 1)
    if recipe.modules in ("neurons", "both") and _neuron_multiple(recipe, config["intermediate_size"]) != 1:
        fixes.append("round_to.neurons: 1")
    fixes += ["round_to.k_quant: false"] * (bool(fixes) and recipe.round_to.k_quant)
    method = resolved.reconstruction.method
    regrouped = heads and 1 < n_kv < n_heads and recipe.round_to.kv_groups != "whole"
    return Form(
        widths=("layers of different widths", ", ".join(fixes)) if fixes else None,
        bias=None if method in BIAS_FREE_METHODS else ("the biases its reconstruction adds", NO_BIAS_RECIPE),
        heads=("query heads removed", "modules: neurons") if heads else None,
        regrouped=regrouped,
        **says,
    )


def check_recipe_gguf(plan, recipe: Recipe) -> str:
    """The llama.cpp architecture the checkpoint ``recipe`` prunes from the model ``plan`` describes
    (``gguf_export.plan`` of the unpruned model) will be written as; ``ExportError`` naming the recipe
    settings that would work when there is none."""
    pruned = recipe_form(recipe, plan.config)
    source = plan.form
    form = replace(
        pruned,
        widths=pruned.widths or source.widths,
        bias=pruned.bias or source.bias,
        heads=pruned.heads or source.heads,
        regrouped=source.regrouped or pruned.regrouped,
    )
    arch = gguf_architecture(plan.family, form, plan.n_rot, plan.head_dim)
    if arch in SHARED:
        check_rope(plan.config)
    return arch
