"""How the tests talk to the local control plane: kubectl, helm, the API client, kubeconfigs,
ServiceAccount tokens, and the wait that fails at once when a component dies."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from localcluster.procs import ManagedProcess
from localcluster.toolcache import tool

if TYPE_CHECKING:
    from localcluster.node import RealNode


class CommandFailed(subprocess.CalledProcessError):
    """A kubectl/helm call failed; its message carries the tool's own stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


def kubeconfig_yaml(
    server: str,
    ca_file: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> str:
    creds: dict[str, Any] = {}
    if cert and key:
        creds = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        creds = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    }
    return yaml.safe_dump(doc, sort_keys=False)


# libyaml's loader and emitter where PyYAML has them (as the product's mapcli): the same documents
# for about a fifth of the CPU of the pure-Python ones; a third of the chart unit tests' time was
# parsing helm's output.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_manifests(text: str) -> list[dict[str, Any]]:
    """The documents of a multi-document manifest (``yaml.safe_load_all``), empty ones left out."""
    return [d for d in yaml.load_all(text, Loader=YAML_LOADER) if d]


def dump_manifests(manifest: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> str:
    docs = [manifest] if isinstance(manifest, Mapping) else list(manifest)
    return yaml.dump_all(docs, Dumper=YAML_DUMPER, sort_keys=False)


class ClusterClients:
    """The client half of :class:`localcluster.cluster.Cluster` (which holds these attributes)."""

    workdir: Path
    server: str
    ca_file: Path
    kubeconfig: Path
    procs: dict[str, ManagedProcess]
    detached: bool
    node: RealNode | None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(tool("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise CommandFailed(res.returncode, res.args, res.stdout, res.stderr)
        return res

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        env.setdefault("HELM_CACHE_HOME", str(self.workdir / "helm" / "cache"))
        env.setdefault("HELM_CONFIG_HOME", str(self.workdir / "helm" / "config"))
        env.setdefault("HELM_DATA_HOME", str(self.workdir / "helm" / "data"))
        res = subprocess.run(
            [str(tool("helm")), *args], check=False, capture_output=True, text=True, env=env, timeout=300
        )
        if check and res.returncode != 0:
            raise CommandFailed(res.returncode, res.args, res.stdout, res.stderr)
        return res

    def apply(self, manifest: Mapping[str, Any] | Iterable[Mapping[str, Any]] | str) -> None:
        """``kubectl apply -f -``: each document a server-side apply through the admin's API
        client where the apiserver takes it, else kubectl's own (localcluster/apiapply.py)."""
        from localcluster import apiapply

        docs = load_manifests(manifest) if isinstance(manifest, str) else manifest
        if isinstance(docs, Mapping):
            docs = [docs]

        def kubectl_apply(rest: list[Mapping[str, Any]]) -> None:
            self.kubectl("apply", "-f", "-", input=dump_manifests(rest))

        apiapply.apply(self.admin_api(), docs, kubectl_apply)

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def admin_api(self) -> Any:
        """One admin API client for this cluster's own helpers (made on first use, kept)."""
        api = self.__dict__.get("_admin_api")
        if api is None:
            api = self.__dict__["_admin_api"] = self.api_client()
        return api

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get <args> -o json`` through the admin's API client, no process; {} when
        kubectl would fail (not found): localcluster/apiget.py."""
        from localcluster import apiget

        return apiget.get(self.admin_api(), *args)

    def _ok(self, *args: str) -> bool:
        """Would ``kubectl <args>`` succeed? A ``get`` is asked through the API client (it polls)."""
        if args and args[0] == "get":
            try:
                return bool(self.get_json(*args[1:]))
            except Exception:  # the apiserver not serving yet: not yet
                return False
        return self.kubectl(*args, check=False).returncode == 0

    def wait_until(self, cond: Any, timeout: float, what: str, interval: float = 0.2) -> None:
        """Poll ``cond`` until true; fail at once if a control-plane component died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs.values():
                if not proc.running():
                    raise proc.fail(f"exited while waiting for {what}")
            if cond():
                return
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    # ---------------------------------------------------------------- identities
    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path | None = None, duration: str = "2h"
    ) -> Path:
        """A kubeconfig holding a token from the TokenRequest API for ``namespace/name``
        (``duration``: ``2h``, ``30m``, ``90s``), asked through the API client (a kubectl process
        costs more than the request)."""
        from kubernetes import client

        seconds = int(duration[:-1]) * {"h": 3600, "m": 60, "s": 1}[duration[-1]]
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        core: Any = client.CoreV1Api(self.admin_api())
        resp = core.create_namespaced_service_account_token(
            name, namespace, {**request, "spec": {"expirationSeconds": seconds}}, _preload_content=False
        )
        token = json.loads(resp.data)["status"]["token"]
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(kubeconfig_yaml(self.server, self.ca_file, f"{namespace}-{name}", token=token))
        path.chmod(0o600)
        return path

    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_file.read_bytes()).decode()
