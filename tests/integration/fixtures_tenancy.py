"""The tenancy world of tests/integration/test_tenancy.py (registered by tests/conftest.py).

One module-scoped world on the session's control plane, made the way a user's cluster is:

* the chart rendered with ``tenancy.enabled`` in policy mode, injection scoped to the
  namespaces carrying this world's label: the GPUPinningPolicy CRD, the grants ConfigMap, the
  injection, map and tenancy admission policies, applied as they are;
* the scheduler as a host process with the chart's RBAC and the environment the chart's
  Deployment gives it (its own scheduler name, so no other test's pods are its);
* the webhook as a host process with the chart's webhook RBAC, registered for one namespace
  (webhook mode beside policy mode, reading the same grants);
* tenant namespaces (team a, b, c; one not opted in to injection), each with a tenant: a
  ServiceAccount bound to the ``edit`` ClusterRole in its own namespace only;
* two kwok nodes of its own: pool ``a`` and a ``shared`` pool (8 GPUs, type A100), and the
  admin's policies: team a on pool a (no limit), teams a and b on the shared pool (maxGPUs 3).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import Cluster
from localcluster.procs import ManagedProcess
from localcluster.rbac import chart_identity, render_chart, scheduler_chart_values
from localcluster.scheduler_host import run_scheduler
from localcluster.webhook_host import make_certs
from tests.support.waiting import wait_for

KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")  # fmt: skip
PRODUCT = "NVIDIA-A100-SXM4-80GB"


@dataclass
class Tenancy:
    cluster: Cluster
    suffix: str
    release_ns: str
    release: str
    scheduler_name: str
    ns: dict[str, str]  # team -> namespace: a, b, c (no policy), w (webhook mode), out (not opted in)
    nodes: dict[str, str]  # pool -> node: a, shared
    tenants: dict[str, Path]  # team -> the tenant's kubeconfig
    scheduler: ManagedProcess
    scheduler_kubeconfig: Path
    webhook: ManagedProcess
    grants: str
    scope_label: str
    policies: list[str] = field(default_factory=list)

    def policy_name(self, short: str) -> str:
        return f"tn-{self.suffix}-{short}"

    def apply_policy(self, short: str, teams: list[str], pool: str, **spec: Any) -> str:
        name = self.policy_name(short)
        body = {
            "apiVersion": "gpu-scheduler.io/v1alpha1",
            "kind": "GPUPinningPolicy",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "team", "operator": "In", "values": teams},
                        {"key": f"tn-{self.suffix}", "operator": "Exists"},
                    ]
                },
                "nodeSelector": {"matchLabels": {f"tn-{self.suffix}-pool": pool}},
                **spec,
            },
        }
        self.cluster.apply(body)
        if name not in self.policies:
            self.policies.append(name)
        return name

    def grants_data(self) -> dict[str, str]:
        out = self.cluster.kubectl(
            "get", "configmap", self.grants, "-n", self.release_ns, "-o", "json"
        ).stdout
        return dict(json.loads(out).get("data") or {})

    def wait_grants(self, namespace: str, policies: list[str]) -> None:
        """Until the published grants say ``namespace`` is selected by exactly ``policies``."""
        want = ",".join(sorted(self.policy_name(p) for p in policies))
        wait_for(
            lambda: self.grants_data().get(f"ns.{namespace}", "") == want,
            30,
            what=f"the grants of {namespace} to be {want!r}",
        )

    def as_tenant(self, team: str, *args: str, input: str | None = None) -> Any:
        return self.cluster.kubectl(*args, input=input, check=False, kubeconfig=self.tenants[team])


def _tenant(cluster: Cluster, namespace: str) -> Path:
    """A ServiceAccount with the ``edit`` ClusterRole in its own namespace only."""
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "tenant", "namespace": namespace},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tenant-edit", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
            },
        ]
    )
    return cluster.service_account_kubeconfig(namespace, "tenant")


def _namespace(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    cluster.wait_until(
        lambda: bool(cluster.get_json("serviceaccount", "default", "-n", name)),
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )


@pytest.fixture(scope="module")
def tenancy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    # Imported here: a plugin module imported by another before pytest registers it is not rewritten.
    from tests.integration.fixtures_webhook import register_webhooks, start_webhook

    suffix = uuid.uuid4().hex[:6]
    release_ns, release, name = f"tn-{suffix}", f"tn-{suffix}", f"gpu-scheduler-tn-{suffix}"
    scope_label = f"tn-{suffix}-injection"
    logs = tmp_path_factory.mktemp("tenancy")
    teams = {"a": "a", "b": "b", "c": "c", "w": "a", "out": "a"}
    ns = {t: f"tn-{suffix}-{t}" for t in teams}
    nodes = {"a": f"tn-{suffix}-a1", "shared": f"tn-{suffix}-s1"}
    values: dict[str, Any] = {
        **scheduler_chart_values(name),
        "replicaCount": 1,
        "tenancy": {"enabled": True},
        "injection": {"mode": "policy", "namespaceSelector": {"matchLabels": {scope_label: "policy"}}},
        "webhook": {"enabled": False},
    }
    made: list[tuple[str, str]] = []
    with contextlib.ExitStack() as stack:
        try:
            _namespace(cluster, release_ns, {})
            made.append(("namespace", release_ns))
            for team, label in teams.items():
                scope = {"w": "webhook", "out": "none"}.get(team, "policy")
                _namespace(cluster, ns[team], {"team": label, f"tn-{suffix}": "", scope_label: scope})
                made.append(("namespace", ns[team]))
            cluster.add_gpu_node(nodes["a"], gpus=4, labels={f"tn-{suffix}-pool": "a"}, wait=False)
            made.append(("node", nodes["a"]))
            cluster.add_gpu_node(
                nodes["shared"],
                gpus=8,
                labels={f"tn-{suffix}-pool": "shared", "nvidia.com/gpu.product": PRODUCT},
                wait=False,
            )
            made.append(("node", nodes["shared"]))
            for node in nodes.values():
                cluster.wait_node_ready(node)
            docs = render_chart(cluster, release, release_ns, values)
            crd = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
            cluster.apply(crd)
            cluster.kubectl(
                "wait", "--for=condition=Established", f"crd/{crd[0]['metadata']['name']}", "--timeout=60s"
            )
            ours = {f"{release}-gpu-scheduler-{s}" for s in ("inject", "map", "tenancy")}
            policies = [d for d in docs if d["kind"] in KINDS and d["metadata"]["name"] in ours]
            assert len(policies) == 6, [d["metadata"]["name"] for d in policies]
            (grants_cm,) = [
                d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-grants")
            ]
            cluster.apply([grants_cm, *policies])
            made.extend((d["kind"].lower(), d["metadata"]["name"]) for d in policies)
            (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
            chart_env = {
                e["name"]: e["value"]
                for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
                if "value" in e
            }
            sched_ident = stack.enter_context(
                chart_identity(cluster, release_ns, "scheduler", release, values)
            )
            hook_ident = stack.enter_context(
                chart_identity(
                    cluster,
                    release_ns,
                    "webhook",
                    release,
                    {**values, "webhook": {"enabled": True, "url": "https://127.0.0.1:1"}},
                )
            )
            scheduler = run_scheduler(
                sched_ident.kubeconfig,
                env={
                    **{k: v for k, v in chart_env.items() if k.startswith("GPU_SCHEDULER_")},
                    "POD_NAME": f"tn-{suffix}",
                    "POD_NAMESPACE": release_ns,
                    "GPU_SCHEDULER_LOG_LEVEL": "DEBUG",
                },
                log_path=logs / "scheduler.log",
            )
            stack.callback(lambda: print(f"--- scheduler log ---\n{scheduler.log_text(80)}"))
            stack.callback(scheduler.stop)
            certs = make_certs(logs / "certs")
            server = stack.enter_context(
                start_webhook(
                    certs,
                    logs,
                    hook_ident.kubeconfig,
                    env={"WEBHOOK_TENANCY_GRANTS": chart_env["GPU_SCHEDULER_TENANCY_GRANTS"]},
                )
            )
            world = Tenancy(
                cluster,
                suffix,
                release_ns,
                release,
                name,
                ns,
                nodes,
                {t: _tenant(cluster, ns[t]) for t in ("a", "b", "c", "w")},
                scheduler,
                sched_ident.kubeconfig,
                server.proc,
                grants_cm["metadata"]["name"],
                scope_label,
            )
            world.apply_policy("pool-a", ["a"], "a")
            world.apply_policy("shared", ["a", "b"], "shared", maxGPUs=3)
            # The webhook's registration probe maps a pod to node1 (a session node): granted to its namespace.
            cluster.kubectl("label", "node", "node1", f"tn-{suffix}-pool=probe", "--overwrite")
            made.append(("label", "node1"))
            world.apply_policy("probe", ["a"], "probe")
            world.wait_grants(ns["w"], ["pool-a", "probe", "shared"])
            stack.enter_context(register_webhooks(cluster, ns["w"], server))
            yield world
        finally:
            stack.close()
            for name_ in getattr(locals().get("world"), "policies", []):
                cluster.kubectl("delete", "gpupinningpolicy", name_, "--ignore-not-found", check=False)
            for kind, what in reversed(made):
                if kind == "label":
                    cluster.kubectl("label", "node", what, f"tn-{suffix}-pool-", check=False)
                else:
                    cluster.kubectl("delete", kind, what, "--ignore-not-found", "--wait=false", check=False)


def sts(name: str, smap: str, replicas: int, scheduler: str) -> str:
    """A StatefulSet (Parallel: the replicas race) as YAML, for ``kubectl apply``."""
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": {"gpu-scheduling-map": smap}},
                    "spec": {
                        "schedulerName": scheduler,
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        }
    )
