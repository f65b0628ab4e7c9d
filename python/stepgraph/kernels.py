"""The kernel library from Python. Each function takes NumPy arrays or device tensors (PyTorch
CUDA tensors, anything with DLPack or __cuda_array_interface__), checks their sizes and
dtypes against each other before calling, and then:

  - device tensors: calls the kernel on them (on `stream`, a CUDA stream handle or an object
    with a `cuda_stream` attribute; None is the default stream);
  - NumPy arrays, with a GPU: copies them to the device, calls the kernel, copies the
    outputs back;
  - NumPy arrays, without a GPU (or with a library built without CUDA): the library still
    checks the arguments (the same code as with CUDA), and on its -1 the NumPy
    implementation in _fallback.py runs.

Outputs may be passed (`out=`); otherwise they are made like the inputs (NumPy arrays, or
with the input tensor's `new_empty`). Bad arguments raise ValueError or TypeError; a token
or expert id out of range raises IndexError (after the call: device calls that can raise it
wait for the device).
"""

import ctypes
import math
import operator
import threading

import numpy as np

from . import _arrays, _fallback, _lib

__all__ = ["StepgraphError", "device_available", "add", "mul", "silu", "silu_mul", "scale",
           "softmax", "rmsnorm", "matmul", "embedding", "argmax", "argmax_workspace_bytes",
           "rope_inv_freq", "rope", "kv_write", "attention", "attention_workspace_bytes",
           "sample", "copy", "advance", "topk", "flash_attention", "gemm", "gemm_batched",
           "cross_entropy", "cross_entropy_backward", "moe_aux_loss", "adamw_step",
           "clip_grad_norm"]


# A scalar integer argument as an int: an integer type only (operator.index), never a
# float truncated (top_k=2.5 is a TypeError, not 2); the C call then checks its range.
_index = operator.index

class StepgraphError(RuntimeError):
    def __init__(self, function, code):
        super().__init__("%s: %s (%d)" % (function, _lib.error_string(code), code))
        self.code = code


_state = threading.local()
_probe_lock = threading.Lock()
_device = None
_cuda = None


def device_available():
    """Whether the loaded kernel library can run on a GPU here."""
    global _device
    with _probe_lock:
        if _device is None:
            b = ctypes.c_int64(0)
            _device = _lib.kernels().stepgraph_argmax_workspace_bytes(1, 64, ctypes.byref(b)) == 0
        return _device


def _runtime():
    global _cuda
    with _probe_lock:
        if _cuda is None:
            _cuda = _arrays.Cuda()
        return _cuda


def _stream(stream):
    if stream is None:
        return None
    return getattr(stream, "cuda_stream", stream)


_NO_FLAGS = object()  # the marker of the error-word argument in an argument list


class _Call:
    """One call: its arrays, which of them it writes, and the error word if it has one."""

    def __init__(self, name, inputs, outputs, flags=False):
        self.name = name
        self.arrays = [a for a in list(inputs) + list(outputs) if a is not None]
        self.outputs = [a for a in outputs if a is not None]
        self.flags = flags
        kinds = {a.device for a in self.arrays}
        if len(kinds) > 1:
            raise ValueError("%s: the arrays mix host (NumPy) and device memory" % name)
        self.device = kinds == {True}

    def run(self, args, fallback, stream=None):
        """args(ptr, flags_ptr, stream) -> the C arguments; fallback() -> error flags."""
        fn = getattr(_lib.kernels(), self.name)
        if self.device:
            return self._on_device(fn, args, lambda a: a.ptr, _stream(stream))
        if device_available():
            return self._staged(fn, args)
        host_flags = ctypes.c_uint32(0)
        code = fn(*args(lambda a: a.ptr, ctypes.addressof(host_flags), None))
        if code == _lib.ERROR_NO_CUDA:
            self._raise_flags(fallback() or 0)
            return
        self._check(code)

    def _check(self, code):
        if code == _lib.ERROR_INVALID_VALUE:
            raise ValueError("%s: %s" % (self.name, _lib.error_string(code)))
        if code != _lib.OK:
            raise StepgraphError(self.name, code)

    def _raise_flags(self, flags):
        if flags & _lib.FLAG_TOKEN_OUT_OF_RANGE:
            raise IndexError("%s: an id or target outside its range" % self.name)
        if flags & _lib.FLAG_POSITION_OUT_OF_RANGE:
            raise IndexError("%s: a position at or past the cache's seq_len (its row was "
                             "skipped)" % self.name)

    def _on_device(self, fn, args, ptr, stream):
        cuda = _runtime() if self.flags else None
        flags_ptr = None
        if self.flags:
            flags_ptr = cuda.alloc(4)
            cuda.upload(flags_ptr, ctypes.addressof(ctypes.c_uint32(0)), 4)
        try:
            self._check(fn(*args(ptr, flags_ptr, stream)))
            if self.flags:
                word = ctypes.c_uint32(0)
                cuda.download(ctypes.addressof(word), flags_ptr, 4)  # waits for the call
                self._raise_flags(word.value)
        finally:
            if flags_ptr is not None:
                cuda.free(flags_ptr)

    def _staged(self, fn, args):
        cuda = _runtime()
        on_device = {}
        try:
            for a in self.arrays:
                on_device[id(a)] = cuda.alloc(a.nbytes)
                cuda.upload(on_device[id(a)], a.ptr, a.nbytes)
            self._on_device(fn, args, lambda a: on_device[id(a)], None)
            for a in self.outputs:
                cuda.download(a.ptr, on_device[id(a)], a.nbytes)
        finally:
            for p in on_device.values():
                cuda.free(p)


