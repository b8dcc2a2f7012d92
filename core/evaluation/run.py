"""One entry point for measuring a model: :func:`evaluate` (``core.evaluate``).

    result = core.prune(recipe, output_dir="pruned/")            # streamed: the result holds no model
    core.evaluate(result, {"type": "perplexity", "text": "wikitext2", "seq_len": 512})
    core.evaluate("pruned/", [{"type": "perplexity", "text": "eval.txt"}, {"type": "lm_eval", "tasks": ["piqa"]}])

It takes what there is to measure — a prune's result (its model in memory, or the checkpoint a
streamed run wrote) or a checkpoint directory / hub id — and the evaluations, as the job service
stores them (``core.spec.evaluation``: perplexity on a named set or a file, with its windows; lm-eval
tasks with their options), and decides by itself how to run them: a result in memory is measured
where it is; a streamed result, block by block from its checkpoint (``core.evaluation.streamed``); a
checkpoint is loaded whole when its weights fit comfortably in the memory of the device it runs on,
else read block by block. Callers (the CLI, the job worker) never choose between the two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from core.spec.errors import validation_message
from core.spec.evaluation import job_evaluation

EXECUTIONS = ("auto", "memory", "stream")
# a checkpoint is loaded whole when its files take at most this share of the memory free on its device
FIT_SHARE = 1 / 2


def evaluate(
    subject: Any,
    spec: dict | BaseModel | list,
    *,
    tokenizer: Any = None,
    device: str = "auto",
    dtype: str = "auto",
    execution: str = "auto",
    show_progress: bool = False,
) -> dict[str, Any] | list[dict[str, Any]]:
    """Measure ``subject`` as ``spec`` says; one result dict per evaluation (a list for a list).

    ``subject``: a :class:`core.PruneResult` (in memory, or streamed: its checkpoint is read block by
    block with the recipe's device and dtype), or a checkpoint directory / hub id (``device``,
    ``dtype`` as a recipe names them; ``tokenizer`` None: the checkpoint's own). ``spec``: one
    evaluation or a list, each ``{"type": "perplexity", "text" (or "dataset"), "seq_len",
    "max_windows", "batch_size"}`` or ``{"type": "lm_eval", "tasks", "task_dir", "limit",
    "num_fewshot", "batch_size"}``. ``execution`` (for a checkpoint): ``auto`` (default: whole when it
    fits, :data:`FIT_SHARE`), ``memory`` or ``stream``.

    Results: perplexity's ``{"perplexity", "nll", "tokens", "windows", "seq_len"}``, lm-eval's
    ``{"summary", "raw", "tasks", "seconds", "parameters"}`` (``passes``: reads of a streamed model),
    and ``parameters`` wherever the model was in memory. A spec that does not validate, or a model
    that cannot run it, raises ``ValueError`` in one sentence."""
    many = isinstance(spec, list)
    evaluations = [_parse(s) for s in (spec if many else [spec])]
    if not evaluations:
        raise ValueError("nothing to evaluate: give at least one evaluation")
    if execution not in EXECUTIONS:
        raise ValueError(f"execution must be one of {', '.join(EXECUTIONS)}, not {execution!r}")
    selections = {i: _tasks(ev) for i, ev in enumerate(evaluations) if ev["type"] == "lm_eval"}  # names first
    if _is_result(subject):
        model, directory, run = _of_result(subject, show_progress)
    elif not isinstance(subject, (str, Path)):
        raise ValueError(
            f"evaluate takes a prune's result or a checkpoint directory / hub id, not {type(subject).__name__}"
        )
    else:
        model, tokenizer, directory = _open(subject, tokenizer, device, dtype, execution, evaluations)
        run = _Run(tokenizer, device, dtype, show_progress)
    out = []
    for i, ev in enumerate(evaluations):
        if model is not None:
            out.append(run.in_memory(model, ev, selections.get(i)))
        else:
            out.append(run.streamed(directory, ev, selections.get(i)))
    return out if many else out[0]


def _of_result(result, show_progress: bool):
    """``(model, None, run)`` for a result in memory; ``(None, checkpoint, run)`` for a streamed one,
    read with its recipe's device and dtype."""
    recipe = result.recipe
    run = _Run(result.tokenizer, recipe.device, recipe.dtype, show_progress)
    if result.model is not None:
        return result.model, None, run
    if result.checkpoint is None:
        raise ValueError("this streamed result's checkpoint was already saved or discarded: evaluate its folder")
    return None, result.checkpoint, run


def _is_result(subject: Any) -> bool:
    """A prune's result (duck-typed: ``core.pipeline`` is a sibling package this one does not import)."""
    return all(hasattr(subject, name) for name in ("model", "tokenizer", "recipe", "checkpoint", "streamed"))


def _parse(spec: Any) -> dict[str, Any]:
    """One evaluation, validated (``core.spec.evaluation``), as stored: ``type`` and its fields."""
    if isinstance(spec, BaseModel):
        spec = spec.model_dump(by_alias=True)
    if not isinstance(spec, dict):
        raise ValueError(f"an evaluation is a mapping with a 'type', not {type(spec).__name__}")
    spec = dict(spec)
    if spec.get("type", "perplexity") == "perplexity" and "text" in spec and "dataset" not in spec:
        spec["dataset"] = spec.pop("text")  # the sweep's name for the text, and the job's
    try:
        return job_evaluation(spec)
    except ValidationError as exc:
        raise ValueError(f"invalid evaluation: {validation_message(exc, 'evaluation')}") from None


def _tasks(ev: dict[str, Any]):
    """The lm-eval task names resolved before any model is read (a typo fails in a second)."""
    from core.evaluation.tasks import select_tasks

    try:
        return select_tasks(ev["tasks"], ev.get("task_dir"))
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None


def _open(name, tokenizer, device: str, dtype: str, execution: str, evaluations: list[dict]):
    """``(model, tokenizer, None)`` for a checkpoint measured whole, ``(None, tokenizer, directory)`` for
    one read block by block (``tokenizer`` None there: the checkpoint's own)."""
    from core.models.streaming import checkpoint_directory

    directory = checkpoint_directory(str(name))
    if execution == "stream" or (execution == "auto" and directory is not None and not _fits(directory, device)):
        if directory is None:
            raise ValueError(f"{str(name)!r} is neither a local directory nor a hub model reachable from this machine")
        return None, tokenizer, directory
    from core.models.loading import load_model

    model, own, adapter = load_model(str(name), dtype, device)
    if adapter.kind != "decoder":
        what = "perplexity" if evaluations[0]["type"] == "perplexity" else "lm-eval tasks"
        raise ValueError(f"{what} needs a causal language model (decoder)")
    return model, tokenizer if tokenizer is not None else own, None


def _fits(directory: Path, device: str) -> bool:
    """Whether the checkpoint's weight files take at most :data:`FIT_SHARE` of the memory free where
    the model would be loaded (unknown: it fits)."""
    import torch

    from core.models.host_memory import available_memory
    from core.models.loading import resolve_device

    weights = sum(f.stat().st_size for f in Path(directory).glob("*.safetensors"))
    dev = resolve_device(device)
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else available_memory()
    return free is None or weights <= FIT_SHARE * free


class _Run:
    """The evaluations of one call: each run on a model in memory or block by block from a directory."""

    def __init__(self, tokenizer, device: str, dtype: str, show_progress: bool):
        self.tokenizer, self.device, self.dtype, self.show_progress = tokenizer, device, dtype, show_progress

    def in_memory(self, model, ev: dict[str, Any], selection) -> dict[str, Any]:
        parameters = sum(p.numel() for p in model.parameters())
        if ev["type"] == "perplexity":
            from core.evaluation.perplexity import perplexity

            out = perplexity(model, self.tokenizer, ev["dataset"], **self._windows(ev))
            return {**out, "parameters": parameters}
        from core.evaluation.lmeval import evaluate_lm_eval

        return evaluate_lm_eval(model, self.tokenizer, selection, **self._task_options(ev))

    def streamed(self, directory: Path, ev: dict[str, Any], selection) -> dict[str, Any]:
        where = {"device": self.device, "dtype": self.dtype}
        if ev["type"] == "perplexity":
            from core.evaluation.perplexity import perplexity_streamed

            return perplexity_streamed(directory, self.tokenizer, ev["dataset"], **where, **self._windows(ev))
        from core.evaluation.lmeval_streamed import evaluate_lm_eval_streamed

        options = {**self._task_options(ev), **where, "show_progress": self.show_progress}
        return evaluate_lm_eval_streamed(directory, selection, tokenizer=self.tokenizer, **options)

    def _windows(self, ev: dict[str, Any]) -> dict[str, Any]:
        return {
            "seq_len": ev["seq_len"],
            "batch_size": ev["batch_size"],
            "max_windows": ev["max_windows"],
            "show_progress": self.show_progress,
        }

    @staticmethod
    def _task_options(ev: dict[str, Any]) -> dict[str, Any]:
        return {"batch_size": ev["batch_size"], "limit": ev["limit"], "num_fewshot": ev["num_fewshot"]}
