#!/usr/bin/env python3
"""The Python half of bench/peers/gguf_peer.sh: writes the GGUF file, runs stepgraph and
llama.cpp's tools on each file, parses what they print and makes the table.

  write --out FILE [--shape 1b|small]   a Llama GGUF with random weights, as llama.cpp's
                                        converter writes one (F16 matrices, F32 norms)
  run --work DIR --logs DIR --stepgraph BIN --llama-bin DIR --files LIST [--shape S]
  table --work DIR
  selftest --work DIR --stepgraph BIN   what runs without a GPU: the parsers on the sample
                                        outputs below, and a small file written and
                                        benchmarked by stepgraph (CPU); gguf_peer.sh then
                                        runs `run --shape small` where llama.cpp's tools
                                        are built (LLAMA_BIN), on the CPU

Needs numpy and the gguf package (gguf_peer.sh puts the prepared wheel on PYTHONPATH).
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time

# ---- the file ---------------------------------------------------------------------------

# Llama-3.2-1B's shape (its config.json), and a small one of the same kind for checks.
SHAPES = {
    "1b": dict(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
               vocab=128256, context=131072, theta=500000.0, eps=1e-5,
               llama3=dict(factor=32.0, low=1.0, high=4.0, original=8192)),
    "small": dict(hidden=256, intermediate=512, layers=2, heads=8, kv_heads=2, head_dim=32,
                  vocab=1024, context=4096, theta=500000.0, eps=1e-5,
                  llama3=dict(factor=32.0, low=1.0, high=4.0, original=8192)),
}


def byte_tokens():
    """GPT-2's byte-level alphabet: the 256 printable stand-ins of the bytes, which
    llama.cpp looks up when it loads a byte-level BPE vocabulary."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def add_decoder_keys(w, s):
    """The decoder's shape keys of a SHAPES-style dict `s` on GGUFWriter `w` (whose
    architecture prefixes them)."""
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["intermediate"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])


def add_byte_vocab(w, vocab, pre, specials):
    """A byte-level BPE vocabulary of `vocab` tokens on GGUFWriter `w` (pre-tokenizer
    `pre`): the 256 byte tokens, a few merges and what they make (llama.cpp refuses a gpt2
    vocabulary without merges), fillers, and the two control tokens `specials` (bos, eos)
    last."""
    import gguf
    alphabet = byte_tokens()
    merges = [f"{a} {b}" for a, b in (("\u0120", "t"), ("\u0120", "a"), ("h", "e"), ("i", "n"),
                                      ("\u0120t", "he"), ("e", "r"), ("o", "n"), ("a", "n"))]
    made = [m.replace(" ", "") for m in merges]
    tokens = alphabet + made + [f"<t{i}>" for i in range(len(alphabet) + len(made), vocab - 2)] + \
        list(specials)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (vocab - 2) + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)


