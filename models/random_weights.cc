// Random weights from a counter hash: element i of tensor `name` is Mix64(key(seed, name) +
// (i + 1)·golden), so no element depends on another, any split of the work over threads
// gives the same bytes, and Llama-3.2-1B's 1.2 G elements fill in well under a second on a
// few cores.
#include "models/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64's finaliser: a bijection that spreads every input bit over the output.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t TensorKey(uint64_t seed, absl::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return Mix64(h ^ Mix64(seed + kGolden));
}

// How a tensor's uniform draw in [-1, 1) becomes its value: offset + scale·u.
struct Distribution {
  float offset = 0.0f;
  float scale = 0.0f;
};

bool IsNormWeight(absl::string_view name) {
  return absl::EndsWith(name, "norm.weight");
}

Distribution DistributionOf(const Tensor& t) {
  if (t.shape.rank() == 1 && IsNormWeight(t.name)) return {1.0f, 0.1f};
  return {0.0f, RandomWeightScale(t)};
}

inline float Draw(uint64_t key, int64_t index, Distribution d) {
  const uint64_t bits = Mix64(key + static_cast<uint64_t>(index + 1) * kGolden);
  // 24 bits: every u is exact in f32, and u is symmetric around 0.
  const float u = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
  return d.offset + d.scale * u;
}

// Writes elements [begin, end) of one tensor.
void FillRange(const Tensor& t, uint64_t key, Distribution d, int64_t begin, int64_t end,
               std::byte* out) {
  switch (t.dtype) {
    case DType::kF32: {
      float* p = reinterpret_cast<float*>(out);
      for (int64_t i = begin; i < end; ++i) p[i] = Draw(key, i, d);
      break;
    }
    case DType::kBF16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) p[i] = FloatToBF16(Draw(key, i, d));
      break;
    }
    case DType::kF16: {
      uint16_t* p = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) p[i] = FloatToHalf(Draw(key, i, d));
      break;
    }
    default:
      if (IsQuantized(t.dtype)) {
        // Blocks quantized from the drawn values; [begin, end) holds whole blocks, and
        // blocks lie back to back across rows (a row is a whole number of blocks).
        const int64_t elems = DTypeBlockElems(t.dtype), bytes = DTypeBlockBytes(t.dtype);
        float values[256];
        for (int64_t i = begin; i < end; i += elems) {
          for (int64_t j = 0; j < elems; ++j) values[j] = Draw(key, i + j, d);
          QuantizeRow(t.dtype, values, out + i / elems * bytes, elems);
        }
      }
      break;  // i32 is refused before any work starts
  }
}

}  // namespace

const BufferLayout::Entry* BufferLayout::Find(absl::string_view name) const {
  for (const Entry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

BufferLayout LayoutBuffers(const Graph& graph, TensorKind kind, int64_t alignment) {
  BufferLayout layout;
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != kind) continue;
    layout.entries.push_back({i, t.name, layout.total_bytes, t.bytes()});
    layout.total_bytes += (t.bytes() + alignment - 1) / alignment * alignment;
  }
  return layout;
}

absl::Status BindLayout(const Graph& graph, TensorKind kind, const BufferLayout& layout,
                        std::byte* base, Bindings& bindings) {
  // Bucket graphs are small in tensor count; a name map makes this linear anyway.
  absl::flat_hash_map<absl::string_view, const BufferLayout::Entry*> by_name;
  for (const BufferLayout::Entry& e : layout.entries) by_name.emplace(e.name, &e);
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != kind) continue;
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("cannot bind ", TensorKindName(kind), " '",
                                              t.name, "': the shared buffer has no such tensor"));
    }
    if (it->second->bytes != t.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot bind ", TensorKindName(kind), " '", t.name, "': the graph needs ", t.bytes(),
          " bytes, the shared buffer holds ", it->second->bytes));
    }
    SG_RETURN_IF_ERROR(bindings.Bind(graph.id(i), base + it->second->offset, t.bytes()));
  }
  return absl::OkStatus();
}

float RandomWeightScale(const Tensor& t) {
  if (absl::StrContains(t.name, "embed_tokens")) return 1.0f;
  if (t.shape.rank() >= 2) return 1.0f / std::sqrt(static_cast<float>(t.shape.cols()));
  if (IsNormWeight(t.name)) return 0.1f;
  return 0.02f;
}

float RandomWeightValue(uint64_t seed, absl::string_view name, int64_t index,
                        const Tensor& tensor) {
  return Draw(TensorKey(seed, name), index, DistributionOf(tensor));
}

absl::Status FillRandomWeights(const Graph& graph, const BufferLayout& layout, uint64_t seed,
                               absl::Span<std::byte> buffer, int threads) {
  if (static_cast<int64_t>(buffer.size()) < layout.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("random weights: the buffer holds ",
                                                   buffer.size(), " bytes, the layout needs ",
                                                   layout.total_bytes));
  }
  struct Work {
    const Tensor* tensor;
    uint64_t key;
    Distribution dist;
    std::byte* out;
    int64_t begin, end;
  };
  // Chunks small enough to balance threads, large enough that the counter is not contended;
  // a multiple of every block size, so that chunks of a quantized weight are whole blocks.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<Work> work;
  for (const BufferLayout::Entry& e : layout.entries) {
    if (e.tensor < 0 || e.tensor >= graph.num_tensors() ||
        graph.tensors()[e.tensor].name != e.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("random weights: the layout entry '", e.name, "' is not of this graph"));
    }
    const Tensor& t = graph.tensors()[e.tensor];
    if (!IsFloat(t.dtype) && !IsQuantized(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("random weights: weight '", t.name,
                                                     "' has dtype ", DTypeName(t.dtype),
                                                     "; only float or quantized weights can be drawn"));
    }
    const uint64_t key = TensorKey(seed, t.name);
    const int64_t n = t.shape.NumElements();
    for (int64_t b = 0; b < n; b += kChunk) {
      work.push_back({&t, key, DistributionOf(t), buffer.data() + e.offset, b,
                      std::min(n, b + kChunk)});
    }
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < work.size(); i = next.fetch_add(1)) {
      const Work& w = work[i];
      FillRange(*w.tensor, w.key, w.dist, w.begin, w.end, w.out);
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(threads, std::max<size_t>(work.size(), 1)));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) {
    // A thread that cannot be started only costs speed: the others take its share.
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
  return absl::OkStatus();
}

void AlignedHostBuffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

absl::StatusOr<AlignedHostBuffer> AlignedHostBuffer::Allocate(int64_t bytes,
                                                              absl::string_view what) {
  constexpr int64_t kAlign = 256;
  AlignedHostBuffer b;
  if (bytes <= 0) return b;
  const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, static_cast<size_t>(rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for ", what));
  }
  b.data_.reset(static_cast<std::byte*>(p));
  b.size_ = bytes;
  return b;
}

absl::StatusOr<RandomWeights> RandomWeights::Create(const Graph& graph, uint64_t seed,
                                                    int threads) {
  BufferLayout layout = LayoutBuffers(graph, TensorKind::kWeight);
  SG_ASSIGN_OR_RETURN(AlignedHostBuffer buffer,
                      AlignedHostBuffer::Allocate(layout.total_bytes, "random weights"));
  SG_RETURN_IF_ERROR(FillRandomWeights(graph, layout, seed, buffer.span(), threads));
  return RandomWeights(std::move(layout), std::move(buffer), seed);
}

}  // namespace sg
