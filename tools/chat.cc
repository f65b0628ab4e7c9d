// `stepgraph chat`: a conversation with the model in one slot whose KV cache keeps it from
// turn to turn: the first turn is prefilled, each later one appended to the slot
// (DecodeSession::Append), so a turn costs only its own tokens. Answers stream as they are
// made; /reset, /stats and /exit are commands; Ctrl-C stops the answer being written and
// keeps the conversation. Without --model the built-in model talks in token ids.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/conversation.h"
#include "tools/model_setup.h"
#include "tools/stop_matcher.h"

namespace sg::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
// The handler also writes a byte here, so that a wait for input wakes up even when Ctrl-C
// comes just before it begins (a flag alone would be seen only after the next line).
int g_interrupt_pipe[2] = {-1, -1};

void OnInterrupt(int) {
  g_interrupted = 1;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = write(g_interrupt_pipe[1], &byte, 1);  // full: already woken
}

// Forgets a Ctrl-C that was seen (or that came when nothing waited for it).
void ClearInterrupt() {
  char bytes[64];
  while (read(g_interrupt_pipe[0], bytes, sizeof(bytes)) > 0) {
  }
  g_interrupted = 0;
}

// While the chat runs, Ctrl-C (SIGINT) sets g_interrupted and wakes the wait for input
// instead of ending the program. Other calls restart: only the wait needs waking, and it
// watches the pipe.
class InterruptHandler {
 public:
  absl::Status Install() {
    if (pipe2(g_interrupt_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("chat: pipe2: ", std::strerror(errno)));
    }
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_);
    installed_ = true;
    return absl::OkStatus();
  }
  ~InterruptHandler() {
    if (!installed_) return;
    sigaction(SIGINT, &old_, nullptr);
    close(g_interrupt_pipe[0]);
    close(g_interrupt_pipe[1]);
  }

 private:
  bool installed_ = false;
  struct sigaction old_ {};
};

// A turn longer than this is refused unread: far more than any KV cache holds.
constexpr size_t kMaxTurnBytes = size_t{1} << 20;

enum class ReadResult { kTurn, kEnd, kInterrupted, kTooLong };

// User turns from standard input, read with a wait that Ctrl-C interrupts.
class TurnReader {
 public:
  // The next turn: a line, or lines each but the last ending in a backslash (kept as
  // newlines), without the newline that ends it.
  ReadResult Next(std::string* turn) {
    turn->clear();
    bool too_long = false;
    for (;;) {
      const size_t newline = buffer_.find('\n');
      if (newline == std::string::npos) {
        if (buffer_.size() > kMaxTurnBytes) {  // keep nothing of it, read on to its end
          too_long = true;
          buffer_.clear();
        }
        if (eof_) {
          const bool nothing = buffer_.empty() && turn->empty();
          *turn += buffer_;
          buffer_.clear();
          if (too_long) return ReadResult::kTooLong;
          return nothing ? ReadResult::kEnd : ReadResult::kTurn;
        }
        if (!Fill()) return ReadResult::kInterrupted;
        continue;
      }
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (too_long || turn->size() + line.size() > kMaxTurnBytes) {
        turn->clear();
        return ReadResult::kTooLong;
      }
      if (absl::EndsWith(line, "\r")) line.pop_back();
      *turn += line;
      if (!absl::EndsWith(*turn, "\\")) return ReadResult::kTurn;
      turn->back() = '\n';
    }
  }

 private:
  // Waits for input or Ctrl-C; false for Ctrl-C.
  bool Fill() {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {g_interrupt_pipe[0], POLLIN, 0}};
    for (;;) {
      if (g_interrupted) return false;
      const int ready = poll(fds, 2, -1);
      if (ready < 0 && errno == EINTR) continue;
      if (fds[1].revents != 0 || g_interrupted) return false;
      if (ready < 0) {
        eof_ = true;
        return true;
      }
      char chunk[4096];
      const ssize_t n = read(STDIN_FILENO, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
      } else {
        buffer_.append(chunk, static_cast<size_t>(n));
      }
      return true;
    }
  }

  std::string buffer_;
  bool eof_ = false;
};

