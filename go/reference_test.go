// The kernels' definitions in Go (float64 math, from c_api.h), against which the kernel
// tests compare what the library computes. Independent of the library's code.
package stepgraph

import (
	"math"
	"sort"
)

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

func softmaxRef(x []float32, rows, n int) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := f64s(x[r*n : (r+1)*n])
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		var sum float64
		for j, v := range row {
			out[r*n+j] = math.Exp(v - m)
			sum += out[r*n+j]
		}
		for j := range row {
			out[r*n+j] /= sum
		}
	}
	return out
}

// rmsnormRef rounds the normalised row to the storage type before the weight, as Hugging
// Face does (round is that rounding; the identity for f32 math).
func rmsnormRef(x, w []float32, rows, hidden int, eps float32,
	round func(float64) float64) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := f64s(x[r*hidden : (r+1)*hidden])
		var ss float64
		for _, v := range row {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(hidden)+float64(eps))
		for j, v := range row {
			out[r*hidden+j] = round(v*inv) * float64(w[j])
		}
	}
	return out
}

func matmulRef(x, w, bias []float32, m, n, k int) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				s += float64(x[i*k+l]) * float64(w[j*k+l])
			}
			if bias != nil {
				s += float64(bias[j])
			}
			out[i*n+j] = s
		}
	}
	return out
}

// ropeRef turns each pair of every head of row i by the angle pos[i] · inv_freq[j], the
// product taken in f32 as Hugging Face does.
func ropeRef(x []float32, pos []int32, invFreq []float32, cols, d int,
	interleaved bool) []float64 {
	out := f64s(x)
	half := d / 2
	for i, p := range pos {
		if p < 0 {
			continue
		}
		for h := 0; h < cols/d; h++ {
			base := i*cols + h*d
			for j := 0; j < half; j++ {
				a, b := base+j, base+j+half
				if interleaved {
					a, b = base+2*j, base+2*j+1
				}
				angle := float64(float32(p) * invFreq[j])
				c, s := math.Cos(angle), math.Sin(angle)
				xa, xb := float64(x[a]), float64(x[b])
				out[a], out[b] = xa*c-xb*s, xb*c+xa*s
			}
		}
	}
	return out
}

// liveRows are the rows whose position lies in the cache, and the flags of the others: a
// negative position is padding (skipped quietly), one at or past seq_len raises the
// position flag, as the kernels do.
func liveRows(pos []int32, seq int) (live []int, flags uint32) {
	for i, p := range pos {
		switch {
		case int(p) >= seq:
			flags |= FlagPositionOutOfRange
		case p >= 0:
			live = append(live, i)
		}
	}
	return live, flags
}

// kvWriteRef stores row i of kv at position pos[i] of slot i.
func kvWriteRef(kv []float32, pos []int32, cache []float32, s CacheShape) ([]float64, uint32) {
	out := f64s(cache)
	kvh, seq, d := int(s.KVHeads), int(s.SeqLen), int(s.HeadDim)
	live, flags := liveRows(pos, seq)
	for _, i := range live {
		for h := 0; h < kvh; h++ {
			for j := 0; j < d; j++ {
				out[((i*kvh+h)*seq+int(pos[i]))*d+j] = float64(kv[(i*kvh+h)*d+j])
			}
		}
	}
	return out, flags
}

func attentionRef(q, kc, vc []float32, pos []int32, heads int, s CacheShape,
	scale float32) ([]float64, uint32) {
	kvh, seq, d := int(s.KVHeads), int(s.SeqLen), int(s.HeadDim)
	group := heads / kvh
	out := make([]float64, len(q))
	live, flags := liveRows(pos, seq)
	for _, i := range live {
		n := int(pos[i]) + 1
		for h := 0; h < heads; h++ {
			g := h / group
			qh := q[(i*heads+h)*d : (i*heads+h+1)*d]
			scores := make([]float64, n)
			m := math.Inf(-1)
			for t := 0; t < n; t++ {
				kt := kc[((i*kvh+g)*seq+t)*d:]
				var dot float64
				for j := 0; j < d; j++ {
					dot += float64(qh[j]) * float64(kt[j])
				}
				scores[t] = dot * float64(scale)
				m = math.Max(m, scores[t])
			}
			var sum float64
			for t := range scores {
				scores[t] = math.Exp(scores[t] - m)
				sum += scores[t]
			}
			for t := 0; t < n; t++ {
				vt := vc[((i*kvh+g)*seq+t)*d:]
				for j := 0; j < d; j++ {
					out[(i*heads+h)*d+j] += scores[t] / sum * float64(vt[j])
				}
			}
		}
	}
	return out, flags
}

