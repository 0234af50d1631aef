"""The package's imports flow one way: no module of dockyard/ imports, directly or through others, a
module that imports it back. Imports inside functions count too (a circle dodged by a late import is
still a circle). KNOWN lists the circles left to undo; the test fails on any other, and on a known one
that is gone (so that the list only shrinks)."""

import ast
import sys

from tests.conftest import REPO

PACKAGE = REPO / "dockyard"
KNOWN: list[set[str]] = []    # circles left to undo (none now)


def module_graph() -> dict[str, set[str]]:
    modules = {}
    for file in PACKAGE.rglob("*.py"):
        parts = file.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("dockyard") else None
                # a module's own package (__init__) is imported before it anyway: not an arrow of its own
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(group)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_new_import_circles():
    found = circles(module_graph())
    new = [sorted(group) for group in found if group not in KNOWN]
    gone = [sorted(group) for group in KNOWN if group not in found]
    assert not new, f"import circles: {new}; move the shared piece one level down"
    assert not gone, f"these circles are gone: take them out of KNOWN: {gone}"


def test_the_check_sees_a_circle_dodged_by_a_late_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]
    graph = module_graph()
    assert "dockyard.envs.swe_tasks" in graph["dockyard.envs.swe"]       # a module-level import is an arrow
    assert "dockyard.preflight.model_folders" in graph["dockyard.preflight"]   # so is one inside a function
