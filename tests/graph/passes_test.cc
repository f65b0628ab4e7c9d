// The graph passes: what they fuse (node counts and op mixes, including the Llama-3.2-1B
// shape's step), what they must leave alone (biases, logits that are read, and whatever
// the backend says it does not run: quantized weights and odd RoPE pairs for CUDA's fused
// kernel), switches, and that a fused graph computes what the plain graph computes on the
// CPU reference: the fused ops are defined with the plain ops' roundings, so outputs and
// written caches are compared bit for bit, from random inputs and weights, into poisoned
// arenas.
#include "stepgraph/graph/passes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/op_support.h"
#include "tests/testing/family_configs.h"
#include "tests/testing/quantized_config.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

using testing::HostTensor;

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes()) ++counts[std::string(OpName(n.op))];
  return counts;
}

// A backend that runs every op but those `refuses` says no to, counting the questions.
class RefusingBackend final : public OpSupport {
 public:
  using Rule = std::function<bool(const Op&, absl::Span<const Tensor* const>)>;
  explicit RefusingBackend(Rule refuses) : refuses_(std::move(refuses)) {}
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override {
    ++asked_;
    return !refuses_(op, inputs);
  }
  int asked() const { return asked_; }

 private:
  Rule refuses_;
  mutable int asked_ = 0;
};

// What the CUDA dispatcher refuses of what the passes make (its answer is tested in
// tests/dispatch/cuda_kernels_test.cc): block-format weights in a FusedMatMul, and the
// rope_kv_write epilogue with head_dim not a multiple of 4.
bool QuantizedFusedMatMul(const Op& op, absl::Span<const Tensor* const> inputs) {
  if (!std::holds_alternative<ops::FusedMatMul>(op)) return false;
  for (const Tensor* t : inputs) {
    if (IsQuantized(t->dtype)) return true;
  }
  return false;
}
bool RopeEpilogueOfOddPairs(const Op& op, absl::Span<const Tensor* const>) {
  const auto* f = std::get_if<ops::FusedMatMul>(&op);
  return f != nullptr && f->epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite &&
         f->rope.head_dim % 4 != 0;
}

LlamaGraphOptions DecodeOptions(bool closed_loop, int64_t batch = 1) {
  LlamaGraphOptions o;
  o.batch = batch;
  o.max_seq = 64;
  o.closed_loop = closed_loop;
  return o;
}

TEST(PassesTest, Llama1BStepHasAtMost100Nodes) {
  const LlamaConfig c = Llama32_1BConfig();
  // Open loop, logits read: the plain step has embedding, 17 nodes per layer, final norm,
  // lm head and argmax; the fused one 5 per layer (qkv with RoPE and the cache writes,
  // attention, o, gate_up, down) and lm head + argmax.
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, DecodeOptions(false));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->num_nodes(), 1 + 16 * 17 + 3);
  absl::StatusOr<Graph> fused = RunPasses(*plain);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(fused->num_nodes(), 83) << fused->ToString();
  std::map<std::string, int> ops = OpCounts(*fused);
  EXPECT_EQ(ops["FusedMatMul"], 16 * 4 + 1);
  EXPECT_EQ(ops.count("RopeKvWrite"), 0u);
  int rope_epilogues = 0;
  for (const Node& n : fused->nodes()) {
    const auto* f = std::get_if<ops::FusedMatMul>(&n.op);
    rope_epilogues += f != nullptr && f->epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite;
  }
  EXPECT_EQ(rope_epilogues, 16);
  EXPECT_EQ(ops["Attention"], 16);
  EXPECT_EQ(ops["Argmax"], 1);
  EXPECT_EQ(ops["Embedding"], 1);
  EXPECT_EQ(ops.count("MatMul") + ops.count("RmsNorm") + ops.count("Add") +
                ops.count("Rope") + ops.count("KvWrite") + ops.count("SiluMul"),
            0u);

  // The closed loop (the session's step) with the logits unread: the lm head chooses the
  // id itself, 84 nodes.
  absl::StatusOr<Graph> loop = BuildLlamaDecodeGraph(c, DecodeOptions(true));
  ASSERT_TRUE(loop.ok());
  PassOptions unread;
  unread.unread_outputs = {kLogitsOutput};
  absl::StatusOr<Graph> loop_fused = RunPasses(*loop, unread);
  ASSERT_TRUE(loop_fused.ok()) << loop_fused.status();
  EXPECT_EQ(loop_fused->num_nodes(), 84);
  EXPECT_EQ(OpCounts(*loop_fused)["Argmax"], 0);
  EXPECT_FALSE(loop_fused->FindOutput(kLogitsOutput).ok());
  // With the logits read they stay a MatMul output and the argmax stays a node: 85.
  absl::StatusOr<Graph> loop_logits = RunPasses(*loop);
  ASSERT_TRUE(loop_logits.ok());
  EXPECT_EQ(loop_logits->num_nodes(), 85);
  EXPECT_TRUE(loop_logits->FindOutput(kLogitsOutput).ok());
  // The session's step with the default passes (the 33 RmsNorms stay): 118 nodes, 134
  // with the RopeKvWrite nodes kept.
  absl::StatusOr<Graph> loop_default = RunPasses(*loop, DefaultPassOptions());
  ASSERT_TRUE(loop_default.ok());
  EXPECT_EQ(loop_default->num_nodes(), 118);
  PassOptions keep_rope = DefaultPassOptions();
  keep_rope.disabled.insert("rope_kv_write_epilogue");
  absl::StatusOr<Graph> loop_rope_node = RunPasses(*loop, keep_rope);
  ASSERT_TRUE(loop_rope_node.ok());
  EXPECT_EQ(loop_rope_node->num_nodes(), 134);
  EXPECT_EQ(OpCounts(*loop_rope_node)["RopeKvWrite"], 16);
}

TEST(PassesTest, EachPassCanBeSwitchedOff) {
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(TinyLlamaConfig(), DecodeOptions(true));
  ASSERT_TRUE(plain.ok());
  PassOptions none;
  none.enabled = false;
  absl::StatusOr<Graph> same = RunPasses(*plain, none);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->num_nodes(), plain->num_nodes());
  for (const std::string& name : PassNames()) {
    PassOptions o;
    o.disabled = {name};
    absl::StatusOr<Graph> g = RunPasses(*plain, o);
    ASSERT_TRUE(g.ok()) << name << ": " << g.status();
    EXPECT_GT(g->num_nodes(), 0);
    EXPECT_TRUE(g->Validate().ok());
    // Only this pass: something changes for every pass but lm_head_argmax (logits read).
    // rope_kv_write_epilogue fuses what qkv_rope_kv_write made, so it runs on that.
    Graph before = *plain;
    if (name == "rope_kv_write_epilogue") {
      absl::StatusOr<Graph> qkv = RunPass("qkv_rope_kv_write", *plain);
      ASSERT_TRUE(qkv.ok()) << qkv.status();
      before = *std::move(qkv);
    }
    absl::StatusOr<Graph> one = RunPass(name, before);
    ASSERT_TRUE(one.ok()) << name << ": " << one.status();
    // Nor does a Llama step leave elementwise_chain anything: its Adds and SiluMuls read
    // matmuls, and each residual sum is read by a norm as well. all_reduce_add needs a
    // sharded step (shard_test).
    // Nor has it a routed MLP for moe_gate_up_silu_mul, moe_combine_add and
    // moe_route_into_combine and moe_down_into_combine (FusedEqualsPlainForMoeFamilies).
    if (name != "lm_head_argmax" && name != "elementwise_chain" && name != "all_reduce_add" &&
        name != "moe_gate_up_silu_mul" && name != "moe_combine_add" &&
        name != "moe_route_into_combine" && name != "moe_down_into_combine") {
      EXPECT_LT(one->num_nodes(), before.num_nodes()) << name;
    }
  }
  PassOptions bad;
  bad.disabled = {"no_such_pass"};
  EXPECT_EQ(RunPasses(*plain, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunPass("no_such_pass", *plain).status().code(), absl::StatusCode::kNotFound);
}

TEST(PassesTest, ParsePassList) {
  absl::StatusOr<PassOptions> all = ParsePassList("all");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->enabled);
  EXPECT_TRUE(all->disabled.empty());
  absl::StatusOr<PassOptions> none = ParsePassList("none");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled);
  absl::StatusOr<PassOptions> skip = ParsePassList("-residual_add,-lm_head_argmax");
  ASSERT_TRUE(skip.ok());
  EXPECT_EQ(skip->disabled.size(), 2u);
  EXPECT_TRUE(skip->disabled.contains("residual_add"));
  absl::StatusOr<PassOptions> only = ParsePassList("norm_into_matmul");
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->disabled.size(), PassNames().size() - 1);
  EXPECT_FALSE(only->disabled.contains("norm_into_matmul"));
  EXPECT_FALSE(ParsePassList("bogus").ok());
  EXPECT_FALSE(ParsePassList("residual_add,-lm_head_argmax").ok());
}

// ---- Fused == plain on the CPU reference -------------------------------------------------

