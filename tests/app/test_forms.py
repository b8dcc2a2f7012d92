"""The web app's logic without a server or Gradio: the recipe a form makes (``app.web.forms``), model
descriptions, the messages the status line shows, the jobs table and the model page (``app.web.views``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from app.web import forms, preview, recipe_box, views
from app.web.forms import build_recipe, describe_model, evaluations_for
from app.web.views import job_rows
from core.models.liar_families import supported_families_text
from core.spec.recipe import Recipe
from jobs.service import SubmitError

ROOT = Path(__file__).resolve().parents[2]


def _fields(tmp_path, **over) -> dict:
    text = tmp_path / "calib.txt"
    text.write_text("some calibration text\n")
    values = dict(
        model="some/model",
        modules="both",
        ratio="0.3",
        allocation="uniform",
        round_neurons=1,
        kv_groups="free",
        criterion="magnitude",
        damp=0.001,
        calibration=str(text),
        upload=None,
        text_field="text",
        label_field="",
        samples=16,
        seq_len=32,
        seed=0,
        export=[],
    )
    values.update(over)
    return values


def _form(tmp_path, model, methods=("liar",), evaluate="(none)", tasks="", task_dir="", **over) -> list:
    """The values of the form's inputs in the order the New-run tab passes them (without the user)."""
    return [*_fields(tmp_path, model=str(model), **over).values(), evaluate, tasks, task_dir, list(methods)]


def _config(tmp_path, name: str, **cfg) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# --- recipe from the form ------------------------------------------------------------------------


def test_form_values_make_a_valid_recipe(tmp_path):
    recipe = Recipe.model_validate(build_recipe(**_fields(tmp_path, criterion="flap", modules="heads")))
    assert recipe.model == "some/model" and recipe.ratio == 0.3 and recipe.modules == "heads"
    assert recipe.criterion.name == "flap" and recipe.reconstruction.method == "ls"  # the default recipe's
    assert recipe.reconstruction.select == "auto"
    assert recipe.calibration.num_calibration_samples == 16 and recipe.calibration.max_seq_length == 32


@pytest.mark.parametrize("choice, expected", [(1, 1), (64, 64), ("64", 64), (None, "auto"), ("auto", "auto")])
def test_ffn_width_multiple_becomes_round_to(tmp_path, choice, expected):
    recipe = Recipe.model_validate(build_recipe(**_fields(tmp_path, round_neurons=choice)))
    assert recipe.round_to.neurons == expected
    assert recipe.round_to.heads == 1


@pytest.mark.parametrize("choice", [0, -8, "eight"])
def test_bad_ffn_width_multiple_is_refused(tmp_path, choice):
    with pytest.raises(SubmitError, match="FFN width multiple"):
        build_recipe(**_fields(tmp_path, round_neurons=choice))


@pytest.mark.parametrize("choice, expected", [("free", "free"), (None, "free"), ("whole", "whole"), ("auto", "auto")])
def test_key_value_groups_become_round_to(tmp_path, choice, expected):
    recipe = Recipe.model_validate(build_recipe(**_fields(tmp_path, kv_groups=choice)))
    assert recipe.round_to.kv_groups == expected and recipe.round_to.neurons == 1


def test_bad_key_value_groups_are_refused(tmp_path):
    with pytest.raises(SubmitError, match="key/value groups must be one of free, whole, auto, got 'some'"):
        build_recipe(**_fields(tmp_path, kv_groups="some"))


def test_form_fields_match_the_recipe_builder():
    import inspect

    assert tuple(inspect.signature(build_recipe).parameters) == forms.RECIPE_FIELDS


def test_upload_wins_over_the_picked_set_and_missing_fields_are_refused(tmp_path):
    upload = tmp_path / "up.jsonl"
    upload.write_text('{"text": "x"}\n')
    assert build_recipe(**_fields(tmp_path, upload=str(upload)))["calibration"]["dataset"] == str(upload)
    with pytest.raises(SubmitError, match="choose a model"):
        build_recipe(**_fields(tmp_path, model="  "))
    with pytest.raises(SubmitError, match="choose a calibration set"):
        build_recipe(**_fields(tmp_path, calibration=None))


def test_record_fields_of_a_jsonl_calibration(tmp_path):
    calibration = build_recipe(**_fields(tmp_path))["calibration"]
    assert "text_field" not in calibration and "label_field" not in calibration  # the defaults stay implicit
    calibration = build_recipe(**_fields(tmp_path, text_field=" sentence ", label_field=" label"))["calibration"]
    assert (calibration["text_field"], calibration["label_field"]) == ("sentence", "label")
    pair = build_recipe(**_fields(tmp_path, text_field="premise, hypothesis"))["calibration"]
    assert pair["text_field"] == ["premise", "hypothesis"] and "label_field" not in pair
    with pytest.raises(SubmitError, match="one text field, or two for a sentence pair, not 3"):
        build_recipe(**_fields(tmp_path, text_field="a, b, c"))
    with pytest.raises(SubmitError, match="the label field 'label' is also a text field"):
        build_recipe(**_fields(tmp_path, text_field="label", label_field="label"))


