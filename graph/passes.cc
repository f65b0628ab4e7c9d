// The graph passes (stepgraph/graph/passes.h). Each pass edits a mutable copy of the graph:
// fused nodes replace groups of nodes, taking the place of the group's last node (every
// input of the group exists by then, every reader of the group's result comes after it,
// and a group is not fused where a node between writes what it reads, as WrittenInputs
// says), intermediates no longer produced are dropped, ids are renumbered under a new
// owner tag and the result is validated. A node is made only where the backend the graph
// is prepared for runs it (PassOptions::backend); no backend's limits are written here.
#include "stepgraph/graph/passes.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

using Epilogue = ops::FusedMatMul::Epilogue;

class Editor {
 public:
  Editor(Graph g, const PassOptions& options)
      : tensors_(g.tensors()),
        nodes_(g.nodes()),
        outputs_(g.outputs()),
        backend_(options.backend) {
    for (const Tensor& t : tensors_) names_.insert(t.name);
    for (const Node& n : nodes_) names_.insert(n.name);
    // Outputs the caller never reads are dropped first, so that passes may fuse them away.
    std::vector<GraphOutput> kept;
    for (GraphOutput& o : outputs_) {
      if (!options.unread_outputs.contains(o.name)) kept.push_back(std::move(o));
    }
    outputs_ = std::move(kept);
    Reindex();
  }

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Tensor& tensor(TensorId id) const { return tensors_[id.index]; }
  bool removed(int32_t node) const { return removed_[node]; }

  // The live node producing (or writing in place) `id`, or -1 for bound tensors.
  int32_t Producer(TensorId id) const { return producer_[id.index]; }
  // Live nodes reading `id`.
  const std::vector<int32_t>& Readers(TensorId id) const { return readers_[id.index]; }
  bool IsOutput(TensorId id) const {
    return std::any_of(outputs_.begin(), outputs_.end(),
                       [&](const GraphOutput& o) { return o.tensor.index == id.index; });
  }
  // An intermediate read by exactly `reader` and by nothing else, and not a graph output.
  bool OnlyReadBy(TensorId id, int32_t reader) const {
    const std::vector<int32_t>& r = Readers(id);
    return tensor(id).kind == TensorKind::kIntermediate && !IsOutput(id) && r.size() == 1 &&
           r[0] == reader;
  }

  // Whether a live node after `from` and before `to`, other than those `moving`, writes
  // one of `reads` (in place or as a side effect, as WrittenInputs says): then what reads
  // them cannot move from node `from` to node `to`.
  bool WrittenBetween(int32_t from, int32_t to, absl::Span<const TensorId> reads,
                      absl::Span<const int32_t> moving = {}) const {
    for (const TensorId t : reads) {
      const std::vector<int32_t>& w = writers_[t.index];
      for (auto it = std::upper_bound(w.begin(), w.end(), from); it != w.end() && *it < to;
           ++it) {
        if (std::find(moving.begin(), moving.end(), *it) == moving.end()) return true;
      }
    }
    return false;
  }
  // Whether the backend runs `op` over `inputs`; without a backend, the CPU reference's
  // answer: every op.
  bool BackendRuns(const Op& op, absl::Span<const Tensor* const> inputs) const {
    return backend_ == nullptr || backend_->Supports(op, inputs);
  }
  bool BackendRuns(const Op& op, absl::Span<const TensorId> inputs) const {
    absl::InlinedVector<const Tensor*, kMaxNodeInputs> t;
    for (TensorId id : inputs) t.push_back(&tensor(id));
    return BackendRuns(op, absl::Span<const Tensor* const>(t));
  }

  std::string UniqueName(const std::string& base) {
    std::string name = base;
    for (int i = 1; names_.contains(name); ++i) name = absl::StrCat(base, "_", i);
    names_.insert(name);
    return name;
  }

  // Replaces node `at` by `op` over `inputs`, writing `output` (the tensor `at` wrote, or
  // a new intermediate when `output` is empty) and removes the nodes in `gone`.
  // The node keeps its output tensor, so its readers need no rewiring; with `rename` the
  // node and that tensor take a new name.
  void Replace(int32_t at, Op op, absl::InlinedVector<TensorId, 4> inputs,
               std::optional<std::string> rename, absl::Span<const int32_t> gone) {
    Node& node = nodes_[at];
    node.op = std::move(op);
    node.inputs = std::move(inputs);
    if (rename.has_value()) {
      node.name = UniqueName(*rename);
      tensors_[node.output.index].name = node.name;
    }
    for (int32_t g : gone) removed_[g] = true;
    Reindex();
  }

  void Remove(int32_t n) {
    removed_[n] = true;
    Reindex();
  }

  // Inserts a node before node `before`, returning its output (a new intermediate).
  TensorId InsertBefore(int32_t before, Op op, absl::InlinedVector<TensorId, 4> inputs,
                        const std::string& name, TensorType type) {
    const std::string unique = UniqueName(name);
    tensors_.push_back(Tensor{unique, TensorKind::kIntermediate, type.dtype, type.shape});
    const TensorId out{static_cast<int32_t>(tensors_.size() - 1), nodes_[before].output.owner};
    nodes_.insert(nodes_.begin() + before, Node{unique, std::move(op), std::move(inputs), out});
    removed_.insert(removed_.begin() + before, false);
    Reindex();
    return out;
  }

  void SetInput(int32_t node, int i, TensorId id) {
    nodes_[node].inputs[i] = id;
    Reindex();
  }

