"""What the Jobs tab and the Model page show, as plain functions of a :class:`JobService` (no Gradio).

A job is picked by selecting a row of a table, by a chart point's link (``?job=N``) or, on the Model
page, by its id; every function takes what was picked (:func:`job_id_of`), or None.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from app.web import charts, figures, listings
from app.web.forms import bar, elapsed, shown
from jobs.access import OPEN, Actor, Forbidden, may_change, public_error
from jobs.service import JobService, NotNow, QueueError, SubmitError

# the Status filter's choices, (label, value): "all" is no filter
STATUSES = [("all", ""), *((s, s) for s in ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"))]
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")
TABLE_COLUMNS = [
    "id",
    "status",
    "stage",
    "layer",
    "progress",
    "elapsed",
    "user",
    "model",
    "ratio",
    "method",
    "criterion",
]
# their widths (% of the table): a speed target's "speed-up 1.5× (decode_b1)" wraps in its cell instead of
# widening the ratio column until the last header is cut off
TABLE_WIDTHS = ["4%", "10%", "13%", "5%", "12%", "8%", "8%", "13%", "10%", "7%", "10%"]
REPORT_HEADERS = ["layer", "unit", "kept", "of", "error before", "error after"]
NOTHING_PICKED = "select a job in the table first"
CANCELLING = "cancel requested"
# the metrics a reader looks for first, in this order (the others follow, sorted)
KEY_METRICS = [
    "perplexity",
    "perplexity_dense",
    "target_ratio",
    "achieved_ratio",
    "params_before",
    "params_after",
    "block_speedup",
    "prefill_speedup",
    "kept_heads_mean",
    "kept_neurons_mean",
    "kv_index_layers",
    "round_to_neurons",
    "prune_seconds",
    "peak_memory_mb",
]


def job_id_of(value: Any) -> int | None:
    """A job id from a table cell, a row, the ``job`` query parameter or a number box; None if none."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and number > 0 else None


def status_text(job: dict[str, Any]) -> str:
    """The status, with a cancel that is pending (a running job stops at its next layer or stage)."""
    pending = job.get("cancel_requested") and job["status"] in ("RUNNING", "QUEUED")
    return f"{job['status']} · {CANCELLING}" if pending else job["status"]


def _why_ended(info: dict[str, Any]) -> str:
    """A cancelled job's reason is no error: ``**Cancelled:** cancelled by alice``."""
    label = "Cancelled" if info["status"] == "CANCELLED" else "Error"
    return f"**{label}:** {info['error']}"


def stage_text(job: dict[str, Any], ahead: int = 0) -> str:
    """The stage, saying what a job waits for: its place in the queue, or the worker's start."""
    if job["status"] == "QUEUED":
        return f"queued ({ahead} ahead)" if ahead else "queued"
    if job["stage"] == "starting":
        return "starting (the worker loads the engine)"
    return job["stage"] or "–"


def job_rows(service: JobService, status: str | None = None) -> list[list[Any]]:
    """The jobs table: one row of :data:`TABLE_COLUMNS` per recent job, newest first."""
    rows = []
    jobs = service.list(status=status or None, limit=200)
    queued = sorted(j["id"] for j in jobs if j["status"] == "QUEUED")
    for j in jobs:
        layer = f"{j['layer']}/{j['n_layers']}" if j["n_layers"] else "–"
        ahead = queued.index(j["id"]) if j["id"] in queued else 0
        rows.append(
            [
                j["id"],
                status_text(j),
                stage_text(j, ahead),
                layer,
                bar(j["progress"] or 0.0),
                elapsed(j["elapsed_s"]),
                j["submitted_by"] or "–",
                Path(str(j["model"])).name,
                j["ratio"] if j["ratio"] is not None else asked(j),
                j["method"],
                j["criterion"],
            ]
        )
    return rows