def test_a_labelled_encoder_form_makes_the_labelled_default(job_service, bert_dir, tmp_path):
    """The label field reaches the recipe the job runs: criterion auto resolves to Kwon et al.'s Fisher
    for a sequence classifier calibrated on labelled records; a text file cannot carry labels."""
    labelled = tmp_path / "reviews.jsonl"
    labelled.write_text("".join(json.dumps({"sentence": f"review {i}", "label": i % 2}) + "\n" for i in range(8)))
    form = _form(
        tmp_path,
        bert_dir,
        criterion="auto",
        allocation="auto",
        calibration=str(labelled),
        text_field="sentence",
        label_field="label",
    )
    message, text, _ = forms.validate_form(job_service, form)
    assert message == "✓ valid"
    recipe = Recipe.model_validate(yaml.safe_load(text))
    assert (recipe.calibration.text_field, recipe.calibration.label_field) == ("sentence", "label")
    assert recipe.resolved("encoder", True).criterion.name == "kwon"
    message, _, _ = forms.validate_form(job_service, _form(tmp_path, bert_dir, label_field="label"))
    assert message.startswith("**⚠") and "label_field needs a .jsonl or .json calibration file" in message


def test_task_evaluation_of_the_form():
    assert forms.task_evaluation("", "") == [] and forms.task_evaluation(None) == []
    assert forms.task_evaluation(" piqa, arc_easy ") == [{"type": "lm_eval", "tasks": "piqa, arc_easy"}]
    assert forms.task_evaluation("wiki_cloze", "/data/tasks") == [
        {"type": "lm_eval", "tasks": "wiki_cloze", "task_dir": "/data/tasks"}
    ]
    with pytest.raises(SubmitError, match="a task folder needs task names"):
        forms.task_evaluation(" ", "/data/tasks")


def test_lm_eval_tasks_from_the_form_reach_the_job(job_service, llama_dir, bert_dir, tmp_path):
    """Task names are checked at submission (a typo fails now, not after the pruning), the folder must
    lie where the server reads, and an encoder cannot take them."""
    from core.evaluation.lmeval import write_rt_sentiment_task

    tasks = job_service.settings.data_dir / "tasks"
    write_rt_sentiment_task(tasks, [{"text": "fine film", "label": 1}])
    message = forms.submit_form(
        job_service, _form(tmp_path, llama_dir, tasks="rt_sentiment, piqa", task_dir=tasks), "a"
    )
    assert message == "✓ submitted job 1"
    stored = job_service.show(1, internal=True)["evaluations"]  # users see the data folder's part: tasks
    assert [(e["type"], e["tasks"], e["task_dir"]) for e in stored] == [
        ("lm_eval", ["rt_sentiment", "piqa"], str(tasks))
    ]
    for form, expected in (
        (_form(tmp_path, llama_dir, tasks="rt_sentimnt", task_dir=tasks), "unknown task 'rt_sentimnt'"),
        (_form(tmp_path, llama_dir, tasks="piqa", task_dir="/etc"), "task_dir '/etc' is not one of this server's task"),
        # a folder the server may read data from is still no task folder: task YAMLs can run Python
        (_form(tmp_path, llama_dir, tasks="piqa", task_dir=tmp_path), "the administrator lists in LIAR_TASK_DIRS"),
        (_form(tmp_path, bert_dir, tasks="piqa"), "lm-eval tasks need a causal language model"),
    ):
        message = forms.submit_form(job_service, form, "a")
        assert message.startswith("**⚠") and expected in message, message
    text = yaml.safe_dump(build_recipe(**_fields(tmp_path, model=str(llama_dir))))
    assert recipe_box.submit(job_service, text, "(none)", "a", "piqa") == "✓ submitted job 2"
    assert job_service.show(2)["evaluations"][0]["tasks"] == ["piqa"]


def test_evaluations_for():
    assert evaluations_for(None, 128) == [] and evaluations_for("(none)", 128) == []
    ev = {"type": "perplexity", "dataset": "held.txt", "seq_len": 64, "max_windows": forms.EVAL_WINDOWS}
    assert evaluations_for("held.txt", "64") == [ev]


# --- model descriptions --------------------------------------------------------------------------


def test_describe_a_supported_decoder_and_encoder(tmp_path):
    llama = _config(
        tmp_path,
        "llama",
        model_type="llama",
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=96,
    )
    assert describe_model(str(llama)) == (
        "decoder",
        "decoder · `llama` · 2 layers · 8 heads / 4 key-value heads · FFN 96",
    )
    bert = _config(
        tmp_path, "bert", model_type="liar_bert", num_hidden_layers=3, num_attention_heads=4, intermediate_size=64
    )
    assert describe_model(str(bert)) == ("encoder", "encoder · `liar_bert` · 3 layers · 4 heads · FFN 64")
    text, perplexity_applies = forms.model_hint(str(bert))
    assert text.endswith("— perplexity does not apply") and not perplexity_applies


