"""The engine's estimate of a run (core/pipeline/estimate.py, core/pipeline/costs.py) against real prunes of
tiny models, the engine's own sizing, hand counts, and the project's measurements in docs/results."""

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.shapes import LLAMA_SHAPES
from core import prune
from core.criteria import REGISTRY
from core.models.adapter import block_parameters
from core.models.loading import load_model
from core.models.offload import activation_bytes, block_working_bytes
from core.models.tiny import tiny_decoder
from core.pipeline import costs, estimate
from core.pipeline.costs import Place, run_of, shape_of, width_peak, work
from core.pipeline.estimate import (
    CPU_BASELINE,
    H100_RECORDS,
    LLAMA_7B,
    WORK_HEADROOM,
    bench_recipe,
    h100_rates,
    seconds_of,
    worker_class,
)
from core.pipeline.sequential import execution_mode
from core.spec.recipe import Recipe
from tests.conftest import DECODER_FAMILIES, recipe_for

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
CPU = worker_class("cpu", gemm_rate=1e11)  # a rate passed in: no measurement in the tests
SMOLLM2 = dict(model_type="llama", max_position_embeddings=8192, dtype="bfloat16", **LLAMA_SHAPES["135m"])


def _shape(name: str) -> dict:
    return dict(model_type="llama", max_position_embeddings=4096, dtype="bfloat16", **LLAMA_SHAPES[name])


