// CapturedStep: one execution of a plan recorded by stream capture, instantiated once and
// replayed with one cudaGraphLaunch per step. Every CUDA node the capture made is mapped
// back to the stepgraph node that launched it, so that a change of bindings can patch
// just the launches that moved, and so that the DOT dump speaks of our nodes.
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
namespace internal {

// A captured graph and, per stepgraph node, the CUDA nodes its Run added (in launch order).
struct CapturedGraph {
  UniqueGraph graph;
  std::vector<std::vector<cudaGraphNode_t>> nodes_of;
  int64_t num_nodes = 0;
};

}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The driver calls that patch a kernel node in place. Kernels launched through the driver
// (cuBLASLt's) are not visible to the runtime's kernel-node calls, the driver's see both.
// Fetched through the runtime so that stepgraph never links libcuda itself.
struct DriverGraphCalls {
  PFN_cuGraphKernelNodeGetParams_v12000 get_kernel_params = nullptr;
  PFN_cuGraphExecKernelNodeSetParams_v12000 set_exec_kernel_params = nullptr;
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
    get("cuGraphExecKernelNodeSetParams", 12000,
        reinterpret_cast<void**>(&c.set_exec_kernel_params));
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

// Copies the parameters of `from` (a node of a fresh single-node capture) onto `to`'s
// instance in `exec`. Both must be of the same type; a kernel must be the same function.
absl::Status PatchNode(cudaGraphExec_t exec, cudaGraphNode_t to, cudaGraphNode_t from,
                       absl::string_view where) {
  cudaGraphNodeType to_type, from_type;
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphNodeGetType(to, &to_type), "cudaGraphNodeGetType"));
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphNodeGetType(from, &from_type), "cudaGraphNodeGetType"));
  if (to_type != from_type) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the new capture has a ", NodeTypeName(from_type),
                     " node where the graph has a ", NodeTypeName(to_type), " node"));
  }
  switch (to_type) {
    case cudaGraphNodeTypeKernel: {
      const DriverGraphCalls& d = Driver();
      if (d.get_kernel_params == nullptr || d.set_exec_kernel_params == nullptr) {
        return absl::FailedPreconditionError("the driver lacks kernel-node patching");
      }
      CUDA_KERNEL_NODE_PARAMS params;
      std::memset(&params, 0, sizeof(params));
      if (CUresult r = d.get_kernel_params(reinterpret_cast<CUgraphNode>(from), &params);
          r != CUDA_SUCCESS) {
        return absl::InternalError(absl::StrCat(where, ": cuGraphKernelNodeGetParams failed (",
                                                static_cast<int>(r), ")"));
      }
      if (CUresult r = d.set_exec_kernel_params(reinterpret_cast<CUgraphExec>(exec),
                                                reinterpret_cast<CUgraphNode>(to), &params);
          r != CUDA_SUCCESS) {
        return absl::FailedPreconditionError(absl::StrCat(
            where, ": cuGraphExecKernelNodeSetParams failed (", static_cast<int>(r), ")"));
      }
      return absl::OkStatus();
    }
    case cudaGraphNodeTypeMemcpy: {
      cudaMemcpy3DParms p;
      std::memset(&p, 0, sizeof(p));
      SG_RETURN_IF_ERROR(ToStatus(cudaGraphMemcpyNodeGetParams(from, &p),
                                  absl::StrCat(where, ": cudaGraphMemcpyNodeGetParams")));
      return ToStatus(cudaGraphExecMemcpyNodeSetParams(exec, to, &p),
                      absl::StrCat(where, ": cudaGraphExecMemcpyNodeSetParams"));
    }
    case cudaGraphNodeTypeMemset: {
      cudaMemsetParams p;
      std::memset(&p, 0, sizeof(p));
      SG_RETURN_IF_ERROR(ToStatus(cudaGraphMemsetNodeGetParams(from, &p),
                                  absl::StrCat(where, ": cudaGraphMemsetNodeGetParams")));
      return ToStatus(cudaGraphExecMemsetNodeSetParams(exec, to, &p),
                      absl::StrCat(where, ": cudaGraphExecMemsetNodeSetParams"));
    }
    case cudaGraphNodeTypeEmpty:
      return absl::OkStatus();
    default:
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": cannot patch a ", NodeTypeName(to_type), " node"));
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
                           CudaDispatch& dispatch, const CaptureOptions& options)
    : prepared_(&prepared), bindings_(bindings), dispatch_(&dispatch), options_(options) {}

CapturedStep::~CapturedStep() {
  if (exec_ != nullptr) GraphExecDeleter()(exec_);
  graph_.reset();
}

