// The one list of ops. Every op is named once in SG_OP_LIST; the Op variant, the op names,
// the KernelDispatch interface and the mock dispatcher are generated from it, so adding an
// op cannot leave one of them behind. Semantics are in docs/ops.md and DESIGN.md's table;
// the CPU reference (dispatch/cpu/) is their executable definition.
#ifndef STEPGRAPH_GRAPH_OPS_H_
#define STEPGRAPH_GRAPH_OPS_H_

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <variant>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/base/dtype.h"
#include "stepgraph/base/penalty_params.h"

#define SG_OP_LIST(V) \
  V(Embedding)        \
  V(MatMul)           \
  V(RmsNorm)          \
  V(Add)              \
  V(Mul)              \
  V(Silu)             \
  V(SiluMul)          \
  V(Rope)             \
  V(KvWrite)          \
  V(Attention)        \
  V(Softmax)          \
  V(Argmax)           \
  V(Sample)           \
  V(Penalize)         \
  V(CountIds)         \
  V(Copy)             \
  V(Advance)          \
  V(FusedMatMul)      \
  V(RopeKvWrite)      \
  V(FusedElementwise)  \
  V(HeadRmsNorm)       \
  V(GeluTanhMul)       \
  V(Scale)             \
  V(Softcap)           \
  V(MoeTopK)           \
  V(MoeRouteWeights)   \
  V(MoeMatMul)         \
  V(MoeCombine)        \
  V(AllReduce)         \
  V(AllGather)

namespace sg::ops {

// table[V,H], ids[M] i32 -> [M,H]. An id outside [0,V) yields a zero row and raises the
// dispatcher's error flag. The output has the table's dtype; a quantized table (a Weight
// in a block format) is dequantized to `dequant_dtype`.
struct Embedding {
  DType dequant_dtype = DType::kF32;
};

// x[M,K], w[N,K] (, bias[N]) -> [M,N]: y = x·wᵀ (+ bias), the PyTorch / HF weight layout.
// w has x's dtype, or is a Weight in a quantized block format (dequantized on the fly).
struct MatMul {
  bool has_bias = false;
};

// x[M,H], w[H] -> [M,H]: round(x·rsqrt(mean(x²)+eps)) · w, as Hugging Face rounds.
struct RmsNorm {
  float eps = 1e-6f;
};

// a, b -> a + b (same shape and dtype; i32 allowed).
struct Add {};
// a, b -> a · b (same shape and dtype).
struct Mul {};
// x -> x·sigmoid(x).
struct Silu {};
// gate, up -> silu(gate)·up: the fused SwiGLU.
struct SiluMul {};

// RoPE frequency scaling: Llama 3's ("rope_type": "llama3" in a HF config, all fields) or
// linear position interpolation ("linear": every frequency divided by `factor`).
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLlama3, kLinear };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_max_position = 8192;
};

// x[M, n·d], pos[M] i32 -> same. Rotates every head of x by its row's position. By default
// the HF "rotate_half" pairing (i, i + d/2); `interleaved` pairs (2i, 2i+1) instead.
struct Rope {
  int32_t head_dim = 0;
  float theta = 10000.0f;
  bool interleaved = false;
  RopeScaling scaling;
};

// kv[M, kvh·d], pos[M] i32 (, seq_slots[B] i32), cache[slots, kvh, S, d] (a State, the
// last input since it is written) -> cache, in place: row i is written at (its slot,
// pos[i]). Without seq_slots (`has_slots` false, the decode step) row i is slot i. With them the M rows are B sequences of T = M / B
// consecutive rows each (M a multiple of B), and row i belongs to sequence i / T, whose
// slot is seq_slots[i / T]: a prefill step of T tokens per sequence. A row with pos < 0 is
// padding and writes nothing; pos >= S, or a non-padding row whose slot is outside
// [0, slots), writes nothing and raises the error flag. Rows of one sequence must not
// share a position (which of them lands is then unspecified).
struct KvWrite {
  bool has_slots = false;
};