def test_describe_an_unsupported_model_lists_the_supported_types(tmp_path):
    gpt2 = _config(tmp_path, "gpt2", model_type="gpt2", n_layer=2)
    kind, text = describe_model(str(gpt2))
    assert kind is None
    assert text.startswith("⚠ model type 'gpt2' is not a supported architecture (supported families: LLaMA")
    assert "Gemma 3 (text)" in text and "Phi-3" in text


def test_describe_what_is_not_a_local_model():
    assert describe_model("") == (None, f"Supported families: {supported_families_text()}")
    assert describe_model("org/some-model") == (None, "hub id or unknown directory: checked when the job starts")


def test_pickers_list_the_engine_names():
    from core.spec.criteria import CRITERIA
    from core.spec.recipe import METHODS, NAMED_DATASETS

    assert forms.CRITERIA == ["auto", *CRITERIA]  # the recipe's default first: the form's first choice
    assert forms.METHODS == list(METHODS) and forms.NAMED_SETS == list(NAMED_DATASETS)


def test_forms_load_without_gradio_or_torch():
    code = "import app.web, app.web.forms, sys; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "app.web.forms" in loaded
    assert not {"gradio", "torch", "transformers"} & loaded


# --- against a job service -----------------------------------------------------------------------


def test_validate_submit_and_the_jobs_table(job_service, llama_dir, tmp_path):
    # a path outside the folders the server reads from is refused before anything reads it (whether it
    # exists or not: the answer does not tell)
    for model in ("/no/such/model", "/etc"):
        message, text, path = forms.validate_form(job_service, _form(tmp_path, model))
        assert message.startswith("**⚠") and "outside the folders this server reads from" in message
        assert (text, path) == ("", None)
    inside = job_service.settings.data_dir / "no-such-model"
    message, _, _ = forms.validate_form(job_service, _form(tmp_path, str(inside)))
    assert "does not exist" in message

    form = _form(tmp_path, llama_dir, round_neurons=8, kv_groups="whole")
    message, text, path = forms.validate_form(job_service, form)
    assert message == "✓ valid" and Path(path).read_text() == text
    assert yaml.safe_load(text)["round_to"] == {"neurons": 8, "kv_groups": "whole"}

    assert forms.submit_form(job_service, _form(tmp_path, llama_dir, methods=[]), "ada") == (
        "**⚠ pick at least one reconstruction method**"
    )
    assert forms.submit_form(job_service, _form(tmp_path, llama_dir), "ada") == "✓ submitted job 1"
    message = forms.submit_form(job_service, _form(tmp_path, llama_dir, methods=["liar", "ls"]), "bob")
    assert message.startswith("✓ submitted sweep ") and message.endswith(" of 2 jobs (2 methods): jobs 2, 3")
    assert recipe_box.submit(job_service, " ", "(none)", "ada").startswith("**⚠ the recipe box is empty")
    assert recipe_box.submit(job_service, text, "(none)", None) == "✓ submitted job 4"

    rows = job_rows(job_service)
    assert [r[0] for r in rows] == [4, 3, 2, 1]
    assert len(rows[0]) == len(views.TABLE_COLUMNS)
    assert rows[-1][1:4] == ["QUEUED", "queued", "–"] and rows[-1][6:8] == ["ada", "llama"]
    assert rows[1][9] == "ls" and rows[0][6] == "–"
    assert job_rows(job_service, "RUNNING") == []


def test_job_actions_and_the_model_page(job_service, llama_dir, tmp_path):
    picked = (3, 3.0, "3", [3, "RUNNING"])  # a number box, the API, the query string, a selected row
    assert [views.job_id_of(v) for v in picked] == [3, 3, 3, 3]
    assert all(views.job_id_of(v) is None for v in ("?", 0, 2.5, [], float("inf"), None))
    for nothing in (None, "", float("nan")):  # no row selected: a sentence, not int()'s error
        assert views.cancel_job(job_service, nothing) == "**⚠ select a job in the table first**"
        assert views.rerun_job(job_service, nothing) == "**⚠ select a job in the table first**"
    assert views.rerun_job(job_service, 7) == "**⚠ no job 7**" and views.cancel_job(job_service, 7) == "**⚠ no job 7**"
    assert views.model_page(job_service, None).head.startswith("Pick a job")
    assert views.model_page(job_service, 7).head == "**no job 7**"
    forms.submit_form(job_service, _form(tmp_path, llama_dir), "ada")
    assert views.rerun_job(job_service, 1) == "re-submitted job 1 as job 2"
    assert job_service.show(2)["submitted_by"] == "ada"  # no login: the original submitter's name
    heading, log, _ = views.job_panel(job_service, [1, "QUEUED"])  # a selected row
    assert heading.startswith("**Job 1** · QUEUED") and "by ada" in heading and "submitted by ada" in log
    page = views.model_page(job_service, 2)
    assert page.head.startswith("### Job 2 — QUEUED") and "by ada" in page.head and "time went" not in page.head
    assert yaml.safe_load(page.recipe)["model"] == str(llama_dir)
    assert page.report == [] and page.layers is None and page.downloads == "" and page.load == ""
    assert views.cancel_job(job_service, 2) == "job 2: cancelled"
    assert views.cancel_job(job_service, 2) == "job 2 had already finished (CANCELLED)"


