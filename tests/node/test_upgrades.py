"""Our own chart on day 2: ``helm upgrade`` and ``helm rollback`` of the product while replicas
are being placed, on the real node (the image from our Dockerfile, as the chart's pods).

Each test installs a fresh release (so ``helm rollback <release> 1`` goes back to where it
started), then runs a burst through the transition: a StatefulSet of 12 mapped replicas (every
GPU of the three kwok nodes) scaled up one replica at a time, down to 0 and up again, for as long
as the transition lasts, while

- ``BoundSampler`` lists the replicas every 0.2 s: a bound replica carries exactly its map entry's
  devices on its entry's node, and no GPU is held by two bound pods;
- ``AdmissionProbe`` admits a mapped pod (``--dry-run=server``) again and again: what the
  apiserver's admission chain gives a mapped pod at each moment, with no controller or
  scheduler in between (the StatefulSet's pods may be replaced before a sample sees them).

At the end every replica is placed with its devices, and no pod seen without them runs.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from localcluster.cluster import Cluster
from localcluster.image import Image
from localcluster.publish import Release as Published
from localcluster.registry import Registry
from localcluster.release import REPO, SCHEDULER_CHART, install_chart, product_values, release_status
from localcluster.webhook_host import make_certs
from tests.node.conftest import RELEASE, SYSTEM_NS, Product
from tests.node.test_product import BoundSampler, _dry_run_pod, _env, _expected, _pods, _statefulset
from tests.support.waiting import wait_for

ENTRIES = [f"{i}=node{i // 4 + 1}:{i % 4}" for i in range(12)]


@dataclass(frozen=True)
class Release:
    """The release these tests install, upgrade and roll back (the package's product's name)."""

    cluster: Cluster
    image: Image
    certs: Path

    @property
    def product(self) -> Product:
        return Product(self.cluster, self.image, self.certs)

    def values(self, mode: str, **extra: Any) -> dict[str, Any]:
        """The chart's values in ``mode``, always explicit (never the chart's defaults)."""
        if mode == "webhook":
            values = product_values(self.image.ref, self.certs)
            values["webhook"]["enabled"] = True
        else:
            values = product_values(self.image.ref)
            values["webhook"] = {"enabled": False}
        values["injection"] = {"mode": mode}
        for key, value in extra.items():
            values.setdefault(key, {}).update(value)
        return values

    def install(self, mode: str, chart: str | Path = SCHEDULER_CHART) -> None:
        """A fresh release (revision 1), serving."""
        self.uninstall()
        install_chart(self.cluster, RELEASE, SYSTEM_NS, self.values(mode), chart)
        self.product.wait_serving(webhook=mode == "webhook")

    def from_registry(self, release: Published, values: dict[str, Any], *, install: bool = False) -> None:
        """``helm install`` (a fresh revision 1) or ``helm upgrade`` to ``oci://.../gpu-scheduler
        --version <release>``, with ``values`` and the chart's own image (pulled by digest)."""
        if install:
            self.uninstall()
        values = {k: v for k, v in values.items() if k != "image"}
        chart = release.charts["gpu-scheduler"]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(values, f)
            f.flush()
            self.cluster.helm(
                "install" if install else "upgrade", RELEASE, chart.ref, "--version", chart.version,
                "--plain-http", "-n", SYSTEM_NS, "-f", f.name, *(["--create-namespace"] if install else []),
            )  # fmt: skip

    def image_ids(self) -> set[str]:
        """The images (by digest) the release's ready pods run."""
        return {
            cs["imageID"]
            for p in self.product.pods()
            for cs in p["status"].get("containerStatuses") or []
            if cs.get("ready")
        }

    def uninstall(self) -> None:
        if release_status(self.cluster, RELEASE, SYSTEM_NS) is not None:
            self.cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "120s")

    def helm(self, *args: str) -> None:
        self.cluster.helm(*args, "-n", SYSTEM_NS)

    def policy_active(self, namespace: str) -> bool:
        """The apiserver runs the release's MutatingAdmissionPolicy: a mapped replica admitted now
        (dry run) counts in its ``apiserver_mutating_admission_policy_check_total`` (one
        apiserver here; with several, each has its own count)."""

        def checks() -> float:
            raw = self.cluster.kubectl("get", "--raw", "/metrics").stdout
            mine = f'policy="{RELEASE}-inject"'
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in raw.splitlines()
                if line.startswith("apiserver_mutating_admission_policy_check_total{") and mine in line
            )

        before = checks()
        _dry_run_pod(self.cluster, namespace, int(time.monotonic() * 1000))
        return checks() > before

    def webhook_reached(self, namespace: str) -> bool:
        """The apiserver reaches the webhook through its Service: a mapped replica admitted now
        (dry run) is in a webhook pod's log (Ready pods should be reached; this proves it)."""
        pod = _dry_run_pod(self.cluster, namespace, int(time.monotonic() * 1000))
        name = f"{namespace}/{pod['metadata']['name']}"
        logs = self.cluster.kubectl(
            "logs", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=webhook", "--tail=-1", check=False
        ).stdout
        return name in logs

    def history(self) -> list[tuple[int, str]]:
        out = self.cluster.helm("history", RELEASE, "-n", SYSTEM_NS, "-o", "json").stdout
        return [(r["revision"], r["description"]) for r in json.loads(out)]


