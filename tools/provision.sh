#!/usr/bin/env bash
# Build the local control plane's upstream tools from their Go modules into a
# cache outside the checkout, keyed by version:
#   $CACHE/<tool>-<version>/bin/<binary>
# A folder is complete only when its .done stamp exists, so an interrupted
# build is redone, and a fresh clone reuses what an earlier clone built.
#
# Usage: tools/provision.sh [k8s|etcd|kwok|helm|ct|argocd|cert-manager|kube-score|monitoring|promtool|prometheus|dashboard-check|node|nvidia|nvidia-ctk|registry|cosign|release|host|unit|all]...
#   (default: all)
#   node: the real kubelet node (Debian packages, kubelet, kube-proxy, containerd, pause image)
#   nvidia: NVIDIA's DRA kubelet plugin and container toolkit (cgo; docs/nvidia-stack.md)
#   nvidia-ctk: the container toolkit alone
#   registry: the CNCF distribution registry (releases pushed and pulled in the tests)
#   monitoring: promtool, prometheus (the server, for tests/node/test_monitoring_live.py) and dashboard-check
#   cosign: sigstore's cosign (make release signs and attests the image, then verifies both)
#   release: what `make release` and its test need beyond the node: registry and cosign
#   host: only the Debian packages (buildah, mmdebstrap, skopeo, qemu-user-static, ...)
#   unit: what the unit tests run (make test-unit): helm, ct, kube-score, the container toolkit,
#     promtool and dashboard-check (monitoring without the server)
# Prints nothing but progress on stderr; `tools/provision.sh --print-bin-dirs`
# prints the bin folders, one per line, for PATH.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

CACHE=${GPU_SCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-scheduler}
export GOFLAGS="-trimpath -mod=mod"
export CGO_ENABLED=0
# Two cores and a shared machine: one compile at a time per package is fine,
# but let the linker and compiler use both cores.
export GOMAXPROCS=${GOMAXPROCS:-2}

log() { printf '[provision] %s\n' "$*" >&2; }

k8s_dir="$CACHE/kubernetes-$KUBERNETES_VERSION"
etcd_dir="$CACHE/etcd-$ETCD_VERSION-k8s-$KUBERNETES_VERSION"
kwok_dir="$CACHE/kwok-$KWOK_VERSION"
helm_dir="$CACHE/helm-$HELM_VERSION-r2"
ct_dir="$CACHE/ct-$CT_VERSION"
argocd_dir="$CACHE/argocd-$ARGOCD_VERSION-ge-${ARGOCD_GITOPS_ENGINE_VERSION##*-}"
cm_dir="$CACHE/cert-manager-$CERT_MANAGER_VERSION"
node_dir="$CACHE/kubernetes-node-$KUBERNETES_VERSION"
containerd_dir="$CACHE/containerd-$CONTAINERD_VERSION"
pause_dir="$CACHE/pause-$PAUSE_VERSION"
coredns_dir="$CACHE/coredns-$COREDNS_VERSION"
kube_score_dir="$CACHE/kube-score-$KUBE_SCORE_VERSION"
promtool_dir="$CACHE/promtool-$PROMETHEUS_VERSION"
prometheus_dir="$CACHE/prometheus-$PROMETHEUS_VERSION"
# Ours (tools/dashboard-check/main.go), keyed by its source and the SDK it decodes with.
dashcheck_dir="$CACHE/dashboard-check-$(sha256sum "$here/dashboard-check/main.go" | cut -c1-12)-$GRAFANA_FOUNDATION_SDK_VERSION"
nvidia_dra_dir="$CACHE/dra-driver-nvidia-gpu-$DRA_DRIVER_NVIDIA_GPU_VERSION"
nvidia_ctk_dir="$CACHE/nvidia-container-toolkit-$NVIDIA_CONTAINER_TOOLKIT_VERSION"
# Ours (tools/dra-prepare/main.go), keyed by its source and the plugin it talks to.
# The OCI registry the release tests push to (tools/registry/main.go over the pinned module).
registry_dir="$CACHE/registry-$REGISTRY_VERSION-$(sha256sum "$here/registry/main.go" | cut -c1-8)"
cosign_dir="$CACHE/cosign-$COSIGN_VERSION"
dra_prepare_dir="$CACHE/dra-prepare-$(sha256sum "$here/dra-prepare/main.go" | cut -c1-12)-$DRA_DRIVER_NVIDIA_GPU_VERSION"

