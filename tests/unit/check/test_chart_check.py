"""gpu-scheduler-check-chart rendered with helm template: the StatefulSet, the map it
carries, the downward-API environment and the verify-release helm test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kube_gpu_scheduler.domain.schedmap import ANNOTATION, parse
from tests.support.charts import (
    CHECK_CHART,
    KUBE_VERSIONS,
    ci_values,
    find,
    is_hook,
    one,
    pod_spec,
    render,
    template,
)
from tests.support.fakenvml import nvml_env
from tests.support.mapcorpus import TASK_MAP

CHART = CHECK_CHART
NS = "gpu-tests"
REL = "rel"
FULL = "rel-gpu-scheduler-check"
SELECTOR = {"app.kubernetes.io/name": "gpu-scheduler-check", "app.kubernetes.io/instance": REL}


def sts(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "StatefulSet")


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_every_ci_scenario_renders_a_parsable_map(values_file: Path, kube_version: str) -> None:
    docs = render(CHART, [values_file], namespace=NS, kube_version=kube_version)
    s = sts(docs)
    text = s["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    parsed = parse(text)
    assert set(range(s["spec"]["replicas"])) <= set(parsed)


def test_default_map_is_the_argocd_readme_map() -> None:
    s = sts(render(CHART, namespace=NS))
    assert s["spec"]["replicas"] == 3
    text = s["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == "0=node1:0,1\n1=node2:2\n2=node3:0,1,2\n"
    assert parse(text).format() == text


def test_map_from_values_is_ordered_and_normalised() -> None:
    values = {
        "replicaCount": 2,
        "gpuScheduling": {
            "schedulingMap": [
                {"podIndex": 1, "nodeName": "b", "gpuDevices": 3},
                {"podIndex": 0, "nodeName": "a", "gpuDevices": " 0 , 2 "},
                {"podIndex": 7, "nodeName": "spare", "gpuDevices": "1"},
            ]
        },
    }
    text = sts(render(CHART, values=values))["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == "0=a:0,2\n1=b:3\n7=spare:1\n"


def test_the_tasks_map_with_two_replicas_sharing_a_gpu_renders_as_written() -> None:
    entries = [
        (0, "node1", "0,1"),
        (1, "node2", "2"),
        (2, "node3", "0,1,2"),
        (3, "node4", "3"),
        (4, "node4", "3"),
    ]
    values = {
        "replicaCount": 5,
        "gpuScheduling": {
            "schedulingMap": [{"podIndex": o, "nodeName": n, "gpuDevices": g} for o, n, g in entries]
        },
    }
    s = sts(render(CHART, values=values))
    text = s["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == TASK_MAP and s["spec"]["replicas"] == 5
    # Each sharer is checked against its own entry: both are given GPU 3 of node4.
    assert parse(text).shared() == {("node4", 3): (3, 4)}


def test_a_count_entry_renders_in_dra_mode_and_its_replica_is_checked_for_how_many() -> None:
    entries = [
        {"podIndex": 0, "nodeName": "a", "gpuDevices": " auto(2) "},
        {"podIndex": 1, "nodeName": "b", "gpuDevices": "1"},
    ]
    values = {"replicaCount": 2, "gpuScheduling": {"injectionMode": "dra", "schedulingMap": entries}}
    text = sts(render(CHART, values=values))["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert text == "0=a:auto(2)\n1=b:1\n"
    assert parse(text)[0].count == 2


COUNT_OUTSIDE_DRA = {
    "replicaCount": 1,
    "gpuScheduling": {"schedulingMap": [{"podIndex": 0, "nodeName": "a", "gpuDevices": "auto(2)"}]},
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 4}, "no entry for podIndex 3"),
        (COUNT_OUTSIDE_DRA, "podIndex 0 asks for a count (auto(2)), which only DRA mode gives GPUs for"),
        (
            {
                "replicaCount": 1,
                "gpuScheduling": {
                    "schedulingMap": [
                        {"podIndex": 0, "nodeName": "a", "gpuDevices": "0"},
                        {"podIndex": 0, "nodeName": "b", "gpuDevices": "1"},
                    ]
                },
            },
            "given twice",
        ),
    ],
)
def test_bad_maps_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    res = template(CHART, values=values)
    assert res.returncode != 0 and message in res.stderr, res.stderr


@pytest.mark.parametrize(
    "bad",
    [
        "replica=3",
        "schedulerNmae=x",
        "gpuScheduling.schedulingMap[0].gpuDevice=1",
        "gpuScheduling.schedulingMap[0].gpuDevices=a\\,b",
        "gpuScheduling.schedulingMap[0].gpuDevices=auto(0)",
        "gpuScheduling.schedulingMap[0].gpuDevices=auto(33)",
        "gpuScheduling.schedulingMap[0].gpuDevices=auto(2)\\,3",
        "gpuScheduling.schedulingMap[0].nodeName=Bad_Node",
        "gpuScheduling.injectionMode=rocm",
        "check.intervalSecond=3",
        "check.expectNoGPU=maybe",
    ],
)
def test_schema_rejects_misspelled_keys_and_bad_values(bad: str) -> None:
    assert template(CHART, set_args=[bad]).returncode != 0


def test_statefulset() -> None:
    docs = render(CHART, namespace=NS, set_args=["schedulerName=my-sched"])
    s = sts(docs)
    assert s["metadata"]["name"] == FULL
    assert s["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert s["spec"]["serviceName"] == FULL
    assert s["spec"]["podManagementPolicy"] == "Parallel"
    spec = pod_spec(s)
    assert spec["schedulerName"] == "my-sched"
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert [*c["command"], *c["args"]] == ["gpu-scheduler-check", "serve"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert "nvidia.com/gpu" not in str(c["resources"])


def test_downward_api_environment() -> None:
    (c,) = pod_spec(sts(render(CHART)))["containers"]
    env = env_of(c)
    field = {k: v["fieldRef"]["fieldPath"] for k, v in env.items() if isinstance(v, dict)}
    assert field == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "NODE_NAME": "spec.nodeName",
        "POD_INDEX": "metadata.labels['apps.kubernetes.io/pod-index']",
        "GPU_SCHEDULING_MAP": "metadata.annotations['gpu-scheduling-map']",
    }
    assert env["GPU_INJECTION_MODE"] == "cuda"
    assert env["CHECK_INTERVAL_SECONDS"] == "30"
    assert env["CHECK_PORT"] == "8080"
    # Nodes are assumed to have GPUs: NVML unavailable fails the check unless declared otherwise.
    assert env["CHECK_EXPECT_NO_GPU"] == "false"
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "File"
    # CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES come from the webhook, never from the chart.
    assert not {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"} & env.keys()


def test_headless_service() -> None:
    svc = one(render(CHART), "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == SELECTOR


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_network_policies() -> None:
    """On by default: the check pods accept only the check port and connect nowhere; the
    helm test pod accepts nothing (its egress goes to the apiserver)."""
    docs = render(CHART, namespace=NS)
    check = one(docs, "NetworkPolicy", FULL)["spec"]
    assert check["podSelector"] == {"matchLabels": {**SELECTOR, "app.kubernetes.io/component": "check"}}
    assert check["policyTypes"] == ["Ingress", "Egress"]
    assert check["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert "egress" not in check  # Egress without rules: no connection out
    tests = one(docs, "NetworkPolicy", f"{FULL}-test")["spec"]
    assert tests["policyTypes"] == ["Ingress"] and "ingress" not in tests
    # Each selects its own pods only.
    pod_labels = sts(docs)["spec"]["template"]["metadata"]["labels"]
    hook_pods = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in find(docs, "Pod") if is_hook(d)
    }
    assert set(hook_pods) == {"test", "wait-ready"}
    test_labels = hook_pods["test"]["metadata"]["labels"]
    # The wait-ready hook pod, too, is the test policy's and nobody else's.
    wait_labels = hook_pods["wait-ready"]["metadata"]["labels"]
    assert selects(tests["podSelector"]["matchLabels"], wait_labels)
    assert not selects(check["podSelector"]["matchLabels"], wait_labels)
    assert not selects(SELECTOR, wait_labels)
    assert selects(check["podSelector"]["matchLabels"], pod_labels)
    assert not selects(check["podSelector"]["matchLabels"], test_labels)
    assert selects(tests["podSelector"]["matchLabels"], test_labels)
    assert not selects(tests["podSelector"]["matchLabels"], pod_labels)
    # Neither the StatefulSet nor the headless Service picks the test pod.
    assert not selects(SELECTOR, test_labels)
    # Peers, and off.
    peers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    docs = render(CHART, values={"networkPolicy": {"from": peers}})
    assert one(docs, "NetworkPolicy", FULL)["spec"]["ingress"][0]["from"] == peers
    assert not find(render(CHART, set_args=["networkPolicy.enabled=false"]), "NetworkPolicy")
    assert [
        d["metadata"]["name"] for d in find(render(CHART, set_args=["tests.enabled=false"]), "NetworkPolicy")
    ] == [FULL]
    assert template(CHART, set_args=["networkPolicy.form[0].x=1"]).returncode != 0


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_every_container_bounds_its_ephemeral_storage(values_file: Path) -> None:
    for doc in render(CHART, [values_file]):
        if doc["kind"] not in ("StatefulSet", "Pod"):
            continue
        spec = pod_spec(doc)
        for c in spec["containers"]:
            assert c["resources"]["requests"]["ephemeral-storage"], doc["metadata"]["name"]
            assert c["resources"]["limits"]["ephemeral-storage"], doc["metadata"]["name"]
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                assert v["emptyDir"]["sizeLimit"], doc["metadata"]["name"]


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_restricted_security_context(values_file: Path) -> None:
    for doc in render(CHART, [values_file]):
        if doc["kind"] not in ("StatefulSet", "Pod"):
            continue
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsUser"] == 65532


def component_hooks(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    """The hook objects of one component: ``test`` (verify-release) or ``wait-ready``."""
    return [
        d
        for d in docs
        if is_hook(d) and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]


VERIFICATION_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Pod"}


def verification(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verification (``helm test``) Pod and its RBAC, hooks or not."""
    return [
        d
        for d in docs
        if d["kind"] in VERIFICATION_KINDS
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "test"
    ]


