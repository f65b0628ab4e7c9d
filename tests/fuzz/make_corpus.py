#!/usr/bin/env python3
"""Writes the fuzz seed corpora (tests/fuzz/corpus/<harness>/): small valid inputs of each
kind, so that the fuzzers start from the formats' structure rather than from nothing.
Deterministic; rerun after changing a format. Needs numpy and gguf."""

import json
import os
import random
import shutil
import struct

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")


def folder(name):
    path = os.path.join(HERE, "corpus", name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(bytes((i * 37 + 11) % 256 for i in range(size)))
        offset += size
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make_safetensors():
    d = folder("safetensors")
    safetensors(os.path.join(d, "two"), [("w", "F32", [2, 3], 24), ("b", "BF16", [3], 6)])
    safetensors(os.path.join(d, "meta"), [("ids", "I32", [4], 16), ("h", "F16", [1, 2], 4)],
                {"format": "pt"})
    safetensors(os.path.join(d, "empty_tensor"), [("e", "F32", [0, 4], 0), ("x", "F32", [1], 4)])
    with open(os.path.join(d, "no_tensors"), "wb") as f:
        f.write(struct.pack("<Q", 2) + b"{}")


def make_config():
    d = folder("config")
    for name in sorted(os.listdir(FIXTURES)):
        src = os.path.join(FIXTURES, name, "config.json")
        if os.path.isfile(src):
            shutil.copy(src, os.path.join(d, name))
    with open(os.path.join(d, "minimal"), "w") as f:
        json.dump(dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, vocab_size=10), f)


def make_gguf():
    d = folder("gguf")
    # Every value type and a tensor of each type stepgraph reads.
    w = gguf.GGUFWriter(os.path.join(d, "values_and_types"), "llama")
    w.add_uint8("v.u8", 200)
    w.add_int8("v.i8", -3)
    w.add_uint16("v.u16", 600)
    w.add_int16("v.i16", -600)
    w.add_uint32("v.u32", 70000)
    w.add_int32("v.i32", -70000)
    w.add_float32("v.f32", 0.5)
    w.add_bool("v.bool", True)
    w.add_string("v.str", "text")
    w.add_uint64("v.u64", 1 << 40)
    w.add_int64("v.i64", -(1 << 40))
    w.add_float64("v.f64", 2.5)
    w.add_array("v.strs", ["a", "bc"])
    w.add_array("v.ints", [1, 2, 3])
    w.add_array("v.floats", [0.25, 0.5])
    rng = np.random.default_rng(0)
    for t in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
              "Q6_K"):
        qtype = gguf.GGMLQuantizationType[t]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        cols = max(block, 4)
        raw = rng.integers(0, 255, size=(2, cols // block * size), dtype=np.uint8)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(f"t.{t}", rng.standard_normal((2, cols)).astype(
                np.float32 if t == "F32" else np.float16))
        else:
            w.add_tensor(f"t.{t}", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # A tiny Llama: hidden 32, 2 heads, 1 KV head, 1 layer, vocab 8.
    w = gguf.GGUFWriter(os.path.join(d, "tiny_llama"), "llama")
    for key, value in [("context_length", 16), ("embedding_length", 32), ("block_count", 1),
                       ("feed_forward_length", 32), ("attention.head_count", 2),
                       ("attention.head_count_kv", 1)]:
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_token_list([f"t{i}" for i in range(8)])
    shapes = {"token_embd.weight": (8, 32), "blk.0.attn_norm.weight": (32,),
              "blk.0.attn_q.weight": (32, 32), "blk.0.attn_k.weight": (16, 32),
              "blk.0.attn_v.weight": (16, 32), "blk.0.attn_output.weight": (32, 32),
              "blk.0.ffn_norm.weight": (32,), "blk.0.ffn_gate.weight": (32, 32),
              "blk.0.ffn_up.weight": (32, 32), "blk.0.ffn_down.weight": (32, 32),
              "output_norm.weight": (32,)}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2:
            w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_builder():
    d = folder("builder")
    # A valid small graph (see builder_fuzz.cc for the encoding): ids input, an f32
    # table, Embedding, a weight, MatMul, Argmax, an output.
    program = bytes([
        0, 1, 3, 1, 0,          # Input "t1" i32 [1]        -> id 2
        1, 2, 0, 2, 8, 8,       # Weight "t2" f32 [64,64]   -> id 3
        3, 3, 2, 5,             # Embedding(t2, t1) "t5"    -> id 4
        1, 6, 0, 2, 7, 8,       # Weight "t6" f32 [32,64]   -> id 5
        5, 4, 5, 7,             # MatMul(id4, id5) "t7"     -> id 6
        17, 6, 9,               # Argmax(id6) "t9"          -> id 7
        21, 10, 7,              # Output "t10" = id7
    ])
    with open(os.path.join(d, "small_graph"), "wb") as f:
        f.write(program)
    rng = random.Random(1)
    for i in range(4):
        with open(os.path.join(d, f"random_{i}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(64 * (i + 1))))


if __name__ == "__main__":
    make_safetensors()
    make_config()
    make_gguf()
    make_builder()
