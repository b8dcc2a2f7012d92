"""GGUF export against stock llama.cpp (llama-cpp-python in its own environment: `liar engines install`).

Every form the export writes is loaded by llama.cpp and its logits are compared with transformers'
float32 logits of the same checkpoint on the same tokens. An engine missing here fails these tests:
the export exists for llama.cpp, so they are never skipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from core import prune
from core.models.loading import load_pruned
from core.models.manifest import read_manifest
from core.models.tiny import tiny_corpus, tiny_decoder
from core.serving.engines import call_llama_cpp
from core.serving.gguf_export import ExportError, _pairwise, export_gguf, plan
from core.serving.layout import layer_shape
from tests.conftest import recipe_for
from tests.core.serving.crafted import crafted_checkpoint

TOKENS = [[2, 55, 301, 268, 311, 267, 68, 92, 277, 224, 20, 21, 40, 50, 60, 70], [7, 8, 9, 100, 200, 300]]
TOL = {"f32": 1e-3, "f16": 1e-2}  # max abs logit difference (the bound for f16 is 1e-2)


def engine_logits(gguf: Path, tmp_path: Path) -> np.ndarray:
    out = tmp_path / "logits.npy"
    call_llama_cpp({"op": "logits", "model": str(gguf), "tokens": TOKENS, "out": str(out)}, timeout=120)
    return np.load(out)


def reference_logits(checkpoint: Path) -> list[np.ndarray]:
    model, _ = load_pruned(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        return [model(torch.tensor([t])).logits[0].numpy() for t in TOKENS]


def assert_same_logits(checkpoint: Path, gguf: Path, tmp_path: Path, tol: float) -> None:
    got = engine_logits(gguf, tmp_path)
    for i, ref in enumerate(reference_logits(checkpoint)):
        diff = np.abs(got[i, : len(TOKENS[i])] - ref).max()
        assert diff <= tol, f"sequence {i}: llama.cpp differs from transformers by {diff:.2e} (> {tol})"


def architecture(gguf: Path) -> str:
    return call_llama_cpp({"op": "info", "model": str(gguf)})["metadata"]["general.architecture"]


@pytest.fixture(scope="module")
def bpe_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-src")
    return {fam: tiny_decoder(root / fam, family=fam, tokenizer="bpe") for fam in ("llama", "mistral", "qwen2")}


def _pruned(src: Path, out: Path, **recipe) -> Path:
    result = prune(recipe_for(src, tiny_corpus(), **recipe))
    return result.save(out)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("form", ["dense", "default", "uniform"])
def test_llama_cpp_logits_equal_transformers(bpe_models, family, form, tmp_path):
    src = bpe_models[family]
    if form == "dense":
        ckpt = src
    elif form == "default":  # the default recipe: global allocation, OBS selection, per-layer widths
        ckpt = _pruned(src, tmp_path / "ckpt", ratio=0.4, criterion={"name": "auto"}, reconstruction={"select": "auto"})
    else:  # one width for every layer, query heads in unequal groups over their key/value heads
        ckpt = _pruned(src, tmp_path / "ckpt", ratio=0.4, allocation="uniform")
    for quant in ("f32", "f16"):
        gguf = export_gguf(ckpt, tmp_path / f"m-{quant}.gguf", quant=quant)
        assert_same_logits(ckpt, gguf, tmp_path, TOL[quant])
    assert architecture(gguf) == plan(ckpt).arch
    if form == "dense":  # a stock LLaMA stays llama.cpp's `llama`; Qwen2 always goes through `deci`
        assert plan(ckpt).arch == ("deci" if family == "qwen2" else "llama")
    if form == "default":
        assert plan(ckpt).arch == "deci"


def test_unequal_groups_and_biases_are_exact(bpe_models, tmp_path):
    """Query heads 1,3,4,5,6,7 over key/value heads 0-3 (groups of 1, 1, 2, 2), one neuron left, added
    biases on both outputs: llama.cpp sees 6 key/value heads (each repeated to its group) and agrees."""
    layout = [
        {"heads": [0, 1, 2, 5], "kv_heads": [0, 1, 2], "neurons": 1, "bias": ["mlp.down_proj"]},
        {"heads": [1, 3, 4, 5, 6, 7], "kv_heads": [0, 1, 2, 3], "neurons": 7, "bias": ["self_attn.o_proj"]},
    ]
    ckpt = crafted_checkpoint(bpe_models["llama"], tmp_path / "ckpt", layout)
    p = plan(ckpt)
    assert [(x.n_head, x.n_kv, x.n_ff) for x in p.layers] == [(4, 4, 1), (6, 6, 7)]
    assert p.arch == "deci"
    gguf = export_gguf(ckpt, tmp_path / "m.gguf", quant="f32")
    assert architecture(gguf) == "deci"
    assert_same_logits(ckpt, gguf, tmp_path, TOL["f32"])


def test_scaled_rotary_goes_into_rope_freqs(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    src = tiny_decoder(tmp_path / "src", tokenizer="bpe", rope_parameters=rope)
    gguf = export_gguf(src, tmp_path / "m.gguf", quant="f32")
    assert_same_logits(src, gguf, tmp_path, TOL["f32"])


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_tokenizer_in_the_file_splits_text_as_transformers(kind, tmp_path):
    """Byte-level BPE (SmolLM2, LLaMA 3, Qwen2) and SentencePiece-style BPE (LLaMA 2, Mistral: "▁"
    spaces, byte fallback for characters outside the vocabulary, a beginning-of-sequence token)."""
    src = tiny_decoder(tmp_path / kind, family="mistral" if kind == "spm" else "llama", tokenizer=kind)
    gguf = export_gguf(src, tmp_path / "m.gguf", quant="f16")
    texts = [
        "The model layer 123 prunes 4567 heads.",
        "  two  spaces, and\nnew lines! ü €",
        "fast slow river city",
        "x",
    ]
    got = call_llama_cpp({"op": "tokenize", "model": str(gguf), "texts": texts})["ids"]
    tok = AutoTokenizer.from_pretrained(src)
    assert got == [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    meta = call_llama_cpp({"op": "info", "model": str(gguf)})["metadata"]
    assert meta["tokenizer.ggml.model"] == ("llama" if kind == "spm" else "gpt2")
    assert (meta.get("tokenizer.ggml.add_bos_token") == "true") == (kind == "spm")  # as transformers adds it
    assert_same_logits(src, gguf, tmp_path, TOL["f16"])


def test_quantized_files_run_and_stay_close(bpe_models, tmp_path):
    src = bpe_models["llama"]
    f16 = export_gguf(src, tmp_path / "f16.gguf", quant="f16")
    ref = engine_logits(f16, tmp_path)
    for quant, tol in (("q8_0", 0.05), ("q4_k_m", 0.5)):
        q = export_gguf(src, tmp_path / f"{quant}.gguf", quant=quant)
        meta = call_llama_cpp({"op": "info", "model": str(q)})["metadata"]
        assert int(meta["general.file_type"]) == {"q8_0": 7, "q4_k_m": 15}[quant]
        got = engine_logits(q, tmp_path)
        assert np.nanmax(np.abs(got - ref)) <= tol


def test_export_inside_the_checkpoint_lists_the_file(bpe_models, tmp_path):
    ckpt = _pruned(bpe_models["qwen2"], tmp_path / "ckpt")
    gguf = export_gguf(ckpt, quant="f16")
    assert gguf == ckpt / "ckpt-f16.gguf"
    names = {e.name for e in read_manifest(ckpt)}
    assert "ckpt-f16.gguf" in names
    card = (ckpt / "README.md").read_text()
    assert "`ckpt-f16.gguf`" in card and "llama-cli -m ckpt-f16.gguf" in card
    export_gguf(ckpt, quant="f16")  # again: the card lists it once
    assert (ckpt / "README.md").read_text().count("`ckpt-f16.gguf`") == 1


def _nothing_written(directory: Path, before: set[str]) -> None:
    assert {p.name for p in directory.iterdir()} == before


GGUF_FAMILIES = r"LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 \(text\) and Phi-3 families"


def test_refusals_name_the_problem_and_write_nothing(bpe_models, tmp_path):
    opt = tiny_decoder(tmp_path / "opt", family="opt", tokenizer="bpe")  # a family llama.cpp has no form of
    words = tiny_decoder(tmp_path / "words")
    for src, message in (
        (opt, f"GGUF export writes the {GGUF_FAMILIES}; this checkpoint is OPT \\(model_type 'opt'\\)"),
        (words, "it is WordLevel, and GGUF export writes BPE tokenizers"),
    ):
        before = {p.name for p in src.iterdir()}
        with pytest.raises(ExportError, match=message):
            export_gguf(src, quant="f16")
        _nothing_written(src, before)
    with pytest.raises(ExportError, match="is not one of f32, f16, q8_0, q5_k_m, q4_k_m, q3_k_m, iq3_xxs, iq2_m"):
        export_gguf(bpe_models["llama"], tmp_path / "x.gguf", quant="q3")


def test_truncated_or_corrupt_checkpoint_is_named(bpe_models, tmp_path):
    ckpt = _pruned(bpe_models["llama"], tmp_path / "ckpt")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(ckpt, corrupt)
    with open(corrupt / "model.safetensors", "r+b") as f:
        f.seek(-64, 2)
        f.write(b"\xff" * 8)
    truncated = tmp_path / "truncated"
    shutil.copytree(ckpt, truncated)
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate((truncated / "model.safetensors").stat().st_size - 100)
    for directory, message in ((corrupt, "does not match its digest"), (truncated, "is truncated")):
        before = {p.name for p in directory.iterdir()}
        with pytest.raises(ExportError, match=message):
            export_gguf(directory, quant="q8_0")
        _nothing_written(directory, before)


def test_layer_shape_regroups_by_the_greatest_common_group():
    # 8 heads over 4 key/value heads (2 each); kept heads 0,1,2,5 read key/value heads 0,0,1,2
    x = layer_shape({"heads": [0, 1, 2, 5], "kv_heads": [0, 1, 2], "neurons": 3}, 8, 4)
    assert (x.q_heads, x.kv_rows) == ([0, 1, 2, 3], [0, 0, 1, 2])  # groups 2, 1, 1 → size 1: head 0 twice
    x = layer_shape({"heads": [0, 1, 4, 5, 6, 7], "kv_heads": [0, 2, 3], "neurons": 3}, 8, 4)
    assert x.kv_rows == [0, 1, 2] and x.q_heads == [0, 1, 2, 3, 4, 5]  # equal groups of 2: nothing repeated


def test_pairwise_matches_an_explicit_rotation_reordering():
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(16, 3)  # 2 heads of 8 rows
    got = _pairwise(w, 2)
    for h in range(2):
        for i in range(4):  # rotate-half pair (i, i + 4) becomes adjacent rows (2i, 2i + 1)
            assert torch.equal(got[h * 8 + 2 * i], w[h * 8 + i])
            assert torch.equal(got[h * 8 + 2 * i + 1], w[h * 8 + i + 4])


def test_a_quantized_form_without_llama_cpp_is_refused_where_the_run_happens(bpe_models, tmp_path, monkeypatch):
    """The worker (engines checked) refuses q4_k_m before pruning when llama.cpp is missing; the submit
    host (engines=False) checks only the model, since the worker may have the engine it lacks."""
    from core.serving import preflight

    monkeypatch.delenv("LIAR_LLAMA_CPP_PYTHON", raising=False)
    monkeypatch.setenv("LIAR_CACHE", str(tmp_path / "empty-cache"))  # no engine environment there
    monkeypatch.setattr("core.serving.engines.importlib.util.find_spec", lambda name: None)
    with pytest.raises(ExportError, match="gguf-q4_k_m needs llama.cpp's quantizer, which this machine lacks"):
        preflight(bpe_models["llama"], ["gguf-q4_k_m"])
    preflight(bpe_models["llama"], ["gguf-q4_k_m"], engines=False)
    preflight(bpe_models["llama"], ["gguf-f16", "vllm"])  # neither needs an engine to be written
