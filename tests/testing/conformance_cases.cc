// The op-conformance table: every op of SG_OP_LIST at decode shapes, in f32, bf16 and
// f16, plus whole one- and four-layer Llama steps. CUDA-free, so that a build without CUDA
// checks that every case builds and that every op has one (op_coverage_test); the GPU
// runs them on the CPU reference and on CudaDispatch and compares (conformance_cuda_test,
// see tests/testing/conformance.h).
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/passes.h"
#include "tests/testing/conformance.h"
#include "tests/testing/family_configs.h"

namespace sg::testing {
namespace {

constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

double Tol(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

std::string Name(absl::string_view op, DType t, absl::string_view shape) {
  return absl::StrCat(op, "/", DTypeName(t), "/", shape);
}

// Penalize's params for 5 slots over a vocabulary of v: slot 0 neutral, 1 repetition with
// presence and frequency, 2 biases only (one id twice, one out of range), 3 min-p only, 4
// everything; the rest of each row stays random (beyond the bias count, never read).
std::vector<float> PenaltyCaseParams(int64_t v) {
  constexpr int64_t p = ops::kPenaltyParams;
  std::vector<float> out(5 * p, 0.0f);
  auto row = [&](int64_t s, float r, float a, float f, float margin,
                 std::vector<std::pair<float, float>> bias) {
    float* q = out.data() + s * p;
    q[ops::kPenaltyRepetition] = r;
    q[ops::kPenaltyPresence] = a;
    q[ops::kPenaltyFrequency] = f;
    q[ops::kPenaltyMinPMargin] = margin;
    q[ops::kPenaltyBiasCount] = static_cast<float>(bias.size());
    for (size_t j = 0; j < bias.size(); ++j) {
      q[ops::kPenaltyBiasFirst + 2 * j] = bias[j].first;
      q[ops::kPenaltyBiasFirst + 2 * j + 1] = bias[j].second;
    }
  };
  const float off = -std::numeric_limits<float>::infinity();
  const float last = static_cast<float>(v - 1);
  row(0, 1.0f, 0.0f, 0.0f, off, {});
  row(1, 1.3f, 0.4f, 0.15f, off, {});
  row(2, 1.0f, 0.0f, 0.0f, off, {{5, 3.5f}, {last, -2.25f}, {5, 0.3f}, {static_cast<float>(v), 9}});
  row(3, 1.0f, 0.0f, 0.0f, 0.7f * std::log(0.05f), {});
  row(4, 0.8f, -0.3f, 0.7f, 1.2f * std::log(0.1f), {{17, 100.0f}, {0, -100.0f}});
  return out;
}

}  // namespace

absl::StatusOr<Graph> BuildCase(const OpCase& c) {
  if (c.graph) return c.graph();
  GraphBuilder b;
  c.build(b);
  return std::move(b).Build();
}

std::map<int32_t, HostTensor> CaseInputs(const OpCase& c, const Graph& g) {
  std::map<int32_t, HostTensor> host;
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind == TensorKind::kIntermediate) continue;
    HostTensor h(t.dtype, t.shape);
    if (t.dtype == DType::kI32) {
      h.FillUniform(c.seed * 1000 + i, static_cast<float>(c.int_lo),
                    static_cast<float>(c.int_hi));
      for (const auto& [name, values] : c.int_values) {
        if (name != t.name) continue;
        auto* p = static_cast<int32_t*>(h.data());
        for (int64_t k = 0; k < h.size() && k < static_cast<int64_t>(values.size()); ++k) {
          p[k] = values[k];
        }
      }
    } else {
      h.FillUniform(c.seed * 1000 + i, -c.float_range, c.float_range);
      for (const auto& [name, values] : c.float_values) {
        if (name != t.name || t.dtype != DType::kF32) continue;
        auto* p = static_cast<float*>(h.data());
        for (int64_t k = 0; k < h.size() && k < static_cast<int64_t>(values.size()); ++k) {
          p[k] = values[k];
        }
      }
    }
    host.emplace(i, std::move(h));
  }
  return host;
}

