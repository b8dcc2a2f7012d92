"""The speed target: the latency table's arithmetic, the skeletons it times, the candidates it
prunes, the corrections of one that falls short when timed, and a run that keeps the candidate with the
least held-aside loss among those whose measured speed-up reaches the target."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from core import prune
from core.depth.select import held_loss
from core.evaluation.latency import LatencyTable, skeleton
from core.models.adapter import adapter_for, block_parameters
from core.models.tiny import tiny_decoder
from core.pipeline import target as target_mod
from core.spec.recipe import Recipe
from tests.conftest import recipe_for


def _table(layers=10, fixed=(1.0, 1.0, 1.0), per_block=(1.0, 0.8, 0.5)):
    return LatencyTable("decode_b1", layers, [0.0, 0.3, 0.6], list(fixed), list(per_block), "cpu")


def test_table_predicts_by_blocks_and_interpolated_width():
    t = _table()
    assert t.seconds(0, 0.0) == pytest.approx(11.0)
    assert t.seconds(4, 0.0) == pytest.approx(7.0)
    assert t.seconds(0, 0.45) == pytest.approx(1.0 + 10 * 0.65)  # halfway between 0.8 and 0.5
    assert t.speedup(4, 0.6) == pytest.approx(11.0 / (1.0 + 6 * 0.5))
    with pytest.raises(ValueError, match="outside the table"):
        t.seconds(0, 0.7)


@pytest.mark.parametrize("speedup, removed", [(1.2, 0), (1.5, 2), (2.0, 4)])
def test_width_for_is_the_least_width_that_reaches(speedup, removed):
    t = _table()
    w = t.width_for(speedup, removed)
    assert t.speedup(removed, w) >= speedup
    assert w == 0.0 or t.speedup(removed, max(w - 2e-3, 0.0)) < speedup


def test_width_for_is_none_beyond_the_widest():
    assert _table().width_for(3.0, 0) is None


def test_unreachable_target_is_refused_with_the_best_reachable(tmp_path, corpus):
    recipe = Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 5.0}))
    best = max(_table().speedup(d, 0.6) for d in range(6))
    with pytest.raises(ValueError, match=f"best is {best:.2f}× \\(5 of 10 blocks removed and 60% of each other"):
        target_mod.candidates(_table(), recipe)


def test_candidates_run_from_width_only_to_depth_only(tmp_path, corpus):
    table = _table()
    recipe = Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4, "candidates": 12}))
    pairs = target_mod.candidates(table, recipe)
    assert pairs[0][0] == 0 and pairs[-1][1] == 0.0  # width only first, depth only last
    assert all(table.speedup(d, w) >= 1.4 - 1e-9 for d, w in pairs)
    assert [d for d, _ in pairs] == list(range(len(pairs)))
    few = target_mod.candidates(
        table, recipe.model_copy(update={"target": recipe.target.model_copy(update={"candidates": 2})})
    )
    assert few == [pairs[0], pairs[-1]]
    blocks_only = recipe.model_copy(update={"modules": "blocks"})
    assert target_mod.candidates(table, blocks_only) == [pairs[-1]]
    no_depth = recipe.model_copy(update={"target": recipe.target.model_copy(update={"depth": False})})
    assert target_mod.candidates(table, no_depth) == [pairs[0]]


def test_concrete_recipes_count_depth_in_the_ratio(tmp_path, corpus):
    recipe = Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4}))
    mixed = target_mod.concrete(recipe, 2, 0.25, 10)
    assert (mixed.ratio, mixed.depth.blocks, mixed.modules, mixed.target) == (0.4, 2, "both", None)
    depth_only = target_mod.concrete(recipe, 3, 0.0, 10)
    assert (depth_only.ratio, depth_only.modules, depth_only.depth_blocks(10)) == (0.3, "blocks", 3)


@pytest.mark.parametrize("width", [0.0, 0.3, 0.6])
def test_skeleton_blocks_lose_about_the_width(tmp_path, width):
    path = tiny_decoder(tmp_path / "m", num_hidden_layers=4, intermediate_size=96)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    sk = skeleton(model, 2, width)
    assert sk.config.num_hidden_layers == 2 and len(adapter_for(sk).layers(sk)) == 2
    dense_block = block_parameters(model, adapter_for(model)) / 4
    kept = block_parameters(sk, adapter_for(sk)) / 2
    assert 1 - kept / dense_block == pytest.approx(width, abs=0.04)
    sk(torch.randint(4, 60, (1, 8)))  # it runs


def test_target_run_keeps_the_candidate_with_the_least_held_aside_loss(tmp_path, corpus, monkeypatch):
    path = tiny_decoder(tmp_path / "m", num_hidden_layers=6, intermediate_size=96)
    table = LatencyTable("decode_b1", 6, [0.0, 0.3, 0.6], [1.0] * 3, [1.0, 0.8, 0.5], "cpu")
    monkeypatch.setattr(target_mod, "measure_table", lambda model, workload: table)
    monkeypatch.setattr(
        target_mod, "interleaved_seconds", lambda models, workload, rounds: {"dense": [2.0], "pruned": [1.0]}
    )
    r = recipe_for(path, corpus, ratio=None, target={"speedup": 1.4, "candidates": 3}, criterion={"name": "magnitude"})
    r["reconstruction"] = {"method": "ls", "damp": 0.001}
    result = prune(r)
    rows = result.metrics["target_candidates"]
    assert len(rows) == 3 and rows[0]["blocks"] == 0 and rows[-1]["width"] == 0.0
    kept = min(rows, key=lambda x: x["loss"])
    assert result.metrics["heldout_loss"] == pytest.approx(kept["loss"])
    assert result.model.config.num_hidden_layers == 6 - kept["blocks"]
    assert result.recipe.target is None and result.recipe.ratio == kept["ratio"]
    assert result.metrics["realised_speedup"] == 2.0
    assert (result.metrics["realised_speedup_low"], result.metrics["realised_speedup_high"]) == (2.0, 2.0)
    assert result.metrics["predicted_speedup"] == pytest.approx(table.speedup(kept["blocks"], kept["width"]), rel=1e-3)
    held = result.metrics["heldout_loss"]
    from core.data.calibration import calibration_batches
    from core.pipeline.scoring import split_batches

    _, hold = calibration_batches(result.recipe.calibration, result.tokenizer, "decoder")
    assert held_loss(result.model, adapter_for(result.model), split_batches(hold, 5)) == pytest.approx(held, rel=1e-5)
    out = result.save(tmp_path / "out")
    assert Recipe.load(out / "recipe.yaml").ratio == kept["ratio"]


def _measured_run(tmp_path, corpus, monkeypatch, prunes, candidates=2):
    """A target run (1.4× on a 6-block model) whose prunes realise and lose what ``prunes`` says, in
    order: ``[(realised, loss), ...]``. Returns the result and the ``(blocks, width, ratio)`` of every
    concrete recipe pruned."""
    path = tiny_decoder(tmp_path / "m", num_hidden_layers=6, intermediate_size=96)
    table = LatencyTable("decode_b1", 6, [0.0, 0.3, 0.6], [1.0] * 3, [1.0, 0.8, 0.5], "cpu")
    monkeypatch.setattr(target_mod, "measure_table", lambda model, workload: table)
    speeds, losses = iter([s for s, _ in prunes]), iter([x for _, x in prunes])
    monkeypatch.setattr(
        target_mod, "interleaved_seconds", lambda models, workload, rounds: {"dense": [next(speeds)], "pruned": [1.0]}
    )
    monkeypatch.setattr(target_mod, "held_loss", lambda model, adapter, batches: next(losses))
    concrete, pruned = target_mod.concrete, []

    def recording(recipe, blocks, width, layers):
        cand = concrete(recipe, blocks, width, layers)
        pruned.append((blocks, width, cand.ratio))
        return cand

    monkeypatch.setattr(target_mod, "concrete", recording)
    target = {"speedup": 1.4, "candidates": candidates}
    r = recipe_for(path, corpus, ratio=None, target=target, criterion={"name": "magnitude"})
    return prune(r), pruned, table


def test_a_candidate_that_realises_less_than_predicted_is_corrected_then_interpolated(tmp_path, corpus, monkeypatch):
    prunes = [(1.2, 1.0), (1.3, 1.1), (1.36, 1.2)]
    result, pruned, table = _measured_run(tmp_path, corpus, monkeypatch, prunes, candidates=1)
    (d, w, _), (d2, w2, ratio2), (d3, w3, ratio3) = pruned  # width only, its correction, its interpolation
    predicted = table.speedup(d, w)
    aim = 1.4 * predicted / 1.2  # the table aimed past its own error on this structure
    assert d3 == d2 == d == 0 and w2 == pytest.approx(table.width_for(aim, 0)) and w2 > w
    assert ratio2 == round(w2, 6)  # width only: the ratio is the width
    first, second, third = result.metrics["target_candidates"]
    assert (first["corrected"], first["realised"], first["predicted"]) == (False, 1.2, predicted)
    assert (second["corrected"], second["aim"], second["realised"]) == (True, round(aim, 4), 1.3)
    assert second["predicted"] == pytest.approx(aim, rel=1e-3)
    # still short (1.3 < 1.4 × 0.95): the line through the two reaches 1.4 past the table's widest, 0.6
    assert w2 + (1.4 - 1.3) * (w2 - w) / 0.1 > 0.6 and w3 == 0.6 and ratio3 == 0.6
    assert (third["corrected"], third["interpolated"], third["aim"]) == (True, True, 1.4)
    assert result.metrics["target_reached"] is True and result.metrics["realised_speedup"] == 1.36
    assert result.recipe.ratio == ratio3 and third["kept"] and not first["kept"] and not second["kept"]


def test_the_interpolation_meets_the_target_between_or_beyond_the_two_prunes(tmp_path, corpus):
    table = _table()  # 10 blocks; at most 60% of each block's parameters
    recipe = Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4}))
    first = {"blocks": 0, "width": 0.2, "realised": 1.2}
    between = target_mod.interpolation(table, recipe, first, {"blocks": 0, "width": 0.5, "realised": 1.8})
    assert between == pytest.approx(0.2 + 0.2 * 0.3 / 0.6)  # an overshoot: back to where the line meets 1.4
    beyond = target_mod.interpolation(table, recipe, first, {"blocks": 0, "width": 0.3, "realised": 1.3})
    assert beyond == pytest.approx(0.4)  # still short: on along the line
    assert target_mod.interpolation(table, recipe, first, {"width": 0.3, "realised": 1.44}) is None  # within 5%
    assert target_mod.interpolation(table, recipe, first, {"width": 0.3, "realised": 1.1}) is None  # no rise
    assert target_mod.interpolation(table, recipe, first, {"width": 0.6, "realised": 1.3}) is None  # at the widest


def test_a_speed_target_holds_more_windows_aside_unless_told(tmp_path, corpus):
    from core.spec.recipe import TARGET_HOLDOUT

    untold = recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4})
    untold["calibration"].pop("holdout_samples")
    target = Recipe.model_validate(untold)
    assert target.calibration.holdout_samples == TARGET_HOLDOUT > 8
    told = recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4})  # says 4
    assert Recipe.model_validate(told).calibration.holdout_samples == told["calibration"]["holdout_samples"] == 4
    ratio = recipe_for(tmp_path, corpus, ratio=0.3)
    ratio["calibration"].pop("holdout_samples")
    assert Recipe.model_validate(ratio).calibration.holdout_samples == 8
    concrete = target_mod.concrete(target, 1, 0.3, 6)  # the candidates keep the target's windows
    assert concrete.target is None and concrete.calibration.holdout_samples == TARGET_HOLDOUT


def test_the_kept_candidate_is_chosen_on_measured_speed(tmp_path, corpus, monkeypatch):
    # width only: least losses but it, its correction and its interpolation fall short of 1.4 × 0.95;
    # depth only: 1.34 ≥ 1.33 is not corrected, and kept
    prunes = [(1.2, 1.0), (1.25, 0.9), (1.3, 0.8), (1.34, 2.0)]
    result, pruned, _ = _measured_run(tmp_path, corpus, monkeypatch, prunes)
    assert len(pruned) == 4
    rows = result.metrics["target_candidates"]
    assert [(x["corrected"], x["kept"]) for x in rows] == [(False, False), (True, False), (True, False), (False, True)]
    assert rows[2]["interpolated"] and "interpolated" not in rows[1]
    assert result.metrics["target_reached"] is True and result.metrics["target_tolerance"] == target_mod.TOLERANCE
    assert result.metrics["heldout_loss"] == 2.0 and result.metrics["realised_speedup"] == 1.34
    assert result.model.config.num_hidden_layers == 6 - rows[-1]["blocks"] and rows[-1]["width"] == 0.0


def test_no_candidate_reaching_the_target_keeps_the_fastest_and_says_so(tmp_path, corpus, monkeypatch, caplog):
    # both candidates short, corrected twice and still short
    prunes = [(1.2, 1.0), (1.25, 0.9), (1.28, 0.8), (1.21, 2.0), (1.26, 2.5), (1.31, 2.7)]
    with caplog.at_level(logging.WARNING, logger=target_mod.__name__):
        result, pruned, table = _measured_run(tmp_path, corpus, monkeypatch, prunes)
    rows = result.metrics["target_candidates"]
    assert [x["corrected"] for x in rows] == [False, True, True, False, True, True] and len(pruned) == 6
    depth_only, fixed = pruned[3], pruned[4]  # the depth-only candidate is corrected with width
    assert depth_only[1] == 0.0 and fixed[0] == depth_only[0]
    assert fixed[1] == pytest.approx(table.width_for(1.4 * table.speedup(depth_only[0], 0.0) / 1.21, fixed[0]))
    assert result.metrics["target_reached"] is False and rows[5]["kept"]
    assert (result.metrics["realised_speedup"], result.metrics["heldout_loss"]) == (1.31, 2.7)
    (record,) = [r for r in caplog.records if r.name == target_mod.__name__]
    assert record.levelno == logging.WARNING and "not reached" in record.getMessage()
    assert "realised 1.31×" in record.getMessage()


def test_a_correction_takes_the_widest_width_or_none(tmp_path, corpus):
    table = _table()  # 10 blocks; at most 60% of each block's parameters
    recipe = Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 1.4}))
    row = {"blocks": 0, "width": 0.3, "predicted": 1.5, "realised": 1.0}
    assert target_mod.correction(table, recipe, row) == (pytest.approx(2.1), 0.6)  # beyond the table: its widest
    assert target_mod.correction(table, recipe, row | {"width": 0.6}) is None  # nothing wider left
    assert target_mod.correction(table, recipe.model_copy(update={"modules": "blocks"}), row) is None


def test_ratio_and_target_are_exclusive(tmp_path, corpus):
    with pytest.raises(ValueError, match="not both"):
        Recipe.model_validate(recipe_for(tmp_path, corpus, target={"speedup": 1.5}))
    with pytest.raises(ValueError, match="neither was given"):
        Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None))
    with pytest.raises(ValueError, match="greater than 1"):
        Recipe.model_validate(recipe_for(tmp_path, corpus, ratio=None, target={"speedup": 0.9}))


def test_a_target_beyond_any_device_is_refused_at_submit(tmp_path, corpus):
    from core.pipeline.preflight import check_model_fit

    path = tiny_decoder(tmp_path / "m", num_hidden_layers=6)
    config = AutoModelForCausalLM.from_pretrained(path).config
    too_fast = Recipe.model_validate(recipe_for(path, corpus, ratio=None, target={"speedup": 6.0}))
    with pytest.raises(ValueError, match=r"at most 5\.71×"):  # 6 / (3 × 0.35)
        check_model_fit(too_fast, config)
    check_model_fit(too_fast.model_copy(update={"target": too_fast.target.model_copy(update={"speedup": 5.0})}), config)
    depth_only = too_fast.model_copy(
        update={"modules": "blocks", "target": too_fast.target.model_copy(update={"speedup": 2.5})}
    )
    with pytest.raises(ValueError, match=r"at most 2\.00×"):
        check_model_fit(depth_only, config)


def test_a_speed_target_for_an_encoder_is_refused_at_submit(bert_dir, corpus):
    from transformers import AutoConfig

    from core.pipeline.preflight import check_model_fit

    recipe = Recipe.model_validate(recipe_for(bert_dir, corpus, ratio=None, target={"speedup": 1.5}))
    with pytest.raises(ValueError, match="a speed target times decoding; bert is an encoder"):
        check_model_fit(recipe, AutoConfig.from_pretrained(bert_dir))


def test_the_realised_speed_up_carries_the_spread_of_its_rounds():
    metrics = target_mod.realised([2.0, 2.4, 1.8], [1.0, 1.0, 1.5])  # per-round ratios 2.0, 2.4, 1.2
    assert metrics == {
        "realised_speedup": round(2.0 / 1.0, 4),  # median dense / median pruned
        "realised_speedup_low": 1.2,
        "realised_speedup_high": 2.4,
        "realised_speedup_repeats": 3,
    }
