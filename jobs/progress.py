"""One progress figure per job that only moves forward: each stage owns a share of the bar, in the
order a job runs them, and a stage reports how far into its share it is.

The engine reports progress per stage (``progress(stage, done, total)``: ``reconstruct`` 3 of 30
layers); shown as it is, a job's bar went 50% (scoring) → 0% (reconstruct) → 100% → 0% (evaluate).
:class:`Overall` maps each call onto the whole job and never goes back: a stage that comes again
later (the in-memory path's ``speed`` after the prune, a speed target's second ``reconstruct``), or
one this table does not know, holds the figure where it is. The bar reaches 1.0 only when the job
succeeds (``jobs.fencing.record_success``). The shares follow where a job's time goes
(``docs/results/time.md``: reconstruction most of it)."""

from __future__ import annotations

# (stage, its share of the bar), in the order a job runs them; the shares add up to 1
STAGE_SHARES = (
    ("starting", 0.02),  # the worker imports the engine, reads the job
    ("load", 0.08),
    ("speed", 0.03),  # the dense model timed (a job pruned in memory)
    ("latency", 0.04),  # a speed target's latency table
    ("calibration", 0.08),
    ("depth", 0.05),  # depth pruning: the span chosen and replaced (after the calibration windows exist)
    ("scoring", 0.08),
    ("reconstruct", 0.42),
    ("write", 0.05),
    ("evaluate", 0.10),
    ("export", 0.03),
    ("upload", 0.02),  # the checkpoint sent to a store other than the data folder (jobs.store)
)
LAST_BEFORE_SUCCESS = 0.99  # the bar's end is the job's success, not its last stage's last step


def _starts() -> dict[str, tuple[float, float]]:
    starts, at = {}, 0.0
    for stage, share in STAGE_SHARES:
        starts[stage] = (at, share)
        at += share
    return starts


_STARTS = _starts()


class Overall:
    """The job's progress so far, from the engine's per-stage calls."""

    def __init__(self) -> None:
        self.value = 0.0

    def update(self, stage: str, done: int, total: int) -> float:
        """The figure after ``progress(stage, done, total)``: never below the last one."""
        if stage in _STARTS:
            start, share = _STARTS[stage]
            here = start + share * min(max(done / max(total, 1), 0.0), 1.0)
            self.value = max(self.value, min(here, LAST_BEFORE_SUCCESS))
        return self.value