  // The edited graph, renumbered under a new owner and validated.
  absl::StatusOr<Graph> Finish() && {
    std::vector<bool> keep(tensors_.size(), false);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      keep[i] = tensors_[i].kind != TensorKind::kIntermediate;
    }
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (removed_[n]) continue;
      keep[nodes_[n].output.index] = true;
      for (TensorId in : nodes_[n].inputs) keep[in.index] = true;
    }
    const uint32_t owner = NewGraphOwnerTag();
    std::vector<int32_t> new_index(tensors_.size(), -1);
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!keep[i]) continue;
      new_index[i] = static_cast<int32_t>(tensors.size());
      tensors.push_back(std::move(tensors_[i]));
    }
    auto remap = [&](TensorId id) { return TensorId{new_index[id.index], owner}; };
    std::vector<Node> nodes;
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (removed_[n]) continue;
      Node node = std::move(nodes_[n]);
      for (TensorId& in : node.inputs) in = remap(in);
      node.output = remap(node.output);
      nodes.push_back(std::move(node));
    }
    std::vector<GraphOutput> outputs;
    for (GraphOutput& o : outputs_) {
      if (new_index[o.tensor.index] < 0) {
        return absl::InternalError(absl::StrCat("graph pass dropped output '", o.name, "'"));
      }
      outputs.push_back(GraphOutput{std::move(o.name), remap(o.tensor)});
    }
    Graph g(owner, std::move(tensors), std::move(nodes), std::move(outputs));
    SG_RETURN_IF_ERROR(g.Validate());
    return g;
  }

 private:
  void Reindex() {
    removed_.resize(nodes_.size(), false);
    producer_.assign(tensors_.size(), -1);
    readers_.assign(tensors_.size(), {});
    writers_.assign(tensors_.size(), {});
    for (int32_t n = 0; n < static_cast<int32_t>(nodes_.size()); ++n) {
      if (removed_[n]) continue;
      const Node& node = nodes_[n];
      producer_[node.output.index] = n;
      for (TensorId in : node.inputs) {
        std::vector<int32_t>& r = readers_[in.index];
        if (r.empty() || r.back() != n) r.push_back(n);
      }
      for (int32_t i : WrittenInputs(node.op).inputs) {
        if (i >= static_cast<int32_t>(node.inputs.size())) continue;
        std::vector<int32_t>& w = writers_[node.inputs[i].index];
        if (w.empty() || w.back() != n) w.push_back(n);
      }
    }
  }

  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<GraphOutput> outputs_;
  std::vector<bool> removed_;
  std::vector<int32_t> producer_;
  std::vector<std::vector<int32_t>> readers_;
  std::vector<std::vector<int32_t>> writers_;  // live nodes writing each tensor, ascending
  absl::flat_hash_set<std::string> names_;
  const OpSupport* backend_;
};

// The prefix of a node name up to and including its last '.', e.g. "model.layers.0.mlp.".
std::string Scope(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot + 1);
}

// A plain MatMul that a FusedMatMul can stand for: no bias (the fused op takes none).
// Whether the backend runs the fused node (float weights of x's dtype, block formats mixed
// freely within a group) is asked where it is made.
bool FusableMatMul(const Editor& e, int32_t n) {
  if (n < 0 || e.removed(n)) return false;
  const auto* mm = std::get_if<ops::MatMul>(&e.nodes()[n].op);
  return mm != nullptr && !mm->has_bias;
}

// A MatMul as above or a FusedMatMul without epilogue: something an epilogue can join.
// Gives its op and its inputs (x, [norm_w], weights...).
std::optional<std::pair<ops::FusedMatMul, absl::InlinedVector<TensorId, 4>>> AsFusedMatMul(
    const Editor& e, int32_t n) {
  if (n < 0 || e.removed(n)) return std::nullopt;
  const Node& node = e.nodes()[n];
  if (FusableMatMul(e, n)) return std::make_pair(ops::FusedMatMul{}, node.inputs);
  if (const auto* f = std::get_if<ops::FusedMatMul>(&node.op)) {
    if (f->epilogue == Epilogue::kNone) return std::make_pair(*f, node.inputs);
  }
  return std::nullopt;
}

bool SameRope(const ops::Rope& a, const ops::Rope& b) {
  return a.head_dim == b.head_dim && a.theta == b.theta && a.interleaved == b.interleaved &&
         a.scaling.type == b.scaling.type && a.scaling.factor == b.scaling.factor &&
         a.scaling.low_freq_factor == b.scaling.low_freq_factor &&
         a.scaling.high_freq_factor == b.scaling.high_freq_factor &&
         a.scaling.original_max_position == b.scaling.original_max_position;
}

template <typename T>
const T* OpOf(const Editor& e, int32_t n) {
  if (n < 0 || e.removed(n)) return nullptr;
  return std::get_if<T>(&e.nodes()[n].op);
}

