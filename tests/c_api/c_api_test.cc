// The C ABI's decode functions on a GPU (the argument checks are c_api_args_test.cc):
//  - skipped without a device: each entry point against the CPU reference, the spec,
//    on random data with poisoned outputs, in f32, bf16 and f16; the error flags; the
//    workspaces (none, partial, full, dirty); calls recorded by stream capture and replayed;
//    a failed launch reported as -3.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "stepgraph/c_api/c_api.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/rope.h"
#include "tests/c_api/gpu_util.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

// ---- On a GPU --------------------------------------------------------------------------

TensorArg ArgOf(const HostTensor& t) {
  TensorArg a;
  a.data = const_cast<void*>(t.data());
  a.dtype = t.dtype();
  a.shape = t.shape();
  return a;
}

// Runs `op` on the CPU reference, the definition of every op, writing `out`; returns the
// error flags it raised.
template <typename Op>
uint32_t Reference(const Op& op, std::initializer_list<const HostTensor*> inputs,
                   HostTensor& out) {
  std::vector<TensorArg> args;
  for (const HostTensor* t : inputs) args.push_back(ArgOf(*t));
  NodeArgs node;
  node.node_name = "c_api";
  node.inputs = absl::MakeConstSpan(args);
  node.output = ArgOf(out);
  CpuDispatch cpu;
  const absl::Status s = cpu.Run(op, node);
  EXPECT_TRUE(s.ok()) << s;
  return cpu.TakeErrorFlags();
}

// ‖got − want‖ / ‖want‖.
double Error(const HostTensor& got, const HostTensor& want) {
  return NormalizedError(got.ToFloat(), want.ToFloat());
}

std::vector<int32_t> Ints(const HostTensor& t) {
  const auto* p = static_cast<const int32_t*>(t.data());
  return std::vector<int32_t>(p, p + t.size());
}

HostTensor IntTensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, Shape{static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), static_cast<int32_t*>(t.data()));
  return t;
}

TEST_F(CApiGpuTest, Embedding) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t hidden : {256, 100}) {  // 16-byte rows, and not
      SCOPED_TRACE(::testing::Message() << Name(dt) << " hidden " << hidden);
      const DType t = ToDType(dt);
      const int64_t rows = 8, vocab = 1000;
      HostTensor table(t, Shape{vocab, hidden});
      table.FillUniform(1);
      HostTensor ids(DType::kI32, Shape{rows});
      ids.FillUniform(2, 0, vocab);
      static_cast<int32_t*>(ids.data())[2] = -1;
      static_cast<int32_t*>(ids.data())[5] = static_cast<int32_t>(vocab);
      HostTensor want(t, Shape{rows, hidden});
      const uint32_t want_flags = Reference(ops::Embedding{}, {&table, &ids}, want);
      ASSERT_EQ(want_flags, STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE);

      DeviceBuffer d_table(table), d_ids(ids), d_out(want.bytes());
      d_out.Poison();
      ASSERT_EQ(stepgraph_embedding(d_table.get(), d_ids.as<int32_t>(), d_out.get(), rows, vocab,
                                    hidden, dt, flags(), stream_),
                kOk);
      EXPECT_EQ(TakeFlags(), want_flags);
      HostTensor got(t, Shape{rows, hidden});
      d_out.CopyTo(got);
      EXPECT_EQ(Error(got, want), 0.0);
    }
  }
}