absl::StatusOr<std::unique_ptr<CapturedStep>> CapturedStep::Create(
    const PreparedPlan& prepared, const Bindings& bindings, CudaDispatch& dispatch,
    const CaptureOptions& options) {
  if (&prepared.dispatch() != &dispatch) {
    return absl::InvalidArgumentError(
        "CapturedStep: the plan was prepared by another dispatcher than the one given");
  }
  SG_RETURN_IF_ERROR(CheckCaptureSafety(prepared.plan(), bindings, dispatch, IsDevicePointer));
  std::unique_ptr<CapturedStep> step(new CapturedStep(prepared, bindings, dispatch, options));
  SG_ASSIGN_OR_RETURN(internal::CapturedGraph captured, step->CaptureOnce(step->bindings_));
  step->graph_ = std::make_unique<internal::CapturedGraph>(std::move(captured));
  SG_RETURN_IF_ERROR(step->Instantiate());
  return step;
}

absl::StatusOr<internal::CapturedGraph> CapturedStep::CaptureOnce(const Bindings& bindings) {
  const auto t0 = Clock::now();
  const cudaStream_t capture_stream = stream();
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture"));
  internal::CapturedGraph out;
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
  absl::StatusOr<ExecStats> run = Execute(*prepared_, bindings, *dispatch_, exec_options);
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
  if (exec_ != nullptr) GraphExecDeleter()(exec_);
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

absl::Status CapturedStep::PatchNodes(const Bindings& next, const std::vector<int32_t>& nodes) {
  const cudaStream_t capture_stream = stream();
  for (const int32_t k : nodes) {
    const Node& node = plan().graph().nodes()[k];
    const std::string where = absl::StrCat("patching node ", k, " '", node.name, "'");
    // Capture this node alone with the new bindings: its launch parameters are exactly
    // what the whole capture would have recorded for it.
    SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture"));
    const int32_t only[] = {k};
    ExecOptions exec_options;
    exec_options.only_nodes = only;
    absl::StatusOr<ExecStats> run = Execute(*prepared_, next, *dispatch_, exec_options);
    cudaGraph_t raw = nullptr;
    const cudaError_t end = cudaStreamEndCapture(capture_stream, &raw);
    UniqueGraph single(raw);
    if (!run.ok()) return run.status();
    SG_RETURN_IF_ERROR(ToStatus(end, "cudaStreamEndCapture"));
    absl::flat_hash_set<cudaGraphNode_t> seen;
    std::vector<cudaGraphNode_t> scratch;
    SG_ASSIGN_OR_RETURN(std::vector<cudaGraphNode_t> fresh,
                        NewNodes(single.get(), seen, scratch));
    const std::vector<cudaGraphNode_t>& old = graph_->nodes_of[k];
    if (fresh.size() != old.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": it now makes ", fresh.size(), " CUDA nodes, the graph has ", old.size()));
    }
    for (size_t i = 0; i < old.size(); ++i) {
      SG_RETURN_IF_ERROR(PatchNode(exec_, old[i], fresh[i], where));
    }
    stats_.patched_nodes += static_cast<int64_t>(old.size());
  }
  return absl::OkStatus();
}

absl::Status CapturedStep::Update(const Bindings& next) {
  if (next.graph_owner() != bindings_.graph_owner()) {
    return absl::InvalidArgumentError("Update: the bindings were made for another graph");
  }
  SG_RETURN_IF_ERROR(CheckCaptureSafety(plan(), next, *dispatch_, IsDevicePointer));
  const UpdateDecision decision =
      DecideUpdate(plan(), bindings_, next, options_.max_patch_fraction);
  if (decision.kind == UpdateDecision::Kind::kNothing) {
    bindings_ = next;
    return absl::OkStatus();
  }
  const auto t0 = Clock::now();
  ++stats_.updates;
  if (decision.kind == UpdateDecision::Kind::kPatchNodes) {
    if (PatchNodes(next, decision.nodes).ok()) {
      ++stats_.node_patches;
      bindings_ = next;
      stats_.update_us += MicrosSince(t0);
      return absl::OkStatus();
    }
    cudaGetLastError();
    // A partly patched executable is made whole by the update below.
  }
  SG_ASSIGN_OR_RETURN(internal::CapturedGraph fresh, CaptureOnce(next));
  cudaGraphExecUpdateResultInfo info;
  std::memset(&info, 0, sizeof(info));
  if (cudaGraphExecUpdate(exec_, fresh.graph.get(), &info) == cudaSuccess) {
    // The executable keeps naming its nodes by the graph it was instantiated from, so the
    // node map of that graph stays the one to patch through.
    ++stats_.exec_updates;
  } else {
    cudaGetLastError();
    graph_ = std::make_unique<internal::CapturedGraph>(std::move(fresh));
    SG_RETURN_IF_ERROR(Instantiate());
    ++stats_.reinstantiations;
  }
  bindings_ = next;
  stats_.update_us += MicrosSince(t0);
  return absl::OkStatus();
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
