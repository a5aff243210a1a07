"""POST /mutate through the Flask test client: the JSONPatch is applied and the resulting pod checked."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.settings import Settings
from localcluster.admission import admission_review

MAP = "# replicas\n0=node1:0,1\n1=node2:2\n2=node3:3,1\n"


class NoNodes:
    def get(self, name: str) -> None:
        raise AssertionError("/mutate must not look nodes up")


def client(**overrides: Any) -> Any:
    return create_app(Settings(**overrides), node_lookup=NoNodes()).test_client()


def pod(
    name: str = "w-1",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    annotation: str | None = MAP,
    labels: dict[str, str] | None = None,
    scheduler: str | None = "gpu-scheduler",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "team"}
    if annotation is not None:
        metadata["annotations"] = {"gpu-scheduling-map": annotation}
    if labels is not None:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"containers": containers or [{"name": "main", "image": "busybox"}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review(
    obj: dict[str, Any], uid: str = "uid-1", operation: str = "CREATE", name: str | None = None
) -> dict:
    return admission_review(obj, uid=uid, operation=operation, name=name, resource=True)


def admit(c: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    resp = c.post("/mutate", json=review(obj, **kw))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    return body["response"]


def _walk(doc: Any, path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace, strict: a replace target must exist, an array index must be in range."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _walk(doc, op["path"])
        if op["op"] == "add":
            if isinstance(parent, list):
                index = len(parent) if key == "-" else int(key)
                assert 0 <= index <= len(parent), op
                parent.insert(index, op["value"])
            else:
                parent[key] = op["value"]
        elif op["op"] == "replace":
            if isinstance(parent, list):
                assert 0 <= int(key) < len(parent), op
                parent[int(key)] = op["value"]
            else:
                assert key in parent, op
                parent[key] = op["value"]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc


def mutated(c: Any, obj: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(response, pod after the patch)."""
    response = admit(c, obj, **kw)
    assert response["allowed"] is True
    if "patch" not in response:
        return response, obj
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return response, apply_patch(obj, ops)


def env_of(container: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in container.get("env") or []]


def test_container_without_env_gets_the_entrys_gpus() -> None:
    response, out = mutated(client(), pod("w-0"))
    assert response["uid"] == "uid-1"
    assert env_of(out["spec"]["containers"][0]) == [
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ]
    assert "warnings" not in response


def test_map_order_of_gpus_is_kept() -> None:
    _, out = mutated(client(), pod("w-2"))
    assert ("CUDA_VISIBLE_DEVICES", "3,1") in env_of(out["spec"]["containers"][0])


def test_other_variables_keep_their_order_and_values() -> None:
    containers = [{"name": "main", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)"}]}]
    _, out = mutated(client(), pod("w-1", containers))
    env = env_of(out["spec"]["containers"][0])
    assert env == [
        ("CUDA_VISIBLE_DEVICES", "2"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("A", "1"),
        ("B", "$(A)"),
    ]


def test_conflicting_value_is_replaced_in_place() -> None:
    containers = [
        {
            "name": "main",
            "env": [
                {"name": "A", "value": "1"},
                {"name": "CUDA_VISIBLE_DEVICES", "value": "7"},
                {"name": "Z", "value": "2"},
            ],
        }
    ]
    _, out = mutated(client(), pod("w-1", containers))
    assert env_of(out["spec"]["containers"][0]) == [
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("A", "1"),
        ("CUDA_VISIBLE_DEVICES", "2"),
        ("Z", "2"),
    ]


def test_value_from_is_replaced_by_a_plain_value() -> None:
    value_from = {"configMapKeyRef": {"name": "gpus", "key": "devices"}}
    containers = [{"name": "main", "env": [{"name": "CUDA_VISIBLE_DEVICES", "valueFrom": value_from}]}]
    _, out = mutated(client(), pod("w-1", containers))
    env = out["spec"]["containers"][0]["env"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "2"} in env
    assert all("valueFrom" not in e for e in env)


def test_duplicate_names_all_get_the_value() -> None:
    dup = [{"name": "CUDA_VISIBLE_DEVICES", "value": "5"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "6"}]
    _, out = mutated(client(), pod("w-1", [{"name": "main", "env": dup}]))
    values = [v for n, v in env_of(out["spec"]["containers"][0]) if n == "CUDA_VISIBLE_DEVICES"]
    assert values == ["2", "2"]


def test_init_containers_and_every_container_are_patched() -> None:
    init = [{"name": "fetch"}, {"name": "warm", "env": [{"name": "X", "value": "y"}]}]
    containers = [{"name": "a"}, {"name": "b", "env": []}]
    _, out = mutated(client(), pod("w-0", containers, init=init))
    for c in out["spec"]["initContainers"] + out["spec"]["containers"]:
        env = dict(env_of(c))
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1", c["name"]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", c["name"]
    assert env_of(out["spec"]["initContainers"][1])[-1] == ("X", "y")


def test_second_call_on_the_mutated_pod_yields_no_patch() -> None:
    c = client()
    init = [{"name": "fetch", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "9"}]}]
    _, once = mutated(c, pod("w-2", [{"name": "a", "env": [{"name": "A", "value": "1"}]}], init=init))
    response, twice = mutated(c, once)
    assert "patch" not in response and "patchType" not in response
    assert twice == once


