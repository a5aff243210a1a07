"""The packages' import graph: the library imports none of its users, and nothing imports in a circle.

Every ``.py`` file under the product packages and the dev tooling is parsed with
:mod:`ast` (nothing is imported); each ``import``/``from ... import`` (at any
depth, relative ones resolved) adds an edge between the top-level packages of
the importing file and of the imported module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("gpu_scheduling", "scheduler", "webhook")
TOOLING = ("bench", "localcluster")
TOP = (*PRODUCT, *TOOLING, "tests")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[str]:
    """Every module name ``path`` imports, relative imports made absolute."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module


def package_graph() -> dict[str, set[str]]:
    """Top-level package -> the other top-level packages (of TOP) its modules import."""
    graph: dict[str, set[str]] = {p: set() for p in TOP}
    for top in TOP:
        for path in sorted((REPO / top).rglob("*.py")):
            for name in imported(path):
                target = name.split(".")[0]
                if target in TOP and target != top:
                    graph[top].add(target)
    return graph


def cycles(graph: dict[str, set[str]], nodes: tuple[str, ...]) -> list[list[str]]:
    """Every elementary cycle among ``nodes`` (small graphs: a depth-first search from each node)."""
    found: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph[path[-1]] & set(nodes)):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in nodes:
        walk([start])
    return found


def test_every_package_is_walked() -> None:
    for top in TOP:
        assert (REPO / top / "__init__.py").is_file(), top


def test_the_product_packages_import_in_no_circle() -> None:
    assert cycles(package_graph(), PRODUCT) == []


def test_the_library_imports_none_of_its_users() -> None:
    assert package_graph()["gpu_scheduling"] == set()


def test_the_product_imports_no_dev_tooling_and_no_tests() -> None:
    graph = package_graph()
    for top in PRODUCT:
        assert graph[top] & {*TOOLING, "tests"} == set(), top


def test_bench_imports_nothing_from_tests() -> None:
    assert "tests" not in package_graph()["bench"]


def test_the_walk_sees_relative_and_nested_imports() -> None:
    # The graph is only as good as the parser: a relative import and one inside a function count.
    src = REPO / "gpu_scheduling" / "check" / "cli.py"
    names = set(imported(src))
    assert any(n.startswith("gpu_scheduling.") for n in names)
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}, ("a", "b", "c")) == [["a", "b", "a"]]