// Attention(Rope(q), KvWrite(Rope(k)), KvWrite(v)) with q, k, v MatMuls of one x, or
// with q and k each through a HeadRmsNorm of head_dim before its Rope (Qwen3's q and k
// norms, then RopeKvWrite's head_norm).
absl::StatusOr<Graph> FuseQkvRopeKvWrite(Editor e) {
  for (int32_t a = 0; a < static_cast<int32_t>(e.nodes().size()); ++a) {
    // Steps whose rows map to slots through seq_slots (prefill) are left as they are:
    // RopeKvWrite writes row i to cache slot i.
    const auto* attention_op = OpOf<ops::Attention>(e, a);
    if (attention_op == nullptr || attention_op->has_slots) continue;
    const Node attention = e.nodes()[a];
    const int32_t rq = e.Producer(attention.inputs[0]);
    const int32_t kw = e.Producer(attention.inputs[1]);
    const int32_t vw = e.Producer(attention.inputs[2]);
    const auto* rope_q = OpOf<ops::Rope>(e, rq);
    const auto* k_write = OpOf<ops::KvWrite>(e, kw);
    const auto* v_write = OpOf<ops::KvWrite>(e, vw);
    if (rope_q == nullptr || k_write == nullptr || v_write == nullptr || kw == vw ||
        k_write->has_slots || v_write->has_slots) {
      continue;
    }
    const int32_t rk = e.Producer(e.nodes()[kw].inputs[0]);
    const auto* rope_k = OpOf<ops::Rope>(e, rk);
    if (rope_k == nullptr || !SameRope(*rope_q, *rope_k)) continue;
    // q's and k's head norms: both or neither, one eps, each weight one head long.
    int32_t nq = e.Producer(e.nodes()[rq].inputs[0]);
    int32_t nk = e.Producer(e.nodes()[rk].inputs[0]);
    const auto* norm_q = OpOf<ops::HeadRmsNorm>(e, nq);
    const auto* norm_k = OpOf<ops::HeadRmsNorm>(e, nk);
    const bool head_norm = norm_q != nullptr;
    if ((norm_k != nullptr) != head_norm) continue;
    float eps = 0.0f;
    if (head_norm) {
      eps = norm_q->eps;
      if (norm_k->eps != eps ||
          e.tensor(e.nodes()[nq].inputs[1]).shape[0] != rope_q->head_dim ||
          e.tensor(e.nodes()[nk].inputs[1]).shape[0] != rope_q->head_dim ||
          !e.OnlyReadBy(e.nodes()[nq].output, rq) || !e.OnlyReadBy(e.nodes()[nk].output, rk)) {
        continue;
      }
    }
    const int32_t mq = head_norm ? e.Producer(e.nodes()[nq].inputs[0]) : nq;
    const int32_t mk = head_norm ? e.Producer(e.nodes()[nk].inputs[0]) : nk;
    const int32_t mv = e.Producer(e.nodes()[vw].inputs[0]);
    if (!FusableMatMul(e, mq) || !FusableMatMul(e, mk) || !FusableMatMul(e, mv)) continue;
    const Node& q = e.nodes()[mq];
    const TensorId x = q.inputs[0];
    const TensorId pos = e.nodes()[rq].inputs[1];
    if (e.nodes()[mk].inputs[0] != x || e.nodes()[mv].inputs[0] != x ||
        e.nodes()[rk].inputs[1] != pos || e.nodes()[kw].inputs[1] != pos ||
        e.nodes()[vw].inputs[1] != pos || attention.inputs[3] != pos) {
      continue;
    }
    if (!e.OnlyReadBy(q.output, head_norm ? nq : rq) || !e.OnlyReadBy(e.nodes()[rq].output, a) ||
        !e.OnlyReadBy(e.nodes()[mk].output, head_norm ? nk : rk) ||
        !e.OnlyReadBy(e.nodes()[rk].output, kw) ||
        !e.OnlyReadBy(e.nodes()[mv].output, vw)) {
      continue;
    }
    // The caches are read by nothing but their writer and this attention.
    const TensorId kc = attention.inputs[1], vc = attention.inputs[2];
    auto only_writer_and_attention = [&](TensorId c, int32_t writer) {
      for (int32_t r : e.Readers(c)) {
        if (r != writer && r != a) return false;
      }
      return true;
    };
    if (!only_writer_and_attention(kc, kw) || !only_writer_and_attention(vc, vw)) continue;
    // `q` refers into the node list: read everything from it before inserting.
    const TensorId wq = q.inputs[1], wk = e.nodes()[mk].inputs[1], wv = e.nodes()[mv].inputs[1];
    const TensorId nwq = head_norm ? e.nodes()[nq].inputs[1] : TensorId{};
    const TensorId nwk = head_norm ? e.nodes()[nk].inputs[1] : TensorId{};
    // The seven (nine) nodes move to the attention: nothing else between may write what
    // they read or write.
    absl::InlinedVector<int32_t, 9> group = {mq, mk, mv, rq, rk, kw, vw};
    absl::InlinedVector<TensorId, 9> touched = {x, wq, wk, wv, pos, kc, vc};
    if (head_norm) {
      group.insert(group.end(), {nq, nk});
      touched.insert(touched.end(), {nwq, nwk});
    }
    if (e.WrittenBetween(*std::min_element(group.begin(), group.end()), a, touched, group)) {
      continue;
    }

    // Copies: the insertions below grow the tensor and node lists.
    const DType dtype = e.tensor(x).dtype;
    const int64_t rows = e.tensor(x).shape[0];
    const int64_t q_cols = e.tensor(q.output).shape[1];
    const int64_t kv_cols = e.tensor(e.nodes()[mk].output).shape[1];
    if (e.tensor(e.nodes()[mv].output).shape[1] != kv_cols) continue;
    const ops::Rope rope = *rope_q;
    const std::string scope = Scope(q.name);
    const ops::FusedMatMul product{.weights = 3};
    const ops::RopeKvWrite rope_kv{.rope = rope, .head_norm = head_norm, .eps = eps};
    const Tensor qkv_type{"", TensorKind::kIntermediate, dtype, Shape{rows, q_cols + 2 * kv_cols}};
    absl::InlinedVector<const Tensor*, 6> rope_inputs = {&qkv_type, &e.tensor(pos),
                                                         &e.tensor(kc), &e.tensor(vc)};
    absl::InlinedVector<TensorId, 4> rope_ids = {pos, kc, vc};
    if (head_norm) {
      rope_inputs.insert(rope_inputs.end(), {&e.tensor(nwq), &e.tensor(nwk)});
      rope_ids.insert(rope_ids.end(), {nwq, nwk});
    }
    if (!e.BackendRuns(product, {x, wq, wk, wv}) || !e.BackendRuns(rope_kv, rope_inputs)) {
      continue;
    }
    // Both new nodes go right before the attention; every input they read exists by then.
    const TensorId qkv = e.InsertBefore(a, product, {x, wq, wk, wv}, scope + "qkv_proj",
                                        TensorType{dtype, qkv_type.shape});
    rope_ids.insert(rope_ids.begin(), qkv);
    const int32_t a2 = a + 1;
    const TensorId q_rot = e.InsertBefore(a2, rope_kv, rope_ids, scope + "rope_kv_write",
                                          TensorType{dtype, Shape{rows, q_cols}});
    const int32_t a3 = a2 + 1;
    // Indices before `a` are unchanged by the insertions.
    e.SetInput(a3, 0, q_rot);
    // Remove the plain nodes (the attention now reads q_rot and the States).
    for (int32_t gone : group) e.Remove(gone);
    a = a3;
  }
  return std::move(e).Finish();
}

