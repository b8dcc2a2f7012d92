"""A speed-target run stopped in the middle of a candidate prune, or between two, resumes from its
checkpoint without measuring the latency table or pruning a finished candidate again, and keeps the
same prune with the same kept units and the same weights, bit for bit on a CPU, as the run that was
never stopped. Timings are stood in for by a function of the pruned model (as a measurement is), so
both runs time their prunes alike."""

from __future__ import annotations

import pytest
import torch

from core.evaluation.latency import LatencyTable
from core.models.adapter import adapter_for, block_parameters
from core.models.tiny import tiny_decoder
from core.pipeline import target as target_mod
from core.pipeline.checkpoint import FolderCheckpoints, StopRequested
from core.pipeline.sequential import prune
from tests.conftest import fast_first, recipe_for

TABLE = LatencyTable("decode_b1", 6, [0.0, 0.3, 0.6], [1.0] * 3, [1.0, 0.8, 0.5], "cpu")


class Interrupted(Exception):
    pass


def _seconds(models, workload, rounds):
    """The pruned model's time as a function of its blocks' parameters: short of the table's
    prediction, so the width-only candidate is corrected."""
    dense, pruned = (block_parameters(m, adapter_for(m)) for m in (models["dense"], models["pruned"]))
    return {"dense": [1.0], "pruned": [(pruned / dense) ** 0.5]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("target") / "llama", num_hidden_layers=6, intermediate_size=96)


@pytest.fixture()
def timed(monkeypatch):
    """Stand-ins for the latency table and the timings; returns the list of prunes timed."""
    timings: list[int] = []

    def seconds(models, workload, rounds):
        timings.append(1)
        return _seconds(models, workload, rounds)

    monkeypatch.setattr(target_mod, "measure_table", lambda model, workload: TABLE)
    monkeypatch.setattr(target_mod, "interleaved_seconds", seconds)
    return timings


def _recipe(model, corpus) -> dict:
    r = recipe_for(model, corpus, ratio=None, target={"speedup": 1.4, "candidates": 2}, criterion={"name": "magnitude"})
    r["reconstruction"] = {"method": "ls", "damp": 0.001}
    return r


def _stop_in(prune_index: int, block: int):
    """A progress callback that raises when prune ``prune_index`` (0-based) starts block ``block``."""
    seen = {"prunes": -1}

    def progress(stage, done, total):
        if stage == "load" and done == 0:
            seen["prunes"] += 1
        if seen["prunes"] == prune_index and stage == "reconstruct" and done == block:
            raise Interrupted(f"stopped in prune {prune_index + 1} before block {block + 1}")

    return progress


def _same(whole, resumed):
    assert resumed.metrics["target_candidates"] == whole.metrics["target_candidates"]
    assert resumed.recipe == whole.recipe
    for a, b in zip(whole.plan.layers, resumed.plan.layers, strict=True):
        assert (a.heads, a.kv_heads) == (b.heads, b.kv_heads)
        assert torch.equal(a.neurons, b.neurons)
    assert [r.kept for r in whole.report] == [r.kept for r in resumed.report]
    assert whole.model.config.liar_layout == resumed.model.config.liar_layout
    sa, sb = whole.model.state_dict(), resumed.model.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa), [k for k in sa if not torch.equal(sa[k], sb[k])]


@pytest.fixture(scope="module")
def whole(model, corpus):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(target_mod, "measure_table", lambda model, workload: TABLE)
        mp.setattr(target_mod, "interleaved_seconds", _seconds)
        result = prune(_recipe(model, corpus))
    rows = result.metrics["target_candidates"]
    # width only, its correction, depth only, its correction (kept): the replay covers both kinds
    assert [(r["blocks"] > 0, r["width"] > 0, r["corrected"]) for r in rows] == [
        (False, True, False),
        (False, True, True),
        (True, False, False),
        (True, True, True),
    ]
    assert rows[-1]["kept"]
    return result


