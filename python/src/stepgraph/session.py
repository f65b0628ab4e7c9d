"""Decode sessions from Python, over the session C ABI (include/stepgraph/c_api/c_session.h).

    with stepgraph.Session("SmolLM2-135M-Instruct.Q4_1.gguf") as s:
        s.generate("The capital of France is", max_new_tokens=32)  # text in, text out
        for piece in s.generate("Once upon a time", stream=True):   # text as it is made
            print(piece, end="", flush=True)
        s.chat([{"role": "user", "content": "What is the capital of France?"}])
        s.generate("Once upon a time", temperature=0.8, top_p=0.95, seed=7,  # per call
                   repetition_penalty=1.2, logit_bias={2: -100.0}, stop=["\n\n"])

    s = stepgraph.Session(None)          # the built-in tiny model, random weights, no tokenizer
    s.prefill([1, 2, 3])
    ids = s.generate(16)                 # 16 new token ids of slot 0

Every argument is checked in Python before the C call: token ids must be integers that fit
int32 (a float, a string or a bool is a TypeError, 2**32 + 5 an OverflowError, never 5),
slots fit int64, seeds int32, texts are str or bytes, paths hold no NUL. A Session may be
shared between threads: its calls are serialised by a lock (the C handle is used by one
thread at a time), and close() waits for a call in progress. A stream (generate(...,
stream=True)) takes the lock one step at a time; a call that prefills or steps the session
between two of its steps takes its sequence, and the stream's next step raises SessionError
saying so instead of continuing someone else's.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import numbers
import os
import threading
from typing import Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lib

# The first guess of a text call's buffer; a larger one is asked for when the library says
# so (the size-query convention of c_session.h), so a guess only saves a call.
_SPARE_IDS = 64
_BYTES_PER_ID = 8

# A stream holds back text that ends in U+FFFD while a character may still be arriving: a
# UTF-8 character spans at most 4 bytes, so more ids than this behind it make it a real one.
_HELD_IDS = 8

# Stop strings a call takes, and the longest in UTF-8 bytes: the program's, the server's and
# the other bindings' bounds, which keep matching them linear in the text.
MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 256

Ids = Union[Sequence[int], "np.ndarray"]
Prompt = Union[str, bytes, Ids]
Message = Mapping[str, str]

_BACKENDS = {"auto": _lib.BACKEND_AUTO, "cpu": _lib.BACKEND_CPU, "cuda": _lib.BACKEND_CUDA}


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_UINT64 = (0, (1 << 64) - 1)


def _int(value, name, bounds=_INT64):
    """`value` as a Python int, if it is an integer (not a bool) inside `bounds`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an integer, got %s" % (name, type(value).__name__))
    v = int(value)
    if not bounds[0] <= v <= bounds[1]:
        raise OverflowError("%s = %d is outside [%d, %d]" % (name, v, bounds[0], bounds[1]))
    return v


