// Reading a JSON fixture in tests: one function for every suite that compares with files
// made by transformers (tests/fixtures).
#ifndef STEPGRAPH_TESTS_TESTING_JSON_FILE_H_
#define STEPGRAPH_TESTS_TESTING_JSON_FILE_H_

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace sg::testing {

// The parsed file; a file that cannot be read fails the test and parses as empty (which
// throws, ending the test).
inline nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_JSON_FILE_H_
