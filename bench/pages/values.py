"""What the results pages are made of: reading docs/results/ (its JSON, or a page's own table), the
number formats, and the lookups the claims and blocks quote. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"

# CPU prune and evaluation times measured before this date ran torch's BLAS, not oneDNN
# (core/kernels/cpu_matmul.py): they are not comparable with later ones.
ONEDNN_DATE = "2026-11-27"


# ---------------------------------------------------------------- reading results


@cache
def data(name: str):
    """A results JSON file of docs/results/, parsed once."""
    return json.loads((RESULTS / name).read_text())


@cache
def page_text(name: str) -> str:
    return (RESULTS / name).read_text()


def row_of(file: str, rows: str = "rows", /, **fields) -> dict:
    """The first row of a results file (its list ``rows``, or the file when it is a list) with these ``fields``."""
    d = data(file)
    found = (r for r in (d if isinstance(d, list) else d[rows]) if all(r.get(k) == v for k, v in fields.items()))
    row = next(found, None)
    if row is None:
        raise KeyError(f"{file}: no row with {fields}")
    return row


def md_tables(page: str, first_header: str, has: str | None = None) -> list[tuple[str, list[dict[str, str]]]]:
    """Every table on ``page`` whose first header cell is ``first_header`` (and which has a column ``has``):
    ``(the section heading above it, its rows as dicts from header to cell)``."""
    lines, found, heading = page_text(page).splitlines(), [], ""
    for i, line in enumerate(lines):
        heading = line.lstrip("# ") if line.startswith("#") else heading
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")) and cells[0] == first_header:
            if has is None or has in cells:
                rows = []
                for row in lines[i + 2 :]:
                    if not row.startswith("|"):
                        break
                    rows.append(dict(zip(cells, (c.strip() for c in row.strip().strip("|").split("|")))))
                found.append((heading, rows))
    return found


def md_table(page: str, first_header: str, has: str | None = None) -> list[dict[str, str]]:
    """The rows of the first table ``md_tables`` finds."""
    tables = md_tables(page, first_header, has)
    if not tables:
        raise KeyError(f"{page}: no table whose first column is {first_header!r}")
    return tables[0][1]


def num(x: float, digits: int = 1) -> str:
    """A measured value as the docs print it: fixed digits, thousands separated."""
    return f"{x:,.{digits}f}"


def ppl(x: float) -> str:
    """A perplexity: one decimal below 1,000, none above."""
    return num(x, 1 if x < 1000 else 0)


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def times(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}×"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------- values, one function per quantity


def criteria_ppl(criterion: str, method: str, ratio: float) -> float:
    return row_of("criteria.json", criterion=criterion, method=method, ratio=ratio)["perplexity"]


def dense_criteria() -> tuple[float, int]:
    """SmolLM2's dense perplexity under the criteria protocol and its evaluated tokens."""
    row = row_of("kv_groups.json", groups="dense")
    return row["perplexity"], row["eval_tokens"]


def obs_row(model: str, ratio: float, recipe: str) -> dict:
    return row_of("obs_allocation.json", model=model, ratio=ratio, recipe=recipe)


def obs_cap(ratio: float, cap: float, model: str | None = None) -> dict:
    for r in data("obs_allocation.json")["rows"]:
        if r["ratio"] == ratio and r["cap"] == cap and r.get("model") == model and r.get("recipe") in (None, "obs"):
            return r
    raise KeyError((ratio, cap, model))


def peer(key: str) -> dict:
    return data("peers.json")["cells"][key]


def best_torch_pruning(ratio: float) -> dict:
    cells = [
        c
        for k, c in data("peers.json")["cells"].items()
        if k.startswith("smollm2|torch-pruning") and k.endswith(f"|{ratio}") and "perplexity" in c
    ]
    return min(cells, key=lambda c: c["perplexity"])


def draws(recipe: str, ratio: float) -> list[float]:
    cells = data("minilm-draws.json")["cells"]
    return [c["accuracy"] for k, c in cells.items() if k.split()[:2] == [recipe, str(ratio)]]


def minilm_dense() -> float:
    return data("minilm-draws.json")["dense"]


def time_row(samples: int, name: str = "time.json") -> dict:
    return row_of(name, samples=samples)


def time_machine() -> str:
    m = data("time.json")["machine"]
    return f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}"


def products_library(name: str = "time.json") -> str:
    """Which library multiplied a time page's float32 products (the ``auto`` choice of its runs)."""
    names = {r.get("cpu_matmul") for r in data(name)["rows"]} - {None}
    return " / ".join(sorted("oneDNN" if n == "onednn" else "BLAS" for n in names)) or "BLAS"


