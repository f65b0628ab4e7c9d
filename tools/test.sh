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
  cmake -S . -B "$root/$c" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_WITH_CUDA=$cuda >&2
  cmake --build "$root/$c" -j "$jobs"
  echo "== stepgraph: test ($c)" >&2
  (cd "$root/$c" && ctest --no-tests=error --output-on-failure -j "$jobs")
done
