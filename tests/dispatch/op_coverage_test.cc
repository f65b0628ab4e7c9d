// Every op of SG_OP_LIST has a case of its own in the conformance table and a section in
// docs/ops.md, so that an op added without either fails here, in every build. The table's
// cases are compared with CudaDispatch only on a GPU (conformance_cuda_test); here each
// case's graph is built, so that a case that no longer builds fails without a GPU too.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "tests/testing/conformance.h"

namespace sg::testing {
namespace {

template <size_t... I>
std::vector<std::string> OpNames(std::index_sequence<I...>) {
  return {std::string(OpName(Op(std::in_place_index<I>)))...};
}
// Every name of SG_OP_LIST, in its order.
std::vector<std::string> AllOpNames() { return OpNames(std::make_index_sequence<kNumOps>{}); }

TEST(OpCoverageTest, TheOpListIsReadWhole) {
  const std::vector<std::string> names = AllOpNames();
  ASSERT_EQ(static_cast<int>(names.size()), kNumOps);
  EXPECT_EQ(names.front(), "Embedding");
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

TEST(OpCoverageTest, EveryCaseBuildsAndEveryOpHasACaseOfItsOwn) {
  // Cases per op, counting the single-op cases only: an op that appears only inside a
  // whole Llama step has no case that checks it alone.
  std::map<std::string, int> cases;
  for (const OpCase& c : ConformanceCases()) {
    absl::StatusOr<Graph> g = CaseGraph(c);
    ASSERT_TRUE(g.ok()) << "conformance case " << c.name << ": " << g.status();
    ASSERT_GT(g->num_nodes(), 0) << c.name;
    if (c.graph) continue;
    std::set<std::string> ops;
    for (const Node& n : g->nodes()) ops.insert(std::string(OpName(n.op)));
    for (const std::string& op : ops) ++cases[op];
  }
  for (const std::string& op : AllOpNames()) {
    EXPECT_GT(cases[op], 0) << "op " << op << " has no case in the conformance table "
                            << "(tests/testing/conformance_cases.cc)";
  }
}

TEST(OpCoverageTest, EveryOpHasASectionInOpsMd) {
  const std::string path = std::string(SG_SOURCE_DIR) + "/docs/ops.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  // Op sections are the "### <Name>" headings; every op has one and every one is an op.
  std::set<std::string> sections;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    if (absl::ConsumePrefix(&line, "### ")) sections.insert(std::string(line));
  }
  const std::vector<std::string> names = AllOpNames();
  for (const std::string& op : names) {
    EXPECT_TRUE(sections.count(op)) << "docs/ops.md has no '### " << op << "' section";
  }
  for (const std::string& s : sections) {
    EXPECT_NE(std::find(names.begin(), names.end(), s), names.end())
        << "docs/ops.md has a section '### " << s << "' for an op not in SG_OP_LIST";
  }
}

}  // namespace
}  // namespace sg::testing
