#!/usr/bin/env bash
# Builds stepgraph and runs every test. With nvcc present it builds the CUDA targets too
# (GPU tests skip when no device is found), and it always builds and tests the CUDA-free
# configuration, which is what a machine without the toolkit gets.
# Build folders: build/cuda and build/nocuda (override build/ with STEPGRAPH_BUILD_DIR).
#
# STEPGRAPH_CONFIGS="cuda nocuda" picks the configurations (default: both with nvcc, else
# nocuda). STEPGRAPH_SANITIZE_NOCUDA=1 builds the CUDA-free configuration with ASan and
# UBSan instead (-O1 with line tables, in build/sanitize) and runs everything that tests
# it under them: every ctest suite, the find_package consumer, pytest and cargo test. A
# sanitizer report fails the test that made it. CI runs this way (the CUDA build's run
# covers the optimised host code); tools/sanitize.sh is it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
root=${STEPGRAPH_BUILD_DIR:-build}
jobs=${STEPGRAPH_JOBS:-$(nproc)}
configs=(nocuda)
command -v nvcc >/dev/null && configs=(cuda nocuda)
[[ -n ${STEPGRAPH_CONFIGS:-} ]] && read -ra configs <<<"$STEPGRAPH_CONFIGS"
sanitize=${STEPGRAPH_SANITIZE_NOCUDA:-}
[[ $sanitize == 0 ]] && sanitize=""

# The build folder of a configuration.
dir_of() {
  if [[ $1 == nocuda && -n $sanitize ]]; then echo "$root/sanitize"; else echo "$root/$1"; fi
}

if [[ -n $sanitize ]]; then
  # Tests that check allocation failure ask for more than exists: let malloc say no.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # Python and a cargo test binary are not built with the sanitizers, but load
  # libstepgraph_c.so, which is: their runtimes have to come first. The interpreter's own
  # allocations are not ours to leak-check.
  sg_preload="$(c++ -print-file-name=libasan.so):$(c++ -print-file-name=libubsan.so)"
  sg_host_asan="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0"
fi

for c in "${configs[@]}"; do
  dir=$(dir_of "$c")
  args=(-DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_WERROR=ON)
  [[ $c == cuda ]] && args+=(-DSTEPGRAPH_WITH_CUDA=ON) || args+=(-DSTEPGRAPH_WITH_CUDA=OFF)
  # The benchmarks build once, in the first configuration (with CUDA when there is nvcc).
  [[ $c == "${configs[0]}" ]] && args+=(-DSTEPGRAPH_BUILD_BENCH=ON) || args+=(-DSTEPGRAPH_BUILD_BENCH=OFF)
  what=$c
  if [[ $c == nocuda && -n $sanitize ]]; then
    what="nocuda, ASan+UBSan"
    # -O1 with line tables only (-g1): reports keep file and line, and the build takes
    # about half as long as -O2 -g.
    args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPGRAPH_WITH_CUDA=OFF -DSTEPGRAPH_SANITIZE=ON
          -DSTEPGRAPH_BUILD_BENCH=OFF -DSTEPGRAPH_WERROR=ON
          "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
          "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
  fi
  echo "== stepgraph: build ($what) in $dir" >&2
  cmake -S . -B "$dir" -G Ninja "${args[@]}" >&2
  cmake --build "$dir" -j "$jobs"
  echo "== stepgraph: test ($what)" >&2
  # Under the sanitizers the server's load run (tests/tools/serve_test.py) costs several
  # times its release time (the runtime's bookkeeping is instrumented; the block loops are
  # not, see base/CMakeLists.txt): 48 requests, 16 at a time, keep its check of slots and
  # memory within CI's time.
  [[ $c == nocuda && -n $sanitize ]] && export SG_SERVE_LOAD=${SG_SERVE_LOAD:-48}
  (cd "$dir" && ctest --no-tests=error --output-on-failure -j "$jobs")