def test_a_rerun_is_the_clicking_accounts_job_and_confined_like_a_web_submission(job_service, llama_dir, tmp_path):
    from jobs.access import Actor

    admin, bob, carol = Actor("alice", admin=True), Actor("bob"), Actor("carol")
    forms.submit_form(job_service, _form(tmp_path, llama_dir), "bob")
    refused = views.rerun_job(job_service, 1, carol)  # not the owner, not an admin: one sentence, no job
    assert refused == "**⚠ job 1 is bob's: only its owner or an administrator may re-run it**"
    assert [j["id"] for j in job_service.list()] == [1]
    assert views.rerun_job(job_service, 1, admin) == "re-submitted job 1 as job 2"
    info = job_service.show(2)
    assert info["submitted_by"] == "alice"  # the account that clicked, not the original's owner
    assert info["log"][0]["message"] == "submitted by alice (re-run of job 1)"
    assert views.rerun_job(job_service, 1, bob) == "re-submitted job 1 as job 3"
    assert job_service.show(3)["submitted_by"] == "bob"
    # a job submitted unconfined (the CLI, on the server) whose data lies outside the folders the web
    # app reads from is not re-run from the web, even by its owner
    outside = Path("/tmp") / "liar-rerun-outside-roots.txt"
    outside.write_text("the quick brown fox jumps over the lazy dog. " * 50)
    try:
        recipe = {"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": str(outside), "max_seq_length": 16}}
        cli_job = job_service.submit(recipe, submitted_by="bob")
        message = views.rerun_job(job_service, cli_job, bob)
        assert message.startswith("**⚠") and "outside the folders this server reads from" in message
    finally:
        outside.unlink()


def test_a_pending_cancel_shows_in_the_table_and_the_heading(job_service, llama_dir, tmp_path):
    from sqlalchemy import update

    from jobs.db import Job

    forms.submit_form(job_service, _form(tmp_path, llama_dir), "ada")
    with job_service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == 1).values(status="RUNNING", stage="reconstruct", layer=1, n_layers=4))
    assert job_rows(job_service)[0][1] == "RUNNING"
    assert views.cancel_job(job_service, 1) == "job 1: cancel requested — it stops at its next layer or stage boundary"
    assert job_rows(job_service)[0][1] == "RUNNING · cancel requested"
    heading = views.job_panel(job_service, 1)[0]
    assert "reconstruct (layer 1/4)" in heading and "cancel requested" in heading


@pytest.mark.parametrize(
    "text, ratios",
    [("0.2", [0.2]), (0.3, [0.3]), ("20%", [0.2]), ("0.2, 0.3 0.5", [0.2, 0.3, 0.5]), ("0.2,0.2;0.4", [0.2, 0.4])],
)
def test_ratios_typed_in_the_form(text, ratios):
    assert forms.parse_ratios(text) == ratios


@given(st.lists(st.floats(min_value=0.001, max_value=0.999), min_size=1, max_size=6), st.sampled_from([",", " ", "; "]))
def test_any_ratios_in_range_read_back_in_order(ratios, separator):
    parsed = forms.parse_ratios(separator.join(repr(r) for r in ratios))
    assert parsed == list(dict.fromkeys(round(r, 6) for r in ratios))


@given(st.floats().filter(lambda r: not 0 < r < 1))
def test_any_ratio_out_of_range_is_refused(ratio):
    with pytest.raises(SubmitError, match="must lie strictly between 0 and 1|is not a number"):
        forms.parse_ratios(f"0.5, {ratio!r}")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "enter a ratio"),
        ("0.95 1.5", "ratio 1.5 must lie strictly between 0 and 1"),
        ("0", "ratio 0 must lie strictly between 0 and 1"),
        ("-0.2", "ratio -0.2 must lie"),
        ("nan", "ratio nan must lie"),
        ("0.2, half", "ratio 'half' is not a number"),
        ("0.2, 1.5, -0.1", r"ratios 1\.5 and -0\.1 must each lie strictly between 0 and 1"),
        ("x, 0.2, 2, y%", r"ratios 'x' and 'y%' are not numbers; ratio 2 must lie strictly"),
    ],
)
def test_a_bad_ratio_is_named_not_clamped(text, message):
    with pytest.raises(SubmitError, match=message):
        forms.parse_ratios(text)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("calibration", "", "choose a calibration set"),
        ("calibration", "   ", "choose a calibration set"),
        ("samples", None, "samples must be a number, got nothing"),
        ("samples", 2.5, "samples must be a whole number"),
        ("seq_len", 1, "sequence length must be at least 2"),
        ("damp", "", "damping must be a number"),
    ],
)
def test_emptied_or_bad_fields_are_one_sentence(tmp_path, field, value, message):
    with pytest.raises(SubmitError, match=message):
        build_recipe(**_fields(tmp_path, **{field: value}))


