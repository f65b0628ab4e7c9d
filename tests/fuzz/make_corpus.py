#!/usr/bin/env python3
"""Writes the fuzz seed corpora (tests/fuzz/corpus/<harness>/): small valid inputs of each
kind, so that the fuzzers start from the formats' structure rather than from nothing, and
structure-aware hostile seeds (deep nesting, long special tokens against their prefixes,
long runs of combining marks, patterns that match empty or backtrack) that random
mutation of small inputs would not reach. Every seed is also a ctest replay case: keep
them small. Deterministic; rerun after changing a format. Needs numpy and gguf for the
gguf corpus.

    python3 tests/fuzz/make_corpus.py [corpus names...]   (default: all)
"""

import json
import os
import random
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")


def folder(name):
    """Empties corpus/<name> of the seeds written here, keeping the crash_* inputs: those
    are regression tests, found by the fuzzers and added by hand."""
    path = os.path.join(HERE, "corpus", name)
    os.makedirs(path, exist_ok=True)
    for entry in os.listdir(path):
        if not entry.startswith("crash_"):
            os.remove(os.path.join(path, entry))
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
    # A header nested past the bound, where a shape belongs.
    header = ('{"t": {"dtype": "F32", "shape": ' + deep_array(3000) +
              ', "data_offsets": [0, 4]}}').encode()
    with open(os.path.join(d, "hostile_deep_header"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(4))


def deep_array(depth):
    return "[" * depth + "1" + "]" * depth


def make_config():
    d = folder("config")
    for name in sorted(os.listdir(FIXTURES)):
        src = os.path.join(FIXTURES, name, "config.json")
        if os.path.isfile(src):
            shutil.copy(src, os.path.join(d, name))
    minimal = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                   num_attention_heads=2, vocab_size=10)
    with open(os.path.join(d, "minimal"), "w") as f:
        json.dump(minimal, f)
    # Nesting past the bound in an unknown key and in a field of the wrong type (both used
    # to be serialised whole for the message), and a number the parser quotes in its error.
    body = json.dumps(minimal)[:-1]
    with open(os.path.join(d, "hostile_deep_unknown_key"), "w") as f:
        f.write(body + ', "unknown": ' + deep_array(3000) + "}")
    with open(os.path.join(d, "hostile_deep_rope_scaling"), "w") as f:
        f.write(body + ', "rope_scaling": ' + deep_array(3000) + "}")
    with open(os.path.join(d, "hostile_long_number"), "w") as f:
        f.write(body + ', "unknown": ' + "7" * 20000 + "}")


def make_gguf():
    import gguf
    import numpy as np

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
    # A tiny Llama: hidden 32, 2 heads, 1 KV head, 1 layer, vocab 8, Q8_0 matrices.
    def q8_0(w, name, x):
        if x.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)
    tiny_llama(os.path.join(d, "tiny_llama"), rng, 16, {},
               {"blk.0.ffn_gate.weight": (32, 32), "blk.0.ffn_up.weight": (32, 32),
                "blk.0.ffn_down.weight": (32, 32)}, q8_0)

    # A tiny BF16 mixture of experts as llama.cpp's converter writes one: 4 experts, 2
    # chosen, the router (ffn_gate_inp) in F32 (rounded to BF16 at load), F32 norms.
    def bf16(w, name, x):
        if x.ndim == 1 or name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(name, x)
        else:
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
            w.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    tiny_llama(os.path.join(d, "tiny_moe_bf16"), rng, 64,
               {"expert_count": 4, "expert_used_count": 2},
               {"blk.0.ffn_gate_inp.weight": (4, 32), "blk.0.ffn_gate_exps.weight": (4, 32, 32),
                "blk.0.ffn_up_exps.weight": (4, 32, 32),
                "blk.0.ffn_down_exps.weight": (4, 32, 32)}, bf16)

    # The same with Q4_1 gate experts: one quantized tensor makes the file compute in f32,
    # so every BF16 tensor is widened to F32 at load and the weights take more bytes than
    # the file (at most twice its float tensors').
    def q4_1_gate(w, name, x):
        if name.endswith("ffn_gate_exps.weight"):
            w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_1),
                         raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        else:
            bf16(w, name, x)
    tiny_llama(os.path.join(d, "tiny_moe_q4_1_bf16"), rng, 64,
               {"expert_count": 4, "expert_used_count": 2},
               {"blk.0.ffn_gate_inp.weight": (4, 32), "blk.0.ffn_gate_exps.weight": (4, 32, 32),
                "blk.0.ffn_up_exps.weight": (4, 32, 32),
                "blk.0.ffn_down_exps.weight": (4, 32, 32)}, q4_1_gate)

    # A tiny Gemma 3 (its q/k head norms and sandwich norms, a window and a layer pattern
    # of its own): the family keys ReadFamilyKeys reads for it.
    tiny_llama(os.path.join(d, "tiny_gemma3"), rng, 16,
               {"attention.sliding_window": 4, "attention.sliding_window_pattern": 2},
               {"blk.0.ffn_gate.weight": (32, 32), "blk.0.ffn_up.weight": (32, 32),
                "blk.0.ffn_down.weight": (32, 32), "blk.0.attn_q_norm.weight": (16,),
                "blk.0.attn_k_norm.weight": (16,), "blk.0.post_attention_norm.weight": (32,),
                "blk.0.post_ffw_norm.weight": (32,)}, q8_0, arch="gemma3")


