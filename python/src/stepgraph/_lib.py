"""The shared libraries and their C declarations.

DECLARATIONS mirrors include/stepgraph/c_api/c_api.h and c_session.h argument by argument (names
and ctypes types); tests/c_api/check_signatures.py checks it against the headers, so a
changed signature fails CI instead of corrupting memory at run time.

The libraries are found in one folder, the first of:
  - the folder given to set_library_dir (before the first call that loads one);
  - $STEPGRAPH_LIB_DIR, read when the first library loads (the variable the Rust crate's and
    the Go package's builds read too): when set, only there, and its absence is an error;
  - this package's own folder, where `pip install ./python` puts them (the wheel carries
    them; `pip install -e` puts them in site-packages, in the package's __path__ too); an
    installed package looks nowhere else, so a stray build folder is never used;
  - only for a package imported from a source checkout (python/src/stepgraph beside the
    repository's CMakeLists.txt): the checkout's build folders build/cuda, build/nocuda, build.
"""

import ctypes
import math
import numbers
import os
import sys
import threading
from ctypes import (POINTER, Structure, c_char_p, c_float, c_int32, c_int64, c_uint32,
                    c_uint64, c_void_p)

# Return codes and constants of c_api.h.
OK = 0
ERROR_NO_CUDA = -1
ERROR_INVALID_VALUE = -2
ERROR_LAUNCH_FAILED = -3
ERROR_OUT_OF_MEMORY = -4
F32, BF16, F16, I32 = 0, 1, 2, 3
FLAG_TOKEN_OUT_OF_RANGE = 1
FLAG_POSITION_OUT_OF_RANGE = 2
MAX_ELEMENTS = 1 << 36
MATMUL_MAX_ROWS = 8
ATTENTION_MAX_HEAD_DIM = 256
MOE_MAX_EXPERTS = 4096
TOPK_MAX_K = 1024
FLASH_MAX_HEAD_DIM = 256
CLIP_MAX_BUFFERS = 65536
ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3 = 0, 1
C_API_VERSION = 2

# c_session.h.
SESSION_API_VERSION = 3
ERROR_NO_TOKENIZER = -5
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
SAMPLING_GREEDY, SAMPLING_SAMPLE = 0, 1
SESSION_MIN_TEMPERATURE = 1e-5  # sampling below it is greedy decoding
TEXT_CHAT = 1
TEXT_NO_ADD_SPECIAL = 2
TEXT_LITERAL_SPECIAL = 4
TEXT_SKIP_SPECIAL = 8
SESSION_MAX_TEXT_BYTES = 1 << 30
SESSION_MAX_DECODE_IDS = 1 << 28
SAMPLING_MAX_LOGIT_BIAS = 64
SAMPLING_MAX_PENALTY = 2.0  # |presence_penalty| and |frequency_penalty|
SAMPLING_MAX_BIAS = 100.0  # |a logit bias|