enum class Ending { kEndOfTurn, kEndOfSequence, kStopString, kLimit, kInterrupted, kFull };

absl::string_view EndingName(Ending e) {
  switch (e) {
    case Ending::kEndOfTurn:
      return "the model ended its turn";
    case Ending::kEndOfSequence:
      return "the model ended the sequence";
    case Ending::kStopString:
      return "ended at a --stop string";
    case Ending::kLimit:
      return "cut at --max-new-tokens";
    case Ending::kInterrupted:
      return "stopped by Ctrl-C";
    case Ending::kFull:
      return "the KV cache is full";
  }
  return "";
}

struct AnswerStats {
  int64_t turn_tokens = 0;  // the tokens the turn prefilled (the new turn only)
  double prefill_ms = 0;
  int64_t tokens = 0;  // of the answer, its end not counted
  int64_t steps = 0;   // decode steps, the one that ended it included
  double ttft_ms = 0;
  double decode_ms = 0;  // of the steps after the first
  Ending ending = Ending::kLimit;
  int64_t position = 0;  // positions the conversation holds after the answer
  int64_t max_seq = 0;
};

void PrintStats(const AnswerStats& a) {
  const int64_t after_first = std::max<int64_t>(a.steps - 1, 0);
  const double ms_per_token = after_first > 0 ? a.decode_ms / static_cast<double>(after_first) : 0;
  std::fprintf(stderr,
               "stepgraph: answer: %lld tokens made (%s); %.3f ms/token (%.1f tokens/s) after the "
               "first; prefill: the turn's %lld tokens in %.1f ms (%.0f tokens/s); time to first "
               "token %.1f ms; the conversation holds %lld of %lld positions\n",
               static_cast<long long>(a.tokens), std::string(EndingName(a.ending)).c_str(),
               ms_per_token, ms_per_token > 0 ? 1e3 / ms_per_token : 0.0,
               static_cast<long long>(a.turn_tokens), a.prefill_ms,
               a.prefill_ms > 0 ? 1e3 * static_cast<double>(a.turn_tokens) / a.prefill_ms : 0.0,
               a.ttft_ms, static_cast<long long>(a.position), static_cast<long long>(a.max_seq));
}

// The conversation's state and what it needs to speak.
struct Chat {
  const Options& options;
  DecodeSession& session;
  const Tokenizer* tokenizer = nullptr;  // null: the built-in model, in ids
  std::optional<Conversation> conversation;
  std::optional<SlotSampling> sampling;  // with penalties only: the slot's, and the sampling
  std::vector<int32_t> stop;
  int32_t end_of_turn = -1;
  bool started = false;  // slot 0 holds a conversation
  bool closed = true;    // its last answer ended with the end of turn
};

