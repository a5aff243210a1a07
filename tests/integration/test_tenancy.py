"""Tenancy on the real apiserver, with tenants' own identities (tests/integration/fixtures_tenancy.py:
the chart's policies, RBAC and environment; tenants with ``edit`` in their own namespace only).

* at apply: a map naming a node no policy grants the namespace is refused, with the line, the
  node and the policies considered; a namespace no policy selects is refused; a bare pod too;
  webhook mode refuses with the policy's very words; a map that shares a GPU is refused where a
  policy of the namespace says allowSharedGPUs: false (in both modes, and at bind:
  GPUSharingForbidden), admitted elsewhere;
* only admins write policies: a tenant can neither create, edit nor delete one, and the
  scheduler's token may only write their status (and the grants ConfigMap);
* at bind: two StatefulSets of two namespaces racing for the last GPUs of a limit never hold more
  than it (a sampler reads every pod all along); the replica left out waits with an event naming
  the policy, the limit and the holders; a scale-down frees the count; raising the limit, or
  giving a grant back, places the waiting replica; the policy's status counts what is held;
* the opt-in loop: a replica in a namespace injection does not serve is never deleted and
  recreated; it waits with an event saying how to opt in, and is placed once it is;
* DRA mode's standard way: a ResourceQuota on the device class counts the replicas' claims.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.domain import dra
from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.schedmap import parse, sharing_problems
from kube_gpu_scheduler.domain.sharing import tenant_forbids
from tests.integration.fixtures_scheduler import metric
from tests.integration.fixtures_tenancy import Tenancy, sts
from tests.integration.test_dra import Dra, dra_env  # noqa: F401 (the DRA fixture, for the quota test)
from tests.support.kubeapi import failed_scheduling
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


def denial(stderr: str) -> str:
    """The message of a refused create: what a policy or a webhook said, after its preamble."""
    found = re.search(r"denied (?:the )?request: (.*)", stderr)
    assert found, stderr
    return found.group(1).strip()


def pods(kube: Any, namespace: str) -> list[dict[str, Any]]:
    resp = client.CoreV1Api(kube).list_namespaced_pod(namespace, _preload_content=False)
    return list(json.loads(resp.data)["items"])


def bound(kube: Any, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods(kube, namespace) if p["spec"].get("nodeName")}


def policy(t: Tenancy, short: str) -> dict[str, Any]:
    out = t.cluster.kubectl("get", "gpupinningpolicy", t.policy_name(short), "-o", "json").stdout
    return dict(json.loads(out))


# -- at apply ------------------------------------------------------------------------------


def test_a_map_naming_a_node_no_policy_grants_is_refused_at_apply(tenancy: Tenancy) -> None:
    t = tenancy
    a, c, pool_a, shared = t.ns["a"], t.ns["c"], t.nodes["a"], t.nodes["shared"]
    t.wait_grants(a, ["pool-a", "probe", "shared"])
    considered = ", ".join(t.policy_name(p) for p in ("pool-a", "probe", "shared"))
    # node2 is a node of the cluster, but no policy grants it to team a.
    res = t.as_tenant(
        "a", "apply", "-n", a, "-f", "-", input=sts("w", f"0={pool_a}:0\n1=node2:0", 2, t.scheduler_name)
    )
    assert res.returncode != 0
    assert denial(res.stderr) == (
        f"gpu-scheduling-map line 2: replica 1 is mapped to node 'node2', which no GPUPinningPolicy "
        f"grants namespace '{a}' (policies considered: {considered})"
    )
    # A namespace no policy selects pins nothing.
    res = t.as_tenant("c", "apply", "-n", c, "-f", "-", input=sts("w", f"0={shared}:0", 1, t.scheduler_name))
    assert res.returncode != 0
    assert denial(res.stderr).endswith(f"(policies considered: none selects namespace '{c}')")
    # A bare pod is checked as a StatefulSet is.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare-0", "annotations": {"gpu-scheduling-map": "0=node2:1"}},
        "spec": {"schedulerName": t.scheduler_name, "containers": [{"name": "c", "image": "x"}]},
    }
    res = t.as_tenant("a", "create", "-n", a, "-f", "-", input=json.dumps(pod))
    assert res.returncode != 0 and "replica 0 is mapped to node 'node2'" in denial(res.stderr)
    # What is granted is admitted.
    res = t.as_tenant(
        "a", "apply", "--dry-run=server", "-n", a, "-f", "-", input=sts("w", f"0={pool_a}:0\n1={shared}:0", 2, t.scheduler_name)
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


def test_webhook_mode_refuses_with_the_policys_words(tenancy: Tenancy) -> None:
    """The same maps through the ValidatingAdmissionPolicy (namespace a) and the webhook (namespace
    w; both team a): the same verdict and, namespace aside, the same message."""
    t = tenancy
    pool_a, shared = t.nodes["a"], t.nodes["shared"]
    maps = [
        f"0={pool_a}:0\n1=node2:0",
        f"# team a\n0=node2:0 ; 1=node3:1 # two here\n2={pool_a}:1",
        f"007=node3:0\n8={shared}:1",
        f"0={pool_a}:0\n1={shared}:0",
    ]
    for smap in maps:
        said = {}
        for team in ("a", "w"):
            res = t.as_tenant(
                team, "apply", "--dry-run=server", "-n", t.ns[team], "-f", "-", input=sts("w", smap, 2, "gpu-scheduler" if team == "w" else t.scheduler_name)
            )  # fmt: skip
            said[team] = denial(res.stderr).replace(t.ns[team], "NS") if res.returncode else "admitted"
        assert said["a"] == said["w"], smap
    assert said["a"] == "admitted"


def test_a_policy_that_forbids_sharing_refuses_a_shared_map_in_its_namespaces_only(
    tenancy: Tenancy, kube: Any
) -> None:
    """allowSharedGPUs: false on a policy of team a: a map whose replicas share a GPU is refused in
    team a's namespaces (the policy, namespace a; the webhook, namespace w: the same words) and
    admitted in team b's; the published grants say which policy forbids it; and a replica that
    shares, created after the policy came (its StatefulSet admitted before), waits with an event
    in the same words (GPUSharingForbidden) while its mate that shares nothing is bound."""
    t = tenancy
    a, b, w, shared = t.ns["a"], t.ns["b"], t.ns["w"], t.nodes["shared"]
    smap = f"0={shared}:0\n1={shared}:1\n2={shared}:5\n3={shared}:5\n"
    t.wait_grants(a, ["pool-a", "probe", "shared"])
    strict = t.policy_name("strict")
    try:
        # Admitted before any policy forbids it: 2 replicas (0 and 1 share nothing). (This world
        # applies no map-warnings policy: the warning is test_injection_policy.py's.)
        res = t.as_tenant("a", "apply", "-n", a, "-f", "-", input=sts("sh", smap, 2, t.scheduler_name))
        assert res.returncode == 0, res.stderr
        t.apply_policy("strict", ["a"], "nowhere", allowSharedGPUs=False)
        t.wait_grants(a, ["pool-a", "probe", "shared", "strict"])
        assert t.grants_data()[f"unshared.{strict}"] == "true"
        for team, ns in (("a", a), ("w", w)):
            why = tenant_forbids(strict, ns)
            err = sharing_problems(parse(smap), why)
            assert err is not None
            res = t.as_tenant(team, "apply", "--dry-run=server", "-n", ns, "-f", "-", input=sts("x", smap, 4, "gpu-scheduler" if team == "w" else t.scheduler_name))  # fmt: skip
            assert res.returncode != 0, (team, res.stdout)
            assert denial(res.stderr).startswith(str(err.problems[0])), (team, res.stderr)
            assert f"line 4: {shared}:5 is also given to ordinal 2 on line 3: {why}" in res.stderr
        # Team b's policies allow it: admitted.
        res = t.as_tenant("b", "apply", "--dry-run=server", "-n", b, "-f", "-", input=sts("x", smap, 4, t.scheduler_name))  # fmt: skip
        assert res.returncode == 0, res.stderr
        # At bind: sh-2 and sh-3 share GPU 5; the scheduler refuses them, and binds sh-0, sh-1.
        wait_for(lambda: {"sh-0", "sh-1"} <= set(bound(kube, a)), 60, what="sh-0 and sh-1 bound")
        t.as_tenant("a", "scale", "statefulset", "sh", "-n", a, "--replicas=4")
        why = tenant_forbids(strict, a)
        event = wait_for(
            lambda: failed_scheduling(kube, a, "sh-3", R.GPU_SHARING_FORBIDDEN, why), 60, what="sh-3 refused"
        )
        assert event["message"].startswith(
            f"{R.GPU_SHARING_FORBIDDEN}: line 4: {shared}:5 is also given to ordinal 2 on line 3: {why}"
        ), event["message"]
        assert "sh-3" not in bound(kube, a) and "sh-2" not in bound(kube, a)
    finally:
        t.as_tenant("a", "delete", "statefulset", "sh", "-n", a, "--wait=false")
        t.cluster.kubectl("delete", "gpupinningpolicy", strict, "--ignore-not-found")
        if strict in t.policies:
            t.policies.remove(strict)
        t.wait_grants(a, ["pool-a", "probe", "shared"])
        wait_for(lambda: not [p for p in pods(kube, a) if p["metadata"]["name"].startswith("sh-")], 60, what="sh-* gone")  # fmt: skip


def test_only_admins_write_policies(tenancy: Tenancy) -> None:
    t = tenancy

    def can(kubeconfig: Any, verb: str, what: str, ns: str | None = None) -> bool:
        resource, _, sub = what.partition("|")  # "resource|subresource"
        args = [
            "auth",
            "can-i",
            verb,
            resource,
            *(["--subresource", sub] if sub else []),
            *(["-n", ns] if ns else []),
        ]
        return t.cluster.kubectl(*args, check=False, kubeconfig=kubeconfig).stdout.strip() == "yes"

    policies = "gpupinningpolicies.gpu-scheduler.io"
    tenant = t.tenants["a"]
    for verb in ("create", "update", "patch", "delete"):
        assert not can(tenant, verb, policies), verb
    assert not can(tenant, "update", f"{policies}|status") and not can(tenant, "patch", f"{policies}|status")
    assert can(tenant, "create", "statefulsets.apps", t.ns["a"])  # edit in its own namespace
    # Nor can it label its namespace into another team's policies (namespaces are cluster-scoped).
    assert not can(tenant, "patch", f"namespaces/{t.ns['a']}") and not can(
        tenant, "update", f"namespaces/{t.ns['a']}"
    )
    res = t.as_tenant("a", "delete", "gpupinningpolicy", t.policy_name("shared"))
    assert res.returncode != 0 and "forbidden" in res.stderr.lower()
    mine = {
        "apiVersion": "gpu-scheduler.io/v1alpha1",
        "kind": "GPUPinningPolicy",
        "metadata": {"name": f"tn-{t.suffix}-mine"},
        "spec": {"namespaceSelector": {}, "nodeSelector": {}},
    }
    res = t.as_tenant("a", "create", "-f", "-", input=json.dumps(mine))
    assert res.returncode != 0 and "forbidden" in res.stderr.lower()
    # The scheduler reads them and writes only their status, and only its grants ConfigMap.
    sched = t.scheduler_kubeconfig
    assert can(sched, "watch", policies) and can(sched, "update", f"{policies}|status")
    assert not can(sched, "patch", f"{policies}|status")
    for verb in ("create", "update", "patch", "delete"):
        assert not can(sched, verb, policies), verb
    assert can(sched, "patch", f"configmaps/{t.grants}", t.release_ns)
    assert not can(sched, "patch", "configmaps/other", t.release_ns) and not can(sched, "get", "configmaps")


# -- at bind --------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Every ~20 ms: the GPUs bound, active pods of ``namespaces`` hold on ``node``.

    Each sample is ONE list of the node's pods across all namespaces, so one resourceVersion:
    a list per namespace, one after the other, could see a replica of one tenant that was
    deleted since the other tenant's list, beside the replica that took its GPU meanwhile
    (4 GPUs "held" through a limit of 3 that was never exceeded: CI saw it)."""

    def __init__(self, kube: Any, namespaces: list[str], node: str) -> None:
        super().__init__(daemon=True)
        self.kube, self.namespaces, self.node = kube, namespaces, node
        self.samples: list[tuple[float, int, list[str]]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            held, who = 0, []
            try:
                resp = client.CoreV1Api(self.kube).list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node}", _preload_content=False
                )
                for p in json.loads(resp.data)["items"]:
                    ns = p["metadata"]["namespace"]
                    if ns in self.namespaces and p["status"].get("phase") not in ("Succeeded", "Failed"):
                        env = {
                            e["name"]: e.get("value", "") for e in p["spec"]["containers"][0].get("env") or []
                        }
                        gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
                        held += len(gpus)
                        who.append(f"{ns}/{p['metadata']['name']}")
            except Exception:  # a transient error is no verdict
                continue
            self.samples.append((time.monotonic(), held, who))
            time.sleep(0.02)

    def most(self, until: float = float("inf")) -> tuple[int, list[str]]:
        found = [(h, w) for at, h, w in self.samples if at < until]
        assert len(found) > 5, "the race was not watched"
        return max(found)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=10)


