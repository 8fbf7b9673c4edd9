"""No import circles between vacsr's modules (counting imports inside functions too): each module
has one job, and a module that needs another's names imports it, never the other way round."""
from __future__ import annotations

import ast

from tests.architecture.source_imports import vacsr_modules


def import_graph() -> dict[str, set[str]]:
    """module -> the vacsr modules it imports anywhere in its body."""
    modules = vacsr_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                base = node.module
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_vacsr_has_no_import_circles():
    graph = import_graph()
    assert "vacsr.distributed.worker" in graph["vacsr.distributed.train"]
    cycle = find_cycle({name: {t for t in targets if not name.startswith(t + ".")}
                        for name, targets in graph.items()})
    assert cycle is None, " -> ".join(cycle)
