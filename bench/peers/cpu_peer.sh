#!/usr/bin/env bash
# stepgraph's CPU reference against llama.cpp's CPU build on the same GGUF file with the same
# thread counts, run back to back (llama.cpp, then stepgraph, then the next repetition), and
# a table of the medians: decode ms/token and prompt tokens/s for each thread count, and
# the ratios. For a machine that other programs share: every measurement is repeated and the
# load average is printed beside the table.
#
#   LLAMA_BENCH=/path/to/llama-bench bench/peers/cpu_peer.sh [MODEL.gguf]
#
# MODEL defaults to the tests' SmolLM2-135M-Instruct Q4_1 file. llama-bench comes from a
# build of llama.cpp (e.g. the sources in the llama-cpp-python sdist, see gguf_peer.sh); it
# runs with -ngl 0, on the CPU, also where it was built with CUDA.
# Environment: SG_BIN (stepgraph, default build/stepgraph), THREADS (default "1 2"), REPS
# (default 5), GEN (decode tokens, default 64), PROMPT (prompt tokens, default 128).
#
# What is compared: llama-bench's tg$GEN (tokens generated from position 0, as ms/token)
# against `stepgraph bench --cpu` (median step of $GEN steps from position 1); llama-bench's
# pp$PROMPT against stepgraph's time to first token of a $PROMPT-token prompt (prefill and
# the first step), as prompt tokens per second.
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-$HOME/.cache/stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf}
llama=${LLAMA_BENCH:?set LLAMA_BENCH to a CPU build of llama.cpp\'s llama-bench}
sg=${SG_BIN:-build/stepgraph}
[[ -f $model ]] || { echo "cpu_peer: no model file $model" >&2; exit 1; }
[[ -x $llama ]] || { echo "cpu_peer: $llama is not executable" >&2; exit 1; }
[[ -x $sg ]] || { echo "cpu_peer: $sg is not executable (set SG_BIN)" >&2; exit 1; }

exec python3 - "$model" "$llama" "$sg" "${THREADS:-1 2}" "${REPS:-5}" "${GEN:-64}" \
  "${PROMPT:-128}" <<'EOF'
import json, os, re, statistics, subprocess, sys

model, llama, sg, threads, reps, gen, prompt = sys.argv[1:]
threads = [int(t) for t in threads.split()]
reps, gen, prompt = int(reps), int(gen), int(prompt)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        sys.exit(f"cpu_peer: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return p.stdout


def llama_once(t):
    # -ngl 0: a CUDA build of llama.cpp runs on the CPU too.
    out = run([llama, "-m", model, "-ngl", "0", "-t", str(t), "-p", str(prompt), "-n", str(gen),
               "-r", "1", "-o", "json"])
    rows = json.loads(out[out.index("["):])
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == gen and r["n_prompt"] == 0)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == prompt and r["n_gen"] == 0)
    return 1e3 / tg, pp


def stepgraph_once(t):
    out = run([sg, "bench", "--cpu", "--model", model, "-t", str(t), "--steps", str(gen),
               "--positions", "1", "--ttft-lengths", str(prompt)])
    ms = float(re.search(r"position 1: ([0-9.]+) ms/token", out).group(1))
    ttft = float(re.search(r"time to first token, %d-token prompt: ([0-9.]+) ms" % prompt,
                           out).group(1))
    return ms, 1e3 * prompt / ttft


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


load_before = os.getloadavg()
results = {}
for t in threads:
    samples = {"llama": [], "sg": []}
    for r in range(reps):
        samples["llama"].append(llama_once(t))
        samples["sg"].append(stepgraph_once(t))
        print(f"threads {t}, repetition {r + 1}/{reps}: llama.cpp {samples['llama'][-1][0]:.2f} "
              f"ms/token, {samples['llama'][-1][1]:.1f} prompt tokens/s; stepgraph "
              f"{samples['sg'][-1][0]:.2f} ms/token, {samples['sg'][-1][1]:.1f} prompt tokens/s",
              file=sys.stderr, flush=True)
    results[t] = {k: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
                  for k, v in samples.items()}
load_after = os.getloadavg()

print(f"{cpu_name()}, {os.cpu_count()} logical CPUs; {os.path.basename(model)}; medians of "
      f"{reps} back-to-back runs; load average {load_before[0]:.1f} before, "
      f"{load_after[0]:.1f} after")
print()
print(f"| threads | decode ms/token: llama.cpp | stepgraph | stepgraph / llama.cpp "
      f"| prompt ({prompt}) tokens/s: llama.cpp | stepgraph | llama.cpp / stepgraph |")
print("|---|---|---|---|---|---|---|")
for t, r in results.items():
    (l_ms, l_pp), (s_ms, s_pp) = r["llama"], r["sg"]
    print(f"| {t} | {l_ms:.2f} | {s_ms:.2f} | {s_ms / l_ms:.2f}x | {l_pp:.1f} | {s_pp:.1f} "
          f"| {l_pp / s_pp:.2f}x |")
EOF
