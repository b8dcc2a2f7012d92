"""GGUF export of the families llama.cpp runs in their own architecture (Qwen3, Gemma 2, Gemma 3, Phi-3).

Each family's tiny model, dense and uniformly pruned, is loaded by llama.cpp and its logits compared with
transformers' float32 logits (the bounds of ``test_gguf``); what the architecture cannot state is refused
before a byte is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from core import prune
from core.models.tiny import tiny_bert, tiny_corpus, tiny_decoder
from core.serving.engines import call_llama_cpp
from core.serving.gguf_export import ExportError, export_gguf, plan
from tests.conftest import recipe_for
from tests.core.serving.crafted import crafted_checkpoint
from tests.core.serving.test_gguf import TOL, architecture, assert_same_logits

FAMILIES = ("qwen3", "gemma3", "phi3", "gemma2")
# what a uniform checkpoint whose architecture has no bias needs: the same widths in every layer, heads in
# whole key/value groups, a reconstruction that adds no bias
UNIFORM = dict(allocation="uniform", round_to={"kv_groups": "whole"}, reconstruction={"method": "none"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family → {"dense": folder, "uniform": folder}."""
    root = tmp_path_factory.mktemp("gguf-families")
    out = {}
    for fam in FAMILIES:
        extra = {"tie_word_embeddings": True} if fam == "gemma2" else {}  # llama.cpp's gemma2 ties them
        src = tiny_decoder(root / fam, family=fam, tokenizer="bpe", **extra)
        ckpt = prune(recipe_for(src, tiny_corpus(), ratio=0.4, **UNIFORM)).save(root / f"{fam}-uniform")
        out[fam] = {"dense": src, "uniform": ckpt}
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("form", ["dense", "uniform"])
def test_llama_cpp_logits_equal_transformers(models, family, form, tmp_path):
    ckpt = models[family][form]
    for quant in ("f32", "f16"):
        gguf = export_gguf(ckpt, tmp_path / f"m-{quant}.gguf", quant=quant)
        assert_same_logits(ckpt, gguf, tmp_path, TOL[quant])
    # a pruned Phi-3 has fewer query heads than llama.cpp's phi3 allows: it is LLaMA's computation
    expected = "llama" if (family, form) == ("phi3", "uniform") else family
    assert plan(ckpt).arch == expected == architecture(gguf)


def test_phi3_with_biases_and_unequal_groups_goes_through_deci(models, tmp_path):
    """Phi-3 is LLaMA's computation with fused projections: any pruned layout, biases included, is exact."""
    layout = [
        {"heads": [0, 1, 2, 5], "kv_heads": [0, 1, 2], "neurons": 5, "bias": ["mlp.down_proj"]},
        {"heads": [1, 3, 4, 5, 6, 7], "kv_heads": [0, 1, 2, 3], "neurons": 30, "bias": ["self_attn.o_proj"]},
    ]
    ckpt = crafted_checkpoint(models["phi3"]["dense"], tmp_path / "ckpt", layout, family="phi3")
    gguf = export_gguf(ckpt, tmp_path / "m.gguf", quant="f32")
    assert architecture(gguf) == "deci"
    assert_same_logits(ckpt, gguf, tmp_path, TOL["f32"])


def test_gemma_tokenizer_splits_text_as_transformers(models, tmp_path):
    """Gemma's tokenizer.json: SentencePiece-style BPE, spaces replaced by "▁" without one before the text,
    and a split at spaces (of which none are left) as its pre-tokenizer."""
    src = shutil.copytree(tiny_decoder(tmp_path / "src", family="gemma3", tokenizer="spm"), tmp_path / "gemma")
    spec = json.loads((src / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                             "invert": False}  # fmt: skip
    (src / "tokenizer.json").write_text(json.dumps(spec))
    gguf = export_gguf(src, tmp_path / "m.gguf", quant="f16")
    texts = ["The model layer 123 prunes 4567 heads.", "  two  spaces, and\nnew lines! ü €", "fast slow", "x"]
    got = call_llama_cpp({"op": "tokenize", "model": str(gguf), "texts": texts})["ids"]
    tok = AutoTokenizer.from_pretrained(src)
    assert got == [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert got[3] != tok(" x", add_special_tokens=False)["input_ids"]  # no "▁" before the text


def _refused(ckpt: Path, message: str) -> None:
    before = {p.name for p in ckpt.iterdir()}
    with pytest.raises(ExportError, match=message):
        export_gguf(ckpt, quant="f16")
    assert {p.name for p in ckpt.iterdir()} == before


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "gemma2"])
def test_what_the_architecture_cannot_state_is_refused(models, family, tmp_path):
    src = models[family]["dense"]
    uneven = [
        {"heads": [0, 1, 2, 3], "kv_heads": [0, 1], "neurons": 20, "bias": []},
        {"heads": list(range(8)), "kv_heads": [0, 1, 2, 3], "neurons": 48, "bias": []},
    ]
    biased = [{"heads": [0, 1, 4, 5], "kv_heads": [0, 2], "neurons": 20, "bias": ["mlp.down_proj"]}] * 2
    ckpt = crafted_checkpoint(src, tmp_path / "uneven", uneven, family=family)
    widths = "layers of different widths: re-prune with allocation: uniform, round_to.kv_groups: whole, "
    widths += "round_to.neurons: 1$"
    _refused(ckpt, f"llama.cpp's {family} architecture has one number of query heads, .*; this checkpoint has {widths}")
    ckpt = crafted_checkpoint(src, tmp_path / "biased", biased, family=family)
    bias = "the biases its reconstruction added: re-prune with reconstruction.method none or mask_tuning"
    _refused(ckpt, f"this checkpoint has {bias}")


def test_families_without_a_gguf_form_are_refused(models, tmp_path):
    opt = tiny_decoder(tmp_path / "opt", family="opt", tokenizer="bpe")
    bert = tiny_bert(tmp_path / "bert")
    families = "LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 \\(text\\) and Phi-3 families"
    _refused(opt, f"GGUF export writes the {families}; this checkpoint is OPT")
    _refused(bert, f"GGUF export writes the {families}; this checkpoint is BERT")
    untied = tiny_decoder(tmp_path / "gemma2", family="gemma2", tokenizer="bpe")  # lm_head of its own
    _refused(untied, "llama.cpp's gemma2 architecture soft-caps .* reads its output from the token embedding")
