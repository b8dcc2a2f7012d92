"""``query_heads: uniform``: a global plan whose every layer keeps the same number of query heads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core import prune
from core.spec.recipe import Recipe
from tests.conftest import recipe_for


@pytest.mark.parametrize("criterion", ["magnitude", "obs"])
@pytest.mark.parametrize("ratio", [0.2, 0.4])
def test_every_layer_keeps_as_many_query_heads(llama_dir, corpus, criterion, ratio):
    recipe = recipe_for(llama_dir, corpus, ratio=ratio, allocation="global", criterion={"name": criterion})
    free = prune(recipe)
    uniform = prune({**recipe, "query_heads": "uniform"})
    heads = [len(lp.heads) for lp in uniform.plan.layers]
    assert len(set(heads)) == 1 and heads[0] < 8  # heads go, the same number in every layer
    assert abs(uniform.plan.ratio - ratio) < 0.03  # the budget is still met (neurons make up the rest)
    assert uniform.plan.ratio == pytest.approx(free.plan.ratio, abs=0.03)


def test_vllm_form_needs_uniform_query_heads(llama_dir, corpus):
    recipe = recipe_for(llama_dir, corpus)
    with pytest.raises(ValidationError, match="export vllm needs the same number of query heads in every layer"):
        Recipe.model_validate({**recipe, "export": ["vllm"]})
    Recipe.model_validate({**recipe, "export": ["vllm"], "query_heads": "uniform"})
    Recipe.model_validate({**recipe, "export": ["vllm"], "modules": "neurons"})
    with pytest.raises(ValidationError, match="head_ratio obs gives each its own"):
        Recipe.model_validate(
            {**recipe, "query_heads": "uniform", "head_ratio": "obs", "reconstruction": {"select": "obs"}}
        )
