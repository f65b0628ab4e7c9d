#!/usr/bin/env python3
"""PyTorch peers of stepgraph's decode step on the GPU, for decode_bench's table.

The Llama-3.2-1B shape (bf16, random weights, tied embeddings, batch 1) decoded greedily by
a plain PyTorch step written the way fast PyTorch decoders are: a static KV cache of
max_seq positions, the new k and v written at the position with index_copy_, attention
over the whole cache with a mask of the positions not yet written (static shapes, so the
step can be captured), RoPE from precomputed tables, and the argmax on the device. The
position and the token live on the device and the step advances them itself, so a
replayed step needs no host work, as stepgraph's.

Three ways to run it, each timed with CUDA events over consecutive closed-loop steps
(median per step) at positions 100 and 1000:
  eager            the step's Python, op by op
  cuda_graph       the eager step captured once in a CUDA graph and replayed
  compile_graph    torch.compile(mode="max-autotune-no-cudagraphs", fullgraph=True), then
                   captured in a CUDA graph: max-autotune with a CUDA graph
and the floor: weight bytes over the bandwidth of a 1 GiB device-to-device copy measured
in the same run (bytes read plus written), as decode_bench counts it.

Usage: python3 bench/gpu_torch_peer.py [--modes eager,cuda_graph,compile_graph]
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2048, 16, 32, 8, 64
INTERMEDIATE, VOCAB, EPS = 8192, 128256, 1e-5
THETA, ROPE_FACTOR, LOW_FREQ, HIGH_FREQ, ORIGINAL_CONTEXT = 500000.0, 32.0, 1.0, 4.0, 8192


def llama3_inv_freq():
    inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    low_wavelen = ORIGINAL_CONTEXT / LOW_FREQ
    high_wavelen = ORIGINAL_CONTEXT / HIGH_FREQ
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / ROPE_FACTOR)
        else:
            smooth = (ORIGINAL_CONTEXT / wavelen - LOW_FREQ) / (HIGH_FREQ - LOW_FREQ)
            out.append((1 - smooth) * f / ROPE_FACTOR + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


class Decoder:
    """Weights, caches and the per-step state (token, position) on the device."""

    def __init__(self, max_seq, device):
        g = torch.Generator(device=device).manual_seed(1)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device) * 0.02).to(torch.bfloat16)

        def ones_ish(n):
            return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(torch.bfloat16)

        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        self.embed = w(VOCAB, HIDDEN)  # tied: also the lm head
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append(dict(
                attn_norm=ones_ish(HIDDEN), wqkv=w(q + 2 * kv, HIDDEN), wo=w(HIDDEN, q),
                mlp_norm=ones_ish(HIDDEN), wgu=w(2 * INTERMEDIATE, HIDDEN),
                wdown=w(HIDDEN, INTERMEDIATE)))
        self.norm = ones_ish(HIDDEN)
        self.k_cache = torch.zeros(LAYERS, 1, KV_HEADS, max_seq, HEAD_DIM, dtype=torch.bfloat16,
                                   device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), llama3_inv_freq())
        self.cos = freqs.cos().to(device)
        self.sin = freqs.sin().to(device)
        self.positions = torch.arange(max_seq, device=device)
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in
                                [self.embed, self.norm] +
                                [v for layer in self.layers for v in layer.values()])

    def rms_norm(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
        return xf.to(x.dtype) * weight

    def rope(self, x, cos, sin):  # x [1, heads, 1, d], rotate-half pairing
        half = HEAD_DIM // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def step(self):
        """One decode step: reads self.token and self.pos, writes the next token and
        advances the position, all on the device."""
        pos = self.pos
        cos, sin = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        x = self.embed[self.token]  # [1, H]
        q_cols, kv_cols = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        for i, layer in enumerate(self.layers):
            h = self.rms_norm(x, layer["attn_norm"])
            qkv = h @ layer["wqkv"].t()
            q, k, v = qkv.split([q_cols, kv_cols, kv_cols], -1)
            q = self.rope(q.view(1, 1, HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
            k = self.rope(k.view(1, 1, KV_HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
            v = v.view(1, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
            self.k_cache[i].index_copy_(2, pos, k)
            self.v_cache[i].index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i],
                                               attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(1, q_cols) @ layer["wo"].t()
            h = self.rms_norm(x, layer["mlp_norm"])
            gate, up = (h @ layer["wgu"].t()).split([INTERMEDIATE, INTERMEDIATE], -1)
            x = x + (F.silu(gate) * up) @ layer["wdown"].t()
        logits = self.rms_norm(x, self.norm) @ self.embed.t()
        self.token.copy_(logits.argmax(-1))
        self.pos.add_(1)


def copy_bandwidth(device, runs=10):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(runs + 2):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * n / statistics.median(times[2:])


def time_steps(run_step, steps):
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        run_step()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="eager,cuda_graph,compile_graph")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--positions", default="100,1000")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_torch_peer: no CUDA device; nothing to measure", file=sys.stderr)
        return 0
    device = torch.device("cuda")
    positions = [int(p) for p in args.positions.split(",")]
    max_seq = max(positions) + args.steps + 16
    torch.manual_seed(0)
    model = Decoder(max_seq, device)
    bandwidth = copy_bandwidth(device)
    floor_ms = 1e3 * model.weight_bytes / bandwidth
    print(f"device {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"weights {model.weight_bytes * 1e-9:.3f} GB; copy {bandwidth * 1e-9:.0f} GB/s; "
          f"floor {floor_ms:.4f} ms/step; cache {max_seq} positions", flush=True)

    def at(position):
        model.pos.fill_(position)
        model.token.fill_(1)

    for mode in args.modes.split(","):
        t0 = time.time()
        if mode == "eager":
            run = model.step
        elif mode in ("cuda_graph", "compile_graph"):
            fn = model.step
            if mode == "compile_graph":
                fn = torch.compile(model.step, mode="max-autotune-no-cudagraphs", fullgraph=True)
            at(positions[0])
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        else:
            print(f"gpu_torch_peer: unknown mode {mode}", file=sys.stderr)
            return 2
        setup_s = time.time() - t0
        for position in positions:
            at(position)
            for _ in range(4):
                run()
            ms = time_steps(run, args.steps)
            print(f"{mode:14s} pos {position:5d}: {ms:.4f} ms/step, {1e3 / ms:7.1f} tokens/s, "
                  f"floor ratio {floor_ms / ms:.3f} (setup {setup_s:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
