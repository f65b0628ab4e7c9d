// NFC as UAX #15 defines it: full canonical decomposition (Hangul syllables computed),
// canonical ordering of combining marks, then canonical composition of primary composites.
#include "text/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace sg {
namespace {

struct CombiningRun {
  uint32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  uint32_t cp, first, second;
  uint8_t composes;
};
#include "text/unicode_nfc_data.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(uint32_t cp) {
  const auto* end = std::end(kCombiningRuns);
  const auto* it = std::upper_bound(std::begin(kCombiningRuns), end, cp,
                                    [](uint32_t c, const CombiningRun& r) { return c < r.first; });
  if (it == std::begin(kCombiningRuns)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const Decomposition* FindDecomposition(uint32_t cp) {
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                    [](const Decomposition& d, uint32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xC0) {  // nothing below U+00C0 decomposes
    out->push_back(cp);
    return;
  }
  const Decomposition* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  Decompose(d->first, out);
  if (d->second != 0) Decompose(d->second, out);
}

const absl::flat_hash_map<uint64_t, uint32_t>& Compositions() {
  static const auto* map = [] {
    auto* m = new absl::flat_hash_map<uint64_t, uint32_t>();
    for (const Decomposition& d : kDecompositions) {
      if (d.composes) (*m)[(uint64_t{d.first} << 32) | d.second] = d.cp;
    }
    return m;
  }();
  return *map;
}

// The primary composite of a + b, or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& m = Compositions();
  auto it = m.find((uint64_t{a} << 32) | b);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

absl::string_view NfcUnicodeVersion() { return kNfcUnicodeVersion; }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string NormalizeNfc(absl::string_view text, int64_t* work) {
  // U+0300 is the first code point that NFC may change; its UTF-8 lead byte is 0xCC.
  if (std::none_of(text.begin(), text.end(), [](char c) { return static_cast<uint8_t>(c) >= 0xCC; })) {
    return std::string(text);
  }
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    const size_t n = b0 < 0x80 ? 1 : b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (size_t k = 1; k < n && i + k < text.size(); ++k) {
      cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    }
    Decompose(cp, &cps);
    i += n;
  }
  // Canonical ordering: each run of marks (nonzero class) sorted by class, stably. A run is
  // as long as the text makes it, so it is sorted in O(r log r), never by insertion.
  std::vector<uint8_t> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = CombiningClass(cps[i]);
  int64_t steps = static_cast<int64_t>(cps.size());
  std::vector<std::pair<uint8_t, uint32_t>> run;
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < cps.size() && ccc[end] != 0) ++end;
    if (end - i > 1) {
      run.clear();
      for (size_t k = i; k < end; ++k) run.emplace_back(ccc[k], cps[k]);
      std::stable_sort(run.begin(), run.end(), [&steps](const auto& a, const auto& b) {
        ++steps;
        return a.first < b.first;
      });
      for (size_t k = i; k < end; ++k) std::tie(ccc[k], cps[k]) = run[k - i];
    }
    i = end;
  }
  if (work != nullptr) *work += steps;
  // Canonical composition.
  if (!cps.empty()) {
    size_t starter = 0, out = 1;
    int last_class = ccc[0] == 0 ? 0 : 256;  // text starting with a mark has no starter
    for (size_t i = 1; i < cps.size(); ++i) {
      const uint32_t cp = cps[i];
      const int cls = ccc[i];
      const uint32_t composite = last_class == 256 ? 0 : Compose(cps[starter], cp);
      if (composite != 0 && (last_class < cls || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      cps[out++] = cp;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (uint32_t cp : cps) AppendUtf8(cp, &result);
  return result;
}

}  // namespace sg
