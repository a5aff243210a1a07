"""The import graph: the layers of ``kube_gpu_scheduler`` and of the dev tooling (``localcluster``,
``bench``) as pyproject.toml declares them, no import cycle between any two modules of any of
them, and no product code importing the dev tooling.

The contracts (which layer may import which) live in one place, ``[tool.importlinter]`` in
pyproject.toml, and are checked here by import-linter itself (``lint-imports``). A layers
contract does not see a cycle inside one layer, so the module graph is also walked with
:mod:`ast` (every ``import`` at any depth, ``TYPE_CHECKING`` ones too, relative ones resolved)
and searched for strongly connected components.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PRODUCT = "kube_gpu_scheduler"
TOOLING = ("bench", "localcluster")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = REPO) -> Iterator[str]:
    """Every name ``path`` imports (``from a import b`` yields ``a.b``), relative ones made absolute."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]
                )
            # ``from a import b``: the module a.b when there is one, else a (resolve() decides).
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph(root: Path = REPO, top: str = PRODUCT) -> dict[str, set[str]]:
    """Module -> the modules of ``top`` it imports (a name resolves to the longest module it names)."""
    modules = {module_name(p, root): p for p in sorted((root / top).rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {resolve(n) for n in imported(path, root) if n.split(".")[0] == top}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the strongly connected ``component``, in import order, its first module
    again at the end (``a -> b -> a``): what a failure names."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first from start, inside the component, back to start
        nxt = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if target in members and target not in came_from:
                    came_from[target] = node
                    nxt.append(target)
        frontier = nxt
    raise ValueError(f"{component} is not a cycle")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def declared_contracts() -> list[dict[str, object]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_declared_contracts_are_kept() -> None:
    res = lint_imports(REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    # Every declared contract ran (a contract that is silently not loaded keeps nothing).
    declared = declared_contracts()
    assert {
        "layers",
        "scheduler-wings",
        "pure-domain",
        "tooling-apart",
        "localcluster-layers",
        "bench-layers",
    } <= {c["id"] for c in declared}
    assert f"Contracts: {len(declared)} kept, 0 broken." in res.stdout, res.stdout[-2000:]


def planted_copy(tmp_path: Path) -> None:
    """pyproject.toml and every root package of its contracts, copied under ``tmp_path``."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for top in (PRODUCT, *TOOLING):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))


# Each import planted into a copy of the tree, and the contract it must break. All are planted in
# one copy and linted once (import-linter reports every broken contract with each illegal import
# and its line): one run instead of one per plant.
PLANTS: list[tuple[str, str, str]] = [
    # the library importing a program
    (
        "kube_gpu_scheduler/domain/schedmap.py",
        "from kube_gpu_scheduler.scheduler.placing import core",
        "layers",
    ),
    # one program importing another
    ("kube_gpu_scheduler/webhook/nodes.py", "from kube_gpu_scheduler.check import results", "layers"),
    ("kube_gpu_scheduler/certs/cli.py", "from kube_gpu_scheduler.webhook import app", "layers"),
    # base knowing of the domain
    ("kube_gpu_scheduler/base/logs.py", "from kube_gpu_scheduler.domain import schedmap", "layers"),
    # the domain doing I/O
    ("kube_gpu_scheduler/domain/fit.py", "import urllib3", "pure-domain"),
    # the scheduler's wings: arrows upward, and two features that must not know each other
    (
        "kube_gpu_scheduler/scheduler/state/ledger.py",
        "from kube_gpu_scheduler.scheduler.placing import core",
        "scheduler-wings",
    ),
    (
        "kube_gpu_scheduler/scheduler/runtime/settings.py",
        "from kube_gpu_scheduler.scheduler.state import ledger",
        "scheduler-wings",
    ),
    (
        "kube_gpu_scheduler/scheduler/dra/controller.py",
        "from kube_gpu_scheduler.scheduler.gang import gangs",
        "scheduler-wings",
    ),
    (
        "kube_gpu_scheduler/scheduler/report/events.py",
        "from kube_gpu_scheduler.scheduler.rollout import eviction",
        "scheduler-wings",
    ),
    # the product importing the dev tooling or the tests
    ("kube_gpu_scheduler/base/argtypes.py", "import localcluster.procs", "tooling-apart"),
    ("kube_gpu_scheduler/kube/client.py", "from bench import raw", "tooling-apart"),
    ("kube_gpu_scheduler/domain/resources.py", "from tests import conftest", "tooling-apart"),
    # localcluster importing the bench
    ("localcluster/node.py", "from bench import raw", "localcluster-apart-from-bench"),
    # a part of the Cluster importing the Cluster (the cycle nvidia_driver <-> cluster was)
    ("localcluster/nvidia_driver.py", "from localcluster.cluster import Cluster", "localcluster-layers"),
    # a building block knowing the clients; the Cluster knowing a demo
    ("localcluster/procs.py", "from localcluster import clients", "localcluster-layers"),
    ("localcluster/cluster.py", "from localcluster import demo", "localcluster-layers"),
    # a phase importing the run, a report section importing the ratios (the five-module loop was)
    ("bench/tenancy.py", "from bench.runner import Bench", "bench-layers"),
    ("bench/drareport.py", "from bench.ratios import median", "bench-layers"),
    # the statistics knowing the ratios; the arms knowing the results record
    ("bench/stats.py", "from bench import ratios", "bench-layers"),
    ("bench/arms.py", "from bench.scales import Results", "bench-layers"),
]


def test_every_planted_import_breaks_its_contract(tmp_path: Path) -> None:
    planted_copy(tmp_path)
    where: dict[tuple[str, str], int] = {}
    for module, planted, _ in PLANTS:
        target = tmp_path / module
        assert (REPO / module).is_file(), module
        text = target.read_text() + f"\n\n{planted}  # noqa\n"
        target.write_text(text)
        where[(module, planted)] = len(text.splitlines())
    res = lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout[-2000:]
    out = " ".join(res.stdout.split())
    names = {c["id"]: c["name"] for c in declared_contracts()}
    assert {contract for *_, contract in PLANTS} == set(names), "a contract no plant breaks"
    for module, planted, contract in PLANTS:
        assert f"{names[contract]} BROKEN" in out, (contract, res.stdout[-3000:])
        importer = module.removesuffix(".py").replace("/", ".")
        # import-linter names each illegal import by its importer and its line.
        assert f"{importer} -> " in out and f"(l.{where[(module, planted)]}" in out, (
            module,
            planted,
            res.stdout[-3000:],
        )


@pytest.mark.parametrize("top", [PRODUCT, *TOOLING, "tests"])
def test_no_two_modules_import_each_other(top: str) -> None:
    graph = module_graph(top=top)
    assert len(graph) > 5, f"no modules found in {top}"
    # Each strongly connected set of modules, named by one loop through it and all its members.
    found = [
        f"{' -> '.join(loop(graph, component))} (the modules that import each other: {', '.join(component)})"
        for component in cycles(graph)
    ]
    assert not found, (
        f"import cycles in {top} (every import counts, lazy and TYPE_CHECKING ones too): "
        + "; ".join(found)
        + ". Cut each by moving what both sides need into a lower module."
    )


def test_the_cycle_search_finds_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.sub import b\n")
    # A TYPE_CHECKING import, relative, inside a block: still an edge.
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n"
    )
    (pkg / "c.py").write_text("import p.a\n")
    graph = module_graph(tmp_path, "p")
    assert cycles(graph) == [["p.a", "p.sub.b"]]
    assert loop(graph, ["p.a", "p.sub.b"]) == ["p.a", "p.sub.b", "p.a"]
    assert loop({"x": {"y"}, "y": {"z", "x"}, "z": {"x"}}, ["x", "y", "z"]) == ["x", "y", "x"]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_the_product_imports_no_dev_tooling_and_no_tests() -> None:
    for path in sorted((REPO / PRODUCT).rglob("*.py")):
        tops = {name.split(".")[0] for name in imported(path)}
        assert tops & {*TOOLING, "tests"} == set(), path


def test_bench_imports_nothing_from_tests() -> None:
    for path in sorted((REPO / "bench").rglob("*.py")):
        assert "tests" not in {name.split(".")[0] for name in imported(path)}, path


def test_one_top_level_package_ships() -> None:
    """What pyproject.toml packages: kube_gpu_scheduler and its subpackages, nothing else."""
    import tomllib

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == [f"{PRODUCT}*"]
    for old in ("gpu_scheduling", "scheduler", "webhook"):
        assert not list((REPO / old).rglob("*.py")), f"{old}/ is back at the top of the checkout"
