"""Resuming a speed-target run (``core/pipeline/target.py``): its latency table and every finished
candidate prune are kept in the run's checkpoint, and the prune under way resumes at its last block
boundary (``core/pipeline/resume.py``).

A target run's checkpoint is one save of its :class:`~core.pipeline.checkpoint.Checkpoints`, whose
manifest holds

- ``target``: the latency table, the rows of the prunes finished so far (measured speed-up and
  held-aside loss, as ``target_candidates`` records them) and which one is kept so far;
- ``target-best.pt``: that prune's model and result (weights, layout, removed blocks, plan, report,
  metrics), written when a prune becomes the best so far;
- ``candidate``: the block-loop checkpoint of the prune under way (its own manifest and files).

It is saved after the table is measured, after every prune (the prune, its held-aside loss and its
timing are minutes of work) and, within a prune, at block boundaries as any run is. A resumed run
replays the finished rows instead of pruning and timing them again, so it reaches the prune under way
with the table and the rows the stopped run had; what follows is the uninterrupted run's arithmetic.
Measured times are kept, not measured again: the resumed model is the uninterrupted one bit for bit
(on a CPU) when the prunes left to run time as they would have.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from core.allocation import Plan
from core.allocation.plan import LayerPlan
from core.criteria import Scores
from core.depth.replace import remove_blocks
from core.evaluation.latency import LatencyTable
from core.models.adapter import adapter_for
from core.models.modeling_liar import apply_layout
from core.pipeline.checkpoint import FORMAT, CheckpointError, Checkpoints, StopRequested, sha256_file
from core.pipeline.result import LayerReport, PruneResult
from core.pipeline.resume import WHAT, made_by
from core.spec.recipe import Recipe

BEST = "target-best.pt"
_COUNTED = ("checkpoint_saves", "checkpoint_seconds")  # summed over the prunes' block-loop saves
# the result's fields kept as they are
_KEPT = ("params_before", "params_after", "block_params_before", "block_params_after", "seconds", "peak_memory_mb")
_KEPT += ("metrics",)


class TargetSaves:
    """A speed-target run's side of checkpoints: :meth:`resume` first, :meth:`measured` once the
    table is there, :meth:`for_prune` for each prune's block loop, :meth:`finished` after each prune."""

    def __init__(self, store: Checkpoints, recipe: Recipe, calibration):
        self.store, self.made = store, made_by(recipe, calibration)
        self.staging = Path(tempfile.mkdtemp(prefix="liar-target-"))
        self.table: LatencyTable | None = None
        self.rows: list[dict[str, Any]] = []  # the finished prunes' rows, in the order they were pruned
        self.best: int | None = None  # the row kept so far, whose result is BEST
        self.kept = 0  # rows from an earlier attempt
        self.under_way: tuple[int, dict, dict[str, Path]] | None = None  # a prune's checkpoint, as loaded
        self.metrics: dict[str, Any] = {}

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def resume(self) -> None:
        """The table, the finished rows and the kept prune's file from the checkpoint, if it has one
        this run made (else the run starts over, and the store's note says why)."""
        try:
            found = self.store.load(self.staging / "loaded")
            if found is None:
                return
            manifest, files = found
            target = manifest.get("target")
            if target is None:
                raise CheckpointError("it is not a speed-target run's")
            for part, what in WHAT.items():
                if part in self.made and manifest.get("made", {}).get(part) != self.made[part]:
                    raise CheckpointError(f"it was made by {what}")
        except CheckpointError as exc:
            self.store.note(f"checkpoint refused: {exc}; the speed target starts over")
            self.store.discard()
            return
        self.table = LatencyTable(**target["table"]) if target["table"] is not None else None
        self.rows, self.best, self.kept = target["rows"], target["best"], len(target["rows"])
        if self.best is not None:  # a copy of our own: the store may drop the one loaded
            shutil.copyfile(files[BEST], self.staging / BEST)
        part = manifest.get("candidate")
        if part is not None:
            self.under_way = (target["under_way"], part, {name: files[name] for name in part["files"]})
        went_on = f"; prune {self.kept + 1} goes on from its own checkpoint" if part is not None else ""
        made = manifest.get("made_by", "an earlier run")
        kept = f"the latency table and {self.kept} finished prunes kept from {made}"
        self.store.note(f"speed target resumed: {kept}{went_on}")
        self.metrics.update(resumed_prunes_kept=self.kept, checkpoint_bytes=manifest["bytes"])

    def recorded(self, index: int) -> dict[str, Any] | None:
        """Prune ``index``'s row if an earlier attempt finished it."""
        return dict(self.rows[index]) if index < self.kept else None

    def measured(self, table: LatencyTable) -> None:
        self.table = table
        self._save(None, "the latency table")

    def for_prune(self, index: int) -> _PruneSaves:
        return _PruneSaves(self, index)

    def finished(self, index: int, row: dict[str, Any], result: PruneResult, best: bool) -> None:
        """Prune ``index`` done and timed: its row kept, its result too if it is the ``best`` so far;
        saved, then :class:`StopRequested` if a stop was asked for."""
        self.rows.append(json.loads(json.dumps(row)))
        for key in _COUNTED:
            self.metrics[key] = self.metrics.get(key, 0) + result.metrics.get(key, 0)
        if best:
            torch.save(_result_state(result), self.staging / BEST)
            self.best = index
        self._save(None, f"candidate prune {index + 1}")
        if self.store.stop_requested():
            after = f"stopped after candidate prune {index + 1}"
            raise StopRequested(f"{after}; the checkpoint resumes at prune {index + 2}")

    def _save(self, prune: tuple[int, dict, dict[str, Path]] | None, after: str) -> None:
        """One save of the run: the target's state, the kept prune's file and ``prune``'s block-loop
        checkpoint (its index, manifest and files), if any."""
        t0 = time.perf_counter()
        files: dict[str, Path] = {}
        digests: dict[str, str] = {}
        if self.best is not None:
            files[BEST] = self.staging / BEST
            digests[BEST] = sha256_file(files[BEST])
        table = None if self.table is None else self.table.to_dict()
        target = {"table": table, "rows": self.rows, "best": self.best, "under_way": None}
        manifest = {"format": FORMAT, "made": self.made, "made_by": self.store.label, "target": target}
        if prune is not None:
            target["under_way"], manifest["candidate"] = prune[0], prune[1]
            files |= prune[2]
            digests |= prune[1]["files"]
        manifest |= {"after": after, "files": digests, "bytes": sum(p.stat().st_size for p in files.values())}
        self.store.save(files, manifest)
        self.metrics["checkpoint_bytes"] = manifest["bytes"]
        if prune is None:  # a prune's own saves are counted by its block loop
            self.metrics["checkpoint_saves"] = self.metrics.get("checkpoint_saves", 0) + 1
            seconds = self.metrics.get("checkpoint_seconds", 0.0) + time.perf_counter() - t0
            self.metrics["checkpoint_seconds"] = round(seconds, 4)

    def best_result(self, source: Any) -> PruneResult:
        """The kept prune's result, rebuilt from BEST on a copy of the dense ``source.model``: the
        blocks it removed, its layout's cuts, then its weights."""
        state = torch.load(self.staging / BEST, map_location=source.device, weights_only=True)
        model = copy.deepcopy(source.model)
        if state["removed_blocks"]:
            remove_blocks(model, adapter_for(model), state["removed_blocks"])
        adapter = adapter_for(model)
        apply_layout(model, adapter.name, state["layout"])
        model.config.liar_layout, model.config.liar_family = state["layout"], adapter.name
        model.load_state_dict(state["weights"], strict=True)
        return PruneResult(
            model=model,
            tokenizer=source.tokenizer,
            recipe=Recipe.model_validate(state["recipe"]),
            adapter=adapter,
            plan=_plan(state["plan"]),
            planned=None if state["planned"] is None else _plan(state["planned"]),
            report=[LayerReport(**r) for r in state["report"]],
            scores=[Scores(**s) for s in state["scores"]],
            **{k: state[k] for k in _KEPT},
        )


