"""How the web app words a job's numbers (``app.web.figures``): a speed-up its spread swamps is said to
be not measurable, never shown as a number; every metric a job records has a name a reader knows."""

from __future__ import annotations

import pytest

from app.web import figures
from app.web.figures import NOT_MEASURABLE, SINGLE_TIMING, measurable, metric_name, speedup_text

MEASURABLE = [
    # (median, low, high): measurable?
    ((1.31, 1.25, 1.36), True),  # the interval clear of 1 and narrower than the effect
    ((0.8, 0.75, 0.85), True),  # a slow-down is a figure too
    ((35.4, 0.9, 40.0), False),  # the 35×: its interval holds 1.0
    ((1.07, 0.98, 1.2), False),  # holds 1.0
    ((1.5, 1.1, 2.2), False),  # clear of 1, but wider (1.1) than the effect (0.5)
    ((1.5, 1.0, 1.9), False),  # touching 1.0 is holding it
    ((1.5, 1.25, 1.75), True),  # width 0.5 == effect 0.5: as wide as the effect, not wider
    ((1.3, None, None), False),  # an older job's single timing
    ((float("nan"), 0.9, 1.1), False),
    ((None, 1.1, 1.2), False),
]


@pytest.mark.parametrize(("figure", "expected"), MEASURABLE)
def test_a_figure_is_measurable_only_when_its_spread_is_clear_of_one_and_narrower_than_its_effect(figure, expected):
    assert measurable(*figure) is expected


def test_a_speed_up_reads_with_its_spread_or_says_why_it_has_no_number():
    assert speedup_text(1.31, 1.25, 1.36) == "1.31× (1.25–1.36)"
    assert speedup_text(35.4, 0.9, 40.0) == NOT_MEASURABLE == "not measurable on this worker"
    assert speedup_text(35.4) == SINGLE_TIMING and "35" not in SINGLE_TIMING  # an older job: no spread
    assert speedup_text(None) == "–"


def test_every_metric_a_job_records_has_a_readable_name():
    metrics = {"block_speedup": 1.3, "block_speedup_repeats": 5.0}
    assert metric_name("block_seconds_dense") == "block time, dense (s)"
    assert metric_name("block_speedup", metrics) == "speed-up, blocks (median of 5)"
    assert metric_name("block_speedup") == "speed-up, blocks"  # an older job: no count
    assert metric_name("achieved_ratio").startswith("parameters removed")
    assert metric_name("perplexity_dense") == "perplexity, dense"
    assert metric_name("peak_memory_mb") == "peak memory (MiB)"
    assert metric_name("evaluations_failed") == "evaluations failed"
    assert metric_name("piqa.acc_norm") == "piqa acc norm"  # unknown: the key as words
    # the keys the pipeline and the worker write (core/, jobs/) are all named, none left as a raw key
    written = [
        *("target_ratio achieved_ratio ratio_deviation params_before params_after block_params_before".split()),
        *("block_params_after prune_seconds peak_memory_mb kept_heads_mean kept_neurons_mean".split()),
        *("kv_index_layers round_to_heads round_to_neurons block_seconds_pruned prefill_tok_s_dense".split()),
        *("prefill_tok_s prefill_speedup realised_speedup perplexity eval_tokens tasks_acc_mean".split()),
        *("export_written export_failed cpu_matmul_onednn_gflops cpu_matmul_blas_gflops".split()),
    ]
    assert all(k in figures.METRIC_NAMES for k in written), [k for k in written if k not in figures.METRIC_NAMES]


def test_the_metrics_table_folds_each_spread_into_its_speed_up():
    metrics = {
        "perplexity": 20.5,
        "params_after": 1234567.0,
        "block_speedup": 1.31,
        "block_speedup_low": 1.25,
        "block_speedup_high": 1.36,
        "block_speedup_repeats": 5.0,
        "prefill_speedup": 35.4,  # an older job's single prefill timing
        "zeta.acc": 0.5,
    }
    table = figures.metrics_markdown(metrics, ["perplexity", "block_speedup"])
    lines = table.splitlines()
    assert lines[:2] == ["| metric | value |", "|---|---:|"]
    assert lines[2:] == [
        "| perplexity, pruned | 20.5 |",
        "| speed-up, blocks (median of 5) | 1.31× (1.25–1.36) |",
        "| parameters, pruned | 1,234,567 |",
        f"| speed-up, prefill | {SINGLE_TIMING} |",
        "| zeta acc | 0.5 |",
    ]
    assert "35" not in table and "_low" not in table and "block_speedup" not in table
    assert figures.metrics_markdown({}) == ""
