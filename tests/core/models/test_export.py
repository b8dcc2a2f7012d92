"""Exported checkpoints reload — with this project, and in a Python where it cannot be imported."""

import json
import select
import subprocess
import sys
import textwrap

import pytest
import torch

from core import load_pruned, prune
from tests.conftest import NEW_FAMILIES, fast_first, recipe_for

# A child interpreter in which `import core` fails: proves the checkpoint carries its own code. It
# imports torch and transformers once and forks a fresh child per checkpoint (which loads it with
# only those two imported: nothing of an earlier reload survives into the next), answering one JSON
# line per request line — a new interpreter per reload spent ~3 s of each on the imports. The
# submodules transformers imports lazily to load a model and a tokenizer (its generic machinery,
# no model family's code) are imported once here too: each child spent ~1.8 s importing them.
RELOAD_SERVER = textwrap.dedent(
    """
    import builtins, json, os, sys, traceback
    sys.modules["core"] = None  # this project is not importable here
    import torch
    import transformers
    import transformers.modeling_utils
    import transformers.models.auto.modeling_auto
    import transformers.models.auto.tokenization_auto
    import transformers.tokenization_utils_fast
    from transformers.utils import logging
    logging.set_verbosity_error()

    def reload(path, auto, trust, ids, mask):
        asked = []  # transformers asks on stdin whether to trust remote code it was not told to trust
        builtins.input = lambda *a: asked.append(a) or "n"
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)  # as users load it: no trust_remote_code
        cls = getattr(transformers, auto)
        model = cls.from_pretrained(path, trust_remote_code=trust, dtype=torch.float32).eval()
        with torch.no_grad():
            out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        return {"logits": out.logits.tolist(), "class": type(model).__name__,
                "module": type(model).__module__, "asked": len(asked), "tokenizer": type(tokenizer).__name__}

    for line in sys.stdin:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one reload, its answer through the pipe
            os.close(read)
            try:
                answer = reload(**json.loads(line))
            except BaseException:
                answer = {"error": traceback.format_exc()}
            with os.fdopen(write, "w") as f:
                f.write(json.dumps(answer))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            answer = f.read()
        _, status = os.waitpid(pid, 0)
        print(answer if answer else json.dumps({"error": f"the child died (status {status})"}), flush=True)
    """
)


class Reloader:
    """The reload server (:data:`RELOAD_SERVER`) in a minimal environment, working in ``directory``."""

    def __init__(self, directory):
        script = directory / "reload_server.py"
        script.write_text(RELOAD_SERVER)
        env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HF_HOME": str(directory / "hf")}
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        self.proc = subprocess.Popen([sys.executable, str(script)], cwd=directory, env=env, **pipes)

    def reload(self, path, auto, trust, ids, mask, timeout=300):
        request = {"path": str(path), "auto": auto, "trust": trust, "ids": ids.tolist(), "mask": mask.tolist()}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no answer from the reload server in {timeout} s"
        answer = json.loads(self.proc.stdout.readline())
        assert "error" not in answer, answer["error"][-3000:]
        return answer

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def reloader(tmp_path_factory):
    server = Reloader(tmp_path_factory.mktemp("reload"))
    yield server
    server.close()


def _batch(tokenizer):
    enc = tokenizer(
        ["the model keeps a head.", "least square error of the pruned layer output is small."],
        padding=True,
        return_tensors="pt",
    )
    return enc["input_ids"], enc["attention_mask"]


CASES = {
    # (fixture, auto class, recipe overrides, expect stock architecture)
    "llama-gqa-irregular": ("llama_dir", "AutoModelForCausalLM", {"ratio": 0.4, "allocation": "global"}, False),
    "qwen2-bias": ("qwen2_dir", "AutoModelForCausalLM", {"ratio": 0.3}, False),
    "bert-classifier": ("bert_dir", "AutoModelForSequenceClassification", {"ratio": 0.3}, False),
    "llama-uniform-neurons": ("llama_dir", "AutoModelForCausalLM", {"ratio": 0.2, "modules": "neurons"}, True),
    "bert-neurons": ("bert_dir", "AutoModelForSequenceClassification", {"ratio": 0.2, "modules": "neurons"}, True),
    # uniform MHA heads: 4 of 8 divide the hidden size 64 → stock; 5 of 8 do not, and transformers refuses
    # such a stock LLaMA config (as 26 of LLaMA-7B's 32 heads after 20%), so it is written as liar_
    "llama-mha-heads-dividing": (
        "llama_mha_dir",
        "AutoModelForCausalLM",
        {"ratio": 0.3, "modules": "heads", "round_to": {"heads": 4}},
        True,
    ),
    "llama-mha-heads-not-dividing": (
        "llama_mha_dir",
        "AutoModelForCausalLM",
        {"ratio": 0.2, "modules": "heads"},
        False,
    ),
    # heads and neurons pruned uniformly in whole key/value groups: a stock GQA checkpoint
    "llama-gqa-whole-groups": (
        "llama_dir",
        "AutoModelForCausalLM",
        {"ratio": 0.5, "head_ratio": "same", "round_to": {"kv_groups": "whole"}},
        True,
    ),
}
# the family template: every family reloads in both forms (non-uniform widths per layer, and stock).
# These families' stock configs cannot switch on an FFN bias, so the stock case reconstructs without
# one (mask tuning); LIAR's FFN bias makes the liar_ form.
for _family in ["mistral", *NEW_FAMILIES]:
    CASES[f"{_family}-global"] = (
        f"{_family}_dir",
        "AutoModelForCausalLM",
        {"ratio": 0.3, "allocation": "global"},
        False,
    )
    CASES[f"{_family}-uniform-neurons"] = (
        f"{_family}_dir",
        "AutoModelForCausalLM",
        {"ratio": 0.2, "modules": "neurons", "reconstruction": {"method": "mask_tuning"}},
        True,
    )
    if _family != "opt":  # grouped-query attention: whole groups make uniform heads a stock checkpoint too
        CASES[f"{_family}-whole-groups"] = (
            f"{_family}_dir",
            "AutoModelForCausalLM",
            # half the heads: a count that divides the hidden size, as the stock configs need
            {
                "ratio": 0.5,
                "head_ratio": "same",
                "round_to": {"kv_groups": "whole"},
                "reconstruction": {"method": "mask_tuning"},
            },
            True,
        )


