#!/usr/bin/env bash
# Installs Pipeforge's build and test dependencies from Debian packages.
# Idempotent and quiet: when every package is present it prints nothing and exits 0.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev python3-torch python3-torchvision
  libyaml-cpp-dev libboost-graph-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  graphviz libgraphviz-dev iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "pipeforge: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
