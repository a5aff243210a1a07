"""POST /validate through the Flask test client.

Node look-ups go through the ``NodeLookup`` seam: a table of nodes here, the real
kubernetes client in tests/integration/test_webhook_cluster.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.nodes import NodeCache, NodeInfo, NodeLookupUnavailable, _entry
from kube_gpu_scheduler.webhook.settings import Settings
from localcluster.admission import admission_review

MAP = "0=node1:0,1\n1=node2:2\n"


class Nodes:
    """The NodeLookup seam, answering from a table; counts the look-ups."""

    def __init__(self, gpus: dict[str, int | None] | None = None, unavailable: str | None = None):
        self.gpus = gpus if gpus is not None else {"node1": 4, "node2": 4}
        self.unavailable = unavailable
        self.asked: list[str] = []

    def get(self, name: str) -> NodeInfo | None:
        self.asked.append(name)
        if self.unavailable:
            raise NodeLookupUnavailable(self.unavailable)
        return NodeInfo(name, self.gpus[name]) if name in self.gpus else None


def statefulset(
    annotation: str | None = MAP,
    replicas: int | None = 2,
    scheduler: str | None = "gpu-scheduler",
    containers: list[dict[str, Any]] | None = None,
    start: int | None = None,
) -> dict[str, Any]:
    template_meta: dict[str, Any] = {"labels": {"app": "w"}}
    if annotation is not None:
        template_meta["annotations"] = {"gpu-scheduling-map": annotation}
    pod_spec: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "busybox"}]}
    if scheduler is not None:
        pod_spec["schedulerName"] = scheduler
    spec: dict[str, Any] = {
        "serviceName": "w",
        "selector": {"matchLabels": {"app": "w"}},
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    if start is not None:
        spec["ordinals"] = {"start": start}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "w", "namespace": "team"},
        "spec": spec,
    }


def review(obj: dict[str, Any] | None, operation: str = "CREATE", uid: str = "uid-v") -> dict[str, Any]:
    return admission_review(obj, kind="StatefulSet", uid=uid, operation=operation, name="w", resource=True)


def validate(
    obj: dict[str, Any] | None, nodes: Any = None, operation: str = "CREATE", **settings: Any
) -> dict:
    app = create_app(Settings(**settings), node_lookup=nodes if nodes is not None else Nodes())
    resp = app.test_client().post("/validate", json=review(obj, operation))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    response = resp.get_json()["response"]
    assert response["uid"] == "uid-v"
    assert "patch" not in response
    return response


def test_good_statefulset_is_allowed_without_warnings() -> None:
    nodes = Nodes()
    response = validate(statefulset(), nodes)
    assert response["allowed"] is True
    assert "warnings" not in response
    assert sorted(nodes.asked) == ["node1", "node2"]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_malformed_map_is_denied_with_line_numbers(operation: str) -> None:
    response = validate(statefulset("0=node1:0\n\n0=node2:1\n1=Node_2:x\n"), operation=operation)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    assert "spec.template.metadata.annotations" in message
    assert "line 3: ordinal 0 is already mapped on line 1" in message
    assert "line 4:" in message and "'Node_2'" in message


def test_replicas_without_an_entry_are_warned_about() -> None:
    response = validate(statefulset(replicas=4))
    assert response["allowed"] is True
    assert response["warnings"] == [
        "gpu-scheduling-map has no entry for ordinal 2, 3 (2 of 4 replicas): "
        "those pods get no GPU variables and cannot be placed"
    ]


def test_replicas_default_to_one() -> None:
    response = validate(statefulset("1=node2:2\n", replicas=None))
    assert "no entry for ordinal 0 (1 of 1 replicas)" in response["warnings"][0]


def test_ordinals_start_is_honoured() -> None:
    assert "warnings" not in validate(statefulset("5=node1:0\n6=node2:0\n", replicas=2, start=5))
    response = validate(statefulset("5=node1:0\n", replicas=2, start=5))
    assert "ordinal 6 (1 of 2" in response["warnings"][0]


def test_huge_replica_count_lists_a_few_missing_ordinals() -> None:
    response = validate(statefulset(replicas=2_000_000_000))
    assert (
        "ordinal 2, 3, 4, 5, 6 and 1999999993 more (1999999998 of 2000000000 replicas)"
        in response["warnings"][0]
    )


def test_unknown_node_is_warned_about() -> None:
    response = validate(statefulset("0=node1:0\n1=ghost:1\n2=ghost:2\n", replicas=3))
    assert response["allowed"] is True
    assert response["warnings"] == [
        "gpu-scheduling-map: node 'ghost' (ordinals 1, 2, line 2, 3) does not exist; "
        "those replicas stay Pending until it does"
    ]


def test_gpu_index_beyond_allocatable_is_warned_about() -> None:
    nodes = Nodes({"node1": 4, "node2": 2})
    response = validate(statefulset("0=node1:3\n1=node2:1,2,5\n", replicas=2), nodes)
    assert response["allowed"] is True
    assert response["warnings"] == [
        "gpu-scheduling-map line 2: ordinal 1 wants GPU 2,5 but node 'node2' has 2 allocatable nvidia.com/gpu "
        "(indices 0..1)",
    ]


def test_node_without_gpus_is_warned_about() -> None:
    nodes = Nodes({"node1": 4, "cpu1": None, "empty": 0})
    text = "0=node1:3\n1=cpu1:0\n2=cpu1:1,2\n3=empty:0\n"
    response = validate(statefulset(text, replicas=4), nodes)
    assert response["allowed"] is True
    assert response["warnings"] == [
        "gpu-scheduling-map: node 'cpu1' reports no nvidia.com/gpu (no GPUs, or no NVIDIA device plugin), "
        "so the GPUs mapped to it cannot be checked: ordinal 1 (line 2) GPU 0; ordinal 2 (line 3) GPU 1,2",
        "gpu-scheduling-map line 4: ordinal 3 wants GPU 0 but node 'empty' has 0 allocatable nvidia.com/gpu",
    ]


def test_no_api_access_skips_node_checks_and_says_so_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="webhook")
    nodes = Nodes(unavailable="no Kubernetes API access (test)")
    response = validate(statefulset("0=ghost:0\n", replicas=1), nodes)
    assert response["allowed"] is True
    assert "warnings" not in response
    assert nodes.asked == ["ghost"]  # stopped after the first refusal
    skipped = [r for r in caplog.records if "node checks skipped" in r.getMessage()]
    assert skipped and skipped[0].levelno == logging.DEBUG
    assert getattr(skipped[0], "statefulset", None) == "team/w"


def eventually(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def why_unavailable(lookup: NodeCache, name: str = "node1") -> str:
    with pytest.raises(NodeLookupUnavailable) as info:
        lookup.get(name)
    return str(info.value)


def test_node_cache_without_any_config_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    lookup = NodeCache(kubeconfig=None)
    # Right away, before its thread has done anything: unavailable (a look-up never waits).
    why_unavailable(lookup)
    eventually(
        lambda: "neither KUBECONFIG nor an in-cluster" in why_unavailable(lookup), "the thread to give up"
    )
    assert not lookup.synced
    # and /validate still answers, without node warnings
    response = validate(statefulset("0=ghost:0\n", replicas=1), lookup)
    assert response["allowed"] is True and "warnings" not in response


def test_node_cache_with_an_unreachable_api_is_unavailable(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    lookup = NodeCache(kubeconfig=str(kubeconfig), backoff_max_s=1.0)
    try:
        eventually(lambda: why_unavailable(lookup).startswith("cannot list nodes: "), "a failed list")
        response = validate(statefulset("0=ghost:0\n", replicas=1), lookup)
        assert response["allowed"] is True and "warnings" not in response
        assert not lookup.synced and lookup.lists == 0
    finally:
        lookup.stop()


def test_app_starts_the_node_cache_in_the_serving_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    lookup = NodeCache(kubeconfig=None)
    app = create_app(Settings(), node_lookup=lookup)
    assert lookup._pid is None  # create_app (which may run before gunicorn forks) starts nothing
    app.test_client().get("/healthz")
    eventually(lambda: "neither KUBECONFIG" in why_unavailable(lookup), "the cache thread to run")


@pytest.mark.parametrize(
    ("status", "gpus"),
    [
        ({"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "9"}}, 8),
        # As the scheduler reads it: capacity when allocatable does not say (was allocatable only).
        ({"capacity": {"nvidia.com/gpu": "2"}}, 2),
        ({"allocatable": {"cpu": "4"}}, None),
        (None, None),
    ],
)
def test_the_node_cache_reads_gpus_as_the_scheduler_does(
    status: dict[str, Any] | None, gpus: int | None
) -> None:
    assert _entry({"metadata": {"name": "n"}, "status": status}) == ("n", gpus)


def test_gpu_resource_in_the_template_warns_or_denies() -> None:
    containers = [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    warned = validate(statefulset(containers=containers))
    assert warned["allowed"] is True
    assert any(
        w.startswith("the pod template also requests nvidia.com/gpu ('main')") for w in warned["warnings"]
    )
    denied = validate(statefulset(containers=containers), gpu_resource_policy="deny")
    assert denied["allowed"] is False
    assert denied["status"]["code"] == 403


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_nvidia_cdi_mode_refuses_a_template_naming_another_runtime_class(operation: str) -> None:
    obj = statefulset()
    obj["spec"]["template"]["spec"]["runtimeClassName"] = "gvisor"
    denied = validate(obj, operation=operation, injection_mode="nvidia-cdi")
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    assert denied["status"]["message"].startswith(
        "spec.template.spec.runtimeClassName is 'gvisor', but this cluster's GPU injection (device mode "
        "nvidia-cdi) gives the map's GPUs through RuntimeClass 'nvidia'"
    )
    # Its own class, another configured one, no class given, another scheduler's pods, other modes.
    obj["spec"]["template"]["spec"]["runtimeClassName"] = "nvidia"
    assert validate(obj, injection_mode="nvidia-cdi")["allowed"] is True
    obj["spec"]["template"]["spec"]["runtimeClassName"] = "gvisor"
    assert validate(obj, injection_mode="nvidia-cdi", runtime_class_name="gvisor")["allowed"] is True
    assert validate(obj, injection_mode="nvidia-cdi", runtime_class_name="")["allowed"] is True
    assert validate(obj, injection_mode="nvidia")["allowed"] is True
    other = validate(obj, injection_mode="nvidia-cdi", scheduler_name="gpu-sched-b")
    assert other["allowed"] is True and "gpu-sched-b" in other["warnings"][0]


def test_default_scheduler_is_warned_about() -> None:
    response = validate(statefulset(scheduler=None))
    assert response["warnings"] == [
        "spec.template.spec.schedulerName is not set: the default scheduler will place these pods and ignore "
        "gpu-scheduling-map; set it to the GPU scheduler's name (gpu-scheduler)"
    ]
    assert validate(statefulset(scheduler="default-scheduler"))["warnings"] == response["warnings"]


def test_scheduler_name_is_the_configured_one() -> None:
    # The configured name is the one pods must use: gpu-scheduler itself is then "another scheduler".
    response = validate(statefulset(scheduler="gpu-scheduler"), scheduler_name="gpu-sched-b")
    assert response["warnings"] == [
        "spec.template.spec.schedulerName is 'gpu-scheduler', not the GPU scheduler (gpu-sched-b): these pods "
        "get no GPU variables and their node is not the map's; set it to gpu-sched-b"
    ]
    assert "warnings" not in validate(statefulset(scheduler="gpu-sched-b"), scheduler_name="gpu-sched-b")
    unset = validate(statefulset(scheduler=None), scheduler_name="gpu-sched-b")
    assert unset["warnings"][0].endswith("set it to the GPU scheduler's name (gpu-sched-b)")


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "gpu-scheduler-b"])
def test_a_map_not_of_this_scheduler_is_not_parsed(scheduler: str | None, monkeypatch: Any) -> None:
    """Another release's map (or one no scheduler reads) is its own release's to check: said
    so, never parsed here, so N releases side by side cost what one does."""
    import kube_gpu_scheduler.webhook.validate as v

    def parse_cached(text: str) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(v, "parse_cached", parse_cached)
    response = validate(statefulset("0=node1:x\n", scheduler=scheduler))
    assert response["allowed"] is True
    (said,) = response["warnings"]
    assert said.startswith("spec.template.spec.schedulerName is ")


def test_pci_bus_ids_are_refused_for_this_schedulers_statefulsets_only() -> None:
    """GPUNameNeedsDRA on this scheduler's StatefulSets; another scheduler (a second release
    of the chart in DRA mode) may name GPUs by PCI bus ID, and its StatefulSet is only warned
    about (it is not this scheduler's)."""
    text = "0=node1:0000:3b:00.0\n"
    ours = validate(statefulset(text, replicas=1))
    assert ours["allowed"] is False and ours["status"]["code"] == 400
    assert "PCI bus IDs name GPUs only in DRA mode" in ours["status"]["message"]
    theirs = validate(statefulset(text, replicas=1, scheduler="gpu-scheduler-dra"))
    assert theirs["allowed"] is True, theirs
    assert [w.split(":")[0] for w in theirs["warnings"]] == [
        "spec.template.spec.schedulerName is 'gpu-scheduler-dra', not the GPU scheduler (gpu-scheduler)"
    ]


def test_node_name_in_the_template_is_warned_about() -> None:
    obj = statefulset()
    obj["spec"]["template"]["spec"]["nodeName"] = "node1"
    response = validate(obj)
    assert response["allowed"] is True
    assert response["warnings"] == [
        "spec.template.spec.nodeName is set ('node1'): every pod of this StatefulSet will be refused, because "
        "a pod carrying gpu-scheduling-map must be placed by gpu-scheduler; remove nodeName"
    ]


def test_map_on_the_statefulset_itself_is_warned_about() -> None:
    obj = statefulset(annotation=None)
    obj["metadata"]["annotations"] = {"gpu-scheduling-map": MAP}
    response = validate(obj)
    assert response["allowed"] is True
    assert "spec.template.metadata.annotations" in response["warnings"][0]


def test_statefulset_without_a_map_is_allowed_silently() -> None:
    nodes = Nodes()
    response = validate(statefulset(annotation=None, scheduler=None), nodes)
    assert response["allowed"] is True and "warnings" not in response
    assert nodes.asked == []


def test_delete_is_allowed() -> None:
    assert validate(None, operation="DELETE")["allowed"] is True


def test_warnings_are_capped() -> None:
    text = "".join(f"{i}=ghost-{i}:0\n" for i in range(40))
    response = validate(statefulset(text, replicas=40))
    assert len(response["warnings"]) == 12
    assert response["warnings"][-1].startswith("... and ")
    assert all(len(w) <= 256 for w in response["warnings"])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("replicas", "3", "spec.replicas must be a non-negative integer"),
        ("replicas", True, "spec.replicas must be a non-negative integer"),
        ("ordinals", {"start": -1}, "spec.ordinals.start must be a non-negative integer"),
        ("template", [], "spec.template must be an object"),
    ],
)
def test_wrong_shapes_are_400_not_500(field: str, value: Any, message: str) -> None:
    obj = statefulset()
    obj["spec"][field] = value
    app = create_app(Settings(), node_lookup=Nodes())
    resp = app.test_client().post("/validate", json=review(obj))
    assert resp.status_code == 400
    body = resp.get_json()
    assert body["response"]["uid"] == "uid-v"
    assert message in body["response"]["status"]["message"]


def test_pod_sent_to_validate_is_400() -> None:
    body = review(statefulset())
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    resp = create_app(Settings(), node_lookup=Nodes()).test_client().post("/validate", json=body)
    assert resp.status_code == 400
    assert (
        "/validate admits apps/v1 StatefulSets, got v1 Pod"
        in resp.get_json()["response"]["status"]["message"]
    )