def _assert_explicit_widths(cfg: dict, result) -> None:
    """What a serving engine reads from a stock config.json: head counts, head size (GQA families) and
    FFN width, all those of the pruned model."""
    fam, lp = result.adapter.family, result.plan.layers[0]
    assert cfg["num_attention_heads"] == len(lp.heads)
    assert cfg[fam.ffn_width_key] == len(lp.neurons)
    if fam.gqa:
        assert cfg["num_key_value_heads"] == len(lp.kv_heads)
        assert cfg["head_dim"] == result.adapter.head_dim


@pytest.mark.parametrize("case", fast_first(4, CASES))  # fast: both forms, GQA and an encoder
def test_reload_without_project_gives_same_logits(case, request, corpus, tmp_path, reloader):
    fixture, auto, overrides, stock = CASES[case]
    result = prune(recipe_for(request.getfixturevalue(fixture), corpus, **overrides))
    out = result.save(tmp_path / f"ckpt-{case}")  # its own name: the name of its remote-code module
    ids, mask = _batch(result.tokenizer)
    with torch.no_grad():
        expected = result.model(input_ids=ids, attention_mask=mask).logits
    cfg = json.loads((out / "config.json").read_text())
    assert ("liar_layout" in cfg) != stock and not cfg["model_type"].startswith("liar_")
    assert (out / "modeling_liar.py").exists() == (not stock)
    for name in ("recipe.yaml", "metrics.json", "README.md", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name
    serving = (out / "README.md").read_text().split("## Serving")[1].split("## Metrics")[0]
    assert ("`vllm serve PATH`" in serving) == stock and ("trust_remote_code=True" in serving) != stock
    if cfg["model_type"] in ("llama", "mistral", "qwen2"):  # the engine forms core.serving writes of them
        assert "liar export PATH --format gguf" in serving and "liar export PATH --format vllm" in serving

    child = reloader.reload(out, auto, True, ids, mask)
    torch.testing.assert_close(torch.tensor(child["logits"]), expected, rtol=0, atol=1e-5)
    assert child["class"].startswith("Liar") != stock
    assert child["asked"] == 0 and child["tokenizer"]  # the tokenizer loaded without a trust prompt
    if stock:  # stock form: no remote code needed at all, and the config states every width
        _assert_explicit_widths(cfg, result)
        child = reloader.reload(out, auto, False, ids, mask)
        torch.testing.assert_close(torch.tensor(child["logits"]), expected, rtol=0, atol=1e-5)
        assert not child["class"].startswith("Liar")

    model, tok = load_pruned(out)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-5)
    assert tok is not None


def test_metrics_and_recipe_round_trip(llama_dir, corpus, tmp_path):
    from core.spec.recipe import Recipe

    result = prune(recipe_for(llama_dir, corpus))
    out = result.save(tmp_path / "ckpt")
    assert Recipe.load(out / "recipe.yaml") == result.recipe
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["achieved_ratio"] == pytest.approx(result.achieved_ratio, abs=1e-6)
    assert len(metrics["layers"]) == len(result.report) > 0
    assert "error_before" in metrics["layers"][0]
    card = (out / "README.md").read_text()
    assert "trust_remote_code=True" in card and "| layer | module |" in card


def test_save_refuses_non_empty_directory_and_leaves_it_alone(llama_dir, corpus, tmp_path):
    result = prune(recipe_for(llama_dir, corpus))
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not empty"):
        result.save(out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    result.save(out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert not list(tmp_path.glob(".ckpt.tmp-*"))


def test_pruning_a_pruned_checkpoint_is_refused_before_and_at_run_time(llama_dir, corpus, tmp_path):
    from core.pipeline.preflight import preflight

    out = prune(recipe_for(llama_dir, corpus)).save(tmp_path / "ckpt")
    again = recipe_for(out, corpus)
    with pytest.raises(ValueError, match="already pruned"):
        preflight(again)
    with pytest.raises(ValueError, match="already pruned"):
        prune(again)
    preflight(recipe_for(llama_dir, corpus))  # the original passes
