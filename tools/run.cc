// `stepgraph run`: feeds a prompt (ids, or text from --prompt, --file or standard input),
// generates tokens, prints them (text as it is made) and a last line with the tokens
// made, ms/token and tokens/s, the prefill rate and the time to first token.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stepgraph/base/status.h"
#include "stepgraph/text/chat_template.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/model_setup.h"
#include "tools/stop_matcher.h"

namespace sg::cli {
namespace {

constexpr char kChatNeedsText[] =
    "--chat wraps a text prompt: give --prompt TEXT, --file PATH or the text on standard "
    "input, with a --model that has a tokenizer";

// The text prompt and where it came from, or none for ids. A pipe or file on standard
// input is the prompt when none is given (with a model, whose tokenizer it needs).
struct PromptSource {
  std::optional<std::string> text;
  std::string flag;  // "--prompt", "--file", "standard input": for errors
};

absl::StatusOr<PromptSource> ReadPromptText(const Options& o) {
  PromptSource p;
  if (o.prompt_text.has_value() && *o.prompt_text != "-") {
    p.flag = "--prompt";
    p.text = *o.prompt_text;
    return p;
  }
  if (o.prompt_file.has_value()) {
    p.flag = "--file";
    SG_ASSIGN_OR_RETURN(p.text, ReadTextFile(*o.prompt_file, "--file"));
  } else if (o.prompt_text.has_value() ||
             (!o.prompt_ids_given && !o.model.empty() && StdinIsPipeOrFile())) {
    p.flag = "the prompt on standard input";
    SG_ASSIGN_OR_RETURN(p.text, ReadStdin(p.flag));
  } else {
    return p;
  }
  // The newline that ends the last line (echo writes one) is not part of the prompt.
  if (absl::EndsWith(*p.text, "\n")) p.text->pop_back();
  if (absl::EndsWith(*p.text, "\r")) p.text->pop_back();
  return p;
}

// A text prompt encoded: its ids, the tokenizer that prints the answer and, for --chat,
// the end-of-turn id to stop at.
struct TextPrompt {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> ids;
  int32_t end_of_turn = -1;
};

absl::StatusOr<TextPrompt> EncodePrompt(const Options& o, const PromptSource& source) {
  TextPrompt p;
  SG_ASSIGN_OR_RETURN(p.tokenizer, ModelTokenizer(o, source.flag));
  if (o.chat) {
    SG_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::ForTokenizer(*p.tokenizer));
    // The rendered turn carries its own special tokens.
    SG_ASSIGN_OR_RETURN(const std::string turn, chat.Render({{"user", *source.text}}, true));
    SG_ASSIGN_OR_RETURN(p.ids, p.tokenizer->Encode(turn, {.add_special = false}));
    if (!chat.end_of_turn().empty()) p.end_of_turn = p.tokenizer->TokenId(chat.end_of_turn());
  } else {
    SG_ASSIGN_OR_RETURN(p.ids, p.tokenizer->Encode(*source.text));
  }
  if (p.ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source.flag, ": the text encodes to no ids"));
  }
  return p;
}

absl::Status PrefillAll(DecodeSession& s, const std::vector<int32_t>& prompt, int64_t batch,
                        int32_t seed, const std::optional<SlotSampling>& sampling) {
  std::vector<PrefillRequest> requests;
  for (int64_t b = 0; b < batch; ++b) {
    // Sequence b's seed is seed + b, wrapping around (every i32 is a valid seed).
    const int32_t seed_b =
        static_cast<int32_t>(static_cast<uint32_t>(seed) + static_cast<uint32_t>(b));
    requests.push_back({b, prompt, seed_b, sampling});
  }
  return PrefillShowingProgress(s, requests);
}

// A text answer: decoded as its ids come, with the stop strings matched on the text.
struct TextAnswer {
  TokenStreamDecoder decoder;
  StopMatcher matcher;
  std::string text;  // what is not printed yet
};

}  // namespace

