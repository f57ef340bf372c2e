#!/usr/bin/env bash
# Installs the Node.js tools the test stack needs from the npm registry (with the ordinary npm client),
# cached by version:
#   azurite (Microsoft's Azure Storage emulator: Blob and ADLS Gen2 APIs), for tables on abfss://.
# The folder is filled in a private work folder and renamed into place once complete, under a lock, so a
# second setup at the same time waits and a running test stack's folder is never touched.
#
# Usage: hack/fetch-npm-tools.sh azurite   (prints the folder holding the tool's executables)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${XDG_CACHE_HOME:-$HOME/.cache}/icefall
case ${1:-} in
  azurite) package=azurite version=$AZURITE_VERSION ;;
  *) echo "usage: $0 azurite" >&2; exit 2 ;;
esac
out=$cache/$1-$version
if [[ ! -f $out/.complete ]]; then
  mkdir -p "$cache"
  exec 9>"$out.lock"
  flock 9
  if [[ ! -f $out/.complete ]]; then
    echo "[fetch-npm-tools] installing $package@$version into $out" >&2
    rm -rf "$out" "$out.work"
    mkdir -p "$out.work"
    npm install --prefix "$out.work" --no-audit --no-fund --no-save --loglevel=error \
      "$package@$version" >&2
    touch "$out.work/.complete"
    mv "$out.work" "$out"
  fi
  exec 9>&-
fi
echo "$out/node_modules/.bin"
