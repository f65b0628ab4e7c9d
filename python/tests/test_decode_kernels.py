# The decode-step kernels from Python (rope, kv_write, attention, sample, copy, advance and
# the workspace queries) on NumPy arrays: the library checks the arguments, then the GPU runs
# them or, on its -1, the NumPy fallback does. Each is compared with a NumPy computation
# written here from the definition in c_api.h, in another way than the fallback's, on random
# inputs; outputs start poisoned. Sizes and dtypes are refused before any call.
import math

import numpy as np
import pytest

import stepgraph
from stepgraph import _fallback
from stepgraph import kernels as k

rng = np.random.default_rng(20261124)


def rand(*shape, dtype=np.float32):
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def close(got, want, tol):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < tol, err


# ---- RoPE -------------------------------------------------------------------------------

def rope_reference(x, pos, inv_freq, interleaved):
    """Each pair as a complex number turned by e^(i·angle)."""
    rows, cols = x.shape
    d = 2 * inv_freq.size
    out = x.astype(np.float64).copy()
    for i in range(rows):
        if pos[i] < 0:
            continue
        angle = (np.float32(pos[i]) * inv_freq).astype(np.float64)  # the f32 product, as HF
        turn = np.exp(1j * angle)
        for h in range(cols // d):
            head = x[i, h * d:(h + 1) * d].astype(np.float64)
            re, im = (head[0::2], head[1::2]) if interleaved else (head[:d // 2], head[d // 2:])
            z = (re + 1j * im) * turn
            if interleaved:
                out[i, h * d:(h + 1) * d][0::2], out[i, h * d:(h + 1) * d][1::2] = z.real, z.imag
            else:
                out[i, h * d:h * d + d // 2], out[i, h * d + d // 2:(h + 1) * d] = z.real, z.imag
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float16, 2e-3)])
def test_rope_turns_each_pair_by_its_angle(interleaved, dtype, tol):
    d, heads, rows = 16, 3, 6
    inv_freq = k.rope_inv_freq(d, 10000.0)
    x = rand(rows, heads * d, dtype=dtype)
    pos = rng.integers(0, 4000, size=rows).astype(np.int32)
    pos[2] = -1  # padding: copied
    y = k.rope(x, pos, inv_freq, interleaved=interleaved)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, rope_reference(x, pos, inv_freq, interleaved), tol)
    assert np.array_equal(y[2], x[2])
    # [rows, heads, head_dim] is the same rows.
    y3 = k.rope(x.reshape(rows, heads, d), pos, inv_freq, interleaved=interleaved)
    assert np.array_equal(y3.reshape(rows, -1), y)


def test_rope_checks_sizes():
    inv_freq = k.rope_inv_freq(16, 10000.0)
    x, pos = rand(4, 48), np.zeros(4, dtype=np.int32)
    with pytest.raises(ValueError):
        k.rope(rand(4, 40), pos, inv_freq)  # 40 is not whole heads of 16
    with pytest.raises(ValueError):
        k.rope(x, np.zeros(3, dtype=np.int32), inv_freq)
    with pytest.raises(TypeError):
        k.rope(x, pos.astype(np.float32), inv_freq)
    with pytest.raises(TypeError):
        k.rope(x, pos, inv_freq.astype(np.float16))
    with pytest.raises(ValueError):
        k.rope(x, pos, inv_freq, out=rand(4, 47))


# ---- the KV cache and decode attention --------------------------------------------------

def test_kv_write_stores_each_row_at_its_slot_and_position():
    slots, kvh, seq, d, rows = 4, 2, 10, 8, 3
    cache = rand(slots, kvh, seq, d)
    before = cache.copy()
    kv = rand(rows, kvh * d)
    pos = np.array([7, -1, 0], dtype=np.int32)
    assert k.kv_write(kv, pos, cache) is cache
    want = before.copy()
    for i, p in enumerate(pos):
        if p >= 0:
            for h in range(kvh):
                want[i, h, p] = kv[i, h * d:(h + 1) * d]
    assert np.array_equal(cache, want)
    # A position past the cache: that row is skipped, the others written, then IndexError.
    kv2 = rand(rows, kvh * d)
    with pytest.raises(IndexError):
        k.kv_write(kv2, np.array([1, seq, 2], dtype=np.int32), cache)
    assert np.array_equal(cache[0, :, 1], kv2[0].reshape(kvh, d))
    assert np.array_equal(cache[2, :, 2], kv2[2].reshape(kvh, d))
    assert np.array_equal(cache[1], want[1])


def test_kv_write_checks_sizes():
    cache = rand(2, 2, 8, 4)
    pos = np.zeros(2, dtype=np.int32)
    with pytest.raises(ValueError):
        k.kv_write(rand(2, 7), pos, cache)
    with pytest.raises(ValueError):
        k.kv_write(rand(3, 8), np.zeros(3, dtype=np.int32), cache)  # 3 rows, 2 slots
    with pytest.raises(TypeError):
        k.kv_write(rand(2, 8, dtype=np.float16), pos, cache)
    with pytest.raises(ValueError):
        k.kv_write(rand(2, 8), pos, rand(2, 2, 32))


