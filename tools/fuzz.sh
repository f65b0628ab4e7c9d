#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan, CUDA off, and
# runs each from its committed seed corpus for a bounded time. New inputs go to a scratch
# folder, so the committed corpus only changes by hand. A crash, leak, hang or sanitizer
# report fails the run and leaves the input under $build/artifacts/; once the library is
# fixed, that input goes into tests/fuzz/corpus/<harness>/crash_<what>, where ctest replays it.
# Usage: tools/fuzz.sh [seconds per harness (default 60)] [harness names...]
# Build folder: build/fuzz (override with STEPGRAPH_FUZZ_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(safetensors config builder gguf tokenizer tokenizer_json)
build=${STEPGRAPH_FUZZ_BUILD_DIR:-build/fuzz}
jobs=${STEPGRAPH_JOBS:-$(nproc)}
cxx=${STEPGRAPH_FUZZ_CXX:-clang++}
cc=${STEPGRAPH_FUZZ_CC:-clang}
source tools/deps.sh
# libFuzzer comes with clang's runtime package; install both from Debian when missing.
if [[ -z ${STEPGRAPH_FUZZ_CXX:-} ]]; then
  fuzz_missing=()
  for p in clang libclang-rt-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || fuzz_missing+=("$p")
  done
  if ((${#fuzz_missing[@]})); then
    echo "fuzz: installing ${fuzz_missing[*]}" >&2
    fuzz_sudo=""
    [[ $(id -u) -ne 0 ]] && fuzz_sudo="sudo"
    $fuzz_sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $fuzz_sudo apt-get install -y -q --no-install-recommends \
      "${fuzz_missing[@]}" >&2
  fi
fi
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (install clang and libclang-rt-dev)" >&2; exit 1; }

echo "== stepgraph: fuzz build in $build" >&2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_COMPILER="$cc" -DSTEPGRAPH_WITH_CUDA=OFF -DSTEPGRAPH_FUZZ=ON \
  -DSTEPGRAPH_BUILD_TESTS=OFF -DSTEPGRAPH_BUILD_BENCH=OFF >&2
cmake --build "$build" -j "$jobs" --target "${names[@]/#/fuzz_}"

mkdir -p "$build/artifacts"
status=0
for name in "${names[@]}"; do
  scratch=$(mktemp -d)
  echo "== stepgraph: fuzz $name for ${seconds}s" >&2
  # -rss_limit_mb also bounds any single allocation (malloc_limit defaults to it).
  # -max_len: inputs may grow to 256 KiB, where nesting, long special tokens and long runs
  # of marks are deep and long enough to matter (the default is the largest seed's size).
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$build/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=2048 \
         -max_len=262144 -timeout=10 -print_final_stats=1 \
         -artifact_prefix="$build/artifacts/$name-" \
         "$scratch" "tests/fuzz/corpus/$name" 2> "$build/fuzz_$name.log"; then
    echo "fuzz: $name FAILED; log $build/fuzz_$name.log, inputs $build/artifacts/$name-*" >&2
    tail -n 60 "$build/fuzz_$name.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/fuzz_$name.log" |
      sed "s/^/fuzz: $name /" >&2 || true
  fi
  rm -rf "$scratch"
done
exit $status