// Runs `g` on the CPU reference with every bound tensor taken (copied) from `bound` by
// name, an arena poisoned with NaN, and returns every graph output and every State by
// name, as bytes.
std::map<std::string, std::vector<std::byte>> RunOnCpu(
    const Graph& g, const std::map<std::string, HostTensor>& bound) {
  std::map<std::string, std::vector<std::byte>> result;
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(g);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return result;
  std::map<std::string, HostTensor> copies;
  Bindings bind(plan->graph());
  for (const Tensor& t : plan->graph().tensors()) {
    if (t.kind == TensorKind::kIntermediate) continue;
    const HostTensor& src = bound.at(t.name);
    HostTensor copy(src.dtype(), src.shape());
    std::memcpy(copy.data(), src.data(), src.bytes());
    auto [it, _] = copies.emplace(t.name, std::move(copy));
    EXPECT_TRUE(bind.Bind(t.name, it->second.data(), it->second.bytes()).ok());
  }
  HostTensor arena(DType::kF32, Shape{std::max<int64_t>(1, plan->arena_bytes() / 4 + 1)});
  arena.Poison();
  bind.SetArena(arena.data(), plan->arena_bytes());
  CpuDispatch cpu(CpuDispatch::Options{.threads = 2});
  absl::StatusOr<ExecStats> stats = Execute(*plan, bind, cpu);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return result;
  auto save = [&](const std::string& name, int32_t index) {
    const TensorArg a = ResolveTensor(*plan, bind, index);
    const auto* p = static_cast<const std::byte*>(a.data);
    result[name] = std::vector<std::byte>(p, p + a.bytes());
  };
  for (const GraphOutput& o : plan->graph().outputs()) save(o.name, o.tensor.index);
  for (int32_t i = 0; i < plan->graph().num_tensors(); ++i) {
    const Tensor& t = plan->graph().tensors()[i];
    if (t.kind == TensorKind::kState) save(t.name, i);
  }
  result["error_flags"] = std::vector<std::byte>(4, std::byte{0});
  const uint32_t flags = cpu.TakeErrorFlags();
  std::memcpy(result["error_flags"].data(), &flags, 4);
  return result;
}

// Random values for every bound tensor of `g` (never zeros; norm weights near 1; ids and
// positions from the given lists).
std::map<std::string, HostTensor> RandomBound(const Graph& g, uint64_t seed,
                                              const std::vector<int32_t>& ids,
                                              const std::vector<int32_t>& pos) {
  std::map<std::string, HostTensor> bound;
  uint64_t k = 0;
  for (const Tensor& t : g.tensors()) {
    if (t.kind == TensorKind::kIntermediate) continue;
    HostTensor h(t.dtype, t.shape);
    ++k;
    if (t.name == kIdsInput || t.name == kPosInput) {
      const std::vector<int32_t>& v = t.name == kIdsInput ? ids : pos;
      std::memcpy(h.data(), v.data(), h.bytes());
    } else if (t.dtype == DType::kI32) {
      h.FillUniform(seed * 7919 + k, 0, 100);
    } else if (t.name.find("norm") != std::string::npos) {
      h.FillUniform(seed * 7919 + k, 0.5f, 1.5f);
    } else {
      h.FillUniform(seed * 7919 + k, -0.5f, 0.5f);
    }
    bound.emplace(t.name, std::move(h));
  }
  return bound;
}

void ExpectSameResults(const Graph& plain, const Graph& fused,
                       const std::map<std::string, HostTensor>& bound) {
  const auto a = RunOnCpu(plain, bound);
  const auto b = RunOnCpu(fused, bound);
  ASSERT_FALSE(a.empty());
  for (const auto& [name, bytes] : b) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(a.contains(name));
    EXPECT_EQ(bytes, a.at(name)) << "fused and plain differ";
  }
  // Every State and output of the fused graph was compared; the plain graph has no
  // others but dropped outputs.
  EXPECT_GE(a.size(), b.size());
}

TEST(PassesTest, LeavesBiasAndQuantizedMatmulsAlone) {
  LlamaConfig c = TinyLlamaConfig();
  c.attention_bias = true;
  c.mlp_bias = true;
  absl::StatusOr<Graph> biased = BuildLlamaDecodeGraph(c, DecodeOptions(false));
  ASSERT_TRUE(biased.ok()) << biased.status();
  absl::StatusOr<Graph> fused = RunPasses(*biased);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(OpCounts(*fused)["FusedMatMul"], 1);  // the lm head and its norm only
  EXPECT_EQ(OpCounts(*fused)["MatMul"], 7 * c.num_hidden_layers);

  // Quantized matmuls stay plain for a backend whose fused kernel takes float weights only
  // (CUDA's); the CPU reference (no backend given) runs them fused, equal to plain.
  LlamaConfig tiny = TinyLlamaConfig();
  tiny.intermediate_size = 704;  // whole Q8_0 blocks
  const LlamaConfig q = testing::WithMatrixDTypes(tiny, [](const std::string& name) {
                          return absl::StrContains(name, "model.layers.") ? DType::kQ8_0
                                                                         : DType::kF32;
                        }).value();
  absl::StatusOr<Graph> quant = BuildLlamaDecodeGraph(q, DecodeOptions(false));
  ASSERT_TRUE(quant.ok()) << quant.status();
  const RefusingBackend float_only(QuantizedFusedMatMul);
  PassOptions for_float_only;
  for_float_only.backend = &float_only;
  absl::StatusOr<Graph> qf = RunPasses(*quant, for_float_only);
  ASSERT_TRUE(qf.ok()) << qf.status();
  EXPECT_GT(float_only.asked(), 0);
  for (const Node& n : qf->nodes()) {
    if (std::holds_alternative<ops::FusedMatMul>(n.op)) {
      for (TensorId in : n.inputs) EXPECT_FALSE(IsQuantized(qf->tensor(in).dtype)) << n.name;
    }
  }
  EXPECT_EQ(OpCounts(*qf)["MatMul"], 7 * q.num_hidden_layers);
  EXPECT_EQ(OpCounts(*qf)["RmsNorm"], 2 * q.num_hidden_layers);
  const auto bound = RandomBound(*quant, 17, {5}, {3});
  ExpectSameResults(*quant, *qf, bound);

  absl::StatusOr<Graph> on_cpu = RunPasses(*quant);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ(OpCounts(*on_cpu).count("MatMul"), 0u) << on_cpu->ToString();
  int quantized_fused = 0;
  for (const Node& n : on_cpu->nodes()) {
    if (!std::holds_alternative<ops::FusedMatMul>(n.op)) continue;
    for (TensorId in : n.inputs) quantized_fused += IsQuantized(on_cpu->tensor(in).dtype);
  }
  EXPECT_EQ(quantized_fused, 7 * q.num_hidden_layers);
  ExpectSameResults(*quant, *on_cpu, bound);
}

struct RandomConfig {
  LlamaConfig config;
  int64_t batch;
  bool closed_loop;
};

std::vector<RandomConfig> RandomConfigs() {
  std::vector<RandomConfig> out;
  std::mt19937 rng(20261123);
  for (int i = 0; i < 9; ++i) {
    LlamaConfig c = TinyLlamaConfig();
    const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
    c.dtype = types[i % 3];
    const int64_t kv = 1 + static_cast<int64_t>(rng() % 3);
    const int64_t group = 1 + static_cast<int64_t>(rng() % 3);
    c.num_key_value_heads = kv;
    c.num_attention_heads = kv * group;
    c.head_dim = 8 * (1 + static_cast<int64_t>(rng() % 4));
    c.hidden_size = 16 * (2 + static_cast<int64_t>(rng() % 6)) + (i == 4 ? 8 : 0);
    c.intermediate_size = 24 + static_cast<int64_t>(rng() % 40);
    c.num_hidden_layers = 1 + static_cast<int64_t>(rng() % 3);
    c.vocab_size = 97 + static_cast<int64_t>(rng() % 200);
    c.tie_word_embeddings = i % 2 == 0;
    if (i % 4 == 1) c.rope_scaling = {ops::RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 64};
    out.push_back({c, 1 + static_cast<int64_t>(rng() % 3), i % 2 == 1});
  }
  return out;
}

TEST(PassesTest, FusedEqualsPlainOnRandomConfigs) {
  int index = 0;
  for (const RandomConfig& rc : RandomConfigs()) {
    SCOPED_TRACE(absl::StrCat("config ", index, " ", DTypeName(rc.config.dtype), " h=",
                              rc.config.hidden_size, " heads=", rc.config.num_attention_heads,
                              "/", rc.config.num_key_value_heads, " d=", rc.config.head_dim,
                              " batch=", rc.batch));
    LlamaGraphOptions o;
    o.batch = rc.batch;
    o.slots = rc.batch + 1;
    o.max_seq = 16;
    o.closed_loop = rc.closed_loop;
    absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(rc.config, o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    std::vector<int32_t> ids, pos;
    for (int64_t r = 0; r < rc.batch; ++r) {
      ids.push_back(static_cast<int32_t>((r * 31 + index) % rc.config.vocab_size));
      // A padding row and an out-of-range position among the rows, where there are rows.
      pos.push_back(r == 1 ? -1 : r == 2 ? 16 : static_cast<int32_t>(3 + r + index));
    }
    const auto bound = RandomBound(*plain, 100 + index, ids, pos);
    for (bool logits_read : {true, false}) {
      PassOptions options;
      if (!logits_read) options.unread_outputs = {kLogitsOutput};
      absl::StatusOr<Graph> fused = RunPasses(*plain, options);
      ASSERT_TRUE(fused.ok()) << fused.status();
      EXPECT_LT(fused->num_nodes(), plain->num_nodes());
      ExpectSameResults(*plain, *fused, bound);
    }
    ++index;
  }
}

// Every family's step: the passes fuse around the pieces they do not take (q/k/v biases,
// per-head q/k norms, sandwich norms, GELU-tanh, soft-caps) and leave those nodes plain,
// and the fused step equals the plain one to the bit, positions past the window included.
TEST(PassesTest, FusedEqualsPlainForEveryFamily) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const auto& [name, config] : testing::FamilyTinyConfigs(t)) {
      SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(t)));
      LlamaGraphOptions o;
      o.batch = 3;
      o.max_seq = 16;
      absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(config, o);
      ASSERT_TRUE(plain.ok()) << plain.status();
      absl::StatusOr<Graph> fused = RunPasses(*plain);
      ASSERT_TRUE(fused.ok()) << fused.status();
      EXPECT_LT(fused->num_nodes(), plain->num_nodes());
      auto counts = OpCounts(*fused);
      const int64_t layers = config.num_hidden_layers;
      if (config.qk_norm) {
        // Qwen3's q and k norms go into the RopeKvWrite after the grouped q/k/v product.
        EXPECT_EQ(counts["HeadRmsNorm"], 0);
        int head_norms = 0;
        for (const Node& n : fused->nodes()) {
          const auto* r = std::get_if<ops::RopeKvWrite>(&n.op);
          head_norms += r != nullptr && r->head_norm;
        }
        EXPECT_EQ(head_norms, layers) << fused->ToString();
      }
      if (config.qkv_bias) {
        EXPECT_EQ(counts["MatMul"], 3 * layers);  // biased q, k, v
      }
      if (config.activation == MlpActivation::kGeluTanh) {
        EXPECT_EQ(counts["GeluTanhMul"], layers);
      }
      if (config.final_logit_softcap > 0.0f) {
        EXPECT_EQ(counts["Softcap"], 1);
      }
      const auto bound = RandomBound(*plain, 31, {5, 77, 300}, {2, 9, 15});
      ExpectSameResults(*plain, *fused, bound);
    }
  }
}

