package stepgraph

// The safe wrappers of the device functions of c_api.h: each checks the slices' lengths
// against the shape it is given (an *Error of ErrInvalidArgument, before any call), then
// calls; the library checks the rest (dtype, limits, alignment, parameters) the same way
// with or without CUDA. A call only enqueues work on the stream. A library built without
// CUDA, or a machine without a device, answers ErrNotAvailable once the arguments pass.
// The functions keep no state and may be called from any goroutine (c_api.h).

/*
#include "stepgraph/c_api/c_api.h"
*/
import "C"

import "unsafe"

// Limits of c_api.h.
const (
	MaxElements         = C.STEPGRAPH_MAX_ELEMENTS
	MatMulMaxRows       = C.STEPGRAPH_MATMUL_MAX_ROWS
	AttentionMaxHeadDim = C.STEPGRAPH_ATTENTION_MAX_HEAD_DIM
	MoEMaxExperts       = C.STEPGRAPH_MOE_MAX_EXPERTS
	TopKMaxK            = C.STEPGRAPH_TOPK_MAX_K
	FlashMaxHeadDim     = C.STEPGRAPH_FLASH_MAX_HEAD_DIM
	ClipMaxBuffers      = C.STEPGRAPH_CLIP_MAX_BUFFERS
)

// elements is the product of the dims as a length, or an error when a dim is not positive
// or the product overflows or passes MaxElements.
func elements(function string, dims ...int64) (int, error) {
	n := int64(1)
	for _, d := range dims {
		if d <= 0 {
			return 0, invalid(function, "dimension %d is not positive (dims %v)", d, dims)
		}
		if n > MaxElements/d {
			return 0, invalid(function, "dims %v hold more than %d elements", dims,
				int64(MaxElements))
		}
		n *= d
	}
	return int(n), nil
}

func expectLen(function, what string, got, want int) error {
	if got != want {
		return invalid(function, "%s has %d elements, the shape needs %d", what, got, want)
	}
	return nil
}

// shaped checks each slice's length against its shape's element count.
type shaped struct {
	what string
	len  int
	dims []int64
}

func checkShapes(function string, list ...shaped) error {
	for _, s := range list {
		n, err := elements(function, s.dims...)
		if err != nil {
			return err
		}
		if err := expectLen(function, s.what, s.len, n); err != nil {
			return err
		}
	}
	return nil
}

// sameLen is the common length of slices that must agree, as the C ABI's count.
func sameLen(function string, names []string, lens ...int) (int64, error) {
	for i, l := range lens {
		if err := expectLen(function, names[i], l, lens[0]); err != nil {
			return 0, err
		}
	}
	return int64(lens[0]), nil
}

func flagsPtr(function string, flags ErrorFlags) (*uint32, error) {
	if err := expectLen(function, "error_flags", flags.n, 1); err != nil {
		return nil, err
	}
	return (*uint32)(flags.ptr), nil
}

func i32Ptr(s DeviceSlice[int32]) *int32     { return (*int32)(s.ptr) }
func f32Ptr(s DeviceSlice[float32]) *float32 { return (*float32)(s.ptr) }

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// DeviceAvailable says whether the kernel library can launch on a device here (built with
// CUDA, a device found).
func DeviceAvailable() bool {
	var bytes int64
	return stepgraph_argmax_workspace_bytes(1, 64, &bytes) == C.STEPGRAPH_OK
}

// ---- elementwise -----------------------------------------------------------------------

// Add: y = a + b (float dtypes, or int32 wrapping).
func Add[T Element](a, b, y DeviceSlice[T], stream Stream) error {
	const f = "stepgraph_add"
	n, err := sameLen(f, []string{"a", "b", "y"}, a.n, b.n, y.n)
	if err != nil {
		return err
	}
	return check(stepgraph_add(a.ptr, b.ptr, y.ptr, n, DType[T](), stream.raw), f)
}

// Mul: y = a · b.
func Mul[T Float](a, b, y DeviceSlice[T], stream Stream) error {
	const f = "stepgraph_mul"
	n, err := sameLen(f, []string{"a", "b", "y"}, a.n, b.n, y.n)
	if err != nil {
		return err
	}
	return check(stepgraph_mul(a.ptr, b.ptr, y.ptr, n, DType[T](), stream.raw), f)
}