print_bin_dirs() {
  printf '%s\n' "$k8s_dir/bin" "$etcd_dir/bin" "$kwok_dir/bin" "$helm_dir/bin" "$ct_dir/bin" \
    "$argocd_dir/bin" "$cm_dir/bin" "$kube_score_dir/bin" "$promtool_dir/bin" "$prometheus_dir/bin" "$dashcheck_dir/bin" "$node_dir/bin" "$containerd_dir/bin" \
    "$coredns_dir/bin" "$nvidia_dra_dir/bin" "$nvidia_ctk_dir/bin" "$dra_prepare_dir/bin" \
    "$registry_dir/bin" "$cosign_dir/bin"
}

# One build per folder at a time: a second provision.sh (another make test, a CI
# job beside this one) waits on the folder's lock instead of building it twice.
with_lock() { # dir command...
  local dir=$1; shift
  mkdir -p "$(dirname "$dir")"
  exec {lockfd}>"$dir.lock"
  flock "$lockfd"
  "$@"
  exec {lockfd}>&-
}

mod_dir() { # module@version -> its extracted folder in the module cache
  (cd "$(mktemp -d)" && GOFLAGS= go mod download -json "$1" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["Dir"]) if "Dir" in d else sys.exit(d.get("Error"))')
}

check_go() {
  command -v go >/dev/null || { log "go is not installed; install Go >= $GO_MIN_VERSION"; exit 1; }
  local have
  have=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$GO_MIN_VERSION" "$have" | sort -V | head -n1)" != "$GO_MIN_VERSION" ]; then
    log "Go $have is older than $GO_MIN_VERSION, which Kubernetes $KUBERNETES_VERSION needs"; exit 1
  fi
}

# Wrapper module that builds k8s.io/kubernetes commands: the kubernetes module
# replaces its ~33 staging modules with ./staging paths, which `go install`
# refuses; we replace each with its published v0.N.P instead.
k8s_wrapper() {
  local src="$CACHE/src/kubernetes-$KUBERNETES_VERSION"
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  if [ -f "$src/.ready" ]; then echo "$src"; return; fi
  rm -rf "$src"; mkdir -p "$src/etcd"
  local modfile
  modfile=$(mktemp)
  curl_mod "k8s.io/kubernetes" "$KUBERNETES_VERSION" >"$modfile"
  {
    echo "module gpu-scheduler.local/k8s-build"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' "$modfile")"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    awk '/=> \.\/staging\/src\//{print $1}' "$modfile" | while read -r m; do
      echo "	$m => $m $staging_version"
    done
    echo ")"
  } >"$src/go.mod"
  rm -f "$modfile"
  # etcd: built from the same module graph, through its own entry point.
  cat >"$src/etcd/main.go" <<'GO'
// Command etcd is go.etcd.io/etcd/server/v3's etcdmain, built from the
// module graph that k8s.io/kubernetes pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "staging modules replaced: $(grep -c '=> k8s.io/' "$src/go.mod") at $staging_version"
  touch "$src/.ready"
  echo "$src"
}

curl_mod() { # module version -> go.mod text, via the module proxy (go mod download)
  local tmp json
  tmp=$(mktemp -d)
  json=$(cd "$tmp" && GOFLAGS= go mod download -json "$1@$2")
  rm -rf "$tmp"
  cat "$(printf '%s' "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
}

# The -X flags that stamp KUBERNETES_VERSION into a Kubernetes binary (so /version and
# --version report the release), for every command built from the wrapper module.
k8s_version_ldflags() {
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local x="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    x+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date -X $pkg.gitCommit=0000000000000000000000000000000000000000"
  done
  printf '%s' "$x"
}

