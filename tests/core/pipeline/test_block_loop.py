"""The block loop's contract: the plan it is given stays as it was made, the plan it returns is the
pruned model's, and prune's options are checked."""

import copy
from typing import get_args

import pytest
import torch

from core import prune
from core.pipeline import sequential
from core.pipeline.context import RunOptions
from core.pipeline.fitting import RECONSTRUCTIONS
from core.spec.recipe import ReconstructionConfig
from tests.conftest import recipe_for

OBS = {"method": "ls", "select": "obs", "damp": 1e-3}


def _units(plan):
    return [(list(lp.heads), list(lp.kv_heads), [int(n) for n in lp.neurons], lp.removed) for lp in plan.layers]


def _run_recording_the_plan(monkeypatch, recipe):
    """Prune, keeping a copy of the plan as the allocation made it (before the loop ran)."""
    made = []

    def recording(*args, **kw):
        plan = make_plan(*args, **kw)
        made.append((plan, copy.deepcopy(plan)))
        return plan

    make_plan = sequential.make_plan
    monkeypatch.setattr(sequential, "make_plan", recording)
    result = prune(recipe)
    ((plan, snapshot),) = made
    return result, plan, snapshot


@pytest.mark.parametrize(
    "kw",
    [
        {"reconstruction": OBS},  # the OBS selection moves heads and neurons
        {"reconstruction": OBS, "round_to": {"kv_groups": "whole"}},  # ... as whole key/value groups
        {"reconstruction": OBS, "head_ratio": "obs", "round_to": {"neurons": 1}},  # each layer its own split
        {"reconstruction": {**OBS, "target": "dense"}, "head_ratio": "obs", "round_to": {"neurons": 1}},
        {},  # the criterion's units: realised as planned
    ],
)
def test_the_planned_plan_is_left_as_made_and_the_realised_one_is_the_models(llama_dir, corpus, monkeypatch, kw):
    result, planned, snapshot = _run_recording_the_plan(monkeypatch, recipe_for(llama_dir, corpus, ratio=0.4, **kw))
    assert result.planned is planned
    assert _units(planned) == _units(snapshot) and planned.removed == snapshot.removed
    assert all(a is not b for a, b in zip(planned.layers, result.plan.layers))  # no layer plan is shared
    adapter, fam = result.adapter, result.adapter.family
    for layer, lp, row in zip(adapter.layers(result.model), result.plan.layers, result.model.config.liar_layout):
        assert layer.get_submodule(fam.q).out_features == len(lp.heads) * adapter.head_dim
        assert layer.get_submodule(fam.k).out_features == len(lp.kv_heads) * adapter.head_dim
        assert layer.get_submodule(fam.o).in_features == len(lp.heads) * adapter.head_dim
        assert layer.get_submodule(fam.ffn_out).in_features == len(lp.neurons)
        assert (row["heads"], row["kv_heads"], row["neurons"]) == (lp.heads, lp.kv_heads, len(lp.neurons))
    assert result.plan.removed == sum(lp.removed for lp in result.plan.layers)
    reported = {(r.layer, r.module): r.kept for r in result.report}
    for li, lp in enumerate(result.plan.layers):  # the reports count the units really kept
        assert reported.get((li, "attention"), len(lp.heads)) == len(lp.heads)
        assert reported.get((li, "ffn"), len(lp.neurons)) == len(lp.neurons)
    moved = _units(result.plan) != _units(planned)
    assert moved == bool(kw), "the selection moved no unit" if kw else "the criterion's units moved"


def test_a_split_of_its_own_changes_the_layers_widths_not_the_plan(llama_dir, corpus, monkeypatch):
    """head_ratio obs: the layers keep other head counts than the plan's starting split (half the ratio
    in heads), and the plan still says what the allocation made."""
    recipe = recipe_for(llama_dir, corpus, ratio=0.4, head_ratio="obs", reconstruction=OBS, round_to={"neurons": 1})
    result, planned, _ = _run_recording_the_plan(monkeypatch, recipe)
    widths = lambda plan: [(len(lp.heads), len(lp.neurons)) for lp in plan.layers]  # noqa: E731
    assert widths(result.plan) != widths(planned)
    assert result.summary()["kept_heads_mean"] == pytest.approx(
        sum(len(lp.heads) for lp in result.plan.layers) / len(result.plan.layers)
    )


def test_prune_refuses_an_unknown_or_mistyped_option(llama_dir, corpus):
    recipe = recipe_for(llama_dir, corpus)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) calibraton; it takes model"):
        prune(recipe, calibraton=None)
    with pytest.raises(TypeError, match="show_progress must be True or False"):
        prune(recipe, show_progress="yes")
    with pytest.raises(TypeError, match="calibration must be a"):
        RunOptions(calibration=[torch.zeros(1)])


def test_every_reconstruction_target_has_an_algorithm():
    target = ReconstructionConfig.model_fields["target"].annotation
    assert set(RECONSTRUCTIONS) == set(get_args(target))
