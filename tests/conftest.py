"""Shared fixtures: one local control plane per test session, a namespace per test.

Tests that touch the control plane use the ``cluster`` (or ``namespace``/``kube``)
fixture and are marked ``cluster`` automatically, so ``pytest -m 'not cluster'``
runs the fast suite alone. A test that starts a control plane otherwise (a command
that starts one, ``Cluster.start`` itself) carries the mark by hand: without it,
``Cluster.start`` refuses (``_unmarked_tests_start_no_control_plane``), here and in
every process the test starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import NO_CONTROL_PLANE, Cluster, versions
from localcluster.procs import GO_GC_ENV
from tests.support.kubeapi import create_namespace, delete_namespace

# The Go programs the tests run themselves (kubectl, helm, ctr) collect garbage as the local
# control plane's do (localcluster/procs.py): about a tenth less CPU for kubectl.
for _name, _value in GO_GC_ENV.items():
    os.environ.setdefault(_name, _value)

# Fixture modules of the components (tests/integration/fixtures_*.py), registered here.
# And each test's time budget (tests/support/budget.py); tests that run while no other worker
# runs one (tests/support/alone.py).
pytest_plugins = [
    *sorted(
        f"tests.integration.{p.stem}" for p in (Path(__file__).parent / "integration").glob("fixtures_*.py")
    ),
    "tests.support.budget",
    "tests.support.alone",
]

CLUSTER_FIXTURES = {"cluster", "namespace", "kube", "node_cluster", "product", "product_image"}
# A fresh install of the wheel (and its dependencies, from the index): make test runs these,
# make test-unit does not.
INSTALL_FIXTURES = {"wheel_venv", "image_venv"}


def pytest_sessionstart(session: pytest.Session) -> None:
    # A SIGTERM (CI timeout, `kill`) unwinds like Ctrl-C, so fixture finalizers stop
    # the control plane instead of leaving it running. pytest-xdist's controller runs no test:
    # it hands the signal on to its workers, which unwind so and then end the run.
    xdist_controller = bool(session.config.getoption("numprocesses", None)) and not hasattr(
        session.config, "workerinput"
    )

    def _interrupt(signum: int, frame: object) -> None:
        workers = _children() if xdist_controller else []
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if not workers:
            raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)


def _children() -> list[int]:
    """The processes this one started (pytest-xdist's workers, in the controller)."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(stat.parent.name))
    return found


# The tests that start the real kubelet node (one per host at a time): tests/node and these.
REAL_NODE_GROUP = "real-node"
REAL_NODE_MODULES = ("tests/integration/test_demo.py",)
# Its tests run one after another on one worker, the suite's longest unit (about 20 minutes): the
# wall time of `make test` is at least theirs, so they never wait for a test marked ``alone``.
BESIDE_ALONE = "the real node's tests, the suite's longest chain: waiting would lengthen the run"


# Tests that are one unit together, apart from their module's others (whose fixtures are then
# made once more on the worker that runs them), in order: the injection policy's four slowest,
# minutes of work beside the module's others. Two keep the apiserver's CPU busy for minutes (the
# 10,000 maps; the malformed 256 KiB maps, which take the map policy's full checks, seconds each
# against the create handler's fixed 34 s deadline): they are marked ``alone``
# (tests/support/alone.py) and run while no other worker runs a test (beside two others on 2
# cores, CI saw a 504 and the 10,000 maps take over 600 s). A well-formed 256 KiB map takes the
# policy's fast path (under 1 s): those two tests share the machine.
AT_SCALE = "tests/integration/test_injection_policy.py::at-scale"
GROUPS = {
    f"tests/integration/test_injection_policy.py::{name}": AT_SCALE
    for name in (
        "test_generated_maps_agree_with_the_parser",
        "test_the_largest_map_is_admitted_within_the_cost_limits",
        "test_the_largest_malformed_map_is_refused_by_the_policy",
        "test_a_256_kib_map_is_admitted_with_three_releases_side_by_side",
    )
}
# The units that take minutes, longest first (measured with --durations=0) but for the one that
# runs alone: each worker starts them first, so that the short units fill in around them
# (longest first, then the rest in collection order).
LONG_UNITS = (
    AT_SCALE,  # first: it runs alone, and the other workers' first tests are then not cut short
    REAL_NODE_GROUP,
    "tests/integration/test_argocd_real.py",
    "tests/integration/test_packaging.py",
    "tests/integration/test_bench_smoke.py",
    "tests/integration/test_trust.py",
    "tests/integration/test_dra.py",
    "tests/integration/test_day2_nodes.py",
)


def work_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs as a whole, in order: the test's module (its
    module-scoped fixtures are made once, and its tests may build on each other), for every
    test that starts the real kubelet node :data:`REAL_NODE_GROUP`, or its group in :data:`GROUPS`."""
    if nodeid in GROUPS:
        return GROUPS[nodeid]
    path = nodeid.split("::", 1)[0]
    return REAL_NODE_GROUP if path.startswith("tests/node/") or path in REAL_NODE_MODULES else path


def unit_rank(nodeid: str) -> int:
    """Where the test's unit comes in a worker's order: the long ones first, longest first."""
    unit = work_unit(nodeid)
    return LONG_UNITS.index(unit) if unit in LONG_UNITS else len(LONG_UNITS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` (``-n 2 --dist loadscope``): two workers, each with a control plane of its
    own, each taking a :func:`work_unit` at a time."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # The units in collection order, the long ones first (pytest_collection_modifyitems): the
    # longest unit starts at once, and the other workers take the rest meanwhile.
    config.option.loadscopereorder = False

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
        if INSTALL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.install)
        if work_unit(item.nodeid) == REAL_NODE_GROUP:
            item.add_marker(pytest.mark.beside_alone(reason=BESIDE_ALONE))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the long units first
        items.sort(key=lambda item: unit_rank(item.nodeid))


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_control_plane(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test without the ``cluster`` mark cannot start a control plane: ``make test-unit``
    (``-m 'not cluster'``) must not start one behind the mark's back."""
    if request.node.get_closest_marker("cluster") is None:
        monkeypatch.setenv(NO_CONTROL_PLANE, request.node.nodeid)


