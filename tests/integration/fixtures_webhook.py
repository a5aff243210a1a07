"""Fixtures that put the real webhook in front of the real kube-apiserver.

* ``webhook_certs`` (session): CA and serving certificate from generate-webhook-certs.py, SAN 127.0.0.1.
* ``webhook_server`` (session): ``gpu-scheduler-webhook`` as a host process on 127.0.0.1, reading
  nodes with the chart's webhook ServiceAccount, which may only list and watch them.
* ``webhook_configs`` (per test): Mutating- and ValidatingWebhookConfigurations pointing at
  ``https://127.0.0.1:PORT`` with the caBundle, limited to the test's namespace and to objects
  carrying the annotation; waits until the apiserver really calls them; deleted afterwards.

``start_webhook`` and ``register_webhooks`` are there for tests that need another webhook process
(other settings) or only one of the two configurations.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.admission import POD_CREATE_RULE
from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.rbac import chart_identity
from localcluster.webhook_host import ca_bundle, make_certs, run_webhook
from tests.support.waiting import wait_for

ANNOTATION = "gpu-scheduling-map"
POD_CONDITION = f"has(object.metadata.annotations) && '{ANNOTATION}' in object.metadata.annotations"
STATEFULSET_CONDITION = (
    "(has(object.spec.template.metadata) && has(object.spec.template.metadata.annotations) && "
    f"'{ANNOTATION}' in object.spec.template.metadata.annotations) || "
    f"(has(object.metadata.annotations) && '{ANNOTATION}' in object.metadata.annotations)"
)
# As the chart's: this scheduler's objects (gpu-scheduler, the webhook's default) and the maps no
# scheduler reads, never another named scheduler's (tests/unit/chart/test_chart_scheduler.py
# keeps the chart's the same).
POD_SCHEDULER_CONDITION = (
    "object.?spec.?schedulerName.orValue('') in ['gpu-scheduler', '', 'default-scheduler']"
)
STATEFULSET_SCHEDULER_CONDITION = (
    "object.?spec.?template.?spec.?schedulerName.orValue('') in ['gpu-scheduler', '', 'default-scheduler']"
)
# The probe map: replica 0 on node1 (a node of the session cluster) with GPU 3.
PROBE_MAP = "0=node1:3\n"


@dataclass
class WebhookServer:
    proc: ManagedProcess
    port: int
    certs: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_bundle(self) -> str:
        return ca_bundle(self.certs)


@pytest.fixture(scope="session")
def webhook_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("webhook") / "certs")


@pytest.fixture(scope="session")
def webhook_kubeconfig(cluster: Cluster) -> Iterator[Path]:
    """A kubeconfig for the chart's webhook ServiceAccount (nodes list/watch, nothing else:
    the RBAC gpu-scheduler-chart renders, read by localcluster/rbac.py)."""
    ns = f"webhook-host-{uuid.uuid4().hex[:6]}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        with chart_identity(cluster, ns, "webhook", f"wh-{ns}") as ident:
            yield ident.kubeconfig
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@contextlib.contextmanager
def start_webhook(
    certs: Path, log_dir: Path, kubeconfig: Path | None, env: Mapping[str, str] | None = None
) -> Iterator[WebhookServer]:
    port = free_port()
    # No kubeconfig: none at all (not the caller's $KUBECONFIG), so node look-ups are skipped.
    full_env = {"WEBHOOK_LOG_LEVEL": "DEBUG", "KUBECONFIG": str(kubeconfig or ""), **(env or {})}
    proc = run_webhook(certs, port, env=full_env, log_path=log_dir / f"webhook-{port}.log")
    try:
        if kubeconfig is not None:
            # Node warnings are skipped until the node cache has listed the nodes (started by the
            # /readyz probes run_webhook made): wait for it, so that tests see them from the start.
            wait_for(lambda: "node cache synced" in proc.log_text(), 60, what="the webhook's node cache")
        yield WebhookServer(proc, port, certs)
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def webhook_server(
    webhook_certs: Path, webhook_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookServer]:
    with start_webhook(webhook_certs, tmp_path_factory.mktemp("webhook-logs"), webhook_kubeconfig) as server:
        yield server


def webhook_configurations(name: str, namespace: str, server: WebhookServer) -> tuple[dict, dict]:
    """The two configurations for ``server``, limited to ``namespace`` (as a test's isolation)."""
    common = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 10,
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    }
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "mutate-pods.gpu-scheduler.io",
                **common,
                "reinvocationPolicy": "IfNeeded",
                "clientConfig": {"url": f"{server.url}/mutate", "caBundle": server.ca_bundle},
                "rules": [POD_CREATE_RULE],
                "matchConditions": [
                    {"name": "has-gpu-scheduling-map", "expression": POD_CONDITION},
                    {"name": "for-this-scheduler-or-none", "expression": POD_SCHEDULER_CONDITION},
                ],
            }
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "validate-statefulsets.gpu-scheduler.io",
                **common,
                "clientConfig": {"url": f"{server.url}/validate", "caBundle": server.ca_bundle},
                "rules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["statefulsets"],
                        "scope": "Namespaced",
                    }
                ],
                "matchConditions": [
                    {"name": "has-gpu-scheduling-map", "expression": STATEFULSET_CONDITION},
                    {"name": "for-this-scheduler-or-none", "expression": STATEFULSET_SCHEDULER_CONDITION},
                ],
            }
        ],
    }
    return mutating, validating


