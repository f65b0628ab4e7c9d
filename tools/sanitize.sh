#!/usr/bin/env bash
# Builds the CUDA-free configuration with ASan and UBSan (STEPGRAPH_SANITIZE) and runs the
# suites of what reads untrusted input (config, safetensors, GGUF, tokenizer, builder,
# planner, executor) and the fuzz corpus replays. Any sanitizer report fails a test. STEPGRAPH_SANITIZE_ALL=1
# builds and runs every suite instead (several times longer on two cores).
# Build folder: build/sanitize (override with STEPGRAPH_SANITIZE_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
build=${STEPGRAPH_SANITIZE_BUILD_DIR:-build/sanitize}
jobs=${STEPGRAPH_JOBS:-$(nproc)}
echo "== stepgraph: ASan+UBSan build in $build" >&2
# -O1 with line tables only (-g1): reports keep file and line, and the build is much
# faster than -O2 -g.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPGRAPH_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DSTEPGRAPH_SANITIZE=ON -DSTEPGRAPH_BUILD_BENCH=OFF >&2
targets=()
if [[ -z ${STEPGRAPH_SANITIZE_ALL:-} ]]; then
  targets=(--target graph_test executor_test models_test gguf_test tokenizer_test
           fuzz_safetensors_replay fuzz_config_replay fuzz_builder_replay fuzz_gguf_replay
           fuzz_tokenizer_replay)
fi
cmake --build "$build" -j "$jobs" "${targets[@]}"
echo "== stepgraph: ASan+UBSan tests" >&2
# Tests that check allocation failure ask for more than exists: let malloc say no.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
filter=()
[[ -z ${STEPGRAPH_SANITIZE_ALL:-} ]] && filter=(-R "^(fuzz_corpus|Builder|Graph|MemoryPlan|Executor|Mock|Safetensors|Config|Gguf|Tokenizer|ChatTemplate|SmolLM2Tokenizer)")
(cd "$build" && ctest --no-tests=error --output-on-failure -j "$jobs" "${filter[@]}")
