"""The shape of the code base: no import cycles among the project's modules (imports inside functions
count), the web-facing layers stay torch-free, and the torch-free name lists match the registries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "jobs", "app", "bench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # the longest project module named by the import (a package, a module, or a name in one)
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package's own __init__ is no edge
                    graph[name].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles_counting_imports_inside_functions():
    graph = _import_graph()
    assert "core.pipeline.sequential" in graph and graph["core.pipeline.sequential"]  # the graph is real
    assert _cycles(graph) == []


def _imports_in_fresh_interpreter(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_recipe_validation_and_job_validation_do_not_import_torch(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 2048}')
    loaded = _imports_in_fresh_interpreter(
        "from core import Recipe\n"
        f"r = Recipe.from_yaml('model: {model}\\nratio: 0.3\\ncriterion: {{name: flap}}\\n"
        "calibration: {texts: [some text]}\\n')\n"
        "from core.pipeline.preflight import preflight\n"
        "preflight(r)\n"
        "import jobs.service\n"
    )
    assert "core.spec.recipe" in loaded and "jobs.service" in loaded
    assert "torch" not in loaded and "transformers" not in loaded


def test_torch_free_name_lists_match_the_registries():
    from core import criteria
    from core.spec.criteria import CRITERIA
    from core.spec.recipe import METHODS
    from core.stats import reconstruct

    assert set(CRITERIA) == set(criteria.REGISTRY)
    assert set(METHODS) == set(reconstruct.METHODS)
