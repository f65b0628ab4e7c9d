#!/usr/bin/env bash
# stepgraph against llama.cpp on Qwen3 files, on one GPU: a Qwen3-8B-shaped file and a
# mixture of experts with Qwen3-30B-A3B's layers (128 experts, 8 chosen; 12 of its 48
# layers, so that the files fit the machine's disk), random weights written as llama.cpp's
# converter writes them (BF16 matrices, F32 norms and router), each also quantized to
# Q4_K_M by llama.cpp's llama-quantize. For each file: decode ms/token at batch 1 of both
# programs, the ratio, and both against the floor of the weight bytes a token reads (the
# chosen experts only); prefill of 512 tokens (tokens/s of both, the ratio) and the GPU
# memory each used. family_peer.py has the details.
#
# llama.cpp's build and the prepared sources are gguf_peer.sh's (the same tools):
#
#   bench/peers/gguf_peer.sh prepare        # here: .peer-deps/ (once)
#   bench/peers/family_peer.sh build        # GPU machine, call 1: llama.cpp in the
#                                           # background, stepgraph and the BF16 files
#   bench/peers/family_peer.sh run [FILES]  # GPU machine, call 2: waits for the build,
#                                           # quantizes, measures, prints the table
#   bench/peers/family_peer.sh table        # the table again from the saved results
#   bench/peers/family_peer.sh selftest     # here: small files of both families written
#                                           # and run by stepgraph's CPU reference
#
# FILES: comma-separated among qwen3-8b-bf16, qwen3-8b-q4_k_m, qwen3-moe-bf16,
# qwen3-moe-q4_k_m (default all); results add up in $SG_PEER_WORK/family_results.json.
# Environment as gguf_peer.sh's, and FAMILY_MOE_LAYERS (layers of the MoE file, default 12).
source "$(dirname "$0")/gguf_peer.sh"
family=$root/bench/peers/family_peer.py
moe_layers=(${FAMILY_MOE_LAYERS:+--moe-layers "$FAMILY_MOE_LAYERS"})

case ${1:-} in
  build)
    t0=$(date +%s)
    start_builds
    "$py" "$family" write --out "$work/files" "${moe_layers[@]}" || die "writing the files failed"
    echo "family_peer: stepgraph built and the BF16 files written in $(( $(date +%s) - t0 )) s"
    ;;
  run)
    ready_to_run
    "$py" "$family" run --work "$work" --logs "$out" --stepgraph "${SG_BUILD:-/tmp/b}/stepgraph" \
      --llama-bin "$llama_build_dir/build/bin" --files "${2:-all}" "${moe_layers[@]}"
    cp -f "$work/family_results.json" "$out/" 2>/dev/null
    ;;
  table)
    "$py" "$family" table --work "$work"
    ;;
  selftest)
    gguf_path
    "$py" "$family" selftest --work "$work/selftest-family" \
      --stepgraph "${SG_BUILD:-$root/build/nocuda}/stepgraph"
    ;;
  *)
    sed -n '2,/^source /p' "$0" | sed '$d'
    exit 2
    ;;
esac
