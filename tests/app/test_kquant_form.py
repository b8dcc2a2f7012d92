"""The New-run form's k-quant rows choice (FFN width multiple) becomes ``round_to.k_quant``."""

from __future__ import annotations

from app.web.fields import K_QUANT
from app.web.forms import build_recipe
from core.spec.recipe import Recipe
from tests.app.test_forms import _fields


def test_k_quant_rows_become_round_to_k_quant(tmp_path):
    recipe = Recipe.model_validate(build_recipe(**_fields(tmp_path, round_neurons=K_QUANT)))
    assert recipe.round_to.k_quant and recipe.round_to.neurons == "auto"
    plain = Recipe.model_validate(build_recipe(**_fields(tmp_path, round_neurons=64)))
    assert not plain.round_to.k_quant and plain.round_to.neurons == 64