def test_pod_index_label_wins_over_the_name() -> None:
    _, out = mutated(client(), pod("odd-name", labels={"apps.kubernetes.io/pod-index": "2"}))
    assert dict(env_of(out["spec"]["containers"][0]))["CUDA_VISIBLE_DEVICES"] == "3,1"


def test_request_name_is_used_when_metadata_has_none() -> None:
    obj = pod("w-1")
    del obj["metadata"]["name"]
    _, out = mutated(client(), obj, name="w-0")
    assert dict(env_of(out["spec"]["containers"][0]))["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_nvidia_mode_sets_physical_and_renumbered_devices() -> None:
    _, out = mutated(client(injection_mode="nvidia"), pod("w-2"))
    assert env_of(out["spec"]["containers"][0]) == [
        ("NVIDIA_VISIBLE_DEVICES", "3,1"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ]


def test_nvidia_mode_replaces_a_cuda_mode_value_and_is_idempotent() -> None:
    c = client(injection_mode="nvidia")
    containers = [{"name": "a", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "2"}]}]
    _, once = mutated(c, pod("w-1", containers))
    assert dict(env_of(once["spec"]["containers"][0])) == {
        "NVIDIA_VISIBLE_DEVICES": "2",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    response, _ = mutated(c, once)
    assert "patch" not in response


CDI = "runtime.nvidia.com/gpu="


def test_nvidia_cdi_mode_names_cdi_devices_and_sets_the_runtime_class() -> None:
    """nvidia-cdi: each GPU as NVIDIA's runtime-generated CDI device, CUDA renumbered, and the
    RuntimeClass (default nvidia) that runs NVIDIA's runtime on a GPU Operator with CDI on."""
    response, out = mutated(client(injection_mode="nvidia-cdi"), pod("w-2"))
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert env_of(out["spec"]["containers"][0]) == [
        ("NVIDIA_VISIBLE_DEVICES", f"{CDI}3,{CDI}1"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ]
    assert not response.get("warnings")
    again, twice = mutated(client(injection_mode="nvidia-cdi"), out)
    assert "patch" not in again and twice == out


def test_nvidia_cdi_mode_writes_uuids_as_the_map_names_them() -> None:
    uuid = "GPU-8a3c0d4e-1234-5678-9abc-def012345678"
    _, out = mutated(client(injection_mode="nvidia-cdi"), pod("w-0", annotation=f"0=node1:{uuid.upper()}\n"))
    assert dict(env_of(out["spec"]["containers"][0]))["NVIDIA_VISIBLE_DEVICES"] == CDI + uuid


def test_nvidia_cdi_mode_with_its_own_class_named_or_none_configured() -> None:
    named = pod("w-1")
    named["spec"]["runtimeClassName"] = "nvidia"
    _, out = mutated(client(injection_mode="nvidia-cdi"), named)
    assert out["spec"]["runtimeClassName"] == "nvidia"
    # runtime_class_name "": a cluster whose default runtime is NVIDIA's in CDI mode.
    _, out = mutated(client(injection_mode="nvidia-cdi", runtime_class_name=""), pod("w-1"))
    assert "runtimeClassName" not in out["spec"]
    assert dict(env_of(out["spec"]["containers"][0]))["NVIDIA_VISIBLE_DEVICES"] == f"{CDI}2"


def test_nvidia_cdi_mode_refuses_a_pod_naming_another_runtime_class(caplog: pytest.LogCaptureFixture) -> None:
    """Never overwritten (it may be a sandbox someone chose) and never admitted as if it would get
    its GPUs (under another class NVIDIA_VISIBLE_DEVICES does nothing, or fails the container)."""
    caplog.set_level("INFO", logger="webhook")
    sandboxed = pod("w-1")
    sandboxed["spec"]["runtimeClassName"] = "kata"
    response = admit(client(injection_mode="nvidia-cdi"), sandboxed)
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith("spec.runtimeClassName is 'kata', but ")
    assert "RuntimeClass 'nvidia'" in message and "injection.runtimeClassName" in message
    assert [r.reasons for r in caplog.records if hasattr(r, "reasons")] == [["RuntimeClassConflict"]]
    # The other modes leave the runtime class to the pod.
    for mode in ("cuda", "nvidia"):
        _, out = mutated(client(injection_mode=mode), copy.deepcopy(sandboxed))
        assert out["spec"]["runtimeClassName"] == "kata"


def test_malformed_map_is_denied_with_line_numbers() -> None:
    response = admit(client(), pod("w-0", annotation="0=node1:0\n0=node1:1\nbad line\n"))
    assert response["allowed"] is False
    assert response["uid"] == "uid-1"
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    assert message.startswith("invalid gpu-scheduling-map annotation: ")
    assert "line 2: ordinal 0 is already mapped on line 1 (0=node1:0)" in message
    assert "line 3:" in message and "'bad line'" in message
    assert "patch" not in response


def test_no_entry_for_the_ordinal_allows_unchanged_with_a_warning() -> None:
    response, out = mutated(client(), pod("w-7"))
    assert out == pod("w-7")
    # The scheduler's OrdinalNotInMap message (kube_gpu_scheduler.domain.rules), plus what the webhook did.
    assert response["warnings"] == [
        "annotation gpu-scheduling-map has no entry for replica 7; no GPU variables set"
    ]


def test_pod_without_an_ordinal_is_allowed_with_a_warning() -> None:
    response, out = mutated(client(), pod("standalone"))
    assert out == pod("standalone")
    assert "ordinal" in response["warnings"][0]


def test_pod_without_the_annotation_is_left_alone() -> None:
    response, out = mutated(client(), pod("w-0", annotation=None))
    assert out == pod("w-0", annotation=None)
    assert "warnings" not in response


def test_pod_naming_its_node_is_denied() -> None:
    obj = pod("w-0")
    obj["spec"]["nodeName"] = "node1"
    response = admit(client(), obj)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "spec.nodeName is set ('node1') on a pod carrying gpu-scheduling-map: such a pod bypasses the "
        "scheduler, so its GPUs could be given twice; gpu-scheduler binds it to the node its map names. "
        "Remove spec.nodeName"
    )
    assert "patch" not in response
    # whatever its scheduler, and even when its map is malformed
    obj = pod("w-0", annotation="nonsense", scheduler="default-scheduler")
    obj["spec"]["nodeName"] = "n" * 5000
    response = admit(client(), obj)
    assert response["status"]["code"] == 403
    assert len(response["status"]["message"]) < 400  # the name is quoted as an excerpt
    # without the map, nodeName is none of the webhook's business
    obj = pod("w-0", annotation=None)
    obj["spec"]["nodeName"] = "node1"
    assert mutated(client(), obj)[1] == obj


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "volcano", "x" * 300])
def test_pod_of_another_scheduler_gets_no_gpus_and_a_warning(scheduler: str | None) -> None:
    response, out = mutated(client(), pod("w-0", scheduler=scheduler))
    assert out == pod("w-0", scheduler=scheduler)  # no patch
    [warning] = response["warnings"]
    shown = repr((scheduler or "default-scheduler")[:39] + ("…" if scheduler and len(scheduler) > 40 else ""))
    assert warning.startswith(
        f"spec.schedulerName is {shown}, not 'gpu-scheduler': gpu-scheduling-map ignored"
    )
    assert "no GPU variables set" in warning
    assert len(warning) <= 256