def rope_freqs(s):
    """Llama 3's per-frequency divisors, as the converter stores them in rope_freqs.weight."""
    import math
    import numpy as np
    r = s["llama3"]
    half = s["head_dim"] // 2
    out = []
    for j in range(half):
        freq = 1.0 / s["theta"] ** (2.0 * j / s["head_dim"])
        wavelen = 2 * math.pi / freq
        if wavelen < r["original"] / r["high"]:
            out.append(1.0)
        elif wavelen > r["original"] / r["low"]:
            out.append(r["factor"])
        else:
            smooth = (r["original"] / wavelen - r["low"]) / (r["high"] - r["low"])
            out.append(1.0 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path, shape="1b", seed=0):
    """A Llama GGUF with random weights, laid out as convert_hf_to_gguf.py --outtype f16
    writes Llama-3.2-1B: F16 matrices, every 1-D tensor (norms, rope_freqs) F32, tied
    embeddings (no output.weight), the GPT-2 style vocabulary llama.cpp expects. The Q/K
    row permutation the converter applies is left out: on random weights it changes
    nothing but the order of random rows."""
    import gguf
    import numpy as np
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    t0 = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path + ".part", "llama")
    w.add_name(f"stepgraph peer llama {shape} random")
    add_decoder_keys(w, s)
    w.add_rope_dimension_count(s["head_dim"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_byte_vocab(w, s["vocab"], "llama-bpe", ("<|begin_of_text|>", "<|end_of_text|>"))

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    h, i, d = s["hidden"], s["intermediate"], s["head_dim"]
    q, kv = s["heads"] * d, s["kv_heads"] * d
    w.add_tensor("rope_freqs.weight", rope_freqs(s))
    w.add_tensor("token_embd.weight", matrix(s["vocab"], h))
    for layer in range(s["layers"]):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        w.add_tensor(p + "attn_q.weight", matrix(q, h))
        w.add_tensor(p + "attn_k.weight", matrix(kv, h))
        w.add_tensor(p + "attn_v.weight", matrix(kv, h))
        w.add_tensor(p + "attn_output.weight", matrix(h, q))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        w.add_tensor(p + "ffn_gate.weight", matrix(i, h))
        w.add_tensor(p + "ffn_up.weight", matrix(i, h))
        w.add_tensor(p + "ffn_down.weight", matrix(h, i))
    w.add_tensor("output_norm.weight", norm(h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".part", path)
    print(f"gguf_peer: wrote {path} ({shape}, {os.path.getsize(path) / 2**30:.2f} GiB) in "
          f"{time.time() - t0:.1f} s", flush=True)


# ---- parsers ------------------------------------------------------------------------------

_NUMBER = r"([0-9.]+(?:e[-+]?[0-9]+)?)"


def _unit_bytes(value, unit):
    return float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def parse_stepgraph_bench(text):
    """`stepgraph bench` output -> {positions: {pos: ms per step}, prefill: {len: tokens/s},
    weight_bytes, copy_gbs, matmul_tflops}. Reads the GPU lines (replayed, or eager when
    the session was eager) and the CPU reference's line."""
    r = {"positions": {}, "prefill": {}}
    m = re.search(r"device-to-device copy: " + _NUMBER + r" GB/s .*; weights " + _NUMBER +
                  r" (B|KiB|MiB|GiB)", text)
    if m:
        r["copy_gbs"] = float(m.group(1))
        r["weight_bytes"] = _unit_bytes(m.group(2), m.group(3))
    for m in re.finditer(r"^position (\d+): (?:replayed|eager) " + _NUMBER + r" ms/step", text,
                         re.M):
        r["positions"][int(m.group(1))] = float(m.group(2))
    for m in re.finditer(r"^position (\d+): " + _NUMBER + r" ms/token on the CPU reference",
                         text, re.M):
        r["positions"][int(m.group(1))] = float(m.group(2))
    for m in re.finditer(r"^time to first token, (\d+)-token prompt: " + _NUMBER +
                         r" ms \(prefill " + _NUMBER + r" ms, " + _NUMBER + r" tokens/s", text,
                         re.M):
        r["prefill"][int(m.group(1))] = float(m.group(4))
    m = re.search(r"the bf16 matmul rate " + _NUMBER + r" TFLOP/s", text)
    if m:
        r["matmul_tflops"] = float(m.group(1))
    return r


def parse_llama_bench(text):
    """`llama-bench -o json` output -> {tests: {"pp512"/"tg128": tokens/s}, model_size,
    build, gpu}. The JSON array is the last thing printed; logs may precede it."""
    start = text.find("[")
    while start >= 0:
        try:
            rows = json.loads(text[start:])
            break
        except json.JSONDecodeError:
            start = text.find("[", start + 1)
    else:
        raise ValueError("no JSON array in llama-bench's output")
    r = {"tests": {}}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        r["tests"][name] = float(row["avg_ts"])
        r["model_size"] = int(row["model_size"])
        r["build"] = f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})"
        r["gpu"] = row.get("gpu_info", "")
        r["flash_attn"] = row.get("flash_attn")
    return r


def parse_batched_bench(text):
    """`llama-batched-bench --output-format jsonl` -> {sequences: token generation
    tokens/s over all of them}."""
    r = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith('{"n_kv_max"'):
            continue
        row = json.loads(line)
        r[int(row["pl"])] = float(row["speed_tg"])
    if not r:
        raise ValueError("no jsonl rows in llama-batched-bench's output")
    return r


# ---- running ------------------------------------------------------------------------------

QUANTS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K"}
FILES = ["f16"] + list(QUANTS) + ["smollm2"]
BATCH_POSITION = 192  # llama-batched-bench -npp 128 -ntg 128: the middle of its generation


class GpuMemory:
    """Peak of nvidia-smi's memory.used while a command runs, above what was used before
    it started (the whole GPU's: per-process figures are not always visible in a
    container)."""

    def __init__(self):
        self.base = self._used()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def _used():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                  "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
            return float(out.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def _poll(self):
        # Twice a second: allocations are held for the whole run, and nvidia-smi itself
        # should not disturb the timings.
        while not self._stop.wait(0.5):
            used = self._used()
            if used is not None and (self.peak is None or used > self.peak):
                self.peak = used

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def mib(self):
        return None if self.base is None or self.peak is None else self.peak - self.base


def gpu_name():
    """The first GPU's name as nvidia-smi gives it, or "unknown"."""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    return gpu.splitlines()[0] if gpu else "unknown"


def run_logged(cmd, log, timeout, memory=False):
    """Runs cmd, writes its output to `log`, returns (output, peak GPU MiB when `memory`)."""
    print("gguf_peer: " + " ".join(cmd), flush=True)
    t0 = time.time()
    with GpuMemory() if memory else contextlib.nullcontext() as mem:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}; see {log}:\n" + p.stdout[-2000:])
    print(f"gguf_peer:   {time.time() - t0:.1f} s", flush=True)
    return p.stdout, mem.mib() if memory else None


def model_path(work, name):
    if name == "smollm2":
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(cache, "stepgraph-test", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return os.path.join(work, "files", name + ".gguf")


def load_results(work, name="results.json"):
    path = os.path.join(work, name)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"files": {}}


def save_results(work, results, name="results.json"):
    path = os.path.join(work, name)
    with open(path + ".part", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".part", path)


def measure(name, path, args):
    logs = args.logs
    sg, ll = args.stepgraph, args.llama_bin
    r = {"file": os.path.basename(path), "bytes": os.path.getsize(path)}
    # stepgraph: decode at position 100 and the prefills; then batches.
    text, r["sg_gpu_mib"] = run_logged(
        [sg, "bench", "--model", path, "--positions", "100", "--ttft-lengths", args.prefill],
        os.path.join(logs, f"{name}-stepgraph.log"), 600, memory=True)
    r["sg"] = parse_stepgraph_bench(text)
    if args.sg_alt:
        # The same decode and prefills under other flags (e.g. --block-gemv-precision int16,
        # --block-gemm-precision int8).
        text, _ = run_logged([sg, "bench", "--model", path, "--positions", "100",
                              "--ttft-lengths", args.prefill] + args.sg_alt.split(),
                             os.path.join(logs, f"{name}-stepgraph-alt.log"), 600)
        alt = parse_stepgraph_bench(text)
        r["sg_alt_ms"] = alt["positions"].get(100)
        r["sg_alt_prefill"] = alt["prefill"]
        # And batch 16, where the block kernels' precision matters too.
        text, _ = run_logged(
            [sg, "bench", "--model", path, "--batch", "16", "--positions", str(BATCH_POSITION),
             "--ttft-lengths", "16"] + args.sg_alt.split(),
            os.path.join(logs, f"{name}-stepgraph-alt-b16.log"), 600)
        r["sg_alt_batch16_ms"] = parse_stepgraph_bench(text)["positions"][BATCH_POSITION]
    for batch in (4, 16):
        text, _ = run_logged(
            [sg, "bench", "--model", path, "--batch", str(batch), "--positions",
             str(BATCH_POSITION), "--ttft-lengths", "16"],
            os.path.join(logs, f"{name}-stepgraph-b{batch}.log"), 600)
        r["sg"][f"batch{batch}_ms"] = parse_stepgraph_bench(text)["positions"][BATCH_POSITION]
    # llama.cpp: decode of 128 tokens from an empty context, and the prefills.
    text, r["llama_gpu_mib"] = run_logged(
        [os.path.join(ll, "llama-bench"), "-m", path, "-ngl", "99", "-fa", "1", "-p", args.prefill,
         "-n", "128", "-o", "json"],
        os.path.join(logs, f"{name}-llama-bench.log"), 600, memory=True)
    r["llama"] = parse_llama_bench(text)
    # Its rows go through llama.cpp's asynchronous logger, which drops what is still queued
    # when the program exits: a last run of one sequence (not used) gives the logger time
    # to print the rows that count.
    text, _ = run_logged(
        [os.path.join(ll, "llama-batched-bench"), "-m", path, "-ngl", "99", "-fa", "on",
         "-c", "8192", "-npp", "128", "-ntg", "128", "-npl", "4,16,1",
         "--output-format", "jsonl"],
        os.path.join(logs, f"{name}-llama-batched-bench.log"), 600)
    batched = parse_batched_bench(text)
    missing = [b for b in (4, 16) if b not in batched]
    if missing:
        raise ValueError(f"llama-batched-bench printed no row for batch {missing}")
    r["llama"]["batched_tg"] = {str(b): batched[b] for b in (4, 16)}
    return r


def run(args):
    results = load_results(args.work)
    names = FILES if args.files == "all" else args.files.split(",")
    for name in names:
        if name not in FILES:
            sys.exit(f"gguf_peer: unknown file '{name}' (known: {','.join(FILES)})")
    os.makedirs(args.logs, exist_ok=True)
    f16 = model_path(args.work, "f16")
    if not os.path.exists(f16):
        write_gguf(f16, args.shape)
    results["gpu"] = gpu_name()
    results["prefill_lengths"] = [int(n) for n in args.prefill.split(",")]
    results["llama_source"] = args.llama_source
    results["sg_alt"] = args.sg_alt
    for name in names:
        path = model_path(args.work, name)
        if name in QUANTS and not os.path.exists(path):
            run_logged([os.path.join(args.llama_bin, "llama-quantize"), f16, path, QUANTS[name]],
                       os.path.join(args.logs, f"{name}-quantize.log"), 300)
        if not os.path.exists(path):
            print(f"gguf_peer: {path} is missing; {name} skipped (the SmolLM2 file comes "
                  "with tools/gpu_check.sh's .device-model parts)", flush=True)
            continue
        try:
            results["files"][name] = measure(name, path, args)
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            print(f"gguf_peer: {name}: {e}", flush=True)
            results["files"].setdefault(name, {})["error"] = str(e)[:500]
        save_results(args.work, results)
    print(table(results))


# ---- the table ----------------------------------------------------------------------------

def _ms(v):
    return "—" if v is None else f"{v:.3f}"


def _rate(v):
    return "—" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _ratio(a, b):
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def _gib(v):
    return "—" if not v else f"{v / 2**30:.3f}"


def table(results):
    """Markdown tables: decode at batch 1, 4 and 16, prefill, memory; ratios > 1 mean
    stepgraph is faster."""
    rows_decode, rows_prefill, rows_memory = [], [], []
    prefill = results.get("prefill_lengths", [512, 2048])
    alt = results.get("sg_alt", "")
    for name in FILES:
        r = results["files"].get(name)
        if not r:
            continue
        if "error" in r:
            rows_decode.append(f"| {name} | failed: {r['error'][:80]} |")
            continue
        sg, ll = r["sg"], r["llama"]
        sg_ms = sg["positions"].get(100, sg["positions"].get("100"))
        tg = ll["tests"].get("tg128")
        ll_ms = 1e3 / tg if tg else None
        cells = [name, _ms(sg_ms), _ms(ll_ms), _ratio(ll_ms, sg_ms)]
        for batch in (4, 16):
            ms = sg.get(f"batch{batch}_ms")
            sg_ts = batch * 1e3 / ms if ms else None
            ll_ts = ll.get("batched_tg", {}).get(str(batch))
            cells += [_rate(sg_ts), _rate(ll_ts), _ratio(sg_ts, ll_ts)]
        if alt:
            cells += [_ms(r.get("sg_alt_ms")), _ratio(ll_ms, r.get("sg_alt_ms"))]
            alt16 = r.get("sg_alt_batch16_ms")
            alt16_ts = 16 * 1e3 / alt16 if alt16 else None
            ll16 = ll.get("batched_tg", {}).get("16")
            cells += [_rate(alt16_ts), _ratio(alt16_ts, ll16)]
        rows_decode.append("| " + " | ".join(cells) + " |")
        cells = [name]
        for n in prefill:
            sg_pp = sg["prefill"].get(n, sg["prefill"].get(str(n)))
            ll_pp = ll["tests"].get(f"pp{n}")
            cells += [_rate(sg_pp), _rate(ll_pp), _ratio(sg_pp, ll_pp)]
            if alt:
                alt_pp = r.get("sg_alt_prefill", {})
                alt_pp = alt_pp.get(n, alt_pp.get(str(n)))
                cells += [_rate(alt_pp), _ratio(alt_pp, ll_pp)]
        rows_prefill.append("| " + " | ".join(cells) + " |")
        mib = [r.get("sg_gpu_mib"), r.get("llama_gpu_mib")]
        rows_memory.append("| " + " | ".join(
            [name, _gib(r["bytes"]), _gib(sg.get("weight_bytes")), _gib(ll.get("model_size"))] +
            ["—" if m is None else f"{m:,.0f}" for m in mib]) + " |")
    out = [f"GPU: {results.get('gpu', 'unknown')}; llama.cpp from "
           f"{results.get('llama_source', '?')}",
           "",
           "Decode (stepgraph bench --positions 100, replayed; llama-bench -ngl 99 -fa 1 -n 128 "
           f"-p 0; batches: stepgraph --batch B --positions {BATCH_POSITION} against "
           "llama-batched-bench -npp 128 -ntg 128 -npl 4,16 -fa on); ratio > 1: stepgraph faster",
           "",
           "| file | sg ms/token | llama ms/token | ratio | sg tok/s b4 | llama tok/s b4 | ratio "
           "| sg tok/s b16 | llama tok/s b16 | ratio |" +
           (f" sg {alt} ms/token | ratio | sg {alt} tok/s b16 | ratio |" if alt else ""),
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if alt else "")
           ] + rows_decode + [
           "",
           "Prefill tokens/s (stepgraph bench's time-to-first-token prefill of a prompt of n "
           "tokens, n - 1 of them in steps of up to 2,048 (the default), then the first decode "
           "step; llama-bench ppn)",
           "",
           "| file | " + " | ".join(f"sg {n} | llama {n} | ratio" +
                                  (f" | sg {alt} {n} | ratio" if alt else "")
                                  for n in prefill) + " |",
           "|---|" + ("---|---|---|---|---|" if alt else "---|---|---|") * len(prefill)
           ] + rows_prefill + [
           "",
           "Memory (GiB of the file and of the weights each program reports; GPU MiB: peak of "
           "nvidia-smi memory.used during the batch-1 run above the idle GPU, weights, KV "
           "cache, workspace and CUDA context together)",
           "",
           "| file | file GiB | sg weights GiB | llama model GiB | sg GPU MiB | llama GPU MiB |",
           "|---|---|---|---|---|---|"] + rows_memory
    return "\n".join(out)