def attention_reference(q, kc, vc, pos, scale):
    rows = q.shape[0]
    _, kvh, _, d = kc.shape
    heads = q.shape[1] // d
    out = np.zeros((rows, heads * d))
    for i in range(rows):
        if pos[i] < 0:
            continue
        for h in range(heads):
            g = h // (heads // kvh)
            qh = q[i, h * d:(h + 1) * d].astype(np.float64)
            scores = np.array([scale * qh @ kc[i, g, t].astype(np.float64)
                               for t in range(pos[i] + 1)])
            w = np.exp(scores - scores.max())
            w /= w.sum()
            out[i, h * d:(h + 1) * d] = sum(w[t] * vc[i, g, t].astype(np.float64)
                                            for t in range(pos[i] + 1))
    return out


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 3e-3)])
def test_attention_is_softmax_over_the_cache(dtype, tol):
    slots, heads, kvh, seq, d = 5, 6, 2, 24, 16
    kc, vc = rand(slots, kvh, seq, d, dtype=dtype), rand(slots, kvh, seq, d, dtype=dtype)
    rows = 4
    q = rand(rows, heads * d, dtype=dtype)
    pos = np.array([0, 23, -1, 11], dtype=np.int32)
    out = k.attention(q, kc, vc, pos)
    assert out.dtype == dtype and out.shape == q.shape
    close(out, attention_reference(q, kc, vc, pos, 1.0 / math.sqrt(d)), tol)
    assert np.all(out[2] == 0)
    close(k.attention(q, kc, vc, pos, scale=0.3), attention_reference(q, kc, vc, pos, 0.3), tol)
    with pytest.raises(IndexError):
        k.attention(q, kc, vc, np.array([0, seq, 1, 2], dtype=np.int32))


def test_attention_checks_sizes():
    kc = rand(2, 2, 8, 4)
    q, pos = rand(2, 16), np.zeros(2, dtype=np.int32)
    with pytest.raises(ValueError):
        k.attention(rand(2, 15), kc, kc, pos)
    with pytest.raises(ValueError):
        k.attention(q, kc, rand(2, 2, 8, 5), pos)
    with pytest.raises(ValueError):
        k.attention(rand(3, 16), kc, kc, np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError):
        k.attention(rand(2, 12), kc, kc, pos)  # 3 heads over 2 kv heads: the library refuses
    with pytest.raises(ValueError):
        k.attention(q, kc, kc, pos, workspace=np.zeros(16, dtype=np.float32))


def test_workspace_queries():
    if stepgraph.device_available():
        assert k.attention_workspace_bytes(4, 32, 8, 4096, 128) >= 0
        assert k.argmax_workspace_bytes(4, 128256) >= 0
    else:
        assert k.attention_workspace_bytes(4, 32, 8, 4096, 128) == 0
        assert k.argmax_workspace_bytes(4, 128256) == 0
    with pytest.raises(ValueError):
        k.attention_workspace_bytes(4, 30, 8, 4096, 128)  # heads not a multiple of kv_heads
    with pytest.raises(ValueError):
        k.argmax_workspace_bytes(0, 100)


# ---- sampling ---------------------------------------------------------------------------

def test_philox_matches_the_published_answers():
    # Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
    assert _fallback.philox4x32_10((0, 0, 0, 0), (0, 0)) == \
        (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert _fallback.philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == \
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert _fallback.philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
                                   (0xA4093822, 0x299F31D0)) == \
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)
    # philox.h's SampleUniform for two (seed, pos) pairs.
    assert _fallback.sample_uniform(3, 7) == pytest.approx(0.0437806249, abs=1e-9)
    assert _fallback.sample_uniform(-5, 100) == pytest.approx(0.305675745, abs=1e-9)


def kept_probabilities(z, top_k, top_p):
    """{id: probability} of the ids sampling may draw, from the definition: the top_k
    largest (ties by index), then the smallest prefix of them reaching top_p of their mass."""
    ranked = sorted(range(z.size), key=lambda j: (-z[j], j))
    if top_k > 0:
        ranked = ranked[:top_k]
    weights = np.exp(z[ranked] - z[ranked[0]])
    if top_p < 1.0:
        reach = np.float32(top_p) * weights.sum()
        n = next(i + 1 for i in range(len(ranked)) if weights[:i + 1].sum() >= reach)
        ranked, weights = ranked[:n], weights[:n]
    return dict(zip(ranked, weights / weights.sum()))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.3, 0, 0.8), (2.0, 20, 0.9)])
