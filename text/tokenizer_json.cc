// A Hugging Face tokenizer folder → TokenizerSpec. tokenizer.json describes its pipeline as a
// tree (normalizer, pre-tokenizer, model, post-processor, decoder); the shapes that the two
// supported families write are mapped onto the spec, and anything else is refused by name,
// since running a tokenizer with a step left out gives plausible but wrong ids.
#include <sys/stat.h>

#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/small_file.h"
#include "nlohmann/json.hpp"
#include "stepgraph/base/status.h"
#include "stepgraph/text/tokenizer.h"
#include "text/bounded_json.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// tokenizer.json: the largest real ones (Gemma 3's 262k tokens) are about 35 MB and hold
// about a million JSON values (vocabulary, merges as pairs, added tokens); nest 8 deep.
// The bounds are checked before anything is built, so a hostile file costs no more than
// its bytes.
constexpr int64_t kMaxTokenizerJsonBytes = int64_t{64} << 20;
constexpr JsonLimits kTokenizerJsonLimits = {.max_depth = 64, .max_values = int64_t{1} << 22};
// tokenizer_config.json and chat_template.jinja carry chat templates of tens of kilobytes.
constexpr int64_t kMaxTokenizerConfigBytes = int64_t{16} << 20;
constexpr JsonLimits kTokenizerConfigLimits = {.max_depth = 64, .max_values = int64_t{1} << 20};
// The largest id a vocabulary may use (Tokenizer::Create's bound on the vocabulary size).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kSpaceMarker[] = "\xE2\x96\x81";

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status Unsupported(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// A string from the file quoted for a message: at most 64 bytes of it, cut on a character.
std::string Quoted(absl::string_view s) {
  if (s.size() <= 64) return absl::StrCat("\"", s, "\"");
  size_t cut = 64;
  while (cut > 0 && (static_cast<uint8_t>(s[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat("\"", s.substr(0, cut), "...\"");
}

// An id from the file: an integer in [0, kMaxTokenId]. A float (1e30) or a string is
// refused before any conversion, which for a float out of range would be undefined.
absl::StatusOr<int64_t> TokenIdOf(const Json& v, const std::string& path, absl::string_view what) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    const int64_t id = v.get<int64_t>();
    if (id >= 0 && id <= kMaxTokenId) return id;
  } else if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId)) {
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " has id ", JsonPreview(v, 32),
                                                 ", not an integer in [0, ", kMaxTokenId, "]"));
}

std::string TypeOf(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// What the pipeline's parts say, gathered before they are checked against each other.
struct Pipeline {
  bool byte_level = false;      // a ByteLevel pre-tokenizer or decoder
  bool metaspace = false;       // ▁ from a Metaspace pre-tokenizer or Replace normalizer
  bool prefix_first = false;    // Metaspace prepend_scheme "first"
  bool prefix_every = false;    // Prepend("▁") normalizer
  bool decoder_strips = false;  // the decoder drops one leading space
  bool nfc = false;
  std::vector<std::string> patterns;
};

absl::Status ReadNormalizer(const Json& n, const std::string& path, Pipeline* p) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(n);
  if (type == "Sequence") {
    for (const Json& step : n.at("normalizers")) SG_RETURN_IF_ERROR(ReadNormalizer(step, path, p));
    return absl::OkStatus();
  }
  if (type == "Prepend" && n.at("prepend").get<std::string>() == kSpaceMarker) {
    p->prefix_every = true;
    return absl::OkStatus();
  }
  if (type == "Replace" && n.at("content").get<std::string>() == kSpaceMarker &&
      n.at("pattern").contains("String") && n.at("pattern").at("String").get<std::string>() == " ") {
    p->metaspace = true;
    return absl::OkStatus();
  }
  if (type == "NFC") {
    p->nfc = true;
    return absl::OkStatus();
  }
  // NFD, NFKC, lowercasing and the rest are not used by the supported families.
  return Unsupported(path, absl::StrCat("normalizer ", Quoted(type), " is not supported"));
}

