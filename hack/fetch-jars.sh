#!/usr/bin/env bash
# Resolves a pom's dependencies with Maven into a cache folder keyed by the pom's content
# (so a version bump gets a fresh folder) and prints that folder.
#
# Usage: hack/fetch-jars.sh spark|kafka|rest-catalog|kafka-connect   (kafka-connect: only `make bench` uses it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
  spark) pom=$here/../spark_images/pom.xml ;;
  kafka) pom=$here/kafka/pom.xml ;;
  rest-catalog) pom=$here/rest-catalog/pom.xml ;;
  kafka-connect) pom=$here/kafka-connect/pom.xml ;;
  *) echo "usage: $0 spark|kafka|rest-catalog|kafka-connect" >&2; exit 2 ;;
esac
key=$(sha256sum "$pom" | cut -c1-12)
out=${XDG_CACHE_HOME:-$HOME/.cache}/icefall/jars-$1-$key
if [[ ! -f $out/.complete ]]; then
  echo "[fetch-jars] resolving $1 jars into $out" >&2
  rm -rf "$out"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out" >&2
  touch "$out/.complete"
fi
echo "$out"