// The nodes of `g` whose op is an Op for which pred(op) holds.
template <typename Op, typename Pred>
int CountOps(const Graph& g, Pred pred) {
  int n = 0;
  for (const Node& node : g.nodes()) {
    const auto* op = std::get_if<Op>(&node.op);
    n += op != nullptr && pred(*op);
  }
  return n;
}

// The routed MLPs keep their routing ops; the gate and up experts and their SiluMul
// become one MoeMatMul, everything around them fuses, and the fused step computes what the
// plain one does.
TEST(PassesTest, FusedEqualsPlainForMoeFamilies) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const auto& [name, config] : testing::MoeTinyConfigs(t)) {
      for (int64_t batch : {2, 3}) {
        SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(t), " batch ", batch));
        LlamaGraphOptions o;
        o.batch = batch;
        o.max_seq = 16;
        absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(config, o);
        ASSERT_TRUE(plain.ok()) << plain.status();
        absl::StatusOr<Graph> fused = RunPasses(*plain);
        ASSERT_TRUE(fused.ok()) << fused.status();
        EXPECT_LT(fused->num_nodes(), plain->num_nodes());
        auto counts = OpCounts(*fused);
        int64_t routed = 0;
        for (int64_t l = 0; l < config.num_hidden_layers; ++l) routed += config.MoeLayer(l);
        EXPECT_EQ(counts["MoeTopK"], routed);
        // Gate and up with their SiluMul in one (moe_gate_up_silu_mul); down goes into the
        // combine (moe_down_into_combine) where the step has fewer (row, expert) pairs than
        // experts.
        const int64_t down_fused = batch * config.experts_per_token < config.num_experts;
        EXPECT_EQ(counts["MoeMatMul"], (2 - down_fused) * routed);
        EXPECT_EQ(CountOps<ops::MoeMatMul>(*fused, [](const auto& op) { return op.silu_mul; }),
                  routed)
            << fused->ToString();
        EXPECT_EQ(counts["MoeCombine"], routed);
        // Every combine took its layer's residual add (moe_combine_add) and computes its
        // routing weights (moe_route_into_combine).
        EXPECT_EQ(CountOps<ops::MoeCombine>(*fused, [](const auto& op) { return op.residual; }),
                  routed)
            << fused->ToString();
        EXPECT_EQ(CountOps<ops::MoeCombine>(*fused, [](const auto& op) { return op.route; }),
                  routed)
            << fused->ToString();
        EXPECT_EQ(counts["MoeRouteWeights"], 0) << fused->ToString();
        EXPECT_EQ(CountOps<ops::MoeCombine>(*fused, [](const auto& op) { return op.matmul; }),
                  down_fused * routed)
            << fused->ToString();
        const auto bound = RandomBound(*plain, 31, {5, 77, 300}, {2, 9, 15});
        ExpectSameResults(*plain, *fused, bound);
      }
    }
  }
}

// The down experts go into the combine only where a step has fewer (row, expert) pairs
// than experts: a decode step of three rows of the tiny Mixtral (top 2 of 8: 6 pairs), not
// the tiny Qwen3-MoE's (top 3: 9), nor a prefill of two sequences of 8 rows, whose
// MoeMatMul may read an expert once for many rows.
TEST(PassesTest, DownIntoCombineOnlyWithFewerPairsThanExperts) {
  for (const auto& [name, config] : testing::MoeTinyConfigs(DType::kF32)) {
    SCOPED_TRACE(name);
    for (int64_t rows : {1, 8}) {
      LlamaGraphOptions o{.batch = rows == 1 ? 3 : 2, .max_seq = 64};
      o.rows_per_seq = rows;
      absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(config, o);
      ASSERT_TRUE(plain.ok()) << plain.status();
      absl::StatusOr<Graph> fused = RunPasses(*plain);
      ASSERT_TRUE(fused.ok()) << fused.status();
      const int routed = CountOps<ops::MoeCombine>(*fused, [](const auto&) { return true; });
      const int with_matmul =
          CountOps<ops::MoeCombine>(*fused, [](const auto& op) { return op.matmul; });
      ASSERT_GT(routed, 0);
      const int64_t pairs = o.batch * rows * config.experts_per_token;
      EXPECT_EQ(with_matmul, pairs < config.num_experts ? routed : 0)
          << rows << " rows a sequence";
    }
  }
}

TEST(PassesTest, FusedOpsOnOddShapesEqualPlain) {
  // A hand-made graph: norm read by three matmuls (one of them not part of a q/k/v
  // pattern), gate/up with SiluMul, a residual add with the matmul on the left.
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    GraphBuilder b;
    const int64_t m = 3, k = 37, n = 19;
    TensorId x = b.Input("x", t, {m, k});
    TensorId nx = b.RmsNorm(x, b.Weight("norm.w", t, {k}), 1e-5f, "norm");
    TensorId g = b.MatMul(nx, b.Weight("gate", t, {n, k}), "gate_mm");
    TensorId u = b.MatMul(nx, b.Weight("up", t, {n, k}), "up_mm");
    TensorId s = b.SiluMul(g, u, "act");
    TensorId d = b.MatMul(s, b.Weight("down", t, {k, n}), "down_mm");
    TensorId r = b.Add(d, x, "residual");
    TensorId other = b.MatMul(nx, b.Weight("other", t, {5, k}), "other_mm");
    b.Output("r", r);
    b.Output("other", other);
    b.Output("ids", b.Argmax(b.MatMul(r, b.Weight("head", t, {29, k}), "head_mm"), "pick"));
    absl::StatusOr<Graph> plain = std::move(b).Build();
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPasses(*plain);
    ASSERT_TRUE(fused.ok()) << fused.status();
    const std::map<std::string, int> ops = OpCounts(*fused);
    EXPECT_EQ(ops.count("RmsNorm"), 0u) << fused->ToString();
    EXPECT_EQ(ops.count("SiluMul"), 0u);
    EXPECT_EQ(ops.count("Add"), 0u);
    EXPECT_EQ(ops.count("Argmax"), 0u);
    EXPECT_EQ(ops.at("FusedMatMul"), 4);
    ExpectSameResults(*plain, *fused, RandomBound(*plain, 5, {}, {}));
  }
}

TEST(PassesTest, AllReduceAddEqualsAllReduceThenAdd) {
  // Both orders of the Add, bit for bit: the fused node rounds the sum before it adds the
  // residual, as the two nodes do. A group of one (the CPU reference's own); groups of
  // ranks run in tensor_parallel_test. An AllReduce read twice, or an Add of another
  // dtype's residual, stays.
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    GraphBuilder b;
    const int64_t m = 3, n = 40;
    const TensorId r = b.Input("r", t, {m, n});
    const TensorId left = b.Add(b.AllReduce(b.Input("x", t, {m, n}), 1, "sum_x"), r, "left");
    const TensorId right = b.Add(left, b.AllReduce(b.Input("y", t, {m, n}), 1, "sum_y"), "right");
    const TensorId twice = b.AllReduce(b.Input("z", t, {m, n}), 1, "sum_z");
    b.Output("right", right);
    b.Output("twice", b.Add(twice, twice, "twice"));
    absl::StatusOr<Graph> plain = std::move(b).Build();
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPass("all_reduce_add", *plain);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_EQ(OpCounts(*fused)["Add"], 1) << fused->ToString();
    EXPECT_EQ(OpCounts(*fused)["AllReduce"], 3);
    ExpectSameResults(*plain, *fused, RandomBound(*plain, 7, {}, {}));
  }
  // The fused op's shapes are checked: a residual of another shape is refused.
  GraphBuilder b;
  b.Output("y", b.AllReduce(b.Input("x", DType::kF32, {2, 8}), 1, "s",
                            b.Input("r", DType::kF32, {2, 4})));
  absl::StatusOr<Graph> bad = std::move(b).Build();
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "residual")) << bad.status();
}

