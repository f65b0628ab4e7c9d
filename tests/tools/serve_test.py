#!/usr/bin/env python3
"""`stepgraph serve` with the real SmolLM2 file on the CPU reference, as clients use it.

The `openai` Python client streams and does not stream a chat and a completion; 8
concurrent greedy requests answer what the same prompts answer one at a time (and what
`stepgraph run` answers), in fewer decode steps; presence_penalty, frequency_penalty and
logit_bias change the answer (a bias of 100 forces its token); stop strings that cross
token boundaries end the text and are never sent; a client that goes away mid-stream frees
its slot at once; a full queue answers 503 with Retry-After; every row of the
malformed-request table gets its status and an OpenAI-shaped error naming the field; a
load run of 200 requests, 16 at a time, is all answered with the slots back to zero and
the memory flat; SIGTERM lets the request in flight finish and exits 0. Skipped, saying
why, where tests/fixtures/fetch_smollm2.sh has not fetched the model or the program has no
HTTP.

    serve_test.py STEPGRAPH_PROGRAM [http|no-http]   (what the build found; CMake passes it)

SG_SERVE_LOAD=N changes the load run's request count (default 200).
"""
import ctypes
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

KEY = "serve-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAILURES = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print(f"FAILED: {what}", flush=True)


def die_with_parent():
    """The server is killed when the test is (ctest's timeout): prctl(PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


class Server:
    """One `stepgraph serve` on a free port; its stderr kept for the messages."""

    def __init__(self, program, model, *flags):
        argv = [program, "serve", "--model", model, "--port", "0", *flags]
        self.program, self.model = program, model
        env = dict(os.environ)
        if "ASAN_OPTIONS" in env:
            # AddressSanitizer keeps freed memory aside (256 MiB by default), which would read
            # as growth in the load run's memory check; a small quarantine still catches
            # use after free within a request.
            env["ASAN_OPTIONS"] += ":quarantine_size_mb=8:thread_local_quarantine_size_kb=64"
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=env, preexec_fn=die_with_parent)
        self.log = []
        self.port = None
        listening = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        if not listening.wait(300) or self.port is None:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))

    def request(self, method, path, body=None, headers=None, timeout=300):
        """(status, headers, parsed JSON or text) of one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        h = {"Content-Type": "application/json", **AUTH, **(headers or {})}
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        raw = r.read().decode()
        conn.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw
        return r.status, dict(r.getheaders()), parsed

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        status, _, text = self.request("GET", "/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_metric(self, name, value, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metrics().get(name) == value:
                return True
            time.sleep(0.05)
        return False

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def open_stream(self, path, body, stream=True):
        """A raw socket with a request sent (streamed unless told)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=300)
        data = json.dumps({**body, "stream": stream}).encode()
        s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
                  .encode() + data)
        return s


def read_events(sock, count):
    """Reads from a raw streamed response until `count` data events came; fails (and
    returns what came) on a status other than 200."""
    seen = b""
    while seen.count(b"data: ") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        seen += chunk
        if b"\r\n" in seen and not seen.startswith(b"HTTP/1.1 200"):
            check(False, f"a stream is answered 200: {seen[:300]!r}")
            break
    return seen


# ---- the openai client --------------------------------------------------------------------


def openai_client(server):
    try:
        import openai
    except ImportError:
        print("openai client part skipped: no openai package (pip install openai; .ci/run "
              "installs it)", flush=True)
        return
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=KEY)
    models = client.models.list()
    model = models.data[0].id
    check(model == "SmolLM2-135M-Instruct.Q4_1", f"the model's id: {model}")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           temperature=0)
    answer = whole.choices[0].message.content
    check("Paris" in answer, f"the chat answers: {answer!r}")
    check(whole.choices[0].finish_reason in ("stop", "length"), "a finish_reason")
    check(whole.usage.completion_tokens <= 24 and whole.usage.prompt_tokens > 7,
          f"usage counts: {whole.usage}")
    check(whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens,
          "usage adds up")

    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    parts, reasons, usage, roles = [], [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                reasons.append(c.finish_reason)
    check("".join(parts) == answer, f"the stream says what the answer said: {parts!r}")
    check(roles == ["assistant"], f"one role, the assistant's: {roles}")
    check(reasons == [whole.choices[0].finish_reason], f"one finish_reason: {reasons}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens
          and usage.prompt_tokens == whole.usage.prompt_tokens,
          f"include_usage's last chunk: {usage} vs {whole.usage}")

    # Without include_usage no chunk carries usage.
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                           temperature=0, stream=True)
    chunks = list(plain)
    check(all(c.usage is None for c in chunks), "no usage without include_usage")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(answer.startswith(text) and text, f"6 tokens begin the answer: {text!r}")

    # A conversation: the system message and the earlier turns reach the prompt.
    longer = client.chat.completions.create(
        model=model, temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "You answer in one word."}, *messages,
                  {"role": "assistant", "content": answer},
                  {"role": "user", "content": "And of Italy?"}])
    check(longer.usage.prompt_tokens > whole.usage.prompt_tokens + whole.usage.completion_tokens,
          f"earlier turns count: {longer.usage.prompt_tokens}")

    done = client.completions.create(model=model, prompt="The capital of France is",
                                     max_tokens=8, temperature=0)
    check(done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8,
          f"a completion of 8 tokens: {done}")
    streamed = client.completions.create(model=model, prompt="The capital of France is",
                                         max_tokens=8, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    check(text == done.choices[0].text, f"a streamed completion: {text!r}")

    penalties(client, model, server)

    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
        check(False, "n = 2 is refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "n", f"the refusal names n: {e.body}")
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="wrong")
    try:
        bad.models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError:
        pass
    print("openai client: chat and completions, streamed and not: ok", flush=True)
    return answer


def penalties(client, model, server):
    """One request with presence_penalty, frequency_penalty and logit_bias: a bias of 100
    forces its token at every step; the penalties alone change a greedy answer."""
    out = subprocess.run([server.program, "tokenize", "--model", server.model, "--text",
                          " Paris"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ids = [int(i) for i in out.stdout.strip().split(",")]
    check(len(ids) == 1, f"' Paris' is one token: {ids}")
    prompt = "Once upon a time"
    forced = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                       presence_penalty=0.5, frequency_penalty=0.5,
                                       logit_bias={str(ids[0]): 100})
    check(forced.choices[0].text == " Paris" * 4, f"logit_bias forces ' Paris': {forced}")
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
    penalized = client.completions.create(model=model, prompt=prompt, max_tokens=16,
                                          temperature=0, presence_penalty=1.5,
                                          frequency_penalty=1.5)
    check(penalized.choices[0].text != plain.choices[0].text,
          f"the penalties change the answer: {penalized.choices[0].text!r} against "
          f"{plain.choices[0].text!r}")
    print("presence_penalty, frequency_penalty and logit_bias: ok", flush=True)


# ---- batching ----------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "The three primary colours are", "In 1969, the first person", "My favourite fruit",
           "Water boils at", "The quick brown fox"]


def completion(server, prompt, max_tokens, **extra):
    status, _, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0, **extra})
    assert status == 200, body
    return body


def run_alone(program, model, prompt, tokens):
    """`stepgraph run`'s greedy text of a prompt (no server)."""
    out = subprocess.run([program, "run", "--model", model, "--prompt", prompt,
                          "--max-new-tokens", str(tokens), "--ignore-eos", "--max-seq", "512"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def batching(server, program, model):
    tokens = 16
    before = server.metrics()
    alone = [completion(server, p, tokens) for p in PROMPTS]
    middle = server.metrics()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: completion(server, p, tokens), PROMPTS))
    after = server.metrics()
    for p, a, t in zip(PROMPTS, alone, together):
        check(a["choices"][0]["text"] == t["choices"][0]["text"],
              f"{p!r}: together {t['choices'][0]['text']!r} vs alone {a['choices'][0]['text']!r}")
    steps_alone = middle["stepgraph_decode_steps_total"] - before["stepgraph_decode_steps_total"]
    steps_together = after["stepgraph_decode_steps_total"] - middle["stepgraph_decode_steps_total"]
    check(steps_together * 3 < steps_alone,
          f"8 requests share steps: {steps_together} steps together, {steps_alone} alone")
    # The server's text is the program's (`stepgraph run` prints the prompt, then the text).
    reference = run_alone(program, model, PROMPTS[0], tokens)
    check(alone[0]["choices"][0]["text"] in reference,
          f"the server's text {alone[0]['choices'][0]['text']!r} is run's: {reference!r}")
    print(f"8 concurrent greedy requests equal the same run one at a time "
          f"({steps_together:.0f} decode steps against {steps_alone:.0f}): ok", flush=True)


def tensor_parallel(server, program, model):
    """A server whose model is sharded over 3 ranks (CPU threads; SmolLM2's 3 KV heads)
    answers 4 concurrent requests with the one-rank server's text."""
    tokens, prompts = 12, PROMPTS[:4]
    alone = [completion(server, p, tokens)["choices"][0]["text"] for p in prompts]
    sharded = Server(program, model, "--cpu", "--tp", "3", "--slots", "4", "--max-seq", "256",
                     "--api-key", KEY, "--prefill-chunk", "64")
    try:
        check(any("tensor parallel over 3 ranks" in line for line in sharded.log),
              "the sharded server says it is: " + "".join(sharded.log[-3:]))
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: completion(sharded, p, tokens), prompts))
        for p, a, t in zip(prompts, alone, together):
            check(t["choices"][0]["text"] == a,
                  f"{p!r} over 3 ranks: {t['choices'][0]['text']!r} vs one rank {a!r}")
    finally:
        sharded.proc.terminate()
        sharded.proc.wait(timeout=60)
    print("a server over 3 ranks answers 4 concurrent requests as one rank does: ok", flush=True)


