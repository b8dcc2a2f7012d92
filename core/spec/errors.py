"""Turning validation failures into the one-sentence messages every entry point shows."""

from __future__ import annotations

from pydantic import ValidationError


def validation_lines(exc: ValidationError, root: str = "recipe", prefix: str = "") -> list[str]:
    """One ``field.path: message`` line per problem; ``root`` names a problem with the whole object."""
    lines = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{prefix}{loc or root}: {msg}")
    return lines


def validation_message(exc: ValidationError, root: str = "recipe") -> str:
    """The problems of :func:`validation_lines` on one line, separated by semicolons."""
    return "; ".join(validation_lines(exc, root))