// Every block format the loader reads (whole K-quant super-blocks at K = 256).
constexpr DType kBlockFormats[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                   DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

TEST(PassesTest, CpuFusedMatMulTakesQuantizedWeights) {
  // The reference defines the fused op for every block format: built by hand, it equals
  // MatMul then Add to the bit.
  for (DType q : kBlockFormats) {
    SCOPED_TRACE(DTypeName(q));
    const int64_t m = 2, k = 256, n = 24;
    GraphBuilder plain;
    {
      TensorId x = plain.Input("x", DType::kF32, {m, k});
      TensorId y = plain.MatMul(x, plain.Weight("w", q, {n, k}), "mm");
      plain.Output("y", plain.Add(plain.Input("residual", DType::kF32, {m, n}), y, "add"));
    }
    GraphBuilder fused;
    {
      TensorId x = fused.Input("x", DType::kF32, {m, k});
      fused.Output("y", fused.FusedMatMul({.epilogue = ops::FusedMatMul::Epilogue::kAdd},
                                          {x, fused.Weight("w", q, {n, k}),
                                           fused.Input("residual", DType::kF32, {m, n})},
                                          "fused"));
    }
    absl::StatusOr<Graph> a = std::move(plain).Build();
    absl::StatusOr<Graph> b = std::move(fused).Build();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectSameResults(*a, *b, RandomBound(*a, 9, {}, {}));
  }
}

// ---- Quantized weights in the fused step, where the backend runs them ------------------

// A Llama whose every matrix reads 256 or 512 columns: whole blocks of every format,
// K-quant super-blocks included.
LlamaConfig BlockFriendlyConfig() {
  LlamaConfig c = TinyLlamaConfig();
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.vocab_size = 300;
  return c;
}

// A mix as llama-quantize's Q4_K_M makes it, varied per layer so that every grouped matmul
// meets several formats: Q4_K for most matrices, Q6_K for v and down on alternate layers,
// Q5_0 / Q8_0 where a real file falls back from a K-quant, an f32 k in one layer (the
// float weight of x's dtype beside block formats in one group) and a Q6_K head.
DType MixedFormat(const std::string& name) {
  const bool layer0 = name.find("layers.0.") != std::string::npos;
  if (name.find("embed_tokens") != std::string::npos) return DType::kQ4_K;
  if (name.find("lm_head") != std::string::npos) return DType::kQ6_K;
  if (name.find("v_proj") != std::string::npos) return layer0 ? DType::kQ6_K : DType::kQ5_0;
  if (name.find("k_proj") != std::string::npos) return layer0 ? DType::kQ4_K : DType::kF32;
  if (name.find("down_proj") != std::string::npos) return layer0 ? DType::kQ8_0 : DType::kQ6_K;
  if (name.find("up_proj") != std::string::npos) return layer0 ? DType::kQ5_K : DType::kQ4_K;
  return DType::kQ4_K;
}

// Fused == plain, bit for bit, on the CPU reference for `c` (f32 activations, matrices in
// c.weight_dtypes): decode steps open and closed, with a padding row and a position past
// the cache, a prefill step, every pass (norm_into_matmul included), logits read or not.
// `check_fused` sees each fused graph.
template <typename Check>
void ExpectQuantizedFusedEqualsPlain(const LlamaConfig& c, Check check_fused) {
  struct Step {
    const char* what;
    LlamaGraphOptions options;
    std::vector<int32_t> ids, pos;
  };
  std::vector<Step> steps;
  steps.push_back({"decode, batch 1, closed loop",
                   {.batch = 1, .slots = 2, .max_seq = 16, .closed_loop = true}, {7}, {5}});
  steps.push_back({"decode, batch 3 (padding, a position past the cache)",
                   {.batch = 3, .slots = 4, .max_seq = 16}, {1, 2, 299}, {4, -1, 16}});
  steps.push_back({"prefill, 2 sequences of 3 rows",
                   {.batch = 2, .slots = 3, .max_seq = 16, .rows_per_seq = 3},
                   {3, 1, 4, 1, 5, 9}, {0, 1, 2, 6, 7, 8}});
  for (const Step& step : steps) {
    SCOPED_TRACE(step.what);
    absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, step.options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    auto bound = RandomBound(*plain, 42, step.ids, step.pos);
    if (bound.contains(kSeqSlotsInput)) {
      const std::vector<int32_t> slots = {2, 0};
      std::memcpy(bound.at(kSeqSlotsInput).data(), slots.data(), 8);
    }
    for (bool logits_read : {true, false}) {
      for (bool every_pass : {false, true}) {
        SCOPED_TRACE(absl::StrCat(logits_read ? "logits read" : "logits unread",
                                  every_pass ? ", every pass" : ", default passes"));
        PassOptions options = every_pass ? PassOptions{} : DefaultPassOptions();
        if (!logits_read) options.unread_outputs = {kLogitsOutput};
        absl::StatusOr<Graph> fused = RunPasses(*plain, options);
        ASSERT_TRUE(fused.ok()) << fused.status();
        EXPECT_LT(fused->num_nodes(), plain->num_nodes());
        check_fused(*fused, step.options);
        ExpectSameResults(*plain, *fused, bound);
      }
    }
  }
}

// Every projection of a fused decode step is fused: at most the lm head stays a plain
// MatMul (its logits read, and no norm folded into it by the default passes). A prefill
// step keeps q, k and v apart unless norm_into_matmul folds the norm into them.
void ExpectNoPlainMatMul(const Graph& g, const LlamaGraphOptions& o) {
  if (o.rows_per_seq > 1) return;
  for (const Node& n : g.nodes()) {
    if (std::holds_alternative<ops::MatMul>(n.op)) {
      EXPECT_EQ(n.name, "lm_head") << g.ToString();
    }
  }
}

TEST(PassesTest, QuantizedFusedEqualsPlainForEveryFormat) {
  for (DType q : kBlockFormats) {
    SCOPED_TRACE(DTypeName(q));
    LlamaConfig c = BlockFriendlyConfig();
    absl::StatusOr<LlamaConfig> qc =
        testing::WithMatrixDTypes(c, [q](const std::string&) { return q; });
    ASSERT_TRUE(qc.ok()) << qc.status();
    ExpectQuantizedFusedEqualsPlain(*qc, [q](const Graph& g, const LlamaGraphOptions& o) {
      ExpectNoPlainMatMul(g, o);
      int quantized_reads = 0;
      for (const Node& n : g.nodes()) {
        if (!std::holds_alternative<ops::FusedMatMul>(n.op)) continue;
        for (TensorId in : n.inputs) quantized_reads += g.tensor(in).dtype == q;
      }
      // Every projection of every layer (prefill: all but q, k and v unless a norm was
      // folded into them).
      EXPECT_GE(quantized_reads, o.rows_per_seq > 1 ? 4 * 2 : 7 * 2) << g.ToString();
    });
  }
}

TEST(PassesTest, MixedFormatFusedEqualsPlain) {
  absl::StatusOr<LlamaConfig> c = testing::WithMatrixDTypes(BlockFriendlyConfig(), MixedFormat);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectQuantizedFusedEqualsPlain(*c, [](const Graph& g, const LlamaGraphOptions& o) {
    ExpectNoPlainMatMul(g, o);
    if (o.rows_per_seq > 1) return;  // prefill keeps q, k and v apart
    // The grouped q/k/v of layer 0 reads Q4_K, Q4_K and Q6_K; of layer 1, Q4_K, f32, Q5_0.
    std::vector<std::vector<DType>> groups;
    for (const Node& n : g.nodes()) {
      const auto* f = std::get_if<ops::FusedMatMul>(&n.op);
      if (f == nullptr || f->weights != 3) continue;
      const int first = f->norm ? 2 : 1;
      groups.push_back({});
      for (int w = 0; w < 3; ++w) groups.back().push_back(g.tensor(n.inputs[first + w]).dtype);
    }
    ASSERT_EQ(groups.size(), 2u) << g.ToString();
    EXPECT_EQ(groups[0], (std::vector<DType>{DType::kQ4_K, DType::kQ4_K, DType::kQ6_K}));
    EXPECT_EQ(groups[1], (std::vector<DType>{DType::kQ4_K, DType::kF32, DType::kQ5_0}));
  });
  // The mix of tests/testing/quantized_config.h (the GPU checks' and benchmarks' Q4_K_M).
  absl::StatusOr<LlamaConfig> bench_mix =
      testing::WithMatrixDTypes(BlockFriendlyConfig(), testing::Q4KMixDType);
  ASSERT_TRUE(bench_mix.ok()) << bench_mix.status();
  ExpectQuantizedFusedEqualsPlain(*bench_mix, ExpectNoPlainMatMul);
}

TEST(PassesTest, QuantizedFusionFollowsTheBackendAndMatchesTheFloatStep) {
  absl::StatusOr<LlamaConfig> q = testing::WithMatrixDTypes(
      BlockFriendlyConfig(), [](const std::string&) { return DType::kQ4_K; });
  ASSERT_TRUE(q.ok()) << q.status();
  const LlamaGraphOptions o = DecodeOptions(true);
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(*q, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // A backend that refuses block formats in a FusedMatMul: the quantized matmuls stay plain.
  const RefusingBackend refuses(QuantizedFusedMatMul);
  PassOptions off_options = DefaultPassOptions();
  off_options.backend = &refuses;
  absl::StatusOr<Graph> off = RunPasses(*plain, off_options);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(OpCounts(*off)["MatMul"], 7 * 2 + 1);
  EXPECT_EQ(OpCounts(*off).count("FusedMatMul"), 0u);
  // The CPU reference's answer (no backend): the same nodes as the float model's fused
  // step, the head and its argmax included.
  PassOptions on = DefaultPassOptions();
  on.unread_outputs = {kLogitsOutput};
  absl::StatusOr<Graph> fused = RunPasses(*plain, on);
  ASSERT_TRUE(fused.ok()) << fused.status();
  absl::StatusOr<Graph> float_plain = BuildLlamaDecodeGraph(BlockFriendlyConfig(), o);
  ASSERT_TRUE(float_plain.ok()) << float_plain.status();
  PassOptions float_options = DefaultPassOptions();
  float_options.unread_outputs = {kLogitsOutput};
  absl::StatusOr<Graph> float_fused = RunPasses(*float_plain, float_options);
  ASSERT_TRUE(float_fused.ok()) << float_fused.status();
  EXPECT_EQ(OpCounts(*fused), OpCounts(*float_fused)) << fused->ToString();
  EXPECT_EQ(fused->num_nodes(), float_fused->num_nodes());

  // The mock runs the fused quantized step and records the block-format weights it reads.
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*fused);
  ASSERT_TRUE(plan.ok()) << plan.status();
  testing::HostBindings host(*plan, 3);
  const int32_t ids = 1, pos = 0;
  std::memcpy(host.tensor(kIdsInput).data(), &ids, 4);
  std::memcpy(host.tensor(kPosInput).data(), &pos, 4);
  MockDispatch mock;
  absl::StatusOr<ExecStats> stats = Execute(*plan, host.bindings(), mock);
  ASSERT_TRUE(stats.ok()) << stats.status();
  int quantized_fused = 0;
  for (const TraceEntry& t : mock.trace()) {
    if (t.op != "FusedMatMul") continue;
    for (const TraceArg& a : t.inputs) quantized_fused += a.dtype == DType::kQ4_K;
  }
  EXPECT_EQ(quantized_fused, 7 * 2 + 1);  // every projection and the head
}

TEST(PassesTest, RopeKvWriteEqualsRopeAndKvWrites) {
  // Rows: a live one, a padding row (pos -1: q unrotated, no cache write) and one past the
  // cache (q rotated, no write, the error flag raised), as the plain ops do; with head
  // norms, as HeadRmsNorm before each Rope.
  for (DType t : {DType::kF32, DType::kBF16}) {
   for (bool head_norm : {false, true}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(t), head_norm ? " head_norm" : ""));
    const int64_t rows = 3, kvh = 2, d = 16, seq = 8, h = 4;
    ops::Rope rope{.head_dim = static_cast<int32_t>(d), .theta = 10000.0f};
    rope.scaling = {ops::RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 64};
    GraphBuilder plain;
    {
      TensorId pos = plain.Input("pos", DType::kI32, {rows});
      TensorId q = plain.Input("q_in", t, {rows, h * d});
      TensorId k = plain.Input("k_in", t, {rows, kvh * d});
      TensorId v = plain.Input("v_in", t, {rows, kvh * d});
      TensorId kc = plain.State("kc", t, {rows, kvh, seq, d});
      TensorId vc = plain.State("vc", t, {rows, kvh, seq, d});
      if (head_norm) {
        q = plain.HeadRmsNorm(q, plain.Weight("q_norm", t, {d}), 1e-5f, "nq");
        k = plain.HeadRmsNorm(k, plain.Weight("k_norm", t, {d}), 1e-5f, "nk");
      }
      plain.Output("q", plain.Rope(q, pos, rope, "rq"));
      plain.KvWrite(plain.Rope(k, pos, rope, "rk"), pos, kc, "kw");
      plain.KvWrite(v, pos, vc, "vw");
    }
    absl::StatusOr<Graph> a = std::move(plain).Build();
    ASSERT_TRUE(a.ok()) << a.status();
    auto bound = RandomBound(*a, 3, {}, {4, -1, 9});
    // The fused graph reads q, k and v side by side.
    HostTensor qkv(t, Shape{rows, (h + 2 * kvh) * d});
    for (int64_t r = 0; r < rows; ++r) {
      int64_t c = 0;
      for (const char* part : {"q_in", "k_in", "v_in"}) {
        const HostTensor& src = bound.at(part);
        const int64_t cols = src.shape()[1];
        const int64_t e = DTypeBytes(t);
        std::memcpy(static_cast<std::byte*>(qkv.data()) + (r * qkv.shape()[1] + c) * e,
                    static_cast<const std::byte*>(src.data()) + r * cols * e, cols * e);
        c += cols;
      }
    }
    GraphBuilder fused;
    {
      TensorId qkv_in = fused.Input("qkv", t, {rows, (h + 2 * kvh) * d});
      TensorId pos = fused.Input("pos", DType::kI32, {rows});
      TensorId kc = fused.State("kc", t, {rows, kvh, seq, d});
      TensorId vc = fused.State("vc", t, {rows, kvh, seq, d});
      TensorId q = head_norm ? fused.RopeKvWrite(qkv_in, pos, kc, vc,
                                                 fused.Weight("q_norm", t, {d}),
                                                 fused.Weight("k_norm", t, {d}), 1e-5f, rope,
                                                 "fused")
                             : fused.RopeKvWrite(qkv_in, pos, kc, vc, rope, "fused");
      fused.Output("q", q);
    }
    absl::StatusOr<Graph> b = std::move(fused).Build();
    ASSERT_TRUE(b.ok()) << b.status();
    bound.emplace("qkv", std::move(qkv));
    const auto want = RunOnCpu(*a, bound);
    const auto got = RunOnCpu(*b, bound);
    for (const char* name : {"q", "kc", "vc", "error_flags"}) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(want.contains(name) && got.contains(name));
      EXPECT_EQ(got.at(name), want.at(name));
    }
    uint32_t flags = 0;
    std::memcpy(&flags, got.at("error_flags").data(), 4);
    EXPECT_NE(flags, 0u) << "position 9 is past a cache of 8";
   }
  }
}

