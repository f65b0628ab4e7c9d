"""NumPy implementations of the kernels: what a call on NumPy arrays runs where the library
says there is no GPU (code -1). Each follows the definition in c_api.h directly, in float64
where that is simpler, and is independent of the CUDA kernels' code. Inputs and outputs are
NumPy arrays of the call's shapes; outputs are written in place.
"""

import numpy as np

from . import _lib


def _f(x):
    return np.asarray(x, dtype=np.float64)


def _store(out, value):
    out[...] = np.asarray(value).astype(out.dtype)


def add(a, b, y):
    if y.dtype == np.int32:  # wraps, as the C ABI does
        _store(y, (a.astype(np.int64) + b.astype(np.int64) + 2**31) % 2**32 - 2**31)
    else:
        _store(y, _f(a) + _f(b))


def mul(a, b, y):
    _store(y, _f(a) * _f(b))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def silu(x, y):
    _store(y, _silu(_f(x)))


def silu_mul(gate, up, y):
    _store(y, _silu(_f(gate)) * _f(up))


def scale(x, y, alpha):
    _store(y, _f(x) * np.float64(np.float32(alpha)))


def softmax(x, y):
    v = _f(x)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    _store(y, e / e.sum(axis=-1, keepdims=True))


def rmsnorm(x, weight, y, eps):
    v = _f(x)
    inv = 1.0 / np.sqrt((v * v).mean(axis=-1, keepdims=True) + np.float64(np.float32(eps)))
    # Hugging Face rounds the normalised row to the storage dtype before the weight.
    normalised = (v * inv).astype(x.dtype)
    _store(y, _f(normalised) * _f(weight))


def matmul(x, w, bias, y):
    r = _f(x) @ _f(w).T
    if bias is not None:
        r = r + _f(bias)
    _store(y, r)


def embedding(table, ids, out):
    vocab = table.shape[0]
    bad = (ids < 0) | (ids >= vocab)
    rows = _f(table)[np.where(bad, 0, ids)]
    rows[bad] = 0.0
    _store(out, rows)
    return _lib.FLAG_TOKEN_OUT_OF_RANGE if bad.any() else 0


def argmax(logits, ids):
    v = _f(logits)
    v = np.where(np.isnan(v), -np.inf, v)  # NaN never wins; a row of -inf gives 0
    ids[...] = np.argmax(v, axis=-1).astype(np.int32)


def _order_keys(row):
    """Sort order for top-k: NaN first (as torch.topk), then larger first, ties by lower
    index."""
    v = _f(row)
    nan = np.isnan(v)
    # lexsort sorts by the last key first: not-NaN, then -value, then index.
    return np.lexsort((np.arange(v.size), -np.where(nan, 0.0, v), ~nan))


def topk(x, values, indices, k):
    for r in range(x.shape[0]):
        order = _order_keys(x[r])[:k]
        values[r] = x[r][order]
        indices[r] = order.astype(np.int32)


def gemm(a, b, c, trans_a, trans_b, alpha, beta):
    left = _f(a).T if trans_a else _f(a)
    right = _f(b).T if trans_b else _f(b)
    product = np.float64(np.float32(alpha)) * (left @ right)
    if beta != 0.0:
        product = product + np.float64(np.float32(beta)) * _f(c)
    _store(c, product)


def flash_attention(q, k, v, out, scale, causal):
    """q, out [batch, seq, heads, d]; k, v [batch, seq, kv_heads, d]."""
    batch, seq, heads, _ = q.shape
    group = heads // k.shape[2]
    qf, kf, vf = _f(q), _f(k), _f(v)
    result = np.empty(q.shape, dtype=np.float64)
    mask = np.triu(np.ones((seq, seq), dtype=bool), 1) if causal else None
    for h in range(heads):
        g = h // group
        s = np.einsum("bid,bjd->bij", qf[:, :, h], kf[:, :, g]) * np.float64(np.float32(scale))
        if mask is not None:
            s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        p = s / s.sum(axis=-1, keepdims=True)
        result[:, :, h] = np.einsum("bij,bjd->bid", p, vf[:, :, g])
    _store(out, result)


