"""The README's results block."""

from __future__ import annotations

import statistics

from bench.pages import values as v
from bench.pages.page import renderer
from bench.pages.registry import page_meta


def _model_rows() -> list[list[str]]:
    """The README's rows of what the pruned models keep and of the CPU prune's time."""
    dense, tokens = v.dense_criteria()
    t = v.time_row(128)
    smollm2 = "; ".join(
        f"{label} {v.ppl(fn(0.2))} / {v.ppl(fn(0.5))}"
        for label, fn in (
            ("default", lambda r: v.peer(f"smollm2|ours|default|{r}")["perplexity"]),
            ("paper's LIAR with FLAP", lambda r: v.criteria_ppl("flap", "liar", r)),
            ("best Torch-Pruning", lambda r: v.best_torch_pruning(r)["perplexity"]),
        )
    )
    rows = [
        [
            "SmolLM2-135M, held-out perplexity, 20% / 50% of block parameters removed",
            smollm2,
            f"dense {v.num(dense, 2)}; {tokens:,} tokens of held-out Wikipedia",
            "[peers](docs/results/peers.md), [criteria](docs/results/criteria.md)",
        ],
        [
            "MiniLM sentiment classifier, accuracy kept at 50% (default with labels)",
            f"{v.pct(statistics.mean(v.draws('labelled', 0.5)) / v.minilm_dense())} of dense",
            f"dense {v.num(v.minilm_dense(), 4)}; mean of {len(v.draws('labelled', 0.5))} calibration draws",
            "[minilm-draws](docs/results/minilm-draws.md)",
        ],
        [
            "CPU prune, paper LIAR, 20%, 128 × 128 calibration tokens",
            f"{v.num(t['prune_seconds'])} s; 1024 samples: {v.times(v.scaling())} as long",
            f"{v.data('time.json')['date']}, {v.time_machine()}, {v.products_library()} products",
            "[time](docs/results/time.md)",
        ],
    ]
    for name, isa in v.TIME_FILES.items():
        ratio = v.product_ratio(name)
        if ratio:
            page = name.removesuffix(".json")
            rows.append(["the same prune against the machine", ratio, isa, f"[{page}](docs/results/{page}.md)"])
    return rows


@renderer("readme")
def render_readme() -> str:
    s70 = v.gpu_stream(v.S70)
    rows = _model_rows() + [
        [
            "GPU prune, LLaMA-7B-shaped, LIAR, 128 / 1024 samples",
            f"{v.gpu_liar_after('7B', '128', 'liar, holdout 8')} / {v.gpu_liar_after('7B', '1024', 'liar')} s",
            f"{page_meta('gpu_liar.md')[0]}, {page_meta('gpu_liar.md')[1].split(', ')[0]}, bf16, random weights",
            "[gpu_liar](docs/results/gpu_liar.md)",
        ],
        [
            "70B-shaped model streamed on one GPU, 128 samples",
            f"{v.gb(s70['peak_device_mb'])} GB of device memory for {v.num(s70['weights_gb'], 0)} GB of weights",
            f"{s70['date']}, {s70['device'].split(',')[0]}, bf16, random weights",
            "[gpu_stream](docs/results/gpu_stream.md)",
        ],
        [
            "pruned SmolLM2 (default recipe), prefill b8×128 over dense, 20% / 50%",
            " / ".join(v.times(v.latency_default(r, "b8x128_speedup")) for r in (0.2, 0.5)),
            f"{page_meta('latency_default.md')[0]}, {v.data('latency_default.json')['machine']['cpu']}, "
            f"{v.data('latency_default.json')['machine']['cores']} cores, float32",
            "[latency_default](docs/results/latency_default.md)",
        ],
        [
            "the default recipe's checkpoints in stock llama.cpp (GGUF f16): perplexity against ours, "
            "dense / 20% / 50%",
            v.serving_ppl_diff(),
            f"{page_meta('serving.md')[0]}, SmolLM2-135M, same token windows",
            "[serving](docs/results/serving.md)",
        ],
        [
            "what vLLM's form costs (`query_heads: uniform`), SmolLM2 perplexity at 20% / 50%",
            v.query_heads_cost().replace(" vs ", " → "),
            f"{v.data('query_heads.json')['date']}, default recipe → the same with every layer keeping as many "
            "query heads",
            "[query_heads](docs/results/query_heads.md)",
        ],
        [
            "depth pruning, SmolLM2, 8 of 30 blocks: least-squares stand-in vs plain removal, perplexity",
            v.depth_ls_over_plain(),
            f"{v.data('depth.json')['date']}, the span chosen by held-aside loss",
            "[depth](docs/results/depth.md)",
        ],
        [
            "SmolLM2 on a CPU, perplexity and batch-1 decode speed-up: width 50% / 8 blocks + width to 50%",
            f"{v.depth_speed_claim('width 50%')} / {v.depth_speed_claim('depth 8 + width, 50%')}",
            f"{v.data('depth_speed.json')['date']}, {v.data('depth_speed.json')['machine']}, eager",
            "[depth_speed](docs/results/depth_speed.md)",
        ],
        [
            "7B-shaped on a GPU, compiled batch-1 decode over dense: 50% width / 8 of 32 blocks + 20% width (40%)",
            v.gpu_depth_decode(),
            f"{page_meta('gpu_latency_depth.md')[0]}, NVIDIA H100, bf16; SmolLM2 perplexity of the like "
            "structures (width 50% / 8 of 30 blocks and width to 40%) "
            f"{v.num(v.depth_speed_row('width 50%')['perplexity'], 1)} / "
            f"{v.num(v.untimed_ppl('depth 8 + width, 40%'), 1)}",
            "[gpu_latency_depth](docs/results/gpu_latency_depth.md)",
        ],
    ]
    if (v.RESULTS / "speed_target.json").exists():
        rows.append(
            [
                "speed target on a CPU: SmolLM2 pruned to 1.3× / 1.5× batch-1 decode",
                f"{v.speed_target_claim(1.3)}; {v.speed_target_claim(1.5)}",
                f"{v.data('speed_target.json')['date']}, {v.data('speed_target.json')['machine']}",
                "[speed_target](docs/results/speed_target.md)",
            ]
        )
    return v.table(["claim", "value", "conditions", "page"], rows)