// RopeKvWrite(FusedMatMul(x, w_q, w_k, w_v)) -> one FusedMatMul with the kRopeKvWrite
// epilogue, when the grouped product is read by nothing else. A separate pass from
// qkv_rope_kv_write so that the RopeKvWrite node can be kept (to measure the epilogue, or
// to debug it).
absl::StatusOr<Graph> FuseRopeKvWriteEpilogue(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    const auto* rope_kv = OpOf<ops::RopeKvWrite>(e, s);
    if (rope_kv == nullptr) continue;
    const Node node = e.nodes()[s];
    const int32_t m = e.Producer(node.inputs[0]);
    const auto* fused = OpOf<ops::FusedMatMul>(e, m);
    // The epilogue has no head norms: a RopeKvWrite with them stays a node of its own.
    if (rope_kv->head_norm || fused == nullptr || fused->epilogue != Epilogue::kNone ||
        fused->weights != 3 || !e.OnlyReadBy(node.inputs[0], s)) {
      continue;
    }
    const Node product = e.nodes()[m];
    const int first_w = fused->norm ? 2 : 1;
    const Tensor& k_cache = e.tensor(node.inputs[2]);
    const int64_t d = rope_kv->rope.head_dim;
    const int64_t kv_cols = k_cache.shape[1] * k_cache.shape[3];
    bool fits = e.tensor(product.inputs[first_w]).shape[0] % d == 0;
    for (int g = 1; g < 3; ++g) {
      fits = fits && e.tensor(product.inputs[first_w + g]).shape[0] == kv_cols;
    }
    // The product moves from node m to node s: nothing between may write what it reads.
    if (!fits || e.WrittenBetween(m, s, product.inputs)) continue;
    ops::FusedMatMul op = *fused;
    op.epilogue = Epilogue::kRopeKvWrite;
    op.rope = rope_kv->rope;
    absl::InlinedVector<TensorId, 4> inputs = product.inputs;
    inputs.insert(inputs.end(), node.inputs.begin() + 1, node.inputs.end());  // pos, caches
    if (!e.BackendRuns(op, inputs)) continue;
    e.Replace(s, op, std::move(inputs), product.name + "_rope_kv_write", {m});
  }
  return std::move(e).Finish();
}

// SiluMul(MatMul(x, gate), MatMul(x, up)).
absl::StatusOr<Graph> FuseGateUpSiluMul(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (OpOf<ops::SiluMul>(e, s) == nullptr) continue;
    const Node& node = e.nodes()[s];
    const int32_t mg = e.Producer(node.inputs[0]), mu = e.Producer(node.inputs[1]);
    if (mg == mu || !FusableMatMul(e, mg) || !FusableMatMul(e, mu)) continue;
    const Node& g = e.nodes()[mg];
    const Node& u = e.nodes()[mu];
    if (g.inputs[0] != u.inputs[0] || !e.OnlyReadBy(g.output, s) || !e.OnlyReadBy(u.output, s)) {
      continue;
    }
    const ops::FusedMatMul op{.weights = 2, .epilogue = Epilogue::kSiluMul};
    const absl::InlinedVector<TensorId, 4> inputs = {g.inputs[0], g.inputs[1], u.inputs[1]};
    if (e.WrittenBetween(std::min(mg, mu), s, inputs)) continue;  // both move to s
    if (!e.BackendRuns(op, inputs)) continue;
    e.Replace(s, op, inputs, Scope(g.name) + "gate_up_proj_silu_mul", {mg, mu});
  }
  return std::move(e).Finish();
}

