// CapturedStep: one execution of a plan recorded by stream capture, instantiated once and
// replayed with one cudaGraphLaunch per step. Every CUDA node the capture made is mapped
// back to the stepgraph node that launched it, so that the DOT dump speaks of our nodes.
#include <cuda.h>  // driver types only; driver entry points are fetched at run time
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/capture/cuda_graph.h"
#include "stepgraph/base/status.h"

namespace sg {

// A captured graph and, per stepgraph node, the CUDA nodes its Run added (in launch order).
struct CapturedStep::Recording {
  UniqueGraph graph;
  std::vector<std::vector<cudaGraphNode_t>> nodes_of;
  int64_t num_nodes = 0;
};

namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The driver calls that name a captured kernel node's function. Kernels launched through
// the driver (cuBLASLt's) are not visible to the runtime's kernel-node calls, the driver's
// see both. Fetched through the runtime so that stepgraph never links libcuda itself.
struct DriverGraphCalls {
  PFN_cuGraphKernelNodeGetParams_v12000 get_kernel_params = nullptr;
  PFN_cuFuncGetName_v12030 func_name = nullptr;
  PFN_cuKernelGetName_v12030 kernel_name = nullptr;
};

const DriverGraphCalls& Driver() {
  static const DriverGraphCalls calls = [] {
    DriverGraphCalls c;
    auto get = [](const char* symbol, unsigned version, void** fn) {
      cudaDriverEntryPointQueryResult found;
      if (cudaGetDriverEntryPointByVersion(symbol, fn, version, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        *fn = nullptr;
      }
    };
    get("cuGraphKernelNodeGetParams", 12000, reinterpret_cast<void**>(&c.get_kernel_params));
    get("cuFuncGetName", 12030, reinterpret_cast<void**>(&c.func_name));
    get("cuKernelGetName", 12030, reinterpret_cast<void**>(&c.kernel_name));
    return c;
  }();
  return calls;
}

// The CUDA nodes of `graph` not in `seen`, ordered so that each follows its dependencies
// (a node's launches form a chain on one stream, so this is launch order). Adds them to
// `seen`.
absl::StatusOr<std::vector<cudaGraphNode_t>> NewNodes(
    cudaGraph_t graph, absl::flat_hash_set<cudaGraphNode_t>& seen,
    std::vector<cudaGraphNode_t>& scratch) {
  size_t n = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes"));
  scratch.resize(n);
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphGetNodes(graph, scratch.data(), &n), "cudaGraphGetNodes"));
  std::vector<cudaGraphNode_t> fresh;
  for (size_t i = 0; i < n; ++i) {
    if (!seen.contains(scratch[i])) fresh.push_back(scratch[i]);
  }
  if (fresh.size() <= 1) {
    seen.insert(fresh.begin(), fresh.end());
    return fresh;
  }
  absl::flat_hash_set<cudaGraphNode_t> pending(fresh.begin(), fresh.end());
  std::vector<cudaGraphNode_t> ordered;
  std::vector<cudaGraphNode_t> deps;
  std::vector<cudaGraphEdgeData> edge_data;
  while (!pending.empty()) {
    bool progressed = false;
    for (cudaGraphNode_t node : fresh) {
      if (!pending.contains(node)) continue;
      size_t nd = 0;
      SG_RETURN_IF_ERROR(ToStatus(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &nd),
                                  "cudaGraphNodeGetDependencies"));
      deps.resize(nd);
      edge_data.resize(nd);  // required where an edge is programmatic (else a lossy query)
      SG_RETURN_IF_ERROR(
          ToStatus(cudaGraphNodeGetDependencies(node, deps.data(), edge_data.data(), &nd),
                   "cudaGraphNodeGetDependencies"));
      bool ready = true;
      for (cudaGraphNode_t d : deps) ready = ready && !pending.contains(d);
      if (ready) {
        ordered.push_back(node);
        pending.erase(node);
        progressed = true;
      }
    }
    if (!progressed) return absl::InternalError("captured nodes form a cycle");
  }
  seen.insert(ordered.begin(), ordered.end());
  return ordered;
}