def test_scheduler_name_comes_from_the_settings() -> None:
    response, out = mutated(client(scheduler_name="gpu-sched-b"), pod("w-0", scheduler="gpu-sched-b"))
    assert dict(env_of(out["spec"]["containers"][0]))["CUDA_VISIBLE_DEVICES"] == "0,1"
    response, out = mutated(client(scheduler_name="gpu-sched-b"), pod("w-0"))
    assert out == pod("w-0")
    assert "not 'gpu-sched-b'" in response["warnings"][0]


def test_update_is_allowed_unchanged() -> None:
    response, out = mutated(client(), pod("w-0"), operation="UPDATE")
    assert out == pod("w-0")
    assert "patch" not in response


GPU_CONTAINERS = [
    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    {"name": "side", "resources": {"requests": {"nvidia.com/gpu": 2, "cpu": "1"}}},
    {"name": "zero", "resources": {"limits": {"nvidia.com/gpu": "0"}}},
]


def test_gpu_resource_request_warns_about_renumbering_and_still_patches() -> None:
    response, out = mutated(client(), pod("w-1", GPU_CONTAINERS))
    [warning] = response["warnings"]
    assert warning.startswith("this pod also requests nvidia.com/gpu ('main', 'side'): ")
    assert "renumbers them from 0" in warning and "wrong GPU" in warning
    assert len(warning) <= 256
    assert dict(env_of(out["spec"]["containers"][0]))["CUDA_VISIBLE_DEVICES"] == "2"


