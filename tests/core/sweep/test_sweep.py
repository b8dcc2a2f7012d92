"""Sweeps: a small grid end to end, resume after interruption, failed cells, grid validation, plots.

Also checks that a pruned model with uneven widths generates with a KV cache (the latency benchmark
relies on it).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

import core.pipeline.sequential as pipeline
from app.cli import main as cli_main
from core.models.tiny import tiny_corpus
from core.spec.sweep import GridError, expand_grid, load_grid, parse_grid
from core.sweep.plots import PNG_SIGNATURE, is_png
from core.sweep.records import read_records
from core.sweep.run import run_sweep
from tests.conftest import recipe_for


def param_count(model, tokenizer, scale: float = 1.0) -> dict[str, float]:
    """A metric callable for the grid tests: parameters of the (pruned) model."""
    return {"params_k": scale * sum(p.numel() for p in model.parameters()) / 1000}


@pytest.fixture
def texts(tmp_path) -> tuple[Path, Path]:
    calib, evaluation = tmp_path / "calib.txt", tmp_path / "eval.txt"
    calib.write_text("\n\n".join(tiny_corpus(40)))
    evaluation.write_text("\n\n".join(tiny_corpus(10, seed=1)))
    return calib, evaluation


def grid_dict(llama_dir, texts, ratios=(0.2, 0.4), methods=("none", "liar"), **extra) -> dict:
    calib, evaluation = texts
    grid = {
        "name": "tiny sweep",
        "base": {
            "modules": "both",
            "dtype": "float32",
            "device": "cpu",
            "calibration": {
                "dataset": str(calib),
                "num_calibration_samples": 12,
                "max_seq_length": 24,
                "holdout_samples": 4,
                "batch_size": 6,
            },
        },
        "grid": {
            "model": [str(llama_dir)],
            "criterion": ["magnitude"],
            "reconstruction": list(methods),
            "ratio": list(ratios),
        },
        "evaluation": {"perplexity": {"text": str(evaluation), "seq_len": 32, "max_windows": 4}},
    }
    grid.update(extra)
    return grid


def write_grid(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


REAL_PRUNE = pipeline.prune  # before any test patches it


def recording(calls: list, key, interrupt_at: int | None = None):
    """A stand-in for core.pipeline.sequential.prune (the sweep calls it through the module) that
    appends ``key(recipe)`` to ``calls`` for each call and prunes, or at call ``interrupt_at`` raises
    KeyboardInterrupt instead."""

    def prune(recipe, **kw):
        calls.append(key(recipe))
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return REAL_PRUNE(recipe, **kw)

    return prune


def ratio(recipe):
    return recipe.ratio


def method(recipe):
    return recipe.reconstruction.method


@pytest.fixture
def count_prunes(monkeypatch):
    """The ratio of every call of core.pipeline.sequential.prune."""
    calls: list[float] = []
    monkeypatch.setattr(pipeline, "prune", recording(calls, ratio))
    return calls


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_grid_runs_and_writes_results_table_and_plots(tmp_path, llama_dir, texts, count_prunes):
    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts))
    out = tmp_path / "out"
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.total, outcome.ran, outcome.failed) == (5, 5, 0)
    assert len(count_prunes) == 4

    records = lines(out / "results.jsonl")
    assert len(records) == 5 and all(r["status"] == "ok" for r in records)
    dense = [r for r in records if r["kind"] == "dense"]
    assert len(dense) == 1 and dense[0]["metrics"]["perplexity"] > 1
    for r in (r for r in records if r["kind"] == "prune"):
        assert r["metrics"]["perplexity"] > 1 and r["summary"]["achieved_ratio"] > 0.1
        assert {(x["layer"], x["module"]) for x in r["layers"]} == {
            (i, m) for i in (0, 1) for m in ("attention", "ffn")
        }
        assert all(x["error_before"] >= 0 and x["error_after"] >= 0 for x in r["layers"])
        if r["params"]["reconstruction"] == "none":
            assert all(x["error_after"] == pytest.approx(x["error_before"]) for x in r["layers"])
    assert len({r["id"] for r in records}) == 5

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 5 and {r["status"] for r in rows} == {"ok"}
    assert {float(r["ratio"]) for r in rows if r["kind"] == "prune"} == {0.2, 0.4}
    assert all(float(r["perplexity"]) > 1 for r in rows)

    md = (out / "results.md").read_text()
    assert "| criterion | ratio | none | liar |" in md
    assert "| dense | 0% |" in md and "| magnitude | 20% |" in md and "| magnitude | 40% |" in md

    pngs = sorted((out / "plots").glob("*.png"))
    assert [p.name for p in pngs] == [
        "layer-errors-llama-magnitude-r0.4.png",
        "perplexity-vs-ratio-llama-magnitude.png",
    ]
    import matplotlib.image

    for png in pngs:
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_SIGNATURE and is_png(png)
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0  # not a blank canvas
        assert f"plots/{png.name}" in md


@pytest.mark.slow
def test_rerun_skips_finished_cells_and_new_ratio_runs_only_new_cells(tmp_path, llama_dir, texts, count_prunes):
    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts))
    out = tmp_path / "out"
    run_sweep(grid, out, log=lambda _m: None)
    first = read_records(out / "results.jsonl")
    assert len(count_prunes) == 4

    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.skipped, outcome.ran) == (5, 0)
    assert len(count_prunes) == 4  # nothing pruned again
    assert len(lines(out / "results.jsonl")) == 5
    assert read_records(out / "results.jsonl") == first

    write_grid(grid, grid_dict(llama_dir, texts, ratios=(0.2, 0.3, 0.4)))
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.total, outcome.skipped, outcome.ran) == (7, 5, 2)
    assert count_prunes[4:] == [0.3, 0.3]
    assert "| magnitude | 30% |" in (out / "results.md").read_text()
    assert len(lines(out / "results.jsonl")) == 7


def test_changed_base_recipe_changes_cell_ids(tmp_path, llama_dir, texts):
    a = load_grid(write_grid(tmp_path / "a.yaml", grid_dict(llama_dir, texts)))
    data = grid_dict(llama_dir, texts)
    data["base"]["calibration"]["num_calibration_samples"] = 16
    b = load_grid(write_grid(tmp_path / "b.yaml", data))
    ids_a, ids_b = {c.id for c in a.prune_cells}, {c.id for c in b.prune_cells}
    assert not ids_a & ids_b
    # the dense baseline does not depend on calibration
    assert {c.id for c in a.cells if c.kind == "dense"} == {c.id for c in b.cells if c.kind == "dense"}
    again = load_grid(write_grid(tmp_path / "a2.yaml", grid_dict(llama_dir, texts)))
    assert [c.id for c in again.cells] == [c.id for c in a.cells]


@pytest.mark.slow
def test_interrupted_run_keeps_cells_finished_before(tmp_path, llama_dir, texts, monkeypatch):
    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts))
    out = tmp_path / "out"
    calls: list[float] = []
    monkeypatch.setattr(pipeline, "prune", recording(calls, ratio, interrupt_at=3))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, out, log=lambda _m: None)
    kept = lines(out / "results.jsonl")
    assert [r["kind"] for r in kept] == ["dense", "prune", "prune"]
    assert all(r["status"] == "ok" for r in kept)
    assert not (out / "results.md").exists()

    calls.clear()
    monkeypatch.setattr(pipeline, "prune", recording(calls, ratio))
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.skipped, outcome.ran, outcome.failed) == (3, 2, 0)
    assert calls == [0.4, 0.4]
    assert (out / "results.md").exists()


@pytest.mark.slow
def test_failed_cell_is_recorded_and_retried(tmp_path, llama_dir, texts, monkeypatch):
    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts))
    out = tmp_path / "out"

    def flaky(recipe, **kw):
        if recipe.reconstruction.method == "liar" and recipe.ratio == 0.4:
            raise RuntimeError("solver exploded")
        return REAL_PRUNE(recipe, **kw)

    monkeypatch.setattr(pipeline, "prune", flaky)
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.ran, outcome.failed) == (5, 1)
    records = read_records(out / "results.jsonl")
    failed = [r for r in records.values() if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"] == "RuntimeError: solver exploded"
    assert "solver exploded" in failed[0]["traceback"]
    md = (out / "results.md").read_text()
    assert "| magnitude | 40% | " in md and "failed |" in md and "solver exploded" in md

    calls: list[str] = []
    monkeypatch.setattr(pipeline, "prune", recording(calls, method))
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.skipped, outcome.ran, outcome.failed) == (4, 1, 0)
    assert calls == ["liar"]
    assert all(r["status"] == "ok" for r in read_records(out / "results.jsonl").values())
    assert "failed |" not in (out / "results.md").read_text() and "Failed cells" not in (out / "results.md").read_text()


def test_a_grid_of_one_ratio_keeps_its_finished_cell_and_retries_its_failed_one(
    tmp_path, llama_dir, texts, monkeypatch
):
    """The fast twin of the two tests above, on the dense cell and two prunes: a cell finished before an
    interrupt is kept; a failed cell is recorded with its error and is the only one run again."""
    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts, ratios=(0.4,)))
    out = tmp_path / "out"
    calls: list[str] = []
    monkeypatch.setattr(pipeline, "prune", recording(calls, method, interrupt_at=2))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, out, log=lambda _m: None)
    assert [(r["kind"], r["status"]) for r in lines(out / "results.jsonl")] == [("dense", "ok"), ("prune", "ok")]
    assert not (out / "results.md").exists()

    def failing(recipe, **kw):
        calls.append(recipe.reconstruction.method)
        raise RuntimeError("solver exploded")

    calls.clear()
    monkeypatch.setattr(pipeline, "prune", failing)
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.skipped, outcome.ran, outcome.failed) == (2, 1, 1) and calls == ["liar"]
    failed = [r for r in read_records(out / "results.jsonl").values() if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"] == "RuntimeError: solver exploded"
    assert "solver exploded" in failed[0]["traceback"] and "failed |" in (out / "results.md").read_text()

    calls.clear()
    monkeypatch.setattr(pipeline, "prune", recording(calls, method))
    outcome = run_sweep(grid, out, log=lambda _m: None)
    assert (outcome.skipped, outcome.ran, outcome.failed) == (2, 1, 0) and calls == ["liar"]
    assert all(r["status"] == "ok" for r in read_records(out / "results.jsonl").values())
    assert "failed |" not in (out / "results.md").read_text()


@pytest.mark.slow
def test_metric_callable_and_error_plot_ratio(tmp_path, llama_dir, texts):
    data = grid_dict(
        llama_dir,
        texts,
        methods=("none", {"method": "ls", "damp": 0.01}),
        evaluation={"metrics": [{"callable": "tests.core.sweep.test_sweep:param_count", "options": {"scale": 2.0}}]},
        plots={"error_ratio": 0.2},
        dense=False,
    )
    grid = write_grid(tmp_path / "grid.yaml", data)
    out = tmp_path / "out"
    run_sweep(grid, out, log=lambda _m: None)
    records = lines(out / "results.jsonl")
    assert len(records) == 4 and all("params_k" in r["metrics"] and "perplexity" not in r["metrics"] for r in records)
    md = (out / "results.md").read_text()
    assert "| criterion | ratio | none | ls (damp=0.01) |" in md and "| dense |" not in md
    names = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert names == ["layer-errors-llama-magnitude-r0.2.png", "params_k-vs-ratio-llama-magnitude.png"]


def _bad(llama_dir, texts, change) -> dict:
    data = grid_dict(llama_dir, texts)
    change(data)
    return data


BAD_GRIDS = [
    (lambda d: d.update(extra_key=1), "extra_key: unknown key"),
    (lambda d: d["grid"].update(damp=[0.1]), "grid.damp: unknown axis"),
    (lambda d: d["grid"].update(ratio=[]), "grid.ratio: an empty list"),
    (lambda d: d["grid"].update(reconstruction=[]), "grid.reconstruction: an empty list"),
    (lambda d: d["grid"].update(ratio=[0.2, 1.5]), "grid.ratio: ratio 1.5 is not strictly between 0 and 1"),
    (lambda d: d["grid"].update(ratio=[0.0]), "ratio 0.0 is not strictly between 0 and 1"),
    (lambda d: d["grid"].update(ratio=[0.2, 0.2]), "duplicated ratios"),
    (lambda d: d["grid"].update(reconstruction=["liar", "liar"]), "grid.reconstruction: duplicated entries"),
    (lambda d: d["grid"].update(reconstruction=["none", "magic"]), "unknown reconstruction method 'magic'"),
    (lambda d: d["grid"].update(criterion=["nonsense"]), "unknown criterion 'nonsense'"),
    (lambda d: d["grid"]["criterion"].append({"name": "magnitude", "bogus": 1}), "grid.criterion.1.bogus: unknown key"),
    (lambda d: d["base"]["calibration"].update(dataset="/no/such/file.txt"), "recipe.calibration"),
    (lambda d: d["base"].update(modules="everything"), "recipe.modules"),
    (lambda d: d["grid"].update(model=["/no/such/model"]), "model path '/no/such/model' does not exist"),
    (lambda d: d.update(evaluation={}), "evaluation needs 'perplexity' and/or 'metrics'"),
    (lambda d: d["evaluation"]["perplexity"].update(text="/no/eval.txt"), "evaluation.perplexity.text"),
    (lambda d: d["evaluation"].update(metrics=["no_such_module:f"]), "cannot import 'no_such_module'"),
    (lambda d: d.update(plots={"error_ratio": 0.3}), "plots.error_ratio: 0.3 is not one of the grid's ratios"),
    (lambda d: d.pop("evaluation"), "evaluation: Field required"),
]


@pytest.mark.parametrize("change,message", BAD_GRIDS, ids=[m for _, m in BAD_GRIDS])
def test_bad_grid_is_refused_before_anything_runs(change, message, tmp_path, llama_dir, texts, count_prunes):
    grid = write_grid(tmp_path / "grid.yaml", _bad(llama_dir, texts, change))
    out = tmp_path / "out"
    with pytest.raises(GridError) as info:
        run_sweep(grid, out, log=lambda _m: None)
    assert message in str(info.value), str(info.value)
    assert count_prunes == [] and not out.exists()


def test_bad_cell_error_names_the_cell_and_counts_the_others(tmp_path, llama_dir, texts):
    grid = write_grid(
        tmp_path / "grid.yaml", _bad(llama_dir, texts, lambda d: d["grid"].update(reconstruction=["none", "magic"]))
    )
    with pytest.raises(GridError) as info:
        load_grid(grid)
    assert info.value.problems == [
        "recipe.reconstruction.method: unknown reconstruction method 'magic'; choose one of "
        "['bias', 'liar', 'ls', 'mask_tuning', 'none'] (cell llama / magnitude / magic / ratio 0.2 and 1 more)"
    ]


@pytest.mark.slow
def test_cli_sweep(tmp_path, llama_dir, texts, capsys):
    bad = write_grid(tmp_path / "bad.yaml", _bad(llama_dir, texts, lambda d: d["grid"].update(ratio=[2])))
    assert cli_main(["sweep", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert (
        "liar: error: invalid grid:\n  grid.ratio: ratio 2.0 is not strictly between 0 and 1" in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()

    good = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts, ratios=(0.3,), methods=("bias",)))
    assert cli_main(["sweep", str(good), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    assert "2 cells; the grid is valid" in capsys.readouterr().out and not (tmp_path / "o").exists()
    assert cli_main(["sweep", str(good), "--out", str(tmp_path / "o")]) == 0
    assert "2 cells: 0 finished earlier, 2 to run" in capsys.readouterr().out
    assert cli_main(["sweep", str(good), "--out", str(tmp_path / "o")]) == 0
    assert "2 cells: 2 finished earlier, 0 to run" in capsys.readouterr().out
    (tmp_path / "o" / "results.md").unlink()
    assert cli_main(["sweep", str(good), "--out", str(tmp_path / "o"), "--report-only"]) == 0
    assert (tmp_path / "o" / "results.md").exists()


@pytest.mark.slow
def test_isolated_cells_run_in_subprocesses(tmp_path, llama_dir, texts):
    data = grid_dict(llama_dir, texts, ratios=(0.3,), methods=("liar",), dense=False)
    grid = write_grid(tmp_path / "grid.yaml", data)
    out = tmp_path / "out"
    outcome = run_sweep(grid, out, isolate=True, log=lambda _m: None)
    assert (outcome.ran, outcome.failed) == (1, 0)
    (record,) = lines(out / "results.jsonl")
    assert record["status"] == "ok" and record["metrics"]["perplexity"] > 1 and record["layers"]
    assert (out / "logs" / f"{record['id']}.log").is_file()


def test_grid_spec_and_its_validation_do_not_import_torch(tmp_path, llama_dir, texts):
    import subprocess
    import sys

    grid = write_grid(tmp_path / "grid.yaml", grid_dict(llama_dir, texts))
    code = (
        "import sys, core.sweep, core.sweep.records\n"
        "from core.spec.sweep import load_grid\n"
        f"assert len(load_grid({str(grid)!r}).cells) == 5\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_job_evaluation_and_grid_perplexity_are_one_schema(tmp_path, texts):
    from pydantic import ValidationError

    from core.spec.errors import validation_message
    from core.spec.evaluation import EvaluationSpec, JobEvaluation

    _, evaluation = texts
    job = JobEvaluation.model_validate({"type": "perplexity", "dataset": str(evaluation), "seq_len": 32})
    assert job.model_dump(by_alias=True) == {
        "dataset": str(evaluation),
        "seq_len": 32,
        "max_windows": None,
        "batch_size": 4,
        "type": "perplexity",
    }
    grid = EvaluationSpec.model_validate({"perplexity": {"text": str(evaluation), "seq_len": 32}})
    assert grid.perplexity.text == job.text and grid.perplexity.seq_len == job.seq_len and grid.metric == "perplexity"
    for change, message in (
        ({"seq_len": 1}, "seq_len: Input should be greater than or equal to 2"),
        ({"max_windows": 0}, "max_windows: Input should be greater than 0"),
        ({"text": str(tmp_path / "missing.txt")}, "is neither a named set"),
    ):
        with pytest.raises(ValidationError) as in_grid:
            EvaluationSpec.model_validate({"perplexity": {"text": str(evaluation), **change}})
        job_change = {"dataset" if k == "text" else k: v for k, v in change.items()}
        with pytest.raises(ValidationError) as in_job:
            JobEvaluation.model_validate({"dataset": str(evaluation), **job_change})
        assert message in validation_message(in_grid.value) and message in validation_message(in_job.value)
    with pytest.raises(ValidationError, match="text"):
        JobEvaluation.model_validate({"text": "wikitext2"})  # the job format names it 'dataset'


def test_expand_grid_gives_the_recipes_of_the_grid_file(llama_dir, texts):
    data = grid_dict(llama_dir, texts, methods=("none", {"method": "ls", "damp": 0.01}))
    sweep = parse_grid(data)
    base = {**data["base"], "model": str(llama_dir)}
    axes = {k: v for k, v in data["grid"].items() if k != "model"}
    assert [c.recipe for c in expand_grid(base, axes)] == [c.recipe for c in sweep.prune_cells]
    with pytest.raises(GridError, match="grid.ratio: ratio 1.5 is not strictly between 0 and 1"):
        expand_grid(base, {"ratio": [1.5]})
    with pytest.raises(GridError, match="grid.colour: unknown key"):
        expand_grid(base, {"colour": ["red"]})


def test_pruned_model_with_uneven_widths_generates_with_kv_cache(llama_dir, corpus):
    """Layers of different widths, one of them gathering key/value heads through its index (uneven GQA
    groups): cached greedy decoding must equal recomputing the whole sequence at every step."""
    # heads at the layer's ratio: 2 of 8 go, leaving uneven key/value groups (the case under test)
    result = pipeline.prune(recipe_for(llama_dir, corpus, ratio=0.3, head_ratio="same"))
    model = result.model.eval()
    layers = result.adapter.layers(model)
    assert len({layer.mlp.down_proj.in_features for layer in layers}) > 1
    indexed = [
        layer.self_attn
        for layer in layers
        if layer.self_attn.num_key_value_groups == 1
        and len(layer.self_attn.liar_heads) != len(layer.self_attn.liar_kv_heads)
    ]
    assert indexed and all(hasattr(a, "liar_kv_index") for a in indexed)
    ids = torch.tensor([[5, 9, 12, 7, 20, 31, 8]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        seq = ids
        for _ in range(6):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert out.shape == (1, 13)
    assert torch.equal(out, seq)


def test_grid_size_is_bounded(llama_dir, texts):
    ratios = [round(0.0001 * i, 4) for i in range(1, 501)]
    with pytest.raises(GridError, match="1001 cells exceed the limit of 1000"):
        parse_grid(grid_dict(llama_dir, texts, ratios=ratios, methods=("none", "liar")))


def test_cells_share_scores_across_ratios_only_for_a_named_criterion():
    """Scores are cached per model, criterion and calibration; criterion auto picks its criterion by
    the ratio (and the other fields it reads), so its cells key by them too."""
    from core.sweep.run import _scores_key

    base = {"model": "m", "calibration": {"dataset": "wikitext2"}, "allocation": "auto"}
    for crit in (None, {"name": "auto", "options": {}}):
        auto = base | ({"criterion": crit} if crit else {})
        assert _scores_key(auto | {"ratio": 0.2}) != _scores_key(auto | {"ratio": 0.5})
    named = base | {"criterion": {"name": "flap", "options": {}}}
    assert _scores_key(named | {"ratio": 0.2}) == _scores_key(named | {"ratio": 0.5})
