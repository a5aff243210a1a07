"""Tenancy in webhook mode: the resolved grants the scheduler publishes, from a watch of one
ConfigMap, and the check ``/mutate`` and ``/validate`` make with them.

With ``WEBHOOK_TENANCY_GRANTS`` (``namespace/name``; the chart sets it with ``tenancy.enabled``)
the webhook refuses a StatefulSet or a bare pod whose map names a node no GPUPinningPolicy grants
its namespace (``NotGranted``, :func:`kube_gpu_scheduler.domain.rules.map_not_granted`: the words
of the chart's ValidatingAdmissionPolicy in policy mode), and one whose map shares a GPU where a
policy that selects its namespace forbids it (``GPUSharingForbidden``, ``spec.allowSharedGPUs:
false``: :func:`kube_gpu_scheduler.domain.rules.sharing_forbidden` with
:func:`kube_gpu_scheduler.domain.sharing.tenant_forbids`). Pods the StatefulSet controller creates
are not checked again (their StatefulSet was); the scheduler refuses to bind what no policy
grants and counts the limits.

:class:`GrantsCache` runs an :class:`~kube_gpu_scheduler.kube.informer.Informer` of that one
ConfigMap (a field selector on its name; RBAC: ``get``, ``list``, ``watch`` with
``resourceNames``). Until it has listed, or when the ConfigMap does not exist, a mapped object is
refused (the policy's ``parameterNotFoundAction: Deny``): with tenancy on nothing is granted that
is not known to be.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

from kubernetes import client

from kube_gpu_scheduler.base.config import split_namespaced
from kube_gpu_scheduler.domain.rules import NOT_GRANTED, Finding, map_not_granted, sharing_forbidden
from kube_gpu_scheduler.domain.schedmap import SchedulingMap
from kube_gpu_scheduler.domain.sharing import tenant_forbids
from kube_gpu_scheduler.domain.tenancy import Grants
from kube_gpu_scheduler.kube.backoff import Backoff
from kube_gpu_scheduler.kube.client import load_client
from kube_gpu_scheduler.kube.errors import short_error
from kube_gpu_scheduler.kube.informer import IGNORE, Informer
from kube_gpu_scheduler.webhook.perprocess import PerProcessWatch
from kube_gpu_scheduler.webhook.review import Request

log = logging.getLogger("webhook.grants")

STATEFULSET_CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"
CONTROLLER_MANAGER = "system:kube-controller-manager"


class GrantsUnavailable(Exception):
    """The grants are not known (not listed yet, no API access, no such ConfigMap)."""


class GrantsLookup(Protocol):
    def grants(self) -> Grants:
        """The grants now; raises GrantsUnavailable. Must not block."""
        ...


class GrantsCache(PerProcessWatch):
    """The grants ConfigMap from a list-then-watch, started in the worker process on first use."""

    thread_name = "webhook-grants"

    def __init__(self, kubeconfig: str | None, namespace: str, name: str) -> None:
        super().__init__("the grants have not been read yet")
        self._kubeconfig, self.namespace, self.name = kubeconfig, namespace, name

    def grants(self) -> Grants:
        self.start()
        informer = self._informer
        if informer is None or not informer.synced.is_set():
            raise GrantsUnavailable(self._why)
        found = informer.get(f"{self.namespace}/{self.name}")
        if found is None:
            raise GrantsUnavailable(f"ConfigMap {self.namespace}/{self.name} does not exist")
        return Grants.from_data(found.get("data"))

    def _run(self) -> None:
        try:
            api = client.CoreV1Api(
                load_client(self._kubeconfig, fallbacks=False, user_agent="gpu-scheduler-webhook")
            )
        except Exception as exc:
            self._why = f"no Kubernetes API access ({type(exc).__name__}: {exc})"
            log.warning("tenancy grants unavailable: %s", self._why)
            return

        def failed(exc: BaseException) -> None:
            self._why = f"cannot read ConfigMap {self.namespace}/{self.name}: {short_error(exc)}"

        informer = Informer(
            "grants",
            functools.partial(api.list_namespaced_config_map, self.namespace),
            IGNORE,
            field_selector=f"metadata.name={self.name}",
            backoff=Backoff(0.5, 30.0),
            on_error=failed,
            jitter=0.2,
            list_timeout=(5.0, 30.0),
        )
        self._informer = informer
        informer.run(self._stop)


def created_by_statefulset_controller(req: Request) -> bool:
    """The pod's creator is the StatefulSet controller, as the apiserver authenticated it."""
    user = req.raw.get("userInfo") if isinstance(req.raw.get("userInfo"), dict) else {}
    name = user.get("username") if isinstance(user, dict) else None
    if name == STATEFULSET_CONTROLLER:
        return True
    owners = ((req.object or {}).get("metadata") or {}).get("ownerReferences") or []
    return name == CONTROLLER_MANAGER and any(
        isinstance(o, dict) and o.get("controller") and o.get("kind") == "StatefulSet" for o in owners
    )


def grant_findings(smap: SchedulingMap, namespace: str, lookup: GrantsLookup | None) -> list[Finding]:
    """NotGranted, then GPUSharingForbidden, for ``smap`` in ``namespace`` (nothing when tenancy is
    off: ``lookup`` None)."""
    if lookup is None:
        return []
    try:
        grants = lookup.grants()
    except GrantsUnavailable as exc:
        why = f"tenancy is on and the GPUPinningPolicy grants are not known ({exc}): no map is admitted"
        return [Finding(NOT_GRANTED, f"{why} until they are (the scheduler publishes them)")]
    found = map_not_granted(smap.entries.values(), namespace, grants)
    policy = grants.forbids_sharing(namespace) if smap.shared() else None
    if policy is not None:
        found += sharing_forbidden(smap, tenant_forbids(policy, namespace))
    return found


def tenancy_lookup(kubeconfig: str | None, grants: str) -> Any:
    """A GrantsCache for ``namespace/name``, or None when tenancy is off."""
    if not grants:
        return None
    return GrantsCache(kubeconfig, *split_namespaced(grants))
