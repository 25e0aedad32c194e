"""No import circle anywhere in the service or the runner, module by module: imports inside
functions and under TYPE_CHECKING count.

import-linter's acyclic contract (pyproject.toml) checks siblings at every depth; a circle
through a package's own ``__init__`` (``pkg`` imports ``pkg.a``, which imports ``pkg``) is
between a package and its child, never two siblings, so that contract cannot see it. This
test sees every circle of the module graph, that one included.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's, without
    recursion): each is one or more import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append(
                        (other, iter(sorted(graph.find_modules_directly_imported_by(other))))
                    )
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in component:
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    lines.append(
                        f"  {importer} -> {imported} (line {detail['line_number']}: "
                        f"{detail['line_contents']})"
                    )
    return "\n".join(lines)


@pytest.mark.parametrize("package", ["gate_service", "gate_runner"])
def test_no_module_imports_itself_through_others(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(ROOT), f"{package} of another checkout"
    graph = grimp.build_graph(
        package,
        include_external_packages=False,
        exclude_type_checking_imports=False,
        cache_dir=None,
    )
    found = circles(graph)
    assert not found, "import circles:\n" + "\n\n".join(describe(graph, c) for c in found)


def test_the_search_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")  # through the package's own __init__
    graph.add_import(importer="pkg.a", imported="pkg")
    graph.add_import(importer="pkg.b", imported="pkg.c")  # one way only: no circle
    assert circles(graph) == [["pkg", "pkg.a"]]