# ---- checks without a GPU -----------------------------------------------------------------

# What the tools print, as their sources format it (tools/stepgraph.cc's Bench and
# MeasureTtft on a GPU; llama-bench's JSON printer; llama-batched-bench's jsonl rows), in
# the shape of a real run, for the parsers.
SAMPLE_STEPGRAPH_GPU = """\
stepgraph: q4_0.gguf on cuda (NVIDIA H100 80GB HBM3), replayed; buckets 1, max_seq 2049
device-to-device copy: 2987.3 GB/s (read + write); weights 0.70 GiB: floor 0.2516 ms/step
time to first token, 512-token prompt: 39.120 ms (prefill 37.900 ms, 13483 tokens/s, chunk 256, 33.5 TFLOP/s = 0.043 of the bf16 matmul rate 781.2 TFLOP/s)
time to first token, 2048-token prompt: 160.020 ms (prefill 158.800 ms, 12891 tokens/s, chunk 256, 33.0 TFLOP/s = 0.042 of the bf16 matmul rate 781.2 TFLOP/s)
position 100: replayed 1.1570 ms/step (864.3 tokens/s), eager 1.4212 ms/step (1.23x); floor/replayed 0.715
"""
SAMPLE_LLAMA_BENCH = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0, VMM: yes
[
  {
    "build_commit": "4a5f1b2",
    "build_number": 7311,
    "cpu_info": "AMD EPYC",
    "gpu_info": "NVIDIA H100 80GB HBM3",
    "backends": "CUDA",
    "model_filename": "/tmp/gguf-peer/files/q4_0.gguf",
    "model_type": "llama 1B Q4_0",
    "model_size": 773025792,
    "model_n_params": 1235814400,
    "n_batch": 2048,
    "n_ubatch": 512,
    "flash_attn": "enabled",
    "n_prompt": 512,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-11-26T10:00:00Z",
    "avg_ns": 11830000,
    "stddev_ns": 50000,
    "avg_ts": 43277.1,
    "stddev_ts": 180.2,
    "samples_ns": [11830000],
    "samples_ts": [43277.1]
  },
  {
    "build_commit": "4a5f1b2",
    "build_number": 7311,
    "gpu_info": "NVIDIA H100 80GB HBM3",
    "model_size": 773025792,
    "flash_attn": "enabled",
    "n_prompt": 0,
    "n_gen": 128,
    "n_depth": 0,
    "avg_ts": 997.0,
    "stddev_ts": 2.1
  }
]
"""
SAMPLE_BATCHED_BENCH = """\
main: n_kv_max = 8192, n_batch = 2048, n_ubatch = 512, flash_attn = 1
{"n_kv_max": 8192, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 16, "n_threads_batch": 16, "pp": 128, "tg": 128, "pl": 4, "n_kv": 1024, "t_pp": 0.012000, "speed_pp": 42666.666667, "t_tg": 0.160000, "speed_tg": 3200.000000, "t": 0.172000, "speed": 5953.488372}
{"n_kv_max": 8192, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 16, "n_threads_batch": 16, "pp": 128, "tg": 128, "pl": 16, "n_kv": 4096, "t_pp": 0.050000, "speed_pp": 40960.000000, "t_tg": 0.361000, "speed_tg": 5671.000000, "t": 0.411000, "speed": 9965.936740}