def helm_test_hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `helm test` (and `helm test --logs`) walks: the objects whose helm.sh/hook names test."""
    return [
        d
        for d in docs
        if "test" in (d["metadata"].get("annotations") or {}).get("helm.sh/hook", "").split(",")
    ]


def test_verify_release_helm_test() -> None:
    docs = render(CHART, namespace=NS)
    hooks = verification(docs)
    assert {d["kind"] for d in hooks} == {"ServiceAccount", "Role", "RoleBinding", "Pod"}
    # The Pod is the chart's only test hook: `helm test --logs` asks for the logs of a pod named
    # as each test hook, whatever its kind. The RBAC are objects of the release (installed with
    # it, removed by `helm uninstall`), rendered only with tests.enabled.
    assert [(d["kind"], d["metadata"]["name"]) for d in helm_test_hooks(docs)] == [("Pod", f"{FULL}-test")]
    assert not [d for d in hooks if d["kind"] != "Pod" and is_hook(d)]
    # Named apart from the pod (and from the 0.1 test hooks a helm test left behind, so an
    # upgrade never collides with them).
    role = one(hooks, "Role", f"{FULL}-verify")
    # Least privilege: read the pods, and the StatefulSet for its replica count; create pods
    # for the init container's dry-run (wait-ready); nothing else.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
    ]
    sa = one(hooks, "ServiceAccount")
    for binding in find(hooks, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NS}
        ]
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
    assert {b["metadata"]["name"] for b in find(hooks, "RoleBinding")} == {
        f"{FULL}-verify",
        f"{FULL}-verify-lease",
    }
    pod = one(hooks, "Pod")
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    (c,) = pod["spec"]["containers"]
    assert [*c["command"], *c["args"]] == [
        "gpu-scheduler-check",
        "verify-release",
        "--namespace",
        NS,
        "--selector",
        f"app.kubernetes.io/name=gpu-scheduler-check,app.kubernetes.io/instance={REL}",
        "--timeout",
        "120",
        "--termination-message-path",
        "/dev/termination-log",
    ]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # Kept for --logs until the next `helm test` replaces it.
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert not verification(render(CHART, set_args=["tests.enabled=false"]))


def test_the_verification_is_also_an_argocd_sync_hook_in_the_resources_wave() -> None:
    """Argo CD runs the same pod (and its RBAC) as a Sync hook in wave 0: a PostSync hook, or
    a hook in another wave (Argo CD reads helm.sh/hook-weight as the wave), would wait for
    every resource to be Healthy, which a misplaced replica never is. For Helm only the Pod is
    a (test) hook; the RBAC carry Argo CD's hook annotations alone, which make them Sync hooks
    there as before (Argo CD ignores an object only when it has a helm.sh/hook and none of
    its own), created in the wave before the Pod (kind order)."""
    for mode in ("cuda", "dra"):
        docs = render(CHART, set_args=[f"gpuScheduling.injectionMode={mode}"])
        hooks = verification(docs)
        kinds = {"ServiceAccount", "Role", "RoleBinding", "Pod"}
        assert {d["kind"] for d in hooks} == (
            kinds | {"ClusterRole", "ClusterRoleBinding"} if mode == "dra" else kinds
        )
        for d in hooks:
            ann = d["metadata"]["annotations"]
            assert ann["argocd.argoproj.io/hook"] == "Sync", d["kind"]
            assert ann["argocd.argoproj.io/sync-wave"] == "0", d["kind"]
            assert ann["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation,HookSucceeded"
            assert ("helm.sh/hook" in ann) == (d["kind"] == "Pod"), d["kind"]
            assert not [k for k in ann if k.startswith("helm.sh/") and d["kind"] != "Pod"], d["kind"]
        # Nothing else in the chart carries a wave: the sync is one step.
        assert not [
            d
            for d in docs
            if d not in hooks and "argocd.argoproj.io/sync-wave" in (d["metadata"].get("annotations") or {})
        ]
    off = verification(render(CHART, set_args=["tests.argocdHook=false"]))
    assert off and not [
        d
        for d in off
        if any(k.startswith("argocd.argoproj.io/") for k in (d["metadata"].get("annotations") or {}))
    ]
    (pod,) = find(verification(render(CHART, set_args=["tests.timeoutSeconds=15"])), "Pod")
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--timeout") + 1] == "15"


def test_hook_pods_run_where_the_scheduler_runs_not_on_the_mapped_gpu_nodes() -> None:
    """The hook pods (the verification pod: helm test and Argo CD Sync hook; Helm's
    pre-install/pre-upgrade wait-ready pod) only call the API: by default they go where
    gpu-scheduler-chart puts the scheduler and the webhook (control-plane nodes preferred, never
    required, their NoSchedule taint tolerated); the StatefulSet keeps its own tolerations and
    only the Linux nodeSelector (the map places it). Every pod selects Linux nodes."""
    control_plane = [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"},
    ]
    prefer = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                        ]
                    },
                }
            ]
        }
    }
    docs = render(CHART)
    hook_pods = [d for d in docs if is_hook(d) and d["kind"] == "Pod"]
    assert {p["spec"]["containers"][0]["args"][0] for p in hook_pods} == {"verify-release", "wait-ready"}
    for pod in hook_pods:
        assert pod["spec"]["nodeSelector"] == {
            "kubernetes.io/os": "linux"
        }  # a managed cluster has no control-plane node
        assert pod["spec"]["affinity"] == prefer
        assert pod["spec"]["tolerations"] == control_plane
    spec = pod_spec(sts(docs))
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in spec and "affinity" not in spec
    # Requiring control-plane nodes (as before 0.2.0), or another pool; the preference off.
    required = {"hookPods": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}
    assert [p["spec"]["nodeSelector"] for p in find(render(CHART, values=required), "Pod")] == [
        {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""}
    ] * len(hook_pods)
    anywhere = {"preferControlPlane": False, "tolerations": [], "nodeSelector": {"kubernetes.io/os": None}}
    off = find(render(CHART, values={"hookPods": anywhere}), "Pod")
    assert len(off) == len(hook_pods)
    assert all(not {"nodeSelector", "tolerations", "affinity"} & set(p["spec"]) for p in off)
    res = template(CHART, values={"hookPods": {"nodeselector": {}}})
    assert res.returncode != 0 and "nodeselector" in res.stderr


def test_long_release_names_fit_pod_names() -> None:
    docs = render(CHART, release="r" * 53)
    name = sts(docs)["metadata"]["name"]
    # <statefulset>-<ordinal> and the controller-revision-hash label must stay within 63.
    assert len(name) <= 52


@pytest.mark.parametrize("values_file", ci_values(CHART), ids=lambda p: p.name)
def test_gpu_less_ci_scenarios_declare_it(values_file: Path) -> None:
    # Every ci/ scenario runs on nodes without GPUs (kwok, a ct test cluster): declared explicitly.
    (c,) = pod_spec(sts(render(CHART, [values_file])))["containers"]
    assert env_of(c)["CHECK_EXPECT_NO_GPU"] == "true"


@pytest.mark.parametrize(("declared", "exit_code"), [(None, 1), ("true", 0), ("false", 1)])
def test_expect_no_gpu_reaches_the_check(fake_nvml: Path, declared: str | None, exit_code: int) -> None:
    """The rendered container env, with the downward-API values a pod would get, run by the check
    where NVML cannot initialise (the fake answers "driver not loaded")."""
    set_args = [f"check.expectNoGPU={declared}"] if declared else []
    s = sts(render(CHART, namespace=NS, set_args=set_args))
    (c,) = pod_spec(s)["containers"]
    env = {k: v for k, v in env_of(c).items() if isinstance(v, str)}
    env.update(
        POD_NAME=f"{FULL}-1",
        POD_NAMESPACE=NS,
        NODE_NAME="node2",
        POD_INDEX="1",
        GPU_SCHEDULING_MAP=s["spec"]["template"]["metadata"]["annotations"][ANNOTATION],
        CUDA_VISIBLE_DEVICES="2",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
    )
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    res = subprocess.run(
        [str(Path(sys.executable).parent / "gpu-scheduler-check"), "once"],
        env={**base, **env, **nvml_env(fake_nvml, gpus=4, init_error=9)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == exit_code, res.stderr


# ---------------------------------------------------------------- the wait-ready hook
WAIT = f"{FULL}-wait-ready"
LEASE_RULE = {
    "apiGroups": ["coordination.k8s.io"],
    "resources": ["leases"],
    "resourceNames": ["gpu-scheduler"],
    "verbs": ["get"],
}


def wait_hooks(**kw: Any) -> list[dict[str, Any]]:
    return component_hooks(render(CHART, namespace=NS, **kw), "wait-ready")


def wait_args(container: dict[str, Any]) -> dict[str, str]:
    args = container["args"]
    assert args[0] == "wait-ready" and container["command"] == ["gpu-scheduler-check"]
    return dict(zip(args[1::2], args[2::2], strict=True))


def test_wait_ready_is_a_helm_pre_install_hook_that_argocd_skips() -> None:
    """Helm: pre-install/pre-upgrade, RBAC first by weight. Argo CD: Skip, so that every
    Argo CD hook of the chart stays in wave 0 (a second wave would make Argo CD wait for the
    StatefulSet to be Healthy before a failed verification could end the sync)."""
    docs = render(CHART, namespace=NS)
    hooks = component_hooks(docs, "wait-ready")
    assert sorted((d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in hooks) == sorted(
        [
            ("ServiceAccount", WAIT, NS),
            ("Role", WAIT, NS),
            ("RoleBinding", WAIT, NS),
            ("Role", f"{WAIT}-lease", "gpu-scheduler-system"),
            ("RoleBinding", f"{WAIT}-lease", "gpu-scheduler-system"),
            ("Pod", WAIT, NS),
        ]
    )
    for d in hooks:
        ann = d["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "pre-install,pre-upgrade", d["kind"]
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert ann["argocd.argoproj.io/hook"] == "Skip", d["kind"]
        assert not {k for k in ann if k.startswith("argocd.argoproj.io/") and k != "argocd.argoproj.io/hook"}
    weight = {
        (d["kind"], d["metadata"]["name"]): int(d["metadata"]["annotations"]["helm.sh/hook-weight"])
        for d in hooks
    }
    pod_weight = weight.pop(("Pod", WAIT))
    assert pod_weight > max(weight.values())
    assert max(w for (k, _), w in weight.items() if k in ("ServiceAccount", "Role")) < min(
        w for (k, _), w in weight.items() if k == "RoleBinding"
    )
    # What Argo CD runs is all in one wave (0): no object of the chart names another.
    argocd = [d for d in docs if d not in hooks]
    assert {
        (d["metadata"].get("annotations") or {}).get("argocd.argoproj.io/sync-wave", "0") for d in argocd
    } == {"0"}


def test_wait_ready_rbac_is_least_privilege() -> None:
    hooks = wait_hooks()
    roles = {d["metadata"]["name"]: d for d in hooks if d["kind"] == "Role"}
    # create pods (a dry-run still needs the right) in its own namespace; nothing else there.
    assert roles[WAIT]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    # get on the scheduler's one Lease, in the scheduler's namespace.
    assert roles[f"{WAIT}-lease"]["rules"] == [LEASE_RULE]
    sa = one(hooks, "ServiceAccount")["metadata"]["name"]
    for b in find(hooks, "RoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
        assert b["roleRef"]["name"] == b["metadata"]["name"]
        assert b["metadata"]["namespace"] == roles[b["roleRef"]["name"]]["metadata"]["namespace"]
    assert one(hooks, "Pod")["spec"]["serviceAccountName"] == sa


def test_wait_ready_pod_runs_the_check_program_on_the_charts_map() -> None:
    docs = render(
        CHART, namespace=NS, set_args=["schedulerName=my-sched", "gpuScheduling.injectionMode=nvidia"]
    )
    pod = one(component_hooks(docs, "wait-ready"), "Pod")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 240 + 60
    (c,) = spec["containers"]
    arg = wait_args(c)
    assert arg["--namespace"] == NS
    # The very map the StatefulSet's pods carry.
    carried = sts(docs)["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    assert arg["--map"] == carried.rstrip("\n") and parse(arg["--map"]) == parse(carried)
    assert arg["--scheduler-name"] == "my-sched"
    assert arg["--mode"] == "nvidia"
    assert (arg["--lease-namespace"], arg["--lease-name"]) == ("gpu-scheduler-system", "gpu-scheduler")
    assert arg["--image"] == c["image"] == sts(docs)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert arg["--service-account"] == spec["serviceAccountName"]
    assert (arg["--timeout"], arg["--interval"]) == ("240", "2")
    assert arg["--termination-message-path"] == c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_verification_pod_waits_first_with_the_same_command() -> None:
    """Under Argo CD (and `helm test`) the wait is the verification Pod's init container: the
    pre-install hook's command, as the verification's ServiceAccount, which holds its rights."""
    docs = render(CHART, namespace=NS)
    pre_install = one(component_hooks(docs, "wait-ready"), "Pod")
    tests = verification(docs)
    pod = one(tests, "Pod")
    (init,) = pod["spec"]["initContainers"]
    (pre,) = pre_install["spec"]["containers"]
    assert init["name"] == "wait-ready" and init["command"] == pre["command"]
    assert {**wait_args(init), "--service-account": "x"} == {**wait_args(pre), "--service-account": "x"}
    assert wait_args(init)["--service-account"] == pod["spec"]["serviceAccountName"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert init["securityContext"] == pod["spec"]["containers"][0]["securityContext"]
    (lease_role,) = [d for d in tests if d["kind"] == "Role" and d["metadata"]["name"].endswith("-lease")]
    assert lease_role["metadata"]["namespace"] == "gpu-scheduler-system" and lease_role["rules"] == [
        LEASE_RULE
    ]
    # Off: no init container, no Lease Role, no create right.
    off = verification(render(CHART, namespace=NS, set_args=["waitReady.enabled=false"]))
    assert "initContainers" not in one(off, "Pod")["spec"]
    assert [r["verbs"] for r in one(off, "Role")["rules"]] == [["get", "list"], ["get"]]


def test_wait_ready_values() -> None:
    custom = wait_hooks(
        values={
            "waitReady": {
                "timeoutSeconds": 30,
                "intervalSeconds": 5,
                "lease": {"namespace": "sched", "name": "my-lease"},
            }
        }
    )
    lease_role = one([d for d in custom if d["metadata"]["name"].endswith("-lease")], "Role")
    assert lease_role["metadata"]["namespace"] == "sched"
    assert lease_role["rules"][0]["resourceNames"] == ["my-lease"]
    arg = wait_args(one(custom, "Pod")["spec"]["containers"][0])
    assert (arg["--timeout"], arg["--interval"], arg["--lease-name"]) == ("30", "5", "my-lease")
    assert one(custom, "Pod")["spec"]["activeDeadlineSeconds"] == 90
    # The scheduler in the check's own namespace: two Roles, two names, no clash.
    same = wait_hooks(values={"waitReady": {"lease": {"namespace": NS}}})
    assert len({(d["kind"], d["metadata"]["name"]) for d in same}) == len(same) == 6
    # No Lease (leader election off): no Lease RBAC, and the program skips the check.
    no_lease = render(CHART, namespace=NS, values={"waitReady": {"lease": {"name": ""}}})
    assert {(d["kind"], d["metadata"]["namespace"]) for d in component_hooks(no_lease, "wait-ready")} == {
        ("ServiceAccount", NS),
        ("Role", NS),
        ("RoleBinding", NS),
        ("Pod", NS),
    }
    assert not [d for d in no_lease if d["metadata"]["name"].endswith("-lease")]
    assert (
        wait_args(one(component_hooks(no_lease, "wait-ready"), "Pod")["spec"]["containers"][0])[
            "--lease-name"
        ]
        == ""
    )
    assert not wait_hooks(set_args=["waitReady.enabled=false"])


@pytest.mark.parametrize(
    "bad",
    [
        "waitReady.timeoutSecond=3",
        "waitReady.timeoutSeconds=0",
        "waitReady.lease.namespace=",
        "waitReady.lease.namespace=Bad_NS",
        "waitReady.lease.nam=x",
    ],
)
def test_schema_rejects_bad_wait_ready_values(bad: str) -> None:
    assert template(CHART, set_args=[bad]).returncode != 0


def test_dra_mode_lets_the_helm_test_read_claims_and_slices_and_nothing_more() -> None:
    """gpuScheduling.injectionMode=dra: verify-release --mode dra, get on the namespace's
    ResourceClaims and list on the (cluster-scoped) ResourceSlices; without it, neither."""
    docs = render(CHART, namespace=NS, set_args=["gpuScheduling.injectionMode=dra"])
    hooks = verification(docs)
    role = one(hooks, "Role", f"{FULL}-verify")
    assert role["rules"][-1] == {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get"],
    }
    cluster_role = one(hooks, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}
    ]
    binding = one(hooks, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULL}-verify", "namespace": NS}]
    # Objects of the release, as the other RBAC: the Pod stays the only test hook.
    assert not is_hook(cluster_role) and not is_hook(binding)
    assert [d["kind"] for d in helm_test_hooks(docs)] == ["Pod"]
    (c,) = one(hooks, "Pod")["spec"]["containers"]
    assert c["args"][c["args"].index("--mode") + 1] == "dra"
    (init,) = one(hooks, "Pod")["spec"]["initContainers"]
    assert init["args"][init["args"].index("--mode") + 1] == "dra"
    env = env_of(sts(docs)["spec"]["template"]["spec"]["containers"][0])
    assert env["GPU_INJECTION_MODE"] == "dra"
    plain = verification(render(CHART, namespace=NS))
    assert (
        not find(plain, "ClusterRole") and "--mode" not in one(plain, "Pod")["spec"]["containers"][0]["args"]
    )
    assert "resource.k8s.io" not in str(one(plain, "Role", f"{FULL}-verify")["rules"])
