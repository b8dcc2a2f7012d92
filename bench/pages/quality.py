"""The results pages of what the pruned models keep: perplexity, accuracy, criteria, peers, MiniLM."""

from __future__ import annotations

import statistics

from bench.pages import values as v
from bench.pages.page import Page, _c

PAGES: dict[str, Page] = {
    "engine.md": Page(
        "make bench-engine",
        "cpu",
        (
            _c(
                "SmolLM2-135M, magnitude, held-out perplexity at 20% (none / bias / liar / ls)",
                lambda: " / ".join(v.ppl(v.engine_ppl(m, 0.2)) for m in ("none", "bias", "liar", "ls")),
            ),
            _c(
                "dense perplexity under this page's protocol",
                lambda: (
                    f"{v.num(v.engine_ppl('dense', 0.0), 2)} on "
                    f"{v.data('engine.json')['rows'][0]['eval_tokens']:,} tokens"
                ),
            ),
        ),
        cpu_times=True,
    ),
    "criteria.md": Page(
        "python bench/criteria.py",
        "cpu",
        (
            _c(
                "best paper criterion at 50%: FLAP + liar / + ls",
                lambda: v.pair(v.ppl(v.criteria_ppl("flap", "liar", 0.5)), v.ppl(v.criteria_ppl("flap", "ls", 0.5))),
            ),
            _c(
                "dense perplexity under this protocol",
                lambda: f"{v.num(v.dense_criteria()[0], 2)} on {v.dense_criteria()[1]:,} tokens",
            ),
        ),
    ),
    "obs_allocation.md": Page(
        "python bench/obs_allocation.py",
        "cpu",
        (
            _c(
                "the default recipe on SmolLM2 at 20% / 50% (Wikipedia perplexity)",
                lambda: " / ".join(v.ppl(v.obs_row("smollm2", r, "auto")["wikipedia"]) for r in (0.2, 0.5)),
            ),
            _c("Gemma 3 270M at 50%: default (cap 1.2×) / uncapped / uniform", v._gemma_50),
        ),
        cpu_times=True,
    ),
    "unseen.md": Page(
        "python bench/unseen.py",
        "cpu",
        (
            _c(
                "paper FLAP + LIAR vs uniform default at 20%, Rotten Tomatoes text",
                lambda: v.pair(v.ppl(v.unseen_rt("paper", 0.2)), v.ppl(v.unseen_rt("auto", 0.2)), " vs "),
            ),
        ),
        cpu_times=True,
    ),
    "head_ratio.md": Page(
        "python bench/head_ratio.py",
        "cpu",
        (
            _c(
                "heads at half the ratio (auto) vs at the ratio (same), 20% / 50%",
                lambda: v._versus(lambda h, r: v.head_ratio_ppl(r, h), "auto", "same"),
            ),
        ),
        cpu_times=True,
    ),
    "kv_groups.md": Page(
        "python bench/kv_groups.py",
        "cpu",
        (
            _c(
                "whole key/value groups vs free query heads, 20% / 50%",
                lambda: v._versus(v.kv_ppl, "whole", "free"),
            ),
        ),
        cpu_times=True,
    ),
    "peers.md": Page(
        "make bench-peers",
        "cpu",
        (
            _c(
                "SmolLM2 at 20%: our default vs the best Torch-Pruning row",
                lambda: v.pair(
                    v.ppl(v.peer("smollm2|ours|default|0.2")["perplexity"]),
                    v.ppl(v.best_torch_pruning(0.2)["perplexity"]),
                    " vs ",
                ),
            ),
            _c(
                "MiniLM classifier at 50%: our default with labels (accuracy)",
                lambda: v.num(v.peer("minilm|ours|default|0.5")["accuracy"], 4),
            ),
        ),
        cpu_times=True,
    ),
    "minilm.md": Page(
        "python bench/minilm.py",
        "cpu",
        (
            _c(
                "LIAR's worst criterion at 30%, share of dense accuracy",
                lambda: v.pct(min(c["relative"] for c in v.minilm_cells("minilm.json", 0.3, method="liar"))),
            ),
        ),
        cpu_times=True,
    ),
    "minilm-select.md": Page(
        "python bench/minilm.py --out docs/results/minilm-select.md --methods ls --select criterion|obs",
        "cpu",
        (
            _c(
                "best all-token recipe at 50% (accuracy)",
                lambda: v.num(max(c["accuracy"] for c in v.minilm_cells("minilm-select.json", 0.5)), 4),
            ),
        ),
        cpu_times=True,
    ),
    "minilm-draws.md": Page(
        "python bench/minilm_draws.py",
        "cpu",
        (
            _c(
                "labelled default at 50%, mean of the calibration draws, share of dense accuracy",
                lambda: v.pct(statistics.mean(v.draws("labelled", 0.5)) / v.minilm_dense()),
            ),
        ),
        cpu_times=True,
    ),
}