def job_heading(info: dict[str, Any]) -> str:
    """One line on the picked job: who, what, where it is, and a pending cancel."""
    where = stage_text(info)
    if info["stage"] == "reconstruct" and info["n_layers"]:
        where += f" (layer {info['layer']}/{info['n_layers']})"
    line = (
        f"**Job {info['id']}** · {info['status']} · {where} · {bar(info['progress'] or 0.0)} · "
        f"by {info['submitted_by'] or '–'} · `{Path(str(info['model'])).name}` {asked(info)} "
        f"{info['method']} · {info['criterion']}"
    )
    if info.get("source_job"):
        line += f"\n\n**Re-evaluation** of job {info['source_job']}: its evaluations on that job's checkpoint."
    if info.get("cancel_requested") and info["status"] == "RUNNING":
        line += f"\n\n**⏳ {CANCELLING}**: the job stops at its next layer or stage boundary."
    if info["error"]:
        line += f"\n\n{_why_ended(info)}"
    return line


class Buttons(NamedTuple):
    """Which of the Jobs tab's buttons the picked job makes usable (the service still decides who may)."""

    cancel: bool  # queued or running, no cancel pending
    delete: bool  # finished
    reevaluate: bool  # a pruning job that succeeded with failed evaluations (jobs.reevaluation)


NO_BUTTONS = Buttons(False, False, False)


class JobView(NamedTuple):
    """What the Jobs tab shows of the picked job, from one read of it."""

    panel: tuple[str, str, str]  # heading, log tail, stage timings per stage
    buttons: Buttons  # usable for the viewer: the job's state allows it and the job is theirs (or they are an admin)
    rerun: bool  # Re-run usable: a job is picked and it is the viewer's (or they are an admin)
    finished: bool  # SUCCEEDED, FAILED or CANCELLED: a pending cancel's message is stale


def job_view(service: JobService, job_id, lines: int = 30, actor: Actor = OPEN) -> JobView:
    """The picked job's panel and which buttons ``actor`` may use (a job of someone else's shows them
    disabled, as the service would refuse them): the Jobs tab refreshes both every few seconds."""
    job_id = job_id_of(job_id)
    if job_id is None:
        return JobView(("Select a job in the table to follow its log.", "", ""), NO_BUTTONS, False, False)
    try:
        info = service.show(job_id)
    except KeyError as exc:
        return JobView((shown(exc.args[0]), "", ""), NO_BUTTONS, False, False)
    tail = "\n".join(f"{x['at'][11:19]} {x['level']:7s} {x['message']}" for x in info["log"][-lines:])
    finished = info["status"] in FINISHED
    failed = info["status"] == "SUCCEEDED" and info["metrics"].get("evaluations_failed", 0) > 0
    mine = may_change(actor, info["submitted_by"])
    buttons = Buttons(not finished and not info.get("cancel_requested"), finished, failed and not info["source_job"])
    panel = (job_heading(info), tail, listings.timings_markdown(info["timings"], steps=False))
    return JobView(panel, Buttons(*(on and mine for on in buttons)), mine, finished)


def job_panel(service: JobService, job_id, lines: int = 30) -> tuple[str, str, str]:
    """(heading, log tail, stage timings per stage) of the picked job (:func:`job_view`)."""
    return job_view(service, job_id, lines).panel


def actions_enabled(service: JobService, job_id, actor: Actor = OPEN) -> Buttons:
    """(Cancel, Delete, Re-evaluate) usable by ``actor`` for the picked job (:func:`job_view`)."""
    return job_view(service, job_id, actor=actor).buttons


def stale_message(message: str | None, view: JobView) -> bool:
    """Whether the action message under the buttons is out of date: a pending cancel's, once the job
    has finished (the heading says how it ended)."""
    return bool(message) and CANCELLING in message and view.finished


def _refusal(exc: Exception, action: str) -> str:
    """A refused or failed action as the status line shows it: the sentence of a refusal, an unknown
    job, or (anything unexpected) a public error with its id."""
    if isinstance(exc, KeyError):
        return shown(exc.args[0])
    if isinstance(exc, (Forbidden, SubmitError, NotNow, QueueError)):
        return shown(str(exc))
    return shown(public_error(exc, action))