func flashRef(q, k, v []float32, s SequenceShape, scale float32, causal bool) []float64 {
	b, seq, heads, kvh, d := int(s.Batch), int(s.Seq), int(s.Heads), int(s.KVHeads),
		int(s.HeadDim)
	group := heads / kvh
	out := make([]float64, len(q))
	for bi := 0; bi < b; bi++ {
		for i := 0; i < seq; i++ {
			for h := 0; h < heads; h++ {
				g := h / group
				qo := ((bi*seq+i)*heads + h) * d
				last := seq - 1
				if causal {
					last = i
				}
				scores := make([]float64, last+1)
				m := math.Inf(-1)
				for j := 0; j <= last; j++ {
					ko := ((bi*seq+j)*kvh + g) * d
					var dot float64
					for l := 0; l < d; l++ {
						dot += float64(q[qo+l]) * float64(k[ko+l])
					}
					scores[j] = dot * float64(scale)
					m = math.Max(m, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - m)
					sum += scores[j]
				}
				for j := 0; j <= last; j++ {
					vo := ((bi*seq+j)*kvh + g) * d
					for l := 0; l < d; l++ {
						out[qo+l] += scores[j] / sum * float64(v[vo+l])
					}
				}
			}
		}
	}
	return out
}

// argmaxRef: the lowest index of the maximum; NaN never wins, a row of NaN or -inf gives 0.
func argmaxRef(x []float32, rows, n int) []int32 {
	ids := make([]int32, rows)
	for r := 0; r < rows; r++ {
		best := math.Inf(-1)
		for j, v := range x[r*n : (r+1)*n] {
			if float64(v) > best {
				best, ids[r] = float64(v), int32(j)
			}
		}
	}
	return ids
}

// topkOrder is the order of top-k: NaN first (torch.topk's), then larger first, ties by the
// lower index.
func topkOrder(row []float32) []int {
	order := make([]int, len(row))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		x, y := row[order[a]], row[order[b]]
		if x != x || y != y {
			return x != x && y == y
		}
		return x > y
	})
	return order
}

// gemmRef: C = alpha · op(A) · op(B) + beta · C.
func gemmRef(a, b, c []float32, s GemmShape) []float64 {
	m, n, k := int(s.M), int(s.N), int(s.K)
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var sum float64
			for l := 0; l < k; l++ {
				av := a[i*k+l]
				if s.TransA {
					av = a[l*m+i]
				}
				bv := b[l*n+j]
				if s.TransB {
					bv = b[j*k+l]
				}
				sum += float64(av) * float64(bv)
			}
			out[i*n+j] = float64(s.Alpha) * sum
			if s.Beta != 0 {
				out[i*n+j] += float64(s.Beta) * float64(c[i*n+j])
			}
		}
	}
	return out
}

func logSoftmax(row []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(row))
	for j, v := range row {
		out[j] = float64(v) - (m + math.Log(sum))
	}
	return out
}

func crossEntropyRef(logits []float32, targets []int32, vocab int,
	ignore int32) (loss, logProbs []float64, flags uint32) {
	loss = make([]float64, len(targets))
	for r, t := range targets {
		lp := logSoftmax(logits[r*vocab : (r+1)*vocab])
		logProbs = append(logProbs, lp...)
		switch {
		case t == ignore:
		case t < 0 || int(t) >= vocab:
			flags |= FlagTokenOutOfRange
		default:
			loss[r] = -lp[t]
		}
	}
	return loss, logProbs, flags
}

func crossEntropyBackwardRef(logits []float32, targets []int32, dloss []float32, vocab int,
	ignore int32) ([]float64, uint32) {
	out := make([]float64, len(logits))
	var flags uint32
	for r, t := range targets {
		if t == ignore {
			continue
		}
		if t < 0 || int(t) >= vocab {
			flags |= FlagTokenOutOfRange
			continue
		}
		lp := logSoftmax(logits[r*vocab : (r+1)*vocab])
		for j := range lp {
			out[r*vocab+j] = math.Exp(lp[j]) * float64(dloss[r])
		}
		out[r*vocab+int(t)] -= float64(dloss[r])
	}
	return out, flags
}

