"""The recipe validates every field with a specific message and round-trips through YAML."""

import pytest
from pydantic import ValidationError

from core import prune
from core.models.liar_families import pools_first_token
from core.spec.recipe import Recipe
from tests.conftest import recipe_for


def test_yaml_round_trip(llama_dir, corpus):
    recipe = Recipe.model_validate(recipe_for(llama_dir, corpus, criterion={"name": "random", "options": {"seed": 3}}))
    assert Recipe.from_yaml(recipe.to_yaml()) == recipe


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ratio": 0.0}, "ratio must lie strictly between 0 and 1"),
        ({"ratio": 1.0}, "ratio must lie strictly between 0 and 1"),
        ({"ratio": -0.2}, "ratio must lie strictly between 0 and 1"),
        ({"reconstruction": {"method": "magic"}}, "unknown reconstruction method 'magic'"),
        ({"criterion": {"name": "vibes"}}, "unknown criterion 'vibes'"),
        ({"model": "/no/such/model/dir"}, "model path '/no/such/model/dir' does not exist"),
        ({"modules": "layers"}, "Input should be 'heads', 'neurons', 'both' or 'blocks'"),
        ({"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"reconstruction": {"method": "liar", "damp": -1}}, "greater than or equal to 0"),
        ({"calibration": {"dataset": "/no/file.txt"}}, "neither a named set"),
    ],
)
def test_bad_fields_give_specific_errors(change, message, llama_dir, corpus):
    data = recipe_for(llama_dir, corpus)
    if "calibration" in change:
        data["calibration"] = {k: v for k, v in data["calibration"].items() if k != "texts"}
        data["calibration"].update(change["calibration"])
    else:
        data.update(change)
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(data)


def test_empty_calibration_file_is_rejected(llama_dir, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n ")
    with pytest.raises(ValidationError, match="is empty"):
        Recipe.model_validate({"model": str(llama_dir), "ratio": 0.2, "calibration": {"dataset": str(empty)}})


def test_needs_exactly_one_calibration_source(llama_dir):
    with pytest.raises(ValidationError, match="exactly one of"):
        Recipe.model_validate({"model": str(llama_dir), "ratio": 0.2, "calibration": {}})


def test_seq_len_beyond_model_limit(llama_dir, corpus):
    with pytest.raises(ValueError, match="exceeds the model's limit of 256 positions"):
        prune(recipe_for(llama_dir, corpus, calibration={"max_seq_length": 300}))


def test_too_little_calibration_text(llama_dir):
    with pytest.raises(ValueError, match="fewer than the .* needed"):
        prune(recipe_for(llama_dir, ["a few words only"]))


def test_unreachable_ratio_for_heads_only(llama_dir, corpus):
    with pytest.raises(ValueError, match="cannot be reached by pruning heads"):
        prune(recipe_for(llama_dir, corpus, modules="heads", ratio=0.9))


def test_unknown_criterion_option(llama_dir, corpus):
    with pytest.raises(ValueError, match="criterion 'magnitude' has no option"):
        prune(recipe_for(llama_dir, corpus, criterion={"name": "magnitude", "options": {"p": 1}}))


def test_named_dataset_offline_says_what_to_do(llama_dir, monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="pass a local .txt or .jsonl file instead"):
        prune({"model": str(llama_dir), "ratio": 0.2, "calibration": {"dataset": "wikitext2"}})


def test_calibration_from_jsonl_and_txt(llama_dir, corpus, tmp_path):
    import json

    jsonl = tmp_path / "cal.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": t}) for t in corpus))
    txt = tmp_path / "cal.txt"
    txt.write_text("\n\n".join(corpus))
    for cal in ({"dataset": str(jsonl), "text_field": "body"}, {"dataset": str(txt)}):
        result = prune(recipe_for(llama_dir, None, calibration={"texts": None, **cal}))
        assert result.achieved_ratio > 0.25
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        prune(recipe_for(llama_dir, None, calibration={"texts": None, "dataset": str(bad)}))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"text": "x"}))
    with pytest.raises(ValueError, match="has no field 'body'"):
        prune(recipe_for(llama_dir, None, calibration={"texts": None, "dataset": str(other), "text_field": "body"}))


