#include "tests/testing/util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>

#include "stepgraph/base/half.h"
#include "stepgraph/base/quant.h"

namespace sg::testing {
namespace {

float Load(const void* p, DType t, int64_t i) { return LoadElement(p, t, i); }
void Store(void* p, DType t, int64_t i, float v) { StoreElement(p, t, i, v); }

}  // namespace

HostTensor::HostTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
  const size_t bytes = static_cast<size_t>((this->bytes() + 255) / 256 * 256);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(256, bytes == 0 ? 256 : bytes));
  storage_ = std::unique_ptr<std::byte[], void (*)(std::byte*)>(
      p, [](std::byte* q) { std::free(q); });
  std::memset(p, 0, bytes == 0 ? 256 : bytes);
}

int64_t HostTensor::bytes() const {
  return std::max<int64_t>(0, TensorBytes(dtype_, shape_));
}

void HostTensor::FillUniform(uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  if (IsQuantized(dtype_)) {
    // Random values quantized row by row: valid blocks whose values span [lo, hi).
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> values(size());
    for (float& v : values) v = dist(rng);
    FillFrom(values);
    return;
  }
  if (dtype_ == DType::kI32) {
    std::uniform_int_distribution<int32_t> dist(static_cast<int32_t>(lo),
                                                static_cast<int32_t>(hi) - 1);
    for (int64_t i = 0; i < size(); ++i) static_cast<int32_t*>(data())[i] = dist(rng);
    return;
  }
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < size(); ++i) Store(data(), dtype_, i, dist(rng));
}

void HostTensor::FillFrom(const std::vector<float>& values) {
  if (IsQuantized(dtype_)) {
    const int64_t cols = shape_.cols(), row_bytes = DTypeRowBytes(dtype_, cols);
    std::vector<float> row(cols, 0.0f);
    for (int64_t r = 0; r < shape_.rows(); ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        row[c] = i < values.size() ? values[i] : 0.0f;
      }
      QuantizeRow(dtype_, row.data(), static_cast<std::byte*>(data()) + r * row_bytes, cols);
    }
    return;
  }
  for (int64_t i = 0; i < size() && i < static_cast<int64_t>(values.size()); ++i) {
    Store(data(), dtype_, i, values[i]);
  }
}

void HostTensor::Poison() { std::memset(data(), 0xFF, static_cast<size_t>(bytes())); }

std::vector<float> HostTensor::ToFloat() const {
  std::vector<float> out(size());
  if (IsQuantized(dtype_)) {
    const int64_t cols = shape_.cols(), row_bytes = DTypeRowBytes(dtype_, cols);
    for (int64_t r = 0; r < shape_.rows(); ++r) {
      DequantizeRow(dtype_, static_cast<const std::byte*>(data()) + r * row_bytes,
                    out.data() + r * cols, cols);
    }
    return out;
  }
  for (int64_t i = 0; i < size(); ++i) out[i] = Load(data(), dtype_, i);
  return out;
}

float HostTensor::At(int64_t i) const {
  if (IsQuantized(dtype_)) return ToFloat()[i];
  return Load(data(), dtype_, i);
}

double NormalizedError(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

double NormalizedError(const std::vector<float>& got, const std::vector<float>& want) {
  return NormalizedError(got, std::vector<double>(want.begin(), want.end()));
}

HostBindings::HostBindings(const ExecutionPlan& plan, uint64_t seed, float scale)
    : bindings_(plan.graph()), arena_(static_cast<size_t>(plan.arena_bytes()) + 256) {
  // Align the arena to 256 bytes as device allocations are.
  auto base = reinterpret_cast<uintptr_t>(arena_.data());
  std::byte* aligned = arena_.data() + ((256 - base % 256) % 256);
  bindings_.SetArena(aligned, plan.arena_bytes());
  const Graph& g = plan.graph();
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind == TensorKind::kIntermediate) continue;
    auto host = std::make_unique<HostTensor>(t.dtype, t.shape);
    if (t.kind == TensorKind::kWeight) {
      const bool norm = t.shape.rank() == 1 && t.name.find("norm") != std::string::npos;
      if (norm) {
        host->FillUniform(seed + i, 1.0f - scale, 1.0f + scale);
      } else {
        host->FillUniform(seed + i, -scale, scale);
      }
    }
    (void)bindings_.Bind(g.id(i), host->data(), host->bytes());
    tensors_.emplace_back(t.name, std::move(host));
  }
}

HostTensor& HostBindings::tensor(absl::string_view name) {
  for (auto& [n, t] : tensors_) {
    if (n == name) return *t;
  }
  std::abort();  // a test asked for a tensor its graph does not have
}

std::vector<float> HostBindings::Read(const ExecutionPlan& plan,
                                      absl::string_view output_name) const {
  const TensorId id = plan.graph().FindOutput(output_name).value();
  const TensorArg arg = ResolveTensor(plan, bindings_, id.index);
  std::vector<float> out(arg.shape.NumElements());
  for (size_t i = 0; i < out.size(); ++i) out[i] = Load(arg.data, arg.dtype, i);
  return out;
}

std::string TestCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/stepgraph-test";
  return std::string(home != nullptr ? home : "/nonexistent") + "/.cache/stepgraph-test";
}

}  // namespace sg::testing
