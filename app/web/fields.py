"""Which box of the New-run form a message is about, so the message is shown under that box.

A form's own checks (:mod:`app.web.forms`) know their box and raise :class:`FieldError`; the job
service's checks name the recipe's keys (``calibration.max_seq_length``, ``lm-eval task``, …), which
:func:`field_for` maps to the box that sets them. A message that names no box (a model's config that
cannot be pruned at that ratio, say) belongs to the form as a whole and stays in the status line.
"""

from __future__ import annotations

import re

from jobs.submission import SubmitError


class FieldError(SubmitError):
    """A submission error about one box of the form (``field``: its name in ``forms.RECIPE_FIELDS``,
    or ``methods``, ``evaluate``, ``tasks``, ``task_dir``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# What a message names → the box. The earliest mention in the message wins ("calibration.dataset
# 'x' … the model's …" is about the calibration set).
_NAMES: tuple[tuple[str, str], ...] = (
    (r"calibration\.num_calibration_samples|\bsamples\b", "samples"),
    (r"calibration\.max_seq_length|\bsequence length\b|\bseq_len\b", "seq_len"),
    (r"calibration\.seed|\bseed\b", "seed"),
    (r"calibration\.text_field|\btext field\b|has no field\b", "text_field"),  # (a record missing it)
    (r"calibration\.label_field|\blabel field\b", "label_field"),
    (r"calibration\.dataset|\bcalibration set\b|\bcalibration file\b|\buploaded file\b", "calibration"),
    (r"reconstruction\.damp|\bdamping\b", "damp"),
    (r"reconstruction method", "methods"),
    (r"round_to\.neurons|FFN width multiple", "round_neurons"),
    (r"round_to\.kv_groups|key/value groups", "kv_groups"),
    (r"\bcriterion\b", "criterion"),
    (r"\ballocation\b", "allocation"),
    (r"\bexport\b|serving form", "export"),
    (r"\btask_dir\b|\btask folder\b", "task_dir"),
    (r"lm-eval task|\btasks?\b '", "tasks"),
    (r"evaluation dataset|\bPerplexity on\b", "evaluate"),
    (r"\bratios?\b|\bspeed-up\b|\btarget\b", "ratio"),
    (r"\bmodules\b", "modules"),
    (r"\bmodel\b", "model"),
)
_PATTERNS = [(re.compile(p, re.IGNORECASE), field) for p, field in _NAMES]


def field_for(error: Exception | str) -> str | None:
    """The box ``error`` is about, or None for the form as a whole."""
    if isinstance(error, FieldError):
        return error.field
    text = str(error)
    evaluation = text.startswith("invalid evaluation: ")
    text = re.sub(r"^invalid (recipe|evaluation): ", "", text)
    if evaluation and text.startswith("dataset:"):  # the perplexity text (an lm-eval task names "task")
        return "evaluate"
    hits = [(m.start(), field) for pattern, field in _PATTERNS if (m := pattern.search(text))]
    return min(hits)[1] if hits else None