// SiLU: y = x · sigmoid(x).
func SiLU[T Float](x, y DeviceSlice[T], stream Stream) error {
	const f = "stepgraph_silu"
	n, err := sameLen(f, []string{"x", "y"}, x.n, y.n)
	if err != nil {
		return err
	}
	return check(stepgraph_silu(x.ptr, y.ptr, n, DType[T](), stream.raw), f)
}

// SiLUMul: y = silu(gate) · up (the fused SwiGLU).
func SiLUMul[T Float](gate, up, y DeviceSlice[T], stream Stream) error {
	const f = "stepgraph_silu_mul"
	n, err := sameLen(f, []string{"gate", "up", "y"}, gate.n, up.n, y.n)
	if err != nil {
		return err
	}
	return check(stepgraph_silu_mul(gate.ptr, up.ptr, y.ptr, n, DType[T](), stream.raw), f)
}

// Scale: y = alpha · x.
func Scale[T Float](x, y DeviceSlice[T], alpha float32, stream Stream) error {
	const f = "stepgraph_scale"
	n, err := sameLen(f, []string{"x", "y"}, x.n, y.n)
	if err != nil {
		return err
	}
	return check(stepgraph_scale(x.ptr, y.ptr, n, alpha, DType[T](), stream.raw), f)
}

// Copy: dst = src, device to device (any dtype).
func Copy[T Element](src, dst DeviceSlice[T], stream Stream) error {
	const f = "stepgraph_copy"
	n, err := sameLen(f, []string{"src", "dst"}, src.n, dst.n)
	if err != nil {
		return err
	}
	return check(stepgraph_copy(src.ptr, dst.ptr, n, DType[T](), stream.raw), f)
}

// Advance: pos[i] += 1 where pos[i] >= 0, in place.
func Advance(pos DeviceSlice[int32], stream Stream) error {
	return check(stepgraph_advance(i32Ptr(pos), int64(pos.n), stream.raw), "stepgraph_advance")
}

// ---- rows ------------------------------------------------------------------------------

// RMSNorm of each row of x [rows, hidden] into y; weight [hidden].
func RMSNorm[T Float](x, weight, y DeviceSlice[T], rows, hidden int64, eps float32,
	stream Stream) error {
	const f = "stepgraph_rmsnorm"
	if err := checkShapes(f, shaped{"x", x.n, []int64{rows, hidden}},
		shaped{"y", y.n, []int64{rows, hidden}},
		shaped{"weight", weight.n, []int64{hidden}}); err != nil {
		return err
	}
	return check(stepgraph_rmsnorm(x.ptr, weight.ptr, y.ptr, rows, hidden, eps, DType[T](),
		stream.raw), f)
}

// Softmax of each row of x [rows, n] into y (needs compute capability 9.0).
func Softmax[T Float](x, y DeviceSlice[T], rows, n int64, stream Stream) error {
	const f = "stepgraph_softmax"
	if err := checkShapes(f, shaped{"x", x.n, []int64{rows, n}},
		shaped{"y", y.n, []int64{rows, n}}); err != nil {
		return err
	}
	return check(stepgraph_softmax(x.ptr, y.ptr, rows, n, DType[T](), stream.raw), f)
}

// MatMul: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]; bias may be the zero DeviceSlice for
// none); 1 <= m <= MatMulMaxRows.
func MatMul[T Float](x, w, bias, y DeviceSlice[T], m, n, k int64, stream Stream) error {
	const f = "stepgraph_matmul"
	list := []shaped{{"x", x.n, []int64{m, k}}, {"w", w.n, []int64{n, k}},
		{"y", y.n, []int64{m, n}}}
	if bias.ptr != nil {
		list = append(list, shaped{"bias", bias.n, []int64{n}})
	}
	if err := checkShapes(f, list...); err != nil {
		return err
	}
	return check(stepgraph_matmul(x.ptr, w.ptr, bias.ptr, y.ptr, m, n, k, DType[T](),
		stream.raw), f)
}

// Embedding: out[i, :] = table[ids[i], :]; table [vocab, hidden], out [len(ids), hidden].
func Embedding[T Float](table DeviceSlice[T], ids DeviceSlice[int32], out DeviceSlice[T],
	vocab, hidden int64, flags ErrorFlags, stream Stream) error {
	const f = "stepgraph_embedding"
	rows := int64(ids.n)
	if err := checkShapes(f, shaped{"table", table.n, []int64{vocab, hidden}},
		shaped{"out", out.n, []int64{rows, hidden}}); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_embedding(table.ptr, i32Ptr(ids), out.ptr, rows, vocab, hidden,
		DType[T](), fp, stream.raw), f)
}

