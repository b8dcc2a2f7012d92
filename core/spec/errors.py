"""Turning validation failures into the one-sentence messages every entry point shows."""

from __future__ import annotations

from pydantic import ValidationError


def validation_lines(exc: ValidationError, root: str = "recipe", prefix: str = "") -> list[str]:
    """One ``field.path: message`` line per problem; ``root`` names a problem with the whole object."""
    lines = []
    for e in exc.errors():
        loc = ".".join(_loc_part(x) for x in e["loc"])
        msg = " ".join(e["msg"].removeprefix("Value error, ").split("\n"))
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{prefix}{loc or root}: {msg}")
    return lines


def _loc_part(x) -> str:
    """A field name as written, or quoted when it is not a plain name (a key with a newline or a
    space in a random mapping must not break the one-line message)."""
    text = str(x)
    return text if isinstance(x, int) or text.isidentifier() else repr(text)


def validation_message(exc: ValidationError, root: str = "recipe") -> str:
    """The problems of :func:`validation_lines` on one line, separated by semicolons."""
    return "; ".join(validation_lines(exc, root))