# ---- helpers ---------------------------------------------------------------------------

def _view(x, what):
    return None if x is None else _arrays.view(x, what)


def _new(like, shape, dtype_code=None):
    """An output array made like `like` (a view), of `shape` and dtype (default like's)."""
    dtype_code = like.dtype if dtype_code is None else dtype_code
    if not like.device:
        np_dtype = {_lib.F32: np.float32, _lib.F16: np.float16, _lib.I32: np.int32}[dtype_code]
        # Poisoned, so that an element a call leaves unwritten shows.
        return np.full(shape, -1 if dtype_code == _lib.I32 else np.nan, dtype=np_dtype)
    if not hasattr(like.obj, "new_empty"):
        raise TypeError("cannot make an output like %s: pass out=" % type(like.obj).__name__)
    import torch  # a device tensor with new_empty is a PyTorch tensor
    torch_dtype = {_lib.F32: torch.float32, _lib.BF16: torch.bfloat16, _lib.F16: torch.float16,
                   _lib.I32: torch.int32}[dtype_code]
    return like.obj.new_empty(shape, dtype=torch_dtype)


def _out(out, like, shape, what, dtype_code=None):
    obj = _new(like, shape, dtype_code) if out is None else out
    view = _arrays.view(obj, what)
    _expect(view, shape, what, like.dtype if dtype_code is None else dtype_code)
    return obj, view


def _expect(a, shape, what, dtype=None):
    if a.size != math.prod(shape):
        raise ValueError("%s has %d elements, %s needs %d" % (what, a.size, shape, math.prod(shape)))
    if dtype is not None and a.dtype != dtype:
        raise TypeError("%s is %s, expected %s" % (what, _arrays.dtype_name(a.dtype),
                                                   _arrays.dtype_name(dtype)))


def _rows_cols(a, what):
    if len(a.shape) < 1 or a.size == 0:
        raise ValueError("%s must have at least one dimension and one element" % what)
    cols = a.shape[-1]
    return a.size // cols, cols


# ---- elementwise -----------------------------------------------------------------------

def _binary(name, fb, a, b, out, stream):
    va, vb = _arrays.view(a, "a"), _arrays.view(b, "b")
    _expect(vb, va.shape, "b", va.dtype)
    y, vy = _out(out, va, va.shape, "out")
    _Call(name, [va, vb], [vy]).run(
        lambda p, f, s: (p(va), p(vb), p(vy), va.size, va.dtype, s),
        lambda: fb(va.host, vb.host, vy.host), stream)
    return y


def add(a, b, out=None, stream=None):
    """out = a + b (float dtypes, or int32 wrapping)."""
    return _binary("stepgraph_add", _fallback.add, a, b, out, stream)


def mul(a, b, out=None, stream=None):
    """out = a · b."""
    return _binary("stepgraph_mul", _fallback.mul, a, b, out, stream)


def silu_mul(gate, up, out=None, stream=None):
    """out = silu(gate) · up."""
    return _binary("stepgraph_silu_mul", _fallback.silu_mul, gate, up, out, stream)


