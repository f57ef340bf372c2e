#!/usr/bin/env bash
# Checks what the machine must already have before `make demo` or `make setup`/`make test` install the
# rest, and prints one line per missing or too old piece (with what to install); exits 1 if any.
#
# Usage: hack/check-prereqs.sh demo   what `make demo` needs: Python 3.11 or 3.12 with venv, Java 17+,
#                                     Maven 3.6.3+, flock and sha256sum
#        hack/check-prereqs.sh all    what `make setup`/`make test` need: the same plus Go, npm and openssl
# Runs before any virtualenv exists: bash and the system's tools only.
set -euo pipefail
mode=${1:-all}
case $mode in
  demo | all) ;;
  *) echo "usage: $0 demo|all" >&2; exit 2 ;;
esac
missing=0
lack() {
  echo "[prereqs] missing: $*" >&2
  missing=$((missing + 1))
}
# version_at_least FOUND NEEDED: true when FOUND >= NEEDED (dotted numbers).
version_at_least() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }

# Python: pyproject.toml's requires-python (>=3.11,<3.13), and its venv module with pip (Debian splits it out).
if ! command -v python3 >/dev/null; then
  lack "python3 3.11 or 3.12 (Debian: apt-get install python3 python3-venv)"
else
  py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if ! version_at_least "$py" 3.11 || version_at_least "$py" 3.13; then
    lack "python3 3.11 or 3.12 (found $py; pyspark 4.1 and pyproject.toml's requires-python)"
  elif ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    lack "python3's venv module with pip (Debian: apt-get install python3-venv)"
  fi
fi
# Java: Kafka 4's broker and Spark 4.1 need 17 or newer.
if ! command -v java >/dev/null; then
  lack "Java 17 or newer, \`java\` on PATH (Debian: apt-get install openjdk-17-jdk-headless)"
else
  java_out=$(java -version 2>&1 || true)
  java_version=$(sed -n 's/.*version "\([0-9][0-9._]*\).*/\1/p' <<<"$java_out" | head -n1)
  java_major=${java_version#1.}
  java_major=${java_major%%.*}
  if [[ -z $java_major ]] || ((java_major < 17)); then
    lack "Java 17 or newer (found ${java_version:-an unknown version}; Kafka 4 and Spark 4.1 need 17+)"
  fi
fi
# Maven resolves the jars (hack/fetch-jars.sh); the registry's pom uses maven-dependency-plugin 3.8, 3.6.3+.
if ! command -v mvn >/dev/null; then
  lack "Maven 3.6.3 or newer, \`mvn\` on PATH (Debian: apt-get install maven)"
else
  mvn_out=$(mvn -B -v 2>/dev/null || true)  # its first line may start with a colour code
  mvn_version=$(sed -n 's/.*Apache Maven \([0-9][0-9.]*\).*/\1/p' <<<"$mvn_out" | head -n1)
  if [[ -z $mvn_version ]] || ! version_at_least "$mvn_version" 3.6.3; then
    lack "Maven 3.6.3 or newer (found ${mvn_version:-an unknown version})"
  fi
fi
# The setup scripts lock each cache folder and key it by a hash (util-linux, coreutils).
for tool in flock sha256sum; do
  command -v "$tool" >/dev/null || lack "$tool (Debian: apt-get install util-linux coreutils)"
done
if [[ $mode == all ]]; then
  # The test stack builds kube-apiserver, etcd, Helm, MinIO, ... from the Go module proxy, installs Azurite
  # with npm, and makes the API server's keys with openssl.
  command -v go >/dev/null || lack "Go, \`go\` on PATH (https://go.dev/dl; it fetches the toolchain the modules ask for)"
  command -v npm >/dev/null || lack "npm and Node.js (Debian: apt-get install npm)"
  command -v openssl >/dev/null || lack "openssl (Debian: apt-get install openssl)"
fi
if ((missing)); then
  echo "[prereqs] $missing missing; install them, then run make again" >&2
  exit 1
fi