def test_racing_statefulsets_never_exceed_a_limit_and_wait_for_freed_gpus_or_a_raised_limit(
    tenancy: Tenancy, kube: Any
) -> None:
    t = tenancy
    a, b, shared, name = t.ns["a"], t.ns["b"], t.nodes["shared"], t.policy_name("shared")
    t.apply_policy("shared", ["a", "b"], "shared", maxGPUs=3)
    t.wait_grants(b, ["shared"])
    sampler = Sampler(kube, [a, b], shared)
    sampler.start()
    try:
        # Two tenants, at once: 4 replicas of one GPU each for a limit of 3.
        jobs = [
            threading.Thread(target=t.as_tenant, args=(team, "apply", "-n", t.ns[team], "-f", "-"),
                             kwargs={"input": sts(app, smap, 2, t.scheduler_name)})
            for team, app, smap in (("a", "w", f"0={shared}:0\n1={shared}:1"), ("b", "x", f"0={shared}:2\n1={shared}:3"))
        ]  # fmt: skip
        for job in jobs:
            job.start()
        for job in jobs:
            job.join()

        def waiting() -> tuple[str, str] | None:
            placed = {
                **{f"{a}/{n}": p for n, p in bound(kube, a).items()},
                **{f"{b}/{n}": p for n, p in bound(kube, b).items()},
            }
            if len(placed) != 3:
                return None
            for ns, pod in ((a, "w-0"), (a, "w-1"), (b, "x-0"), (b, "x-1")):
                if f"{ns}/{pod}" not in placed and failed_scheduling(
                    kube, ns, pod, R.GPU_LIMIT_REACHED, f"'{name}' allows 3 GPUs", "3 are held"
                ):
                    return ns, pod
            return None

        ns, pod = wait_for(waiting, 60, what="3 replicas bound and the 4th waiting with GPULimitReached")  # fmt: skip
        # The policy's status counts them; kubectl shows its columns.
        wait_for(lambda: (policy(t, "shared").get("status") or {}).get("held") == 3, 30, what="status.held 3")
        line = t.cluster.kubectl("get", "gpupinningpolicy", name, "--no-headers").stdout.split()
        assert line[:4] == [name, "3", "3", "1"], line  # NAME MAX HELD NODES
        # A scale-down of the other tenant's StatefulSet frees a GPU: the waiting replica binds.
        other_team, other_app = ("b", "x") if ns == a else ("a", "w")
        t.as_tenant(other_team, "scale", "statefulset", other_app, "-n", t.ns[other_team], "--replicas=1")
        wait_for(lambda: pod in bound(kube, ns), 60, what=f"{ns}/{pod} bound once a GPU was freed")
        # A third StatefulSet waits at the limit until the admin raises it.
        res = t.as_tenant(
            "a", "apply", "-n", a, "-f", "-", input=sts("late", f"0={shared}:4", 1, t.scheduler_name)
        )
        assert res.returncode == 0, res.stderr
        wait_for(
            lambda: failed_scheduling(kube, a, "late-0", R.GPU_LIMIT_REACHED),
            60,
            what="late-0 waiting at the limit",
        )
        raised = time.monotonic()
        t.apply_policy("shared", ["a", "b"], "shared", maxGPUs=4)
        wait_for(lambda: "late-0" in bound(kube, a), 30, what="late-0 bound once the limit was raised")
        wait_for(lambda: (policy(t, "shared").get("status") or {}).get("held") == 4, 30, what="status.held 4")
        status, generation = policy(t, "shared")["status"], policy(t, "shared")["metadata"]["generation"]
    finally:
        sampler.stop()
        for team, app in (("a", "w"), ("b", "x"), ("a", "late")):
            t.as_tenant(team, "delete", "statefulset", app, "-n", t.ns[team], "--wait=false")
    most, who = sampler.most(until=raised)
    assert most <= 3, f"{most} GPUs held through a policy of 3: {who}"
    assert status["observedGeneration"] == generation
    by_ns = {n["namespace"]: n for n in status["namespaces"]}
    assert sum(n["gpus"] for n in by_ns.values()) == 4
    assert all(
        n["types"] == [{"product": "NVIDIA-A100-SXM4-80GB", "gpus": n["gpus"]}] for n in by_ns.values()
    )
    t.apply_policy("shared", ["a", "b"], "shared", maxGPUs=3)