def test_the_form_submits_a_sweep_of_ratios_and_methods(job_service, llama_dir, tmp_path):
    form = _form(tmp_path, llama_dir, methods=["liar", "ls"], ratio="0.2, 0.4")
    message, text, _ = forms.validate_form(job_service, form)
    assert message == "✓ valid: a sweep of 4 jobs (2 ratios × 2 methods); the YAML holds all of them"
    grid = yaml.safe_load(text)  # the grid form of `liar sweep`'s files
    assert grid["grid"] == {"ratio": [0.2, 0.4], "reconstruction": ["liar", "ls"]}
    message = forms.submit_form(job_service, form, "ada")
    assert message.endswith(" of 4 jobs (2 ratios × 2 methods): jobs 1, 2, 3, 4"), message
    cells = sorted((j["ratio"], j["method"]) for j in job_service.list())
    assert cells == [(0.2, "liar"), (0.2, "ls"), (0.4, "liar"), (0.4, "ls")]
    assert len({j["group_id"] for j in job_service.list()}) == 1
    # a bad ratio in the list: nothing queued, and the ratio box is the one named
    message = forms.submit_form(job_service, _form(tmp_path, llama_dir, ratio="0.2, 1.2"), "ada")
    assert message.startswith("**⚠ ratio 1.2 must lie strictly between 0 and 1 (the fraction of the blocks'")
    assert message.field == "ratio"
    assert len(job_service.list()) == 4
    # the validated YAML, submitted as it is, queues the whole sweep again (it queued only the first job)
    message = recipe_box.submit(job_service, text, "(none)", "ada")
    assert message == "✓ submitted sweep " + message.split()[3] + " of 4 jobs: jobs 5, 6, 7, 8", message
    cells = sorted((j["ratio"], j["method"]) for j in job_service.list() if j["id"] > 4)
    assert cells == [(0.2, "liar"), (0.2, "ls"), (0.4, "liar"), (0.4, "ls")]


@pytest.mark.parametrize(
    "grid, message",
    [
        ("grid: {ratio: [0.2, 1.5]}", "ratio"),
        ("grid: {model: [a, b]}", "grid.model needs `liar sweep`"),
        ("grid: {reconstruction: [{method: ls, damp: 0.1}]}", "give plain values here"),
        ("grid: {}", "a sweep needs base"),
        ("grid: {ratio: [0.2]}\nevaluation: {perplexity: {text: x}}", "not evaluation"),
    ],
)
def test_a_bad_sweep_grid_in_the_recipe_box_queues_nothing(job_service, llama_dir, tmp_path, grid, message):
    base = yaml.safe_dump({"base": build_recipe(**_fields(tmp_path, model=str(llama_dir)))})
    line = recipe_box.submit(job_service, base + grid, "(none)", "ada")
    assert line.startswith("**⚠") and message in line, line
    assert job_service.list() == []


def test_validating_keeps_one_recipe_file_per_recipe(job_service, llama_dir, tmp_path, monkeypatch):
    recipes = job_service.settings.data_dir / "recipes"
    first = forms.validate_form(job_service, _form(tmp_path, llama_dir))[2]
    again = forms.validate_form(job_service, _form(tmp_path, llama_dir))[2]
    assert first == again and len(list(recipes.iterdir())) == 1  # the same recipe: the same file
    monkeypatch.setattr(forms, "KEEP_RECIPE_FILES", 2)
    paths = [forms.validate_form(job_service, _form(tmp_path, llama_dir, seed=s))[2] for s in (1, 2, 3)]
    assert len(set(paths)) == 3 and sorted(recipes.iterdir()) == sorted(Path(p).parent for p in paths[1:])


def test_formatters():
    assert forms.bar(0.5, width=4) == "██░░  50%"
    assert forms.elapsed(None) == "–" and forms.elapsed(7.9) == "7s" and forms.elapsed(125) == "2m05s"

    class Request:
        username = "alice"

    assert forms.submitter("mallory", Request()) == "alice"
    assert forms.submitter("", None) is None and forms.submitter("ada", object()) == "ada"


