#!/usr/bin/env bash
# stepgraph against llama.cpp on the same GGUF files, on one GPU: a Llama-3.2-1B-shaped
# model with random weights written as llama.cpp's converter writes it (F16 matrices, F32
# norms), quantized by llama.cpp's own llama-quantize (Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K),
# and the real SmolLM2-135M Q4_1 file where the tests' cache holds it. For each file:
# decode ms/token at batch 1, tokens/s at batch 4 and 16, prefill tokens/s at 512 and
# 2,048 tokens, the ratios, and the GPU memory each program used.
#
# The GPU machine has no network: llama.cpp's sources come from the llama-cpp-python
# sdist (PyPI; its vendor/llama.cpp) and the gguf package from its wheel, both put in
# .peer-deps/ (ignored by git) by `prepare` on a machine that has PyPI.
#
#   bench/peers/gguf_peer.sh prepare      # here: .peer-deps/ (sdist trimmed, gguf wheel)
#   bench/peers/gguf_peer.sh build        # GPU machine, call 1: llama.cpp in the background
#                                         # (setsid), stepgraph and the F16 file meanwhile
#   bench/peers/gguf_peer.sh run [FILES]  # GPU machine, call 2: waits for the build,
#                                         # quantizes, measures, prints the table
#   bench/peers/gguf_peer.sh table        # the table again from the saved results
#   bench/peers/gguf_peer.sh selftest     # here: parses the peers' sample outputs, writes a
#                                         # small file and runs stepgraph on it (CPU); with
#                                         # LLAMA_BIN (llama.cpp's tools built for the CPU)
#                                         # also the whole run on small files
#
# FILES is a comma-separated subset of f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k,smollm2 (default
# all): a run that does not fit one call can be split, the results add up in
# $SG_PEER_WORK/results.json. Logs go to $OUT (or $SG_PEER_WORK/logs).
# Environment: SG_PEER_WORK (default /tmp/gguf-peer: files, builds, results),
# SG_TARGETS (more of stepgraph's targets for `build` to build beside the program),
# SG_BUILD (stepgraph's build folder, default /tmp/b as tools/gpu_check.sh uses),
# LLAMA_JOBS (default 10), PYTHON (default python3), LLAMA_BIN (selftest),
# SG_PEER_PREFILL (prompt lengths of the prefill rows, default 512,2048), SG_PEER_ALT
# (flags of a second stepgraph decode run per file, reported beside the first, e.g.
# "--block-gemv-precision int16").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
deps=$root/.peer-deps
work=${SG_PEER_WORK:-/tmp/gguf-peer}
out=${OUT:-$work/logs}
py=${PYTHON:-python3}
helper=$root/bench/peers/gguf_peer.py
mkdir -p "$work" "$out"

die() { echo "gguf_peer: $*" >&2; exit 1; }

# The gguf package where Python has it, else from the prepared wheel, on PYTHONPATH
# (nothing installed system-wide).
gguf_path() {
  "$py" -c "import gguf" 2>/dev/null && return 0  # installed, or on PYTHONPATH already
  local lib=$work/pylib
  if [[ ! -d $lib/gguf ]]; then
    local wheel
    wheel=$(ls "$deps"/gguf-*.whl 2>/dev/null | head -1)
    [[ -n $wheel ]] || die "no gguf wheel in $deps: run '$0 prepare' where PyPI is reachable"
    # A pure-Python wheel is a zip of the package: unpacked, it imports.
    "$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
      "$wheel" "$lib" || die "cannot unpack $wheel"
  fi
  export PYTHONPATH=$lib${PYTHONPATH:+:$PYTHONPATH}
}

