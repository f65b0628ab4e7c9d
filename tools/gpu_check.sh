#!/usr/bin/env bash
# One call on the GPU machine: build, run the tests (GPU suites included) and the
# benchmarks, write every log under $OUT (or /tmp/sg-out), and print a short table last.
# The machine has no Abseil: Debian's packages are carried in .device-deps/ and unpacked
# under /tmp/deps (fetch them with:
#   mkdir -p .device-deps && (cd .device-deps && apt-get download libabsl-dev libabsl20220623 nlohmann-json3-dev libpcre2-dev libpcre2-8-0)
# and, for `stepgraph serve` (without them it builds without HTTP), cpp-httplib with what its
# pkg-config file requires: apt-get download libcpp-httplib-dev libcpp-httplib0.11 libssl-dev
# libssl3 zlib1g-dev libbrotli-dev libbrotli1).
# The real SmolLM2 file is larger than one call may carry: split it into .device-model/
# (split -b 50000000 -d FILE part-; its sha256 in .device-model/SHA256; the tokenizer
# fixtures as extras.tgz) and carry the parts in consecutive calls while the machine stays
# warm; each call keeps what it was given under /tmp/model-parts and installs the file in
# the tests' cache folder once the parts add up to the checksum.
# Usage: tools/gpu_check.sh [tests|bench|check|sanitize|all|none] [ctest -R regex]
#        [benchmark filter]    (check: tests and benchmarks, without the sanitizers)
# Environment: SG_TARGETS (targets to build), SG_BENCHES (benchmarks to run), SG_CTEST_JOBS
# (tests at once, default 4),
# SG_BENCH_TIMEOUT (seconds per benchmark, default 240), SG_SANITIZE_TIMEOUT (seconds per
# compute-sanitizer run, default 300).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
test_filter=${2:-}
bench_filter=${3:-.}
out=${OUT:-/tmp/sg-out}
mkdir -p "$out"
if [[ -d .device-deps ]]; then
  mkdir -p /tmp/deps
  for f in .device-deps/*.deb; do dpkg -x "$f" /tmp/deps; done
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # PCRE2's pkg-config file names /usr; the sysroot points it at the unpacked copy.
  export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
  prefix=(-DCMAKE_PREFIX_PATH=/tmp/deps/usr)
else
  prefix=()
fi
if [[ -d .device-model ]]; then
  mkdir -p /tmp/model-parts
  cp -f .device-model/* /tmp/model-parts/ 2>/dev/null
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph-test"
  mkdir -p "$cache"
  [[ -f /tmp/model-parts/extras.tgz ]] && tar xzf /tmp/model-parts/extras.tgz -C "$cache"
  if [[ -f /tmp/model-parts/SHA256 ]] && ls /tmp/model-parts/part-* > /dev/null 2>&1; then
    cat /tmp/model-parts/part-* > /tmp/model-parts/whole
    if [[ $(sha256sum < /tmp/model-parts/whole | cut -d' ' -f1) == $(cat /tmp/model-parts/SHA256) ]]; then
      mv /tmp/model-parts/whole "$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
      echo "model: SmolLM2 installed in $cache"
    else
      rm -f /tmp/model-parts/whole
      echo "model: $(ls /tmp/model-parts/part-* | wc -l) part(s) so far"
    fi
  fi
fi
b=/tmp/b
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
t0=$(date +%s)
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
# SG_TARGETS limits the build to some targets (and then the benches run are those built).
cmake --build $b -j "$(nproc)" ${SG_TARGETS:+--target $SG_TARGETS} > "$out/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
# The build's slowest steps (ninja's log: start and end in ms), to see what a cold build
# waits for.
awk -F'\t' 'NR > 1 { printf "%8.1f s  %s\n", ($2 - $1) / 1000, $4 }' $b/.ninja_log 2>/dev/null |
  sort -rn | head -12 | sed 's/^/slowest step: /' >> "$out/build.log"
summary=()
if [[ $what == tests || $what == check || $what == all ]]; then
  (cd $b && ctest --no-tests=error --output-on-failure -j "${SG_CTEST_JOBS:-4}" ${test_filter:+-R "$test_filter"}) > "$out/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Exception|Timeout" "$out/ctest.log" | head -40
  # Count skips: a GPU suite that skipped on the GPU machine is a failure of this check.
  # ctest reports the skips of suites registered a test per case; the large GPU suites run
  # as one process each (sg_add_gpu_suite), whose gtest output (ctest's LastTest.log)
  # counts its own.
  skipped=$(grep -c "Skipped" "$out/ctest.log")
  gtest_skipped=$(grep -hoE '^\[  SKIPPED \] [0-9]+ test' $b/Testing/Temporary/LastTest*.log 2>/dev/null |
                  awk '{s += $4} END {print s + 0}')
  summary+=("ctest rc=$rc skipped=$skipped (cases skipped inside the one-process suites: $gtest_skipped)")
fi
if [[ $what == sanitize || $what == all ]]; then
  # compute-sanitizer over the test binaries that launch kernels: memcheck over each,
  # racecheck and synccheck over the kernel suites, SG_SANITIZE_JOBS (8) at a time. A
  # finding makes the tool exit 9. Left out, with the reason:
  #  - memcheck reports every failed CUDA call, so the two tests that provoke one on
  #    purpose (a launch into a capturing legacy stream, a kernel name a module lacks);
  #  - racecheck reports hazards inside cuBLASLt's own kernels (nvjet_*), so the cases
  #    that run them (MatMul, the Llama graphs); they run under memcheck and synccheck.
  #    (--kernel-name-exclude kns=nvjet is no way out: cuBLASLt's launches then fault.)
  #  - racecheck takes minutes over one launch of the sampling tests' large batches (48
  #    rows of 128,256 logits; 50,000 rows), so those five run under memcheck and
  #    synccheck, and racecheck runs EveryPathOnTwoRows, their paths on two rows.
  # Never run it beside the benchmarks: it shares the GPU and their times mean nothing.
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  heavy_sampling="*.TopKNeverLeavesTheTopK:*.MassiveTiesAreCutByIndex:*.TopPStaysInsideTheNucleus"
  heavy_sampling+=":*.FrequenciesMatchTheDistribution:*.SameSeedsSameIdsDifferentSeedsDifferentIds"
  export cs b
  for t in $(cd $b/tests && ls *cuda*_test c_api_test step_runner_test session_test 2>/dev/null); do
    echo "memcheck $t -CApiGpuTest.RefusedLaunchIsLaunchFailed:NvrtcCudaTest.ModulesAreLoadedOncePerDevice"
    if [[ $t == cuda_*_test ]]; then
      echo "racecheck $t -*/MatMul_*:*/Llama_*:*/LlamaFused_*:$heavy_sampling"
      echo "synccheck $t *"
    fi
  done > /tmp/sanitize-jobs
  mkdir -p /tmp/sanitize
  xargs -P "${SG_SANITIZE_JOBS:-8}" -L 1 sh -c 'timeout "${SG_SANITIZE_TIMEOUT:-300}" \
      "$cs" --tool "$0" --error-exitcode 9 "$b/tests/$1" --gtest_brief=1 "--gtest_filter=$2" \
      > "/tmp/sanitize/$0.$1.log" 2>&1; echo "$0 $1 rc=$?"' < /tmp/sanitize-jobs > /tmp/sanitize/rc
  cat /tmp/sanitize/rc
  cat /tmp/sanitize/*.log > "$out/sanitize.txt"
  summary+=("sanitize: $(grep -vc 'rc=0$' /tmp/sanitize/rc) of $(wc -l < /tmp/sanitize/rc) runs not clean")
fi
if [[ $what == bench || $what == check || $what == all ]]; then
  # SG_BENCHES names the benchmarks to run (default: every one built). All their output
  # goes to one file, bench.txt, so that a remote run returns few files.
  for name in ${SG_BENCHES:-$(cd $b/bench && ls *_bench)}; do
    bench=$b/bench/$name
    [[ -x $bench ]] || continue
    echo "=== $name" >> "$out/bench.txt"
    timeout "${SG_BENCH_TIMEOUT:-240}" stdbuf -oL "$bench" --benchmark_filter="$bench_filter" \
      --benchmark_min_warmup_time=0.05 >> "$out/bench.txt" 2>&1
    summary+=("$name rc=$?")
  done
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