def test_gradio_fills_the_request_of_the_submit_handlers(job_service):
    """With login on, the submitter is the account, so Gradio must pass gr.Request to the handlers:
    it does so only for functions whose parameters it can count (a *form handler got none)."""
    import gradio as gr
    from gradio import helpers

    from app.web import build_app

    demo = build_app(job_service, default_models=[], default_texts=[], eval_texts=[])
    handlers = {fn.fn.__name__: fn for fn in demo.fns.values() if fn.fn is not None}  # (None: a browser-only event)
    for name in ("submit_form", "submit_yaml_text", "cancel", "rerun", "delete"):  # the account acts
        block_fn = handlers[name]
        inputs = [None] * len(block_fn.inputs)
        request = gr.Request(username="ada")
        filled, *_ = helpers.special_args(block_fn.fn, inputs=list(inputs), request=request)
        assert filled[-1] is request, name


def test_web_submissions_read_only_inside_the_data_roots(job_service, llama_dir, tmp_path_factory):
    """Through the web app or the API, server-side paths must lie in the data roots (uploads land in
    the data dir); the same recipe from the CLI on one's own machine is not confined."""
    outside = Path("/tmp") / "liar-outside-roots.txt"
    outside.write_text("the quick brown fox jumps over the lazy dog. " * 50)
    try:
        text = yaml.safe_dump(
            {"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": str(outside), "max_seq_length": 16}}
        )
        assert "outside the folders this server reads from" in recipe_box.submit(job_service, text, None, "ada")
        assert job_service.list() == []
        job_service.submit(text)  # the CLI's path: unconfined
        assert len(job_service.list()) == 1
    finally:
        outside.unlink()


def test_uploads_are_stored_in_the_data_dir_by_content(job_service, tmp_path):
    upload = tmp_path / "mine.txt"
    upload.write_text("some calibration text")
    named = forms.store_upload(job_service, str(upload))  # how a recipe names it: a key, not a server path
    digest = hashlib.sha256(b"some calibration text").hexdigest()[:20]
    assert named == f"upload:{digest}.txt"
    stored = job_service.settings.uploads_dir / f"{digest}.txt"  # the default store: the data folder
    assert stored.read_text() == "some calibration text"
    assert forms.store_upload(job_service, str(upload)) == named  # same content, same file
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (forms.MAX_UPLOAD_MB * 2**20 + 1))
    with pytest.raises(forms.SubmitError, match="the limit is"):
        forms.store_upload(job_service, str(big))
    assert len(list(job_service.settings.uploads_dir.iterdir())) == 1  # the big one was not stored


# --- serving files (the recipe's export) ---------------------------------------------------------


def test_serving_files_land_in_the_recipe_and_its_yaml(job_service, tmp_path_factory, tmp_path):
    from core.models.tiny import tiny_decoder

    assert forms.SERVING_FORMS == [
        *(f"gguf-{t}" for t in ("f16", "q8_0", "q5_k_m", "q4_k_m", "q3_k_m", "iq3_xxs", "iq2_m")),
        "vllm",
    ]  # the recipe's names, in its order
    assert build_recipe(**_fields(tmp_path, export=["vllm"]))["query_heads"] == "uniform"  # what vLLM needs
    assert "export" not in build_recipe(**_fields(tmp_path))  # none ticked: the recipe stays as before
    base = tmp_path_factory.mktemp("serving")
    llama = tiny_decoder(base / "llama-bpe", tokenizer="bpe")
    message, text, path = forms.validate_form(job_service, _form(tmp_path, llama, export=["gguf-f16"]))
    assert (
        message == "✓ valid" and yaml.safe_load(text)["export"] == ["gguf-f16"] and "export:" in Path(path).read_text()
    )
    assert Recipe.from_yaml(text).export == ["gguf-f16"]
    form = _form(tmp_path, llama, methods=["liar", "ls"], ratio="0.2, 0.3", export=["gguf-f16"])
    assert forms.submit_form(job_service, form, "ada").endswith("jobs 1, 2, 3, 4")
    assert all(job_service.show(i)["recipe"]["export"] == ["gguf-f16"] for i in (1, 2, 3, 4))
    # a model the forms cannot be written from is refused in one line, before anything is queued
    opt = tiny_decoder(base / "opt", family="opt", tokenizer="bpe")
    message, text, _ = forms.validate_form(job_service, _form(tmp_path, opt, export=["gguf-f16"]))
    families = "GGUF export writes the LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (text) and Phi-3 families"
    assert message.startswith(f"**⚠ invalid recipe: export: {families}; this checkpoint is OPT")
    assert text == "" and "\n" not in message
    assert forms.submit_form(job_service, _form(tmp_path, opt, export=["gguf-f16"]), "ada").startswith("**⚠ invalid")
    assert recipe_box.submit(
        job_service, f"model: {opt}\nratio: 0.3\nexport: [gguf-f16]\ncalibration: {{texts: [a b]}}\n", "(none)", None
    ).startswith(f"**⚠ invalid recipe: export: {families}")
    assert len(job_service.list()) == 4


