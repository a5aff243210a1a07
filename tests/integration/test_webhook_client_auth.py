"""WEBHOOK_CLIENT_CA_FILE against the real kube-apiserver: only the apiserver's client certificate admits.

The local control plane starts kube-apiserver with an AdmissionConfiguration whose webhook
kubeconfig presents a client certificate (signed by ``cluster.webhook_client_ca_file``) to every
webhook. A webhook that trusts that CA must still inject through the apiserver, refuse a direct
call without a certificate or with one from another CA, and answer the kubelet-style probes.
"""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path

import pytest

from localcluster.admission import admission_review, mapped_pod
from localcluster.cluster import Cluster
from tests.integration.fixtures_webhook import ANNOTATION, register_webhooks, start_webhook

HOST = "127.0.0.1"


def _review(uid: str) -> bytes:
    return json.dumps(admission_review(mapped_pod("w-0", "0=node1:2\n"), uid=uid)).encode()


def _call(
    port: int, ca: Path, method: str, path: str, cert: tuple[Path, Path] | None = None
) -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    conn = http.client.HTTPSConnection(HOST, port, context=ctx, timeout=10)
    try:
        body = _review("direct") if method == "POST" else None
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_client_certificate_of_the_apiserver_is_required(
    cluster: Cluster, namespace: str, webhook_certs: Path, tmp_path: Path
) -> None:
    assert cluster.webhook_client_ca_file is not None and cluster.webhook_client_ca_file.is_file()
    env = {"WEBHOOK_CLIENT_CA_FILE": str(cluster.webhook_client_ca_file)}
    with start_webhook(webhook_certs, tmp_path, None, env) as server:
        ca = webhook_certs / "ca.crt"
        # kubelet probes send no client certificate: they still answer
        assert _call(server.port, ca, "GET", "/healthz")[0] == 200
        assert _call(server.port, ca, "GET", "/readyz")[0] == 200

        # a direct call without a client certificate: 403, nothing admitted
        status, body = _call(server.port, ca, "POST", "/mutate")
        assert status == 403 and "WEBHOOK_CLIENT_CA_FILE" in body["error"]
        assert _call(server.port, ca, "POST", "/validate")[0] == 403

        # a certificate from another CA (the cluster's own, which signed the admin's): refused
        admin = (cluster.workdir / "pki" / "admin.crt", cluster.workdir / "pki" / "admin.key")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _call(server.port, ca, "POST", "/mutate", cert=admin)

        # the apiserver's own webhook client certificate: answered (the positive control)
        client_dir = cluster.webhook_client_ca_file.parent
        apiserver = (client_dir / "apiserver-webhook-client.crt", client_dir / "apiserver-webhook-client.key")
        status, body = _call(server.port, ca, "POST", "/mutate", cert=apiserver)
        assert status == 200 and body["response"]["allowed"] is True and "patch" in body["response"]

        # through the real apiserver: the pod gets its GPU
        with register_webhooks(cluster, namespace, server, validate=False):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "w-0",
                    "namespace": namespace,
                    "annotations": {ANNOTATION: "0=node1:2\n"},
                },
                "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "busybox"}]},
            }
            cluster.apply(pod)
            env_of = json.loads(cluster.kubectl("get", "pod", "w-0", "-n", namespace, "-o", "json").stdout)[
                "spec"
            ]["containers"][0]["env"]
            assert {"name": "CUDA_VISIBLE_DEVICES", "value": "2"} in env_of

        records = [json.loads(line) for line in server.proc.log_text().splitlines() if line.strip()]
        refused = [r for r in records if r.get("reason") == "client_certificate"]
        assert refused and refused[0]["level"] == "warning"
        assert server.proc.running()
