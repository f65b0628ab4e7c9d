// The C ABI's top-k, attention over sequences, general matrix products and training
// functions on the GPU against CPU references written here in double from their
// definitions (PyTorch's: torch.topk, F.cross_entropy, torch.optim.AdamW, clip_grad_norm_;
// the Switch Transformer loss); the Python suite also compares the training functions with
// PyTorch's own numbers (tests/fixtures/c_api/training.json). Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "stepgraph/c_api/c_api.h"
#include "tests/c_api/gpu_util.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

template <typename T>
std::vector<T> Download(const DeviceBuffer& d, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

template <typename T>
void Upload(DeviceBuffer& d, const std::vector<T>& v) {
  EXPECT_EQ(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
}

std::vector<double> LogSoftmax(const HostTensor& logits, int64_t row, int64_t vocab) {
  double m = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) m = std::max<double>(m, logits.At(row * vocab + j));
  double s = 0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(logits.At(row * vocab + j) - m);
  std::vector<double> out(vocab);
  for (int64_t j = 0; j < vocab; ++j) out[j] = logits.At(row * vocab + j) - m - std::log(s);
  return out;
}

// top-k with ties, -0/+0 and a NaN, against a stable sort of the row: rows of up to 256
// (a warp per row, keys in registers; 256 its most) and longer ones (a block per row).
TEST_F(CApiGpuTest, Topk) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t n : {int64_t{50}, int64_t{256}, int64_t{257}, int64_t{32000}}) {
      for (const int64_t k : {int64_t{1}, int64_t{40}}) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << " n " << n << " k " << k);
        const DType t = ToDType(dt);
        const int64_t rows = 5;
        HostTensor x(t, Shape{rows, n});
        x.FillUniform(91, -4.0f, 4.0f);
        std::vector<float> vals = x.ToFloat();
        vals[3] = vals[7] = 2.5f;           // a tie: the lower index first
        vals[n + 1] = std::nanf("");        // NaN ranks first
        vals[2 * n] = -0.0f;
        vals[2 * n + 1] = 0.0f;             // -0 ties with +0
        x.FillFrom(vals);
        vals = x.ToFloat();
        std::vector<int32_t> want_idx;
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<int32_t> order(n);
          for (int64_t j = 0; j < n; ++j) order[j] = static_cast<int32_t>(j);
          const float* row = vals.data() + r * n;
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
            if (na != nb) return na;
            return !na && row[a] > row[b];
          });
          want_idx.insert(want_idx.end(), order.begin(), order.begin() + k);
        }
        DeviceBuffer dx(x), dv(rows * k * DTypeBytes(t)), di(rows * k * 4);
        dv.Poison();
        di.Poison();
        ASSERT_EQ(stepgraph_topk(dx.get(), dv.get(), di.as<int32_t>(), rows, n, k, dt, stream_),
                  kOk);
        Sync();
        EXPECT_EQ(Download<int32_t>(di, rows * k), want_idx);
        HostTensor got(t, Shape{rows, k});
        dv.CopyTo(got);
        const std::vector<float> got_v = got.ToFloat();
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < k; ++j) {
            const float want_v = vals[r * n + want_idx[r * k + j]];
            const float g = got_v[r * k + j];
            EXPECT_TRUE(g == want_v || (std::isnan(g) && std::isnan(want_v))) << r << "," << j;
          }
        }
      }
    }
  }
}

