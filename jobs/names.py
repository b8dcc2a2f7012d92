"""The names users see for the server's models and texts, and the files they stand for.

Users name what the server offers as the model list does, never by where it lies on the server:

| name                      | the file on this host                          |
|---------------------------|------------------------------------------------|
| ``models/tiny-llama-demo`` | ``$LIAR_DATA_DIR/models/tiny-llama-demo``     |
| ``texts/tiny-demo.txt``   | ``$LIAR_DATA_DIR/texts/tiny-demo.txt``         |
| ``cache/wiki-…``          | ``$LIAR_CACHE/wiki-…`` (the benchmarks' cache) |
| ``upload:4ae1….jsonl``    | the store's ``uploads/4ae1….jsonl`` (``jobs.references``) |
| ``job:42``                | job 42's checkpoint (``jobs.references``)      |

A submission is checked against the files (:meth:`Names.path`) and stored with the names
(:meth:`Names.name`): a job page, a re-run and a worker on another host see the same recipe, and
each host resolves the names to files of its own. An absolute path a user typed still works; one
under the data folder is stored and shown by its name. What a user reads (an API answer, a page,
an error, every file of a checkpoint) goes through :meth:`Names.text`, which turns any path under
the data folder or the cache that is left into its name; the operator's ``liar jobs show`` keeps
the full paths.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jobs.settings import Settings

MODELS, TEXTS, CACHE = "models/", "texts/", "cache/"
UPLOAD = "upload:"
# the small files of a checkpoint that may quote the model or the calibration file it came from
# (config.json's _name_or_path, the model card's base_model, recipe.yaml, metrics.json, tokenizer files)
TEXT_FILES = (".json", ".yaml", ".yml", ".md", ".txt", ".jinja")
TEXT_LIMIT = 64 << 20  # bytes: a bigger file is no text a person reads (a tokenizer.json is a few MB)


def _spellings(folder: Path) -> list[str]:
    """The ways ``folder`` may be written: as given and resolved (``/tmp`` may be a link)."""
    forms = {str(folder.expanduser()), str(folder.expanduser().resolve())}
    return sorted(forms, key=len, reverse=True)


class Names:
    """The names of one server's models and texts (its :class:`Settings`)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.roots = [(MODELS, settings.models_dir), (TEXTS, settings.texts_dir), (CACHE, settings.cache_dir)]
        pairs: list[tuple[str, str]] = []
        for name, folder in [*self.roots, (UPLOAD, settings.uploads_dir)]:
            pairs += [(spelled + "/", name) for spelled in _spellings(folder)]
        for spelled in _spellings(settings.data_dir):
            pairs.append((spelled + "/", ""))  # the rest of the data folder: its own relative path
            pairs.append((spelled, "the server's data folder"))
        self._pairs = sorted(pairs, key=lambda p: len(p[0]), reverse=True)
        artifacts = "|".join(re.escape(s) for s in _spellings(settings.artifacts_dir))
        self._job = re.compile(rf"(?:{artifacts})/job-(\d+)(?:/attempt-\d+)?(?:/checkpoint)?(?![\w.-])")

    # --- one value --------------------------------------------------------------------------
    def name(self, value: Any) -> Any:
        """``value`` as users see it: a path under the data folder or the cache by its name
        (``models/tiny-llama-demo``); anything else (a hub id, ``job:42``, a named dataset, another
        folder) as it is."""
        if not isinstance(value, str) or not value.startswith(("/", "~")):
            return value
        path = Path(value).expanduser()
        for name, folder in [*self.roots, (UPLOAD, self.settings.uploads_dir)]:
            for spelled in map(Path, _spellings(folder)):
                if spelled in path.parents:
                    return name + path.relative_to(spelled).as_posix()
        return self.text(value)

    def path(self, value: Any) -> Any:
        """The file a name stands for on this host (``models/NAME`` → the models folder's ``NAME``),
        where it exists; anything else as it is (a hub id ``org/name`` is no name of this server's
        unless a folder of that name is here; ``upload:`` and ``job:`` are ``jobs.references``')."""
        if not isinstance(value, str):
            return value
        for name, folder in self.roots:
            rest = value[len(name) :]
            if value.startswith(name) and rest and not rest.startswith("/") and ".." not in Path(rest).parts:
                local = folder / rest
                if local.exists() or name == TEXTS:  # a missing text is said to be missing, by its name
                    return str(local)
        return value

    # --- free text and documents --------------------------------------------------------------
    def text(self, text: str) -> str:
        """``text`` with every path under the data folder or the cache turned into its name (a job's
        folder into ``job:N``); what an error, a log line or a checkpoint's file may say."""
        if not isinstance(text, str) or "/" not in text:
            return text
        text = self._job.sub(lambda m: f"job:{m.group(1)}", text)
        for spelled, name in self._pairs:
            if spelled in text:
                text = text.replace(spelled, name)
        return text

    def public(self, value: Any) -> Any:
        """``value`` (an API answer: dicts, lists, strings) with :meth:`text` applied to every string."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.public(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.public(v) for v in value]
        return value

    def recipe(self, recipe: dict, how) -> dict:
        """``recipe`` with its model and calibration file passed through ``how`` (:meth:`name` or
        :meth:`path`)."""
        out = {**recipe, "model": how(recipe.get("model"))} if "model" in recipe else dict(recipe)
        calibration = recipe.get("calibration")
        if isinstance(calibration, dict) and "dataset" in calibration:
            out["calibration"] = {**calibration, "dataset": how(calibration["dataset"])}
        return out

    def evaluations(self, evaluations: list | None, how) -> list:
        """``evaluations`` with each one's dataset passed through ``how``."""
        return [
            {**e, "dataset": how(e["dataset"])} if isinstance(e, dict) and "dataset" in e else e
            for e in evaluations or []
        ]

    def checkpoint(self, folder: Path) -> list[str]:
        """Rewrite the small text files of a checkpoint written on this host so that none names a
        server path (:meth:`text`), and its ``SHA256SUMS`` for the files changed; the names of the
        files changed."""
        from core.models.manifest import MANIFEST, file_sha256, read_manifest, write_manifest

        changed = []
        for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in TEXT_FILES):
            if file.stat().st_size > TEXT_LIMIT:
                continue
            try:
                before = file.read_text()
            except UnicodeDecodeError:
                continue
            after = self.text(before)
            if after != before:
                file.write_text(after)
                changed.append(file.relative_to(folder).as_posix())
        if changed and (folder / MANIFEST).is_file():
            known = {e.name: e.sha256 for e in read_manifest(folder) if e.name not in changed}
            write_manifest(folder, known | {n: file_sha256(folder / n) for n in changed})
        return changed
