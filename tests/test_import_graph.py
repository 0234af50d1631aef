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


# The layers of docs/architecture.md, lowest first: a module imports from its own layer or below, never
# from above (an upward arrow ties a lower part to a higher one: the stop signals in the launcher, the
# job plan in the launcher when the preflight needs it). A new package or top-level module gets a layer.
LAYERS = [
    {"errors"},
    {"registry", "waiting", "processes", "machine", "distributed"},
    {"config", "components"},
    {"model_files", "models", "vision", "data", "sandboxes", "desktop", "algorithms"},
    {"agents", "policy", "generation", "envs", "io"},
    {"preflight"},
    {"loop", "plane"},
    {"launch", "run"},
    {"cli"},
]


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else module
    return next(i for i, names in enumerate(LAYERS) if part in names)


def test_imports_go_down_the_layers_never_up():
    graph = module_graph()
    unplaced = sorted({m.split(".")[1] for m in graph if "." in m} - set().union(*LAYERS))
    assert not unplaced, f"give these a layer in LAYERS (and docs/architecture.md): {unplaced}"
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() if a != "dockyard" for b in targets
                    if b != "dockyard" and layer_of(b) > layer_of(a))
    assert not upward, f"imports from a higher layer: {upward}"
