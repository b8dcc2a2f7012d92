"""A job's downloads, serving files, stage timings and attempts as the web app shows them (Markdown) and the API
returns them (plain values) — no Gradio; used by ``forms`` and ``api``."""

from __future__ import annotations

import re
from typing import Any

from app.web.downloads import file_url, tar_url
from jobs.access import OPEN, Actor
from jobs.checkpoints import attempts
from jobs.service import JobService
from jobs.timings import rows as timing_rows

SERVING_SUFFIXES = (".gguf",)  # the files a recipe's export writes into the checkpoint
VLLM_PREFIX = "vllm/"  # ... and the vLLM form's folder
IMATRIX = "imatrix.gguf"  # ... and the importance matrix its quantized files were made with (core.serving.card)
_EXPORT_FAILED = re.compile(r"export \S+ failed")  # the worker's warning for a form it could not write


def size_text(n: int | None) -> str:
    """``1.2 GB``-style sizes (powers of 1000, as disks and download bars count)."""
    if n is None:
        return "–"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable


def deletion_text(files: list[dict[str, Any]]) -> str:
    """What deleting a job removes, from ``JobService.deletion``: ``its checkpoint (14 files, 12.3 MB)
    and its exports: model-Q8_0.gguf (3.1 MB), vllm/ (5 files, 4.0 MB)``."""
    shards = [f for f in files if f["kind"] == "file"]
    exports = [f for f in shards if f["name"].endswith(SERVING_SUFFIXES)]
    vllm = [f for f in shards if f["name"].startswith(VLLM_PREFIX)]
    if shards:
        total = sum(f["size"] for f in shards)
        what = f"its checkpoint ({len(shards)} file{'s' if len(shards) != 1 else ''}, {size_text(total)})"
    elif any(f["kind"] == "archive" for f in files):
        archive = next(f for f in files if f["kind"] == "archive")
        what = f"its checkpoint archive {archive['name']} ({size_text(archive['size'])})"
    else:
        return "its place in the lists (it wrote no checkpoint)"
    named = [f"{f['name']} ({size_text(f['size'])})" for f in exports]
    if vllm:
        named.append(f"vllm/ ({len(vllm)} files, {size_text(sum(f['size'] for f in vllm))})")
    return what + (f" and its exports: {', '.join(named)}" if named else ", which has no exports")


def download_listing(service: JobService, job_id: int, actor: Actor = OPEN) -> dict[str, Any]:
    """The job's files (name, size, sha256, kind, url) and the address of the whole checkpoint as one
    file (``checkpoint_tar``: the streamed tar, or an older job's .tar.gz; None before the job has
    finished). URLs are relative to the app's address. ``KeyError`` for an unknown job,
    ``jobs.access.Forbidden`` when downloads are for owners and admins and ``actor`` is neither."""
    files = [{**f, "url": file_url(job_id, f["name"])} for f in service.downloads(job_id, actor)]
    whole, size = None, None
    if any(f["kind"] == "file" for f in files):
        whole = tar_url(job_id)
        try:  # the tar's exact length (headers and padding included), as the download will be
            size = len(service.checkpoint_tar(job_id, actor))
        except KeyError:  # a file gone from the server: the routes say so when asked
            size = None
    elif files:  # a job from before per-file artifacts: its archive
        whole, size = files[0]["url"], files[0]["size"]
    return {"job": job_id, "checkpoint_tar": whole, "checkpoint_tar_size": size, "files": files}


def downloads_markdown(listing: dict[str, Any]) -> str:
    """The model page's download section (of :func:`download_listing`): the whole checkpoint as one
    file, then one link per file with its size and sha256 (empty when there is nothing to download yet)."""
    job_id = listing["job"]
    files = listing["files"]
    if not files:
        return ""
    if any(f["kind"] == "file" for f in files):
        whole = (
            f"**[⬇ Whole checkpoint as one file — liar-job-{job_id}.tar, {size_text(listing['checkpoint_tar_size'])}]"
            f"({listing['checkpoint_tar']})** (an uncompressed tar, made while it downloads; "
            "or take the files one by one and check them with `sha256sum -c SHA256SUMS`)"
        )
    else:
        whole = f"**[⬇ Whole checkpoint as one file — {files[0]['name']}]({listing['checkpoint_tar']})**"
    table = "\n".join(f"| [{f['name']}]({f['url']}) | {size_text(f['size'])} | `{f['sha256'] or '–'}` |" for f in files)
    return f"### Download\n\n{whole}\n\n| file | size | sha256 |\n|---|---:|---|\n{table}"