prepare() {
  local tmp
  tmp=$(mktemp -d)
  mkdir -p "$deps"
  rm -f "$deps"/llama.cpp.tar.gz "$deps"/gguf-*.whl
  "$py" -m pip download -q --no-binary :all: --no-deps -d "$tmp" \
    "llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}" ||
    die "pip download llama-cpp-python failed"
  "$py" -m pip download -q --only-binary :all: --no-deps -d "$deps" gguf ||
    die "pip download gguf failed"
  local sdist
  sdist=$(ls "$tmp"/llama_cpp_python-*.tar.gz | head -1)
  tar xzf "$sdist" -C "$tmp" || die "cannot unpack $sdist"
  local src
  src=$(ls -d "$tmp"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  # What the CUDA build of llama-bench, llama-batched-bench, llama-quantize and
  # llama-server (serve_peer.sh) does not read: models, docs, tests, examples, the web UI's
  # sources (its CMake file and templates stay: llama-server embeds no UI without them),
  # the app and every ggml backend but the CPU's and CUDA's (vendor/ stays: its CMakeLists
  # is always read).
  (cd "$src" && rm -rf models docs media tests examples pocs benches app \
                       tools/server/public* .github &&
   find tools/ui -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name 'ui.*.in' \
     ! -name sources.cmake -exec rm -rf {} +) || die "cannot trim $src"
  for b in "$src"/ggml/src/ggml-*/; do
    case $(basename "$b") in ggml-cpu|ggml-cuda) ;; *) rm -rf "$b" ;; esac
  done
  tar czf "$deps/llama.cpp.tar.gz" -C "$(dirname "$src")" llama.cpp || die "cannot pack"
  echo "$(basename "$sdist") sha256 $(sha256sum "$sdist" | cut -d' ' -f1)" > "$deps/SOURCE"
  rm -rf "$tmp"
  local bytes
  bytes=$(du -cb "$deps" | tail -1 | cut -f1)
  (( bytes < 48 * 1024 * 1024 )) || die "$deps holds $bytes bytes; a call carries 64 MiB in all"
  echo "gguf_peer: $deps ready: $(cat "$deps/SOURCE");" \
       "$(ls "$deps" | tr '\n' ' ')($((bytes / 1024)) KiB)"
}

# serve_peer.sh sources this file and sets these three for its llama-server build.
llama_build_dir=${llama_build_dir:-$work/llama-build}
[[ -n ${llama_bins+x} ]] || llama_bins=(llama-bench llama-batched-bench llama-quantize)
llama_cmake_extra=${llama_cmake_extra:--DLLAMA_BUILD_SERVER=OFF}

# llama.cpp with CUDA, in the background (setsid: it outlives this call while the machine
# stays warm); its log and exit status land in $llama_build_dir.
start_llama_build() {
  [[ -f $llama_build_dir/rc && $(cat "$llama_build_dir/rc") == 0 ]] && return 0
  if [[ -f $llama_build_dir/pid ]] && kill -0 "$(cat "$llama_build_dir/pid")" 2>/dev/null; then
    echo "gguf_peer: llama.cpp build already running"
    return 0
  fi
  [[ -f $deps/llama.cpp.tar.gz ]] || die "no $deps/llama.cpp.tar.gz: run '$0 prepare' here first"
  rm -rf "$llama_build_dir" && mkdir -p "$llama_build_dir"
  tar xzf "$deps/llama.cpp.tar.gz" -C "$llama_build_dir" || die "cannot unpack llama.cpp"
  local src=$llama_build_dir/llama.cpp b=$llama_build_dir/build
  setsid bash -c "
    t0=\$(date +%s)
    cmake -S '$src' -B '$b' -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $llama_cmake_extra \
      -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_CCACHE=OFF \
      > '$llama_build_dir/configure.log' 2>&1 &&
    cmake --build '$b' -j ${LLAMA_JOBS:-10} --target ${llama_bins[*]} \
      > '$llama_build_dir/build.log' 2>&1
    rc=\$?
    echo \$(( \$(date +%s) - t0 )) > '$llama_build_dir/seconds'
    echo \$rc > '$llama_build_dir/rc'
  " < /dev/null > /dev/null 2>&1 &
  echo $! > "$llama_build_dir/pid"
  echo "gguf_peer: llama.cpp build started (log $llama_build_dir/build.log)"
}