def test_a_grant_taken_away_holds_new_replicas_until_it_is_given_back(tenancy: Tenancy, kube: Any) -> None:
    """Bind-time NotGranted: the StatefulSet was admitted while granted; its next replica, created
    by the controller after the grant went, waits; the grant given back places it."""
    t = tenancy
    a, pool_a = t.ns["a"], t.nodes["a"]
    t.wait_grants(a, ["pool-a", "probe", "shared"])
    t.as_tenant(
        "a", "apply", "-n", a, "-f", "-", input=sts("g", f"0={pool_a}:0\n1={pool_a}:1", 1, t.scheduler_name)
    )
    try:
        wait_for(lambda: "g-0" in bound(kube, a), 60, what="g-0 bound")
        t.apply_policy("pool-a", ["a"], "nowhere")
        t.as_tenant("a", "scale", "statefulset", "g", "-n", a, "--replicas=2")
        wait_for(
            lambda: failed_scheduling(kube, a, "g-1", R.NOT_GRANTED, f"node '{pool_a}'"),
            60,
            what="g-1 NotGranted",
        )
        t.apply_policy("pool-a", ["a"], "a")
        wait_for(lambda: "g-1" in bound(kube, a), 30, what="g-1 bound once the grant was given back")
    finally:
        t.apply_policy("pool-a", ["a"], "a")
        t.as_tenant("a", "delete", "statefulset", "g", "-n", a, "--wait=false")


