# syntax=docker/dockerfile:1
# One image for the three programs: gpu-scheduler (default), gpu-scheduler-webhook
# and gpu-scheduler-check (the charts pick one with `command`).
# Build: docker build -t gpu-scheduler .   (CI and make image: buildah, see .gitlab-ci.yml)
# The base needs only `python` (3.11) with its venv module: python:3.11-slim, or a Debian
# bookworm root with python3, python3-venv and python-is-python3 (--build-arg PYTHON_IMAGE=...).
# Pinned by digest (the tag's multi-architecture index): a rebuilt tag changes nothing here.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
# Multi-architecture (docker buildx build --platform linux/amd64,linux/arm64 .): the build stage
# runs on the build machine's platform and, for another target, installs the target's wheels
# (pip --platform, hash-checked like the native ones); the runtime stage runs nothing, so no
# emulation is needed. BUILD_PYTHON_IMAGE: the build stage's base where the target's base is a
# single-platform image (make release: the local arm64 base; docs/operate.md "Releases").
ARG BUILD_PYTHON_IMAGE=${PYTHON_IMAGE}

# ---- stage 1: build the wheel; install the locked dependencies, then the wheel, into a venv
FROM --platform=$BUILDPLATFORM ${BUILD_PYTHON_IMAGE} AS build
ARG TARGETARCH
ARG BUILDARCH
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Every pip here is the venv's own: nothing is installed into the base's Python.
RUN python -m venv /opt/venv
# The runtime dependencies, nvml extra included: exact versions and their sha256 hashes,
# generated from pyproject.toml by `make lock` (requirements/runtime.txt says so). Wheels only.
# Cross (TARGETARCH is not BUILDARCH): the target's manylinux wheels for this Python and glibc,
# into the venv's site-packages (pip --target; their scripts, unused, are dropped).
COPY requirements/runtime.txt requirements/runtime.txt
# hadolint ignore=SC2086
RUN set -eu; cross=""; \
    if [ -n "${TARGETARCH:-}" ] && [ "${TARGETARCH}" != "${BUILDARCH:-$TARGETARCH}" ]; then \
      case "$TARGETARCH" in arm64) m=aarch64 ;; amd64) m=x86_64 ;; *) m=$TARGETARCH ;; esac; \
      glibc=$(/opt/venv/bin/python -c 'import platform; print(platform.libc_ver()[1].split(".")[1])'); \
      py=$(/opt/venv/bin/python -c 'import sys; print("%d%d" % sys.version_info[:2])'); \
      site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
      cross="--target $site --implementation cp --python-version $py --abi cp$py --platform manylinux2014_$m"; \
      for v in $(seq 17 "$glibc"); do cross="$cross --platform manylinux_2_${v}_$m"; done; \
    fi; \
    /opt/venv/bin/pip install --no-cache-dir --no-compile --require-hashes --no-deps --only-binary=:all: $cross \
      -r requirements/runtime.txt; \
    if [ -n "$cross" ]; then rm -rf "${site:?}/bin"; fi
COPY pyproject.toml README.md ./
COPY LICENSE ./
COPY kube_gpu_scheduler/ kube_gpu_scheduler/
# An isolated PEP 517 build (pip fetches the build backend). Then the wheel itself, with no
# index: pip installs nothing more, and finds every requirement of gpu-scheduler[nvml]
# (extras of extras too, such as gunicorn[gevent]) already installed from the lock, or
# the build fails here. Then every .pyc, once (pip writes none: --no-compile), hash-based and
# unchecked (PEP 552): pip's would be checked against their source's mtime, which the image
# layers keep only in whole seconds, so about half of them no longer matched, and each process
# recompiled those modules in memory at every start (the root is read-only): about 80 MB more
# per Python process for kubernetes' API modules, webhook workers OOM-killed under the
# chart's 256Mi limit.
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index \
      "$(find /wheels -name 'kube_gpu_scheduler-*.whl')[nvml]" \
    && /opt/venv/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/venv/lib

# ---- stage 2: runtime, non-root, read-only root filesystem friendly
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-scheduler" \
      org.opencontainers.image.description="Kubernetes scheduler + admission webhook pinning StatefulSet replica N to a node and GPU indices" \
      org.opencontainers.image.source="https://gitlab.com/evgenii19/gpu-scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
COPY --from=build /opt/venv /opt/venv
# 65532: the conventional "nonroot" uid/gid; the charts run with runAsUser 65532.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8443
CMD ["gpu-scheduler"]
