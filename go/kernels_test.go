// The kernel wrappers: each against its Go definition (reference_test.go) on random inputs
// where a device runs it, and answering ErrNotAvailable with its outputs untouched where
// none does (harness_test.go); lengths refused before any call, and the library's own
// argument checks reaching Go as ErrInvalidArgument in every build.
package stepgraph

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
	"unsafe"
)

const f32Tol = 1e-5

func TestElementwise(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(1))
	const n = 1000
	a, b := uniform(rng, n, -3, 3), uniform(rng, n, -3, 3)
	want := map[string]func(x, y float64) float64{
		"add":      func(x, y float64) float64 { return x + y },
		"mul":      func(x, y float64) float64 { return x * y },
		"silu":     func(x, _ float64) float64 { return silu(x) },
		"silu_mul": func(x, y float64) float64 { return silu(x) * y },
		"scale":    func(x, _ float64) float64 { return x * float64(float32(-1.75)) },
	}
	for name, call := range map[string]func(a, b, y DeviceSlice[float32]) error{
		"add":      func(a, b, y DeviceSlice[float32]) error { return Add(a, b, y, Stream{}) },
		"mul":      func(a, b, y DeviceSlice[float32]) error { return Mul(a, b, y, Stream{}) },
		"silu":     func(a, _, y DeviceSlice[float32]) error { return SiLU(a, y, Stream{}) },
		"silu_mul": func(a, b, y DeviceSlice[float32]) error { return SiLUMul(a, b, y, Stream{}) },
		"scale": func(a, _, y DeviceSlice[float32]) error {
			return Scale(a, y, -1.75, Stream{})
		},
	} {
		y := poisoned(n)
		if r.done(name, call(in(r, a), in(r, b), out(r, y))) {
			ref := make([]float64, n)
			for i := range ref {
				ref[i] = want[name](float64(a[i]), float64(b[i]))
			}
			closeTo(t, name, y, ref, f32Tol)
		}
	}
	// int32 wraps.
	ia := []int32{math.MaxInt32, -5, 7, math.MinInt32}
	ib := []int32{1, 9, -7, -1}
	iy := poisonedIDs(4)
	if r.done("add i32", Add(in(r, ia), in(r, ib), out(r, iy), Stream{})) {
		equalIDs(t, "add i32", iy, []int32{math.MinInt32, 4, 0, math.MaxInt32})
	}
	// copy of every dtype, advance of live positions only.
	src := uniform(rng, 77, -9, 9)
	dst := poisoned(77)
	if r.done("copy", Copy(in(r, src), out(r, dst), Stream{})) {
		closeTo(t, "copy", dst, f64s(src), 0)
	}
	isrc := []int32{3, -1, 1 << 30}
	idst := poisonedIDs(3)
	if r.done("copy i32", Copy(in(r, isrc), out(r, idst), Stream{})) {
		equalIDs(t, "copy i32", idst, isrc)
	}
	pos := []int32{-1, 0, 5, math.MaxInt32 - 1, -9}
	if r.done("advance", Advance(out(r, pos), Stream{})) {
		equalIDs(t, "advance", pos, []int32{-1, 1, 6, math.MaxInt32, -9})
	}
}

