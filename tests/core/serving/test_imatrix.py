"""The importance matrix for llama.cpp's quantizer (``core.serving.imatrix``), against a slow reference:
the sum of squared raw inputs per channel of each projection, captured in float64, matched to the GGUF
file's columns through the exported weights themselves (not through the conversion's own code)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core import prune
from core.models.loading import load_pruned
from core.models.tiny import tiny_corpus, tiny_decoder
from core.serving import imatrix
from core.serving.engines import call_llama_cpp
from core.serving.gguf_export import ExportError, export_gguf
from core.serving.quantize import collect, fallbacks, resolve_imatrix, tensor_types
from core.spec.recipe import CalibrationConfig
from tests.conftest import recipe_for
from tests.core.serving.crafted import crafted_checkpoint

CAL = CalibrationConfig(texts=tiny_corpus(40), num_calibration_samples=6, max_seq_length=16)
# query heads in unequal groups: the GGUF file repeats key/value heads and regroups the attention
# output's columns by head, so its columns are not the checkpoint's
LAYOUT = [
    {"heads": [0, 1, 2, 5], "kv_heads": [0, 1, 2], "neurons": 20},
    {"heads": [1, 3, 4, 5, 6, 7], "kv_heads": [0, 1, 2, 3], "neurons": 33},
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("imatrix")
    llama = tiny_decoder(root / "llama", family="llama", tokenizer="bpe")
    qwen = tiny_decoder(root / "qwen2", family="qwen2", tokenizer="bpe", tie_word_embeddings=True)
    crafted = crafted_checkpoint(llama, root / "crafted", LAYOUT)
    pruned = prune(recipe_for(qwen, tiny_corpus(), ratio=0.4)).save(root / "pruned")
    return {"crafted": crafted, "pruned": pruned, "dense": llama}


def raw_square_sums(checkpoint: Path, windows: torch.Tensor) -> dict[str, np.ndarray]:
    """Every linear layer's raw inputs over ``windows``, kept whole, then squared and summed in numpy."""
    model, _ = load_pruned(checkpoint, dtype=torch.float32)
    seen: dict[str, list[np.ndarray]] = {}
    hooks = [
        m.register_forward_hook(lambda _m, a, _o, n=n: seen.setdefault(n, []).append(a[0].reshape(-1, a[0].shape[-1])))
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    with torch.no_grad():
        for w in windows:
            model(input_ids=w[None])
    for h in hooks:
        h.remove()
    return {n: np.square(np.concatenate([x.numpy() for x in xs]).astype(np.float64)).sum(0) for n, xs in seen.items()}


HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
      "ffn_down": "mlp.down_proj"}  # fmt: skip