# ---- stop strings ------------------------------------------------------------------------


def stop_strings(server):
    prompt = "Once upon a time"
    status, _, raw = server.request("POST", "/v1/completions",
                                    {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                     "stream": True})
    chunks = [json.loads(line[6:]) for line in raw.splitlines()
              if line.startswith("data: {")]
    pieces = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    full = "".join(pieces)
    # A stop string that begins inside one token and ends inside the next.
    cut = None
    for i in range(2, len(pieces) - 1):
        if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2:
            stop = pieces[i][-2:] + pieces[i + 1][:2]
            if full.find(stop) == len("".join(pieces[:i])) + len(pieces[i]) - 2:
                cut = full.find(stop)
                break
    if cut is None:
        check(False, f"a stop string across two tokens in {pieces!r}")
        return
    whole = completion(server, prompt, 24, stop=["never there", stop])
    check(whole["choices"][0]["text"] == full[:cut] and
          whole["choices"][0]["finish_reason"] == "stop",
          f"stop {stop!r}: {whole['choices'][0]} against {full!r}")
    status, _, raw = server.request("POST", "/v1/completions",
                                    {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                     "stream": True, "stop": stop})
    sent = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["text"] for c in sent if c["choices"])
    check(text == full[:cut], f"streamed with stop {stop!r}: {text!r}")
    check(sent[-1]["choices"][0]["finish_reason"] == "stop", f"finish_reason stop: {sent[-1]}")
    print(f"a stop string across a token boundary ({stop!r}) ends the text unsent: ok",
          flush=True)