def _log_softmax(logits):
    v = _f(logits)
    m = v.max(axis=-1, keepdims=True)
    return v - (m + np.log(np.exp(v - m).sum(axis=-1, keepdims=True)))


def cross_entropy(logits, targets, loss, log_probs, ignore_index):
    lp = _log_softmax(logits)
    vocab = logits.shape[1]
    flags = 0
    for r, t in enumerate(targets):
        if t == ignore_index:
            loss[r] = 0.0
        elif t < 0 or t >= vocab:
            loss[r] = 0.0
            flags |= _lib.FLAG_TOKEN_OUT_OF_RANGE
        else:
            loss[r] = -lp[r, t]
    if log_probs is not None:
        _store(log_probs, lp)
    return flags


def cross_entropy_backward(logits, targets, dloss, dlogits, ignore_index):
    p = np.exp(_log_softmax(logits))
    vocab = logits.shape[1]
    flags = 0
    grad = np.zeros(p.shape)
    for r, t in enumerate(targets):
        if t == ignore_index:
            continue
        if t < 0 or t >= vocab:
            flags |= _lib.FLAG_TOKEN_OUT_OF_RANGE
            continue
        grad[r] = p[r] * dloss[r]
        grad[r, t] -= dloss[r]
    _store(dlogits, grad)
    return flags


def moe_aux_loss(router_probs, expert_ids, loss):
    tokens, experts = router_probs.shape
    ids = expert_ids.reshape(-1)
    valid = ids[(ids >= 0) & (ids < experts)]
    fraction = np.bincount(valid, minlength=experts) / tokens
    mean_prob = _f(router_probs).mean(axis=0)
    loss[...] = np.float32(experts * np.sum(fraction * mean_prob))
    return 0 if valid.size == ids.size else _lib.FLAG_TOKEN_OUT_OF_RANGE


def adamw_step(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step):
    """The update as torch.optim.AdamW documents it, in float64, stored as float32."""
    lr, beta1, beta2, eps, weight_decay = (float(np.float32(v)) for v in
                                           (lr, beta1, beta2, eps, weight_decay))
    g = _f(grad)
    p = _f(param) * (1.0 - lr * weight_decay)
    m = beta1 * _f(exp_avg) + (1.0 - beta1) * g
    v = beta2 * _f(exp_avg_sq) + (1.0 - beta2) * g * g
    m_hat = m / (1.0 - beta1 ** step)
    v_hat = v / (1.0 - beta2 ** step)
    _store(param, p - lr * m_hat / (np.sqrt(v_hat) + eps))
    _store(exp_avg, m)
    _store(exp_avg_sq, v)


def clip_grad_norm(grads, max_norm):
    total = np.sqrt(sum(float(np.sum(_f(g) ** 2)) for g in grads))
    coef = min(1.0, float(np.float32(max_norm)) / (total + 1e-6))
    for g in grads:
        _store(g, _f(g) * coef)
    return total


# ---- decode-step kernels: RoPE, the KV cache, attention, sampling -----------------------

def rope(x, pos, inv_freq, y, head_dim, interleaved):
    """x, y [rows, cols]: every head of row i turned by pos[i] · inv_freq (rows with pos < 0
    copied). The angle is the f32 product, as Hugging Face computes it."""
    rows = x.shape[0]
    v = _f(x).reshape(rows, -1, head_dim)
    half = head_dim // 2
    angle = pos.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    angle = angle.astype(np.float64)
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a = np.arange(half) * 2 if interleaved else np.arange(half)
    b = a + 1 if interleaved else a + half
    r = v.copy()
    r[:, :, a] = v[:, :, a] * c - v[:, :, b] * s
    r[:, :, b] = v[:, :, b] * c + v[:, :, a] * s
    r[pos < 0] = v[pos < 0]
    _store(y, r.reshape(y.shape))


