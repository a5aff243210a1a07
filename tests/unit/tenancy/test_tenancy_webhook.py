"""Tenancy in webhook mode, through the Flask test client: /validate refuses a StatefulSet and
/mutate a bare pod whose map names a node no policy grants the namespace; the StatefulSet
controller's pods are not checked again; unknown grants refuse (as the policy's
parameterNotFoundAction: Deny); tenancy off checks nothing."""

from __future__ import annotations

from typing import Any

from kube_gpu_scheduler.domain.tenancy import Grants
from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.settings import Settings
from kube_gpu_scheduler.webhook.tenancy import STATEFULSET_CONTROLLER, GrantsUnavailable
from localcluster.admission import admission_review, mapped_pod
from tests.unit.webhook.test_webhook_validate import Nodes, statefulset

GRANTS = Grants(
    {"pool-a": frozenset({"node1"}), "shared": frozenset({"node9"})}, {"team": ("pool-a", "shared")}
)


class Lookup:
    def __init__(self, grants: Grants | None) -> None:
        self._grants = grants

    def grants(self) -> Grants:
        if self._grants is None:
            raise GrantsUnavailable("the grants have not been read yet")
        return self._grants


def answer(path: str, review: dict[str, Any], grants: Grants | None, tenancy: bool = True) -> dict[str, Any]:
    app = create_app(Settings(), node_lookup=Nodes(), grants=Lookup(grants) if tenancy else None)
    resp = app.test_client().post(path, json=review)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return dict(resp.get_json()["response"])


def sts_review(smap: str) -> dict[str, Any]:
    return admission_review(statefulset(smap), kind="StatefulSet", name="w", resource=True)


def test_a_statefulset_naming_an_ungranted_node_is_refused_with_the_line_and_the_policies() -> None:
    refused = answer("/validate", sts_review("0=node1:0\n1=node2:1\n"), GRANTS)
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert refused["status"]["message"] == (
        "gpu-scheduling-map line 2: replica 1 is mapped to node 'node2', which no GPUPinningPolicy "
        "grants namespace 'team' (policies considered: pool-a, shared)"
    )
    assert answer("/validate", sts_review("0=node1:0\n1=node9:1\n"), GRANTS)["allowed"] is True
    assert answer("/validate", sts_review("0=node2:0\n"), GRANTS, tenancy=False)["allowed"] is True


def test_a_bare_pod_is_refused_but_the_statefulset_controllers_is_not_checked_again() -> None:
    pod = mapped_pod("w-0", "0=node2:0")
    pod["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": "0"}
    bare = answer("/mutate", admission_review(pod, name="w-0"), GRANTS)
    assert bare["allowed"] is False and "node 'node2'" in bare["status"]["message"]
    review = admission_review(pod, name="w-0")
    review["request"]["userInfo"] = {"username": STATEFULSET_CONTROLLER}
    controllers = answer("/mutate", review, GRANTS)
    assert controllers["allowed"] is True and controllers["patch"]


def test_grants_not_known_refuse_every_map() -> None:
    refused = answer("/validate", sts_review("0=node1:0\n"), None)
    assert refused["allowed"] is False
    assert "grants are not known (the grants have not been read yet)" in refused["status"]["message"]