def test_a_replica_in_a_namespace_not_opted_in_waits_and_is_placed_once_it_is(
    tenancy: Tenancy, kube: Any
) -> None:
    t = tenancy
    out, pool_a = t.ns["out"], t.nodes["a"]
    t.cluster.kubectl("apply", "-n", out, "-f", "-", input=sts("o", f"0={pool_a}:2", 1, t.scheduler_name))
    try:
        event = wait_for(lambda: failed_scheduling(kube, out, "o-0", R.NAMESPACE_NOT_OPTED_IN), 60, what="o-0 waiting, not opted in")  # fmt: skip
        assert f"kubectl label namespace {out} {t.scope_label}=policy" in event["message"]
        uid = pods(kube, out)[0]["metadata"]["uid"]
        failures = f'reason="{R.NAMESPACE_NOT_OPTED_IN}"'
        wait_for(lambda: metric(t.scheduler, "gpu_scheduler_scheduling_failures_total", failures) >= 2, 30, what="a retry")  # fmt: skip
        assert [p["metadata"]["uid"] for p in pods(kube, out)] == [uid], "the replica was recreated"
        assert metric(t.scheduler, "gpu_scheduler_pods_recreated_total") == 0
        # Opted in: recreated through the injection policy, and placed.
        t.cluster.kubectl("label", "namespace", out, f"{t.scope_label}=policy", "--overwrite")

        def placed() -> bool:
            p = bound(kube, out).get("o-0")
            env = {
                e["name"]: e.get("value")
                for e in (p or {}).get("spec", {}).get("containers", [{}])[0].get("env") or []
            }
            return p is not None and p["metadata"]["uid"] != uid and env.get("CUDA_VISIBLE_DEVICES") == "2"

        wait_for(placed, 60, what="o-0 recreated with its variables and bound")
    finally:
        t.cluster.kubectl("delete", "statefulset", "o", "-n", out, "--wait=false", check=False)


