"""docs/results/resume.md's renderer (bench/pages/resume.py) on a synthetic results file, and the
checkpoint sizes bench/resume.py computes from the 7B and 70B shapes. The numbers below are made up
for the test; the page's own come from `python bench/resume.py`."""

from __future__ import annotations

import pytest

from bench.pages.resume import render, save_size, total_against_target
from bench.resume import shapes

SYNTHETIC = {  # not a measurement
    "date": "2000-01-01",
    "machine": "a test machine, 2 cores",
    "torch": "0.0.0+test",
    "model": "SmolLM2-135M",
    "dtype": "float32",
    "blocks": 30,
    "interval_s": 5.0,
    "recipe": {"ratio": 0.3, "calibration": {"samples": 128, "tokens": 128, "holdout": 8}},
    "uninterrupted": {
        "wall_s": 80.0,
        "prune_s": 70.0,
        "checkpoint_saves": 10,
        "checkpoint_seconds": 2.0,
        "checkpoint_bytes": 300e6,
        "checkpoint_state_bytes": 40e6,
    },
    "killed": {"wall_s": 60.0, "blocks_done": 21},
    "resumed": {"wall_s": 35.0, "prune_s": 30.0, "resumed_at_block": 20, "before_loop_s": 12.0, "load_s": 0.5},
    "total_s": 95.0,
    "target_s": 85.5,
    "same_result": True,
    "write_rate_gbs": 0.2,
    "nvme_gbs": 2.0,
    "default_tokens": 128,
    "shapes": shapes(8, 0.2),
}


def test_the_shapes_count_fit_and_held_aside_activations_in_the_models_dtype():
    rows = {(r["model"], r["dtype"], r["samples"]): r["state_bytes"] for r in shapes(8, 1.0)}
    assert len(rows) == 8
    assert rows["Llama-2-7B", "float16", 128] == (128 + 8) * 2048 * 4096 * 2  # ≈ 2.28 GB
    assert rows["Llama-2-70B", "float32", 1024] == (1024 + 8) * 2048 * 8192 * 4  # ≈ 69.3 GB


def test_the_page_states_the_runs_the_target_the_equality_and_the_shapes():
    page = render(SYNTHETIC)
    assert page.startswith("2000-01-01, a test machine, 2 cores, torch 0.0.0+test. SmolLM2-135M (30 blocks)")
    assert "`FolderCheckpoints(every_seconds=5)`" in page
    assert "| uninterrupted (T) | 80.0 | 10 saves in 2.00 s |" in page
    assert "| SIGKILLed after 21 of 30 blocks | 60.0 |" in page
    assert "| resumed at block 20 | 35.0 | 12.0 s from its start" in page and "0.50 s loading it" in page
    assert "| killed + resumed | 95.0 | target T + interval + load = 85.5 s |" in page
    assert "95.0 s against a target of 85.5 s (1.11×)" in page
    assert "same kept heads and neurons): yes." in page
    assert "Per save: 40.0 MB written" in page and "300.0 MB in\nall at the last save" in page
    assert "0.200 s a save" in page and "0.067 s a\nblock" in page
    assert "assumed NVMe" in page and "(not measured)" in page and "16 times smaller" in page
    # 70B, float16, 1024 windows of 2048 tokens: 34.6 GB a save, 69.3 GB with error feedback
    assert "| Llama-2-70B | float16 | 1024 × 2048 | 34.6 | 69.3 | 173.1 | 17.3 |" in page
    assert "**no**" in render(SYNTHETIC | {"same_result": False})


def test_the_index_claims_read_the_same_results():
    assert total_against_target(SYNTHETIC) == "95.0 s against a target of 85.5 s (1.11×)"
    assert save_size(SYNTHETIC, "Llama-2-70B", 1024, "float16") == "34.6 GB, 17.3 s at NVMe rate"
    assert save_size(SYNTHETIC, "Llama-3-405B", 1024, "float16") == "–"


@pytest.mark.parametrize("missing", ["shapes", "uninterrupted"])
def test_a_results_file_without_a_part_is_not_rendered_silently(missing):
    with pytest.raises(KeyError):
        render({k: v for k, v in SYNTHETIC.items() if k != missing})


def test_the_page_says_whether_the_resumed_run_kept_its_scores():
    assert "(model, windows, scores again)" in render(SYNTHETIC)  # a results file from before scores were kept
    kept = SYNTHETIC | {"resumed": SYNTHETIC["resumed"] | {"scores_kept_from": "an earlier run"}}
    page = render(kept)
    assert "(model and windows again, scores kept from an earlier run)" in page
    assert "the scores are read from the checkpoint, not computed" in page


def test_the_other_recipes_are_a_table_and_a_different_result_is_shown_bold():
    cases = [
        {"case": "paper", "recipe": {"head_ratio": "same"}, "blocks": 30, "killed_after": 9, "resumed_at_block": 9,
         "same_result": True},
        {"case": "depth+width", "recipe": {"ratio": 0.5}, "blocks": 22, "killed_after": 17, "resumed_at_block": 17,
         "same_result": False},
    ]  # fmt: skip
    page = render(SYNTHETIC | {"cases": cases})
    assert '| paper | `{"head_ratio": "same"}` | 9 of 30 | 9 | yes |' in page
    assert '| depth+width | `{"ratio": 0.5}` | 17 of 22 | 17 | **no** |' in page
    assert "Other recipes" not in render(SYNTHETIC)  # a results file from before the cases were run