@pytest.mark.parametrize(
    ("calibration", "message"),
    [
        ({"num_calibration_samples": 1_000_000_000}, "less than or equal to 100000"),
        ({"max_seq_length": 10**7}, "less than or equal to 131072"),
        ({"batch_size": 10**6}, "less than or equal to 4096"),
        ({"num_calibration_samples": 50_000, "max_seq_length": 4096}, "exceeds the limit of 16,777,216"),
    ],
)
def test_size_like_fields_are_bounded(calibration, message, llama_dir, corpus):
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(recipe_for(llama_dir, corpus, calibration=calibration))


def test_unbounded_recipe_never_becomes_a_job(tmp_path, llama_dir, corpus):
    from jobs.service import JobService, SubmitError
    from jobs.settings import Settings

    data = tmp_path / "data"
    service = JobService(Settings(data_dir=data, database_url=f"sqlite:///{data / 'l.db'}", broker_url="filesystem://"))
    service.settings.ensure_dirs()
    with pytest.raises(SubmitError, match="less than or equal to 100000"):
        service.submit(recipe_for(llama_dir, corpus, calibration={"num_calibration_samples": 10**9}))
    with pytest.raises(SubmitError, match="less than or equal to 100000"):
        service.submit(recipe_for(llama_dir, corpus), evaluations=[{"type": "perplexity", "max_windows": 10**9}])
    assert service.list() == []


def test_file_errors_name_the_record_but_never_quote_its_contents(tmp_path):
    """A calibration file's errors say which record and field is wrong, never the values or other
    field names it holds (through the web app those could be any file the server can read)."""
    from core.data.calibration import load_labels
    from core.data.texts import read_records
    from core.spec.recipe import CalibrationConfig

    path = tmp_path / "secret.jsonl"
    path.write_text('{"text": "fine", "label": 1}\n{"text": "also fine", "label": "TOP-SECRET-VALUE", "ssn": 1}\n')
    cfg = CalibrationConfig(dataset=str(path), label_field="label")
    with pytest.raises(ValueError, match="record 2: the label is not a number") as exc:
        load_labels(cfg)
    assert "TOP-SECRET" not in str(exc.value)
    with pytest.raises(ValueError, match="record 1 has no field 'body'") as exc:
        read_records(path, "body")
    assert "ssn" not in str(exc.value) and "fine" not in str(exc.value)


def test_select_auto_resolves_by_method():
    from core.spec.recipe import ReconstructionConfig

    default = ReconstructionConfig()
    assert default.method == "ls" and default.select == "auto"
    assert default.resolved_select() == "obs"
    assert ReconstructionConfig(method="liar").resolved_select() == "obs"
    assert ReconstructionConfig(method="none").resolved_select() == "criterion"  # no refit follows
    assert ReconstructionConfig(method="liar", select="criterion").resolved_select() == "criterion"


DEFAULT_SELECTION = {"method": "ls", "select": "auto"}  # the default reconstruction (recipe_for sets the paper's)