done
# ---- package (begin): the CUDA-free build installed and used through find_package ----
echo "== stepgraph: find_package(stepgraph) consumer (nocuda)" >&2
tools/package_test.sh "$(dir_of nocuda)"
# ---- package (end) ----
# ---- bindings (begin): the Python package, Rust crate and Go package over each C ABI ----
# pytest (python/tests), cargo test (rust/) and go vet + go test (go/), offline; the
# signature check runs in ctest and in pytest. GPU cases skip without a device.
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
command -v go >/dev/null || sg_apt golang-go
# STEPGRAPH_BINDINGS_CONFIGS narrows the configurations the bindings are tested against
# (CI: nocuda only, where the stub and the CPU fallbacks run; without a GPU the CUDA
# build's library adds nothing the nocuda run does not cover).
for c in ${STEPGRAPH_BINDINGS_CONFIGS:-${configs[@]}}; do
  lib_dir=$(cd "$(dir_of "$c")" && pwd)
  host_env=()
  if [[ $c == nocuda && -n $sanitize ]]; then
    # STEPGRAPH_TEST_SANITIZED: the real-model generation tests make a few tokens, not 32.
    host_env=(env "LD_PRELOAD=$sg_preload" "ASAN_OPTIONS=$sg_host_asan" STEPGRAPH_TEST_SANITIZED=1)
    echo "== stepgraph: Python, Rust and Go bindings ($c, ASan+UBSan)" >&2
  else
    echo "== stepgraph: Python, Rust and Go bindings ($c)" >&2
  fi
  STEPGRAPH_LIB_DIR=$lib_dir "${host_env[@]}" python3 -m pytest -q python/tests
  if command -v cargo >/dev/null; then
    # The runner wraps only the test binaries: cargo and rustc run as they are.
    runner=()
    if ((${#host_env[@]})); then
      host=$(rustc -vV | sed -n 's/^host: //p')
      host=${host//-/_}
      runner=("CARGO_TARGET_${host^^}_RUNNER=${host_env[*]}")
    fi
    env "${runner[@]}" STEPGRAPH_LIB_DIR=$lib_dir CARGO_TARGET_DIR="$lib_dir/rust-target" \
      cargo test --offline -q --manifest-path rust/Cargo.toml
  else
    echo "stepgraph: cargo not found; the Rust crate's tests did not run" >&2
    exit 1
  fi
  # Go links the folder named in CGO_LDFLAGS, with an rpath (go/README.md); -exec wraps only
  # the test binary, as cargo's runner does. -count=1: the go command's test cache does not
  # see the libraries change.
  go_exec=()
  ((${#host_env[@]})) && go_exec=(-exec "${host_env[*]}")
  (cd go && export STEPGRAPH_LIB_DIR=$lib_dir CGO_LDFLAGS="-L$lib_dir -Wl,-rpath,$lib_dir" \
     GOCACHE="$lib_dir/go-cache" GOFLAGS=-mod=mod GOPROXY=off GOWORK=off &&
   go vet ./... && go test -count=1 "${go_exec[@]}" ./...)
done
# The README's Python and Rust sections as a user runs them: pip install into a venv and a
# crate depending on rust/ by path, outside the checkout, programs run with no environment
# (tools/install_test.sh). One CPU-only build of the two C libraries, shared by both.
python3 -c "import ensurepip" 2>/dev/null || sg_apt python3-venv
STEPGRAPH_WITH_CUDA=OFF tools/install_test.sh
# ---- bindings (end) ----
# ---- peers (begin): the GPU peer scripts' self-tests, on the CPU reference ----
# bench/peers/*.sh run on the GPU machine, where a broken parser or file writer costs
# device time: tools/peer_selftest.sh checks them here with the first configuration's
# program (the gguf package reads and writes the files; it needs PyYAML).
if ! python3 -c "import numpy, yaml" 2>/dev/null; then
  python3 -m pip install -q numpy pyyaml >&2 2>/dev/null || sg_apt python3-numpy python3-yaml
fi
echo "== stepgraph: the peer scripts' self-tests (${configs[0]})" >&2
tools/peer_selftest.sh "$(dir_of "${configs[0]}")"
# ---- peers (end) ----
