"""A results page (the command that writes it, its machine, its claims) and the registry of the docs'
generated blocks (``<!-- results:NAME -->``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Claim:
    text: str
    value: Callable[[], str | None]  # None: the results do not hold this quantity (yet); no row
    section: str = ""  # the heading its value is read under, when that states its own date and machine


@dataclass(frozen=True)
class Page:
    """A page of docs/results/: the command that writes it, what kind of machine it needs, its claims."""

    script: str
    machine: str  # cpu | gpu | jobs
    claims: tuple[Claim, ...] = ()
    cpu_times: bool = False  # quotes CPU prune or evaluation times (superseded when before ONEDNN_DATE)
    stale: str = ""  # why the page needs a re-run, where its date alone does not say
    data: tuple[str, ...] | None = None  # JSON files the page is made from (None: its own, NAME.json)


def with_data(pages: dict[str, Page]) -> dict[str, Page]:
    """``pages`` with each page's JSON named: ``NAME.json`` for a page ``NAME.md`` that names none."""
    return {n: p if p.data is not None else replace(p, data=(f"{Path(n).stem}.json",)) for n, p in pages.items()}


def _c(text: str, value: Callable[[], str | None], section: str = "") -> Claim:
    return Claim(text, value, section)


RENDERERS: dict[str, Callable[[], str]] = {}


def renderer(name: str):
    """Register a block's renderer under ``name`` (the NAME of ``<!-- results:NAME -->``)."""

    def add(fn: Callable[[], str]) -> Callable[[], str]:
        RENDERERS[name] = fn
        return fn

    return add