# ---- disconnects and the queue -------------------------------------------------------------


def disconnect(server):
    # A request ended by a stop string is cancelled too, a step after its answer went out.
    server.wait_metric("stepgraph_active_slots", 0.0)
    before = server.metrics()
    s = server.open_stream("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Tell me a long story."}],
                            "max_tokens": 120, "temperature": 0})
    read_events(s, 4)  # the role and three tokens
    s.close()
    freed = server.wait_metric("stepgraph_active_slots", 0.0, timeout=20)
    after = server.metrics()
    made = after["stepgraph_generated_tokens_total"] - before["stepgraph_generated_tokens_total"]
    cancelled = (after['stepgraph_requests_finished_total{reason="cancelled"}'] -
                 before['stepgraph_requests_finished_total{reason="cancelled"}'])
    check(freed, "a client gone mid-stream frees its slot")
    check(cancelled == 1, f"its request ended cancelled: {cancelled}")
    check(made <= 8, f"the slot is freed within a step or two of the close: {made} tokens made")

    # An answer that is not streamed writes nothing until its end: the connection is
    # watched all the same.
    before = server.metrics()
    s = server.open_stream(COMP, {"prompt": "Once upon a time", "max_tokens": 120,
                                  "temperature": 0}, stream=False)
    deadline = time.monotonic() + 60
    while server.metrics()["stepgraph_generated_tokens_total"] < (
            before["stepgraph_generated_tokens_total"] + 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    s.close()
    freed = server.wait_metric("stepgraph_active_slots", 0.0, timeout=20)
    after = server.metrics()
    unread = after["stepgraph_generated_tokens_total"] - before["stepgraph_generated_tokens_total"]
    check(freed and unread <= 10,
          f"a client gone before its whole answer frees the slot: {unread} tokens made")
    print(f"a client gone mid-stream frees its slot ({made:.0f} tokens made; not streamed: "
          f"{unread:.0f}): ok", flush=True)


def queue_full(server, slots, queue):
    body = {"prompt": "1, 2, 3,", "max_tokens": 120, "temperature": 0}
    socks = [server.open_stream(COMP, body) for _ in range(slots + queue)]
    for s in socks:
        read_events(s, 1)  # headers and the role chunk: accepted
    m = server.metrics()
    check(m["stepgraph_queue_depth"] + m["stepgraph_active_slots"] == slots + queue,
          f"{slots} running and {queue} queued: {m['stepgraph_active_slots']}, "
          f"{m['stepgraph_queue_depth']}")
    status, headers, err = server.post(COMP, body)
    check(status == 503 and headers.get("Retry-After") == "1" and
          isinstance(err, dict) and "error" in err,
          f"a full queue answers 503 with Retry-After: {status} {headers} {err}")
    for s in socks:
        s.close()
    check(server.wait_metric("stepgraph_active_slots", 0.0, timeout=30) and
          server.wait_metric("stepgraph_queue_depth", 0.0, timeout=5),
          "clients gone from the queue and the slots leave nothing behind")
    print("a full queue answers 503 with Retry-After; gone clients leave it: ok", flush=True)


# ---- the malformed-request table ----------------------------------------------------------

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "Hi"}]

