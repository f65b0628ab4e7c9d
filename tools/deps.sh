#!/usr/bin/env bash
# Installs stepgraph's build dependencies from Debian's packages when any is missing.
# Sourced by tools/test.sh and tools/run.sh; needs root (or sudo) only when something is
# missing.
set -euo pipefail
sg_packages=(cmake ninja-build g++ pkg-config libabsl-dev nlohmann-json3-dev libgtest-dev
             libgmock-dev libbenchmark-dev libpcre2-dev libcpp-httplib-dev)
sg_missing=()
for p in "${sg_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || sg_missing+=("$p")
done
if ((${#sg_missing[@]})); then
  echo "stepgraph: installing ${sg_missing[*]}" >&2
  sg_sudo=""
  [[ $(id -u) -ne 0 ]] && sg_sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sg_sudo apt-get update -q >&2
  $sg_sudo apt-get install -y -q --no-install-recommends "${sg_missing[@]}" >&2
fi
# The CUDA toolkit is not a Debian package here: use it when it is installed.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