def tiny_llama(path, rng, context, keys, mlp_shapes, add, arch="llama"):
    """A one-layer GGUF of architecture `arch` (hidden 32, 2 heads, 1 KV head, vocab 8)
    with `keys` beside the usual ones and the tensors `mlp_shapes` beside Llama's; each
    tensor's random values go to add(writer, name, values)."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(path, arch)
    for key, value in [("context_length", context), ("embedding_length", 32),
                       ("block_count", 1), ("feed_forward_length", 32),
                       ("attention.head_count", 2), ("attention.head_count_kv", 1),
                       *keys.items()]:
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_token_list([f"t{i}" for i in range(8)])
    shapes = {"token_embd.weight": (8, 32), "blk.0.attn_norm.weight": (32,),
              "blk.0.attn_q.weight": (32, 32), "blk.0.attn_k.weight": (16, 32),
              "blk.0.attn_v.weight": (16, 32), "blk.0.attn_output.weight": (32, 32),
              "blk.0.ffn_norm.weight": (32,), **mlp_shapes, "output_norm.weight": (32,)}
    for name, shape in shapes.items():
        add(w, name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

def gguf_bytes(metadata):
    """A GGUF v3 file of metadata only: [(key, type, encoded value)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    for key, value_type, value in metadata:
        k = key.encode()
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", value_type) + value
    return out


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_array(element_type, encoded):
    return struct.pack("<IQ", element_type, len(encoded)) + b"".join(encoded)


def byte_level_alphabet():
    """GPT-2's byte -> character table."""
    out, n = {}, 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def byte_tokenizer(pre_tokenizer, added=(), normalizer=None):
    """tokenizer.json of a byte-level BPE over the 256 byte characters, one merge."""
    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    vocab["ab"] = 256
    return {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
            "added_tokens": list(added), "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "decoder": {"type": "ByteLevel"}}


def split_then_bytes(*patterns):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
        for p in patterns] + [{"type": "ByteLevel", "add_prefix_space": False,
                               "use_regex": False}]}


def make_tokenizer():
    # The corpus also holds seeds made by hand (text_ascii, gguf_spm, ...): only these are
    # rewritten.
    d = os.path.join(HERE, "corpus", "tokenizer")
    # Text seeds (first byte even) for the bl_smollm fixture, whose special tokens are
    # <|im_start|>, <|im_end|> and <|endoftext|>: prefixes of them over and over, and a
    # long run of marks of two classes.
    with open(os.path.join(d, "text_special_prefixes"), "wb") as f:
        f.write(b"\x00" + b"<|im_star" * 1500 + b"<|im_start|>user")
    with open(os.path.join(d, "text_mark_run"), "wb") as f:
        f.write(b"\x00" + ("a" + "\u0301" * 3000 + "\u0316" * 3000).encode())
    # GGUF seeds (first byte odd): a token type that only fits 64 bits.
    tokens = gguf_array(8, [gguf_string(t) for t in ("a", "b", "ab")])
    metadata = [("tokenizer.ggml.model", 8, gguf_string("gpt2")),
                ("tokenizer.ggml.tokens", 9, tokens),
                ("tokenizer.ggml.merges", 9, gguf_array(8, [gguf_string("a b")])),
                ("tokenizer.ggml.token_type", 9,
                 gguf_array(11, [struct.pack("<q", v) for v in (1, 1, (1 << 32) + 3)]))]
    with open(os.path.join(d, "hostile_gguf_token_type_64_bit"), "wb") as f:
        f.write(b"\x01" + gguf_bytes(metadata))