// Qwen3's attention inputs: q and k through HeadRmsNorm before RoPE. qkv_rope_kv_write
// takes the norms into the RopeKvWrite (so the epilogue pass leaves it a node), and only
// when both heads are normed alike.
TEST(PassesTest, HeadNormsGoIntoTheRopeKvWrite) {
  const int64_t rows = 2, k = 24, kvh = 2, d = 8, seq = 8, h = 4;
  const ops::Rope rope{.head_dim = static_cast<int32_t>(d), .theta = 10000.0f};
  for (int variant = 0; variant < 3; ++variant) {  // both normed; only q; k's eps differs
    SCOPED_TRACE(variant);
    GraphBuilder b;
    TensorId x = b.Input("x", DType::kF32, {rows, k});
    TensorId pos = b.Input("pos", DType::kI32, {rows});
    TensorId q = b.MatMul(x, b.Weight("wq", DType::kF32, {h * d, k}), "q");
    TensorId kk = b.MatMul(x, b.Weight("wk", DType::kF32, {kvh * d, k}), "k");
    TensorId v = b.MatMul(x, b.Weight("wv", DType::kF32, {kvh * d, k}), "v");
    q = b.HeadRmsNorm(q, b.Weight("q_norm", DType::kF32, {d}), 1e-6f, "nq");
    if (variant != 1) {
      kk = b.HeadRmsNorm(kk, b.Weight("k_norm", DType::kF32, {d}), variant == 2 ? 1e-5f : 1e-6f,
                         "nk");
    }
    TensorId kc = b.KvWrite(b.Rope(kk, pos, rope, "rk"), pos,
                            b.State("kc", DType::kF32, {rows, kvh, seq, d}), "kw");
    TensorId vc = b.KvWrite(v, pos, b.State("vc", DType::kF32, {rows, kvh, seq, d}), "vw");
    b.Output("out", b.Attention(b.Rope(q, pos, rope, "rq"), kc, vc, pos, "attention"));
    absl::StatusOr<Graph> plain = std::move(b).Build();
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPasses(*plain);
    ASSERT_TRUE(fused.ok()) << fused.status();
    auto counts = OpCounts(*fused);
    if (variant == 0) {
      EXPECT_EQ(fused->num_nodes(), 3) << fused->ToString();  // product, RopeKvWrite, attention
      EXPECT_EQ(counts["HeadRmsNorm"], 0);
      ASSERT_EQ(counts["RopeKvWrite"], 1) << fused->ToString();
      for (const Node& n : fused->nodes()) {
        if (const auto* r = std::get_if<ops::RopeKvWrite>(&n.op)) {
          EXPECT_TRUE(r->head_norm);
          EXPECT_EQ(r->eps, 1e-6f);
        }
      }
    } else {
      EXPECT_EQ(counts["RopeKvWrite"], 0) << fused->ToString();
      EXPECT_EQ(counts["HeadRmsNorm"], variant == 1 ? 1 : 2);
    }
    ExpectSameResults(*plain, *fused, RandomBound(*plain, 5, {}, {3, 6}));
  }
}

// FusedMatMul(q, k, v) then RopeKvWrite, as qkv_rope_kv_write leaves them, with a
// head_dim of `d` and `readers` extra readers of the product.
absl::StatusOr<Graph> QkvThenRopeKvWrite(DType t, int64_t d, bool interleaved, bool norm,
                                         bool product_read_elsewhere) {
  const int64_t rows = 3, k = 40, kvh = 2, seq = 8, h = 4;
  ops::Rope rope{.head_dim = static_cast<int32_t>(d), .theta = 10000.0f,
                 .interleaved = interleaved};
  rope.scaling = {ops::RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 64};
  GraphBuilder b;
  std::vector<TensorId> in = {b.Input("x", t, {rows, k})};
  if (norm) in.push_back(b.Weight("norm_w", t, {k}));
  in.push_back(b.Weight("wq", t, {h * d, k}));
  in.push_back(b.Weight("wk", t, {kvh * d, k}));
  in.push_back(b.Weight("wv", t, {kvh * d, k}));
  TensorId pos = b.Input("pos", DType::kI32, {rows});
  TensorId kc = b.State("kc", t, {rows, kvh, seq, d});
  TensorId vc = b.State("vc", t, {rows, kvh, seq, d});
  TensorId qkv = b.FusedMatMul({.norm = norm, .eps = 1e-5f, .weights = 3}, in, "qkv");
  b.Output("q", b.RopeKvWrite(qkv, pos, kc, vc, rope, "rope_kv"));
  if (product_read_elsewhere) b.Output("qkv", qkv);
  return std::move(b).Build();
}

