"""The real node's tests: the image built from the Dockerfile, running as pods on a kubelet.

One control plane with a real kubelet node (localcluster/node.py) serves the whole
package (``node_cluster``); the product is installed into it once (``product``), as a
user installs it. Only one real node runs on a host at a time: tests/node/test_host.py and
tests/node/test_gitops.py, which start and stop nodes of their own, run before the
package's node is started.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster.cluster import Cluster
from localcluster.image import Image
from localcluster.image import build as build_image
from localcluster.release import install_chart, product_values
from localcluster.webhook_host import make_certs

RELEASE, SYSTEM_NS = "gpu-scheduler", "gpu-scheduler-system"
# The real node's stand-in GPUs, under NVIDIA's own DRA driver and container runtime.
NODE_GPUS = 4
HERE = Path(__file__).resolve().parent
# Run first: they start and stop real nodes of their own (one real node per host at a time).
FIRST = ("test_host.py", "test_gitops.py")
# Runs last: it uninstalls the package's product.
LAST = "test_helm_uninstall_leaves_nothing_behind"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order this package's tests: those with nodes of their own first, the uninstall last (in place)."""
    idx = [i for i, it in enumerate(items) if Path(str(it.path)).parent == HERE]
    mine = [items[i] for i in idx]

    def key(it: pytest.Item) -> int:
        if Path(str(it.path)).name in FIRST:
            return 0
        return 2 if it.name == LAST else 1

    for i, it in zip(idx, sorted(mine, key=key), strict=True):
        items[i] = it


@pytest.fixture(scope="package")
def product_image() -> Image:
    """The image of this tree (built by `make image`, or here when the tree changed)."""
    return build_image()


@pytest.fixture(scope="package")
def node_cluster(tmp_path_factory: pytest.TempPathFactory, product_image: Image) -> Iterator[Cluster]:
    """kwok GPU nodes node1..node3 (4 GPUs each) and the real control-plane node holding the image,
    with NVIDIA's DRA driver and container runtime over :data:`NODE_GPUS` stand-in GPUs."""
    workdir = tmp_path_factory.mktemp("node-cluster")
    c = Cluster.start(
        workdir,
        gpu_nodes=3,
        gpus_per_node=4,
        real_node=True,
        images=[product_image.archive],
        # NVIDIA's DRA driver and container runtime over 4 stand-in GPUs (localcluster/nvidia_driver.py).
        nvidia_gpus=NODE_GPUS,
    )
    try:
        yield c
    finally:
        c.stop()