// SiluMul(MoeMatMul(x, gate, ids), MoeMatMul(x, up, ids)): a routed MLP's gate and up
// experts (one input for every chosen expert) -> one MoeMatMul with silu_mul.
absl::StatusOr<Graph> FuseMoeGateUpSiluMul(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (OpOf<ops::SiluMul>(e, s) == nullptr) continue;
    const Node& node = e.nodes()[s];
    const int32_t mg = e.Producer(node.inputs[0]), mu = e.Producer(node.inputs[1]);
    const auto* og = OpOf<ops::MoeMatMul>(e, mg);
    const auto* ou = OpOf<ops::MoeMatMul>(e, mu);
    if (mg == mu || og == nullptr || ou == nullptr || og->silu_mul || ou->silu_mul) continue;
    const Node& g = e.nodes()[mg];
    const Node& u = e.nodes()[mu];
    const Tensor& wg = e.tensor(g.inputs[1]);
    const Tensor& wu = e.tensor(u.inputs[1]);
    if (g.inputs[0] != u.inputs[0] || g.inputs[2] != u.inputs[2] || wg.shape != wu.shape ||
        wg.dtype != wu.dtype || e.tensor(g.inputs[0]).shape[1] != wg.shape[2] ||
        !e.OnlyReadBy(g.output, s) || !e.OnlyReadBy(u.output, s)) {
      continue;
    }
    const ops::MoeMatMul op{.silu_mul = true};
    const absl::InlinedVector<TensorId, 4> inputs = {g.inputs[0], g.inputs[1], u.inputs[1],
                                                     g.inputs[2]};
    if (e.WrittenBetween(std::min(mg, mu), s, inputs)) continue;  // both move to s
    if (!e.BackendRuns(op, inputs)) continue;
    e.Replace(s, op, inputs, Scope(g.name) + "gate_up_silu_mul", {mg, mu});
  }
  return std::move(e).Finish();
}

// Add(residual, MatMul(...)) or Add(MatMul(...), residual).
absl::StatusOr<Graph> FuseResidualAdd(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (OpOf<ops::Add>(e, s) == nullptr) continue;
    const Node& node = e.nodes()[s];
    if (!IsFloat(e.tensor(node.output).dtype)) continue;
    for (int side : {1, 0}) {
      const int32_t m = e.Producer(node.inputs[side]);
      auto fused = AsFusedMatMul(e, m);
      if (!fused.has_value() || !e.OnlyReadBy(node.inputs[side], s)) continue;
      if (node.inputs[0] == node.inputs[1] || e.WrittenBetween(m, s, fused->second)) continue;
      fused->first.epilogue = Epilogue::kAdd;
      absl::InlinedVector<TensorId, 4> inputs = fused->second;
      inputs.push_back(node.inputs[1 - side]);
      if (!e.BackendRuns(fused->first, inputs)) continue;
      e.Replace(s, fused->first, std::move(inputs), e.nodes()[m].name + "_add", {m});
      break;
    }
  }
  return std::move(e).Finish();
}

// Add(residual, P) or Add(P, residual), P the output of a node of type Op read by nothing
// else -> that node's op with the residual taken in (`with_residual(op)`: the op that adds
// its last input, or nullopt where it has one already), its inputs followed by the
// residual, at the Add's place.
template <typename Op, typename WithResidual>
absl::StatusOr<Graph> FuseAddIntoProducer(Editor e, WithResidual with_residual) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (OpOf<ops::Add>(e, s) == nullptr) continue;
    const Node& node = e.nodes()[s];
    if (!IsFloat(e.tensor(node.output).dtype) || node.inputs[0] == node.inputs[1]) continue;
    for (int side : {1, 0}) {
      const int32_t p = e.Producer(node.inputs[side]);
      const Op* producer_op = OpOf<Op>(e, p);
      if (producer_op == nullptr || !e.OnlyReadBy(node.inputs[side], s)) continue;
      const std::optional<Op> op = with_residual(*producer_op);
      if (!op.has_value()) continue;
      // Add's inputs share a dtype and shape, which are the producer's output's.
      const Node& producer = e.nodes()[p];
      absl::InlinedVector<TensorId, 4> inputs(producer.inputs.begin(), producer.inputs.end());
      inputs.push_back(node.inputs[1 - side]);
      // The producer moves from p to s: nothing between may write what it reads (and for
      // a collective, every rank moves it alike: the pass sees the same graph on each).
      if (e.WrittenBetween(p, s, inputs)) continue;
      if (!e.BackendRuns(*op, inputs)) continue;
      e.Replace(s, *op, std::move(inputs), producer.name + "_add", {p});
      break;
    }
  }
  return std::move(e).Finish();
}

// MoeCombine then Add: a routed MLP's combine and the layer's residual add.
absl::StatusOr<Graph> FuseMoeCombineAdd(Editor e) {
  return FuseAddIntoProducer<ops::MoeCombine>(
      std::move(e), [](const ops::MoeCombine& op) -> std::optional<ops::MoeCombine> {
        if (op.residual) return std::nullopt;
        return ops::MoeCombine{.residual = true};
      });
}

