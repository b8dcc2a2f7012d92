"""The house's size rules, for every package the structure check covers (bench/ included): no module over
500 lines, no function over 80 (``python3 tools/structure.py``'s figures; import cycles are
tests/test_architecture.py's)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "jobs", "app", "bench")
MAX_MODULE, MAX_FUNCTION = 500, 80


def _modules(package: str) -> list[Path]:
    return [p for p in sorted((ROOT / package).rglob("*.py")) if "migrations" not in p.parts]


def _long_functions(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(root)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_500_lines(package):
    modules = _modules(package)
    assert modules
    sizes = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8").count("\n") + 1 for p in modules}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_80_lines(package):
    assert [f for p in _modules(package) for f in _long_functions(p)] == []


def test_the_rules_see_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    path = tmp_path / "probe.py"
    path.write_text(f"def long():\n{body}\n\n\ndef short():\n    pass\n")
    assert _long_functions(path, tmp_path) == ["probe.py:long (81 lines)"]
