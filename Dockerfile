# syntax=docker/dockerfile:1
# One image for the three programs: gpu-scheduler (default), gpu-scheduler-webhook
# and gpu-scheduler-check (the charts pick one with `command`).
# Build: docker build -t gpu-scheduler .   (CI: kaniko, see .gitlab-ci.yml)
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- stage 1: build the wheel, install it with the nvml extra into a venv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_scheduling/ gpu_scheduling/
COPY scheduler/ scheduler/
COPY webhook/ webhook/
# pip compiles the .pyc files here, so nothing is written at run time.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir "$(find /wheels -name 'gpu_scheduler-*.whl')[nvml]"

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
