// Status helpers. Abseil 20220623 (Debian's) ships absl::Status and StatusOr but no
// propagation macros, so stepgraph defines the two it needs here.
#ifndef STEPGRAPH_BASE_STATUS_H_
#define STEPGRAPH_BASE_STATUS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SG_STATUS_CONCAT_INNER(a, b) a##b
#define SG_STATUS_CONCAT(a, b) SG_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if it is
// not OK.
#define SG_RETURN_IF_ERROR(expr)                                   \
  do {                                                             \
    ::absl::Status sg_status_ = (expr);                            \
    if (ABSL_PREDICT_FALSE(!sg_status_.ok())) return sg_status_;   \
  } while (0)

// `SG_ASSIGN_OR_RETURN(auto x, MakeX());` evaluates an absl::StatusOr<T>, returns its
// status if it is not OK, and otherwise moves the value into `lhs`.
#define SG_ASSIGN_OR_RETURN(lhs, rexpr) \
  SG_ASSIGN_OR_RETURN_IMPL(SG_STATUS_CONCAT(sg_statusor_, __LINE__), lhs, rexpr)

#define SG_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr)                     \
  auto statusor = (rexpr);                                                 \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // STEPGRAPH_BASE_STATUS_H_