std::string KernelName(cudaGraphNode_t node) {
  const DriverGraphCalls& d = Driver();
  CUDA_KERNEL_NODE_PARAMS params;
  std::memset(&params, 0, sizeof(params));
  if (d.get_kernel_params == nullptr ||
      d.get_kernel_params(reinterpret_cast<CUgraphNode>(node), &params) != CUDA_SUCCESS) {
    return "kernel";
  }
  const char* name = nullptr;
  if (params.func != nullptr && d.func_name != nullptr) {
    d.func_name(&name, params.func);
  } else if (params.kern != nullptr && d.kernel_name != nullptr) {
    d.kernel_name(&name, params.kern);
  }
  return name != nullptr ? std::string(name) : std::string("kernel");
}

std::string NodeTypeName(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeEmpty: return "empty";
    default: return "other";
  }
}

std::string DotEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}});
}

}  // namespace

bool IsDevicePointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown host pointer is not an error worth keeping
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

CapturedStep::CapturedStep(const PreparedPlan& prepared, const Bindings& bindings,
                           CudaDispatch& dispatch)
    : prepared_(&prepared), bindings_(bindings), dispatch_(&dispatch) {}

CapturedStep::~CapturedStep() {
  if (exec_ != nullptr) GraphExecDeleter()(exec_);
  graph_.reset();
}

absl::StatusOr<std::unique_ptr<CapturedStep>> CapturedStep::Create(
    const PreparedPlan& prepared, const Bindings& bindings, CudaDispatch& dispatch) {
  if (&prepared.dispatch() != &dispatch) {
    return absl::InvalidArgumentError(
        "CapturedStep: the plan was prepared by another dispatcher than the one given");
  }
  SG_RETURN_IF_ERROR(CheckCaptureSafety(prepared.plan(), bindings, dispatch, IsDevicePointer));
  std::unique_ptr<CapturedStep> step(new CapturedStep(prepared, bindings, dispatch));
  SG_ASSIGN_OR_RETURN(Recording captured, step->CaptureOnce());
  step->graph_ = std::make_unique<Recording>(std::move(captured));
  SG_RETURN_IF_ERROR(step->Instantiate());
  return step;
}

absl::StatusOr<CapturedStep::Recording> CapturedStep::CaptureOnce() {
  const auto t0 = Clock::now();
  const cudaStream_t capture_stream = stream();
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture"));
  Recording out;
  out.nodes_of.resize(plan().graph().num_nodes());
  absl::flat_hash_set<cudaGraphNode_t> seen;
  std::vector<cudaGraphNode_t> scratch;
  cudaGraph_t capturing = nullptr;
  ExecOptions exec_options;
  exec_options.after_node = [&](int32_t node) -> absl::Status {
    if (capturing == nullptr) {
      cudaStreamCaptureStatus status;
      SG_RETURN_IF_ERROR(ToStatus(cudaStreamGetCaptureInfo(capture_stream, &status, nullptr, &capturing),
                                  "cudaStreamGetCaptureInfo"));
      if (status != cudaStreamCaptureStatusActive) {
        return absl::InternalError("stream capture was invalidated");
      }
    }
    SG_ASSIGN_OR_RETURN(out.nodes_of[node], NewNodes(capturing, seen, scratch));
    return absl::OkStatus();
  };
  absl::StatusOr<ExecStats> run = Execute(*prepared_, bindings_, *dispatch_, exec_options);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(capture_stream, &graph);
  out.graph.reset(graph);
  if (!run.ok()) {
    cudaGetLastError();
    return absl::Status(run.status().code(),
                        absl::StrCat("capture of the step failed: ", run.status().message()));
  }
  SG_RETURN_IF_ERROR(ToStatus(end, "cudaStreamEndCapture"));
  out.num_nodes = static_cast<int64_t>(seen.size());
  ++stats_.captures;
  stats_.capture_us += MicrosSince(t0);
  return out;
}

