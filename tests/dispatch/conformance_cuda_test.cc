// The op-conformance table (tests/testing/conformance_cases.cc) on the GPU: every case run
// on the CPU reference and on CudaDispatch from the same random inputs and compared.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "tests/testing/conformance.h"

namespace sg::testing {
namespace {

class ConformanceTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(ConformanceTest, CpuAndCudaAgree) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RunConformance(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ops, ConformanceTest, ::testing::ValuesIn(ConformanceCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace sg::testing
