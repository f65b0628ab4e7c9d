// Checks of an absl::Status for the tests: the code, and the parts a message must name
// (the node, the tensor, the bound that was broken), so that an error that says the wrong
// thing fails as surely as a missing one.
#ifndef STEPGRAPH_TESTS_TESTING_STATUS_MATCHERS_H_
#define STEPGRAPH_TESTS_TESTING_STATUS_MATCHERS_H_

#include <initializer_list>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace sg::testing {

// Success when `status` has `code` and its message contains every one of `parts`.
inline ::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                          std::initializer_list<absl::string_view> parts) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected code " << absl::StatusCodeToString(code) << ", got " << status;
  }
  for (absl::string_view part : parts) {
    if (!absl::StrContains(status.message(), part)) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" does not contain \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_STATUS_MATCHERS_H_
