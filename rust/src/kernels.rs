//! Safe wrappers of the device functions of c_api.h: each checks the slices' lengths
//! against the shape, then calls; the library checks the rest (dtype, limits, alignment)
//! the same way with or without CUDA. Calls only enqueue work on `stream`.
use crate::{as_i64, check, elements, expect_len, ffi, flags_ptr, invalid, DeviceSlice,
            DeviceSliceMut, Element, ErrorFlags, Float, Result, Stream};
use std::ptr;

fn same_len(function: &str, lens: &[(&str, usize)]) -> Result<i64> {
    let n = lens[0].1;
    for (what, len) in lens {
        expect_len(function, what, *len, n)?;
    }
    as_i64(function, n)
}

/// y = a + b (float dtypes, or i32 wrapping).
pub fn add<T: Element>(a: DeviceSlice<T>, b: DeviceSlice<T>, mut y: DeviceSliceMut<T>,
                       stream: Stream) -> Result<()> {
    let f = "stepgraph_add";
    let n = same_len(f, &[("a", a.len()), ("b", b.len()), ("y", y.len())])?;
    // SAFETY: the three slices hold n elements each (checked); validity is theirs.
    check(unsafe { ffi::stepgraph_add(a.void(), b.void(), y.void(), n, T::DTYPE, stream.0) }, f)
}

/// y = a · b.
pub fn mul<T: Float>(a: DeviceSlice<T>, b: DeviceSlice<T>, mut y: DeviceSliceMut<T>,
                     stream: Stream) -> Result<()> {
    let f = "stepgraph_mul";
    let n = same_len(f, &[("a", a.len()), ("b", b.len()), ("y", y.len())])?;
    // SAFETY: as for add.
    check(unsafe { ffi::stepgraph_mul(a.void(), b.void(), y.void(), n, T::DTYPE, stream.0) }, f)
}

/// y = x · sigmoid(x).
pub fn silu<T: Float>(x: DeviceSlice<T>, mut y: DeviceSliceMut<T>, stream: Stream)
                      -> Result<()> {
    let f = "stepgraph_silu";
    let n = same_len(f, &[("x", x.len()), ("y", y.len())])?;
    // SAFETY: as for add.
    check(unsafe { ffi::stepgraph_silu(x.void(), y.void(), n, T::DTYPE, stream.0) }, f)
}

/// y = silu(gate) · up.
pub fn silu_mul<T: Float>(gate: DeviceSlice<T>, up: DeviceSlice<T>, mut y: DeviceSliceMut<T>,
                          stream: Stream) -> Result<()> {
    let f = "stepgraph_silu_mul";
    let n = same_len(f, &[("gate", gate.len()), ("up", up.len()), ("y", y.len())])?;
    // SAFETY: as for add.
    check(unsafe {
        ffi::stepgraph_silu_mul(gate.void(), up.void(), y.void(), n, T::DTYPE, stream.0)
    }, f)
}

/// y = alpha · x.
pub fn scale<T: Float>(x: DeviceSlice<T>, mut y: DeviceSliceMut<T>, alpha: f32, stream: Stream)
                       -> Result<()> {
    let f = "stepgraph_scale";
    let n = same_len(f, &[("x", x.len()), ("y", y.len())])?;
    // SAFETY: as for add.
    check(unsafe { ffi::stepgraph_scale(x.void(), y.void(), n, alpha, T::DTYPE, stream.0) }, f)
}

/// RMSNorm of each of the `rows` rows of x [rows, hidden] into y; weight [hidden].
pub fn rmsnorm<T: Float>(x: DeviceSlice<T>, weight: DeviceSlice<T>, mut y: DeviceSliceMut<T>,
                         rows: i64, hidden: i64, eps: f32, stream: Stream) -> Result<()> {
    let f = "stepgraph_rmsnorm";
    let n = elements(f, &[rows, hidden])?;
    expect_len(f, "x", x.len(), n)?;
    expect_len(f, "y", y.len(), n)?;
    expect_len(f, "weight", weight.len(), hidden as usize)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_rmsnorm(x.void(), weight.void(), y.void(), rows, hidden, eps, T::DTYPE,
                               stream.0)
    }, f)
}

/// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]); 1 <= m <= STEPGRAPH_MATMUL_MAX_ROWS.
#[allow(clippy::too_many_arguments)]
pub fn matmul<T: Float>(x: DeviceSlice<T>, w: DeviceSlice<T>, bias: Option<DeviceSlice<T>>,
                        mut y: DeviceSliceMut<T>, m: i64, n: i64, k: i64, stream: Stream)
                        -> Result<()> {
    let f = "stepgraph_matmul";
    expect_len(f, "x", x.len(), elements(f, &[m, k])?)?;
    expect_len(f, "w", w.len(), elements(f, &[n, k])?)?;
    expect_len(f, "y", y.len(), elements(f, &[m, n])?)?;
    if let Some(b) = &bias {
        expect_len(f, "bias", b.len(), n as usize)?;
    }
    let bias_ptr = bias.map_or(ptr::null(), |b| b.void());
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_matmul(x.void(), w.void(), bias_ptr, y.void(), m, n, k, T::DTYPE, stream.0)
    }, f)
}

/// out[i, :] = table[ids[i], :]; table [vocab, hidden], out [ids.len(), hidden].
pub fn embedding<T: Float>(table: DeviceSlice<T>, ids: DeviceSlice<i32>,
                           mut out: DeviceSliceMut<T>, vocab: i64, hidden: i64,
                           mut error_flags: ErrorFlags, stream: Stream) -> Result<()> {
    let f = "stepgraph_embedding";
    let rows = as_i64(f, ids.len())?;
    expect_len(f, "table", table.len(), elements(f, &[vocab, hidden])?)?;
    expect_len(f, "out", out.len(), elements(f, &[rows, hidden])?)?;
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_embedding(table.void(), ids.as_ptr(), out.void(), rows, vocab, hidden,
                                 T::DTYPE, flags, stream.0)
    }, f)
}

/// Rotates the heads of x [pos.len(), cols] by each row's position; inv_freq [head_dim / 2].
#[allow(clippy::too_many_arguments)]
pub fn rope<T: Float>(x: DeviceSlice<T>, pos: DeviceSlice<i32>, inv_freq: DeviceSlice<f32>,
                      mut y: DeviceSliceMut<T>, cols: i64, head_dim: i64, interleaved: bool,
                      stream: Stream) -> Result<()> {
    let f = "stepgraph_rope";
    let rows = as_i64(f, pos.len())?;
    let n = elements(f, &[rows, cols])?;
    expect_len(f, "x", x.len(), n)?;
    expect_len(f, "y", y.len(), n)?;
    if head_dim < 2 || head_dim % 2 != 0 {
        return invalid(format!("{f}: head_dim {head_dim} must be even and >= 2"));
    }
    expect_len(f, "inv_freq", inv_freq.len(), (head_dim / 2) as usize)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_rope(x.void(), pos.as_ptr(), inv_freq.as_ptr(), y.void(), rows, cols,
                            head_dim, interleaved as i32, T::DTYPE, stream.0)
    }, f)
}

/// The shape of a KV cache: [slots, kv_heads, seq_len, head_dim].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    pub slots: i64,
    pub kv_heads: i64,
    pub seq_len: i64,
    pub head_dim: i64,
}

impl CacheShape {
    fn elements(&self, f: &str) -> Result<usize> {
        elements(f, &[self.slots, self.kv_heads, self.seq_len, self.head_dim])
    }
}

/// Stores row i of kv [pos.len(), kv_heads · head_dim] at position pos[i] of slot i.
pub fn kv_write<T: Float>(kv: DeviceSlice<T>, pos: DeviceSlice<i32>, mut cache: DeviceSliceMut<T>,
                          shape: CacheShape, mut error_flags: ErrorFlags, stream: Stream)
                          -> Result<()> {
    let f = "stepgraph_kv_write";
    let rows = as_i64(f, pos.len())?;
    expect_len(f, "kv", kv.len(), elements(f, &[rows, shape.kv_heads, shape.head_dim])?)?;
    expect_len(f, "cache", cache.len(), shape.elements(f)?)?;
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_kv_write(kv.void(), pos.as_ptr(), cache.void(), rows, shape.slots,
                                shape.kv_heads, shape.seq_len, shape.head_dim, T::DTYPE, flags,
                                stream.0)
    }, f)
}