# prune 3 removes blocks only: no block loop; stopping in prune 1 (a finished prune kept, a block loop
# resumed) is the fast twin of the others
@pytest.mark.parametrize("stop_prune", fast_first(1, [1, 0, 3]))
def test_a_target_run_stopped_in_a_prune_resumes_to_the_same_model(
    model, corpus, tmp_path, whole, timed, monkeypatch, stop_prune
):
    recipe = _recipe(model, corpus)
    saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 1")
    with pytest.raises(Interrupted):
        prune(recipe, checkpoints=saves, progress=_stop_in(stop_prune, 3))
    assert len(timed) == stop_prune
    timed.clear()

    def no_table(model, workload):
        raise AssertionError("the latency table is measured again")

    monkeypatch.setattr(target_mod, "measure_table", no_table)
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 2")
    resumed = prune(recipe, checkpoints=again)
    n = len(whole.metrics["target_candidates"])
    assert len(timed) == n - stop_prune  # the finished prunes were not pruned or timed again
    assert again.notes[0] == (
        f"speed target resumed: the latency table and {stop_prune} finished prunes kept from attempt 1; "
        f"prune {stop_prune + 1} goes on from its own checkpoint"
    )
    assert again.notes[1].startswith("resumed at block 4 of ") and "scores kept from attempt 1" in again.notes[1]
    assert resumed.metrics["resumed_prunes_kept"] == stop_prune
    assert resumed.metrics["checkpoint_saves"] > 0 and resumed.metrics["checkpoint_bytes"] > 0
    _same(whole, resumed)


@pytest.mark.parametrize("after", fast_first(1, [4, 1]))  # after the last prune: the kept one rebuilt
def test_a_stop_request_saves_after_the_prune_and_the_next_attempt_goes_on(
    model, corpus, tmp_path, whole, timed, after
):
    recipe = _recipe(model, corpus)
    saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=3600, label="attempt 1")  # no block save is due
    seen = {"prunes": 0}

    def progress(stage, done, total):
        seen["prunes"] += stage == "load" and done == 0
        if seen["prunes"] == after and stage == "reconstruct" and done == total - 1:
            saves.stop = True  # in the prune's last block, as a SIGTERM handler does

    stopped = f"stopped after candidate prune {after}; the checkpoint resumes at prune {after + 1}"
    with pytest.raises(StopRequested, match=stopped):
        prune(recipe, checkpoints=saves, progress=progress)
    assert len(timed) == after
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=3600, label="attempt 2")
    resumed = prune(recipe, checkpoints=again)
    assert again.notes == [f"speed target resumed: the latency table and {after} finished prunes kept from attempt 1"]
    assert len(timed) == 4
    _same(whole, resumed)
    if after == 4:  # the kept prune was rebuilt from the checkpoint's copy: its export is the same bytes too
        a, b = whole.save(tmp_path / "a"), resumed.save(tmp_path / "b")
        shards = sorted(a.glob("*.safetensors"))
        assert shards and all(s.read_bytes() == (b / s.name).read_bytes() for s in shards)


def test_a_checkpoint_of_another_target_is_refused_and_the_run_starts_over(model, corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(target_mod, "measure_table", lambda model, workload: TABLE)
    fast = {"dense": [2.0], "pruned": [1.0]}  # every prune reaches the target: one prune a run
    monkeypatch.setattr(target_mod, "interleaved_seconds", lambda models, workload, rounds: fast)
    recipe = _recipe(model, corpus)
    recipe["target"]["candidates"] = 1
    with pytest.raises(Interrupted):
        prune(recipe, checkpoints=FolderCheckpoints(tmp_path / "c", 0), progress=_stop_in(0, 2))
    recipe["target"]["speedup"] = 1.3
    again = FolderCheckpoints(tmp_path / "c", 0)
    resumed = prune(recipe, checkpoints=again)
    assert again.notes[0] == "checkpoint refused: it was made by another recipe; the speed target starts over"
    assert "resumed_prunes_kept" not in resumed.metrics
