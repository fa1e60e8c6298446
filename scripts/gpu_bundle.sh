#!/usr/bin/env bash
# Downloads, on this (Debian 12) machine, the Debian packages that
# scripts/gpu_check.sh unpacks on a GPU machine that has a CUDA torch, a
# compiler, CMake and Ninja but no Debian dev packages and no network: the
# headers (and the few shared libraries) Pipeforge builds against besides
# LibTorch. They land in .gpu_bundle/ (git-ignored), which a device run
# carries beside the working tree; together they must stay under 64 MiB.
# Usage: scripts/gpu_bundle.sh [DIR]   (idempotent: present files are kept)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu_bundle}
# What the build finds with find_package (CMakeLists.txt, cmake/, stage/,
# tests/) and c10d's Gloo header, plus the runtime libraries those -dev
# packages link to. Graphviz is left out (-DPIPEFORGE_WITH_GRAPHVIZ=OFF).
PACKAGES=(
  libyaml-cpp-dev libyaml-cpp0.7
  libboost1.74-dev
  libcli11-dev nlohmann-json3-dev
  libfmt-dev libfmt9
  libssl-dev libssl3
  zlib1g-dev zlib1g
  libxxhash-dev libxxhash0
  libgtest-dev libgmock-dev
  libgloo-dev
)
mkdir -p "$DIR"
cd "$DIR"
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}" >/dev/null 2>apt-download.err || {
    echo "gpu_bundle: apt-get download failed:" >&2; cat apt-download.err >&2
    echo "gpu_bundle: run 'apt-get update' once if the package lists are missing" >&2
    exit 1
  }
  rm -f apt-download.err
fi
cd - >/dev/null
size=$(du -sk "$DIR" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "gpu_bundle: ${#PACKAGES[@]} packages in $DIR: $((size / 1024)) MiB; tracked tree $((tree / 1024)) MiB;" \
     "together $(((size + tree) / 1024)) MiB of the 64 MiB a device run may carry"
if [ $((size + tree)) -gt $((60 * 1024)) ]; then
  echo "gpu_bundle: over 60 MiB: a device run would be refused" >&2
  exit 1
fi
