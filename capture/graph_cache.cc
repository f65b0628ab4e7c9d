// GraphCache: one captured step per batch bucket. Every bucket's plan is made and the
// dispatcher prepared for all of them before the first capture, so that no workspace the
// dispatcher owns moves under an already captured graph; all buckets share one arena and
// one stream, so their replays are ordered and never overlap in the arena.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/capture.h"
#include "stepgraph/status.h"

namespace sg {

GraphCache::~GraphCache() {
  steps_.clear();  // executables go before the arena and stream they use
  if (arena_ != nullptr) DeviceFree()(arena_);
  if (stream_ != nullptr) StreamDeleter()(stream_);
}

absl::StatusOr<std::unique_ptr<GraphCache>> GraphCache::Create(const GraphFactory& make_graph,
                                                               const Binder& bind,
                                                               CudaDispatch& dispatch,
                                                               const Options& options) {
  SG_RETURN_IF_ERROR(ValidateBuckets(options.buckets));
  std::unique_ptr<GraphCache> cache(new GraphCache());
  cache->options_ = options;
  cache->dispatch_ = &dispatch;
  for (const int64_t bucket : options.buckets) {
    absl::StatusOr<Graph> graph = make_graph(bucket);
    if (!graph.ok()) {
      return absl::Status(graph.status().code(), absl::StrCat("graph of bucket ", bucket, ": ",
                                                              graph.status().message()));
    }
    SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(*std::move(graph)));
    cache->plans_.push_back(std::make_unique<ExecutionPlan>(std::move(plan)));
    auto bindings = std::make_unique<Bindings>(cache->plans_.back()->graph());
    if (absl::Status s = bind(cache->plans_.back()->graph(), *bindings); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("binding bucket ", bucket, ": ", s.message()));
    }
    cache->bindings_.push_back(std::move(bindings));
    cache->arena_bytes_ = std::max(cache->arena_bytes_, cache->plans_.back()->arena_bytes());
  }
  cache->steps_.resize(options.buckets.size());
  if (cache->arena_bytes_ > 0) {
    SG_RETURN_IF_ERROR(ToStatus(cudaMalloc(&cache->arena_, cache->arena_bytes_),
                                absl::StrCat("cudaMalloc(shared arena, ", cache->arena_bytes_,
                                             " bytes)")));
  }
  for (auto& b : cache->bindings_) b->SetArena(cache->arena_, cache->arena_bytes_);
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&cache->stream_, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags(graph cache stream)"));
  dispatch.set_stream(cache->stream_);
  for (const auto& plan : cache->plans_) SG_RETURN_IF_ERROR(dispatch.Prepare(*plan));
  cache->options_.capture.stream = cache->stream_;
  if (options.capture_up_front) {
    for (const int64_t bucket : options.buckets) SG_RETURN_IF_ERROR(cache->Step(bucket).status());
  }
  return cache;
}

int64_t GraphCache::IndexOf(int64_t bucket) const {
  const auto& b = options_.buckets;
  const auto it = std::find(b.begin(), b.end(), bucket);
  return it == b.end() ? -1 : static_cast<int64_t>(it - b.begin());
}

absl::StatusOr<CapturedStep*> GraphCache::Step(int64_t bucket) {
  const int64_t i = IndexOf(bucket);
  if (i < 0) {
    return absl::InvalidArgumentError(absl::StrCat("no batch bucket of ", bucket, " rows"));
  }
  if (steps_[i] == nullptr) {
    absl::StatusOr<std::unique_ptr<CapturedStep>> step =
        CapturedStep::Create(*plans_[i], *bindings_[i], *dispatch_, options_.capture);
    if (!step.ok()) {
      return absl::Status(step.status().code(), absl::StrCat("bucket ", bucket, ": ",
                                                             step.status().message()));
    }
    steps_[i] = *std::move(step);
  }
  return steps_[i].get();
}

absl::Status GraphCache::Replay(int64_t live_rows) {
  SG_ASSIGN_OR_RETURN(const int64_t bucket, BucketFor(live_rows));
  SG_ASSIGN_OR_RETURN(CapturedStep * step, Step(bucket));
  return step->Replay();
}

const ExecutionPlan& GraphCache::plan(int64_t bucket) const { return *plans_[IndexOf(bucket)]; }

const Bindings& GraphCache::bindings(int64_t bucket) const {
  return *bindings_[IndexOf(bucket)];
}

std::vector<GraphCache::BucketMemory> GraphCache::Memory() const {
  std::vector<BucketMemory> out;
  for (size_t i = 0; i < plans_.size(); ++i) {
    BucketMemory m;
    m.bucket = options_.buckets[i];
    m.arena_bytes = plans_[i]->arena_bytes();
    m.captured = steps_[i] != nullptr && !steps_[i]->eager();
    m.graph_nodes = steps_[i] != nullptr ? steps_[i]->num_graph_nodes() : 0;
    out.push_back(m);
  }
  return out;
}

absl::StatusOr<int64_t> GraphCache::DeviceGraphMemory() {
  int device = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
  uint64_t used = 0;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used),
      "cudaDeviceGetGraphMemAttribute(UsedMemCurrent)"));
  return static_cast<int64_t>(used);
}

}  // namespace sg