TEST_F(CApiGpuTest, Matmul) {
  struct Case {
    int64_t m, k, n;
    bool bias;
  };
  for (const int32_t dt : kFloatDTypes) {
    for (const Case c : {Case{1, 256, 128, false}, Case{3, 257, 129, true},
                         Case{STEPGRAPH_MATMUL_MAX_ROWS, 512, 1000, true}}) {
      SCOPED_TRACE(::testing::Message() << Name(dt) << " m" << c.m << " k" << c.k << " n" << c.n
                                        << (c.bias ? " bias" : ""));
      const DType t = ToDType(dt);
      HostTensor x(t, Shape{c.m, c.k}), w(t, Shape{c.n, c.k}), bias(t, Shape{c.n});
      x.FillUniform(3);
      w.FillUniform(4, -0.1f, 0.1f);
      bias.FillUniform(5);
      HostTensor want(t, Shape{c.m, c.n});
      ops::MatMul op;
      op.has_bias = c.bias;
      if (c.bias) {
        Reference(op, {&x, &w, &bias}, want);
      } else {
        Reference(op, {&x, &w}, want);
      }
      DeviceBuffer dx(x), dw(w), db(bias), dy(want.bytes());
      dy.Poison();
      ASSERT_EQ(stepgraph_matmul(dx.get(), dw.get(), c.bias ? db.get() : nullptr, dy.get(), c.m,
                                 c.n, c.k, dt, stream_),
                kOk);
      Sync();
      HostTensor got(t, Shape{c.m, c.n});
      dy.CopyTo(got);
      EXPECT_LT(Error(got, want), Tol(dt));
    }
  }
}

TEST_F(CApiGpuTest, RmsNorm) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t hidden : {2048, 1000}) {
      SCOPED_TRACE(::testing::Message() << Name(dt) << " hidden " << hidden);
      const DType t = ToDType(dt);
      const int64_t rows = 5;
      HostTensor x(t, Shape{rows, hidden}), w(t, Shape{hidden});
      x.FillUniform(6, -2.0f, 2.0f);
      w.FillUniform(7, 0.5f, 1.5f);
      HostTensor want(t, Shape{rows, hidden});
      ops::RmsNorm op;
      op.eps = 1e-5f;
      Reference(op, {&x, &w}, want);
      DeviceBuffer dx(x), dw(w), dy(want.bytes());
      dy.Poison();
      ASSERT_EQ(stepgraph_rmsnorm(dx.get(), dw.get(), dy.get(), rows, hidden, op.eps, dt, stream_),
                kOk);
      Sync();
      HostTensor got(t, Shape{rows, hidden});
      dy.CopyTo(got);
      EXPECT_LT(Error(got, want), Tol(dt));
    }
  }
}

// The elementwise family at a small size and one past the launchers' large-tensor switch,
// both odd so the vector tails run.
TEST_F(CApiGpuTest, Elementwise) {
  struct Family {
    const char* name;
    std::function<uint32_t(const HostTensor&, const HostTensor&, HostTensor&)> reference;
    std::function<int32_t(const void*, const void*, void*, int64_t, int32_t, void*)> call;
  };
  const Family families[] = {
      {"add", [](auto& a, auto& b, auto& y) { return Reference(ops::Add{}, {&a, &b}, y); },
       &stepgraph_add},
      {"mul", [](auto& a, auto& b, auto& y) { return Reference(ops::Mul{}, {&a, &b}, y); },
       &stepgraph_mul},
      {"silu", [](auto& a, auto&, auto& y) { return Reference(ops::Silu{}, {&a}, y); },
       [](const void* a, const void*, void* y, int64_t n, int32_t dt, void* s) {
         return stepgraph_silu(a, y, n, dt, s);
       }},
      {"silu_mul",
       [](auto& a, auto& b, auto& y) { return Reference(ops::SiluMul{}, {&a, &b}, y); },
       &stepgraph_silu_mul},
  };
  for (const Family& f : families) {
    for (const int32_t dt : {STEPGRAPH_F32, STEPGRAPH_BF16, STEPGRAPH_F16, STEPGRAPH_I32}) {
      if (dt == STEPGRAPH_I32 && std::string(f.name) != "add") continue;
      for (const int64_t n : {int64_t{10007}, int64_t{(1 << 20) + 3}}) {
        SCOPED_TRACE(::testing::Message() << f.name << " " << Name(dt) << " n " << n);
        const DType t = ToDType(dt);
        HostTensor a(t, Shape{n}), b(t, Shape{n}), want(t, Shape{n});
        const float range = dt == STEPGRAPH_I32 ? 1000.0f : 4.0f;
        a.FillUniform(8, -range, range);
        b.FillUniform(9, -range, range);
        f.reference(a, b, want);
        DeviceBuffer da(a), db(b), dy(want.bytes());
        dy.Poison();
        ASSERT_EQ(f.call(da.get(), db.get(), dy.get(), n, dt, stream_), kOk);
        Sync();
        HostTensor got(t, Shape{n});
        dy.CopyTo(got);
        if (dt == STEPGRAPH_I32) {
          EXPECT_EQ(Ints(got), Ints(want));
        } else {
          EXPECT_LT(Error(got, want), Tol(dt));
        }
      }
    }
  }
}

