"""Extender mode without a cluster: the settings, the filter and bind answers from the
caches (fed as watch events), and the HTTPS endpoint's bounds."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.kube.tls import server_context
from kube_gpu_scheduler.scheduler.main import build
from kube_gpu_scheduler.scheduler.placing.core import Scheduler
from kube_gpu_scheduler.scheduler.placing.extender import Extender
from kube_gpu_scheduler.scheduler.placing.extender_http import MAX_BODY_BYTES, ExtenderServer
from kube_gpu_scheduler.scheduler.runtime import settings as settings_mod
from kube_gpu_scheduler.scheduler.runtime.settings import Settings, SettingsError
from localcluster.cluster import gpu_node_manifest
from localcluster.pki import LocalPKI

NAME = "gpu-scheduler"


def ready(node: dict[str, Any]) -> dict[str, Any]:
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


def mapped_pod(name: str, smap: str, *, uid: str | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": NAME, "containers": [{"name": "main", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {"gpu-scheduling-map": smap},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


@pytest.fixture
def sched() -> Scheduler:
    """A scheduler whose caches are fed by hand (no API call is made): node1, node2 with 4 GPUs."""
    s = build(
        Settings(leader_elect=False, require_injection=False, identity="t", mode="extender"),
        client.ApiClient(),
    )
    for name in ("node1", "node2"):
        s.nodes._apply({"type": "ADDED", "object": ready(gpu_node_manifest(name))})
    s.nodes.synced.set()
    s.pods.synced.set()
    return s


@pytest.fixture
def extender(sched: Scheduler) -> Extender:
    return Extender(sched, client.ApiClient())


# ---------------------------------------------------------------- settings
def test_extender_mode_needs_a_certificate() -> None:
    with pytest.raises(SettingsError, match="GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE"):
        settings_mod.load([], {"GPU_SCHEDULER_MODE": "extender"})
    loaded = settings_mod.load(
        [],
        {
            "GPU_SCHEDULER_MODE": "Extender",
            "GPU_SCHEDULER_EXTENDER_TLS_CERT_FILE": "/c",
            "GPU_SCHEDULER_EXTENDER_TLS_KEY_FILE": "/k",
            "GPU_SCHEDULER_EXTENDER_PORT": "9443",
        },
    )
    assert (loaded.mode, loaded.extender_port) == ("extender", 9443)
    assert settings_mod.load([], {}).mode == "standalone"


def test_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(SettingsError, match="GPU_SCHEDULER_MODE='both'"):
        settings_mod.load([], {"GPU_SCHEDULER_MODE": "both"})


# ---------------------------------------------------------------- filter
def test_filter_keeps_only_the_mapped_node(extender: Extender) -> None:
    out = extender.filter({"Pod": mapped_pod("w-1", "0=node1:0\n1=node2:1"), "NodeNames": ["node1", "node2"]})
    assert out["NodeNames"] == ["node2"]
    assert out["FailedAndUnresolvableNodes"] == {"node1": "NotMappedNode: replica 1 is mapped to node2:1"}
    assert out["Error"] == ""


def test_filter_refuses_a_held_gpu_naming_the_holder(sched: Scheduler, extender: Extender) -> None:
    holder = mapped_pod("a-0", "0=node2:1", node="node2")
    sched.pods._apply({"type": "ADDED", "object": holder})
    out = extender.filter({"pod": mapped_pod("w-1", "1=node2:1,2"), "nodenames": ["node1", "node2"]})
    assert out["NodeNames"] == []
    assert out["FailedAndUnresolvableNodes"]["node2"] == "GPUInUse: GPU node2:1 is held by pod ns/a-0"


def test_filter_passes_a_replica_beside_its_mate_and_refuses_another_workload(
    sched: Scheduler, extender: Extender
) -> None:
    smap = "0=node2:1\n1=node2:1"
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "w", "uid": "sts-w", "controller": True}
    mate = mapped_pod("w-0", smap, node="node2")
    mate["metadata"]["ownerReferences"] = [owner]
    sched.pods._apply({"type": "ADDED", "object": mate})
    sharer = mapped_pod("w-1", smap)
    sharer["metadata"]["ownerReferences"] = [owner]
    out = extender.filter({"pod": sharer, "nodenames": ["node1", "node2"]})
    assert out["NodeNames"] == ["node2"], out
    # The same map on another StatefulSet's replica: w-0 is not its mate.
    other = mapped_pod("v-1", smap)
    other["metadata"]["ownerReferences"] = [{**owner, "name": "v", "uid": "sts-v"}]
    out = extender.filter({"pod": other, "nodenames": ["node2"]})
    assert out["FailedAndUnresolvableNodes"]["node2"] == "GPUInUse: GPU node2:1 is held by pod ns/w-0"


def test_filter_refuses_every_node_when_the_map_does_not_resolve(extender: Extender) -> None:
    out = extender.filter({"Pod": mapped_pod("w-3", "0=node1:0"), "NodeNames": ["node1", "node2"]})
    assert out["NodeNames"] == []
    assert set(out["FailedAndUnresolvableNodes"]) == {"node1", "node2"}
    assert out["FailedAndUnresolvableNodes"]["node1"].startswith("OrdinalNotInMap: ")


@pytest.mark.parametrize(
    "pod",
    [
        {**mapped_pod("w-0", "0=node1:0"), "spec": {"schedulerName": "default-scheduler"}},
        {"metadata": {"name": "plain-0", "namespace": "ns"}, "spec": {"schedulerName": NAME}},
    ],
    ids=["other-scheduler", "unmapped"],
)
def test_filter_passes_other_pods_through(extender: Extender, pod: dict[str, Any]) -> None:
    out = extender.filter({"Pod": pod, "NodeNames": ["node1", "node2", "node9"]})
    assert out["NodeNames"] == ["node1", "node2", "node9"]
    assert out["FailedAndUnresolvableNodes"] == {}


def test_filter_with_node_objects_answers_node_objects(extender: Extender) -> None:
    nodes = {"items": [gpu_node_manifest("node1"), gpu_node_manifest("node2")]}
    out = extender.filter({"Pod": mapped_pod("w-0", "0=node1:0"), "Nodes": nodes})
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["node1"]
    assert "NodeNames" not in out


def test_filter_and_bind_answer_an_error_until_the_caches_synced(
    sched: Scheduler, extender: Extender
) -> None:
    sched.pods.synced.clear()
    out = extender.filter({"Pod": mapped_pod("w-0", "0=node1:0"), "NodeNames": ["node1"]})
    assert out["Error"].startswith("NotSynced: ")
    bound = extender.bind({"PodName": "w-0", "PodNamespace": "ns", "PodUID": "u", "Node": "node1"})
    assert bound["Error"].startswith("NotSynced: ")


def test_bind_refuses_a_node_the_map_does_not_name(sched: Scheduler, extender: Extender) -> None:
    pod = mapped_pod("w-0", "0=node1:0")
    sched.pods._apply({"type": "ADDED", "object": pod})
    out = extender.bind({"PodName": "w-0", "PodNamespace": "ns", "PodUID": "uid-w-0", "Node": "node2"})
    assert out["Error"] == "NotMappedNode: replica 0 is mapped to node1:0, not to node 'node2'"
    assert sched.ledger.snapshot() == {}  # nothing reserved


def test_bind_refuses_a_gpu_taken_since_the_filter(sched: Scheduler, extender: Extender) -> None:
    pod = mapped_pod("w-0", "0=node1:0")
    sched.pods._apply({"type": "ADDED", "object": pod})
    sched.pods._apply({"type": "ADDED", "object": mapped_pod("x-0", "0=node1:0", node="node1")})
    out = extender.bind({"PodName": "w-0", "PodNamespace": "ns", "PodUID": "uid-w-0", "Node": "node1"})
    assert out["Error"] == "GPUInUse: GPU node1:0 is held by pod ns/x-0"
    assert sched.ledger.snapshot() == {"node1:0": ["ns/x-0"]}


def test_bind_needs_every_field(extender: Extender) -> None:
    assert "PodUID" in extender.bind({"PodName": "w-0", "PodNamespace": "ns", "Node": "node1"})["Error"]


# ---------------------------------------------------------------- the HTTPS endpoint
@pytest.fixture
def pki(tmp_path: Path) -> LocalPKI:
    return LocalPKI(tmp_path / "pki")


@pytest.fixture
def served(extender: Extender, pki: LocalPKI) -> Iterator[tuple[int, ssl.SSLContext]]:
    crt, key = pki.issue("ext", "ext", ips=("127.0.0.1",), server=True)
    server = ExtenderServer(
        "127.0.0.1", 0, extender, server_context(str(crt), str(key), require_client_cert=True)
    )
    server.start()
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    try:
        yield server.port, client_ctx
    finally:
        server.stop()


def post(
    port: int, ctx: ssl.SSLContext, path: str, body: bytes, headers: dict[str, str] | None = None
) -> Any:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_server_context_refuses_anything_below_tls_1_2(pki: LocalPKI) -> None:
    crt, key = pki.issue("ext2", "ext2", server=True)
    assert (
        server_context(str(crt), str(key), require_client_cert=True).minimum_version == ssl.TLSVersion.TLSv1_2
    )


def test_filter_over_https(served: tuple[int, ssl.SSLContext]) -> None:
    port, ctx = served
    args = {"Pod": mapped_pod("w-0", "0=node1:0"), "NodeNames": ["node1", "node2"]}
    status, out = post(port, ctx, "/filter", json.dumps(args).encode())
    assert status == 200 and out["NodeNames"] == ["node1"]


@pytest.mark.parametrize(
    ("path", "body", "headers", "code"),
    [
        ("/filter", b"x" * 10, {"Content-Length": str(MAX_BODY_BYTES + 1)}, 413),
        ("/filter", b"{not json", None, 400),
        ("/filter", b"[1]", None, 400),
        ("/prioritize", b"{}", None, 404),
    ],
    ids=["too-large", "not-json", "not-an-object", "unknown-verb"],
)
def test_bounded_and_specific_refusals(
    served: tuple[int, ssl.SSLContext], path: str, body: bytes, headers: dict[str, str] | None, code: int
) -> None:
    port, ctx = served
    status, out = post(port, ctx, path, body, headers)
    assert status == code
    assert out["Error"]


def test_a_client_that_does_not_trust_the_server_gets_nothing(served: tuple[int, ssl.SSLContext]) -> None:
    port, _ = served
    with pytest.raises(ssl.SSLError):
        post(port, ssl.create_default_context(), "/filter", b"{}")


def test_with_a_client_ca_only_its_clients_are_served(
    extender: Extender, pki: LocalPKI, tmp_path: Path
) -> None:
    crt, key = pki.issue("ext3", "ext3", ips=("127.0.0.1",), server=True)
    clients = LocalPKI(tmp_path / "clients")
    client_crt, client_key = clients.issue("kube-scheduler", "kube-scheduler")
    ctx = server_context(str(crt), str(key), str(clients.ca_file), require_client_cert=True)
    server = ExtenderServer("127.0.0.1", 0, extender, ctx)
    server.start()
    try:
        anonymous = ssl.create_default_context(cafile=str(pki.ca_file))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post(server.port, anonymous, "/filter", b"{}")
        trusted = ssl.create_default_context(cafile=str(pki.ca_file))
        trusted.load_cert_chain(str(client_crt), str(client_key))
        status, out = post(server.port, trusted, "/filter", b"{}")
        assert (status, out["Error"]) == (200, "ExtenderArgs.Pod is missing")
    finally:
        server.stop()