def test_the_model_page_lists_serving_files_and_failed_forms():
    files = [
        {"name": "config.json", "size": 700, "sha256": "a" * 64, "kind": "file", "url": "jobs/3/files/config.json"},
        {"name": "c-f16.gguf", "size": 2_400_000, "sha256": "b" * 64, "kind": "file", "url": "jobs/3/files/c-f16.gguf"},
    ]
    failed = "export gguf-q4_k_m failed; the checkpoint is kept: llama.cpp is not installed"
    log = [
        {"level": "INFO", "message": "export gguf-f16: c-f16.gguf (2.3 MiB)"},
        {"level": "WARNING", "message": failed},
    ]
    from app.web import listings

    text = listings.serving_markdown({"files": files}, log)
    assert text == (
        "### Serving files\n\n- [c-f16.gguf](jobs/3/files/c-f16.gguf) — 2.4 MB · `llama-cli -m c-f16.gguf`\n"
        f"- ⚠ {failed}"
    )
    assert listings.serving_markdown({"files": files[:1]}, log[:1]) == ""  # no export asked


# --- speed targets and depth in the form -----------------------------------------------------------


@pytest.mark.parametrize("text, speedup", [("1.5x", 1.5), ("2X", 2.0), (" 1.25× ", 1.25), (".9x", None)])
def test_a_speed_up_in_the_ratio_box_becomes_the_target(tmp_path, text, speedup):
    if speedup is None:
        with pytest.raises(SubmitError, match="above 1x"):
            build_recipe(**_fields(tmp_path, ratio=text))
        return
    recipe = Recipe.model_validate(build_recipe(**_fields(tmp_path, ratio=text, modules="blocks")))
    assert recipe.ratio is None and recipe.target.speedup == speedup and recipe.target.workload == "decode_b1"
    assert recipe.modules == "blocks"


def test_a_speed_up_goes_alone_and_ratios_still_sweep(tmp_path):
    with pytest.raises(SubmitError, match="goes alone"):
        forms.parse_amount("0.2, 1.5x")
    assert forms.parse_amount("0.2, 0.5") == [0.2, 0.5]


def test_a_speed_target_form_submits_one_job_per_method(tmp_path, job_service, llama_dir):
    run = forms.from_form(job_service, _form(tmp_path, llama_dir, methods=("ls", "liar"), ratio="1.4x"))
    assert run.ratios == [None] and run.n_jobs == 2 and run.describe() == "2 methods"
    assert run.recipe["target"]["speedup"] == 1.4 and "ratio" not in run.recipe


def test_a_speed_target_sweep_over_methods_queues_one_job_each(tmp_path, job_service, llama_dir):
    status = forms.submit_form(job_service, _form(tmp_path, llama_dir, methods=("ls", "liar"), ratio="1.4x"), "ada")
    assert status.startswith("✓ submitted sweep") and "2 methods" in status, status
    jobs = job_service.list()
    assert {j["method"] for j in jobs} == {"ls", "liar"} and len({j["group_id"] for j in jobs}) == 1
    assert all(j["ratio"] is None and j["target"]["speedup"] == 1.4 for j in jobs)


def test_every_bad_box_is_named_and_placed(job_service, llama_dir, tmp_path):
    """Each bad input of the form gets one sentence naming its box, and the tab knows which box to
    show it under (``Status.field``); the form as a whole gets none. Nothing is queued."""
    bad_jsonl = tmp_path / "records.jsonl"
    bad_jsonl.write_text('{"body": "no text field here"}\n')
    outside = tmp_path.parent.parent / "elsewhere"  # outside the data roots
    cases = [
        (dict(samples=0), "samples", "samples must be at least 1, got 0"),
        (dict(seq_len=-5), "seq_len", "sequence length must be at least 2, got -5"),
        (dict(seed=1.5), "seed", "seed must be a whole number"),
        (dict(damp=-1), "damp", "damping must be at least 0"),
        (dict(ratio="0.2, 1.5, −0.1"), "ratio", "ratios 1.5 and -0.1 must each lie strictly between 0 and 1"),
        (dict(ratio=""), "ratio", "enter a ratio"),
        (dict(calibration=str(bad_jsonl)), "text_field", "record 1 has no field 'text'"),
        (dict(calibration=str(bad_jsonl), text_field="body", label_field="label"), "label_field", "label field"),
        (dict(text_field="a, b, c"), "text_field", "give one text field"),
        (dict(model=str(outside / "model")), "model", "outside the folders this server reads from"),
        (dict(model=""), "model", "choose a model"),
        (dict(methods=[]), "methods", "pick at least one reconstruction method"),
        (dict(tasks="no_such_task"), "tasks", "no_such_task"),
        (dict(task_dir=str(tmp_path)), "tasks", "a task folder needs task names"),
        (dict(evaluate=str(tmp_path / "missing.txt")), "evaluate", "missing.txt"),
        (dict(round_neurons="0"), "round_neurons", "FFN width multiple"),
    ]
    for over, field, words in cases:
        methods = over.pop("methods", ["ls"])
        line = forms.submit_form(
            job_service, _form(tmp_path, over.pop("model", llama_dir), methods=methods, **over), "ada"
        )
        assert line.startswith("**⚠") and words in line, (over, line)
        assert line.field == field, (over, line, line.field)
        assert line.message in line and "\n" not in line.message
    assert job_service.list() == []
    assert forms.check_form(job_service, _form(tmp_path, llama_dir)) == ""  # a valid form: nothing to show


