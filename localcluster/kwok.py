"""What kwok plays: the fake GPU nodes' manifests, kwok's configuration and the stages it runs
(its own, from the pinned module, and the kubelet's refusal of a pod at admission)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localcluster.toolcache import tool

GPU_RESOURCE = "nvidia.com/gpu"
CONTROL_PLANE_NODE = "control-plane"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# A pod carrying this annotation is refused by its (kwok) kubelet at admission, as a real kubelet
# refuses a pod that does not fit: phase Failed, status.reason the annotation's value (OutOfcpu,
# NodeAffinity, UnexpectedAdmissionError, ...). For tests of what the scheduler does then.
KUBELET_REFUSES_ANNOTATION = "localcluster.gpu-scheduler.dev/kubelet-refuses"
# The kwok Stage that does it. Its weight (1) beats kwok's own pod-ready stage (0) for such pods.
KUBELET_REFUSAL_STAGE = f"""apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-kubelet-refuses
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.annotations["{KUBELET_REFUSES_ANNOTATION}"]'
      operator: 'Exists'
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  weight: 1
  next:
    statusTemplate: |
      phase: Failed
      reason: {{{{ index .metadata.annotations "{KUBELET_REFUSES_ANNOTATION}" | Quote }}}}
      message: "Pod was rejected: the node refused it at admission (localcluster kwok stage pod-kubelet-refuses)"
"""
# Taints the node lifecycle controller puts on a node until it has seen it Ready.
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def write_config(path: Path) -> Path:
    """An explicit configuration (so a user's ~/.kwok/kwok.yaml is never picked up) holding
    kwok's own stages from the pinned module: nodes become Ready, bound pods Running."""
    stages = sorted((tool("kwok").parent.parent / "stages").glob("*.yaml"))
    if not stages:
        raise FileNotFoundError("kwok stages are missing from the tool cache: run `make tools`")
    docs = [
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
        "  nodeLeaseParallelism: 4\n  nodePlayStageParallelism: 4\n"
        "  podPlayStageParallelism: 8\n  podsOnNodeSyncParallelism: 2\n"
    ]
    docs += [s.read_text() for s in stages]
    docs.append(KUBELET_REFUSAL_STAGE)
    path.write_text("\n---\n".join(docs))
    return path


def gpu_node_manifest(
    name: str,
    gpus: int | None = 4,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node that kwok manages, reporting ``gpus`` nvidia.com/gpu (None: no GPU resource).
    Like a kubelet, it reports ephemeral-storage: the charts' pods request some."""
    resources: dict[str, str] = {"cpu": "32", "memory": "256Gi", "ephemeral-storage": "100Gi", "pods": "110"}
    if gpus is not None:
        resources[GPU_RESOURCE] = str(gpus)
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        node_labels["nvidia.com/gpu.present"] = "true"
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": list(taints or []), "unschedulable": unschedulable},
        "status": {"capacity": resources, "allocatable": resources},
    }
