#!/usr/bin/env python3
"""stepgraph serve against llama.cpp's llama-server: one load generator for both.

`load` drives one OpenAI-compatible server with C concurrent streams: each stream sends
streamed /v1/completions requests one after another (a different prompt each, greedy, a
fixed answer length) until the measuring time is up, then finishes the request it is in.
It reports the total tokens/s (answer tokens of every request over the wall time), and the
p50 / p99 time to first token and time per output token (a request's tokens after its
first, over the time they took). `run` starts each server in turn on the same GGUF file and
runs `load` at every concurrency (without --llama-bin, stepgraph alone: serve_peer.sh's
selftest on the CPU); `table` prints the saved results.

Only the standard library: the GPU machine has no network.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name").split()


def prompt_text(seed, words):
    r = random.Random(seed)
    return "Write about " + " ".join(r.choice(WORDS) for _ in range(words)) + "."


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def one_request(url, body, timeout):
    """(ttft s, tokens, seconds from first to last token) of one streamed completion."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = json.dumps(body).encode()
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body=data,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    chunks = 0
    usage = None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        payload = line[6:]
        if payload == b"[DONE]":
            break
        event = json.loads(payload)
        if event.get("usage"):
            usage = event["usage"]
        choices = event.get("choices") or []
        if choices and choices[0].get("text"):
            now = time.monotonic()
            if first is None:
                first = now
            last = now
            chunks += 1
    conn.close()
    tokens = usage["completion_tokens"] if usage else chunks
    if first is None:
        raise RuntimeError("no token came")
    return first - start, tokens, last - first