# -- DRA mode: the standard way ----------------------------------------------------------------


def test_dra_mode_a_resource_quota_on_the_device_class_counts_the_replicas_claims(dra_env: Dra) -> None:  # noqa: F811
    env, quota = dra_env, "gpus"
    resource = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    env.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": quota, "namespace": env.namespace},
            "spec": {"hard": {resource: "2"}},
        }
    )
    a, b = env.nodes["a"], env.nodes["b"]
    env.cluster.apply(env.statefulset("q", f"0={a}:0\n1={a}:1\n2={b}:0", 3))
    replicas = ("q-0", "q-1", "q-2")

    def two_placed() -> list[str] | None:
        found = [r for r in replicas if env.placed(r)]
        return found if len(found) == 2 else None

    placed = wait_for(two_placed, 90, what="two replicas placed with their claims")
    (third,) = set(replicas) - set(placed)
    refusal = f'"key":"pod:{env.namespace}/{third}","error":"403 Forbidden"'
    wait_for(lambda: refusal in env.procs[-1].log_text(), 30, what="the third claim refused by the quota")
    assert env.claim(dra.claim_name(third)) is None
    assert env.get("resourcequota", quota)["status"]["used"][resource] == "2"
    pod = env.pod(third)
    assert pod is not None and not pod["spec"].get("nodeName") and dra.gated(pod)
    # Raised, the third claim is made and its replica placed.
    env.cluster.kubectl("patch", "resourcequota", quota, "-n", env.namespace, "--type=merge", "-p", json.dumps({"spec": {"hard": {resource: "3"}}}))  # fmt: skip
    wait_for(lambda: env.placed(third), 120, what="the third replica placed once the quota was raised")