def _float(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, got %s" % (name, type(value).__name__))
    v = float(value)
    if not math.isfinite(v):
        raise ValueError("%s must be finite, got %r" % (name, v))
    return v


def _bounded(value, name, lo, hi, lo_open=False, what=""):
    """`value` as a finite float in [lo, hi] ((lo, hi] with lo_open), or ValueError naming
    it and the range."""
    v = _float(value, name)
    if v > hi or v < lo or (lo_open and v == lo):
        raise ValueError("%s must be in %s%r, %r]%s, got %r"
                         % (name, "(" if lo_open else "[", lo, hi, what, v))
    return v


def _until_stop(pieces, stops):
    """The text of `pieces` up to the first of the strings `stops`, which is left out: a stop
    may span pieces, so the last len(longest stop) - 1 characters wait for the next piece.
    Stopping closes `pieces` (its generation stops). Linear in the text."""
    keep = max(len(t) for t in stops) - 1
    held = ""
    for piece in pieces:
        held += piece
        found = [i for i in (held.find(t) for t in stops) if i >= 0]
        if found:
            if min(found):
                yield held[:min(found)]
            pieces.close()
            return
        if len(held) > keep:
            yield held[:len(held) - keep]
            held = held[len(held) - keep:]
    if held:
        yield held


def _ids(ids, name="ids"):
    """Token ids as a contiguous int32 array: integers only (Python ints or a NumPy integer
    array), each fitting int32, in one dimension."""
    if isinstance(ids, (str, bytes, bytearray, memoryview)):
        raise TypeError("%s must be a sequence of integers, got %s" % (name, type(ids).__name__))
    arr = np.asarray(ids)
    if arr.ndim > 1:
        raise ValueError("%s must be one-dimensional, got shape %s" % (name, arr.shape))
    arr = arr.reshape(-1)
    if arr.dtype == object:  # integers beyond int64, or mixed types
        for i, v in enumerate(arr.tolist()):
            _int(v, "%s[%d]" % (name, i), _INT32)
        return np.ascontiguousarray(arr.astype(np.int64), dtype=np.int32)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        if arr.size == 0 and arr.dtype.kind == "f":  # [] is float64 to NumPy
            return np.zeros(0, dtype=np.int32)
        raise TypeError("%s must be integers, got an array of %s" % (name, arr.dtype))
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < _INT32[0] or hi > _INT32[1]:
            bad = lo if lo < _INT32[0] else hi
            at = int(np.argmax(arr == bad))
            raise OverflowError("%s[%d] = %d does not fit a token id (int32)" % (name, at, bad))
    return np.ascontiguousarray(arr, dtype=np.int32)


def _locked(method):
    """Runs the method holding the session's lock: one C call sequence at a time."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


class SessionError(RuntimeError):
    """A failed session call: the library's message, and its code in `code` (-5,
    Session.NO_TOKENIZER, for text on a model without a tokenizer)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class Session:
    """A model loaded for decoding: `slots` sequences at once, each up to `max_seq`
    positions (0: the model's, at most 4096).

    model: a Hugging Face model folder or a GGUF file (str, bytes or os.PathLike), or None
      for the built-in tiny Llama with random weights from `weight_seed` (which has no
      tokenizer: ids only).
    backend: "auto" (CUDA when the library has it and a device is found, else the CPU),
      "cpu" or "cuda".
    temperature, top_k, top_p: sampling, by name. Greedy (argmax) unless `temperature` is
      given; then each step samples at that temperature from the top_k most likely ids (0:
      no limit) whose probabilities sum to top_p, with each slot's seed (prefill's and
      generate's `seed`). These are the session's; prefill, generate and chat take their
      own per call (see prefill).
    cpu_threads: threads of the CPU backend's parallel ops (0: one per core).

    Close it with close() or a `with` block; the garbage collector closes it too.
    """

    NO_TOKENIZER = _lib.ERROR_NO_TOKENIZER

    def __init__(self, model: Union[str, bytes, os.PathLike, None] = None, *,
                 backend: str = "auto", slots: int = 1, max_seq: int = 0,
                 temperature: Optional[float] = None, top_k: int = 0, top_p: float = 1.0,
                 weight_seed: int = 0, cpu_threads: int = 0) -> None:
        self._lock = threading.RLock()
        self._handle = None
        # Bumped by every call that prefills, steps or ends a sequence: a stream compares it
        # with the value its own last call left.
        self._epoch = 0
        if backend not in _BACKENDS:
            raise ValueError("backend must be one of %s, got %r" % (sorted(_BACKENDS), backend))
        self._lib = _lib.sessions()
        # The session's sampling, which a call's own options default to.
        self._temperature, self._top_k, self._top_p = None, 0, 1.0
        options = _lib.SessionOptions()
        self._lib.stepgraph_session_options_init(ctypes.byref(options))
        options.backend = _BACKENDS[backend]
        options.max_slots = _int(slots, "slots")
        options.max_seq = _int(max_seq, "max_seq")
        options.weight_seed = _int(weight_seed, "weight_seed", _UINT64)
        options.cpu_threads = _int(cpu_threads, "cpu_threads", _INT32)
        if temperature is not None:
            options.sampling = _lib.SAMPLING_SAMPLE
            # Finite and in float range: a float32 would make 1e39 infinite.
            options.temperature = _float(temperature, "temperature")
            if math.isinf(options.temperature):
                raise OverflowError("temperature %r does not fit a float32" % (temperature,))
            options.top_k = _int(top_k, "top_k", _INT32)
            options.top_p = _float(top_p, "top_p")
            self._temperature, self._top_k, self._top_p = (
                options.temperature, options.top_k, options.top_p)
        elif top_k != 0 or top_p != 1.0:
            raise ValueError("top_k and top_p shape sampling: give a temperature too "
                             "(without one the session decodes greedily)")
        handle = ctypes.c_void_p()
        path = None
        if model is not None:
            path = os.fsencode(model)  # str, bytes or os.PathLike
            if b"\0" in path:
                raise ValueError("the model path holds a NUL byte: %r" % (model,))
        code = self._lib.stepgraph_session_create(path, ctypes.byref(options),
                                                  ctypes.byref(handle))
        if code != _lib.OK:
            message = self._lib.stepgraph_session_error(handle).decode(errors="replace")
            self._lib.stepgraph_session_destroy(handle)
            raise SessionError("cannot create the session: %s" % message, code)
        self._handle = handle
        info = _lib.SessionInfo()
        self._check(self._lib.stepgraph_session_get_info(self._handle, ctypes.byref(info)))
        self.vocab_size: int = info.vocab_size
        self.slots: int = info.max_slots
        self.max_seq: int = info.max_seq
        self.backend: str = "cuda" if info.backend == _lib.BACKEND_CUDA else "cpu"

    def _check(self, code):
        if code != _lib.OK:
            message = self._lib.stepgraph_session_error(self._handle).decode(errors="replace")
            raise SessionError(message, code)

    def _live(self):
        if self._handle is None:
            raise SessionError("the session is closed", _lib.ERROR_INVALID_VALUE)
        return self._handle

    @property
    def closed(self) -> bool:
        """Whether close() ran."""
        return self._handle is None

    @_locked
    def prefill(self, ids: Ids, slot: int = 0, seed: int = 0, *,
                temperature: Optional[float] = None, top_k: Optional[int] = None,
                top_p: Optional[float] = None, repetition_penalty: Optional[float] = None,
                presence_penalty: Optional[float] = None,
                frequency_penalty: Optional[float] = None, min_p: Optional[float] = None,
                logit_bias: Optional[Mapping[int, float]] = None) -> None:
        """Starts a sequence in `slot` with the prompt token ids (integers fitting int32);
        `seed` (int32) is the slot's sampling seed.

        The sequence's own way of choosing ids (generate and chat take the same keywords);
        None leaves each as the session has it:
          temperature: >= 0; 0 decodes greedily, above it each step samples (the session's
            temperature when None; greedy for a greedy session).
          top_k (>= 0, 0: no limit), top_p (in (0, 1]): with a temperature only.
          repetition_penalty: > 0 (1: off), transformers': the logit l of an id in the
            prompt or already generated becomes l / r where positive, l * r otherwise.
          presence_penalty, frequency_penalty: in [-2, 2] (0: off), OpenAI's: l - (presence
            + frequency * times generated) for each id generated so far.
          min_p: in [0, 1] (0: off); sampled ids have at least min_p times the probability
            of the top one.
          logit_bias: {id: bias}, at most 64 ids of the vocabulary, biases in [-100, 100]
            added to their logits (OpenAI's: -100 bans an id, 100 all but forces it).
        Penalties and bias run in the decode step; a temperature other than the session's
        is drawn on the host from the step's logits (each step waits for the device)."""
        self._prefill(ids, slot, seed, self._sampling(
            temperature, top_k, top_p, repetition_penalty, presence_penalty,
            frequency_penalty, min_p, logit_bias))

    def _sampling(self, temperature, top_k, top_p, repetition_penalty, presence_penalty,
                  frequency_penalty, min_p, logit_bias):
        """A call's sampling as (stepgraph_sampling, the arrays it points at), checked as the
        C ABI checks it; None when the call asks for nothing of its own."""
        if all(v is None for v in (temperature, top_k, top_p, repetition_penalty,
                                   presence_penalty, frequency_penalty, min_p, logit_bias)):
            return None
        c = _lib.Sampling()
        self._lib.stepgraph_sampling_init(ctypes.byref(c))
        if temperature is not None:
            t = _float(temperature, "temperature")
            if t < 0:
                raise ValueError("temperature must be >= 0 (0: greedy), got %r" % t)
            if t > _lib._FLOAT_MAX:
                raise OverflowError("temperature %r does not fit a float32" % t)
        else:
            t = self._temperature or 0.0
        if t == 0.0 and (top_k is not None or top_p is not None):
            raise ValueError("top_k and top_p shape sampling: give a temperature too "
                             "(without one the call decodes greedily)")
        if t > 0.0:
            c.mode = _lib.SAMPLING_SAMPLE
            c.temperature = t
            c.top_k = self._top_k if top_k is None else _int(top_k, "top_k", _INT32)
            if c.top_k < 0:
                raise ValueError("top_k must be >= 0 (0: no limit), got %d" % c.top_k)
            c.top_p = self._top_p if top_p is None else _bounded(top_p, "top_p", 0.0, 1.0,
                                                                 lo_open=True)
        limit = _lib.SAMPLING_MAX_PENALTY
        if repetition_penalty is not None:
            c.repetition_penalty = _float(repetition_penalty, "repetition_penalty")
            if not c.repetition_penalty > 0:
                raise ValueError("repetition_penalty must be > 0 (1: off), got %r"
                                 % repetition_penalty)
        if presence_penalty is not None:
            c.presence_penalty = _bounded(presence_penalty, "presence_penalty", -limit, limit,
                                          what=" (0: off)")
        if frequency_penalty is not None:
            c.frequency_penalty = _bounded(frequency_penalty, "frequency_penalty", -limit,
                                           limit, what=" (0: off)")
        if min_p is not None:
            c.min_p = _bounded(min_p, "min_p", 0.0, 1.0, what=" (0: off)")
        ids = np.zeros(0, dtype=np.int32)
        values = np.zeros(0, dtype=np.float32)
        if logit_bias is not None:
            if not isinstance(logit_bias, Mapping):
                raise TypeError("logit_bias must be a mapping {token id: bias}, got %s"
                                % type(logit_bias).__name__)
            if len(logit_bias) > _lib.SAMPLING_MAX_LOGIT_BIAS:
                raise ValueError("logit_bias holds %d ids, at most %d are taken"
                                 % (len(logit_bias), _lib.SAMPLING_MAX_LOGIT_BIAS))
            bias = _lib.SAMPLING_MAX_BIAS
            pairs = []
            for k, v in logit_bias.items():
                i = _int(k, "logit_bias id", _INT32)
                if not 0 <= i < self.vocab_size:
                    raise ValueError("logit_bias id %d is outside the vocabulary [0, %d)"
                                     % (i, self.vocab_size))
                pairs.append((i, _bounded(v, "logit_bias[%d]" % i, -bias, bias)))
            if len({i for i, _ in pairs}) != len(pairs):  # 5 and np.int64(5) are one key
                raise ValueError("logit_bias names an id twice")
            ids = np.array([i for i, _ in pairs], dtype=np.int32)
            values = np.array([v for _, v in pairs], dtype=np.float32)
            c.logit_bias_count = len(pairs)
            if pairs:
                c.logit_bias_ids = ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
                c.logit_bias_values = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        return c, (ids, values)

    def _prefill(self, ids, slot, seed, sampling):
        with self._lock:
            handle = self._live()
            prompt = _ids(ids)
            slot = _int(slot, "slot")
            seed = _int(seed, "seed", _INT32)
            self._epoch += 1
            pointer = prompt.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            if sampling is None:
                self._check(self._lib.stepgraph_session_prefill(
                    handle, slot, pointer, prompt.size, seed))
            else:
                self._check(self._lib.stepgraph_session_prefill_sampled(
                    handle, slot, pointer, prompt.size, seed, ctypes.byref(sampling[0])))

    def _steps(self, n, slot):
        handle = self._live()
        n = _int(n, "n")
        slot = _int(slot, "slot")
        if n < 1:
            raise ValueError("the number of steps must be >= 1, got %d" % n)
        out = np.empty(n, dtype=np.int32)
        self._epoch += 1
        self._check(self._lib.stepgraph_session_generate(
            handle, slot, n, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))))
        return out.tolist()

    def generate(self, prompt: Union[Prompt, int], max_new_tokens: Optional[int] = None, *,
                 slot: int = 0, seed: int = 0, chat: bool = False,
                 stop: Union[bool, str, Iterable[Union[int, str]], None] = True,
                 stream: bool = False, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None,
                 repetition_penalty: Optional[float] = None,
                 presence_penalty: Optional[float] = None,
                 frequency_penalty: Optional[float] = None, min_p: Optional[float] = None,
                 logit_bias: Optional[Mapping[int, float]] = None
                 ) -> Union[str, List[int], Iterator[str], Iterator[int]]:
        """Three forms:

        generate("text", max_new_tokens=32): encodes the text with the model's tokenizer
          (chat=True: as one user turn of its chat template, as `stepgraph run --chat`),
          starts `slot` with it and returns the new text (special tokens left out).
        generate([ids...], max_new_tokens=32): the same with token ids in and out.
        generate(n): n more ids of a slot started with prefill (every live slot advances n
          steps), as a list; no stopping.

        The first two stop before the first of the model's stop ids (stop_ids(chat)) unless
        stop=False. stop may also list ids (they replace the model's) and, for text,
        strings: the text ends before the first of them, matched on the decoded text across
        token boundaries and left out of it (strings alone keep the model's stop ids). At
        most max_new_tokens (default 32) ids are generated; the prompt and them must fit
        max_seq. `seed` is the slot's sampling seed (see Session); temperature, top_k,
        top_p, repetition_penalty, presence_penalty, frequency_penalty, min_p and
        logit_bias choose this call's ids (see prefill).

        stream=True returns an iterator instead: of text pieces for a text prompt (their
        concatenation is the text generate returns; a character split between ids comes
        whole, in one piece), of ids for an id prompt. It runs as it is read, one step per
        piece or id at most; see the module's docstring for sharing a session meanwhile."""
        sampling = (temperature, top_k, top_p, repetition_penalty, presence_penalty,
                    frequency_penalty, min_p, logit_bias)
        if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
            if (max_new_tokens is not None or chat or seed != 0 or stream
                    or any(v is not None for v in sampling)):
                raise ValueError("generate(n) continues a prefilled slot: give slot= alone "
                                 "(max_new_tokens, seed, chat, stream and sampling belong to "
                                 "a prompt)")
            with self._lock:
                return self._steps(prompt, slot)
        text = isinstance(prompt, (str, bytes))
        if chat and not text:
            raise ValueError("chat=True wraps a text prompt")
        with self._lock:
            ids = self.encode(prompt, chat=chat) if text else _ids(prompt, "prompt").tolist()
        return self._generate(ids, max_new_tokens, slot, seed, stop, stream, text, chat,
                              sampling)

    def _generate(self, ids, max_new_tokens, slot, seed, stop, stream, text, chat, sampling):
        """generate and chat from the prompt's ids: text out (special tokens left out) when
        `text`, else ids."""
        n = 32 if max_new_tokens is None else _int(max_new_tokens, "max_new_tokens")
        if n < 1:
            raise ValueError("max_new_tokens must be >= 1, got %d" % n)
        slot = _int(slot, "slot")
        seed = _int(seed, "seed", _INT32)
        if not ids:
            raise ValueError("the prompt has no ids")
        with self._lock:
            # A prefill feeds every prompt id but the last; each step feeds one more.
            if len(ids) + n - 1 > self.max_seq:
                raise ValueError("a prompt of %d ids and %d new ids need %d positions, the "
                                 "session has max_seq %d"
                                 % (len(ids), n, len(ids) + n - 1, self.max_seq))
            stop_ids, stop_texts = self._stops(stop, chat, text)
            call = self._sampling(*sampling)
        # Stop strings are found in the text as it comes: the ids are asked for one at a
        # time, as by a stream.
        new_ids = self._new_ids(ids, n, slot, seed, stop_ids, stream or bool(stop_texts),
                                call)
        if not text:
            if stream:
                return new_ids
            with self._lock:  # whole: one locked call, as before streams existed
                return list(new_ids)
        if not stop_texts:
            if stream:
                return self._text_pieces(new_ids)
            with self._lock:
                return self.decode(list(new_ids), skip_special=True)
        pieces = _until_stop(self._text_pieces(new_ids), stop_texts)
        if stream:
            return pieces
        with self._lock:
            return "".join(pieces)

    def _stops(self, stop, chat, text):
        """The stop ids (a set) and stop strings (a list) of generate's `stop`."""
        if stop is True:
            return set(self.stop_ids(chat=chat)), []
        if stop is False or stop is None:
            return set(), []
        if isinstance(stop, str):
            stop = [stop]
        if isinstance(stop, np.ndarray):
            return set(_ids(stop, "stop").tolist()), []
        items = list(stop)
        texts = [x for x in items if isinstance(x, str)]
        given = [x for x in items if not isinstance(x, str)]
        if texts and not text:
            raise ValueError("stop strings are matched on text: give a text prompt (an id "
                             "prompt stops at ids)")
        if len(texts) > MAX_STOP_STRINGS:
            raise ValueError("stop: %d stop strings, at most %d are taken"
                             % (len(texts), MAX_STOP_STRINGS))
        for i, t in enumerate(texts):
            if not t or len(t.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES:
                raise ValueError("stop[%d]: each stop string must hold 1 to %d bytes of UTF-8"
                                 % (i, MAX_STOP_BYTES))
        if given or not texts:
            return set(_ids(given, "stop").tolist()), texts
        return set(self.stop_ids(chat=chat)), texts

    def _new_ids(self, ids, n, slot, seed, stops, stream, sampling=None):
        """The new ids of a prompt, lazily: each step runs under the lock when it is asked
        for, after checking that no other call used the session since this one's last."""
        with self._lock:
            self._prefill(ids, slot, seed, sampling)
            mine = self._epoch
        # Steps in chunks, so that a stop ends the work early; the CPU steps one at a time
        # (a step there costs far more than a call), and so does a stream, whose reader
        # wants each id as soon as it is made.
        chunk = 1 if self.backend == "cpu" or stream else 8
        done = 0
        while done < n:
            k = min(chunk, n - done) if stops or stream else n - done
            with self._lock:
                if self._epoch != mine:
                    raise SessionError(
                        "slot %d's sequence was taken by another call (a prefill, a step, a "
                        "release or close) while this generation was under way" % slot,
                        _lib.ERROR_INVALID_VALUE)
                got = self._steps(k, slot)
                mine = self._epoch
            done += k
            for i in got:
                if i in stops:
                    return
                yield i

    def _text_pieces(self, new_ids):
        """The text of the ids `new_ids` yields, piece by piece: each piece is the text the
        newest ids add to that of a few ids before them, so that a tokenizer's word starts
        (a leading space) come out as in decoding the whole; text ending in U+FFFD, a
        character whose bytes are still arriving, waits for up to _HELD_IDS more ids. Each
        piece costs a decode of a few ids, not of everything so far."""
        ids = []
        start = done = 0  # ids[start:done] is context already given; ids[done:] is not
        for i in new_ids:
            ids.append(i)
            piece = self._piece(ids, start, done, final=False)
            if piece is not None:
                if piece:
                    yield piece
                start, done = done, len(ids)
        piece = self._piece(ids, start, done, final=True)
        if piece:
            yield piece

    def _piece(self, ids, start, done, final):
        with self._lock:
            before = self.decode(ids[start:done], skip_special=True)
            after = self.decode(ids[start:], skip_special=True)
        if (not final and after.endswith("\ufffd")
                and len(ids) - done < _HELD_IDS):
            return None
        return after[len(before):]

    def chat(self, messages: Union[str, Sequence[Message]], max_new_tokens: Optional[int] = None,
             *, slot: int = 0, seed: int = 0,
             stop: Union[bool, str, Iterable[Union[int, str]], None] = True,
             stream: bool = False, temperature: Optional[float] = None,
             top_k: Optional[int] = None, top_p: Optional[float] = None,
             repetition_penalty: Optional[float] = None,
             presence_penalty: Optional[float] = None,
             frequency_penalty: Optional[float] = None, min_p: Optional[float] = None,
             logit_bias: Optional[Mapping[int, float]] = None) -> Union[str, Iterator[str]]:
        """The assistant's reply to a conversation: the messages through the model's chat
        template as transformers' apply_chat_template(messages, add_generation_prompt=True)
        renders them (encode_chat), then generated as generate(ids, ...) and returned as
        text, special tokens left out; stream=True gives an iterator of text pieces.

        messages: [{"role": "system" | "user" | "assistant", "content": "..."}, ...], or
        the user's text alone. stop=True stops at the chat's stop ids (stop_ids(chat=True));
        stop strings and the sampling keywords are generate's. Each call renders and
        prefills the whole conversation."""
        if isinstance(messages, (str, bytes)):
            text = messages if isinstance(messages, str) else messages.decode("utf-8")
            messages = [{"role": "user", "content": text}]
        ids = self.encode_chat(messages)
        if not ids:
            raise ValueError("the chat template rendered no ids")
        return self._generate(ids, max_new_tokens, slot, seed, stop, stream, True, True,
                              (temperature, top_k, top_p, repetition_penalty,
                               presence_penalty, frequency_penalty, min_p, logit_bias))

    # ---- text (the model's tokenizer) ----------------------------------------------------

    @_locked
    def encode(self, text: Union[str, bytes], chat: bool = False, add_special: bool = True,
               parse_special: bool = True) -> List[int]:
        """The token ids of `text` (str, or UTF-8 bytes). chat=True: as one user turn of the
        model's chat template with the assistant's turn opened. add_special: bos / eos where
        the tokenizer's files ask for them. parse_special=False: special tokens written in
        the text stay text."""
        handle = self._live()
        if isinstance(text, str):
            data = text.encode("utf-8", "surrogatepass")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:  # bytes(12345) would be 12345 NUL bytes
            raise TypeError("text must be str or bytes, got %s" % type(text).__name__)
        flags = ((_lib.TEXT_CHAT if chat else 0) | (0 if add_special else _lib.TEXT_NO_ADD_SPECIAL)
                 | (0 if parse_special else _lib.TEXT_LITERAL_SPECIAL))
        return self._sized_ids("stepgraph_session_encode", len(data),
                               lambda out, capacity, count: self._lib.stepgraph_session_encode(
                                   handle, data, len(data), flags, out, capacity, count))

    def _sized_ids(self, function, guess, call):
        """The ids a text call writes: call(ids pointer, capacity, count pointer) with room
        for guess + a few ids, then once more with the size the library asks for."""
        count = ctypes.c_int64(0)
        capacity = guess + _SPARE_IDS
        for _ in range(2):
            out = np.empty(capacity, dtype=np.int32)
            code = call(out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), capacity,
                        ctypes.byref(count))
            if code == _lib.ERROR_INVALID_VALUE and count.value > capacity:
                capacity = count.value
                continue
            self._check(code)
            return out[:count.value].tolist()
        raise SessionError("%s: the size it asked for did not suffice" % function,
                           _lib.ERROR_LAUNCH_FAILED)

    @_locked
    def encode_chat(self, messages: Sequence[Message]) -> List[int]:
        """The token ids of a conversation through the model's chat template, with the
        prompt that opens the assistant's turn: what transformers'
        apply_chat_template(messages, add_generation_prompt=True, tokenize=True) gives.
        messages: [{"role": "system" | "user" | "assistant", "content": "..."}, ...]; the
        template decides which roles and orders it takes (SessionError says why not)."""
        handle = self._live()
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a list of {'role', 'content'} mappings, got %s"
                            % type(messages).__name__)
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise TypeError("messages[%d] must be a mapping with str 'role' and "
                                "'content'" % i)
        # Every key goes to the library, which refuses those it does not take by name.
        data = json.dumps([dict(m) for m in messages],
                          ensure_ascii=False).encode("utf-8", "surrogatepass")
        return self._sized_ids("stepgraph_session_encode_chat", len(data),
                               lambda out, capacity, count:
                               self._lib.stepgraph_session_encode_chat(
                                   handle, data, len(data), out, capacity, count))

    @_locked
    def decode(self, ids: Ids, skip_special: bool = False) -> str:
        """The text of token ids (a str). skip_special: leave control tokens (bos, eos,
        <|im_end|>, ...) out. Bytes that do not form UTF-8 become U+FFFD."""
        handle = self._live()
        arr = _ids(ids)
        flags = _lib.TEXT_SKIP_SPECIAL if skip_special else 0
        length = ctypes.c_int64(0)
        capacity = arr.size * _BYTES_PER_ID + _SPARE_IDS
        for _ in range(2):
            buf = ctypes.create_string_buffer(capacity)
            code = self._lib.stepgraph_session_decode(
                handle, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), arr.size, flags,
                buf, capacity, ctypes.byref(length))
            if code == _lib.ERROR_INVALID_VALUE and length.value + 1 > capacity:
                capacity = length.value + 1
                continue
            self._check(code)
            return buf.raw[:length.value].decode("utf-8")
        raise SessionError("stepgraph_session_decode: the size it asked for did not suffice",
                           _lib.ERROR_LAUNCH_FAILED)

    @_locked
    def stop_ids(self, chat: bool = False) -> List[int]:
        """The ids that end a sequence, as the model's files state them; chat=True adds the
        chat template's end-of-turn id (which needs the tokenizer)."""
        handle = self._live()
        flags = _lib.TEXT_CHAT if chat else 0
        count = ctypes.c_int64(0)
        self._check(self._lib.stepgraph_session_stop_ids(handle, flags, None, 0,
                                                         ctypes.byref(count)))
        out = np.empty(max(count.value, 1), dtype=np.int32)
        self._check(self._lib.stepgraph_session_stop_ids(
            handle, flags, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), out.size,
            ctypes.byref(count)))
        return out[:count.value].tolist()

    @_locked
    def complete(self, ids: Ids, max_new_tokens: int = 32, slot: int = 0, seed: int = 0,
                 **sampling) -> List[int]:
        """Starts `slot` with the prompt ids and returns its max_new_tokens new ids, without
        stopping (generate(ids) stops at the stop ids; generate("text") speaks text).
        `sampling`: prefill's keywords (temperature, ..., logit_bias)."""
        self.prefill(ids, slot=slot, seed=seed, **sampling)
        return self._steps(max_new_tokens, slot)

    @_locked
    def logits(self, slot: int = 0) -> np.ndarray:
        """The f32 logits of `slot`'s row in the last step (a NumPy array)."""
        handle = self._live()
        slot = _int(slot, "slot")
        out = np.empty(self.vocab_size, dtype=np.float32)
        self._check(self._lib.stepgraph_session_logits(
            handle, slot, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    @_locked
    def release(self, slot: int = 0) -> None:
        """Ends `slot`'s sequence."""
        self._epoch += 1
        self._check(self._lib.stepgraph_session_release(self._live(), _int(slot, "slot")))

    @_locked
    def close(self) -> None:
        """Frees the session (the model's buffers, its KV cache); later calls raise
        SessionError. Waits for a call in progress in another thread; twice is harmless."""
        if self._handle is not None:
            self._lib.stepgraph_session_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_lock", None) is not None:
                self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
