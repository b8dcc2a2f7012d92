"""Budgets over layers: which heads and neurons each layer keeps, from the criterion's scores."""

from core.allocation.plan import LayerPlan, Plan, allocate

__all__ = ["LayerPlan", "Plan", "allocate"]