class _PruneSaves:
    """The :class:`Checkpoints` one prune's block loop sees: its saves go into the target's, with the
    table and finished rows beside them."""

    def __init__(self, saves: TargetSaves, index: int):
        self.saves, self.index = saves, index
        self.every_seconds, self.label = saves.store.every_seconds, saves.store.label

    def save(self, files: dict[str, Path], manifest: dict) -> None:
        after = f"block {manifest['next_block']} of {manifest['blocks']} of candidate prune {self.index + 1}"
        self.saves._save((self.index, manifest, files), after)

    def load(self, into: Path) -> tuple[dict, dict[str, Path]] | None:
        found = self.saves.under_way
        return (found[1], found[2]) if found is not None and found[0] == self.index else None

    def peek(self, name: str, into: Path) -> tuple[dict, Path | None] | None:
        found = self.load(into)  # loaded and checked with the target's checkpoint already
        return None if found is None else (found[0], found[1].get(name))

    def discard(self) -> None:  # a refused block-loop checkpoint: the target's own state stays
        self.saves.under_way = None

    def stop_requested(self) -> bool:
        return self.saves.store.stop_requested()

    def note(self, message: str) -> None:
        self.saves.store.note(message)


def _result_state(result: PruneResult) -> dict[str, Any]:
    """What rebuilds ``result`` (:meth:`TargetSaves.best_result`), in types ``torch.load`` reads with
    ``weights_only``."""
    return {
        "weights": result.model.state_dict(),
        "layout": result.model.config.liar_layout,
        "removed_blocks": list(result.metrics.get("depth_blocks_removed") or []),
        "recipe": result.recipe.model_dump(mode="json"),
        "plan": _plan_state(result.plan),
        "planned": None if result.planned is None else _plan_state(result.planned),
        "report": [asdict(r) for r in result.report],
        "scores": [asdict(s) for s in result.scores],
    } | {k: getattr(result, k) for k in _KEPT}


def _plan_state(plan: Plan) -> dict[str, Any]:
    return {
        "layers": [asdict(lp) for lp in plan.layers],
        "block_params": plan.block_params,
        "target_removed": plan.target_removed,
        "removed": plan.removed,
    }


def _plan(state: dict[str, Any]) -> Plan:
    plan = Plan([LayerPlan(**lp) for lp in state["layers"]], state["block_params"], state["target_removed"])
    plan.removed = state["removed"]  # a depth-only plan counts the removed blocks, which are not its layers
    return plan
