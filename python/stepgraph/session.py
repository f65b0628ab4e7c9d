"""Decode sessions from Python, over the session C ABI (include/stepgraph/c_api/c_session.h).

    s = stepgraph.Session("SmolLM2-135M-Instruct.Q4_1.gguf")
    s.generate("The capital of France is", max_new_tokens=32)   # text in, text out
    s.generate("What is the capital of France?", chat=True)     # one user turn of the chat

    s = stepgraph.Session(None)          # the built-in tiny model, random weights, no tokenizer
    s.prefill([1, 2, 3])
    ids = s.generate(16)                 # 16 new token ids of slot 0

Every argument is checked in Python before the C call: token ids must be integers that fit
int32 (a float, a string or a bool is a TypeError, 2**32 + 5 an OverflowError, never 5),
slots fit int64, seeds int32, texts are str or bytes, paths hold no NUL. A Session may be
shared between threads: its calls are serialised by a lock (the C handle is used by one
thread at a time), and close() waits for a call in progress.
"""

import ctypes
import functools
import math
import numbers
import os
import threading

import numpy as np

from . import _lib

# The first guess of a text call's buffer; a larger one is asked for when the library says
# so (the size-query convention of c_session.h), so a guess only saves a call.
_SPARE_IDS = 64
_BYTES_PER_ID = 8

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
    positions (0: the model's, at most 4096). model: a Hugging Face model folder or a GGUF
    file, or None for the built-in tiny Llama with random weights from `weight_seed` (which
    has no tokenizer: ids only). backend: "auto", "cpu" or "cuda". Greedy unless
    `temperature` is given (then sampled, with top_k and top_p)."""

    NO_TOKENIZER = _lib.ERROR_NO_TOKENIZER

    def __init__(self, model=None, backend="auto", slots=1, max_seq=0, temperature=None,
                 top_k=0, top_p=1.0, weight_seed=0):
        self._lock = threading.RLock()
        self._handle = None
        if backend not in _BACKENDS:
            raise ValueError("backend must be one of %s, got %r" % (sorted(_BACKENDS), backend))
        self._lib = _lib.sessions()
        options = _lib.SessionOptions()
        self._lib.stepgraph_session_options_init(ctypes.byref(options))
        options.backend = _BACKENDS[backend]
        options.max_slots = _int(slots, "slots")
        options.max_seq = _int(max_seq, "max_seq")
        options.weight_seed = _int(weight_seed, "weight_seed", _UINT64)
        if temperature is not None:
            options.sampling = _lib.SAMPLING_SAMPLE
            # Finite and in float range: a float32 would make 1e39 infinite.
            options.temperature = _float(temperature, "temperature")
            if math.isinf(options.temperature):
                raise OverflowError("temperature %r does not fit a float32" % (temperature,))
            options.top_k = _int(top_k, "top_k", _INT32)
            options.top_p = _float(top_p, "top_p")
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
        self.vocab_size = info.vocab_size
        self.slots = info.max_slots
        self.max_seq = info.max_seq
        self.backend = "cuda" if info.backend == _lib.BACKEND_CUDA else "cpu"

    def _check(self, code):
        if code != _lib.OK:
            message = self._lib.stepgraph_session_error(self._handle).decode(errors="replace")
            raise SessionError(message, code)

    def _live(self):
        if self._handle is None:
            raise SessionError("the session is closed", _lib.ERROR_INVALID_VALUE)
        return self._handle

    @_locked
    def prefill(self, ids, slot=0, seed=0):
        """Starts a sequence in `slot` with the prompt token ids (integers fitting int32);
        `seed` (int32) is the slot's sampling seed."""
        handle = self._live()
        prompt = _ids(ids)
        slot = _int(slot, "slot")
        seed = _int(seed, "seed", _INT32)
        self._check(self._lib.stepgraph_session_prefill(
            handle, slot, prompt.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            prompt.size, seed))

    def _steps(self, n, slot):
        handle = self._live()
        n = _int(n, "n")
        slot = _int(slot, "slot")
        if n < 1:
            raise ValueError("the number of steps must be >= 1, got %d" % n)
        out = np.empty(n, dtype=np.int32)
        self._check(self._lib.stepgraph_session_generate(
            handle, slot, n, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))))
        return out.tolist()

    @_locked
    def generate(self, prompt, max_new_tokens=None, slot=0, seed=0, chat=False, stop=True):
        """Three forms:

        generate("text", max_new_tokens=32): encodes the text with the model's tokenizer
          (chat=True: as one user turn of its chat template, as `stepgraph run --chat`),
          starts `slot` with it and returns the new text (special tokens left out).
        generate([ids...], max_new_tokens=32): the same with token ids in and out.
        generate(n): n more ids of a slot started with prefill (every live slot advances n
          steps), as a list; no stopping.

        The first two stop before the first of the model's stop ids (stop_ids(chat)) unless
        stop=False; stop may also be a list of ids. At most max_new_tokens (default 32) ids
        are generated."""
        if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
            if max_new_tokens is not None or chat or seed != 0:
                raise ValueError("generate(n) continues a prefilled slot: give slot= alone "
                                 "(max_new_tokens, seed and chat belong to a prompt)")
            return self._steps(prompt, slot)
        text = isinstance(prompt, (str, bytes))
        if chat and not text:
            raise ValueError("chat=True wraps a text prompt")
        n = 32 if max_new_tokens is None else _int(max_new_tokens, "max_new_tokens")
        if n < 1:
            raise ValueError("max_new_tokens must be >= 1, got %d" % n)
        ids = self.encode(prompt, chat=chat) if text else _ids(prompt, "prompt").tolist()
        if not ids:
            raise ValueError("the prompt has no ids")
        # A prefill feeds every prompt id but the last; each step feeds one more.
        if len(ids) + n - 1 > self.max_seq:
            raise ValueError("a prompt of %d ids and %d new ids need %d positions, the session "
                             "has max_seq %d" % (len(ids), n, len(ids) + n - 1, self.max_seq))
        if stop is True:
            stops = set(self.stop_ids(chat=chat))
        elif stop is False or stop is None:
            stops = set()
        else:
            stops = set(_ids(stop, "stop").tolist())
        self.prefill(ids, slot=slot, seed=seed)
        # Steps in chunks, so that a stop ends the work early; the CPU steps one at a time
        # (a step there costs far more than a call).
        chunk = 1 if self.backend == "cpu" else 8
        out = []
        done = 0
        while done < n:
            k = min(chunk, n - done) if stops else n - done
            got = self._steps(k, slot)
            done += k
            for i in got:
                if i in stops:
                    done = n
                    break
                out.append(i)
        return self.decode(out, skip_special=True) if text else out

    # ---- text (the model's tokenizer) ----------------------------------------------------

    @_locked
    def encode(self, text, chat=False, add_special=True, parse_special=True):
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
        count = ctypes.c_int64(0)
        capacity = len(data) + _SPARE_IDS
        for _ in range(2):
            out = np.empty(capacity, dtype=np.int32)
            code = self._lib.stepgraph_session_encode(
                handle, data, len(data), flags,
                out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), capacity,
                ctypes.byref(count))
            if code == _lib.ERROR_INVALID_VALUE and count.value > capacity:
                capacity = count.value
                continue
            self._check(code)
            return out[:count.value].tolist()
        raise SessionError("stepgraph_session_encode: the size it asked for did not suffice",
                           _lib.ERROR_LAUNCH_FAILED)

    @_locked
    def decode(self, ids, skip_special=False):
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
    def stop_ids(self, chat=False):
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
    def complete(self, ids, max_new_tokens=32, slot=0, seed=0):
        """Starts `slot` with the prompt ids and returns its max_new_tokens new ids, without
        stopping (generate(ids) stops at the stop ids; generate("text") speaks text)."""
        self.prefill(ids, slot=slot, seed=seed)
        return self._steps(max_new_tokens, slot)

    @_locked
    def logits(self, slot=0):
        """The f32 logits of `slot`'s row in the last step (a NumPy array)."""
        handle = self._live()
        slot = _int(slot, "slot")
        out = np.empty(self.vocab_size, dtype=np.float32)
        self._check(self._lib.stepgraph_session_logits(
            handle, slot, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    @_locked
    def release(self, slot=0):
        """Ends `slot`'s sequence."""
        self._check(self._lib.stepgraph_session_release(self._live(), _int(slot, "slot")))

    @_locked
    def close(self):
        if self._handle is not None:
            self._lib.stepgraph_session_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_lock", None) is not None:
                self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