def _probe_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe-0", "namespace": namespace, "annotations": {ANNOTATION: PROBE_MAP}},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "busybox"}]},
    }


def _probe_statefulset(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "replicas": 0,
            "serviceName": "probe",
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}, "annotations": {ANNOTATION: "not a map"}},
                # The webhook's own scheduler: only its maps are parsed (and refused).
                "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }


def _mutating_live(cluster: Cluster, namespace: str) -> bool:
    res = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps(_probe_pod(namespace)),
        check=False,
    )
    if res.returncode != 0:
        return False
    env = json.loads(res.stdout)["spec"]["containers"][0].get("env") or []
    return {"name": "CUDA_VISIBLE_DEVICES", "value": "3"} in env or {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "value": "3",
    } in env


def _validating_live(cluster: Cluster, namespace: str) -> bool:
    res = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(_probe_statefulset(namespace)), check=False
    )
    return res.returncode != 0 and "validate-statefulsets.gpu-scheduler.io" in res.stderr


@contextlib.contextmanager
def register_webhooks(
    cluster: Cluster, namespace: str, server: WebhookServer, *, mutate: bool = True, validate: bool = True
) -> Iterator[str]:
    """Create the configurations, wait until the apiserver calls them (dry-run probes), delete after."""
    name = f"gpu-scheduler-it-{namespace}"
    mutating, validating = webhook_configurations(name, namespace, server)
    kinds = []
    if mutate:
        cluster.apply(mutating)
        kinds.append("mutatingwebhookconfiguration")
    if validate:
        cluster.apply(validating)
        kinds.append("validatingwebhookconfiguration")
    try:
        if mutate:
            wait_for(lambda: _mutating_live(cluster, namespace), 60, what="the mutating webhook to be called")
        if validate:
            wait_for(
                lambda: _validating_live(cluster, namespace), 60, what="the validating webhook to be called"
            )
        yield name
    finally:
        for kind in kinds:
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)


@pytest.fixture
def webhook_configs(cluster: Cluster, namespace: str, webhook_server: WebhookServer) -> Iterator[str]:
    with register_webhooks(cluster, namespace, webhook_server) as name:
        yield name


def dump(manifest: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(manifest), sort_keys=False)


def kubectl_apply(cluster: Cluster, manifest: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """``kubectl apply`` as a user runs it: rc, stdout and stderr (where ``Warning:`` lines go)."""
    return cluster.kubectl("apply", "-f", "-", input=dump(manifest), check=False)
