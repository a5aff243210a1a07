"""kube_gpu_scheduler/kube/wire.py, the hot path's kept-alive connections, against the real
apiserver: what ``send_json`` writes through it arrives, the apiserver's refusals come back as the
client's own ``ApiException`` (status, reason, body), a ServiceAccount's bearer token
authenticates (and RBAC refuses what it must), and a kept-alive connection that can no longer
carry a request is replaced without the caller seeing it."""

from __future__ import annotations

import json
import socket
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kube_gpu_scheduler.kube import wire as wire_mod
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


def _bound_token(cluster: Cluster, account: str, secret: str) -> str:
    """A TokenRequest token for ``account`` bound to the Secret ``secret``: deleting the Secret
    invalidates the token at once (what a rotation leaves of the old one, sooner)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.admin_api())
    uid = cluster.get_json("secret", secret, "-n", NS)["metadata"]["uid"]
    spec = {
        "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": secret, "uid": uid},
    }
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    resp = core.create_namespaced_service_account_token(account, NS, body, _preload_content=False)
    return str(json.loads(resp.data)["status"]["token"])


def test_credentials_are_reused_between_requests_and_read_again_after_a_401(
    cluster: Cluster, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's refresh hook is asked once per AUTH_TTL, not per request (it cost a third of
    the CPU per pod); a token that stops working within that time costs one 401, then the
    request goes with the token the client holds now."""
    suffix = uuid.uuid4().hex[:6]
    account, old_anchor, new_anchor = f"rot-{suffix}", f"old-{suffix}", f"new-{suffix}"
    cluster.kubectl("create", "serviceaccount", account, "-n", NS)
    cluster.kubectl(
        "create", "rolebinding", account, "-n", NS, "--clusterrole=admin", f"--serviceaccount={NS}:{account}"
    )
    for anchor in (old_anchor, new_anchor):
        cluster.kubectl("create", "secret", "generic", anchor, "-n", NS)
    api = load_client(str(cluster.service_account_kubeconfig(NS, account)))
    conf = api.configuration
    asked: list[int] = []
    old = _bound_token(cluster, account, old_anchor)
    conf.api_key, conf.api_key_prefix = {"authorization": f"Bearer {old}"}, {}
    conf.refresh_api_key_hook = lambda c: asked.append(1)
    monkeypatch.setattr(wire_mod, "AUTH_TTL", 3600.0)  # only a 401 makes it read them again
    cluster.wait_until(
        lambda: _created(api, f"r0-{suffix}"), timeout=30, what="the account's RoleBinding in effect"
    )
    for i in range(5):
        send_json(api, "POST", EVENTS, event(f"r{i + 1}-{suffix}"), TIMEOUT)
    assert len(asked) == 1, f"the refresh hook was asked {len(asked)} times for 6 requests"
    # Rotation: the client now holds a new token, and the old one is refused from now on.
    conf.api_key = {"authorization": f"Bearer {_bound_token(cluster, account, new_anchor)}"}
    cluster.kubectl("delete", "secret", old_anchor, "-n", NS)
    cluster.wait_until(lambda: _refused(cluster, old), timeout=30, what="the old token refused")
    before = len(asked)
    send_json(api, "POST", EVENTS, event(f"after-{suffix}"), TIMEOUT)
    assert len(asked) == before + 1, "the 401 made the wire read the credentials again"
    assert read_event(cluster, f"after-{suffix}")["metadata"]["name"] == f"after-{suffix}"


def _refused(cluster: Cluster, token: str) -> bool:
    """Whether the apiserver answers 401 to ``token`` now."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(
        f"{cluster.server}/api/v1/namespaces/{NS}/events?limit=1",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        urllib.request.urlopen(req, context=ctx, timeout=10).close()
    except urllib.error.HTTPError as err:
        return err.code == 401
    return False
