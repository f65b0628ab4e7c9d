#!/usr/bin/env bash
# `stepgraph serve` against llama.cpp's llama-server on the same GGUF files, on one GPU, both
# driven by one load generator (serve_peer.py): streamed completions at 1, 4, 16 and 64
# concurrent streams, greedy, 128 tokens each (end-of-sequence ignored by both, so answers
# are equally long), a different ~130-token prompt each; total tokens/s, p50/p99 time to
# first token and time per output token. Both servers get 16 slots (llama-server -np 16,
# continuous batching on) and 1,024 positions a slot; at 64 streams the rest wait in each
# server's queue. Files: the Llama-3.2-1B-shaped F16 file gguf_peer.sh writes, its Q4_K_M
# from llama-quantize, and the real SmolLM2-135M Q4_1 file where the tests' cache holds it.
#
# The GPU machine has no network: llama.cpp's sources come from gguf_peer.sh prepare
# (.peer-deps/), and Debian's cpp-httplib with what its pkg-config file requires from
# .device-deps/ (tools/gpu_check.sh unpacks them):
#   (cd .device-deps && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev
#    libssl3 zlib1g-dev libbrotli-dev libbrotli1)
#
#   bench/peers/serve_peer.sh prepare      # here: gguf_peer.sh prepare
#   bench/peers/serve_peer.sh build        # GPU machine, call 1: llama-server and
#                                          # llama-quantize in the background, stepgraph and
#                                          # the F16 file meanwhile
#   bench/peers/serve_peer.sh run [FILES]  # GPU machine, call 2: waits for the build,
#                                          # quantizes, measures, prints the table
#   bench/peers/serve_peer.sh table        # the table again from the saved results
#   bench/peers/serve_peer.sh selftest     # here: the load generator against stepgraph
#                                          # serve on the CPU with SmolLM2 (small counts)
#
# FILES: comma-separated f16,q4_k_m,smollm2 (default all). Environment as gguf_peer.sh's,
# and SERVE_PEER_ARGS: more arguments for serve_peer.py run (e.g. "--seconds 60").
llama_build_dir=${SG_PEER_WORK:-/tmp/gguf-peer}/llama-server-build
llama_bins=(llama-server llama-quantize)
llama_cmake_extra="-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
source "$(dirname "$0")/gguf_peer.sh"
loadgen=$root/bench/peers/serve_peer.py
smollm2="${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf"

# The files named in $1 (f16, q4_k_m, smollm2), made where missing.
files_for() {
  local list=() f
  for f in ${1//,/ }; do
    case $f in
      f16)
        [[ -f $work/files/f16.gguf ]] ||
          "$py" "$helper" write --out "$work/files/f16.gguf" || die "writing the F16 file failed"
        list+=("$work/files/f16.gguf") ;;
      q4_k_m)
        [[ -f $work/files/f16.gguf ]] || files_for f16 > /dev/null
        [[ -f $work/files/q4_k_m.gguf ]] ||
          "$llama_build_dir/build/bin/llama-quantize" "$work/files/f16.gguf" \
            "$work/files/q4_k_m.gguf" Q4_K_M > "$out/quantize-q4_k_m.log" 2>&1 ||
          die "llama-quantize Q4_K_M failed (log $out/quantize-q4_k_m.log)"
        list+=("$work/files/q4_k_m.gguf") ;;
      smollm2)
        if [[ -f $smollm2 ]]; then list+=("$smollm2"); else
          echo "serve_peer: $smollm2 missing (tools/gpu_check.sh installs it from" \
               ".device-model/): skipped" >&2
        fi ;;
      *) die "unknown file '$f' (f16, q4_k_m, smollm2)" ;;
    esac
  done
  (IFS=,; echo "${list[*]}")
}

case ${1:-} in
  prepare)
    prepare
    ;;
  build)
    t0=$(date +%s)
    start_builds
    files_for f16 > /dev/null
    echo "serve_peer: stepgraph built and the F16 file written in $(( $(date +%s) - t0 )) s"
    ;;
  run)
    ready_to_run
    files=$(files_for "${2:-f16,q4_k_m,smollm2}") || exit 1
    # shellcheck disable=SC2086
    "$py" "$loadgen" run --stepgraph "${SG_BUILD:-/tmp/b}/stepgraph" \
      --llama-bin "$llama_build_dir/build/bin" --files "$files" --work "$work" --logs "$out" \
      ${SERVE_PEER_ARGS:-}
    cp -f "$work/serve_results.json" "$out/" 2>/dev/null
    ;;
  table)
    "$py" "$loadgen" table --work "$work"
    ;;
  selftest)
    [[ -f $smollm2 ]] || die "no $smollm2: tests/fixtures/fetch_smollm2.sh fetches it"
    rm -f "$work/selftest-serve/serve_results.json"
    "$py" "$loadgen" run --stepgraph "${SG_BUILD:-$root/build/nocuda}/stepgraph" \
      --files "$smollm2" --work "$work/selftest-serve" --logs "$work/selftest-serve" \
      --concurrency 1,4 --seconds 3 --max-tokens 8 --prompt-words 8 --slots 4 --context 256 \
      --stepgraph-flags=--cpu
    ;;
  *)
    sed -n '2,/^llama_build_dir=/p' "$0" | sed '$d'
    exit 2
    ;;
esac
