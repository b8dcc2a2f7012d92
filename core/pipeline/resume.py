"""What the block loop saves at a block boundary, and how a run resumes from it
(``core/pipeline/checkpoint.py`` keeps the files).

After block k the rest of the loop needs:

- the calibration activations entering block k + 1 — the fit and held-aside batches' hidden states,
  and the dense model's when error feedback uses them (``reconstruction.target: dense``), saved in
  their own dtype (``state.pt``);
- the blocks done: a streamed run's shards as written (with their tensor names and sha256), or the
  pruned blocks' weights of a run in memory (``block-00001.pt``, …, each written once);
- the realised plan, the layout, the per-projection reports, ``head_ratio: obs``'s carry, and the
  block timings (``measure_speed``).

and, written once at a run's first save and carried to its later ones, the finalized scores its plan
was made from (``scores.pt``).

What comes before the loop — calibration windows, scores, plan — is deterministic. The windows and
the plan are computed again by the resumed run; the scores (a whole pass over the model for a
calibration-based criterion) are read first, alone (:meth:`Checkpoints.peek`), and used instead of
scoring when the checkpoint was made by the same format, code, recipe and windows (:func:`kept_scores`).
The checkpoint's fingerprint (the recipe, the windows, the planned keep-sets and the engine's code,
each a sha256) must match what the resumed run computed, or the checkpoint is refused and the run
starts over. The calibration seeds are part of the recipe, and the block loop draws no random
numbers: what a resumed run computes after block k is, bit for bit, what the whole run computed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from core.allocation import Plan
from core.allocation.plan import LayerPlan
from core.allocation.split import SplitState
from core.criteria import Scores
from core.data.calibration import CalibrationBatch
from core.models.modeling_liar import ensure_bias, prune_heads_, prune_neurons_
from core.pipeline.checkpoint import FORMAT, CheckpointError, Checkpoints, StopRequested, code_version, sha256_file
from core.pipeline.context import RunContext
from core.pipeline.result import LayerReport

STATE = "state.pt"
SCORES = "scores.pt"


def fingerprint(ctx: RunContext, plan: Plan, calibration: tuple[CalibrationBatch, CalibrationBatch]) -> dict[str, Any]:
    """What made a checkpoint, each part a sha256: a resumed run must match every part."""
    layers = [[lp.heads, lp.kv_heads, lp.neurons.tolist()] for lp in plan.layers]
    return made_by(ctx.recipe, calibration) | {"plan": _sha(json.dumps(layers))}


def made_by(recipe, calibration: tuple[CalibrationBatch, CalibrationBatch]) -> dict[str, Any]:
    """The parts of a fingerprint known before any plan: the format, the code, the recipe, the windows."""
    windows = hashlib.sha256()
    for batch in calibration:
        for t in (batch.input_ids, batch.attention_mask):
            if t is not None:
                windows.update(t.detach().cpu().contiguous().numpy().tobytes())
    recipe_sha = _sha(recipe.to_yaml())
    return {"format": FORMAT, "code": code_version(), "recipe": recipe_sha, "calibration": windows.hexdigest()}


WHAT = {
    "format": "another checkpoint format",
    "code": "another code version",
    "recipe": "another recipe",
    "calibration": "other calibration windows",
    "plan": "another plan",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class RunScores:
    """The finalized scores a run's plan is made from, as its checkpoints keep them (``SCORES``)."""

    scores: list[Scores]
    kept_from: str | None = None  # who saved the checkpoint that lent them; None: this run scored


def kept_scores(store: Checkpoints, made: dict[str, Any], n_layers: int) -> RunScores | None:
    """The scores of the checkpoint ``store`` keeps, read alone before any scoring, if it was made by
    ``made`` (:func:`made_by`: this run's format, code, recipe and windows) and holds them, matching
    their sha256; else None, and the run scores (whether the checkpoint itself is refused is the
    block loop's :meth:`Checkpointer.resume` to say)."""
    with tempfile.TemporaryDirectory(prefix="liar-scores-") as tmp:
        try:
            found = store.peek(SCORES, Path(tmp))
            if found is None or found[1] is None:
                return None
            manifest, path = found
            if any(manifest.get("made", {}).get(part) != value for part, value in made.items()):
                return None
            rows = torch.load(path, weights_only=True)  # on the device they were saved from, as scored
            scores = [Scores(**row) for row in rows]
        except (CheckpointError, OSError, RuntimeError, TypeError, ValueError):  # unreadable here: score
            return None
    if len(scores) != n_layers:
        return None
    return RunScores(scores, str(manifest.get("made_by", "an earlier run")))