// scale: alpha · x rounded once to the dtype, against the host's product, at an odd size
// (the scalar path), an aligned multiple of the vector width, and a misaligned view.
TEST_F(CApiGpuTest, Scale) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t n : {int64_t{10007}, int64_t{(1 << 20) + 64}}) {
      for (const int offset : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << " n " << n << " offset " << offset);
        const DType t = ToDType(dt);
        const float alpha = -1.7f;
        HostTensor x(t, Shape{n + offset}), want(t, Shape{n});
        x.FillUniform(21, -3.0f, 3.0f);
        std::vector<float> product(n);
        for (int64_t i = 0; i < n; ++i) product[i] = alpha * x.At(i + offset);
        want.FillFrom(product);
        DeviceBuffer dx(x), dy(want.bytes() + 16);
        dy.Poison();
        const int64_t esize = static_cast<int64_t>(DTypeBytes(t));
        const auto* src = static_cast<const std::byte*>(dx.get()) + offset * esize;
        ASSERT_EQ(stepgraph_scale(src, dy.get(), n, alpha, dt, stream_), kOk);
        Sync();
        HostTensor got(t, Shape{n});
        dy.CopyTo(got);
        EXPECT_LT(Error(got, want), Tol(dt));
      }
    }
  }
}

TEST_F(CApiGpuTest, Rope) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int32_t interleaved : {0, 1}) {
      for (const bool llama3 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << (interleaved ? " interleaved" : "")
                                          << (llama3 ? " llama3" : ""));
        const DType t = ToDType(dt);
        const int64_t rows = 4, heads = 4, head_dim = 128, cols = heads * head_dim;
        ops::Rope op;
        op.head_dim = static_cast<int32_t>(head_dim);
        op.theta = 500000.0f;
        op.interleaved = interleaved == 1;
        if (llama3) {
          op.scaling.type = ops::RopeScaling::Type::kLlama3;
          op.scaling.factor = 8.0f;
        }
        std::vector<float> inv_freq(head_dim / 2);
        ASSERT_EQ(stepgraph_rope_inv_freq(
                      op.head_dim, op.theta,
                      llama3 ? STEPGRAPH_ROPE_SCALING_LLAMA3 : STEPGRAPH_ROPE_SCALING_NONE,
                      op.scaling.factor, op.scaling.low_freq_factor, op.scaling.high_freq_factor,
                      op.scaling.original_max_position, inv_freq.data()),
                  kOk);
        HostTensor x(t, Shape{rows, cols});
        x.FillUniform(10);
        const HostTensor pos = IntTensor({4000, -1, 0, 123});  // -1: padding, unchanged
        HostTensor want(t, Shape{rows, cols});
        Reference(op, {&x, &pos}, want);

        DeviceBuffer dx(x), dpos(pos), dfreq(static_cast<int64_t>(inv_freq.size() * 4)),
            dy(want.bytes());
        ASSERT_EQ(cudaMemcpy(dfreq.get(), inv_freq.data(), inv_freq.size() * 4,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
        dy.Poison();
        ASSERT_EQ(stepgraph_rope(dx.get(), dpos.as<int32_t>(), dfreq.as<float>(), dy.get(), rows,
                                 cols, head_dim, interleaved, dt, stream_),
                  kOk);
        Sync();
        HostTensor got(t, Shape{rows, cols});
        dy.CopyTo(got);
        EXPECT_LT(Error(got, want), Tol(dt));
      }
    }
  }
}

