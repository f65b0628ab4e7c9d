# The kernel functions on NumPy arrays (the library's checks, then the GPU or, on its -1, the
# NumPy fallback) against PyTorch's own ops as the reference, their size and dtype checks,
# and, with a GPU, PyTorch CUDA tensors passed straight to the kernels.
import numpy as np
import pytest

import stepgraph
from stepgraph import kernels as k

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(20261123)


def rand(*shape, dtype=np.float32):
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def close(got, want, tol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < tol, err


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a)).double()


def test_elementwise_against_torch():
    a, b = rand(1001), rand(1001)
    close(k.add(a, b), t(a) + t(b))
    close(k.mul(a, b), t(a) * t(b))
    close(k.silu(a), F.silu(t(a)))
    close(k.silu_mul(a, b), F.silu(t(a)) * t(b))
    close(k.scale(a, -1.75), -1.75 * t(a))
    out = np.full_like(a, np.nan)
    assert k.scale(a, 3.0, out=out) is out
    close(out, 3.0 * t(a))
    ia = rng.integers(-2**31, 2**31 - 1, size=64, dtype=np.int32)
    ib = rng.integers(-2**31, 2**31 - 1, size=64, dtype=np.int32)
    want = ((ia.astype(np.int64) + ib.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)
    assert np.array_equal(k.add(ia, ib), want)


def test_rows_against_torch():
    x = rand(3, 257)
    w = rng.uniform(0.5, 1.5, size=257).astype(np.float32)
    close(k.softmax(x), torch.softmax(t(x), dim=-1))
    eps = 1e-5
    close(k.rmsnorm(x, w, eps=eps), F.rms_norm(t(x), (257,), t(w), eps=eps))
    ids = k.argmax(x)
    assert ids.dtype == np.int32
    assert np.array_equal(ids, torch.argmax(t(x), dim=-1).numpy())
    xm, wm, bias = rand(4, 96), rand(40, 96), rand(40)
    close(k.matmul(xm, wm, bias), F.linear(t(xm), t(wm), t(bias)))
    close(k.matmul(xm, wm), F.linear(t(xm), t(wm)))
    table = rand(50, 16)
    tok = rng.integers(0, 50, size=7).astype(np.int32)
    assert np.array_equal(k.embedding(table, tok), table[tok])


def test_rope_inv_freq():
    got = k.rope_inv_freq(64, 10000.0)
    want = 1.0 / 10000.0 ** (np.arange(0, 64, 2, dtype=np.float64) / 64)
    close(got, want, 1e-6)
    with pytest.raises(ValueError):
        k.rope_inv_freq(63, 10000.0)
    with pytest.raises(ValueError):
        k.rope_inv_freq(64, 1e-45)


def test_sizes_and_dtypes_are_checked_before_the_call():
    a = rand(10)
    with pytest.raises(ValueError):
        k.add(a, rand(9))
    with pytest.raises(TypeError):
        k.add(a, rand(10, dtype=np.float64))
    with pytest.raises(ValueError):
        k.scale(a, 2.0, out=np.empty(11, np.float32))
    with pytest.raises(ValueError):
        k.rmsnorm(rand(2, 8), rand(7))
    with pytest.raises(ValueError):
        k.matmul(rand(2, 8), rand(4, 9))
    with pytest.raises(TypeError):
        k.embedding(rand(5, 4), np.array([1, 2], dtype=np.int64))


def test_the_library_refuses_what_it_must_in_every_build():
    # Shapes agree, so these reach the C checks: the same -2 with or without CUDA.
    with pytest.raises(ValueError):
        k.rmsnorm(rand(2, 8), rand(8), eps=float("nan"))
    with pytest.raises(ValueError):
        k.scale(rand(8), float("inf"))
    with pytest.raises(ValueError):
        k.matmul(rand(9, 8), rand(4, 8))  # m > STEPGRAPH_MATMUL_MAX_ROWS
    with pytest.raises(ValueError):
        k.silu(rand(8).view(np.int32))  # i32 is add's only


def test_embedding_out_of_range_raises():
    with pytest.raises(IndexError):
        k.embedding(rand(5, 4), np.array([1, 5], dtype=np.int32))


gpu = pytest.mark.skipif(not (stepgraph.device_available() and torch.cuda.is_available()),
                         reason="no GPU: the library or PyTorch finds no device")


@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2),
                                       (torch.float16, 2e-3)])