class Checkpointer:
    """The block loop's side of checkpoints: :meth:`resume` before the loop, :meth:`after` each block."""

    def __init__(self, ctx: RunContext, store: Checkpoints, made: dict[str, Any], n_blocks: int):
        self.ctx, self.store, self.made, self.n = ctx, store, made, n_blocks
        self.staging = Path(tempfile.mkdtemp(prefix="liar-checkpoint-"))
        self.blocks: dict[str, tuple[Path, str]] = {}  # a run in memory: the blocks' files written so far
        self.scores: tuple[Path, str] | None = None  # SCORES as written at this run's first save
        self.last = time.monotonic()
        self.metrics: dict[str, Any] = {}

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    # --- resuming -----------------------------------------------------------------------------
    def resume(self, runner, split: SplitState | None, reports) -> tuple[int, list[LayerPlan], list[dict]]:
        """``(first block to run, realised plans, layout)`` from the checkpoint, the runner's
        activations, the reports and the split's carry restored; ``(0, [], [])`` without one (or with
        one refused: the run starts over, and the store's note says why)."""
        t0 = time.perf_counter()
        try:
            found = self.store.load(self.staging / "loaded")
            if found is None:
                return 0, [], []
            manifest, files = found
            self._check(manifest)
            state = torch.load(files[STATE], map_location="cpu", weights_only=True)
        except CheckpointError as exc:
            self.store.note(f"checkpoint refused: {exc}; starting over at block 1")
            self.store.discard()
            return 0, [], []
        start = int(manifest["next_block"])
        device = runner.device
        runner.hidden = [runner.offload.store(t.to(device)) for t in state["hidden"]]
        if state["dense"] is not None:
            runner.dense = [runner.offload.store(t.to(device)) for t in state["dense"]]
        realised = [LayerPlan(**lp) for lp in state["realised"]]
        reports.rows = [LayerReport(**r) for r in state["reports"]]
        if split is not None:
            split.carry = state["carry"]
        if self.ctx.speed is not None and state["speed"] is not None:
            self.ctx.speed.seconds = state["speed"]
        self._restore_blocks(manifest, files, realised, state["layout"])
        seconds = round(time.perf_counter() - t0, 3)
        made_by = manifest.get("made_by", "an earlier run")
        message = f"resumed at block {start + 1} of {self.n}, {start} blocks kept from {made_by}"
        kept = self.ctx.scores is not None and self.ctx.scores.kept_from is not None
        scoring = f", scores kept from {self.ctx.scores.kept_from}" if kept else ""
        self.store.note(f"{message}{scoring} (checkpoint loaded in {seconds:.2f} s)")
        self.metrics.update(resumed_at_block=start + 1, resumed_blocks_kept=start, checkpoint_bytes=manifest["bytes"])
        self.metrics.update(resumed_scores_kept=kept, resume_load_seconds=seconds)
        return start, realised, state["layout"]

    def _check(self, manifest: dict) -> None:
        for part, what in WHAT.items():
            if manifest.get("made", {}).get(part) != self.made[part]:
                raise CheckpointError(f"it was made by {what}")
        if manifest.get("blocks") != self.n or not 0 < int(manifest.get("next_block", 0)) < self.n:
            raise CheckpointError(f"it is for a model of {manifest.get('blocks')} blocks, not {self.n}")

    def _restore_blocks(self, manifest: dict, files: dict[str, Path], realised: list, layout: list) -> None:
        """The blocks done: a streamed run's shards back in its output folder; in memory, each block
        cut as it was and given its saved weights."""
        if manifest.get("streamed"):
            self.ctx.io.restore_blocks({n: files[n] for n in manifest["shards"]}, manifest)
            return
        ctx = self.ctx
        fam, layers = ctx.adapter.family, ctx.adapter.layers(ctx.model)
        for li, lp in enumerate(realised):
            layer, name = layers[li], _block_file(li)
            if len(lp.heads) < ctx.adapter.n_heads:
                prune_heads_(layer, fam, ctx.model.config, lp.heads, lp.kv_heads)
            if len(lp.neurons) < ctx.adapter.n_neurons:
                prune_neurons_(layer, fam, lp.neurons)
            for path in layout[li]["bias"]:
                ensure_bias(layer.get_submodule(path))
            own = self.staging / name  # the next save's copy: the store may drop the one loaded
            shutil.copyfile(files[name], own)
            layer.load_state_dict(torch.load(own, map_location=ctx.device, weights_only=True))
            self.blocks[name] = (own, manifest["files"][name])

    # --- saving -------------------------------------------------------------------------------
    def after(self, li: int, runner, split, reports, realised: list[LayerPlan], layout: list[dict]) -> None:
        """After block ``li`` is done: save when the interval has passed or a stop was asked for (then
        :class:`StopRequested` is raised once the checkpoint is kept). Nothing after the last block."""
        if li + 1 >= self.n:
            return
        stop = self.store.stop_requested()
        if not stop and time.monotonic() - self.last < self.store.every_seconds:
            return
        t0 = time.perf_counter()
        state = {
            "hidden": [t.detach().cpu() for t in runner.hidden],
            "dense": None if runner.dense is None else [t.detach().cpu() for t in runner.dense],
            "realised": [asdict(lp) for lp in realised],
            "layout": layout,
            "reports": [asdict(r) for r in reports.finish()],
            "carry": None if split is None else split.carry,
            "speed": None if self.ctx.speed is None else self.ctx.speed.seconds,
        }
        torch.save(state, self.staging / STATE)
        files = {STATE: (self.staging / STATE, sha256_file(self.staging / STATE))}
        manifest = {"format": FORMAT, "made": self.made, "made_by": self.store.label, "blocks": self.n}
        manifest |= {"next_block": li + 1, "streamed": False}
        shards = self.ctx.io.block_files(li + 1)
        if shards is not None:
            files |= shards[0]
            manifest |= {"streamed": True, "shards": sorted(shards[0])} | shards[1]
        else:
            files |= self._memory_blocks(li + 1)
        if self.ctx.scores is not None:
            files[SCORES] = self._scores_file()
        manifest["files"] = {name: digest for name, (_, digest) in files.items()}
        manifest["bytes"] = sum(path.stat().st_size for path, _ in files.values())
        manifest["state_bytes"] = files[STATE][0].stat().st_size
        self.store.save({name: path for name, (path, _) in files.items()}, manifest)
        self.last = time.monotonic()
        self._count(manifest, time.perf_counter() - t0)
        if stop:
            raise StopRequested(f"stopped after block {li + 1} of {self.n}; the checkpoint resumes at block {li + 2}")

    def _scores_file(self) -> tuple[Path, str]:
        """SCORES, written at the first save; every later save carries the same file."""
        if self.scores is None:
            path = self.staging / SCORES
            torch.save([asdict(s) for s in self.ctx.scores.scores], path)
            self.scores = (path, sha256_file(path))
        return self.scores

    def _memory_blocks(self, upto: int) -> dict[str, tuple[Path, str]]:
        layers = self.ctx.adapter.layers(self.ctx.model)
        for li in range(upto):
            name = _block_file(li)
            if name not in self.blocks:
                path = self.staging / name
                torch.save(layers[li].state_dict(), path)
                self.blocks[name] = (path, sha256_file(path))
        return dict(self.blocks)

    def _count(self, manifest: dict, seconds: float) -> None:
        m = self.metrics
        m["checkpoint_saves"] = m.get("checkpoint_saves", 0) + 1
        m["checkpoint_bytes"] = manifest["bytes"]  # the latest save's, all files (the store may share some)
        m["checkpoint_state_bytes"] = manifest["state_bytes"]  # the activations and the loop's state
        m["checkpoint_seconds"] = round(m.get("checkpoint_seconds", 0.0) + seconds, 4)


def _block_file(li: int) -> str:
    return f"block-{li + 1:05d}.pt"