func TestRowKernels(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(2))
	rows, hidden := 3, 257
	x, w := uniform(rng, rows*hidden, -2, 2), uniform(rng, hidden, 0.5, 1.5)
	y := poisoned(rows * hidden)
	if r.done("rmsnorm", RMSNorm(in(r, x), in(r, w), out(r, y), int64(rows), int64(hidden),
		1e-5, Stream{})) {
		identity := func(v float64) float64 { return float64(float32(v)) }
		closeTo(t, "rmsnorm", y, rmsnormRef(x, w, rows, hidden, 1e-5, identity), f32Tol)
	}
	sx := uniform(rng, 4*1000, -8, 8)
	sy := poisoned(len(sx))
	if r.done("softmax", Softmax(in(r, sx), out(r, sy), 4, 1000, Stream{})) {
		closeTo(t, "softmax", sy, softmaxRef(sx, 4, 1000), f32Tol)
	}
	for _, withBias := range []bool{false, true} {
		m, n, k := 5, 33, 130
		xm, wm := uniform(rng, m*k, -1, 1), uniform(rng, n*k, -1, 1)
		var bias []float32
		var dbias DeviceSlice[float32]
		if withBias {
			bias = uniform(rng, n, -1, 1)
			dbias = in(r, bias)
		}
		ym := poisoned(m * n)
		if r.done("matmul", MatMul(in(r, xm), in(r, wm), dbias, out(r, ym), int64(m),
			int64(n), int64(k), Stream{})) {
			closeTo(t, "matmul", ym, matmulRef(xm, wm, bias, m, n, k), f32Tol)
		}
	}
	vocab, dim := 50, 16
	table := uniform(rng, vocab*dim, -1, 1)
	ids := []int32{3, 49, 0, 50, -1, 17} // 50 and -1: zero rows and the token flag
	emb := poisoned(len(ids) * dim)
	fl, word := flags(r)
	if r.done("embedding", Embedding(in(r, table), in(r, ids), out(r, emb), int64(vocab),
		int64(dim), fl, Stream{})) {
		want := make([]float64, len(emb))
		for i, id := range ids {
			if id >= 0 && int(id) < vocab {
				copy(want[i*dim:], f64s(table[int(id)*dim:(int(id)+1)*dim]))
			}
		}
		closeTo(t, "embedding", emb, want, 0)
		if *word != FlagTokenOutOfRange {
			t.Errorf("embedding flags %#x", *word)
		}
	}
}

func TestRopeKVWriteAttention(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(3))
	const d, heads, rows = 16, 3, 6
	inv := make([]float32, d/2)
	if err := RopeInvFreq(d, 10000, RopeScaling{}, inv); err != nil {
		t.Fatal(err)
	}
	for _, interleaved := range []bool{false, true} {
		x := uniform(rng, rows*heads*d, -2, 2)
		pos := []int32{0, 7, -1, 3999, 12, 1}
		y := poisoned(len(x))
		if r.done("rope", Rope(in(r, x), in(r, pos), in(r, inv), out(r, y), heads*d, d,
			interleaved, Stream{})) {
			closeTo(t, "rope", y, ropeRef(x, pos, inv, heads*d, d, interleaved), f32Tol)
		}
	}
	shape := CacheShape{Slots: 4, KVHeads: 2, SeqLen: 40, HeadDim: 32}
	cacheLen := int(shape.Slots * shape.KVHeads * shape.SeqLen * shape.HeadDim)
	kc, vc := uniform(rng, cacheLen, -1, 1), uniform(rng, cacheLen, -1, 1)
	kv := uniform(rng, 3*2*32, -1, 1)
	pos := []int32{5, -1, 40} // a live row, padding, and one past seq_len
	fl, word := flags(r)
	written := append([]float32(nil), kc...)
	if r.done("kv_write", KVWrite(in(r, kv), in(r, pos), out(r, written), shape, fl,
		Stream{})) {
		want, wantFlags := kvWriteRef(kv, pos, kc, shape)
		closeTo(t, "kv_write", written, want, 0)
		if *word != wantFlags {
			t.Errorf("kv_write flags %#x, want %#x", *word, wantFlags)
		}
	}
	bytes, err := AttentionWorkspaceBytes(4, 8, 2, 40, 32)
	if r.done("attention_workspace_bytes", err) && bytes < 0 {
		t.Errorf("workspace of %d bytes", bytes)
	}
	qHeads := int64(8)
	q := uniform(rng, 4*int(qHeads)*32, -1, 1)
	apos := []int32{0, 39, -1, 40} // padding gives zeros; 40 too, and the position flag
	for _, split := range []bool{false, true} {
		var ws DeviceSlice[byte]
		if split && r.device && bytes > 0 {
			ws = in(r, make([]byte, bytes))
		}
		o := poisoned(len(q))
		fl, word := flags(r)
		if r.done("attention", Attention(in(r, q), in(r, kc), in(r, vc), in(r, apos), out(r, o),
			qHeads, shape, float32(1/math.Sqrt(32)), ws, fl, Stream{})) {
			want, wantFlags := attentionRef(q, kc, vc, apos, int(qHeads), shape,
				float32(1/math.Sqrt(32)))
			closeTo(t, "attention", o, want, f32Tol)
			if *word != wantFlags {
				t.Errorf("attention flags %#x", *word)
			}
		}
	}
}

