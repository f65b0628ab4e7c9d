#!/usr/bin/env python3
"""The Python half of bench/peers/family_peer.sh: Qwen3 files beyond Llama, stepgraph
against llama.cpp on the same file, decode at batch 1 against the floor of the bytes a
token actually reads (for a mixture of experts: the chosen experts only).

  write --out DIR [--shapes LIST] [--moe-layers N] [--random-q4-k]
                                          the BF16 files, random weights laid out as
                                          llama.cpp's convert_hf_to_gguf.py writes them
                                          (BF16 matrices, F32 norms and router); with
                                          --random-q4-k <shape>-random-q4_k files instead,
                                          every matrix whose rows are whole 256-value blocks
                                          random Q4_K blocks (finite scales), the rest BF16:
                                          for `stepgraph bench --profile` without
                                          llama-quantize (not a llama.cpp peer's file)
  run --work DIR --logs DIR --stepgraph BIN --llama-bin DIR [--files LIST]
  table --work DIR
  selftest --work DIR --stepgraph BIN     without a GPU: small files of both families
                                          written, their floors computed, run by
                                          stepgraph's CPU reference; the table from samples

Shapes: qwen3-8b (Qwen3-8B's config.json) and qwen3-moe (Qwen3-30B-A3B's layers: 128
experts of 768, 8 chosen, hidden 2048; 12 of its 48 layers by default so that its BF16
file, 15 GB, and the Q4_K_M made of it fit the GPU machine's disk with the 8B's; the
ratio to llama.cpp and to the floor is per layer the same). Files: <shape>-bf16 and
<shape>-q4_k_m (llama-quantize of the BF16 file).

Needs numpy and the gguf package (family_peer.sh puts the prepared wheel on PYTHONPATH).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_peer  # noqa: E402  (file keys, vocabulary, parsers, logged runs)

SHAPES = {
    "qwen3-8b": dict(arch="qwen3", hidden=4096, intermediate=12288, layers=36, heads=32,
                     kv_heads=8, head_dim=128, vocab=151936, context=40960, theta=1e6,
                     eps=1e-6),
    "qwen3-moe": dict(arch="qwen3moe", hidden=2048, intermediate=6144, layers=12, heads=32,
                      kv_heads=4, head_dim=128, vocab=151936, context=40960, theta=1e6,
                      eps=1e-6, experts=128, used=8, expert_ff=768),
    # Small ones of the same kinds, for the self-test.
    "qwen3-small": dict(arch="qwen3", hidden=256, intermediate=512, layers=2, heads=8,
                        kv_heads=2, head_dim=32, vocab=1024, context=4096, theta=1e6,
                        eps=1e-6),
    "qwen3-moe-small": dict(arch="qwen3moe", hidden=256, intermediate=512, layers=2,
                            heads=8, kv_heads=2, head_dim=32, vocab=1024, context=4096,
                            theta=1e6, eps=1e-6, experts=8, used=2, expert_ff=64),
}
BIG = ["qwen3-8b", "qwen3-moe"]
QUANT = "q4_k_m"
PREFILL = 512  # the prompt both programs prefill (stepgraph's time to first token, pp512)


def file_name(shape, kind):
    return f"{shape}-{kind}.gguf"


def write_gguf(path, shape, moe_layers=None, seed=0, random_q4_k=False):
    """A Qwen3 (dense or MoE) GGUF with random BF16 matrices. The values come from one
    random pool that every matrix is a slice of (a speed benchmark needs finite, varied
    values, not independent ones; drawing 8 billion would take minutes). With random_q4_k
    the matrices whose rows are whole 256-value blocks are random Q4_K blocks instead:
    bytes from the pool, each block's two f16 scales set to small finite values."""
    import gguf
    import numpy as np
    s = dict(SHAPES[shape])
    if moe_layers and "experts" in s:
        s["layers"] = moe_layers
    t0 = time.time()
    rng = np.random.default_rng(seed)
    h, d, v = s["hidden"], s["head_dim"], s["vocab"]
    q, kv = s["heads"] * d, s["kv_heads"] * d
    largest = max(v * h, s.get("experts", 0) * s.get("expert_ff", 0) * h,
                  s["intermediate"] * h, q * h)
    # bf16 bits of N(0, 0.02) samples: the top half of their f32 bits (truncation).
    pool_f32 = rng.standard_normal(largest + 4096, dtype=np.float32) * np.float32(0.02)
    pool = (pool_f32.view(np.uint32) >> 16).astype(np.uint16)
    del pool_f32

    def slice_of_pool(n):
        off = int(rng.integers(0, pool.size - n + 1))
        return pool[off:off + n]

    bf16 = gguf.GGMLQuantizationType.BF16
    q4_k = gguf.GGMLQuantizationType.Q4_K
    # 256 values in 144 bytes: d, dmin (f16), 12 bytes of scales, 128 of quants.
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[q4_k]

    def matrix(*shape_):
        if random_q4_k and shape_[-1] % block_elems == 0:
            blocks = int(np.prod(shape_)) // block_elems
            raw = np.empty((blocks, block_bytes), dtype=np.uint8)
            flat = raw.reshape(-1)
            for at in range(0, flat.size, pool.size * 2):
                n = min(pool.size * 2, flat.size - at)
                flat[at:at + n] = slice_of_pool((n + 1) // 2).view(np.uint8)[:n]
            raw[:, 0:2] = np.array([np.float16(0.003)]).view(np.uint8)
            raw[:, 2:4] = np.array([np.float16(0.002)]).view(np.uint8)
            return raw.reshape(*shape_[:-1], shape_[-1] // block_elems * block_bytes), q4_k
        return slice_of_pool(int(np.prod(shape_))).reshape(shape_), bf16

    def add_matrix(name, *shape_):
        data, kind = matrix(*shape_)
        w.add_tensor(name, data, raw_dtype=kind)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path + ".part", s["arch"])
    w.add_name(f"stepgraph peer {shape} random")
    gguf_peer.add_decoder_keys(w, s)
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ff"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if random_q4_k
                    else gguf.LlamaFileType.MOSTLY_BF16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    gguf_peer.add_byte_vocab(w, v, "qwen2", ("<|im_start|>", "<|im_end|>"))
    add_matrix("token_embd.weight", v, h)
    for layer in range(s["layers"]):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        add_matrix(p + "attn_q.weight", q, h)
        add_matrix(p + "attn_k.weight", kv, h)
        add_matrix(p + "attn_v.weight", kv, h)
        add_matrix(p + "attn_output.weight", h, q)
        w.add_tensor(p + "attn_q_norm.weight", norm(d))
        w.add_tensor(p + "attn_k_norm.weight", norm(d))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        if "experts" in s:
            e, f = s["experts"], s["expert_ff"]
            router = (slice_of_pool(e * h).reshape(e, h).astype(np.uint32) << 16).view(np.float32)
            w.add_tensor(p + "ffn_gate_inp.weight", np.ascontiguousarray(router))
            add_matrix(p + "ffn_gate_exps.weight", e, f, h)
            add_matrix(p + "ffn_up_exps.weight", e, f, h)
            add_matrix(p + "ffn_down_exps.weight", e, h, f)
        else:
            i = s["intermediate"]
            add_matrix(p + "ffn_gate.weight", i, h)
            add_matrix(p + "ffn_up.weight", i, h)
            add_matrix(p + "ffn_down.weight", h, i)
    w.add_tensor("output_norm.weight", norm(h))
    add_matrix("output.weight", v, h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".part", path)
    print(f"family_peer: wrote {path} ({shape}, {s['layers']} layers, "
          f"{os.path.getsize(path) / 2**30:.2f} GiB) in {time.time() - t0:.1f} s", flush=True)


def token_bytes(path):
    """Bytes of weights one decode token reads from the file's tensors: every tensor whole
    but the embedding (one row) and the experts (the chosen ones: expert_used_count of
    expert_count). Returns (bytes, all weight bytes)."""
    import gguf
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    experts = used = 1
    if f"{arch}.expert_count" in r.fields:
        experts = int(r.fields[f"{arch}.expert_count"].contents())
        used = int(r.fields[f"{arch}.expert_used_count"].contents())
    read = total = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        total += n
        if t.name == "token_embd.weight":
            read += n // int(t.shape[-1])
        elif "_exps." in t.name:
            read += n * used // experts
        else:
            read += n
    return read, total


def measure(name, path, args):
    r = {"file": os.path.basename(path), "bytes": os.path.getsize(path)}
    r["token_bytes"], r["weight_bytes"] = token_bytes(path)
    text, r["sg_gpu_mib"] = gguf_peer.run_logged(
        [args.stepgraph, "bench", "--model", path, "--positions", "100", "--ttft-lengths",
         str(PREFILL)],
        os.path.join(args.logs, f"{name}-stepgraph.log"), 900, memory=True)
    r["sg"] = gguf_peer.parse_stepgraph_bench(text)
    text, r["llama_gpu_mib"] = gguf_peer.run_logged(
        [os.path.join(args.llama_bin, "llama-bench"), "-m", path, "-ngl", "99", "-fa", "1",
         "-p", str(PREFILL), "-n", "128", "-o", "json"],
        os.path.join(args.logs, f"{name}-llama-bench.log"), 900, memory=True)
    r["llama"] = gguf_peer.parse_llama_bench(text)
    return r


def run(args):
    results = load_results(args.work)
    names = args.files.split(",") if args.files != "all" else \
        [f"{s}-{k}" for s in BIG for k in ("bf16", QUANT)]
    os.makedirs(args.logs, exist_ok=True)
    results["gpu"] = gguf_peer.gpu_name()
    for name in names:
        shape, _, kind = name.rpartition("-")
        if shape not in SHAPES or kind not in ("bf16", QUANT):
            sys.exit(f"family_peer: unknown file '{name}' (<shape>-bf16 or <shape>-{QUANT}, "
                     f"shapes {','.join(SHAPES)})")
        bf16 = os.path.join(args.work, "files", file_name(shape, "bf16"))
        if not os.path.exists(bf16):
            write_gguf(bf16, shape, args.moe_layers)
        path = os.path.join(args.work, "files", file_name(shape, kind))
        if kind == QUANT and not os.path.exists(path):
            gguf_peer.run_logged([os.path.join(args.llama_bin, "llama-quantize"), bf16, path,
                                  "Q4_K_M"], os.path.join(args.logs, f"{name}-quantize.log"), 900)
        try:
            results["files"][name] = measure(name, path, args)
        except (RuntimeError, ValueError, KeyError) as e:
            print(f"family_peer: {name}: {e}", flush=True)
            results["files"][name] = {"error": str(e)[:500]}
        save_results(args.work, results)
    print(table(results))


RESULTS = "family_results.json"


def load_results(work):
    return gguf_peer.load_results(work, RESULTS)


def save_results(work, results):
    gguf_peer.save_results(work, results, RESULTS)


def table(results):
    """Decode at batch 1: ms/token of both, the ratio (> 1: stepgraph faster), the bytes a
    token reads and their floor at stepgraph's measured copy rate, each program's share of
    that floor; prefill of PREFILL tokens (tokens/s of both, the ratio) and the GPU memory
    each program used (MiB over the idle GPU)."""
    rows = []
    for name, r in results["files"].items():
        if "error" in r:
            rows.append(f"| {name} | failed: {r['error'][:80]} |")
            continue
        sg_ms = r["sg"]["positions"].get("100", r["sg"]["positions"].get(100))
        tg = r["llama"]["tests"].get("tg128")
        ll_ms = 1e3 / tg if tg else None
        gbs = r["sg"].get("copy_gbs")
        floor = r["token_bytes"] / (gbs * 1e9) * 1e3 if gbs else None
        share = [gguf_peer._ratio(floor, ms) for ms in (sg_ms, ll_ms)]
        sg_pp = r["sg"]["prefill"].get(str(PREFILL), r["sg"]["prefill"].get(PREFILL))
        ll_pp = r["llama"]["tests"].get(f"pp{PREFILL}")
        mib = [f"{v:,.0f}" if v else "—" for v in (r.get("sg_gpu_mib"), r.get("llama_gpu_mib"))]
        rows.append("| " + " | ".join([
            name, gguf_peer._ms(sg_ms), gguf_peer._ms(ll_ms), gguf_peer._ratio(ll_ms, sg_ms),
            gguf_peer._gib(r["weight_bytes"]), gguf_peer._gib(r["token_bytes"]),
            gguf_peer._ms(floor)] + share + [
            f"{sg_pp:,.0f}" if sg_pp else "—", f"{ll_pp:,.0f}" if ll_pp else "—",
            gguf_peer._ratio(sg_pp, ll_pp)] + mib) + " |")
    return "\n".join([
        f"GPU: {results.get('gpu', 'unknown')}",
        "",
        "Decode at batch 1 (stepgraph bench --positions 100, replayed; llama-bench -ngl 99 "
        f"-fa 1 -p {PREFILL} -n 128); floor: the weight bytes one token reads (the chosen "
        "experts only) at the device-to-device copy rate stepgraph measured; prefill of "
        f"{PREFILL} tokens (stepgraph's time to first token, llama.cpp's pp{PREFILL}); GPU "
        "memory: MiB over the idle GPU, the peak seen",
        "",
        "| file | sg ms/token | llama ms/token | ratio | weights GiB | read per token GiB "
        f"| floor ms | sg of floor | llama of floor | sg pp{PREFILL} tok/s | llama "
        f"pp{PREFILL} | ratio | sg MiB | llama MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows)


SAMPLE_RESULTS = {"gpu": "NVIDIA H200", "files": {"qwen3-moe-q4_k_m": {
    "file": "qwen3-moe-q4_k_m.gguf", "bytes": 4 << 30, "token_bytes": 1 << 29,
    "weight_bytes": 4 << 30,
    "sg": {"positions": {"100": 0.5}, "prefill": {"512": 30000.0}, "copy_gbs": 4294.967296},
    "sg_gpu_mib": 5353.0, "llama_gpu_mib": 5251.0,
    "llama": {"tests": {"tg128": 1000.0, "pp512": 20000.0}}}}}


def selftest(args):
    text = table(SAMPLE_RESULTS)
    # 0.5 GiB at 4294.97 GB/s: 0.125 ms; llama.cpp 1 ms against stepgraph's 0.5.
    # Prefill 30,000 against 20,000 tokens/s: 1.50.
    assert ("| qwen3-moe-q4_k_m | 0.500 | 1.000 | 2.00 | 4.000 | 0.500 | 0.125 | 0.25 | 0.12 "
            "| 30,000 | 20,000 | 1.50 | 5,353 | 5,251 |") in text, text
    print("family_peer: table agrees with the sample")
    os.makedirs(args.work, exist_ok=True)
    for shape in ("qwen3-small", "qwen3-moe-small"):
        path = os.path.join(args.work, file_name(shape, "bf16"))
        write_gguf(path, shape)
        read, total = token_bytes(path)
        s = SHAPES[shape]
        h, v = s["hidden"], s["vocab"]
        embd = v * h * 2
        if "experts" in s:
            exps = s["layers"] * 3 * s["experts"] * s["expert_ff"] * h * 2
            assert read == total - embd + h * 2 - exps + exps * s["used"] // s["experts"], \
                (read, total)
        else:
            assert read == total - embd + h * 2, (read, total)
        if not os.access(args.stepgraph, os.X_OK):
            print(f"family_peer: {args.stepgraph} not built; stepgraph's run skipped")
            continue
        out, _ = gguf_peer.run_logged(
            [args.stepgraph, "bench", "--cpu", "--model", path, "--positions", "20", "--steps",
             "4", "--ttft-lengths", "16"], os.path.join(args.work, f"{shape}-stepgraph.log"),
            300)
        r = gguf_peer.parse_stepgraph_bench(out)
        assert 20 in r["positions"], out
        print(f"family_peer: stepgraph ran {shape} (BF16, {read} of {total} weight bytes a "
              f"token): {r['positions'][20]} ms/token on the CPU reference")
        # The same shape with random Q4_K blocks where rows are whole blocks (the small
        # MoE's down experts, 64 values a row, stay BF16: a mixed file).
        qpath = os.path.join(args.work, file_name(shape, "random-q4_k"))
        write_gguf(qpath, shape, random_q4_k=True)
        out, _ = gguf_peer.run_logged(
            [args.stepgraph, "bench", "--cpu", "--model", qpath, "--positions", "20", "--steps",
             "4", "--ttft-lengths", "16"], os.path.join(args.work, f"{shape}-q4_k-stepgraph.log"),
            300)
        assert 20 in gguf_peer.parse_stepgraph_bench(out)["positions"], out
        print(f"family_peer: stepgraph ran {shape} with random Q4_K blocks")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True, help="folder of the files")
    w.add_argument("--shapes", default=",".join(BIG))
    w.add_argument("--moe-layers", type=int, default=None)
    w.add_argument("--random-q4-k", action="store_true")
    r = sub.add_parser("run")
    for flag in ("--work", "--logs", "--stepgraph", "--llama-bin"):
        r.add_argument(flag, required=True)
    r.add_argument("--files", default="all")
    r.add_argument("--moe-layers", type=int, default=None)
    t = sub.add_parser("table")
    t.add_argument("--work", required=True)
    s = sub.add_parser("selftest")
    s.add_argument("--work", required=True)
    s.add_argument("--stepgraph", required=True)
    args = ap.parse_args()
    if args.command == "write":
        for shape in args.shapes.split(","):
            if shape not in SHAPES:
                sys.exit(f"family_peer: unknown shape '{shape}' ({','.join(SHAPES)})")
            kind = "random-q4_k" if args.random_q4_k else "bf16"
            path = os.path.join(args.out, file_name(shape, kind))
            if not os.path.exists(path):
                write_gguf(path, shape, args.moe_layers, random_q4_k=args.random_q4_k)
    elif args.command == "run":
        run(args)
    elif args.command == "table":
        print(table(load_results(args.work)))
    else:
        selftest(args)


if __name__ == "__main__":
    main()
