"""localcluster/apiget.py reads what ``kubectl get -o json`` reads: the same arguments, the same
documents, against the real apiserver (the polling loops of the tests and demos use it instead
of a kubectl process); localcluster/apiapply.py (``Cluster.apply``) leaves objects as
``kubectl apply`` does, and hands what the apiserver refuses to kubectl, whose error is raised."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcluster import apiapply, apiget
from localcluster.clients import CommandFailed
from localcluster.cluster import Cluster


def _kubectl(cluster: Cluster, *args: str) -> dict[str, Any]:
    res = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _comparable(doc: dict[str, Any]) -> Any:
    """What both must agree on: each object's kind, apiVersion, name, namespace, labels and
    whether it shows its managedFields (not its spec: a Lease's changes between the two reads)."""
    objs = doc.get("items", [doc]) if doc else []
    return (
        doc.get("kind"),
        sorted(
            (
                o.get("kind"),
                o.get("apiVersion"),
                o["metadata"]["name"],
                o["metadata"].get("namespace"),
                json.dumps(o["metadata"].get("labels"), sort_keys=True),
                "managedFields" in o["metadata"],
            )
            for o in objs
        ),
    )


def test_get_json_reads_what_kubectl_get_reads(cluster: Cluster, namespace: str) -> None:
    for i, labels in enumerate(({"app": "a"}, {"app": "b"})):
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i}", "namespace": namespace, "labels": labels},
                "data": {"k": str(i)},
            }
        )
    cases = [
        ("configmaps", "-n", namespace),
        ("cm", "cm-0", "-n", namespace),  # a short name, one object
        ("configmap", "-n", namespace, "-l", "app=b"),  # the singular, a selector
        ("configmaps", "-n", namespace, "--selector=app in (a,b)"),
        ("serviceaccount", "default", "-n", namespace),
        ("nodes", "-l", "kubernetes.io/hostname=node1"),  # cluster-scoped
        ("node", "node1", "-n", namespace),  # -n is ignored for a cluster-scoped resource
        ("leases.coordination.k8s.io", "node1", "-n", "kube-node-lease"),  # a group's resource
        ("configmaps", "-A", "--field-selector=metadata.name=cm-1"),
        ("configmap", "cm-0", "--show-managed-fields", "-n", namespace),
        ("configmap", "no-such", "-n", namespace),  # not found: {} where kubectl fails
        ("pods", "-n", "no-such-namespace"),  # an empty list, as kubectl's
    ]
    for args in cases:
        ours, theirs = cluster.get_json(*args), _kubectl(cluster, *args)
        assert _comparable(ours) == _comparable(theirs), args
    assert cluster.get_json("configmap", "no-such", "-n", namespace) == {}
    assert cluster.get_json("configmap", "cm-0", "-n", namespace)["data"] == {"k": "0"}
    # A resource type the apiserver does not serve (a CRD not installed): {}, where kubectl fails.
    assert cluster.get_json("certificates.cert-manager.io", "-A") == {}
    assert cluster.kubectl("get", "certificates.cert-manager.io", "-A", check=False).returncode != 0
    with pytest.raises(LookupError, match='resource type "no-such-kind"'):
        apiget.resolve(cluster.admin_api(), "no-such-kind")
    with pytest.raises(ValueError, match="'-o' is not read here"):
        cluster.get_json("pods", "-o", "yaml")


def test_a_crd_installed_after_the_first_read_is_found(cluster: Cluster) -> None:
    api = cluster.api_client()  # a client of its own: its discovery is read now, before the CRD
    assert apiget.get(api, "namespaces", "default")["metadata"]["name"] == "default"
    group = "apiget.gpu-scheduler.test"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    cluster.apply(crd)
    try:
        cluster.wait_until(lambda: cluster._ok("get", f"widgets.{group}"), 60, "the Widget CRD to be served")
        cluster.apply({"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"}})
        # The client's discovery is read again at most every REDISCOVER_AFTER seconds: found within a few.
        found: dict[str, Any] = {}
        cluster.wait_until(
            lambda: bool(found.update(apiget.get(api, "wdg", "w1")) or found),
            3 * apiget.REDISCOVER_AFTER + 10,
            "the Widget through the client that read its discovery before the CRD",
        )
        got = found
        assert (got["kind"], got["apiVersion"], got["metadata"]["name"]) == ("Widget", f"{group}/v1", "w1")
        assert [w["metadata"]["name"] for w in apiget.get(api, f"widget.{group}")["items"]] == ["w1"]
    finally:
        cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


def test_apply_creates_updates_and_removes_fields_as_kubectl_apply(cluster: Cluster, namespace: str) -> None:
    """Server-side applies through the API: created, updated (a label removed, a key changed), a
    namespaced document without a namespace lands in "default"; a refused document goes to
    kubectl, whose error (with the apiserver's words) is raised, and the documents before it stay."""
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "w", "namespace": namespace, "labels": {"a": "1", "b": "2"}},
        "spec": {
            "replicas": 0,
            "serviceName": "w",
            "selector": {"matchLabels": {"app": "w"}},
            "template": {
                "metadata": {"labels": {"app": "w"}, "annotations": {"gpu-scheduling-map": "0=n:0"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"apply-{namespace}"},
        "data": {"k": "1"},
    }
    calls: list[list[str]] = []
    real = cluster.kubectl

    def counting(*args: str, **kw: object) -> object:
        calls.append(list(args))
        return real(*args, **kw)  # type: ignore[arg-type]

    cluster.kubectl = counting  # type: ignore[method-assign]
    try:
        cluster.apply([sts, cm])
        sts["metadata"]["labels"] = {"a": "1"}
        sts["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = "0=n:1"
        cm["data"] = {"k2": "2"}
        cluster.apply([sts, cm])
        assert calls == [], calls  # no kubectl process for what the API applies
        live = cluster.get_json("statefulset", "w", "-n", namespace)
        assert live["metadata"]["labels"] == {"a": "1"}
        assert live["spec"]["template"]["metadata"]["annotations"] == {"gpu-scheduling-map": "0=n:1"}
        got = cluster.get_json("configmap", f"apply-{namespace}", "-n", "default", "--show-managed-fields")
        assert got["data"] == {"k2": "2"}
        appliers = [m["manager"] for m in got["metadata"]["managedFields"] if m["operation"] == "Apply"]
        assert appliers == [apiapply.MANAGER], got["metadata"]["managedFields"]
        bad = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "Not_A_Name", "namespace": namespace},
        }
        after = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "after", "namespace": namespace},
        }
        ok = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before", "namespace": namespace}}
        with pytest.raises(CommandFailed) as err:
            cluster.apply([ok, bad, after])
        assert "Not_A_Name" in err.value.stderr and "Invalid value" in err.value.stderr, err.value.stderr
        assert calls and calls[0][:3] == ["apply", "-f", "-"], calls
        assert cluster.get_json("configmap", "before", "-n", namespace), (
            "the document before it was not applied"
        )
    finally:
        cluster.kubectl = real  # type: ignore[method-assign]
        cluster.kubectl("delete", "configmap", f"apply-{namespace}", "-n", "default", "--ignore-not-found")