func TestFlashAttention(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(4))
	s := SequenceShape{Batch: 2, Seq: 19, Heads: 4, KVHeads: 2, HeadDim: 24}
	qn := int(s.Batch * s.Seq * s.Heads * s.HeadDim)
	kn := int(s.Batch * s.Seq * s.KVHeads * s.HeadDim)
	q, k, v := uniform(rng, qn, -1, 1), uniform(rng, kn, -1, 1), uniform(rng, kn, -1, 1)
	for _, causal := range []bool{true, false} {
		o := poisoned(qn)
		if r.done("flash_attention", FlashAttention(in(r, q), in(r, k), in(r, v), out(r, o), s,
			0.3, causal, Stream{})) {
			closeTo(t, "flash_attention", o, flashRef(q, k, v, s, 0.3, causal), f32Tol)
		}
	}
}

func TestArgmaxTopKSample(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(5))
	rows, vocab := 5, 3000
	x := uniform(rng, rows*vocab, -4, 4)
	x[1*vocab+10], x[1*vocab+2000] = 9, 9 // a tie: the lower index
	x[2*vocab+5] = float32(math.NaN())    // NaN never wins
	for j := 0; j < vocab; j++ {
		x[3*vocab+j] = float32(math.Inf(-1)) // a row of -inf gives 0
	}
	bytes, err := ArgmaxWorkspaceBytes(int64(rows), int64(vocab))
	r.done("argmax_workspace_bytes", err)
	for _, split := range []bool{false, true} {
		var ws DeviceSlice[byte]
		if split && r.device && bytes > 0 {
			ws = in(r, make([]byte, bytes))
		}
		ids := poisonedIDs(rows)
		if r.done("argmax", Argmax(in(r, x), out(r, ids), int64(vocab), ws, Stream{})) {
			equalIDs(t, "argmax", ids, argmaxRef(x, rows, vocab))
		}
	}
	// top-k: NaN first, then largest, ties by index.
	k := 7
	tx := uniform(rng, rows*vocab, -4, 4)
	tx[2*vocab+17] = float32(math.NaN())
	tx[4*vocab+3], tx[4*vocab+1500] = 8, 8
	values, indices := poisoned(rows*k), poisonedIDs(rows*k)
	if r.done("topk", TopK(in(r, tx), out(r, values), out(r, indices), int64(rows),
		int64(vocab), int64(k), Stream{})) {
		for row := 0; row < rows; row++ {
			order := topkOrder(tx[row*vocab : (row+1)*vocab])[:k]
			for j, idx := range order {
				got, want := values[row*k+j], tx[row*vocab+idx]
				bothNaN := got != got && want != want
				if indices[row*k+j] != int32(idx) || (got != want && !bothNaN) {
					t.Fatalf("topk row %d: %v %v, want %v", row, indices[row*k:(row+1)*k],
						values[row*k:(row+1)*k], order)
				}
			}
		}
	}
	// sampling: the draw of (seed, pos) over the kept ids in index order.
	for _, p := range []SampleParams{{1, 0, 1}, {0.7, 20, 1}, {1.3, 0, 0.8}, {0.5, 1, 1}} {
		srows, svocab := 12, 50
		logits := uniform(rng, srows*svocab, -2, 2)
		seeds, pos := make([]int32, srows), make([]int32, srows)
		for i := range seeds {
			seeds[i], pos[i] = int32(rng.Uint32()), int32(rng.Intn(10000))
		}
		ids := poisonedIDs(srows)
		if !r.done("sample", Sample(in(r, logits), in(r, seeds), in(r, pos), out(r, ids),
			int64(svocab), p, Stream{})) {
			continue
		}
		for i := 0; i < srows; i++ {
			kept, cum := sampleKept(logits[i*svocab:(i+1)*svocab], p)
			target := sampleUniform(seeds[i], pos[i]) * cum[len(cum)-1]
			slack := 1e-5 * cum[len(cum)-1] // f32 sums on the device
			ok := false
			for j, id := range kept {
				lo := 0.0
				if j > 0 {
					lo = cum[j-1]
				}
				if int32(id) == ids[i] && lo-slack <= target && target <= cum[j]+slack {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("sample %+v row %d: id %d is not the draw %g over %v (cum %v)", p, i,
					ids[i], target, kept, cum)
			}
		}
		if p.TopK == 1 {
			equalIDs(t, "sample top_k 1", ids, argmaxRef(logits, srows, svocab))
		}
	}
}