def cancel_job(service: JobService, job_id, actor: Actor = OPEN) -> str:
    """Cancel the picked job (its owner or an admin); says what happens (a running job finishes its
    current layer first)."""
    job_id = job_id_of(job_id)
    if job_id is None:
        return shown(NOTHING_PICKED)
    try:
        before = service.show(job_id)["status"]
        status = service.cancel(job_id, actor)
    except Exception as exc:
        return _refusal(exc, f"cancel job {job_id}")
    if before in FINISHED:
        return f"job {job_id} had already finished ({before})"
    if status == "RUNNING":
        return f"job {job_id}: {CANCELLING} — it stops at its next layer or stage boundary"
    return f"job {job_id}: cancelled"


def rerun_job(service: JobService, job_id, actor: Actor = OPEN) -> str:
    """Submit a job's recipe and evaluations again as a new job of whoever clicked (the job's owner or
    an admin; without a login, credited to the original submitter), checked as any web submission is
    (``JobService.rerun``)."""
    return _new_job_from(job_id, service.rerun, actor, "re-run", "re-submitted job {job} as job {new}")


def reevaluate_job(service: JobService, job_id, actor: Actor = OPEN) -> str:
    """Run the picked job's failed evaluations again on its checkpoint, without pruning, as a new job
    of whoever clicked (the job's owner or an admin), its data confined as a web submission's
    (``JobService.reevaluate``)."""
    done = "job {job}: its evaluations run again on its checkpoint as job {new} (nothing is pruned)"
    return _new_job_from(job_id, service.reevaluate, actor, "re-evaluate", done)


def _new_job_from(job_id, make, actor: Actor, verb: str, done: str) -> str:
    """The status line of an action that makes a new job from the picked one (``make(job_id, actor)``
    returns its id): ``done`` formatted with both ids, or the refusal."""
    job_id = job_id_of(job_id)
    if job_id is None:
        return shown(NOTHING_PICKED)
    try:
        new = make(job_id, actor)
    except Exception as exc:
        return _refusal(exc, f"{verb} job {job_id}")
    return done.format(job=job_id, new=new)


def delete_question(service: JobService, job_id, actor: Actor = OPEN) -> str:
    """What the page asks before it deletes the picked job: what goes (its checkpoint, with its size,
    and its exports) and what stays; or, when the job may not be deleted, the refusal (a ``shown``
    line: nothing is asked)."""
    job_id = job_id_of(job_id)
    if job_id is None:
        return shown(NOTHING_PICKED)
    try:
        files = service.deletion(job_id, actor)
    except Exception as exc:
        return _refusal(exc, f"delete job {job_id}")
    return (
        f"**Delete job {job_id}?** This removes {listings.deletion_text(files)}, for everyone. Its record "
        "stays, with its metrics: a link to it will say who deleted it and when."
    )


def delete_job(service: JobService, job_id, actor: Actor = OPEN) -> str:
    """Delete the picked job with its files (its owner or an admin, once it has finished), once the
    page has asked (:func:`delete_question`)."""
    job_id = job_id_of(job_id)
    if job_id is None:
        return shown(NOTHING_PICKED)
    try:
        files = service.deletion(job_id, actor)
        service.delete(job_id, actor)
    except Exception as exc:
        return _refusal(exc, f"delete job {job_id}")
    return f"deleted job {job_id}: removed {listings.deletion_text(files)}"


# --- the Model page ------------------------------------------------------------------------------


class ModelPage(NamedTuple):
    head: str  # heading, metrics (once), where the time went
    recipe: str  # YAML
    report: list[list[Any]]  # per-layer rows of REPORT_HEADERS
    layers: dict[str, Any] | None  # the per-layer error chart (Vega-Lite)
    downloads: str  # Markdown links (app.web.listings)
    load: str  # how to load the checkpoint (Markdown code)