@pytest.mark.parametrize(
    ("kind", "change", "expected"),
    [
        ("decoder", {}, ("obs", "global")),  # the default recipe at 20% on a decoder
        ("decoder", {"ratio": 0.3}, ("obs", "global")),
        ("decoder", {"ratio": 0.31}, ("obs", "global")),  # capped from here on
        ("decoder", {"ratio": 0.5}, ("obs", "global")),
        ("decoder", {"ratio": 0.51}, ("magnitude", "uniform")),
        ("encoder", {}, ("magnitude", "uniform")),
        ("decoder", {"reconstruction": {"method": "liar", "select": "criterion"}}, ("flap", "uniform")),  # --paper
        # no refit: the criterion's scores pick a decoder's units, and magnitude's wreck it (criteria.md)
        ("decoder", {"reconstruction": {"method": "none"}}, ("flap", "uniform")),
        ("decoder", {"reconstruction": {"method": "mask_tuning"}, "allocation": "uniform"}, ("flap", "uniform")),
        ("decoder", {"reconstruction": {"method": "bias"}, "ratio": 0.6}, ("flap", "uniform")),
        ("encoder", {"reconstruction": {"method": "none"}}, ("magnitude", "uniform")),
        ("decoder", {"head_ratio": "obs"}, ("magnitude", "uniform")),
        ("decoder", {"modules": "neurons"}, ("magnitude", "uniform")),
        ("decoder", {"allocation": "uniform"}, ("magnitude", "uniform")),
        ("encoder", {"allocation": "global", "ratio": 0.5}, ("obs", "global")),
        ("decoder", {"criterion": {"name": "flap"}}, ("flap", "uniform")),
        ("decoder", {"criterion": {"name": "flap", "options": {"structure": "AL-AM"}}}, ("flap", "global")),
        ("encoder", {"criterion": {"name": "obs"}, "ratio": 0.5}, ("obs", "global")),
        ("decoder", {"criterion": {"name": "magnitude"}, "allocation": "global"}, ("magnitude", "global")),
    ],
)
def test_auto_criterion_and_allocation_resolve_by_model_kind_and_ratio(kind, change, expected, llama_dir, corpus):
    data = recipe_for(llama_dir, corpus, ratio=0.2, criterion={"name": "auto"}, reconstruction=DEFAULT_SELECTION)
    data |= change
    recipe = Recipe.model_validate(data)
    resolved = recipe.resolved(kind)
    assert (resolved.criterion.name, resolved.allocation) == expected
    assert Recipe.model_validate(resolved.model_dump()) == resolved  # a valid recipe, the one recorded
    unchanged = {k: v for k, v in resolved.model_dump().items() if k not in ("criterion", "allocation")}
    assert unchanged == {k: v for k, v in recipe.model_dump().items() if k not in ("criterion", "allocation")}


def test_sequence_classifiers_are_told_from_their_model_classes():
    assert pools_first_token(["BertForSequenceClassification"])
    assert pools_first_token(["RobertaForSequenceClassification"])
    assert not pools_first_token(["BertForQuestionAnswering"])
    assert not pools_first_token(["BertModel"])
    assert not pools_first_token(None)


@pytest.mark.parametrize(("ratio", "cap"), [(0.2, None), (0.3, None), (0.31, 0.372), (0.4, 0.48), (0.5, 0.6)])
def test_auto_obs_caps_every_layer_above_30_percent(ratio, cap, llama_dir, corpus):
    """Above 30% no layer may lose more than 1.2 × the ratio of its heads or neurons (uncapped obs
    counts collapse at 40% and 50% on SmolLM2); a cap the user gives to obs is kept as given."""
    data = recipe_for(llama_dir, corpus, ratio=ratio, criterion={"name": "auto"}, reconstruction=DEFAULT_SELECTION)
    resolved = Recipe.model_validate(data).resolved("decoder")
    assert resolved.criterion.name == "obs"
    assert resolved.criterion.options.get("max_layer_ratio") == (None if cap is None else pytest.approx(cap))
    assert resolved.criterion.options.get("over_cap") == (None if cap is None else "last")
    named = data | {"criterion": {"name": "obs", "options": {"max_layer_ratio": 0.9}}}
    assert Recipe.model_validate(named).resolved("decoder").criterion.options == {"max_layer_ratio": 0.9}


