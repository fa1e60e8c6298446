#!/usr/bin/env bash
# Installs Pipeforge's build and test dependencies:
#   - Debian packages (compiler, CMake, Ninja, ccache, Boost.Graph, yaml-cpp, ...,
#     Gloo's headers, and Debian's LibTorch + python3-torch for the second build);
#   - the project virtual environment .venv/ with torch==2.13.0 (CPU), whose
#     LibTorch is the main build's (python/requirements.txt).
# Idempotent and quiet: when everything is present it prints nothing and exits 0.
# PIPEFORGE_TORCH=system skips the venv (only Debian's LibTorch is needed then).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev python3-torch python3-torchvision
  libyaml-cpp-dev libboost-graph-dev libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libssl-dev zlib1g-dev libxxhash-dev
  graphviz libgraphviz-dev iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "pipeforge: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "${PIPEFORGE_TORCH:-wheel}" = "system" ] && exit 0

# The venv: the interpreter on PATH (Python 3.11 here), never Debian's
# /usr/bin/python3, whose site-packages hold torch 1.13 for the system build.
# PIPEFORGE_TORCH=cuda: .venv-cuda with the CUDA wheel (python/requirements-cuda.txt).
if [ "${PIPEFORGE_TORCH:-wheel}" = "cuda" ]; then
  VENV=${PIPEFORGE_VENV:-.venv-cuda}
  REQ=python/requirements-cuda.txt
  WANT=2.14.1
else
  VENV=${PIPEFORGE_VENV:-.venv}
  REQ=python/requirements.txt
  WANT=2.13.0
fi
stamp="$VENV/.pipeforge-requirements"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && cmp -s "$REQ" "$stamp"; then
  exit 0
fi
PY=${PIPEFORGE_VENV_PYTHON:-python3}
echo "pipeforge: preparing $VENV ($("$PY" --version 2>&1)) with $(grep -v '^#' "$REQ" | tr '\n' ' ')" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# Exact pins only: a bare or newer `torch` would fetch a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >/dev/null
"$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$WANT' else 1)" || {
  echo "pipeforge: $VENV has torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), expected $WANT" >&2
  exit 1
}
cp "$REQ" "$stamp"