func TestGemm(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(6))
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			s := GemmShape{M: 17, N: 40, K: 23, TransA: ta, TransB: tb, Alpha: 0.5, Beta: -2}
			a := uniform(rng, int(s.M*s.K), -1, 1)
			b := uniform(rng, int(s.K*s.N), -1, 1)
			c := uniform(rng, int(s.M*s.N), -1, 1)
			got := append([]float32(nil), c...)
			if r.done("gemm", Gemm(in(r, a), in(r, b), out(r, got), s, DeviceSlice[byte]{},
				Stream{})) {
				closeTo(t, "gemm", got, gemmRef(a, b, c, s), f32Tol)
			}
		}
	}
	s := GemmShape{M: 6, N: 9, K: 11, TransB: true, Alpha: 1}
	batch := 3
	a := uniform(rng, batch*int(s.M*s.K), -1, 1)
	b := uniform(rng, batch*int(s.K*s.N), -1, 1)
	c := poisoned(batch * int(s.M*s.N)) // beta 0: only written
	if r.done("gemm_batched", GemmBatched(in(r, a), in(r, b), out(r, c), int64(batch), s,
		DeviceSlice[byte]{}, Stream{})) {
		var want []float64
		for i := 0; i < batch; i++ {
			ma, mb := int(s.M*s.K), int(s.K*s.N)
			want = append(want, gemmRef(a[i*ma:(i+1)*ma], b[i*mb:(i+1)*mb], nil, s)...)
		}
		closeTo(t, "gemm_batched", c, want, f32Tol)
	}
}

func TestTraining(t *testing.T) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(7))
	rows, vocab := 6, 300
	logits := uniform(rng, rows*vocab, -5, 5)
	targets := []int32{4, -100, 299, 300, 0, 17} // ignored, and one out of range
	loss, lp := poisoned(rows), poisoned(rows*vocab)
	fl, word := flags(r)
	if r.done("cross_entropy", CrossEntropy(in(r, logits), in(r, targets), out(r, loss),
		out(r, lp), int64(vocab), -100, fl, Stream{})) {
		wantLoss, wantLP, wantFlags := crossEntropyRef(logits, targets, vocab, -100)
		closeTo(t, "cross_entropy loss", loss, wantLoss, f32Tol)
		closeTo(t, "cross_entropy log_probs", lp, wantLP, f32Tol)
		if *word != wantFlags {
			t.Errorf("cross_entropy flags %#x", *word)
		}
	}
	dloss := uniform(rng, rows, 0.1, 1)
	dlogits := poisoned(rows * vocab)
	fl, word = flags(r)
	if r.done("cross_entropy_backward", CrossEntropyBackward(in(r, logits), in(r, targets),
		in(r, dloss), out(r, dlogits), int64(vocab), -100, fl, Stream{})) {
		want, wantFlags := crossEntropyBackwardRef(logits, targets, dloss, vocab, -100)
		closeTo(t, "cross_entropy_backward", dlogits, want, f32Tol)
		if *word != wantFlags {
			t.Errorf("cross_entropy_backward flags %#x", *word)
		}
	}
	tokens, experts, topK := 10, 8, 2
	probs := uniform(rng, tokens*experts, 0, 1)
	eids := make([]int32, tokens*topK)
	for i := range eids {
		eids[i] = int32(rng.Intn(experts))
	}
	eids[3] = int32(experts) // not counted; raises the flag
	aux := poisoned(1)
	fl, word = flags(r)
	if r.done("moe_aux_loss", MoEAuxLoss(in(r, probs), in(r, eids), out(r, aux),
		int64(tokens), int64(experts), int64(topK), fl, Stream{})) {
		want, wantFlags := moeAuxLossRef(probs, eids, tokens, experts)
		closeTo(t, "moe_aux_loss", aux, []float64{want}, f32Tol)
		if *word != wantFlags {
			t.Errorf("moe_aux_loss flags %#x", *word)
		}
	}
	n := 1000
	param, grad := uniform(rng, n, -1, 1), uniform(rng, n, -1, 1)
	m, v := uniform(rng, n, -0.1, 0.1), uniform(rng, n, 0, 0.01)
	p2, m2, v2 := append([]float32(nil), param...), append([]float32(nil), m...),
		append([]float32(nil), v...)
	h := AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	if r.done("adamw_step", AdamWStep(out(r, p2), in(r, grad), out(r, m2), out(r, v2), h, 3,
		Stream{})) {
		wp, wm, wv := adamwRef(param, grad, m, v, h, 3)
		closeTo(t, "adamw param", p2, wp, f32Tol)
		closeTo(t, "adamw exp_avg", m2, wm, f32Tol)
		closeTo(t, "adamw exp_avg_sq", v2, wv, f32Tol)
	}
	// Two buffers whose joint norm is over max_norm: both scaled by the same factor.
	g1, g2 := uniform(rng, 300, -1, 1), uniform(rng, 77, -1, 1)
	c1, c2 := append([]float32(nil), g1...), append([]float32(nil), g2...)
	norm := poisoned(1)
	if r.done("clip_grad_norm", ClipGradNorm([]DeviceSlice[float32]{out(r, c1), out(r, c2)},
		1.5, out(r, norm), Stream{})) {
		var ss float64
		for _, x := range append(append([]float32(nil), g1...), g2...) {
			ss += float64(x) * float64(x)
		}
		total := math.Sqrt(ss)
		coef := math.Min(1, 1.5/(total+1e-6))
		closeTo(t, "clip_grad_norm total", norm, []float64{total}, f32Tol)
		scaled := func(g []float32) []float64 {
			out := f64s(g)
			for i := range out {
				out[i] *= coef
			}
			return out
		}
		closeTo(t, "clip_grad_norm 1", c1, scaled(g1), f32Tol)
		closeTo(t, "clip_grad_norm 2", c2, scaled(g2), f32Tol)
	}
}