TEST_F(CApiGpuTest, KvWrite) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t head_dim : {128, 6}) {  // 16-byte heads, and not
      SCOPED_TRACE(::testing::Message() << Name(dt) << " head_dim " << head_dim);
      const DType t = ToDType(dt);
      const int64_t rows = 3, slots = 4, kv_heads = 2, seq = 16;
      HostTensor kv(t, Shape{rows, kv_heads * head_dim});
      kv.FillUniform(11);
      HostTensor cache(t, Shape{slots, kv_heads, seq, head_dim});
      cache.FillUniform(12);
      // A position, padding, and one past the cache (nothing written, the flag raised).
      const HostTensor pos = IntTensor({5, -1, static_cast<int32_t>(seq)});
      HostTensor want(t, cache.shape());
      std::copy_n(static_cast<const char*>(cache.data()), cache.bytes(),
                  static_cast<char*>(want.data()));
      const uint32_t want_flags = Reference(ops::KvWrite{}, {&kv, &pos, &cache}, want);
      ASSERT_EQ(want_flags, STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE);

      DeviceBuffer dkv(kv), dpos(pos), dcache(cache);
      ASSERT_EQ(stepgraph_kv_write(dkv.get(), dpos.as<int32_t>(), dcache.get(), rows, slots,
                                   kv_heads, seq, head_dim, dt, flags(), stream_),
                kOk);
      EXPECT_EQ(TakeFlags(), want_flags);
      HostTensor got(t, cache.shape());
      dcache.CopyTo(got);
      EXPECT_EQ(Error(got, want), 0.0);
      EXPECT_GT(Error(got, cache), 0.0) << "nothing was written";
    }
  }
}

// Attention with no workspace, part of the preferred one, all of it, and that workspace
// reused dirty: each must give the reference's result.
TEST_F(CApiGpuTest, Attention) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t head_dim : {128, 80}) {  // a fast path, and the generic one
      const DType t = ToDType(dt);
      const int64_t rows = 4, heads = 8, kv_heads = 2, slots = 5, seq = 1024;
      HostTensor q(t, Shape{rows, heads * head_dim});
      HostTensor k(t, Shape{slots, kv_heads, seq, head_dim}), v(t, k.shape());
      q.FillUniform(13);
      k.FillUniform(14);
      v.FillUniform(15);
      // Long and short contexts, padding, and a position past the cache.
      const HostTensor pos = IntTensor({1000, -1, 37, static_cast<int32_t>(seq)});
      ops::Attention op;
      op.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      HostTensor want(t, q.shape());
      const uint32_t want_flags = Reference(op, {&q, &k, &v, &pos}, want);
      ASSERT_EQ(want_flags, STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE);

      int64_t preferred = -1;
      ASSERT_EQ(stepgraph_attention_workspace_bytes(rows, heads, kv_heads, seq, head_dim,
                                                    &preferred),
                kOk);
      ASSERT_GT(preferred, 0) << "a 1024-key context should be split";
      DeviceBuffer dq(q), dk(k), dv(v), dpos(pos), dout(want.bytes()), ws(preferred);
      ws.Poison();  // the call must clear what it uses
      struct Mode {
        const char* name;
        void* workspace;
        int64_t bytes;
      };
      const Mode modes[] = {{"no workspace", nullptr, 0},
                            {"part", ws.get(), preferred / 3},
                            {"all", ws.get(), preferred},
                            {"all again", ws.get(), preferred}};
      for (const Mode& m : modes) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << " head_dim " << head_dim << " " << m.name);
        dout.Poison();
        ASSERT_EQ(stepgraph_attention(dq.get(), dk.get(), dv.get(), dpos.as<int32_t>(), dout.get(),
                                      rows, heads, kv_heads, slots, seq, head_dim, op.scale, dt,
                                      m.workspace, m.bytes, flags(), stream_),
                  kOk);
        EXPECT_EQ(TakeFlags(), want_flags);
        HostTensor got(t, q.shape());
        dout.CopyTo(got);
        EXPECT_LT(Error(got, want), Tol(dt));
      }
    }
  }
}

