"""lm-eval task names: the paper's, the offline builders', and the lookup that resolves them.

Torch-free (only ``lm_eval.tasks`` is imported, when a lookup runs), so a job submission in the web
process checks task names without loading the model stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAPER_TASKS: tuple[str, ...] = (
    "boolq",
    "piqa",
    "hellaswag",
    "winogrande",
    "arc_easy",
    "arc_challenge",
    "openbookqa",
)
"""The zero-shot tasks of the paper's decoder tables (lm-eval registry names; data from the Hub)."""

TASKS_ACC_MEAN = "tasks_acc_mean"
"""The metric a job records for its lm-eval tasks: their mean accuracy (``core.evaluation.lmeval.task_metrics``)."""

LOCAL_TASKS: tuple[str, ...] = ("rt_sentiment", "wiki_cloze")
"""Task names of the offline builders in this module."""

# Folders of lm-eval's own task tree that define the paper's tasks: indexing only these takes
# milliseconds, where indexing the whole registry (thousands of YAMLs) takes about ten seconds.
_PAPER_TASK_FOLDERS = {
    "boolq": "super_glue/boolq",
    "piqa": "piqa",
    "hellaswag": "hellaswag",
    "winogrande": "winogrande",
    "arc_easy": "arc",
    "arc_challenge": "arc",
    "openbookqa": "openbookqa",
}

_BUILDERS = {"rt_sentiment": "write_rt_sentiment_task", "wiki_cloze": "write_wiki_cloze_task"}


def _task_names(tasks: str | Sequence[str]) -> list[str]:
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    out: list[str] = []
    for n in (str(n).strip() for n in names):
        if n and n not in out:
            out.append(n)
    if not out:
        raise ValueError("no task given")
    return out


@dataclass
class TaskSelection:
    """Requested task names, resolved: the ``TaskManager`` that knows them and which ones are local."""

    manager: Any
    names: list[str]
    local: set[str]
    task_dir: Path | None


def select_tasks(tasks: str | Sequence[str], task_dir: str | Path | None = None) -> TaskSelection:
    """Resolve task names with a ``TaskManager`` that indexes no more of the registry than needed.

    Local YAMLs in ``task_dir`` come first; the paper's tasks are found by indexing their own
    folders only; any other name makes it index the whole registry (about ten seconds), unless a
    quick text scan shows the name occurs in none of the registry's files. Unknown names raise a
    ``ValueError`` that lists what is available.
    """
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    names = _task_names(tasks)
    include: list[Path] = []
    if task_dir is not None:
        task_dir = Path(task_dir).expanduser()
        if not task_dir.is_dir():
            raise FileNotFoundError(f"task directory {str(task_dir)!r} does not exist")
        include.append(task_dir.resolve())
    local = set(TaskManager(include_path=include, include_defaults=False).all_tasks) if include else set()
    rest = [n for n in names if n not in local]
    registry_root = Path(lm_eval.tasks.__file__).parent
    folders = sorted({registry_root / _PAPER_TASK_FOLDERS[n] for n in rest if n in _PAPER_TASK_FOLDERS})
    # names of the local builders are not registry tasks: missing locally, they need no registry scan
    full_registry = any(n not in _PAPER_TASK_FOLDERS and n not in LOCAL_TASKS for n in rest) or not all(
        f.is_dir() for f in folders
    )
    others = [n for n in rest if n not in _PAPER_TASK_FOLDERS and n not in LOCAL_TASKS]
    absent = _absent_from_registry(others, registry_root)
    if absent:  # cannot be a registry task: say so now instead of indexing the whole registry first
        raise ValueError(_unknown_message(absent, task_dir, local))
    if full_registry:
        manager = TaskManager(include_path=include or None, include_defaults=True)
    else:
        manager = TaskManager(include_path=folders + include, include_defaults=False)
    known = set(manager.all_tasks)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(_unknown_message(unknown, task_dir, local))
    return TaskSelection(manager, names, local, task_dir)


def _absent_from_registry(names: list[str], root: Path) -> list[str]:
    """Names that occur in no YAML file of the registry at all (a quick scan; presence proves nothing)."""
    left = set(names)
    for path in root.rglob("*.yaml"):
        if not left:
            break
        text = path.read_text(encoding="utf-8", errors="ignore")
        left = {n for n in left if n not in text}
    return [n for n in names if n in left]


def _unknown_message(unknown: list[str], task_dir: Path | None, local: set[str]) -> str:
    hints = []
    for n in unknown:
        if n in LOCAL_TASKS:
            where = f"in {str(task_dir)!r}" if task_dir is not None else "(no --task-dir given)"
            hints.append(
                f"{n!r} is a local task but no {n}.yaml was found {where}; build it with "
                f"core.evaluation.lmeval.{_BUILDERS[n]} "
                "(bench.assets.lm_eval_task_dir() builds both from the bundled data)"
            )
        else:
            hints.append(f"unknown task {n!r}")
    available = f"local tasks in {str(task_dir)!r}: {sorted(local) or 'none'}; " if task_dir is not None else ""
    return "; ".join(hints) + f" ({available}registry tasks include the paper's {', '.join(PAPER_TASKS)})"


def load_tasks(selection: TaskSelection, output_types: dict[str, str] | None = None) -> list:
    """Build every task now (this reads its data) so a missing Hub is reported per task, clearly.
    ``output_types``, when given, receives each task's (each group member's) kind of request:
    ``loglikelihood``, ``multiple_choice``, ``loglikelihood_rolling`` or ``generate_until``."""
    specs: list = []
    for name in selection.names:
        try:
            loaded = selection.manager.load([name])
        except Exception as exc:
            if name in selection.local:
                raise RuntimeError(f"could not load the local task {name!r}: {type(exc).__name__}: {exc}") from exc
            raise RuntimeError(
                f"could not load the lm-eval task {name!r}: its data come from the Hugging Face Hub, which "
                f"seems unreachable from here ({type(exc).__name__}: {exc}). Local tasks ({', '.join(LOCAL_TASKS)}) "
                "work offline: build them into a directory and pass it as task_dir / --task-dir."
            ) from exc
        if output_types is not None:
            output_types.update({task: t.OUTPUT_TYPE for task, t in loaded["tasks"].items()})
        if name in loaded["groups"]:
            specs.append(loaded["groups"][name])
        else:
            specs.extend(loaded["tasks"].values())
    return specs
