"""The generated blocks of docs/ other than the index and the README's."""

from __future__ import annotations

import statistics

from bench.pages import values as v
from bench.pages.page import renderer
from bench.pages.registry import page_meta


@renderer("default-recipe")
def render_default_recipe() -> str:
    rows = [
        ["paper's LIAR with FLAP (paper-exact)", *(v.ppl(v.criteria_ppl("flap", "liar", r)) for r in (0.2, 0.5))],
        ["uniform shares, OBS selection + `ls` (the default before `obs` counts)"]
        + [v.ppl(v.head_ratio_ppl(r, "auto")) for r in (0.2, 0.5)],
        ["`obs` counts, no cap", *(v.ppl(v.obs_cap(r, 0.0)["wikipedia"]) for r in (0.2, 0.5))],
        ["`obs` counts, cap 1.2 × the ratio", "–", v.ppl(v.obs_cap(0.5, 1.2, "smollm2")["wikipedia"])],
        [
            "**the default** (`criterion: auto`)",
            *(f"**{v.ppl(v.obs_row('smollm2', r, 'auto')['wikipedia'])}**" for r in (0.2, 0.5)),
        ],
    ]
    dense, tokens = v.dense_criteria()
    note = f"\n\nHeld-out Wikipedia perplexity, dense {v.num(dense, 2)} ({tokens:,} tokens)."
    return v.table(["SmolLM2-135M recipe", "20%", "50%"], rows) + note


@renderer("gemma-cap")
def render_gemma_cap() -> str:
    capped, free, uni, paper = (
        v.obs_cap(0.5, 1.2, "gemma3"),
        v.obs_row("gemma3", 0.5, "obs"),
        v.obs_row("gemma3", 0.5, "default"),
        v.obs_row("gemma3", 0.5, "paper"),
    )
    return (
        f"Gemma 3 270M at 50%: capped {v.ppl(capped['wikipedia'])}, uncapped {v.ppl(free['wikipedia'])}, "
        f"uniform shares {v.ppl(uni['wikipedia'])}, paper-exact FLAP + LIAR {v.ppl(paper['wikipedia'])} "
        "(Wikipedia perplexity)."
    )


@renderer("encoder-default")
def render_encoder_default() -> str:
    d = v.minilm_dense()
    rows = [
        [f"{int(100 * r)}%", *(v.pct(statistics.mean(v.draws(k, r)) / d) for k in ("labelled", "unlabelled"))]
        for r in (0.2, 0.3, 0.5)
    ]
    note = f"\n\nShare of dense accuracy ({v.num(d, 4)}), mean of {len(v.draws('labelled', 0.5))} calibration draws."
    return v.table(["MiniLM, removed", "with labels (Kwon et al. + `ls`)", "without labels"], rows) + note


@renderer("head-ratio")
def render_head_ratio() -> str:
    parts = ", ".join(
        f"`{h}` {v.ppl(v.head_ratio_ppl(0.2, h))} / {v.ppl(v.head_ratio_ppl(0.5, h))}" for h in ("auto", "same", "obs")
    )
    return f"`head_ratio`: {parts} (SmolLM2, 20% / 50%, uniform shares, Wikipedia perplexity)."


@renderer("kv-groups")
def render_kv_groups() -> str:
    return (
        f"Whole groups {v.ppl(v.kv_ppl('whole', 0.2))} / {v.ppl(v.kv_ppl('whole', 0.5))} against free query heads "
        f"{v.ppl(v.kv_ppl('free', 0.2))} / {v.ppl(v.kv_ppl('free', 0.5))} (SmolLM2, 20% / 50%, Wikipedia perplexity)."
    )


@renderer("onednn")
def render_onednn() -> str:
    doc = v.data("cpu_matmul.json")
    rows, machine = doc["rows"], doc["machine"]

    def rate(key: str) -> str:
        return f"{v.num(min(r[key] for r in rows), 0)}–{v.num(max(r[key] for r in rows), 0)}"

    auto = doc.get("auto") or {}
    chose = ""
    if auto.get("cpu_matmul_onednn_gflops"):
        lib = "oneDNN" if auto["cpu_matmul"] == "onednn" else "the BLAS"
        chose = (
            f"; `auto` took {lib} there ({v.num(auto['cpu_matmul_onednn_gflops'], 0)} against "
            f"{v.num(auto['cpu_matmul_blas_gflops'], 0)} GFLOP/s in its one-time timing)"
        )
    text = (
        f"On the CPU of {page_meta('cpu_matmul.md')[0]}, oneDNN ran the run's projections "
        f"{v.span(v.matmul_speedups('proj'))} and its Gram blocks {v.span(v.matmul_speedups('gram'))} "
        "as fast as the BLAS "
        f"({rate('blas_gflops')} against {rate('onednn_gflops')} GFLOP/s; {machine['cpu']}, {machine['cores']} "
        f"cores){chose}. The paper point takes {v.num(v.time_row(128)['prune_seconds'])} s with "
        f"{v.products_library()} products on {v.time_machine()} ({v.data('time.json')['date']})."
    )
    ratios = [f"{v.product_ratio(n)} on {isa}" for n, isa in v.TIME_FILES.items() if v.product_ratio(n)]
    return text + "".join(f" The paper point takes {r}." for r in ratios)


