#!/usr/bin/env bash
# `make e2e-kind`: Icefall as a user installs it, on a real Kubernetes cluster in Docker (kind). Needs a
# running Docker daemon; neither `make test` nor CI runs it (the machines that run those have no Docker).
#
#   1. a kind cluster `icefall-e2e` (kept between runs: creation is skipped when it exists);
#   2. the image of spark_images/Dockerfile as icefall:e2e, and Iceberg's REST catalog server
#      (hack/kind/rest-catalog.Dockerfile) as icefall-rest-catalog:e2e, loaded into the cluster;
#   3. a fresh Kafka (hack/kind/kafka.yaml), MinIO and REST catalog (hack/kind/lake.yaml), under the Service
#      names examples/cluster.yaml uses (on a reused cluster, the previous run's are deleted first);
#   4. pytest e2e/test_user_path.py, the module the local harness runs, with ICEFALL_E2E_KUBECONFIG set to
#      the cluster's kubeconfig: it reaches Kafka, the catalog and the object store through `kubectl
#      port-forward`, runs `icefall run -f` here, `helm install`s charts/icefall (examples/cluster-values.yaml
#      plus hack/kind/values.yaml), applies examples/cluster.yaml as it is, and checks the table exactly once,
#      compacted, and `kubectl get st` READY True with FRESHNESS and LAG 0.
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
kube_bin=$("$repo/hack/build-go-tools.sh" kube) # kubectl (helm: the test finds it as the local e2e does)
export PATH=$kube_bin:$PATH

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

# The test counts every record of the topic and expects its own namespace to be new: start from nothing.
# e2e-user-path is the namespace e2e/conftest.py gives test_user_path.py.
if $reused; then
  log "deleting the previous run's Kafka, lake and test namespace"
  kubectl delete namespace kafka lake e2e-user-path --ignore-not-found --wait=true --timeout=300s
fi
log "Kafka, MinIO and the REST catalog"
kubectl apply -f "$here/kafka.yaml" -f "$here/lake.yaml"
kubectl -n kafka rollout status deployment/kafka --timeout=300s
kubectl -n lake rollout status deployment/minio --timeout=300s
kubectl -n lake wait --for=condition=Complete job/lake-bucket --timeout=300s
kubectl -n lake rollout status deployment/iceberg-rest --timeout=300s

log "the e2e assertions (e2e/test_user_path.py, on this cluster)"
cd "$repo"
ICEFALL_E2E_KUBECONFIG=$kubeconfig "${PYTEST:-$repo/.venv/bin/pytest}" e2e/test_user_path.py -m e2e \
  --basetemp="$repo/.icefall/kind/pytest" "$@"
log "passed; the cluster stays up for a look (KUBECONFIG=$kubeconfig); make e2e-kind-clean deletes it"
