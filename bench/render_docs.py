"""Fill the generated blocks of the README and docs/ from the results files: ``make docs``.

A markdown file carries blocks ``<!-- results:NAME -->`` … ``<!-- /results -->``; each NAME is a renderer
below that reads ``docs/results/*.json`` (or, for the few pages a benchmark writes without JSON, the
page's own table) and returns the block's text. No measured number is typed into the docs: it is
typed here as a key into a results file, so a re-run benchmark changes every place that quotes it,
and ``tests/test_docs.py`` fails when a committed file differs from what this script renders.

The results index (``docs/results/README.md``) is the ``PAGES`` table below: every page of
``docs/results/`` with the script that writes it and its claims (what the page shows, and the value
it shows it with); the date, machine and torch of a row are read from the page itself.

    python bench/render_docs.py            # rewrite the files whose blocks changed
    python bench/render_docs.py --check    # exit 1, naming the files that are not up to date

Standard library only (no torch), so the docs test is fast.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# The markdown files that carry generated blocks.
FILES = ("README.md", "docs/guide.md", "docs/deployment.md", "docs/design.md", "docs/results/README.md")
BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)
# CPU prune and evaluation times measured before this date ran torch's BLAS, not oneDNN
# (core/kernels/cpu_matmul.py): they are not comparable with later ones.
ONEDNN_DATE = "2026-11-27"
RENDERERS: dict[str, Callable[[], str]] = {}


def renderer(name: str):
    """Register a block's renderer under ``name`` (the NAME of ``<!-- results:NAME -->``)."""

    def add(fn: Callable[[], str]) -> Callable[[], str]:
        RENDERERS[name] = fn
        return fn

    return add


# ---------------------------------------------------------------- reading results


@cache
def data(name: str):
    """A results JSON file of docs/results/, parsed once."""
    return json.loads((RESULTS / name).read_text())


@cache
def page_text(name: str) -> str:
    return (RESULTS / name).read_text()


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
    for r in data("criteria.json")["rows"]:
        if r["criterion"] == criterion and r["method"] == method and r["ratio"] == ratio:
            return r["perplexity"]
    raise KeyError((criterion, method, ratio))


def dense_criteria() -> tuple[float, int]:
    """SmolLM2's dense perplexity under the criteria protocol and its evaluated tokens."""
    row = next(r for r in data("kv_groups.json")["rows"] if r["groups"] == "dense")
    return row["perplexity"], row["eval_tokens"]


def obs_row(model: str, ratio: float, recipe: str) -> dict:
    for r in data("obs_allocation.json")["rows"]:
        if r.get("model") == model and r["ratio"] == ratio and r.get("recipe") == recipe:
            return r
    raise KeyError((model, ratio, recipe))


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
    return next(r for r in data(name)["rows"] if r["samples"] == samples)


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
    return next(r for r in data("gpu_stream.json") if r["run"] == run and r["criterion"] == criterion)


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
    return next(r for r in data("latency_default.json")["rows"] if r["ratio"] == ratio and r.get("default"))[key]


def gpu_latency(model: str, key: str, name: str = "gpu_latency.json") -> float:
    return next(r for r in data(name) if r["model"] == model)[key]


def head_ratio_ppl(ratio: float, head_ratio) -> float:
    return next(r for r in data("head_ratio.json")["rows"] if r["ratio"] == ratio and r["head_ratio"] == head_ratio)[
        "perplexity"
    ]


def kv_ppl(groups: str, ratio: float) -> float:
    rows = data("kv_groups.json")["rows"]
    return next(r for r in rows if r["groups"] == groups and r["ratio"] == ratio and "round_heads" not in r)[
        "perplexity"
    ]


def peak(part: str, setting: str, label: str) -> float:
    rows = data("peak_memory.json")
    return next(r for r in rows if (r["part"], r["setting"], r["label"]) == (part, setting, label))["peak_mib"]


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


# ---------------------------------------------------------------- the results index


@dataclass(frozen=True)
class Claim:
    text: str
    value: Callable[[], str | None]  # None: the results do not hold this quantity (yet); no row
    section: str = ""  # the heading its value is read under, when that states its own date and machine


@dataclass(frozen=True)
class Page:
    """A page of docs/results/: the command that writes it, what kind of machine it needs, its claims."""

    script: str
    machine: str  # cpu | gpu | jobs
    claims: tuple[Claim, ...] = ()
    cpu_times: bool = False  # quotes CPU prune or evaluation times (superseded when before ONEDNN_DATE)
    stale: str = ""  # why the page needs a re-run, where its date alone does not say
    data: tuple[str, ...] = field(default=())  # JSON files the page is made from


def _c(text: str, value: Callable[[], str | None], section: str = "") -> Claim:
    return Claim(text, value, section)