// Feeds the turn's tokens (Prefill for the first, Append after), then generates and
// prints the answer until a stop id, a stop string, the token limit, Ctrl-C or a full KV
// cache. A stop string is not printed, yet the conversation keeps the tokens that made it
// (the KV cache holds them): the next turn follows what the model wrote.
absl::StatusOr<AnswerStats> Answer(Chat& c, const std::vector<int32_t>& turn) {
  DecodeSession& s = c.session;
  AnswerStats a;
  a.turn_tokens = static_cast<int64_t>(turn.size());
  a.max_seq = s.max_seq();
  ClearInterrupt();
  const Clock::time_point start = Clock::now();
  if (c.started) {
    SG_RETURN_IF_ERROR(AppendShowingProgress(s, 0, turn));
  } else {
    const PrefillRequest r{0, turn, c.options.seed, c.sampling};
    SG_RETURN_IF_ERROR(PrefillShowingProgress(s, absl::MakeConstSpan(&r, 1)));
    c.started = true;
  }
  SG_RETURN_IF_ERROR(s.runner().Sync());
  a.prefill_ms = MsSince(start);

  std::optional<TokenStreamDecoder> stream;
  if (c.tokenizer != nullptr) stream.emplace(*c.tokenizer, DecodeOptions{.skip_special = true});
  StopMatcher matcher(c.options.stop);
  Clock::time_point t0 = start;
  for (;;) {
    if (g_interrupted) {
      a.ending = Ending::kInterrupted;
      break;
    }
    if (c.options.answer_tokens > 0 && a.tokens >= c.options.answer_tokens) {
      a.ending = Ending::kLimit;
      break;
    }
    if (s.position(0) + 1 > s.max_seq()) {
      a.ending = Ending::kFull;
      break;
    }
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> got, s.Generate(0, 1));
    if (a.steps++ == 0) {
      a.ttft_ms = MsSince(start);
      t0 = Clock::now();
    }
    const int32_t id = got[0];
    if (std::find(c.stop.begin(), c.stop.end(), id) != c.stop.end()) {
      a.ending = id == c.end_of_turn ? Ending::kEndOfTurn : Ending::kEndOfSequence;
      break;
    }
    ++a.tokens;
    if (stream.has_value()) {
      SG_ASSIGN_OR_RETURN(std::string piece, stream->Push(id));
      std::fputs(matcher.Push(piece).c_str(), stdout);
    } else {
      std::printf("%s%d", a.tokens > 1 ? "," : "", id);
    }
    std::fflush(stdout);
    if (matcher.stopped()) {
      a.ending = Ending::kStopString;
      break;
    }
  }
  if (a.steps > 0) a.decode_ms = MsSince(t0);
  ClearInterrupt();  // it stopped this answer, or came as it ended: not the next read's
  std::string rest;
  if (stream.has_value()) {
    rest = matcher.Push(stream->Finish());
    if (!matcher.stopped()) rest += matcher.Finish();
  }
  std::printf("%s\n", rest.c_str());
  std::fflush(stdout);
  c.closed = a.ending == Ending::kEndOfTurn;
  a.position = s.position(0);
  return a;
}

// The tokens of a user turn: the template's text (the whole start, or what follows the
// last answer), or for the built-in model the ids the line lists.
absl::StatusOr<std::vector<int32_t>> TurnTokens(const Chat& c, const std::string& line) {
  if (c.tokenizer == nullptr) {
    SG_ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                        ParseIntList(line, 0, c.session.config().vocab_size - 1));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  SG_ASSIGN_OR_RETURN(const std::string text, c.started
                                                   ? c.conversation->NextOrError(line, c.closed)
                                                   : c.conversation->StartOrError(line));
  return c.tokenizer->Encode(text, {.add_special = false});
}

void Note(absl::string_view text) {
  std::fprintf(stderr, "stepgraph: %s\n", std::string(text).c_str());
}

// A line starting with '/' other than /exit.
absl::Status SlashCommand(Chat& c, const std::string& line,
                          const std::optional<AnswerStats>& last) {
  if (line == "/reset") {
    if (c.started) SG_RETURN_IF_ERROR(c.session.Release(0));
    c.started = false;
    c.closed = true;
    Note("a new conversation");
  } else if (line == "/stats") {
    if (last.has_value()) {
      PrintStats(*last);
    } else {
      Note("no answer yet");
    }
  } else {
    Note(absl::StrCat("unknown command '", line, "' (/reset, /stats, /exit)"));
  }
  return absl::OkStatus();
}

}  // namespace

