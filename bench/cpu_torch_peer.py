#!/usr/bin/env python3
"""The CPU decode step of stepgraph beside PyTorch's, on SmolLM2-135M's shape, in one run.

Runs bench/cpu_bench (stepgraph's CPU reference, f32 and Q4_1 weights, 1 and 2 threads)
and then Hugging Face transformers' LlamaForCausalLM with the same shape, random f32
weights, in PyTorch eager mode with a KV cache, on the same machine right after, and
prints milliseconds per token for each. Both decode one token at a time (batch 1) from
context position 100; PyTorch's time is the median of single-token forward calls with
torch.no_grad(), timed with time.perf_counter.

    python3 bench/cpu_torch_peer.py --bench build/bench/cpu_bench [--threads 2]

Needs torch and transformers. Prints a table; exits non-zero if either side fails.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

START_POS = 100
TIMED_TOKENS = 32

SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)


def stepgraph_rows(bench, min_time):
    out = subprocess.run(
        [bench, "--benchmark_format=json", f"--benchmark_min_time={min_time}"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        ms = b["real_time"] if b["time_unit"] == "ms" else b["real_time"] * 1e-6
        rows.append((f"stepgraph {b['label']}, {int(b['threads'])} thread(s)", ms,
                     b.get("weight_GBps", 0.0), b.get("copy_GBps", 0.0)))
    return rows


def torch_ms_per_token(threads):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, START_POS))
    times = []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(TIMED_TOKENS + 4):
            t0 = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
            cache = out.past_key_values
    return statistics.median(times[4:]) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="path of the cpu_bench program")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds per stepgraph case")
    args = p.parse_args()

    rows = stepgraph_rows(args.bench, args.min_time)
    rows.append((f"PyTorch {sys.modules.get('torch', __import__('torch')).__version__} f32, "
                 f"{args.threads} thread(s)", torch_ms_per_token(args.threads), 0.0, 0.0))
    print(f"SmolLM2-135M shape, batch 1, decode from position {START_POS}")
    print(f"{'':58s} {'ms/token':>9s} {'weight GB/s':>12s} {'memcpy GB/s':>12s}")
    for name, ms, wgb, cgb in rows:
        extra = f"{wgb:12.2f} {cgb:12.2f}" if wgb else ""
        print(f"{name:58s} {ms:9.1f} {extra}")


if __name__ == "__main__":
    main()