def _config_dir(path: Path, config: dict, safetensors: bool = False) -> Path:
    """A model directory holding only ``config.json`` (and an empty ``model.safetensors`` if asked): the
    estimate reads nothing else."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    if safetensors:
        (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """Six blocks: room for depth pruning (the first block stays, and one after the span)."""
    return tiny_decoder(tmp_path_factory.mktemp("models") / "deep", "llama", num_hidden_layers=6)


# --- parameters ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [f"{f}_dir" for f in DECODER_FAMILIES] + ["bert_dir", "bert_qa_dir"])
def test_shape_counts_every_parameter_of_the_loaded_model(fixture, request):
    path = request.getfixturevalue(fixture)
    model, _, adapter = load_model(str(path), "float32", "cpu")
    shape = shape_of(json.loads((path / "config.json").read_text()))
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.layers * shape.block_params == block_parameters(model, adapter)
    layer = adapter.layers(model)[0]
    biases = [layer.get_submodule(p).bias is not None for p in (adapter.family.o, adapter.family.ffn_out)]
    assert shape.out_biases == tuple(biases)


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
        ("opt", dict(word_embed_proj_dim=32, do_layer_norm_before=False)),  # opt-350m's projected embeddings
    ],
)
def test_shape_follows_the_config_flags(family, overrides, tmp_path):
    path = tiny_decoder(tmp_path / family, family, **overrides)
    model, _, _ = load_model(str(path), "float32", "cpu")
    assert shape_of(json.loads((path / "config.json").read_text())).params == sum(p.numel() for p in model.parameters())


def test_llama_7b_shape_has_the_measured_parameter_count():
    dense = json.loads((RESULTS / "gpu_latency.json").read_text())[0]  # the dense LLaMA-7B-shaped model
    assert dense["model"] == "dense"
    assert shape_of(LLAMA_7B).params == dense["params"] == 6_738_415_616


def _unit_tolerance(recipe: dict, path: Path) -> int:
    """How far the achieved count may be from ``ratio`` × blocks: each layer's plan keeps whole units, so
    it lands within half its coarsest unit of the layer's share — a query head (with its key and value
    rows where they go with it: multi-head attention) when heads are pruned, else a neuron."""
    shape = shape_of(json.loads((path / "config.json").read_text()))
    d, hd = shape.hidden, shape.head_dim
    kv_goes = not shape.family.gqa or shape.kv_heads == shape.heads
    head = hd * (2 * d + 2 * d * kv_goes) + 4 * hd * (shape.family.name in ("opt", "bert"))
    neuron = (shape.ffn_in + 1) * d + shape.ffn_in
    unit = neuron if recipe.get("modules") == "neurons" else max(head, neuron)
    return shape.layers * unit // 2


PRUNES = [
    ("llama_dir", {}),
    ("llama_dir", dict(ratio=0.5)),
    ("llama_mha_dir", dict(modules="heads", ratio=0.15)),
    ("qwen2_dir", {}),  # q, k, v biases: o_proj and down_proj get one from the refit
    ("opt_dir", dict(reconstruction={"method": "none"})),  # biases everywhere, none added
    ("gemma3_dir", dict(modules="neurons")),
    ("phi3_dir", dict(ratio=0.2, criterion={"name": "auto"}, reconstruction={"method": "ls", "select": "auto"})),
    ("bert_dir", {}),
    ("deep_dir", dict(depth={"blocks": 2}, ratio=0.5)),
]


@pytest.mark.parametrize("fixture, kw", PRUNES)
def test_params_after_match_a_real_prune_within_the_unit_rounding(fixture, kw, request, corpus):
    path = request.getfixturevalue(fixture)
    recipe = recipe_for(path, corpus, **kw)
    result = prune(recipe)
    guess = estimate.estimate(recipe, CPU)
    assert guess.ok, guess.error
    assert guess.params_before == result.params_before
    assert abs(guess.params_after - result.params_after) <= _unit_tolerance(recipe, path)


def test_depth_only_params_are_exact(deep_dir, corpus):
    recipe = recipe_for(deep_dir, corpus, modules="blocks", ratio=0.34)  # round(0.34 × 6) = 2 blocks
    assert estimate.estimate(recipe, CPU).params_after == prune(recipe).params_after


def test_a_speed_target_gives_the_range_it_can_land_in(deep_dir, corpus):
    recipe = recipe_for(deep_dir, corpus, ratio=None, target={"speedup": 1.5})
    guess = estimate.estimate(recipe, CPU)
    low, high = guess.params_range
    shape = shape_of(json.loads((deep_dir / "config.json").read_text()))
    blocks = shape.layers * shape.block_params
    assert guess.params_after is None and "speed-up" in guess.params_note
    # at least 1 − 1/1.5 of the blocks go; at most half of them and 65% of the rest
    assert high == shape.outer_params + round(blocks / 1.5)
    assert low == shape.outer_params + round(blocks * 0.5 * 0.35)
    assert guess.execution == "memory" and guess.seconds > 0
    assert "–" in guess.summary()


# --- execution mode ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(execution="memory"),
        dict(criterion={"name": "snip"}),  # whole-model gradients
        dict(ratio=None, target={"speedup": 1.2}),
        dict(modules="blocks", ratio=0.2),
    ],
)
def test_the_mode_is_the_one_the_engine_picks_for_a_job(kw, llama_dir, corpus, tmp_path):
    recipe = Recipe.model_validate(recipe_for(llama_dir, corpus, **kw))
    assert estimate.execution_of(recipe) == execution_mode(recipe, None, tmp_path / "out")[0]
    bare = _config_dir(tmp_path / "no-weights", json.loads((llama_dir / "config.json").read_text()))
    no_weights = recipe.model_copy(update={"model": str(bare)})
    assert estimate.execution_of(no_weights) == execution_mode(no_weights, None, tmp_path / "out")[0] == "memory"


def test_input_criteria_are_those_that_run_the_blocks():
    assert set(costs.INPUT_CRITERIA) == {name for name, c in REGISTRY.items() if c.needs == "inputs"}


# --- peak memory -------------------------------------------------------------------------------------------


def test_the_sizing_is_the_engines_own(llama_dir, gemma3_dir, opt_dir, bert_dir, corpus):
    """costs' activation and working bytes equal core/models/offload.py's, which a run uses to place
    its activations (and whose bounds tests/core/models/test_offload.py checks on real runs)."""
    for path in (llama_dir, gemma3_dir, opt_dir, bert_dir):
        model, _, adapter = load_model(str(path), "float32", "cpu")
        shape = shape_of(json.loads((path / "config.json").read_text()))
        for target in ("pruned", "dense"):
            recipe = Recipe.model_validate(recipe_for(path, corpus, reconstruction={"method": "ls", "target": target}))
            run = run_of(recipe, shape, "cpu")
            tokens, dense = run.fit + run.held, target == "dense"
            for ffn_tokens in (tokens, run.held):
                engine = activation_bytes(adapter, tokens, 4, dense, ffn_tokens=ffn_tokens)
                assert costs.activation_bytes(shape, run, ffn_tokens) == engine
            layer = adapter.layers(model)[0]
            assert costs.working_bytes(shape, run) == block_working_bytes(layer, adapter, run.batch, 4, run.matrices)


SMALL = dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=100, tie_word_embeddings=False, max_position_embeddings=64, dtype="float32",
)  # fmt: skip


def _small_recipe(model: str = "x", **kw) -> Recipe:
    """Neurons only, a ratio that removes a quarter of each FFN exactly (6,144 of a block's 41,088)."""
    cal = dict(texts=["x"], num_calibration_samples=4, max_seq_length=8, holdout_samples=2, batch_size=2)
    recipe = dict(
        model=model, modules="neurons", ratio=6144 / 41088, criterion={"name": "magnitude"}, dtype="float32",
        reconstruction={"method": "liar", "select": "criterion"}, calibration=cal, device="cpu",
    )  # fmt: skip
    return Recipe.model_validate({**recipe, **kw})


def _reference_peak(d: int, f: int, layers: int, vocab: int) -> int:
    """The tensors a width prune of SMALL holds at its FFN solve, in memory on a CPU, listed one by one
    (float32 unless said): every weight; per calibration batch (two fit batches and one held aside, of
    2 × 8 tokens) the block inputs, the replayed FFN output and the FFN's kept inputs (all channels at
    most); one batch's float32 intermediates (4 of FFN width, 4 of hidden width: the engine's
    allowance); and the float64 solve at its worst kept share (3/4 of 128 channels): the Gram, the kept
    block factorised, and the right-hand side, the solve's intermediate and its result."""
    block = [(d, d)] * 4 + [(f, d), (f, d), (d, f), (d,), (d,)]
    weights = [(vocab, d), (d,), (vocab, d)] + block * layers
    tokens = (2, 8)
    per_batch = [(*tokens, d), (*tokens, d), (*tokens, f)]
    intermediates = [(*tokens, f)] * 4 + [(*tokens, d)] * 4
    kept = 3 * f // 4
    solve = [(f, f), (kept, kept), (kept, f - kept), (kept, f - kept), (kept, f - kept)]
    f32 = weights + per_batch * 3 + intermediates
    return sum(4 * math.prod(t) for t in f32) + sum(8 * math.prod(t) for t in solve)


def test_peak_matches_the_tensors_listed_one_by_one():
    shape, recipe = shape_of(SMALL), _small_recipe()
    peak, where = width_peak(shape, run_of(recipe, shape, "cpu"), "memory", shape.layers, "auto", Place("cpu"))
    assert where == "device"
    assert peak == _reference_peak(64, 128, 2, 100)


def test_the_sizing_against_the_measured_gpu_peaks():
    """docs/results/gpu_stream.json's peaks (``max_memory_allocated``) against the sizing: what is not
    resident weights is measured at 1.0–WORK_HEADROOM × the sizing, the headroom a fit is judged with."""
    ratios = []
    for row in json.loads((RESULTS / "gpu_stream.json").read_text()):
        shape = shape_of(_shape(row["shape"]))
        obs = row["criterion"] == "obs"
        kw = dict(criterion={"name": "auto"}, reconstruction={"method": "ls", "select": "auto"}) if obs else {}
        run = run_of(bench_recipe(row["samples"], 8, **kw), shape, "cuda")
        sized, where = width_peak(shape, run, row["mode"], shape.layers, "auto", Place("cuda", 141 * 10**9))
        assert where == row["activations"] == "device"
        resident = shape.params * 2 if row["mode"] == "memory" else 0
        ratios.append((row["peak_device_mb"] * 2**20 - resident) / (sized - resident))
    assert 1.0 <= min(ratios) and max(ratios) <= WORK_HEADROOM, ratios


def test_cpu_peaks_against_the_measured_rss(tmp_path):
    """Peak RSS of CPU prunes (docs/results/time.json in memory, streaming.json streamed and in memory)
    within 25%: RSS counts the mapped checkpoint pages and the allocator's reuse, which the sizing
    approximates (the baseline: streaming.md's process that only imports the engine)."""
    for row in json.loads((RESULTS / "time.json").read_text())["rows"]:
        path = _config_dir(tmp_path / f"smol{row['samples']}", SMOLLM2)
        recipe = bench_recipe(row["samples"], 8, model=str(path), dtype="float32", device="cpu")
        guess = estimate.estimate(recipe.model_copy(update={"execution": "memory"}), CPU)
        assert guess.peak_bytes == pytest.approx(row["peak_rss_mb"] * 2**20, rel=0.25)
    for row in json.loads((RESULTS / "streaming.json").read_text())["rows"]:
        if row["criterion"] != "magnitude" or row["mode"] not in ("stream", "memory") or row.get("child_env"):
            continue
        config = dict(_shape(row["shape"]) if row["shape"] != "135m" else SMOLLM2, dtype="float32")
        path = _config_dir(tmp_path / f"{row['shape']}-{row['mode']}", config, safetensors=True)
        cal = dict(texts=["x"], num_calibration_samples=row["samples"], max_seq_length=row["seq_len"])
        recipe = dict(model=str(path), ratio=row["ratio"], criterion={"name": "magnitude"}, calibration=cal)
        recipe.update(reconstruction={"method": "liar", "select": "criterion"}, execution=row["mode"], device="cpu")
        assert estimate.estimate(recipe, CPU).peak_bytes == pytest.approx(row["peak_rss_mb"] * 2**20, rel=0.25)
    assert CPU_BASELINE == 387 * 2**20


# --- work and time -----------------------------------------------------------------------------------------


def test_flops_match_a_hand_count():
    """SMALL, a quarter of each FFN pruned, 4 windows of 8 tokens + 2 held aside (48 tokens, 32 fitted).
    Multiply-adds per layer, each counted twice as FLOPs:
    - the FFN's inputs collected over 48 tokens: q, k, v (64 × 192), scores and values (2 × 8 × 64), o
      (64 × 64), gate and up (2 × 64 × 128): 33,792 a token;
    - the output pass: down on the 96 kept neurons, 96 × 64 a token over 48 tokens;
    - the Gram of down's 128 inputs over the 32 fit tokens (one column block under 256: the full square).
    Float64, liar with 96 kept and 32 pruned of 128 into 64 outputs: the factorisation 96³/3, the
    triangular solves 2 · 96² · 32, the update 2 · 96 · 32 · 64, the projection (96 ≥ 64 rows: W_uᵀW_u and its
    factorisation) 2 · 96 · 64² + 64³/3. The report on 16 held tokens: 2 · 16 · 64 · (2 · 128 + 32)."""
    macs = 48 * 33_792 + 48 * 96 * 64 + 32 * 128 * 128
    fp64 = 96**3 / 3 + 2 * 96**2 * 32 + 2 * 96 * 32 * 64 + 2 * 96 * 64**2 + 64**3 / 3
    flops = work(_small_recipe(), shape_of(SMALL), "cpu")
    assert flops["dense"] == pytest.approx(2 * 2 * macs, rel=1e-12)
    assert flops["fp64"] == pytest.approx(2 * fp64, rel=1e-12)
    assert flops["report"] == pytest.approx(2 * 2 * 16 * 64 * (2 * 128 + 32), rel=1e-12)


def test_flops_match_the_engines_counted_products():
    """docs/results/time.json counted every matrix product of SmolLM2 prunes (bench/flops.py's
    ProductCounter): the count from the shapes is within 3% (it also holds the float64 factorisations and
    triangular solves, which the counter does not see: under 1% here)."""
    for row in json.loads((RESULTS / "time.json").read_text())["rows"]:
        recipe = bench_recipe(row["samples"], 8, dtype="float32", device="cpu", round_to={"neurons": 1})
        total = sum(work(recipe, shape_of(SMOLLM2), "cpu").values())
        assert total == pytest.approx(row["product_tflop"] * 1e12, rel=0.03)


def _page_seconds(shape: str, samples: int, method: str) -> float:
    """A time of docs/results/gpu_liar.md's first table (H100, 2026-11-23): the row's 'after' column."""
    text = (RESULTS / "gpu_liar.md").read_text()
    row = re.search(rf"^\| {shape} \| {samples} \| {re.escape(method)} \| [^|]+ \| \**([\d.]+)", text, re.M)
    return float(row.group(1))


def test_h100_records_are_the_pages():
    assert (
        H100_RECORDS
        == (
            (128, 8, _page_seconds("7B", 128, "liar, holdout 8")),
            (128, 0, _page_seconds("7B", 128, "liar")),
            (1024, 0, _page_seconds("7B", 1024, "liar")),
        )
        == ((128, 8, 4.3), (128, 0, 6.0), (1024, 0, 9.3))
    )


def test_h100_rates_reproduce_the_measured_times():
    """Three records, three rates: the fit reproduces 4.3 / 6.0 / 9.3 s exactly (to rounding)."""
    worker, shape = worker_class("h100-80gb"), shape_of(LLAMA_7B)
    for samples, held, seconds in H100_RECORDS:
        assert seconds_of(work(bench_recipe(samples, held), shape, "cuda"), worker) == pytest.approx(seconds, rel=1e-9)
    dense, fp64, report = h100_rates()
    assert 0 < fp64 < report < dense < 989e12  # below the H100's bf16 peak, float64 slowest


def test_h100_rates_beyond_the_records():
    """Out of the fit: 13B at 1024 samples (the same table, 16.6 s) within 30% — the float64 and report
    work is counted as FLOPs, which grow faster with width than the run's time does (+27% here) — and the
    default recipe (OBS criterion and selection, ls; 18.4 s in the page's 2026-11-26 H100 section) within 15%."""
    worker = worker_class("h100-80gb")
    s13 = shape_of(_shape("13b"))
    assert seconds_of(work(bench_recipe(1024, 0), s13, "cuda"), worker) == pytest.approx(16.6, rel=0.30)
    default = bench_recipe(128, 8, criterion={"name": "auto"}, reconstruction={"method": "ls", "select": "auto"})
    assert seconds_of(work(default, shape_of(LLAMA_7B), "cuda"), worker) == pytest.approx(18.4, rel=0.15)


def test_a100_is_the_h100_scaled_by_the_bf16_peaks():
    h100, a100 = worker_class("h100-80gb"), worker_class("a100-80gb")
    for rate in ("dense_rate", "fp64_rate", "report_rate"):
        assert getattr(a100, rate) == pytest.approx(getattr(h100, rate) * 312 / 989)


def test_cpu_product_share_is_the_measured_one():
    rows = json.loads((RESULTS / "time.json").read_text())["rows"]
    shares = [row["product_seconds"] / row["prune_seconds"] for row in rows]
    assert estimate.CPU_PRODUCT_SHARE == pytest.approx(sum(shares) / len(shares), rel=1e-3)


def test_cpu_time_reproduces_the_measured_prunes():
    """SmolLM2 on 2 CPU cores (time.json), at each row's own GEMM rate: within 15%."""
    for row in json.loads((RESULTS / "time.json").read_text())["rows"]:
        recipe = bench_recipe(row["samples"], 8, dtype="float32", device="cpu", round_to={"neurons": 1})
        cpu = worker_class("cpu", gemm_rate=row["gemm_gflops"] * 1e9)
        assert seconds_of(work(recipe, shape_of(SMOLLM2), "cpu"), cpu) == pytest.approx(row["prune_seconds"], rel=0.15)


def test_the_cpu_rate_is_measured_once():
    assert estimate.cpu_gemm_rate(256, 1) > 0
    assert estimate.cpu_gemm_rate(256, 1) == estimate.cpu_gemm_rate(256, 1)


def test_the_estimate_imports_no_torch():
    """The web process calls it on every change of the form: no torch, no transformers (the cpu class
    alone measures its rate with torch, once)."""
    code = (
        "import sys; from core.pipeline.estimate import estimate, worker_class; worker_class('h100-80gb'); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the estimate as the form shows it -----------------------------------------------------------------------


def test_a_7b_on_an_h100_in_one_line(tmp_path):
    path = _config_dir(tmp_path / "7b", LLAMA_7B)  # no weights: held in memory, as the records ran
    guess = estimate.estimate(bench_recipe(128, 8, model=str(path)), "h100-80gb")
    assert guess.ok and guess.fits and guess.execution == "memory" and guess.activations == "device"
    assert guess.seconds == pytest.approx(4.3)
    assert guess.summary() == "≈ 5.4 B parameters after pruning (from 6.7 B) · peak ≈ 16 GiB · ≈ 4.3 s on an H100 80 GB"
    assert "docs/results/gpu_liar.md" in guess.basis


def test_a_model_that_does_not_fit_gets_a_sentence(tmp_path):
    path = _config_dir(tmp_path / "70b", _shape("70b"))  # 138 GB of bf16 weights, held in memory
    guess = estimate.estimate(bench_recipe(128, 8, model=str(path)), "h100-80gb")
    assert guess.ok and not guess.fits
    assert guess.fit_note.startswith("the run needs ≈ ") and "an H100 80 GB has" in guess.fit_note
    assert guess.fit_note.endswith("choose a class with more memory") and "(does not fit)" in guess.summary()
    streamable = _config_dir(tmp_path / "70b-st", _shape("70b"), safetensors=True)
    asked = bench_recipe(128, 8, model=str(streamable), execution="memory")
    assert "execution: auto" in estimate.estimate(asked, "h100-80gb").fit_note
    streamed = estimate.estimate(asked.model_copy(update={"execution": "auto"}), "h100-80gb")
    assert streamed.execution == "stream" and streamed.fits  # one block at a time


def test_a_hub_id_not_in_the_cache_cannot_be_estimated():
    recipe = dict(model="liar-tests/no-such-model-in-any-cache", ratio=0.2, calibration={"dataset": "wikitext2"})
    guess = estimate.estimate(recipe, "h100-80gb")
    assert not guess.ok and guess.error.startswith("cannot estimate: ") and "cache" in guess.error
    assert guess.summary() == guess.error and guess.peak_bytes is None


@pytest.mark.parametrize(
    "recipe, worker, words",
    [
        (dict(ratio=0.2), "tpu-v9", "unknown worker class 'tpu-v9'"),
        (dict(ratio=1.5), CPU, "ratio"),
        (dict(ratio=0.2, device="cuda"), CPU, "has no GPU"),
        (dict(ratio=0.2, calibration={"texts": ["x"], "max_seq_length": 10**5}), CPU, "exceeds the model's limit"),
    ],
)
def test_bad_input_is_one_sentence(recipe, worker, words, llama_dir):
    recipe = {"model": str(llama_dir), "calibration": {"texts": ["x"]}, **recipe}
    guess = estimate.estimate(recipe, worker)
    assert guess.error.startswith("cannot estimate: ") and words in guess.error


def test_gradient_criteria_hold_the_model_in_memory_and_depth_streams(deep_dir, corpus):
    width = estimate.estimate(recipe_for(deep_dir, corpus, ratio=0.5), CPU)
    depth = estimate.estimate(recipe_for(deep_dir, corpus, depth={"blocks": 2}, ratio=0.5), CPU)
    snip = estimate.estimate(recipe_for(deep_dir, corpus, criterion={"name": "snip"}), CPU)
    assert width.execution == depth.execution == "stream" and snip.execution == "memory"
    assert snip.peak_bytes > width.peak_bytes
    assert dict(depth.flops)["fp64"] > dict(width.flops)["fp64"]  # the span's float64 least squares


@pytest.mark.parametrize("select", ["loss", "angular"])
def test_streamed_depth_peak_is_one_block_and_the_passes_activations(tmp_path, select):
    """A 7B-shaped depth-only recipe: in memory the peak holds the model and every span's float64 sums;
    streamed, the outer weights, one block, one span's sums, the larger pass's activations and one batch's
    logits (hand count), and on a CPU the candidates' stand-ins for the loss pass."""
    path = _config_dir(tmp_path / "7b", LLAMA_7B, safetensors=True)
    recipe = bench_recipe(128, 8, model=str(path), modules="blocks", ratio=0.25, depth={"select": select})
    assert estimate.execution_of(recipe) == "stream"
    shape = shape_of(LLAMA_7B)
    d, n, k, b = 4096, 32, 8, 2  # bfloat16
    for device in ("cuda", "cpu"):
        run = run_of(recipe, shape, device)
        fit, held, batch = 128 * 128, 8 * 128, 16 * 128
        rows = max((2 * k + 1) * fit, (1 + 2 * (n - k)) * held * (select == "loss"))
        stand_ins = (n - k) * 2 * d * d * 8 * (select == "loss" and device == "cpu")
        hand = (shape.outer_params + shape.block_params) * b + 4 * d * d * 8 + rows * d * b
        hand += batch * 32000 * (b + 4) + stand_ins
        assert costs.depth_peak(recipe, shape, run, k, "stream", device) == hand
        assert hand < costs.depth_peak(recipe, shape, run, k, "memory", device) / 2
    memory = estimate.estimate(recipe.model_copy(update={"execution": "memory"}), "h100-80gb")
    streamed = estimate.estimate(recipe, "h100-80gb")
    assert streamed.execution == "stream" and streamed.fits
    assert streamed.peak_bytes < memory.peak_bytes / 3


def test_recomputed_activations_cost_memory_less_and_time_more(tmp_path):
    path = _config_dir(tmp_path / "7b", LLAMA_7B)
    device, recompute = (
        estimate.estimate(bench_recipe(1024, 0, model=str(path), activations=a), "h100-80gb")
        for a in ("device", "recompute")
    )
    assert recompute.activations == "recompute" and recompute.peak_bytes < device.peak_bytes
    assert recompute.seconds > device.seconds


def test_auto_spills_the_activations_when_the_card_is_short(tmp_path):
    path = _config_dir(tmp_path / "7b", LLAMA_7B)
    small = replace(worker_class("h100-80gb"), memory=20 * 2**30)
    recipe = bench_recipe(4096, 0, model=str(path))
    assert estimate.estimate(recipe, "h100-80gb").activations == "device"
    assert estimate.estimate(recipe, small).activations in ("recompute", "host")
