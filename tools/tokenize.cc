// `stepgraph tokenize`: the ids of a text with the model's tokenizer, or the text of ids.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/model_setup.h"

namespace sg::cli {

int TokenizeCommand(const Options& o) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = ModelTokenizer(o, "tokenize");
  if (!tok.ok()) return ModelFailure(o, tok.status(), ModelPart::kTokenizer);
  if (o.decode.has_value()) {
    for (int32_t id : *o.decode) {
      if (id >= (*tok)->vocab_size()) {
        return UsageFailure(absl::StrCat("--decode: id ", id, " is outside the vocabulary [0, ",
                                         (*tok)->vocab_size(), ")"),
                            kTokenize);
      }
    }
    absl::StatusOr<std::string> decoded = (*tok)->Decode(*o.decode);
    if (!decoded.ok()) return Failure(decoded.status(), HelpHint(kTokenize));
    std::printf("%s\n", decoded->c_str());
    return kExitOk;
  }
  absl::StatusOr<std::string> input =
      o.text.has_value() ? absl::StatusOr<std::string>(*o.text) : ReadStdin("tokenize");
  if (!input.ok()) return Failure(input.status(), HelpHint(kTokenize));
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(*input);
  if (!ids.ok()) return Failure(ids.status(), HelpHint(kTokenize));
  std::printf("%s\n", absl::StrJoin(*ids, ",").c_str());
  return kExitOk;
}

}  // namespace sg::cli