def silu(x, out=None, stream=None):
    """out = x · sigmoid(x)."""
    vx = _arrays.view(x, "x")
    y, vy = _out(out, vx, vx.shape, "out")
    _Call("stepgraph_silu", [vx], [vy]).run(
        lambda p, f, s: (p(vx), p(vy), vx.size, vx.dtype, s),
        lambda: _fallback.silu(vx.host, vy.host), stream)
    return y


def scale(x, alpha, out=None, stream=None):
    """out = alpha · x; out may be x."""
    vx = _arrays.view(x, "x")
    y, vy = _out(out, vx, vx.shape, "out")
    _Call("stepgraph_scale", [vx], [vy]).run(
        lambda p, f, s: (p(vx), p(vy), vx.size, float(alpha), vx.dtype, s),
        lambda: _fallback.scale(vx.host, vy.host, alpha), stream)
    return y


def softmax(x, out=None, stream=None):
    """Softmax over the last dimension."""
    vx = _arrays.view(x, "x")
    rows, cols = _rows_cols(vx, "x")
    y, vy = _out(out, vx, vx.shape, "out")
    _Call("stepgraph_softmax", [vx], [vy]).run(
        lambda p, f, s: (p(vx), p(vy), rows, cols, vx.dtype, s),
        lambda: _fallback.softmax(vx.host, vy.host), stream)
    return y


def rmsnorm(x, weight, eps=1e-6, out=None, stream=None):
    """RMSNorm over the last dimension of x, times weight."""
    vx, vw = _arrays.view(x, "x"), _arrays.view(weight, "weight")
    rows, hidden = _rows_cols(vx, "x")
    _expect(vw, (hidden,), "weight", vx.dtype)
    y, vy = _out(out, vx, vx.shape, "out")
    _Call("stepgraph_rmsnorm", [vx, vw], [vy]).run(
        lambda p, f, s: (p(vx), p(vw), p(vy), rows, hidden, float(eps), vx.dtype, s),
        lambda: _fallback.rmsnorm(vx.host, vw.host, vy.host, eps), stream)
    return y


def matmul(x, w, bias=None, out=None, stream=None):
    """x [m, k] · w[n, k]ᵀ (+ bias[n]), the decode-time kernel: m <= 8."""
    vx, vw, vb = _arrays.view(x, "x"), _arrays.view(w, "w"), _view(bias, "bias")
    if len(vx.shape) != 2 or len(vw.shape) != 2 or vx.shape[1] != vw.shape[1]:
        raise ValueError("matmul: x %s and w %s must be [m, k] and [n, k]" % (vx.shape, vw.shape))
    m, k = vx.shape
    n = vw.shape[0]
    _expect(vw, (n, k), "w", vx.dtype)
    if vb is not None:
        _expect(vb, (n,), "bias", vx.dtype)
    y, vy = _out(out, vx, (m, n), "out")
    _Call("stepgraph_matmul", [vx, vw, vb], [vy]).run(
        lambda p, f, s: (p(vx), p(vw), p(vb) if vb else None, p(vy), m, n, k, vx.dtype, s),
        lambda: _fallback.matmul(vx.host, vw.host, vb.host if vb else None, vy.host), stream)
    return y


def embedding(table, ids, out=None, stream=None):
    """out[i] = table[ids[i]]; an id out of range raises IndexError."""
    vt, vi = _arrays.view(table, "table"), _arrays.view(ids, "ids")
    if len(vt.shape) != 2:
        raise ValueError("embedding: table must be [vocab, hidden]")
    vocab, hidden = vt.shape
    _expect(vi, (vi.size,), "ids", _lib.I32)
    y, vy = _out(out, vt, (vi.size, hidden), "out")
    _Call("stepgraph_embedding", [vt, vi], [vy], flags=True).run(
        lambda p, f, s: (p(vt), p(vi), p(vy), vi.size, vocab, hidden, vt.dtype, f, s),
        lambda: _fallback.embedding(vt.host, vi.host, vy.host), stream)
    return y


def argmax(logits, out=None, stream=None):
    """The index of the largest value of each row (the lowest among equals; NaN never wins)."""
    vl = _arrays.view(logits, "logits")
    rows, vocab = _rows_cols(vl, "logits")
    y, vy = _out(out, vl, (rows,), "out", _lib.I32)
    _Call("stepgraph_argmax", [vl], [vy]).run(
        lambda p, f, s: (p(vl), p(vy), rows, vocab, vl.dtype, None, 0, s),
        lambda: _fallback.argmax(vl.host.reshape(rows, vocab), vy.host), stream)
    return y


