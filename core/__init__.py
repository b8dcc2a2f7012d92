"""Retraining-free structured pruning of transformers with least-squares reconstruction (LIAR).

Public API::

    from core import Recipe, prune, load_pruned, reconstruct_linear, perplexity
    result = prune(Recipe.load("recipe.yaml"))
    result.save("pruned/")
"""

from core.evaluate import perplexity
from core.export import load_pruned
from core.pipeline import LayerReport, PruneResult, prune
from core.recipe import Recipe
from core.reconstruct import METHODS, reconstruct_linear

__all__ = [
    "METHODS",
    "LayerReport",
    "PruneResult",
    "Recipe",
    "load_pruned",
    "perplexity",
    "prune",
    "reconstruct_linear",
]