// ---- RoPE, the KV cache, attention -----------------------------------------------------

// RopeScaling is the RoPE frequency scaling of RopeInvFreq: the zero value is none;
// Llama3 true takes the other fields ("rope_type": "llama3").
type RopeScaling struct {
	Llama3              bool
	Factor              float32
	LowFreqFactor       float32
	HighFreqFactor      float32
	OriginalMaxPosition int32
}

// RopeInvFreq writes the headDim / 2 RoPE inverse frequencies into the host slice invFreq
// (copy them to the device for Rope). Host only: the same in every build.
func RopeInvFreq(headDim int32, theta float32, scaling RopeScaling, invFreq []float32) error {
	const f = "stepgraph_rope_inv_freq"
	if headDim < 2 || headDim%2 != 0 {
		return invalid(f, "head_dim %d must be even and >= 2", headDim)
	}
	if err := expectLen(f, "inv_freq", len(invFreq), int(headDim/2)); err != nil {
		return err
	}
	mode := int32(C.STEPGRAPH_ROPE_SCALING_NONE)
	if scaling.Llama3 {
		mode = C.STEPGRAPH_ROPE_SCALING_LLAMA3
	}
	return check(stepgraph_rope_inv_freq(headDim, theta, mode, scaling.Factor,
		scaling.LowFreqFactor, scaling.HighFreqFactor, scaling.OriginalMaxPosition,
		&invFreq[0]), f)
}

// Rope rotates the heads of x [len(pos), cols] by each row's position into y; invFreq
// [headDim / 2] f32 on the device.
func Rope[T Float](x DeviceSlice[T], pos DeviceSlice[int32], invFreq DeviceSlice[float32],
	y DeviceSlice[T], cols, headDim int64, interleaved bool, stream Stream) error {
	const f = "stepgraph_rope"
	rows := int64(pos.n)
	if headDim < 2 || headDim%2 != 0 {
		return invalid(f, "head_dim %d must be even and >= 2", headDim)
	}
	if err := checkShapes(f, shaped{"x", x.n, []int64{rows, cols}},
		shaped{"y", y.n, []int64{rows, cols}},
		shaped{"inv_freq", invFreq.n, []int64{headDim / 2}}); err != nil {
		return err
	}
	return check(stepgraph_rope(x.ptr, i32Ptr(pos), f32Ptr(invFreq), y.ptr, rows, cols,
		headDim, boolInt(interleaved), DType[T](), stream.raw), f)
}

// CacheShape is a KV cache's shape: [Slots, KVHeads, SeqLen, HeadDim].
type CacheShape struct {
	Slots, KVHeads, SeqLen, HeadDim int64
}

func (s CacheShape) dims() []int64 { return []int64{s.Slots, s.KVHeads, s.SeqLen, s.HeadDim} }

// KVWrite stores row i of kv [len(pos), KVHeads · HeadDim] at position pos[i] of slot i of
// cache, in place.
func KVWrite[T Float](kv DeviceSlice[T], pos DeviceSlice[int32], cache DeviceSlice[T],
	shape CacheShape, flags ErrorFlags, stream Stream) error {
	const f = "stepgraph_kv_write"
	rows := int64(pos.n)
	if err := checkShapes(f, shaped{"kv", kv.n, []int64{rows, shape.KVHeads, shape.HeadDim}},
		shaped{"cache", cache.n, shape.dims()}); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_kv_write(kv.ptr, i32Ptr(pos), cache.ptr, rows, shape.Slots,
		shape.KVHeads, shape.SeqLen, shape.HeadDim, DType[T](), fp, stream.raw), f)
}

// AttentionWorkspaceBytes is the workspace with which Attention of this shape splits the
// keys as it prefers on the current device (0: it would not split).
func AttentionWorkspaceBytes(rows, heads, kvHeads, seqLen, headDim int64) (int64, error) {
	bytes := int64(-1)
	err := check(stepgraph_attention_workspace_bytes(rows, heads, kvHeads, seqLen, headDim,
		&bytes), "stepgraph_attention_workspace_bytes")
	return bytes, err
}