// q[M, h·d], k_cache, v_cache [slots, kvh, S, d], pos[M] i32 (, seq_slots[B] i32) ->
// [M, h·d]. Row i attends to positions 0..pos[i] of its slot (the slot as in KvWrite).
// Because every KvWrite of a step runs before its Attention, a prefill row sees the
// cache and the step's own rows at earlier positions of the same sequence: causal over
// the new tokens and covering what the cache held. GQA maps head j to kv head
// j / (h / kvh). A padding row (pos < 0) yields zeros; pos >= S or a slot out of range
// yields zeros and raises the error flag. The launch shape depends on the shapes only,
// never on pos or the slots.
// `window` > 0 is sliding-window attention (Mistral, Gemma 2's local layers): row i sees
// only positions pos[i] - window + 1 .. pos[i], `window` keys including its own, as
// transformers masks them. `softcap` > 0 caps every score s = scale·q·k as
// softcap·tanh(s / softcap) before the softmax (Gemma 2).
struct Attention {
  float scale = 0.0f;  // the builder sets 1/sqrt(d) unless given
  bool has_slots = false;
  int32_t window = 0;   // 0: every position up to pos[i]
  float softcap = 0.0f;  // 0: no capping
};

// x[M,N] -> [M,N], row-wise, f32 math, max-subtracted.
struct Softmax {};

// x[M,V] -> ids[M] i32, the lowest index among equal maxima.
struct Argmax {};

// logits[M,V], seeds[M] i32, pos[M] i32 -> ids[M] i32. Draws from softmax(logits/T)
// restricted to the top_k largest (0: no limit) and then to the smallest set whose mass
// reaches top_p. The random stream is counter based: (seed[i], pos[i]) fixes row i's draw,
// so the same seeds and positions give the same ids on every run and every dispatcher
// that implements the same generator.
struct Sample {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
};

// Per-sequence sampling controls, read from device memory so that a replayed step needs
// no host work and the rows of one step may each ask for their own. Row i of the step is
// sequence slot i (the decode step's layout; M <= slots).
//
// The parameters of slot s, params[s, kPenaltyParams] f32 (see PenaltyParam):
//   repetition r (1: off), presence a and frequency f (0: off), the min-p margin
//   (-inf: off), the count n of logit biases, then n pairs (id, bias), n <= kMaxLogitBias
//   (ids are stored as floats: exact below 2^24).
// counts[s, V] i32: bit 0 says the id occurs in the sequence's prompt, the bits above
// count how often the sequence generated it (CountIds adds 2 per chosen id).
// (kMaxLogitBias, PenaltyParam and kPenaltyParams: stepgraph/base/penalty_params.h.)

// logits[M,V] (float), params[S, kPenaltyParams] f32, counts[S,V] i32 -> [M,V] f32,
// computed in f32 from the stored logits. For each id v of row i (slot i),
// in this order and with these roundings (each step one f32 operation):
//   1. c = counts[i,v]; where c != 0 (the id is in the prompt or was generated):
//      l = l > 0 ? l / r : l * r                     (transformers' repetition penalty)
//   2. g = c >> 1 (times generated); where g > 0: l = l - (a + f * g)       (OpenAI)
//   3. l[id_j] = l[id_j] + bias_j for each pair j in order (ids outside [0,V) skipped)
//   4. with a finite margin m: l = -inf where l - max_v(l) < m. The session sets
//      m = T * ln(min_p), so the kept ids are those with
//      exp((l - max) / T) >= min_p: probability at least min_p times the top one's
//      after temperature T, as llama.cpp's and transformers' min-p.
// A row whose parameters are all neutral is its logits as f32. Min-p here comes before
// Sample's top-k and top-p (docs/ops.md, "Penalize", says what that changes).
struct Penalize {};

// ids[M] i32, pos[M] i32, counts[S,V] i32 (a State) -> counts, in place: counts[i, ids[i]]
// += 2 for each row i with pos[i] >= 0 (padding rows count nothing); an id outside [0,V)
// counts nothing and raises the error flag (token out of range).
// Follows Sample or Argmax so that the next step's Penalize sees the chosen id.
struct CountIds {};

// src, dst -> dst (an Input or State of the same shape and dtype), in place: how a step hands
// its sampled ids to the next step without the host.
struct Copy {};

// pos[M] i32 (an Input or State) -> pos, in place: pos + 1 where pos >= 0; padding rows
// (pos < 0) stay as they are. Ends a step of a closed decode loop.
struct Advance {};

// ---- Fused ops: made by the graph passes (stepgraph/graph/passes.h), never needed by a model.
// Each is defined as the plain ops it replaces, with the same roundings, so that a fused
// graph computes what the plain graph computes.

