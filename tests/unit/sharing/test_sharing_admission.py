"""Shared GPUs at admission and at bind, without an apiserver (the CEL policies say the same on
the real one: tests/integration/test_injection_policy.py, test_tenancy.py):

* webhook mode: a map that shares GPUs is admitted with the warning naming each shared GPU
  (``sharing.warning``), and both sharers get the same variables; with
  ``GPU_SCHEDULER_ALLOW_SHARING=false`` it is refused in ``sharing_problems``' words; where a
  GPUPinningPolicy says ``allowSharedGPUs: false`` it is refused in that namespace alone, in
  ``tenant_forbids``' words; the StatefulSet controller's pods are not checked again;
* the rules' words for one replica (the scheduler's Event) are ``sharing_problems``' for its line;
* the policy's field, the grants ConfigMap's ``unshared.<policy>`` keys;
* the scheduler refuses a sharing replica where its namespace's policy forbids sharing
  (``GPUSharingForbidden``), and binds the others.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.schedmap import parse, sharing_problems
from kube_gpu_scheduler.domain.sharing import RELEASE_FORBIDS, tenant_forbids, warning
from kube_gpu_scheduler.domain.tenancy import Grants, Policy
from kube_gpu_scheduler.webhook.app import create_app
from kube_gpu_scheduler.webhook.settings import Settings
from kube_gpu_scheduler.webhook.tenancy import STATEFULSET_CONTROLLER
from localcluster.admission import admission_review, mapped_pod
from tests.support.mapcorpus import TASK_MAP
from tests.unit.tenancy.test_tenancy_scheduler import NODES, Tenants, policy, replica
from tests.unit.tenancy.test_tenancy_webhook import Lookup
from tests.unit.webhook.test_webhook_validate import Nodes, statefulset

TASK_WARNING = (
    "gpu-scheduling-map shares GPUs between replicas: node4:3 by ordinals 3, 4 (lines 4, 5); a shared "
    "GPU is time-sliced by the driver, with no memory isolation between its sharers (MIG or MPS give "
    "that); sharing.allowed=false forbids sharing"
)
RELEASE_REFUSAL = f"line 5: node4:3 is also given to ordinal 3 on line 4: {RELEASE_FORBIDS} (in '4=node4:3')"


def answer(
    path: str, review: dict[str, Any], *, allow_sharing: bool = True, grants: Grants | None = None
) -> dict[str, Any]:
    app = create_app(
        Settings(allow_sharing=allow_sharing),
        node_lookup=Nodes(),
        grants=Lookup(grants) if grants is not None else None,
    )
    resp = app.test_client().post(path, json=review)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return dict(resp.get_json()["response"])


def sts(text: str, namespace: str = "team", scheduler: str = "gpu-scheduler") -> dict[str, Any]:
    return admission_review(
        statefulset(text, replicas=5, scheduler=scheduler),
        kind="StatefulSet",
        name="w",
        resource=True,
        namespace=namespace,
    )


def pod(ordinal: int, text: str = TASK_MAP, by_controller: bool = False) -> dict[str, Any]:
    obj = mapped_pod(f"w-{ordinal}", text)
    obj["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": str(ordinal)}
    review = admission_review(obj, name=f"w-{ordinal}")
    if by_controller:
        review["request"]["userInfo"] = {"username": STATEFULSET_CONTROLLER}
    return review


def env_of(response: dict[str, Any]) -> dict[str, str]:
    ops = json.loads(base64.b64decode(response["patch"]))
    (add,) = [op for op in ops if op["path"].endswith("/env")]
    return {v["name"]: v["value"] for v in add["value"]}


def test_the_words_are_the_parsers() -> None:
    smap = parse(TASK_MAP)
    assert warning(smap) == TASK_WARNING
    err = sharing_problems(smap, RELEASE_FORBIDS)
    assert err is not None and str(err.problems[0]) == RELEASE_REFUSAL


def test_a_shared_map_is_admitted_with_the_warning_and_both_sharers_see_the_same_gpu() -> None:
    admitted = answer("/validate", sts(TASK_MAP))
    assert admitted["allowed"] is True
    assert TASK_WARNING in admitted["warnings"]
    # A bare pod of the map hears the same; its GPUs are its entry's.
    three, four = answer("/mutate", pod(3)), answer("/mutate", pod(4))
    assert three["allowed"] and four["allowed"]
    assert TASK_WARNING in three["warnings"] and TASK_WARNING in four["warnings"]
    assert env_of(three)["CUDA_VISIBLE_DEVICES"] == env_of(four)["CUDA_VISIBLE_DEVICES"] == "3"
    # The StatefulSet controller's pods (their template was checked) are not warned again.
    controllers = answer("/mutate", pod(4, by_controller=True))
    assert controllers["allowed"] and env_of(controllers)["CUDA_VISIBLE_DEVICES"] == "3"
    assert not any("shares GPUs" in w for w in controllers.get("warnings") or [])
    # A map that shares nothing is told nothing of it.
    plain = answer("/validate", sts("0=node1:0\n1=node1:1\n2=n:0\n3=n:1\n4=n:2\n"))
    assert not any("shares GPUs" in w for w in plain.get("warnings") or [])


def test_a_release_that_forbids_sharing_refuses_the_map_with_the_parsers_words() -> None:
    refused = answer("/validate", sts(TASK_MAP), allow_sharing=False)
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert refused["status"]["message"] == str(sharing_problems(parse(TASK_MAP), RELEASE_FORBIDS))
    assert refused["status"]["message"].startswith(RELEASE_REFUSAL)
    bare = answer("/mutate", pod(0), allow_sharing=False)
    assert bare["allowed"] is False and bare["status"]["message"].startswith(RELEASE_REFUSAL)
    # The controller's pods are not checked again; a map that shares nothing is admitted.
    assert answer("/mutate", pod(0, by_controller=True), allow_sharing=False)["allowed"] is True
    assert answer("/validate", sts("0=node1:0\n1=node1:1\n"), allow_sharing=False)["allowed"] is True
    # Another scheduler's StatefulSet is its release's to judge (it may allow sharing): admitted,
    # and not warned about here.
    theirs = answer("/validate", sts(TASK_MAP, scheduler="other"), allow_sharing=False)
    assert theirs["allowed"] is True
    assert not any("shares GPUs" in w for w in theirs.get("warnings") or [])


GRANTS = Grants(
    {
        "strict": frozenset({"node1", "node2", "node3", "node4"}),
        "open": frozenset({"node1", "node2", "node3", "node4"}),
    },
    {"team": ("open", "strict"), "other": ("open",)},
    frozenset({"strict"}),
)


def test_a_policy_that_forbids_sharing_refuses_the_map_in_its_namespaces_only() -> None:
    refused = answer("/validate", sts(TASK_MAP), grants=GRANTS)
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    why = tenant_forbids("strict", "team")
    assert why == (
        "GPUPinningPolicy 'strict' forbids GPU sharing in namespace team (spec.allowSharedGPUs: false): "
        "give each replica its own GPUs, or ask the operator to set allowSharedGPUs: true"
    )
    assert (
        refused["status"]["message"]
        == f"line 5: node4:3 is also given to ordinal 3 on line 4: {why} (in '4=node4:3')"
    )
    assert answer("/mutate", pod(3), grants=GRANTS)["allowed"] is False
    assert answer("/mutate", pod(3, by_controller=True), grants=GRANTS)["allowed"] is True
    elsewhere = answer("/validate", sts(TASK_MAP, namespace="other"), grants=GRANTS)
    assert elsewhere["allowed"] is True and TASK_WARNING in elsewhere["warnings"]


def test_the_policy_field_and_the_grants_keys() -> None:
    spec = {"namespaceSelector": {}, "nodeSelector": {}}
    assert Policy.of({"metadata": {"name": "p"}, "spec": spec}).allow_sharing is True
    strict = Policy.of({"metadata": {"name": "p"}, "spec": {**spec, "allowSharedGPUs": False}})
    assert strict.allow_sharing is False and not strict.problem
    bad = Policy.of({"metadata": {"name": "p"}, "spec": {**spec, "allowSharedGPUs": "no"}})
    assert bad.problem == "spec.allowSharedGPUs must be true or false, got 'no'"
    open_ = Policy.of({"metadata": {"name": "o"}, "spec": spec})
    grants = Grants.resolve([strict, open_, bad], {"team": {}}, {"n1": {}})
    assert grants.unshared == frozenset({"p"})
    data = grants.to_data()
    assert data == {"ns.team": "o,p", "policy.o": "n1", "policy.p": "n1", "unshared.p": "true"}
    back = Grants.from_data(data)
    assert back == grants and back.forbids_sharing("team") == "p" and back.forbids_sharing("x") is None


@pytest.mark.parametrize(
    ("ordinal", "words"),
    [
        (4, "line 5: node4:3 is also given to ordinal 3 on line 4: why (in '4=node4:3')"),
        (3, "line 4: node4:3 is also given to ordinal 4 on line 5: why (in '3=node4:3')"),
        (0, None),
    ],
)
def test_a_replicas_words_are_those_of_its_line(ordinal: int, words: str | None) -> None:
    smap = parse(TASK_MAP)
    found = R.replica_sharing_forbidden(smap, smap[ordinal], "why")
    assert (found.message if found else None) == words
    if found is not None:
        assert found.reason == R.GPU_SHARING_FORBIDDEN


def test_a_replica_names_the_first_gpu_an_earlier_entry_names() -> None:
    # Entry 2 shares GPU 1 with the later entry 5 and GPU 2 with the earlier entry 1.
    smap = parse("1=n:2\n2=n:1,2\n5=n:1\n")
    found = R.replica_sharing_forbidden(smap, smap[2], "why")
    assert found is not None and found.message.startswith("line 2: n:2 is also given to ordinal 1 on line 1")
    err = sharing_problems(smap, "why")
    assert err is not None and str(err.problems[0]) == found.message


def test_the_scheduler_refuses_a_sharing_replica_where_a_policy_forbids_it() -> None:
    smap = "0=a1:0\n1=a1:1\n2=a1:1\n"
    w = Tenants([], NODES, [policy("strict", "a", "a", allowSharedGPUs=False), policy("open", "b", "a")])
    alone = w.add(replica("ta", "w-0", smap))
    sharer = w.add(replica("ta", "w-1", smap))
    elsewhere = w.add(replica("tb", "w-2", smap))
    for key in (alone, sharer, elsewhere):
        w.sched.process(key)
    assert sorted(w.writer.binds) == sorted([(alone, "a1"), (elsewhere, "a1")])
    (note,) = w.notes(R.GPU_SHARING_FORBIDDEN)
    assert note == (
        f"{R.GPU_SHARING_FORBIDDEN}: line 2: a1:1 is also given to ordinal 2 on line 3: "
        f"{tenant_forbids('strict', 'ta')} (in '1=a1:1')"
    )