// MoeRouteWeights read only by MoeCombines of the same ids: each combine computes the
// weights from the router's logits itself (one launch fewer a routed layer).
absl::StatusOr<Graph> FuseMoeRouteIntoCombine(Editor e) {
  for (int32_t r = 0; r < static_cast<int32_t>(e.nodes().size()); ++r) {
    const auto* route = OpOf<ops::MoeRouteWeights>(e, r);
    if (route == nullptr) continue;
    const Node node = e.nodes()[r];
    const ops::MoeRouteWeights params = *route;
    if (e.IsOutput(node.output)) continue;
    const std::vector<int32_t> readers = e.Readers(node.output);
    std::vector<std::pair<ops::MoeCombine, absl::InlinedVector<TensorId, 4>>> fused;
    bool all = !readers.empty();
    for (int32_t m : readers) {
      const Node& reader = e.nodes()[m];
      const auto* combine = OpOf<ops::MoeCombine>(e, m);
      // The weights as the combine's input 1 only, with the route's own ids, and nothing
      // between that writes the logits or the ids.
      all = combine != nullptr && !combine->route && reader.inputs[1] == node.output &&
            reader.inputs[2] == node.inputs[1] &&
            std::count(reader.inputs.begin(), reader.inputs.end(), node.output) == 1 &&
            !e.WrittenBetween(r, m, node.inputs);
      if (!all) break;
      ops::MoeCombine op = *combine;
      op.route = true;
      op.renormalize = params.renormalize;
      op.round_to_dtype = params.round_to_dtype;
      absl::InlinedVector<TensorId, 4> inputs = reader.inputs;
      inputs[1] = node.inputs[0];  // the logits
      all = e.BackendRuns(op, inputs);
      if (!all) break;
      fused.emplace_back(op, std::move(inputs));
    }
    if (!all) continue;
    for (size_t i = 0; i < readers.size(); ++i) {
      e.Replace(readers[i], fused[i].first, std::move(fused[i].second), std::nullopt, {});
    }
    e.Remove(r);
  }
  return std::move(e).Finish();
}

// AllReduce then Add: the o and down projections of a sharded layer, whose AllReduce
// stands between the matmul and its residual add.
absl::StatusOr<Graph> FuseAllReduceAdd(Editor e) {
  return FuseAddIntoProducer<ops::AllReduce>(
      std::move(e), [](const ops::AllReduce& op) -> std::optional<ops::AllReduce> {
        if (op.residual) return std::nullopt;
        return ops::AllReduce{.ranks = op.ranks, .residual = true};
      });
}

// RmsNorm whose every reader is a matmul taking it as x.
absl::StatusOr<Graph> FuseNormIntoMatMul(Editor e) {
  for (int32_t r = 0; r < static_cast<int32_t>(e.nodes().size()); ++r) {
    const auto* norm = OpOf<ops::RmsNorm>(e, r);
    if (norm == nullptr) continue;
    const Node node = e.nodes()[r];
    const float eps = norm->eps;
    if (e.IsOutput(node.output)) continue;
    const std::vector<int32_t> readers = e.Readers(node.output);
    // Each reader as it would become: the same op normalising its own x.
    std::vector<std::pair<ops::FusedMatMul, absl::InlinedVector<TensorId, 4>>> folded;
    bool all = !readers.empty();
    for (int32_t m : readers) {
      const Node& reader = e.nodes()[m];
      const bool plain = FusableMatMul(e, m);
      const auto* f = OpOf<ops::FusedMatMul>(e, m);
      const bool as_x = reader.inputs[0] == node.output &&
                        std::count(reader.inputs.begin(), reader.inputs.end(), node.output) == 1;
      // The norm moves into each reader: nothing between may write x or its weight.
      all = all && as_x && (plain || (f != nullptr && !f->norm)) &&
            !e.WrittenBetween(r, m, node.inputs);
      if (!all) break;
      ops::FusedMatMul op;
      if (f != nullptr) op = *f;
      op.norm = true;
      op.eps = eps;
      absl::InlinedVector<TensorId, 4> inputs = {node.inputs[0], node.inputs[1]};
      inputs.insert(inputs.end(), reader.inputs.begin() + 1, reader.inputs.end());
      all = e.BackendRuns(op, inputs);
      folded.emplace_back(op, std::move(inputs));
    }
    if (!all) continue;
    for (size_t i = 0; i < readers.size(); ++i) {
      e.Replace(readers[i], folded[i].first, std::move(folded[i].second), std::nullopt, {});
    }
    e.Remove(r);
  }
  return std::move(e).Finish();
}

// Argmax(MatMul(...)) when the logits are read by nothing else.
absl::StatusOr<Graph> FuseLmHeadArgmax(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (OpOf<ops::Argmax>(e, s) == nullptr) continue;
    const Node& node = e.nodes()[s];
    const int32_t m = e.Producer(node.inputs[0]);
    auto fused = AsFusedMatMul(e, m);
    if (!fused.has_value() || fused->first.weights != 1 || !e.OnlyReadBy(node.inputs[0], s) ||
        e.WrittenBetween(m, s, fused->second)) {
      continue;
    }
    fused->first.epilogue = Epilogue::kArgmax;
    if (!e.BackendRuns(fused->first, fused->second)) continue;
    e.Replace(s, fused->first, fused->second, e.nodes()[m].name + "_argmax", {m});
  }
  return std::move(e).Finish();
}

// ---- elementwise_chain --------------------------------------------------------------

using Kind = ops::FusedElementwise::Kind;

std::optional<Kind> PlainElementwiseKind(const Op& op) {
  if (std::holds_alternative<ops::Add>(op)) return Kind::kAdd;
  if (std::holds_alternative<ops::Mul>(op)) return Kind::kMul;
  if (std::holds_alternative<ops::Silu>(op)) return Kind::kSilu;
  if (std::holds_alternative<ops::SiluMul>(op)) return Kind::kSiluMul;
  return std::nullopt;
}

// A live Add, Mul, Silu, SiluMul or FusedElementwise over float tensors.
bool ChainableNode(const Editor& e, int32_t n) {
  if (n < 0 || e.removed(n)) return false;
  const Node& node = e.nodes()[n];
  if (!IsFloat(e.tensor(node.output).dtype)) return false;
  return PlainElementwiseKind(node.op).has_value() ||
         std::holds_alternative<ops::FusedElementwise>(node.op);
}

