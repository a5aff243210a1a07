"""The chart's RBAC with the real tokens: what the scheduler's and the webhook's
ServiceAccounts may and may not do, asked of the local control plane's apiserver
(``kubectl auth can-i`` with each token, a SelfSubjectAccessReview, and direct calls).

The objects come from ``helm template`` of gpu-scheduler-chart (localcluster/rbac.py),
so these tests check the chart, not a copy of its rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.rbac import LEASE_NAME, ChartIdentity, chart_identity, scheduler_chart_values

ELSEWHERE = "kube-system"  # a namespace that is not the release's


@pytest.fixture
def webhook_identity(cluster: Cluster, namespace: str) -> Iterator[ChartIdentity]:
    with chart_identity(cluster, namespace, "webhook", f"wh-{namespace}") as ident:
        yield ident


def can_i(cluster: Cluster, kubeconfig: Path, verb: str, resource: str, namespace: str | None = None) -> bool:
    """``kubectl auth can-i`` as the token in ``kubeconfig`` (no impersonation)."""
    what, _, sub = resource.partition("/") if resource.startswith("pods/") else (resource, "", "")
    args = ["auth", "can-i", verb, what]
    if sub:
        args.append(f"--subresource={sub}")
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    res = cluster.kubectl(*args, kubeconfig=kubeconfig, check=False)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {verb} {resource}: {res.stdout}{res.stderr}"
    return answer == "yes"


def whoami(cluster: Cluster, kubeconfig: Path) -> str:
    res = cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    return str(json.loads(res.stdout)["status"]["userInfo"]["username"])


SCHEDULER_ALLOWED = [
    ("get", "pods", None),
    ("list", "pods", None),
    ("watch", "pods", None),
    ("delete", "pods", None),
    ("delete", "pods", ELSEWHERE),
    ("create", "pods/binding", None),
    ("create", "pods/eviction", None),
    ("patch", "pods/status", None),
    ("get", "statefulsets.apps", None),
    ("list", "nodes", None),
    ("watch", "nodes", None),
    ("create", "events.events.k8s.io", None),
    ("patch", "events.events.k8s.io", None),
    ("create", "leases.coordination.k8s.io", "{ns}"),
    ("get", f"leases.coordination.k8s.io/{LEASE_NAME}", "{ns}"),
    ("update", f"leases.coordination.k8s.io/{LEASE_NAME}", "{ns}"),
]
SCHEDULER_DENIED = [
    ("patch", "pods", None),
    ("patch", "pods", ELSEWHERE),
    ("patch", "pods", "{ns}"),
    ("update", "pods", None),
    ("create", "pods", None),
    ("deletecollection", "pods", None),
    ("update", "pods/status", None),
    ("create", "pods/exec", None),
    ("patch", "pods/ephemeralcontainers", None),
    ("get", "secrets", None),
    ("list", "secrets", None),
    ("get", "secrets", "{ns}"),
    ("get", "configmaps", None),
    ("list", "configmaps", "{ns}"),
    ("get", "nodes", None),
    ("patch", "nodes", None),
    ("update", "nodes", None),
    ("delete", "nodes", None),
    ("patch", "nodes/status", None),
    ("create", "events", None),
    ("patch", "events", None),
    ("delete", "events.events.k8s.io", None),
    ("list", "leases.coordination.k8s.io", "{ns}"),
    ("update", "leases.coordination.k8s.io/someone-else", "{ns}"),
    ("delete", f"leases.coordination.k8s.io/{LEASE_NAME}", "{ns}"),
    ("create", "leases.coordination.k8s.io", ELSEWHERE),
    ("create", "serviceaccounts/token", "{ns}"),
    ("update", "statefulsets.apps", None),
    ("list", "statefulsets.apps", None),
    ("patch", "statefulsets.apps", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
]
WEBHOOK_ALLOWED = [("list", "nodes", None), ("watch", "nodes", None)]
WEBHOOK_DENIED = [
    ("get", "pods", None),
    ("list", "pods", None),
    ("get", "pods", "{ns}"),
    ("patch", "pods", None),
    ("update", "pods", None),
    ("delete", "pods", None),
    ("create", "pods/binding", None),
    ("patch", "pods/status", None),
    ("create", "pods/exec", None),
    ("get", "secrets", None),
    ("list", "secrets", "{ns}"),
    ("get", "configmaps", None),
    ("list", "configmaps", "{ns}"),
    ("patch", "nodes", None),
    ("update", "nodes", None),
    ("delete", "nodes", None),
    ("create", "events.events.k8s.io", None),
    ("create", "leases.coordination.k8s.io", "{ns}"),
    ("list", "statefulsets.apps", None),
]


def check(
    cluster: Cluster,
    ident: ChartIdentity,
    allowed: list[tuple[str, str, str | None]],
    denied: list[tuple[str, str, str | None]],
) -> None:
    wrong = []
    for verb, resource, ns in allowed + denied:
        scope = ns.format(ns=ident.namespace) if ns else None
        expected = (verb, resource, ns) in allowed
        if can_i(cluster, ident.kubeconfig, verb, resource, scope) != expected:
            wrong.append(
                f"{verb} {resource} in {scope or 'all namespaces'}: expected {'yes' if expected else 'no'}"
            )
    assert not wrong, f"{ident.username}:\n" + "\n".join(wrong)


def test_scheduler_token_may_do_exactly_what_the_scheduler_calls(
    cluster: Cluster, namespace: str, scheduler_identity: ChartIdentity
) -> None:
    assert whoami(cluster, scheduler_identity.kubeconfig) == scheduler_identity.username
    check(cluster, scheduler_identity, SCHEDULER_ALLOWED, SCHEDULER_DENIED)


def test_webhook_token_may_only_list_and_watch_nodes(
    cluster: Cluster, namespace: str, webhook_identity: ChartIdentity
) -> None:
    assert whoami(cluster, webhook_identity.kubeconfig) == webhook_identity.username
    assert webhook_identity.service_account != "gpu-scheduler"
    check(cluster, webhook_identity, WEBHOOK_ALLOWED, WEBHOOK_DENIED)


def test_scheduler_token_cannot_change_a_pod_in_another_namespace(
    cluster: Cluster, namespace: str, scheduler_identity: ChartIdentity, tmp_path: Path
) -> None:
    """What the adversarial review did with the old ClusterRole (pods patch): change the
    image of someone else's pod. Refused by RBAC now, the pod unchanged."""
    other = f"{namespace}-other"
    cluster.kubectl("create", "namespace", other)
    try:
        cluster.wait_until(
            lambda: bool(cluster.get_json("serviceaccount", "default", "-n", other)),
            timeout=60,
            what=f"ServiceAccount {other}/default",
        )
        cluster.kubectl("run", "victim", "-n", other, "--image=registry.k8s.io/pause:3.10", "--restart=Never")
        patch = json.dumps({"spec": {"containers": [{"name": "victim", "image": "evil.example/x:1"}]}})
        res = cluster.kubectl(
            "patch",
            "pod",
            "victim",
            "-n",
            other,
            "-p",
            patch,
            kubeconfig=scheduler_identity.kubeconfig,
            check=False,
        )
        assert res.returncode != 0
        assert "forbidden" in res.stderr.lower() and 'cannot patch resource "pods"' in res.stderr, res.stderr
        image = cluster.kubectl(
            "get", "pod", "victim", "-n", other, "-o", "jsonpath={.spec.containers[0].image}"
        )
        assert image.stdout == "registry.k8s.io/pause:3.10"
        # It can still read it (its watch needs that).
        ok = cluster.kubectl(
            "get", "pod", "victim", "-n", other, kubeconfig=scheduler_identity.kubeconfig, check=False
        )
        assert ok.returncode == 0, ok.stderr
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_webhook_token_reads_nodes_but_not_pods(
    cluster: Cluster, namespace: str, webhook_identity: ChartIdentity
) -> None:
    kc = webhook_identity.kubeconfig
    nodes = cluster.kubectl(
        "get", "nodes", "--field-selector=metadata.name=node1", "-o", "name", kubeconfig=kc, check=False
    )
    assert nodes.returncode == 0 and nodes.stdout.strip() == "node/node1", nodes.stderr
    # A GET by name is not granted: the webhook lists with a field selector.
    assert cluster.kubectl("get", "node", "node1", kubeconfig=kc, check=False).returncode != 0
    pods = cluster.kubectl("get", "pods", "-A", kubeconfig=kc, check=False)
    assert pods.returncode != 0 and 'cannot list resource "pods"' in pods.stderr, pods.stderr
    secrets = cluster.kubectl("get", "secrets", "-n", namespace, kubeconfig=kc, check=False)
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr.lower()


def test_scheduler_identity_comes_from_the_chart(scheduler_identity: ChartIdentity) -> None:
    """The fixtures' scheduler RBAC is the chart's rendered objects, not a restatement."""
    kinds = sorted(d["kind"] for d in scheduler_identity.objects)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"]
    (role,) = [d for d in scheduler_identity.objects if d["kind"] == "ClusterRole"]
    assert role["metadata"]["labels"]["helm.sh/chart"].startswith("gpu-scheduler-")
    values = scheduler_chart_values()
    assert scheduler_identity.service_account == values["serviceAccount"]["name"]
