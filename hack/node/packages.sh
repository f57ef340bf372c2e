#!/usr/bin/env bash
# Installs the Debian packages a node of the e2e cluster needs, when missing: containerd (the container
# runtime the kubelet talks to), runc, the CNI plugins, podman (builds the image) and debootstrap (makes
# its base). Needs root, as every apt-get install here.
set -euo pipefail
need=()
for pair in containerd:containerd runc:runc podman:podman debootstrap:debootstrap \
  /usr/lib/cni/loopback:containernetworking-plugins gcc:gcc; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x ${pair%%:*} ]] || need+=("${pair#*:}")
done
((${#need[@]} == 0)) && exit 0
echo "[node-packages] apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# One at a time: apt holds a lock, and two setups may run side by side.
exec 9>/tmp/icefall-apt.lock
flock 9
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${need[@]}" >&2