class SessionOptions(Structure):
    _fields_ = [
        ("struct_size", c_int64),
        ("max_slots", c_int64),
        ("max_seq", c_int64),
        ("weight_seed", c_uint64),
        ("backend", c_int32),
        ("sampling", c_int32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("cpu_threads", c_int32),
    ]


class Sampling(Structure):
    _fields_ = [
        ("struct_size", c_int64),
        ("mode", c_int32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("repetition_penalty", c_float),
        ("presence_penalty", c_float),
        ("frequency_penalty", c_float),
        ("min_p", c_float),
        ("logit_bias_count", c_int32),
        ("logit_bias_ids", POINTER(c_int32)),
        ("logit_bias_values", POINTER(c_float)),
    ]


class SessionInfo(Structure):
    _fields_ = [
        ("vocab_size", c_int64),
        ("max_slots", c_int64),
        ("max_seq", c_int64),
        ("backend", c_int32),
    ]


_P_I32 = POINTER(c_int32)
_P_U32 = POINTER(c_uint32)
_P_I64 = POINTER(c_int64)
_P_F32 = POINTER(c_float)
_P_PTR = POINTER(c_void_p)  # void* const* and stepgraph_session**
_SESSION = c_void_p  # stepgraph_session*, opaque

# name: (restype, [(argument name, ctypes type), ...]), in the headers' order.
DECLARATIONS = {
    # ---- c_api.h
    "stepgraph_abi_version": (c_int32, []),
    "stepgraph_error_string": (c_char_p, [("code", c_int32)]),
    "stepgraph_embedding": (c_int32, [
        ("table", c_void_p), ("ids", _P_I32), ("out", c_void_p), ("rows", c_int64),
        ("vocab", c_int64), ("hidden", c_int64), ("dtype", c_int32),
        ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_matmul": (c_int32, [
        ("x", c_void_p), ("w", c_void_p), ("bias", c_void_p), ("y", c_void_p), ("m", c_int64),
        ("n", c_int64), ("k", c_int64), ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_rmsnorm": (c_int32, [
        ("x", c_void_p), ("weight", c_void_p), ("y", c_void_p), ("rows", c_int64),
        ("hidden", c_int64), ("eps", c_float), ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_add": (c_int32, [
        ("a", c_void_p), ("b", c_void_p), ("y", c_void_p), ("n", c_int64), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_mul": (c_int32, [
        ("a", c_void_p), ("b", c_void_p), ("y", c_void_p), ("n", c_int64), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_silu": (c_int32, [
        ("x", c_void_p), ("y", c_void_p), ("n", c_int64), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_silu_mul": (c_int32, [
        ("gate", c_void_p), ("up", c_void_p), ("y", c_void_p), ("n", c_int64),
        ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_scale": (c_int32, [
        ("x", c_void_p), ("y", c_void_p), ("n", c_int64), ("alpha", c_float), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_rope_inv_freq": (c_int32, [
        ("head_dim", c_int32), ("theta", c_float), ("scaling", c_int32), ("factor", c_float),
        ("low_freq_factor", c_float), ("high_freq_factor", c_float),
        ("original_max_position", c_int32), ("inv_freq", _P_F32)]),
    "stepgraph_rope": (c_int32, [
        ("x", c_void_p), ("pos", _P_I32), ("inv_freq", _P_F32), ("y", c_void_p),
        ("rows", c_int64), ("cols", c_int64), ("head_dim", c_int64), ("interleaved", c_int32),
        ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_kv_write": (c_int32, [
        ("kv", c_void_p), ("pos", _P_I32), ("cache", c_void_p), ("rows", c_int64),
        ("slots", c_int64), ("kv_heads", c_int64), ("seq_len", c_int64), ("head_dim", c_int64),
        ("dtype", c_int32), ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_attention_workspace_bytes": (c_int32, [
        ("rows", c_int64), ("heads", c_int64), ("kv_heads", c_int64), ("seq_len", c_int64),
        ("head_dim", c_int64), ("bytes", _P_I64)]),
    "stepgraph_attention": (c_int32, [
        ("q", c_void_p), ("k_cache", c_void_p), ("v_cache", c_void_p), ("pos", _P_I32),
        ("out", c_void_p), ("rows", c_int64), ("heads", c_int64), ("kv_heads", c_int64),
        ("slots", c_int64), ("seq_len", c_int64), ("head_dim", c_int64), ("scale", c_float),
        ("dtype", c_int32), ("workspace", c_void_p), ("workspace_bytes", c_int64),
        ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_softmax": (c_int32, [
        ("x", c_void_p), ("y", c_void_p), ("rows", c_int64), ("n", c_int64), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_argmax_workspace_bytes": (c_int32, [
        ("rows", c_int64), ("vocab", c_int64), ("bytes", _P_I64)]),
    "stepgraph_argmax": (c_int32, [
        ("logits", c_void_p), ("ids", _P_I32), ("rows", c_int64), ("vocab", c_int64),
        ("dtype", c_int32), ("workspace", c_void_p), ("workspace_bytes", c_int64),
        ("stream", c_void_p)]),
    "stepgraph_sample": (c_int32, [
        ("logits", c_void_p), ("seeds", _P_I32), ("pos", _P_I32), ("ids", _P_I32),
        ("rows", c_int64), ("vocab", c_int64), ("temperature", c_float), ("top_k", c_int32),
        ("top_p", c_float), ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_copy": (c_int32, [
        ("src", c_void_p), ("dst", c_void_p), ("n", c_int64), ("dtype", c_int32),
        ("stream", c_void_p)]),
    "stepgraph_advance": (c_int32, [("pos", _P_I32), ("n", c_int64), ("stream", c_void_p)]),
    "stepgraph_topk": (c_int32, [
        ("x", c_void_p), ("values", c_void_p), ("indices", _P_I32), ("rows", c_int64),
        ("n", c_int64), ("k", c_int64), ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_flash_attention": (c_int32, [
        ("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("out", c_void_p), ("batch", c_int64),
        ("seq", c_int64), ("heads", c_int64), ("kv_heads", c_int64), ("head_dim", c_int64),
        ("scale", c_float), ("causal", c_int32), ("dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_gemm": (c_int32, [
        ("a", c_void_p), ("b", c_void_p), ("c", c_void_p), ("m", c_int64), ("n", c_int64),
        ("k", c_int64), ("trans_a", c_int32), ("trans_b", c_int32), ("alpha", c_float),
        ("beta", c_float), ("dtype", c_int32), ("workspace", c_void_p),
        ("workspace_bytes", c_int64), ("stream", c_void_p)]),
    "stepgraph_gemm_batched": (c_int32, [
        ("a", c_void_p), ("b", c_void_p), ("c", c_void_p), ("batch", c_int64), ("m", c_int64),
        ("n", c_int64), ("k", c_int64), ("stride_a", c_int64), ("stride_b", c_int64),
        ("stride_c", c_int64), ("trans_a", c_int32), ("trans_b", c_int32), ("alpha", c_float),
        ("beta", c_float), ("dtype", c_int32), ("workspace", c_void_p),
        ("workspace_bytes", c_int64), ("stream", c_void_p)]),
    "stepgraph_cross_entropy": (c_int32, [
        ("logits", c_void_p), ("targets", _P_I32), ("loss", _P_F32), ("log_probs", c_void_p),
        ("rows", c_int64), ("vocab", c_int64), ("ignore_index", c_int32), ("dtype", c_int32),
        ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_cross_entropy_backward": (c_int32, [
        ("logits", c_void_p), ("targets", _P_I32), ("dloss", _P_F32), ("dlogits", c_void_p),
        ("rows", c_int64), ("vocab", c_int64), ("ignore_index", c_int32), ("dtype", c_int32),
        ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_moe_aux_loss": (c_int32, [
        ("router_probs", c_void_p), ("expert_ids", _P_I32), ("loss", _P_F32),
        ("tokens", c_int64), ("experts", c_int64), ("top_k", c_int64), ("dtype", c_int32),
        ("error_flags", _P_U32), ("stream", c_void_p)]),
    "stepgraph_adamw_step": (c_int32, [
        ("param", _P_F32), ("grad", c_void_p), ("exp_avg", _P_F32), ("exp_avg_sq", _P_F32),
        ("n", c_int64), ("lr", c_float), ("beta1", c_float), ("beta2", c_float),
        ("eps", c_float), ("weight_decay", c_float), ("step", c_int64),
        ("grad_dtype", c_int32), ("stream", c_void_p)]),
    "stepgraph_clip_grad_norm": (c_int32, [
        ("grads", _P_PTR), ("sizes", _P_I64), ("count", c_int64), ("max_norm", c_float),
        ("dtype", c_int32), ("total_norm", _P_F32), ("stream", c_void_p)]),
    # ---- c_session.h
    "stepgraph_session_abi_version": (c_int32, []),
    "stepgraph_session_options_init": (c_int32, [("options", POINTER(SessionOptions))]),
    "stepgraph_sampling_init": (c_int32, [("sampling", POINTER(Sampling))]),
    "stepgraph_session_create": (c_int32, [
        ("model_path", c_char_p), ("options", POINTER(SessionOptions)), ("session", _P_PTR)]),
    "stepgraph_session_destroy": (None, [("session", _SESSION)]),
    "stepgraph_session_error": (c_char_p, [("session", _SESSION)]),
    "stepgraph_session_get_info": (c_int32, [
        ("session", _SESSION), ("info", POINTER(SessionInfo))]),
    "stepgraph_session_prefill": (c_int32, [
        ("session", _SESSION), ("slot", c_int64), ("ids", _P_I32), ("n", c_int64),
        ("seed", c_int32)]),
    "stepgraph_session_prefill_sampled": (c_int32, [
        ("session", _SESSION), ("slot", c_int64), ("ids", _P_I32), ("n", c_int64),
        ("seed", c_int32), ("sampling", POINTER(Sampling))]),
    "stepgraph_session_generate": (c_int32, [
        ("session", _SESSION), ("slot", c_int64), ("n", c_int64), ("ids", _P_I32)]),
    "stepgraph_session_logits": (c_int32, [
        ("session", _SESSION), ("slot", c_int64), ("logits", _P_F32), ("capacity", c_int64)]),
    "stepgraph_session_release": (c_int32, [("session", _SESSION), ("slot", c_int64)]),
    "stepgraph_session_encode": (c_int32, [
        ("session", _SESSION), ("text", c_char_p), ("text_bytes", c_int64), ("flags", c_uint32),
        ("ids", _P_I32), ("capacity", c_int64), ("count", _P_I64)]),
    "stepgraph_session_encode_chat": (c_int32, [
        ("session", _SESSION), ("messages_json", c_char_p), ("json_bytes", c_int64),
        ("ids", _P_I32), ("capacity", c_int64), ("count", _P_I64)]),
    "stepgraph_session_decode": (c_int32, [
        ("session", _SESSION), ("ids", _P_I32), ("n", c_int64), ("flags", c_uint32),
        ("text", c_char_p), ("capacity", c_int64), ("length", _P_I64)]),
    "stepgraph_session_stop_ids": (c_int32, [
        ("session", _SESSION), ("flags", c_uint32), ("ids", _P_I32), ("capacity", c_int64),
        ("count", _P_I64)]),
}

KERNEL_LIBRARY = "libstepgraph_c.so"
SESSION_LIBRARY = "libstepgraph_session_c.so"


class LibraryNotFound(OSError):
    pass


_lock = threading.Lock()
_loaded = {}
_library_dir = None


def set_library_dir(path):
    """Looks for libstepgraph_c.so and libstepgraph_session_c.so in `path` first. Only before
    the libraries are loaded (the first call that needs one)."""
    global _library_dir
    with _lock:
        if _loaded:
            raise RuntimeError("the stepgraph libraries are loaded already")
        _library_dir = os.fspath(path)


def _in_checkout(here):
    """The repository a package imported from a source checkout sits in, else None."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # python/src/stepgraph
    if (os.path.isfile(os.path.join(repo, "python", "pyproject.toml"))
            and os.path.isfile(os.path.join(repo, "CMakeLists.txt"))
            and os.path.isdir(os.path.join(repo, "c_api"))):
        return repo
    return None


def library_dirs():
    """The folders searched for the libraries, in order (see the module's docstring): one
    when set_library_dir or STEPGRAPH_LIB_DIR names it."""
    if _library_dir is not None:
        return [_library_dir]
    env = os.environ.get("STEPGRAPH_LIB_DIR")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    # The package's folders: this one, and for an editable install (`pip install -e`) the
    # one in site-packages that holds the libraries while the modules stay in the checkout.
    package = sys.modules.get(__package__)
    dirs = [os.path.abspath(d) for d in getattr(package, "__path__", [])] or [here]
    repo = _in_checkout(here)
    if repo is not None and not any(_has_libraries(d) for d in dirs):
        dirs += [os.path.join(repo, sub) for sub in ("build/cuda", "build/nocuda", "build")]
    return dirs


def _has_libraries(folder):
    return all(os.path.isfile(os.path.join(folder, n)) for n in (KERNEL_LIBRARY, SESSION_LIBRARY))


def _candidates(name):
    """Both libraries come from one folder: the first that holds both (a folder with only one
    of them would pair it with the other from elsewhere)."""
    dirs = library_dirs()
    if len(dirs) > 1:
        dirs = [d for d in dirs if _has_libraries(d)][:1] or dirs
    return [os.path.join(d, name) for d in dirs]


def _checked_int(base, bits, signed):
    """`base` whose conversion of a call's argument refuses what the C type cannot hold:
    ctypes itself would pass 2**32 + 5 as a 32-bit 5, 2.5 as an error only sometimes and a
    bool as 0 or 1."""
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)

    class Checked(base):
        @classmethod
        def from_param(cls, value):
            if isinstance(value, base):
                return value
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError("expected an integer, got %s" % type(value).__name__)
            if not lo <= int(value) <= hi:
                raise OverflowError("%d does not fit %s" % (int(value), base.__name__))
            return base(int(value))

    Checked.__name__ = "checked_" + base.__name__
    return Checked


class _CheckedFloat(c_float):
    """c_float whose conversion refuses a finite number that would become infinite."""

    @classmethod
    def from_param(cls, value):
        if isinstance(value, c_float):
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError("expected a number, got %s" % type(value).__name__)
        v = float(value)
        if math.isfinite(v) and abs(v) > _FLOAT_MAX:
            raise OverflowError("%r does not fit a float32" % v)
        return c_float(v)


_FLOAT_MAX = 3.4028234663852886e38
_CHECKED = {c_int32: _checked_int(c_int32, 32, True), c_int64: _checked_int(c_int64, 64, True),
            c_uint32: _checked_int(c_uint32, 32, False),
            c_uint64: _checked_int(c_uint64, 64, False), c_float: _CheckedFloat}


def _call_type(library, t):
    """The ctypes type a call passes. The kernel library's buffers are addresses (ints, from
    NumPy, DLPack or __cuda_array_interface__), so its typed data pointers are passed as
    c_void_p: same size and calling convention; the signature check reads DECLARATIONS.
    Numbers are checked against their C type before the call (TypeError, OverflowError)."""
    if library == KERNEL_LIBRARY and isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return c_void_p
    return _CHECKED.get(t, t)


def _load(name):
    with _lock:
        if name in _loaded:
            return _loaded[name]
        tried = []
        for path in _candidates(name):
            if os.path.isfile(path):
                lib = ctypes.CDLL(path)
                for fn, (restype, args) in DECLARATIONS.items():
                    f = getattr(lib, fn, None)
                    if f is not None:
                        f.restype = restype
                        f.argtypes = [_call_type(name, t) for _, t in args]
                _loaded[name] = lib
                return lib
            tried.append(path)
        how = ("set_library_dir" if _library_dir is not None else
               "STEPGRAPH_LIB_DIR" if os.environ.get("STEPGRAPH_LIB_DIR") else None)
        if how:
            raise LibraryNotFound("%s not found in %s, the folder %s names" % (
                name, os.path.dirname(tried[0]), how))
        raise LibraryNotFound(
            "%s not found; install the package with `pip install ./python` (which builds it), "
            "or name the folder holding it with STEPGRAPH_LIB_DIR or stepgraph.set_library_dir. "
            "Looked at: %s" % (name, ", ".join(tried)))


def kernels():
    """libstepgraph_c, loaded once, its functions declared."""
    lib = _load(KERNEL_LIBRARY)
    version = lib.stepgraph_abi_version()
    if version != C_API_VERSION:
        raise LibraryNotFound("%s has C ABI version %d, this package speaks %d"
                              % (KERNEL_LIBRARY, version, C_API_VERSION))
    return lib


def sessions():
    """libstepgraph_session_c, loaded once, its functions declared."""
    lib = _load(SESSION_LIBRARY)
    version = lib.stepgraph_session_abi_version()
    if version != SESSION_API_VERSION:
        raise LibraryNotFound("%s has session ABI version %d, this package speaks %d"
                              % (SESSION_LIBRARY, version, SESSION_API_VERSION))
    return lib


def error_string(code):
    return kernels().stepgraph_error_string(code).decode()
