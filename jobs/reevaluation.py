"""Run a succeeded job's evaluations again on its checkpoint, without pruning it again.

An evaluation that fails after the prune costs neither the checkpoint nor the job
(``jobs.tasks._run_evaluations``): the job SUCCEEDED, ``evaluations_failed`` counts the failures and
its ``failed_evaluations`` says which. Once the cause is fixed (a share mounted again, a task file
repaired) the numbers are wanted without the prune: on a 70B model that is hours of GPU time.

The record: a re-evaluation is a job of its own, a row whose ``source_job_id`` names the job it
evaluates and ``source_evaluations`` which of that job's evaluations it runs (their positions; its
own ``evaluations`` are copies of them, checked again). So queueing, the claim and its fenced
attempts (``jobs.fencing``), heartbeats and the reaper, progress, cancel, the log and the listings
work as for any job, and the source's record stays the run that pruned it. The worker
(``jobs.tasks``) sees the pointer and, instead of pruning, runs :func:`run`: the evaluations read the
source's checkpoint block by block (as they read a streamed prune's), with its recipe's device and
dtype; nothing is written into the checkpoint (its ``metrics.json`` and model card keep the numbers
of the run that wrote them). The dense baseline is ``jobs.baseline``'s: copied when any job has it
for the same model and text, else measured.

Its success (:func:`record`) is one fenced transaction of its attempt: its own metrics (what it
measured, kept when a later re-evaluation replaces them on the source), and on the source job the
re-run evaluations' numbers under their names (replacing what was there), ``perplexity_dense`` if
the source's baseline text was among them, its ``failed_evaluations`` and ``evaluations_failed``
updated, and a log line naming the re-evaluation. An evaluation that fails again leaves the source's
numbers as they were. A superseded attempt therefore writes on neither job.

What is re-run (:func:`positions`): by default the evaluations that failed; all of them when none
did (the data or the evaluation code changed since); or the ones named (``1,3`` as the log numbers
them, or ``all``). A job that finished before failures were recorded one by one counts all its
evaluations as failed if any did. Metrics are named by kind, not by evaluation: when two of a job's
evaluations write the same name (two perplexity texts), the one run last stands, as within one run.

Who and when (:func:`request`): the job's owner or an administrator (``jobs.access``), a SUCCEEDED
pruning job whose checkpoint is still on the server, that has evaluations and is not being
re-evaluated already; anything else is refused in one sentence, with nothing created. A source job
is not deleted while one of its re-evaluations is queued or running (``JobService.delete``); a
finished re-evaluation keeps its record after its source is deleted (no foreign key: migration 0004).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from jobs import baseline, tombstones
from jobs.access import Actor, NotNow, require_owner
from jobs.db import Job, JobLog, Metric, Status, retry_on_disconnect
from jobs.fencing import add_metrics, fenced, job_log, mark_succeeded, numeric
from jobs.references import JobInputError, job_reference, local_checkpoint, owner_and_checkpoint
from jobs.store import Store
from jobs.submission import SubmitError, Validator
from jobs.timings import StageClock
from jobs.tombstones import said

FAILED = "evaluations_failed"
_NUMBERS = re.compile(r"\s*\d+\s*(,\s*\d+\s*)*")


def evaluation_name(position: int, ev: dict[str, Any]) -> str:
    """An evaluation as log lines name it: ``evaluation 1 (perplexity on held-out.txt)``."""
    if ev.get("type") == "lm_eval":
        on = ", ".join(ev.get("tasks") or [])
    else:
        on = Path(str(ev.get("dataset"))).name
    return f"evaluation {position + 1} ({ev.get('type')} on {on})"


def _numbered(chosen: Sequence[int]) -> str:
    return ", ".join(str(i + 1) for i in chosen)


# --- the request ------------------------------------------------------------------------------------


def positions(which: str | Sequence[int] | None, count: int, failed: list[int]) -> list[int]:
    """The positions to run again, in order: ``None`` / ``""`` the failed ones (all when none failed),
    ``"all"``, or numbers as the log gives them (``"1,3"`` or ``[1, 3]``). :class:`SubmitError` for
    a selection that names no evaluation of the job."""
    if which is None or (isinstance(which, str) and not which.strip()):
        return sorted(failed) or list(range(count))
    if isinstance(which, str) and which.strip().lower() == "all":
        return list(range(count))
    if isinstance(which, str):
        if not _NUMBERS.fullmatch(which):
            raise SubmitError(f"evaluations: 'all', or numbers as the job's log gives them (1,3), not {which!r}")
        which = [int(n) for n in which.split(",")]
    wrong = [n for n in which if not 1 <= int(n) <= count]
    if wrong:
        has = f"{count} evaluation{'s' if count != 1 else ''}"
        raise SubmitError(f"the job has {has}: there is no evaluation {wrong[0]}")
    return sorted({int(n) - 1 for n in which})


def failed_before(session: Session, job: Job) -> list[int]:
    """Which of the job's evaluations failed: its ``failed_evaluations``; for a job finished before
    they were recorded, all of them if its ``evaluations_failed`` is above zero."""
    if job.failed_evaluations is not None:
        return list(job.failed_evaluations)
    count = session.scalar(select(Metric.value).where(Metric.job_id == job.id, Metric.name == FAILED))
    return list(range(len(job.evaluations or []))) if count else []


def pending(session: Session, job_id: int) -> int | None:
    """The re-evaluation of the job that is queued or running, if one is."""
    unfinished = (Status.QUEUED.value, Status.RUNNING.value)
    return session.scalar(select(Job.id).where(Job.source_job_id == job_id, Job.status.in_(unfinished)).limit(1))


def request(
    session: Session, validator: Validator, job_id: int, actor: Actor, which: str | Sequence[int] | None, confine: bool
) -> tuple[Job, str]:
    """The re-evaluation job for ``JobService.reevaluate`` (not yet added: the service queues it, in
    ``session``, which holds the source's row) and the note for its first log line; refusals
    (``KeyError``, ``Forbidden``, :class:`NotNow`, :class:`SubmitError`) in one sentence. The chosen
    evaluations are checked again, as at submission (``confine``: as a web submission's)."""
    source = tombstones.find(session, job_id, for_update=True)
    require_owner(actor, job_id, source.submitted_by, "re-evaluate")
    if source.source_job_id is not None:
        raise NotNow(f"job {job_id} is a re-evaluation of job {source.source_job_id}: re-evaluate that job instead")
    if source.status != Status.SUCCEEDED.value:
        instead = "; re-run it instead" if Status(source.status).finished else ""
        raise NotNow(
            f"job {job_id} is {source.status}: only a succeeded job's checkpoint can be evaluated again{instead}"
        )
    evaluations = list(source.evaluations or [])
    if not evaluations:
        raise NotNow(f"job {job_id} was submitted without evaluations: there is nothing to evaluate again")
    checkpoint = local_checkpoint(session, validator.settings.store(), job_id, weights=False)
    if checkpoint is None:
        raise NotNow(f"job {job_id}'s checkpoint is no longer on the server: re-run the job instead")
    busy = pending(session, job_id)
    if busy is not None:
        raise NotNow(f"job {job_id} is already being re-evaluated by job {busy}: wait for it, or cancel it")
    chosen = positions(which, len(evaluations), failed_before(session, source))
    checked = validator.evaluations(str(checkpoint), [evaluations[i] for i in chosen], confine)
    job = Job(
        recipe=source.recipe,
        evaluations=checked,
        submitted_by=actor.name or source.submitted_by,
        status=Status.QUEUED.value,
        stage="queued",
        source_job_id=job_id,
        source_evaluations=chosen,
    )
    return job, f"re-evaluation of job {job_id}: evaluation {_numbered(chosen)}; no pruning"


# --- the worker ----------------------------------------------------------------------------------


def source_of(sf: sessionmaker, job_id: int) -> int | None:
    """The job a re-evaluation evaluates; None for a pruning job."""
    with sf() as s:
        return s.scalar(select(Job.source_job_id).where(Job.id == job_id))


@dataclass
class _Where:
    """What ``core.evaluate`` and ``jobs.baseline.measure`` read of a result's recipe."""

    model: str  # the dense model (the baseline's), resolved where the job names another job's checkpoint
    device: str
    dtype: str


@dataclass
class Checkpoint:
    """A job's checkpoint in the shape of a streamed prune's result, for ``jobs.tasks._run_evaluations``
    and ``core.evaluate``: no model in memory, so every evaluation reads ``checkpoint`` block by block."""

    recipe: _Where
    checkpoint: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    model: None = None
    tokenizer: None = None  # the checkpoint's own (and the dense model's, for its baseline)
    streamed: bool = True


@dataclass
class Plan:
    """What a re-evaluation job runs, read by the worker."""

    source: int
    chosen: list[int]  # positions in the source's evaluations
    evaluations: list[dict[str, Any]]  # this job's
    recipe: dict[str, Any]  # the source's, as stored (jobs.baseline keys its dense perplexity on it)
    subject: Checkpoint
    baseline_rerun: bool  # the source's perplexity_dense belongs to one of these evaluations


def load(sf: sessionmaker, job_id: int, store: Store, names=None) -> Plan:
    """The re-evaluation's :class:`Plan`; :class:`JobInputError` (one sentence) when its source job or
    checkpoint is gone. ``names`` (``jobs.names``): the server's, to find a model it names here."""
    with sf() as s:
        job = s.get(Job, job_id)
        source = s.get(Job, job.source_job_id)
        if source is None or source.status != Status.SUCCEEDED.value:
            state = f"job {job.source_job_id} " + ("was deleted" if source is None else f"is {source.status}")
            if source is not None and source.status == Status.DELETED.value:
                state = said(source.id, source.deleted_by, source.deleted_at)
            raise JobInputError(f"{state}: there is no checkpoint to evaluate")
        path = local_checkpoint(s, store, source.id)
        if path is None:
            raise JobInputError(f"job {source.id}'s checkpoint is no longer on the server: nothing to evaluate")
        ran = source.recipe_as_run or source.recipe
        model = names.path(source.recipe["model"]) if names is not None else source.recipe["model"]
        reference = job_reference(model)
        if reference is not None:
            try:
                model = str(owner_and_checkpoint(s, reference, store)[1])
            except ValueError:
                pass  # only a dense baseline still to measure needs it: that one fails, as a warning
        where = _Where(model, ran.get("device", "auto"), ran.get("dtype", "auto"))
        own = list(job.evaluations or [])
        last = baseline.last_perplexity(own)
        return Plan(
            source=source.id,
            chosen=list(job.source_evaluations or []),
            evaluations=own,
            recipe=dict(source.recipe),
            subject=Checkpoint(where, path),
            baseline_rerun=last is not None and last == baseline.last_perplexity(source.evaluations),
        )


def run(
    sf: sessionmaker,
    job_id: int,
    token: int,
    progress: Callable,
    clock: StageClock,
    run_evaluations,
    store: Store,
    names=None,
) -> bool:
    """Attempt ``token`` at re-evaluation ``job_id`` (``jobs.tasks``, in place of the prune):
    ``run_evaluations`` (``jobs.tasks._run_evaluations``: stage ``evaluate``, a WARNING line per
    failure) on the source's checkpoint, then :func:`record`; False if a cancel arrived meanwhile."""
    plan = retry_on_disconnect(lambda: load(sf, job_id, store, names))
    said = f"evaluating job {plan.source}'s checkpoint again (no pruning): evaluation {_numbered(plan.chosen)}"
    job_log(sf, job_id, token, said)
    failed = run_evaluations(sf, job_id, token, plan.recipe, plan.subject, plan.evaluations, progress)
    return retry_on_disconnect(lambda: record(sf, job_id, token, plan, plan.subject.metrics, failed, clock))


def record(
    sf: sessionmaker, job_id: int, token: int, plan: Plan, metrics: dict[str, Any], failed: list[int], clock: StageClock
) -> bool:
    """Attempt ``token``'s success, in one fenced transaction (see the module docstring): this job's
    metrics and SUCCEEDED, and the source's metrics, ``failed_evaluations`` and a log line; False,
    writing nothing but the heartbeat, if a cancel arrived meanwhile."""
    with fenced(sf, job_id, token) as s:
        if s.scalar(select(Job.cancel_requested).where(Job.id == job_id)):
            return False
        source = s.get(Job, plan.source, with_for_update=True)
        if source is None or source.status != Status.SUCCEEDED.value:
            raise JobInputError(f"job {plan.source} was deleted while it was evaluated again: nothing recorded")
        add_metrics(s, job_id, metrics)
        before = set(failed_before(s, source))
        again = {plan.chosen[i] for i in failed}
        still = sorted((before - set(plan.chosen)) | (again & before))  # a number it had stands
        numbers = {k: v for k, v in numeric(metrics).items() if k not in (FAILED, baseline.DENSE)}
        if baseline.DENSE in metrics and plan.baseline_rerun:
            numbers[baseline.DENSE] = float(metrics[baseline.DENSE])
        numbers[FAILED] = float(len(still))
        s.execute(delete(Metric).where(Metric.job_id == source.id, Metric.name.in_(list(numbers))))
        add_metrics(s, source.id, numbers)
        source.failed_evaluations = still
        s.add(_source_line(job_id, plan, again, still, s.get(Job, job_id).submitted_by))
        mark_succeeded(s, job_id, clock, recipe_as_run=source.recipe_as_run)
    return True


def _source_line(job_id: int, plan: Plan, again: set[int], still: list[int], by: str | None) -> JobLog:
    """The line in the source job's log that says what the re-evaluation changed."""
    named = [evaluation_name(p, ev) for p, ev in zip(plan.chosen, plan.evaluations, strict=True)]
    done = [n for p, n in zip(plan.chosen, named, strict=True) if p not in again]
    bad = [n for p, n in zip(plan.chosen, named, strict=True) if p in again]
    parts = [f"{', '.join(done)} recorded"] if done else []
    parts += [f"{', '.join(bad)} failed again (job {job_id}'s log says why)"] if bad else []
    message = f"re-evaluated by job {job_id} ({by or 'anonymous'}): {'; '.join(parts)}; {FAILED} {len(still)}"
    return JobLog(job_id=plan.source, level="WARNING" if bad else "INFO", message=message)