std::vector<OpCase> ConformanceCases() {
  std::vector<OpCase> cases;
  auto add = [&](OpCase c) { cases.push_back(std::move(c)); };

  for (DType t : kFloatTypes) {
    // Embedding.
    for (int64_t m : {1, 8}) {
      add({.name = Name("Embedding", t, absl::StrCat("V1000xH256/M", m)),
           .build = [=](GraphBuilder& b) {
             auto out = b.Embedding(b.Weight("table", t, {1000, 256}), b.Input("ids", DType::kI32, {m}));
             b.Output("out", out);
           },
           .tolerance = 0.0,
           .int_hi = 1000});
    }
    add({.name = Name("Embedding", t, "bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.Embedding(b.Weight("table", t, {64, 128}), b.Input("ids", DType::kI32, {4})));
         },
         .tolerance = 0.0,
         .int_values = {{"ids", {-1, 5, 64, 7}}}});

    // MatMul, with and without bias, at decode shapes and odd ones.
    struct Mm { int64_t m, k, n; bool bias; };
    for (Mm s : {Mm{1, 2048, 2048, false}, Mm{1, 2048, 512, false}, Mm{8, 2048, 8192, false},
                 Mm{1, 8192, 2048, false}, Mm{3, 257, 129, false}, Mm{8, 512, 1000, true},
                 Mm{1, 64, 64, true}}) {
      add({.name = Name("MatMul", t, absl::StrCat(s.m, "x", s.k, "x", s.n, s.bias ? "+bias" : "")),
           .build = [=](GraphBuilder& b) {
             auto x = b.Input("x", t, {s.m, s.k});
             auto w = b.Weight("w", t, {s.n, s.k});
             b.Output("out", s.bias ? b.MatMul(x, w, b.Weight("bias", t, {s.n})) : b.MatMul(x, w));
           },
           .tolerance = Tol(t)});
    }

    for (int64_t rows : {1, 8}) {
      for (int64_t h : {2048, 100}) {
        const std::string shape = absl::StrCat(rows, "x", h);
        add({.name = Name("RmsNorm", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.RmsNorm(b.Input("x", t, {rows, h}), b.Weight("w", t, {h}), 1e-5f));
             },
             .tolerance = Tol(t)});
        add({.name = Name("Add", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.Add(b.Input("a", t, {rows, h}), b.Input("b", t, {rows, h})));
             },
             .tolerance = Tol(t)});
        add({.name = Name("Mul", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.Mul(b.Input("a", t, {rows, h}), b.Input("b", t, {rows, h})));
             },
             .tolerance = Tol(t)});
        add({.name = Name("Silu", t, shape),
             .build = [=](GraphBuilder& b) { b.Output("out", b.Silu(b.Input("x", t, {rows, h}))); },
             .tolerance = Tol(t), .float_range = 6.0f});
        add({.name = Name("SiluMul", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.SiluMul(b.Input("g", t, {rows, h}), b.Input("u", t, {rows, h})));
             },
             .tolerance = Tol(t), .float_range = 6.0f});
        add({.name = Name("Softmax", t, shape),
             .build = [=](GraphBuilder& b) { b.Output("out", b.Softmax(b.Input("x", t, {rows, h}))); },
             .tolerance = Tol(t), .float_range = 8.0f});
        add({.name = Name("GeluTanhMul", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.GeluTanhMul(b.Input("g", t, {rows, h}), b.Input("u", t, {rows, h})));
             },
             .tolerance = Tol(t), .float_range = 6.0f});
        // Gemma's embedding scale √2304 = 48 and an inexact one (√2048, rounded to t).
        for (float factor : {48.0f, 45.254834f}) {
          add({.name = Name("Scale", t, absl::StrCat(shape, "/", factor)),
               .build = [=](GraphBuilder& b) {
                 b.Output("out", b.Scale(b.Input("x", t, {rows, h}), factor));
               },
               .tolerance = Tol(t)});
        }
        // Collectives of a group of one (a copy, bit for bit): the dispatcher's own
        // group; groups of several ranks run in tensor_parallel_test (CPU threads) and
        // cuda_tensor_parallel_test (GPUs).
        add({.name = Name("AllReduce", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.AllReduce(b.Input("x", t, {rows, h}), 1));
             },
             .tolerance = 0.0});
        add({.name = Name("AllReduceResidual", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.AllReduce(b.Input("x", t, {rows, h}), 1, {},
                                           b.Input("r", t, {rows, h})));
             },
             .tolerance = 0.0});
        add({.name = Name("AllGather", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.AllGather(b.Input("x", t, {rows, h}), 1));
             },
             .tolerance = 0.0});
        // Gemma 2's final cap 30 over logits that reach past it.
        add({.name = Name("Softcap", t, shape),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.Softcap(b.Input("x", t, {rows, h}), 30.0f));
             },
             .tolerance = Tol(t), .float_range = 90.0f});
      }
    }
    // HeadRmsNorm: Qwen3's q and k norms (head_dim 128, 16 and 8 heads) and a small head.
    struct Hn { int64_t rows, heads, d; };
    for (Hn s : {Hn{1, 16, 128}, Hn{8, 8, 128}, Hn{3, 4, 16}}) {
      add({.name = Name("HeadRmsNorm", t, absl::StrCat(s.rows, "x", s.heads, "x", s.d)),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.HeadRmsNorm(b.Input("x", t, {s.rows, s.heads * s.d}),
                                           b.Weight("w", t, {s.d}), 1e-6f));
           },
           .tolerance = Tol(t)});
    }
    // Mixture of experts: Qwen3-30B-A3B's routing (128 experts, top 8), Mixtral's (8, top
    // 2) and top 1; the experts' matmuls at small shapes, an expert input shared by the
    // chosen experts (gate, up) and one per expert (down), odd sizes (scalar loads, a
    // partial block of columns), and ids out of range. Random bf16/f16 logits in [-4, 4)
    // over 128 experts tie often: the lower index must come first.
    struct Moe { int64_t rows, experts, top_k; };
    for (Moe s : {Moe{1, 128, 8}, Moe{5, 8, 2}, Moe{7, 64, 1}}) {
      const std::string shape = absl::StrCat(s.rows, "x", s.experts, "/top", s.top_k);
      add({.name = Name("MoeTopK", t, shape),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeTopK(b.Input("logits", t, {s.rows, s.experts}),
                                       static_cast<int32_t>(s.top_k)));
           },
           .tolerance = 0.0, .float_range = 4.0f});
      for (ops::MoeRouteWeights route : {ops::MoeRouteWeights{false, false},
                                         ops::MoeRouteWeights{true, false},
                                         ops::MoeRouteWeights{true, true}}) {
        add({.name = Name("MoeRouteWeights", t,
                          absl::StrCat(shape, route.renormalize ? "/norm" : "",
                                       route.round_to_dtype ? "/round" : "")),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.MoeRouteWeights(b.Input("logits", t, {s.rows, s.experts}),
                                                 b.Input("ids", DType::kI32, {s.rows, s.top_k}),
                                                 route));
             },
             .tolerance = Tol(t), .int_hi = static_cast<int32_t>(s.experts),
             .float_range = 4.0f});
      }
    }
    add({.name = Name("MoeRouteWeights", t, "bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeRouteWeights(b.Input("logits", t, {3, 8}),
                                             b.Input("ids", DType::kI32, {3, 2}), {true, false}));
         },
         .tolerance = Tol(t), .int_values = {{"ids", {0, 3, -1, 5, 8, 2}}}, .float_range = 4.0f});
    struct MoeMm { int64_t rows, experts, top_k, n, k; bool per_slot; };
    // The last three have enough pairs per expert to walk by expert (a prefill step;
    // CudaOptions::moe_by_expert_pairs), the last more pairs than one window holds.
    for (MoeMm s : {MoeMm{1, 16, 4, 96, 128, false}, MoeMm{3, 8, 2, 64, 96, true},
                    MoeMm{4, 128, 8, 64, 128, false}, MoeMm{6, 32, 1, 200, 256, false},
                    MoeMm{2, 8, 2, 33, 37, true}, MoeMm{64, 16, 4, 64, 128, false},
                    MoeMm{40, 8, 2, 48, 96, true}, MoeMm{300, 8, 4, 16, 64, false}}) {
      const std::string shape = absl::StrCat(s.rows, "x", s.experts, "x", s.n, "x", s.k, "/top",
                                             s.top_k, s.per_slot ? "/per_slot" : "");
      add({.name = Name("MoeMatMul", t, shape),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeMatMul(
                                 b.Input("x", t, {s.rows, s.per_slot ? s.top_k * s.k : s.k}),
                                 b.Weight("w", t, {s.experts, s.n, s.k}),
                                 b.Input("ids", DType::kI32, {s.rows, s.top_k})));
           },
           .tolerance = Tol(t), .int_hi = static_cast<int32_t>(s.experts)});
    }
    add({.name = Name("MoeMatMul", t, "bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeMatMul(b.Input("x", t, {2, 32}), b.Weight("w", t, {4, 16, 32}),
                                       b.Input("ids", DType::kI32, {2, 3})));
         },
         .tolerance = Tol(t),
         .int_values = {{"ids", {0, -1, 3, 4, 2, 1000}}}});
    // The gate and up experts with their SiluMul (silu_mul): Qwen3-MoE's 128 experts and
    // top 8, odd sizes (scalar loads), and bad ids (zeros).
    for (MoeMm s : {MoeMm{1, 128, 8, 64, 128, false}, MoeMm{3, 8, 2, 33, 37, false},
                    MoeMm{64, 16, 4, 40, 64, false}}) {
      add({.name = Name("MoeMatMul", t,
                        absl::StrCat("silu_mul/", s.rows, "x", s.experts, "x", s.n, "x", s.k,
                                     "/top", s.top_k)),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeGateUpSiluMul(b.Input("x", t, {s.rows, s.k}),
                                                b.Weight("wg", t, {s.experts, s.n, s.k}),
                                                b.Weight("wu", t, {s.experts, s.n, s.k}),
                                                b.Input("ids", DType::kI32, {s.rows, s.top_k})));
           },
           .tolerance = Tol(t), .int_hi = static_cast<int32_t>(s.experts)});
    }
    // Bad ids among enough pairs to walk by expert: zeros and the flag there too.
    {
      std::vector<int32_t> ids(32);
      for (int i = 0; i < 32; ++i) ids[i] = i % 5 == 4 ? (i % 2 == 0 ? -3 : 4) : i % 4;
      add({.name = Name("MoeMatMul", t, "by_expert/bad_ids"),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeMatMul(b.Input("x", t, {16, 64}), b.Weight("w", t, {4, 16, 64}),
                                         b.Input("ids", DType::kI32, {16, 2})));
           },
           .tolerance = Tol(t), .int_values = {{"ids", ids}}});
    }
    add({.name = Name("MoeMatMul", t, "silu_mul/bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeGateUpSiluMul(b.Input("x", t, {2, 32}),
                                              b.Weight("wg", t, {4, 16, 32}),
                                              b.Weight("wu", t, {4, 16, 32}),
                                              b.Input("ids", DType::kI32, {2, 3})));
         },
         .tolerance = Tol(t),
         .int_values = {{"ids", {0, -1, 3, 4, 2, 1000}}}});
    // Ids drawn from 128 experts (rarely equal) and from 3 (often equal: ties by slot).
    struct Mc { int64_t top_k; int32_t experts; };
    for (Mc s : {Mc{1, 128}, Mc{2, 128}, Mc{8, 128}, Mc{8, 3}}) {
      add({.name = Name("MoeCombine", t, absl::StrCat("3x", s.top_k, "x256/E", s.experts)),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeCombine(b.Input("y", t, {3, s.top_k * 256}),
                                          b.Input("weights", DType::kF32, {3, s.top_k}),
                                          b.Input("ids", DType::kI32, {3, s.top_k})));
           },
           .tolerance = Tol(t), .int_hi = s.experts});
    }
    add({.name = Name("MoeCombine", t, "5x4x100/weights_of_y_dtype"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeCombine(b.Input("y", t, {5, 4 * 100}),
                                        b.Input("weights", t, {5, 4}),
                                        b.Input("ids", DType::kI32, {5, 4})));
         },
         .tolerance = Tol(t), .int_hi = 6});
    // With the layer's residual added (moe_combine_add): ties among 3 experts, and an odd
    // width with weights of y's dtype.
    add({.name = Name("MoeCombine", t, "3x8x256/E3/residual"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeCombineAdd(b.Input("y", t, {3, 8 * 256}),
                                           b.Input("weights", DType::kF32, {3, 8}),
                                           b.Input("ids", DType::kI32, {3, 8}),
                                           b.Input("residual", t, {3, 256})));
         },
         .tolerance = Tol(t), .int_hi = 3});
    // With the routing weights computed in the combine (moe_route_into_combine): 128
    // experts choosing 8 (each flag of MoeRouteWeights), ties among 3 with the residual,
    // and a bad id (weight 0 and the flag).
    for (ops::MoeRouteWeights route : {ops::MoeRouteWeights{false, false},
                                       ops::MoeRouteWeights{true, false},
                                       ops::MoeRouteWeights{true, true}}) {
      const std::string flags = absl::StrCat(route.renormalize ? "/norm" : "",
                                             route.round_to_dtype ? "/round" : "");
      add({.name = Name("MoeCombine", t, absl::StrCat("3x8x256/E128/route", flags)),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeCombineRouted(b.Input("y", t, {3, 8 * 256}),
                                                b.Input("logits", t, {3, 128}),
                                                b.Input("ids", DType::kI32, {3, 8}), route));
           },
           .tolerance = Tol(t), .int_hi = 128, .float_range = 4.0f});
    }
    add({.name = Name("MoeCombine", t, "3x8x300/E3/route/residual"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeCombineRouted(b.Input("y", t, {3, 8 * 300}),
                                              b.Input("logits", t, {3, 3}),
                                              b.Input("ids", DType::kI32, {3, 8}),
                                              {true, true}, b.Input("residual", t, {3, 300})));
         },
         .tolerance = Tol(t), .int_hi = 3, .float_range = 4.0f});
    add({.name = Name("MoeCombine", t, "2x3x64/route/bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeCombineRouted(b.Input("y", t, {2, 3 * 64}),
                                              b.Input("logits", t, {2, 8}),
                                              b.Input("ids", DType::kI32, {2, 3}), {true, false}));
         },
         .tolerance = Tol(t), .int_values = {{"ids", {0, 9, 3, -1, 7, 7}}}, .float_range = 4.0f});
    add({.name = Name("MoeCombine", t, "5x4x100/residual"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeCombineAdd(b.Input("y", t, {5, 4 * 100}),
                                           b.Input("weights", t, {5, 4}),
                                           b.Input("ids", DType::kI32, {5, 4}),
                                           b.Input("residual", t, {5, 100})));
         },
         .tolerance = Tol(t), .int_hi = 6});
    // The down experts' products summed where they are made (MoeCombine with matmul, the
    // moe_down_into_combine pass): Qwen3-MoE's 128 experts and top 8 with the weights
    // from the logits (each flag of MoeRouteWeights) and the residual, Mixtral's top 2 with
    // given weights and an odd N over three rows, ties among 3 of 8 experts, top 1, and bad
    // ids (zeros and the flag).
    struct Md { int64_t rows, experts, top_k, n, k; int32_t ids_below; };
    for (Md s : {Md{1, 128, 8, 128, 128, 128}, Md{3, 8, 2, 33, 96, 8}, Md{1, 8, 8, 64, 64, 3},
                 Md{2, 16, 1, 40, 32, 16}}) {
      const std::string shape = absl::StrCat("matmul/", s.rows, "x", s.experts, "x", s.n, "x",
                                             s.k, "/top", s.top_k, "/ids", s.ids_below);
      for (int route = 0; route < 3; ++route) {  // given weights; route; rounded, + residual
        const char* what = route == 0 ? "" : route == 1 ? "/route" : "/route/round/residual";
        add({.name = Name("MoeCombine", t, absl::StrCat(shape, what)),
             .build = [=](GraphBuilder& b) {
               const TensorId x = b.Input("x", t, {s.rows, s.top_k * s.k});
               const TensorId w = b.Weight("w", t, {s.experts, s.n, s.k});
               const TensorId ids = b.Input("ids", DType::kI32, {s.rows, s.top_k});
               if (route == 0) {
                 const TensorId weights = b.Input("weights", DType::kF32, {s.rows, s.top_k});
                 b.Output("out", b.MoeDownCombine(x, w, weights, ids, {}));
                 return;
               }
               const ops::MoeCombine op{.route = true, .round_to_dtype = route == 2};
               const TensorId logits = b.Input("logits", t, {s.rows, s.experts});
               const TensorId residual =
                   route == 2 ? b.Input("residual", t, {s.rows, s.n}) : TensorId{};
               b.Output("out", b.MoeDownCombine(x, w, logits, ids, op, residual));
             },
             .tolerance = Tol(t), .int_hi = s.ids_below});
      }
    }
    add({.name = Name("MoeCombine", t, "matmul/bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeDownCombine(b.Input("x", t, {2, 3 * 64}),
                                            b.Weight("w", t, {4, 16, 64}),
                                            b.Input("logits", t, {2, 4}),
                                            b.Input("ids", DType::kI32, {2, 3}), {.route = true},
                                            b.Input("residual", t, {2, 16})));
         },
         .tolerance = Tol(t), .int_values = {{"ids", {0, -1, 3, 4, 2, 1000}}}});
    // Linear RoPE scaling.
    add({.name = Name("Rope", t, "4x8x64/linear"),
         .build = [=](GraphBuilder& b) {
           ops::Rope rope{.head_dim = 64, .theta = 10000.0f};
           rope.scaling = {ops::RopeScaling::Type::kLinear, 4.0f};
           b.Output("out", b.Rope(b.Input("x", t, {4, 8 * 64}), b.Input("pos", DType::kI32, {4}), rope));
         },
         .tolerance = Tol(t),
         .int_values = {{"pos", {0, 1, 4095, -1}}}});
    add({.name = Name("Softmax", t, "2x128256"),
         .build = [=](GraphBuilder& b) { b.Output("out", b.Softmax(b.Input("x", t, {2, 128256}))); },
         .tolerance = Tol(t), .float_range = 8.0f});

    // Rope: HF rotate_half and interleaved pairs, Llama-3 scaling, a padding row.
    for (bool interleaved : {false, true}) {
      for (bool llama3 : {false, true}) {
        ops::Rope rope{.head_dim = 64, .theta = llama3 ? 500000.0f : 10000.0f,
                       .interleaved = interleaved};
        if (llama3) rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
        add({.name = Name("Rope", t, absl::StrCat("4x32x64", interleaved ? "/interleaved" : "",
                                                  llama3 ? "/llama3" : "")),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.Rope(b.Input("x", t, {4, 32 * 64}), b.Input("pos", DType::kI32, {4}), rope));
             },
             .tolerance = Tol(t),
             .int_values = {{"pos", {0, 1, 4095, -1}}}});
      }
    }
    add({.name = Name("Rope", t, "8x8x128/random_pos"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.Rope(b.Input("x", t, {8, 8 * 128}), b.Input("pos", DType::kI32, {8}),
                                  ops::Rope{.head_dim = 128, .theta = 10000.0f}));
         },
         .tolerance = Tol(t), .int_hi = 8192});

    // KvWrite: random cache contents must survive outside the written rows.
    add({.name = Name("KvWrite", t, "M4/slots6/kvh8/S128/d64"),
         .build = [=](GraphBuilder& b) {
           auto cache = b.State("cache", t, {6, 8, 128, 64});
           b.KvWrite(b.Input("kv", t, {4, 8 * 64}), b.Input("pos", DType::kI32, {4}), cache);
         },
         .tolerance = 0.0,
         .int_values = {{"pos", {0, 127, -1, 64}}}});
    add({.name = Name("KvWrite", t, "out_of_range_pos"),
         .build = [=](GraphBuilder& b) {
           auto cache = b.State("cache", t, {2, 2, 16, 32});
           b.KvWrite(b.Input("kv", t, {2, 2 * 32}), b.Input("pos", DType::kI32, {2}), cache);
         },
         .tolerance = 0.0,
         .int_values = {{"pos", {16, 3}}}});

    // Attention: GQA and MHA; positions 0, S-1, random; padding and out-of-range rows; the
    // lengths where one chunk gives way to several: with 32 blocks a chunk or more (rows ·
    // kv heads · head tiles) 128 keys take one chunk, 129 and 130 three; with fewer, 32
    // keys one, 33 three (two rows of 2 KV heads; one row of Qwen3-MoE's 4 KV heads of
    // 128 at position 100: seven chunks of 14 or 15 keys, and at 4,095: chunks of 32 keys,
    // where f32 takes two rounds of 16 keys a block).
    struct At { int64_t m, heads, kv_heads, seq, d; std::vector<int32_t> pos; };
    // Decode attention of shape s: q [m, heads·d] against caches [m, kv_heads, seq, d].
    const auto decode_attention = [t](const At& s) {
      return [=](GraphBuilder& b) {
        auto q = b.Input("q", t, {s.m, s.heads * s.d});
        auto kc = b.State("k_cache", t, {s.m, s.kv_heads, s.seq, s.d});
        auto vc = b.State("v_cache", t, {s.m, s.kv_heads, s.seq, s.d});
        b.Output("out", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {s.m})));
      };
    };
    for (const At& s : {At{1, 32, 8, 4096, 64, {4095}}, At{4, 32, 8, 1024, 64, {0, 1023, 17, 500}},
                        At{3, 8, 8, 256, 128, {255, 0, 100}}, At{8, 32, 8, 512, 64, {}},
                        At{4, 4, 2, 64, 32, {-1, 64, 10, 63}},
                        At{4, 32, 8, 1000, 64, {127, 128, 129, 5}},
                        At{2, 16, 2, 256, 64, {31, 32}}, At{1, 32, 4, 513, 128, {100}},
                        At{1, 32, 4, 4096, 128, {4095}}}) {
      add({.name = Name("Attention", t, absl::StrCat("M", s.m, "/h", s.heads, "/kvh", s.kv_heads,
                                                     "/S", s.seq, "/d", s.d)),
           .build = decode_attention(s),
           .tolerance = Tol(t),
           .int_lo = 0,
           .int_hi = static_cast<int32_t>(s.seq),
           .int_values = {{"pos", s.pos}}});
    }

    // The chunks' merge within thread block clusters (CudaOptions::attention_clusters: on
    // where a chunk has fewer than 8 blocks, as one row of 4 or 2 KV heads) and through the
    // workspace alone, one row at a time in a 4,096-position cache (grids of 72 and 256
    // chunks, clusters of 8): positions whose 16-key chunks fit one cluster (100, 127), take
    // two, the second with keyless blocks (128), many (1,000, 4,095), and one chunk (16).
    for (bool clusters : {true, false}) {
      for (const At& s : {At{1, 32, 4, 4096, 128, {}}, At{1, 16, 2, 4096, 64, {}}}) {
        for (int32_t pos : {100, 127, 128, 1000, 4095, 16}) {
          add({.name = Name("Attention", t, absl::StrCat("M1/h", s.heads, "/kvh", s.kv_heads,
                                                         "/S", s.seq, "/d", s.d, "/pos", pos,
                                                         clusters ? "/clusters" : "/no_clusters")),
               .build = decode_attention(s),
               .tolerance = Tol(t),
               .int_values = {{"pos", {pos}}},
               .cuda_options = [clusters](CudaOptions& o) { o.attention_clusters = clusters; }});
        }
      }
    }

    // Prefill attention (seq_slots: B sequences of T rows): chunks that continue a cached
    // prefix, T not a multiple of the query tile, padding rows, GQA and MHA, the tiled
    // kernels (bf16/f16 on tensor cores, f32 on CUDA cores; d 64 and 128, T >= 16) and the
    // row-by-row one (d 32, T 8).
    struct Pf {
      int64_t seqs, rows, heads, kv_heads, seq, d, slots;
      std::vector<int32_t> seq_slots;
      std::vector<int32_t> begin, count;  // per sequence: first position, rows used
    };
    for (const Pf& s : {Pf{2, 100, 32, 8, 512, 64, 4, {3, 1}, {37, 0}, {100, 80}},
                        Pf{1, 256, 8, 8, 600, 128, 2, {1}, {300}, {256}},
                        Pf{4, 16, 4, 2, 64, 32, 5, {4, 0, 2, 1}, {0, 5, 40, 48}, {16, 3, 16, 16}},
                        Pf{3, 64, 16, 4, 200, 64, 3, {2, 0, 1}, {0, 64, 136}, {64, 64, 64}},
                        Pf{2, 8, 4, 4, 32, 64, 2, {0, 1}, {0, 24}, {8, 8}}}) {
      std::vector<int32_t> pos;
      for (int64_t b = 0; b < s.seqs; ++b) {
        for (int64_t j = 0; j < s.rows; ++j) {
          pos.push_back(j < s.count[b] ? static_cast<int32_t>(s.begin[b] + j) : -1);
        }
      }
      const auto build = [=](GraphBuilder& b) {
        const int64_t m = s.seqs * s.rows;
        auto q = b.Input("q", t, {m, s.heads * s.d});
        auto kc = b.State("k_cache", t, {s.slots, s.kv_heads, s.seq, s.d});
        auto vc = b.State("v_cache", t, {s.slots, s.kv_heads, s.seq, s.d});
        b.Output("out", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {m}),
                                    b.Input("seq_slots", DType::kI32, {s.seqs})));
      };
      const std::string shape = absl::StrCat("B", s.seqs, "xT", s.rows, "/h", s.heads, "/kvh",
                                             s.kv_heads, "/S", s.seq, "/d", s.d);
      add({.name = Name("Attention", t, absl::StrCat("prefill/", shape)),
           .build = build,
           .tolerance = Tol(t),
           .int_values = {{"pos", pos}, {"seq_slots", s.seq_slots}}});
      // f32 rows on the tensor-core kernel in f16 (CudaOptions::prefill_attention kF16), where
      // the tiled kernel runs: f16's tolerance.
      if (t == DType::kF32 && s.d >= 64 && s.rows >= 16) {
        add({.name = Name("Attention", t, absl::StrCat("prefill_f16/", shape)),
             .build = build,
             .tolerance = 3e-3,
             .int_values = {{"pos", pos}, {"seq_slots", s.seq_slots}},
             .cuda_options =
                 [](CudaOptions& o) { o.prefill_attention = PrefillAttentionPrecision::kF16; }});
      }
    }
    // Sliding windows (Mistral, Gemma 2's local layers) and score soft-capping (Gemma 2):
    // windows shorter and longer than the positions, one chunk and several, decode and
    // prefill (which runs on CUDA's row-by-row kernel).
    struct Sw { int64_t m, heads, kv_heads, seq, d; int32_t window; float softcap;
                std::vector<int32_t> pos; };
    for (const Sw& s : {Sw{4, 8, 2, 512, 64, 64, 0.0f, {0, 511, 200, 63}},
                        Sw{3, 8, 2, 1024, 64, 300, 0.0f, {1023, 299, 700}},
                        Sw{4, 4, 2, 256, 32, 0, 1.5f, {255, 0, 100, 31}},
                        Sw{2, 8, 4, 512, 128, 100, 1.5f, {511, 60}}}) {
      add({.name = Name("Attention", t, absl::StrCat("M", s.m, "/h", s.heads, "/kvh", s.kv_heads,
                                                     "/S", s.seq, "/d", s.d, "/window",
                                                     s.window, "/softcap", s.softcap)),
           .build = [=](GraphBuilder& b) {
             auto q = b.Input("q", t, {s.m, s.heads * s.d});
             auto kc = b.State("k_cache", t, {s.m, s.kv_heads, s.seq, s.d});
             auto vc = b.State("v_cache", t, {s.m, s.kv_heads, s.seq, s.d});
             b.Output("out", b.Attention({.window = s.window, .softcap = s.softcap}, q, kc, vc,
                                         b.Input("pos", DType::kI32, {s.m}), TensorId{}));
           },
           .tolerance = Tol(t),
           .int_values = {{"pos", s.pos}}});
    }
    add({.name = Name("Attention", t, "prefill/B2xT32/window20/softcap2"),
         .build = [=](GraphBuilder& b) {
           auto q = b.Input("q", t, {64, 8 * 64});
           auto kc = b.State("k_cache", t, {2, 4, 128, 64});
           auto vc = b.State("v_cache", t, {2, 4, 128, 64});
           b.Output("out", b.Attention({.window = 20, .softcap = 2.0f}, q, kc, vc,
                                       b.Input("pos", DType::kI32, {64}),
                                       b.Input("seq_slots", DType::kI32, {2})));
         },
         .tolerance = Tol(t),
         .int_lo = 0,
         .int_hi = 128,
         .int_values = {{"seq_slots", {1, 0}}}});
    // A slot out of range: zeros and the error flag, on both (for f32 on the f16 tensor-core
    // kernel too).
    for (const bool f16 : {false, true}) {
      if (f16 && t != DType::kF32) continue;
      add({.name = Name("Attention", t, f16 ? "prefill_f16/bad_slot" : "prefill/bad_slot"),
           .build = [=](GraphBuilder& b) {
             auto q = b.Input("q", t, {32, 4 * 64});
             auto kc = b.State("k_cache", t, {2, 4, 64, 64});
             auto vc = b.State("v_cache", t, {2, 4, 64, 64});
             b.Output("out", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {32}),
                                         b.Input("seq_slots", DType::kI32, {2})));
           },
           .tolerance = f16 ? 3e-3 : Tol(t),
           .int_lo = 0,
           .int_hi = 64,
           .int_values = {{"seq_slots", {1, 7}}},
           .cuda_options = [f16](CudaOptions& o) {
             o.prefill_attention =
                 f16 ? PrefillAttentionPrecision::kF16 : PrefillAttentionPrecision::kF32;
           }});
    }
    // KvWrite of a prefill step: rows to their sequences' slots.
    add({.name = Name("KvWrite", t, "prefill/B3xT8/slots4"),
         .build = [=](GraphBuilder& b) {
           auto cache = b.State("cache", t, {4, 2, 32, 64});
           b.KvWrite(b.Input("kv", t, {24, 2 * 64}), b.Input("pos", DType::kI32, {24}),
                     b.Input("seq_slots", DType::kI32, {3}), cache);
         },
         .tolerance = 0.0,
         .int_values = {{"pos", {0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22, -1, -1, -1, -1, -1,
                                 31, 30, 29, 28, 27, 26, 25, 24}},
                        {"seq_slots", {2, 0, 3}}}});

    // Argmax (exact ties are common in random bf16 data: the lowest index must win).
    for (int64_t v : {1000, 128256}) {
      add({.name = Name("Argmax", t, absl::StrCat("4x", v)),
           .build = [=](GraphBuilder& b) { b.Output("out", b.Argmax(b.Input("x", t, {4, v}))); },
           .tolerance = 0.0});
    }
    // Sample with top_k = 1 is deterministic: the top token.
    add({.name = Name("Sample", t, "top_k1/4x32000"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.Sample(b.Input("x", t, {4, 32000}), b.Input("seeds", DType::kI32, {4}),
                                    b.Input("pos", DType::kI32, {4}),
                                    ops::Sample{.temperature = 0.7f, .top_k = 1}));
         },
         .tolerance = 0.0, .int_hi = 1000});

    // Penalize: one slot per kind of control, the counts a mix of prompt-only (odd 1),
    // generated (2, 4) and both (3, 5); ids of the bias lists repeat and fall outside.
    for (int64_t v : {1000, 128256}) {
      add({.name = Name("Penalize", t, absl::StrCat("4x", v)),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.Penalize(b.Input("x", t, {4, v}),
                                        b.State("params", DType::kF32, {5, ops::kPenaltyParams}),
                                        b.State("counts", DType::kI32, {5, v})));
           },
           .tolerance = 0.0,
           .int_lo = 0,
           .int_hi = 6,
           .float_range = 4.0f,
           .float_values = {{"params", PenaltyCaseParams(v)}}});
    }

    add({.name = Name("Copy", t, "8x16"),
         .build = [=](GraphBuilder& b) {
           auto dst = b.State("dst", t, {8, 16});
           b.Copy(b.Input("src", t, {8, 16}), dst);
         },
         .tolerance = 0.0});
  }

  // MoeMatMul over experts in every block format (the layout repacked at upload, its
  // planes spanning all experts): activations in f32 and bf16, an input shared by the
  // chosen experts and one per expert, 128 experts and top 8, top 1, and bad ids. On the
  // GPU with exact x (the default's one f16 part from 16 pairs has cases of its own in
  // cuda_quant_test's MoeMma).
  const auto ExactExperts = [](CudaOptions& o) {
    o.block_gemm_precision = BlockGemmPrecision::kF32;
  };
  for (DType w : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    struct MoeQ { DType x; int64_t rows, experts, top_k, n, k; bool per_slot; };
    for (MoeQ s : {MoeQ{DType::kF32, 3, 16, 4, 64, 256, false},
                   MoeQ{DType::kF32, 2, 8, 2, 48, 512, true},
                   MoeQ{DType::kBF16, 1, 128, 8, 32, 256, false},
                   MoeQ{DType::kBF16, 5, 16, 1, 40, 256, false},
                   // By expert (a prefill step's pairs).
                   MoeQ{DType::kF32, 48, 16, 4, 48, 256, false},
                   MoeQ{DType::kF32, 32, 8, 2, 32, 512, true},
                   // Pairs past one window of 512 (about 100 an expert): the by-expert
                   // kernel's tiles carried from one window to the next.
                   MoeQ{DType::kF32, 200, 8, 4, 40, 256, false}}) {
      add({.name = absl::StrCat("MoeMatMul/", DTypeName(w), "/", DTypeName(s.x), "/", s.rows,
                                "x", s.experts, "x", s.n, "x", s.k, "/top", s.top_k,
                                s.per_slot ? "/per_slot" : ""),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeMatMul(
                                 b.Input("x", s.x, {s.rows, s.per_slot ? s.top_k * s.k : s.k}),
                                 b.Weight("w", w, {s.experts, s.n, s.k}),
                                 b.Input("ids", DType::kI32, {s.rows, s.top_k})));
           },
           .tolerance = Tol(s.x), .int_hi = static_cast<int32_t>(s.experts),
           .cuda_options = ExactExperts});
    }
    for (int64_t rows : {2, 48}) {  // by pair; by expert
      add({.name = absl::StrCat("MoeMatMul/", DTypeName(w), "/f32/silu_mul/rows", rows),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeGateUpSiluMul(b.Input("x", DType::kF32, {rows, 256}),
                                                b.Weight("wg", w, {16, 48, 256}),
                                                b.Weight("wu", w, {16, 48, 256}),
                                                b.Input("ids", DType::kI32, {rows, 4})));
           },
           .tolerance = Tol(DType::kF32), .int_hi = 16, .cuda_options = ExactExperts});
    }
    // The down experts summed in the combine (MoeCombine with matmul): f32 and bf16
    // activations, 128 experts and top 8 with the routing from the logits and the residual,
    // and given weights over ties, with bad ids.
    add({.name = absl::StrCat("MoeCombine/", DTypeName(w), "/bf16/matmul/1x128x96x256/top8"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeDownCombine(b.Input("x", DType::kBF16, {1, 8 * 256}),
                                            b.Weight("w", w, {128, 96, 256}),
                                            b.Input("logits", DType::kBF16, {1, 128}),
                                            b.Input("ids", DType::kI32, {1, 8}),
                                            {.route = true},
                                            b.Input("residual", DType::kBF16, {1, 96})));
         },
         .tolerance = Tol(DType::kBF16), .int_hi = 128, .float_range = 4.0f});
    add({.name = absl::StrCat("MoeCombine/", DTypeName(w), "/f32/matmul/3x8x40x512/top4/bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeDownCombine(b.Input("x", DType::kF32, {3, 4 * 512}),
                                            b.Weight("w", w, {8, 40, 512}),
                                            b.Input("weights", DType::kF32, {3, 4}),
                                            b.Input("ids", DType::kI32, {3, 4}), {}));
         },
         .tolerance = Tol(DType::kF32),
         .int_values = {{"ids", {2, 2, 5, 0, 7, -1, 7, 3, 8, 1, 1, 1}}}});
    // Each way the one-row kernel meets x (the default's is above): exact f32, and x as
    // int8 and int16 (8 and 16 bits a value against its unit's largest).
    for (BlockGemvPrecision precision :
         {BlockGemvPrecision::kF32, BlockGemvPrecision::kInt8, BlockGemvPrecision::kInt16}) {
      const char* name = precision == BlockGemvPrecision::kF32    ? "x_f32"
                         : precision == BlockGemvPrecision::kInt8 ? "x_int8"
                                                                  : "x_int16";
      add({.name = absl::StrCat("MoeCombine/", DTypeName(w), "/f32/matmul/2x16x64x256/top4/", name),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeDownCombine(b.Input("x", DType::kF32, {2, 4 * 256}),
                                              b.Weight("w", w, {16, 64, 256}),
                                              b.Input("logits", DType::kF32, {2, 16}),
                                              b.Input("ids", DType::kI32, {2, 4}),
                                              {.route = true},
                                              b.Input("residual", DType::kF32, {2, 64})));
           },
           // As cuda_quant_test's one-row cases: x in 8 bits 3e-2, in 16 bits 1e-4.
           .tolerance = precision == BlockGemvPrecision::kF32    ? Tol(DType::kF32)
                        : precision == BlockGemvPrecision::kInt8 ? 3e-2
                                                                 : 1e-4,
           .int_hi = 16,
           .cuda_options = [precision](CudaOptions& o) { o.block_gemv_precision = precision; }});
    }
    add({.name = absl::StrCat("MoeMatMul/", DTypeName(w), "/f32/bad_ids"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeMatMul(b.Input("x", DType::kF32, {2, 256}),
                                       b.Weight("w", w, {4, 16, 256}),
                                       b.Input("ids", DType::kI32, {2, 2})));
         },
         .tolerance = 1e-5,
         .int_values = {{"ids", {3, 4, -7, 0}}}});
  }
  // MoeTopK's order where values are equal or not numbers: NaN above every number (lower
  // index first among NaNs), -0 equal to +0, equal values by index.
  {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    add({.name = "MoeTopK/f32/nan_and_ties",
         .build = [](GraphBuilder& b) {
           b.Output("out", b.MoeTopK(b.Input("logits", DType::kF32, {2, 8}), 6));
         },
         .tolerance = 0.0,
         .float_values = {{"logits", {1.0f, nan, 2.0f, -0.0f, 0.0f, nan, 2.0f, -1.0f,
                                      0.0f, -0.0f, 0.5f, 0.5f, -3.0f, 0.5f, -0.0f, 4.0f}}}});
  }

  add({.name = "Add/i32/8x16",
       .build = [](GraphBuilder& b) {
         b.Output("out", b.Add(b.Input("a", DType::kI32, {8, 16}), b.Input("b", DType::kI32, {8, 16})));
       },
       .int_lo = -1000, .int_hi = 1000});
  add({.name = "Copy/i32/ids",
       .build = [](GraphBuilder& b) {
         auto ids = b.Input("ids", DType::kI32, {5});
         b.Copy(b.Input("next", DType::kI32, {5}), ids);
       }});
  add({.name = "CountIds/i32/4x1000",
       .build = [](GraphBuilder& b) {
         b.CountIds(b.Input("ids", DType::kI32, {4}), b.Input("pos", DType::kI32, {4}),
                    b.State("counts", DType::kI32, {6, 1000}));
       },
       .int_hi = 100,
       .int_values = {{"ids", {7, 999, 3, 1000}}, {"pos", {0, 12, -1, 5}}}});
  add({.name = "Advance/i32/pos",
       .build = [](GraphBuilder& b) { b.Advance(b.Input("pos", DType::kI32, {6})); },
       .int_values = {{"pos", {0, 5, -1, 100, -7, 4094}}}});
  // The last position stays and raises kErrorPositionOutOfRange (the flags are compared).
  add({.name = "Advance/i32/int32_max",
       .build = [](GraphBuilder& b) { b.Advance(b.Input("pos", DType::kI32, {5})); },
       .int_values = {{"pos", {INT32_MAX - 1, INT32_MAX, -1, 17, INT32_MAX}}}});

  // The fused ops of the graph passes: every epilogue, with and without the folded norm,
  // narrow outputs that take split-K, odd sizes (scalar path), M up to 8 and beyond (row
  // chunks).
  using Epilogue = ops::FusedMatMul::Epilogue;
  for (DType t : kFloatTypes) {
    struct Fm { int64_t m, k; std::vector<int64_t> n; bool norm; Epilogue e; };
    const std::vector<Fm> shapes = {
        {1, 2048, {2048, 512, 512}, true, Epilogue::kNone},   // q/k/v, Llama-3.2-1B
        {3, 2048, {512}, false, Epilogue::kNone},             // narrow: split-K
        {8, 256, {96, 32, 32}, true, Epilogue::kNone},
        {1, 2048, {2048}, false, Epilogue::kAdd},             // o + residual
        {5, 8192, {512}, false, Epilogue::kAdd},              // down-like, split-K
        {2, 2048, {1024, 1024}, true, Epilogue::kSiluMul},    // gate/up
        {1, 37, {19, 19}, true, Epilogue::kSiluMul},          // odd: scalar loads
        {11, 64, {13}, true, Epilogue::kAdd},                 // M > 8: two launches
        {1, 2048, {5000}, true, Epilogue::kArgmax},           // lm head
        {4, 200, {1001}, false, Epilogue::kArgmax},
        // Partial last blocks, blocks across weight boundaries, split-K with a partial
        // block, and M > 8 (a launch of 8 rows, then the rest).
        {2, 512, {21, 7, 7}, false, Epilogue::kNone},
        {1, 4096, {50}, false, Epilogue::kAdd},               // split-K, partial block
        {10, 96, {50, 50}, false, Epilogue::kSiluMul},
        {9, 128, {301}, true, Epilogue::kArgmax},
    };
    for (const Fm& f : shapes) {
      std::string shape = absl::StrCat(f.m, "x", f.k, "x");
      for (int64_t n : f.n) absl::StrAppend(&shape, n, "_");
      absl::StrAppend(&shape, f.norm ? "norm_" : "", static_cast<int>(f.e));
      const bool ids = f.e == Epilogue::kArgmax;
      const auto build = [=](GraphBuilder& b) {
        ops::FusedMatMul op{.norm = f.norm, .eps = 1e-5f,
                            .weights = static_cast<int32_t>(f.n.size()), .epilogue = f.e};
        std::vector<TensorId> in = {b.Input("x", t, {f.m, f.k})};
        if (f.norm) in.push_back(b.Weight("norm_w", t, {f.k}));
        int64_t total = 0;
        for (size_t g = 0; g < f.n.size(); ++g) {
          in.push_back(b.Weight(absl::StrCat("w", g), t, {f.n[g], f.k}));
          total += f.n[g];
        }
        if (f.e == Epilogue::kAdd) in.push_back(b.Input("residual", t, {f.m, total}));
        b.Output("out", b.FusedMatMul(op, in));
      };
      // bf16/f16 products rounded to 8 or 11 bits tie often; sums in another order may
      // break a tie the other way.
      add({.name = Name("FusedMatMul", t, shape),
           .build = build,
           .tolerance = Tol(t),
           .exact_ids = !ids || t == DType::kF32});
      // One row on the kernel held to 5 or 6 blocks an SM (CudaOptions::
      // fused_float_min_blocks), which spills registers.
      if (f.m != 1) continue;
      for (int blocks : {5, 6}) {
        add({.name = Name("FusedMatMul", t, absl::StrCat(shape, "/min_blocks_", blocks)),
             .build = build,
             .tolerance = Tol(t),
             .exact_ids = !ids || t == DType::kF32,
             .cuda_options = [blocks](CudaOptions& o) { o.fused_float_min_blocks = blocks; }});
      }
    }
    // The rope_kv_write epilogue: q, k and v of a Llama-3.2-1B layer (q/k/v at 2048 x
    // 2048/512/512, d 64, llama3 scaling) at M = 1 and 2 (with the folded norm), a narrow
    // one that takes split-K, interleaved pairs, d 128, and M > 8 (two launches: the second
    // writes cache slots 8 and up). Positions include a padding row and one past the cache.
    struct Rk { int64_t m, k, h, kvh, d; bool norm, interleaved; };
    const std::vector<Rk> rope_shapes = {
        {1, 2048, 32, 8, 64, false, false}, {2, 2048, 32, 8, 64, true, false},
        {3, 4096, 2, 1, 16, false, false},  {2, 512, 4, 2, 32, true, true},
        {1, 256, 2, 1, 128, false, true},   {10, 128, 4, 2, 16, true, false},
    };
    for (const Rk& f : rope_shapes) {
      const std::string shape =
          absl::StrCat("rope_kv_write/", f.m, "x", f.k, "/h", f.h, "kv", f.kvh, "d", f.d,
                       f.norm ? "/norm" : "", f.interleaved ? "/interleaved" : "");
      const auto build = [=](GraphBuilder& b) {
        ops::Rope rope{.head_dim = static_cast<int32_t>(f.d), .theta = 500000.0f,
                       .interleaved = f.interleaved};
        rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
        ops::FusedMatMul op{.norm = f.norm, .eps = 1e-5f, .weights = 3,
                            .epilogue = Epilogue::kRopeKvWrite, .rope = rope};
        std::vector<TensorId> in = {b.Input("x", t, {f.m, f.k})};
        if (f.norm) in.push_back(b.Weight("norm_w", t, {f.k}));
        in.push_back(b.Weight("wq", t, {f.h * f.d, f.k}));
        in.push_back(b.Weight("wk", t, {f.kvh * f.d, f.k}));
        in.push_back(b.Weight("wv", t, {f.kvh * f.d, f.k}));
        in.push_back(b.Input("pos", DType::kI32, {f.m}));
        TensorId kc = b.State("kc", t, {f.m + 1, f.kvh, 32, f.d});
        TensorId vc = b.State("vc", t, {f.m + 1, f.kvh, 32, f.d});
        in.push_back(kc);
        in.push_back(vc);
        b.Output("q", b.FusedMatMul(op, in));
        b.Output("kc_out", kc);
        b.Output("vc_out", vc);
      };
      const std::vector<int32_t> pos = {7, -1, 40, 31, 0, 12, 5, -1, 30, 2};
      add({.name = Name("FusedMatMul", t, shape),
           .build = build,
           .tolerance = Tol(t),
           .int_values = {{"pos", pos}}});
      if (f.m != 1) continue;
      for (int blocks : {5, 6}) {
        add({.name = Name("FusedMatMul", t, absl::StrCat(shape, "/min_blocks_", blocks)),
             .build = build,
             .tolerance = Tol(t),
             .int_values = {{"pos", pos}},
             .cuda_options = [blocks](CudaOptions& o) { o.fused_float_min_blocks = blocks; }});
      }
    }
    // Plain, and with Qwen3's head norms (head_dim 128 as Qwen3's, interleaved pairs too).
    for (int64_t rows : {1, 3}) {
      for (bool head_norm : {false, true}) {
        const int64_t d = head_norm ? 128 : 64;
        const bool interleaved = head_norm && rows == 3;
        add({.name = Name("RopeKvWrite", t,
                          absl::StrCat("rows", rows, head_norm ? "/head_norm" : "",
                                       interleaved ? "/interleaved" : "")),
             .build = [=](GraphBuilder& b) {
               ops::Rope rope{.head_dim = static_cast<int32_t>(d), .theta = 500000.0f,
                              .interleaved = interleaved};
               rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
               TensorId kc = b.State("kc", t, {4, 2, 32, d});
               TensorId vc = b.State("vc", t, {4, 2, 32, d});
               TensorId qkv = b.Input("qkv", t, {rows, 8 * d + 2 * 2 * d});
               TensorId pos = b.Input("pos", DType::kI32, {rows});
               b.Output("q", head_norm ? b.RopeKvWrite(qkv, pos, kc, vc, b.Weight("q_norm", t, {d}),
                                                       b.Weight("k_norm", t, {d}), 1e-6f, rope)
                                       : b.RopeKvWrite(qkv, pos, kc, vc, rope));
               b.Output("kc_out", kc);
               b.Output("vc_out", vc);
             },
             .tolerance = t == DType::kF32 ? 1e-5 : 1e-2,
             // A padding row and a position past the cache among the rows.
             .int_values = {{"pos", {7, -1, 40}}}});
      }
    }
  }

  // FusedElementwise (compiled for the plan on CUDA): SwiGLU then a residual add, every
  // kind with a value read twice, the most inputs and steps, odd sizes (element accesses)
  // and a chain made by the elementwise_chain pass from plain ops.
  using Kind = ops::FusedElementwise::Kind;
  struct Chain {
    std::string name;
    int inputs;
    std::vector<ops::FusedElementwise::Step> steps;
  };
  const std::vector<Chain> chains = {
      {"swiglu_add", 3, {{Kind::kSiluMul, 0, 1}, {Kind::kAdd, 3, 2}}},
      {"every_kind", 2,
       {{Kind::kSilu, 0, 0}, {Kind::kMul, 2, 1}, {Kind::kAdd, 3, 0}, {Kind::kSiluMul, 4, 1},
        {Kind::kMul, 5, 5}}},
      {"widest", 8,
       {{Kind::kAdd, 0, 1}, {Kind::kAdd, 8, 2}, {Kind::kMul, 9, 3}, {Kind::kAdd, 10, 4},
        {Kind::kSilu, 11, 0}, {Kind::kMul, 12, 5}, {Kind::kAdd, 13, 6},
        {Kind::kSiluMul, 14, 7}}},
  };
  for (DType t : kFloatTypes) {
    for (const Chain& chain : chains) {
      for (Shape shape : {Shape{1, 2048}, Shape{8, 2048}, Shape{3, 37}}) {
        add({.name = Name("FusedElementwise", t,
                          absl::StrCat(chain.name, "/", shape[0], "x", shape[1])),
             .build = [=](GraphBuilder& b) {
               ops::FusedElementwise op;
               op.num_steps = static_cast<int32_t>(chain.steps.size());
               for (size_t i = 0; i < chain.steps.size(); ++i) op.steps[i] = chain.steps[i];
               std::vector<TensorId> in;
               for (int i = 0; i < chain.inputs; ++i) {
                 in.push_back(b.Input(absl::StrCat("x", i), t, shape));
               }
               b.Output("out", b.FusedElementwise(op, in));
             },
             .tolerance = Tol(t)});
      }
    }
    add({.name = Name("FusedElementwise", t, "from_the_pass/4x1000"),
         .graph = [=]() -> absl::StatusOr<Graph> {
           GraphBuilder b;
           const Shape shape{4, 1000};
           auto g = b.Input("gate", t, shape), u = b.Input("up", t, shape);
           auto r = b.Input("residual", t, shape);
           auto h = b.Add(b.Mul(b.Silu(g), u), r);
           b.Output("out", b.SiluMul(h, h));
           absl::StatusOr<Graph> graph = std::move(b).Build();
           if (!graph.ok()) return graph;
           return RunPass("elementwise_chain", *std::move(graph));
         },
         .tolerance = Tol(t)});
  }

  // Whole Llama steps through the graph passes (f32 and bf16).
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t batch : {1, 3}) {
      add({.name = absl::StrCat("LlamaFused/", DTypeName(t), "/batch", batch),
           .graph = [=]() -> absl::StatusOr<Graph> {
             LlamaConfig config = TinyLlamaConfig();
             config.num_hidden_layers = 2;
             config.dtype = t;
             absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(
                 config, {.batch = batch, .max_seq = 64, .closed_loop = true});
             if (!g.ok()) return g;
             return RunPasses(*std::move(g));
           },
           .tolerance = t == DType::kF32 ? 1e-4 : 3e-2,
           .int_hi = 64,
           .float_range = 0.2f,
           .exact_ids = t == DType::kF32});
    }
  }

  using IntValues = std::vector<std::pair<std::string, std::vector<int32_t>>>;
  // Whole steps of every other family through the passes (the backend's: CUDA fuses what
  // it runs), decode and prefill (two sequences of 8 rows), positions past the windows.
  // The mixture-of-experts families too, in f32 only: bf16 router logits tie often, and
  // an expert chosen the other way changes its row entirely.
  for (DType t : {DType::kF32, DType::kBF16}) {
    std::vector<std::pair<std::string, LlamaConfig>> families = FamilyTinyConfigs(t);
    if (t == DType::kF32) {
      for (auto& moe : MoeTinyConfigs(t)) families.push_back(std::move(moe));
    }
    for (const auto& [family, config] : families) {
      for (int64_t rows : {1, 8}) {
        const LlamaConfig c = config;
        add({.name = absl::StrCat("Family/", family, "/", DTypeName(t),
                                  rows == 1 ? "/decode3" : "/prefill/B2xT8"),
             .graph = [=]() -> absl::StatusOr<Graph> {
               LlamaGraphOptions o{.batch = rows == 1 ? 3 : 2, .max_seq = 64};
               o.rows_per_seq = rows;
               absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(c, o);
               if (!g.ok()) return g;
               return RunPasses(*std::move(g));
             },
             .tolerance = t == DType::kF32 ? 1e-4 : 3e-2,
             .int_hi = 56,
             .int_values = rows == 1 ? IntValues{}
                                     : IntValues{{"pos", {10, 11, 12, 13, 14, 15, 16, 17, 40,
                                                          41, 42, 43, 44, 45, 46, 47}},
                                                 {"seq_slots", {1, 0}}},
             .float_range = 0.2f,
             .exact_ids = t == DType::kF32});
      }
    }
  }

  // Whole Llama-shaped steps (f32, closed loop so Copy and Advance run in context).
  for (int64_t layers : {1, 4}) {
    for (int64_t batch : {1, 3}) {
      add({.name = absl::StrCat("Llama/f32/layers", layers, "/batch", batch),
           .graph = [=] {
             LlamaConfig config = TinyLlamaConfig();
             config.num_hidden_layers = layers;
             return BuildLlamaDecodeGraph(
                 config, {.batch = batch, .max_seq = 64, .closed_loop = true});
           },
           .tolerance = 1e-4,
           .int_hi = 64,
           .float_range = 0.2f});
    }
  }
  // Whole prefill steps (bf16, head_dim 64 so the flash kernel runs): two sequences of 32
  // rows, the second continuing at position 20 with 4 padding rows.
  {
    std::vector<int32_t> pos;
    for (int32_t j = 0; j < 32; ++j) pos.push_back(j);
    for (int32_t j = 0; j < 32; ++j) pos.push_back(j < 28 ? 20 + j : -1);
    add({.name = "Llama/bf16/prefill/B2xT32",
         .graph = [] {
           LlamaConfig config = TinyLlamaConfig();
           config.dtype = DType::kBF16;
           config.num_attention_heads = 4;
           config.head_dim = 64;
           return BuildLlamaDecodeGraph(
               config, {.batch = 2, .slots = 3, .max_seq = 64, .rows_per_seq = 32});
         },
         .tolerance = 2e-2,
         .int_hi = 64,
         .int_values = {{"pos", pos}, {"seq_slots", {2, 0}}},
         .float_range = 0.2f,
         .exact_ids = false});
  }
  return cases;
}

}  // namespace sg::testing