build_k8s() {
  [ -f "$k8s_dir/.done" ] && return
  check_go
  local src; src=$(k8s_wrapper)
  local x; x=$(k8s_version_ldflags)
  mkdir -p "$k8s_dir/bin"
  log "building kube-apiserver kube-controller-manager kube-scheduler kubectl $KUBERNETES_VERSION (cold: tens of minutes)"
  (cd "$src" && go build -ldflags "-s -w$x" -o "$k8s_dir/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl)
  "$k8s_dir/bin/kube-apiserver" --version | grep -qx "Kubernetes $KUBERNETES_VERSION" \
    || { log "kube-apiserver does not report $KUBERNETES_VERSION"; exit 1; }
  touch "$k8s_dir/.done"
}

build_etcd() {
  [ -f "$etcd_dir/.done" ] && return
  check_go
  local src; src=$(k8s_wrapper)
  mkdir -p "$etcd_dir/bin"
  log "building etcd from the Kubernetes $KUBERNETES_VERSION module graph"
  (cd "$src" && go build -ldflags "-s -w" -o "$etcd_dir/bin/etcd" ./etcd)
  "$etcd_dir/bin/etcd" --version >&2
  touch "$etcd_dir/.done"
}

go_install() { # dir module@version ldflags
  mkdir -p "$1/bin"
  GOBIN="$1/bin" go install -ldflags "-s -w ${3:-}" "$2"
}

build_kwok() {
  [ -f "$kwok_dir/.done" ] && [ -d "$kwok_dir/stages" ] && return
  check_go
  log "building kwok $KWOK_VERSION"
  go_install "$kwok_dir" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  # kwok's own stage definitions (what makes nodes Ready and pods Running), taken
  # from the same pinned module: node-initialize, node heartbeat with lease, pod fast.
  local mod
  mod=$(cd "$(mktemp -d)" && GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$kwok_dir/stages"; mkdir -p "$kwok_dir/stages"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cp "$mod/kustomize/stage/$f" "$kwok_dir/stages/"
  done
  chmod -R u+w "$kwok_dir/stages"
  touch "$kwok_dir/.done"
}

build_helm() {
  [ -f "$helm_dir/.done" ] && return
  check_go
  log "building helm $HELM_VERSION"
  # helm's default Kubernetes version (for `helm template`/`lint` without a cluster) is
  # stamped by its release build from the client-go it links; do the same, or it says 1.20.
  local minor x=""
  minor=$(curl_mod helm.sh/helm/v3 "$HELM_VERSION" | awk '$1=="k8s.io/client-go"{print $2}' | cut -d. -f2)
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    x+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  go_install "$helm_dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean$x"
  "$helm_dir/bin/helm" version --short >&2
  touch "$helm_dir/.done"
}

# Like go_install, through a throw-away wrapper module that requires the exact
# version: `go install m@v` also asks the proxy for m's version list (deprecation
# notices), which some proxies refuse.
go_build_pinned() { # dir module version package ldflags
  local src="$CACHE/src/$(basename "$1")"
  rm -rf "$src"; mkdir -p "$src" "$1/bin"
  printf 'module gpu-scheduler.local/build\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$2" "$3" >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w ${5:-}" -o "$1/bin/" "$4")
}

build_ct() {
  [ -f "$ct_dir/.done" ] && return
  check_go
  log "building ct $CT_VERSION"
  go_build_pinned "$ct_dir" github.com/helm/chart-testing/v3 "$CT_VERSION" \
    github.com/helm/chart-testing/v3/ct "-X github.com/helm/chart-testing/v3/ct/cmd.Version=$CT_VERSION"
  "$ct_dir/bin/ct" version >&2
  touch "$ct_dir/.done"
}

# Argo CD: one multi-call binary (ARGOCD_BINARY_NAME picks the component), built
# through a wrapper module. Replace directives of a dependency are ignored, so the
# wrapper repeats argo-cd's own (k8s.io/* pins) except `gitops-engine => ./gitops-engine`,
# a folder the module zip lacks: that one points at the published commit pinned in
# versions.env (why: see there). Next to the binary: helm (the repo-server renders
# charts), the module's hack/git-verify-wrapper.sh (the repo-server calls it) and
# manifests/base/config (argocd-cm, argocd-secret, ...) and the CRDs.
build_miniredis() { # wrapper-src: Argo CD's cache, from the same module graph
  cp -r "$here/argocd/miniredis" "$1/"
  (cd "$1" && go build -ldflags "-s -w" -o "$argocd_dir/bin/miniredis" ./miniredis)
}

build_argocd() {
  [ -f "$argocd_dir/.done" ] && return
  check_go
  local src="$CACHE/src/$(basename "$argocd_dir")" mod
  mod=$(mod_dir "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION")
  rm -rf "$src" "$argocd_dir"; mkdir -p "$src" "$argocd_dir/bin"
  {
    echo "module gpu-scheduler.local/argocd-build"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' "$mod/go.mod")"
    echo
    echo "require ("
    echo "	github.com/argoproj/argo-cd/v3 $ARGOCD_VERSION"
    echo "	github.com/argoproj/argo-cd/gitops-engine $ARGOCD_GITOPS_ENGINE_VERSION"
    echo ")"
    echo
    echo "replace ("
    awk '/^replace \($/{r=1; next} r&&/^\)/{r=0} r&&/=>/{print "\t" $1 " => " $3 " " $4}' "$mod/go.mod"
    echo "	github.com/argoproj/argo-cd/gitops-engine => github.com/argoproj/argo-cd/gitops-engine $ARGOCD_GITOPS_ENGINE_VERSION"
    echo ")"
  } >"$src/go.mod"
  log "building Argo CD $ARGOCD_VERSION (gitops-engine $ARGOCD_GITOPS_ENGINE_VERSION; cold: ~20 min on 2 cores)"
  local p=github.com/argoproj/argo-cd/v3/common
  (cd "$src" && go build -ldflags "-s -w -X $p.version=${ARGOCD_VERSION#v} -X $p.gitTag=$ARGOCD_VERSION \
      -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
      -o "$argocd_dir/bin/argocd" github.com/argoproj/argo-cd/v3/cmd)
  build_miniredis "$src"
  install -m 0755 "$mod/hack/git-verify-wrapper.sh" "$argocd_dir/bin/git-verify-wrapper.sh"
  mkdir -p "$argocd_dir/config" "$argocd_dir/crds"
  install -m 0644 "$mod"/manifests/base/config/*.yaml "$argocd_dir/config/"
  install -m 0644 "$mod"/manifests/crds/*-crd.yaml "$argocd_dir/crds/"
  "$argocd_dir/bin/argocd" version --client --short >&2
  touch "$argocd_dir/.done"
}

# cert-manager: upstream's entry points (cmd/controller, cmd/cainjector, cmd/webhook)
# are nested modules that the module proxy does not serve, so the wrapper module holds
# small entry points of our own (tools/cert-manager/*/main.go) over the main module's
# packages. Its path lies under github.com/cert-manager/cert-manager, like upstream's
# nested modules, so it may import the module's internal/ packages. The main module's
# own replace directives are repeated (a dependency's are ignored). Next to the
# binaries: the module's Helm chart (the CRDs and the webhook configurations come
# from it, rendered by localcluster).
build_cert_manager() {
  [ -f "$cm_dir/.done" ] && return
  check_go
  local src="$CACHE/src/$(basename "$cm_dir")" mod
  mod=$(mod_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
  rm -rf "$src" "$cm_dir"; mkdir -p "$src" "$cm_dir/bin"
  cp -r "$here/cert-manager/controller" "$here/cert-manager/cainjector" "$here/cert-manager/webhook" "$src/"
  {
    echo "module github.com/cert-manager/cert-manager/gpu-scheduler-local-build"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' "$mod/go.mod")"
    echo
    echo "require github.com/cert-manager/cert-manager $CERT_MANAGER_VERSION"
    awk '/^replace \($/{r=1; next} r&&/^\)/{r=0} r&&/=>/{print "replace " $1 " => " $3 " " $4} /^replace [^(]/{print}' "$mod/go.mod"
  } >"$src/go.mod"
  log "building cert-manager $CERT_MANAGER_VERSION (controller, cainjector, webhook)"
  local x="-X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION"
  (cd "$src" && for c in controller cainjector webhook; do
     go build -ldflags "-s -w $x" -o "$cm_dir/bin/cert-manager-$c" "./$c" || exit 1
   done)
  mkdir -p "$cm_dir/chart"
  cp -r "$mod/deploy/charts/cert-manager/." "$cm_dir/chart/"
  chmod -R u+w "$cm_dir/chart"
  touch "$cm_dir/.done"
}

# ---------------------------------------------------------------- the real node
# Debian packages the real kubelet node and `make image` need: runc and the CNI
# plugins run pods, nftables is kube-proxy's backend, conntrack its cleanup,
# buildah and mmdebstrap build images without Docker; skopeo pushes the release's
# multi-architecture image as built, qemu-user-static runs its arm64 Python once in a test (and
# byte-compiles the arm64 base's standard library). Installed only when missing.
HOST_PACKAGES=(runc containernetworking-plugins nftables conntrack iptables buildah mmdebstrap uidmap skopeo qemu-user-static)

ensure_host_packages() {
  local missing=() p
  for p in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "the real node needs these Debian packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})"
    exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# kubelet and kube-proxy, from the same wrapper module as kube-apiserver.
build_node_bins() {
  [ -f "$node_dir/.done" ] && return
  check_go
  local src; src=$(k8s_wrapper)
  local x; x=$(k8s_version_ldflags)
  mkdir -p "$node_dir/bin"
  log "building kubelet kube-proxy $KUBERNETES_VERSION (cold: ~6 min after kube-apiserver)"
  (cd "$src" && go build -ldflags "-s -w$x" -o "$node_dir/bin/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  "$node_dir/bin/kubelet" --version | grep -qx "Kubernetes $KUBERNETES_VERSION" \
    || { log "kubelet does not report $KUBERNETES_VERSION"; exit 1; }
  touch "$node_dir/.done"
}

# containerd 2.x (Debian bookworm's 1.6 is too old for the 1.37 kubelet), static.
build_containerd() {
  [ -f "$containerd_dir/.done" ] && return
  check_go
  log "building containerd $CONTAINERD_VERSION (containerd, containerd-shim-runc-v2, ctr)"
  local src="$CACHE/src/$(basename "$containerd_dir")" m=github.com/containerd/containerd/v2
  rm -rf "$src"; mkdir -p "$src" "$containerd_dir/bin"
  printf 'module gpu-scheduler.local/build\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$m" "$CONTAINERD_VERSION" >"$src/go.mod"
  (cd "$src" && go build -tags no_btrfs,no_devmapper,no_zfs \
      -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Package=$m" \
      -o "$containerd_dir/bin/" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr")
  "$containerd_dir/bin/containerd" --version >&2
  touch "$containerd_dir/.done"
}

# The sandbox ("pause") image: tools/pause/main.go, static, wrapped as an OCI archive
# that localcluster imports into the node's containerd and pins there.
build_pause() {
  [ -f "$pause_dir/.done" ] && return
  check_go
  command -v buildah >/dev/null || { log "buildah is missing (tools/provision.sh node installs it)"; exit 1; }
  log "building the pause image $PAUSE_VERSION"
  local src="$CACHE/src/$(basename "$pause_dir")"
  rm -rf "$src" "$pause_dir"; mkdir -p "$src" "$pause_dir/bin"
  cp "$here/pause/main.go" "$src/"
  printf 'module gpu-scheduler.local/pause\n\ngo 1.22\n' >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w" -o "$pause_dir/bin/pause" .)
  local ctr
  ctr=$(buildah --storage-driver vfs from scratch)
  buildah --storage-driver vfs copy --chmod 0755 "$ctr" "$pause_dir/bin/pause" /pause >/dev/null
  buildah --storage-driver vfs config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah --storage-driver vfs commit --rm -q "$ctr" "localhost/gpu-scheduler/pause:$PAUSE_VERSION" >/dev/null
  buildah --storage-driver vfs push -q "localhost/gpu-scheduler/pause:$PAUSE_VERSION" \
    "oci-archive:$pause_dir/pause.oci.tar:localhost/gpu-scheduler/pause:$PAUSE_VERSION"
  buildah --storage-driver vfs rmi "localhost/gpu-scheduler/pause:$PAUSE_VERSION" >/dev/null
  touch "$pause_dir/.done"
}

# The cluster DNS of the real node's pods: CoreDNS with the few plugins it uses
# (tools/coredns/main.go), through a wrapper module that requires the pinned release.
build_coredns() {
  [ -f "$coredns_dir/.done" ] && return
  check_go
  log "building CoreDNS $COREDNS_VERSION (bind, errors, health, kubernetes, cache)"
  local src="$CACHE/src/$(basename "$coredns_dir")"
  rm -rf "$src"; mkdir -p "$src" "$coredns_dir/bin"
  cp "$here/coredns/main.go" "$src/"
  printf 'module gpu-scheduler.local/coredns\n\ngo %s\n\nrequire github.com/coredns/coredns %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$COREDNS_VERSION" >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$coredns_dir/bin/coredns" .)
  "$coredns_dir/bin/coredns" -version >&2
  touch "$coredns_dir/.done"
}

build_node() {
  ensure_host_packages
  build_node_bins
  build_containerd
  build_pause
  build_coredns
}

# kube-score: a static checker of the rendered charts (tests/unit/chart/test_chart_kubescore.py,
# docs/charts.md "kube-score"). One small binary, through go_build_pinned like ct.
build_kube_score() {
  [ -f "$kube_score_dir/.done" ] && return
  check_go
  log "building kube-score $KUBE_SCORE_VERSION"
  go_build_pinned "$kube_score_dir" github.com/zegl/kube-score "$KUBE_SCORE_VERSION" \
    github.com/zegl/kube-score/cmd/kube-score "-X main.version=$KUBE_SCORE_VERSION -X main.commit=N/A"
  "$kube_score_dir/bin/kube-score" version >&2
  touch "$kube_score_dir/.done"
}

# ------------------------------------------------------------ the NVIDIA stack
# NVIDIA's DRA kubelet plugin and container toolkit, from their Go modules. Both need cgo
# (github.com/NVIDIA/go-nvml binds libnvidia-ml.so.1 at run time through dlopen, so only a
# C compiler is needed, no NVML), and so they link glibc dynamically: they run on this host
# and on the real node, not in a scratch image. What runs them over a GPU-less stand-in:
# localcluster/nvidia.py, docs/nvidia-stack.md. go-nvml's header marks many calls deprecated:
# cgo's warnings about them are silenced, they say nothing about the build.
NVIDIA_CGO_CFLAGS="-O2 -g0 -Wno-deprecated-declarations"
build_nvidia_dra() {
  [ -f "$nvidia_dra_dir/.done" ] && return
  check_go
  command -v "${CC:-cc}" >/dev/null || { log "the NVIDIA DRA plugin needs cgo: install a C compiler (gcc)"; exit 1; }
  local m=sigs.k8s.io/dra-driver-nvidia-gpu mod
  mod=$(mod_dir "$m@$DRA_DRIVER_NVIDIA_GPU_VERSION")
  rm -rf "$nvidia_dra_dir"
  log "building NVIDIA's gpu-kubelet-plugin $DRA_DRIVER_NVIDIA_GPU_VERSION (cgo)"
  local t0; t0=$(date +%s)
  CGO_ENABLED=1 CGO_CFLAGS="$NVIDIA_CGO_CFLAGS" go_build_pinned "$nvidia_dra_dir" "$m" "$DRA_DRIVER_NVIDIA_GPU_VERSION" \
    "$m/cmd/gpu-kubelet-plugin" "-X $m/internal/info.version=$DRA_DRIVER_NVIDIA_GPU_VERSION"
  mkdir -p "$nvidia_dra_dir/chart"
  cp -r "$mod/deployments/helm/dra-driver-nvidia-gpu/." "$nvidia_dra_dir/chart/"
  chmod -R u+w "$nvidia_dra_dir/chart"
  "$nvidia_dra_dir/bin/gpu-kubelet-plugin" --version >&2
  log "gpu-kubelet-plugin built in $(( $(date +%s) - t0 ))s"
  touch "$nvidia_dra_dir/.done"
}

# promtool: Prometheus' rule checker and rule unit tester, for the chart's PrometheusRule and the
# dashboard's queries (tests/unit/chart/test_chart_monitoring.py, docs/charts.md "Monitoring").
build_promtool() {
  [ -f "$promtool_dir/.done" ] && return
  check_go
  local v=github.com/prometheus/common/version
  log "building promtool (Prometheus module $PROMETHEUS_VERSION; cold: several minutes)"
  # remove_all_sd: Prometheus' own build tag that leaves out the cloud service discoveries
  # (AWS, Azure, GCE, ... SDKs: most of its module graph); promtool's rule checks and tests
  # need none of them.
  GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=remove_all_sd" \
    go_build_pinned "$promtool_dir" github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
    github.com/prometheus/prometheus/cmd/promtool "-X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=module"
  "$promtool_dir/bin/promtool" --version >&2
  touch "$promtool_dir/.done"
}

# prometheus: the server itself, from the same module and version as promtool, so a test scrapes
# the chart's real pods and evaluates its real rules (tests/node/test_monitoring_live.py,
# docs/operate.md "Prometheus against a release"). remove_all_sd as above, but with the one
# discovery users point at a cluster: enable_kubernetes_sd (Prometheus' own tag). No
# builtinassets tag: the web UI's assets are not built (the HTTP API needs none).
build_prometheus() {
  [ -f "$prometheus_dir/.done" ] && return
  check_go
  local v=github.com/prometheus/common/version
  log "building prometheus (Prometheus module $PROMETHEUS_VERSION, kubernetes_sd only; cold: several minutes)"
  GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=remove_all_sd,enable_kubernetes_sd" \
    go_build_pinned "$prometheus_dir" github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
    github.com/prometheus/prometheus/cmd/prometheus "-X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=module"
  "$prometheus_dir/bin/prometheus" --version >&2
  touch "$prometheus_dir/.done"
}

# dashboard-check (tools/dashboard-check/main.go): Grafana's dashboard schema, as the foundation
# SDK's generated types, decodes a dashboard JSON strictly and validates it.
build_dashcheck() {
  [ -f "$dashcheck_dir/.done" ] && return
  check_go
  local m=github.com/grafana/grafana-foundation-sdk/go src="$CACHE/src/$(basename "$dashcheck_dir")"
  log "building dashboard-check (tools/dashboard-check) against $m $GRAFANA_FOUNDATION_SDK_VERSION"
  rm -rf "$src" "$dashcheck_dir"; mkdir -p "$src" "$dashcheck_dir/bin"
  cp "$here/dashboard-check/main.go" "$src/"
  printf 'module gpu-scheduler.local/dashboard-check\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$m" "$GRAFANA_FOUNDATION_SDK_VERSION" >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w" -o "$dashcheck_dir/bin/dashboard-check" .)
  touch "$dashcheck_dir/.done"
}

build_monitoring() {
  with_lock "$promtool_dir" build_promtool
  with_lock "$prometheus_dir" build_prometheus
  with_lock "$dashcheck_dir" build_dashcheck
}

build_nvidia_ctk() {
  [ -f "$nvidia_ctk_dir/.done" ] && return
  check_go
  command -v "${CC:-cc}" >/dev/null || { log "NVIDIA's container toolkit needs cgo: install a C compiler (gcc)"; exit 1; }
  local m=github.com/NVIDIA/nvidia-container-toolkit
  rm -rf "$nvidia_ctk_dir"
  log "building NVIDIA's container toolkit $NVIDIA_CONTAINER_TOOLKIT_VERSION (nvidia-container-runtime, nvidia-ctk, nvidia-cdi-hook; cgo)"
  local t0; t0=$(date +%s)
  local src="$CACHE/src/$(basename "$nvidia_ctk_dir")"
  rm -rf "$src"; mkdir -p "$src" "$nvidia_ctk_dir/bin"
  printf 'module gpu-scheduler.local/build\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$m" "$NVIDIA_CONTAINER_TOOLKIT_VERSION" >"$src/go.mod"
  (cd "$src" && CGO_ENABLED=1 CGO_CFLAGS="$NVIDIA_CGO_CFLAGS" go build -ldflags "-s -w -X $m/internal/info.version=${NVIDIA_CONTAINER_TOOLKIT_VERSION#v}" \
      -o "$nvidia_ctk_dir/bin/" "$m/cmd/nvidia-container-runtime" "$m/cmd/nvidia-ctk" "$m/cmd/nvidia-cdi-hook")
  "$nvidia_ctk_dir/bin/nvidia-ctk" --version >&2
  log "NVIDIA container toolkit built in $(( $(date +%s) - t0 ))s"
  touch "$nvidia_ctk_dir/.done"
}

# dra-prepare (tools/dra-prepare/main.go): the kubelet's side of the DRA gRPC call, so a test
# drives the plugin's prepare (and its CDI spec) without a kubelet. Built from the plugin's own
# module graph (k8s.io/kubelet's DRA API, grpc at the plugin's versions): small, no cgo.
build_dra_prepare() {
  [ -f "$dra_prepare_dir/.done" ] && return
  check_go
  local m=sigs.k8s.io/dra-driver-nvidia-gpu src="$CACHE/src/$(basename "$dra_prepare_dir")"
  log "building dra-prepare (tools/dra-prepare) against $m $DRA_DRIVER_NVIDIA_GPU_VERSION"
  rm -rf "$src" "$dra_prepare_dir"; mkdir -p "$src" "$dra_prepare_dir/bin"
  cp "$here/dra-prepare/main.go" "$src/"
  printf 'module gpu-scheduler.local/dra-prepare\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$m" "$DRA_DRIVER_NVIDIA_GPU_VERSION" >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w" -o "$dra_prepare_dir/bin/dra-prepare" .)
  touch "$dra_prepare_dir/.done"
}

build_nvidia() {
  with_lock "$nvidia_ctk_dir" build_nvidia_ctk
  with_lock "$nvidia_dra_dir" build_nvidia_dra
  with_lock "$dra_prepare_dir" build_dra_prepare
}

# ------------------------------------------------------------ the OCI registry
# The CNCF distribution registry, the reference implementation of the OCI distribution API
# (what Docker Hub, GHCR and GitLab's registry speak): `make release` pushes to it in the
# tests (tests/node/test_release_registry.py), and the real node's containerd pulls from it.
# tools/registry/main.go is upstream's cmd/registry with the filesystem and in-memory storage
# drivers only (no cloud SDKs to build), through a wrapper module that requires the pin.
build_registry() {
  [ -f "$registry_dir/.done" ] && return
  check_go
  local m=github.com/distribution/distribution/v3 src="$CACHE/src/$(basename "$registry_dir")"
  log "building the distribution registry $REGISTRY_VERSION (filesystem and in-memory storage)"
  rm -rf "$src" "$registry_dir"; mkdir -p "$src" "$registry_dir/bin"
  cp "$here/registry/main.go" "$src/"
  printf 'module gpu-scheduler.local/registry\n\ngo %s\n\nrequire %s %s\n' \
    "$(go env GOVERSION | sed 's/^go//')" "$m" "$REGISTRY_VERSION" >"$src/go.mod"
  (cd "$src" && go build -ldflags "-s -w -X $m/version.version=$REGISTRY_VERSION" \
      -o "$registry_dir/bin/registry" .)
  "$registry_dir/bin/registry" --version >&2
  touch "$registry_dir/.done"
}

# cosign: signs the released image index and attests its SBOMs with a key (`make release`,
# localcluster/sign.py), and verifies both back from the registry.
build_cosign() {
  [ -f "$cosign_dir/.done" ] && return
  check_go
  log "building cosign $COSIGN_VERSION (cold: several minutes)"
  go_build_pinned "$cosign_dir" github.com/sigstore/cosign/v3 "$COSIGN_VERSION" \
    github.com/sigstore/cosign/v3/cmd/cosign "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"
  "$cosign_dir/bin/cosign" version >&2
  touch "$cosign_dir/.done"
}

# `all` in two lanes side by side: a cold build spends much of its time fetching modules and
# linking, one core each, and the other lane's compiles fill that time. Lane one holds every
# build from the Kubernetes wrapper module (one source folder: k8s_wrapper) and those that reuse
# its compiled packages most (cert-manager, Argo CD); lane two the rest. Go's module and build
# caches take concurrent builds. A lane that fails fails `all` (its log says which build).
lane_k8s() {
  build_k8s; build_etcd; with_lock "$node_dir" build_node
  with_lock "$cm_dir" build_cert_manager; with_lock "$argocd_dir" build_argocd
}
lane_rest() {
  build_kwok; build_helm; build_ct; with_lock "$kube_score_dir" build_kube_score
  build_monitoring; build_nvidia; with_lock "$registry_dir" build_registry
  with_lock "$cosign_dir" build_cosign
}
build_all() {
  local a b ra=0 rb=0
  ( lane_k8s ) & a=$!
  ( lane_rest ) & b=$!
  wait "$a" || ra=$?
  wait "$b" || rb=$?
  if [ "$ra" -ne 0 ] || [ "$rb" -ne 0 ]; then
    log "build failed (Kubernetes lane: exit $ra, other lane: exit $rb); the log above says where"
    exit 1
  fi
}

if [ "${1:-}" = "--print-bin-dirs" ]; then print_bin_dirs; exit 0; fi
targets=("$@"); [ ${#targets[@]} -eq 0 ] && targets=(all)
start=$(date +%s)
for t in "${targets[@]}"; do
  case "$t" in
    k8s) build_k8s ;; etcd) build_etcd ;; kwok) build_kwok ;; helm) build_helm ;; ct) build_ct ;;
    argocd) with_lock "$argocd_dir" build_argocd ;;
    cert-manager) with_lock "$cm_dir" build_cert_manager ;;
    kube-score) with_lock "$kube_score_dir" build_kube_score ;;
    monitoring) build_monitoring ;;
    promtool) with_lock "$promtool_dir" build_promtool ;;
    prometheus) with_lock "$prometheus_dir" build_prometheus ;;
    dashboard-check) with_lock "$dashcheck_dir" build_dashcheck ;;
    node) with_lock "$node_dir" build_node ;;
    nvidia) build_nvidia ;;
    nvidia-ctk) with_lock "$nvidia_ctk_dir" build_nvidia_ctk ;;
    registry) with_lock "$registry_dir" build_registry ;;
    cosign) with_lock "$cosign_dir" build_cosign ;;
    host) ensure_host_packages ;;
    release) with_lock "$registry_dir" build_registry; with_lock "$cosign_dir" build_cosign ;;
    unit) build_helm; build_ct; with_lock "$kube_score_dir" build_kube_score
          with_lock "$nvidia_ctk_dir" build_nvidia_ctk
          with_lock "$promtool_dir" build_promtool; with_lock "$dashcheck_dir" build_dashcheck ;;
    all) build_all ;;
    *) log "unknown target $t"; exit 2 ;;
  esac
done
el=$(( $(date +%s) - start ))
[ "$el" -gt 5 ] && log "done in ${el}s"
exit 0
