"""What each file of an export-only job (``jobs.export_jobs``) costs in quality, and its size.

Where the job whose checkpoint is exported evaluated perplexity, every GGUF file the export writes is
scored by llama.cpp on the windows of that evaluation (its last perplexity evaluation: the one its
``perplexity`` metric comes from), at most ``core.serving.quality.EVAL_TOKENS`` tokens of them (the log
says when that is a subset). The export job records, per form, a row of metrics
(``export.<form>.bytes``, ``.perplexity``, ``.fallbacks``: the tensors that fell back from the form's
K/i type), the windows scored, and the reference the files are compared with: the checkpoint's weight
bytes and its own perplexity on the same windows (the source's number where the windows are all of
them, else measured here in torch on the subset). The Model page draws them (``app.web.export_chart``);
:func:`form_rows` reads them back. Scoring is the export's extra: a failure is a WARNING line and a
row without a perplexity, never a failed export.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from jobs.access import public_message
from jobs.baseline import last_perplexity
from jobs.db import Job, Metric
from jobs.fencing import job_log

PREFIX = "export."  # export.<form>.<field>
FIELDS = ("bytes", "perplexity", "fallbacks")
EVAL_WINDOWS, EVAL_TOTAL, EVAL_SEQ_LEN = "export_eval_windows", "export_eval_windows_total", "export_eval_seq_len"
REFERENCE_PERPLEXITY, REFERENCE_BYTES = "export_reference_perplexity", "export_reference_bytes"


def metric(form: str, name: str) -> str:
    """The metric of ``form``'s row: ``export.gguf-q4_k_m.perplexity``."""
    return f"{PREFIX}{form}.{name}"


def form_rows(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """An export job's rows from its metrics: {form: {"bytes", "perplexity", "fallbacks"}} (those it has)."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith(PREFIX):
            form, _, name = key[len(PREFIX) :].rpartition(".")
            if form and name in FIELDS:
                rows.setdefault(form, {})[name] = value
    return rows


@dataclass
class Source:
    """What an export job reads of the job whose checkpoint it exports, its files resolved to this host's."""

    id: int
    calibration: str | None = None  # the calibration text's file here, where the recipe names a file
    evaluation: dict[str, Any] | None = None  # its last perplexity evaluation (dataset: the file here)
    text: str = ""  # that evaluation's text as users name it
    perplexity: float | None = None  # what that evaluation recorded (None: it failed, or none ran)


def read_source(session, source_id: int, settings) -> Source:
    """:class:`Source` of job ``source_id`` (``jobs.names`` and ``jobs.references`` resolve its texts)."""
    from jobs.exporting import calibration_file
    from jobs.names import Names
    from jobs.references import with_local_uploads

    job = session.get(Job, source_id)
    names = Names(settings)
    out = Source(source_id)
    try:
        recipe = with_local_uploads(names.recipe(dict(job.recipe), names.path), settings.store())
        out.calibration = calibration_file((recipe.get("calibration") or {}).get("dataset"))
    except (ValueError, OSError):  # an upload no longer in the store: the matrix says so when wanted
        out.calibration = None
    stored = list(job.evaluations or [])
    last = last_perplexity(stored)
    if last is None:
        return out
    out.text = str(last.get("dataset"))
    out.evaluation = names.evaluations([last], names.path)[0]
    if stored.index(last) not in (job.failed_evaluations or []):
        query = select(Metric.value).where(Metric.job_id == source_id, Metric.name == "perplexity")
        out.perplexity = session.scalar(query.order_by(Metric.id.desc()))
    return out


@dataclass
class Quality:
    """On the worker: the windows and the reference once (:meth:`prepare`), then a row per file
    (:meth:`score`); :attr:`metrics` is what the job records."""

    sf: Any
    job_id: int
    token: int
    source: Source
    checkpoint: Path
    threads: int = 2
    windows: Any = None  # core.serving.quality.Windows, once prepared (None: the files are not scored)
    metrics: dict[str, float] = field(default_factory=dict)

    def log(self, line: str, level: str = "INFO") -> None:
        job_log(self.sf, self.job_id, self.token, line, level)

    def prepare(self) -> None:
        """The checkpoint's weight bytes; the evaluation's windows and the reference perplexity on them,
        each said in the log (or why the files will not be scored)."""
        from core.serving.quality import checkpoint_perplexity, held_out_windows

        weights = sum(f.stat().st_size for f in self.checkpoint.glob("*.safetensors"))
        self.metrics[REFERENCE_BYTES] = weights
        ev, source = self.source.evaluation, self.source.id
        if ev is None:
            self.log(f"the files' held-out perplexity is not measured: job {source} ran no perplexity evaluation")
            return
        try:
            windows = held_out_windows(
                self.checkpoint, ev["dataset"], int(ev.get("seq_len", 512)), ev.get("max_windows")
            )
        except Exception as exc:  # a text gone from this host, a hub outage: the files stand
            why = public_message(exc)
            self.log(
                f"the files' held-out perplexity is not measured: job {source}'s evaluation text: {why}", "WARNING"
            )
            return
        self.windows = windows
        self.metrics.update({EVAL_WINDOWS: len(windows.ids), EVAL_TOTAL: windows.total, EVAL_SEQ_LEN: windows.seq_len})
        self.log(f"held-out perplexity of each GGUF file in llama.cpp on {windows.describe(self.source.text)}")
        reference = self.source.perplexity
        if windows.subset:
            try:
                reference = checkpoint_perplexity(self.checkpoint, ev["dataset"], windows)
            except Exception as exc:
                reference = None
                self.log(f"job {source}'s checkpoint on those windows: not measured: {public_message(exc)}", "WARNING")
            else:
                self.log(f"job {source}'s checkpoint on those windows: perplexity {reference:.4g} (torch)")
        if reference is not None:
            self.metrics[REFERENCE_PERPLEXITY] = reference

    def score(self, written) -> None:
        """The row of the form ``written`` (``core.serving.Written``): its bytes, its fallen-back tensors
        and, for a GGUF file where the windows are known, its perplexity in llama.cpp."""
        from core.serving.quality import gguf_perplexity
        from core.serving.quantize import BLOCK_256

        form = written.form
        self.metrics[metric(form, "bytes")] = written.size
        if form == "vllm":
            return
        if form.removeprefix("gguf-") in BLOCK_256:  # a K/i type (f16 and q8_0 have nothing to fall back from)
            self.metrics[metric(form, "fallbacks")] = written.fallen_back
        if self.windows is None:
            return
        started = time.monotonic()
        try:
            got = gguf_perplexity(written.path, self.windows, self.threads)
        except Exception as exc:  # llama.cpp failed on the file: the file stands
            self.log(f"export {form}: held-out perplexity not measured: {public_message(exc)}", "WARNING")
            return
        self.metrics[metric(form, "perplexity")] = got["perplexity"]
        seconds = time.monotonic() - started
        self.log(f"export {form}: held-out perplexity {got['perplexity']:.4g} in llama.cpp ({seconds:.1f} s)")