TEST(PassesTest, RopeKvWriteEpilogueEqualsFusedMatMulThenRopeKvWrite) {
  // Rows: a live one, a padding row and one past the cache (the error flag), compared
  // bit for bit with the two nodes: q, both caches and the flags.
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool interleaved : {false, true}) {
      for (bool norm : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(t), interleaved ? " interleaved" : "",
                                  norm ? " norm" : ""));
        absl::StatusOr<Graph> plain = QkvThenRopeKvWrite(t, 12, interleaved, norm, false);
        ASSERT_TRUE(plain.ok()) << plain.status();
        absl::StatusOr<Graph> fused = RunPass("rope_kv_write_epilogue", *plain);
        ASSERT_TRUE(fused.ok()) << fused.status();
        ASSERT_EQ(fused->num_nodes(), 1) << fused->ToString();
        const auto* f = std::get_if<ops::FusedMatMul>(&fused->nodes()[0].op);
        ASSERT_NE(f, nullptr);
        EXPECT_EQ(f->epilogue, ops::FusedMatMul::Epilogue::kRopeKvWrite);
        EXPECT_EQ(f->norm, norm);
        EXPECT_EQ(f->rope.interleaved, interleaved);
        const auto bound = RandomBound(*plain, 11, {}, {4, -1, 9});
        ExpectSameResults(*plain, *fused, bound);
        uint32_t flags = 0;
        std::memcpy(&flags, RunOnCpu(*fused, bound).at("error_flags").data(), 4);
        EXPECT_NE(flags, 0u) << "position 9 is past a cache of 8";
      }
    }
  }
}

TEST(PassesTest, RopeKvWriteEpilogueOnlyWhereTheBackendRunsIt) {
  // head_dim 6: for a backend whose block of four product columns would split a RoPE pair
  // (CUDA's), the RopeKvWrite stays; and a product that something else reads must stay
  // stored, whatever the backend.
  const RefusingBackend whole_pairs(RopeEpilogueOfOddPairs);
  PassOptions for_whole_pairs;
  for_whole_pairs.backend = &whole_pairs;
  for (auto [d, read_elsewhere] : {std::pair{6, false}, std::pair{8, true}}) {
    absl::StatusOr<Graph> plain = QkvThenRopeKvWrite(DType::kF32, d, false, false,
                                                     read_elsewhere);
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> out = RunPasses(*plain, for_whole_pairs);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(OpCounts(*out)["RopeKvWrite"], 1) << "d=" << d;
  }
  // The reference runs the epilogue at head_dim 6.
  absl::StatusOr<Graph> six = QkvThenRopeKvWrite(DType::kF32, 6, false, false, false);
  ASSERT_TRUE(six.ok()) << six.status();
  absl::StatusOr<Graph> six_on_cpu = RunPasses(*six);
  ASSERT_TRUE(six_on_cpu.ok()) << six_on_cpu.status();
  EXPECT_EQ(OpCounts(*six_on_cpu).count("RopeKvWrite"), 0u);
  ExpectSameResults(*six, *six_on_cpu, RandomBound(*six, 12, {}, {4, -1, 9}));
  // The full step with head_dim 6 keeps its RopeKvWrite nodes for such a backend, and
  // equals plain either way.
  LlamaConfig c = TinyLlamaConfig();
  c.head_dim = 6;
  c.num_hidden_layers = 1;
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, DecodeOptions(false, 2));
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Graph> fused = RunPasses(*plain, for_whole_pairs);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(OpCounts(*fused)["RopeKvWrite"], 1);
  const auto bound = RandomBound(*plain, 4, {5, 9}, {3, 7});
  ExpectSameResults(*plain, *fused, bound);
  absl::StatusOr<Graph> on_cpu = RunPasses(*plain);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ(OpCounts(*on_cpu).count("RopeKvWrite"), 0u);
  ExpectSameResults(*plain, *on_cpu, bound);
}

// A backend that refuses an op gets no node of it from any pass, and the graph the passes
// leave still computes what the plain one does; one that refuses everything gets the
// plain graph back.
TEST(PassesTest, WhatTheBackendRefusesStaysUnfused) {
  struct Refusal {
    const char* name;
    RefusingBackend::Rule rule;
  };
  const Refusal refusals[] = {
      {"every FusedMatMul",
       [](const Op& op, auto) { return std::holds_alternative<ops::FusedMatMul>(op); }},
      {"FusedMatMul with a norm",
       [](const Op& op, auto) {
         const auto* f = std::get_if<ops::FusedMatMul>(&op);
         return f != nullptr && f->norm;
       }},
      {"the silu_mul and add epilogues",
       [](const Op& op, auto) {
         const auto* f = std::get_if<ops::FusedMatMul>(&op);
         return f != nullptr && (f->epilogue == ops::FusedMatMul::Epilogue::kSiluMul ||
                                 f->epilogue == ops::FusedMatMul::Epilogue::kAdd);
       }},
      {"RopeKvWrite",
       [](const Op& op, auto) { return std::holds_alternative<ops::RopeKvWrite>(op); }},
      {"FusedElementwise of more than one step",
       [](const Op& op, auto) {
         const auto* f = std::get_if<ops::FusedElementwise>(&op);
         return f != nullptr && f->num_steps > 1;
       }},
      {"everything", [](const Op&, auto) { return true; }},
  };
  LlamaConfig c = TinyLlamaConfig();
  c.num_hidden_layers = 2;
  LlamaGraphOptions o = DecodeOptions(true, 2);
  o.slots = 3;
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const auto bound = RandomBound(*plain, 31, {7, 11}, {2, 5});
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    const RefusingBackend backend(r.rule);
    PassOptions options;  // every pass, the logits unread: every fusion is tried
    options.unread_outputs = {kLogitsOutput};
    options.backend = &backend;
    absl::StatusOr<Graph> fused = RunPasses(*plain, options);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_GT(backend.asked(), 0);
    // The nodes the passes made (the plain step has no fused op).
    std::vector<const Tensor*> inputs;
    for (const Node& n : fused->nodes()) {
      if (!std::holds_alternative<ops::FusedMatMul>(n.op) &&
          !std::holds_alternative<ops::RopeKvWrite>(n.op) &&
          !std::holds_alternative<ops::FusedElementwise>(n.op)) {
        continue;
      }
      inputs.clear();
      for (TensorId in : n.inputs) inputs.push_back(&fused->tensor(in));
      EXPECT_FALSE(r.rule(n.op, inputs)) << n.name << " was made though refused";
    }
    EXPECT_LE(fused->num_nodes(), plain->num_nodes());
    if (std::string(r.name) == "everything") {
      ASSERT_EQ(fused->num_nodes(), plain->num_nodes());
      for (int32_t i = 0; i < plain->num_nodes(); ++i) {
        EXPECT_EQ(fused->nodes()[i].name, plain->nodes()[i].name);
        EXPECT_EQ(OpName(fused->nodes()[i].op), OpName(plain->nodes()[i].op));
      }
    }
    ExpectSameResults(*plain, *fused, bound);
  }
}

