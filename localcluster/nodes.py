"""The cluster's nodes: kwok GPU nodes made, waited for, cut off and reconnected (kwok plays
them: localcluster/kwok.py), and the real kubelet node joined to the control plane
(localcluster/node.py holds what runs on it)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from localcluster.clients import kubeconfig_yaml
from localcluster.components import ComponentProcesses
from localcluster.kwok import CONTROL_PLANE_NODE, KWOK_ANNOTATION, NOT_READY_TAINTS, gpu_node_manifest
from localcluster.network import free_port
from localcluster.pki import LocalPKI
from localcluster.procs import ManagedProcess


class ClusterNodes(ComponentProcesses):
    """The node half of :class:`localcluster.cluster.Cluster`."""

    def _spawn_node_process(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        # containerd finds containerd-shim-runc-v2 on its PATH; runc and the CNI plugins come
        # from the host's packages.
        assert self.node is not None
        return self._spawn(name, argv, path_prefix=self.node.bins.shim_dir)

    def _start_real_node(self, pki: LocalPKI, timeout: float) -> None:
        assert self.node is not None
        name = self.node.name
        from localcluster.node import COREDNS_RBAC, ControlPlane

        self.apply(COREDNS_RBAC)
        access = ControlPlane(
            self._spawn_node_process, pki, self.server, self.ca_file, kubeconfig_yaml, free_port
        )
        dns_health = self.node.start_coredns(access)
        self.procs["coredns"].wait_http(dns_health, timeout=timeout)
        self.node.start_kubelet(access)
        self.node.start_kube_proxy(access)
        self.wait_until(lambda: self._ok("get", "node", name), timeout, f"the kubelet to register {name}")
        # The kubelet may not set node-role labels itself (NodeRestriction): label it here, so the
        # charts' default nodeSelector and tolerations (control-plane) hold unchanged.
        self.kubectl(
            "label",
            "node",
            name,
            "--overwrite",
            "node-role.kubernetes.io/control-plane=",
            "node.kubernetes.io/exclude-from-external-load-balancers=",
        )
        self.wait_node_ready(name, timeout)

    def _create_nodes(self, gpu_nodes: int, gpus_per_node: int, timeout: float) -> None:
        names = [f"node{i}" for i in range(1, gpu_nodes + 1)]
        for name in names:
            self.add_gpu_node(name, gpus=gpus_per_node, wait=False)
        if self.node is None:
            self._create_kwok_control_plane()
            names.insert(0, CONTROL_PLANE_NODE)
        for name in names:
            self.wait_node_ready(name, timeout)

    def _create_kwok_control_plane(self) -> None:
        self.add_node(
            CONTROL_PLANE_NODE,
            gpus=None,
            labels={
                "node-role.kubernetes.io/control-plane": "",
                "node.kubernetes.io/exclude-from-external-load-balancers": "",
            },
            taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
            wait=False,
        )

    def add_node(
        self,
        name: str,
        gpus: int | None = 4,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        unschedulable: bool = False,
        wait: bool = True,
        timeout: float = 60,
    ) -> None:
        self.apply(gpu_node_manifest(name, gpus, labels, taints, unschedulable))
        if wait:
            self.wait_node_ready(name, timeout)

    def add_gpu_node(
        self,
        name: str,
        gpus: int = 4,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        unschedulable: bool = False,
        wait: bool = True,
    ) -> None:
        self.add_node(name, gpus, labels, taints, unschedulable, wait)

    def add_nodes(
        self, names: Sequence[str], gpus: int | None = 4, *, threads: int = 8, timeout: float = 300
    ) -> None:
        """Create many kwok nodes at once (``make bench``: 1,000 in seconds) and wait until all are Ready.

        Nodes are created through the API with a small thread pool (one POST each; an existing
        node is left as it is), then one list per poll waits for their Ready condition and for
        the controller-manager to lift the ``node.kubernetes.io/not-ready`` taint it puts on every
        new node (with 1,000 nodes that takes a while longer than Ready itself).
        """
        from concurrent.futures import ThreadPoolExecutor

        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self.api_client()
        # Plain dicts in and out (no model objects): the API's JSON as it is.
        core: Any = client.CoreV1Api(api)

        def create(name: str) -> None:
            try:
                core.create_node(gpu_node_manifest(name, gpus), _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise

        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(create, names))
            wanted = set(names)

            def all_ready() -> bool:
                resp = core.list_node(_preload_content=False)
                ready = {
                    n["metadata"]["name"]
                    for n in json.loads(resp.data)["items"]
                    if any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or []
                    )
                    and not any(
                        t.get("key") in NOT_READY_TAINTS for t in (n.get("spec") or {}).get("taints") or []
                    )
                }
                return wanted <= ready

            self.wait_until(all_ready, timeout, f"{len(wanted)} nodes Ready", interval=1.0)
        finally:
            api.close()

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true")

    def wait_node_ready(self, name: str, timeout: float = 60) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core: Any = client.CoreV1Api(self.admin_api())

        def ready() -> bool:
            try:
                node = json.loads(core.read_node(name, _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            conditions = (node.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

        self.wait_until(ready, timeout, f"node {name} Ready")

    def cut_off_node(self, name: str) -> None:
        """Kwok node ``name``'s kubelet stops answering, as in a network partition: kwok stops
        playing it (no status, no lease renewal; its pods are left as they are, so a pod deleted
        there stays Terminating), and its Ready condition turns Unknown as the node lifecycle
        controller writes it once ``--node-monitor-grace-period`` (50 s) passes without a
        heartbeat, written at once here. The controller then taints the node unreachable
        (NoSchedule, NoExecute) and evicts its pods after their ``tolerationSeconds``.

        kwok keeps playing a node it has seen even when the node stops matching its annotation
        selector, so it is restarted (it lists the nodes again, without this one): see
        :meth:`_restart_kwok`.
        """
        self.kubectl("annotate", "node", name, f"{KWOK_ANNOTATION}=cut-off", "--overwrite")
        self._restart_kwok()
        ready = {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }
        patch = json.dumps({"status": {"conditions": [ready]}})
        self.kubectl("patch", "node", name, "--subresource=status", "--type=strategic", "-p", patch)

    def reconnect_node(self, name: str, timeout: float = 60) -> None:
        """Undo :meth:`cut_off_node`: kwok plays the node again (it reports Ready, renews its lease,
        finishes the deletions that waited) and the node lifecycle controller lifts its taints."""
        self.kubectl("annotate", "node", name, f"{KWOK_ANNOTATION}=fake", "--overwrite")
        # kwok takes up a node's lease only when it lists it (not on an update): restart it.
        self._restart_kwok()
        self.wait_node_ready(name, timeout)

        # kwok plays the pods of a node once it holds the node's Lease, as its Lease cache shows
        # it: pods it lists before that are skipped until they change. So the pods deleted while
        # the node was away are touched until kwok has finished their deletion, as a kubelet
        # coming back does.
        def deletions_finished() -> bool:
            out = self.kubectl(
                "get", "pods", "-A", "--field-selector", f"spec.nodeName={name}", "-o", "json"
            ).stdout
            left = [p for p in json.loads(out)["items"] if p["metadata"].get("deletionTimestamp")]
            for pod in left:
                meta = pod["metadata"]
                self.kubectl(
                    "annotate",
                    "pod",
                    meta["name"],
                    "-n",
                    meta["namespace"],
                    f"localcluster.gpu-scheduler.dev/reconnected={time.monotonic_ns()}",
                    "--overwrite",
                    check=False,
                )
            return not left

        self.wait_until(deletions_finished, timeout, f"kwok to finish the deletions on {name}", interval=1.0)

    def _restart_kwok(self) -> None:
        """Restart kwok, which then lists the nodes it plays again.

        A kwok process holds its nodes' Leases under an identity of its own (hostname and a
        random UUID): a new process could take them only once they expire (40 s), longer than
        the node lifecycle controller may wait without a heartbeat for some. So the Leases of
        the nodes kwok plays are deleted between the stop and the start, and the new process
        creates them at once (a node cut off keeps its Lease, which nobody renews any more).
        """
        proc = self.procs["kwok"]
        proc.stop()
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        played = [
            n["metadata"]["name"]
            for n in nodes
            if (n["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == "fake"
        ]
        if played:
            self.kubectl("delete", "lease", "-n", "kube-node-lease", "--ignore-not-found", *played)
        proc.start()
        if self.detached:
            proc.detach()
        if (self.workdir / "state.json").exists():
            self._write_state()