def source_module(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{HF[parts[2]]}"
    return "lm_head"  # output.weight, or the tied embedding the output head reads


def column_map(gguf_w: np.ndarray, hf_w: np.ndarray) -> list[int]:
    """For each column of the GGUF matrix, the checkpoint column it holds (rows may be permuted or
    repeated: a column is known by the set of its values)."""
    keys = {tuple(np.unique(hf_w[:, k])): k for k in range(hf_w.shape[1])}
    return [keys[tuple(np.unique(gguf_w[:, j]))] for j in range(gguf_w.shape[1])]


@pytest.mark.parametrize("which", ["crafted", "pruned"])
def test_the_matrix_is_the_sum_of_squared_inputs_in_the_files_column_order(checkpoints, which, tmp_path):
    import gguf

    ckpt = checkpoints[which]
    made = collect(ckpt, CAL.texts, CAL, "tiny corpus")
    path = imatrix.write(tmp_path / "m.imatrix.gguf", made)
    back = imatrix.read(path)
    _, tok = load_pruned(ckpt)
    from core.data.calibration import decoder_windows

    windows = decoder_windows(CAL.texts, tok, CAL.model_copy(update={"holdout_samples": 0}))[0].input_ids
    ref = raw_square_sums(ckpt, windows)
    f32 = gguf.GGUFReader(str(export_gguf(ckpt, tmp_path / "m.gguf", quant="f32")))
    weights = {t.name: np.asarray(t.data) for t in f32.tensors}
    model, _ = load_pruned(ckpt, dtype=torch.float32)
    hf = {n: m.weight.detach().numpy() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    expected = {n for n, w in weights.items() if w.ndim == 2 and n != "token_embd.weight"}
    if which == "pruned":  # tied head: its statistics go under the embedding's name, as llama-imatrix's do
        expected.add("token_embd.weight")
    assert set(back.sums) == expected
    assert back.chunk_count == len(windows) and back.chunk_size == windows.shape[1]
    assert back.datasets == ["tiny corpus"]
    for name, sums in back.sums.items():
        src = source_module(name)
        cols = column_map(weights[name], hf[src]) if name != "token_embd.weight" else range(len(sums))
        np.testing.assert_allclose(sums, ref[src][list(cols)], rtol=2e-6, err_msg=name)
        assert back.counts[name] == windows.numel()
    if which == "crafted":  # key/value heads repeated to equal groups: rows the checkpoint does not have
        assert weights["blk.0.attn_k.weight"].shape[0] > hf["model.layers.0.self_attn.k_proj"].shape[0]


def test_llama_cpp_reads_the_file_back(checkpoints, tmp_path):
    made = collect(checkpoints["crafted"], CAL.texts, CAL, "tiny corpus")
    path = imatrix.write(tmp_path / "m.imatrix.gguf", made)
    got = call_llama_cpp({"op": "imatrix", "path": str(path)})
    assert got["chunks"] == made.chunk_count
    means = made.means()
    assert set(got["tensors"]) == set(means)
    for name, (n, mean) in got["tensors"].items():
        assert n == len(means[name])
        assert mean == pytest.approx(float(means[name].mean()), rel=1e-5)


def weighted_errors(q: Path, f32: Path, means: dict[str, np.ndarray]) -> dict[str, float]:
    """Σ_j E[x_j²] Σ_i (W − Ŵ)²_ij per matrix: the loss the quantizer minimises with a matrix."""
    import gguf
    from gguf.quants import dequantize

    ref = {t.name: np.asarray(t.data, dtype=np.float64) for t in gguf.GGUFReader(str(f32)).tensors}
    out = {}
    for t in gguf.GGUFReader(str(q)).tensors:
        if t.name in means:
            w = dequantize(t.data, t.tensor_type).reshape(ref[t.name].shape).astype(np.float64)
            out[t.name] = float((np.square(w - ref[t.name]) * means[t.name]).sum())
    return out


def test_quantizing_with_the_matrix_lowers_the_error_it_weights(checkpoints, tmp_path):
    ckpt = checkpoints["crafted"]
    made = collect(ckpt, CAL.texts, CAL, "tiny corpus")
    path = imatrix.write(tmp_path / "m.imatrix.gguf", made)
    f32 = export_gguf(ckpt, tmp_path / "f32.gguf", quant="f32")
    plain = export_gguf(ckpt, tmp_path / "plain.gguf", quant="q4_k_m")
    weighted = export_gguf(ckpt, tmp_path / "weighted.gguf", quant="q4_k_m", imatrix=path)
    assert plain.read_bytes() != weighted.read_bytes()
    means = {n: v.astype(np.float64) for n, v in made.means().items()}
    without, with_ = weighted_errors(plain, f32, means), weighted_errors(weighted, f32, means)
    assert sum(with_.values()) < 0.95 * sum(without.values())
    better = sum(with_[n] <= without[n] for n in with_)
    assert better >= 0.8 * len(with_), f"only {better} of {len(with_)} matrices improved"
    # its rows (64, 20, 33, 32, 48 long) are no multiple of 256: every block matrix fell back
    falls = fallbacks(tensor_types(weighted), "q4_k_m")
    assert {f["role"] for f in falls} >= {"attn_output", "ffn_down", "ffn_up"}
    assert sum(f["tensors"] for f in falls) == 14


def test_refusals_name_the_problem_and_write_nothing(checkpoints, tmp_path):
    ckpt = checkpoints["crafted"]
    before = {p.name for p in ckpt.iterdir()}
    with pytest.raises(ExportError, match="iq3_xxs needs an importance matrix: pass --imatrix auto"):
        export_gguf(ckpt, quant="iq3_xxs")
    with pytest.raises(ExportError, match="has no recipe.yaml with a calibration set"):
        resolve_imatrix(ckpt, "iq3_xxs", "auto")
    assert resolve_imatrix(ckpt, "q4_k_m", "auto")[0] is None  # a K-quant goes without one, and says so
    assert "without an importance matrix" in resolve_imatrix(ckpt, "q4_k_m", "auto")[1]
    with pytest.raises(ExportError, match="which f16 does not use"):
        export_gguf(ckpt, quant="f16", imatrix=tmp_path / "x")
    with pytest.raises(ExportError, match="is not a file"):
        export_gguf(ckpt, quant="q4_k_m", imatrix=tmp_path / "missing.gguf")
    other = imatrix.write(tmp_path / "other.gguf", collect(checkpoints["dense"], CAL.texts, CAL, "t"))
    with pytest.raises(ExportError, match="was made for another model: blk.0.attn_output.weight has 64 channels"):
        export_gguf(ckpt, quant="q4_k_m", imatrix=other)
    f16 = export_gguf(ckpt, tmp_path / "f.gguf", quant="f16")
    with pytest.raises(ExportError, match="not an importance matrix"):
        export_gguf(ckpt, quant="q4_k_m", imatrix=f16)
    assert {p.name for p in ckpt.iterdir()} == before


def test_an_i_quant_form_is_refused_before_anything_runs_where_no_calibration_set_is_named(checkpoints):
    from core.serving import FORMATS, GGUF_FORMATS, preflight

    assert {"gguf-q5_k_m", "gguf-q3_k_m", "gguf-iq3_xxs", "gguf-iq2_m"} <= set(FORMATS)
    assert GGUF_FORMATS["gguf-iq2_m"] == "iq2_m"
    with pytest.raises(ExportError, match="gguf-iq2_m needs an importance matrix, gathered over the checkpoint's"):
        preflight(checkpoints["crafted"], ["gguf-q4_k_m", "gguf-iq2_m"], engines=False)
    preflight(checkpoints["crafted"], ["gguf-q3_k_m"], engines=False)  # a K type goes without one
    preflight(checkpoints["pruned"], ["gguf-iq2_m"], engines=False)  # its recipe names the calibration text


def test_auto_gathers_from_the_recipes_calibration_text(checkpoints, tmp_path):
    ckpt = checkpoints["pruned"]
    matrix, said = resolve_imatrix(ckpt, "iq3_xxs", "auto")
    assert matrix == ckpt / "imatrix.gguf" and said.startswith("quantized with an importance matrix from 12 windows")
    out = export_gguf(ckpt, tmp_path / "q.gguf", quant="iq3_xxs", imatrix=matrix)
    made = imatrix.read(ckpt / "imatrix.gguf")
    assert made.chunk_count == 12 and "blk.0.ffn_down.weight" in made.sums  # recipe_for's 12 windows
    assert call_llama_cpp({"op": "info", "model": str(out)})["metadata"]["general.file_type"] == "23"


def test_one_writer_gathers_the_matrix_once_and_logs_it_and_the_fallbacks(checkpoints, tmp_path, monkeypatch):
    """``core.serving.write_form``, which a recipe's ``export`` (``core.serving.export``) and the server's
    export-only job both write with: the quantized forms share one matrix, gathered into the folder asked
    for; the log names it and every group of tensors that fell back."""
    import shutil

    import core.serving as serving
    import core.serving.quantize as quantize
    from core.serving import Matrices, write_form

    ckpt = shutil.copytree(checkpoints["pruned"], tmp_path / "ckpt")  # export() writes into it
    (ckpt / "imatrix.gguf").unlink(missing_ok=True)
    gathered, collect = [], quantize.collect
    monkeypatch.setattr(quantize, "collect", lambda *a, **k: gathered.append(1) or collect(*a, **k))
    calls, real = [], serving.write_form
    monkeypatch.setattr(serving, "write_form", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    lines: list[str] = []
    iq, q4 = serving.export(ckpt, ["gguf-iq3_xxs", "gguf-q4_k_m"], log=lines.append)
    assert calls == ["gguf-iq3_xxs", "gguf-q4_k_m"] and len(gathered) == 1
    said = "quantized with an importance matrix from 12 windows of 24 tokens of calibration texts"
    assert f"{iq.name}: {said}" in lines and f"{q4.name}: {said}" in lines
    assert "imatrix.gguf" in (ckpt / "SHA256SUMS").read_text()  # inside the checkpoint, listed there
    falls = fallbacks(tensor_types(q4), "q4_k_m")
    assert falls and [x for x in lines if x.startswith(q4.name) and "fell back to" in x] == [
        f"{q4.name}: {f['tensors']} × {f['role']}: rows of {f['row']} (not a multiple of 256) fell back to {f['type']}"
        for f in falls
    ]
    # into a folder of its own (the export job's), the matrix beside the file, the checkpoint untouched
    out = tmp_path / "export"
    out.mkdir()
    before = sorted(p.name for p in ckpt.iterdir())
    matrices, lines = Matrices(ckpt, folder=out, hint=None), []
    q5 = write_form(ckpt, "gguf-q5_k_m", out / "m.gguf", log=lines.append, matrices=matrices)
    write_form(ckpt, "gguf-iq2_m", out / "n.gguf", log=lines.append, matrices=matrices)
    assert len(gathered) == 2 and matrices.gathered == out / "imatrix.gguf"
    assert sorted(p.name for p in ckpt.iterdir()) == before
    assert lines[0] == f"m.gguf: {said}" and q5.fallbacks == fallbacks(tensor_types(q5.path), "q5_k_m")
    assert q5.fallen_back == sum(f["tensors"] for f in q5.fallbacks) > 0 and q5.size == q5.path.stat().st_size


def test_the_cli_says_which_matrix_and_what_fell_back(checkpoints, tmp_path, capsys):
    from app.cli import main

    ckpt = checkpoints["pruned"]
    assert main(["export", str(ckpt), "--quant", "iq2_m", "--imatrix", "none"]) == 2
    assert "iq2_m needs an importance matrix: pass --imatrix auto" in capsys.readouterr().err
    assert main(["export", str(ckpt), "--format", "vllm", "--imatrix", "none"]) == 2
    assert "go with --format gguf" in capsys.readouterr().err
    out = tmp_path / "q.gguf"
    assert main(["export", str(ckpt), "--quant", "q4_k_m", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "quantized with an importance matrix from 12 windows of 24 tokens of calibration texts" in said
    assert "× ffn_down: rows of" in said and "(not a multiple of 256) fell back to" in said
    assert out.is_file()


def test_k_quant_rounding_keeps_the_pruned_rows_on_their_k_type(tmp_path):
    """head_dim 64: kept query heads in fours (4 × 64 = 256) and neurons in 256s; the q4_k_m file then
    has no attention output or down projection on a legacy type."""
    from core.models.config_file import read_config

    src = tiny_decoder(tmp_path / "src", tokenizer="bpe", hidden_size=512, intermediate_size=1024, head_dim=64)
    recipe = recipe_for(src, tiny_corpus(), ratio=0.4, round_to={"k_quant": True, "kv_groups": "free"})
    recipe["allocation"] = "global"
    recipe["reconstruction"]["damp"] = 0.01  # fewer tokens than channels here
    ckpt = prune(recipe).save(tmp_path / "ckpt")
    layers = read_config(ckpt)["liar_layout"]
    assert all(len(x["heads"]) % 4 == 0 and x["neurons"] % 256 == 0 for x in layers)
    assert any(len(x["heads"]) < 8 or x["neurons"] < 1024 for x in layers)  # something was pruned
    q = export_gguf(ckpt, tmp_path / "q.gguf", quant="q4_k_m")
    falls = fallbacks(tensor_types(q), "q4_k_m")
    assert not [f for f in falls if f["role"] in ("attn_output", "ffn_down")], falls
    plain = prune({**recipe, "round_to": {"kv_groups": "free", "neurons": 1}}).save(tmp_path / "plain")
    assert [f for f in fallbacks(tensor_types(export_gguf(plain, tmp_path / "p.gguf", quant="q4_k_m")), "q4_k_m")
            if f["role"] in ("attn_output", "ffn_down")]  # fmt: skip


@pytest.mark.parametrize(
    "head_dim, n_heads, n_neurons, given, expected",
    [
        (64, 9, 1536, {}, (4, 256)),  # SmolLM2: 4 × 64 = 256
        (128, 32, 11008, {"heads": 3, "neurons": 128}, (6, 256)),  # LLaMA-7B: the multiples combine
        (8, 8, 48, {}, (1, 1)),  # the tiny model: 32 heads of 8 or 256 neurons are more than it has
        (64, 14, 4864, {"neurons": 1}, (4, 256)),  # Qwen2.5-0.5B
    ],
)
def test_k_quant_multiples(head_dim, n_heads, n_neurons, given, expected):
    from types import SimpleNamespace

    from core.pipeline.planning import round_to
    from core.spec.recipe import Recipe

    recipe = Recipe.model_validate(
        {"model": "m", "ratio": 0.5, "calibration": {"texts": ["a b"]}, "round_to": {**given, "k_quant": True}}
    )
    adapter = SimpleNamespace(head_dim=head_dim, n_heads=n_heads, n_neurons=n_neurons)
    assert round_to(recipe, adapter, torch.device("cpu")) == expected
