"""docs/results/resume.md (``bench/resume.py``): a streamed prune killed at 70% of its blocks and resumed
from its checkpoint, against the run never stopped; the checkpoint's size and save time for 7B and 70B
shapes computed from the same arithmetic."""

from __future__ import annotations

import json

from bench.pages.page import renderer
from bench.pages.values import data, num, table, times

MB = 1e6
GB = 1e9


def total_against_target(d: dict) -> str:
    """``85.2 s against a target of 80.4 s (1.06×)``: killed + resumed against T + interval + load."""
    return f"{num(d['total_s'])} s against a target of {num(d['target_s'])} s ({times(d['total_s'] / d['target_s'])})"


def save_size(d: dict, model: str, samples: int, dtype: str) -> str:
    """One save's size and its time at the assumed NVMe rate, for a shape row at 2048 tokens."""
    for r in d["shapes"]:
        if (r["model"], r["samples"], r["dtype"], r["tokens"]) == (model, samples, dtype, 2048):
            return f"{num(r['state_bytes'] / GB)} GB, {num(r['state_bytes'] / (d['nvme_gbs'] * GB))} s at NVMe rate"
    return "–"


def _runs(d: dict) -> str:
    w, k, r = d["uninterrupted"], d["killed"], d["resumed"]
    saves = f"{w['checkpoint_saves']} saves in {num(w['checkpoint_seconds'], 2)} s"
    rows = [
        ["uninterrupted (T)", num(w["wall_s"]), saves],
        [f"SIGKILLed after {k['blocks_done']} of {d['blocks']} blocks", num(k["wall_s"]), "its last save is kept"],
        [
            f"resumed at block {r['resumed_at_block']}",
            num(r["wall_s"]),
            f"{num(r['before_loop_s'])} s from its start to the checkpoint ({_again(r)}), "
            f"{num(r['load_s'], 2)} s loading it",
        ],
        ["killed + resumed", num(d["total_s"]), f"target T + interval + load = {num(d['target_s'])} s"],
    ]  # fmt: skip
    return table(["run", "wall s", "notes"], rows)


def _again(r: dict) -> str:
    """What the resumed run computed again before its checkpoint loaded."""
    if r.get("scores_kept_from"):
        return f"model and windows again, scores kept from {r['scores_kept_from']}"
    return "model, windows, scores again"


def _cases(d: dict) -> str:
    """The other recipes, each killed at a random block and resumed: the same result or not."""
    if not d.get("cases"):
        return ""
    rows = [
        [c["case"], f"`{json.dumps(c['recipe'])}`", f"{c['killed_after']} of {c['blocks']}", str(c["resumed_at_block"]),
         "yes" if c["same_result"] else "**no**"]
        for c in d["cases"]
    ]  # fmt: skip
    head = ["recipe", "changed from the default", "killed after blocks", "resumed at block", "same result"]
    return (
        "\n\nOther recipes, each run uninterrupted and then SIGKILLed at a random block and resumed (a fresh "
        "process each; the same result means the same shards by sha256 and the same kept heads and neurons):\n\n"
        + table(head, rows)
    )


def _shapes(d: dict) -> str:
    rate, nvme = d["write_rate_gbs"], d["nvme_gbs"]
    rows = [
        [
            r["model"], r["dtype"], f"{r['samples']} × {r['tokens']}", num(r["state_bytes"] / GB),
            num(2 * r["state_bytes"] / GB), num(r["state_bytes"] / (rate * GB)), num(r["state_bytes"] / (nvme * GB)),
        ]
        for r in d["shapes"]
    ]  # fmt: skip
    header = ["model", "dtype", "samples × tokens", "GB per save", "GB, error feedback"]
    return table(header + [f"s at {num(rate, 2)} GB/s (measured)", f"s at {num(nvme)} GB/s (assumed NVMe)"], rows)


def render(d: dict) -> str:
    """The page's generated block from the results ``d`` (``resume.json``'s content)."""
    w, rc = d["uninterrupted"], d["recipe"]
    same = "yes" if d["same_result"] else "**no**"
    per_save = w["checkpoint_seconds"] / w["checkpoint_saves"]
    cal = rc["calibration"]
    kept = d["resumed"].get("scores_kept_from")
    scores = "; the scores are read from the checkpoint, not computed" if kept else ", and so are the scores"
    return f"""{d["date"]}, {d["machine"]}, torch {d["torch"]}. {d["model"]} ({d["blocks"]} blocks), streamed
(`execution: stream`), the default recipe at ratio {rc["ratio"]} ({cal["samples"]} × {cal["tokens"]}
calibration tokens, {cal["holdout"]} windows held aside), {d["dtype"]} on the CPU; a checkpoint at most
every {num(d["interval_s"])} s (`FolderCheckpoints(every_seconds={d["interval_s"]:g})`). Every run is a
fresh process; wall seconds from its start to its exit.

{_runs(d)}

Killed and resumed: {total_against_target(d)}; the resumed run spent {num(d["resumed"]["before_loop_s"])} s
starting again before its checkpoint loaded (the process, the model's skeleton and the calibration windows
are computed again{scores}).
The resumed run's result is the uninterrupted one's (the same shards, by sha256, and the
same kept heads and neurons): {same}.{_cases(d)}

Per save: {num(w["checkpoint_state_bytes"] / MB)} MB written (the activations entering the next block and
the loop's state; the finished blocks' shards are linked, not copied: {num(w["checkpoint_bytes"] / MB)} MB in
all at the last save), {num(per_save, 3)} s a save and {num(w["checkpoint_seconds"] / d["blocks"], 3)} s a
block over the run: {num(d["write_rate_gbs"], 2)} GB/s (bytes written over save seconds, the sha256 pass
included).

### Larger models, computed from their shapes

What one save writes: the hidden states entering the next block of every calibration window, fit and
held aside ((samples + {cal["holdout"]}) × tokens × hidden × bytes a value; the loop's other state is
kilobytes). Error feedback (`reconstruction.target: dense`) saves the dense model's too: twice as much.
A block's shard is written once, not per save. Times at the rate measured above and at an assumed NVMe
rate of {num(d["nvme_gbs"])} GB/s (not measured); the project's default window is
{d["default_tokens"]} tokens, where every size is {2048 / d["default_tokens"]:g} times smaller than at 2048.

{_shapes(d)}
"""


@renderer("resume")
def resume_block() -> str:
    return render(data("resume.json"))