// PCRE2 reads \Q...\E as a literal; a literal that contains \E is split around it.
std::string LiteralPattern(const std::string& s) {
  std::string out = "\\Q";
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\\E") == 0) {
      out += "\\E\\\\\\QE";
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out + "\\E";
}

absl::Status ReadPreTokenizer(const Json& t, const std::string& path, Pipeline* p) {
  if (t.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(t);
  if (type == "Sequence") {
    for (const Json& step : t.at("pretokenizers")) SG_RETURN_IF_ERROR(ReadPreTokenizer(step, path, p));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (t.value("add_prefix_space", false)) {
      return Unsupported(path, "ByteLevel pre-tokenizer with add_prefix_space is not supported");
    }
    p->byte_level = true;
    if (t.value("use_regex", true)) p->patterns.push_back(kGpt2Pattern);
    return absl::OkStatus();
  }
  if (type == "Split") {
    const std::string behavior = t.at("behavior").get<std::string>();
    if (behavior != "Isolated" || t.value("invert", false)) {
      return Unsupported(path, absl::StrCat("Split pre-tokenizer with behavior ", Quoted(behavior),
                                            t.value("invert", false) ? " inverted" : "",
                                            " is not supported (only Isolated)"));
    }
    const Json& pattern = t.at("pattern");
    if (pattern.contains("Regex")) {
      p->patterns.push_back(pattern.at("Regex").get<std::string>());
    } else {
      p->patterns.push_back(LiteralPattern(pattern.at("String").get<std::string>()));
    }
    return absl::OkStatus();
  }
  if (type == "Digits") {
    p->patterns.push_back(t.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    if (t.value("replacement", std::string(kSpaceMarker)) != kSpaceMarker) {
      return Unsupported(path, "Metaspace pre-tokenizer with a replacement other than U+2581");
    }
    p->metaspace = true;
    std::string scheme = t.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = t.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "first") {
      p->prefix_first = true;
    } else if (scheme != "never") {
      return Unsupported(path, absl::StrCat("Metaspace prepend_scheme ", Quoted(scheme),
                                            " is not supported (first, never)"));
    }
    // split: each ▁ starts a new piece.
    if (t.value("split", true)) p->patterns.push_back("\xE2\x96\x81[^\xE2\x96\x81]*|[^\xE2\x96\x81]+");
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("pre-tokenizer ", Quoted(type), " is not supported"));
}

absl::Status ReadDecoder(const Json& d, const std::string& path, Pipeline* p) {
  if (d.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(d);
  if (type == "Sequence") {
    for (const Json& step : d.at("decoders")) SG_RETURN_IF_ERROR(ReadDecoder(step, path, p));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    p->byte_level = true;
    return absl::OkStatus();
  }
  if (type == "ByteFallback" || type == "Fuse") return absl::OkStatus();
  if (type == "Replace") {
    if (d.at("content").get<std::string>() == " " && d.at("pattern").contains("String") &&
        d.at("pattern").at("String").get<std::string>() == kSpaceMarker) {
      return absl::OkStatus();
    }
    return Unsupported(path, "Replace decoder other than U+2581 → space");
  }
  if (type == "Strip") {
    // Compared as JSON numbers: a start of 1e30 is unequal, not a float-to-int conversion.
    if (d.at("content").get<std::string>() == " " && d.at("start") == Json(1) &&
        d.at("stop") == Json(0)) {
      p->decoder_strips = true;
      return absl::OkStatus();
    }
    return Unsupported(path, "Strip decoder other than one leading space");
  }
  if (type == "Metaspace") {
    p->decoder_strips = d.value("prepend_scheme", std::string("always")) != "never";
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("decoder ", Quoted(type), " is not supported"));
}

// bos / eos from the post-processor: tokens around the single sequence.
absl::Status ReadPostProcessor(const Json& pp, const std::string& path,
                               std::vector<std::string>* before, std::vector<std::string>* after) {
  if (pp.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(pp);
  if (type == "Sequence") {
    for (const Json& step : pp.at("processors")) {
      SG_RETURN_IF_ERROR(ReadPostProcessor(step, path, before, after));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const Json& piece : pp.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        (seen_sequence ? after : before)->push_back(piece.at("SpecialToken").at("id").get<std::string>());
      }
    }
    return absl::OkStatus();
  }
  return Unsupported(path, absl::StrCat("post-processor ", Quoted(type), " is not supported"));
}

// A token named in tokenizer_config.json: a string or an AddedToken object.
std::string TokenName(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

// The contents of a tokenizer folder's files, and the names they go by in messages.
struct TokenizerFiles {
  absl::string_view json;
  std::string json_path;
  std::optional<absl::string_view> config;  // tokenizer_config.json, when there is one
  std::string config_path;
  std::optional<absl::string_view> jinja;  // chat_template.jinja, when there is one
};

absl::Status ParseObject(absl::string_view text, const JsonLimits& limits,
                         const std::string& path, Json* out) {
  SG_RETURN_IF_ERROR(ParseBoundedJson(text, limits, path, out));
  if (!out->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenizerSpec> ParseTokenizerFiles(const TokenizerFiles& files) {
  const std::string& json_path = files.json_path;
  if (static_cast<int64_t>(files.json.size()) > kMaxTokenizerJsonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(json_path, " is ", files.json.size(),
                                                   " bytes, more than the ",
                                                   kMaxTokenizerJsonBytes, " a tokenizer needs"));
  }
  Json root;
  SG_RETURN_IF_ERROR(ParseObject(files.json, kTokenizerJsonLimits, json_path, &root));
  Json config = Json::object();
  if (files.config.has_value()) {
    SG_RETURN_IF_ERROR(
        ParseObject(*files.config, kTokenizerConfigLimits, files.config_path, &config));
  }

  const Json& model = root.at("model");
  if (TypeOf(model) != "BPE") {
    return Unsupported(json_path, absl::StrCat("model ", Quoted(TypeOf(model)),
                                               " is not supported (only BPE)"));
  }
  if (!model.value("dropout", Json()).is_null()) {
    return Unsupported(json_path, "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json v = model.value(key, Json());
    if (!v.is_null() && !v.get<std::string>().empty()) {
      return Unsupported(json_path, absl::StrCat("BPE ", key, " is not supported"));
    }
  }

  Pipeline p;
  SG_RETURN_IF_ERROR(ReadNormalizer(root.value("normalizer", Json()), json_path, &p));
  SG_RETURN_IF_ERROR(ReadPreTokenizer(root.value("pre_tokenizer", Json()), json_path, &p));
  SG_RETURN_IF_ERROR(ReadDecoder(root.value("decoder", Json()), json_path, &p));
  if (p.byte_level == p.metaspace) {
    return Unsupported(json_path, p.byte_level
        ? "mixes byte-level and SentencePiece steps"
        : "is neither byte-level BPE nor SentencePiece-style BPE (no ByteLevel or ▁ step)");
  }

  TokenizerSpec spec;
  spec.model = p.byte_level ? "gpt2" : "llama";
  spec.pre = "tokenizer.json";
  spec.pre_patterns = p.patterns;
  spec.normalize_nfc = p.nfc;
  spec.ignore_merges = model.value("ignore_merges", false);
  spec.byte_fallback = model.value("byte_fallback", false);
  if (p.byte_level && spec.byte_fallback) {
    return Unsupported(json_path, "byte fallback in a byte-level BPE is not supported");
  }
  if (!p.byte_level) {
    spec.space_prefix_every_piece = p.prefix_every;
    spec.add_space_prefix = p.prefix_first;
    if ((p.prefix_every || p.prefix_first) != p.decoder_strips) {
      return Unsupported(json_path, "the decoder's leading-space strip does not match the ▁ prefix");
    }
  }

  // The vocabulary and the added tokens, which may extend it.
  const Json& vocab = model.at("vocab");
  const Json added = root.value("added_tokens", Json::array());
  if (!vocab.is_object() || !added.is_array()) {
    return Unsupported(json_path, "the vocabulary is not an object or added_tokens not a list");
  }
  int64_t size = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    SG_ASSIGN_OR_RETURN(const int64_t id,
                        TokenIdOf(it.value(), json_path, absl::StrCat("token ", Quoted(it.key()))));
    size = std::max(size, id + 1);
  }
  for (const Json& a : added) {
    SG_ASSIGN_OR_RETURN(const int64_t id, TokenIdOf(a.at("id"), json_path, "an added token"));
    size = std::max(size, id + 1);
  }
  spec.tokens.assign(size, std::string());
  spec.token_types.assign(size, static_cast<int32_t>(TokenType::kNormal));
  std::vector<uint8_t> filled(size, 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();  // checked above
    spec.tokens[id] = it.key();
    filled[id] = 1;
    const std::string& t = spec.tokens[id];
    if (spec.byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
      spec.token_types[id] = static_cast<int32_t>(TokenType::kByte);
    }
  }
  for (const Json& a : added) {
    const int64_t id = a.at("id").get<int64_t>();
    const std::string content = a.at("content").get<std::string>();
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false)) {
      return Unsupported(json_path, absl::StrCat("added token ", Quoted(content),
                                                 " strips spaces or matches single words only, "
                                                 "which is not supported"));
    }
    if (filled[id] && spec.tokens[id] != content) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, ": added token ",
                                                     Quoted(content), " takes id ", id, " of ",
                                                     Quoted(spec.tokens[id])));
    }
    spec.tokens[id] = content;
    filled[id] = 1;
    spec.token_types[id] = static_cast<int32_t>(a.value("special", false) ? TokenType::kControl
                                                                          : TokenType::kUserDefined);
  }
  for (int64_t i = 0; i < size; ++i) {
    if (!filled[i]) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, ": no token has id ", i));
    }
  }

  for (const Json& m : model.at("merges")) {
    if (m.is_string()) {
      spec.merges.push_back(m.get<std::string>());
    } else {
      const std::string a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
      if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos || m.size() != 2) {
        return Unsupported(json_path, "a merge of tokens containing spaces is not supported");
      }
      spec.merges.push_back(absl::StrCat(a, " ", b));
    }
  }

  absl::flat_hash_map<std::string, int32_t> ids;
  for (int64_t i = 0; i < size; ++i) ids[spec.tokens[i]] = static_cast<int32_t>(i);
  auto id_of = [&](const std::string& name, const char* what, int32_t* out) -> absl::Status {
    if (name.empty()) return absl::OkStatus();
    auto it = ids.find(name);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, ": the ", what, " ", Quoted(name),
                                                     " is not a token"));
    }
    *out = it->second;
    return absl::OkStatus();
  };
  const Json unk = model.value("unk_token", Json());
  if (!unk.is_null()) SG_RETURN_IF_ERROR(id_of(unk.get<std::string>(), "unk_token", &spec.unk_id));
  SG_RETURN_IF_ERROR(id_of(TokenName(config, "bos_token"), "bos_token", &spec.bos_id));
  SG_RETURN_IF_ERROR(id_of(TokenName(config, "eos_token"), "eos_token", &spec.eos_id));
  SG_RETURN_IF_ERROR(id_of(TokenName(config, "pad_token"), "pad_token", &spec.pad_id));

  std::vector<std::string> before, after;
  SG_RETURN_IF_ERROR(ReadPostProcessor(root.value("post_processor", Json()), json_path, &before, &after));
  if (before.size() > 1 || after.size() > 1) {
    return Unsupported(json_path, "a post-processor adding more than one token on a side");
  }
  auto template_token = [&](const std::vector<std::string>& names, int32_t* id, bool* add,
                            const char* what) -> absl::Status {
    if (names.empty()) return absl::OkStatus();
    int32_t named = -1;
    SG_RETURN_IF_ERROR(id_of(names[0], what, &named));
    if (*id >= 0 && *id != named) {
      return Unsupported(json_path, absl::StrCat("the post-processor adds ", Quoted(names[0]),
                                                 ", which is not the ", what));
    }
    *id = named;
    *add = true;
    return absl::OkStatus();
  };
  SG_RETURN_IF_ERROR(template_token(before, &spec.bos_id, &spec.add_bos, "bos_token"));
  SG_RETURN_IF_ERROR(template_token(after, &spec.eos_id, &spec.add_eos, "eos_token"));
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    spec.add_bos = config["add_bos_token"].get<bool>();
  }
  if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) {
    spec.add_eos = config["add_eos_token"].get<bool>();
  }

  // The chat template: tokenizer_config.json, or chat_template.jinja beside it.
  if (config.contains("chat_template")) {
    const Json& ct = config["chat_template"];
    if (ct.is_string()) {
      spec.chat_template = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const Json& named : ct) {
        if (named.value("name", std::string()) == "default") spec.chat_template = named.value("template", std::string());
      }
    }
  }
  if (spec.chat_template.empty() && files.jinja.has_value()) {
    spec.chat_template = std::string(*files.jinja);
  }
  return spec;
}

