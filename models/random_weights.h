// Deterministic random weights, for running a model shape without a checkpoint: every
// element is a function of (seed, tensor name, element index) alone, so a CPU session and a
// GPU session made from the same seed (on any machine, with any number of threads) see
// bit-identical weights. Also the block layout that puts a graph's bound tensors of one
// kind (weights, KV states) into one allocation.
#ifndef STEPGRAPH_MODELS_RANDOM_WEIGHTS_H_
#define STEPGRAPH_MODELS_RANDOM_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"

namespace sg {

// Every tensor of one kind of a graph placed in one block, each at an aligned offset, in
// the graph's tensor order.
struct BufferLayout {
  struct Entry {
    int32_t tensor = -1;  // index in the graph the layout was made from
    std::string name;
    int64_t offset = 0;
    int64_t bytes = 0;
  };
  std::vector<Entry> entries;
  int64_t total_bytes = 0;

  // nullptr when no entry has that name.
  const Entry* Find(absl::string_view name) const;
};
BufferLayout LayoutBuffers(const Graph& graph, TensorKind kind, int64_t alignment = 256);

// Binds every tensor of `kind` in `graph` to `base` + its offset in `layout` (made from a
// graph with the same tensors of that kind, e.g. another batch bucket of one model).
// NotFound naming the tensor when the layout lacks it, InvalidArgument when its size
// differs.
absl::Status BindLayout(const Graph& graph, TensorKind kind, const BufferLayout& layout,
                        std::byte* base, Bindings& bindings);

// The half-width of the uniform distribution a weight is drawn from, by its role: a matrix
// [out, in] gets 1/sqrt(in) (so activations keep their scale through a projection), a norm
// weight ("...norm.weight") 0.1 around 1, any other vector (a bias) 0.02.
float RandomWeightScale(const Tensor& tensor);

// Element `index` of weight `name` as f32, before rounding to the tensor's dtype.
float RandomWeightValue(uint64_t seed, absl::string_view name, int64_t index,
                        const Tensor& tensor);

// Fills `buffer` (laid out by `layout`, made from `graph`'s weights) with every weight's
// values in its storage dtype, using up to `threads` threads (0: one per core). A weight in
// a GGUF block format gets the drawn values quantized (QuantizeRow, stepgraph/base/quant.h).
// InvalidArgument when the buffer is too small or a weight is neither float nor quantized.
absl::Status FillRandomWeights(const Graph& graph, const BufferLayout& layout, uint64_t seed,
                               absl::Span<std::byte> buffer, int threads = 0);

// 256-byte-aligned host memory that reports failure instead of throwing.
class AlignedHostBuffer {
 public:
  // ResourceExhausted naming `what` when the allocation fails.
  static absl::StatusOr<AlignedHostBuffer> Allocate(int64_t bytes, absl::string_view what);

  AlignedHostBuffer() = default;
  std::byte* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  absl::Span<std::byte> span() const { return {data_.get(), static_cast<size_t>(size_)}; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], Free> data_;
  int64_t size_ = 0;
};

// Host-held random weights of a model, bindable to every graph with the same weights (all
// batch buckets of one config).
class RandomWeights {
 public:
  static absl::StatusOr<RandomWeights> Create(const Graph& graph, uint64_t seed,
                                              int threads = 0);

  absl::Status Bind(const Graph& graph, Bindings& bindings) const {
    return BindLayout(graph, TensorKind::kWeight, layout_, buffer_.data(), bindings);
  }
  const BufferLayout& layout() const { return layout_; }
  absl::Span<const std::byte> bytes() const { return buffer_.span(); }
  uint64_t seed() const { return seed_; }

 private:
  RandomWeights(BufferLayout layout, AlignedHostBuffer buffer, uint64_t seed)
      : layout_(std::move(layout)), buffer_(std::move(buffer)), seed_(seed) {}

  BufferLayout layout_;
  AlignedHostBuffer buffer_;
  uint64_t seed_;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_RANDOM_WEIGHTS_H_