wait_llama_build() {
  local waited=0
  while [[ ! -f $llama_build_dir/rc ]]; do
    [[ -f $llama_build_dir/pid ]] || die "llama.cpp was never built: run '$0 build' first"
    kill -0 "$(cat "$llama_build_dir/pid")" 2>/dev/null ||
      [[ -f $llama_build_dir/rc ]] || die "the llama.cpp build died without a status"
    sleep 5
    waited=$((waited + 5))
  done
  if [[ $(cat "$llama_build_dir/rc") != 0 ]]; then
    tail -30 "$llama_build_dir/configure.log" "$llama_build_dir/build.log" 2>/dev/null
    die "the llama.cpp build failed"
  fi
  ((waited > 0)) && echo "gguf_peer: waited ${waited} s for the llama.cpp build"
  echo "gguf_peer: llama.cpp built in $(cat "$llama_build_dir/seconds") s"
}

build_stepgraph() {
  # tools/gpu_check.sh unpacks the carried Debian packages, installs the SmolLM2 parts
  # carried in .device-model/ and builds; 'none' runs no test. SG_TARGETS adds targets
  # (test programs, benches) to the same build, so that one call builds what the lease
  # runs beside the peers.
  SG_TARGETS="stepgraph ${SG_TARGETS:-}" OUT=$out tools/gpu_check.sh none > "$out/stepgraph-build.log" 2>&1 ||
    { tail -30 "$out/stepgraph-build.log"; die "stepgraph build failed"; }
  grep -E "^build:|^model:" "$out/stepgraph-build.log"
}

device_env() {
  # As tools/gpu_check.sh sets it: the carried Abseil is a shared library.
  [[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ]] &&
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  return 0
}

# A build call's start: llama.cpp in the background, stepgraph meanwhile.
start_builds() {
  start_llama_build
  build_stepgraph
  gguf_path
}

# A run call's start: the gguf package, stepgraph (built if the machine lost it) and
# llama.cpp's build done.
ready_to_run() {
  gguf_path
  device_env
  [[ -x ${SG_BUILD:-/tmp/b}/stepgraph ]] || build_stepgraph
  device_env
  wait_llama_build
}

# Sourced (serve_peer.sh): the functions only.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

case ${1:-} in
  prepare)
    prepare
    ;;
  build)
    t0=$(date +%s)
    start_builds
    "$py" "$helper" write --out "$work/files/f16.gguf" || die "writing the F16 file failed"
    llama_state="still building"
    [[ -f $llama_build_dir/rc ]] && llama_state="done (rc $(cat "$llama_build_dir/rc"))"
    echo "gguf_peer: stepgraph built and the F16 file written in $(( $(date +%s) - t0 )) s;" \
         "llama.cpp: $llama_state"
    ;;
  run)
    ready_to_run
    [[ -f $work/files/f16.gguf ]] ||
      "$py" "$helper" write --out "$work/files/f16.gguf" || die "writing the F16 file failed"
    "$py" "$helper" run --work "$work" --logs "$out" --stepgraph "${SG_BUILD:-/tmp/b}/stepgraph" \
      --llama-bin "$llama_build_dir/build/bin" --files "${2:-all}" \
      --llama-source "$(cut -d' ' -f1 "$deps/SOURCE" 2>/dev/null || echo '?')" \
      --prefill "${SG_PEER_PREFILL:-512,2048}" --sg-alt "${SG_PEER_ALT:-}"
    cp -f "$work/results.json" "$out/" 2>/dev/null
    ;;
  table)
    "$py" "$helper" table --work "$work"
    ;;
  selftest)
    # Where llama.cpp's tools are built for the CPU (LLAMA_BIN), the whole run on a small
    # file: llama-quantize's files read by stepgraph, every tool's real output parsed.
    gguf_path
    sg=${SG_BUILD:-$root/build/nocuda}/stepgraph
    "$py" "$helper" selftest --work "$work/selftest" --stepgraph "$sg" || exit 1
    if [[ -n ${LLAMA_BIN:-} ]]; then
      rm -rf "$work/selftest-run"
      "$py" "$helper" run --shape small --work "$work/selftest-run" \
        --logs "$work/selftest-run/logs" --stepgraph "$sg" --llama-bin "$LLAMA_BIN" \
        --prefill 64,128 --files "${2:-f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k}"
    fi
    ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed '$d'
    exit 2
    ;;
esac