def test_auto_criterion_takes_no_options_and_obs_still_needs_global(llama_dir, corpus):
    with pytest.raises(ValidationError, match="criterion auto takes no options"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, criterion={"name": "auto", "options": {"step": 1}}))
    with pytest.raises(ValidationError, match="set allocation: global"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, criterion={"name": "obs"}, allocation="uniform"))
    default = {k: v for k, v in recipe_for(llama_dir, corpus).items() if k != "criterion"}
    assert (Recipe.model_validate(default).criterion.name, Recipe.model_validate(default).allocation) == (
        "auto",
        "auto",
    )


@pytest.mark.parametrize(
    ("ratio", "expected"), [(0.2, ("obs", "global")), (0.5, ("obs", "global")), (0.6, ("magnitude", "uniform"))]
)
def test_the_default_recipe_runs_and_records_what_it_resolved_to(ratio, expected, llama_dir, corpus, tmp_path):
    """``liar prune --model M --ratio R``: in memory and streamed, the result and the recipe.yaml of its
    checkpoint carry the criterion and allocation that ran, and both runs write the same weights."""
    from tests.core.models.test_streaming import _assert_same_checkpoint, _both

    memory, memory_dir, streamed, stream_dir = _both(
        llama_dir, corpus, tmp_path, ratio=ratio, reconstruction=DEFAULT_SELECTION, criterion={"name": "auto"}
    )
    for result, out in ((memory, memory_dir), (streamed, stream_dir)):
        assert (result.recipe.criterion.name, result.recipe.allocation) == expected
        assert result.achieved_ratio == pytest.approx(ratio, abs=0.03)
        saved = Recipe.from_yaml((out / "recipe.yaml").read_text())
        assert (saved.criterion.name, saved.allocation) == expected
        assert saved.criterion.options == result.recipe.criterion.options  # the cap above 30%, if any
    _assert_same_checkpoint(memory_dir, stream_dir)


# --- export: the serving forms written into the checkpoint ---------------------------------------


def test_export_names_serving_forms_and_round_trips(llama_dir, corpus):
    from core.serving import FORMATS
    from core.spec.recipe import EXPORT_FORMATS

    assert FORMATS == EXPORT_FORMATS  # one list of names, kept in core.spec (torch-free)
    assert Recipe.model_validate(recipe_for(llama_dir, corpus)).export == []  # none unless asked
    recipe = Recipe.model_validate(recipe_for(llama_dir, corpus, export=["gguf-q4_k_m", "gguf-f16"]))
    assert recipe.export == ["gguf-q4_k_m", "gguf-f16"]  # in the order given
    assert "export:\n- gguf-q4_k_m\n- gguf-f16\n" in recipe.to_yaml()
    assert Recipe.from_yaml(recipe.to_yaml()) == recipe
    # a form named twice is written once; a single name reads as a list of one
    assert Recipe.model_validate(recipe_for(llama_dir, corpus, export=["gguf-f16", "gguf-f16"])).export == ["gguf-f16"]
    one = recipe.to_yaml().replace("export:\n- gguf-q4_k_m\n- gguf-f16\n", "export: gguf-q8_0\n")
    assert Recipe.from_yaml(one).export == ["gguf-q8_0"]


FORMS = "gguf-f16, gguf-q8_0, gguf-q5_k_m, gguf-q4_k_m, gguf-q3_k_m, gguf-iq3_xxs, gguf-iq2_m, vllm"


@pytest.mark.parametrize(
    ("export", "message"),
    [
        (["gguf"], f"export: 'gguf' is not a serving form; choose from {FORMS}"),
        (
            ["gguf-f16", "vllm-fp8", "q4"],
            f"export: 'vllm-fp8', 'q4' are not serving forms; choose from {FORMS}",
        ),
        (3, "export: Input should be a valid list"),
    ],
)
def test_an_unknown_export_form_is_one_sentence_naming_the_forms(export, message, llama_dir, corpus):
    from core.spec.errors import validation_message

    with pytest.raises(ValidationError) as caught:
        Recipe.model_validate(recipe_for(llama_dir, corpus, export=export))
    assert validation_message(caught.value) == message
