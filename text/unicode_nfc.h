// Unicode Normalization Form C, for tokenizers whose tokenizer.json normalizes text to NFC
// before splitting it (Qwen2's do). Tables come from tools/make_unicode_tables.py.
#ifndef STEPGRAPH_TEXT_UNICODE_NFC_H_
#define STEPGRAPH_TEXT_UNICODE_NFC_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace sg {

// `text` must be valid UTF-8. Text of code points below U+0300 only is returned unchanged
// without a table lookup.
// `work` (optional) is increased by the steps taken (see EncodeWork::nfc_steps).
std::string NormalizeNfc(absl::string_view text, int64_t* work = nullptr);

// The Unicode version of the tables: the reference tokenizer's (see
// tools/make_unicode_tables.py), not the newest.
absl::string_view NfcUnicodeVersion();

// Appends the UTF-8 bytes of code point `cp` (at most U+10FFFF) to `out`.
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace sg

#endif  // STEPGRAPH_TEXT_UNICODE_NFC_H_
