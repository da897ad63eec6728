"""The engine's layout holds: few top-level modules in console/, one package per concern with a
docstring saying what it may import, and no import circle in screens/ (import-linter's layers
contract, run by scripts/test, keeps the order between the packages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The packages of console/, one per concern.
PACKAGES = ("ssh", "cluster", "bringup", "training", "gpu", "commands")


def test_console_top_level_has_at_most_five_modules():
    modules = sorted(p.name for p in (ROOT / "console").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 5, f"console/ has {len(modules)} top-level modules: {modules}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_it_owns(package):
    init = ROOT / "console" / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    assert doc, f"console/{package}/__init__.py has no docstring"
    if package != "commands":
        assert "import" in doc, f"console/{package}'s docstring does not say what it may import"


def screens_imports() -> dict[str, set[str]]:
    """Every ``screens.*`` module each screens module imports, at any depth of the file (lazy
    imports inside functions and ``TYPE_CHECKING`` blocks count: a circle is a circle)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "screens").glob("*.py")):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps.update(n for n in names if n.startswith("screens.")
                        and (ROOT / (n.replace(".", "/") + ".py")).is_file())
        graph[f"screens.{path.stem}"] = deps
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, as the list of modules around it, or None."""
    state: dict[str, int] = {}   # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_find_circle_sees_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_screens_have_no_import_circle():
    graph = screens_imports()
    assert "screens.gpus" in graph and graph["screens.gpus"], "the walk found no imports"
    circle = find_circle(graph)
    assert circle is None, "import circle in screens/: " + " -> ".join(circle or [])
