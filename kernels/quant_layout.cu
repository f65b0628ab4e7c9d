// The host repacking of GGUF blocks into the device layout of kernels/quant_blocks.cuh,
// and the host reading of that layout through the kernels' readers (for tests). Host
// code only; the field order of each plane is the one quant_blocks.cuh documents.
#include <cstring>
#include <type_traits>

#include "kernels/quant_blocks.cuh"
#include "kernels/quant_layout.h"
#include "stepgraph/base/quant.h"

namespace sg::kernels {
namespace {

using quant::Format;

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// The 16 quant bytes of a unit from its 32 4-bit codes: value i low, value 16 + i high.
void PackNibbles(const uint8_t (&code)[32], uint8_t* out) {
  for (int i = 0; i < 16; ++i) {
    out[i] = static_cast<uint8_t>((code[i] & 0xF) | (code[16 + i] & 0xF) << 4);
  }
}

void Repack(const BlockQ8_0* src, int64_t blocks, uint8_t* dst) {
  uint8_t* d = dst + Format<DType::kQ8_0>::kPlane0 * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    std::memcpy(dst + 32 * b, src[b].qs, 32);
    Put16(d + 2 * b, src[b].d);
  }
}

// Q4_0 .. Q5_1: [qs][qh if five][d (m)].
template <typename Block, bool kMin, bool kFive>
void Repack32(const Block* src, int64_t blocks, uint8_t* dst) {
  uint8_t* qh = dst + 16 * blocks;
  uint8_t* scales = qh + (kFive ? 4 * blocks : 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const Block& s = src[b];
    std::memcpy(dst + 16 * b, s.qs, 16);
    if constexpr (kFive) std::memcpy(qh + 4 * b, s.qh, 4);
    if constexpr (kMin) {
      Put16(scales + 4 * b, s.d);
      Put16(scales + 4 * b + 2, s.m);
    } else {
      Put16(scales + 2 * b, s.d);
    }
  }
}

// Q4_K and Q5_K: the head as it is, the sub-blocks' codes per unit, Q5_K's high bits per
// unit as one 32-bit word.
template <typename Block, bool kFive>
void RepackK(const Block* src, int64_t blocks, uint8_t* dst) {
  constexpr int kBytes = Format<kFive ? DType::kQ5_K : DType::kQ4_K>::kBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const Block& s = src[b];
    uint8_t* out = dst + kBytes * b;
    std::memcpy(out, &s, 16);  // d, dmin, scales
    for (int u = 0; u < 8; ++u) {
      const int c = u / 2, shift = 4 * (u % 2);
      uint8_t code[32];
      uint32_t high = 0;
      for (int l = 0; l < 32; ++l) {
        code[l] = static_cast<uint8_t>((s.qs[32 * c + l] >> shift) & 0xF);
        if constexpr (kFive) high |= static_cast<uint32_t>((s.qh[l] >> u) & 1) << l;
      }
      PackNibbles(code, out + 16 + 16 * u);
      if constexpr (kFive) std::memcpy(out + 144 + 4 * u, &high, 4);
    }
  }
}

// Q6_K: per unit the low nibbles, then per unit the 2-bit highs as one 64-bit word, then
// the scales; d in a plane of its own.
void Repack(const BlockQ6_K* src, int64_t blocks, uint8_t* dst) {
  constexpr int kPlane0 = Format<DType::kQ6_K>::kPlane0;
  uint8_t* d = dst + kPlane0 * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const BlockQ6_K& s = src[b];
    uint8_t* out = dst + kPlane0 * b;
    for (int u = 0; u < 8; ++u) {
      uint8_t low[32];
      uint64_t high = 0;
      for (int l = 0; l < 32; ++l) {
        const int code = Q6KCode(s, 32 * u + l);
        low[l] = static_cast<uint8_t>(code & 0xF);
        high |= static_cast<uint64_t>(code >> 4) << (2 * (l & 15) + 32 * (l >> 4));
      }
      PackNibbles(low, out + 16 * u);
      std::memcpy(out + 128 + 8 * u, &high, 8);
    }
    std::memcpy(out + 192, s.scales, 16);
    Put16(d + 2 * b, s.d);
  }
}

}  // namespace