TEST(PassesTest, FusedOpsRejectBadShapes) {
  GraphBuilder b;
  TensorId x = b.Input("x", DType::kF32, {2, 8});
  TensorId w1 = b.Weight("w1", DType::kF32, {4, 8});
  TensorId w2 = b.Weight("w2", DType::kF32, {5, 8});
  // SiluMul needs two weights of equal N.
  b.FusedMatMul({.weights = 2, .epilogue = ops::FusedMatMul::Epilogue::kSiluMul}, {x, w1, w2});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("silu_mul"), std::string::npos) << b.status();

  GraphBuilder c;
  TensorId cx = c.Input("x", DType::kF32, {2, 8});
  TensorId bad = c.Weight("w", DType::kF32, {4, 9});
  c.FusedMatMul({}, {cx, bad});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);

  GraphBuilder r;
  TensorId qkv = r.Input("qkv", DType::kF32, {1, 40});
  TensorId pos = r.Input("pos", DType::kI32, {1});
  TensorId kc = r.State("kc", DType::kF32, {1, 2, 16, 8});
  TensorId vc = r.State("vc", DType::kF32, {1, 2, 16, 8});
  ops::Rope rope;
  rope.head_dim = 8;
  TensorId q = r.RopeKvWrite(qkv, pos, kc, vc, rope);  // 40 - 2·16 = 8 columns of q
  ASSERT_TRUE(r.status().ok()) << r.status();
  (void)q;
  TensorId qkv2 = r.Input("qkv2", DType::kF32, {1, 36});
  r.RopeKvWrite(qkv2, pos, kc, vc, rope);  // 4 columns of q: not whole heads
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  // The rope_kv_write epilogue: three weights whose k and v match the caches.
  const ops::FusedMatMul rope_op{.weights = 3, .epilogue = ops::FusedMatMul::Epilogue::kRopeKvWrite,
                                 .rope = rope};
  auto epilogue = [&](int64_t nq, int64_t nk, int64_t nv) {
    GraphBuilder e;
    TensorId ex = e.Input("x", DType::kF32, {1, 8});
    e.FusedMatMul(rope_op,
                  {ex, e.Weight("wq", DType::kF32, {nq, 8}), e.Weight("wk", DType::kF32, {nk, 8}),
                   e.Weight("wv", DType::kF32, {nv, 8}), e.Input("pos", DType::kI32, {1}),
                   e.State("kc", DType::kF32, {1, 2, 16, 8}),
                   e.State("vc", DType::kF32, {1, 2, 16, 8})});
    return e.status();
  };
  EXPECT_TRUE(epilogue(24, 16, 16).ok()) << epilogue(24, 16, 16);
  EXPECT_EQ(epilogue(24, 8, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(epilogue(20, 16, 16).code(), absl::StatusCode::kInvalidArgument);  // 2.5 heads
  GraphBuilder two;
  two.FusedMatMul({.weights = 2, .epilogue = ops::FusedMatMul::Epilogue::kRopeKvWrite,
                   .rope = rope},
                  {two.Input("x", DType::kF32, {1, 8}), two.Weight("wq", DType::kF32, {8, 8}),
                   two.Weight("wk", DType::kF32, {16, 8}), two.Input("pos", DType::kI32, {1}),
                   two.State("kc", DType::kF32, {1, 2, 16, 8}),
                   two.State("vc", DType::kF32, {1, 2, 16, 8})});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);

  // RopeKvWrite's head norms: one weight of head_dim each, of qkv's dtype, a finite eps.
  auto head_norm = [&](int64_t q_len, DType k_dtype, float eps) {
    GraphBuilder h;
    h.RopeKvWrite(h.Input("qkv", DType::kF32, {1, 40}), h.Input("pos", DType::kI32, {1}),
                  h.State("kc", DType::kF32, {1, 2, 16, 8}),
                  h.State("vc", DType::kF32, {1, 2, 16, 8}),
                  h.Weight("q_norm", DType::kF32, {q_len}), h.Weight("k_norm", k_dtype, {8}),
                  eps, rope);
    return h.status();
  };
  EXPECT_TRUE(head_norm(8, DType::kF32, 1e-6f).ok()) << head_norm(8, DType::kF32, 1e-6f);
  EXPECT_NE(head_norm(16, DType::kF32, 1e-6f).message().find("q_norm"), std::string::npos)
      << head_norm(16, DType::kF32, 1e-6f);
  EXPECT_EQ(head_norm(8, DType::kBF16, 1e-6f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(head_norm(8, DType::kF32, std::nanf("")).message().find("eps"), std::string::npos);

  // MoeMatMul's silu_mul: w_up as w_gate, and one input for every chosen expert.
  auto moe = [&](Shape up, int64_t x_cols) {
    GraphBuilder m;
    m.MoeGateUpSiluMul(m.Input("x", DType::kF32, {2, x_cols}),
                       m.Weight("wg", DType::kF32, {4, 16, 8}), m.Weight("wu", DType::kF32, up),
                       m.Input("ids", DType::kI32, {2, 2}));
    return m.status();
  };
  EXPECT_TRUE(moe(Shape{4, 16, 8}, 8).ok()) << moe(Shape{4, 16, 8}, 8);
  EXPECT_EQ(moe(Shape{4, 12, 8}, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(moe(Shape{4, 16, 8}, 16).message().find("silu_mul"), std::string::npos)
      << moe(Shape{4, 16, 8}, 16);  // a per-slot x

  // MoeCombine's residual: the combined output's shape, in y's dtype.
  auto combine = [&](Shape residual, DType dtype) {
    GraphBuilder c;
    c.MoeCombineAdd(c.Input("y", DType::kF32, {2, 32}), c.Input("w", DType::kF32, {2, 2}),
                    c.Input("ids", DType::kI32, {2, 2}), c.Input("residual", dtype, residual));
    return c.status();
  };
  EXPECT_TRUE(combine(Shape{2, 16}, DType::kF32).ok()) << combine(Shape{2, 16}, DType::kF32);
  EXPECT_NE(combine(Shape{2, 32}, DType::kF32).message().find("residual"), std::string::npos)
      << combine(Shape{2, 32}, DType::kF32);
  EXPECT_NE(combine(Shape{2, 16}, DType::kBF16).message().find("residual"), std::string::npos)
      << combine(Shape{2, 16}, DType::kBF16);

  // MoeCombine's matmul: x [M, top_k·K] for w [E, N, K], w of x's dtype or quantized, and
  // the residual of the combined [M, N].
  auto down = [&](int64_t x_cols, DType w_dtype, Shape residual) {
    GraphBuilder c;
    const TensorId r =
        residual.rank() == 0 ? TensorId{} : c.Input("residual", DType::kF32, residual);
    c.MoeDownCombine(c.Input("x", DType::kF32, {2, x_cols}),
                     c.Weight("w", w_dtype, {4, 16, 32}), c.Input("w8", DType::kF32, {2, 2}),
                     c.Input("ids", DType::kI32, {2, 2}), {}, r);
    return c.status();
  };
  EXPECT_TRUE(down(64, DType::kF32, Shape{}).ok()) << down(64, DType::kF32, Shape{});
  EXPECT_TRUE(down(64, DType::kQ8_0, Shape{2, 16}).ok()) << down(64, DType::kQ8_0, Shape{2, 16});
  EXPECT_NE(down(32, DType::kF32, Shape{}).message().find("top_k*K=64"), std::string::npos)
      << down(32, DType::kF32, Shape{});  // one input for every expert
  EXPECT_EQ(down(64, DType::kBF16, Shape{}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(down(64, DType::kF32, Shape{2, 32}).message().find("residual"), std::string::npos)
      << down(64, DType::kF32, Shape{2, 32});
}

// ---- elementwise_chain -------------------------------------------------------------------

const Node* FindNode(const Graph& g, absl::string_view op) {
  for (const Node& n : g.nodes()) {
    if (OpName(n.op) == op) return &n;
  }
  return nullptr;
}

TEST(PassesTest, ElementwiseChainsBecomeOneNode) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    GraphBuilder b;
    const Shape shape{3, 37};
    TensorId g = b.Input("g", t, shape), u = b.Input("u", t, shape);
    TensorId r = b.Input("r", t, shape), z = b.Input("z", t, shape);
    // A: silu, mul, add, then silu_mul reading the sum twice: one node of four steps.
    TensorId h = b.Add(b.Mul(b.Silu(g, "a.silu"), u, "a.mul"), r, "a.add");
    b.Output("a", b.SiluMul(h, h, "a.out"));
    // B: a sum that is also a graph output stays a node of its own, as does its reader.
    TensorId p = b.Add(z, r, "b.add");
    b.Output("p", p);
    b.Output("q", b.Mul(p, z, "b.mul"));
    // C: a silu read by two nodes stays; the two and their sum become one node.
    TensorId c1 = b.Silu(z, "c.silu");
    b.Output("c", b.Add(b.Add(c1, g, "c.add"), b.Mul(c1, u, "c.mul"), "c.out"));
    absl::StatusOr<Graph> plain = std::move(b).Build();
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPass("elementwise_chain", *plain);
    ASSERT_TRUE(fused.ok()) << fused.status();
    const std::map<std::string, int> ops = OpCounts(*fused);
    EXPECT_EQ(ops.at("FusedElementwise"), 2) << fused->ToString();
    EXPECT_EQ(ops.at("Add"), 1);
    EXPECT_EQ(ops.at("Mul"), 1);
    EXPECT_EQ(ops.at("Silu"), 1);
    EXPECT_EQ(fused->num_nodes(), 5);
    // A's steps, values numbered inputs first (g, u, r), then steps.
    const Node* a = FindNode(*fused, "FusedElementwise");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->name, "a.out");
    EXPECT_EQ(a->inputs.size(), 3u);
    EXPECT_EQ(OpParamsToString(a->op), "silu(0) mul(3,1) add(4,2) silu_mul(5,5)");
    ExpectSameResults(*plain, *fused, RandomBound(*plain, 11, {}, {}));
    // Also among the default passes, after the matmul fusions.
    absl::StatusOr<Graph> all = RunPasses(*plain, DefaultPassOptions());
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(OpCounts(*all).at("FusedElementwise"), 2);
    PassOptions off = DefaultPassOptions();
    off.disabled.insert("elementwise_chain");
    absl::StatusOr<Graph> kept = RunPasses(*plain, off);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->num_nodes(), plain->num_nodes());
  }
}

TEST(PassesTest, ElementwiseChainsStopAtTheLimits) {
  // Twelve adds of thirteen distinct inputs: more than one FusedElementwise takes.
  GraphBuilder b;
  TensorId acc = b.Input("x0", DType::kBF16, {2, 64});
  for (int i = 1; i <= 12; ++i) {
    acc = b.Add(acc, b.Input(absl::StrCat("x", i), DType::kBF16, {2, 64}));
  }
  b.Output("sum", acc);
  absl::StatusOr<Graph> plain = std::move(b).Build();
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Graph> fused = RunPass("elementwise_chain", *plain);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(OpCounts(*fused).count("Add"), 0u) << fused->ToString();
  EXPECT_EQ(OpCounts(*fused).at("FusedElementwise"), 2) << fused->ToString();
  for (const Node& n : fused->nodes()) {
    const auto& f = std::get<ops::FusedElementwise>(n.op);
    EXPECT_LE(n.inputs.size(), static_cast<size_t>(ops::FusedElementwise::kMaxInputs));
    EXPECT_LE(f.num_steps, ops::FusedElementwise::kMaxSteps);
  }
  ExpectSameResults(*plain, *fused, RandomBound(*plain, 12, {}, {}));

  // Integer adds are not chained.
  GraphBuilder i;
  TensorId k = i.Input("k", DType::kI32, {4});
  i.Output("k3", i.Add(i.Add(k, k), k));
  absl::StatusOr<Graph> ints = std::move(i).Build();
  ASSERT_TRUE(ints.ok());
  absl::StatusOr<Graph> same = RunPass("elementwise_chain", *ints);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(OpCounts(*same).at("Add"), 2);
}

TEST(PassesTest, FusedElementwiseRejectsBadChains) {
  using F = ops::FusedElementwise;
  auto build = [](const F& op, int inputs, DType second = DType::kF32) {
    GraphBuilder b;
    std::vector<TensorId> in;
    for (int i = 0; i < inputs; ++i) {
      in.push_back(b.Input(absl::StrCat("x", i), i == 1 ? second : DType::kF32, {2, 8}));
    }
    b.FusedElementwise(op, in, "chain");
    return b.status();
  };
  F ok;
  ok.num_steps = 2;
  ok.steps[0] = {F::Kind::kSiluMul, 0, 1};
  ok.steps[1] = {F::Kind::kSilu, 2, 0};
  EXPECT_TRUE(build(ok, 2).ok()) << build(ok, 2);
  F none = ok;
  none.num_steps = 0;
  EXPECT_EQ(build(none, 2).code(), absl::StatusCode::kInvalidArgument);
  F later = ok;
  later.steps[0].b = 2;  // its own value
  const absl::Status s = build(later, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("step 0"), std::string::npos) << s;
  F unary_b = ok;
  unary_b.steps[1].b = 1;
  EXPECT_EQ(build(unary_b, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(build(ok, 2, DType::kBF16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(build(ok, 0).code(), absl::StatusCode::kInvalidArgument);
  F big = ok;
  big.num_steps = F::kMaxSteps + 1;
  EXPECT_EQ(build(big, 2).code(), absl::StatusCode::kInvalidArgument);
}

// ---- Writes besides outputs (WrittenInputs) ---------------------------------------------

TEST(PassesTest, NodesWhoseOnlyEffectIsAWriteAreKeptInOrder) {
  // No graph output at all: each node's effect is the State it writes (in place, or as the
  // side effect of a RopeKvWrite whose q nothing reads).
  const int64_t rows = 2, k = 16, kvh = 1, d = 8, seq = 8, h = 2;
  const ops::Rope rope{.head_dim = static_cast<int32_t>(d)};
  GraphBuilder b;
  TensorId x = b.Input("x", DType::kF32, {rows, k});
  TensorId pos = b.State("pos", DType::kI32, {rows});
  TensorId kc = b.State("kc", DType::kF32, {rows, kvh, seq, d});
  TensorId vc = b.State("vc", DType::kF32, {rows, kvh, seq, d});
  TensorId kc2 = b.State("kc2", DType::kF32, {rows, kvh, seq, d});
  TensorId wk = b.Weight("wk", DType::kF32, {kvh * d, k});
  TensorId qkv = b.FusedMatMul({.weights = 3},
                               {x, b.Weight("wq", DType::kF32, {h * d, k}), wk,
                                b.Weight("wv", DType::kF32, {kvh * d, k})},
                               "qkv");
  b.RopeKvWrite(qkv, pos, kc, vc, rope, "rope_kv");
  b.KvWrite(b.Rope(b.MatMul(x, wk, "k2"), pos, rope, "rk2"), pos, kc2, "kw2");
  b.Advance(pos, "advance");
  absl::StatusOr<Graph> plain = std::move(b).Build();
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(plain->outputs().empty());
  absl::StatusOr<Graph> fused = RunPasses(*plain);
  ASSERT_TRUE(fused.ok()) << fused.status();
  // The product and its RopeKvWrite become one node that still writes both caches; the
  // other writes stay where they were, the Advance last.
  std::vector<std::string> names;
  for (const Node& n : fused->nodes()) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"qkv_rope_kv_write", "k2", "rk2", "kw2",
                                             "advance"}))
      << fused->ToString();
  EXPECT_TRUE(WritesInputs(fused->nodes()[0].op));
  ExpectSameResults(*plain, *fused, RandomBound(*plain, 21, {}, {3, 5}));
  // The States do change: a run that kept no node would leave them as bound.
  const auto bound = RandomBound(*plain, 21, {}, {3, 5});
  const auto after = RunOnCpu(*fused, bound);
  for (const char* name : {"kc", "vc", "kc2", "pos"}) {
    const HostTensor& before = bound.at(name);
    const auto* p = static_cast<const std::byte*>(before.data());
    EXPECT_NE(after.at(name), std::vector<std::byte>(p, p + before.bytes())) << name;
  }
}

// A fusion moves a computation from its producer to its consumer. `write_between` puts a
// Copy into x (an Input) between them, which the fused node must not read past.
struct MovePattern {
  const char* pass;
  const char* moved_op;  // an op the fusion removes from the graph
  std::function<void(GraphBuilder&, TensorId x, const std::function<void()>& write)> build;
};

std::vector<MovePattern> MovePatterns() {
  constexpr int64_t rows = 2, k = 16, n = 8, kvh = 1, d = 8, seq = 8, h = 2;
  const DType t = DType::kF32;
  return {
      {"residual_add", "MatMul",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId p = b.MatMul(x, b.Weight("w", t, {n, k}), "p");
         write();
         b.Output("y", b.Add(b.Input("r", t, {rows, n}), p, "y"));
       }},
      {"all_reduce_add", "Add",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId p = b.AllReduce(x, 1, "p");
         write();
         b.Output("y", b.Add(p, b.Input("r", t, {rows, k}), "y"));
       }},
      {"gate_up_silu_mul", "MatMul",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId g = b.MatMul(x, b.Weight("wg", t, {n, k}), "g");
         TensorId u = b.MatMul(x, b.Weight("wu", t, {n, k}), "u");
         write();
         b.Output("y", b.SiluMul(g, u, "y"));
       }},
      {"moe_gate_up_silu_mul", "SiluMul",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         // 128 experts: the random i32 ids (0 to 99) all choose one.
         TensorId experts = b.Input("experts", DType::kI32, {rows, 2});
         TensorId g = b.MoeMatMul(x, b.Weight("wg", t, {128, n, k}), experts, "g");
         TensorId u = b.MoeMatMul(x, b.Weight("wu", t, {128, n, k}), experts, "u");
         write();
         b.Output("y", b.SiluMul(g, u, "y"));
       }},
      {"moe_combine_add", "Add",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         // x as the outputs of two chosen experts of k / 2 columns each.
         TensorId combined = b.MoeCombine(x, b.Input("route", t, {rows, 2}),
                                          b.Input("experts", DType::kI32, {rows, 2}), "c");
         write();
         b.Output("y", b.Add(b.Input("r", t, {rows, k / 2}), combined, "y"));
       }},
      {"moe_route_into_combine", "MoeRouteWeights",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         // x as a router's logits over k experts; two chosen a row.
         TensorId experts = b.Input("experts", DType::kI32, {rows, 2});
         TensorId w = b.MoeRouteWeights(x, experts, {.renormalize = false}, "w");
         write();
         b.Output("y", b.MoeCombine(b.Input("ey", t, {rows, 2 * n}), w, experts, "y"));
       }},
      {"moe_down_into_combine", "MoeMatMul",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         // x as two chosen experts' own inputs of k / 2 columns each.
         TensorId experts = b.Input("experts", DType::kI32, {rows, 2});
         TensorId y = b.MoeMatMul(x, b.Weight("w", t, {128, n, k / 2}), experts, "down");
         write();
         b.Output("y", b.MoeCombine(y, b.Input("route", t, {rows, 2}), experts, "y"));
       }},
      {"lm_head_argmax", "Argmax",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId logits = b.MatMul(x, b.Weight("w", t, {n, k}), "logits");
         write();
         b.Output("y", b.Argmax(logits, "y"));
       }},
      {"norm_into_matmul", "RmsNorm",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId normed = b.RmsNorm(x, b.Weight("norm_w", t, {k}), 1e-5f, "norm");
         write();
         b.Output("y", b.MatMul(normed, b.Weight("w", t, {n, k}), "y"));
       }},
      {"elementwise_chain", "Silu",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId s = b.Silu(x, "s");
         write();
         b.Output("y", b.Mul(s, b.Input("c", t, {rows, k}), "y"));
       }},
      {"rope_kv_write_epilogue", "RopeKvWrite",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         TensorId qkv = b.FusedMatMul({.weights = 3},
                                      {x, b.Weight("wq", t, {h * d, k}),
                                       b.Weight("wk", t, {kvh * d, k}),
                                       b.Weight("wv", t, {kvh * d, k})},
                                      "qkv");
         write();
         b.Output("y", b.RopeKvWrite(qkv, b.Input("pos", DType::kI32, {rows}),
                                     b.State("kc", t, {rows, kvh, seq, d}),
                                     b.State("vc", t, {rows, kvh, seq, d}),
                                     {.head_dim = static_cast<int32_t>(d)}, "y"));
       }},
      {"qkv_rope_kv_write", "KvWrite",
       [=](GraphBuilder& b, TensorId x, const std::function<void()>& write) {
         const ops::Rope rope{.head_dim = static_cast<int32_t>(d)};
         TensorId pos = b.Input("pos", DType::kI32, {rows});
         TensorId q = b.MatMul(x, b.Weight("wq", t, {h * d, k}), "q");
         TensorId kk = b.MatMul(x, b.Weight("wk", t, {kvh * d, k}), "k");
         TensorId v = b.MatMul(x, b.Weight("wv", t, {kvh * d, k}), "v");
         write();
         TensorId kc = b.KvWrite(b.Rope(kk, pos, rope, "rk"), pos,
                                 b.State("kc", t, {rows, kvh, seq, d}), "kw");
         TensorId vc = b.KvWrite(v, pos, b.State("vc", t, {rows, kvh, seq, d}), "vw");
         b.Output("y", b.Attention(b.Rope(q, pos, rope, "rq"), kc, vc, pos, "y"));
       }},
  };
}