// A chain while it is assembled: its external inputs and its steps, whose operands refer
// to an input or to an earlier step.
struct ChainDraft {
  struct Ref {
    bool step = false;
    int32_t index = 0;
  };
  struct Step {
    Kind kind = Kind::kAdd;
    Ref a, b;
  };
  absl::InlinedVector<TensorId, 8> inputs;
  std::vector<Step> steps;

  Ref Input(TensorId id) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] == id) return Ref{false, static_cast<int32_t>(i)};
    }
    inputs.push_back(id);
    return Ref{false, static_cast<int32_t>(inputs.size() - 1)};
  }

  // Appends node n's computation (a plain elementwise op or a FusedElementwise) with its
  // inputs given as refs into this draft; returns the ref of its result.
  Ref Append(const Node& node, absl::Span<const Ref> operands) {
    const size_t first = steps.size();
    if (const auto* f = std::get_if<ops::FusedElementwise>(&node.op)) {
      const int32_t n_in = static_cast<int32_t>(node.inputs.size());
      auto ref = [&](uint8_t v) {
        return v < n_in ? operands[v] : Ref{true, static_cast<int32_t>(first) + v - n_in};
      };
      for (int i = 0; i < f->num_steps; ++i) {
        steps.push_back(Step{f->steps[i].kind, ref(f->steps[i].a), ref(f->steps[i].b)});
      }
    } else {
      const Kind kind = *PlainElementwiseKind(node.op);
      steps.push_back(Step{kind, operands[0], IsBinaryKind(kind) ? operands[1] : operands[0]});
    }
    return Ref{true, static_cast<int32_t>(steps.size() - 1)};
  }

  bool Fits() const {
    return inputs.size() <= static_cast<size_t>(ops::FusedElementwise::kMaxInputs) &&
           steps.size() <= static_cast<size_t>(ops::FusedElementwise::kMaxSteps);
  }

  ops::FusedElementwise ToOp() const {
    const int32_t n_in = static_cast<int32_t>(inputs.size());
    auto value = [&](Ref r) { return static_cast<uint8_t>(r.step ? n_in + r.index : r.index); };
    ops::FusedElementwise op;
    op.num_steps = static_cast<int32_t>(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      op.steps[i] = {steps[i].kind, value(steps[i].a),
                     IsBinaryKind(steps[i].kind) ? value(steps[i].b) : uint8_t{0}};
    }
    return op;
  }
};

// Node s's chain with the producers in `absorb` (each an elementwise node whose result
// only s reads) computed inside it; a producer s reads twice (Mul(p, p)) is computed once.
ChainDraft DraftChain(const Editor& e, int32_t s, absl::Span<const int32_t> absorb) {
  ChainDraft d;
  const Node& node = e.nodes()[s];
  absl::InlinedVector<ChainDraft::Ref, 8> operands;
  absl::InlinedVector<std::pair<int32_t, ChainDraft::Ref>, 4> computed;  // producer, result
  for (TensorId in : node.inputs) {
    const int32_t p = e.Producer(in);
    if (std::find(absorb.begin(), absorb.end(), p) == absorb.end()) {
      operands.push_back(d.Input(in));
      continue;
    }
    auto it = std::find_if(computed.begin(), computed.end(),
                           [p](const auto& c) { return c.first == p; });
    if (it == computed.end()) {
      absl::InlinedVector<ChainDraft::Ref, 8> inner;
      for (TensorId pin : e.nodes()[p].inputs) inner.push_back(d.Input(pin));
      it = computed.insert(computed.end(), {p, d.Append(e.nodes()[p], inner)});
    }
    operands.push_back(it->second);
  }
  d.Append(node, operands);
  return d;
}

// Elementwise nodes whose results only the next elementwise node reads -> one
// FusedElementwise (compiled for the plan on CUDA), processed in graph order so that a
// chain grows through every link. Chains stop at kMaxInputs inputs and kMaxSteps steps.
absl::StatusOr<Graph> FuseElementwiseChains(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    if (!ChainableNode(e, s)) continue;
    std::vector<int32_t> absorb;
    for (TensorId in : e.nodes()[s].inputs) {
      const int32_t p = e.Producer(in);
      // An absorbed producer is computed at s: nothing between may write what it reads.
      if (ChainableNode(e, p) && e.OnlyReadBy(in, s) &&
          std::find(absorb.begin(), absorb.end(), p) == absorb.end() &&
          !e.WrittenBetween(p, s, e.nodes()[p].inputs)) {
        absorb.push_back(p);
      }
    }
    // The most producers that still fit and the backend runs, in input order.
    ChainDraft d = DraftChain(e, s, absorb);
    while (!absorb.empty() && (!d.Fits() || !e.BackendRuns(d.ToOp(), d.inputs))) {
      absorb.pop_back();
      d = DraftChain(e, s, absorb);
    }
    if (absorb.empty()) continue;
    e.Replace(s, d.ToOp(), absl::InlinedVector<TensorId, 4>(d.inputs.begin(), d.inputs.end()),
              std::nullopt, absorb);
  }
  return std::move(e).Finish();
}