@pytest.fixture(scope="module")
def release(
    node_cluster: Cluster, product_image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    """The node's release, ours for this module: the package's product (if installed) is
    uninstalled first and installed again after, as its tests expect it."""
    certs = make_certs(
        tmp_path_factory.mktemp("upgrade-certs") / "webhook",
        service=f"{RELEASE}-webhook",
        namespace=SYSTEM_NS,
    )
    rel = Release(node_cluster, product_image, certs)
    had_product = release_status(node_cluster, RELEASE, SYSTEM_NS) is not None
    try:
        yield rel
    finally:
        if had_product:
            rel.install("webhook")
        else:
            rel.uninstall()


class AdmissionProbe(threading.Thread):
    """Admits a mapped replica (ordinal 1 of a map giving it node2:1,2) with --dry-run=server
    again and again: each result is the devices the apiserver gave it, or the error."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace = cluster, namespace
        self.results: list[tuple[float, str | None]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self._stop_evt.is_set():
            i += 1
            try:
                got = _env(_dry_run_pod(self.cluster, self.namespace, i)).get("CUDA_VISIBLE_DEVICES")
            except Exception as e:  # an admission error is a result too
                got = f"error: {e}"
            self.results.append((time.monotonic(), got))
            self._stop_evt.wait(0.1)  # about as often as a kubectl process a time made them

    def without_devices(self) -> list[tuple[float, str | None]]:
        return [r for r in self.results if r[1] != "1,2"]

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=60)


class ScaleBurst(threading.Thread):
    """Scales the StatefulSet "burst" up one replica at a time to 12, down to 0, and up again,
    until stopped; then to 12, where it stays."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace = cluster, namespace
        self.scales = 0
        self.cycles = 0
        self._stop_evt = threading.Event()

    def _scale(self, n: int) -> None:
        # `kubectl scale`, through the API client (hundreds of them: a process each cost more).
        with contextlib.suppress(client.ApiException):
            client.AppsV1Api(self.cluster.admin_api()).patch_namespaced_stateful_set_scale(
                "burst", self.namespace, {"spec": {"replicas": n}}, _preload_content=False
            )
        self.scales += 1

    def run(self) -> None:
        while not self._stop_evt.is_set():
            for n in range(1, 13):
                if self._stop_evt.is_set():
                    break
                self._scale(n)
                self._stop_evt.wait(0.3)
            if self._stop_evt.is_set():
                break
            self._stop_evt.wait(1)
            self._scale(0)
            self.cycles += 1
            self._stop_evt.wait(1)
        self._scale(12)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=60)


