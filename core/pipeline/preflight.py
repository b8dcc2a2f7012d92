"""Checks of a recipe against the model it names, before anything heavy runs.

Torch-free (families are data, configs are read as JSON or through ``AutoConfig``), so the job
service and the web form run them at submit time without loading the engine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.models.config_file import read_config
from core.models.liar_families import PRUNED_PREFIX, family_of, pools_first_token, unsupported_reason
from core.spec.recipe import Recipe


def as_recipe(recipe: Recipe | dict | str | Path) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.model_validate(recipe)
    return Recipe.load(recipe)


def check_model_fit(recipe: Recipe, config: Any, eval_lengths: list[int] | tuple[int, ...] = ()) -> None:
    """The recipe checks that need the model's config (``ValueError`` with the reason): sequence length
    (and the window lengths of the evaluations to follow) within the model's positions, ``positions:
    first`` only for encoders, not an already pruned model. :func:`prune` runs them after loading;
    :func:`preflight` before a job is queued."""
    model_type = getattr(config, "model_type", None)
    if getattr(config, "liar_layout", None) is not None or str(model_type or "").startswith(PRUNED_PREFIX):
        raise ValueError("this model is already pruned; prune the original model with a larger ratio instead")
    family = family_of(model_type)
    if family is None:
        raise ValueError(unsupported_reason(model_type))
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and recipe.calibration.max_seq_length > limit:
        raise ValueError(
            f"max_seq_length {recipe.calibration.max_seq_length} exceeds the model's limit of {limit} positions"
        )
    for length in eval_lengths:
        if limit is not None and length > limit:
            raise ValueError(
                f"evaluation seq_len {length} exceeds the model's limit of {limit} positions; "
                f"evaluate with seq_len {limit} or less"
            )
    positions = recipe.reconstruction.positions
    if positions in ("first", "pooled") and family.kind != "encoder":
        raise ValueError(
            f"reconstruction.positions {positions!r} fits each sequence's first ([CLS]) token only, which is meant for "
            f"encoder classifiers; {family.name} is a decoder scored at every position: use 'all'"
        )
    check_depth(recipe, config)


# the width pruning's share must be at least this much of the remaining blocks' parameters, or the
# recipe is depth only in all but name (use modules: blocks)
MIN_WIDTH_RATIO = 0.005


def check_depth(recipe: Recipe, config: Any) -> None:
    """The depth checks that need the model's config (``ValueError`` with the reason); run before any
    work, and before a job is queued."""
    if not recipe.removes_blocks and recipe.target is None:
        return
    family = family_of(getattr(config, "model_type", None))
    if family is not None and family.kind != "decoder":
        what = "a speed target times decoding" if recipe.target is not None else "depth pruning removes decoder blocks"
        raise ValueError(f"{what}; {family.name} is an encoder: prune heads and neurons by a ratio")
    n = int(config.num_hidden_layers)
    if recipe.target is not None:  # the depth is chosen on the worker, against its latency table
        check_target_bound(recipe, n)
        return
    blocks = recipe.depth_blocks(n)
    if blocks > n - 2:
        raise ValueError(
            f"the model has {n} blocks and depth pruning keeps the first and at least one after the removed span: "
            f"at most {max(n - 2, 0)} can go, {blocks} asked"
        )
    stand_in = recipe.depth.reconstruction == "ls" or recipe.depth.select == "fit"
    if stand_in and family is not None and family.ffn_output_norm is not None:
        raise ValueError(
            f"{family.label or family.name} normalises the FFN's output before the residual stream, so the "
            "least-squares stand-in cannot be folded into its weights: use depth.reconstruction none (and select "
            "loss or angular)"
        )
    if recipe.modules != "blocks" and width_ratio(recipe.ratio, blocks / n) < MIN_WIDTH_RATIO:
        raise ValueError(
            f"{blocks} of {n} blocks already remove {blocks / n:.1%} of the block parameters, the ratio "
            f"{recipe.ratio:g} leaves the heads and neurons nothing to remove: raise ratio, lower depth.blocks, or "
            "prune modules: blocks"
        )


# a speed target's reach (core/pipeline/target.py): at most this share of the blocks removed, at most
# TARGET_MAX_WIDTH of every other block's parameters
TARGET_MAX_DEPTH = 0.5
TARGET_MAX_WIDTH = 0.65


def check_target_bound(recipe: Recipe, layers: int) -> None:
    """Refuse, before a job is queued, a speed-up no device reaches within the target's reach: even if
    all of a call's time went into the blocks and shrank with their parameters, removing half the
    blocks and 65% of the rest gives at most L / ((L − D)(1 − w)). The worker refuses a lesser target
    it cannot reach against its own latency table."""
    depth = int(layers * TARGET_MAX_DEPTH) if recipe.target.depth or recipe.modules == "blocks" else 0
    width = 0.0 if recipe.modules == "blocks" else TARGET_MAX_WIDTH
    bound = layers / ((layers - depth) * (1 - width))
    if recipe.target.speedup > bound:
        raise ValueError(
            f"a {recipe.target.speedup:g}× speed-up is beyond what pruning at most {depth} of {layers} blocks and "
            f"{width:.0%} of the others can give on any device (at most {bound:.2f}×, and less where the embeddings, "
            f"the output head and the per-call work take time); ask for less"
        )


def width_ratio(total: float, depth_share: float) -> float:
    """The fraction of the remaining blocks' parameters the width pruning removes so that depth and
    width together remove ``total`` (``depth_share``: the fraction the removed blocks held)."""
    return (total - depth_share) / (1.0 - depth_share)


def _cached_config(model: str) -> dict[str, Any] | None:
    """The raw ``config.json`` of a local directory or of a hub id already in the local cache, or None."""
    local = Path(model).expanduser() / "config.json"
    path: Any = local if local.is_file() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a valid repo id, or no cache: the worker checks after loading
            return None
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        return None
    return read_config(Path(path).parent)  # a config.json that is no JSON object is refused here


def _offline_config(model: str) -> dict[str, Any]:
    """:func:`_cached_config`, empty where it is unreadable offline or no JSON object (the worker
    checks again after loading)."""
    try:
        return _cached_config(model) or {}
    except ValueError:
        return {}


def model_positions(model: str) -> int | None:
    """The model's ``max_position_embeddings`` when its config is readable offline (else None)."""
    value = _offline_config(model).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_kind(model: str) -> tuple[str, bool] | None:
    """``(kind, pools_first)`` — ``"decoder"`` or ``"encoder"``, and whether its task head reads only
    the first token — when the model's config is readable offline and its family is supported (else
    None): what the recipe's ``auto`` settings resolve by (:meth:`Recipe.resolved`)."""
    config = _offline_config(model)
    family = family_of(config.get("model_type"))
    if family is None:
        return None
    return family.kind, pools_first_token(config.get("architectures"))


def default_eval_seq_len(model: object, preferred: int = 512) -> int:
    """An evaluation window for ``model`` when none is asked for: ``preferred``, or the model's positions
    if fewer (a 256-position model gets 256) when its config is readable offline."""
    positions = model_positions(model) if isinstance(model, str) else None
    return min(preferred, positions or preferred)


def preflight(recipe: Recipe | dict | str | Path, eval_lengths: list[int] | tuple[int, ...] = ()) -> None:
    """:func:`check_model_fit` with the model's config, when it can be read without downloading (a local
    directory, or a hub id already in the local cache); otherwise nothing — :func:`prune` checks again.
    Reads the config as JSON: no torch, no transformers, so a form check in the web process stays fast.
    ``eval_lengths``: the window lengths of the evaluations that will follow the pruning, checked against
    the model's positions too, so a job never prunes and then fails on a length known beforehand."""
    recipe = as_recipe(recipe)
    raw = _cached_config(recipe.model)
    if raw is not None:
        check_model_fit(recipe, SimpleNamespace(**raw), eval_lengths)
