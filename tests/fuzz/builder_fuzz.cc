// libFuzzer harness: bytes decoded into a sequence of GraphBuilder calls with arbitrary
// names, dtypes, shapes (huge, zero, negative, too many dims), op parameters and operands
// (including invalid ids and ids of another builder), then Build, Validate, the text
// forms and the memory plan. Every call must return a graph or an error; never crash,
// overflow, leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/memory_plan.h"

namespace {

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t Byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Byte();
    return v;
  }
  float Float() {
    const uint32_t bits = U32();
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Dims that matter: small ones, block multiples, and the edges of every bound.
constexpr int64_t kDims[] = {1,     2,        3,        4,       7,       8,
                             16,    32,       64,       256,     4096,    0,
                             -1,    int64_t{1} << 31,   int64_t{1} << 40, (int64_t{1} << 48) + 1,
                             (int64_t{1} << 62) + 1,    std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::min()};

sg::Shape ReadShape(Bytes& in) {
  const int rank = in.Byte() % 6;  // 5 is beyond kMaxRank
  std::vector<int64_t> dims;
  for (int i = 0; i < rank; ++i) dims.push_back(kDims[in.Byte() % std::size(kDims)]);
  return sg::Shape(absl::Span<const int64_t>(dims));
}

sg::DType ReadDType(Bytes& in) {
  // A few values past the last dtype, as a caller through an FFI could pass.
  return static_cast<sg::DType>(in.Byte() % (sg::kNumDTypes + 2));
}

std::string ReadName(Bytes& in) {
  const uint8_t b = in.Byte();
  if (b % 4 == 0) return "";  // the builder picks one
  return absl::StrCat("t", b % 16);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  sg::GraphBuilder b;
  sg::GraphBuilder other;
  std::vector<sg::TensorId> ids = {sg::TensorId{},
                                   other.Input("foreign", sg::DType::kF32, {1, 4})};
  auto pick = [&]() { return ids[in.Byte() % ids.size()]; };
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const uint8_t op = in.Byte() % 22;
    sg::TensorId out;
    // Every read is its own statement: the order in which a call's arguments are
    // evaluated differs between compilers, and a corpus input must replay the same
    // calls under GCC as under the clang that found it.
    const auto decl = [&](sg::TensorId (sg::GraphBuilder::*declare)(absl::string_view,
                                                                     sg::DType, sg::Shape)) {
      const std::string name = ReadName(in);
      const sg::DType dtype = ReadDType(in);
      const sg::Shape shape = ReadShape(in);
      return (b.*declare)(name, dtype, shape);
    };
    switch (op) {
      case 0: out = decl(&sg::GraphBuilder::Input); break;
      case 1: out = decl(&sg::GraphBuilder::Weight); break;
      case 2: out = decl(&sg::GraphBuilder::State); break;
      case 3: {
        const sg::TensorId t = pick(), ids_in = pick();
        out = b.Embedding(t, ids_in, ReadName(in));
        break;
      }
      case 4: {
        const sg::TensorId t = pick(), ids_in = pick();
        const sg::DType dtype = ReadDType(in);
        out = b.Embedding(t, ids_in, dtype, ReadName(in));
        break;
      }
      case 5: {
        const sg::TensorId x = pick(), w = pick();
        out = b.MatMul(x, w, ReadName(in));
        break;
      }
      case 6: {
        const sg::TensorId x = pick(), w = pick(), bias = pick();
        out = b.MatMul(x, w, bias, ReadName(in));
        break;
      }
      case 7: {
        const sg::TensorId x = pick(), w = pick();
        const float eps = in.Float();
        out = b.RmsNorm(x, w, eps, ReadName(in));
        break;
      }
      case 8: {
        const sg::TensorId x = pick(), y = pick();
        out = b.Add(x, y, ReadName(in));
        break;
      }
      case 9: {
        const sg::TensorId x = pick(), y = pick();
        out = b.Mul(x, y, ReadName(in));
        break;
      }
      case 10: {
        const sg::TensorId x = pick();
        out = b.Silu(x, ReadName(in));
        break;
      }
      case 11: {
        const sg::TensorId x = pick(), y = pick();
        out = b.SiluMul(x, y, ReadName(in));
        break;
      }
      case 12: {
        sg::ops::Rope r;
        r.head_dim = static_cast<int32_t>(in.U32());
        r.theta = in.Float();
        r.interleaved = in.Byte() & 1;
        if (in.Byte() & 1) {
          r.scaling.type = sg::ops::RopeScaling::Type::kLlama3;
          r.scaling.factor = in.Float();
          r.scaling.low_freq_factor = in.Float();
          r.scaling.high_freq_factor = in.Float();
          r.scaling.original_max_position = static_cast<int32_t>(in.U32());
        }
        const sg::TensorId x = pick(), pos = pick();
        out = b.Rope(x, pos, r, ReadName(in));
        break;
      }
      case 13: {
        const sg::TensorId cache = pick(), v = pick(), pos = pick();
        out = b.KvWrite(cache, v, pos, ReadName(in));
        break;
      }
      case 14: {
        const sg::TensorId q = pick(), k = pick(), v = pick(), pos = pick();
        out = b.Attention(q, k, v, pos, ReadName(in));
        break;
      }
      case 15: {
        const sg::TensorId q = pick(), k = pick(), v = pick(), pos = pick();
        const float scale = in.Float();
        out = b.Attention(q, k, v, pos, scale, ReadName(in));
        break;
      }
      case 16: {
        const sg::TensorId x = pick();
        out = b.Softmax(x, ReadName(in));
        break;
      }
      case 17: {
        const sg::TensorId x = pick();
        out = b.Argmax(x, ReadName(in));
        break;
      }
      case 18: {
        sg::ops::Sample s;
        s.temperature = in.Float();
        s.top_k = static_cast<int32_t>(in.U32());
        s.top_p = in.Float();
        const sg::TensorId logits = pick(), seeds = pick(), pos = pick();
        out = b.Sample(logits, seeds, pos, s, ReadName(in));
        break;
      }
      case 19: {
        const sg::TensorId src = pick(), dst = pick();
        out = b.Copy(src, dst, ReadName(in));
        break;
      }
      case 20: {
        const sg::TensorId x = pick();
        out = b.Advance(x, ReadName(in));
        break;
      }
      default: {
        const std::string name = ReadName(in);
        b.Output(name, pick());
        continue;
      }
    }
    ids.push_back(out);
  }
  absl::StatusOr<sg::Graph> graph = std::move(b).Build();
  if (!graph.ok()) return 0;
  if (const absl::Status valid = graph->Validate(); !valid.ok()) {
    // Build promises a valid graph.
    std::fprintf(stderr, "built graph fails Validate: %s\n", valid.ToString().c_str());
    std::abort();
  }
  (void)graph->ToString();
  (void)graph->ToDot();
  absl::StatusOr<sg::ExecutionPlan> plan = sg::ExecutionPlan::Create(*std::move(graph));
  if (plan.ok()) (void)plan->arena_bytes();
  return 0;
}