func moeAuxLossRef(probs []float32, ids []int32, tokens, experts int) (float64, uint32) {
	count := make([]float64, experts)
	var flags uint32
	for _, id := range ids {
		if id < 0 || int(id) >= experts {
			flags |= FlagTokenOutOfRange
			continue
		}
		count[id]++
	}
	var loss float64
	for e := 0; e < experts; e++ {
		var mean float64
		for t := 0; t < tokens; t++ {
			mean += float64(probs[t*experts+e])
		}
		loss += count[e] / float64(tokens) * mean / float64(tokens)
	}
	return float64(experts) * loss, flags
}

// adamwRef is the update as torch.optim.AdamW documents it.
func adamwRef(param, grad, m, v []float32, h AdamW, step int64) (p2, m2, v2 []float64) {
	lr, b1, b2 := float64(h.LR), float64(h.Beta1), float64(h.Beta2)
	eps, wd := float64(h.Eps), float64(h.WeightDecay)
	for i := range param {
		g := float64(grad[i])
		p := float64(param[i]) * (1 - lr*wd)
		mi := b1*float64(m[i]) + (1-b1)*g
		vi := b2*float64(v[i]) + (1-b2)*g*g
		mHat := mi / (1 - math.Pow(b1, float64(step)))
		vHat := vi / (1 - math.Pow(b2, float64(step)))
		p2 = append(p2, p-lr*mHat/(math.Sqrt(vHat)+eps))
		m2 = append(m2, mi)
		v2 = append(v2, vi)
	}
	return p2, m2, v2
}

// philox4x32_10 is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1,
// 2, 3"), the counter-based generator of stepgraph_sample.
func philox4x32_10(c [4]uint32, k [2]uint32) [4]uint32 {
	for i := 0; i < 10; i++ {
		p0 := uint64(0xD2511F53) * uint64(c[0])
		p1 := uint64(0xCD9E8D57) * uint64(c[2])
		c = [4]uint32{uint32(p1>>32) ^ c[1] ^ k[0], uint32(p1), uint32(p0>>32) ^ c[3] ^ k[1],
			uint32(p0)}
		k[0] += 0x9E3779B9
		k[1] += 0xBB67AE85
	}
	return c
}

// sampleUniform is the number in [0, 1) that sampling draws for (seed, pos): 24 bits.
func sampleUniform(seed, pos int32) float64 {
	r := philox4x32_10([4]uint32{uint32(pos), 0, 0x5A6E5031, 0},
		[2]uint32{uint32(seed), 0x243F6A88})
	return float64(r[0]>>8) / 16777216.0
}

// sampleKept is the ids sampling keeps from a row (the top_k largest of logits /
// temperature, then the smallest prefix of them reaching top_p of their mass) in index
// order, with their cumulative unnormalised probabilities.
func sampleKept(row []float32, p SampleParams) (ids []int, cum []float64) {
	z := make([]float64, len(row))
	for j, v := range row {
		z[j] = float64(v) / float64(p.Temperature)
		if v != v {
			z[j] = math.Inf(-1)
		}
	}
	order := make([]int, len(z))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return z[order[a]] > z[order[b]] })
	if p.TopK > 0 && int(p.TopK) < len(order) {
		order = order[:p.TopK]
	}
	w := make([]float64, len(order))
	var total float64
	for i, j := range order {
		w[i] = math.Exp(z[j] - z[order[0]])
		total += w[i]
	}
	if p.TopP < 1 {
		var run float64
		for i := range w {
			run += w[i]
			if run >= float64(p.TopP)*total {
				order, w = order[:i+1], w[:i+1]
				break
			}
		}
	}
	weight := map[int]float64{}
	for i, j := range order {
		weight[j] = w[i]
	}
	ids = append(ids, order...)
	sort.Ints(ids)
	var run float64
	for _, j := range ids {
		run += weight[j]
		cum = append(cum, run)
	}
	return ids, cum
}