# (what, path, body, extra headers, status, param, a word of the message)
TABLE = [
    ("no API key", CHAT, {"messages": USER}, {"Authorization": ""}, 401, None, "API key"),
    ("a wrong API key", CHAT, {"messages": USER}, {"Authorization": "Bearer nope"}, 401, None,
     "API key"),
    ("not JSON", CHAT, "{\"messages\": [", {}, 400, None, "JSON"),
    ("not an object", CHAT, "[1, 2]", {}, 400, None, "object"),
    ("nested too deep", CHAT, "[" * 100 + "]" * 100, {}, 400, None, "deeper"),
    ("no messages", CHAT, {"max_tokens": 4}, {}, 400, "messages", "required"),
    ("messages a string", CHAT, {"messages": "Hi"}, {}, 400, "messages", "array"),
    ("no messages in it", CHAT, {"messages": []}, {}, 400, "messages", "at least one"),
    ("a bad role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, {}, 400,
     "messages[0].role", "robot"),
    ("content a number", CHAT, {"messages": [{"role": "user", "content": 5}]}, {}, 400,
     "messages[0].content", "string"),
    ("an image part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, {}, 400,
     "messages[0].content[0]", "text"),
    ("the assistant last", CHAT, {"messages": USER + [{"role": "assistant", "content": "x"}]},
     {}, 400, "messages", "last"),
    ("max_tokens a string", CHAT, {"messages": USER, "max_tokens": "ten"}, {}, 400, "max_tokens",
     "integer"),
    ("max_tokens 0", CHAT, {"messages": USER, "max_tokens": 0}, {}, 400, "max_tokens",
     "at least 1"),
    ("max_tokens over the limit", CHAT, {"messages": USER, "max_tokens": 100000}, {}, 400,
     "max_tokens", "128"),
    ("temperature 3", CHAT, {"messages": USER, "temperature": 3}, {}, 400, "temperature", "[0, 2]"),
    ("top_p 0", CHAT, {"messages": USER, "top_p": 0}, {}, 400, "top_p", "top_p"),
    ("top_k negative", CHAT, {"messages": USER, "top_k": -1}, {}, 400, "top_k", "at least 0"),
    ("seed a float", CHAT, {"messages": USER, "seed": 1.5}, {}, 400, "seed", "integer"),
    ("n 2", CHAT, {"messages": USER, "n": 2}, {}, 400, "n", "not supported"),
    ("logprobs", CHAT, {"messages": USER, "logprobs": True}, {}, 400, "logprobs", "not supported"),
    ("tools", CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]},
     {}, 400, "tools", "not supported"),
    ("presence_penalty 3", CHAT, {"messages": USER, "presence_penalty": 3}, {}, 400,
     "presence_penalty", "[-2, 2]"),
    ("logit_bias a list", CHAT, {"messages": USER, "logit_bias": [1]}, {}, 400, "logit_bias",
     "object"),
    ("a logit_bias id out of range", CHAT, {"messages": USER, "logit_bias": {"999999": 1}}, {},
     400, "logit_bias", "token ids"),
    ("a logit_bias of 200", COMP, {"prompt": "x", "logit_bias": {"5": 200}}, {}, 400,
     "logit_bias", "[-100, 100]"),
    ("repetition_penalty 0", COMP, {"prompt": "x", "repetition_penalty": 0}, {}, 400,
     "repetition_penalty", "(0,"),
    ("min_p 2", COMP, {"prompt": "x", "min_p": 2}, {}, 400, "min_p", "[0, 1]"),
    ("json mode", CHAT, {"messages": USER, "response_format": {"type": "json_object"}}, {}, 400,
     "response_format", "not supported"),
    ("an unknown field", CHAT, {"messages": USER, "frobnicate": 1}, {}, 400, "frobnicate",
     "unrecognized"),
    ("five stop strings", CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, {}, 400,
     "stop", "at most 4"),
    ("an empty stop string", CHAT, {"messages": USER, "stop": [""]}, {}, 400, "stop", "1 to"),
    ("stream a string", CHAT, {"messages": USER, "stream": "yes"}, {}, 400, "stream", "boolean"),
    ("stream_options without stream", CHAT, {"messages": USER, "stream_options":
                                             {"include_usage": True}}, {}, 400,
     "stream_options", "stream"),
    ("a message field", CHAT, {"messages": [{"role": "user", "content": "x", "name": "n"}]}, {},
     400, "messages[0].name", "not supported"),
    ("no prompt", COMP, {"max_tokens": 4}, {}, 400, "prompt", "required"),
    ("a prompt object", COMP, {"prompt": {"text": "x"}}, {}, 400, "prompt", "string"),
    ("two prompts", COMP, {"prompt": ["a", "b"]}, {}, 400, "prompt", "one prompt"),
    ("a token id out of range", COMP, {"prompt": [1, 2, 999999]}, {}, 400, "prompt", "token id"),
    ("echo", COMP, {"prompt": "x", "echo": True}, {}, 400, "echo", "not supported"),
    ("best_of 2", COMP, {"prompt": "x", "best_of": 2}, {}, 400, "best_of", "not supported"),
    ("a prompt over the limit", COMP, {"prompt": "word " * 400}, {}, 400, "prompt", "256"),
    ("a body over the limit", COMP, {"prompt": "x" * 70000}, {}, 413, None, "65536"),
    ("no route", "/v1/embeddings", {"input": "x"}, {}, 404, None, "/v1/embeddings"),
]