absl::Status CapturedStep::Instantiate() {
  const auto t0 = Clock::now();
  cudaGraphExec_t exec = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphInstantiateWithFlags(&exec, graph_->graph.get(), 0),
                              "cudaGraphInstantiateWithFlags"));
  exec_ = exec;
  // Uploading now keeps the first replay from paying for it.
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphUpload(exec_, stream()), "cudaGraphUpload"));
  ++stats_.instantiations;
  stats_.instantiate_us += MicrosSince(t0);
  return absl::OkStatus();
}

absl::Status CapturedStep::Replay() {
  ++stats_.replays;
  return ToStatus(cudaGraphLaunch(exec_, stream()), "cudaGraphLaunch");
}

absl::StatusOr<int64_t> CapturedStep::DeviceGraphMemory() {
  int device = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
  uint64_t used = 0;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used),
      "cudaDeviceGetGraphMemAttribute(UsedMemCurrent)"));
  return static_cast<int64_t>(used);
}

int64_t CapturedStep::num_graph_nodes() const {
  return graph_ != nullptr ? graph_->num_nodes : 0;
}

absl::StatusOr<std::string> CapturedStep::ToDot() const {
  const Graph& g = plan().graph();
  absl::flat_hash_map<cudaGraphNode_t, std::string> id_of;
  std::string dot = "digraph captured_step {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  for (int32_t k = 0; k < g.num_nodes(); ++k) {
    const Node& node = g.nodes()[k];
    std::string shapes;
    for (const TensorId in : node.inputs) {
      absl::StrAppend(&shapes, shapes.empty() ? "" : ", ", g.tensor(in).shape.ToString());
    }
    absl::StrAppend(&dot, "  subgraph cluster_", k, " {\n    label=\"",
                    DotEscape(absl::StrCat(k, " ", OpName(node.op), " ", node.name, "\\n(",
                                           shapes, ") -> ",
                                           g.tensor(node.output).shape.ToString(), " ",
                                           DTypeName(g.tensor(node.output).dtype))),
                    "\";\n");
    for (size_t i = 0; i < graph_->nodes_of[k].size(); ++i) {
      cudaGraphNode_t cn = graph_->nodes_of[k][i];
      const std::string id = absl::StrCat("n", k, "_", i);
      id_of[cn] = id;
      cudaGraphNodeType type;
      std::string label = "?";
      if (cudaGraphNodeGetType(cn, &type) == cudaSuccess) {
        label = type == cudaGraphNodeTypeKernel ? KernelName(cn) : NodeTypeName(type);
      }
      absl::StrAppend(&dot, "    ", id, " [label=\"", DotEscape(label), "\"];\n");
    }
    absl::StrAppend(&dot, "  }\n");
  }
  size_t num_edges = 0;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaGraphGetEdges(graph_->graph.get(), nullptr, nullptr, nullptr, &num_edges),
      "cudaGraphGetEdges"));
  // Edge data is required: without it a graph with programmatic edges (kernels launched
  // with programmatic dependent launch) refuses the query as lossy.
  std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
  std::vector<cudaGraphEdgeData> data(num_edges);
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphGetEdges(graph_->graph.get(), from.data(), to.data(),
                                                data.data(), &num_edges),
                              "cudaGraphGetEdges"));
  for (size_t e = 0; e < num_edges; ++e) {
    auto a = id_of.find(from[e]);
    auto b = id_of.find(to[e]);
    if (a != id_of.end() && b != id_of.end()) {
      // Programmatic edges (the next kernel may launch early) are drawn dashed.
      const bool programmatic = data[e].type == cudaGraphDependencyTypeProgrammatic;
      absl::StrAppend(&dot, "  ", a->second, " -> ", b->second,
                      programmatic ? " [style=dashed]" : "", ";\n");
    }
  }
  absl::StrAppend(&dot, "}\n");
  return dot;
}

}  // namespace sg