int ChatCommand(const Options& o) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<Conversation> conversation;
  if (!o.model.empty()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = ModelTokenizer(o, "chat");
    if (!tok.ok()) return ModelFailure(o, tok.status(), ModelPart::kTokenizer);
    tokenizer = *std::move(tok);
    absl::StatusOr<Conversation> conv = Conversation::ForTokenizer(*tokenizer, o.system);
    if (!conv.ok()) {
      return Failure(conv.status(),
                     "chat follows a model's chat template (docs/chat_templates.md); "
                     "'stepgraph run --prompt' takes plain text");
    }
    conversation = *std::move(conv);
  }
  const int64_t max_seq =
      o.max_seq > 0 ? o.max_seq : std::min<int64_t>(config->max_position_embeddings, 4096);
  if (absl::Status st = CheckPenaltyFlags(o.penalties, config->vocab_size); !st.ok()) {
    return UsageFailure(st.message(), kChat);
  }
  std::optional<ops::Sample> sampling;
  if (o.temperature > 0.0f) sampling = ops::Sample{o.temperature, o.top_k, o.top_p};
  // Penalties cost a GPU step its fused argmax: the session has them only when asked.
  const bool penalize = !o.penalties.neutral();
  absl::StatusOr<std::unique_ptr<DecodeSession>> made =
      MakeSession(o, 1, max_seq, sampling, o.eager, penalize);
  if (!made.ok()) return ModelFailure(o, made.status());
  DecodeSession& s = **made;

  Chat chat{.options = o, .session = s, .tokenizer = tokenizer.get()};
  chat.conversation = std::move(conversation);
  if (penalize) chat.sampling = SlotSampling{sampling, o.penalties};
  if (chat.conversation.has_value()) {
    chat.stop = s.stop_ids();
    chat.end_of_turn = tokenizer->TokenId(chat.conversation->end_of_turn());
    if (chat.end_of_turn >= 0) chat.stop.push_back(chat.end_of_turn);
  }
  InterruptHandler interrupts;
  if (absl::Status st = interrupts.Install(); !st.ok()) return Failure(st, HelpHint(kChat));
  TurnReader reader;
  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty) {
    Note(absl::StrCat(chat.tokenizer != nullptr ? "type a message" : "type token ids (1,2,3)",
                      "; /reset starts over, /stats shows the speed of the last answer, /exit "
                      "(or Ctrl-D) leaves; Ctrl-C stops an answer"));
  }
  std::optional<AnswerStats> last;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    const ReadResult got = reader.Next(&line);
    if (got == ReadResult::kEnd) break;
    if (got == ReadResult::kInterrupted) {
      ClearInterrupt();
      std::fputs("\n", stdout);
      Note("/exit or Ctrl-D leaves");
      continue;
    }
    if (got == ReadResult::kTooLong) {
      Note("a turn of more than 1 MiB is not sent");
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '/') {
      if (line == "/exit" || line == "/quit") break;
      if (absl::Status st = SlashCommand(chat, line, last); !st.ok()) {
        return Failure(st, HelpHint(kChat));
      }
      continue;
    }
    absl::StatusOr<std::vector<int32_t>> turn = TurnTokens(chat, line);
    if (!turn.ok()) {
      Note(absl::StrCat("the turn is not sent: ", turn.status().message()));
      continue;
    }
    // The turn's last token must find a place, as must the answer's first.
    const int64_t held = chat.started ? s.position(0) : 0;
    const int64_t room = chat.started ? s.max_seq() - 1 - held : s.max_seq();
    if (turn->empty() || static_cast<int64_t>(turn->size()) > room) {
      Note(absl::StrCat("the turn (", turn->size(), " tokens) does not fit the KV cache: the "
                        "conversation holds ", held, " of ", s.max_seq(),
                        " positions; /reset starts a new one, --max-seq gives more"));
      continue;
    }
    absl::StatusOr<AnswerStats> answer = Answer(chat, *turn);
    if (!answer.ok()) return Failure(answer.status(), HelpHint(kChat));
    last = *answer;
    if (o.verbose) PrintStats(*last);
    if (last->ending == Ending::kInterrupted) Note("stopped");
    if (last->ending == Ending::kFull) {
      Note("the conversation fills the KV cache: /reset starts a new one");
    }
  }
  if (tty) std::fputs("\n", stdout);
  return kExitOk;
}

}  // namespace sg::cli
