"""The Service network of the local control plane: how the apiserver's calls to a Service (a
webhook behind its Service) reach a host process, through localcluster.svcproxy or, on the real
node, through kube-proxy and an EndpointSlice naming the host."""

from __future__ import annotations

import json
from pathlib import Path

from localcluster.components import ComponentProcesses
from localcluster.network import write_egress_selector


class ServiceRoutes(ComponentProcesses):
    """The Service half of :class:`localcluster.cluster.Cluster`."""

    @property
    def services_file(self) -> Path:
        return self.workdir / "services.json"

    def _start_service_proxy(self, timeout: float) -> None:
        import sys
        import tempfile

        self.services_file.write_text("{}")
        # A short path: a Unix socket's name is limited to ~100 bytes.
        sock = Path(tempfile.mkdtemp(prefix="gs-svc-")) / "proxy.sock"
        proc = self._spawn(
            "svcproxy",
            [
                sys.executable,
                "-m",
                "localcluster.svcproxy",
                "--socket",
                str(sock),
                "--map",
                str(self.services_file),
            ],
        )
        self.wait_until(sock.exists, timeout, "the Service proxy")
        if not proc.running():
            raise proc.fail("exited during start-up")
        write_egress_selector(self.workdir, sock)

    def register_service(self, namespace: str, name: str, port: int, target_port: int) -> None:
        """Route the apiserver's calls to Service ``namespace/name:port`` (which must exist: the
        apiserver dials its ClusterIP) to a host process on port ``target_port``.

        Through the Service proxy (``service_network=True``) to 127.0.0.1:``target_port``; with a
        real node and no proxy, kube-proxy routes it as in a user's cluster: an EndpointSlice of
        the Service names the host at the pods' gateway address, so the process must listen
        there (or on every address), and pods reach it the same way."""
        if self.node is not None and not self.services_file.exists():
            self._host_endpoint(namespace, name, port, target_port)
            return
        if not self.services_file.exists():
            raise RuntimeError("this control plane was started without service_network=True")
        table = json.loads(self.services_file.read_text())
        table[f"{name}.{namespace}.svc:{port}"] = target_port
        # kube-apiserver dials a Service webhook at the Service's ClusterIP.
        ip = self.kubectl(
            "get", "service", name, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
        ).stdout.strip()
        if ip and ip != "None":
            table[f"{ip}:{port}"] = target_port
        tmp = self.services_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        tmp.replace(self.services_file)

    def _host_endpoint(self, namespace: str, name: str, port: int, target_port: int) -> None:
        """An EndpointSlice of Service ``namespace/name`` at GATEWAY:``target_port`` (the host,
        seen from the pods' bridge): kube-proxy sends the Service's ``port`` there. The
        EndpointSlice controller leaves it alone (another manager), beside its own, empty, slice
        when the Service has a selector."""
        from localcluster.node import GATEWAY

        svc = json.loads(self.kubectl("get", "service", name, "-n", namespace, "-o", "json").stdout)
        svc_port = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
        if svc_port is None:
            raise RuntimeError(f"Service {namespace}/{name} has no port {port}")
        self.apply(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-host",
                    "namespace": namespace,
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "localcluster",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
                "ports": [
                    {
                        "name": svc_port.get("name", ""),
                        "port": target_port,
                        "protocol": svc_port.get("protocol", "TCP"),
                    }
                ],
            }
        )