def scaling() -> float:
    """The prune time at 1024 samples over that at 128."""
    return time_row(1024)["prune_seconds"] / time_row(128)["prune_seconds"]


def gram_errors() -> list[float]:
    """Relative errors of the Grams against float64, from gram_precision.md's table (no JSON)."""
    return [float(r["‖G − G64‖ / ‖G64‖"]) for r in md_table("gram_precision.md", "projection")]


def matmul_speedups(kind: str) -> list[float]:
    rows = data("cpu_matmul.json")["rows"]
    return [r["speedup"] for r in rows if r["product"].startswith("Gram") == (kind == "gram")]


def streaming_row(shape: str, mode: str, criterion: str, date: str | None = None) -> dict:
    rows = [
        r for r in data("streaming.json")["rows"] if (r["shape"], r["mode"], r["criterion"]) == (shape, mode, criterion)
    ]
    rows = [r for r in rows if date is None or r["date"] == date]
    return max(rows, key=lambda r: r["date"])


def gpu_stream(run: str, criterion: str = "magnitude") -> dict:
    return row_of("gpu_stream.json", run=run, criterion=criterion)


def gb(mb: float) -> str:
    """Device memory recorded in MB (10⁶ bytes), printed in GB."""
    return num(mb / 1000)


def gpu_liar_after(shape: str, samples: str, method: str) -> str:
    for r in md_table("gpu_liar.md", "shape"):
        if (r["shape"], r["samples"], r["method"]) == (shape, samples, method):
            return r["after (s)"].strip("*")
    raise KeyError((shape, samples, method))


# gpu_liar.md's section of the 2026-11-27 H200 run (its heading starts so)
LIAR_H200 = "2026-11-27: after the block-loop redesign"


