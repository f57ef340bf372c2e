#!/usr/bin/env bash
# Builds Icefall's image (spark_images/Dockerfile) with podman, with no image registry: the Debian base is
# made by debootstrap from the Debian mirror apt already uses, the pod sandbox's "pause" image from
# hack/node/pause.c. Each is built once and found again by tag:
#   localhost/icefall-base:bookworm     Debian 12 minbase (what debian:bookworm-slim is elsewhere)
#   localhost/icefall-pause:1           the static pause binary alone
#   localhost/icefall:<hash>            the image, tagged with a hash of everything that goes into it
# Prints the image refs as shell assignments (ICEFALL_IMAGE=..., ICEFALL_PAUSE_IMAGE=...).
#
# Usage: hack/build-image.sh            (as root: debootstrap and podman need it here)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export CONTAINERS_CONF=$here/node/containers.conf
cache=${XDG_CACHE_HOME:-$HOME/.cache}/icefall
base=localhost/icefall-base:bookworm
pause=localhost/icefall-pause:1

log() { echo "[build-image] $*" >&2; }

"$here/node/packages.sh"
mkdir -p "$cache"
# Two builds at once would debootstrap into one folder: one at a time.
exec 9>"$cache/build-image.lock"
flock 9

if ! podman image exists "$base"; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n $mirror ]] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  work=$(mktemp -d "$cache/debootstrap.XXXXXX")
  log "base image: debootstrap --variant=minbase bookworm (about 1.5 min)"
  s=$SECONDS
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
  rm -rf "$work"
  log "base image $base ready ($((SECONDS - s)) s)"
fi

if ! podman image exists "$pause"; then
  work=$(mktemp -d "$cache/pause.XXXXXX")
  gcc -static -O2 -o "$work/pause" "$here/node/pause.c"
  printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$work/Containerfile"
  podman build -q -t "$pause" -f "$work/Containerfile" "$work" >/dev/null
  rm -rf "$work"
  log "pause image $pause ready"
fi

# The tag: a hash of the Dockerfile, the files it copies and the base it builds on.
hash=$(cd "$root" && {
  podman image inspect --format '{{.Id}}' "$base"
  sha256sum spark_images/Dockerfile spark_images/pom.xml spark_images/delta/pom.xml constraints.txt pyproject.toml README.md
  find operator/src -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -c1-12)
image=localhost/icefall:$hash
if ! podman image exists "$image"; then
  log "image $image: building (first build about 5 min; a code change rebuilds the last layers only)"
  s=$SECONDS
  # pip's and Maven's caches of this machine are lent to the build (what `make setup` downloaded is not
  # downloaded again), and so is its trust store: the registries may be reached through a proxy whose CA
  # only this machine's store holds.
  mkdir -p "$HOME/.cache/pip" "$HOME/.m2"
  podman build --layers -t "$image" -f "$root/spark_images/Dockerfile" --build-arg "BASE=$base" \
    -v "$HOME/.cache/pip:/root/.cache/pip" -v "$HOME/.m2:/root/.m2" -v /etc/ssl/certs:/etc/ssl/host-certs:ro \
    --build-arg MAVEN_OPTS=-Djavax.net.ssl.trustStore=/etc/ssl/host-certs/java/cacerts \
    --build-arg PIP_CERT=/etc/ssl/host-certs/ca-certificates.crt \
    "$root" >"$cache/build-image.log" 2>&1 ||
    { tail -40 "$cache/build-image.log" >&2; exit 1; }
  log "image $image ready ($((SECONDS - s)) s; log: $cache/build-image.log)"
  # Older builds only take disk space (their layers that the new one shares stay).
  podman images --format '{{.Repository}}:{{.Tag}}' localhost/icefall | grep -vx "$image" |
    xargs -r podman rmi >/dev/null 2>&1 || true
fi
echo "ICEFALL_IMAGE=$image"
echo "ICEFALL_PAUSE_IMAGE=$pause"