/// The workspace bytes stepgraph_attention prefers for this shape on the current device.
pub fn attention_workspace_bytes(rows: i64, heads: i64, kv_heads: i64, seq_len: i64,
                                 head_dim: i64) -> Result<i64> {
    let mut bytes = -1i64;
    // SAFETY: a valid out pointer.
    check(unsafe {
        ffi::stepgraph_attention_workspace_bytes(rows, heads, kv_heads, seq_len, head_dim,
                                                 &mut bytes)
    }, "stepgraph_attention_workspace_bytes")?;
    Ok(bytes)
}

/// Decode attention of q [pos.len(), heads · head_dim] over the caches; `workspace` None
/// runs without splitting the keys.
#[allow(clippy::too_many_arguments)]
pub fn attention<T: Float>(q: DeviceSlice<T>, k_cache: DeviceSlice<T>, v_cache: DeviceSlice<T>,
                           pos: DeviceSlice<i32>, mut out: DeviceSliceMut<T>, heads: i64,
                           shape: CacheShape, scale: f32, workspace: Option<DeviceSliceMut<u8>>,
                           mut error_flags: ErrorFlags, stream: Stream) -> Result<()> {
    let f = "stepgraph_attention";
    let rows = as_i64(f, pos.len())?;
    let qn = elements(f, &[rows, heads, shape.head_dim])?;
    expect_len(f, "q", q.len(), qn)?;
    expect_len(f, "out", out.len(), qn)?;
    let cn = shape.elements(f)?;
    expect_len(f, "k_cache", k_cache.len(), cn)?;
    expect_len(f, "v_cache", v_cache.len(), cn)?;
    let (ws, ws_bytes) = match workspace {
        Some(mut w) => { let b = as_i64(f, w.len())?; (w.as_mut_ptr() as *mut _, b) }
        None => (ptr::null_mut(), 0),
    };
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape; the workspace's length is its bytes.
    check(unsafe {
        ffi::stepgraph_attention(q.void(), k_cache.void(), v_cache.void(), pos.as_ptr(),
                                 out.void(), rows, heads, shape.kv_heads, shape.slots,
                                 shape.seq_len, shape.head_dim, scale, T::DTYPE, ws, ws_bytes,
                                 flags, stream.0)
    }, f)
}

/// Softmax of each row of x [rows, n] into y.
pub fn softmax<T: Float>(x: DeviceSlice<T>, mut y: DeviceSliceMut<T>, rows: i64, n: i64,
                         stream: Stream) -> Result<()> {
    let f = "stepgraph_softmax";
    let len = elements(f, &[rows, n])?;
    expect_len(f, "x", x.len(), len)?;
    expect_len(f, "y", y.len(), len)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe { ffi::stepgraph_softmax(x.void(), y.void(), rows, n, T::DTYPE, stream.0) }, f)
}

/// The workspace bytes with which argmax splits long rows on the current device.
pub fn argmax_workspace_bytes(rows: i64, vocab: i64) -> Result<i64> {
    let mut bytes = -1i64;
    // SAFETY: a valid out pointer.
    check(unsafe { ffi::stepgraph_argmax_workspace_bytes(rows, vocab, &mut bytes) },
          "stepgraph_argmax_workspace_bytes")?;
    Ok(bytes)
}

/// ids[i] = the lowest index of the maximum of row i of logits [ids.len(), vocab].
pub fn argmax<T: Float>(logits: DeviceSlice<T>, mut ids: DeviceSliceMut<i32>, vocab: i64,
                        workspace: Option<DeviceSliceMut<u8>>, stream: Stream) -> Result<()> {
    let f = "stepgraph_argmax";
    let rows = as_i64(f, ids.len())?;
    expect_len(f, "logits", logits.len(), elements(f, &[rows, vocab])?)?;
    let (ws, ws_bytes) = match workspace {
        Some(mut w) => { let b = as_i64(f, w.len())?; (w.as_mut_ptr() as *mut _, b) }
        None => (ptr::null_mut(), 0),
    };
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_argmax(logits.void(), ids.as_mut_ptr(), rows, vocab, T::DTYPE, ws,
                              ws_bytes, stream.0)
    }, f)
}

