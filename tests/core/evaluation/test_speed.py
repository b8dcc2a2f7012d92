"""End-to-end prefill timings (``core/evaluation/speed.py``): every side timed several times, and the
speed-up of a model pruned in place given with a conservative spread."""

from __future__ import annotations

import itertools

import pytest

from core.evaluation.speed import PrefillTiming, prefill_speedup, prefill_timing


def test_a_prefill_timing_keeps_every_repeat_over_the_capped_tokens(llama_dir):
    from core.models.loading import load_model

    model, _, _ = load_model(str(llama_dir), "float32", "cpu")
    timing = prefill_timing(model, batch=2, seq_len=10**6, repeats=4)  # capped at 256 positions
    assert timing.tokens == 2 * 256 and len(timing.seconds) == 4 and min(timing.seconds) > 0
    middle = sorted(timing.seconds)[1:3]  # four repeats: the median is the mean of the middle two
    assert timing.tokens_per_second == pytest.approx(512 / (sum(middle) / 2)) and not model.training


def test_the_prefill_speed_up_s_spread_holds_every_pairing_of_a_dense_and_a_pruned_run():
    dense = PrefillTiming(512, [2.0, 2.2, 1.9, 2.6, 2.1])
    pruned = PrefillTiming(512, [1.0, 1.3, 1.1, 0.9, 1.2])
    median, low, high = prefill_speedup(dense, pruned)
    assert median == pytest.approx(2.1 / 1.1)  # the ratio of the medians
    # the slow reference: every dense run against every pruned run (timed apart, no run pairs with another)
    pairings = [d / p for d, p in itertools.product(dense.seconds, pruned.seconds)]
    assert (low, high) == (pytest.approx(min(pairings)), pytest.approx(max(pairings)))
    assert low < median < high
