"""The `liar` command line: both prune forms, eval --json, and clean failures that write nothing."""

import json
import math
import os
import re

import pytest

from app.cli import main
from core.spec.recipe import Recipe


@pytest.fixture(autouse=True)
def engine_unconfigured():
    """The engine verbs configure the process as the liar command does (oneDNN route, malloc policy):
    each test leaves the pytest process as a library user's again."""
    from core.kernels import cpu_matmul
    from core.models import host_memory

    yield
    cpu_matmul.reset()
    host_memory.configure(False)


@pytest.fixture()
def calib_file(tmp_path, corpus):
    path = tmp_path / "calib.txt"
    path.write_text("\n\n".join(corpus))
    return path


def test_prune_with_flags_then_eval_json(llama_dir, calib_file, tmp_path, capsys):
    out = tmp_path / "pruned"
    code = main(
        [
            "prune",
            "--model",
            str(llama_dir),
            "--criterion",
            "magnitude",
            "--ratio",
            "0.5",
            "--reconstruction",
            "liar",
            "--calibration",
            str(calib_file),
            "--samples",
            "16",
            "--seq-len",
            "32",
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "saved to" in capsys.readouterr().out
    assert (out / "config.json").is_file()
    code = main(["eval", str(out), "--ppl", str(calib_file), "--seq-len", "32", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert math.isfinite(report["perplexity"]) and report["perplexity"] > 1
    assert report["seq_len"] == 32


def test_prune_from_recipe_file_with_override(llama_dir, calib_file, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model: {llama_dir}\nratio: 0.3\nreconstruction: {{method: ls}}\n"
        f"calibration: {{dataset: {calib_file}, num_calibration_samples: 8, max_seq_length: 32}}\n"
    )
    out = tmp_path / "pruned"
    flags = ["--ratio", "0.2", "--round-neurons", "8", "--kv-groups", "whole", "--select", "obs", "--head-ratio", "0.3"]
    assert main(["prune", str(recipe), *flags, "--output", str(out), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["target_ratio"] == 0.2 and summary["round_to_kv_groups"] == "whole"
    saved = Recipe.load(out / "recipe.yaml")
    assert saved.reconstruction.method == "ls" and saved.round_to.neurons == 8 and saved.round_to.kv_groups == "whole"
    assert saved.reconstruction.select == "obs" and saved.head_ratio == 0.3
    widths = [layer["neurons"] for layer in json.loads((out / "config.json").read_text())["liar_layout"]]
    assert all(w % 8 == 0 for w in widths)


@pytest.mark.slow
def test_select_auto_flag_overrides_a_recipe_and_resolves(llama_dir, calib_file, tmp_path, capsys):
    """--select auto (the default, offered as a flag too) undoes a recipe's select and resolves to obs
    before a least-squares refit."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model: {llama_dir}\nratio: 0.3\nreconstruction: {{method: ls, select: criterion}}\n"
        f"calibration: {{dataset: {calib_file}, num_calibration_samples: 8, max_seq_length: 32}}\n"
    )
    out = tmp_path / "pruned"
    assert main(["prune", str(recipe), "--select", "auto", "--output", str(out), "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert Recipe.load(out / "recipe.yaml").reconstruction.select == "obs"


@pytest.mark.slow
def test_activations_recompute_flag_is_recorded(llama_dir, calib_file, tmp_path, capsys):
    """--activations recompute reaches the recipe, and the run reports that it recomputed the FFN."""
    out = tmp_path / "pruned"
    args = ["prune", "--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file)]
    args += ["--samples", "8", "--seq-len", "32", "--activations", "recompute", "--output", str(out), "--json"]
    assert main([*args, "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert Recipe.load(out / "recipe.yaml").activations == "recompute"
    assert printed["activations"] == "recompute"


def test_activations_flag_reaches_the_recipe(calib_file, tmp_path):
    """The fast twin of the test above: the flag's path into the recipe, without a prune (the engine
    recording ``activations`` in its metrics is tests/core/models/test_offload.py's)."""
    from app.cli import build_parser
    from app.cli.prune import recipe_from_args

    argv = ["prune", "--model", str(tmp_path), "--ratio", "0.3", "--calibration", str(calib_file), "-o", "x"]
    assert recipe_from_args(build_parser().parse_args([*argv, "--activations", "recompute"])).activations == "recompute"
    assert recipe_from_args(build_parser().parse_args(argv)).activations != "recompute"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ratio", "1.5"], "ratio must lie strictly between 0 and 1"),
        (["--ratio", "0.3", "--reconstruction", "magic"], "unknown reconstruction method 'magic'"),
        (["--ratio", "0.3", "--seq-len", "4096"], "exceeds the model's limit"),
        (["--ratio", "0.3", "--model", "./missing-model"], "does not exist"),
        (["--ratio", "0.3", "--round-neurons", "0"], "round_to.neurons"),
        (["--ratio", "0.3", "--head-ratio", "1.2"], "head_ratio must be 'auto', 'same', 'obs' or a fraction in [0, 1)"),
        (["--ratio", "0.3", "--head-ratio", "obs", "--paper"], "head_ratio 'obs' chooses each layer's split"),
    ],
)
def test_bad_input_fails_cleanly_and_writes_nothing(flags, message, llama_dir, calib_file, tmp_path, capsys):
    out = tmp_path / "never"
    args = [
        "prune",
        "--model",
        str(llama_dir),
        "--calibration",
        str(calib_file),
        "--samples",
        "4",
        "--seq-len",
        "16",
        "--output",
        str(out),
        "--quiet",
    ]
    code = main(args + flags)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not out.exists()
    assert not list(tmp_path.glob(".never*"))


def test_empty_calibration_file(llama_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code = main(
        [
            "prune",
            "--model",
            str(llama_dir),
            "--ratio",
            "0.3",
            "--calibration",
            str(empty),
            "--output",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2 and "is empty" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_refuses_non_empty_output_before_work(llama_dir, calib_file, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "x").write_text("keep me")
    code = main(
        ["prune", "--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file), "--output", str(out)]
    )
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert (out / "x").read_text() == "keep me"


def test_missing_required_flags(tmp_path, capsys):
    assert main(["prune", "--output", str(tmp_path / "o")]) == 2
    assert "give a recipe file or at least --model, --ratio or --speedup, --calibration" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "liar" in out and "held-out ppl" in out
    assert (tmp_path / "pruned-liar" / "config.json").is_file()


# --- liar eval --tasks (lm-eval on offline local tasks) -------------------------------------------


@pytest.fixture()
def lm_task_dir(tmp_path, corpus):
    from core.evaluation.lmeval import write_rt_sentiment_task, write_wiki_cloze_task

    d = tmp_path / "tasks"
    reviews = [{"text": t, "label": i % 2} for i, t in enumerate(["good fun film", "bad dull plot", "great story"])]
    write_rt_sentiment_task(d, reviews)
    write_wiki_cloze_task(d, corpus[:4], items_per_passage=2)
    return d


@pytest.mark.slow
def test_eval_tasks_on_saved_pruned_checkpoint(llama_dir, corpus, lm_task_dir, calib_file, tmp_path, capsys):
    from core import prune
    from core.evaluation.lmeval import evaluate_lm_eval
    from core.models.loading import load_model
    from tests.conftest import recipe_for

    ckpt = prune(recipe_for(llama_dir, corpus, ratio=0.5)).save(tmp_path / "pruned")
    raw_file = tmp_path / "raw.json"
    args = ["eval", str(ckpt), "--tasks", "rt_sentiment,wiki_cloze", "--task-dir", str(lm_task_dir), "--limit", "4"]
    assert main([*args, "--json", "--results", str(raw_file)]) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)  # stdout is only the JSON object
    assert set(report["tasks"]) == {"rt_sentiment", "wiki_cloze"}
    assert all(0.0 <= m["acc"] <= 1.0 for m in report["tasks"].values())
    raw = json.loads(raw_file.read_text())
    assert raw["n-samples"]["rt_sentiment"]["effective"] == 3 and raw["n-samples"]["wiki_cloze"]["effective"] == 4
    # the same numbers as the Python API on the reloaded checkpoint
    model, tok, _ = load_model(str(ckpt), "float32", "cpu")
    api = evaluate_lm_eval(model, tok, ["rt_sentiment", "wiki_cloze"], task_dir=lm_task_dir, limit=4)
    assert report["tasks"] == api["summary"]
    assert report["parameters"] == api["parameters"]
    # read block by block (a model bigger than the device): the same scores, the model read once
    assert main([*args, "--stream", "--json"]) == 0, capsys.readouterr().err
    streamed = json.loads(capsys.readouterr().out)
    assert streamed["tasks"].keys() == report["tasks"].keys() and streamed["model_reads"] == 1
    for task, metrics in report["tasks"].items():
        assert streamed["tasks"][task] == pytest.approx(metrics)
    assert streamed["parameters"] == report["parameters"]
    # text output, together with perplexity
    assert main([*args, "--ppl", str(calib_file), "--seq-len", "32", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and re.search(r"wiki_cloze: acc \d\.\d{4} ± \d\.\d{4}, acc_norm", out)


def test_eval_unknown_task_fails_cleanly(llama_dir, lm_task_dir, capsys):
    code = main(["eval", str(llama_dir), "--tasks", "rt_sentiment,no_such_task", "--task-dir", str(lm_task_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "unknown task 'no_such_task'" in err and "Traceback" not in err
    assert "local tasks in" in err and "'rt_sentiment'" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "nothing to evaluate"),
        (["--task-dir", "."], "--task-dir needs --tasks"),
        (["--tasks", "rt_sentiment", "--task-dir", "/no/such/dir"], "task directory '/no/such/dir' does not exist"),
        (["--tasks", "wiki_cloze"], "'wiki_cloze' is a local task but no wiki_cloze.yaml was found (no --task-dir"),
    ],
)
def test_eval_argument_errors(flags, message, llama_dir, capsys):
    assert main(["eval", str(llama_dir), *flags]) == 2
    assert message in capsys.readouterr().err


def test_eval_limit_must_be_positive(llama_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(llama_dir), "--tasks", "rt_sentiment", "--limit", "0"])
    assert exc.value.code == 2 and "--limit: must be positive" in capsys.readouterr().err


def test_dry_run_checks_what_the_model_config_tells(llama_dir, calib_file, tmp_path, capsys):
    base = ["prune", "--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file)]
    out = ["--output", str(tmp_path / "never"), "--dry-run"]
    assert main([*base, "--seq-len", "100000", *out]) == 2
    assert "exceeds the model's limit" in capsys.readouterr().err
    assert main([*base, "--seq-len", "32", *out]) == 0
    printed = Recipe.from_yaml(capsys.readouterr().out)
    assert printed.calibration.max_seq_length == 32
    # the default criterion as it will run on this decoder at 30%: obs counts, globally ranked
    assert (printed.criterion.name, printed.allocation) == ("obs", "global")
    assert not (tmp_path / "never").exists()


def test_dry_run_of_a_labelled_classifier_shows_its_default(bert_dir, corpus, tmp_path, capsys):
    """--label-field makes the calibration labelled: a sequence classifier's default is then Kwon et al.'s
    Fisher search with its own units."""
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(json.dumps({"text": t, "label": i % 2}) for i, t in enumerate(corpus)))
    base = ["prune", "--model", str(bert_dir), "--ratio", "0.5", "--calibration", str(data)]
    base += ["--output", str(tmp_path / "never"), "--dry-run"]
    assert main([*base, "--label-field", "label"]) == 0
    printed = Recipe.from_yaml(capsys.readouterr().out)
    assert printed.calibration.label_field == "label"
    assert (printed.criterion.name, printed.allocation, printed.reconstruction.select) == (
        "kwon",
        "global",
        "criterion",
    )
    assert main(base) == 0  # no labels: the unlabelled encoder default
    printed = Recipe.from_yaml(capsys.readouterr().out)
    assert (printed.criterion.name, printed.allocation) == ("magnitude", "uniform")


@pytest.mark.slow
def test_prune_streams_by_default_and_ppl_matches_eval(llama_dir, calib_file, tmp_path, capsys):
    """liar prune streams a model read from a directory; its --ppl (block by block) equals liar eval's
    in memory and liar eval --stream's on the saved checkpoint. The command configured the engine for
    its process (LIAR_CPU_MATMUL's default, auto; the malloc policy), as a library call does not."""
    from core.kernels import cpu_matmul
    from core.models import host_memory

    out = tmp_path / "pruned"
    flags = ["--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file), "--samples", "8"]
    flags += ["--seq-len", "24", "--device", "cpu", "--output", str(out), "--quiet", "--json"]
    assert main(["prune", *flags, "--ppl", str(calib_file)]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["execution"] == "stream"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["execution"] == "stream" and metrics["perplexity"] == summary["perplexity"]
    assert (out / "SHA256SUMS").is_file()
    evals = []
    for extra in ([], ["--stream"]):
        assert main(["eval", str(out), "--ppl", str(calib_file), "--seq-len", "24", "--json", *extra]) == 0
        evals.append(json.loads(capsys.readouterr().out)["perplexity"])
    assert evals[0] == pytest.approx(summary["perplexity"], rel=1e-5)
    assert evals[1] == pytest.approx(summary["perplexity"], rel=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.txt", "pruned"]  # no temporary left
    requested = (os.environ.get("LIAR_CPU_MATMUL") or "auto").strip().lower()
    assert cpu_matmul.decision().requested == requested and host_memory.tunes()


def test_an_unknown_cpu_matmul_choice_fails_in_one_sentence(llama_dir, monkeypatch, capsys):
    monkeypatch.setenv("LIAR_CPU_MATMUL", "mkl")
    assert main(["eval", str(llama_dir), "--ppl", "wikitext2"]) == 2
    err = capsys.readouterr().err
    assert "LIAR_CPU_MATMUL must be one of auto, onednn, blas, not 'mkl'" in err and "Traceback" not in err


@pytest.mark.slow
def test_stream_refuses_whole_model_gradient_criteria(llama_dir, calib_file, tmp_path, capsys):
    flags = ["--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file), "--samples", "8"]
    flags += ["--criterion", "snip", "--execution", "stream", "--output", str(tmp_path / "out"), "--quiet"]
    assert main(["prune", *flags]) == 2
    err = capsys.readouterr().err
    assert "needs gradients of the whole model" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert main(["eval", str(llama_dir), "--stream", "--tasks", "x"]) == 2  # names checked before reading
    assert "unknown task 'x'" in capsys.readouterr().err


def test_default_recipe_and_the_paper_flag(llama_dir, calib_file, tmp_path, capsys):
    """The default reconstruction is ls with reconstruction-aware selection (recorded resolved in the
    checkpoint's recipe) and heads pruned at half the ratio; --paper gives the paper's LIAR with the
    criterion's units and heads at the layer's ratio."""
    common = ["--model", str(llama_dir), "--ratio", "0.3", "--calibration", str(calib_file), "--samples", "8"]
    common += ["--seq-len", "32", "--quiet"]
    assert main(["prune", *common, "--output", str(tmp_path / "default")]) == 0
    saved = Recipe.load(tmp_path / "default" / "recipe.yaml")
    assert (saved.reconstruction.method, saved.reconstruction.select, saved.head_ratio) == ("ls", "obs", "auto")
    assert main(["prune", *common, "--paper", "--output", str(tmp_path / "paper")]) == 0
    saved = Recipe.load(tmp_path / "paper" / "recipe.yaml")
    assert (saved.reconstruction.method, saved.reconstruction.select, saved.head_ratio) == ("liar", "criterion", "same")
    capsys.readouterr()


# --- serving forms: --export / the recipe's export -----------------------------------------------


@pytest.fixture(scope="module")
def bpe_models(tmp_path_factory):
    """A tiny LLaMA GGUF export can write (byte-level BPE tokenizer), an OPT it cannot, and a Gemma 3 it can
    write only when the prune keeps one width in every layer and adds no bias."""
    from core.models.tiny import tiny_decoder

    base = tmp_path_factory.mktemp("bpe_models")
    return {
        "llama": tiny_decoder(base / "llama", tokenizer="bpe"),
        "opt": tiny_decoder(base / "opt", family="opt", tokenizer="bpe"),
        "gemma3": tiny_decoder(base / "gemma3", family="gemma3", tokenizer="bpe"),
    }


def _prune_args(model, calib_file, out, *extra) -> list[str]:
    return [
        "prune",
        "--model",
        str(model),
        "--ratio",
        "0.3",
        "--calibration",
        str(calib_file),
        "--samples",
        "8",
        "--seq-len",
        "32",
        "--output",
        str(out),
        "--quiet",
        *extra,
    ]


def test_prune_writes_the_serving_forms_after_saving(bpe_models, calib_file, tmp_path, capsys):
    from core.models.manifest import read_manifest

    out = tmp_path / "pruned"
    code = main(_prune_args(bpe_models["llama"], calib_file, out, "--export", "gguf-f16", "--json"))
    assert code == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    gguf = out / "pruned-f16.gguf"
    assert report["export"] == {"gguf-f16": str(gguf)} and report["export_failed"] == {}
    assert gguf.read_bytes()[:4] == b"GGUF" and gguf.name in {e.name for e in read_manifest(out)}
    assert Recipe.from_yaml((out / "recipe.yaml").read_text()).export == ["gguf-f16"]


def test_prune_refuses_a_model_it_cannot_export_before_pruning(bpe_models, calib_file, tmp_path, capsys):
    out = tmp_path / "never"
    for dry_run in ((), ("--dry-run",)):
        code = main(_prune_args(bpe_models["opt"], calib_file, out, "--export", "gguf-f16", *dry_run))
        err = capsys.readouterr().err
        families = "GGUF export writes the LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (text) and Phi-3 families"
        assert code == 2 and f"{families}; this checkpoint is OPT" in err
        assert "Traceback" not in err and not out.exists()
    code = main(_prune_args(bpe_models["llama"], calib_file, out, "--export", "gguf-f5"))
    assert code == 2 and "'gguf-f5' is not a serving form; choose from gguf-f16" in capsys.readouterr().err


def test_prune_refuses_a_recipe_whose_checkpoint_llama_cpp_cannot_hold_before_pruning(
    bpe_models, calib_file, tmp_path, capsys
):
    """Gemma 3's llama.cpp architecture states one width for every layer and no bias on the attention output
    or the FFN: the default recipe (global allocation, a refit that adds biases) is refused before pruning,
    naming the settings that would work; with them the prune runs and writes the GGUF."""
    out = tmp_path / "never"
    for dry_run in ((), ("--dry-run",)):
        code = main(_prune_args(bpe_models["gemma3"], calib_file, out, "--export", "gguf-f16", *dry_run))
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and not out.exists()
        (line,) = [x for x in err.splitlines() if "llama.cpp's gemma3 architecture has one number of query heads" in x]
        assert line.endswith(
            "prune with allocation: uniform, round_to.kv_groups: whole and reconstruction.method none or mask_tuning"
        )
    out = tmp_path / "uniform"
    fits = ("--allocation", "uniform", "--kv-groups", "whole", "--reconstruction", "mask_tuning", "--json")
    code = main(_prune_args(bpe_models["gemma3"], calib_file, out, "--export", "gguf-f16", *fits))
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["export"] == {"gguf-f16": str(out / "uniform-f16.gguf")}


def test_prune_keeps_the_checkpoint_when_an_export_fails(bpe_models, calib_file, tmp_path, capsys, monkeypatch):
    import core.serving

    def refuse(checkpoint, forms, threads=2):
        raise core.serving.ExportError("no room for the GGUF")

    monkeypatch.setattr(core.serving, "export", refuse)
    out = tmp_path / "pruned"
    code = main(_prune_args(bpe_models["llama"], calib_file, out, "--export", "gguf-f16"))
    captured = capsys.readouterr()
    assert code == 1 and (out / "config.json").is_file() and "saved to" in captured.out
    assert "liar: warning: export gguf-f16 failed; the checkpoint is kept: no room for the GGUF" in captured.err


def test_the_export_flag_names_every_serving_form():
    """The help is written out (the CLI starts without pydantic): a form added to the recipe's list
    must be added to it too."""
    import argparse

    from app.cli.prune import add_recipe_flags
    from core.spec.recipe import EXPORT_FORMATS

    parser = argparse.ArgumentParser()
    add_recipe_flags(parser)
    (flag,) = [a for a in parser._actions if a.dest == "export"]
    assert all(form in flag.help for form in EXPORT_FORMATS)


# --- depth and speed targets ------------------------------------------------------------------------


def test_depth_flags_prune_blocks_and_print_the_span(tmp_path, calib_file, capsys):
    from core.models.tiny import tiny_decoder

    model = tiny_decoder(tmp_path / "deep", num_hidden_layers=6, intermediate_size=96)
    out = tmp_path / "o"
    code = main(
        ["prune", "--model", str(model), "--modules", "blocks", "--ratio", "0.34", "--calibration", str(calib_file)]
        + ["--samples", "8", "--seq-len", "16", "--holdout", "4", "--output", str(out), "--quiet"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "removed (2 of 6)" in printed
    import json

    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4


def test_speedup_flag_replaces_the_ratio(tmp_path, calib_file):
    from app.cli import build_parser
    from app.cli.prune import recipe_from_args

    args = build_parser().parse_args(
        [
            "prune",
            "--model",
            str(tmp_path),
            "--speedup",
            "1.5",
            "--workload",
            "prefill_b8x512",
            "--calibration",
            str(calib_file),
            "-o",
            "x",
        ]
    )
    recipe = recipe_from_args(args)
    assert recipe.ratio is None and (recipe.target.speedup, recipe.target.workload) == (1.5, "prefill_b8x512")
    args = build_parser().parse_args(
        [
            "prune",
            "--model",
            str(tmp_path),
            "--workload",
            "decode_b1",
            "--ratio",
            "0.2",
            "--calibration",
            "c4",
            "-o",
            "x",
        ]
    )
    with pytest.raises(ValueError, match="--workload goes with --speedup"):
        recipe_from_args(args)


def test_a_speed_up_beyond_reach_is_refused_before_any_work(tmp_path, calib_file, capsys):
    from core.models.tiny import tiny_decoder

    model = tiny_decoder(tmp_path / "deep", num_hidden_layers=6)
    out = tmp_path / "o"
    code = main(["prune", "--model", str(model), "--speedup", "9", "--calibration", str(calib_file), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "beyond what pruning at most 3 of 6 blocks" in err and "at most 5.71×" in err
    assert not out.exists() or not any(out.iterdir())