// A matmul of x[M,K] with `weights` matrices w_g[N_g, K] (one launch over several weight
// pointers: weights are not concatenated in memory), with an optional RmsNorm of x folded
// in front and an optional epilogue. Inputs, in order:
//   x, [norm_w[K] when `norm`], w_0 .. w_{weights-1}, [residual when epilogue == kAdd],
//   [pos, k_cache, v_cache when epilogue == kRopeKvWrite].
// With `norm`, x is first replaced by RmsNorm(x, norm_w, eps) exactly as ops::RmsNorm
// rounds it. The product p = x·[w_0; ...; w_{g-1}]ᵀ is [M, ΣN_g] (the weights' columns
// side by side, w_0's first), rounded to x's dtype as a MatMul output is. Then:
//   kNone:    output p.
//   kAdd:     output residual + p (residual [M, ΣN_g], as ops::Add).
//   kSiluMul: weights == 2 with N_0 == N_1: output silu(p[:, :N]) · p[:, N:] ([M, N],
//             as ops::SiluMul of the gate and up products).
//   kArgmax:  weights == 1: output ids [M] i32, the argmax of each row of p (as
//             ops::Argmax; p itself is not stored).
//   kRopeKvWrite: weights == 3 (w_q [h·d, K], w_k and w_v [kvh·d, K]); three more
//             inputs after the weights: pos[M] i32, k_cache, v_cache [slots, kvh, S, d]
//             (States). Output ops::RopeKvWrite{rope}(p, pos, k_cache, v_cache): the
//             rotated q [M, h·d], with the rotated k and the v written into the caches
//             in place (same padding, out-of-range and error-flag rules). p itself is not
//             stored. CUDA takes head_dim % 4 == 0 only.
// w may be a quantized Weight on the CPU reference; CUDA takes float weights of x's dtype.
struct FusedMatMul {
  enum class Epilogue : uint8_t { kNone, kAdd, kSiluMul, kArgmax, kRopeKvWrite };
  bool norm = false;
  float eps = 1e-6f;
  int32_t weights = 1;  // 1 to 3
  Epilogue epilogue = Epilogue::kNone;
  Rope rope;  // kRopeKvWrite only
};

// qkv[M, (h + 2·kvh)·d] (q, k and v side by side, as a grouped FusedMatMul writes them),
// pos[M] i32, k_cache, v_cache [slots, kvh, S, d] (States) (, q_norm[d], k_norm[d] with
// `head_norm`) -> q [M, h·d]. With `head_norm` every q head is first ops::HeadRmsNorm'd
// with q_norm and every k head with k_norm (`eps`; Qwen3's q and k norms), rounded as that
// op stores its output. Rotates q and k as ops::Rope with `rope`, writes the rotated k and
// v into the caches as ops::KvWrite (same padding and out-of-range rules) and outputs the
// rotated q. The two caches are written in place as a side effect: the output is q, so
// that Attention, which reads q, runs after the writes.
struct RopeKvWrite {
  Rope rope;
  bool head_norm = false;
  float eps = 1e-6f;  // head_norm only
};

// A chain of elementwise ops as one node, made by the elementwise_chain pass from Add,
// Mul, Silu and SiluMul nodes whose intermediate results nothing else reads. Inputs
// x_0 .. x_{n-1} (1 <= n <= kMaxInputs), float tensors of one shape and dtype, are
// values 0 .. n-1; step i computes value n + i from one (kSilu) or two values numbered
// below it, in f32 from their stored values, and rounds it to the dtype as the plain op
// stores its output. The output is the last step's value. So the node computes, bit for
// bit on the CPU reference, what the chain of plain ops computes.
struct FusedElementwise {
  enum class Kind : uint8_t { kAdd, kMul, kSilu, kSiluMul };
  struct Step {
    Kind kind = Kind::kAdd;
    uint8_t a = 0;
    uint8_t b = 0;  // binary kinds only (kSilu: 0)
  };
  static constexpr int kMaxInputs = 8;
  static constexpr int kMaxSteps = 8;
  int32_t num_steps = 0;  // 1 .. kMaxSteps
  std::array<Step, kMaxSteps> steps{};
};

// ---- Pieces of other model families (docs/models.md). Each is what transformers computes,
// with its roundings.

// x[M, n·d], w[d] -> [M, n·d]: ops::RmsNorm of every head of d values of each row, each
// with the one weight w (Qwen3's q_norm and k_norm), as RmsNorm rounds.
struct HeadRmsNorm {
  float eps = 1e-6f;
};

// gate, up -> gelu_tanh(gate)·up (Gemma's GeGLU; PyTorch's gelu(approximate="tanh"):
// 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))), f32 math, one rounding as SiluMul.
struct GeluTanhMul {};