// Attention over sequences against a double softmax reference: causal and not,
// grouped-query, an odd head_dim and sequence length.
TEST_F(CApiGpuTest, FlashAttention) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int32_t causal : {0, 1}) {
      for (const int64_t head_dim : {int64_t{64}, int64_t{40}, int64_t{256}}) {
        SCOPED_TRACE(::testing::Message() << Name(dt) << " causal " << causal << " head_dim "
                                          << head_dim);
        const DType t = ToDType(dt);
        const int64_t batch = 2, seq = 37, heads = 6, kv_heads = 2;
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        HostTensor q(t, Shape{batch, seq, heads, head_dim});
        HostTensor k(t, Shape{batch, seq, kv_heads, head_dim});
        HostTensor v(t, Shape{batch, seq, kv_heads, head_dim});
        q.FillUniform(101, -2.0f, 2.0f);
        k.FillUniform(102, -2.0f, 2.0f);
        v.FillUniform(103, -1.0f, 1.0f);
        std::vector<float> want_f(q.size());
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / (heads / kv_heads);
            for (int64_t i = 0; i < seq; ++i) {
              const int64_t last = causal ? i : seq - 1;
              std::vector<double> s(last + 1);
              double mx = -INFINITY;
              for (int64_t j = 0; j <= last; ++j) {
                double dot = 0;
                for (int64_t d = 0; d < head_dim; ++d) {
                  dot += double{q.At(((b * seq + i) * heads + h) * head_dim + d)} *
                         k.At(((b * seq + j) * kv_heads + g) * head_dim + d);
                }
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
              }
              double sum = 0;
              for (double& x : s) sum += (x = std::exp(x - mx));
              for (int64_t d = 0; d < head_dim; ++d) {
                double o = 0;
                for (int64_t j = 0; j <= last; ++j) {
                  o += s[j] * v.At(((b * seq + j) * kv_heads + g) * head_dim + d);
                }
                want_f[((b * seq + i) * heads + h) * head_dim + d] = static_cast<float>(o / sum);
              }
            }
          }
        }
        HostTensor want(t, Shape{batch, seq, heads, head_dim});
        want.FillFrom(want_f);
        DeviceBuffer dq(q), dk(k), dvb(v), dout(want.bytes());
        dout.Poison();
        ASSERT_EQ(stepgraph_flash_attention(dq.get(), dk.get(), dvb.get(), dout.get(), batch, seq,
                                            heads, kv_heads, head_dim, scale, causal, dt, stream_),
                  kOk);
        Sync();
        HostTensor got(t, Shape{batch, seq, heads, head_dim});
        dout.CopyTo(got);
        EXPECT_LT(NormalizedError(got.ToFloat(), want.ToFloat()), Tol(dt));
      }
    }
  }
}

// C = alpha · op(A) · op(B) + beta · C for every transpose pair at odd sizes, single and
// batched (with one B shared by every product), against a double reference.
TEST_F(CApiGpuTest, GemmAndBatchedGemm) {
  const int64_t m = 37, n = 45, k = 61, batch = 3;
  for (const int32_t dt : kFloatDTypes) {
    for (const int ta : {0, 1}) {
      for (const int tb : {0, 1}) {
        for (const float beta : {0.0f, 0.75f}) {
          SCOPED_TRACE(::testing::Message() << Name(dt) << " trans_a " << ta << " trans_b " << tb
                                            << " beta " << beta);
          const DType t = ToDType(dt);
          const float alpha = -1.25f;
          HostTensor a(t, Shape{batch, m * k}), b(t, Shape{k * n}), c0(t, Shape{batch, m * n});
          a.FillUniform(81, -1.0f, 1.0f);
          b.FillUniform(82, -1.0f, 1.0f);
          c0.FillUniform(83, -1.0f, 1.0f);
          // op(A)[i, p] and op(B)[p, j] of the stored row-major matrices.
          auto at = [&](int64_t s, int64_t i, int64_t p) {
            return double{a.At(s * m * k + (ta ? p * m + i : i * k + p))};
          };
          auto bt = [&](int64_t p, int64_t j) { return double{b.At(tb ? j * k + p : p * n + j)}; };
          std::vector<float> want_f(batch * m * n);
          for (int64_t s = 0; s < batch; ++s) {
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t p = 0; p < k; ++p) acc += at(s, i, p) * bt(p, j);
                const int64_t o = s * m * n + i * n + j;
                want_f[o] = static_cast<float>(alpha * acc + beta * double{c0.At(o)});
              }
            }
          }
          HostTensor want(t, Shape{batch, m * n});
          want.FillFrom(want_f);
          DeviceBuffer da(a), db(b), ws(1 << 22);
          {  // one product: the first matrix of each stack
            DeviceBuffer dc(c0);
            if (beta == 0.0f) dc.Poison();
            ASSERT_EQ(stepgraph_gemm(da.get(), db.get(), dc.get(), m, n, k, ta, tb, alpha, beta,
                                     dt, ws.get(), 1 << 22, stream_),
                      kOk);
            Sync();
            HostTensor got(t, Shape{m * n});
            dc.CopyTo(got);
            std::vector<float> w0(want_f.begin(), want_f.begin() + m * n);
            HostTensor want0(t, Shape{m * n});
            want0.FillFrom(w0);
            EXPECT_LT(NormalizedError(got.ToFloat(), want0.ToFloat()), Tol(dt));
          }
          {  // batched, B shared (stride 0), without a workspace
            DeviceBuffer dc(c0);
            if (beta == 0.0f) dc.Poison();
            ASSERT_EQ(stepgraph_gemm_batched(da.get(), db.get(), dc.get(), batch, m, n, k, m * k, 0,
                                             m * n, ta, tb, alpha, beta, dt, nullptr, 0, stream_),
                      kOk);
            Sync();
            HostTensor got(t, Shape{batch, m * n});
            dc.CopyTo(got);
            EXPECT_LT(NormalizedError(got.ToFloat(), want.ToFloat()), Tol(dt));
          }
        }
      }
    }
  }
}