def test_sample_draws_by_inverse_cdf_over_the_kept_ids(temperature, top_k, top_p):
    rows, vocab = 12, 50
    logits = rand(rows, vocab)
    seeds = rng.integers(-2**31, 2**31 - 1, size=rows).astype(np.int32)
    pos = rng.integers(0, 10000, size=rows).astype(np.int32)
    ids = k.sample(logits, seeds, pos, temperature, top_k, top_p)
    assert ids.dtype == np.int32 and ids.shape == (rows,)
    for i in range(rows):
        kept = kept_probabilities(logits[i].astype(np.float64) / np.float32(temperature),
                                  top_k, top_p)
        # The draw walks the kept ids in index order.
        u = _fallback.sample_uniform(int(seeds[i]), int(pos[i]))
        cum = 0.0
        for j in sorted(kept):
            cum += kept[j]
            if cum > u:
                break
        assert ids[i] == j, (i, u)
    # The same inputs, the same ids.
    assert np.array_equal(k.sample(logits, seeds, pos, temperature, top_k, top_p), ids)


def test_sample_follows_the_distribution_and_top_k_1_is_argmax():
    vocab, rows = 6, 3000
    row = np.array([1.0, 0.2, -0.5, 2.0, 0.0, 1.5], dtype=np.float32)
    logits = np.tile(row, (rows, 1))
    seeds = np.arange(rows, dtype=np.int32)
    pos = np.full(rows, 5, dtype=np.int32)
    ids = k.sample(logits, seeds, pos, 1.0, 0, 1.0)
    p = np.exp(row - row.max())
    p /= p.sum()
    counts = np.bincount(ids, minlength=vocab)
    # Each count within 5 standard deviations of its expectation.
    assert np.all(np.abs(counts - rows * p) < 5 * np.sqrt(rows * p * (1 - p)) + 1), counts
    x = rand(7, 33)
    assert np.array_equal(k.sample(x, seeds[:7], pos[:7], 0.5, 1, 1.0), np.argmax(x, axis=1))


def test_sample_checks_sizes():
    x = rand(3, 10)
    s = np.zeros(3, dtype=np.int32)
    with pytest.raises(ValueError):
        k.sample(x, np.zeros(2, dtype=np.int32), s)
    with pytest.raises(TypeError):
        k.sample(x, s, s.astype(np.float32))
    with pytest.raises(ValueError):
        k.sample(x, s, s, temperature=0.0)  # the library's refusal
    with pytest.raises(ValueError):
        k.sample(x, s, s, top_p=1.5)


# ---- copy and advance -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_copy(dtype):
    src = rng.integers(-1000, 1000, size=(5, 7)).astype(dtype)
    out = np.full_like(src, 77)
    assert k.copy(src, out=out) is out
    assert np.array_equal(out, src)
    made = k.copy(src)
    assert made.dtype == src.dtype and np.array_equal(made, src)
    with pytest.raises(ValueError):
        k.copy(src, out=np.zeros((5, 6), dtype=dtype))
    with pytest.raises(TypeError):
        k.copy(src, out=np.zeros((5, 7), dtype=np.float64))


def test_advance_moves_live_positions_only():
    pos = rng.integers(-3, 500, size=40).astype(np.int32)
    pos[:3] = [-1, 0, 2**31 - 2]
    want = np.where(pos >= 0, pos + 1, pos)
    assert k.advance(pos) is pos
    assert np.array_equal(pos, want)
    with pytest.raises(TypeError):
        k.advance(np.zeros(4, dtype=np.float32))


# ---- device tensors (PyTorch CUDA), with a GPU ------------------------------------------

def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if stepgraph.device_available() and torch.cuda.is_available() else None


@pytest.mark.skipif(_torch_cuda() is None, reason="no GPU: the library or PyTorch finds none")
def test_decode_kernels_on_cuda_tensors():
    torch = _torch_cuda()

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).cuda()

    d, heads, kvh, slots, seq, rows = 16, 4, 2, 3, 20, 3
    inv_freq = k.rope_inv_freq(d, 10000.0)
    x = rand(rows, heads * d)
    pos = np.array([5, -1, 19], dtype=np.int32)
    y = k.rope(dev(x), dev(pos), dev(inv_freq))
    close(y.cpu().numpy(), rope_reference(x, pos, inv_freq, False), 1e-5)

    kc, vc = rand(slots, kvh, seq, d), rand(slots, kvh, seq, d)
    kv = rand(rows, kvh * d)
    kc_dev = dev(kc)
    k.kv_write(dev(kv), dev(pos), kc_dev)
    want = kc.copy()
    for i in (0, 2):
        want[i, :, pos[i]] = kv[i].reshape(kvh, d)
    assert np.array_equal(kc_dev.cpu().numpy(), want)

    q = rand(rows, heads * d)
    out = k.attention(dev(q), kc_dev, dev(vc), dev(pos))
    close(out.cpu().numpy(), attention_reference(q, want, vc, pos, 1.0 / math.sqrt(d)), 1e-5)

    logits = rand(rows, 40)
    seeds = np.array([1, 2, 3], dtype=np.int32)
    ids = k.sample(dev(logits), dev(seeds), dev(np.abs(pos)), 0.8, 10, 0.9)
    assert np.array_equal(ids.cpu().numpy(), k.sample(logits, seeds, np.abs(pos), 0.8, 10, 0.9))

    p = dev(pos)
    k.advance(p)
    assert np.array_equal(p.cpu().numpy(), np.where(pos >= 0, pos + 1, pos))
    assert np.array_equal(k.copy(dev(x)).cpu().numpy(), x)