/// Sampling parameters of [`sample`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
}

/// ids[i] drawn from row i of logits [ids.len(), vocab] with (seeds[i], pos[i]).
pub fn sample<T: Float>(logits: DeviceSlice<T>, seeds: DeviceSlice<i32>, pos: DeviceSlice<i32>,
                        mut ids: DeviceSliceMut<i32>, vocab: i64, p: SampleParams,
                        stream: Stream) -> Result<()> {
    let f = "stepgraph_sample";
    let rows = same_len(f, &[("ids", ids.len()), ("seeds", seeds.len()), ("pos", pos.len())])?;
    expect_len(f, "logits", logits.len(), elements(f, &[rows, vocab])?)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_sample(logits.void(), seeds.as_ptr(), pos.as_ptr(), ids.as_mut_ptr(), rows,
                              vocab, p.temperature, p.top_k, p.top_p, T::DTYPE, stream.0)
    }, f)
}

/// dst = src, device to device.
pub fn copy<T: Element>(src: DeviceSlice<T>, mut dst: DeviceSliceMut<T>, stream: Stream)
                        -> Result<()> {
    let f = "stepgraph_copy";
    let n = same_len(f, &[("src", src.len()), ("dst", dst.len())])?;
    // SAFETY: both hold n elements.
    check(unsafe { ffi::stepgraph_copy(src.void(), dst.void(), n, T::DTYPE, stream.0) }, f)
}

/// pos[i] += 1 where pos[i] >= 0, in place.
pub fn advance(mut pos: DeviceSliceMut<i32>, stream: Stream) -> Result<()> {
    let f = "stepgraph_advance";
    let n = as_i64(f, pos.len())?;
    // SAFETY: pos holds n elements.
    check(unsafe { ffi::stepgraph_advance(pos.as_mut_ptr(), n, stream.0) }, f)
}

// ---- top-k and attention over sequences ----

/// The k largest of each row of x [rows, n]: values and indices [rows, k], largest first.
pub fn topk<T: Float>(x: DeviceSlice<T>, mut values: DeviceSliceMut<T>,
                      mut indices: DeviceSliceMut<i32>, rows: i64, n: i64, k: i64,
                      stream: Stream) -> Result<()> {
    let f = "stepgraph_topk";
    expect_len(f, "x", x.len(), elements(f, &[rows, n])?)?;
    let out = elements(f, &[rows, k])?;
    expect_len(f, "values", values.len(), out)?;
    expect_len(f, "indices", indices.len(), out)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_topk(x.void(), values.void(), indices.as_mut_ptr(), rows, n, k, T::DTYPE,
                            stream.0)
    }, f)
}

/// The shape of [`flash_attention`]: q and out [batch, seq, heads, head_dim], k and v
/// [batch, seq, kv_heads, head_dim].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequenceShape {
    pub batch: i64,
    pub seq: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
}

/// Attention over whole sequences (causal or not).
pub fn flash_attention<T: Float>(q: DeviceSlice<T>, k: DeviceSlice<T>, v: DeviceSlice<T>,
                                 mut out: DeviceSliceMut<T>, s: SequenceShape, scale: f32,
                                 causal: bool, stream: Stream) -> Result<()> {
    let f = "stepgraph_flash_attention";
    let qn = elements(f, &[s.batch, s.seq, s.heads, s.head_dim])?;
    let kn = elements(f, &[s.batch, s.seq, s.kv_heads, s.head_dim])?;
    expect_len(f, "q", q.len(), qn)?;
    expect_len(f, "out", out.len(), qn)?;
    expect_len(f, "k", k.len(), kn)?;
    expect_len(f, "v", v.len(), kn)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_flash_attention(q.void(), k.void(), v.void(), out.void(), s.batch, s.seq,
                                       s.heads, s.kv_heads, s.head_dim, scale, causal as i32,
                                       T::DTYPE, stream.0)
    }, f)
}

// ---- general matrix products ----

/// The shape and scalars of a product C[m, n] = alpha · op(A) · op(B) + beta · C.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmShape {
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// A is stored [k, m] (else [m, k]).
    pub trans_a: bool,
    /// B is stored [n, k] (else [k, n]).
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