// The half dtypes reach the kernels as such: inputs rounded to the type, outputs compared
// with the f32 math of those inputs.
func TestHalfDtypes(t *testing.T) {
	t.Run("bf16", func(t *testing.T) { halfCase[BF16](t, 1e-2) })
	t.Run("f16", func(t *testing.T) { halfCase[F16](t, 2e-3) })
}

func halfCase[T Float](t *testing.T, tol float64) {
	r := newRun(t)
	rng := rand.New(rand.NewSource(8))
	n := 500
	a, b := toFloat[T](uniform(rng, n, -3, 3)), toFloat[T](uniform(rng, n, -3, 3))
	af, bf := f64s(fromFloat(a)), f64s(fromFloat(b))
	y := toFloat[T](poisoned(n))
	if r.done("add", Add(in(r, a), in(r, b), out(r, y), Stream{})) {
		want := make([]float64, n)
		for i := range want {
			want[i] = af[i] + bf[i]
		}
		closeTo(t, "add", fromFloat(y), want, tol)
	}
	y = toFloat[T](poisoned(n))
	if r.done("silu_mul", SiLUMul(in(r, a), in(r, b), out(r, y), Stream{})) {
		want := make([]float64, n)
		for i := range want {
			want[i] = silu(af[i]) * bf[i]
		}
		closeTo(t, "silu_mul", fromFloat(y), want, tol)
	}
	m, k, nn := 2, 64, 20
	x, w := toFloat[T](uniform(rng, m*k, -1, 1)), toFloat[T](uniform(rng, nn*k, -1, 1))
	ym := toFloat[T](poisoned(m * nn))
	if r.done("matmul", MatMul(in(r, x), in(r, w), DeviceSlice[T]{}, out(r, ym), int64(m),
		int64(nn), int64(k), Stream{})) {
		closeTo(t, "matmul", fromFloat(ym), matmulRef(fromFloat(x), fromFloat(w), nil, m, nn, k),
			tol)
	}
}

// ---- refusals, in every build ------------------------------------------------------------

// host wraps host memory, for calls that must be refused before anything is launched.
func host[T any](v []T) DeviceSlice[T] {
	return NewDeviceSlice[T](unsafe.Pointer(&v[0]), len(v))
}

func isInvalid(t *testing.T, what string, err error, mention string) {
	t.Helper()
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("%s: %v, want ErrInvalidArgument", what, err)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Fatalf("%s: %q does not mention %q", what, err, mention)
	}
}