def rope_inv_freq(head_dim, theta, llama3=None):
    """The head_dim / 2 RoPE inverse frequencies (host, f32), as the library computes them.
    llama3: None or (factor, low_freq_factor, high_freq_factor, original_max_position)."""
    out = np.empty(head_dim // 2 if head_dim > 0 else 0, dtype=np.float32)
    scaling, params = _lib.ROPE_SCALING_NONE, (0.0, 0.0, 0.0, 0)
    if llama3 is not None:
        scaling, params = _lib.ROPE_SCALING_LLAMA3, tuple(llama3)
    buf = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if out.size else None
    code = _lib.kernels().stepgraph_rope_inv_freq(
        _index(head_dim), float(theta), scaling, float(params[0]), float(params[1]),
        float(params[2]), _index(params[3]), buf)
    if code == _lib.ERROR_INVALID_VALUE:
        raise ValueError("rope_inv_freq: %s" % _lib.error_string(code))
    if code != _lib.OK:
        raise StepgraphError("stepgraph_rope_inv_freq", code)
    return out


def _workspace_query(name, args):
    """A *_workspace_bytes call: the bytes, or 0 where there is no device (the NumPy fallback
    needs none)."""
    b = ctypes.c_int64(-1)
    code = getattr(_lib.kernels(), name)(*args, ctypes.byref(b))
    if code == _lib.ERROR_NO_CUDA:
        return 0
    if code == _lib.ERROR_INVALID_VALUE:
        raise ValueError("%s: %s" % (name, _lib.error_string(code)))
    if code != _lib.OK:
        raise StepgraphError(name, code)
    return int(b.value)


def argmax_workspace_bytes(rows, vocab):
    """The workspace with which argmax splits long rows on this device (0 without one)."""
    return _workspace_query("stepgraph_argmax_workspace_bytes", (_index(rows), _index(vocab)))


# ---- the decode step: RoPE, the KV cache, attention, sampling ----------------------------

def rope(x, pos, inv_freq, interleaved=False, out=None, stream=None):
    """Rotates every head of each row of x [rows, ...] (rows = x.shape[0], head_dim =
    2 · inv_freq.size) by the row's position: pos [rows] int32 (rows with pos < 0 are
    copied), inv_freq f32 as rope_inv_freq gives it. Pairs (j, j + head_dim/2) (Hugging
    Face's rotate_half), or (2j, 2j + 1) when interleaved."""
    vx, vp, vf = _arrays.view(x, "x"), _arrays.view(pos, "pos"), _arrays.view(inv_freq, "inv_freq")
    if len(vx.shape) < 2 or vx.size == 0:
        raise ValueError("rope: x must be [rows, ...] with at least one element")
    rows = vx.shape[0]
    cols = vx.size // rows
    head_dim = 2 * vf.size
    _expect(vf, (vf.size,), "inv_freq", _lib.F32)
    if head_dim == 0 or cols % head_dim != 0:
        raise ValueError("rope: a row of %d values is not whole heads of head_dim %d "
                         "(2 · inv_freq.size)" % (cols, head_dim))
    _expect(vp, (rows,), "pos", _lib.I32)
    y, vy = _out(out, vx, vx.shape, "out")
    _Call("stepgraph_rope", [vx, vp, vf], [vy]).run(
        lambda p, f, s: (p(vx), p(vp), p(vf), p(vy), rows, cols, head_dim, int(bool(interleaved)),
                         vx.dtype, s),
        lambda: _fallback.rope(vx.host.reshape(rows, cols), vp.host, vf.host,
                               vy.host.reshape(rows, cols), head_dim, bool(interleaved)),
        stream)
    return y


def _cache_dims(vc, what):
    if len(vc.shape) != 4:
        raise ValueError("%s must be [slots, kv_heads, seq_len, head_dim], got %s"
                         % (what, vc.shape))
    return vc.shape


def kv_write(kv, pos, cache, stream=None):
    """Stores row i of kv [rows, kv_heads · head_dim] at position pos[i] of slot i of cache
    [slots, kv_heads, seq_len, head_dim], in place (slots >= rows). pos < 0 writes nothing; a
    pos >= seq_len writes nothing and raises IndexError once the other rows are written."""
    vk, vp, vc = _arrays.view(kv, "kv"), _arrays.view(pos, "pos"), _arrays.view(cache, "cache")
    slots, kv_heads, seq_len, head_dim = _cache_dims(vc, "cache")
    if len(vk.shape) < 1 or vk.size == 0:
        raise ValueError("kv_write: kv must be [rows, kv_heads · head_dim]")
    rows = vk.shape[0]
    _expect(vk, (rows, kv_heads * head_dim), "kv", vc.dtype)
    _expect(vp, (rows,), "pos", _lib.I32)
    if rows > slots:
        raise ValueError("kv_write: %d rows but the cache has %d slots" % (rows, slots))
    _Call("stepgraph_kv_write", [vk, vp], [vc], flags=True).run(
        lambda p, f, s: (p(vk), p(vp), p(vc), rows, slots, kv_heads, seq_len, head_dim, vc.dtype,
                         f, s),
        lambda: _fallback.kv_write(vk.host.reshape(rows, -1), vp.host, vc.host), stream)
    return cache


def attention_workspace_bytes(rows, heads, kv_heads, seq_len, head_dim):
    """The workspace with which attention of this shape splits the keys on this device (0
    without one)."""
    return _workspace_query("stepgraph_attention_workspace_bytes",
                            (_index(rows), _index(heads), _index(kv_heads), _index(seq_len),
                             _index(head_dim)))


def attention(q, k_cache, v_cache, pos, scale=None, out=None, workspace=None, stream=None):
    """Decode attention: q [rows, heads · head_dim] (or [rows, heads, head_dim]), one query
    per row, against slot i of k_cache and v_cache [slots, kv_heads, seq_len, head_dim] over
    positions 0..pos[i] (grouped-query when heads > kv_heads). scale: 1/sqrt(head_dim) by
    default. Rows with pos < 0 get zeros; pos >= seq_len gets zeros and raises IndexError.
    workspace: a device buffer of attention_workspace_bytes (device tensors only)."""
    vq, vk = _arrays.view(q, "q"), _arrays.view(k_cache, "k_cache")
    vv = _arrays.view(v_cache, "v_cache")
    vp = _arrays.view(pos, "pos")
    slots, kv_heads, seq_len, head_dim = _cache_dims(vk, "k_cache")
    _expect(vv, vk.shape, "v_cache", vk.dtype)
    if len(vq.shape) < 2 or vq.size == 0:
        raise ValueError("attention: q must be [rows, heads · head_dim]")
    rows = vq.shape[0]
    if (vq.size // rows) % head_dim != 0:
        raise ValueError("attention: a q row of %d values is not whole heads of head_dim %d"
                         % (vq.size // rows, head_dim))
    heads = vq.size // rows // head_dim
    _expect(vq, (rows, heads * head_dim), "q", vk.dtype)
    _expect(vp, (rows,), "pos", _lib.I32)
    if rows > slots:
        raise ValueError("attention: %d rows but the caches have %d slots" % (rows, slots))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    vw = _view(workspace, "workspace")
    if vw is not None and not vw.device:
        raise ValueError("attention: the workspace is a device buffer")
    o, vo = _out(out, vq, vq.shape, "out")
    _Call("stepgraph_attention", [vq, vk, vv, vp] + ([vw] if vw else []), [vo], flags=True).run(
        lambda p, f, s: (p(vq), p(vk), p(vv), p(vp), p(vo), rows, heads, kv_heads, slots,
                         seq_len, head_dim, scale, vk.dtype, p(vw) if vw else None,
                         vw.nbytes if vw else 0, f, s),
        lambda: _fallback.attention(vq.host.reshape(rows, -1), vk.host, vv.host, vp.host,
                                    vo.host.reshape(rows, -1), scale), stream)
    return o


def sample(logits, seeds, pos, temperature=1.0, top_k=0, top_p=1.0, out=None, stream=None):
    """ids [rows] int32 drawn from softmax(logits[i] / temperature) kept to the top_k largest
    (0: all) and to the smallest prefix of those reaching top_p of their mass; the draw is
    fixed by (seeds[i], pos[i]) (int32 [rows] each): the same inputs, the same ids."""
    vl = _arrays.view(logits, "logits")
    vs, vp = _arrays.view(seeds, "seeds"), _arrays.view(pos, "pos")
    rows, vocab = _rows_cols(vl, "logits")
    _expect(vs, (rows,), "seeds", _lib.I32)
    _expect(vp, (rows,), "pos", _lib.I32)
    y, vy = _out(out, vl, (rows,), "out", _lib.I32)
    _Call("stepgraph_sample", [vl, vs, vp], [vy]).run(
        lambda p, f, s: (p(vl), p(vs), p(vp), p(vy), rows, vocab, float(temperature), _index(top_k),
                         float(top_p), vl.dtype, s),
        lambda: _fallback.sample(vl.host.reshape(rows, vocab), vs.host, vp.host, vy.host,
                                 float(temperature), _index(top_k), float(top_p)), stream)
    return y


def copy(src, out=None, stream=None):
    """out = src (any dtype, int32 included); out must not overlap src unless it is src."""
    vs = _arrays.view(src, "src")
    if vs.size == 0:
        raise ValueError("copy: src has no elements")
    y, vy = _out(out, vs, vs.shape, "out")
    _Call("stepgraph_copy", [vs], [vy]).run(
        lambda p, f, s: (p(vs), p(vy), vs.size, vs.dtype, s),
        lambda: _fallback.copy(vs.host, vy.host.reshape(vs.host.shape)), stream)
    return y


def advance(pos, stream=None):
    """pos += 1 in place where pos >= 0 (int32; padding rows with pos < 0 stay)."""
    vp = _arrays.view(pos, "pos")
    _expect(vp, (vp.size,), "pos", _lib.I32)
    if vp.size == 0:
        raise ValueError("advance: pos has no elements")
    _Call("stepgraph_advance", [], [vp]).run(
        lambda p, f, s: (p(vp), vp.size, s), lambda: _fallback.advance(vp.host), stream)
    return pos


# ---- top-k and attention over sequences --------------------------------------------------

def topk(x, k, values=None, indices=None, stream=None):
    """The k largest of each row of x [rows, n], largest first (ties by lower index, NaN
    first, as torch.topk): (values [rows, k], indices [rows, k] int32)."""
    vx = _arrays.view(x, "x")
    rows, n = _rows_cols(vx, "x")
    shape = (rows, _index(k)) if len(vx.shape) > 1 else (_index(k),)
    v, vv = _out(values, vx, shape, "values")
    i, vi = _out(indices, vx, shape, "indices", _lib.I32)
    _Call("stepgraph_topk", [vx], [vv, vi]).run(
        lambda p, f, s: (p(vx), p(vv), p(vi), rows, n, _index(k), vx.dtype, s),
        lambda: _fallback.topk(vx.host.reshape(rows, n), vv.host.reshape(rows, -1),
                               vi.host.reshape(rows, -1), _index(k)), stream)
    return v, i


def flash_attention(q, k, v, scale=None, causal=True, out=None, stream=None):
    """q [batch, seq, heads, d], k and v [batch, seq, kv_heads, d] -> out like q."""
    vq, vk, vv = _arrays.view(q, "q"), _arrays.view(k, "k"), _arrays.view(v, "v")
    if len(vq.shape) != 4 or len(vk.shape) != 4:
        raise ValueError("flash_attention: q and k must be [batch, seq, heads, head_dim]")
    batch, seq, heads, d = vq.shape
    kv_heads = vk.shape[2]
    _expect(vk, (batch, seq, kv_heads, d), "k", vq.dtype)
    _expect(vv, (batch, seq, kv_heads, d), "v", vq.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o, vo = _out(out, vq, vq.shape, "out")
    _Call("stepgraph_flash_attention", [vq, vk, vv], [vo]).run(
        lambda p, f, s: (p(vq), p(vk), p(vv), p(vo), batch, seq, heads, kv_heads, d, scale,
                         int(bool(causal)), vq.dtype, s),
        lambda: _fallback.flash_attention(vq.host, vk.host, vv.host, vo.host, scale, causal),
        stream)
    return o



# ---- general matrix products (cuBLASLt) -------------------------------------------------

def _gemm_dims(va, vb, trans_a, trans_b, batched):
    lead = 1 if batched else 0
    if len(va.shape) != 2 + lead or len(vb.shape) != 2 + lead:
        raise ValueError("gemm: a %s and b %s must have rank %d" % (va.shape, vb.shape, 2 + lead))
    m, ka = (va.shape[lead + 1], va.shape[lead]) if trans_a else va.shape[lead:]
    kb, n = (vb.shape[lead + 1], vb.shape[lead]) if trans_b else vb.shape[lead:]
    if ka != kb:
        raise ValueError("gemm: op(a) is [%d, %d] but op(b) is [%d, %d]" % (m, ka, kb, n))
    return m, n, ka


def gemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, workspace=None,
         stream=None):
    """c = alpha · op(a) · op(b) + beta · c (row-major; op transposes when asked)."""
    va, vb = _arrays.view(a, "a"), _arrays.view(b, "b")
    _expect(vb, vb.shape, "b", va.dtype)
    m, n, k = _gemm_dims(va, vb, trans_a, trans_b, False)
    if c is None and beta != 0.0:
        raise ValueError("gemm: beta != 0 needs c")
    out, vc = _out(c, va, (m, n), "c")
    vw = _view(workspace, "workspace")
    _Call("stepgraph_gemm", [va, vb] + ([vw] if vw else []), [vc]).run(
        lambda p, f, s: (p(va), p(vb), p(vc), m, n, k, _index(trans_a), _index(trans_b),
                         float(alpha), float(beta), va.dtype, p(vw) if vw else None,
                         vw.nbytes if vw else 0, s),
        lambda: _fallback.gemm(va.host, vb.host, vc.host.reshape(m, n), trans_a, trans_b, alpha,
                               beta), stream)
    return out


def gemm_batched(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                 workspace=None, stream=None):
    """gemm over the leading dimension of a [batch, ...], b [batch, ...], c [batch, m, n]."""
    va, vb = _arrays.view(a, "a"), _arrays.view(b, "b")
    _expect(vb, vb.shape, "b", va.dtype)
    m, n, k = _gemm_dims(va, vb, trans_a, trans_b, True)
    batch = va.shape[0]
    if vb.shape[0] != batch:
        raise ValueError("gemm_batched: a has %d problems, b %d" % (batch, vb.shape[0]))
    if c is None and beta != 0.0:
        raise ValueError("gemm_batched: beta != 0 needs c")
    out, vc = _out(c, va, (batch, m, n), "c")
    vw = _view(workspace, "workspace")

    def fallback():
        cc = vc.host.reshape(batch, m, n)
        for i in range(batch):
            _fallback.gemm(va.host[i], vb.host[i], cc[i], trans_a, trans_b, alpha, beta)

    _Call("stepgraph_gemm_batched", [va, vb] + ([vw] if vw else []), [vc]).run(
        lambda p, f, s: (p(va), p(vb), p(vc), batch, m, n, k, m * k, k * n, m * n, _index(trans_a),
                         _index(trans_b), float(alpha), float(beta), va.dtype,
                         p(vw) if vw else None, vw.nbytes if vw else 0, s),
        fallback, stream)
    return out



# ---- training: losses and optimizer steps ----------------------------------------------

def cross_entropy(logits, targets, ignore_index=-100, log_probs=False, loss=None, stream=None):
    """Per-row losses (f32) of logits [rows, vocab] against int32 targets, and with
    log_probs=True the log-probabilities too: loss or (loss, log_probs)."""
    vl, vt = _arrays.view(logits, "logits"), _arrays.view(targets, "targets")
    rows, vocab = _rows_cols(vl, "logits")
    _expect(vt, (rows,), "targets", _lib.I32)
    out, vo = _out(loss, vl, (rows,), "loss", _lib.F32)
    lp, vlp = (None, None)
    if log_probs:
        lp, vlp = _out(None, vl, vl.shape, "log_probs")
    _Call("stepgraph_cross_entropy", [vl, vt], [vo, vlp], flags=True).run(
        lambda p, f, s: (p(vl), p(vt), p(vo), p(vlp) if vlp else None, rows, vocab,
                         _index(ignore_index), vl.dtype, f, s),
        lambda: _fallback.cross_entropy(vl.host.reshape(rows, vocab), vt.host, vo.host,
                                        vlp.host.reshape(rows, vocab) if vlp else None,
                                        ignore_index), stream)
    return (out, lp) if log_probs else out


def cross_entropy_backward(logits, targets, dloss, ignore_index=-100, out=None, stream=None):
    """dlogits = dloss[i] · (softmax(logits[i]) - onehot(targets[i])); out may be logits."""
    vl, vt, vd = (_arrays.view(logits, "logits"), _arrays.view(targets, "targets"),
                  _arrays.view(dloss, "dloss"))
    rows, vocab = _rows_cols(vl, "logits")
    _expect(vt, (rows,), "targets", _lib.I32)
    _expect(vd, (rows,), "dloss", _lib.F32)
    g, vg = _out(out, vl, vl.shape, "out")
    _Call("stepgraph_cross_entropy_backward", [vl, vt, vd], [vg], flags=True).run(
        lambda p, f, s: (p(vl), p(vt), p(vd), p(vg), rows, vocab, _index(ignore_index), vl.dtype,
                         f, s),
        lambda: _fallback.cross_entropy_backward(vl.host.reshape(rows, vocab), vt.host, vd.host,
                                                 vg.host.reshape(rows, vocab), ignore_index),
        stream)
    return g


def moe_aux_loss(router_probs, expert_ids, out=None, stream=None):
    """The load-balancing loss (one f32) of router_probs [tokens, experts] and the experts
    chosen, expert_ids [tokens, top_k] int32."""
    vp, vi = _arrays.view(router_probs, "router_probs"), _arrays.view(expert_ids, "expert_ids")
    if len(vp.shape) != 2:
        raise ValueError("moe_aux_loss: router_probs must be [tokens, experts]")
    tokens, experts = vp.shape
    if vi.size % tokens != 0:
        raise ValueError("moe_aux_loss: expert_ids has %d entries for %d tokens"
                         % (vi.size, tokens))
    top_k = vi.size // tokens
    _expect(vi, (tokens, top_k), "expert_ids", _lib.I32)
    loss, vo = _out(out, vp, (1,), "out", _lib.F32)
    _Call("stepgraph_moe_aux_loss", [vp, vi], [vo], flags=True).run(
        lambda p, f, s: (p(vp), p(vi), p(vo), tokens, experts, top_k, vp.dtype, f, s),
        lambda: _fallback.moe_aux_loss(vp.host, vi.host, vo.host), stream)
    return loss


def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=1e-2, stream=None):
    """One AdamW step, in place: param, exp_avg, exp_avg_sq f32; grad any float dtype."""
    vp, vg = _arrays.view(param, "param"), _arrays.view(grad, "grad")
    vm, vv = _arrays.view(exp_avg, "exp_avg"), _arrays.view(exp_avg_sq, "exp_avg_sq")
    _expect(vp, (vp.size,), "param", _lib.F32)
    for a, what in ((vg, "grad"), (vm, "exp_avg"), (vv, "exp_avg_sq")):
        _expect(a, (vp.size,), what, None if a is vg else _lib.F32)
    beta1, beta2 = betas
    _Call("stepgraph_adamw_step", [vg], [vp, vm, vv]).run(
        lambda p, f, s: (p(vp), p(vg), p(vm), p(vv), vp.size, float(lr), float(beta1),
                         float(beta2), float(eps), float(weight_decay), _index(step), vg.dtype, s),
        lambda: _fallback.adamw_step(vp.host, vg.host, vm.host, vv.host, lr, beta1, beta2, eps,
                                     weight_decay, _index(step)), stream)


def clip_grad_norm(grads, max_norm, stream=None):
    """Scales every buffer of `grads` in place so that their global L2 norm is at most
    max_norm (as torch.nn.utils.clip_grad_norm_); returns the norm before clipping."""
    views = [_arrays.view(g, "grads[%d]" % i) for i, g in enumerate(grads)]
    if not views:
        raise ValueError("clip_grad_norm: no buffers")
    dtype = views[0].dtype
    for i, v in enumerate(views):
        _expect(v, v.shape, "grads[%d]" % i, dtype)
    norm_host = np.zeros(1, dtype=np.float32)
    norm_obj, vn = _out(None, views[0], (1,), "total_norm", _lib.F32)
    result = {}

    def args(p, f, s):
        pointers = (ctypes.c_void_p * len(views))(*[p(v) for v in views])
        sizes = (ctypes.c_int64 * len(views))(*[v.size for v in views])
        result["keep"] = (pointers, sizes)
        return (ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p)),
                ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64)), len(views), float(max_norm),
                dtype, p(vn), s)

    def fallback():
        result["norm"] = _fallback.clip_grad_norm([v.host for v in views], max_norm)

    _Call("stepgraph_clip_grad_norm", [], views + [vn]).run(args, fallback, stream)
    if "norm" in result:
        return float(result["norm"])
    if vn.device:
        _runtime().download(norm_host.ctypes.data, vn.ptr, 4)
        return float(norm_host[0])
    return float(vn.host[0])