def make_tokenizer_json():
    """Seeds of the tokenizer.json + chat template harness: tokenizer.json, NUL,
    tokenizer_config.json, NUL, chat_template.jinja, NUL, text."""
    d = folder("tokenizer_json")

    def seed(name, tokenizer, config=None, jinja=None, text=""):
        parts = [tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer),
                 "" if config is None else json.dumps(config), jinja or "", text]
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"\0".join(p.encode() for p in parts))

    fixtures = os.path.join(FIXTURES, "tokenizer")
    with open(os.path.join(fixtures, "bl_smollm", "tokenizer.json"), encoding="utf-8") as f:
        smollm = f.read()
    with open(os.path.join(fixtures, "chat", "smollm2.jinja"), encoding="utf-8") as f:
        smollm2_template = f.read()
    seed("smollm_chatml", smollm,
         {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, smollm2_template,
         "Hi <|im_end|> there \u00e9\u0301 123")
    seed("split_empty_matches", byte_tokenizer(split_then_bytes("$", "a*", "\\b", "\\z")),
         text="aab ba\nab\n \u00e9 x")
    seed("hostile_backtracking", byte_tokenizer(split_then_bytes("(a+)+b|.")),
         text=("a" * 19 + "c") * 200)
    deep = {"type": "NFC"}
    for _ in range(300):
        deep = {"type": "Sequence", "normalizers": [deep]}
    seed("hostile_deep_sequence", byte_tokenizer(split_then_bytes("."), normalizer=deep))
    long_token = "a" * 4095 + "b"
    seed("hostile_long_special_token",
         byte_tokenizer(split_then_bytes("."),
                        added=[{"id": 257, "content": long_token, "special": True}]),
         text="a" * 12000 + long_token)
    seed("hostile_nfc_mark_run", byte_tokenizer(split_then_bytes("."), normalizer={"type": "NFC"}),
         text="a" + "\u0301" * 3000 + "\u0316" * 3000 + "\u0598\u1ac3")
    huge_id = json.dumps(byte_tokenizer(split_then_bytes("."))).replace(
        '"ab": 256', '"ab": 1e30')
    seed("hostile_float_id", huge_id, text="ab")
    seed("hostile_inst_reversed", byte_tokenizer(split_then_bytes("."),
                                                added=[{"id": 257, "content": "</s>",
                                                        "special": True}]),
         {"eos_token": "</s>",
          "chat_template": "{% for message in messages %}{{ '[/INST]' + message['content'] "
                           "+ '[INST]' }}{% endfor %}"},
         text="hi")
    seed("hostile_deep_config", byte_tokenizer(split_then_bytes(".")),
         {"chat_template": json.loads(deep_array(200))}, text="x")


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


def make_jinja():
    """Seeds of the chat template harness: the real templates of the fixtures, and hostile
    ones (deep nesting of each kind, loops and strings that grow past the bounds, a macro
    calling itself, unclosed tags)."""
    d = folder("jinja")
    for sub in ("chat_templates", os.path.join("tokenizer", "chat")):
        src = os.path.join(FIXTURES, sub)
        for name in sorted(os.listdir(src)):
            if name.endswith(".jinja"):
                shutil.copyfile(os.path.join(src, name), os.path.join(d, name[:-6]))
    hostile = {
        "deep_parens": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
        "deep_ifs": "{% if 1 %}" * 3000,
        "deep_filters": "{{ 'a'" + "|trim" * 3000 + " }}",
        "deep_lists": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
        "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}"
                        "{% endfor %}{% endfor %}",
        "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "repeat": "{{ 'x' * 100000000 }}{{ [1] * 100000000 }}",
        "macro_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "unclosed": "{% for m in messages %}{{ m.content",
        "everything": "{%- set ns = namespace(n=0) -%}{% for m in messages[::-1] if m.role %}"
                      "{{ loop.index ~ m.role | upper }}{{ m.content.split(' ')[-1].strip() }}"
                      "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ messages | tojson(indent=2) }}"
                      "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') "
                      "| join(', ') }}{{ strftime_now('%d %b %Y') }}{{ raise_exception('end') }}",
    }
    for name, text in hostile.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)


MAKERS = {"safetensors": make_safetensors, "config": make_config, "gguf": make_gguf,
          "builder": make_builder, "tokenizer": make_tokenizer,
          "tokenizer_json": make_tokenizer_json, "jinja": make_jinja}

if __name__ == "__main__":
    for name in sys.argv[1:] or MAKERS:
        MAKERS[name]()
