"""The generated blocks of docs/ other than the index and the README's."""

from __future__ import annotations

import statistics

from bench.pages.page import renderer
from bench.pages.registry import page_meta
from bench.pages.values import (
    TIME_FILES,
    best_torch_pruning,
    criteria_ppl,
    data,
    dense_criteria,
    draws,
    gb,
    gram_errors,
    head_ratio_ppl,
    kv_ppl,
    matmul_speedups,
    md_tables,
    minilm_dense,
    num,
    obs_cap,
    obs_row,
    pct,
    peak,
    peer,
    ppl,
    product_ratio,
    products_library,
    span,
    streaming_row,
    table,
    time_machine,
    time_row,
)


@renderer("default-recipe")
def render_default_recipe() -> str:
    rows = [
        ["paper's LIAR with FLAP (paper-exact)", *(ppl(criteria_ppl("flap", "liar", r)) for r in (0.2, 0.5))],
        ["uniform shares, OBS selection + `ls` (the default before `obs` counts)"]
        + [ppl(head_ratio_ppl(r, "auto")) for r in (0.2, 0.5)],
        ["`obs` counts, no cap", *(ppl(obs_cap(r, 0.0)["wikipedia"]) for r in (0.2, 0.5))],
        ["`obs` counts, cap 1.2 × the ratio", "–", ppl(obs_cap(0.5, 1.2, "smollm2")["wikipedia"])],
        [
            "**the default** (`criterion: auto`)",
            *(f"**{ppl(obs_row('smollm2', r, 'auto')['wikipedia'])}**" for r in (0.2, 0.5)),
        ],
    ]
    dense, tokens = dense_criteria()
    note = f"\n\nHeld-out Wikipedia perplexity, dense {num(dense, 2)} ({tokens:,} tokens)."
    return table(["SmolLM2-135M recipe", "20%", "50%"], rows) + note


@renderer("gemma-cap")
def render_gemma_cap() -> str:
    capped, free, uni, paper = (
        obs_cap(0.5, 1.2, "gemma3"),
        obs_row("gemma3", 0.5, "obs"),
        obs_row("gemma3", 0.5, "default"),
        obs_row("gemma3", 0.5, "paper"),
    )
    return (
        f"Gemma 3 270M at 50%: capped {ppl(capped['wikipedia'])}, uncapped {ppl(free['wikipedia'])}, uniform shares "
        f"{ppl(uni['wikipedia'])}, paper-exact FLAP + LIAR {ppl(paper['wikipedia'])} (Wikipedia perplexity)."
    )


@renderer("encoder-default")
def render_encoder_default() -> str:
    d = minilm_dense()
    rows = [
        [f"{int(100 * r)}%", *(pct(statistics.mean(draws(k, r)) / d) for k in ("labelled", "unlabelled"))]
        for r in (0.2, 0.3, 0.5)
    ]
    note = f"\n\nShare of dense accuracy ({num(d, 4)}), mean of {len(draws('labelled', 0.5))} calibration draws."
    return table(["MiniLM, removed", "with labels (Kwon et al. + `ls`)", "without labels"], rows) + note


@renderer("head-ratio")
def render_head_ratio() -> str:
    parts = ", ".join(
        f"`{h}` {ppl(head_ratio_ppl(0.2, h))} / {ppl(head_ratio_ppl(0.5, h))}" for h in ("auto", "same", "obs")
    )
    return f"`head_ratio`: {parts} (SmolLM2, 20% / 50%, uniform shares, Wikipedia perplexity)."


@renderer("kv-groups")
def render_kv_groups() -> str:
    return (
        f"Whole groups {ppl(kv_ppl('whole', 0.2))} / {ppl(kv_ppl('whole', 0.5))} against free query heads "
        f"{ppl(kv_ppl('free', 0.2))} / {ppl(kv_ppl('free', 0.5))} (SmolLM2, 20% / 50%, Wikipedia perplexity)."
    )


@renderer("onednn")
def render_onednn() -> str:
    doc = data("cpu_matmul.json")
    rows, machine = doc["rows"], doc["machine"]

    def rate(key: str) -> str:
        return f"{num(min(r[key] for r in rows), 0)}–{num(max(r[key] for r in rows), 0)}"

    auto = doc.get("auto") or {}
    chose = ""
    if auto.get("cpu_matmul_onednn_gflops"):
        lib = "oneDNN" if auto["cpu_matmul"] == "onednn" else "the BLAS"
        chose = (
            f"; `auto` took {lib} there ({num(auto['cpu_matmul_onednn_gflops'], 0)} against "
            f"{num(auto['cpu_matmul_blas_gflops'], 0)} GFLOP/s in its one-time timing)"
        )
    text = (
        f"On the CPU of {page_meta('cpu_matmul.md')[0]}, oneDNN ran the run's projections "
        f"{span(matmul_speedups('proj'))} and its Gram blocks {span(matmul_speedups('gram'))} as fast as the BLAS "
        f"({rate('blas_gflops')} against {rate('onednn_gflops')} GFLOP/s; {machine['cpu']}, {machine['cores']} "
        f"cores){chose}. The paper point takes {num(time_row(128)['prune_seconds'])} s with "
        f"{products_library()} products on {time_machine()} ({data('time.json')['date']})."
    )
    ratios = [f"{product_ratio(n)} on {isa}" for n, isa in TIME_FILES.items() if product_ratio(n)]
    return text + "".join(f" The paper point takes {r}." for r in ratios)