@dataclass(frozen=True)
class Product:
    cluster: Cluster
    image: Image
    certs: Path
    release: str = RELEASE
    namespace: str = SYSTEM_NS

    def values(self, **webhook: Any) -> dict[str, Any]:
        return product_values(self.image.ref, self.certs, **webhook)

    def pods(self, component: str | None = None) -> list[dict[str, Any]]:
        sel = f"app.kubernetes.io/instance={self.release}"
        if component:
            sel += f",app.kubernetes.io/component={component}"
        items = self.cluster.get_json("pods", "-n", self.namespace, "-l", sel).get("items", [])
        return [p for p in items if p["metadata"].get("deletionTimestamp") is None]

    def wait_serving(self, timeout: float = 180, webhook: bool = True) -> None:
        """Every Deployment of the release has all its replicas Ready, and the webhook Service has
        as many ready endpoints (``rollout status`` can answer from a status the controller has
        not updated yet, e.g. right after pods were force-deleted). ``webhook=False``: a release
        in injection.mode policy, with no webhook pods."""
        import time

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            # A read that failed ({}, no items) counts as not serving yet, never as no Deployments.
            deps = self.cluster.get_json(
                "deployments", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={self.release}"
            ).get("items") or [{"metadata": {"name": "?"}, "spec": {"replicas": 1}, "status": {}}]
            ready_pods = {
                p["metadata"]["labels"].get("app.kubernetes.io/component")
                for p in self.pods()
                if p["status"].get("phase") == "Running"
                and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
            }
            slices = self.cluster.get_json(
                "endpointslices",
                "-n",
                self.namespace,
                "-l",
                f"kubernetes.io/service-name={self.release}-webhook",
            ).get("items", [])
            ready_endpoints = sum(
                1
                for sl in slices
                for ep in sl.get("endpoints") or []
                if (ep.get("conditions") or {}).get("ready")
            )
            want_webhook = sum(
                d["spec"]["replicas"] for d in deps if d["metadata"]["name"].endswith("-webhook")
            )
            if (
                all((d["status"].get("readyReplicas") or 0) == d["spec"]["replicas"] for d in deps)
                and ready_endpoints == want_webhook
                and ready_pods >= ({"scheduler", "webhook"} if webhook else {"scheduler"})
            ):
                return
            last = f"deployments {[(d['metadata']['name'], d['status'].get('readyReplicas')) for d in deps]}, webhook endpoints ready {ready_endpoints}/{want_webhook}"
            time.sleep(1)
        raise AssertionError(
            f"the release is not serving after {timeout:.0f}s: {last}; {self.why_not_ready()}"
        )

    def why_not_ready(self) -> str:
        """Each pod of the release: its node, phase, and each container's waiting or terminated
        reason; then the namespace's last warning events (what a person would run kubectl for)."""
        rows = []
        for p in self.pods():
            states = [
                f"{c['name']}:{next(iter(c.get('state') or {'?': {}}))}"
                f"({((c.get('state') or {}).get('waiting') or (c.get('state') or {}).get('terminated') or {}).get('reason', '')})"
                for c in p["status"].get("containerStatuses") or []
            ]
            rows.append(
                f"{p['metadata']['name']} on {p['spec'].get('nodeName')}: {p['status'].get('phase')} {states}"
            )
        events = [
            e
            for e in self.cluster.get_json("events", "-n", self.namespace).get("items", [])
            if e.get("type") == "Warning"
        ]
        notes = [
            f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message', '')[:200]}"
            for e in events[-8:]
        ]
        return f"pods {rows or 'none'}; warnings {notes or 'none'}"

    def rollout(self, timeout: int = 180) -> None:
        for dep in self.cluster.kubectl(
            "get",
            "deployments",
            "-n",
            self.namespace,
            "-l",
            f"app.kubernetes.io/instance={self.release}",
            "-o",
            "name",
        ).stdout.split():
            self.cluster.kubectl("rollout", "status", "-n", self.namespace, dep, f"--timeout={timeout}s")


@pytest.fixture(scope="package")
def product(node_cluster: Cluster, product_image: Image, tmp_path_factory: pytest.TempPathFactory) -> Product:
    """gpu-scheduler-chart installed as a user does: scheduler and webhook pods on the real node."""
    certs = make_certs(
        tmp_path_factory.mktemp("certs") / "webhook", service=f"{RELEASE}-webhook", namespace=SYSTEM_NS
    )
    p = Product(node_cluster, product_image, certs)
    install_chart(node_cluster, RELEASE, SYSTEM_NS, p.values())
    p.rollout()
    p.wait_serving()
    return p


@pytest.fixture
def node_namespace(node_cluster: Cluster) -> Iterator[str]:
    name = f"n-{uuid.uuid4().hex[:8]}"
    node_cluster.kubectl("create", "namespace", name)
    node_cluster.wait_until(
        lambda: bool(node_cluster.get_json("serviceaccount", "default", "-n", name)),
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )
    try:
        yield name
    finally:
        node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# Releases pushed to a real OCI registry (tests/node/fixtures_release.py).
from tests.node.fixtures_release import (  # noqa: E402
    current_release,
    node_registry,
    previous_release,
    registry,
)

__all__ = ["current_release", "node_registry", "previous_release", "registry"]
