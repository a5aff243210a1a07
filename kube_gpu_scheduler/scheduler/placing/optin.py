"""The namespaces injection serves: a replica admitted without its variables elsewhere waits.

When injection is scoped (the chart's ``injection.namespaceSelector``, its
``excludeNamespaces`` and the release namespace, given as ``GPU_SCHEDULER_INJECTION_NAMESPACES``),
a mapped replica in a namespace outside that scope is admitted without its GPU variables,
and would be admitted the same way again: deleting it so that its controller recreates it
(:mod:`kube_gpu_scheduler.scheduler.report.recreate`) only loops. Such a replica waits instead,
``NamespaceNotOptedIn``, with an event saying how to opt its namespace in; once its namespace
is served (a label added), it is tried again at once, recreated through admission, and placed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from kube_gpu_scheduler.domain.objects import Pod
from kube_gpu_scheduler.domain.rules import Decision, not_opted_in
from kube_gpu_scheduler.domain.selectors import Selector
from kube_gpu_scheduler.domain.tenancy import labels_of
from kube_gpu_scheduler.kube.informer import Obj


class InjectionScope:
    def __init__(
        self, selector: Selector, namespace: Callable[[str], Obj | None], retry: Callable[[str], None]
    ) -> None:
        self.selector = selector
        self._namespace = namespace  # the namespace cache's lookup by name
        self._retry = retry
        self._lock = threading.Lock()
        self._waiting: dict[str, set[str]] = {}  # namespace -> keys of its replicas waiting here

    def served(self, namespace: str) -> bool:
        return self.selector.matches(labels_of(self._namespace(namespace)))

    def hold(self, pod: Mapping[str, Any], decision: Decision) -> Decision | None:
        """For a pod admitted without its variables (``NotInjected``): ``NamespaceNotOptedIn``
        when injection does not serve its namespace, else None (it is recreated)."""
        view = Pod(pod)
        namespace = view.namespace or ""
        labels = dict(labels_of(self._namespace(namespace)))
        if decision.entry is None or self.selector.matches(labels):
            return None
        with self._lock:
            self._waiting.setdefault(namespace, set()).add(view.key)
        finding = not_opted_in(namespace, self.selector, labels, decision.entry)
        return Decision(decision.ordinal, decision.entry, (finding,), decision.warnings)

    def forget(self, pod: Mapping[str, Any]) -> None:
        view = Pod(pod)
        namespace = view.namespace or ""
        with self._lock:
            keys = self._waiting.get(namespace)
            if keys is not None:
                keys.discard(view.key)
                if not keys:
                    del self._waiting[namespace]

    def namespace_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A namespace's labels changed: its waiting replicas are tried again (now served: recreated)."""
        if old is not None and new is not None and labels_of(old) == labels_of(new):
            return
        name = str(((new or old or {}).get("metadata") or {}).get("name") or "")
        with self._lock:
            keys = list(self._waiting.get(name, ()))
        for key in keys:
            self._retry(key)
