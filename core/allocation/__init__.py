"""Budgets over layers: which heads and neurons each layer keeps, from the criterion's scores."""

from core.allocation.plan import Budget, LayerPlan, Plan, allocate

__all__ = ["Budget", "LayerPlan", "Plan", "allocate"]
