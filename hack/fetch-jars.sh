#!/usr/bin/env bash
# Resolves a pom's dependencies with Maven into a cache folder keyed by the pom's content
# (so a version bump gets a fresh folder) and prints that folder.
# `registry` unpacks a distribution instead (hack/registry/pom.xml: Apicurio Registry's tar.gz).
#
# Usage: hack/fetch-jars.sh spark|delta|kafka|rest-catalog|registry|kafka-connect
#   (delta: only Delta Lake tables' sessions and their tests; kafka-connect: only `make bench`)
#
# A folder is filled in a private work folder and renamed into place once complete, under a lock per
# component: a second setup running at the same time waits, and never empties a folder a test stack uses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
goal=copy-dependencies
case ${1:-} in
  spark) pom=$here/../spark_images/pom.xml ;;
  delta) pom=$here/../spark_images/delta/pom.xml ;;
  kafka) pom=$here/kafka/pom.xml ;;
  rest-catalog) pom=$here/rest-catalog/pom.xml ;;
  registry) pom=$here/registry/pom.xml goal=unpack ;;
  kafka-connect) pom=$here/kafka-connect/pom.xml ;;
  *) echo "usage: $0 spark|delta|kafka|rest-catalog|registry|kafka-connect" >&2; exit 2 ;;
esac
key=$(sha256sum "$pom" | cut -c1-12)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/icefall
out=$cache/jars-$1-$key
[[ $goal == unpack ]] && out=$cache/$1-$key
if [[ ! -f $out/.complete ]]; then
  mkdir -p "$cache"
  exec 9>"$out.lock"
  flock 9
  if [[ ! -f $out/.complete ]]; then
    echo "[fetch-jars] resolving $1 into $out" >&2
    rm -rf "$out" "$out.work"
    if [[ $goal == unpack ]]; then
      mvn -q -B -f "$pom" dependency:unpack -Dregistry.home="$out.work" >&2
      rm -rf "$out.work/.markers"
    else
      mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$out.work" >&2
    fi
    touch "$out.work/.complete"
    mv "$out.work" "$out"
  fi
  exec 9>&-
fi
echo "$out"