int RunCommand(const Options& o) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  absl::StatusOr<PromptSource> source = ReadPromptText(o);
  if (!source.ok()) return Failure(source.status(), HelpHint(kRun));
  if (o.chat && !source->text.has_value()) return UsageFailure(kChatNeedsText, kRun);
  if (!o.stop.empty() && !source->text.has_value()) return UsageFailure(kStopNeedsText, kRun);
  if (source->text.has_value() && source->text->empty()) {
    return UsageFailure(absl::StrCat(source->flag, ": the prompt is empty"), kRun);
  }
  std::vector<int32_t> prompt = o.prompt_ids;
  std::optional<TextPrompt> text;
  if (source->text.has_value()) {
    absl::StatusOr<TextPrompt> encoded = EncodePrompt(o, *source);
    if (!encoded.ok()) return ModelFailure(o, encoded.status(), ModelPart::kTokenizer);
    text = *std::move(encoded);
    prompt = text->ids;
  }
  for (int32_t id : prompt) {
    if (id >= config->vocab_size) {
      return UsageFailure(absl::StrCat(text ? "--prompt: the tokenizer gave id "
                                            : "--prompt-ids: id ",
                                       id, " is outside the model's vocabulary [0, ",
                                       config->vocab_size, ")"),
                          kRun);
    }
  }
  const int64_t need = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
  if (o.max_seq == 0 && need > config->max_position_embeddings) {
    return UsageFailure(absl::StrCat("the prompt (", prompt.size(), " ids) plus --max-new-tokens (",
                                     o.max_new_tokens, ") exceed the model's ",
                                     "max_position_embeddings (", config->max_position_embeddings,
                                     ")"),
                        kRun);
  }
  if (absl::Status st = CheckPenaltyFlags(o.penalties, config->vocab_size); !st.ok()) {
    return UsageFailure(st.message(), kRun);
  }
  std::optional<ops::Sample> sampling;
  if (o.temperature > 0.0f) sampling = ops::Sample{o.temperature, o.top_k, o.top_p};
  // Penalties cost a GPU step its fused argmax: the session has them only when asked.
  const bool penalize = !o.penalties.neutral();
  std::optional<SlotSampling> slot_sampling;
  if (penalize) slot_sampling = SlotSampling{sampling, o.penalties};

  absl::StatusOr<std::unique_ptr<DecodeSession>> made = MakeSession(
      o, o.batch, o.max_seq > 0 ? o.max_seq : need, sampling, o.eager, penalize);
  if (!made.ok()) return ModelFailure(o, made.status());
  DecodeSession& s = **made;
  const std::string hint = HelpHint(kRun);

  // Text generation ends at the model's end of sequence (and the chat's end of turn).
  std::vector<int32_t> stop;
  if (text.has_value() && !o.ignore_eos) {
    stop = s.stop_ids();
    if (text->end_of_turn >= 0) stop.push_back(text->end_of_turn);
  }
  auto is_stop = [&](int32_t id) { return std::find(stop.begin(), stop.end(), id) != stop.end(); };

  // Time to first token: every prompt's prefill steps, then the first decode step (which
  // feeds each prompt's last token and yields the first new id).
  const Clock::time_point start = Clock::now();
  if (absl::Status st = PrefillAll(s, prompt, o.batch, o.seed, slot_sampling); !st.ok()) {
    return Failure(st, hint);
  }
  absl::StatusOr<std::vector<int32_t>> ready = s.Tokens(0);  // waits for the prefill
  if (!ready.ok()) return Failure(ready.status(), hint);
  const double prefill_ms = MsSince(start);

  // Generation in chunks: the session waits for the device once per chunk, and the text
  // of a single sequence is printed as its chunk arrives (several: at the end). A sequence
  // ends at a stop id or where a stop string completes.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(o.batch));
  std::vector<bool> ended(static_cast<size_t>(o.batch), false);
  std::vector<TextAnswer> answers;
  if (text.has_value()) {
    answers.reserve(static_cast<size_t>(o.batch));
    for (int64_t b = 0; b < o.batch; ++b) {
      answers.push_back({TokenStreamDecoder(*text->tokenizer, {.skip_special = true}),
                         StopMatcher(o.stop), ""});
    }
  }
  const bool live = text.has_value() && o.batch == 1;
  // On the device loop a chunk is one launch, which stops on the device once every
  // sequence produced a stop id.
  const int64_t chunk = o.device_loop > 0 ? o.device_loop
                        : s.backend() == Backend::kCpu ? 1
                                                       : (live ? 8 : 64);
  const bool stop_on_device =
      o.device_loop > 0 && !stop.empty() && stop.size() <= StepRunner::kMaxLoopStopIds;
  Progress progress("generated", o.max_new_tokens * o.batch, "tokens");
  int64_t steps = 0;
  double ttft_ms = 0;
  Clock::time_point t0 = Clock::now();
  while (steps < o.max_new_tokens) {
    // The first step alone, for the time to first token; then chunks.
    const int64_t k = steps == 0 ? 1 : std::min(chunk, o.max_new_tokens - steps);
    absl::StatusOr<std::vector<std::vector<int32_t>>> got =
        stop_on_device ? s.Generate(k, stop) : s.Generate(k);
    if (!got.ok()) return Failure(got.status(), hint);
    if (steps == 0) {
      ttft_ms = MsSince(start);
      t0 = Clock::now();
    }
    // The steps run: k, or fewer where every sequence stopped on the device.
    steps += got->empty() ? k : static_cast<int64_t>((*got)[0].size());
    for (int64_t b = 0; b < o.batch; ++b) {
      for (int32_t id : (*got)[b]) {
        if (ended[b]) break;
        if (is_stop(id)) {
          ended[b] = true;
          break;
        }
        ids[b].push_back(id);
        if (answers.empty()) continue;
        TextAnswer& a = answers[static_cast<size_t>(b)];
        absl::StatusOr<std::string> piece = a.decoder.Push(id);
        if (!piece.ok()) return Failure(piece.status(), hint);
        a.text += a.matcher.Push(*piece);
        if (live) {
          std::fputs(a.text.c_str(), stdout);
          std::fflush(stdout);
          a.text.clear();
        }
        if (a.matcher.stopped()) {
          ended[b] = true;
          break;
        }
      }
    }
    if (!live) progress.Update(steps * o.batch);
    if (std::all_of(ended.begin(), ended.end(), [](bool e) { return e; })) break;
  }
  progress.Done();
  const double gen_ms = MsSince(t0);

  int64_t made_tokens = 0;
  for (int64_t b = 0; b < o.batch; ++b) {
    made_tokens += static_cast<int64_t>(ids[b].size());
  }
  for (TextAnswer& a : answers) {
    // The last bytes held, and what was held for a stop string that never completed.
    a.text += a.matcher.Push(a.decoder.Finish());
    if (!a.matcher.stopped()) a.text += a.matcher.Finish();
  }
  if (live) {
    std::printf("%s\n", answers[0].text.c_str());
    std::fflush(stdout);
  } else {
    for (int64_t b = 0; b < o.batch; ++b) {
      const std::string shown =
          answers.empty() ? absl::StrJoin(ids[b], ",") : answers[static_cast<size_t>(b)].text;
      if (o.batch == 1) {
        std::printf("generated: %s\n", shown.c_str());
      } else {
        std::printf("sequence %lld: %s\n", static_cast<long long>(b), shown.c_str());
      }
    }
  }
  // The decode speed is that of the steps after the first (whose time is the time to
  // first token's), whatever a stop id left unprinted.
  const int64_t n = std::max<int64_t>(steps - 1, 0);
  const double ms_per_step = n > 0 ? gen_ms / static_cast<double>(n) : 0;
  const double tokens_per_s = gen_ms > 0 ? 1e3 * static_cast<double>(n * o.batch) / gen_ms : 0;
  // Tokens the prefill steps fed: all but each prompt's last.
  const double prefill_tokens =
      static_cast<double>(prompt.size() - 1) * static_cast<double>(o.batch);
  const std::string made_line =
      o.batch == 1 ? absl::StrCat(made_tokens, " tokens made")
                   : absl::StrCat(made_tokens, " tokens made (", o.batch, " sequences)");
  const std::string path = s.backend() == Backend::kCpu ? "on the CPU reference"
                           : s.eager()                  ? "eager"
                                                        : "replayed";
  // The timing goes to stderr when text is printed, so that stdout holds only the text.
  std::fprintf(text.has_value() ? stderr : stdout,
               "timing: %s; %.3f ms/token %s (%.1f tokens/s) after the first; prefill %zu "
               "tokens x %lld in %.1f ms (%.0f tokens/s, %lld steps); time to first token "
               "%.1f ms\n",
               made_line.c_str(), ms_per_step, path.c_str(), tokens_per_s, prompt.size(),
               static_cast<long long>(o.batch), prefill_ms,
               prefill_ms > 0 ? 1e3 * prefill_tokens / prefill_ms : 0.0,
               static_cast<long long>(s.prefill_steps()), ttft_ms);
  return kExitOk;
}

}  // namespace sg::cli
