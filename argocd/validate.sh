#!/usr/bin/env bash
# Validate the Argo CD manifests of this folder against a real apiserver:
#   1. fetch the Argo CD CRDs of the pinned release (ARGOCD_VERSION in
#      tools/versions.env) from its Go module into the tool cache (not committed),
#   2. install them (server-side apply) into the cluster of $KUBECONFIG,
#   3. `kubectl apply --dry-run=server --validate=strict` every manifest here: the
#      apiserver checks them against the CRDs' OpenAPI schemas, rejects unknown
#      fields and runs admission; nothing is persisted except the CRDs and the
#      argocd namespace.
#
# Usage: argocd/validate.sh              (needs KUBECONFIG, kubectl, go)
#        argocd/validate.sh --crd-dir    (only fetch; print the CRD folder)
# `make argocd-validate` runs it against a throw-away local control plane.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=../tools/versions.env
source "$repo/tools/versions.env"
: "${ARGOCD_VERSION:?ARGOCD_VERSION is not set in tools/versions.env}"

CACHE=${GPU_SCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-scheduler}
crd_dir="$CACHE/argocd-$ARGOCD_VERSION/crds"
KUBECTL=${KUBECTL:-kubectl}

log() { printf '[argocd-validate] %s\n' "$*" >&2; }

fetch_crds() {
  [ -f "$crd_dir/.done" ] && return
  command -v go >/dev/null || { log "go is needed to fetch the Argo CD module"; exit 1; }
  log "fetching Argo CD $ARGOCD_VERSION CRDs (go module github.com/argoproj/argo-cd/v3)"
  local tmp json dir
  tmp=$(mktemp -d)
  json=$(cd "$tmp" && GOFLAGS= go mod download -json "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION")
  rm -rf "$tmp"
  dir=$(printf '%s' "$json" | "${PYTHON:-python3}" -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))')
  rm -rf "$crd_dir"; mkdir -p "$crd_dir"
  for f in application-crd.yaml applicationset-crd.yaml appproject-crd.yaml; do
    cp "$dir/manifests/crds/$f" "$crd_dir/"
  done
  chmod -R u+w "$crd_dir"
  touch "$crd_dir/.done"
}

fetch_crds
if [ "${1:-}" = "--crd-dir" ]; then echo "$crd_dir"; exit 0; fi
: "${KUBECONFIG:?set KUBECONFIG to the cluster to validate against}"

log "installing the Argo CD $ARGOCD_VERSION CRDs"
# Server-side: the ApplicationSet CRD is too large for the last-applied annotation.
"$KUBECTL" apply --server-side --force-conflicts -f "$crd_dir" >&2
# (kubectl wait fails outright while a new CRD has no status yet: poll instead.)
for crd in applications.argoproj.io applicationsets.argoproj.io appprojects.argoproj.io; do
  for _ in $(seq 120); do
    established=$("$KUBECTL" get crd "$crd" \
      -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)
    [ "$established" = True ] && break
    sleep 0.5
  done
  [ "$established" = True ] || { log "CRD $crd is not Established"; exit 1; }
done
"$KUBECTL" get namespace argocd >/dev/null 2>&1 || "$KUBECTL" create namespace argocd >&2

status=0
for f in "$here"/*.yaml; do
  if out=$("$KUBECTL" apply --dry-run=server --validate=strict -f "$f" 2>&1); then
    log "ok   $(basename "$f"): $out"
  else
    log "FAIL $(basename "$f"): $out"
    status=1
  fi
done

# The repository URL lives in two places that must agree: the cluster Secret's
# annotation (read by the ApplicationSets) and the AppProject's sourceRepos.
"${PYTHON:-python3}" - "$here" <<'PY' || status=1
import sys, pathlib, yaml
here = pathlib.Path(sys.argv[1])
secret = yaml.safe_load((here / "local-cluster-secret.yaml").read_text())
project = yaml.safe_load((here / "gpu-scheduler-project.yaml").read_text())
url = secret["metadata"]["annotations"]["gpu-scheduler.io/repo-url"]
if url not in project["spec"]["sourceRepos"]:
    sys.exit(f"[argocd-validate] FAIL repo URL {url} of local-cluster-secret.yaml is not in the AppProject's sourceRepos")
print(f"[argocd-validate] ok   repo URL {url} is allowed by the AppProject", file=sys.stderr)
charts = secret["metadata"]["annotations"]["gpu-scheduler.io/chart-registry"]
if f"{charts}/*" not in project["spec"]["sourceRepos"]:
    sys.exit(f"[argocd-validate] FAIL chart registry {charts} of local-cluster-secret.yaml is not allowed ({charts}/*) by the AppProject's sourceRepos")
print(f"[argocd-validate] ok   chart registry {charts}/* is allowed by the AppProject", file=sys.stderr)
PY
exit $status
