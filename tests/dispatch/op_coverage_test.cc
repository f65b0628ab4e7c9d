// Adding an op touches the places docs/ops.md lists ("Adding an op"); this test fails,
// naming the place, when an op misses one that a build without a GPU can see: a case of
// its own in the conformance table, a section in docs/ops.md, a CPU reference and mock run
// of every case, and written inputs (WrittenInputs) that say every bound tensor a run
// changes. The op list, shape inference, the CPU reference's and the CUDA unit's Run and
// WrittenInputs are enforced by the compiler (no defaults); the table's cases are compared
// with CudaDispatch on a GPU (conformance_cuda_test).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/ops.h"
#include "tests/testing/conformance.h"

namespace sg::testing {
namespace {

// Every name of SG_OP_LIST, in its order, as strings.
std::vector<std::string> OpNameList() {
  const absl::Span<const absl::string_view> names = AllOpNames();
  return {names.begin(), names.end()};
}

std::string OpsMd() {
  const std::string path = std::string(SG_SOURCE_DIR) + "/docs/ops.md";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(OpCoverageTest, TheOpListIsReadWhole) {
  const std::vector<std::string> names = OpNameList();
  ASSERT_EQ(static_cast<int>(names.size()), kNumOps);
  EXPECT_EQ(names.front(), "Embedding");
  // The names and the Op variant follow the list in one order.
  EXPECT_EQ(names.back(), OpName(Op(std::in_place_index<kNumOps - 1>)));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

TEST(OpCoverageTest, EveryCaseBuildsAndEveryOpHasACaseOfItsOwn) {
  // Cases per op, counting the single-op cases only: an op that appears only inside a
  // whole Llama step has no case that checks it alone.
  std::map<std::string, int> cases;
  for (const OpCase& c : ConformanceCases()) {
    absl::StatusOr<Graph> g = BuildCase(c);
    ASSERT_TRUE(g.ok()) << "conformance case " << c.name << ": " << g.status();
    ASSERT_GT(g->num_nodes(), 0) << c.name;
    if (c.graph) continue;
    std::set<std::string> ops;
    for (const Node& n : g->nodes()) ops.insert(std::string(OpName(n.op)));
    for (const std::string& op : ops) ++cases[op];
  }
  for (const std::string& op : OpNameList()) {
    EXPECT_GT(cases[op], 0) << "op " << op << " has no case in the conformance table "
                            << "(tests/testing/conformance_cases.cc)";
  }
}

TEST(OpCoverageTest, EveryOpHasASectionInOpsMd) {
  // Op sections are the "### <Name>" headings; every op has one and every one is an op.
  std::set<std::string> sections;
  for (absl::string_view line : absl::StrSplit(OpsMd(), '\n')) {
    if (absl::ConsumePrefix(&line, "### ")) sections.insert(std::string(line));
  }
  const std::vector<std::string> names = OpNameList();
  for (const std::string& op : names) {
    EXPECT_TRUE(sections.count(op)) << "docs/ops.md has no '### " << op << "' section";
  }
  for (const std::string& s : sections) {
    EXPECT_NE(std::find(names.begin(), names.end(), s), names.end())
        << "docs/ops.md has a section '### " << s << "' for an op not in SG_OP_LIST";
  }
}

TEST(OpCoverageTest, AddingAnOpListsPlacesThatExist) {
  // The section names each place by its file; a file that moved or went makes it stale.
  const std::string text = OpsMd();
  const size_t begin = text.find("## Adding an op");
  ASSERT_NE(begin, std::string::npos) << "docs/ops.md has no '## Adding an op' section";
  const size_t end = text.find("\n## ", begin + 1);
  const std::string section = text.substr(begin, end - begin);
  int files = 0;
  // Backquoted paths: `graph/ops.cc`, `include/stepgraph/graph/ops.h`; not `<family>` ones.
  const std::vector<std::string> quoted = absl::StrSplit(section, '`');
  for (size_t i = 1; i < quoted.size(); i += 2) {
    const std::string& q = quoted[i];
    if (!absl::StrContains(q, "/") || absl::StrContains(q, "<") || absl::StrContains(q, " ")) {
      continue;
    }
    ++files;
    EXPECT_TRUE(std::filesystem::exists(std::string(SG_SOURCE_DIR) + "/" + q))
        << "docs/ops.md, 'Adding an op', names " << q << ", which is not in the tree";
  }
  EXPECT_GE(files, 8) << section;
}

// Bytes of every bound tensor (by index) as the run left them.
std::map<int32_t, std::vector<std::byte>> BoundBytes(
    const std::map<int32_t, HostTensor>& bound) {
  std::map<int32_t, std::vector<std::byte>> out;
  for (const auto& [i, h] : bound) {
    const auto* p = static_cast<const std::byte*>(h.data());
    out.emplace(i, std::vector<std::byte>(p, p + h.bytes()));
  }
  return out;
}

// Runs `plan` with `dispatch` over copies of `inputs` into a poisoned arena; returns the
// bound tensors afterwards.
std::map<int32_t, HostTensor> RunOn(KernelDispatch& dispatch, const ExecutionPlan& plan,
                                    const std::map<int32_t, HostTensor>& inputs,
                                    absl::Status* status) {
  const Graph& g = plan.graph();
  std::map<int32_t, HostTensor> bound;
  Bindings bind(g);
  for (const auto& [i, h] : inputs) {
    HostTensor copy(h.dtype(), h.shape());
    std::memcpy(copy.data(), h.data(), h.bytes());
    auto [it, _] = bound.emplace(i, std::move(copy));
    EXPECT_TRUE(bind.Bind(g.id(i), it->second.data(), it->second.bytes()).ok());
  }
  HostTensor arena(DType::kF32, Shape{std::max<int64_t>(1, plan.arena_bytes() / 4 + 1)});
  arena.Poison();
  bind.SetArena(arena.data(), plan.arena_bytes());
  *status = Execute(plan, bind, dispatch).status();
  return bound;
}

// Per op, the conformance case with the fewest bound bytes among those that hold it: a
// small set that still runs every op.
std::vector<OpCase> SmallestCasePerOp() {
  const std::vector<OpCase> cases = ConformanceCases();
  std::map<std::string, std::pair<int64_t, size_t>> best;  // op -> (bytes, case)
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<Graph> g = BuildCase(cases[i]);
    EXPECT_TRUE(g.ok()) << cases[i].name << ": " << g.status();
    if (!g.ok()) continue;
    int64_t bytes = 0;
    for (const Tensor& t : g->tensors()) {
      if (t.kind != TensorKind::kIntermediate) bytes += t.bytes();
    }
    for (const Node& n : g->nodes()) {
      auto [it, fresh] = best.try_emplace(std::string(OpName(n.op)), bytes, i);
      if (!fresh && bytes < it->second.first) it->second = {bytes, i};
    }
  }
  std::set<size_t> chosen;
  for (const auto& [op, b] : best) chosen.insert(b.second);
  std::vector<OpCase> out;
  for (size_t i : chosen) out.push_back(cases[i]);
  return out;
}

TEST(OpCoverageTest, EveryOpRunsOnTheCpuReferenceAndTheMockWritingOnlyWhatItDeclares) {
  // Per op with written inputs: whether some case changed them (a declaration no run
  // bears out is as wrong as a write not declared).
  std::map<std::string, bool> declared_write_seen;
  std::set<std::string> ran;
  for (const OpCase& c : SmallestCasePerOp()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Graph> graph = BuildCase(c);
    ASSERT_TRUE(graph.ok()) << graph.status();
    for (const Node& n : graph->nodes()) ran.insert(std::string(OpName(n.op)));
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const Graph& g = plan->graph();
    const std::map<int32_t, HostTensor> inputs = CaseInputs(c, g);

    absl::Status status;
    MockDispatch mock;
    RunOn(mock, *plan, inputs, &status);
    ASSERT_TRUE(status.ok()) << "the mock (dispatch/mock/): " << status;
    ASSERT_EQ(mock.trace().size(), static_cast<size_t>(g.num_nodes()));
    for (int32_t i = 0; i < g.num_nodes(); ++i) {
      EXPECT_EQ(mock.trace()[i].op, OpName(g.nodes()[i].op)) << "the mock's entry " << i;
    }

    CpuDispatch cpu(CpuDispatch::Options{.threads = 2});
    const std::map<int32_t, HostTensor> after = RunOn(cpu, *plan, inputs, &status);
    ASSERT_TRUE(status.ok()) << "the CPU reference (dispatch/cpu/cpu_dispatch.cc): " << status;
    const auto before_bytes = BoundBytes(inputs);
    const auto after_bytes = BoundBytes(after);
    // Which nodes declare each tensor written.
    std::map<int32_t, std::vector<int32_t>> writers;
    for (int32_t n = 0; n < g.num_nodes(); ++n) {
      const Node& node = g.nodes()[n];
      for (int32_t w : WrittenInputs(node.op).inputs) writers[node.inputs[w].index].push_back(n);
    }
    for (const auto& [i, bytes] : after_bytes) {
      const bool changed = bytes != before_bytes.at(i);
      const Tensor& t = g.tensors()[i];
      if (changed && !writers.contains(i)) {
        std::string readers;
        for (const Node& node : g.nodes()) {
          if (std::find(node.inputs.begin(), node.inputs.end(), g.id(i)) != node.inputs.end()) {
            absl::StrAppend(&readers, readers.empty() ? "" : ", ", OpName(node.op), " '",
                            node.name, "'");
          }
        }
        ADD_FAILURE() << TensorKindName(t.kind) << " '" << t.name << "' changed, but no node "
                      << "declares it written; it is read by " << readers
                      << ": say so in WrittenInputs (graph/ops.cc)";
      }
      for (int32_t n : writers[i]) {
        bool& seen = declared_write_seen[std::string(OpName(g.nodes()[n].op))];
        seen = seen || changed;
      }
    }
  }
  EXPECT_EQ(ran.size(), static_cast<size_t>(kNumOps));
  for (const auto& [op, seen] : declared_write_seen) {
    EXPECT_TRUE(seen) << "op " << op << " declares written inputs (WrittenInputs in "
                      << "graph/ops.cc) that no conformance case saw change";
  }
}

}  // namespace
}  // namespace sg::testing