def _live_rows(pos, rows, seq_len):
    """The rows whose position lies in the cache, and the error flags of the others: a
    negative position is padding (skipped quietly), one past seq_len raises
    FLAG_POSITION_OUT_OF_RANGE, as the kernels do."""
    live, flags = [], 0
    for i in range(rows):
        if pos[i] >= seq_len:
            flags |= _lib.FLAG_POSITION_OUT_OF_RANGE
        elif pos[i] >= 0:
            live.append(i)
    return live, flags


def kv_write(kv, pos, cache):
    """Row i of kv at position pos[i] of slot i of cache [slots, kv_heads, seq_len, d]."""
    _, kv_heads, seq_len, d = cache.shape
    rows = kv.shape[0]
    v = kv.reshape(rows, kv_heads, d)
    live, flags = _live_rows(pos, rows, seq_len)
    for i in live:
        cache[i, :, pos[i], :] = v[i]
    return flags


def attention(q, k_cache, v_cache, pos, out, scale):
    """Decode attention of one query row per slot over positions 0..pos[i] of its cache."""
    _, kv_heads, seq_len, d = k_cache.shape
    rows = q.shape[0]
    qf = _f(q).reshape(rows, -1, d)
    heads = qf.shape[1]
    group = heads // kv_heads
    result = np.zeros(qf.shape)
    live, flags = _live_rows(pos, rows, seq_len)
    for i in live:
        n = int(pos[i]) + 1
        for h in range(heads):
            k = _f(k_cache[i, h // group, :n])
            v = _f(v_cache[i, h // group, :n])
            s = (k @ qf[i, h]) * np.float64(np.float32(scale))
            p = np.exp(s - s.max())
            result[i, h] = (p / p.sum()) @ v
    _store(out, result.reshape(out.shape))
    return flags


_M32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): four
    32-bit words of counter and two of key to four random words."""
    c0, c1, c2, c3 = (int(w) & _M32 for w in counter)
    k0, k1 = (int(w) & _M32 for w in key)
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & _M32, (p0 >> 32) ^ c3 ^ k1, p0 & _M32)
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return c0, c1, c2, c3


def sample_uniform(seed, pos):
    """The uniform number in [0, 1) that sampling draws for (seed, pos) (24 bits, as
    include/stepgraph/base/philox.h)."""
    r = philox4x32_10((pos, 0, 0x5A6E5031, 0), (seed, 0x243F6A88))
    return (r[0] >> 8) / 16777216.0


def sample(logits, seeds, pos, ids, temperature, top_k, top_p):
    """ids[i] from softmax(logits[i] / temperature), kept to the top_k largest (ties by
    index) and then to the smallest prefix reaching top_p of their mass, drawn with
    sample_uniform(seeds[i], pos[i]) over the kept ids in index order."""
    z = _f(logits)
    z = np.where(np.isnan(z), -np.inf, z) / np.float64(np.float32(temperature))
    for i in range(z.shape[0]):
        order = np.argsort(-z[i], kind="stable")
        keep = order if top_k <= 0 else order[:top_k]
        p = np.exp(z[i, keep] - z[i, keep[0]])
        if top_p < 1.0:
            cum = np.cumsum(p)
            stop = int(np.searchsorted(cum, np.float64(np.float32(top_p)) * p.sum()))
            keep, p = keep[:stop + 1], p[:stop + 1]
        by_index = np.argsort(keep)
        keep, p = keep[by_index], p[by_index]
        cum = np.cumsum(p)
        target = sample_uniform(int(seeds[i]), int(pos[i])) * cum[-1]
        ids[i] = keep[min(int(np.searchsorted(cum, target, side="right")), keep.size - 1)]


def copy(src, dst):
    dst[...] = src


def advance(pos):
    pos[pos >= 0] += 1
