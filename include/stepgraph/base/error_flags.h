// Bits of the error word that kernels raise instead of reading or writing out of bounds
// (a bad token id, a position outside the KV cache) or find what must not go unnoticed
// (logits that are not finite). Plain C++ so that kernels, the CPU
// reference and the host API share one definition. The host reads the word after a step.
#ifndef STEPGRAPH_BASE_ERROR_FLAGS_H_
#define STEPGRAPH_BASE_ERROR_FLAGS_H_

#include <cstdint>

namespace sg {

enum ErrorFlag : uint32_t {
  kErrorTokenOutOfRange = 1u << 0,     // Embedding id outside [0, V): a zero row was written
  kErrorPositionOutOfRange = 1u << 1,  // KvWrite/Attention pos >= S: nothing written / zeros;
                                       // Advance at INT32_MAX: the position stays
  kErrorNonFiniteLogits = 1u << 2,     // Argmax/Sample read a NaN or an infinity: the model
                                       // (weights or activations) overflowed or is corrupt
  kErrorExpertOutOfRange = 1u << 3,    // MoeMatMul/MoeRouteWeights read an expert id outside
                                       // [0, E): zeros / weight 0 were used instead
};

}  // namespace sg

#endif  // STEPGRAPH_BASE_ERROR_FLAGS_H_