TEST_F(CApiGpuTest, Softmax) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t n : {1000, 32003}) {
      SCOPED_TRACE(::testing::Message() << Name(dt) << " n " << n);
      const DType t = ToDType(dt);
      const int64_t rows = 3;
      HostTensor x(t, Shape{rows, n});
      x.FillUniform(16, -8.0f, 8.0f);
      HostTensor want(t, x.shape());
      Reference(ops::Softmax{}, {&x}, want);
      DeviceBuffer dx(x), dy(want.bytes());
      dy.Poison();
      ASSERT_EQ(stepgraph_softmax(dx.get(), dy.get(), rows, n, dt, stream_), kOk);
      Sync();
      HostTensor got(t, x.shape());
      dy.CopyTo(got);
      EXPECT_LT(Error(got, want), Tol(dt));
    }
  }
}

// Exact ids, with and without the workspace that splits long rows; bf16 and f16 logits in
// a narrow range make ties, which must go to the lowest index.
TEST_F(CApiGpuTest, Argmax) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t vocab : {1000, 128000}) {
      const DType t = ToDType(dt);
      const int64_t rows = 4;
      HostTensor logits(t, Shape{rows, vocab});
      logits.FillUniform(17, -4.0f, 4.0f);
      HostTensor want(DType::kI32, Shape{rows});
      Reference(ops::Argmax{}, {&logits}, want);

      int64_t bytes = -1;
      ASSERT_EQ(stepgraph_argmax_workspace_bytes(rows, vocab, &bytes), kOk);
      if (vocab >= 100000) {
        EXPECT_GT(bytes, 0) << "long rows should be split";
      }
      DeviceBuffer dx(logits), dids(rows * 4), ws(std::max<int64_t>(bytes, 16));
      ws.Poison();
      for (const bool use_workspace : {false, true, true}) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << " vocab " << vocab
                                          << (use_workspace ? " workspace" : ""));
        dids.Poison();
        ASSERT_EQ(stepgraph_argmax(dx.get(), dids.as<int32_t>(), rows, vocab, dt,
                                   use_workspace ? ws.get() : nullptr,
                                   use_workspace ? bytes : 0, stream_),
                  kOk);
        Sync();
        HostTensor got(DType::kI32, Shape{rows});
        dids.CopyTo(got);
        EXPECT_EQ(Ints(got), Ints(want));
      }
    }
  }
}