// x -> x·factor', with factor' the factor rounded to x's dtype (Gemma's embedding scale
// √hidden, a tensor of the activations' dtype in transformers), f32 math, one rounding.
struct Scale {
  float factor = 1.0f;
};

// x -> cap·tanh(x / cap), f32 math, one rounding (Gemma 2's final logit soft-capping).
struct Softcap {
  float cap = 1.0f;
};

// ---- Mixture of experts (Mixtral, Qwen3-MoE; docs/models.md). A layer's MLP is routed:
// MoeTopK picks each row's experts from the router's logits, MoeRouteWeights gives their
// weights, MoeMatMul multiplies each row by its chosen experts' matrices only (the ids are
// a tensor the kernels read, so the launch never depends on the routing), and MoeCombine
// sums the experts' outputs by weight.

// logits [M, E] float -> ids [M, top_k] i32: the indices of each row's top_k largest
// logits, largest first; NaN above every number (as torch.topk), and among equal values
// the lower index first (the C ABI's stepgraph_topk's order; torch.topk's order among
// ties is unspecified). 1 <= top_k <= E.
struct MoeTopK {
  int32_t top_k = 1;
};

// logits [M, E] float, ids [M, k] i32 -> weights [M, k] f32: p = softmax(logits) over
// all E experts in f32, w_j = p[ids_j]; with `renormalize` each w_j is divided by Σ_j w_j
// (Mixtral always, which equals a softmax over the chosen logits; Qwen3-MoE when
// norm_topk_prob). With `round_to_dtype` each weight is rounded to the logits' dtype (and
// stored in f32), as Qwen3-MoE casts them; Mixtral keeps them in f32. An id outside
// [0, E) gets weight 0 and raises kErrorExpertOutOfRange.
struct MoeRouteWeights {
  bool renormalize = true;
  bool round_to_dtype = false;
};

// x [M, K] or [M, k·K], w [E, N, K] (x's dtype or a quantized Weight), ids [M, k] i32 ->
// [M, k·N]: y[i, j·N .. (j+1)·N) = x_ij · w[ids[i, j]]ᵀ, where x_ij is row i of x when x
// has K columns (the same input for every chosen expert: gate and up projections) and its
// j-th slice of K when it has k·K (each expert's own input: the down projection). Only
// the chosen experts' rows of w are read. An id outside [0, E) gives zeros and raises
// kErrorExpertOutOfRange. Each output as MatMul computes it: an f32 dot product rounded
// once.
// With `silu_mul` (made by the moe_gate_up_silu_mul pass): x [M, K], w_gate, w_up [E, N, K]
// (one shape, one dtype), ids [M, k] -> [M, k·N], SiluMul(x·w_gate, x·w_up) of each chosen
// expert: both products rounded to x's dtype as MoeMatMul stores them, then silu(g)·u
// rounded as SiluMul stores it (a routed MLP's gate and up projections and their
// activation in one node).
struct MoeMatMul {
  bool silu_mul = false;
};

// y [M, k·N] float, weights [M, k] float, ids [M, k] i32 -> [M, N] of y's dtype: the
// weighted sum of the chosen experts' outputs as transformers adds them: each term
// weights[i, j] · y[i, j·N ..] rounded to y's dtype, the terms added in ascending expert
// id (ties by slot) into a zero row of y's dtype, each partial sum rounded (index_add_ of
// every expert's output in expert order). In f32 every rounding is f32's own.
// With `residual` (made by the moe_combine_add pass): a fourth input residual [M, N] of
// y's dtype, and the output residual + that sum, rounded as Add stores it (a routed MLP's
// combine and the layer's residual add in one node).
// With `route` (made by the moe_route_into_combine pass): input 1 is the router's logits
// [M, E] float instead of the weights, and the weights are MoeRouteWeights(logits, ids)
// with `renormalize` and `round_to_dtype` (its params; unused without `route`): the
// routing weights and the combine in one node.
// With `matmul` (made by the moe_down_into_combine pass): input 0 is x [M, k·K] instead of
// y (each chosen expert's own input, as the down projection's MoeMatMul takes it), and a
// last input w [E, N, K] (x's dtype or a quantized Weight) follows the others; y =
// MoeMatMul(x, w, ids) is computed in the node, rounded as MoeMatMul stores it (a bad id's
// y zeros), and never stored: a routed MLP's down projection and its combine in one node.
struct MoeCombine {
  bool residual = false;
  bool route = false;
  bool renormalize = true;
  bool round_to_dtype = false;
  bool matmul = false;
};