def section_rows(page: str, heading: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first table under the heading that starts with ``heading``."""
    return next(rows for h, rows in md_tables(page, first_header) if h.startswith(heading))


def gpu_liar_recompute() -> str:
    r = next(
        r for r in section_rows("gpu_liar.md", LIAR_H200, "activations") if r["activations"].startswith("recompute")
    )
    return f"{r['seconds'].strip('*')} s / {r['× bf16 weights (13.5 GB)'].strip('*')}"


def gpu_liar_shape(shape: str, samples: str) -> dict[str, str]:
    rows = section_rows("gpu_liar.md", LIAR_H200, "shape")
    return next(r for r in rows if (r["shape"], r["samples"]) == (shape, samples))


def latency_default(ratio: float, key: str) -> float:
    return row_of("latency_default.json", ratio=ratio, default=True)[key]


def gpu_latency(model: str, key: str, name: str = "gpu_latency.json") -> float:
    return row_of(name, model=model)[key]


def head_ratio_ppl(ratio: float, head_ratio) -> float:
    return row_of("head_ratio.json", ratio=ratio, head_ratio=head_ratio)["perplexity"]


def kv_ppl(groups: str, ratio: float) -> float:
    return row_of("kv_groups.json", groups=groups, ratio=ratio, round_heads=None)["perplexity"]  # not heads × N


def peak(part: str, setting: str, label: str) -> float:
    return row_of("peak_memory.json", part=part, setting=setting, label=label)["peak_mib"]


def floor_seconds(r: dict) -> float | None:
    """The least a prune that runs the model can take on this CPU: the model's own forward over the
    calibration windows (timed), plus the products the prune makes beyond that forward's (statistics,
    solves, error report), each timed at its own shape. None for a row without both measurements."""
    if "own_product_seconds" not in r or "forward_own_product_seconds" not in r:
        return None
    return r["forward_seconds"] + r["own_product_seconds"] - r["forward_own_product_seconds"]


# bench/speed.py time writes time.json; with --isa avx2 (a CPU without AVX-512) time_avx2.json
TIME_FILES = {"time.json": "this CPU's own kernels", "time_avx2.json": "AVX2-only settings"}


def product_ratio(name: str = "time.json") -> str | None:
    """Prune time over its matrix products' time at the GEMM rate measured in the same run (``bench/speed.py
    time``), at 128 samples: ``None`` unless that file exists and its row has ``gemm_gflops`` and
    ``product_seconds`` and the ratio (``ratio_to_products``, or ``ratio``)."""
    if not (RESULTS / name).exists():
        return None
    row = time_row(128, name)
    ratio = row.get("ratio_to_products", row.get("ratio"))
    if ratio is None or not all(k in row for k in ("gemm_gflops", "product_seconds")):
        return None
    text = (
        f"{times(ratio)} the time of its matrix products ({num(row['product_seconds'])} s at the "
        f"{num(row['gemm_gflops'], 0)} GFLOP/s measured in the same run; prune {num(row['prune_seconds'])} s)"
    )
    if "forward_ratio_to_products" in row:  # the model's own forward on the same CPU, for scale
        text += (
            f"; the model's own forward over the same tokens takes {times(row['forward_ratio_to_products'])} "
            f"its products, and the prune {times(row['prune_over_forward'])} that forward"
        )
    if "ratio_to_own_products" in row:  # the products timed at their own shapes on the same CPU
        text += (
            f"; timed at their own shapes the products take {num(row['own_product_seconds'])} s, the prune "
            f"{times(row['ratio_to_own_products'])} that and the forward {times(row['forward_ratio_to_own_products'])}"
        )
    floor = floor_seconds(row)
    if floor is not None:  # one forward of the model plus the prune's other products, at their own shapes
        text += f"; the prune is {times(row['prune_seconds'] / floor)} its floor (that forward + its other products)"
    return text


def pair(a: str, b: str, sep: str = " / ") -> str:
    return f"{a}{sep}{b}"


def span(xs: list[float], digits: int = 1) -> str:
    """The range of some ratios, as ``2.0×–2.3×``."""
    return f"{times(min(xs), digits)}–{times(max(xs), digits)}"


def engine_ppl(method: str, ratio: float) -> float:
    return row_of("engine.json", method=method, ratio=ratio)["perplexity"]


def unseen_rt(recipe: str, ratio: float) -> float:
    return row_of("unseen.json", recipe=recipe, ratio=ratio)["rotten_tomatoes"]


def minilm_cells(name: str, ratio: float, **match) -> list[dict]:
    cells = data(name)["cells"].values()
    return [
        c
        for c in cells
        if c["ratio"] == ratio and c.get("positions", "all") == "all" and all(c.get(k) == v for k, v in match.items())
    ]


def block_read(name: str, threads: int) -> float:
    return row_of(name, threads=threads, read="block", cache="warm")["gb_s"]


def _gemma_50() -> str:
    capped, free, uni = obs_cap(0.5, 1.2, "gemma3"), obs_row("gemma3", 0.5, "obs"), obs_row("gemma3", 0.5, "default")
    return " / ".join(ppl(r["wikipedia"]) for r in (capped, free, uni))


def _versus(fn: Callable[[str, float], float], a: str, b: str) -> str:
    """``a`` against ``b`` at 20% and at 50%."""
    return " / ".join(pair(ppl(fn(a, r)), ppl(fn(b, r)), " vs ") for r in (0.2, 0.5))


def _refit_peak() -> str:
    s = "statistics kept, 8824 of 11008 kept"
    return f"{num(peak('solve', s, 'before (6d6d779)'), 0)} / {num(peak('solve', s, 'after'), 0)} MiB"


def depth_ls_over_plain(name: str = "depth.json") -> str:
    """The stand-in's perplexity over plain removal's on the same span (the best plain span)."""
    d = data(name)
    rows = [r for r in d["rows"] if "perplexity" in r]
    plain = min((r for r in rows if r["method"] == "none"), key=lambda r: r["perplexity"])
    ls = next(r for r in rows if r["method"] == "ls" and r["start"] == plain["start"])
    span = f"{plain['start']}–{plain['start'] + d['blocks_removed'] - 1}"
    return f"{num(ls['perplexity'], 1)} vs {num(plain['perplexity'], 1)} (blocks {span})"


DEPTH_SLEB, DEPTH_ANGULAR = "held-aside loss, span removed (SLEB)", "angular distance (ShortGPT)"


def depth_plain_spans(name: str) -> str:
    """A depth page's plain removal: perplexity with the span SLEB's criterion picks / the angular distance picks."""
    d = data(name)
    measured = {r["start"]: r["perplexity"] for r in d["rows"] if r["method"] == "none" and "perplexity" in r}
    chosen = {r["selection"]: r["start"] for r in d["rows"]}

    def cell(selection: str) -> str:
        s = chosen[selection]
        return f"{num(measured[s], 1)} (blocks {s}–{s + d['blocks_removed'] - 1})"

    return f"{cell(DEPTH_SLEB)} / {cell(DEPTH_ANGULAR)}; dense {num(d['dense'], 1)}"


def quality_ppl(name: str, recipe: str) -> str | None:
    """A recipe's held-out perplexity on a quality-only depth_speed page (None: not measured)."""
    row = next((r for r in data(name)["untimed"] if r["name"] == recipe), None)
    return None if row is None else num(row["perplexity"], 1)


def quality_pair(name: str, a: str, b: str) -> str | None:
    """``a vs b``: two recipes' perplexities on a quality-only depth_speed page (None unless both were measured)."""
    pa, pb = quality_ppl(name, a), quality_ppl(name, b)
    return None if pa is None or pb is None else pair(pa, pb, " vs ")


