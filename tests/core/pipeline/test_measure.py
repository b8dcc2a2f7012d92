"""Block timings a user can trust (``core/pipeline/measure.py``): the dense copy and the pruned block
timed side by side in alternating pairs, the speed-up's median and spread against a slow reference,
and two identical runs that agree within the spread they report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core import prune
from core.pipeline.measure import BlockSpeed, dense_copy
from tests.conftest import recipe_for

CPU = torch.device("cpu")


class _Scripted:
    """A clock that only moves when a block runs: each run of ``name`` takes the next of its scripted
    durations, and the order of the runs is recorded."""

    def __init__(self, durations: dict[str, list[float]]):
        self.now, self.order = 0.0, []
        self.left = {k: list(v) for k, v in durations.items()}

    def clock(self) -> float:
        return self.now

    def forward(self, block: nn.Module) -> None:
        self.order.append(block.name)
        self.now += self.left[block.name].pop(0)


def _block(name: str) -> nn.Module:
    block = nn.Linear(2, 2)
    block.name = name
    return block


def _reference(blocks: list[tuple[list[float], list[float]]]) -> dict[str, float]:
    """The metrics spelled out: per repeat, the total over blocks of each side; the speed-up samples
    their ratios; the median and the extremes of those."""
    repeats = len(blocks[0][0])
    dense = [sum(b[0][r] for b in blocks) for r in range(repeats)]
    pruned = [sum(b[1][r] for b in blocks) for r in range(repeats)]
    samples = sorted(d / p for d, p in zip(dense, pruned))
    assert repeats % 2 == 1  # the median is then the middle value
    return {
        "block_speedup": samples[repeats // 2],
        "block_speedup_low": samples[0],
        "block_speedup_high": samples[-1],
        "block_seconds_dense": sorted(dense)[repeats // 2],
        "block_seconds_pruned": sorted(pruned)[repeats // 2],
    }


def test_the_two_versions_are_timed_in_alternating_pairs_after_a_warm_up():
    speed = BlockSpeed(repeats=4)
    fake = _Scripted({"dense": [9.0] + [1.0] * 4, "pruned": [9.0] + [0.5] * 4})
    speed.clock = fake.clock
    speed.time(_block("dense"), _block("pruned"), fake.forward, CPU)
    # one untimed warm-up of each, then pairs whose first side alternates (a bias of going first shows
    # in the spread instead of the median)
    assert fake.order == ["dense", "pruned"] + ["dense", "pruned", "pruned", "dense"] * 2
    assert speed.seconds == {"dense": [1.0] * 4, "pruned": [0.5] * 4}  # the warm-ups' 9 s are not counted


def test_the_speed_up_is_the_median_of_the_per_repeat_ratios_and_its_spread_their_extremes():
    # three blocks, five repeats: each block's dense and pruned seconds per repeat (a busy worker: the
    # third repeat of block 1 was hit by another process, on its pruned side)
    blocks = [
        ([1.0, 1.1, 0.9, 1.0, 1.2], [0.5, 0.6, 0.5, 0.4, 0.6]),
        ([2.0, 2.1, 2.2, 1.9, 2.0], [1.0, 1.1, 9.0, 1.0, 0.9]),
        ([0.3, 0.3, 0.4, 0.3, 0.3], [0.2, 0.1, 0.2, 0.2, 0.2]),
    ]
    speed = BlockSpeed(repeats=5)
    for dense_s, pruned_s in blocks:
        fake = _Scripted({"dense": [0.0, *dense_s], "pruned": [0.0, *pruned_s]})
        speed.clock = fake.clock
        speed.time(_block("dense"), _block("pruned"), fake.forward, CPU)
    m, ref = speed.metrics(), _reference(blocks)
    assert m["block_speedup_repeats"] == 5
    for key, value in ref.items():
        assert m[key] == pytest.approx(value, abs=1e-4), key
    assert m["block_speedup_low"] < 1.0 < m["block_speedup"]  # the slow repeat widens the spread only


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        BlockSpeed(repeats=0)


def test_the_dense_copy_is_its_own_block_and_keeps_the_hooks_owner():
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    owner = {"calls": 0}

    def hook(_m, _args):
        owner["calls"] += 1

    block.register_forward_pre_hook(hook)
    copy = dense_copy(block)
    with torch.no_grad():
        block[0].weight.zero_()  # "pruning" the original leaves the copy dense
    assert copy[0].weight.abs().sum() > 0
    copy(torch.ones(1, 4))
    assert owner["calls"] == 1  # the same hook, not a copy of its owner


def test_block_timing_leaves_a_run_s_numbers_readable(llama_dir, corpus):
    m = prune(recipe_for(llama_dir, corpus, device="cpu"), measure_speed=True).metrics
    assert m["block_speedup_repeats"] == 5
    assert m["block_speedup_low"] <= m["block_speedup"] <= m["block_speedup_high"]
    assert m["block_seconds_dense"] > 0 and m["block_seconds_pruned"] > 0


def test_two_identical_runs_agree_within_the_spread_they_report(llama_dir, corpus):
    """The issue: two identical recipes showed 35.4× and 1.07×. Two runs of one recipe now give medians
    no further apart than their two spreads laid end to end: |s1 − s2| ≤ (high1 − low1) + (high2 − low2),
    the distance the medians can lie apart while the two ranges still touch — each run's range admits
    the other's figure. (One spread covering the difference alone, max(...), would also ask that both
    runs met the same noise; the union of the two ranges contains both medians by construction and
    tests nothing.)

    One thread: with two on a loaded two-core machine, OpenMP's waits for a descheduled thread slow
    every sample of a run alike — the machine changing between runs, which no spread within a run can
    show — while the noise the spread is for, a process taking the core mid-timing, remains."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = [prune(recipe_for(llama_dir, corpus, device="cpu", ratio=0.2), measure_speed=True).metrics for _ in "ab"]
    finally:
        torch.set_num_threads(threads)
    (s1, lo1, hi1), (s2, lo2, hi2) = (
        (m["block_speedup"], m["block_speedup_low"], m["block_speedup_high"]) for m in runs
    )
    assert lo1 <= s1 <= hi1 and lo2 <= s2 <= hi2
    assert abs(s1 - s2) <= (hi1 - lo1) + (hi2 - lo2), runs