def malformed(server):
    for what, path, body, headers, status, param, word in TABLE:
        got, _, err = server.post(path, body, headers=headers)
        shaped = (isinstance(err, dict) and isinstance(err.get("error"), dict) and
                  isinstance(err["error"].get("message"), str) and "type" in err["error"])
        check(got == status and shaped, f"{what}: {got} {err} (wanted {status})")
        if shaped:
            check(err["error"].get("param") == param,
                  f"{what}: param {err['error'].get('param')!r}, wanted {param!r}")
            check(word.lower() in err["error"]["message"].lower(),
                  f"{what}: {err['error']['message']!r} says {word!r}")
    status, _, _ = server.request("GET", "/health")
    check(status == 200, "healthy after the table")
    print(f"the malformed-request table ({len(TABLE)} rows): ok", flush=True)


# ---- load ---------------------------------------------------------------------------------


def load(server, total, at_once):
    # Short prompts and answers (the CPU reference, under the sanitizers in CI): token ids
    # mostly, some text, a chat now and then; greedy and sampled, streamed and not.
    def one(i):
        if i % 50 == 7:
            return server.post(CHAT, {"messages": [{"role": "user", "content": f"Hi {i}"}],
                                      "max_tokens": 2, "temperature": 0.7, "seed": i})
        prompt = [1 + i % 97, 200 + i % 31, 400 + i % 13] if i % 5 else f"Number {i}:"
        body = {"prompt": prompt, "max_tokens": 1 + i % 3, "stream": i % 4 == 0}
        if i % 2:
            body.update(temperature=0.8, top_p=0.9, top_k=40, seed=i)
        return server.post(COMP, body)

    def run(n):
        with ThreadPoolExecutor(at_once) as pool:
            return list(pool.map(one, range(n)))

    run(at_once * 2)  # warm: threads, buffers and the allocator's arenas
    rss_before = server.rss_kib()
    started = time.monotonic()
    answers = run(total)
    seconds = time.monotonic() - started
    statuses = [a[0] for a in answers]
    check(statuses == [200] * total, f"all {total} answered: {sorted(set(statuses))}")
    check(server.wait_metric("stepgraph_active_slots", 0.0, 10) and
          server.wait_metric("stepgraph_queue_depth", 0.0, 1), "slots and queue back to zero")
    grown = server.rss_kib() - rss_before
    check(grown < 32 * 1024, f"memory flat over the load run: grew {grown} KiB")
    print(f"load: {total} requests, {at_once} at a time, all answered in {seconds:.1f} s, "
          f"memory grew {grown} KiB: ok", flush=True)


