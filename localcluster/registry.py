"""A real OCI registry on this machine: the CNCF distribution registry (tools/registry/main.go,
built by ``tools/provision.sh registry``), plain HTTP on a loopback port, storage in a folder.

    with Registry.start(workdir) as reg:      # reg.host == "127.0.0.1:PORT"
        publish(version, reg.host)            # make release VERSION=... REGISTRY=127.0.0.1:PORT
        reg.pulls("gpu-scheduler")            # the manifests clients fetched, from its access log

``python -m localcluster.registry [--port 5000] [--dir .cluster/registry]`` runs one in the
foreground (``make registry``) to try ``make release`` against.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from localcluster.network import free_port
from localcluster.procs import ManagedProcess
from localcluster.toolcache import REPO, tool

# What an OCI client asks for a manifest with (helm, containerd and buildah send these).
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)


def config_yaml(storage: Path, port: int) -> str:
    """The registry's configuration: filesystem storage, deletes allowed, HTTP on 127.0.0.1 only,
    an access log line per request (``pulls`` reads them), no authentication."""
    return json.dumps(
        {
            "version": "0.1",
            "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": False}},
            "storage": {
                "filesystem": {"rootdirectory": str(storage)},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {"addr": f"127.0.0.1:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
        }
    )


@dataclass
class Registry:
    """A running registry: ``host`` is what clients name it by (``127.0.0.1:PORT``)."""

    proc: ManagedProcess
    port: int
    dir: Path

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, workdir: Path, port: int | None = None, timeout: float = 30) -> Registry:
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        config = workdir / "config.yml"
        config.write_text(config_yaml(workdir / "storage", port))  # JSON is YAML
        proc = ManagedProcess(
            "registry", [tool("registry"), "serve", config], log_path=workdir / "registry.log"
        ).start()
        reg = cls(proc, port, workdir)
        try:
            proc.wait_http(f"http://{reg.host}/v2/", timeout=timeout)
        except BaseException:
            proc.stop()
            raise
        return reg

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self) -> Registry:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading it
    def get(
        self, path: str, method: str = "GET", accept: str = MANIFEST_TYPES
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(f"http://{self.host}{path}", method=method, headers={"Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (loopback only)
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry serves for ``repository:reference`` (a tag or a digest)."""
        status, headers, _ = self.get(f"/v2/{repository}/manifests/{reference}", method="HEAD")
        return headers.get("Docker-Content-Digest") if status == 200 else None

    def tags(self, repository: str) -> list[str]:
        status, _, body = self.get(f"/v2/{repository}/tags/list", accept="application/json")
        return list(json.loads(body).get("tags") or []) if status == 200 else []

    def requests(self) -> list[dict[str, str]]:
        """Every request in the access log: method, path, status and user agent."""
        out = []
        for line in self.proc.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or "http.request.uri" not in entry:
                continue
            out.append(
                {
                    "method": str(entry.get("http.request.method", "")),
                    "path": str(entry["http.request.uri"]),
                    "status": str(entry.get("http.response.status", "")),
                    "agent": str(entry.get("http.request.useragent", "")),
                }
            )
        return out

    def pulls(self, repository: str) -> list[dict[str, str]]:
        """The successful manifest GETs of ``repository`` (each pull fetches one)."""
        pattern = re.compile(rf"^/v2/{re.escape(repository)}/manifests/[^/?]+$")
        return [
            r
            for r in self.requests()
            if r["method"] == "GET" and r["status"] == "200" and pattern.match(r["path"])
        ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.registry", description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--dir", type=Path, default=REPO / ".cluster" / "registry")
    args = ap.parse_args(argv)
    reg = Registry.start(args.dir, args.port)
    print(f"registry at {reg.host} (storage {args.dir / 'storage'}); Ctrl-C stops it", flush=True)
    print(f"  make release VERSION=<version> REGISTRY={reg.host}", flush=True)
    try:
        while reg.proc.running():
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