def load(url, concurrency, seconds, max_tokens, prompt_words, model, extra, timeout=600):
    results, errors = [], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def stream(i):
        n = 0
        while time.monotonic() < deadline:
            body = {"model": model, "prompt": prompt_text(i * 100003 + n, prompt_words),
                    "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, **extra}
            n += 1
            try:
                r = one_request(url, body, timeout)
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                results.append(r)

    start = time.monotonic()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    tokens = sum(r[1] for r in results)
    tpot = [r[2] / (r[1] - 1) for r in results if r[1] > 1]
    return {"concurrency": concurrency, "requests": len(results), "errors": len(errors),
            "first_error": errors[0] if errors else None, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50_ms": percentile([r[0] for r in results], 50) * 1e3,
            "ttft_p99_ms": percentile([r[0] for r in results], 99) * 1e3,
            "tpot_p50_ms": percentile(tpot, 50) * 1e3,
            "tpot_p99_ms": percentile(tpot, 99) * 1e3}


def wait_healthy(url, proc, seconds):
    u = urllib.parse.urlparse(url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def serve(name, argv, url, log_path, args, model, extra):
    """Starts one server, loads it at every concurrency, stops it."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        wait_healthy(url, proc, 900)
        # A short warm-up: first-use costs (allocations, graph instantiation) stay out.
        load(url, 2, 2, 8, args.prompt_words, model, extra)
        for c in args.concurrency:
            row = load(url, c, args.seconds, args.max_tokens, args.prompt_words, model, extra)
            row["server"] = name
            rows.append(row)
            print(f"  {name:10s} {c:3d} streams: {row['tokens_per_s']:9.1f} tok/s, TTFT p50 "
                  f"{row['ttft_p50_ms']:8.1f} ms p99 {row['ttft_p99_ms']:8.1f} ms, per token "
                  f"p50 {row['tpot_p50_ms']:7.2f} ms p99 {row['tpot_p99_ms']:7.2f} ms "
                  f"({row['requests']} requests, {row['errors']} errors)", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return rows


def run_ms_per_token(args, file):
    """`stepgraph run`'s ms/token on the same file and prompt: one stream through the
    server should be within 5% of it."""
    argv = [args.stepgraph, "run", "--model", file, "--prompt", prompt_text(0, args.prompt_words),
            "--max-new-tokens", str(args.max_tokens), "--ignore-eos", "--max-seq",
            str(args.context), *args.stepgraph_flags.split()]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    m = re.search(r"([0-9.]+) ms/token", out.stdout + out.stderr)
    return float(m.group(1)) if m else float("nan")


def stepgraph_argv(args, file, port):
    return [args.stepgraph, "serve", "--model", file, "--port", str(port), "--slots",
            str(args.slots), "--max-seq", str(args.context), "--max-queue", "128",
            "--ignore-eos", *args.stepgraph_flags.split()]


def llama_argv(args, file, port):
    # -np slots sharing -c; continuous batching is llama-server's default (-cb).
    return [os.path.join(args.llama_bin, "llama-server"), "-m", file, "--port", str(port),
            "-np", str(args.slots), "-c", str(args.slots * args.context), "-ngl", "999",
            "-cb", "--no-warmup", *args.llama_flags.split()]


def run(args):
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.logs, exist_ok=True)
    results_path = os.path.join(args.work, "serve_results.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    for file in args.files.split(","):
        label = os.path.basename(file)
        print(f"{label}:", flush=True)
        rows = []
        if not args.skip_stepgraph:
            ms = run_ms_per_token(args, file)
            rows.append({"server": "run", "concurrency": 1, "tpot_p50_ms": ms})
            print(f"  stepgraph run: {ms:.3f} ms/token", flush=True)
            rows += serve("stepgraph", stepgraph_argv(args, file, 18080), "http://127.0.0.1:18080",
                          os.path.join(args.logs, f"serve-stepgraph-{label}.log"), args, label, {})
        if args.llama_bin:
            rows += serve("llama", llama_argv(args, file, 18081), "http://127.0.0.1:18081",
                          os.path.join(args.logs, f"serve-llama-{label}.log"), args, label,
                          {"ignore_eos": True, "cache_prompt": False})
        results[label] = rows
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
    table(results)


def table(results):
    print("\nfile / streams | server    |    tok/s | TTFT p50 / p99 ms | per token p50 / p99 ms"
          " | tok/s ratio")
    for label, rows in results.items():
        by = {(r["server"], r["concurrency"]): r for r in rows if r["server"] != "run"}
        run = [r for r in rows if r["server"] == "run"]
        one = by.get(("stepgraph", 1))
        if run and one:
            print(f"{label[:22]:22s}   1 stream through the server: {one['tpot_p50_ms']:.3f} "
                  f"ms/token; stepgraph run: {run[0]['tpot_p50_ms']:.3f} ms/token "
                  f"({one['tpot_p50_ms'] / run[0]['tpot_p50_ms']:.3f}x)")
        order = sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0] != "stepgraph"))
        for (server, c), r in order:
            ratio = ""
            peer = by.get(("llama", c))
            if server == "stepgraph" and peer and peer["tokens_per_s"] > 0:
                ratio = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x"
            print(f"{label[:22]:22s} {c:3d} | {server:9s} | {r['tokens_per_s']:8.1f} | "
                  f"{r['ttft_p50_ms']:8.1f} / {r['ttft_p99_ms']:8.1f} | "
                  f"{r['tpot_p50_ms']:7.2f} / {r['tpot_p99_ms']:7.2f} | {ratio}"
                  f"{'  ERRORS ' + str(r['errors']) if r['errors'] else ''}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--stepgraph", required=True)
    r.add_argument("--llama-bin", default="")
    r.add_argument("--files", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--logs", required=True)
    r.add_argument("--concurrency", default="1,4,16,64",
                   type=lambda s: [int(x) for x in s.split(",")])
    r.add_argument("--seconds", type=float, default=30.0)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--prompt-words", type=int, default=100)
    r.add_argument("--slots", type=int, default=16)
    r.add_argument("--context", type=int, default=1024)
    r.add_argument("--stepgraph-flags", default="")
    r.add_argument("--llama-flags", default="")
    r.add_argument("--skip-stepgraph", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("--work", required=True)
    args = p.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        table(json.load(open(os.path.join(args.work, "serve_results.json"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
