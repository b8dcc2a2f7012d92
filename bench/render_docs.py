"""Fill the generated blocks of the README and docs/ from the results files: ``make docs``.

A markdown file carries blocks ``<!-- results:NAME -->`` … ``<!-- /results -->``; each NAME is a renderer
below that reads ``docs/results/*.json`` (or, for the few pages a benchmark writes without JSON, the
page's own table) and returns the block's text. No measured number is typed into the docs: it is
typed here as a key into a results file, so a re-run benchmark changes every place that quotes it,
and ``tests/test_docs.py`` fails when a committed file differs from what this script renders.

The results index (``docs/results/README.md``) is ``bench/pages/registry.py``'s ``PAGES``: every page of
``docs/results/`` with the script that writes it and its claims (what the page shows, and the value it
shows it with), in one table per family of pages (``bench/pages/quality.py``, ``speed.py``, ``systems.py``);
the date, machine and torch of a row are read from the page itself. The blocks' renderers are
``bench/pages/readme.py`` and ``blocks.py``; a new page is a row of its family's table.

    python bench/render_docs.py            # rewrite the files whose blocks changed
    python bench/render_docs.py --check    # exit 1, naming the files that are not up to date

Standard library only (no torch), so the docs test is fast.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, like the other benchmarks

from bench.pages import blocks  # noqa: E402  (its renderers register themselves)
from bench.pages.page import RENDERERS  # noqa: E402
from bench.pages.readme import render_readme  # noqa: E402
from bench.pages.registry import PAGES, render_index  # noqa: E402
from bench.pages.values import RESULTS, ROOT, product_ratio, time_row  # noqa: E402

__all__ = ["PAGES", "RESULTS", "ROOT", "blocks", "product_ratio", "render_index", "render_readme", "time_row"]
# The markdown files that carry generated blocks.
FILES = ("README.md", "docs/guide.md", "docs/deploy-one-host.md", "docs/design.md", "docs/results/README.md")
# the pages of OPTIONAL_PAGES that carry generated blocks, once their benchmark has written them
FILES += tuple(f"docs/results/{name}" for name in ("first_run.md", "resume.md") if (RESULTS / name).exists())
BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def render_text(text: str) -> str:
    """``text`` with every generated block replaced by what its renderer returns now."""

    def fill(m: re.Match) -> str:
        name = m.group(2)
        if name not in RENDERERS:
            raise KeyError(f"unknown results block {name!r}; known: {', '.join(sorted(RENDERERS))}")
        return f"{m.group(1)}{RENDERERS[name]().rstrip()}\n{m.group(4)}"

    return BLOCK.sub(fill, text)


def stale_files(root: Path = ROOT) -> list[str]:
    """The files of ``FILES`` whose committed text differs from what this script renders."""
    return [f for f in FILES if (root / f).exists() and render_text((root / f).read_text()) != (root / f).read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is not up to date")
    args = parser.parse_args(argv)
    stale = stale_files()
    if args.check:
        for f in stale:
            print(f"{f}: generated blocks are out of date (run `make docs`)", file=sys.stderr)
        return 1 if stale else 0
    for f in stale:
        path = ROOT / f
        path.write_text(render_text(path.read_text()))
        print(f"rewrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
