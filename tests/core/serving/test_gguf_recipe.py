"""The GGUF architecture a recipe's checkpoint will have, known before any pruning (``core.serving.gguf_recipe``).

The check before pruning, the writer on the finished checkpoint and the model card take one decision
(``core.models.serving_forms.gguf_architecture``): each recipe here is pruned for real and the three are
compared. No llama.cpp is needed: the writer's decision is its plan (test_gguf_families loads the files).
"""

from __future__ import annotations

import shutil

import pytest

from core import prune
from core.models.serving_forms import SHARED
from core.models.tiny import tiny_corpus, tiny_decoder
from core.serving import ExportError, check_recipe, preflight
from core.serving.gguf_export import plan
from core.serving.gguf_recipe import check_recipe_gguf
from core.spec.recipe import Recipe
from tests.conftest import recipe_for

OWN = "llama.cpp's gemma3 architecture has one number of query heads, key/value heads and FFN width for all layers "
OWN += "and no bias on the attention output or the FFN; this recipe would give "
UNIFORM = dict(allocation="uniform", round_to={"kv_groups": "whole"})
# the default recipe: criterion auto (obs, allocation global at this ratio), a least-squares refit
DEFAULT = dict(criterion={"name": "auto"}, reconstruction={"method": "ls", "select": "auto"})


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-recipe")
    return {
        fam: tiny_decoder(root / fam, family=fam, tokenizer="bpe", **extra)
        for fam, extra in (
            ("gemma3", {}),
            ("qwen3", {}),
            ("phi3", {}),
            ("llama", {}),
            ("gemma2", {"tie_word_embeddings": True}),  # llama.cpp's gemma2 ties them
        )
    }


def _recipe(src, **kw) -> Recipe:
    return Recipe.model_validate(recipe_for(src, tiny_corpus(), export=["gguf-f16"], **kw))


def _decided(decide) -> str:
    try:
        return decide()
    except ExportError as exc:
        return f"refused: {str(exc).split(';')[0]}"  # the architecture's statement, not the checkpoint's part


CASES = {
    "gemma3-default": ("gemma3", DEFAULT),
    "gemma3-uniform-none": ("gemma3", {**UNIFORM, "reconstruction": {"method": "none"}}),
    "gemma3-uniform-mask_tuning": ("gemma3", {**UNIFORM, "reconstruction": {"method": "mask_tuning"}}),
    "gemma3-uniform-bias": ("gemma3", {**UNIFORM, "reconstruction": {"method": "bias"}}),
    "gemma2-uniform-liar": ("gemma2", {**UNIFORM}),
    "qwen3-uniform-none": ("qwen3", {**UNIFORM, "reconstruction": {"method": "none"}}),
    "qwen3-default": ("qwen3", DEFAULT),
    "phi3-default": ("phi3", DEFAULT),
    "phi3-neurons-uniform-none": ("phi3", {"modules": "neurons", "reconstruction": {"method": "none"}}),
    "llama-default": ("llama", DEFAULT),
}


@pytest.fixture(scope="module")
def pruned(sources, tmp_path_factory):
    """case → (recipe, its checkpoint)."""
    root = tmp_path_factory.mktemp("gguf-recipe-pruned")
    out = {}
    for case, (family, kw) in CASES.items():
        recipe = _recipe(sources[family], ratio=0.4, **kw)
        out[case] = recipe, prune(recipe).save(root / case)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_the_check_before_pruning_decides_as_the_writer_and_the_card(sources, pruned, case):
    family = CASES[case][0]
    recipe, ckpt = pruned[case]
    before = _decided(lambda: check_recipe_gguf(plan(sources[family]), recipe))
    after = _decided(lambda: plan(ckpt).arch)
    if before.startswith("refused"):
        assert after == before  # what the check refuses, the writer refuses for the same reason
    elif before in SHARED:
        assert after in SHARED  # llama or deci: decided by the kept heads' grouping, both write any layout
    else:
        assert after == before
    card = (ckpt / "README.md").read_text().split("## Serving")[1].split("## Metrics")[0]
    if after.startswith("refused"):
        assert f"this checkpoint has no GGUF form: {after.removeprefix('refused: ')}" in " ".join(card.split())
        assert "liar export PATH --format gguf" not in card
    else:
        assert f"`{after}` architecture" in card and "liar export PATH --format gguf" in card
    assert ("--format vllm" in card) == (family == "llama")  # vLLM's DeciLM form: LLaMA-like families only


def test_what_each_case_decides(sources, pruned):
    """The cases above cover both answers for each kind of family."""
    decided = {c: _decided(lambda c=c: plan(pruned[c][1]).arch) for c in CASES}
    assert decided["gemma3-uniform-none"] == decided["gemma3-uniform-mask_tuning"] == "gemma3"
    assert decided["qwen3-uniform-none"] == "qwen3"
    assert decided["phi3-neurons-uniform-none"] == "phi3" and decided["phi3-default"] in SHARED
    for case in ("gemma3-default", "gemma3-uniform-bias", "gemma2-uniform-liar", "qwen3-default"):
        assert decided[case].startswith("refused: llama.cpp's"), case