# ---- SIGTERM -------------------------------------------------------------------------------


def drain(server):
    s = server.open_stream(COMP, {"prompt": "Once upon a time", "max_tokens": 24,
                                  "temperature": 0})
    seen = read_events(s, 2)
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        status, _, _ = server.request("GET", "/health")
        if status == 503:
            break
        time.sleep(0.05)
    check(status == 503, f"draining: /health answers 503: {status}")
    refused, _, _ = server.post(COMP, {"prompt": "x", "max_tokens": 2})
    check(refused == 503, f"no new requests while draining: {refused}")
    while b"data: [DONE]" not in seen:
        chunk = s.recv(65536)
        if not chunk:
            break
        seen += chunk
    s.close()
    events = [json.loads(line[6:]) for line in seen.decode().splitlines()
              if line.startswith("data: {")]
    check(b"data: [DONE]" in seen and events[-1]["choices"][0]["finish_reason"] == "length",
          "the request in flight finishes")
    check(server.proc.wait(60) == 0, "then the server exits 0")
    print("SIGTERM: the request in flight finishes, new ones are refused, exit 0: ok",
          flush=True)


def main():
    program = sys.argv[1]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/nonexistent"),
                                                             ".cache")
    model = os.path.join(cache, "stepgraph-test", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        print(f"skipped: {model} not fetched (tests/fixtures/fetch_smollm2.sh)")
        return 0
    if len(sys.argv) > 2 and sys.argv[2] == "no-http":
        print("skipped: this stepgraph was built without HTTP (libcpp-httplib-dev)")
        return 0
    slots, queue = 8, 8
    server = Server(program, model, "--cpu", "--slots", str(slots), "--max-queue", str(queue),
                    "--max-seq", "512", "--api-key", KEY, "--max-body-bytes", "65536",
                    "--max-prompt-tokens", "256", "--max-tokens", "128", "--prefill-chunk", "64")
    try:
        openai_client(server)
        batching(server, program, model)
        tensor_parallel(server, program, model)
        stop_strings(server)
        disconnect(server)
        queue_full(server, slots, queue)
        malformed(server)
        load(server, int(os.environ.get("SG_SERVE_LOAD", "200")), slots + queue)
        drain(server)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    if FAILURES:
        print("".join(server.log[-20:]))
        print(f"{len(FAILURES)} failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
