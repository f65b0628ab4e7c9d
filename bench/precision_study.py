#!/usr/bin/env python3
"""What rounding x in a prompt's quantized matmuls does to a real model's greedy ids.

The question behind CudaOptions::block_gemm_precision's default (docs/gguf.md): a prompt's
matmuls over block-format weights are fastest on the tensor cores with x rounded to bf16
(and, in the block GEMM, the weights too), where exact f32 products cost three bf16 MMAs
each. This script answers it on the real SmolLM2-135M-Instruct Q4_1 file with a plain
NumPy Llama (the GGUF's weights dequantized exactly, as the CPU reference does): each
prompt is prefilled with the inputs of every matmul treated as a mode says, then decoded
greedily in exact f32, and the ids are compared with the exact run's.

Modes: f32 (exact; the baseline), f64 (the prompt in float64: differences of the size of
f32 rounding, the noise any change of summation order makes), bf16x2 (x as the sum of two
bf16 parts, 16 significant bits, weights exact: the tensor-core block kernel with two
parts), bf16x (x rounded to bf16, weights exact: the tensor-core block kernel with one
part), bf16xw (x and weights rounded to bf16: the block GEMM through cuBLASLt), f16x and
f16xw (the same rounded to f16: 11 significant bits where bf16 keeps 8, and no value past
65504), q8 (x quantized to int8 per 32 values with one
scale, weights exact: how llama.cpp multiplies quantized weights), q16 (int16, one scale:
--block-gemv-precision int16), q16x2 (two int16 parts with a power-of-two scale, each
value held to 2^-30 of its unit's largest: --block-gemv-precision int16x2). Attention
too: f16xw_f16att (the matmuls as f16xw, and the prompt's attention with q, k, v and the
softmax's probabilities rounded to f16 before their products, sums in f32: a tensor-core
prefill attention for f32 models, or an f16 KV cache), f16att (that attention alone, the
matmuls exact).

Needs numpy and gguf (PyPI) and the file (tests/models/fetch_smollm2.sh puts it in the
tests' cache); the prompts' ids come from the stepgraph program's tokenizer:

  bench/precision_study.py --stepgraph BUILD/stepgraph [--model FILE] [--tokens 64]
"""
import argparse
import os
import subprocess
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("precision_study.py needs the gguf package (pip install gguf)")

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain how a rainbow forms, in three sentences.",
    "List five fruits that are red.",
    "What is 17 times 23? Show your work.",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Summarise the plot of Romeo and Juliet.",
    "Give me three tips for writing clean Python code.",
    "Why is the sky blue?",
    "Describe the water cycle to a ten-year-old.",
    "What are the main differences between a CPU and a GPU?",
    "Write a haiku about autumn leaves.",
    "How do vaccines train the immune system?",
    "Suggest a name for a small bakery in a seaside town, and explain why.",
    "What happened during the French Revolution? Keep it brief.",
    "Write a function in C that reverses a string in place.",
    "Compare cats and dogs as pets for someone who works long hours.",
    "What is photosynthesis, and why does it matter for life on Earth?",
    "Tell me a short story about a robot who learns to paint. It lives in a quiet village "
    "by the mountains, and the villagers are wary of it at first.",
    "I am planning a three-day trip to Rome in spring. Which sights should I see, in what "
    "order, and where should I eat? I like history, long walks and simple food, and I do "
    "not want to spend much on tickets.",
    "Here is a paragraph: 'The committee met on Tuesday to discuss the budget. After a long "
    "debate, they agreed to increase funding for the library by ten percent, while cutting "
    "the parks budget slightly. Several members objected, arguing that the parks serve more "
    "residents.' Summarise it in one sentence and name the main disagreement.",
    "Explain the difference between a list and a tuple in Python, with an example of when "
    "you would use each, and mention what happens if you try to change a tuple.",
    "What is the boiling point of water at the top of Mount Everest, and why is it lower "
    "than at sea level?",
    "Write a polite email to a colleague asking them to review a document by Friday.",
]

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(prompt):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            "<|im_start|>assistant\n")


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)

        def field(name):
            return r.fields[name].contents()

        self.layers = field("llama.block_count")
        self.heads = field("llama.attention.head_count")
        self.kv_heads = field("llama.attention.head_count_kv")
        self.dim = field("llama.embedding_length")
        self.hd = self.dim // self.heads
        self.theta = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.w = {}
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed(t.shape))
            a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            self.w[t.name] = a.reshape(shape)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        inv = self.theta ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.inv_freq = inv

    def rope(self, x, pos):
        # GGUF's llama q/k are permuted for rotation of adjacent pairs.
        ang = np.outer(pos, self.inv_freq)  # [t, hd/2]
        c = np.cos(ang).astype(x.dtype)[:, None, :]
        s = np.sin(ang).astype(x.dtype)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def forward(self, ids, cache, start, mm, dt, att=None):
        """ids [t] at positions start..; cache: per layer (k, v) lists; returns last logits.
        att, when given, rounds the attention's q, k, v and probabilities before their
        products."""
        w = self.w
        att = att or (lambda a: a)
        x = w["token_embd.weight"][ids].astype(dt)
        pos = np.arange(start, start + len(ids))
        t = len(ids)
        for i in range(self.layers):
            p = f"blk.{i}."
            h = rms(x, w[p + "attn_norm.weight"], self.eps, dt)
            q = mm(h, w[p + "attn_q.weight"]).reshape(t, self.heads, self.hd)
            k = mm(h, w[p + "attn_k.weight"]).reshape(t, self.kv_heads, self.hd)
            v = mm(h, w[p + "attn_v.weight"]).reshape(t, self.kv_heads, self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            ks, vs = cache[i]
            ks.append(k.astype(np.float32))
            vs.append(v.astype(np.float32))
            K = np.concatenate(ks).astype(dt)
            V = np.concatenate(vs).astype(dt)
            rep = self.heads // self.kv_heads
            K = np.repeat(K, rep, axis=1)
            V = np.repeat(V, rep, axis=1)
            sc = np.einsum("thd,shd->hts", att(q), att(K)) / np.sqrt(self.hd).astype(dt)
            total = K.shape[0]
            mask = np.arange(total)[None, :] > (pos[:, None])
            sc = np.where(mask[None], -np.inf, sc)
            sc = sc - sc.max(-1, keepdims=True)
            e = np.exp(sc)
            a = e / e.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att(a), att(V)).reshape(t, self.dim)
            x = x + mm(o, w[p + "attn_output.weight"])
            h = rms(x, w[p + "ffn_norm.weight"], self.eps, dt)
            g = mm(h, w[p + "ffn_gate.weight"])
            u = mm(h, w[p + "ffn_up.weight"])
            x = x + mm(g / (1 + np.exp(-g)) * u, w[p + "ffn_down.weight"])
        h = rms(x[-1:], w["output_norm.weight"], self.eps, dt)
        return mm(h, w["output.weight"])[0].astype(np.float32)