class Transition:
    """The burst, the sampler and the probe around a sequence of helm commands."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        spec = _statefulset("burst", ENTRIES, replicas=0)
        cluster.apply({**spec, "metadata": {"name": "burst", "namespace": namespace}})
        self.sampler = BoundSampler(cluster, namespace, ENTRIES)
        self.probe = AdmissionProbe(cluster, namespace)
        self.burst = ScaleBurst(cluster, namespace)
        self.marks: list[tuple[float, str]] = []

    def mark(self, step: str) -> None:
        """A helm step starts now: admissions are reported by the step they fell in."""
        self.marks.append((time.monotonic(), step))

    def without_devices(self) -> list[str]:
        """The probe's admissions without devices, each with the step it fell in and when."""
        out = []
        for ts, got in self.probe.without_devices():
            step = [(t0, name) for t0, name in self.marks if t0 <= ts]
            t0, name = step[-1] if step else (ts, "before")
            out.append(f"{name} +{ts - t0:.2f}s: {got}")
        return out

    def __enter__(self) -> Transition:
        self.sampler.start()
        self.probe.start()
        self.burst.start()
        wait_for(lambda: self.burst.scales >= 3, timeout=60, what="the burst under way")
        return self

    def __exit__(self, *exc: object) -> None:
        self.burst.stop()
        self.probe.stop()
        try:
            if exc[0] is None:
                wait_for(
                    self.all_placed, timeout=240, interval=1, what="all 12 replicas placed with their devices"
                )
        finally:
            self.sampler.stop()

    def all_placed(self) -> bool:
        pods = _pods(self.cluster, self.namespace, "app=burst")
        expected = _expected(ENTRIES)
        return len(pods) == 12 and all(
            p["status"].get("phase") == "Running"
            and p["metadata"].get("deletionTimestamp") is None
            and (p["spec"].get("nodeName"), _env(p).get("CUDA_VISIBLE_DEVICES"))
            == expected[int(p["metadata"]["name"].rsplit("-", 1)[1])]
            for p in pods
        )

    def settle(self, cycles: int = 1) -> None:
        """Let the burst run ``cycles`` more full cycles (placements under the new release)."""
        until = self.burst.cycles + cycles
        wait_for(lambda: self.burst.cycles >= until, timeout=180, interval=1, what=f"{cycles} burst cycle(s)")

    def check(self) -> None:
        """What must hold whatever the transition: asserted on every sample, and at the end."""
        assert self.sampler.samples > 20, f"the transition was watched {self.sampler.samples} times only"
        assert self.burst.cycles >= 2, self.burst.cycles
        assert self.sampler.violations == [], self.sampler.violations[:10]
        running = {p["metadata"]["uid"] for p in _pods(self.cluster, self.namespace, "app=burst")}
        assert not running & self.sampler.unmutated.keys(), "a pod admitted without its devices is running"
        assert len(self.probe.results) > 20, f"only {len(self.probe.results)} admissions were probed"


@pytest.mark.slow(
    reason="two releases pushed to the registry, pulled by the kubelet, upgraded and rolled back under a burst",
    budget=300,
)
def test_helm_upgrade_from_the_previous_release_and_rollback_under_a_burst(
    release: Release,
    node_registry: Registry,
    previous_release: Published,
    current_release: Published,
    node_namespace: str,
) -> None:
    """N-1 and N as users get them: both pushed to a registry (fixtures_release.py), installed
    and upgraded from it (``oci://``), each chart with its own image, pulled by digest."""
    assert previous_release.version != current_release.version
    release.from_registry(previous_release, release.values("webhook"), install=True)
    release.product.wait_serving()

    def runs(published: Published) -> bool:
        ids = release.image_ids()
        return bool(ids) and all(i.endswith(published.digest) for i in ids)

    wait_for(
        lambda: runs(previous_release), timeout=120, what=f"the pods on {previous_release.version}'s image"
    )
    with Transition(release.cluster, node_namespace) as t:
        # N, with values that roll both Deployments (as a new image does anyway).
        t.mark("upgrade")
        release.from_registry(
            current_release,
            release.values("webhook", scheduler={"logLevel": "DEBUG"}, webhook={"logLevel": "DEBUG"}),
        )
        release.product.rollout()
        release.product.wait_serving()
        wait_for(
            lambda: runs(current_release), timeout=180, what=f"the pods on {current_release.version}'s image"
        )
        t.settle()
        t.mark("rollback")
        release.helm("rollback", RELEASE, "1")
        release.product.rollout()
        release.product.wait_serving()
        wait_for(
            lambda: runs(previous_release), timeout=180, what=f"the pods back on {previous_release.version}'s"
        )
        t.settle()
    t.check()
    missing = t.without_devices()
    assert missing == [], (
        f"{len(missing)} of {len(t.probe.results)} admissions without devices: {missing[:5]}"
    )
    assert t.sampler.unmutated == {}, t.sampler.unmutated
    assert [r for r, _ in release.history()] == [1, 2, 3], release.history()
    charts = json.loads(release.cluster.helm("history", RELEASE, "-n", SYSTEM_NS, "-o", "json").stdout)
    assert [c["chart"] for c in charts] == [
        f"gpu-scheduler-{previous_release.version}",
        f"gpu-scheduler-{current_release.version}",
        f"gpu-scheduler-{previous_release.version}",
    ]