TEST(PassesTest, FusionsNeverMoveAReadPastAWrite) {
  for (const MovePattern& m : MovePatterns()) {
    for (bool write_between : {false, true}) {
      SCOPED_TRACE(absl::StrCat(m.pass, write_between ? ", x written between" : ""));
      GraphBuilder b;
      TensorId x = b.Input("x", DType::kF32, {2, 16});
      TensorId x_next = b.Input("x_next", DType::kF32, {2, 16});
      // Without the write, a Copy into another Input takes its place: the same nodes.
      TensorId other = b.Input("other", DType::kF32, {2, 16});
      m.build(b, x, [&] { b.Copy(x_next, write_between ? x : other, "overwrite"); });
      absl::StatusOr<Graph> plain = std::move(b).Build();
      ASSERT_TRUE(plain.ok()) << plain.status();
      PassOptions only;
      for (const std::string& name : PassNames()) {
        if (name != m.pass) only.disabled.insert(name);
      }
      absl::StatusOr<Graph> fused = RunPasses(*plain, only);
      ASSERT_TRUE(fused.ok()) << fused.status();
      const int before = OpCounts(*plain)[m.moved_op];
      const int after = OpCounts(*fused)[m.moved_op];
      if (write_between) {
        EXPECT_EQ(after, before) << fused->ToString();
      } else {
        EXPECT_LT(after, before) << fused->ToString();
      }
      ExpectSameResults(*plain, *fused, RandomBound(*plain, 31, {}, {3, 5}));
    }
  }
}

}  // namespace
}  // namespace sg
