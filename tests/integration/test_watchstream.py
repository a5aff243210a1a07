"""kube_gpu_scheduler/kube/watchstream.py against the real apiserver: the official client's watch
response is read in bulk (not the fallback), an Informer whose watches the apiserver ends every
second sees every change once, in order, across the restarts, and each ended watch's connection
is closed (its body was read behind urllib3's back)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from kube_gpu_scheduler.kube import watchstream
from kube_gpu_scheduler.kube.client import load_client
from kube_gpu_scheduler.kube.informer import Callbacks, Informer, Obj
from localcluster.cluster import Cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_the_clients_watch_is_read_in_bulk(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(load_client(str(cluster.kubeconfig)))
    resp = core.list_namespace(watch=True, timeout_seconds=1, _preload_content=False)
    try:
        assert not watchstream.reusable(resp), "the response is read the client's way, not in bulk"
        names = {line for line in watchstream.lines(resp) if line}
        assert any(b'"default"' in line for line in names), names
    finally:
        resp.close()
        resp.release_conn()


def test_an_informer_whose_watches_end_every_second_misses_nothing(cluster: Cluster) -> None:
    ns = f"ws-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    api = load_client(str(cluster.kubeconfig))
    core: Any = client.CoreV1Api(api)
    seen: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def record(kind: str) -> Any:
        def on(*objs: Obj) -> None:
            obj = objs[-1]
            if obj["metadata"]["name"] == "kube-root-ca.crt":  # the namespace's own
                return
            with lock:
                seen.append((kind, obj["metadata"]["name"], obj.get("data", {}).get("v", "")))

        return on

    informer = Informer(
        "configmaps",
        lambda **kw: core.list_namespaced_config_map(ns, **kw),
        Callbacks(record("add"), record("update"), record("delete")),
        watch_timeout=1,
    )
    stop = threading.Event()
    informer.start(stop)
    try:
        wait_for(informer.synced.is_set, 30, what="the informer synced")
        for i in range(12):  # across several watches: each ends after a second
            name = f"c{i % 3}"
            body = {"metadata": {"name": name}, "data": {"v": str(i)}}
            if i < 3:
                core.create_namespaced_config_map(ns, body)
            else:
                core.replace_namespaced_config_map(name, ns, body)
            time.sleep(0.4)
        core.delete_namespaced_config_map("c0", ns)
        want = [("add", f"c{i}", str(i)) for i in range(3)]
        want += [("update", f"c{i % 3}", str(i)) for i in range(3, 12)] + [("delete", "c0", "9")]
        wait_for(lambda: len(seen) >= len(want), 30, what=f"{len(want)} changes seen")
        time.sleep(1.5)  # one more watch: nothing is delivered twice
        assert seen == want
    finally:
        stop.set()
        informer.join(5)
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