// ParseTokenizerFiles, with what nlohmann throws on content of the wrong shape (a string
// where a list belongs) turned into a message naming the file.
absl::StatusOr<TokenizerSpec> Guarded(const std::string& json_path,
                                      const TokenizerFiles& files) {
  try {
    return ParseTokenizerFiles(files);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(json_path, ": unexpected content: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(json_path, ": out of memory reading it"));
  }
}

}  // namespace

absl::StatusOr<TokenizerSpec> Tokenizer::SpecFromTokenizerJson(const std::string& path) {
  std::string json_path = path, folder;
  if (IsDirectory(path)) {
    folder = path;
    json_path = path + "/tokenizer.json";
  } else {
    const size_t slash = path.rfind('/');
    folder = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  // Refused by size before a byte is read.
  SG_ASSIGN_OR_RETURN(const std::string text,
                      ReadSmallFile(json_path, kMaxTokenizerJsonBytes, "tokenizer file"));
  TokenizerFiles files{.json = text, .json_path = json_path};
  std::string config_text, jinja_text;
  files.config_path = folder + "/tokenizer_config.json";
  if (Exists(files.config_path)) {
    SG_ASSIGN_OR_RETURN(config_text, ReadSmallFile(files.config_path, kMaxTokenizerConfigBytes,
                                                   "tokenizer config"));
    files.config = config_text;
  }
  const std::string jinja_path = folder + "/chat_template.jinja";
  if (Exists(jinja_path)) {
    SG_ASSIGN_OR_RETURN(jinja_text,
                        ReadSmallFile(jinja_path, kMaxTokenizerConfigBytes, "chat template"));
    files.jinja = jinja_text;
  }
  return Guarded(json_path, files);
}

absl::StatusOr<TokenizerSpec> Tokenizer::SpecFromTokenizerJsonText(
    absl::string_view tokenizer_json, std::optional<absl::string_view> tokenizer_config,
    std::optional<absl::string_view> chat_template, absl::string_view source) {
  TokenizerFiles files{.json = tokenizer_json,
                       .json_path = absl::StrCat(source, "/tokenizer.json"),
                       .config = tokenizer_config,
                       .config_path = absl::StrCat(source, "/tokenizer_config.json")};
  if (chat_template.has_value() && chat_template->size() > kMaxTokenizerConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, "/chat_template.jinja is ",
                                                   chat_template->size(), " bytes, more than the ",
                                                   kMaxTokenizerConfigBytes, " allowed"));
  }
  if (tokenizer_config.has_value() && tokenizer_config->size() > kMaxTokenizerConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(files.config_path, " is ",
                                                   tokenizer_config->size(),
                                                   " bytes, more than the ",
                                                   kMaxTokenizerConfigBytes, " allowed"));
  }
  files.jinja = chat_template;
  return Guarded(files.json_path, files);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(const std::string& path) {
  SG_ASSIGN_OR_RETURN(TokenizerSpec spec, SpecFromTokenizerJson(path));
  return Create(std::move(spec));
}

}  // namespace sg