def test_a_refused_recipe_names_the_settings_that_would_work(sources):
    src = sources["gemma3"]  # 8 query heads over 4 key/value heads, an FFN of 48
    before = plan(src)
    for kw, message in (
        (
            {},  # the default recipe
            "layers of different widths and the biases its reconstruction adds: prune with allocation: uniform, "
            "round_to.kv_groups: whole and reconstruction.method none or mask_tuning",
        ),
        (
            {"allocation": "uniform", "round_to": {"neurons": 8}, "reconstruction": {"method": "none"}},
            "layers of different widths: prune with round_to.kv_groups: whole, round_to.neurons: 1",
        ),
        (UNIFORM, "the biases its reconstruction adds: prune with reconstruction.method none or mask_tuning"),
    ):
        recipe = Recipe.model_validate({"model": str(src), "ratio": 0.3, "calibration": {"texts": ["a b"]}, **kw})
        with pytest.raises(ExportError) as caught:
            check_recipe_gguf(before, recipe)
        assert str(caught.value) == OWN + message
    # a speed target (no ratio) resolves allocation auto at each candidate's ratio: global at the low ones
    target = {"model": str(src), "target": {"speedup": 1.5}, "calibration": {"texts": ["a b"]}}
    assert check_recipe_gguf(before, Recipe.model_validate({**target, **UNIFORM, "reconstruction": {"method": "none"}}))
    with pytest.raises(ExportError) as caught:
        check_recipe_gguf(before, Recipe.model_validate(target))
    assert str(caught.value) == OWN + (
        "layers of different widths and the biases its reconstruction adds: prune with allocation: uniform, "
        "round_to.kv_groups: whole and reconstruction.method none or mask_tuning"
    )


def test_what_does_not_change_the_widths_passes(sources, tmp_path):
    # whole blocks removed: the other blocks keep their widths, and no refit adds a bias
    blocks = Recipe.model_validate(
        {"model": str(sources["gemma3"]), "modules": "blocks", "ratio": 0.5, "calibration": {"texts": ["a b"]}}
    )
    assert check_recipe_gguf(plan(sources["gemma3"]), blocks) == "gemma3"
    # one key/value head: every kept query head reads it, so heads pruned one at a time keep one group size
    mqa = tiny_decoder(tmp_path / "mqa", family="gemma3", tokenizer="bpe", num_key_value_heads=1)
    free = _recipe(mqa, allocation="uniform", reconstruction={"method": "none"})
    assert free.round_to.kv_groups == "free" and check_recipe_gguf(plan(mqa), free) == "gemma3"
    grouped = _recipe(sources["gemma3"], allocation="uniform", reconstruction={"method": "none"})
    with pytest.raises(ExportError, match="layers of different widths: prune with round_to.kv_groups: whole$"):
        check_recipe_gguf(plan(sources["gemma3"]), grouped)


def test_a_partially_rotated_phi3_keeps_its_own_architecture_or_is_refused(tmp_path):
    """llama.cpp's phi3 rotates part of a head; a Phi-3 it cannot take (heads removed, widths differing,
    biases added) goes through llama/deci, which rotate all of it: refused before pruning."""
    src = tiny_decoder(tmp_path / "phi3", family="phi3", tokenizer="bpe", partial_rotary_factor=0.5)
    before = plan(src)
    assert (before.arch, before.n_rot, before.head_dim) == ("phi3", 4, 8)
    keeps = _recipe(src, modules="neurons", reconstruction={"method": "mask_tuning"})
    assert check_recipe_gguf(before, keeps) == "phi3"
    with pytest.raises(ExportError) as caught:
        check_recipe_gguf(before, _recipe(src, **DEFAULT))
    assert str(caught.value).startswith(
        "llama.cpp's phi3 architecture needs every query head, one width for all layers and no added bias, and its "
        "llama and deci ones, which take any other Phi-3, rotate every channel of a head while this model rotates "
        "4 of 8; this recipe would give query heads removed, layers of different widths and the biases its "
        "reconstruction adds: prune with modules: neurons, allocation: uniform, round_to.kv_groups: whole and "
        "reconstruction.method none or mask_tuning"
    )


def test_preflight_checks_the_recipe_and_check_recipe_reads_no_tokenizer(sources, tmp_path):
    src = shutil.copytree(sources["gemma3"], tmp_path / "gemma3")
    default, uniform = _recipe(src, **DEFAULT), _recipe(src, **UNIFORM, reconstruction={"method": "none"})
    preflight(src, ["gguf-f16"], recipe=uniform)
    preflight(src, ["gguf-f16"])  # the dense model itself is written as llama.cpp's gemma3
    for check in (lambda: preflight(src, ["gguf-f16"], recipe=default), lambda: check_recipe(default)):
        with pytest.raises(ExportError, match="^" + OWN):
            check()
    (src / "tokenizer.json").unlink()
    check_recipe(uniform)  # the recipe's part alone: no tokenizer read
    with pytest.raises(ExportError, match="tokenizer"):
        preflight(src, ["gguf-f16"], recipe=uniform)
    check_recipe(default.model_copy(update={"export": ["vllm"]}))  # no GGUF form asked: nothing to check
