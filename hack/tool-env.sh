#!/usr/bin/env bash
# Provisions every non-Python component (cached by version) and prints the `export` lines that point
# icefall.devstack at them. Usage: eval "$(hack/tool-env.sh)"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS
# A cached step is silent; a step that builds or downloads says what it did and how long it took.
step() {
  local s=$SECONDS out
  out=$("$@")
  if ((SECONDS - s > 0)); then echo "[setup] $(basename "$1") ${2:-} -> $out ($((SECONDS - s))s)" >&2; fi
  echo "$out"
}
kube=$(step "$here/build-go-tools.sh" kube)
etcd=$(step "$here/build-go-tools.sh" etcd)
helm=$(step "$here/build-go-tools.sh" helm)
minio=$(step "$here/build-go-tools.sh" minio)
fake_gcs=$(step "$here/build-go-tools.sh" fake-gcs-server)
promtool=$(step "$here/build-go-tools.sh" promtool)
kafka=$(step "$here/fetch-jars.sh" kafka)
spark=$(step "$here/fetch-jars.sh" spark)
rest_catalog=$(step "$here/fetch-jars.sh" rest-catalog)
registry=$(step "$here/fetch-jars.sh" registry)
azurite=$(step "$here/fetch-npm-tools.sh" azurite)
if ((SECONDS - t0 > 0)); then echo "[setup] tools ready in $((SECONDS - t0))s" >&2; fi
cat <<ENV
export ICEFALL_KUBE_BIN=$kube
export ICEFALL_ETCD_BIN=$etcd
export ICEFALL_HELM_BIN=$helm
export ICEFALL_MINIO_BIN=$minio
export ICEFALL_FAKE_GCS_BIN=$fake_gcs
export ICEFALL_PROMTOOL_BIN=$promtool
export ICEFALL_KAFKA_JARS=$kafka
export ICEFALL_SPARK_JARS=$spark
export ICEFALL_REST_CATALOG_JARS=$rest_catalog
export ICEFALL_REGISTRY_HOME=$registry
export ICEFALL_AZURITE_BIN=$azurite
export PATH=$kube:$helm:$promtool:\$PATH
ENV