def pair(a: str, b: str, sep: str = " / ") -> str:
    return f"{a}{sep}{b}"


def span(xs: list[float], digits: int = 1) -> str:
    """The range of some ratios, as ``2.0×–2.3×``."""
    return f"{times(min(xs), digits)}–{times(max(xs), digits)}"


def engine_ppl(method: str, ratio: float) -> float:
    return next(r for r in data("engine.json")["rows"] if r["method"] == method and r["ratio"] == ratio)["perplexity"]


def unseen_rt(recipe: str, ratio: float) -> float:
    rows = data("unseen.json")["rows"]
    return next(r for r in rows if r["recipe"] == recipe and r["ratio"] == ratio)["rotten_tomatoes"]


def minilm_cells(name: str, ratio: float, **match) -> list[dict]:
    cells = data(name)["cells"].values()
    return [
        c
        for c in cells
        if c["ratio"] == ratio and c.get("positions", "all") == "all" and all(c.get(k) == v for k, v in match.items())
    ]


def block_read(name: str, threads: int) -> float:
    rows = data(name)["rows"]
    return next(r for r in rows if r["threads"] == threads and r["read"] == "block" and r["cache"] == "warm")["gb_s"]


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
    return next(r for r in data("depth_speed.json")["rows"] if r["name"] == name)


def depth_speed_claim(name: str) -> str:
    """A depth_speed.json recipe: held-out perplexity and its CPU decode / prefill speed-ups."""
    dense, r = depth_speed_row("dense"), depth_speed_row(name)
    return (
        f"{num(r['perplexity'], 1)}; decode {times(dense['decode_ms'] / r['decode_ms'])}, "
        f"prefill {times(r['prefill_tok_s'] / dense['prefill_tok_s'])}"
    )


def untimed_ppl(name: str) -> float:
    return next(r for r in data("depth_speed.json")["untimed"] if r["name"] == name)["perplexity"]


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