// Sample is tested in depth against the kernel (cuda_sampling_test); here, that the C ABI
// passes everything through: the ids agree with the CPU reference on nearly every row
// (its f32 running sums may move a boundary), never leave [0, vocab), repeat exactly, and
// top_k = 1 is exactly the argmax of the scaled logits.
TEST_F(CApiGpuTest, Sample) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t vocab : {1000, 20000}) {  // a block per row, and a cluster per row
      SCOPED_TRACE(::testing::Message() << Name(dt) << " vocab " << vocab);
      const DType t = ToDType(dt);
      const int64_t rows = 128;
      HostTensor logits(t, Shape{rows, vocab});
      logits.FillUniform(18, -3.0f, 3.0f);
      HostTensor seeds(DType::kI32, Shape{rows}), pos(DType::kI32, Shape{rows});
      seeds.FillUniform(19, -1000000.0f, 1000000.0f);
      pos.FillUniform(20, 0.0f, 8192.0f);
      DeviceBuffer dl(logits), ds(seeds), dp(pos), dids(rows * 4);

      for (const ops::Sample op : {ops::Sample{0.7f, 40, 0.9f}, ops::Sample{1.3f, 0, 0.5f},
                                   ops::Sample{0.8f, 1, 1.0f}}) {
        SCOPED_TRACE(::testing::Message() << "T " << op.temperature << " top_k " << op.top_k
                                          << " top_p " << op.top_p);
        HostTensor want(DType::kI32, Shape{rows});
        Reference(op, {&logits, &seeds, &pos}, want);
        std::vector<std::vector<int32_t>> runs;
        for (int run = 0; run < 2; ++run) {
          dids.Poison();
          ASSERT_EQ(stepgraph_sample(dl.get(), ds.as<int32_t>(), dp.as<int32_t>(),
                                     dids.as<int32_t>(), rows, vocab, op.temperature, op.top_k,
                                     op.top_p, dt, stream_),
                    kOk);
          Sync();
          HostTensor got(DType::kI32, Shape{rows});
          dids.CopyTo(got);
          runs.push_back(Ints(got));
        }
        EXPECT_EQ(runs[0], runs[1]) << "not reproducible";
        const std::vector<int32_t> expected = Ints(want);
        int64_t agree = 0;
        for (int64_t i = 0; i < rows; ++i) {
          ASSERT_GE(runs[0][i], 0) << "row " << i;
          ASSERT_LT(runs[0][i], vocab) << "row " << i;
          agree += runs[0][i] == expected[i];
        }
        if (op.top_k == 1) {
          EXPECT_EQ(runs[0], expected);
        } else {
          EXPECT_GE(agree, rows - 3) << agree << " of " << rows << " rows agree";
        }
      }
    }
  }
}

TEST_F(CApiGpuTest, CopyAndAdvance) {
  for (const int32_t dt : {STEPGRAPH_F32, STEPGRAPH_BF16, STEPGRAPH_F16, STEPGRAPH_I32}) {
    SCOPED_TRACE(Name(dt));
    const DType t = ToDType(dt);
    const int64_t n = 1001;
    HostTensor src(t, Shape{n});
    src.FillUniform(21, -100.0f, 100.0f);
    DeviceBuffer dsrc(src), ddst(src.bytes());
    ddst.Poison();
    ASSERT_EQ(stepgraph_copy(dsrc.get(), ddst.get(), n, dt, stream_), kOk);
    ASSERT_EQ(stepgraph_copy(dsrc.get(), dsrc.get(), n, dt, stream_), kOk);  // onto itself
    Sync();
    HostTensor got(t, Shape{n}), same(t, Shape{n});
    ddst.CopyTo(got);
    dsrc.CopyTo(same);
    EXPECT_EQ(Error(got, src), 0.0);
    EXPECT_EQ(Error(same, src), 0.0);
  }

  HostTensor pos = IntTensor({0, 7, -1, 4095, -3, 12});
  HostTensor want(DType::kI32, pos.shape());
  std::copy_n(static_cast<const int32_t*>(pos.data()), pos.size(),
              static_cast<int32_t*>(want.data()));
  Reference(ops::Advance{}, {&pos}, want);
  DeviceBuffer dpos(pos);
  ASSERT_EQ(stepgraph_advance(dpos.as<int32_t>(), pos.size(), stream_), kOk);
  Sync();
  HostTensor got(DType::kI32, pos.shape());
  dpos.CopyTo(got);
  EXPECT_EQ(Ints(got), Ints(want));
  EXPECT_EQ(Ints(got), (std::vector<int32_t>{1, 8, -1, 4096, -3, 13}));
}

