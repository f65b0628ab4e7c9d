#!/usr/bin/env bash
# Builds stepgraph and runs every test. With nvcc present it builds the CUDA targets too
# (GPU tests skip when no device is found), and it always builds and tests the CUDA-free
# configuration, which is what a machine without the toolkit gets.
# Build folders: build/cuda and build/nocuda (override with STEPGRAPH_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
root=${STEPGRAPH_BUILD_DIR:-build}
jobs=${STEPGRAPH_JOBS:-$(nproc)}
configs=(nocuda)
command -v nvcc >/dev/null && configs=(cuda nocuda)
for c in "${configs[@]}"; do
  cuda=OFF; [[ $c == cuda ]] && cuda=ON
  echo "== stepgraph: build ($c) in $root/$c" >&2
  # The benchmarks build once, in the first configuration (with CUDA when there is nvcc).
  bench=ON; [[ $c == nocuda && ${#configs[@]} -gt 1 ]] && bench=OFF
  cmake -S . -B "$root/$c" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_WITH_CUDA=$cuda \
        -DSTEPGRAPH_BUILD_BENCH=$bench -DSTEPGRAPH_WERROR=ON >&2
  cmake --build "$root/$c" -j "$jobs"
  echo "== stepgraph: test ($c)" >&2
  (cd "$root/$c" && ctest --no-tests=error --output-on-failure -j "$jobs")
done
# ---- package (begin): the CUDA-free build installed and used through find_package ----
echo "== stepgraph: find_package(stepgraph) consumer (nocuda)" >&2
tools/package_test.sh "$root/nocuda"
# ---- package (end) ----
# ---- bindings (begin): the Python package and the Rust crate over each build's C ABI ----
# pytest (python/tests) and cargo test (rust/), offline; the signature check runs in ctest
# and in pytest. GPU cases skip without a device.
# Missing tools come from Debian (a system Python refuses pip installs), or from pip where
# python3 is not the system's.
sg_apt() {
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$@" >&2
}
if ! python3 -c "import numpy, pytest" 2>/dev/null; then
  python3 -m pip install -q numpy pytest >&2 2>/dev/null || sg_apt python3-numpy python3-pytest
fi
command -v cargo >/dev/null || sg_apt cargo
# STEPGRAPH_BINDINGS_CONFIGS narrows the configurations the bindings are tested against
# (CI: nocuda only, where the stub and the CPU fallbacks run; without a GPU the CUDA
# build's library adds nothing the nocuda run does not cover).
for c in ${STEPGRAPH_BINDINGS_CONFIGS:-${configs[@]}}; do
  lib_dir=$(cd "$root/$c" && pwd)
  echo "== stepgraph: Python and Rust bindings ($c)" >&2
  STEPGRAPH_LIB_DIR=$lib_dir python3 -m pytest -q python/tests
  if command -v cargo >/dev/null; then
    STEPGRAPH_LIB_DIR=$lib_dir CARGO_TARGET_DIR="$lib_dir/rust-target" \
      cargo test --offline -q --manifest-path rust/Cargo.toml
  else
    echo "stepgraph: cargo not found; the Rust crate's tests did not run" >&2
    exit 1
  fi
done
# ---- bindings (end) ----