fn workspace_parts(f: &str, w: Option<DeviceSliceMut<u8>>) -> Result<(*mut std::ffi::c_void, i64)> {
    match w {
        Some(mut w) => { let b = as_i64(f, w.len())?; Ok((w.as_mut_ptr() as *mut _, b)) }
        None => Ok((ptr::null_mut(), 0)),
    }
}

/// One product through cuBLASLt; `workspace` None or a 256-byte aligned device buffer.
pub fn gemm<T: Float>(a: DeviceSlice<T>, b: DeviceSlice<T>, mut c: DeviceSliceMut<T>,
                      s: GemmShape, workspace: Option<DeviceSliceMut<u8>>, stream: Stream)
                      -> Result<()> {
    let f = "stepgraph_gemm";
    expect_len(f, "a", a.len(), elements(f, &[s.m, s.k])?)?;
    expect_len(f, "b", b.len(), elements(f, &[s.k, s.n])?)?;
    expect_len(f, "c", c.len(), elements(f, &[s.m, s.n])?)?;
    let (ws, ws_bytes) = workspace_parts(f, workspace)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_gemm(a.void(), b.void(), c.void(), s.m, s.n, s.k, s.trans_a as i32,
                            s.trans_b as i32, s.alpha, s.beta, T::DTYPE, ws, ws_bytes, stream.0)
    }, f)
}

/// `batch` products over dense stacks: a [batch, m·k], b [batch, k·n], c [batch, m·n].
pub fn gemm_batched<T: Float>(a: DeviceSlice<T>, b: DeviceSlice<T>, mut c: DeviceSliceMut<T>,
                              batch: i64, s: GemmShape, workspace: Option<DeviceSliceMut<u8>>,
                              stream: Stream) -> Result<()> {
    let f = "stepgraph_gemm_batched";
    expect_len(f, "a", a.len(), elements(f, &[batch, s.m, s.k])?)?;
    expect_len(f, "b", b.len(), elements(f, &[batch, s.k, s.n])?)?;
    expect_len(f, "c", c.len(), elements(f, &[batch, s.m, s.n])?)?;
    let (ws, ws_bytes) = workspace_parts(f, workspace)?;
    // SAFETY: each stack holds batch matrices of its shape (checked), at dense strides.
    check(unsafe {
        ffi::stepgraph_gemm_batched(a.void(), b.void(), c.void(), batch, s.m, s.n, s.k, s.m * s.k,
                                    s.k * s.n, s.m * s.n, s.trans_a as i32, s.trans_b as i32,
                                    s.alpha, s.beta, T::DTYPE, ws, ws_bytes, stream.0)
    }, f)
}

// ---- training ----

/// Per-row cross entropy of logits [targets.len(), vocab] (f32 losses), and the
/// log-probabilities when `log_probs` is given.
pub fn cross_entropy<T: Float>(logits: DeviceSlice<T>, targets: DeviceSlice<i32>,
                               mut loss: DeviceSliceMut<f32>,
                               log_probs: Option<DeviceSliceMut<T>>, vocab: i64,
                               ignore_index: i32, mut error_flags: ErrorFlags, stream: Stream)
                               -> Result<()> {
    let f = "stepgraph_cross_entropy";
    let rows = same_len(f, &[("targets", targets.len()), ("loss", loss.len())])?;
    let n = elements(f, &[rows, vocab])?;
    expect_len(f, "logits", logits.len(), n)?;
    let lp = match log_probs {
        Some(mut p) => { expect_len(f, "log_probs", p.len(), n)?; p.void() }
        None => ptr::null_mut(),
    };
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_cross_entropy(logits.void(), targets.as_ptr(), loss.as_mut_ptr(), lp, rows,
                                     vocab, ignore_index, T::DTYPE, flags, stream.0)
    }, f)
}