@pytest.mark.slow(reason="helm upgrade and rollback on the real node under a burst", budget=240)
def test_helm_upgrade_from_webhook_to_policy_in_one_step_and_rollback_under_a_burst(
    release: Release, node_namespace: str
) -> None:
    release.install("webhook")
    with Transition(release.cluster, node_namespace) as t:
        t.mark("upgrade to policy")
        release.helm(
            "upgrade",
            RELEASE,
            str(REPO / SCHEDULER_CHART),
            "--reuse-values",
            "--set",
            "injection.mode=policy,webhook.enabled=false",
        )
        release.product.wait_serving(webhook=False)
        t.settle()
        t.mark("rollback to webhook")
        release.helm("rollback", RELEASE, "1")
        release.product.rollout()
        release.product.wait_serving()
        t.settle()
    # The window of a one-step switch (measured: 0-2 probes at the upgrade, every probe for
    # 30-40 s at the rollback while the new webhook pods start; docs/injection.md): pods are
    # admitted without devices, and the guarantee is that none is bound so.
    window = t.without_devices()
    assert window, "no admission without devices: the one-step switch did not exercise the guarantee"
    t.check()
    assert [r for r, _ in release.history()] == [1, 2, 3], release.history()


@pytest.mark.slow(reason="four helm upgrades on the real node, each rolling the pods", budget=300)
def test_helm_upgrade_from_webhook_to_policy_in_two_steps_and_back_admits_nothing_without_devices(
    release: Release, node_namespace: str
) -> None:
    """The migration of docs/injection.md: each step adds or removes one injector while the other
    is known to be working, so at every moment one of them injects."""
    release.install("webhook")
    # Its pods Ready is not the apiserver reaching them through the Service (kube-proxy's rules
    # follow the endpoints): the starting state is a webhook that injects, proven, before the probe.
    wait_for(
        lambda: release.webhook_reached(node_namespace),
        timeout=180,
        interval=2,
        what="the webhook reached",
    )
    chart = str(REPO / SCHEDULER_CHART)
    with Transition(release.cluster, node_namespace) as t:
        t.mark("1: add the policy")
        release.helm("upgrade", RELEASE, chart, "--reuse-values", "--set", "injection.mode=policy")
        release.product.wait_serving()
        wait_for(lambda: release.policy_active(node_namespace), timeout=60, what="the policy active")
        t.settle()
        t.mark("2: remove the webhook")
        release.helm("upgrade", RELEASE, chart, "--reuse-values", "--set", "webhook.enabled=false")
        release.product.wait_serving(webhook=False)
        t.settle()
        t.mark("back 1: rollback to 2, the webhook added")
        release.helm("rollback", RELEASE, "2")
        release.product.rollout()
        release.product.wait_serving()
        wait_for(
            lambda: release.webhook_reached(node_namespace),
            timeout=180,
            interval=2,
            what="the webhook reached",
        )
        t.settle()
        t.mark("back 2: rollback to 1, the policy removed")
        release.helm("rollback", RELEASE, "1")
        release.product.wait_serving()
        t.settle()
    t.check()
    missing = t.without_devices()
    assert missing == [], (
        f"{len(missing)} of {len(t.probe.results)} admissions without devices: {missing[:5]}"
    )
    assert t.sampler.unmutated == {}, t.sampler.unmutated
    assert [r for r, _ in release.history()] == [1, 2, 3, 4, 5], release.history()