bool RepackBlocksForDevice(DType t, int64_t blocks, const void* src, void* dst) {
  if (!IsQuantized(t) || blocks < 0) return false;
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::kQ8_0: Repack(static_cast<const BlockQ8_0*>(src), blocks, out); return true;
    case DType::kQ4_0:
      Repack32<BlockQ4_0, false, false>(static_cast<const BlockQ4_0*>(src), blocks, out);
      return true;
    case DType::kQ4_1:
      Repack32<BlockQ4_1, true, false>(static_cast<const BlockQ4_1*>(src), blocks, out);
      return true;
    case DType::kQ5_0:
      Repack32<BlockQ5_0, false, true>(static_cast<const BlockQ5_0*>(src), blocks, out);
      return true;
    case DType::kQ5_1:
      Repack32<BlockQ5_1, true, true>(static_cast<const BlockQ5_1*>(src), blocks, out);
      return true;
    case DType::kQ4_K:
      RepackK<BlockQ4_K, false>(static_cast<const BlockQ4_K*>(src), blocks, out);
      return true;
    case DType::kQ5_K:
      RepackK<BlockQ5_K, true>(static_cast<const BlockQ5_K*>(src), blocks, out);
      return true;
    case DType::kQ6_K: Repack(static_cast<const BlockQ6_K*>(src), blocks, out); return true;
    default: return false;
  }
}

bool DequantizeDeviceLayoutRow(DType t, const void* device_layout, int64_t blocks, int64_t row,
                               int64_t k, float* out, DeviceLayoutReading reading) {
  const bool by_quarters = reading == DeviceLayoutReading::kQuarters;
  if (!IsQuantized(t) || k <= 0 || k % DTypeBlockElems(t) != 0 || row < 0 ||
      (row + 1) * (k / DTypeBlockElems(t)) > blocks) {
    return false;
  }
  const auto* base = static_cast<const uint8_t*>(device_layout);
  return quant::DispatchFormat(t, [&](auto format) {
           using Q = decltype(format);
           const int64_t units = k / quant::kUnitElems;
           for (int64_t u = 0; u < units; ++u) {
             const typename Q::Unit unit = Q::Load(base, blocks, row * units + u);
             float* v = out + 32 * u;
             for (int j = 0; j < 4 && !by_quarters; ++j) {
               float eight[8];
               if constexpr (Q::kUnits == 1) {
                 if (reading == DeviceLayoutReading::kParts) {
                   Q::LoadPart(base, blocks, row * units + u, j).Values8(j, eight);
                   std::memcpy(v + 8 * j, eight, sizeof(eight));
                   continue;
                 }
               }
               unit.Values8(j, eight);
               std::memcpy(v + 8 * j, eight, sizeof(eight));
             }
             for (int quarter = 0; quarter < 4 && by_quarters; ++quarter) {
               // QuadCodes' bytes, each (signed for Q8_0) less the bias, as Values8 rounds.
               uint32_t half[2];
               unit.QuadCodes(quarter, half[0], half[1]);
               for (int h = 0; h < 2; ++h) {
                 for (int i = 0; i < 4; ++i) {
                   const uint32_t byte = (half[h] >> (8 * i)) & 0xFFu;
                   const int code = std::is_same_v<Q, quant::Format<DType::kQ8_0>>
                                        ? static_cast<int8_t>(byte)
                                        : static_cast<int>(byte) - Q::Unit::kCodeBias;
                   float value = quant::MulRn(unit.Scale(2 * h), static_cast<float>(code));
                   if constexpr (Q::Unit::kHasMin) value = quant::AddRn(value, unit.Min(2 * h));
                   v[16 * h + 4 * quarter + i] = value;
                 }
               }
             }
           }
           return cudaSuccess;
         }) == cudaSuccess;
}

}  // namespace sg::kernels
