#!/usr/bin/env bash
# Runs on the GPU machine a program built here, so that a short call spends no device
# time building. A cold build of the kernels there takes 150-200 s of a lease (its longest
# steps are single .cu files); here it costs nothing but waiting.
#
#   tools/gpu_prebuilt.sh pack BUILD_DIR TARGET...   # here: each TARGET (a path under
#        BUILD_DIR: stepgraph, bench/quant_bench, tests/cuda_quant_test) xz-compressed
#        into .gpu-bin/, and the Debian packages of its shared libraries into .device-deps/
#   tools/gpu_prebuilt.sh run NAME [ARGS...]         # GPU machine: NAME (the target's
#        file name) unpacked and run with ARGS, its libraries found in the packages
#
# Carry .gpu-bin and .device-deps (both ignored: list them in .git/info/exclude). Each
# program links every kernel statically (30-35 MB compressed), and a call carries at
# most 64 MiB with the tree: one program a call. The build here must target the GPU's
# architecture (the default, sm_90, is the H100's and the H200's).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=(libabsl20220623 libpcre2-8-0 libbenchmark1debian)
case ${1:-} in
  pack)
    [[ $# -ge 3 ]] || { sed -n '2,/^set /p' "$0" | sed '$d'; exit 2; }
    build=$2
    shift 2
    mkdir -p .gpu-bin .device-deps
    rm -f .gpu-bin/*.xz
    for target in "$@"; do
      [[ -x $build/$target ]] || { echo "gpu_prebuilt: no program $build/$target" >&2; exit 1; }
      xz -T0 -6 -c "$build/$target" > ".gpu-bin/$(basename "$target").xz"
    done
    (cd .device-deps && for d in "${debs[@]}"; do
       ls "${d}"_*.deb > /dev/null 2>&1 || apt-get download "$d" > /dev/null
     done)
    du -sh .gpu-bin .device-deps
    bytes=$(( $(du -sb .gpu-bin | cut -f1) + $(du -sb .device-deps | cut -f1) +
              $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) ))
    if (( bytes > 64 * 1024 * 1024 )); then
      echo "gpu_prebuilt: $((bytes >> 20)) MiB with the tree: more than one call carries" >&2
      exit 1
    fi
    ;;
  run)
    [[ $# -ge 2 ]] || { sed -n '2,/^set /p' "$0" | sed '$d'; exit 2; }
    name=$2
    shift 2
    mkdir -p /tmp/deps /tmp/prebuilt
    for f in .device-deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    [[ -f .gpu-bin/$name.xz ]] || { echo "gpu_prebuilt: no .gpu-bin/$name.xz carried" >&2; exit 1; }
    xz -T0 -dc ".gpu-bin/$name.xz" > "/tmp/prebuilt/$name"
    chmod +x "/tmp/prebuilt/$name"
    if ldd "/tmp/prebuilt/$name" | grep "not found" >&2; then
      echo "gpu_prebuilt: $name lacks the libraries above (add their packages to debs)" >&2
      exit 1
    fi
    exec "/tmp/prebuilt/$name" "$@"
    ;;
  *)
    sed -n '2,/^set /p' "$0" | sed '$d'
    exit 2
    ;;
esac
