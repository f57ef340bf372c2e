#!/usr/bin/env bash
# `make e2e-kind`: Icefall as a user installs it, on a real Kubernetes cluster in Docker (kind). Needs a
# running Docker daemon; neither `make test` nor CI runs it (the machines that run those have no Docker).
#
#   1. a kind cluster `icefall-e2e` (kept between runs: creation is skipped when it exists);
#   2. the image of spark_images/Dockerfile as icefall:e2e, and Iceberg's REST catalog server
#      (hack/kind/rest-catalog.Dockerfile) as icefall-rest-catalog:e2e, loaded into the cluster;
#   3. Kafka (hack/kind/kafka.yaml), MinIO and the REST catalog (hack/kind/lake.yaml), under the Service
#      names examples/cluster.yaml uses;
#   4. `helm upgrade --install icefall charts/icefall` with hack/kind/values.yaml;
#   5. pytest hack/kind/test_kind.py with ICEFALL_E2E_KUBECONFIG set to the cluster's kubeconfig: it applies
#      examples/cluster.yaml as it is and checks rows exactly once and `kubectl get st` READY True.
#
# Usage: hack/kind/e2e-kind.sh            (from `make e2e-kind`, which provisions the venv, kubectl, helm)
#        hack/kind/e2e-kind.sh --delete   (deletes the cluster)
# The cluster's kubeconfig is written to .icefall/kind/kubeconfig; ~/.kube/config is left alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${ICEFALL_KIND_CLUSTER:-icefall-e2e}
kubeconfig=$repo/.icefall/kind/kubeconfig
image=icefall:e2e
rest_image=icefall-rest-catalog:e2e

log() { echo "[e2e-kind +${SECONDS}s] $*" >&2; }
fail() {
  echo "[e2e-kind] $*" >&2
  exit 1
}

command -v docker >/dev/null || fail "needs Docker: no docker command here"
docker info >/dev/null 2>&1 || fail "needs Docker: the Docker daemon does not answer (docker info)"
kind_bin=$("$repo/hack/build-go-tools.sh" kind)
export PATH=$kind_bin:$PATH
if [[ ${1:-} == --delete ]]; then
  kind delete cluster --name "$cluster"
  rm -f "$kubeconfig"
  exit 0
fi
kube_bin=$("$repo/hack/build-go-tools.sh" kube) # kubectl
helm_bin=$("$repo/hack/build-go-tools.sh" helm)
export PATH=$kube_bin:$helm_bin:$PATH

mkdir -p "$(dirname "$kubeconfig")"
reused=false
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "cluster $cluster exists: reusing it (make e2e-kind-clean first for a fresh one)"
  reused=true
else
  log "creating cluster $cluster"
  kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s
fi
kind get kubeconfig --name "$cluster" >"$kubeconfig"
export KUBECONFIG=$kubeconfig

log "building $image (spark_images/Dockerfile) and $rest_image"
docker build -f "$repo/spark_images/Dockerfile" -t "$image" "$repo"
docker build -f "$here/rest-catalog.Dockerfile" -t "$rest_image" "$repo"
log "loading the images into $cluster"
kind load docker-image --name "$cluster" "$image" "$rest_image"

log "Kafka, MinIO and the REST catalog"
kubectl apply -f "$here/kafka.yaml" -f "$here/lake.yaml"
kubectl -n kafka rollout status deployment/kafka --timeout=300s
kubectl -n lake rollout status deployment/minio --timeout=300s
kubectl -n lake wait --for=condition=Complete job/lake-bucket --timeout=300s
kubectl -n lake rollout status deployment/iceberg-rest --timeout=300s

# Helm installs crds/ only when the CRD is absent: apply it first, so a reused cluster gets this checkout's.
kubectl apply --server-side -f "$repo/crds"
# No --wait: the operator's pod starts once the test has applied examples/cluster.yaml (its Secret).
log "helm upgrade --install icefall charts/icefall"
helm upgrade --install icefall "$repo/charts/icefall" --namespace icefall --create-namespace \
  --values "$here/values.yaml"
# The image was rebuilt under the same tag: a running operator would go on with the old one.
if $reused; then kubectl -n icefall rollout restart deployment/icefall; fi

log "the e2e assertions (hack/kind/test_kind.py)"
cd "$repo"
ICEFALL_E2E_KUBECONFIG=$kubeconfig "${PYTEST:-$repo/.venv/bin/pytest}" hack/kind/test_kind.py -m e2e \
  --basetemp="$repo/.icefall/kind/pytest" "$@"
log "passed; the cluster stays up for a look (KUBECONFIG=$kubeconfig); make e2e-kind-clean deletes it"