def rms(x, w, eps, dt):
    ms = (x.astype(dt) ** 2).mean(-1, keepdims=True)
    return (x / np.sqrt(ms + dt(eps)) * w).astype(dt)


def bf16(a):
    """a rounded to bf16 (round to nearest even), kept in float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def f16(a):
    """a rounded to f16 (round to nearest even; past 65504 infinite), kept in float32."""
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


def bf16x2(a):
    """a as the sum of two bf16 parts (the first rounded, then what it left), as float32."""
    hi = bf16(a)
    return hi + bf16(np.asarray(a, dtype=np.float32) - hi)


def quantize_x(a, top):
    """a quantized per 32 values to integers in [-top, top] with one scale (max / top), as
    float32: top 127 is int8, 32767 int16."""
    s = a.reshape(a.shape[0], -1, 32)
    d = np.abs(s).max(-1, keepdims=True) / top
    q = np.round(np.where(d > 0, s / np.where(d > 0, d, 1), 0))
    return (q * d).reshape(a.shape).astype(np.float32)


def quantize_x2(a):
    """a per 32 values as two int16 parts with a power-of-two scale 2^(14-e), e the
    exponent of the largest magnitude (as frexp gives it): the first part rounds a·scale,
    the second the remainder times 2^15 (--block-gemv-precision int16x2), as float32."""
    s = a.reshape(a.shape[0], -1, 32).astype(np.float32)
    _, e = np.frexp(np.abs(s).max(-1, keepdims=True))
    scale = np.ldexp(np.float32(1), 14 - np.maximum(e, -100)).astype(np.float32)
    v = s * scale
    hi = np.round(v)
    lo = np.round((v - hi) * np.float32(32768))
    return ((hi + lo / np.float32(32768)) / scale).reshape(a.shape).astype(np.float32)


def quantize_x8(a, parts):
    """a per 32 values as `parts` int8 parts with a power-of-two scale 2^(5-e), e the
    exponent of the largest magnitude: the first part rounds a·scale (at most 32), each
    next one the remainder times 2^7 (the int8-MMA readings of x tried for the tensor-core
    block kernel: docs/cuda_kernels.md), as float32."""
    s = a.reshape(a.shape[0], -1, 32).astype(np.float32)
    _, e = np.frexp(np.abs(s).max(-1, keepdims=True))
    scale = np.ldexp(np.float32(1), 5 - np.maximum(e, -100)).astype(np.float32)
    r = s * scale
    got = np.zeros_like(r)
    step = np.float32(1)
    for _ in range(parts):
        p = np.round(r)
        got += p * step
        r = (r - p) * np.float32(128)
        step = step / np.float32(128)
    return (got / scale).reshape(a.shape).astype(np.float32)


MODES = {
    "f32": (lambda x, w: x.astype(np.float32) @ w.T, np.float32),
    "f64": (lambda x, w: x.astype(np.float64) @ w.T.astype(np.float64), np.float64),
    "bf16x2": (lambda x, w: bf16x2(x) @ w.T, np.float32),
    "bf16x": (lambda x, w: bf16(x) @ w.T, np.float32),
    "bf16xw": (lambda x, w: bf16(x) @ bf16(w).T, np.float32),
    "f16x": (lambda x, w: f16(x) @ w.T, np.float32),
    "f16xw": (lambda x, w: f16(x) @ f16(w).T, np.float32),
    "q8": (lambda x, w: quantize_x(x, 127.0) @ w.T, np.float32),
    "q16": (lambda x, w: quantize_x(x, 32767.0) @ w.T, np.float32),
    "q16x2": (lambda x, w: quantize_x2(x) @ w.T, np.float32),
    "q8x2": (lambda x, w: quantize_x8(x, 2) @ w.T, np.float32),
    "q8x3": (lambda x, w: quantize_x8(x, 3) @ w.T, np.float32),
    "f16xw_f16att": (lambda x, w: f16(x) @ f16(w).T, np.float32, f16),
    "f16att": (lambda x, w: x.astype(np.float32) @ w.T, np.float32, f16),
}


def generate(model, ids, mode, tokens, stop, decode=False):
    mm, dt, *att = MODES[mode]
    cache = [([], []) for _ in range(model.layers)]
    logits = model.forward(np.array(ids), cache, 0, mm, dt, *att)
    first = logits
    out = []
    step_mm, step_dt, *step_att = MODES[mode if decode else "f32"]
    pos = len(ids)
    for _ in range(tokens):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if nxt in stop:
            break
        logits = model.forward(np.array([nxt]), cache, pos, step_mm, step_dt, *step_att)
        pos += 1
    return out, first


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stepgraph", required=True, help="the stepgraph program (its tokenizer)")
    ap.add_argument("--model", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "stepgraph-test",
        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens a prompt (64)")
    ap.add_argument("--modes", default="f64,bf16x2,bf16x,bf16xw,q8")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--decode", action="store_true",
                    help="decode the tokens after the prompt in the mode too")
    args = ap.parse_args()
    model = Model(args.model)
    stop = {2}
    modes = args.modes.split(",")
    same = {m: 0 for m in modes}
    agree = {m: [] for m in modes}
    err = {m: [] for m in modes}
    lengths = []
    for n, prompt in enumerate(PROMPTS[:args.prompts]):
        ids = subprocess.run([args.stepgraph, "tokenize", "--model", args.model, "--text",
                              chat(prompt)], check=True, capture_output=True,
                             text=True).stdout.strip()
        ids = [int(i) for i in ids.split(",")]
        lengths.append(len(ids))
        ref, ref_logits = generate(model, ids, "f32", args.tokens, stop)
        line = [f"prompt {n:2d} ({len(ids):3d} ids):"]
        for m in modes:
            got, logits = generate(model, ids, m, args.tokens, stop, args.decode)
            k = 0
            while k < min(len(got), len(ref)) and got[k] == ref[k]:
                k += 1
            whole = got == ref
            same[m] += whole
            agree[m].append(k / len(ref))
            e = float(np.linalg.norm(logits - ref_logits) / np.linalg.norm(ref_logits))
            err[m].append(e)
            line.append(f"{m} {'same' if whole else f'first differs at {k}/{len(ref)}'}"
                        f" (logits {e:.1e})")
        print(" ".join(line), flush=True)
    count = len(lengths)
    print(f"\n{count} prompts of {min(lengths)}-{max(lengths)} ids, {args.tokens} greedy tokens"
          " each (stop at <|im_end|>), the prompt in each mode, the tokens after it "
          + ("in the mode too:" if args.decode else "exact f32:"))
    print("| mode | prompts whose ids equal exact f32's | mean share of ids before the first"
          " difference | first logits' normalised error (median, max) |")
    print("|---|---|---|---|")
    for m in modes:
        print(f"| {m} | {same[m]} / {count} | {np.mean(agree[m]):.3f} | "
              f"{np.median(err[m]):.1e}, {np.max(err[m]):.1e} |")


if __name__ == "__main__":
    main()