func TestLengthsAreCheckedBeforeTheCall(t *testing.T) {
	a, b, y := []float32{1.5, -2, 3.25}, []float32{0.5, 4}, poisoned(3)
	isInvalid(t, "add", Add(host(a), host(b), host(y), Stream{}), "b has 2 elements")
	isInvalid(t, "silu", SiLU(host(a), host(y[:2]), Stream{}), "y has 2")
	x, w, o := make([]float32, 6), make([]float32, 3), make([]float32, 6)
	isInvalid(t, "rmsnorm", RMSNorm(host(x), host(w), host(o), 3, 2, 1e-5, Stream{}), "weight")
	isInvalid(t, "rmsnorm", RMSNorm(host(x), host(w), host(o), 0, 3, 1e-5, Stream{}),
		"not positive")
	ids, table, emb := []int32{3, 1}, make([]float32, 8), make([]float32, 4)
	two := []uint32{0, 0}
	isInvalid(t, "embedding", Embedding(host(table), host(ids), host(emb), 4, 2, host(two),
		Stream{}), "error_flags")
	one := []uint32{0}
	isInvalid(t, "embedding", Embedding(host(table), host(ids), host(emb[:3]), 4, 2, host(one),
		Stream{}), "out has 3")
	q, cache, pos := make([]float32, 8), make([]float32, 2*2*4*2), []int32{0, 0}
	shape := CacheShape{Slots: 2, KVHeads: 2, SeqLen: 4, HeadDim: 2}
	// q needs rows 2 × heads 4 × head_dim 2 = 16 elements.
	isInvalid(t, "attention", Attention(host(q), host(cache), host(cache), host(pos), host(q),
		4, shape, 0.5, DeviceSlice[byte]{}, host(one), Stream{}), "q has 8")
	isInvalid(t, "softmax", Softmax(host(a), host(y), math.MaxInt64/2, 4, Stream{}),
		"more than")
	isInvalid(t, "rope", Rope(host(a), host([]int32{0}), host(w), host(y), 3, 3, false,
		Stream{}), "head_dim 3")
	isInvalid(t, "rope_inv_freq", RopeInvFreq(32, 10000, RopeScaling{}, make([]float32, 15)),
		"inv_freq")
	isInvalid(t, "topk", TopK(host(make([]float32, 20)), host(make([]float32, 6)),
		host(make([]int32, 5)), 2, 10, 3, Stream{}), "indices")
	gs := GemmShape{M: 2, N: 3, K: 4, TransB: true, Alpha: 1}
	isInvalid(t, "gemm", Gemm(host(make([]float32, 8)), host(make([]float32, 11)),
		host(make([]float32, 6)), gs, DeviceSlice[byte]{}, Stream{}), "b has 11")
	fs := SequenceShape{Batch: 1, Seq: 4, Heads: 4, KVHeads: 2, HeadDim: 8}
	fq, fkv := make([]float32, 128), make([]float32, 63)
	isInvalid(t, "flash_attention", FlashAttention(host(fq), host(fkv), host(fkv), host(fq), fs,
		0.35, true, Stream{}), "k has 63")
	lg, tg, ls := make([]float32, 12), []int32{1, 2, 3}, make([]float32, 3)
	isInvalid(t, "cross_entropy", CrossEntropy(host(lg), host(tg), host(ls), DeviceSlice[float32]{},
		5, -100, host(one), Stream{}), "logits has 12")
	p4, g4, m4, v3 := make([]float32, 4), make([]float32, 4), make([]float32, 4), make([]float32, 3)
	isInvalid(t, "adamw_step", AdamWStep(host(p4), host(g4), host(m4), host(v3), DefaultAdamW, 1,
		Stream{}), "exp_avg_sq")
	norm := make([]float32, 1)
	isInvalid(t, "clip_grad_norm", ClipGradNorm([]DeviceSlice[float32]{}, 1, host(norm),
		Stream{}), "0 buffers")
	isInvalid(t, "moe_aux_loss", MoEAuxLoss(host(make([]float32, 8)), host([]int32{0, 1, 2, 3}),
		host(norm), 2, 4, 3, host(one), Stream{}), "expert_ids")
	isInvalid(t, "sample", Sample(host(make([]float32, 8)), host([]int32{1}), host([]int32{0, 0}),
		host([]int32{0, 0}), 4, SampleParams{1, 0, 1}, Stream{}), "seeds")
	if !strings.Contains(Add(host(a), host(b), host(y), Stream{}).Error(), "stepgraph_add") {
		t.Error("the error does not name the function")
	}
	for i, v := range y {
		if v == v {
			t.Fatalf("y[%d] was written", i)
		}
	}
}

