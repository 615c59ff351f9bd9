"""Imports run one way: no cycles (TYPE_CHECKING and function-local imports included), and layers.

Read from the source with `ast`, so every import counts, wherever it stands. An import
of `a.b.c` is an edge to that module only (not to its parent packages: Python runs
them too, but a package's `__init__` re-exporting its modules is not a cycle of design).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "stores", "kiteq", "spark_jobs")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            modules[module_name(path)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        else:
            continue
        found |= {target for target in targets if target in modules and target != name}
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers() -> None:
    """protocol imports nothing of ours; stores only protocol; spark_jobs reads files, and of
    ours imports only the delivery log's event names (protocol.logevents)."""
    allowed = {
        "protocol": {"protocol"},
        "stores": {"protocol", "stores"},
        "spark_jobs": {"spark_jobs", "protocol.logevents"},
    }
    wrong = [
        (name, target)
        for name, targets in graph().items()
        for target in targets
        if name.split(".")[0] in allowed and not {target, target.split(".")[0]} & allowed[name.split(".")[0]]
    ]
    assert wrong == []


def test_the_connection_and_the_admin_endpoint_do_not_know_the_broker() -> None:
    edges = graph()
    for name in ("kiteq.server.connection", "kiteq.server.handlers", "kiteq.server.admin.app"):
        assert "kiteq.server.broker" not in edges[name], name
