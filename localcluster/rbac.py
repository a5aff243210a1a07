"""The chart's RBAC for processes the tests and ``make bench`` run on the host.

RBAC is written once, in ``gpu-scheduler-chart/templates/rbac.yaml``. The tests and
the bench never restate it: :func:`render_rbac` renders the chart with ``helm template`` for the test's
release and namespace, :func:`component_objects` keeps the ServiceAccount, roles and
bindings of one component (label ``app.kubernetes.io/component``: ``scheduler``,
``webhook`` or, in extender mode, ``kube-scheduler``), and :func:`chart_identity` applies them to the local control plane and
yields a kubeconfig holding a token of that ServiceAccount
(``Cluster.service_account_kubeconfig``), removing the cluster-scoped objects afterwards.
:func:`scheduler_chart_values` are the values the tests and the bench install the
scheduler's RBAC with (ServiceAccount :data:`SCHEDULER_SA`, Lease :data:`LEASE_NAME`).
"""

from __future__ import annotations

import base64
import contextlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.clients import load_manifests
from localcluster.cluster import Cluster
from localcluster.release import REPO, SCHEDULER_CHART

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENTS = ("scheduler", "webhook", "kube-scheduler")
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding")
# The URL and CA only let the chart render the webhook's objects; nothing calls them.
_PLACEHOLDER_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").decode()
BASE_VALUES: dict[str, Any] = {
    "replicaCount": 0,
    "webhook": {"enabled": True, "url": "https://127.0.0.1:1", "caBundle": _PLACEHOLDER_CA},
}

# What the chart's injection.mode auto and policy look for in helm's capabilities.
MUTATING_POLICY_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
# resource.k8s.io/v1 (DRA, Kubernetes >= 1.34): what dra.enabled needs.
DRA_API = "resource.k8s.io/v1/ResourceClaim"

SCHEDULER_SA = "gpu-scheduler"
# The scheduler's default Lease name (kube_gpu_scheduler/scheduler/runtime/settings.py), which the chart's Role names.
LEASE_NAME = "gpu-scheduler"


def scheduler_chart_values(scheduler_name: str = "gpu-scheduler") -> dict[str, Any]:
    """Chart values for a host-process scheduler: ServiceAccount ``gpu-scheduler`` and the
    scheduler's default Lease name."""
    return {
        "serviceAccount": {"name": SCHEDULER_SA},
        "scheduler": {"name": scheduler_name, "leaderElection": {"leaseName": LEASE_NAME}},
    }


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def render_chart(
    cluster: Cluster, release: str, namespace: str, values: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``helm template`` of gpu-scheduler-chart (base values: webhook enabled at a URL,
    no scheduler pod; ``values`` merged over them): every rendered object."""
    merged = _merge(BASE_VALUES, values or {})
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-rbac-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(merged))
        text = cluster.helm(
            "template",
            release,
            str(REPO / SCHEDULER_CHART),
            "--namespace",
            namespace,
            "--values",
            str(values_file),
            # helm template knows nothing of the cluster: tell it what the local control
            # plane (Kubernetes 1.37) serves, as helm install learns by discovery.
            "--api-versions",
            MUTATING_POLICY_API,
            "--api-versions",
            DRA_API,
        ).stdout
    return load_manifests(text)


def component_objects(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    """The ServiceAccount, ClusterRole(Binding) and Role(Binding) of one component."""
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {COMPONENTS}, not {component!r}")
    return [
        d
        for d in docs
        if d["kind"] in RBAC_KINDS
        and ((d.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == component
    ]


def render_rbac(
    cluster: Cluster, release: str, namespace: str, component: str, values: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The chart's RBAC objects of ``component`` for ``release`` in ``namespace``."""
    objects = component_objects(render_chart(cluster, release, namespace, values), component)
    if [d["kind"] for d in objects].count("ServiceAccount") != 1:
        raise RuntimeError(f"the chart rendered no single ServiceAccount for the {component}: {objects}")
    return objects


def rules_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rules of the one ``kind`` (ClusterRole or Role) among ``objects``."""
    (role,) = [d for d in objects if d["kind"] == kind]
    return list(role["rules"])


@dataclass(frozen=True)
class ChartIdentity:
    """A component's ServiceAccount, created from the chart, and a kubeconfig with its token."""

    component: str
    namespace: str
    service_account: str
    kubeconfig: Path
    objects: tuple[dict[str, Any], ...]

    @property
    def username(self) -> str:
        """The name the apiserver gives this token (what RBAC and admission policies see)."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@contextlib.contextmanager
def chart_identity(
    cluster: Cluster,
    namespace: str,
    component: str,
    release: str,
    values: Mapping[str, Any] | None = None,
) -> Iterator[ChartIdentity]:
    """Apply the chart's RBAC of ``component`` (rendered for ``release`` in ``namespace``,
    which must exist) and yield its identity; the cluster-scoped objects and those in
    other namespaces (kube-scheduler's RoleBinding in kube-system) are deleted afterwards
    (the others go with the namespace)."""
    objects = render_rbac(cluster, release, namespace, component, values)
    cluster.apply(objects)
    try:
        (sa,) = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
        kubeconfig = cluster.service_account_kubeconfig(namespace, sa)
        yield ChartIdentity(component, namespace, sa, kubeconfig, tuple(objects))
    finally:
        for doc in objects:
            other_ns = (doc.get("metadata") or {}).get("namespace") not in (None, namespace)
            if doc["kind"] in CLUSTER_SCOPED or other_ns:
                _delete(cluster, doc)


def _delete(cluster: Cluster, doc: dict[str, Any]) -> None:
    """Delete one RBAC object through the API client (gone already, or failing: no matter, as
    ``kubectl delete --ignore-not-found`` unchecked)."""
    from kubernetes import client

    kind, meta = doc["kind"], doc["metadata"]
    api: Any = (client.CoreV1Api if kind == "ServiceAccount" else client.RbacAuthorizationV1Api)(
        cluster.admin_api()
    )
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()  # ClusterRoleBinding -> cluster_role_binding
    with contextlib.suppress(client.ApiException):
        if kind in CLUSTER_SCOPED:
            getattr(api, f"delete_{snake}")(meta["name"], _preload_content=False)
        else:
            getattr(api, f"delete_namespaced_{snake}")(
                meta["name"], meta["namespace"], _preload_content=False
            )