// Attention is decode attention of q [len(pos), heads · HeadDim] over the caches into out;
// the zero workspace runs without splitting the keys, else a 16-byte aligned device buffer
// of its length in bytes.
func Attention[T Float](q, kCache, vCache DeviceSlice[T], pos DeviceSlice[int32],
	out DeviceSlice[T], heads int64, shape CacheShape, scale float32,
	workspace DeviceSlice[byte], flags ErrorFlags, stream Stream) error {
	const f = "stepgraph_attention"
	rows := int64(pos.n)
	qDims := []int64{rows, heads, shape.HeadDim}
	if err := checkShapes(f, shaped{"q", q.n, qDims}, shaped{"out", out.n, qDims},
		shaped{"k_cache", kCache.n, shape.dims()},
		shaped{"v_cache", vCache.n, shape.dims()}); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_attention(q.ptr, kCache.ptr, vCache.ptr, i32Ptr(pos), out.ptr,
		rows, heads, shape.KVHeads, shape.Slots, shape.SeqLen, shape.HeadDim, scale,
		DType[T](), workspace.ptr, int64(workspace.n), fp, stream.raw), f)
}

// SequenceShape is FlashAttention's: q and out [Batch, Seq, Heads, HeadDim], k and v
// [Batch, Seq, KVHeads, HeadDim].
type SequenceShape struct {
	Batch, Seq, Heads, KVHeads, HeadDim int64
}

// FlashAttention is attention over whole sequences (training, prefill), causal or not.
func FlashAttention[T Float](q, k, v, out DeviceSlice[T], s SequenceShape, scale float32,
	causal bool, stream Stream) error {
	const f = "stepgraph_flash_attention"
	qDims := []int64{s.Batch, s.Seq, s.Heads, s.HeadDim}
	kDims := []int64{s.Batch, s.Seq, s.KVHeads, s.HeadDim}
	if err := checkShapes(f, shaped{"q", q.n, qDims}, shaped{"out", out.n, qDims},
		shaped{"k", k.n, kDims}, shaped{"v", v.n, kDims}); err != nil {
		return err
	}
	return check(stepgraph_flash_attention(q.ptr, k.ptr, v.ptr, out.ptr, s.Batch, s.Seq,
		s.Heads, s.KVHeads, s.HeadDim, scale, boolInt(causal), DType[T](), stream.raw), f)
}

// ---- picking ids -----------------------------------------------------------------------

// ArgmaxWorkspaceBytes is the workspace with which Argmax splits long rows on the current
// device (0: it would not).
func ArgmaxWorkspaceBytes(rows, vocab int64) (int64, error) {
	bytes := int64(-1)
	err := check(stepgraph_argmax_workspace_bytes(rows, vocab, &bytes),
		"stepgraph_argmax_workspace_bytes")
	return bytes, err
}

// Argmax: ids[i] = the lowest index of the maximum of row i of logits [len(ids), vocab];
// workspace as for Attention.
func Argmax[T Float](logits DeviceSlice[T], ids DeviceSlice[int32], vocab int64,
	workspace DeviceSlice[byte], stream Stream) error {
	const f = "stepgraph_argmax"
	rows := int64(ids.n)
	if err := checkShapes(f, shaped{"logits", logits.n, []int64{rows, vocab}}); err != nil {
		return err
	}
	return check(stepgraph_argmax(logits.ptr, i32Ptr(ids), rows, vocab, DType[T](),
		workspace.ptr, int64(workspace.n), stream.raw), f)
}

// SampleParams are Sample's: Temperature finite and > 0, TopK >= 0 (0: no limit), TopP in
// (0, 1].
type SampleParams struct {
	Temperature float32
	TopK        int32
	TopP        float32
}

// Sample draws ids[i] from row i of logits [len(ids), vocab] with (seeds[i], pos[i]): the
// same inputs give the same ids.
func Sample[T Float](logits DeviceSlice[T], seeds, pos, ids DeviceSlice[int32], vocab int64,
	p SampleParams, stream Stream) error {
	const f = "stepgraph_sample"
	rows, err := sameLen(f, []string{"ids", "seeds", "pos"}, ids.n, seeds.n, pos.n)
	if err != nil {
		return err
	}
	if err := checkShapes(f, shaped{"logits", logits.n, []int64{rows, vocab}}); err != nil {
		return err
	}
	return check(stepgraph_sample(logits.ptr, i32Ptr(seeds), i32Ptr(pos), i32Ptr(ids), rows,
		vocab, p.Temperature, p.TopK, p.TopP, DType[T](), stream.raw), f)
}