// MoeCombine of a MoeMatMul's output that nothing else reads, of the same ids and each
// chosen expert's own input (the down projection): one MoeCombine with `matmul`, which
// computes the products it sums (y is never stored: one launch and one round trip of y
// fewer a routed layer). Only where the step has fewer (row, expert) pairs than experts
// (a decode step): the fused node reads a row's experts for that row alone, where a
// separate MoeMatMul over many rows may read each expert's matrix once for all the rows
// that chose it. Last of the MoE passes, so it takes the combine with its residual and
// route already folded in.
absl::StatusOr<Graph> FuseMoeDownIntoCombine(Editor e) {
  for (int32_t s = 0; s < static_cast<int32_t>(e.nodes().size()); ++s) {
    const auto* combine = OpOf<ops::MoeCombine>(e, s);
    if (combine == nullptr || combine->matmul) continue;
    const Node& node = e.nodes()[s];
    const int32_t p = e.Producer(node.inputs[0]);
    const auto* down = OpOf<ops::MoeMatMul>(e, p);
    if (down == nullptr || down->silu_mul) continue;
    const Node& producer = e.nodes()[p];
    const Tensor& x = e.tensor(producer.inputs[0]);
    const Tensor& w = e.tensor(producer.inputs[1]);
    const int64_t top_k = e.tensor(node.inputs[2]).shape[1];
    // The combine's own ids, each slot its own input (top_k · K columns: shape inference
    // checked the product), and y read by the combine alone.
    if (producer.inputs[2] != node.inputs[2] || x.shape[1] != top_k * w.shape[2] ||
        x.shape[0] * top_k >= w.shape[0] ||
        !e.OnlyReadBy(producer.output, s) ||
        std::count(node.inputs.begin(), node.inputs.end(), producer.output) != 1) {
      continue;
    }
    ops::MoeCombine op = *combine;
    op.matmul = true;
    absl::InlinedVector<TensorId, 4> inputs = node.inputs;
    inputs[0] = producer.inputs[0];
    inputs.push_back(producer.inputs[1]);
    // The products move from p to s: nothing between may write x, w or the ids.
    if (e.WrittenBetween(p, s, producer.inputs)) continue;
    if (!e.BackendRuns(op, inputs)) continue;
    e.Replace(s, op, std::move(inputs), std::nullopt, {p});
  }
  return std::move(e).Finish();
}

struct PassEntry {
  const char* name;
  absl::StatusOr<Graph> (*run)(Editor);
};
constexpr PassEntry kPasses[] = {
    {"qkv_rope_kv_write", FuseQkvRopeKvWrite},
    {"rope_kv_write_epilogue", FuseRopeKvWriteEpilogue},
    {"gate_up_silu_mul", FuseGateUpSiluMul},
    {"moe_gate_up_silu_mul", FuseMoeGateUpSiluMul},
    {"residual_add", FuseResidualAdd},
    {"moe_combine_add", FuseMoeCombineAdd},
    {"moe_route_into_combine", FuseMoeRouteIntoCombine},
    {"moe_down_into_combine", FuseMoeDownIntoCombine},
    {"all_reduce_add", FuseAllReduceAdd},
    {"norm_into_matmul", FuseNormIntoMatMul},
    {"lm_head_argmax", FuseLmHeadArgmax},
    {"elementwise_chain", FuseElementwiseChains},
};

}  // namespace

std::vector<std::string> PassNames() {
  std::vector<std::string> names;
  for (const PassEntry& p : kPasses) names.push_back(p.name);
  return names;
}

absl::StatusOr<Graph> RunPass(absl::string_view name, Graph graph, const PassOptions& options) {
  for (const PassEntry& p : kPasses) {
    if (name != p.name) continue;
    absl::StatusOr<Graph> out = p.run(Editor(std::move(graph), options));
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("graph pass ", name, ": ", out.status().message()));
    }
    return out;
  }
  return absl::NotFoundError(absl::StrCat("no graph pass named '", name, "'"));
}

absl::StatusOr<Graph> RunPasses(Graph graph, const PassOptions& options) {
  for (const std::string& name : options.disabled) {
    const auto known = PassNames();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown graph pass '", name, "'"));
    }
  }
  if (!options.enabled) return graph;
  for (const PassEntry& p : kPasses) {
    if (options.disabled.contains(p.name)) continue;
    SG_ASSIGN_OR_RETURN(graph, RunPass(p.name, std::move(graph), options));
  }
  return graph;
}

PassOptions DefaultPassOptions() {
  PassOptions o;
  o.disabled.insert("norm_into_matmul");
  o.disabled.insert("moe_down_into_combine");
  return o;
}

absl::StatusOr<PassOptions> ParsePassList(absl::string_view spec) {
  PassOptions o;
  if (spec.empty() || spec == "default") return DefaultPassOptions();
  if (spec == "all") return o;
  if (spec == "none") {
    o.enabled = false;
    return o;
  }
  const std::vector<std::string> known = PassNames();
  std::vector<std::string> only;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const bool off = item[0] == '-';
    if (off) item.remove_prefix(1);
    if (std::find(known.begin(), known.end(), item) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown graph pass '", item, "' (known: ", absl::StrJoin(known, ","), ")"));
    }
    if (off) {
      o.disabled.insert(std::string(item));
    } else {
      only.push_back(std::string(item));
    }
  }
  if (!only.empty()) {
    if (!o.disabled.empty()) {
      return absl::InvalidArgumentError("a pass list names passes to run or, with '-', "
                                        "passes to skip, not both");
    }
    for (const std::string& n : known) {
      if (std::find(only.begin(), only.end(), n) == only.end()) o.disabled.insert(n);
    }
  }
  return o;
}

}  // namespace sg
