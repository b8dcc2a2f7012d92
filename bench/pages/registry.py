"""The results index: every page of docs/results/ (the families' tables, in the index's order, and the
pages a benchmark writes only in some runs), the date, machine and torch each states, and its status."""

from __future__ import annotations

import json
import re

from bench.family_page import claim as family_claim
from bench.pages import quality, speed, systems
from bench.pages.first_run import first_run_ratio
from bench.pages.page import Page, _c, renderer, with_data
from bench.pages.resume import save_size, total_against_target
from bench.pages.values import ONEDNN_DATE, RESULTS, data, num, page_text, product_ratio, table, time_row
from bench.quantize_page import q4_over_f16

PAGES: dict[str, Page] = with_data({**quality.PAGES, **speed.PAGES, **systems.PAGES})


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
    ),
    "quantize.md": Page(
        "python bench/quantize.py",
        "cpu",
        (
            _c(
                "SmolLM2 at 50% (default recipe): llama.cpp q4_k_m over f16, without / with our importance matrix",
                lambda: q4_over_f16(data("quantize.json"), "0.5"),
            ),
            _c(
                "SmolLM2 at 50%, 8 blocks + width: the same",
                lambda: q4_over_f16(data("quantize.json"), "0.5-depth8"),
            ),
        ),
    ),
    "family.md": Page(
        "python bench/family.py",
        "cpu",
        (
            _c(
                "Qwen2.5-Coder-1.5B / 0.5B dense (dequantised from Q4_K_M): held-out perplexity, float32",
                lambda: family_claim(data("family.json"), "1.5B dense", "perplexity"),
            ),
            _c(
                "the same in llama.cpp from our q4_k_m files: perplexity",
                lambda: family_claim(data("family.json"), "1.5B dense", "served"),
            ),
            _c(
                "the same: batch-1 decode speed on 2 cores",
                lambda: family_claim(data("family.json"), "1.5B dense", "speed"),
            ),
        ),
    ),
    "first_run.md": Page(
        "python bench/first_run.py",
        "jobs",
        (_c("the first run's default job: real time over the estimate before Submit", lambda: first_run_ratio(0)),),
        cpu_times=True,
    ),
    "resume.md": Page(
        "python bench/resume.py",
        "cpu",
        (
            _c(
                "SmolLM2-135M streamed, SIGKILLed at 70% of its blocks and resumed: total time against T + one "
                "checkpoint interval + loading",
                lambda: total_against_target(data("resume.json")),
            ),
            _c(
                "one checkpoint save of a Llama-2-70B shape, float16, 1024 × 2048 calibration tokens",
                lambda: save_size(data("resume.json"), "Llama-2-70B", 1024, "float16"),
            ),
        ),
        cpu_times=True,
    ),
    # written by a whole `make test` run only (tests/timing.py): indexed once real numbers are committed
    "test_time.md": Page(
        "make test TEST_TIME=docs/results/test_time.json; python bench/test_time.py",
        "cpu",
        (
            _c(
                "`make test`'s tests, wall time (target: 15 min)",
                lambda: f"{data('test_time.json')['wall_seconds'] / 60:.1f} min",
            ),
        ),
    ),
}
PAGES.update({name: page for name, page in with_data(OPTIONAL_PAGES).items() if (RESULTS / name).exists()})

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
