"""Depth pruning streamed (one block in memory) against the same recipe pruned in memory: the same span,
the same candidate scores, the same checkpoint; and a failed run leaves nothing behind."""

from __future__ import annotations

import json

import pytest
import torch

from core import load_pruned, prune
from core.models.streaming import StreamedModel
from core.pipeline import estimate
from core.pipeline.streamed import shard_name
from tests.conftest import fast_first, recipe_for
from tests.core.depth.test_blockwise import six_block_models
from tests.core.models.test_streaming import _assert_same_checkpoint


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """LLaMA, Qwen2 with sliding-window and full-attention blocks alternating, and Gemma 3, six blocks each."""
    return six_block_models(tmp_path_factory.mktemp("deep"))


def _recipe(path, corpus, **kw):
    recipe = recipe_for(path, corpus, device="cpu", round_to={"neurons": 1}, **kw)
    recipe["reconstruction"] = {"select": "criterion", "method": "ls", "damp": 0.001}
    return recipe


def _one_block_at_a_time(monkeypatch):
    """Every block load of a streamed run finds every other block on the meta device."""
    real = StreamedModel.load_block
    loads = []

    def load_block(self, i, names=None):
        live = [j for j, layer in enumerate(self.layers) if any(not p.is_meta for p in layer.parameters())]
        assert live == [], f"block {i} loaded while blocks {live} are in memory"
        loads.append(i)
        return real(self, i, names)

    monkeypatch.setattr(StreamedModel, "load_block", load_block)
    return loads


CASES = fast_first(
    3,
    [
        ("llama", dict(modules="blocks", ratio=0.34)),  # 2 of 6 blocks, select loss, ls
        ("llama", dict(ratio=0.5, depth={"blocks": 2})),  # depth and width (magnitude)
        ("qwen2", dict(modules="blocks", ratio=0.2)),  # 1 block: the blocks after it change position type
        ("qwen2", dict(ratio=0.5, depth={"blocks": 1}, criterion={"name": "flap"})),  # scores read the folded block
        ("gemma3", dict(modules="blocks", ratio=0.34, depth={"reconstruction": "none"})),
        ("llama", dict(modules="blocks", ratio=0.34, depth={"select": "fit"})),
        ("llama", dict(modules="blocks", ratio=0.5, depth={"select": "angular", "reconstruction": "none"})),
        ("llama", dict(ratio=0.5, depth={"blocks": 1, "select": "fit"}, calibration={"holdout_samples": 0})),
    ],
)


@pytest.mark.parametrize("family, kw", CASES)
def test_streamed_depth_equals_in_memory(deep, corpus, tmp_path, monkeypatch, family, kw):
    recipe = _recipe(deep[family], corpus, **kw)
    memory = prune({**recipe, "execution": "memory"})
    memory_dir = memory.save(tmp_path / "memory")
    loads = _one_block_at_a_time(monkeypatch)
    streamed = prune({**recipe, "execution": "stream"}, output_dir=tmp_path / "stream")
    assert streamed.model is None and streamed.metrics["execution"] == "stream"
    stream_dir = streamed.save(tmp_path / "stream")
    assert loads  # the streamed run went through the counted loads

    depth = {k: v for k, v in memory.metrics.items() if k.startswith("depth_") and k != "depth_seconds"}
    assert depth["depth_blocks_removed"] and streamed.metrics["depth_blocks_removed"] == depth["depth_blocks_removed"]
    for key, value in depth.items():
        got = streamed.metrics[key]
        assert got == (pytest.approx(value, rel=1e-6, abs=1e-9) if isinstance(value, float) else value), key
    assert (streamed.params_before, streamed.params_after) == (memory.params_before, memory.params_after)
    assert streamed.achieved_ratio == pytest.approx(memory.achieved_ratio)
    _assert_same_checkpoint(memory_dir, stream_dir)

    # one shard per kept block, numbered for the shorter model, under the blocks' new names
    kept = json.loads((stream_dir / "config.json").read_text())["num_hidden_layers"]
    assert kept == 6 - len(depth["depth_blocks_removed"])
    weight_map = json.loads((stream_dir / "model.safetensors.index.json").read_text())["weight_map"]
    files = {shard_name(k, kept + 1) for k in range(1, kept + 2)}
    assert set(weight_map.values()) - {"model-zero-biases.safetensors"} == files
    assert {p.name for p in stream_dir.glob("model-0*.safetensors")} == files
    for name, file in weight_map.items():
        if ".layers." in name:
            assert file == shard_name(int(name.split(".layers.")[1].split(".")[0]) + 2, kept + 1), name

    model, _ = load_pruned(stream_dir)
    ids = torch.randint(4, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, memory.model(ids).logits, atol=1e-5, rtol=1e-5)


def test_auto_streams_a_depth_recipe_saved_from_a_checkpoint(deep, corpus, tmp_path):
    recipe = _recipe(deep["llama"], corpus, modules="blocks", ratio=0.34, depth={"select": "angular"})
    streamed = prune(recipe, output_dir=tmp_path / "out", measure_speed=True)
    assert streamed.metrics["execution"] == "stream"
    # every block timed in the fit pass: the removed ones on the dense side, the kept ones on both
    assert streamed.metrics["block_speedup_repeats"] == 5
    streamed.discard()
    assert prune(recipe).metrics["execution"] == "memory"  # not saved: nothing to stream into
    guess = estimate.estimate(recipe, "cpu")
    assert guess.ok and guess.execution == "stream"


@pytest.mark.parametrize("at", [("depth", 3), ("depth", 9), ("reconstruct", 2)])
def test_a_run_stopped_during_or_after_the_depth_passes_leaves_nothing(deep, corpus, tmp_path, at):
    """Cancelled in the fit pass, in the loss pass, or in the width pruning after the span was taken
    out (and the first shard renamed): no checkpoint and no temporary directory remain."""
    recipe = _recipe(deep["llama"], corpus, ratio=0.5, depth={"blocks": 2}, execution="stream")

    def progress(stage, done, total):
        if (stage, done) == at:
            raise RuntimeError(f"stopped at {stage} {done}")

    with pytest.raises(RuntimeError, match="stopped at"):
        prune(recipe, output_dir=tmp_path / "out", progress=progress)
    assert not list(tmp_path.iterdir())


def test_a_depth_only_run_failing_while_writing_its_blocks_leaves_nothing(deep, corpus, tmp_path, monkeypatch):
    from core.models import safetensors_io

    real, calls = safetensors_io.write_shard, []

    def failing(path, tensors):
        calls.append(path.name)
        if len(calls) == 3:  # the outer shard, then the first two blocks'
            raise OSError("disk full while writing")
        return real(path, tensors)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", failing)
    recipe = _recipe(deep["llama"], corpus, modules="blocks", ratio=0.34, execution="stream")
    with pytest.raises(OSError, match="disk full"):
        prune(recipe, output_dir=tmp_path / "out")
    assert len(calls) >= 3 and not list(tmp_path.iterdir())
