// libFuzzer harness: bytes decoded into a sequence of GraphBuilder calls with arbitrary
// names, dtypes, shapes (huge, zero, negative, too many dims), op parameters and operands
// (including invalid ids and ids of another builder), then Build, Validate, the text
// forms and the memory plan. Every call must return a graph or an error; never crash,
// overflow, leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/builder.h"
#include "stepgraph/plan.h"

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
    switch (op) {
      case 0: out = b.Input(ReadName(in), ReadDType(in), ReadShape(in)); break;
      case 1: out = b.Weight(ReadName(in), ReadDType(in), ReadShape(in)); break;
      case 2: out = b.State(ReadName(in), ReadDType(in), ReadShape(in)); break;
      case 3: out = b.Embedding(pick(), pick(), ReadName(in)); break;
      case 4: out = b.Embedding(pick(), pick(), ReadDType(in), ReadName(in)); break;
      case 5: out = b.MatMul(pick(), pick(), ReadName(in)); break;
      case 6: out = b.MatMul(pick(), pick(), pick(), ReadName(in)); break;
      case 7: out = b.RmsNorm(pick(), pick(), in.Float(), ReadName(in)); break;
      case 8: out = b.Add(pick(), pick(), ReadName(in)); break;
      case 9: out = b.Mul(pick(), pick(), ReadName(in)); break;
      case 10: out = b.Silu(pick(), ReadName(in)); break;
      case 11: out = b.SiluMul(pick(), pick(), ReadName(in)); break;
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
      case 13: out = b.KvWrite(pick(), pick(), pick(), ReadName(in)); break;
      case 14: out = b.Attention(pick(), pick(), pick(), pick(), ReadName(in)); break;
      case 15: {
        const sg::TensorId q = pick(), k = pick(), v = pick(), pos = pick();
        out = b.Attention(q, k, v, pos, in.Float(), ReadName(in));
        break;
      }
      case 16: out = b.Softmax(pick(), ReadName(in)); break;
      case 17: out = b.Argmax(pick(), ReadName(in)); break;
      case 18: {
        sg::ops::Sample s;
        s.temperature = in.Float();
        s.top_k = static_cast<int32_t>(in.U32());
        s.top_p = in.Float();
        const sg::TensorId logits = pick(), seeds = pick(), pos = pick();
        out = b.Sample(logits, seeds, pos, s, ReadName(in));
        break;
      }
      case 19: out = b.Copy(pick(), pick(), ReadName(in)); break;
      case 20: out = b.Advance(pick(), ReadName(in)); break;
      default: b.Output(ReadName(in), pick()); continue;
    }
    ids.push_back(out);
  }
  absl::StatusOr<sg::Graph> graph = std::move(b).Build();
  if (!graph.ok()) return 0;
  if (!graph->Validate().ok()) __builtin_trap();  // Build promises a valid graph
  (void)graph->ToString();
  (void)graph->ToDot();
  absl::StatusOr<sg::ExecutionPlan> plan = sg::ExecutionPlan::Create(*std::move(graph));
  if (plan.ok()) (void)plan->arena_bytes();
  return 0;
}
