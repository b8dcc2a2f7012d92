"""docs/results/quantize.md and its picture (figures/quantize.svg) from quantize.json (``bench/quantize.py``)."""

from __future__ import annotations

import math
from pathlib import Path

TYPES = ("f16", "q8_0", "q5_k_m", "q4_k_m", "q3_k_m", "iq3_xxs")
WEIGHTED = ("q5_k_m", "q4_k_m", "q3_k_m", "iq3_xxs")  # types the importance matrix changes
TARGETS = {"0.5": 0.02, "0.5-depth8": 0.05}  # q4_k_m with the matrix over f16, at most
COLOURS = {"dense": "#1f2937", "0.2": "#2563eb", "0.35": "#059669", "0.5": "#d97706", "0.5-depth8": "#dc2626"}
W, H, PAD = 720, 440, 60


def points(data: dict) -> list[dict]:
    """Every file as a point: model, type, weighted, MiB, perplexity."""
    out = []
    for model, row in data["models"].items():
        for key, f in row["files"].items():
            quant, _, w = key.partition("+")
            out.append({"model": model, "type": quant, "imatrix": bool(w), "mib": f["mib"], "ppl": f["perplexity"]})
    return out


def svg(data: dict, title: str = "SmolLM2-135M") -> str:
    """Perplexity (log scale) against file size: one colour per model, hollow without the matrix."""
    pts = points(data)
    x0, x1 = 0.0, max(p["mib"] for p in pts) * 1.05
    y0, y1 = math.log(min(p["ppl"] for p in pts) * 0.9), math.log(max(p["ppl"] for p in pts) * 1.1)

    def xy(p: dict) -> tuple[float, float]:
        x = PAD + (p["mib"] - x0) / (x1 - x0) * (W - 2 * PAD)
        y = H - PAD - (math.log(p["ppl"]) - y0) / (y1 - y0) * (H - 2 * PAD)
        return round(x, 1), round(y, 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}: held-out perplexity in '
        "llama.cpp against file size</text>",
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<text x="{W / 2}" y="{H - 20}" text-anchor="middle">file size (MiB)</text>',
        f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">perplexity (log)</text>',
    ]
    for mib in range(0, int(x1) + 1, 50):
        x = PAD + (mib - x0) / (x1 - x0) * (W - 2 * PAD)
        parts.append(f'<text x="{x:.1f}" y="{H - PAD + 16}" text-anchor="middle">{mib}</text>')
    for ppl in (10, 20, 30, 50, 100, 200, 500, 1000):
        if y0 <= math.log(ppl) <= y1:
            y = H - PAD - (math.log(ppl) - y0) / (y1 - y0) * (H - 2 * PAD)
            parts.append(f'<text x="{PAD - 6}" y="{y + 4:.1f}" text-anchor="end">{ppl}</text>')
    for p in pts:
        x, y = xy(p)
        colour = COLOURS.get(p["model"], "#6b7280")
        fill = colour if p["imatrix"] else "white"
        parts.append(f'<circle cx="{x}" cy="{y}" r="4" stroke="{colour}" fill="{fill}"><title>'
                     f'{p["model"]} {p["type"]}{" + imatrix" if p["imatrix"] else ""}: {p["ppl"]:.2f}, '
                     f'{p["mib"]} MiB</title></circle>')  # fmt: skip
    for i, (model, colour) in enumerate(c for c in COLOURS.items() if c[0] in data["models"]):
        y = PAD + 16 * i
        parts.append(f'<circle cx="{W - PAD - 150}" cy="{y}" r="4" fill="{colour}" stroke="{colour}"/>')
        parts.append(f'<text x="{W - PAD - 140}" y="{y + 4}">{data["models"][model]["label"]}</text>')
    y = PAD + 16 * len(data["models"])
    parts.append(f'<circle cx="{W - PAD - 150}" cy="{y}" r="4" fill="white" stroke="#6b7280"/>')
    parts.append(f'<text x="{W - PAD - 140}" y="{y + 4}">hollow: no importance matrix</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def best_under(data: dict, mib: float) -> dict | None:
    """The point with the lowest perplexity at or below ``mib``."""
    pts = [p for p in points(data) if p["mib"] <= mib]
    return min(pts, key=lambda p: p["ppl"]) if pts else None


def _name(p: dict, data: dict) -> str:
    return f"{data['models'][p['model']]['label']}, {p['type']}{' + imatrix' if p['imatrix'] else ''}"


def findings(data: dict) -> list[str]:
    dense = data["models"]["dense"]["files"]
    lines = []
    for model, bound in TARGETS.items():
        if model not in data["models"]:
            continue
        f = data["models"][model]["files"]
        for key in ("q4_k_m", "q4_k_m+imatrix"):
            over = f[key]["perplexity"] / f["f16"]["perplexity"] - 1
            what = "with the importance matrix" if "+" in key else "without it"
            target = f" (target ≤ {bound:.0%}: {'met' if over <= bound else 'not met'})" if "+" in key else ""
            lines.append(f"- {data['models'][model]['label']}: q4_k_m {what} {over:+.1%} over f16{target}.")
    q4 = dense["q4_k_m"]["mib"]
    best = best_under(data, q4)
    if best:
        ref = dense["q4_k_m"]["perplexity"]
        lines.append(f"- Lowest perplexity at or below the dense q4_k_m file's {q4} MiB: {_name(best, data)}, "
                     f"{best['ppl']:.2f} at {best['mib']} MiB (dense q4_k_m: {ref:.2f}).")  # fmt: skip
    q3 = min((dense[k] for k in ("q3_k_m", "q3_k_m+imatrix")), key=lambda f: f["perplexity"])
    rivals = [
        p for p in points(data) if p["model"] != "dense" and p["mib"] <= q3["mib"] and p["ppl"] < q3["perplexity"]
    ]
    if rivals:
        top = min(rivals, key=lambda p: p["ppl"])
        lines.append(f"- A pruned + quantized file beats dense q3_k_m ({q3['perplexity']:.2f}, {q3['mib']} MiB) at "
                     f"equal or smaller size: {_name(top, data)}, {top['ppl']:.2f} at {top['mib']} MiB.")  # fmt: skip
    else:
        lines.append(f"- No pruned + quantized file beats dense q3_k_m ({q3['perplexity']:.2f} at {q3['mib']} MiB) "
                     "at equal or smaller size.")  # fmt: skip
    return lines


def table(data: dict, types: tuple[str, ...] = TYPES) -> list[str]:
    head = "| model | " + " | ".join(types) + " |"
    lines = [head, "|---|" + "---|" * len(types)]
    for row in data["models"].values():
        f, cells = row["files"], []
        for t in types:
            plain, weighted = f.get(t), f.get(f"{t}+imatrix")
            text = f"{plain['perplexity']:.2f}" if plain else "—"
            if weighted:
                text += f" / **{weighted['perplexity']:.2f}**"
            size = (plain or weighted)["mib"]
            cells.append(f"{text} ({size:g} MiB)")
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: perplexity without / **with** the importance matrix (where measured), the file's size.")
    return lines


def fallback_lines(data: dict) -> list[str]:
    out = []
    for row in data["models"].values():
        falls = row["files"].get("q4_k_m", {}).get("fallbacks", [])
        text = "; ".join(f"{f['tensors']} × {f['role']} ({f['row']}) → {f['type']}" for f in falls) or "none"
        out.append(f"- {row['label']}: {text}")
    return out


def qwen_section(data: dict, out: Path) -> list[str]:
    """Qwen2.5-Coder-0.5B's part of the page (``bench/quantize.py --qwen``) and its picture."""
    figure = out.parent / "figures" / "quantize_qwen25.svg"
    figure.write_text(svg(data, "Qwen2.5-Coder-0.5B"))
    models, lines = data["models"], []
    for row in models.values():
        f = row["files"]
        over = [f"{f[k]['perplexity'] / f['f16']['perplexity'] - 1:+.1%}" for k in ("q4_k_m", "q4_k_m+imatrix")]
        lines.append(f"- {row['label']}: q4_k_m over f16 {over[0]} without the importance matrix, {over[1]} with it.")
    rounded = models.get("0.5-k256", {}).get("files", {}).get("q4_k_m", {}).get("fallbacks")
    if rounded is not None:
        pruned = [x for x in rounded if x["role"] in ("ffn_down", "attn_output")]
        said = "; ".join(f"{x['tensors']} × {x['role']} → {x['type']}" for x in pruned) or "none"
        lines.append(f"- With the 256 rounding at 50%, `ffn_down` / `attn_output` tensors that fall back from their "
                     f"K type in q4_k_m: {said} (target: none, {'met' if not pruned else 'not met'}).")  # fmt: skip
    return [
        "## Qwen2.5-Coder-0.5B-Instruct",
        "",
        f"Measured {data['date']} (`python bench/quantize.py --qwen`, {data.get('seconds', 0) / 60:.0f} min): dense "
        "and pruned by the default recipe at 50%, with and without `round_to: {k_quant: true}`; fewer files per model "
        "than SmolLM2's (f16, q4_k_m without and with the matrix, q3_k_m with it). Same text and windows.",
        "",
        "![Qwen2.5-Coder-0.5B: perplexity against file size](figures/quantize_qwen25.svg)",
        "",
        *table(data, ("f16", "q4_k_m", "q3_k_m")),
        "",
        *lines,
        "",
        "Tensors that fell back from their K type in q4_k_m (hidden size 896 is not a multiple of 256):",
        *fallback_lines(data),
        "",
    ]


def write(data: dict, out: Path, qwen: dict | None = None) -> None:
    m = data["machine"]
    figure = out.parent / "figures" / out.with_suffix(".svg").name
    figure.parent.mkdir(exist_ok=True)
    figure.write_text(svg(data))
    lines = [
        "# Prune and quantize: bytes for quality",
        "",
        f"Measured {data['date']} on {m.get('cpu', m.get('processor', '?'))}, {m.get('threads')} threads, "
        f"llama-cpp-python {m.get('llama_cpp_python')} (`python bench/quantize.py`, "
        f"{data.get('seconds', 0) / 60:.0f} min).",
        "SmolLM2-135M-Instruct pruned by the default recipe (the serving page's checkpoints), written as GGUF and "
        "quantized by llama.cpp's own quantizer, with and without the importance matrix `liar export --imatrix auto` "
        "gathers from the checkpoint's calibration text (128 windows of 128 tokens, one forward pass). Perplexity is "
        "llama.cpp's on 20 windows of 512 tokens of held-out Wikipedia text.",
        "",
        "![perplexity against file size](figures/quantize.svg)",
        "",
        *table(data),
        "",
        "## Findings",
        *findings(data),
        "",
        "## Tensors that fell back from their K type in q4_k_m",
        "SmolLM2's hidden size (576) is not a multiple of 256, so every matrix that reads the hidden state "
        "(q/k/v, gate/up) falls back whatever the pruning; the pruned widths decide `ffn_down` and `attn_output`.",
        *fallback_lines(data),
        "",
        *(qwen_section(qwen, out) if qwen else []),
    ]
    out.write_text("\n".join(lines))


def q4_over_f16(data: dict, model: str) -> str | None:
    """The results index's claim: q4_k_m without / with the matrix over f16, for one model."""
    f = data.get("models", {}).get(model, {}).get("files")
    if not f or "q4_k_m+imatrix" not in f:
        return None
    base = f["f16"]["perplexity"]
    return " / ".join(f"{f[k]['perplexity'] / base - 1:+.1%}" for k in ("q4_k_m", "q4_k_m+imatrix"))
