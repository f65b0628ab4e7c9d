// The median of measured times: the one definition the step runner's measurements, the
// `stepgraph` program and the benchmarks report with. A median, not a mean, since one
// descheduled run must not move the figure.
#ifndef STEPGRAPH_RUNTIME_TIMING_H_
#define STEPGRAPH_RUNTIME_TIMING_H_

#include <algorithm>
#include <vector>

namespace sg {

// The middle value (the mean of the two middle values for an even count); 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_TIMING_H_
