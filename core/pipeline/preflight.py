"""Checks of a recipe against the model it names, before anything heavy runs.

Torch-free (families are data, configs are read as JSON or through ``AutoConfig``), so the job
service and the web form run them at submit time without loading the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.liar_families import PRUNED_PREFIX, family_of, supported_model_types
from core.spec.recipe import Recipe


def as_recipe(recipe: Recipe | dict | str | Path) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return Recipe.model_validate(recipe)
    return Recipe.load(recipe)


def check_model_fit(recipe: Recipe, config: Any) -> None:
    """The recipe checks that need the model's config (``ValueError`` with the reason): sequence length
    within the model's positions, ``positions: first`` only for encoders, not an already pruned model.
    :func:`prune` runs them after loading; :func:`preflight` before a job is queued."""
    model_type = getattr(config, "model_type", None)
    if getattr(config, "liar_layout", None) is not None or str(model_type or "").startswith(PRUNED_PREFIX):
        raise ValueError("this model is already pruned; prune the original model with a larger ratio instead")
    family = family_of(model_type)
    if family is None:
        raise ValueError(f"model type {model_type!r} is not supported; supported: {supported_model_types()}")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and recipe.calibration.max_seq_length > limit:
        raise ValueError(
            f"max_seq_length {recipe.calibration.max_seq_length} exceeds the model's limit of {limit} positions"
        )
    if recipe.reconstruction.positions == "first" and family.kind != "encoder":
        raise ValueError(
            "reconstruction.positions 'first' fits only each sequence's first ([CLS]) token, which is meant for "
            f"encoder classifiers; {family.name} is a decoder scored at every position: use 'all'"
        )


def preflight(recipe: Recipe | dict | str | Path) -> None:
    """:func:`check_model_fit` with the model's config, when it can be read without downloading (a local
    directory, or a hub id already in the local cache); otherwise nothing — :func:`prune` checks again."""
    from transformers import AutoConfig, PretrainedConfig

    recipe = as_recipe(recipe)
    local = Path(recipe.model).expanduser() / "config.json"
    try:
        config = AutoConfig.from_pretrained(recipe.model, local_files_only=True)
    except Exception:  # a pruned (liar_) or unknown local type still has its fields; else the worker checks
        if not local.is_file():
            return
        config = PretrainedConfig.from_json_file(local)
    check_model_fit(recipe, config)