def _runs(name: str) -> str:
    """What a serving file is for: the command that runs it, or, for the importance matrix, that quantizes."""
    return f"the importance matrix · `llama-quantize --imatrix {name}`" if name == IMATRIX else f"`llama-cli -m {name}`"


def serving_markdown(listing: dict[str, Any], log: list[dict[str, Any]] | None = None) -> str:
    """The model page's serving files (what a recipe's ``export`` wrote into the checkpoint: GGUF for
    llama.cpp and ollama, the vLLM folder), one link each with its size and the command that runs it, then each form
    that could not be written with the reason from the job's log; empty when there is neither."""
    files = [f for f in listing["files"] if f["kind"] == "file" and f["name"].endswith(SERVING_SUFFIXES)]
    failed = [x["message"] for x in log or [] if x["level"] == "WARNING" and _EXPORT_FAILED.match(x["message"])]
    if not files and not failed and not any(f["name"].startswith(VLLM_PREFIX) for f in listing["files"]):
        return ""
    lines = [f"- [{f['name']}]({f['url']}) — {size_text(f['size'])} · {_runs(f['name'])}" for f in files]
    vllm = [f for f in listing["files"] if f["kind"] == "file" and f["name"].startswith(VLLM_PREFIX)]
    if vllm:
        size = size_text(sum(f["size"] for f in vllm))
        lines.append(f"- `vllm/` — {len(vllm)} files, {size}, in the whole checkpoint's download · "
                     "`vllm serve vllm --trust-remote-code`")  # fmt: skip
    lines += [f"- ⚠ {message}" for message in failed]
    return "### Serving files\n\n" + "\n".join(lines)


def timings_markdown(timings: dict[str, Any] | None, steps: bool = True) -> str:
    """Where the time went: one row per stage (per layer / evaluation too with ``steps``), the time
    between stages and the total, with each stage's share."""
    table = timing_rows(timings, steps=steps)
    if not table:
        return ""
    total = (timings or {}).get("total") or 0.0
    lines = []
    for label, seconds in table:
        step = label.startswith("  ")
        share = "" if step or label == "total" or not total else f"{100 * seconds / total:.0f}%"
        name = f"&nbsp;&nbsp;&nbsp;{label.strip()}" if step else (f"**{label}**" if label == "total" else label)
        lines.append(f"| {name} | {seconds:.1f} | {share} |")
    return "| stage | seconds | share |\n|---|---:|---:|\n" + "\n".join(lines)


def attempts_markdown(log: list[dict[str, Any]], metrics: dict[str, Any] | None) -> str:
    """The job's attempts (``jobs.checkpoints.attempts``: worker, the block each started at, its last
    checkpoint, minutes), then what one checkpoint save cost the run that finished (its metrics)."""
    rows = attempts(log or [])
    if not rows:
        return ""
    lines = []
    for a in rows:
        of = f" of {a['blocks']}" if a["blocks"] else ""
        saved = f"after block {a['saved_block']}{of}" if a["saved_block"] else "–"
        lines.append(f"| {a['attempt']} | {a['worker']} | {a['from_block']}{of} | {saved} | {a['minutes']:.1f} |")
    text = "| attempt | worker | from block | last checkpoint | minutes |\n|---:|---|---|---|---:|\n" + "\n".join(lines)
    m = metrics or {}
    saves, seconds = m.get("checkpoint_saves"), m.get("checkpoint_seconds") or 0.0
    if m.get("checkpoint_bytes") and saves:
        state = m.get("checkpoint_state_bytes")
        rewritten = f" ({size_text(state)} of it activations and loop state, rewritten by every save)" if state else ""
        text += (
            f"\n\nCheckpoints: {size_text(m['checkpoint_bytes'])} per save{rewritten}; "
            f"{seconds / saves:.2f} s per save ({saves:.0f} saves, {seconds:.1f} s in all)."
        )
    return text
