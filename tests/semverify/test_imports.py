"""The package's modules import one another without cycles: every import counts, those inside functions too
(a deferred import only hides a cycle); imports for type checking alone do not."""

from __future__ import annotations

import ast
from pathlib import Path

import semverify

ROOT = Path(semverify.__file__).parent


def module_name(path: Path) -> str:
    parts = ["semverify", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The semverify modules ``path`` imports anywhere but under ``if TYPE_CHECKING``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n))), None)


def test_no_import_cycle_among_the_package_modules():
    files = sorted(ROOT.rglob("*.py"))
    modules = {module_name(f) for f in files}
    # a package imports its submodules to register them; a submodule importing a sibling is the edge that matters
    graph = {module_name(f): imported(f, modules) for f in files}
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_imports_nothing_outside_it_but_types_and_stats():
    files = sorted(ROOT.rglob("*.py"))
    modules = {module_name(f) for f in files}
    allowed = {"semverify.types", "semverify.stats", "semverify.engine"}
    outside = {f"{module_name(f)} -> {dep}" for f in sorted((ROOT / "engine").glob("*.py"))
               for dep in imported(f, modules) if not dep.startswith("semverify.engine.") and dep not in allowed}
    assert not outside, f"the engine imports methods or loading: {sorted(outside)}"
