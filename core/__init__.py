"""Retraining-free structured pruning of transformers with least-squares reconstruction (LIAR).

Public API::

    from core import Recipe, prune, evaluate, load_pruned, reconstruct_linear, perplexity
    result = prune(Recipe.load("recipe.yaml"))
    evaluate(result, {"type": "perplexity", "text": "wikitext2"})   # in memory or streamed: decided here
    result.save("pruned/")

Names are imported on first use, so ``import core`` (and the CLI's ``--help``) does not load torch.
"""

from importlib import import_module

_EXPORTS = {
    "METHODS": "core.stats.reconstruct",
    "reconstruct_linear": "core.stats.reconstruct",
    "LayerReport": "core.pipeline.result",
    "PruneResult": "core.pipeline.result",
    "prune": "core.pipeline.sequential",
    "preflight": "core.pipeline.preflight",
    "Recipe": "core.spec.recipe",
    "load_model": "core.models.loading",
    "load_pruned": "core.models.loading",
    "perplexity": "core.evaluation.perplexity",
    "evaluate": "core.evaluation.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'core' has no attribute {name!r}")