@pytest.mark.parametrize(
    "message, field",
    [
        ("invalid recipe: calibration.max_seq_length: must be at most 64 (the model's positions)", "seq_len"),
        ("invalid recipe: model 'x' does not exist", "model"),
        ("invalid recipe: ratio 0.95 leaves a layer of the model without heads", "ratio"),
        ("invalid evaluation: lm-eval task 'piqa' loads its data from the Hugging Face Hub", "tasks"),
        ("invalid recipe: calibration.dataset 'wikitext2' comes from the Hugging Face Hub", "calibration"),
        ("the queue is unreachable: try again", None),
    ],
)
def test_service_messages_find_their_box(message, field):
    from app.web.fields import field_for

    assert field_for(message) == field


def test_the_advanced_title_shows_the_current_choices():
    title = preview.advanced_title(
        dict(modules="heads", allocation="global", methods=["ls", "liar"], damp=0.01, samples=64, seq_len=256,
             evaluate="/data/texts/wiki.txt", tasks="piqa", export=["gguf"])
    )  # fmt: skip
    assert title == (
        "Advanced · prune heads · allocation global · reconstruction ls + liar · damping 0.01 · 64 samples × "
        "256 tokens · perplexity on wiki.txt and lm-eval piqa · serving files: gguf"
    )
    title = preview.advanced_title(dict(modules="both", allocation="auto", methods=[], damp=0.001, samples=128,
                                      seq_len=128, evaluate="(none)", tasks="", export=[]))  # fmt: skip
    assert "reconstruction (none picked)" in title and "no evaluation · no serving files" in title


def test_the_estimate_above_submit_is_the_engines(job_service, llama_dir, tmp_path):
    """The line above Submit is ``core.pipeline.estimate``'s, for the form's first ratio, on the
    server's worker class; nothing while the form cannot make a recipe or names an unreadable folder."""
    from core.pipeline.estimate import estimate

    form = _form(tmp_path, llama_dir, ratio="0.3, 0.5", methods=["ls"])
    line = preview.estimate_line(job_service, form)
    recipe = build_recipe(**_fields(tmp_path, model=str(llama_dir), ratio="0.3"))
    recipe["reconstruction"]["method"] = "ls"
    expected = estimate(recipe, job_service.settings.worker_class)
    assert line == f"Estimate (for ratio 0.3, the first of 2): {expected.summary()}"
    assert "parameters after pruning" in line and "on this server's CPU" in line
    assert preview.estimate_line(job_service, _form(tmp_path, llama_dir, samples=0)) == ""
    outside = tmp_path.parent.parent / "elsewhere-model"
    outside.mkdir(exist_ok=True)
    (outside / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert preview.estimate_line(job_service, _form(tmp_path, outside)) == ""  # never read outside the roots
    assert preview.estimate_line(job_service, _form(tmp_path, "org/not-cached")).startswith("Estimate: cannot estimate")


def test_the_worker_class_is_one_the_estimate_knows(monkeypatch, tmp_path):
    from jobs.settings import Settings

    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LIAR_WORKER_CLASS", "H100-80GB")
    assert Settings.from_env().worker_class == "h100-80gb"
    monkeypatch.setenv("LIAR_WORKER_CLASS", "tpu")
    with pytest.raises(ValueError, match="LIAR_WORKER_CLASS is 'tpu'; use one of cpu, a100-80gb, h100-80gb"):
        Settings.from_env()


def test_with_routed_queues_the_estimate_names_the_queue_or_says_none_fits(job_service, llama_dir, tmp_path):
    """With LIAR_QUEUES the line above Submit is the estimate on the queue the job would go to
    (jobs.routing), or the sentence Submit would refuse it with."""
    import dataclasses

    from jobs.settings import parse_queues

    settings = job_service.settings
    job_service.settings = dataclasses.replace(settings, queues=parse_queues("small:cpu:0.2, big:cpu:1"))
    line = preview.estimate_line(job_service, _form(tmp_path, llama_dir))
    assert line.startswith("Estimate: ") and line.endswith("on this server's CPU (queue big)"), line
    job_service.settings = dataclasses.replace(settings, queues=parse_queues("tiny:cpu:0.1"))
    line = preview.estimate_line(job_service, _form(tmp_path, llama_dir))
    assert line.startswith("Estimate: ⚠ no queue has the memory for this job"), line
