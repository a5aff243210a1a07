"""kube_gpu_scheduler/kube/wire.py, the hot path's kept-alive connections, against the real
apiserver: what ``send_json`` writes through it arrives, the apiserver's refusals come back as the
client's own ``ApiException`` (status, reason, body), a ServiceAccount's bearer token
authenticates (and RBAC refuses what it must), and a kept-alive connection that can no longer
carry a request is replaced without the caller seeing it."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube.client import load_client
from kube_gpu_scheduler.kube.errors import ApiError, api_error, api_status
from kube_gpu_scheduler.kube.jsonio import send_json
from kube_gpu_scheduler.kube.wire import Wire, wire_for
from localcluster.cluster import Cluster

pytestmark = pytest.mark.cluster
TIMEOUT = (5.0, 30.0)
NS = "wire"


def event(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NS},
        "regarding": {"kind": "Pod", "namespace": NS, "name": "p", "uid": str(uuid.uuid4())},
        "reason": "Scheduled",
        "note": "Successfully assigned wire/p to node1 with GPUs 3 (replica 3)",
        "type": "Normal",
        "action": "Binding",
        "reportingController": "gpu-scheduler",
        "reportingInstance": "gpu-scheduler-test",
        "eventTime": "2026-11-29T00:00:00.000000Z",
    }


EVENTS = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Any:
    cluster.kubectl("create", "namespace", NS, check=False)
    api = load_client(str(cluster.kubeconfig))
    assert isinstance(wire_for(api), Wire), "the local control plane's kubeconfig takes the wire"
    return api


def read_event(cluster: Cluster, name: str) -> dict[str, Any]:
    from kubernetes import client

    events: Any = client.EventsV1Api(cluster.admin_api())
    return events.read_namespaced_event(name, NS).to_dict()


def test_writes_arrive_and_refusals_come_back_as_the_clients_exceptions(cluster: Cluster, admin: Any) -> None:
    name = f"e-{uuid.uuid4().hex[:8]}"
    for _ in range(3):  # the same connection, kept alive between them
        send_json(admin, "POST", EVENTS, event(name), TIMEOUT, query=[("fieldManager", "wire-test")])
        with pytest.raises(ApiException) as taken:
            send_json(admin, "POST", EVENTS, event(name), TIMEOUT)
        assert taken.value.status == 409 and api_status(taken.value).already_exists, taken.value.body
        send_json(admin, "DELETE", f"{EVENTS}/{name}", {}, TIMEOUT)
    send_json(admin, "POST", EVENTS, event(name), TIMEOUT)
    got = read_event(cluster, name)
    assert got["note"] == event(name)["note"] and got["regarding"]["name"] == "p"
    # A merge patch (another content type), then a 404 and a 422, each as the client raises them.
    send_json(
        admin,
        "PATCH",
        f"{EVENTS}/{name}",
        {"metadata": {"labels": {"wire": "patched"}}},
        TIMEOUT,
        content_type="application/merge-patch+json",
    )
    assert read_event(cluster, name)["metadata"]["labels"] == {"wire": "patched"}
    with pytest.raises(ApiException) as missing:
        send_json(
            admin,
            "PATCH",
            f"{EVENTS}/nothing-here",
            {"note": "x"},
            TIMEOUT,
            content_type="application/merge-patch+json",
        )
    assert missing.value.status == 404 and api_error(missing.value) is ApiError.NOT_FOUND
    with pytest.raises(ApiException) as invalid:
        send_json(admin, "POST", EVENTS, {**event("Bad_Name"), "type": "Sideways"}, TIMEOUT)
    assert invalid.value.status == 422 and "Sideways" in (invalid.value.body or ""), invalid.value.body


def test_a_service_accounts_token_authenticates_and_rbac_still_refuses(cluster: Cluster, admin: Any) -> None:
    cluster.kubectl("create", "serviceaccount", "writer", "-n", NS, check=False)
    cluster.kubectl(
        "create", "role", "writer", "-n", NS, "--verb=create", "--resource=events.events.k8s.io", check=False
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "writer",
        "-n",
        NS,
        "--role=writer",
        f"--serviceaccount={NS}:writer",
        check=False,
    )
    api = load_client(str(cluster.service_account_kubeconfig(NS, "writer")))
    assert isinstance(wire_for(api), Wire)
    name = f"sa-{uuid.uuid4().hex[:8]}"
    cluster.wait_until(lambda: _created(api, name), timeout=30, what="the ServiceAccount's Role in effect")
    assert read_event(cluster, name)["metadata"]["name"] == name
    with pytest.raises(ApiException) as denied:  # its Role allows no delete
        send_json(api, "DELETE", f"{EVENTS}/{name}", {}, TIMEOUT)
    assert denied.value.status == 403 and "system:serviceaccount:wire:writer" in (denied.value.body or "")


def _created(api: Any, name: str) -> bool:
    try:
        send_json(api, "POST", EVENTS, event(name), TIMEOUT)
    except ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


def test_a_dead_kept_alive_connection_is_replaced(cluster: Cluster, admin: Any) -> None:
    wire = wire_for(admin)
    assert wire is not None
    send_json(admin, "POST", EVENTS, event(f"a-{uuid.uuid4().hex[:8]}"), TIMEOUT)
    idle = list(wire._idle)
    assert idle, "the connection was kept for the next request"
    for sock in idle:  # the connection can carry nothing more (as one the apiserver closed)
        sock.shutdown(socket.SHUT_RDWR)
    name = f"b-{uuid.uuid4().hex[:8]}"
    send_json(admin, "POST", EVENTS, event(name), TIMEOUT)
    assert read_event(cluster, name)["metadata"]["name"] == name
    assert all(sock.fileno() == -1 for sock in idle), "the dead connections were closed"