TEST_F(CApiGpuTest, CrossEntropyForwardAndBackward) {
  for (const int32_t dt : kFloatDTypes) {
    for (const int64_t vocab : {int64_t{1000}, int64_t{32003}}) {
      SCOPED_TRACE(::testing::Message() << Name(dt) << " vocab " << vocab);
      const DType t = ToDType(dt);
      const int64_t rows = 9;
      const int32_t ignore = -100;
      HostTensor logits(t, Shape{rows, vocab});
      logits.FillUniform(31, -6.0f, 6.0f);
      std::mt19937 rng(5);
      std::vector<int32_t> targets(rows);
      for (auto& x : targets) x = static_cast<int32_t>(rng() % vocab);
      targets[4] = ignore;
      std::vector<float> dloss(rows);
      for (auto& x : dloss) x = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;

      std::vector<double> want_loss(rows, 0.0);
      HostTensor want_lp(t, Shape{rows, vocab}), want_d(t, Shape{rows, vocab});
      std::vector<float> lp_all, d_all;
      for (int64_t i = 0; i < rows; ++i) {
        const std::vector<double> lp = LogSoftmax(logits, i, vocab);
        for (int64_t j = 0; j < vocab; ++j) {
          lp_all.push_back(static_cast<float>(lp[j]));
          double g = 0;
          if (targets[i] != ignore) g = dloss[i] * (std::exp(lp[j]) - (j == targets[i] ? 1 : 0));
          d_all.push_back(static_cast<float>(g));
        }
        if (targets[i] != ignore) want_loss[i] = -lp[targets[i]];
      }
      want_lp.FillFrom(lp_all);
      want_d.FillFrom(d_all);

      DeviceBuffer dl(logits), dt_(rows * 4), dloss_d(rows * 4), dloss_out(rows * 4),
          dlp(want_lp.bytes()), dd(want_d.bytes());
      Upload(dt_, targets);
      Upload(dloss_d, dloss);
      dloss_out.Poison();
      dlp.Poison();
      dd.Poison();
      ASSERT_EQ(stepgraph_cross_entropy(dl.get(), dt_.as<int32_t>(), dloss_out.as<float>(),
                                        dlp.get(), rows, vocab, ignore, dt, flags(), stream_),
                kOk);
      ASSERT_EQ(stepgraph_cross_entropy_backward(dl.get(), dt_.as<int32_t>(),
                                                 dloss_d.as<float>(), dd.get(), rows, vocab,
                                                 ignore, dt, flags(), stream_),
                kOk);
      EXPECT_EQ(TakeFlags(), 0u);
      const std::vector<float> loss = Download<float>(dloss_out, rows);
      EXPECT_LT(NormalizedError(loss, want_loss), 1e-5);
      EXPECT_EQ(loss[4], 0.0f);
      HostTensor got_lp(t, Shape{rows, vocab}), got_d(t, Shape{rows, vocab});
      dlp.CopyTo(got_lp);
      dd.CopyTo(got_d);
      EXPECT_LT(NormalizedError(got_lp.ToFloat(), want_lp.ToFloat()), Tol(dt));
      EXPECT_LT(NormalizedError(got_d.ToFloat(), want_d.ToFloat()), Tol(dt));
    }
  }
}

TEST_F(CApiGpuTest, CrossEntropyTargetOutOfRangeRaisesTheFlag) {
  const int64_t rows = 3, vocab = 50;
  HostTensor logits(DType::kF32, Shape{rows, vocab});
  logits.FillUniform(3);
  DeviceBuffer dl(logits), dt_(rows * 4), loss(rows * 4);
  Upload(dt_, std::vector<int32_t>{1, vocab, 2});
  loss.Poison();
  ASSERT_EQ(stepgraph_cross_entropy(dl.get(), dt_.as<int32_t>(), loss.as<float>(), nullptr, rows,
                                    vocab, -100, STEPGRAPH_F32, flags(), stream_),
            kOk);
  EXPECT_EQ(TakeFlags(), STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE);
  EXPECT_EQ(Download<float>(loss, rows)[1], 0.0f);
}

