"""Block-boundary checkpoints: a run stopped at a random block and resumed from its checkpoint gives
the same kept units and the same weights, bit for bit on a CPU, as the run that was never stopped."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from core.data.calibration import CalibrationBatch, calibration_batches
from core.models.loading import ensure_pad_token
from core.models.tiny import tiny_decoder
from core.pipeline.checkpoint import FolderCheckpoints, StopRequested
from core.pipeline.sequential import MemorySource, prune
from core.pipeline.streamed import StreamSource
from core.spec.recipe import Recipe
from tests.conftest import recipe_for

N_BLOCKS = 6


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def six(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("resume") / "llama", num_hidden_layers=N_BLOCKS, intermediate_size=96)


def _recipe(path, corpus, case: str, execution: str) -> dict:
    recipe = recipe_for(path, corpus, device="cpu", execution=execution)
    if case == "default":  # the recipe's own defaults (criterion and selection auto), but a streamable criterion
        recipe.pop("reconstruction")
        if execution == "memory":
            recipe.pop("criterion")
    elif case == "paper":  # what --paper sets
        recipe |= {"head_ratio": "same", "reconstruction": {"method": "liar", "select": "criterion"}}
    elif case == "obs-split":  # head_ratio obs carries its running split from block to block
        recipe |= {"head_ratio": "obs", "reconstruction": {"select": "obs", "damp": 0.01}}
    elif case == "depth+width":
        recipe |= {"ratio": 0.5, "depth": {"blocks": 2}}
    elif case == "error-feedback":  # the dense model's activations are carried too
        recipe["reconstruction"] |= {"target": "dense", "method": "ls", "damp": 0.01}
    return recipe


def _stop_at(block: int):
    def progress(stage, done, total):
        if stage == "reconstruct" and done == block and done < total:
            raise Interrupted(f"stopped before block {block + 1}")

    return progress


def _run(recipe, execution, tmp_path, name, **options):
    out = tmp_path / name if execution == "stream" else None
    return prune(recipe, output_dir=out, **options)


def _same(whole, resumed, execution):
    for a, b in zip(whole.plan.layers, resumed.plan.layers, strict=True):
        assert (a.heads, a.kv_heads) == (b.heads, b.kv_heads)
        assert torch.equal(a.neurons, b.neurons)
    assert [r.kept for r in whole.report] == [r.kept for r in resumed.report]
    if execution == "memory":
        sa, sb = whole.model.state_dict(), resumed.model.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), [k for k in sa if not torch.equal(sa[k], sb[k])]
    else:  # the shards' sha256, computed as they were written: the same bytes
        assert whole.digests == resumed.digests


CASES = [
    ("default", "memory"),
    ("default", "stream"),
    ("paper", "stream"),
    ("obs-split", "memory"),
    ("depth+width", "stream"),
    ("error-feedback", "stream"),
]


@pytest.mark.parametrize("case,execution", CASES)
def test_a_run_stopped_at_a_random_block_resumes_to_the_same_model(six, corpus, tmp_path, case, execution):
    recipe = _recipe(six, corpus, case, execution)
    whole = _run(recipe, execution, tmp_path, "whole")
    n = len(whole.plan.layers)
    stop = random.Random(f"{case}-{execution}").randint(1, n - 1)  # a block after the first save
    saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 1")
    with pytest.raises(Interrupted):
        _run(recipe, execution, tmp_path, "out", checkpoints=saves, progress=_stop_at(stop))
    if execution == "stream":
        assert not (tmp_path / "out").exists()  # nothing half-written where the result goes
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 2")
    resumed = _run(recipe, execution, tmp_path, "out", checkpoints=again)
    assert len(again.notes) == 1
    assert again.notes[0].startswith(f"resumed at block {stop + 1} of {n}, {stop} blocks kept from attempt 1, ")
    assert "scores kept from attempt 1" in again.notes[0] and resumed.metrics["resumed_scores_kept"]
    assert resumed.metrics["resumed_at_block"] == stop + 1
    assert resumed.metrics["checkpoint_bytes"] > 0
    _same(whole, resumed, execution)


def test_a_stop_request_saves_at_the_next_boundary_and_the_run_resumes(six, corpus, tmp_path):
    recipe = _recipe(six, corpus, "paper", "stream")
    whole = _run(recipe, "stream", tmp_path, "whole")
    saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=3600, label="attempt 1")  # no save is due

    def progress(stage, done, total):
        if stage == "reconstruct" and done == 2:
            saves.stop = True  # as a SIGTERM handler does: the block under way is finished first

    with pytest.raises(StopRequested, match="stopped after block 3 of 6"):
        _run(recipe, "stream", tmp_path, "out", checkpoints=saves, progress=progress)
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=3600, label="attempt 2")
    resumed = _run(recipe, "stream", tmp_path, "out", checkpoints=again)
    assert again.notes[0].startswith(
        "resumed at block 4 of 6, 3 blocks kept from attempt 1, scores kept from attempt 1"
    )
    _same(whole, resumed, "stream")


@pytest.mark.parametrize(
    "change,why",
    [
        ("recipe", "it was made by another recipe"),
        ("corrupt", "does not match its recorded sha256"),
        ("code", "it was made by another code version"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_and_the_run_starts_over(six, corpus, tmp_path, change, why):
    recipe = _recipe(six, corpus, "paper", "memory")
    with pytest.raises(Interrupted):
        _run(recipe, "memory", tmp_path, "out", checkpoints=FolderCheckpoints(tmp_path / "c", 0), progress=_stop_at(3))
    if change == "recipe":
        recipe["reconstruction"]["damp"] = 0.05
    elif change == "corrupt":
        state = next((tmp_path / "c").glob("*/state.pt"))
        data = state.read_bytes()
        state.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        import json

        manifest = next((tmp_path / "c").glob("*/manifest.json"))
        data = json.loads(manifest.read_text())
        data["made"]["code"] = "0.0.1+000000000000"
        manifest.write_text(json.dumps(data))
    again = FolderCheckpoints(tmp_path / "c", 0)
    resumed = _run(recipe, "memory", tmp_path, "out", checkpoints=again)
    assert len(again.notes) == 1 and why in again.notes[0] and again.notes[0].endswith("starting over at block 1")
    assert "resumed_at_block" not in resumed.metrics
    _same(_run(recipe, "memory", tmp_path, "whole"), resumed, "memory")


def _spy_scoring(monkeypatch) -> list[str]:
    """Every scoring pass of either model source, as it is asked for."""
    calls: list[str] = []
    for source in (MemorySource, StreamSource):
        original = source.score

        def score(self, *args, _original=original, **kwargs):
            calls.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(source, "score", score)
    return calls


@pytest.mark.parametrize("criterion,execution", [("flap", "stream"), ("obs", "stream"), ("flap", "memory")])
def test_a_resumed_run_keeps_its_scores_instead_of_scoring_again(
    six, corpus, tmp_path, monkeypatch, criterion, execution
):
    recipe = _recipe(six, corpus, "paper", execution) | {"criterion": {"name": criterion}}
    whole = _run(recipe, execution, tmp_path, "whole")
    with pytest.raises(Interrupted):
        saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 1")
        _run(recipe, execution, tmp_path, "out", checkpoints=saves, progress=_stop_at(3))
    assert all((save / "scores.pt").is_file() for save in (tmp_path / "ckpt").iterdir())
    calls = _spy_scoring(monkeypatch)
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0, label="attempt 2")
    resumed = _run(recipe, execution, tmp_path, "out", checkpoints=again)
    assert calls == []  # no scoring pass: the plan was made from the checkpoint's scores
    assert again.notes[0].startswith(
        "resumed at block 4 of 6, 3 blocks kept from attempt 1, scores kept from attempt 1"
    )
    assert resumed.metrics["scores_kept_from"] == "attempt 1" and resumed.metrics["resumed_scores_kept"]
    assert resumed.metrics["resume_load_seconds"] >= 0
    for a, b in zip(whole.scores, resumed.scores, strict=True):
        assert torch.equal(a.heads, b.heads) and torch.equal(a.neurons, b.neurons)
    _same(whole, resumed, execution)


def _reversed(batch: CalibrationBatch) -> CalibrationBatch:
    n = len(batch)
    return CalibrationBatch.concat([batch.slice(n // 2, n), batch.slice(0, n // 2)])


@pytest.mark.parametrize("change,why", [("windows", "other calibration windows"), ("scores", "recorded sha256")])
def test_a_checkpoint_that_does_not_fit_lends_no_scores(six, corpus, tmp_path, monkeypatch, change, why):
    recipe = _recipe(six, corpus, "paper", "stream") | {"criterion": {"name": "flap"}}
    tokenizer = AutoTokenizer.from_pretrained(six)
    ensure_pad_token(tokenizer)
    fit, held = calibration_batches(Recipe.model_validate(recipe).calibration, tokenizer, "decoder")
    first = (_reversed(fit), held) if change == "windows" else (fit, held)
    with pytest.raises(Interrupted):
        saves = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0)
        _run(recipe, "stream", tmp_path, "out", checkpoints=saves, calibration=first, progress=_stop_at(3))
    if change == "scores":
        path = next((tmp_path / "ckpt").glob("*/scores.pt"))
        data = path.read_bytes()
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    calls = _spy_scoring(monkeypatch)
    again = FolderCheckpoints(tmp_path / "ckpt", every_seconds=0)
    resumed = _run(recipe, "stream", tmp_path, "out", checkpoints=again, calibration=(fit, held))
    assert calls == ["StreamSource"]  # scored as a run without a checkpoint does
    assert len(again.notes) == 1 and why in again.notes[0] and again.notes[0].endswith("starting over at block 1")
    assert "scores_kept_from" not in resumed.metrics
    _same(_run(recipe, "stream", tmp_path, "whole", calibration=(fit, held)), resumed, "stream")
