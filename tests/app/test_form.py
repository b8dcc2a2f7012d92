"""The New-run form's values → recipe mapping (no server needed)."""

from __future__ import annotations

import pytest

from app.main import build_recipe
from core.spec.recipe import Recipe
from jobs.service import SubmitError


def _form(tmp_path, **over):
    text = tmp_path / "calib.txt"
    text.write_text("some calibration text\n")
    values = dict(
        model="some/model",
        modules="both",
        ratio=0.3,
        allocation="uniform",
        round_neurons=1,
        criterion="magnitude",
        damp=0.001,
        calibration=str(text),
        upload=None,
        samples=16,
        seq_len=32,
        seed=0,
    )
    values.update(over)
    return values


@pytest.mark.parametrize("choice, expected", [(1, 1), (64, 64), ("64", 64), (None, 1)])
def test_ffn_width_multiple_becomes_round_to(tmp_path, choice, expected):
    recipe = Recipe.model_validate(build_recipe(**_form(tmp_path, round_neurons=choice)))
    assert recipe.round_to.neurons == expected
    assert recipe.round_to.heads == 1


@pytest.mark.parametrize("choice", [0, -8, "eight"])
def test_bad_ffn_width_multiple_is_refused(tmp_path, choice):
    with pytest.raises(SubmitError, match="FFN width multiple"):
        build_recipe(**_form(tmp_path, round_neurons=choice))