PAGES: dict[str, Page] = {
    "engine.md": Page(
        "make bench-engine",
        "cpu",
        (
            _c(
                "SmolLM2-135M, magnitude, held-out perplexity at 20% (none / bias / liar / ls)",
                lambda: " / ".join(ppl(engine_ppl(m, 0.2)) for m in ("none", "bias", "liar", "ls")),
            ),
            _c(
                "dense perplexity under this page's protocol",
                lambda: (
                    f"{num(engine_ppl('dense', 0.0), 2)} on {data('engine.json')['rows'][0]['eval_tokens']:,} tokens"
                ),
            ),
        ),
        cpu_times=True,
        data=("engine.json",),
    ),
    "criteria.md": Page(
        "python bench/criteria.py",
        "cpu",
        (
            _c(
                "best paper criterion at 50%: FLAP + liar / + ls",
                lambda: pair(ppl(criteria_ppl("flap", "liar", 0.5)), ppl(criteria_ppl("flap", "ls", 0.5))),
            ),
            _c(
                "dense perplexity under this protocol",
                lambda: f"{num(dense_criteria()[0], 2)} on {dense_criteria()[1]:,} tokens",
            ),
        ),
        data=("criteria.json",),
    ),
    "obs_allocation.md": Page(
        "python bench/obs_allocation.py",
        "cpu",
        (
            _c(
                "the default recipe on SmolLM2 at 20% / 50% (Wikipedia perplexity)",
                lambda: " / ".join(ppl(obs_row("smollm2", r, "auto")["wikipedia"]) for r in (0.2, 0.5)),
            ),
            _c("Gemma 3 270M at 50%: default (cap 1.2×) / uncapped / uniform", _gemma_50),
        ),
        cpu_times=True,
        data=("obs_allocation.json",),
    ),
    "unseen.md": Page(
        "python bench/unseen.py",
        "cpu",
        (
            _c(
                "paper FLAP + LIAR vs uniform default at 20%, Rotten Tomatoes text",
                lambda: pair(ppl(unseen_rt("paper", 0.2)), ppl(unseen_rt("auto", 0.2)), " vs "),
            ),
        ),
        cpu_times=True,
        data=("unseen.json",),
    ),
    "head_ratio.md": Page(
        "python bench/head_ratio.py",
        "cpu",
        (
            _c(
                "heads at half the ratio (auto) vs at the ratio (same), 20% / 50%",
                lambda: _versus(lambda h, r: head_ratio_ppl(r, h), "auto", "same"),
            ),
        ),
        cpu_times=True,
        data=("head_ratio.json",),
    ),
    "kv_groups.md": Page(
        "python bench/kv_groups.py",
        "cpu",
        (
            _c(
                "whole key/value groups vs free query heads, 20% / 50%",
                lambda: _versus(kv_ppl, "whole", "free"),
            ),
        ),
        cpu_times=True,
        data=("kv_groups.json",),
    ),
    "peers.md": Page(
        "make bench-peers",
        "cpu",
        (
            _c(
                "SmolLM2 at 20%: our default vs the best Torch-Pruning row",
                lambda: pair(
                    ppl(peer("smollm2|ours|default|0.2")["perplexity"]),
                    ppl(best_torch_pruning(0.2)["perplexity"]),
                    " vs ",
                ),
            ),
            _c(
                "MiniLM classifier at 50%: our default with labels (accuracy)",
                lambda: num(peer("minilm|ours|default|0.5")["accuracy"], 4),
            ),
        ),
        cpu_times=True,
        data=("peers.json",),
    ),
    "minilm.md": Page(
        "python bench/minilm.py",
        "cpu",
        (
            _c(
                "LIAR's worst criterion at 30%, share of dense accuracy",
                lambda: pct(min(c["relative"] for c in minilm_cells("minilm.json", 0.3, method="liar"))),
            ),
        ),
        cpu_times=True,
        data=("minilm.json",),
    ),
    "minilm-select.md": Page(
        "python bench/minilm.py --out docs/results/minilm-select.md --methods ls --select criterion|obs",
        "cpu",
        (
            _c(
                "best all-token recipe at 50% (accuracy)",
                lambda: num(max(c["accuracy"] for c in minilm_cells("minilm-select.json", 0.5)), 4),
            ),
        ),
        cpu_times=True,
        data=("minilm-select.json",),
    ),
    "minilm-draws.md": Page(
        "python bench/minilm_draws.py",
        "cpu",
        (
            _c(
                "labelled default at 50%, mean of the calibration draws, share of dense accuracy",
                lambda: pct(statistics.mean(draws("labelled", 0.5)) / minilm_dense()),
            ),
        ),
        cpu_times=True,
        data=("minilm-draws.json",),
    ),
    "time.md": Page(
        "make bench-time",
        "cpu",
        (
            _c("CPU prune, paper LIAR, 128 × 128 samples", lambda: f"{num(time_row(128)['prune_seconds'])} s"),
            _c("time at 1024 samples over 128", lambda: times(scaling())),
            _c("the same prune against its matrix products at the measured GEMM rate", product_ratio),
        ),
        cpu_times=True,
        data=("time.json",),
    ),
    "cpu_matmul.md": Page(
        "python bench/cpu_matmul.py --threads 2 --tokens 2048",
        "cpu",
        (
            _c(
                "oneDNN over the BLAS, the run's projections / Gram blocks",
                lambda: pair(span(matmul_speedups("proj")), span(matmul_speedups("gram"))),
            ),
        ),
        data=("cpu_matmul.json",),
    ),
    "gram_precision.md": Page(
        "python bench/gram_precision.py --device cpu",
        "cpu",
        (_c("largest relative error of a Gram against float64", lambda: f"{max(gram_errors()):.2e}"),),
    ),
    "latency.md": Page(
        "make bench-latency",
        "cpu",
        (
            _c(
                "50% removed, FFN widths ×64: prefill at batch 1, prompt 512",
                lambda: md_table("latency.md", "model", "batch 1, prompt 512")[-1]["batch 1, prompt 512"],
            ),
        ),
        stale="measured 2026-11-21 with transformers 5.23.0, before the later engine changes",
        data=("latency.json",),
    ),
    "latency_default.md": Page(
        f"{SPEED_AB} --compile",
        "cpu",
        (
            _c(
                "default recipe, prefill b8×128 over dense at 20% / 50%",
                lambda: " / ".join(times(latency_default(r, "b8x128_speedup")) for r in (0.2, 0.5)),
            ),
        ),
        data=("latency_default.json",),
    ),
    "latency_kv_groups.md": Page(
        "python bench/speed_ab.py --compile",
        "cpu",
        (_c("whole vs free key/value groups: speed", lambda: "table on the page"),),
        data=("latency_kv_groups.json",),
    ),
    "streaming.md": Page(
        "python bench/streaming.py",
        "cpu",
        (
            _c(
                "1.1B-shaped checkpoint, magnitude: peak RSS streamed vs in memory",
                lambda: pair(
                    f"{num(streaming_row('1.1b', 'stream', 'magnitude')['peak_rss_mb'], 0)} MB",
                    f"{num(streaming_row('1.1b', 'memory', 'magnitude')['peak_rss_mb'], 0)} MB",
                    " vs ",
                ),
            ),
        ),
        cpu_times=True,
        data=("streaming.json",),
    ),
    "streamed_eval.md": Page(
        "python bench/streamed_eval.py",
        "cpu",
        (
            _c(
                "1.1B perplexity + lm-eval: peak RSS in memory vs streamed",
                lambda: " vs ".join(f"{num(r['peak_rss_mb'], 0)} MB" for r in data("streamed_eval.json")),
            ),
        ),
        cpu_times=True,
        data=("streamed_eval.json",),
    ),
    "serving.md": Page(
        "python bench/serving.py",
        "cpu",
        (
            _c("GGUF in llama.cpp, 50% removed: batch-1 decode over dense at q4_k_m / f16", serving_decode_speedup),
            _c("GGUF f16 in llama.cpp: perplexity against ours, dense / 20% / 50%", serving_ppl_diff),
            _c(
                "GGUF q4_k_m in llama.cpp at 50%: decode over dense with 8 blocks + width / FFN widths × 256",
                serving_levers,
            ),
        ),
        data=("serving.json",),
    ),
    "serving_vllm.md": Page(
        "python bench/serving_vllm.py",
        "cpu",
        (_c("vLLM (CPU) serving SmolLM2's vLLM form at 50%: greedy tokens equal to transformers'", vllm_same),),
        data=("serving_vllm.json",),
    ),
    "depth.md": Page(
        "python bench/depth.py",
        "cpu",
        (
            _c(
                "SmolLM2, 8 of 30 blocks removed: least-squares stand-in vs plain removal, perplexity",
                depth_ls_over_plain,
            ),
        ),
        data=("depth.json",),
    ),
    "depth_speed.md": Page(
        "python bench/depth_speed.py",
        "cpu",
        (
            _c(
                "SmolLM2 width 50% (default): perplexity; CPU batch-1 decode and prefill over dense",
                lambda: depth_speed_claim("width 50%"),
            ),
            _c("SmolLM2 8 of 30 blocks + width to 50%: the same", lambda: depth_speed_claim("depth 8 + width, 50%")),
            _c("SmolLM2 8 of 30 blocks (ls stand-in): the same", lambda: depth_speed_claim("depth 8 (27%)")),
        ),
        data=("depth_speed.json",),
    ),
    "depth_gemma3.md": Page(
        "python bench/depth.py --model gemma3 --blocks 4 --no-timing",
        "cpu",
        (
            _c(
                "Gemma 3 270M, 4 of 18 blocks removed plainly (ls refused: normalised FFN output), perplexity: "
                "span by held-aside loss (SLEB) / by angular distance (ShortGPT)",
                lambda: depth_plain_spans("depth_gemma3.json"),
            ),
        ),
        data=("depth_gemma3.json",),
    ),
    "depth_speed_gemma3.md": Page(
        "python bench/depth_speed.py --model gemma3 --no-timing",
        "cpu",
        (
            _c(
                "Gemma 3 270M at 22% removed, perplexity: width only vs 4 of 18 blocks removed plainly",
                lambda: quality_pair("depth_speed_gemma3.json", "width 22%", "depth 4 (22%), none"),
            ),
            _c(
                "Gemma 3 270M at 50% removed, perplexity: width only vs 4 blocks removed plainly + width",
                lambda: quality_pair("depth_speed_gemma3.json", "width 50%", "depth 4 + width, 50%, none"),
            ),
        ),
        data=("depth_speed_gemma3.json",),
    ),
    "depth_qwen25.md": Page(
        "python bench/depth.py --model qwen25 --blocks 6 --no-timing --selections angular sleb ours",
        "cpu",
        (
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed: least-squares stand-in vs plain removal, perplexity",
                lambda: depth_ls_over_plain("depth_qwen25.json"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed plainly, perplexity: span by held-aside loss (SLEB) / "
                "by angular distance (ShortGPT)",
                lambda: depth_plain_spans("depth_qwen25.json"),
            ),
        ),
        data=("depth_qwen25.json",),
    ),
    "depth_speed_qwen25.md": Page(
        "python bench/depth_speed.py --model qwen25 --no-timing",
        "cpu",
        (
            _c(
                "Qwen2.5-Coder-0.5B at 25% removed, perplexity: width only vs 6 of 24 blocks (ls stand-in)",
                lambda: quality_pair("depth_speed_qwen25.json", "width 25%", "depth 6 (25%)"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B, 6 of 24 blocks removed, perplexity: ls stand-in vs plain removal",
                lambda: quality_pair("depth_speed_qwen25.json", "depth 6 (25%)", "depth 6 (25%), none"),
            ),
            _c(
                "Qwen2.5-Coder-0.5B at 50% removed, perplexity: width only vs 6 blocks + width",
                lambda: quality_pair("depth_speed_qwen25.json", "width 50%", "depth 6 + width, 50%"),
            ),
        ),
        data=("depth_speed_qwen25.json",),
    ),
    "speed_target.md": Page(
        "python bench/speed_target.py",
        "cpu",
        (
            _c("SmolLM2, target 1.3× batch-1 decode on this CPU: the pick", lambda: speed_target_claim(1.3)),
            _c("SmolLM2, target 1.5× batch-1 decode on this CPU: the pick", lambda: speed_target_claim(1.5)),
        ),
        data=("speed_target.json",),
    ),
    "gpu_latency_depth.md": Page(
        "python bench/gpu_latency.py --ratios 0.5 --depth 8 16 8:0.3 4:0.4 --compiled-graph --rounds 3 (and a second "
        "run: see the page)",
        "gpu",
        (
            _c(
                "7B-shaped, compiled batch-1 decode over dense: 50% width / 8 of 32 blocks + 20% width",
                gpu_depth_decode,
            ),
            _c(
                "7B-shaped, prefill b8×512 over dense: 50% width / 8 of 32 blocks + 30% width",
                lambda: (
                    f"{times(gpu_depth('50% ÷128', 'prefill_b8x512_tok_s'))} / "
                    f"{times(gpu_depth('−8 blocks + 30% ÷128', 'prefill_b8x512_tok_s'))}"
                ),
            ),
        ),
        data=("gpu_latency_depth.json", "gpu_latency_depth2.json"),
    ),
    "query_heads.md": Page(
        "python bench/query_heads.py",
        "cpu",
        (_c("SmolLM2 default recipe vs query_heads uniform (vLLM's form), perplexity at 20% / 50%", query_heads_cost),),
        data=("query_heads.json",),
    ),
    "block_reads.md": Page(
        "python bench/block_reads.py --shape 7b --layers 4 --dtype bfloat16",
        "cpu",
        (
            _c(
                "7B block read, one thread, warm page cache",
                lambda: f"{num(block_read('block_reads.json', 1), 2)} GB/s",
            ),
        ),
        data=("block_reads.json",),
    ),
    "block_reads_gpu_host.md": Page(
        "python bench/block_reads.py --shape 7b --layers 4 --dtype bfloat16 --device cuda",
        "gpu",
        (
            _c(
                "7B block read, 4 threads, warm, into pinned memory",
                lambda: f"{num(block_read('block_reads_gpu_host.json', 4), 1)} GB/s",
            ),
        ),
        data=("block_reads_gpu_host.json",),
    ),
    "peak_memory.md": Page(
        "python bench/peak_memory.py",
        "cpu",
        (_c("the FFN's refit at 7B widths, memory beyond the Gram: before / after", _refit_peak),),
        data=("peak_memory.json",),
    ),
    "families.md": Page(
        "python bench/families.py",
        "jobs",
        (
            _c(
                "Gemma 3 270M through a job: perplexity of the job vs the reloaded checkpoint",
                lambda: pair(
                    num(data("families.json")["ppl_job"], 2), num(data("families.json")["ppl_reloaded"], 2), " vs "
                ),
            ),
        ),
        cpu_times=True,
        data=("families.json",),
    ),
    "load.md": Page(
        "python bench/load.py",
        "jobs",
        (
            _c(
                "worst p95 of a call, 10,000 jobs, 8 clients",
                lambda: f"{num(max(r['p95_s'] for r in data('load.json')['rows']), 2)} s",
            ),
        ),
        data=("load.json",),
    ),
    "reliability.md": Page(
        "pytest -s tests/jobs/test_faults.py",
        "jobs",
        (
            _c(
                "fault cases of the job runner (SIGKILL, broker restart, …)",
                lambda: f"{len(md_table('reliability.md', 'case'))} cases, table on the page",
            ),
        ),
    ),
    "gpu_liar.md": Page(
        "python bench/gpu_liar.py --shape 7b|13b|30b --samples 128 1024",
        "gpu",
        (
            _c(
                "7B-shaped, LIAR, 128 / 1024 samples",
                lambda: f"{gpu_liar_after('7B', '128', 'liar, holdout 8')} / {gpu_liar_after('7B', '1024', 'liar')} s",
            ),
            _c(
                "7B-shaped, 1024 samples, FFN inputs recomputed: time / peak device memory over the bf16 weights",
                gpu_liar_recompute,
                LIAR_H200,
            ),
            _c(
                "7B-shaped, LIAR, 128 / 1024 samples, error report on the fit statistics",
                lambda: " / ".join(gpu_liar_shape("7B", n)["seconds"].strip("*") for n in ("128", "1024")) + " s",
                LIAR_H200,
            ),
            _c(
                "30B-shaped in memory, 1024 samples: time / peak device memory",
                lambda: pair(
                    f"{gpu_liar_shape('30B', '1024')['seconds'].strip('*')} s",
                    f"{gpu_liar_shape('30B', '1024')['peak GB']} GB",
                ),
                LIAR_H200,
            ),
        ),
    ),
    "gpu_stream.md": Page(
        "python bench/gpu_stream.py (bash bench/gpu_all.sh)",
        "gpu",
        (
            _c(
                "70B-shaped, 128 samples, streamed: peak device memory / time",
                lambda: pair(f"{gb(gpu_stream(S70)['peak_device_mb'])} GB", f"{num(gpu_stream(S70)['total_s'], 0)} s"),
            ),
        ),
        data=("gpu_stream.json",),
    ),
    "gpu_stream_profile.txt": Page(
        "python bench/gpu_stream.py --profile",
        "gpu",
        (_c("torch.profiler table of the 7B streamed run", lambda: "profile"),),
    ),
    "gpu_latency.md": Page(
        "python bench/gpu_latency.py",
        "gpu",
        (
            _c(
                "7B-shaped at 50%: prefill b8×512 over dense",
                lambda: times(
                    gpu_latency("50% ÷128", "prefill_b8x512_tok_s") / gpu_latency("dense", "prefill_b8x512_tok_s")
                ),
            ),
            _c(
                "7B-shaped at 50%: batch-1 decode, compiled + CUDA graph, over dense",
                lambda: times(
                    gpu_latency("dense", "decode_graph_compiled_ms", "gpu_latency_compiled.json")
                    / gpu_latency("50% ÷128", "decode_graph_compiled_ms", "gpu_latency_compiled.json")
                ),
            ),
        ),
        # the latest run's files; the earlier sections' runs keep their date and machine in the name
        data=(
            "gpu_latency.json",
            "gpu_latency_compiled.json",
            "gpu_latency_2026-11-26_h200.json",
            "gpu_latency_compiled_2026-11-26_h100.json",
        ),
    ),
    "gpu_check.md": Page(
        "python bench/gpu_check.py",
        "gpu",
        (_c("GPU path checks passed", _gpu_checks),),
    ),
}


# Pages a benchmark writes only in some runs: indexed when they exist.
OPTIONAL_PAGES = {
    "time_avx2.md": Page(
        "python bench/speed.py time --isa avx2",
        "cpu",
        (
            _c(
                "CPU prune, paper LIAR, 128 × 128 samples, AVX2-only settings",
                lambda: f"{num(time_row(128, 'time_avx2.json')['prune_seconds'])} s",
            ),
            _c(
                "the same prune against its matrix products at the measured GEMM rate",
                lambda: product_ratio("time_avx2.json"),
            ),
        ),
        data=("time_avx2.json",),
    ),
}
OPTIONAL_PAGES["first_run.md"] = Page(
    "python bench/first_run.py",
    "jobs",
    (_c("the first run's default job: real time over the estimate before Submit", lambda: first_run_ratio(0)),),
    cpu_times=True,
    data=("first_run.json",),
)
PAGES.update({name: page for name, page in OPTIONAL_PAGES.items() if (RESULTS / name).exists()})
# the pages of OPTIONAL_PAGES that carry generated blocks, once their benchmark has written them
FILES += tuple(f"docs/results/{name}" for name in ("first_run.md",) if (RESULTS / name).exists())


def first_run_ratio(row: int) -> str:
    r = data("first_run.json")["rows"][row]
    return f"{num(r['real_s'])} s against ≈ {num(r['estimate_s'])} s ({times(r['real_over_estimate'])})"


@renderer("first-run")
def first_run_table() -> str:
    """docs/results/first_run.md's table: each job's estimate against its real time, and what it showed."""
    d = data("first_run.json")
    rows = [
        [
            r["run"], f"{r['samples']} × {r['seq_len']}", r["status"], f"{num(r['estimate_s'])} s",
            f"{num(r['real_s'])} s", times(r["real_over_estimate"]),
            f"{ppl(r['perplexity_dense'])} → {ppl(r['perplexity'])}" if r.get("perplexity") else "–",
            r["speedup_text"],
        ]
        for r in d["rows"]
    ]  # fmt: skip
    header = ["job", "samples × tokens", "status", "estimate", "real", "real / estimate", "perplexity", "speed-up"]
    note = f"{d['date']}, {d['machine']}, worker's float32 GEMM rate {num(d['gemm_gflops'])} GFLOP/s"
    return f"{note}\n\n{table(header, rows)}\n"


DATE = re.compile(r"20\d\d-\d\d-\d\d")
MACHINES = r"NVIDIA H100[\w ]*?HBM3|NVIDIA H200|AMD EPYC|Intel\(R\) Xeon\(R\)[\w ]*|Intel Xeon|x86_64, 2 (?:CPU )?cores"


def page_meta(name: str, section: str = "") -> tuple[str, str, str]:
    """(dates, machines, torch versions) as the page states them; with ``section``, as the part of the
    page under the heading that starts with it states them above its first table."""
    page = page_text(name)
    if section:
        start = re.search(rf"^#+ {re.escape(section)}", page, re.M)
        if start is None:
            raise KeyError(f"{name}: no heading starting with {section!r}")
        text = page[start.start() :].split("\n|", 1)[0]
    else:
        head = page.split("\n|", 1)[0]  # what the page says above its first table
        text = head + "".join(json.dumps(data(j), ensure_ascii=False) for j in PAGES[name].data)
    if not DATE.search(text):
        text = page
    dates = sorted(set(DATE.findall(text)))
    when = "not stated" if not dates else dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    machines = list(dict.fromkeys(m.strip() for m in re.findall(MACHINES, text)))
    torches = sorted(set(re.findall(r"torch[ =]{1,2}(\d+\.\d+\.\d+\+\w+)", text)))
    return when, ", ".join(machines[:2]) or "not stated", ", ".join(torches) or "not stated"


def short_status(name: str) -> str:
    """The index's status column: current, GPU (dated), or what makes it due for a re-run."""
    s = status(name)
    return "current" if s == "current" else "GPU, dated" if s.startswith("GPU") else "re-run due (below)"


def status(name: str) -> str:
    page = PAGES[name]
    last = page_meta(name)[0].split(" to ")[-1]
    if page.machine == "gpu":
        return "GPU run, dated; not re-measurable on the CPU machines"
    if page.stale:
        return f"{page.stale}; re-run: `{page.script}`"
    if page.cpu_times and last < ONEDNN_DATE:
        return f"its times were measured before the oneDNN products ({ONEDNN_DATE}); re-run: `{page.script}`"
    return "current"


@renderer("index")
def render_index() -> str:
    rows = []
    for name, page in PAGES.items():
        for claim in page.claims:
            value = claim.value()
            if value is not None:
                when, machine, torch = page_meta(name, claim.section)
                row = [f"[{name}]({name})", claim.text, value, f"`{page.script}`", when, machine, torch]
                rows.append([*row, short_status(name)])
    return table(["page", "claim", "value", "script", "date", "machine", "torch", "status"], rows)


@renderer("rerun")
def render_rerun() -> str:
    lines = []
    for name in PAGES:
        s = status(name)
        if s != "current":
            lines.append(f"- [{name}]({name}): {s}")
    return "\n".join(lines)


# ---------------------------------------------------------------- blocks of the README and docs


@renderer("readme")
def render_readme() -> str:
    dense, tokens = dense_criteria()
    t = time_row(128)
    smollm2 = "; ".join(
        f"{label} {ppl(fn(0.2))} / {ppl(fn(0.5))}"
        for label, fn in (
            ("default", lambda r: peer(f"smollm2|ours|default|{r}")["perplexity"]),
            ("paper's LIAR with FLAP", lambda r: criteria_ppl("flap", "liar", r)),
            ("best Torch-Pruning", lambda r: best_torch_pruning(r)["perplexity"]),
        )
    )
    rows = [
        [
            "SmolLM2-135M, held-out perplexity, 20% / 50% of block parameters removed",
            smollm2,
            f"dense {num(dense, 2)}; {tokens:,} tokens of held-out Wikipedia",
            "[peers](docs/results/peers.md), [criteria](docs/results/criteria.md)",
        ],
        [
            "MiniLM sentiment classifier, accuracy kept at 50% (default with labels)",
            f"{pct(statistics.mean(draws('labelled', 0.5)) / minilm_dense())} of dense",
            f"dense {num(minilm_dense(), 4)}; mean of {len(draws('labelled', 0.5))} calibration draws",
            "[minilm-draws](docs/results/minilm-draws.md)",
        ],
        [
            "CPU prune, paper LIAR, 20%, 128 × 128 calibration tokens",
            f"{num(t['prune_seconds'])} s; 1024 samples: {times(scaling())} as long",
            f"{data('time.json')['date']}, {time_machine()}, {products_library()} products",
            "[time](docs/results/time.md)",
        ],
    ]
    for name, isa in TIME_FILES.items():
        ratio = product_ratio(name)
        if ratio:
            page = name.removesuffix(".json")
            rows.append(["the same prune against the machine", ratio, isa, f"[{page}](docs/results/{page}.md)"])
    s70 = gpu_stream(S70)
    rows += [
        [
            "GPU prune, LLaMA-7B-shaped, LIAR, 128 / 1024 samples",
            f"{gpu_liar_after('7B', '128', 'liar, holdout 8')} / {gpu_liar_after('7B', '1024', 'liar')} s",
            f"{page_meta('gpu_liar.md')[0]}, {page_meta('gpu_liar.md')[1].split(', ')[0]}, bf16, random weights",
            "[gpu_liar](docs/results/gpu_liar.md)",
        ],
        [
            "70B-shaped model streamed on one GPU, 128 samples",
            f"{gb(s70['peak_device_mb'])} GB of device memory for {num(s70['weights_gb'], 0)} GB of weights",
            f"{s70['date']}, {s70['device'].split(',')[0]}, bf16, random weights",
            "[gpu_stream](docs/results/gpu_stream.md)",
        ],
        [
            "pruned SmolLM2 (default recipe), prefill b8×128 over dense, 20% / 50%",
            " / ".join(times(latency_default(r, "b8x128_speedup")) for r in (0.2, 0.5)),
            f"{page_meta('latency_default.md')[0]}, {data('latency_default.json')['machine']['cpu']}, "
            f"{data('latency_default.json')['machine']['cores']} cores, float32",
            "[latency_default](docs/results/latency_default.md)",
        ],
        [
            "the default recipe's checkpoints in stock llama.cpp (GGUF f16): perplexity against ours, "
            "dense / 20% / 50%",
            serving_ppl_diff(),
            f"{page_meta('serving.md')[0]}, SmolLM2-135M, same token windows",
            "[serving](docs/results/serving.md)",
        ],
        [
            "what vLLM's form costs (`query_heads: uniform`), SmolLM2 perplexity at 20% / 50%",
            query_heads_cost().replace(" vs ", " → "),
            f"{data('query_heads.json')['date']}, default recipe → the same with every layer keeping as many "
            "query heads",
            "[query_heads](docs/results/query_heads.md)",
        ],
        [
            "depth pruning, SmolLM2, 8 of 30 blocks: least-squares stand-in vs plain removal, perplexity",
            depth_ls_over_plain(),
            f"{data('depth.json')['date']}, the span chosen by held-aside loss",
            "[depth](docs/results/depth.md)",
        ],
        [
            "SmolLM2 on a CPU, perplexity and batch-1 decode speed-up: width 50% / 8 blocks + width to 50%",
            f"{depth_speed_claim('width 50%')} / {depth_speed_claim('depth 8 + width, 50%')}",
            f"{data('depth_speed.json')['date']}, {data('depth_speed.json')['machine']}, eager",
            "[depth_speed](docs/results/depth_speed.md)",
        ],
        [
            "7B-shaped on a GPU, compiled batch-1 decode over dense: 50% width / 8 of 32 blocks + 20% width (40%)",
            gpu_depth_decode(),
            f"{page_meta('gpu_latency_depth.md')[0]}, NVIDIA H100, bf16; SmolLM2 perplexity of the like "
            "structures (width 50% / 8 of 30 blocks and width to 40%) "
            f"{num(depth_speed_row('width 50%')['perplexity'], 1)} / {num(untimed_ppl('depth 8 + width, 40%'), 1)}",
            "[gpu_latency_depth](docs/results/gpu_latency_depth.md)",
        ],
    ]
    if (RESULTS / "speed_target.json").exists():
        rows.append(
            [
                "speed target on a CPU: SmolLM2 pruned to 1.3× / 1.5× batch-1 decode",
                f"{speed_target_claim(1.3)}; {speed_target_claim(1.5)}",
                f"{data('speed_target.json')['date']}, {data('speed_target.json')['machine']}",
                "[speed_target](docs/results/speed_target.md)",
            ]
        )
    return table(["claim", "value", "conditions", "page"], rows)


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


# ---------------------------------------------------------------- rendering


def render_text(text: str) -> str:
    """``text`` with every generated block replaced by what its renderer returns now."""

    def fill(m: re.Match) -> str:
        name = m.group(2)
        if name not in RENDERERS:
            raise KeyError(f"unknown results block {name!r}; known: {', '.join(sorted(RENDERERS))}")
        return f"{m.group(1)}{RENDERERS[name]().rstrip()}\n{m.group(4)}"

    return BLOCK.sub(fill, text)


def stale_files(root: Path = ROOT) -> list[str]:
    """The files of ``FILES`` whose committed text differs from what this script renders."""
    return [f for f in FILES if (root / f).exists() and render_text((root / f).read_text()) != (root / f).read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is not up to date")
    args = parser.parse_args(argv)
    stale = stale_files()
    if args.check:
        for f in stale:
            print(f"{f}: generated blocks are out of date (run `make docs`)", file=sys.stderr)
        return 1 if stale else 0
    for f in stale:
        path = ROOT / f
        path.write_text(render_text(path.read_text()))
        print(f"rewrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
