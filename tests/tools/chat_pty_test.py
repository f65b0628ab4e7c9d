#!/usr/bin/env python3
"""`stepgraph chat` on a pseudo-terminal, as a person types at it.

With the built-in model (token ids): the prompt shows, a turn gets its answer, Ctrl-C at
the prompt does not leave, /reset and /stats answer, /exit leaves with status 0. With the
real SmolLM2 file (skipped where tests/fixtures/fetch_smollm2.sh has not fetched it): a
long answer is stopped by Ctrl-C, the conversation goes on with another turn, /stats says
the answer was stopped, and Ctrl-D leaves with status 0.

    chat_pty_test.py STEPGRAPH_PROGRAM
"""
import os
import pty
import select
import sys
import time


class Chat:
    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(argv[0], argv)
        self.seen = b""
        self.cursor = 0  # where the next read_until looks from

    def read_until(self, needle, timeout=120.0):
        """Reads until `needle` comes after the last match; returns the text up to its end."""
        deadline = time.monotonic() + timeout
        while True:
            at = self.seen.find(needle.encode(), self.cursor)
            if at >= 0:
                text = self.seen[self.cursor:at + len(needle)].decode(errors="replace")
                self.cursor = at + len(needle)
                return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} within {timeout} s; got "
                                     f"{self.seen[self.cursor:]!r}")
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the chat ended before {needle!r}: "
                                         f"{self.seen[self.cursor:]!r}")
                self.seen += chunk

    def type(self, text):
        os.write(self.fd, text.encode())

    def exit_status(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:  # drain, so that the child never blocks writing
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.seen += os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                return os.waitstatus_to_exitcode(status)
        raise AssertionError("the chat did not end")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def built_in_model(program):
    chat = Chat([program, "chat", "--cpu", "--max-new-tokens", "5"])
    chat.read_until("> ")
    chat.type("3,1,4\n")
    answer = chat.read_until("> ")
    lines = [l.strip() for l in answer.splitlines() if l.strip() and not l.startswith(">")]
    ids = [l for l in lines if l.replace(",", "").isdigit()]
    check(ids and len(ids[-1].split(",")) == 5, f"an answer of 5 ids: {answer!r}")
    chat.type("\x03")  # Ctrl-C at the prompt: a fresh prompt, not the end
    chat.read_until("/exit or Ctrl-D leaves")
    chat.read_until("> ")
    chat.type("/stats\n")
    check("the turn's 3 tokens" in chat.read_until("> "), "the stats of the last answer")
    chat.type("/reset\n")
    check("a new conversation" in chat.read_until("> "), "/reset says so")
    chat.type("/exit\n")
    status = chat.exit_status()
    check(status == 0, f"/exit leaves with status 0, got {status}")
    print("built-in model: prompt, answer, Ctrl-C at the prompt, /stats, /reset, /exit: ok")


def smollm2(program, model):
    chat = Chat([program, "chat", "--cpu", "--model", model])
    chat.read_until("> ")
    chat.type("Write a very long story about a dragon who learns to cook.\n")
    # Wait for the answer to be under way (some words after the echoed turn), then stop it.
    chat.read_until("cook.\r\n", timeout=60)
    started = time.monotonic()
    while len(chat.seen) - chat.cursor < 40 and time.monotonic() - started < 300:
        if select.select([chat.fd], [], [], 1.0)[0]:
            chat.seen += os.read(chat.fd, 4096)
    chat.type("\x03")
    chat.read_until("stopped", timeout=60)
    chat.read_until("> ")
    chat.type("/stats\n")
    check("stopped by Ctrl-C" in chat.read_until("> "), "/stats says the answer was stopped")
    chat.type("What is the capital of France? One word.\n")
    second = chat.read_until("> ", timeout=300)
    check("Paris" in second, f"the conversation goes on after Ctrl-C: {second!r}")
    chat.type("\x04")  # Ctrl-D on an empty line: the end of the input
    status = chat.exit_status()
    check(status == 0, f"Ctrl-D leaves with status 0, got {status}")
    print("SmolLM2: Ctrl-C stops a long answer, the chat goes on, Ctrl-D leaves: ok")


def main():
    program = sys.argv[1]
    built_in_model(program)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/nonexistent"),
                                                             ".cache")
    model = os.path.join(cache, "stepgraph-test", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(model):
        smollm2(program, model)
    else:
        print(f"SmolLM2 part skipped: {model} not fetched (tests/fixtures/fetch_smollm2.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