/// dlogits = dloss[i] · (softmax(logits[i]) − onehot(targets[i])).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_backward<T: Float>(logits: DeviceSlice<T>, targets: DeviceSlice<i32>,
                                        dloss: DeviceSlice<f32>, mut dlogits: DeviceSliceMut<T>,
                                        vocab: i64, ignore_index: i32,
                                        mut error_flags: ErrorFlags, stream: Stream)
                                        -> Result<()> {
    let f = "stepgraph_cross_entropy_backward";
    let rows = same_len(f, &[("targets", targets.len()), ("dloss", dloss.len())])?;
    let n = elements(f, &[rows, vocab])?;
    expect_len(f, "logits", logits.len(), n)?;
    expect_len(f, "dlogits", dlogits.len(), n)?;
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_cross_entropy_backward(logits.void(), targets.as_ptr(), dloss.as_ptr(),
                                              dlogits.void(), rows, vocab, ignore_index,
                                              T::DTYPE, flags, stream.0)
    }, f)
}

/// The load-balancing loss (one f32) of router_probs [tokens, experts] and expert_ids
/// [tokens, top_k].
#[allow(clippy::too_many_arguments)]
pub fn moe_aux_loss<T: Float>(router_probs: DeviceSlice<T>, expert_ids: DeviceSlice<i32>,
                              mut loss: DeviceSliceMut<f32>, tokens: i64, experts: i64,
                              top_k: i64, mut error_flags: ErrorFlags, stream: Stream)
                              -> Result<()> {
    let f = "stepgraph_moe_aux_loss";
    expect_len(f, "router_probs", router_probs.len(), elements(f, &[tokens, experts])?)?;
    expect_len(f, "expert_ids", expert_ids.len(), elements(f, &[tokens, top_k])?)?;
    expect_len(f, "loss", loss.len(), 1)?;
    let flags = flags_ptr(f, &mut error_flags)?;
    // SAFETY: lengths checked against the shape.
    check(unsafe {
        ffi::stepgraph_moe_aux_loss(router_probs.void(), expert_ids.as_ptr(), loss.as_mut_ptr(),
                                    tokens, experts, top_k, T::DTYPE, flags, stream.0)
    }, f)
}

/// AdamW's hyperparameters (torch.optim.AdamW's names and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 1e-2 }
    }
}

/// Step number `step` (from 1) of AdamW over f32 parameters and moments, in place.
pub fn adamw_step<G: Float>(mut param: DeviceSliceMut<f32>, grad: DeviceSlice<G>,
                            mut exp_avg: DeviceSliceMut<f32>, mut exp_avg_sq: DeviceSliceMut<f32>,
                            h: AdamW, step: i64, stream: Stream) -> Result<()> {
    let f = "stepgraph_adamw_step";
    let n = same_len(f, &[("param", param.len()), ("grad", grad.len()),
                          ("exp_avg", exp_avg.len()), ("exp_avg_sq", exp_avg_sq.len())])?;
    // SAFETY: the four hold n elements each.
    check(unsafe {
        ffi::stepgraph_adamw_step(param.as_mut_ptr(), grad.void(), exp_avg.as_mut_ptr(),
                                  exp_avg_sq.as_mut_ptr(), n, h.lr, h.beta1, h.beta2, h.eps,
                                  h.weight_decay, step, G::DTYPE, stream.0)
    }, f)
}

/// Scales the buffers in place so that their global L2 norm is at most max_norm; the norm
/// before clipping goes to `total_norm` (one f32 on the device).
pub fn clip_grad_norm<T: Float>(grads: &mut [DeviceSliceMut<T>], max_norm: f32,
                                mut total_norm: DeviceSliceMut<f32>, stream: Stream)
                                -> Result<()> {
    let f = "stepgraph_clip_grad_norm";
    expect_len(f, "total_norm", total_norm.len(), 1)?;
    if grads.is_empty() {
        return invalid(format!("{f}: no buffers"));
    }
    let mut ptrs = Vec::with_capacity(grads.len());
    let mut sizes = Vec::with_capacity(grads.len());
    for g in grads.iter_mut() {
        sizes.push(as_i64(f, g.len())?);
        ptrs.push(g.void());
    }
    let count = as_i64(f, grads.len())?;
    // SAFETY: count host pointers and sizes; each buffer holds its size (its slice's).
    check(unsafe {
        ffi::stepgraph_clip_grad_norm(ptrs.as_ptr() as *const *mut std::ffi::c_void,
                                      sizes.as_ptr(), count, max_norm, T::DTYPE,
                                      total_norm.as_mut_ptr(), stream.0)
    }, f)
}
