"""What a submission must pass before a job exists: the recipe and its evaluations validated and
preflighted against the model's config, the serving forms its ``export`` asks for, the server paths it
names confined to the folders a web or API job may read, lm-eval task folders to those an
administrator listed, and ``model: job:N`` resolved to that job's checkpoint. Used by
:class:`jobs.service.JobService` (``validate``, ``submit``, ``submit_sweep``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from jobs.access import OPEN, Actor, Forbidden, require_owner
from jobs.hub import missing_model
from jobs.names import Names
from jobs.references import job_reference, owner_and_checkpoint, upload_reference, with_local_uploads
from jobs.settings import Settings


class SubmitError(ValueError):
    """The submission is invalid; nothing was created."""


# the server is offline: LIAR_OFFLINE, HF_HUB_OFFLINE or HF_DATASETS_OFFLINE (jobs.settings.offline_from_env)
OFFLINE = "which this server's workers cannot reach (this server works offline)"


def _check_tasks(model: str, evaluations: list[dict], offline: bool = False) -> None:
    """lm-eval evaluations name tasks that exist (registry, or the task directory's YAMLs) and a causal
    language model (when its config is readable here): a typo fails at submission, not after pruning.
    ``offline``: a registry task (its data on the Hub) is refused too."""
    tasks = [e for e in evaluations if e.get("type") == "lm_eval"]
    if not tasks:
        return
    from core.evaluation.tasks import LOCAL_TASKS, select_tasks
    from core.pipeline.preflight import model_kind

    kind = model_kind(model)
    if kind is not None and kind[0] != "decoder":
        raise ValueError(f"lm-eval tasks need a causal language model; {model!r} is an {kind[0]}")
    for e in tasks:
        selection = select_tasks(e["tasks"], e.get("task_dir"))
        hub = [n for n in selection.names if n not in selection.local and n not in LOCAL_TASKS]
        if offline and hub:
            raise ValueError(
                f"lm-eval task {hub[0]!r} loads its data from the Hugging Face Hub, {OFFLINE}: use a task folder "
                "whose YAMLs read local files, or the local tasks (" + ", ".join(LOCAL_TASKS) + ")"
            )


def check_sources(recipe, evaluations: list[dict], offline: bool) -> None:
    """What the worker will read, read now where this host can (``ValueError``, one sentence): the
    calibration file's records and fields; and, for ``offline`` workers, no model, dataset or task
    that only the Hub has."""
    from core.data.texts import read_records, read_rows
    from core.pipeline.preflight import model_kind
    from core.spec.recipe import NAMED_DATASETS

    model = recipe.model
    remote = not Path(model).expanduser().is_dir() and model_kind(model) is None  # nor in the hub cache
    if offline and remote:
        raise ValueError(
            f"model {model!r} is no folder on this server and not in its Hugging Face cache, and the Hub is one "
            f"{OFFLINE}: use a local model folder"
        )
    if remote and (missing := missing_model(model)):  # asked of the Hub now, not found on the worker
        raise ValueError(missing)
    calibration = recipe.calibration
    if calibration.texts is None and calibration.dataset in NAMED_DATASETS:
        if offline:
            raise ValueError(
                f"calibration.dataset {calibration.dataset!r} comes from the Hugging Face Hub, {OFFLINE}: "
                "use a text or .jsonl file"
            )
    elif calibration.texts is None:
        read_records(calibration.dataset, calibration.text_field)  # a missing field fails now, not on the worker
        if calibration.label_field is not None:
            field = calibration.label_field
            for i, row in enumerate(read_rows(calibration.dataset)[1], 1):
                if field not in row:
                    raise ValueError(f"{calibration.dataset}: record {i} has no label field {field!r}")
    for e in evaluations:
        dataset = e.get("dataset") if e.get("type") == "perplexity" else None
        if dataset in NAMED_DATASETS and offline:  # (a file's existence: core.spec.evaluation)
            raise ValueError(f"evaluation dataset {dataset!r} comes from the Hugging Face Hub, {OFFLINE}")


def _check_export(recipe, model_too: bool) -> None:
    """The serving forms a recipe asks for can be written from its model (``core.serving.preflight``:
    family, rotary scaling, tokenizer, and the engine a quantized form needs) and from the checkpoint the
    recipe prunes from it (``core.serving.check_recipe``: llama.cpp's Qwen3 and Gemma architectures state
    one width and no added bias, which the recipe must give): a recipe that cannot is refused here rather
    than after hours of pruning. ``model_too`` False: the recipe's part only, for the cells of a grid whose
    model was checked once. A local folder is checked now; a hub id by the worker, once downloaded and
    before pruning."""
    if not recipe.export or not Path(recipe.model).expanduser().is_dir():  # (core.serving imports torch)
        return
    from core.serving import ExportError, check_recipe, preflight_model

    try:
        if model_too:  # the engines are the worker's business (it checks again before pruning)
            preflight_model(recipe.model, recipe.export, engines=False, download=False, recipe=recipe)
        else:
            check_recipe(recipe)
    except ExportError as exc:
        raise SubmitError(f"invalid recipe: export: {exc}") from None


def _uploaded(recipe: object) -> str | None:
    """The ``upload:…`` a recipe's calibration set names (``jobs.references``), if it names one."""
    calibration = recipe.get("calibration") if isinstance(recipe, dict) else None
    dataset = calibration.get("dataset") if isinstance(calibration, dict) else None
    return dataset if upload_reference(dataset) is not None else None


def _inside(path: Path, roots: list[Path]) -> bool:
    """Whether the resolved ``path`` is one of ``roots`` or lies below one."""
    return any(path == r or r in path.parents for r in roots)


class Validator:
    """The checks of one server (its settings, its database for job references)."""

    def __init__(self, settings: Settings, sessions):
        self.settings, self.sessions = settings, sessions
        self.names = Names(settings)

    def validate(
        self,
        recipe: dict | str | Path,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        check_export: bool | None = True,
        actor: Actor = OPEN,
    ) -> tuple[dict, list[dict]]:
        """The recipe and evaluations as stored (:meth:`checked`), the server's models and texts by
        their names (``jobs.names``: ``models/NAME``, typed so or as a path under the data folder);
        a refusal names them so too."""
        names = self.names
        try:
            local = names.evaluations(evaluations, names.path)
            stored, evals = self.checked(recipe, local, confine, check_export, actor)
        except SubmitError as exc:
            raise SubmitError(names.text(str(exc))) from None
        stored = names.recipe(stored, names.name)
        return stored, names.evaluations(evals, names.name)

    def checked(
        self,
        recipe: dict | str | Path,
        evaluations: list[dict] | None = None,
        confine: bool = False,
        check_export: bool | None = True,
        actor: Actor = OPEN,
    ) -> tuple[dict, list[dict]]:
        """The recipe and evaluations as stored, validated (and preflighted against the model's config,
        and against the serving forms its ``export`` asks for); raises :class:`SubmitError`. ``confine``:
        a web or API submission, whose server-side paths must lie in :meth:`Settings.readable_roots`
        (checked before anything reads them). ``check_export=False`` skips the model's part of the
        serving forms' check (about half a second: it reads the tokenizer) for the cells of a grid whose
        model and forms were checked once, and checks only what the cell's recipe prunes; ``None`` skips
        both (a grid's base recipe, whose cells are checked). ``model: job:N`` names job N's checkpoint
        (:mod:`jobs.references`): checked as that folder, stored as written; with downloads restricted,
        only for who may download it."""
        from core.pipeline.preflight import preflight
        from core.spec.errors import validation_message
        from core.spec.recipe import Recipe

        reference = upload = None
        try:
            if isinstance(recipe, (str, Path)) and Path(recipe).suffix in (".yaml", ".yml", ".json"):
                if confine:
                    raise SubmitError("a web submission passes the recipe itself, not a server-side file")
                parsed = Recipe.load(recipe)
            else:
                data = Recipe.parse_yaml(recipe) if isinstance(recipe, str) else recipe
                data = self.names.recipe(data, self.names.path) if isinstance(data, dict) else data
                reference = job_reference(data.get("model")) if isinstance(data, dict) else None
                if reference is not None:
                    data = {**data, "model": str(self.referenced_checkpoint(reference, actor))}
                if confine and isinstance(data, dict):
                    self.check_paths(data, evaluations, skip_model=reference is not None)
                upload = _uploaded(data)
                if upload is not None:  # read here from this host's copy, stored as written
                    data = with_local_uploads(data, self.settings.store())
                parsed = Recipe.model_validate(data)
        except ValidationError as exc:
            raise SubmitError(f"invalid recipe: {validation_message(exc)}") from None
        except (ValueError, FileNotFoundError) as exc:
            raise SubmitError(f"invalid recipe: {exc}") from None
        evals = self.checked_evaluations(parsed.model, evaluations or [])
        try:  # what the model's config can tell before anything is queued (evaluation lengths included)
            preflight(parsed, [int(e["seq_len"]) for e in evals if e.get("seq_len") is not None])
            check_sources(parsed, evals, self.settings.offline)  # what the worker would read, read now
        except (ValueError, FileNotFoundError) as exc:
            raise SubmitError(f"invalid recipe: {exc}") from None
        if check_export is not None:
            _check_export(parsed, model_too=check_export)
        stored = parsed.model_dump(mode="json", exclude_none=True)
        if reference is not None:
            stored["model"] = f"job:{reference}"  # the job page names the job, not the server's folder
        if upload is not None:
            stored["calibration"]["dataset"] = upload  # the store's key, for a worker on any host
        return stored, evals

    def evaluations(self, model: str, evaluations: list[dict], confine: bool = False) -> list[dict]:
        """:meth:`checked_evaluations` for ``model`` and ``evaluations`` that may name the server's
        texts by their names (``jobs.names``); returned, and refused, with the names."""
        names = self.names
        try:
            evals = self.checked_evaluations(names.path(model), names.evaluations(evaluations, names.path), confine)
        except SubmitError as exc:
            raise SubmitError(names.text(str(exc))) from None
        return names.evaluations(evals, names.name)

    def checked_evaluations(self, model: str, evaluations: list[dict], confine: bool = False) -> list[dict]:
        """``evaluations`` as stored, validated for ``model`` (a file that exists, lm-eval tasks that
        do and a causal language model to run them); ``confine``: their server paths and task folders
        checked as a web submission's are (:meth:`check_paths`). Raises :class:`SubmitError`. Also
        what a re-evaluation checks again (``jobs.reevaluation``): the cause of a failure fixed."""
        from core.spec.errors import validation_message
        from core.spec.evaluation import job_evaluation

        if confine:
            self.check_paths({}, evaluations, skip_model=True)
        try:
            evals = [job_evaluation(e) for e in evaluations]
            _check_tasks(model, evals, self.settings.offline)
        except ValidationError as exc:
            raise SubmitError(f"invalid evaluation: {validation_message(exc)}") from None
        except (ValueError, FileNotFoundError) as exc:
            raise SubmitError(f"invalid evaluation: {exc}") from None
        return evals

    def referenced_checkpoint(self, job_id: int, actor: Actor) -> Path:
        """The checkpoint folder ``model: job:N`` names (``ValueError``, one sentence, if there is none
        to use); when downloads are restricted, only for the job's owner or an admin."""
        with self.sessions() as s:
            owner, path = owner_and_checkpoint(s, job_id, self.settings.store(), weights=False)
        if self.settings.downloads == "owners":
            try:
                require_owner(actor, job_id, owner, "use the checkpoint of")
            except Forbidden as exc:
                raise SubmitError(str(exc)) from None
        return path

    def readable(self, value: str) -> bool:
        """Whether a server path lies inside one of :meth:`Settings.readable_roots`."""
        resolved = Path(value).expanduser().resolve()
        return _inside(resolved, self.settings.readable_roots())

    def check_paths(self, recipe: dict, evaluations: list[dict] | None, skip_model: bool = False) -> None:
        """Every server-side path a recipe or evaluation names lies inside a readable root, and a task
        folder inside one the administrator listed (its YAMLs can run Python)."""
        from core.spec.recipe import NAMED_DATASETS

        calibration = recipe.get("calibration") if isinstance(recipe.get("calibration"), dict) else {}
        named = [] if skip_model else [("model", recipe.get("model"))]
        named += [("calibration.dataset", calibration.get("dataset"))]
        named += [("evaluation dataset", e.get("dataset")) for e in evaluations or [] if isinstance(e, dict)]
        for field, value in named:
            if not isinstance(value, str) or value in NAMED_DATASETS or upload_reference(value) is not None:
                continue
            local = value.startswith((".", "/", "~")) or value.count("/") > 1 or Path(value).expanduser().exists()
            # a model may be a hub id; a dataset that is not named is a file
            if (field != "model" or local) and not self.readable(value):
                artifacts = self.settings.artifacts_dir.resolve()
                if field == "model" and artifacts in Path(value).expanduser().resolve().parents:
                    raise SubmitError(
                        f"model {value!r} is a job's folder on this server: name a job's checkpoint by the "
                        "job's id instead (model: job:42)"
                    )
                advice = "upload the file, or" if field != "model" else "a hub id also works; or"  # no model uploads
                raise SubmitError(
                    f"{field} {value!r} is outside the folders this server reads from; {advice} ask the "
                    "administrator to add its folder to LIAR_DATA_ROOTS"
                )
        task_roots = [r.resolve() for r in self.settings.task_dirs]
        for e in evaluations or []:
            folder = e.get("task_dir") if isinstance(e, dict) else None
            if isinstance(folder, str) and folder:
                resolved = Path(folder).expanduser().resolve()
                if not _inside(resolved, task_roots):
                    raise SubmitError(
                        f"task_dir {folder!r} is not one of this server's task folders: task YAMLs can run Python, "
                        "so a web job may use only the folders the administrator lists in LIAR_TASK_DIRS"
                    )


def target_cells(base: dict[str, Any], methods: list[str] | None, criteria: list[str] | None) -> list[dict]:
    """The recipes of a speed-target sweep: ``base`` with each method × criterion."""
    cells = []
    for method in methods or [None]:
        for name in criteria or [None]:
            cell = dict(base)
            if method is not None:
                cell["reconstruction"] = {**base.get("reconstruction", {}), "method": method}
            if name is not None:
                cell["criterion"] = {"name": name, "options": base.get("criterion", {}).get("options", {})}
            cells.append(cell)
    return cells
