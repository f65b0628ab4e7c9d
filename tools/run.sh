#!/usr/bin/env bash
# The main job: builds the `stepgraph` program and runs it, on the GPU when there is one,
# on the CPU reference otherwise. Without arguments it fetches the real SmolLM2-135M-Instruct
# model (a 98 MB GGUF file, once, into ~/.cache/stepgraph-test) and asks it a question in
# a chat turn; where the model cannot be fetched it runs the built-in random model instead.
# Arguments are passed to the program: tools/run.sh --help. It prints nothing of its own
# but a line when it builds, and the build's output only when the build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
cuda=OFF
command -v nvcc >/dev/null && cuda=ON
dir=${STEPGRAPH_BUILD_DIR:-build}/run-$cuda
# Quiet unless something fails: CMake's output goes to logs in the build folder, shown
# only when configuring or building fails; a line says when there is something to build.
mkdir -p "$dir"
if [[ ! -f $dir/build.ninja ]]; then
  echo "stepgraph: configuring $dir (first run)" >&2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_WITH_CUDA=$cuda \
        -DSTEPGRAPH_BUILD_TESTS=OFF -DSTEPGRAPH_BUILD_BENCH=OFF > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log" >&2; exit 1; }
fi
plan=$(cmake --build "$dir" --target stepgraph -- -n 2>/dev/null || true)
[[ $plan == *"no work to do"* ]] ||
  echo "stepgraph: building $dir/stepgraph (log: $dir/build.log)" >&2
cmake --build "$dir" -j "${STEPGRAPH_JOBS:-$(nproc)}" --target stepgraph > "$dir/build.log" 2>&1 ||
  { cat "$dir/build.log" >&2; exit 1; }
if (($# == 0)); then
  if model=$(tests/fixtures/fetch_smollm2.sh); then
    exec "$dir/stepgraph" run --model "$model" --chat --prompt "What is the capital of France?" \
         --max-new-tokens 64
  fi
  echo "stepgraph: could not fetch SmolLM2; running the built-in model (random weights)" >&2
fi
exec "$dir/stepgraph" "$@"
