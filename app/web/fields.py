"""Which box of the New-run form a message is about, so the message is shown under that box.

A form's own checks (:mod:`app.web.forms`) know their box and raise :class:`FieldError`; the job
service's checks name the recipe's keys (``calibration.max_seq_length``, ``lm-eval task``, …), which
:func:`field_for` maps to the box that sets them. A message that names no box (a model's config that
cannot be pruned at that ratio, say) belongs to the form as a whole and stays in the status line.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.submission import SubmitError

K_QUANT = "k-quant rows (256)"  # the FFN width multiple's choice for round_to.k_quant


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


def round_to_field(round_neurons: Any, kv_groups: Any, kv_choices: list[str]) -> dict:
    """The recipe's ``round_to`` from the FFN width multiple (``auto``, a whole number, or
    :data:`K_QUANT`) and the key/value groups boxes: ``{}`` for the defaults (the first of
    ``kv_choices``), ``{"round_to": {...}}`` otherwise; :class:`FieldError` for a bad box."""
    if round_neurons in (None, "", "auto", K_QUANT):
        multiple: int | str = "auto"
    else:
        try:
            multiple = int(round_neurons)
        except (TypeError, ValueError):
            multiple = 0
        if multiple < 1:
            message = f"FFN width multiple must be auto or a whole number ≥ 1, got {round_neurons!r}"
            raise FieldError("round_neurons", message)
    groups = kv_choices[0] if kv_groups in (None, "") else kv_groups
    if groups not in kv_choices:
        raise FieldError("kv_groups", f"key/value groups must be one of {', '.join(kv_choices)}, got {kv_groups!r}")
    round_to: dict[str, Any] = {"neurons": multiple} if multiple != "auto" else {}
    round_to.update({"k_quant": True} if round_neurons == K_QUANT else {})
    round_to.update({"kv_groups": groups} if groups != kv_choices[0] else {})
    return {"round_to": round_to} if round_to else {}