@renderer("gram-precision")
def render_gram_precision() -> str:
    g = v.gram_errors()
    return (
        f"With 256-token chunks the Gram's relative error against float64 is {min(g):.1e}–{max(g):.1e}, "
        "a float32 product's own rounding."
    )


@renderer("host-memory")
def render_host_memory() -> str:
    day = "2026-11-26"
    rows = [
        [label, v.num(r["prune_s"]), v.num(r["peak_rss_mb"], 0)]
        for label, r in (
            ("in memory", v.streaming_row("135m", "memory", "magnitude", day)),
            ("streamed, freed memory reused (`auto`)", v.streaming_row("135m", "auto", "magnitude", day)),
            ("streamed, every allocation mapped (`stream`)", v.streaming_row("135m", "stream", "magnitude", day)),
        )
    ]
    return v.table(["135M-shaped checkpoint, magnitude + LIAR", "prune s", "peak RSS MB"], rows)


@renderer("streaming")
def render_streaming() -> str:
    s, m = v.streaming_row("1.1b", "stream", "magnitude"), v.streaming_row("1.1b", "memory", "magnitude")
    auto = v.streaming_row("1.1b", "stream", "auto")
    return (
        f"A TinyLlama-1.1B-shaped float32 checkpoint ({v.num(s['checkpoint_bytes'] / 1e9)} GB) prunes streamed "
        f"at a peak of {v.num(s['peak_rss_mb'], 0)} MB RSS against {v.num(m['peak_rss_mb'], 0)} MB in memory "
        f"(magnitude, 16 × 128 samples, {s['date']} and {m['date']}); the default recipe streamed peaks at "
        f"{v.num(auto['peak_rss_mb'], 0)} MB ({auto['date']})."
    )


@renderer("gpu-stream")
def render_gpu_stream() -> str:
    rows = [
        [r["shape"], str(r["samples"]), r["mode"], r["criterion"], v.num(r["total_s"]), v.gb(r["peak_device_mb"])]
        + [v.num(r["weights_gb"]), f"{r['date']}, {r['device'].split(',')[0]}"]
        for r in v.data("gpu_stream.json")
        if r.get("activations", "device") == "device"
    ]
    header = ["shape", "samples", "mode", "criterion", "total s", "peak device GB", "bf16 weights GB", "measured on"]
    return v.table(header, rows)


@renderer("peak-memory")
def render_peak_memory() -> str:
    s, r = "statistics kept, 8824 of 11008 kept", "activations device, 0 held aside"
    solve = f"{v.num(v.peak('solve', s, 'before (6d6d779)'), 0)} → {v.num(v.peak('solve', s, 'after'), 0)} MiB"
    run = f"{v.num(v.peak('run', r, 'before (6d6d779)'))} → {v.num(v.peak('run', r, 'after'))} MiB"
    return (
        f"The FFN's refit at 7B widths: {solve} beyond its Gram; a whole 7B-proportioned run: {run} "
        "(CPU, the engine's own code)."
    )


@renderer("gpu-activations")
def render_gpu_activations() -> str:
    rows = [
        [f"{heading.split(':')[0]}, {heading.rsplit('on one ', 1)[-1]}", r["activations"].split(" (")[0]]
        + [r[k].strip("*") for k in ("seconds", "peak GB", "× bf16 weights (13.5 GB)")]
        for heading, table_rows in v.md_tables("gpu_liar.md", "activations", "peak GB")
        for r in table_rows
    ]
    return v.table(["7B-shaped, 1024 samples: run", "activations", "s", "peak GB", "× bf16 weights"], rows)


@renderer("peers")
def render_peers() -> str:
    rows = []
    for r in (0.2, 0.5):
        tp = v.best_torch_pruning(r)
        rows.append(
            [
                f"{int(100 * r)}%",
                v.ppl(v.peer(f"smollm2|ours|default|{r}")["perplexity"]),
                v.ppl(v.peer(f"smollm2|ours|best|{r}")["perplexity"]),
                f"{v.ppl(tp['perplexity'])} ({tp['label'].removeprefix('Torch-Pruning ')})",
                v.ppl(v.peer(f"smollm2|modelopt|fastnas|{r}")["perplexity"]),
            ]
        )
    dense = v.data("peers.json")["dense"]["smollm2|ours"]["perplexity"]
    header = ["SmolLM2, removed", "ours, default", "ours, Kwon counts + OBS + `ls`", "best Torch-Pruning"]
    note = f"\n\nHeld-out Wikipedia perplexity, dense {v.num(dense, 2)}; the classifier's rows are on the page."
    return v.table([*header, "ModelOpt FastNAS"], rows) + note