def model_page(service: JobService, job_id, actor: Actor = OPEN) -> ModelPage:
    job_id = job_id_of(job_id)
    if job_id is None:
        return ModelPage(
            "Pick a job: select it in the Jobs tab or the dashboard, or type its id.", "", [], None, "", ""
        )
    try:
        info = service.show(job_id)
    except KeyError as exc:
        return ModelPage(f"**{exc.args[0]}**", "", [], None, "", "")
    report = [
        [r["layer"], r["module"], r["kept"], r["total"], round(r["error_before"], 4), round(r["error_after"], 4)]
        for r in info["report"] or []
    ]
    try:
        listing = listings.download_listing(service, job_id, actor)
    except Forbidden:
        listing = None
    return ModelPage(
        _page_head(info),
        yaml.safe_dump(info["recipe"], sort_keys=False),
        report,
        charts.layer_errors(info["report"]),
        _downloads(listing, info),
        load_snippet(_card(service, job_id) if listing and listing["files"] else None, job_id),
    )


def numbered_yaml(text: str) -> str:
    """The Model page's recipe viewer: every line of ``text`` with its number, as HTML (all of it, however
    long: the code editor drew only the lines near the screen, so its numbers stopped short). The numbers
    are left out of a selection, so a copied recipe is plain YAML."""
    lines = text.rstrip("\n").split("\n") if text else []
    rows = "".join(
        f'<span class="recipe-ln" aria-hidden="true">{i}</span><span class="recipe-line">{html.escape(line)}</span>'
        for i, line in enumerate(lines, 1)
    )
    return f'<pre class="recipe-view">{rows}</pre>' if rows else ""


DOWNLOADS_RESTRICTED = "Downloads on this server are for the job's owner and the administrators."


def _downloads(listing: dict[str, Any] | None, info: dict[str, Any]) -> str:
    """The serving files (if the recipe asked for any), then every file of the checkpoint; a line
    saying why not, when downloads are restricted and the viewer may not."""
    if listing is None:
        return DOWNLOADS_RESTRICTED if info["status"] == "SUCCEEDED" else ""
    serving = listings.serving_markdown(listing, info["log"])
    return "\n\n".join(x for x in (serving, listings.downloads_markdown(listing)) if x)


def _card(service: JobService, job_id: int) -> str | None:
    """The text of the job's model card (its checkpoint's README.md), or None."""
    return service.text_file(job_id, "README.md")


def asked(info: dict[str, Any]) -> str:
    """What a job was asked for: its ratio, or its speed target."""
    target = info.get("target")
    if info.get("export_only"):  # jobs.export_jobs
        return f"export {', '.join(info['export_only'])} (no pruning)"
    if info.get("ratio") is None and isinstance(target, dict):
        return f"speed-up {target.get('speedup')}× ({target.get('workload', 'decode_b1')})"
    return f"ratio {info.get('ratio')}"


def _page_head(info: dict[str, Any]) -> str:
    head = (
        f"### Job {info['id']} — {info['status']}\n\n`{info['model']}` · {asked(info)} · "
        f"{info['method']} · {info['criterion']} · by {info['submitted_by'] or '–'}"
    )
    if info["error"]:
        head += f"\n\n{_why_ended(info)}"
    table = figures.metrics_markdown(info["metrics"], KEY_METRICS)  # named for readers, speed-ups with spreads
    if table:
        head += "\n\n" + table
    timings = listings.timings_markdown(info.get("timings"))
    if timings:
        head += "\n\n#### Where the time went\n\n" + timings
    tries = listings.attempts_markdown(info.get("log"), info["metrics"])
    if tries:
        head += "\n\n#### Attempts\n\n" + tries
    return head


_CODE = re.compile(r"```python\n(.*?)```", re.S)


def load_snippet(card: str | None, job_id: int) -> str:
    """How to load the checkpoint once downloaded: unpack the whole-checkpoint tar (it unpacks to
    ``liar-job-N/``), then the model card's code (which knows whether the bundled code is needed)
    with that folder filled in; empty before there is a checkpoint. Never the server's folder."""
    found = _CODE.search(card) if card else None
    if found is None:
        return ""
    folder = f"liar-job-{int(job_id)}"
    code = found.group(1).replace('"PATH"', f'"{folder}"')
    return f"#### Load it\n\nDownload the whole checkpoint above, `tar xf {folder}.tar`, then:\n\n```python\n{code}```"