// A decode-like step of C ABI calls recorded by stream capture and replayed: attention and
// argmax with their workspaces (the clearing included), then advance. Each replay reads the
// positions the previous one advanced, as a captured step must.
TEST_F(CApiGpuTest, CallsCanBeCapturedAndReplayed) {
  const int32_t dt = STEPGRAPH_BF16;
  const DType t = ToDType(dt);
  const int64_t rows = 2, heads = 4, kv_heads = 2, seq = 512, head_dim = 64, vocab = 50000;
  HostTensor q(t, Shape{rows, heads * head_dim});
  HostTensor k(t, Shape{rows, kv_heads, seq, head_dim}), v(t, k.shape());
  HostTensor logits(t, Shape{rows, vocab});
  q.FillUniform(22);
  k.FillUniform(23);
  v.FillUniform(24);
  logits.FillUniform(25, -5.0f, 5.0f);
  const std::vector<int32_t> start = {300, 17};
  HostTensor pos = IntTensor(start);
  ops::Attention op;
  op.scale = 0.125f;

  int64_t attention_bytes = 0, argmax_bytes = 0;
  ASSERT_EQ(stepgraph_attention_workspace_bytes(rows, heads, kv_heads, seq, head_dim,
                                                &attention_bytes),
            kOk);
  ASSERT_EQ(stepgraph_argmax_workspace_bytes(rows, vocab, &argmax_bytes), kOk);
  DeviceBuffer dq(q), dk(k), dv(v), dl(logits), dpos(pos), dout(q.bytes()), dids(rows * 4),
      attention_ws(attention_bytes), argmax_ws(std::max<int64_t>(argmax_bytes, 16));
  attention_ws.Poison();
  argmax_ws.Poison();

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const int32_t attention = stepgraph_attention(
      dq.get(), dk.get(), dv.get(), dpos.as<int32_t>(), dout.get(), rows, heads, kv_heads, rows,
      seq, head_dim, op.scale, dt, attention_ws.get(), attention_bytes, flags(), stream_);
  const int32_t argmax = stepgraph_argmax(dl.get(), dids.as<int32_t>(), rows, vocab, dt,
                                          argmax_ws.get(), argmax_bytes, stream_);
  const int32_t advance = stepgraph_advance(dpos.as<int32_t>(), rows, stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_EQ(attention, kOk);
  ASSERT_EQ(argmax, kOk);
  ASSERT_EQ(advance, kOk);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  HostTensor want_ids(DType::kI32, Shape{rows});
  Reference(ops::Argmax{}, {&logits}, want_ids);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "replay " << step);
    dout.Poison();
    dids.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    Sync();
    HostTensor step_pos = IntTensor({start[0] + step, start[1] + step});
    HostTensor want(t, q.shape());
    Reference(op, {&q, &k, &v, &step_pos}, want);
    HostTensor got(t, q.shape()), ids(DType::kI32, Shape{rows}), moved(DType::kI32, Shape{rows});
    dout.CopyTo(got);
    dids.CopyTo(ids);
    dpos.CopyTo(moved);
    EXPECT_LT(Error(got, want), Tol(dt));
    EXPECT_EQ(Ints(ids), Ints(want_ids));
    EXPECT_EQ(Ints(moved), (std::vector<int32_t>{start[0] + step + 1, start[1] + step + 1}));
  }
  EXPECT_EQ(TakeFlags(), 0u);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

// A launch CUDA refuses is -3: one on the legacy default stream while a blocking stream is
// being captured in global mode would depend on the capture implicitly, which CUDA forbids.
TEST_F(CApiGpuTest, RefusedLaunchIsLaunchFailed) {
  const int64_t n = 4096;
  DeviceBuffer a(n * 4), b(n * 4), y(n * 4);
  a.Zero();
  b.Zero();
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(stepgraph_add(a.get(), b.get(), y.get(), n, STEPGRAPH_F32, nullptr),
            STEPGRAPH_ERROR_LAUNCH_FAILED);
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(blocking, &graph);  // invalidated by the refused launch
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  (void)cudaStreamDestroy(blocking);

  // The error was not sticky: the next call works.
  ASSERT_EQ(stepgraph_add(a.get(), b.get(), y.get(), n, STEPGRAPH_F32, stream_), kOk);
  Sync();
}

}  // namespace
}  // namespace sg::testing