@renderer("gram-precision")
def render_gram_precision() -> str:
    g = gram_errors()
    return (
        f"With 256-token chunks the Gram's relative error against float64 is {min(g):.1e}–{max(g):.1e}, "
        "a float32 product's own rounding."
    )


@renderer("host-memory")
def render_host_memory() -> str:
    day = "2026-11-26"
    rows = [
        [label, num(r["prune_s"]), num(r["peak_rss_mb"], 0)]
        for label, r in (
            ("in memory", streaming_row("135m", "memory", "magnitude", day)),
            ("streamed, freed memory reused (`auto`)", streaming_row("135m", "auto", "magnitude", day)),
            ("streamed, every allocation mapped (`stream`)", streaming_row("135m", "stream", "magnitude", day)),
        )
    ]
    return table(["135M-shaped checkpoint, magnitude + LIAR", "prune s", "peak RSS MB"], rows)


@renderer("streaming")
def render_streaming() -> str:
    s, m = streaming_row("1.1b", "stream", "magnitude"), streaming_row("1.1b", "memory", "magnitude")
    auto = streaming_row("1.1b", "stream", "auto")
    return (
        f"A TinyLlama-1.1B-shaped float32 checkpoint ({num(s['checkpoint_bytes'] / 1e9)} GB) prunes streamed "
        f"at a peak of {num(s['peak_rss_mb'], 0)} MB RSS against {num(m['peak_rss_mb'], 0)} MB in memory "
        f"(magnitude, 16 × 128 samples, {s['date']} and {m['date']}); the default recipe streamed peaks at "
        f"{num(auto['peak_rss_mb'], 0)} MB ({auto['date']})."
    )


@renderer("gpu-stream")
def render_gpu_stream() -> str:
    rows = [
        [r["shape"], str(r["samples"]), r["mode"], r["criterion"], num(r["total_s"]), gb(r["peak_device_mb"])]
        + [num(r["weights_gb"]), f"{r['date']}, {r['device'].split(',')[0]}"]
        for r in data("gpu_stream.json")
        if r.get("activations", "device") == "device"
    ]
    header = ["shape", "samples", "mode", "criterion", "total s", "peak device GB", "bf16 weights GB", "measured on"]
    return table(header, rows)


@renderer("peak-memory")
def render_peak_memory() -> str:
    s, r = "statistics kept, 8824 of 11008 kept", "activations device, 0 held aside"
    solve = f"{num(peak('solve', s, 'before (6d6d779)'), 0)} → {num(peak('solve', s, 'after'), 0)} MiB"
    run = f"{num(peak('run', r, 'before (6d6d779)'))} → {num(peak('run', r, 'after'))} MiB"
    return (
        f"The FFN's refit at 7B widths: {solve} beyond its Gram; a whole 7B-proportioned run: {run} "
        "(CPU, the engine's own code)."
    )


@renderer("gpu-activations")
def render_gpu_activations() -> str:
    rows = [
        [f"{heading.split(':')[0]}, {heading.rsplit('on one ', 1)[-1]}", r["activations"].split(" (")[0]]
        + [r[k].strip("*") for k in ("seconds", "peak GB", "× bf16 weights (13.5 GB)")]
        for heading, table_rows in md_tables("gpu_liar.md", "activations", "peak GB")
        for r in table_rows
    ]
    return table(["7B-shaped, 1024 samples: run", "activations", "s", "peak GB", "× bf16 weights"], rows)


@renderer("peers")
def render_peers() -> str:
    rows = []
    for r in (0.2, 0.5):
        tp = best_torch_pruning(r)
        rows.append(
            [
                f"{int(100 * r)}%",
                ppl(peer(f"smollm2|ours|default|{r}")["perplexity"]),
                ppl(peer(f"smollm2|ours|best|{r}")["perplexity"]),
                f"{ppl(tp['perplexity'])} ({tp['label'].removeprefix('Torch-Pruning ')})",
                ppl(peer(f"smollm2|modelopt|fastnas|{r}")["perplexity"]),
            ]
        )
    dense = data("peers.json")["dense"]["smollm2|ours"]["perplexity"]
    header = ["SmolLM2, removed", "ours, default", "ours, Kwon counts + OBS + `ls`", "best Torch-Pruning"]
    note = f"\n\nHeld-out Wikipedia perplexity, dense {num(dense, 2)}; the classifier's rows are on the page."
    return table([*header, "ModelOpt FastNAS"], rows) + note
