// libFuzzer harness for the chat template interpreter: the input is a template, parsed
// and rendered with a fixed conversation (system, user, assistant, user; a generation
// prompt) and the globals transformers gives. An error or a text, never a crash, leak or
// hang; the text never passes the output bound. The bounds are those of a render, made
// smaller so that each input runs quickly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>

#include "text/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sg::jinja::Dict;
  using sg::jinja::List;
  using sg::jinja::Value;
  sg::jinja::Limits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = size_t{1} << 20;
  absl::StatusOr<sg::jinja::Template> t = sg::jinja::Template::Parse(
      absl::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!t.ok()) return 0;
  List messages;
  const char* turns[][2] = {{"system", " Be brief.\n"},
                            {"user", "Hi <b>'\"\\"},
                            {"assistant", "<think>x</think>Hello"},
                            {"user", "  And?  "}};
  for (const auto& turn : turns) {
    Dict m;
    m.Set("role", Value(turn[0]));
    m.Set("content", Value(turn[1]));
    messages.emplace_back(std::move(m));
  }
  Dict vars;
  vars.Set("messages", Value(std::move(messages)));
  vars.Set("add_generation_prompt", Value(true));
  vars.Set("bos_token", Value("<s>"));
  vars.Set("eos_token", Value("</s>"));
  sg::jinja::Environment env;
  env.now = std::tm{};
  absl::StatusOr<std::string> text = t->Render(vars, env);
  if (text.ok() && text->size() > limits.max_output_bytes) std::abort();
  return 0;
}
