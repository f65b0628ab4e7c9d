"""Decode sessions from Python, over the session C ABI (include/stepgraph/c_session.h).

    s = stepgraph.Session(None)          # the built-in tiny model, random weights
    s.prefill([1, 2, 3])
    ids = s.generate(16)                 # 16 new token ids of slot 0
"""

import ctypes

import numpy as np

from . import _lib

_BACKENDS = {"auto": _lib.BACKEND_AUTO, "cpu": _lib.BACKEND_CPU, "cuda": _lib.BACKEND_CUDA}


class SessionError(RuntimeError):
    """A failed session call: the library's message, and its code in `code`."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class Session:
    """A model loaded for decoding: `slots` sequences at once, each up to `max_seq`
    positions. model: a Hugging Face model folder, or None for the built-in tiny Llama with
    random weights from `weight_seed`. backend: "auto", "cpu" or "cuda". Greedy unless
    `temperature` is given (then sampled, with top_k and top_p)."""

    def __init__(self, model=None, backend="auto", slots=1, max_seq=0, temperature=None,
                 top_k=0, top_p=1.0, weight_seed=0):
        if backend not in _BACKENDS:
            raise ValueError("backend must be one of %s, got %r" % (sorted(_BACKENDS), backend))
        self._lib = _lib.sessions()
        self._handle = None
        options = _lib.SessionOptions()
        self._lib.stepgraph_session_options_init(ctypes.byref(options))
        options.backend = _BACKENDS[backend]
        options.max_slots = int(slots)
        options.max_seq = int(max_seq)
        options.weight_seed = int(weight_seed)
        if temperature is not None:
            options.sampling = _lib.SAMPLING_SAMPLE
            options.temperature = float(temperature)
            options.top_k = int(top_k)
            options.top_p = float(top_p)
        handle = ctypes.c_void_p()
        path = None if model is None else str(model).encode()
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

    def prefill(self, ids, slot=0, seed=0):
        """Starts a sequence in `slot` with the prompt token ids."""
        handle = self._live()
        prompt = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        self._check(self._lib.stepgraph_session_prefill(
            handle, int(slot), prompt.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            prompt.size, int(seed)))

    def generate(self, n, slot=0):
        """n new token ids of `slot` (every live slot advances n steps), as a list."""
        handle = self._live()
        out = np.empty(int(n), dtype=np.int32)
        self._check(self._lib.stepgraph_session_generate(
            handle, int(slot), int(n), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))))
        return out.tolist()

    def complete(self, ids, max_new_tokens=32, slot=0, seed=0):
        """Starts `slot` with the prompt ids and returns its max_new_tokens new ids (text in
        and out comes with the tokenizer's C functions)."""
        self.prefill(ids, slot=slot, seed=seed)
        return self.generate(max_new_tokens, slot=slot)

    def logits(self, slot=0):
        """The f32 logits of `slot`'s row in the last step (a NumPy array)."""
        handle = self._live()
        out = np.empty(self.vocab_size, dtype=np.float32)
        self._check(self._lib.stepgraph_session_logits(
            handle, int(slot), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    def release(self, slot=0):
        """Ends `slot`'s sequence."""
        self._check(self._lib.stepgraph_session_release(self._live(), int(slot)))

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
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
