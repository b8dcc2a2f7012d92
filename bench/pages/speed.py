"""The results pages of CPU speed and depth pruning: time, products, latency, streaming, serving, targets."""

from __future__ import annotations

from bench.pages import values as v
from bench.pages.page import Page, _c

PAGES: dict[str, Page] = {
    "time.md": Page(
        "make bench-time",
        "cpu",
        (
            _c("CPU prune, paper LIAR, 128 × 128 samples", lambda: f"{v.num(v.time_row(128)['prune_seconds'])} s"),
            _c("time at 1024 samples over 128", lambda: v.times(v.scaling())),
            _c("the same prune against its matrix products at the measured GEMM rate", v.product_ratio),
        ),
        cpu_times=True,
    ),
    "cpu_matmul.md": Page(
        "python bench/cpu_matmul.py --threads 2 --tokens 2048",
        "cpu",
        (
            _c(
                "oneDNN over the BLAS, the run's projections / Gram blocks",
                lambda: v.pair(v.span(v.matmul_speedups("proj")), v.span(v.matmul_speedups("gram"))),
            ),
        ),
    ),
    "gram_precision.md": Page(
        "python bench/gram_precision.py --device cpu",
        "cpu",
        (_c("largest relative error of a Gram against float64", lambda: f"{max(v.gram_errors()):.2e}"),),
        data=(),  # no JSON: the page itself holds its numbers
    ),
    "latency.md": Page(
        "make bench-latency",
        "cpu",
        (
            _c(
                "50% removed, FFN widths ×64: prefill at batch 1, prompt 512",
                lambda: v.md_table("latency.md", "model", "batch 1, prompt 512")[-1]["batch 1, prompt 512"],
            ),
        ),
        stale="measured 2026-11-21 with transformers 5.23.0, before the later engine changes",
    ),
    "latency_default.md": Page(
        f"{v.SPEED_AB} --compile",
        "cpu",
        (
            _c(
                "default recipe, prefill b8×128 over dense at 20% / 50%",
                lambda: " / ".join(v.times(v.latency_default(r, "b8x128_speedup")) for r in (0.2, 0.5)),
            ),
        ),
    ),
    "latency_kv_groups.md": Page(
        "python bench/speed_ab.py --compile",
        "cpu",
        (_c("whole vs free key/value groups: speed", lambda: "table on the page"),),
    ),
    "streaming.md": Page(
        "python bench/streaming.py",
        "cpu",
        (
            _c(
                "1.1B-shaped checkpoint, magnitude: peak RSS streamed vs in memory",
                lambda: v.pair(
                    f"{v.num(v.streaming_row('1.1b', 'stream', 'magnitude')['peak_rss_mb'], 0)} MB",
                    f"{v.num(v.streaming_row('1.1b', 'memory', 'magnitude')['peak_rss_mb'], 0)} MB",
                    " vs ",
                ),
            ),
        ),
        cpu_times=True,
    ),
    "streamed_eval.md": Page(
        "python bench/streamed_eval.py",
        "cpu",
        (
            _c(
                "1.1B perplexity + lm-eval: peak RSS in memory vs streamed",
                lambda: " vs ".join(f"{v.num(r['peak_rss_mb'], 0)} MB" for r in v.data("streamed_eval.json")),
            ),
        ),
        cpu_times=True,
    ),
    "serving.md": Page(
        "python bench/serving.py",
        "cpu",
        (
            _c("GGUF in llama.cpp, 50% removed: batch-1 decode over dense at q4_k_m / f16", v.serving_decode_speedup),
            _c("GGUF f16 in llama.cpp: perplexity against ours, dense / 20% / 50%", v.serving_ppl_diff),
            _c(
                "GGUF q4_k_m in llama.cpp at 50%: decode over dense with 8 blocks + width / FFN widths × 256",
                v.serving_levers,
            ),
        ),
    ),
    "serving_vllm.md": Page(
        "python bench/serving_vllm.py",
        "cpu",
        (_c("vLLM (CPU) serving SmolLM2's vLLM form at 50%: greedy tokens equal to transformers'", v.vllm_same),),
    ),
    "depth.md": Page(
        "python bench/depth.py",
        "cpu",
        (
            _c(
                "SmolLM2, 8 of 30 blocks removed: least-squares stand-in vs plain removal, perplexity",
                v.depth_ls_over_plain,
            ),
        ),
    ),
    "depth_speed.md": Page(
        "python bench/depth_speed.py",
        "cpu",
        (
            _c(
                "SmolLM2 width 50% (default): perplexity; CPU batch-1 decode and prefill over dense",
                lambda: v.depth_speed_claim("width 50%"),
            ),
            _c("SmolLM2 8 of 30 blocks + width to 50%: the same", lambda: v.depth_speed_claim("depth 8 + width, 50%")),
            _c("SmolLM2 8 of 30 blocks (ls stand-in): the same", lambda: v.depth_speed_claim("depth 8 (27%)")),
        ),
    ),
    "depth_gemma3.md": Page(
        "python bench/depth.py --model gemma3 --blocks 4 --no-timing",
        "cpu",
        (
            _c(
                "Gemma 3 270M, 4 of 18 blocks removed plainly (ls refused: normalised FFN output), perplexity: "
                "span by held-aside loss (SLEB) / by angular distance (ShortGPT)",
                lambda: v.depth_plain_spans("depth_gemma3.json"),
            ),
        ),
    ),
    "depth_speed_gemma3.md": Page(
        "python bench/depth_speed.py --model gemma3 --no-timing",
        "cpu",
        (
            _c(
                "Gemma 3 270M at 22% removed, perplexity: width only vs 4 of 18 blocks removed plainly",
                lambda: v.quality_pair("depth_speed_gemma3.json", "width 22%", "depth 4 (22%), none"),
            ),
            _c(
                "Gemma 3 270M at 50% removed, perplexity: width only vs 4 blocks removed plainly + width",
                lambda: v.quality_pair("depth_speed_gemma3.json", "width 50%", "depth 4 + width, 50%, none"),
            ),
        ),
    ),
    "depth_qwen25.md": Page(
        "python bench/depth.py --model qwen25 --blocks 6 --no-timing --selections angular sleb ours",
        "cpu",
        (
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed: least-squares stand-in vs plain removal, perplexity",
                lambda: v.depth_ls_over_plain("depth_qwen25.json"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed plainly, perplexity: span by held-aside loss (SLEB) / "
                "by angular distance (ShortGPT)",
                lambda: v.depth_plain_spans("depth_qwen25.json"),
            ),
        ),
    ),
    "depth_speed_qwen25.md": Page(
        "python bench/depth_speed.py --model qwen25 --no-timing",
        "cpu",
        (
            _c(
                "Qwen2.5-Coder-0.5B at 25% removed, perplexity: width only vs 6 of 24 blocks (ls stand-in)",
                lambda: v.quality_pair("depth_speed_qwen25.json", "width 25%", "depth 6 (25%)"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed, perplexity: ls stand-in vs plain removal",
                lambda: v.quality_pair("depth_speed_qwen25.json", "depth 6 (25%)", "depth 6 (25%), none"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B at 50% removed, perplexity: width only vs 6 blocks + width",
                lambda: v.quality_pair("depth_speed_qwen25.json", "width 50%", "depth 6 + width, 50%"),
            ),
        ),
    ),
    "speed_target.md": Page(
        "python bench/speed_target.py",
        "cpu",
        (
            _c("SmolLM2, target 1.3× batch-1 decode on this CPU: the pick", lambda: v.speed_target_claim(1.3)),
            _c("SmolLM2, target 1.5× batch-1 decode on this CPU: the pick", lambda: v.speed_target_claim(1.5)),
        ),
    ),
}