// Lengths that agree leave the library's checks: a bad parameter is refused by the library
// itself, in every build, with or without a device.
func TestTheLibraryChecksTheRest(t *testing.T) {
	x, w, y := []float32{0.25, 1, -0.5, 2}, []float32{1, 0.5}, poisoned(4)
	isInvalid(t, "rmsnorm eps NaN", RMSNorm(host(x), host(w), host(y), 2, 2,
		float32(math.NaN()), Stream{}), "stepgraph_rmsnorm")
	xs, wide, out := make([]float32, 9*2), make([]float32, 9*2), make([]float32, 2*9)
	isInvalid(t, "matmul m 9", MatMul(host(xs), host(wide), DeviceSlice[float32]{}, host(out), 9,
		2, 2, Stream{}), "stepgraph_matmul")
	logits, two := make([]float32, 8), []int32{1, 2}
	isInvalid(t, "sample temperature 0", Sample(host(logits), host(two), host(two), host(two), 4,
		SampleParams{Temperature: 0, TopP: 1}, Stream{}), "stepgraph_sample")
	p4 := []float32{1, 1, 1, 1}
	isInvalid(t, "adamw step 0", AdamWStep(host(p4), host(p4), host(p4), host(p4), DefaultAdamW,
		0, Stream{}), "stepgraph_adamw_step")
	norm := make([]float32, 1)
	g := []float32{1, 2, 3}
	isInvalid(t, "clip max_norm NaN", ClipGradNorm([]DeviceSlice[float32]{host(g)},
		float32(math.NaN()), host(norm), Stream{}), "stepgraph_clip_grad_norm")
	isInvalid(t, "topk k > n", TopK(host(make([]float32, 20)), host(make([]float32, 22)),
		host(make([]int32, 22)), 2, 10, 11, Stream{}), "stepgraph_topk")
	isInvalid(t, "rope_inv_freq theta", RopeInvFreq(32, 1e-45, RopeScaling{},
		make([]float32, 16)), "stepgraph_rope_inv_freq")
	bad := RopeScaling{Llama3: true, Factor: 8, LowFreqFactor: 4, HighFreqFactor: 1,
		OriginalMaxPosition: 8192}
	isInvalid(t, "rope_inv_freq llama3", RopeInvFreq(32, 500000, bad, make([]float32, 16)),
		"stepgraph_rope_inv_freq")
	if errors.Is(Add(host(x), host(x), host(y), Stream{}), ErrInvalidArgument) {
		t.Error("a valid call was refused")
	}
}

// Host only: the same in every build.
func TestRopeInvFreqIsThetaToTheMinusTwoIOverD(t *testing.T) {
	f := poisoned(16)
	if err := RopeInvFreq(32, 10000, RopeScaling{}, f); err != nil {
		t.Fatal(err)
	}
	for i, v := range f {
		want := 1 / math.Pow(10000, 2*float64(i)/32)
		if math.Abs(float64(v)-want) > 1e-6*want {
			t.Fatalf("%d: %g, want %g", i, v, want)
		}
	}
	// Llama 3's scaling: the high frequencies stay, the low ones divide by factor, those
	// between are blended (Hugging Face's _compute_llama3_parameters).
	l3 := RopeScaling{Llama3: true, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4,
		OriginalMaxPosition: 8192}
	g := poisoned(64)
	if err := RopeInvFreq(128, 500000, l3, g); err != nil {
		t.Fatal(err)
	}
	for i, v := range g {
		base := 1 / math.Pow(500000, 2*float64(i)/128)
		wavelen := 2 * math.Pi / base
		want := base
		switch {
		case wavelen > 8192/1.0:
			want = base / 8
		case wavelen >= 8192/4.0:
			smooth := (8192/wavelen - 1) / (4 - 1)
			want = (1-smooth)*base/8 + smooth*base
		}
		if math.Abs(float64(v)-want) > 1e-5*want {
			t.Fatalf("llama3 %d: %g, want %g", i, v, want)
		}
	}
}
