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
