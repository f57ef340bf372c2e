#!/usr/bin/env bash
# Builds the Go binaries the test stack needs from the Go module proxy, cached by version:
#   kube-apiserver + kubectl + kube-controller-manager + kube-scheduler + kubelet (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3),
#   helm, minio (github.com/minio/minio: the S3-compatible object store), fake-gcs-server (a Google Cloud
#   Storage emulator, for gs:// tables), promtool (Prometheus's rule checker
#   and rule unit-test runner); on request only, kind
#   (sigs.k8s.io/kind, for `make e2e-kind`, which needs Docker).
# `go install` cannot build kube-apiserver or etcd (their go.mod files use replace directives), so each is
# built from a small wrapper module that pins the staging modules to the matching v0.Y.Z versions.
#
# Usage: hack/build-go-tools.sh [kube|etcd|helm|minio|fake-gcs-server|promtool|kind|all]   (prints the bin folder; all: not kind)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${XDG_CACHE_HOME:-$HOME/.cache}/icefall
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

log() { echo "[build-go-tools] $*" >&2; }

# The cached folder may be in use by a running test stack: a missing binary is built in a private work
# folder and renamed into bin/ (atomic on one file system); binaries already there are never touched.
build_kube() {
  local out=$cache/kube-$KUBE_VERSION
  local cmd missing=()
  for cmd in kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet; do
    [[ -x $out/bin/$cmd ]] || missing+=("$cmd")
  done
  if ((${#missing[@]} == 0)); then echo "$out/bin"; return; fi
  local minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  local staging_version=v0.${KUBE_VERSION#v1.}
  mkdir -p "$out/bin"
  local work
  work=$(mktemp -d "$out/build.XXXXXX")
  log "kube $KUBE_VERSION: resolving the staging modules from its go.mod"
  (cd "$work" && go mod init icefall.dev/kubebuild >/dev/null 2>&1)
  local gomod
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
    echo ")"
  } >>"$work/go.mod"
  log "kube $KUBE_VERSION: building ${missing[*]} (several minutes on 2 cores)"
  local pkg
  local ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date -X $pkg.gitCommit=icefall-build"
  done
  local pkgs=()
  for cmd in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  (cd "$work" && go get "k8s.io/kubernetes@$KUBE_VERSION" >&2 &&
    go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "$work/bin/" "${pkgs[@]}" >&2)
  for cmd in "${missing[@]}"; do mv "$work/bin/$cmd" "$out/bin/$cmd"; done
  rm -rf "$work"
  echo "$out/bin"
}

build_etcd() {
  local out=$cache/etcd-$ETCD_VERSION
  if [[ -x $out/bin/etcd ]]; then echo "$out/bin"; return; fi
  local work=$out/src
  rm -rf "$work" && mkdir -p "$work" "$out/bin"
  log "etcd $ETCD_VERSION: building"
  cat >"$work/main.go" <<'EOF'
// Command etcd: the etcd server, built from go.etcd.io/etcd/server/v3 for the Icefall test stack.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$work" && go mod init icefall.dev/etcdbuild >/dev/null 2>&1 &&
    for m in api/v3 client/pkg/v3 client/v3 pkg/v3 server/v3; do
      go mod edit -require="go.etcd.io/etcd/$m@$ETCD_VERSION"
    done &&
    go build -mod=mod -trimpath -o "$out/bin/etcd" \
      -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=icefall-build" . >&2)
  rm -rf "$work"
  echo "$out/bin"
}

# Stamped with its client-go's Kubernetes version, as helm's own Makefile does: unstamped, `helm template`
# and `helm lint` assume Kubernetes v1.20 and refuse charts/icefall (its kubeVersion asks for >= 1.30).
# The folder's name says so: an unstamped build in helm-<version> is never reused.
build_helm() {
  local out=$cache/helm-$HELM_VERSION-stamped
  if [[ -x $out/bin/helm ]]; then echo "$out/bin"; return; fi
  mkdir -p "$out/bin"
  local gomod minor
  gomod=$(cd "$out" && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod")
  [[ -n $minor ]] || { log "helm $HELM_VERSION: no k8s.io/client-go in $gomod"; exit 1; }
  log "helm $HELM_VERSION (Kubernetes 1.$minor by default): building"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" pkg
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  local work
  work=$(mktemp -d "$out/build.XXXXXX")
  GOBIN=$work go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mv "$work/helm" "$out/bin/helm"
  rm -rf "$work"
  echo "$out/bin"
}

# MinIO tags its releases RELEASE.<date>, which are not module versions, so versions.env pins the
# pseudo-version of a commit. Its go.mod has no replace directives: `go install` builds it directly.
# Left unstamped, it reports itself as a development build, which changes nothing the tests use.
build_minio() { go_install_cached minio "$MINIO_VERSION" "github.com/minio/minio"; }

build_fake_gcs_server() {
  go_install_cached fake-gcs-server "$FAKE_GCS_SERVER_VERSION" "github.com/fsouza/fake-gcs-server"
}

build_kind() { go_install_cached kind "$KIND_VERSION" "sigs.k8s.io/kind"; }

# Only promtool, from the Prometheus module (its go.mod has no replace directives). `remove_all_sd` leaves out
# the service-discovery plugins (cloud SDKs), which rule checks and rule unit tests never use.
build_promtool() {
  local out=$cache/promtool-$PROMETHEUS_VERSION
  if [[ -x $out/bin/promtool ]]; then echo "$out/bin"; return; fi
  mkdir -p "$out/bin"
  local module=${PROMETHEUS_VERSION#v0.}   # 316.0 for Prometheus 3.16.0
  local release="3.$((${module%%.*} - 300)).${module#*.}"
  log "promtool $PROMETHEUS_VERSION (Prometheus $release): building"
  GOBIN=$out/bin go install -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
  echo "$out/bin"
}

# go_install_cached NAME VERSION MODULE: `go install MODULE@VERSION` into $cache/NAME-VERSION/bin once.
go_install_cached() {
  local name=$1 version=$2 module=$3 out=$cache/$1-$2
  if [[ -x $out/bin/$name ]]; then echo "$out/bin"; return; fi
  mkdir -p "$out/bin"
  log "$name $version: building (minutes on 2 cores)"
  GOBIN=$out/bin go install -trimpath -ldflags "-s -w" "$module@$version" >&2
  echo "$out/bin"
}

case ${1:-all} in
  kube) build_kube ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  minio) build_minio ;;
  fake-gcs-server) build_fake_gcs_server ;;
  promtool) build_promtool ;;
  kind) build_kind ;;
  all) build_etcd && build_kube && build_helm && build_minio && build_fake_gcs_server && build_promtool ;;
  *) echo "usage: $0 [kube|etcd|helm|minio|fake-gcs-server|promtool|kind|all]" >&2; exit 2 ;;
esac
