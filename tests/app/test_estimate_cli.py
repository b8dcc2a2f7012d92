"""``liar estimate``: the engine's estimate of a recipe's run, one line, and one sentence for bad input."""

import json

import yaml

from app.cli import main
from app.cli.estimate import WORKER_CHOICES
from core.pipeline.estimate import WORKERS


def _recipe(tmp_path, name="recipe", **kw):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"ratio": 0.3, "calibration": {"dataset": "wikitext2"}, **kw}))
    return str(path)


def test_prints_the_summary(llama_dir, tmp_path, capsys):
    assert main(["estimate", _recipe(tmp_path, model=str(llama_dir)), "--worker", "a100-80gb"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("≈ ") and out[0].endswith("on an A100 80 GB")


def test_json_has_every_field(llama_dir, tmp_path, capsys):
    assert main(["estimate", _recipe(tmp_path, model=str(llama_dir)), "--worker", "h100-80gb", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["execution"] == "stream" and data["fits"] and data["params_after"] < data["params_before"]
    assert set(data["flops"]) == {"dense", "fp64", "report"} and data["summary"].startswith("≈ ")


def test_bad_input_is_one_sentence_and_a_usage_exit(llama_dir, tmp_path, capsys):
    cases = [
        ([str(tmp_path / "missing.yaml")], "does not exist"),
        ([_recipe(tmp_path, "bad", model=str(llama_dir), ratio=2.0)], "invalid recipe: ratio"),
        ([_recipe(tmp_path, "uncached", model="liar-tests/not-cached-anywhere")], "cannot estimate: the config of"),
    ]
    for args, words in cases:
        assert main(["estimate", *args, "--worker", "h100-80gb"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("liar: error: ") and words in err[0], err


def test_the_choices_are_the_engines_worker_classes():
    assert WORKER_CHOICES == tuple(WORKERS)
