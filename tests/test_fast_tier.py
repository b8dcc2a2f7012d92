"""`make test-fast` reaches every package of core/, jobs/ and app/: each is imported, directly or through
the project's own modules, by at least one test file the target runs (read from the Makefile, so the
check follows the target). Static: imports are read from the files (inside functions too), nothing is run."""

from __future__ import annotations

import ast
import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "jobs", "app")


def fast_files() -> list[Path]:
    """The test files `make test-fast` names (folders walked, ``$(wildcard …)`` expanded)."""
    rule = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    line = next(cmd for cmd in rule.splitlines() if "pytest" in cmd)
    args = re.sub(r"\$\(wildcard ([^)]*)\)", lambda m: " ".join(glob.glob(str(ROOT / m.group(1)))), line)
    files: list[Path] = []
    for word in args.split():
        path = ROOT / word
        if path.is_dir():
            files += sorted(path.rglob("test_*.py"))
        elif path.suffix == ".py" and path.is_file():
            files.append(path)
    return files


def imported(path: Path) -> set[str]:
    """The project modules ``path`` imports (``from core.x import y`` counts ``core.x`` and ``core.x.y``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in PACKAGES}


def source(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def reached(start: list[Path]) -> set[str]:
    """Every project module the files import, and what those import in turn."""
    seen: set[str] = set()
    todo = [m for f in start for m in imported(f)]
    while todo:
        module = todo.pop()
        path = source(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
        todo += imported(path)
    return seen


def test_make_test_fast_imports_every_package():
    files = fast_files()
    assert len(files) > 50 and ROOT / "tests/app/test_cli.py" in files  # the rule was read
    packages = sorted(
        str(p.parent.relative_to(ROOT)).replace("/", ".") for n in PACKAGES for p in (ROOT / n).rglob("__init__.py")
    )
    seen = reached(files)
    missing = [p for p in packages if p not in seen]
    assert missing == [], f"no test `make test-fast` runs imports {', '.join(missing)}"