llama_perf_context_print:        load time =     512.00 ms
"""


def selftest(args):
    # The parsers on the samples.
    sg = parse_stepgraph_bench(SAMPLE_STEPGRAPH_GPU)
    assert sg["positions"] == {100: 1.157}, sg
    assert sg["prefill"] == {512: 13483.0, 2048: 12891.0}, sg
    assert abs(sg["weight_bytes"] - 0.70 * 2**30) < 1, sg
    assert sg["matmul_tflops"] == 781.2 and sg["copy_gbs"] == 2987.3, sg
    ll = parse_llama_bench(SAMPLE_LLAMA_BENCH)
    assert ll["tests"] == {"pp512": 43277.1, "tg128": 997.0}, ll
    assert ll["model_size"] == 773025792 and ll["gpu"] == "NVIDIA H100 80GB HBM3", ll
    bb = parse_batched_bench(SAMPLE_BATCHED_BENCH)
    assert bb == {4: 3200.0, 16: 5671.0}, bb
    for bad in ("", "[not json", "position x"):
        for parser in (parse_llama_bench, parse_batched_bench):
            try:
                parser(bad)
                raise AssertionError(f"{parser.__name__} accepted {bad!r}")
            except ValueError:
                pass
    # The table from those numbers: the ratios come out as the (1.003 ms / 1.157).
    fake = {"gpu": "NVIDIA H100 80GB HBM3", "files": {"q4_0": {
        "bytes": 773025792 + (4 << 20), "sg": dict(sg, batch4_ms=1.5, batch16_ms=6.3),
        "llama": dict(ll, batched_tg={"4": 3200.0, "16": 5671.0}),
        "sg_gpu_mib": 2101.0, "llama_gpu_mib": 1480.0}}}
    text = table(fake)
    assert ("| q4_0 | 1.157 | 1.003 | 0.87 | 2,667 | 3,200 | 0.83 | 2,540 | 5,671 | 0.45 |"
            in text), text
    assert "| q4_0 | 13,483 | 43,277 | 0.31 | 12,891 | — | — |" in text, text
    assert "| q4_0 | 0.724 | 0.700 | 0.720 | 2,101 | 1,480 |" in text, text
    # With a second run under other flags: its decode and prefill beside the first.
    fake["sg_alt"] = "--block-gemm-precision int8"
    fake["files"]["q4_0"].update(sg_alt_ms=1.0, sg_alt_prefill={"512": 21640.0},
                                 sg_alt_batch16_ms=2.0)
    text = table(fake)
    assert "| 0.45 | 1.000 | 1.00 | 8,000 | 1.41 |" in text, text
    assert "| q4_0 | 13,483 | 43,277 | 0.31 | 21,640 | 0.50 | 12,891 | — | — | — | — |" in text, text
    print("gguf_peer: parsers and table agree with the samples")

    # A small file written as the 1B one is, read by stepgraph (its CPU reference here).
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "small-f16.gguf")
    write_gguf(path, shape="small")
    import gguf
    reader = gguf.GGUFReader(path)
    kinds = {(len(t.shape), t.tensor_type.name) for t in reader.tensors}
    assert kinds == {(1, "F32"), (2, "F16")}, kinds
    if not os.access(args.stepgraph, os.X_OK):
        print(f"gguf_peer: {args.stepgraph} not built; stepgraph's run on the file skipped")
        return
    text, _ = run_logged([args.stepgraph, "bench", "--cpu", "--model", path, "--positions",
                          "20", "--steps", "4", "--ttft-lengths", "64"],
                         os.path.join(args.work, "stepgraph.log"), 300)
    r = parse_stepgraph_bench(text)
    assert 20 in r["positions"] and 64 in r["prefill"], text
    print(f"gguf_peer: stepgraph ran the small F16 file: {r['positions'][20]} ms/token, "
          f"prefill {r['prefill'][64]:.0f} tokens/s (CPU reference)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    w.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    for flag in ("--work", "--logs", "--stepgraph", "--llama-bin"):
        r.add_argument(flag, required=True)
    r.add_argument("--files", default="all")
    r.add_argument("--shape", choices=sorted(SHAPES), default="1b",
                   help="of the F16 file when it is not written yet")
    r.add_argument("--prefill", default="512,2048", help="prompt lengths of the prefill rows")
    r.add_argument("--llama-source", default="?", help="what llama.cpp was built from")
    r.add_argument("--sg-alt", default="",
                   help="flags of a second stepgraph decode run per file, reported beside "
                        "the first (e.g. '--block-gemv-precision int16')")
    t = sub.add_parser("table")
    t.add_argument("--work", required=True)
    s = sub.add_parser("selftest")
    s.add_argument("--work", required=True)
    s.add_argument("--stepgraph", required=True)
    args = ap.parse_args()
    if args.command == "write":
        write_gguf(args.out, args.shape, args.seed)
    elif args.command == "run":
        run(args)
    elif args.command == "table":
        print(table(load_results(args.work)))
    else:
        selftest(args)


if __name__ == "__main__":
    main()
