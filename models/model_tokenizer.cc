#include "models/model_tokenizer.h"

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// An optional id key: -1 when absent, refused when it does not fit an id.
absl::StatusOr<int32_t> OptionalId(const GgufFile& f, absl::string_view key) {
  if (f.Find(key) == nullptr) return -1;
  SG_ASSIGN_OR_RETURN(const int64_t v, f.GetInt(key));
  if (v < -1 || v > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.source(), ": ", key, " = ", v, " is not a token id"));
  }
  return static_cast<int32_t>(v);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& f, absl::string_view key, bool fallback) {
  if (f.Find(key) == nullptr) return fallback;
  return f.GetBool(key);
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& f) {
  if (f.Find("tokenizer.ggml.model") == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(f.source(), " has no tokenizer (no tokenizer.ggml.model key)"));
  }
  TokenizerSpec spec;
  SG_ASSIGN_OR_RETURN(absl::string_view model, f.GetString("tokenizer.ggml.model"));
  spec.model = std::string(model);
  spec.pre = "default";
  if (f.Find("tokenizer.ggml.pre") != nullptr) {
    SG_ASSIGN_OR_RETURN(absl::string_view pre, f.GetString("tokenizer.ggml.pre"));
    spec.pre = std::string(pre);
  }
  SG_ASSIGN_OR_RETURN(absl::Span<const absl::string_view> tokens,
                      f.GetStringArray("tokenizer.ggml.tokens"));
  spec.tokens.reserve(tokens.size());
  for (absl::string_view t : tokens) spec.tokens.emplace_back(t);
  if (f.Find("tokenizer.ggml.scores") != nullptr) {
    SG_ASSIGN_OR_RETURN(spec.scores, f.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    SG_ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      // Checked in 64 bits: narrowed first, 2^32 + 3 would pass as 3 (a control token).
      if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat(
            f.source(), ": tokenizer.ggml.token_type of token ", i, " is ", types[i],
            " (0 to 6 are known)"));
      }
      spec.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (f.Find("tokenizer.ggml.merges") != nullptr) {
    SG_ASSIGN_OR_RETURN(absl::Span<const absl::string_view> merges,
                        f.GetStringArray("tokenizer.ggml.merges"));
    spec.merges.reserve(merges.size());
    for (absl::string_view m : merges) spec.merges.emplace_back(m);
  }
  SG_ASSIGN_OR_RETURN(spec.bos_id, OptionalId(f, "tokenizer.ggml.bos_token_id"));
  SG_ASSIGN_OR_RETURN(spec.eos_id, OptionalId(f, "tokenizer.ggml.eos_token_id"));
  SG_ASSIGN_OR_RETURN(spec.eot_id, OptionalId(f, "tokenizer.ggml.eot_token_id"));
  SG_ASSIGN_OR_RETURN(spec.unk_id, OptionalId(f, "tokenizer.ggml.unknown_token_id"));
  SG_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(f, "tokenizer.ggml.padding_token_id"));
  // A "llama" file that does not say adds bos, as transformers does.
  SG_ASSIGN_OR_RETURN(spec.add_bos,
                      OptionalBool(f, "tokenizer.ggml.add_bos_token", spec.model == "llama"));
  SG_ASSIGN_OR_RETURN(spec.add_eos, OptionalBool(f, "tokenizer.ggml.add_eos_token", false));
  SG_ASSIGN_OR_RETURN(spec.add_space_prefix,
                      OptionalBool(f, "tokenizer.ggml.add_space_prefix", true));
  if (f.Find("tokenizer.chat_template") != nullptr) {
    SG_ASSIGN_OR_RETURN(absl::string_view t, f.GetString("tokenizer.chat_template"));
    spec.chat_template = std::string(t);
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    const std::string json = path + "/tokenizer.json";
    if (::stat(json.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("the model ", path, " has no tokenizer.json"));
    }
    return Tokenizer::FromTokenizerJson(path);
  }
  SG_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  SG_ASSIGN_OR_RETURN(TokenizerSpec spec, TokenizerSpecFromGguf(file));
  return Tokenizer::Create(std::move(spec));
}

}  // namespace sg