// TopK: the k largest of each row of x [rows, n], largest first, into values and indices
// [rows, k].
func TopK[T Float](x, values DeviceSlice[T], indices DeviceSlice[int32], rows, n, k int64,
	stream Stream) error {
	const f = "stepgraph_topk"
	if err := checkShapes(f, shaped{"x", x.n, []int64{rows, n}},
		shaped{"values", values.n, []int64{rows, k}},
		shaped{"indices", indices.n, []int64{rows, k}}); err != nil {
		return err
	}
	return check(stepgraph_topk(x.ptr, values.ptr, i32Ptr(indices), rows, n, k, DType[T](),
		stream.raw), f)
}

// ---- general matrix products -----------------------------------------------------------

// GemmShape is C[M, N] = Alpha · op(A) · op(B) + Beta · C: A is stored [K, M] when TransA
// (else [M, K]), B [N, K] when TransB (else [K, N]).
type GemmShape struct {
	M, N, K        int64
	TransA, TransB bool
	Alpha, Beta    float32
}

// Gemm is one product through cuBLASLt; workspace the zero DeviceSlice or a 256-byte
// aligned device buffer.
func Gemm[T Float](a, b, c DeviceSlice[T], s GemmShape, workspace DeviceSlice[byte],
	stream Stream) error {
	const f = "stepgraph_gemm"
	if err := checkShapes(f, shaped{"a", a.n, []int64{s.M, s.K}},
		shaped{"b", b.n, []int64{s.K, s.N}}, shaped{"c", c.n, []int64{s.M, s.N}}); err != nil {
		return err
	}
	return check(stepgraph_gemm(a.ptr, b.ptr, c.ptr, s.M, s.N, s.K, boolInt(s.TransA),
		boolInt(s.TransB), s.Alpha, s.Beta, DType[T](), workspace.ptr, int64(workspace.n),
		stream.raw), f)
}

// GemmBatched is batch products over dense stacks: a [batch, M·K], b [batch, K·N], c
// [batch, M·N].
func GemmBatched[T Float](a, b, c DeviceSlice[T], batch int64, s GemmShape,
	workspace DeviceSlice[byte], stream Stream) error {
	const f = "stepgraph_gemm_batched"
	if err := checkShapes(f, shaped{"a", a.n, []int64{batch, s.M, s.K}},
		shaped{"b", b.n, []int64{batch, s.K, s.N}},
		shaped{"c", c.n, []int64{batch, s.M, s.N}}); err != nil {
		return err
	}
	return check(stepgraph_gemm_batched(a.ptr, b.ptr, c.ptr, batch, s.M, s.N, s.K, s.M*s.K,
		s.K*s.N, s.M*s.N, boolInt(s.TransA), boolInt(s.TransB), s.Alpha, s.Beta, DType[T](),
		workspace.ptr, int64(workspace.n), stream.raw), f)
}

// ---- training --------------------------------------------------------------------------

// CrossEntropy: per-row losses (f32) of logits [len(targets), vocab], and the
// log-probabilities when logProbs is not the zero DeviceSlice.
func CrossEntropy[T Float](logits DeviceSlice[T], targets DeviceSlice[int32],
	loss DeviceSlice[float32], logProbs DeviceSlice[T], vocab int64, ignoreIndex int32,
	flags ErrorFlags, stream Stream) error {
	const f = "stepgraph_cross_entropy"
	rows, err := sameLen(f, []string{"targets", "loss"}, targets.n, loss.n)
	if err != nil {
		return err
	}
	list := []shaped{{"logits", logits.n, []int64{rows, vocab}}}
	if logProbs.ptr != nil {
		list = append(list, shaped{"log_probs", logProbs.n, []int64{rows, vocab}})
	}
	if err := checkShapes(f, list...); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_cross_entropy(logits.ptr, i32Ptr(targets), f32Ptr(loss),
		logProbs.ptr, rows, vocab, ignoreIndex, DType[T](), fp, stream.raw), f)
}

