"""Reading a model directory's ``config.json`` (standard library only: the torch-free checks use it)."""

from __future__ import annotations

import json
from pathlib import Path


def read_config(model_dir: str | Path) -> dict:
    """A model directory's ``config.json`` as a mapping; ``ValueError`` naming the file when it is not one."""
    path = Path(model_dir).expanduser() / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object of model settings, not a {type(raw).__name__}")
    return raw