@pytest.mark.parametrize("depth_only", [True, False])
def test_blocks_removed_by_depth_pruning_count_on_the_dense_side_only(depth_only):
    """Three blocks timed alone before the span went (block 1 removed). The totals are the reference's
    blocks: a removed block as (its times, zeros); a kept block of a depth-only run as (its times, its
    times); with width pruning after, the kept blocks only as the width pruning times them side by side
    (one here)."""
    durations = {"b0": [9.0, 1.0, 1.2, 1.1], "b1": [9.0, 2.0, 2.5, 2.2], "b2": [9.0, 3.0, 3.3, 3.1]}
    fake = _Scripted({**durations, "dense": [9.0, 3.0, 3.0, 3.0], "pruned": [9.0, 1.5, 1.0, 2.0]})
    speed = BlockSpeed(repeats=3, clock=fake.clock)
    times = [speed.time_alone(_block(name), fake.forward, CPU) for name in ("b0", "b1", "b2")]
    for got, name in zip(times, ("b0", "b1", "b2"), strict=True):  # the warm-up is not timed
        assert got == pytest.approx(durations[name][1:], abs=1e-12), name
    speed.add_depth(times, {1}, depth_only)
    blocks = [(times[1], [0.0] * 3)]
    if depth_only:
        blocks += [(times[0], times[0]), (times[2], times[2])]
    else:
        speed.time(_block("dense"), _block("pruned"), fake.forward, CPU)
        blocks += [([3.0] * 3, [1.5, 1.0, 2.0])]  # the kept blocks count as the width pruning times them
    metrics = speed.metrics()
    for key, value in _reference(blocks).items():
        assert metrics[key] == pytest.approx(value, abs=1e-4), key
