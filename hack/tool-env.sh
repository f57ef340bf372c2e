#!/usr/bin/env bash
# Provisions the non-Python components (cached by version) and prints the `export` lines that point
# icefall.devstack at them.
#
# Usage: eval "$(hack/tool-env.sh)"          every component: what `make setup` and `make test` use
#        eval "$(hack/tool-env.sh --demo)"   only what `make demo` uses: Kafka's jars and Spark's jars
#        eval "$(hack/tool-env.sh kafka spark ...)"   the components named (see TOOLS below)
# A component left out is not provisioned and its variable not exported; icefall.devstack.tools then
# provisions it on first use (the Avro demo's schema registry, for one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# component: script, its argument, the variable it sets, and whether its folder goes on PATH.
declare -A TOOLS=(
  [kube]="build-go-tools.sh kube ICEFALL_KUBE_BIN path"
  [etcd]="build-go-tools.sh etcd ICEFALL_ETCD_BIN -"
  [helm]="build-go-tools.sh helm ICEFALL_HELM_BIN path"
  [minio]="build-go-tools.sh minio ICEFALL_MINIO_BIN -"
  [fake-gcs-server]="build-go-tools.sh fake-gcs-server ICEFALL_FAKE_GCS_BIN -"
  [promtool]="build-go-tools.sh promtool ICEFALL_PROMTOOL_BIN path"
  [kafka]="fetch-jars.sh kafka ICEFALL_KAFKA_JARS -"
  [spark]="fetch-jars.sh spark ICEFALL_SPARK_JARS -"
  [delta]="fetch-jars.sh delta ICEFALL_DELTA_JARS -"
  [rest-catalog]="fetch-jars.sh rest-catalog ICEFALL_REST_CATALOG_JARS -"
  [registry]="fetch-jars.sh registry ICEFALL_REGISTRY_HOME -"
  [azurite]="fetch-npm-tools.sh azurite ICEFALL_AZURITE_BIN -"
)
ALL=(kube etcd helm minio fake-gcs-server promtool kafka spark delta rest-catalog registry azurite)
DEMO=(kafka spark)
case ${1:-} in
  "") wanted=("${ALL[@]}") ;;
  --demo) wanted=("${DEMO[@]}") ;;
  *) wanted=("$@") ;;
esac
for name in "${wanted[@]}"; do
  if [[ -z ${TOOLS[$name]:-} ]]; then
    echo "usage: $0 [--demo | COMPONENT...]; components: ${ALL[*]}" >&2
    exit 2
  fi
done
t0=$SECONDS
# A cached step is silent; a step that builds or downloads says what it did and how long it took.
step() {
  local s=$SECONDS out
  out=$("$@")
  if ((SECONDS - s > 0)); then echo "[setup] $(basename "$1") ${2:-} -> $out ($((SECONDS - s))s)" >&2; fi
  echo "$out"
}
exports=() path=""
for name in "${wanted[@]}"; do
  read -r script arg variable on_path <<<"${TOOLS[$name]}"
  folder=$(step "$here/$script" "$arg")
  exports+=("export $variable=$folder")
  if [[ $on_path == path ]]; then path+="$folder:"; fi
done
if ((SECONDS - t0 > 0)); then echo "[setup] tools ready in $((SECONDS - t0))s" >&2; fi
printf '%s\n' "${exports[@]}"
if [[ -n $path ]]; then echo "export PATH=$path\$PATH"; fi