_SERVED_VERSION: list[str] = []


def pytest_report_header(config: pytest.Config) -> list[str]:
    v = versions()
    return [
        f"local control plane: kube-apiserver {v['KUBERNETES_VERSION']}, etcd {v['ETCD_VERSION']}, "
        f"kwok {v['KWOK_VERSION']}, helm {v['HELM_VERSION']} (pinned in tools/versions.env)"
    ]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SERVED_VERSION:
        terminalreporter.write_line(
            f"local control plane: the tests ran against kube-apiserver {_SERVED_VERSION[0]} (GET /version)"
        )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running control plane: etcd, kube-apiserver, KCM, kube-scheduler, kwok; node1..node3 with 4 GPUs."""
    workdir = tmp_path_factory.mktemp("cluster")
    c = Cluster.start(workdir, gpu_nodes=3, gpus_per_node=4)
    _SERVED_VERSION.append(json.loads(c.kubectl("get", "--raw", "/version").stdout)["gitVersion"])
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def namespace(cluster: Cluster, kube: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    create_namespace(kube, name)
    try:
        yield name
    finally:
        if os.environ.get("KEEP_NAMESPACES") != "1":
            delete_namespace(kube, name)


@pytest.fixture
def own_node(cluster: Cluster, namespace: str) -> Any:
    """``own_node(suffix, **kw)`` creates a kwok GPU node for this test only
    (named ``<namespace>-<suffix>``; ``kw``: ``Cluster.add_gpu_node``'s); deleted afterwards."""
    made: list[str] = []

    def make(suffix: str, wait: bool = True, **kw: Any) -> str:
        name = f"{namespace}-{suffix}"
        made.append(name)
        cluster.add_gpu_node(name, wait=wait, **kw)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Any:
    """An admin ``kubernetes.client.ApiClient`` for the control plane."""
    client = cluster.api_client()
    yield client
    client.close()
