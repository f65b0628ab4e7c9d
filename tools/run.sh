#!/usr/bin/env bash
# The main job: builds the `stepgraph` program and runs it (by default on its built-in
# tiny Llama with deterministic random weights; on the GPU when there is one, on the CPU
# reference otherwise). Arguments are passed to the program: tools/run.sh --help.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
cuda=OFF
command -v nvcc >/dev/null && cuda=ON
dir=${STEPGRAPH_BUILD_DIR:-build}/run-$cuda
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_WITH_CUDA=$cuda \
      -DSTEPGRAPH_BUILD_TESTS=OFF -DSTEPGRAPH_BUILD_BENCH=OFF >&2
cmake --build "$dir" -j "${STEPGRAPH_JOBS:-$(nproc)}" --target stepgraph >&2
exec "$dir/stepgraph" "$@"
