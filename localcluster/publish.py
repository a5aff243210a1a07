"""``make release VERSION=x.y.z REGISTRY=host[:port][/path]``: one version, three artifacts, one registry.

1. The version must be the one the tree says everywhere (tools/release_check.py: pyproject.toml,
   both charts' ``version`` and ``appVersion``).
2. The image (localcluster/multiarch.py): linux/amd64 and linux/arm64 under one OCI image index,
   pushed as ``REGISTRY/gpu-scheduler:x.y.z``. The amd64 image is `make image`'s archive, the one
   `make test` ran (same base, same digest); arm64 is cross-built from the same Dockerfile (or,
   ``--base dockerfile``, both built on the Dockerfile's own ``PYTHON_IMAGE``, as CI does). An SPDX
   SBOM per platform attested and the index signed with cosign (COSIGN_KEY, or a local key in
   build/release-keys/), both verified back from the registry: the release fails otherwise.
3. Both charts, packaged with that image written into what they install: ``image.repository``
   = ``REGISTRY/gpu-scheduler`` and ``image.digest`` = the digest (a chart older than
   ``image.digest``, such as 0.1.0, gets it as ``image.tag: x.y.z@sha256:...``), and Artifact
   Hub's ``artifacthub.io/images`` annotation; pushed as OCI artifacts
   ``oci://REGISTRY/charts/gpu-scheduler`` and ``oci://REGISTRY/charts/gpu-scheduler-check``
   (``helm push``).
4. ``dist/release/<version>.json`` records the references and digests, and the install commands
   are printed.

A registry on a loopback address (127.0.0.1, localhost, [::1]) is spoken to over plain HTTP
unless ``--plain-http false`` (as containerd and go-containerregistry do); credentials, where
the registry wants them, come from ``RELEASE_REGISTRY_USER``/``RELEASE_REGISTRY_PASSWORD``
(``buildah login`` and ``helm registry login``, password on stdin).

``--source DIR`` releases another tree (an earlier release's checkout: the upgrade tests push
the previous release this way), ``--image LOCALREF`` pushes an image already built (one
platform, labelled with the version here, unsigned: the tests' previous release).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localcluster.toolcache import REPO

IMAGE_NAME = "gpu-scheduler"
CHARTS = ("gpu-scheduler-chart", "gpu-scheduler-check-chart")
CHART_PATH = "charts"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
OUT = REPO / "dist" / "release"
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


def say(msg: str) -> None:
    print(f"[release] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- names
def registry_host(registry: str) -> str:
    """``host[:port]`` of ``host[:port][/path]``."""
    return registry.split("/", 1)[0]


def is_loopback(registry: str) -> bool:
    host = registry_host(registry)
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return name in LOOPBACK


def image_repository(registry: str) -> str:
    """Where the image goes: ``REGISTRY/gpu-scheduler`` (CI: $CI_REGISTRY_IMAGE/gpu-scheduler,
    the charts' default image.repository)."""
    return f"{registry.rstrip('/')}/{IMAGE_NAME}"


def chart_repository(registry: str) -> str:
    """Where the charts go (``helm push`` adds the chart's name): ``oci://REGISTRY/charts``. Not
    REGISTRY itself: the scheduler chart is named gpu-scheduler like the image."""
    return f"oci://{registry.rstrip('/')}/{CHART_PATH}"


# ---------------------------------------------------------------- versions
def tree_versions(source: Path) -> dict[str, str | None]:
    """The version each file of ``source`` names: pyproject.toml, each chart's version and appVersion."""
    out: dict[str, str | None] = {
        "pyproject.toml": str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"])
    }
    for chart in CHARTS:
        text = (source / chart / "Chart.yaml").read_text()
        for key in ("version", "appVersion"):
            m = re.search(rf"""^{key}:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""", text, re.M)
            out[f"{chart}/Chart.yaml {key}"] = m.group(1) if m else None
    return out


def version_problems(source: Path, version: str) -> list[str]:
    return [
        f"{where} says {found!r}, not {version!r}"
        for where, found in tree_versions(source).items()
        if found != version
    ]


# ---------------------------------------------------------------- the charts' values
def pin_image(values_text: str, repository: str, digest: str, version: str) -> str:
    """``values.yaml`` text with its top-level ``image`` block naming ``repository`` and
    ``digest``: the ``digest:`` line set where the chart has one, else ``tag:`` set to
    ``version@digest`` (a chart older than image.digest). Comments and the rest stay as written."""
    if not DIGEST.match(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    m = re.search(r"^image:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)+)", values_text, re.M)
    if not m:
        raise ValueError("values.yaml has no top-level image: block")
    block = m.group(1)

    def setting(text: str, key: str, value: str) -> tuple[str, int]:
        return re.subn(
            rf"^([ \t]+){key}:[ \t]*.*$", lambda k: f'{k.group(1)}{key}: "{value}"', text, count=1, flags=re.M
        )

    block, n = setting(block, "repository", repository)
    if n != 1:
        raise ValueError("the image block has no repository:")
    block, n = setting(block, "digest", digest)
    if n != 1:
        block, n = setting(block, "tag", f"{version}@{digest}")
        if n != 1:
            raise ValueError("the image block has neither digest: nor tag:")
    return values_text[: m.start(1)] + block + values_text[m.end(1) :]


def annotate_images(chart_yaml: str, image: str) -> str:
    """Chart.yaml text with Artifact Hub's ``artifacthub.io/images`` annotation naming ``image``."""
    entry = f"  artifacthub.io/images: |\n    - name: {IMAGE_NAME}\n      image: {image}\n"
    if re.search(r"^annotations:[ \t]*$", chart_yaml, re.M):
        return re.sub(r"^annotations:[ \t]*\n", lambda m: m.group(0) + entry, chart_yaml, count=1, flags=re.M)
    return chart_yaml.rstrip("\n") + "\nannotations:\n" + entry


# ---------------------------------------------------------------- tools
def helm_bin() -> str:
    found = shutil.which("helm")
    if found:
        return found
    from localcluster.toolcache import tool

    return str(tool("helm"))


def run(argv: list[str], input_text: str | None = None, timeout: float = 1800) -> str:
    res = subprocess.run(argv, input=input_text, capture_output=True, text=True, check=False, timeout=timeout)
    if res.returncode != 0:
        shown = " ".join(a if "password" not in a.lower() else "***" for a in argv[:4])
        raise RuntimeError(f"{shown} ... failed ({res.returncode}):\n{res.stderr[-4000:]}")
    return res.stdout + res.stderr


def login(registry: str, plain_http: bool) -> None:
    """``buildah login`` and ``helm registry login`` with RELEASE_REGISTRY_USER/PASSWORD, if set."""
    user, password = os.environ.get("RELEASE_REGISTRY_USER"), os.environ.get("RELEASE_REGISTRY_PASSWORD")
    if not (user and password):
        return
    host = registry_host(registry)
    tls = [f"--tls-verify={'false' if plain_http else 'true'}"]
    res = subprocess.run(
        ["buildah", "login", *tls, "--username", user, "--password-stdin", host],
        input=password, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"buildah login {host} failed: {res.stderr.strip()}")
    extra = ["--insecure"] if plain_http else []
    run(
        [helm_bin(), "registry", "login", host, "--username", user, "--password-stdin", *extra],
        input_text=password,
    )


# ---------------------------------------------------------------- the image
def build_tree_image(source: Path, ref: str, python_image: str | None = None) -> str:
    """``buildah bud`` of ``source``'s Dockerfile as ``ref`` (PYTHON_IMAGE: the local mmdebstrap
    base unless ``python_image``; ``"dockerfile"``: the Dockerfile's own default)."""
    from localcluster import image as img

    if source.resolve() == REPO.resolve() and python_image is None:
        built = img.build()  # `make image`'s image of this tree, built or reused
        return in_storage(built.ref, built.archive)
    base = img.base_image() if python_image is None else python_image
    args = ["bud", "--isolation", "chroot", "--layers=false", "-q"]
    if base != "dockerfile":
        args += ["--build-arg", f"PYTHON_IMAGE={base}"]
    if img.HOST_CA_BUNDLE.exists():
        args += ["-v", f"{img.HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
    say(f"buildah bud {ref} from {source}/Dockerfile (PYTHON_IMAGE={base})")
    img.buildah(*args, "-t", ref, "-f", str(source / "Dockerfile"), str(source), timeout=3600)
    return ref


def in_storage(ref: str, archive: Path | None) -> str:
    """``ref``, loaded into buildah's storage from its OCI ``archive`` when it is not there (the
    storage is the machine's: another checkout's `make image` removes the dev images it did not
    build, and keeps the archives)."""
    from localcluster.image import buildah

    if buildah("inspect", "--type", "image", ref, check=False).returncode != 0:
        if archive is None or not Path(archive).is_file():
            raise RuntimeError(f"{ref} is not in buildah's storage and has no archive to load it from")
        say(f"loading {ref} from {archive}")
        buildah("pull", "-q", f"oci-archive:{archive}", timeout=1800)
    return ref


def labelled(local: str, version: str, revision: str | None) -> str:
    """``local`` with the OCI version (and revision) labels, committed as ``localhost/gpu-scheduler:<version>``."""
    from localcluster.image import REPOSITORY, buildah

    ref = f"{REPOSITORY}:{version}"
    ctr = buildah("from", "--pull=never", local).stdout.strip()
    try:
        labels = ["--label", f"org.opencontainers.image.version={version}"]
        if revision:
            labels += ["--label", f"org.opencontainers.image.revision={revision}"]
        buildah("config", *labels, ctr)
        buildah("commit", "-q", ctr, ref)
    finally:
        buildah("rm", ctr, check=False)
    return ref


def push_image(local: str, registry: str, tags: list[str], plain_http: bool) -> str:
    """Push ``local`` as ``REGISTRY/gpu-scheduler:<tag>`` for each tag; the digest the registry stored."""
    from localcluster.image import buildah

    digests = set()
    for tag in tags:
        dest = f"{image_repository(registry)}:{tag}"
        with tempfile.TemporaryDirectory() as tmp:
            digest_file = Path(tmp) / "digest"
            say(f"buildah push {local} docker://{dest}")
            buildah(
                "push", "-q", f"--tls-verify={'false' if plain_http else 'true'}",
                "--digestfile", str(digest_file), local, f"docker://{dest}",
                timeout=1800,
            )  # fmt: skip
            digests.add(digest_file.read_text().strip())
    if len(digests) != 1 or not DIGEST.match(next(iter(digests))):
        raise RuntimeError(f"the pushes gave digests {sorted(digests)}, not one sha256 digest")
    return digests.pop()


# ---------------------------------------------------------------- the charts
@dataclass(frozen=True)
class ChartRelease:
    name: str
    ref: str  # oci://REGISTRY/charts/<name>
    version: str
    digest: str
    package: str  # the .tgz pushed


def package_chart(chart_dir: Path, version: str, repository: str, digest: str, out: Path) -> Path:
    """A copy of ``chart_dir`` with the image pinned (values.yaml, Chart.yaml), ``helm package``d into ``out``."""
    with tempfile.TemporaryDirectory(prefix="gpu-scheduler-release-") as tmp:
        copy = Path(tmp) / chart_dir.name
        shutil.copytree(chart_dir, copy)
        values = copy / "values.yaml"
        values.write_text(pin_image(values.read_text(), repository, digest, version))
        chart_yaml = copy / "Chart.yaml"
        chart_yaml.write_text(annotate_images(chart_yaml.read_text(), f"{repository}:{version}@{digest}"))
        out.mkdir(parents=True, exist_ok=True)
        text = run(
            [
                helm_bin(),
                "package",
                str(copy),
                "--destination",
                str(out),
                "--version",
                version,
                "--app-version",
                version,
            ]
        )
    m = re.search(r"saved it to: (\S+\.tgz)", text)
    if not m:
        raise RuntimeError(f"helm package said: {text}")
    return Path(m.group(1))


def push_chart(package: Path, registry: str, plain_http: bool) -> tuple[str, str]:
    """``helm push`` ``package`` under ``oci://REGISTRY/charts``: (its reference, its digest)."""
    extra = ["--plain-http"] if plain_http else []
    text = run([helm_bin(), "push", str(package), chart_repository(registry), *extra])
    ref = re.search(r"^Pushed:\s*(\S+)", text, re.M)
    digest = re.search(r"^Digest:\s*(sha256:[a-f0-9]{64})", text, re.M)
    if not (ref and digest):
        raise RuntimeError(f"helm push said: {text}")
    return "oci://" + ref.group(1).rsplit(":", 1)[0], digest.group(1)


# ---------------------------------------------------------------- the release
@dataclass(frozen=True)
class Release:
    version: str
    registry: str
    image: str  # REGISTRY/gpu-scheduler
    digest: str  # the image index (one platform's manifest with --image)
    charts: dict[str, ChartRelease] = field(default_factory=dict)
    platforms: dict[str, str] = field(default_factory=dict)  # "linux/amd64" -> manifest digest
    sboms: dict[str, str] = field(default_factory=dict)  # platform -> SPDX file attested
    archives: dict[str, str] = field(default_factory=dict)  # platform -> OCI archive pushed
    public_key: str = ""  # verifies the signature and the attestations

    @property
    def image_ref(self) -> str:
        """The image by digest, as the charts install it."""
        return f"{self.image}@{self.digest}"

    def install_commands(self) -> list[str]:
        flag = " --plain-http" if is_loopback(self.registry) else ""
        return [
            f"helm install {name} {c.ref} --version {c.version}{flag} -n "
            + ("gpu-scheduler-system" if name == "gpu-scheduler" else "gpu-scheduler-tests")
            + " --create-namespace"
            for name, c in self.charts.items()
        ]


def publish(
    version: str,
    registry: str,
    *,
    source: Path = REPO,
    plain_http: bool | None = None,
    python_image: str | None = None,
    local_image: str | None = None,
    local_archive: Path | None = None,
    revision: str | None = None,
    out: Path = OUT,
) -> Release:
    """Release ``source`` as ``version`` under ``registry``: the image, then both charts pinned to it."""
    source = Path(source).resolve()
    problems = version_problems(source, version)
    if problems:
        raise SystemExit("release: the tree does not say one version:\n  " + "\n  ".join(problems))
    plain = is_loopback(registry) if plain_http is None else plain_http
    login(registry, plain)
    out_charts = Path(out) / version
    if local_image:
        release = Release(
            version,
            registry,
            image_repository(registry),
            push_local(local_image, local_archive, registry, version, revision, plain),
        )
    else:
        from localcluster.multiarch import push_release_image

        pushed = push_release_image(
            image_repository(registry), version, plain, out_charts / "image",
            source=source, python_image=python_image, revision=revision,
        )  # fmt: skip
        public_key = out_charts / "cosign.pub"  # to publish with the release: users verify with it
        shutil.copyfile(pushed.public_key, public_key)
        release = Release(
            version, registry, image_repository(registry), pushed.digest,
            platforms=pushed.platforms, sboms=pushed.sboms, archives=pushed.archives, public_key=str(public_key),
        )  # fmt: skip
    say(f"image {image_repository(registry)}:{version} is {release.digest}")
    for chart in CHARTS:
        package = package_chart(source / chart, version, release.image, release.digest, out_charts)
        chart_ref, chart_digest = push_chart(package, registry, plain)
        name = chart_ref.rsplit("/", 1)[1]
        release.charts[name] = ChartRelease(name, chart_ref, version, chart_digest, str(package))
        say(f"chart {chart_ref}:{version} is {chart_digest}")
    record = Path(out) / f"{version}.json"
    record.write_text(json.dumps(asdict(release), indent=2) + "\n")
    say(f"recorded in {record}")
    return release


def push_local(
    local_image: str, archive: Path | None, registry: str, version: str, revision: str | None, plain: bool
) -> str:
    """``--image``: one local image, labelled with the version, pushed as it is: its digest."""
    ref = labelled(in_storage(local_image, archive), version, revision)
    try:
        return push_image(ref, registry, [version], plain)
    finally:
        # The labelled copy was only for the push (its layers are the built image's).
        from localcluster.image import buildah

        buildah("rmi", ref, check=False)


def push_image_tags(
    registry: str, tags: list[str], plain_http: bool | None = None, python_image: str | None = None
) -> str:
    """Build this tree's image and push it under each of ``tags`` (CI's branch pipelines)."""
    plain = is_loopback(registry) if plain_http is None else plain_http
    login(registry, plain)
    local = build_tree_image(REPO, f"localhost/{IMAGE_NAME}:build", python_image)
    return push_image(local, registry, tags, plain)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.publish", description=__doc__.split("\n")[0])
    ap.add_argument("--registry", required=True, help="host[:port][/path]")
    ap.add_argument("--version", help="x.y.z: release the image and both charts")
    ap.add_argument("--tag", action="append", default=[], help="only push the image under this tag (repeat)")
    ap.add_argument("--plain-http", type=_bool, default=None, help="default: true for a loopback registry")
    ap.add_argument(
        "--base",
        default="local",
        help="PYTHON_IMAGE of the build: local (the mmdebstrap base, as `make image`), "
        "dockerfile (the Dockerfile's default, pulled), or an image reference",
    )
    ap.add_argument("--source", type=Path, default=REPO, help="the tree to release (default: this one)")
    ap.add_argument("--image", help="push this local image (buildah storage) instead of building one")
    ap.add_argument(
        "--revision", default=os.environ.get("CI_COMMIT_SHA"), help="org.opencontainers.image.revision"
    )
    args = ap.parse_args(argv)
    python_image = None if args.base == "local" else args.base
    if args.tag:
        digest = push_image_tags(args.registry, args.tag, args.plain_http, python_image)
        print(f"{image_repository(args.registry)}@{digest}")
        return 0
    if not args.version:
        ap.error("--version (or --tag) is required")
    release = publish(
        args.version,
        args.registry,
        source=args.source,
        plain_http=args.plain_http,
        python_image=python_image,
        local_image=args.image,
        revision=args.revision,
    )
    print(f"image {release.image_ref}")
    for platform, digest in release.platforms.items():
        print(f"  {platform} {digest}")
    if release.public_key:
        print(f"verify: cosign verify --key {release.public_key} --insecure-ignore-tlog {release.image_ref}")
    for c in release.charts.values():
        print(f"chart {c.ref}:{c.version}@{c.digest}")
    print("install:")
    for line in release.install_commands():
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