def depth_speed_row(name: str) -> dict:
    return row_of("depth_speed.json", name=name)


def depth_speed_claim(name: str) -> str:
    """A depth_speed.json recipe: held-out perplexity and its CPU decode / prefill speed-ups."""
    dense, r = depth_speed_row("dense"), depth_speed_row(name)
    return (
        f"{num(r['perplexity'], 1)}; decode {times(dense['decode_ms'] / r['decode_ms'])}, "
        f"prefill {times(r['prefill_tok_s'] / dense['prefill_tok_s'])}"
    )


def untimed_ppl(name: str) -> float:
    return row_of("depth_speed.json", "untimed", name=name)["perplexity"]


def speed_target_claim(speedup: float) -> str:
    """The picked candidate of a CPU speed target: realised speed-up and held-out perplexity."""
    t = next(x for x in data("speed_target.json")["targets"] if x["speedup"] == speedup)
    r = t["rows"][t["pick"]]
    kind = "width only" if r["blocks"] == 0 else ("depth only" if r["width"] == 0 else "depth + width")
    return f"{times(r['realised'])} realised ({kind}, {r['blocks']} blocks), perplexity {num(r['perplexity'], 1)}"


def gpu_depth(model: str, key: str, name: str = "gpu_latency_depth.json") -> float:
    """A 7B-shaped model's speed-up over dense in a depth run's JSON (higher is better)."""
    rows = data(name)
    dense, r = rows[0], next(x for x in rows if x["model"] == model)
    return r[key] / dense[key] if key.endswith("tok_s") else dense[key] / r[key]


def gpu_depth_decode() -> str:
    """Compiled batch-1 decode of the second depth run: 50% width against 8 blocks + 20% of the rest."""
    key, name = "decode_graph_compiled_ms", "gpu_latency_depth2.json"
    return f"{times(gpu_depth('50% ÷128', key, name))} / {times(gpu_depth('−8 blocks + 20% ÷128', key, name))}"


def vllm_same() -> str:
    rows = data("serving_vllm.json")["rows"]
    return " / ".join(f"{r['same_tokens']} of 5 prompts" for r in rows) + " (dense / 50%)"


def query_heads_cost() -> str:
    """Wikipedia perplexity of the default recipe and of the same with query_heads uniform, per ratio."""
    rows = {(r["ratio"], r["query_heads"]): r["wikipedia"] for r in data("query_heads.json")["rows"]}
    ratios = sorted({ratio for ratio, _ in rows})
    return " / ".join(f"{num(rows[(x, 'free')], 1)} vs {num(rows[(x, 'uniform')], 1)}" for x in ratios)


def serving_decode_speedup() -> str | None:
    """The 50% model's llama.cpp decode speed over dense at q4_k_m / f16, beside what its weight bytes allow."""
    sm = data("serving.json")["summary"]
    if "decode_speedup_50" not in sm:
        return None  # speeds not measured yet
    got, allow = sm["decode_speedup_50"], sm["bytes_ratio"]
    return " / ".join(f"{times(got[q])} (bytes allow {times(allow[q])})" for q in ("q4_k_m", "f16"))


def serving_levers() -> str | None:
    """The 50% variants' llama.cpp q4_k_m decode over dense, with their q4_k_m perplexity beside the
    width-only default's (``bench/serving.py``'s two levers), where the run measured them."""
    d = data("serving.json")
    levers, models = d["summary"].get("decode_speedup_levers"), d["quality"]["models"]
    if not levers:
        return None
    ppl = {k: models[k]["gguf"]["q4_k_m"]["perplexity"] for k in ("0.5", *levers)}
    cells = [f"{times(levers[k]['q4_k_m'])} at perplexity {num(ppl[k], 1)}" for k in levers]
    return " / ".join(cells) + f" (width only: {num(ppl['0.5'], 1)})"


def serving_ppl_diff() -> str:
    """llama.cpp's perplexity at f16 against ours on the same windows, dense / 20% / 50%."""
    diffs = data("serving.json")["summary"]["ppl_f16_rel_diff"]
    return " / ".join(f"{100 * diffs[k]:+.3f}%" for k in ("dense", "0.2", "0.5"))


def _gpu_checks() -> str:
    rows = md_table("gpu_check.md", "check")
    return f"{sum(r['result'] == 'ok' for r in rows)} of {len(rows)}"


SPEED_AB = "python bench/speed_ab.py --models 0 0.2:default 0.5:default 0.2:64:free 0.5:64:free --prune-samples 128"
S70 = "70b:128:stream:discard"