// CrossEntropyBackward: dlogits = dloss[i] · (softmax(logits[i]) − onehot(targets[i])).
func CrossEntropyBackward[T Float](logits DeviceSlice[T], targets DeviceSlice[int32],
	dloss DeviceSlice[float32], dlogits DeviceSlice[T], vocab int64, ignoreIndex int32,
	flags ErrorFlags, stream Stream) error {
	const f = "stepgraph_cross_entropy_backward"
	rows, err := sameLen(f, []string{"targets", "dloss"}, targets.n, dloss.n)
	if err != nil {
		return err
	}
	if err := checkShapes(f, shaped{"logits", logits.n, []int64{rows, vocab}},
		shaped{"dlogits", dlogits.n, []int64{rows, vocab}}); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_cross_entropy_backward(logits.ptr, i32Ptr(targets), f32Ptr(dloss),
		dlogits.ptr, rows, vocab, ignoreIndex, DType[T](), fp, stream.raw), f)
}

// MoEAuxLoss is the load-balancing loss (one f32) of routerProbs [tokens, experts] and
// expertIDs [tokens, topK].
func MoEAuxLoss[T Float](routerProbs DeviceSlice[T], expertIDs DeviceSlice[int32],
	loss DeviceSlice[float32], tokens, experts, topK int64, flags ErrorFlags,
	stream Stream) error {
	const f = "stepgraph_moe_aux_loss"
	if err := checkShapes(f, shaped{"router_probs", routerProbs.n, []int64{tokens, experts}},
		shaped{"expert_ids", expertIDs.n, []int64{tokens, topK}},
		shaped{"loss", loss.n, []int64{1}}); err != nil {
		return err
	}
	fp, err := flagsPtr(f, flags)
	if err != nil {
		return err
	}
	return check(stepgraph_moe_aux_loss(routerProbs.ptr, i32Ptr(expertIDs), f32Ptr(loss),
		tokens, experts, topK, DType[T](), fp, stream.raw), f)
}

// AdamW holds torch.optim.AdamW's hyperparameters; DefaultAdamW has its defaults.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
}

var DefaultAdamW = AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2}

// AdamWStep is step number step (from 1) of AdamW over f32 parameters and moments, in
// place, with a gradient of dtype G.
func AdamWStep[G Float](param DeviceSlice[float32], grad DeviceSlice[G],
	expAvg, expAvgSq DeviceSlice[float32], h AdamW, step int64, stream Stream) error {
	const f = "stepgraph_adamw_step"
	n, err := sameLen(f, []string{"param", "grad", "exp_avg", "exp_avg_sq"}, param.n, grad.n,
		expAvg.n, expAvgSq.n)
	if err != nil {
		return err
	}
	return check(stepgraph_adamw_step(f32Ptr(param), grad.ptr, f32Ptr(expAvg),
		f32Ptr(expAvgSq), n, h.LR, h.Beta1, h.Beta2, h.Eps, h.WeightDecay, step, DType[G](),
		stream.raw), f)
}

// ClipGradNorm scales the buffers in place so that their global L2 norm is at most
// maxNorm; the norm before clipping goes to totalNorm (one f32 on the device).
func ClipGradNorm[T Float](grads []DeviceSlice[T], maxNorm float32,
	totalNorm DeviceSlice[float32], stream Stream) error {
	const f = "stepgraph_clip_grad_norm"
	if err := expectLen(f, "total_norm", totalNorm.n, 1); err != nil {
		return err
	}
	if len(grads) == 0 || len(grads) > ClipMaxBuffers {
		return invalid(f, "%d buffers, not 1 to %d", len(grads), ClipMaxBuffers)
	}
	ptrs := make([]unsafe.Pointer, len(grads))
	sizes := make([]int64, len(grads))
	for i, g := range grads {
		ptrs[i], sizes[i] = g.ptr, int64(g.n)
	}
	list := cPointers(ptrs)
	if list == nil {
		return &Error{Code: C.STEPGRAPH_ERROR_OUT_OF_MEMORY, Func: f,
			Message: "the host array of buffer pointers"}
	}
	defer freeC(unsafe.Pointer(list))
	return check(stepgraph_clip_grad_norm(list, &sizes[0], int64(len(grads)), maxNorm,
		DType[T](), f32Ptr(totalNorm), stream.raw), f)
}