// ---- Collectives (tensor parallel; docs/parallel.md). A sharded step runs on every rank of
// a group, and every rank reaches each collective node at the same point of its step; the
// dispatcher holds the group and its own rank. `ranks` is the group's size, which shape
// inference needs and the dispatcher checks against its group. One rank (no group) makes
// either op a copy.
inline constexpr int32_t kMaxRanks = 64;

// x[M,N] float -> [M,N]: on every rank, the sum over the ranks of their x, added in f32 in
// rank order and rounded once to x's dtype (so every rank holds the same bits).
// With `residual`, a second input r[M,N] of x's dtype (the same on every rank) is added to
// that rounded sum and the result rounded again: Add(r, AllReduce(x)) in one node, as the
// all_reduce_add pass makes it (bit for bit the two nodes it replaces).
struct AllReduce {
  int32_t ranks = 1;
  bool residual = false;
};

// x[M,N] float -> [M, N·ranks]: out[i, r·N + j] = rank r's x[i, j] on every rank (each
// rank's columns side by side, as a column-split matmul's outputs join).
struct AllGather {
  int32_t ranks = 1;
};

}  // namespace sg::ops

namespace sg {

namespace internal {
// SG_OP_LIST expands to "ops::A, ops::B, ..., " with a trailing comma; the list is closed
// with OpListEnd and the variant is made of every type but that last one.
struct OpListEnd {};
template <typename Tuple, typename Indices>
struct VariantOfLeading;
template <typename Tuple, size_t... I>
struct VariantOfLeading<Tuple, std::index_sequence<I...>> {
  using type = std::variant<std::tuple_element_t<I, Tuple>...>;
};
#define SG_OP_TYPE(Name) ops::Name,
using OpTuple = std::tuple<SG_OP_LIST(SG_OP_TYPE) OpListEnd>;
#undef SG_OP_TYPE
}  // namespace internal

// std::variant<ops::Embedding, ops::MatMul, ...>, in SG_OP_LIST order.
using Op = internal::VariantOfLeading<
    internal::OpTuple,
    std::make_index_sequence<std::tuple_size_v<internal::OpTuple> - 1>>::type;

// Number of ops in SG_OP_LIST.
inline constexpr int kNumOps = static_cast<int>(std::variant_size_v<Op>);

// "MatMul", "Rope", ...
absl::string_view OpName(const Op& op);
// Every op's name, in SG_OP_LIST order (kNumOps of them).
absl::Span<const absl::string_view> AllOpNames();

// Parameters as "eps=1e-05", "" for ops without any.
std::string OpParamsToString(const Op& op);

// ---- What an op writes besides its output ----------------------------------------------
// Most ops only make their output, a new intermediate. Some write bound tensors that they
// take as inputs: the in-place ops KvWrite (its cache), Copy (dst) and Advance (pos),
// whose output is the tensor they write; and RopeKvWrite and a FusedMatMul with the
// kRopeKvWrite epilogue, which write the k and v caches as a side effect beside an output
// of their own. Whatever asks which tensors a node changes (the builder and Validate
// through IsInPlace, the passes when they move a computation past other nodes, capture
// safety, the conformance comparison) reads this instead of naming ops.
struct InputWrites {
  // Indices into the node's inputs of the tensors the node writes (States or Inputs).
  absl::InlinedVector<int32_t, 2> inputs;
  // The node's output is its written input (its last one) rather than a new intermediate.
  bool output_is_written = false;
};

// Every op answers: graph/ops.cc has one overload per op and no default, so an op added to
// SG_OP_LIST without saying what it writes does not compile.
InputWrites WrittenInputs(const Op& op);

// The in-place ops write an existing State or Input instead of producing a tensor:
// WrittenInputs(op).output_is_written.
bool IsInPlace(const Op& op);

// Whether a node of `op` writes any of its inputs (in place or as a side effect), so that
// its effect is more than its output.
bool WritesInputs(const Op& op);

// "add", "mul", "silu", "silu_mul".
absl::string_view ElementwiseKindName(ops::FusedElementwise::Kind kind);
// Whether `kind` reads two values (every kind but kSilu).
inline bool IsBinaryKind(ops::FusedElementwise::Kind kind) {
  return kind != ops::FusedElementwise::Kind::kSilu;
}

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_OPS_H_