TEST_F(CApiGpuTest, MoeAuxLoss) {
  for (const int32_t dt : kFloatDTypes) {
    SCOPED_TRACE(Name(dt));
    const int64_t tokens = 777, experts = 64, top_k = 4;
    HostTensor probs(ToDType(dt), Shape{tokens, experts});
    probs.FillUniform(41, 0.001f, 1.0f);
    std::mt19937 rng(9);
    std::vector<int32_t> ids(tokens * top_k);
    for (auto& e : ids) e = static_cast<int32_t>(rng() % experts);
    std::vector<double> count(experts, 0), psum(experts, 0);
    for (int32_t e : ids) count[e] += 1;
    for (int64_t i = 0; i < tokens * experts; ++i) psum[i % experts] += probs.At(i);
    double want = 0;
    for (int64_t e = 0; e < experts; ++e) want += count[e] / tokens * psum[e] / tokens;
    want *= experts;
    DeviceBuffer dp(probs), di(ids.size() * 4), dlossb(4);
    Upload(di, ids);
    dlossb.Poison();
    ASSERT_EQ(stepgraph_moe_aux_loss(dp.get(), di.as<int32_t>(), dlossb.as<float>(), tokens,
                                     experts, top_k, dt, flags(), stream_),
              kOk);
    EXPECT_EQ(TakeFlags(), 0u);
    EXPECT_NEAR(Download<float>(dlossb, 1)[0], want, 1e-4 * want);
  }
}

TEST_F(CApiGpuTest, AdamWStepsMatchTheDefinition) {
  for (const int32_t gdt : kFloatDTypes) {
    SCOPED_TRACE(Name(gdt));
    const int64_t n = (1 << 18) + 5;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    HostTensor p0(DType::kF32, Shape{n});
    p0.FillUniform(51, -1.0f, 1.0f);
    std::vector<double> p(n), m(n, 0), v(n, 0);
    for (int64_t i = 0; i < n; ++i) p[i] = p0.At(i);
    DeviceBuffer dp(p0), dm(n * 4), dv(n * 4);
    dm.Zero();
    dv.Zero();
    for (int64_t step = 1; step <= 3; ++step) {
      HostTensor g(ToDType(gdt), Shape{n});
      g.FillUniform(60 + step, -0.5f, 0.5f);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g.At(i);
        p[i] *= 1.0 - static_cast<double>(lr) * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        const double mh = m[i] / (1.0 - std::pow(double{b1}, step));
        const double vh = v[i] / (1.0 - std::pow(double{b2}, step));
        p[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
      DeviceBuffer dg(g);
      ASSERT_EQ(stepgraph_adamw_step(dp.as<float>(), dg.get(), dm.as<float>(), dv.as<float>(), n,
                                     lr, b1, b2, eps, wd, step, gdt, stream_),
                kOk);
      Sync();
    }
    EXPECT_LT(NormalizedError(Download<float>(dp, n), p), 1e-6);
    EXPECT_LT(NormalizedError(Download<float>(dm, n), m), 1e-6);
    EXPECT_LT(NormalizedError(Download<float>(dv, n), v), 1e-6);
  }
}

TEST_F(CApiGpuTest, ClipGradNorm) {
  for (const int32_t dt : kFloatDTypes) {
    for (const float max_norm : {0.5f, 1e6f}) {
      SCOPED_TRACE(::testing::Message() << Name(dt) << " max_norm " << max_norm);
      const std::vector<int64_t> sizes = {1, 4099, 300000};
      std::vector<HostTensor> host;
      double sq = 0;
      for (size_t b = 0; b < sizes.size(); ++b) {
        host.emplace_back(ToDType(dt), Shape{sizes[b]});
        host.back().FillUniform(70 + b, -1.0f, 1.0f);
        for (int64_t i = 0; i < sizes[b]; ++i) sq += double{host.back().At(i)} * host.back().At(i);
      }
      const double norm = std::sqrt(sq);
      const double coef = std::min(1.0, max_norm / (norm + 1e-6));
      std::vector<std::unique_ptr<DeviceBuffer>> dev;
      std::vector<void*> ptrs;
      for (auto& h : host) {
        dev.push_back(std::make_unique<DeviceBuffer>(h));
        ptrs.push_back(dev.back()->get());
      }
      DeviceBuffer dn(4);
      dn.Poison();
      ASSERT_EQ(stepgraph_clip_grad_norm(ptrs.data(), sizes.data(),
                                         static_cast<int64_t>(sizes.size()), max_norm, dt,
                                         dn.as<float>(), stream_),
                kOk);
      Sync();
      EXPECT_NEAR(Download<float>(dn, 1)[0], norm, 1e-5 * norm);
      for (size_t b = 0; b < sizes.size(); ++b) {
        std::vector<float> want_f(sizes[b]);
        for (int64_t i = 0; i < sizes[b]; ++i) want_f[i] = static_cast<float>(host[b].At(i) * coef);
        HostTensor want(ToDType(dt), Shape{sizes[b]}), got(ToDType(dt), Shape{sizes[b]});
        want.FillFrom(want_f);
        dev[b]->CopyTo(got);
        EXPECT_LT(NormalizedError(got.ToFloat(), want.ToFloat()), Tol(dt)) << "buffer " << b;
      }
    }
  }
}

}  // namespace
}  // namespace sg::testing