def test_cuda_tensors(dtype, tol):
    a = torch.rand(4099, device="cuda", dtype=dtype) * 4 - 2
    b = torch.rand(4099, device="cuda", dtype=dtype) * 4 - 2
    y = torch.full_like(a, float("nan"))
    k.add(a, b, out=y)
    close(y.double().cpu(), (a + b).double().cpu(), tol)
    close(k.scale(a, 0.37).double().cpu(), (a.float() * 0.37).to(dtype).double().cpu(), tol)
    close(k.silu(a).double().cpu(), F.silu(a.float()).to(dtype).double().cpu(), tol)
    x = torch.rand(3, 4096, device="cuda", dtype=dtype)
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    close(k.rmsnorm(x, w, eps=1e-6).double().cpu(),
          F.rms_norm(x.float(), (4096,), w.float(), eps=1e-6).double().cpu(), tol * 2)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        z = k.mul(a, b, stream=stream)
    stream.synchronize()
    close(z.double().cpu(), (a.float() * b.float()).to(dtype).double().cpu(), tol)


@gpu
def test_numpy_arrays_are_staged_through_the_gpu():
    a, b = rand(777), rand(777)
    close(k.add(a, b), t(a) + t(b))
    with pytest.raises(IndexError):
        k.embedding(rand(5, 4), np.array([1, 5], dtype=np.int32))


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_against_torch(trans_a, trans_b):
    m, n, kk = 5, 7, 9
    a = rand(kk, m) if trans_a else rand(m, kk)
    b = rand(n, kk) if trans_b else rand(kk, n)
    c = rand(m, n)
    ta = t(a).T if trans_a else t(a)
    tb = t(b).T if trans_b else t(b)
    close(k.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5), 0.5 * ta @ tb)
    out = c.copy()
    k.gemm(a, b, out, alpha=-1.0, beta=2.0, trans_a=trans_a, trans_b=trans_b)
    close(out, -(ta @ tb) + 2.0 * t(c))
    batch_a = np.stack([a, 2 * a, -a])
    batch_b = np.stack([b, b, 3 * b])
    got = k.gemm_batched(batch_a, batch_b, trans_a=trans_a, trans_b=trans_b)
    want = torch.stack([(t(x).T if trans_a else t(x)) @ (t(y).T if trans_b else t(y))
                        for x, y in zip(batch_a, batch_b)])
    close(got, want)


def test_gemm_shape_checks():
    with pytest.raises(ValueError):
        k.gemm(rand(3, 4), rand(5, 6))
    with pytest.raises(ValueError):
        k.gemm(rand(3, 4), rand(4, 6), beta=1.0)  # beta needs c
    with pytest.raises(ValueError):
        k.gemm(rand(3, 4), rand(4, 6), alpha=float("nan"))


def test_topk_against_torch():
    x = rand(4, 300)
    x[1, 5] = x[1, 9] = 7.0  # a tie: the lower index first
    x[2, 17] = np.nan  # NaN ranks first, as torch.topk
    values, indices = k.topk(x, 12)
    tv, ti = torch.topk(torch.from_numpy(x), 12, dim=-1, sorted=True)
    assert np.array_equal(indices[[0, 3]], ti.numpy()[[0, 3]])
    assert indices[1, 0] == 5 and indices[1, 1] == 9
    assert indices[2, 0] == 17 and np.isnan(values[2, 0])
    np.testing.assert_array_equal(values[[0, 1, 3]], tv.numpy()[[0, 1, 3]])
    with pytest.raises(ValueError):
        k.topk(x, 301)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_against_torch(causal):
    batch, seq, heads, kv_heads, d = 2, 11, 4, 2, 16
    q, kk, v = rand(batch, seq, heads, d), rand(batch, seq, kv_heads, d), rand(batch, seq, kv_heads, d)
    got = k.flash_attention(q, kk, v, causal=causal)
    # PyTorch's SDPA takes [batch, heads, seq, d] and repeated kv heads.
    tq = t(q).transpose(1, 2)
    tk = t(kk).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
    tv = t(v).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
    want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).transpose(1, 2)
    close(got, want)
    with pytest.raises(ValueError):
        k.flash_attention(q, rand(batch, seq, 3, d), rand(batch, seq, 3, d))