def test_gpu_resource_request_in_an_init_container_counts() -> None:
    init = [{"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    response, _ = mutated(client(), pod("w-1", init=init))
    assert "'prep'" in response["warnings"][0]


def test_gpu_resource_request_is_denied_under_the_deny_policy() -> None:
    response = admit(client(gpu_resource_policy="deny"), pod("w-1", GPU_CONTAINERS))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "renumbered from 0" in response["status"]["message"]
    assert "(containers 'main', 'side')" in response["status"]["message"]
    assert "patch" not in response


def test_zero_gpu_request_is_not_a_request() -> None:
    response, _ = mutated(client(gpu_resource_policy="deny"), pod("w-1", [GPU_CONTAINERS[2]]))
    assert "warnings" not in response


# Property: whatever env a container starts with, one patch makes it right, a second patch is empty,
# and the variables that are not ours keep their order and values.
NAMES = st.sampled_from(
    ["A", "B", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "PATH"]
)
ENV_ITEM = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, NAMES, st.text(max_size=5)),
    st.builds(lambda n: {"name": n, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, NAMES),
)
CONTAINER = st.one_of(
    st.just({"name": "c"}),
    st.builds(lambda env: {"name": "c", "env": env}, st.lists(ENV_ITEM, max_size=6)),
)


@settings(max_examples=150, deadline=None)
@given(
    containers=st.lists(CONTAINER, min_size=1, max_size=3),
    init=st.lists(CONTAINER, max_size=2),
    mode=st.sampled_from(["cuda", "nvidia", "nvidia-cdi"]),
)
def test_any_env_converges_in_one_patch(containers: list[dict], init: list[dict], mode: str) -> None:
    c = client(injection_mode=mode)
    before = pod("w-2", copy.deepcopy(containers), init=copy.deepcopy(init))
    _, once = mutated(c, before)
    ours = {"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if mode in ("nvidia", "nvidia-cdi"):
        ours = {
            "NVIDIA_VISIBLE_DEVICES": "3,1" if mode == "nvidia" else f"{CDI}3,{CDI}1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
    for old, new in zip(
        before["spec"].get("initContainers", []) + before["spec"]["containers"],
        once["spec"].get("initContainers", []) + once["spec"]["containers"],
        strict=True,
    ):
        for name, value in ours.items():
            items = [e for e in new["env"] if e["name"] == name]
            assert items and all(e == {"name": name, "value": value} for e in items)
        others_before = [e for e in old.get("env") or [] if e["name"] not in ours]
        others_after = [e for e in new["env"] if e["name"] not in ours]
        assert others_after == others_before
    response, twice = mutated(c, once)
    assert "patch" not in response
    assert twice == once


@pytest.mark.parametrize("mode", ["cuda", "nvidia", "nvidia-cdi"])
def test_log_lines_name_the_pod(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="webhook")
    mutated(client(injection_mode=mode), pod("w-0"))
    lines = [r for r in caplog.records if r.name == "webhook.mutate"]
    assert lines and all(getattr(r, "pod", None) == "team/w-0" for r in lines)


def test_gpu_resource_warning_stays_within_the_apiservers_limit() -> None:
    containers = [
        {"name": "x" * 60 + str(i), "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(5)
    ]
    response, _ = mutated(client(), pod("w-1", containers))
    [warning] = response["warnings"]
    assert len(warning) <= 256
    assert warning.endswith("drop the nvidia.com/gpu request")
    assert ", ...)" in warning
