// The C ABI of stepgraph's decode sessions (library stepgraph_session_c,
// libstepgraph_session_c.so): load a model, then prefill slots with token ids, generate ids
// and read logits, and turn text into ids and back with the model's tokenizer, through an
// opaque handle. It wraps the C++ DecodeSession (stepgraph/runtime/session.h) and Tokenizer
// (stepgraph/text/tokenizer.h); C99 and C++, nothing but C types. Like c_api.h, this header is the
// one list of its functions: the build reads the declarations (see c_api.h) for the export
// check and the bindings' signature checks.
//
// Conventions:
//   - Return codes are c_api.h's and one of this header's: STEPGRAPH_OK;
//     STEPGRAPH_ERROR_INVALID_VALUE for a bad argument (NULL, a slot out of range, a token
//     id outside the vocabulary, a prompt longer than max_seq, a path that is not a model,
//     text that is not UTF-8) or a call the session's state does not allow (logits of a
//     slot that did not run); STEPGRAPH_ERROR_NO_CUDA when the CUDA backend was asked for
//     where it cannot run (a build without CUDA, no device); STEPGRAPH_ERROR_OUT_OF_MEMORY;
//     STEPGRAPH_ERROR_LAUNCH_FAILED for a failure while running (a CUDA error, an error flag
//     raised on the device); STEPGRAPH_ERROR_NO_TOKENIZER for a text function on a model
//     without a tokenizer.
//   - Every failure on a handle leaves a message naming what was wrong, readable with
//     stepgraph_session_error until the next call on that handle; a success clears it.
//   - A build without CUDA has the same functions: the arguments are checked the same, and
//     sessions run on the CPU reference (STEPGRAPH_BACKEND_AUTO picks it there).
//   - No C++ exception and no abort crosses these functions.
//   - A handle is used by one thread at a time (it holds the session's buffers and the
//     last error); distinct handles are independent. The Python binding serialises its
//     calls with a lock; the Rust Session is Send but not Sync.
//   - Weights are mapped from the model's files, not copied: a file truncated while a
//     session has it open (rewritten in place) makes the next read past its new end raise
//     SIGBUS, as with any mmap loader. Replace model files by renaming a new file over
//     them (docs/hostile_input.md).
//
// Text: stepgraph_session_encode and stepgraph_session_decode turn UTF-8 text into token ids
// and back with the model's tokenizer (a folder's tokenizer.json, a GGUF file's tokenizer.*
// metadata), as Hugging Face transformers does with the same files; the chat flag wraps a
// text as one user turn of the model's chat template, as `stepgraph run --chat` does, and
// stepgraph_session_encode_chat renders a whole conversation (JSON messages) through it. The
// tokenizer is loaded by the first text call on a handle. Functions that return a variable
// amount (encode, encode_chat, decode, stop_ids) follow one size-query convention: the
// caller passes a buffer and its capacity, and always gets the size needed in *count /
// *length; a NULL buffer with capacity 0 only asks for that size (STEPGRAPH_OK); a buffer
// too small is STEPGRAPH_ERROR_INVALID_VALUE with nothing written.
#ifndef STEPGRAPH_C_API_C_SESSION_H_
#define STEPGRAPH_C_API_C_SESSION_H_

#include <stdint.h>

#include "stepgraph/c_api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a signature, a struct or a meaning below changes.
#define STEPGRAPH_SESSION_API_VERSION 3

// The model has no tokenizer (the built-in model; a folder without tokenizer.json; a GGUF
// file without tokenizer.* metadata): the text functions cannot run, token ids still do.
#define STEPGRAPH_ERROR_NO_TOKENIZER (-5)

// stepgraph_session_options.backend and stepgraph_session_info.backend.
#define STEPGRAPH_BACKEND_AUTO 0  // CUDA when built with it and a device is found, else CPU
#define STEPGRAPH_BACKEND_CPU 1   // the f32 CPU reference: slow, always available
#define STEPGRAPH_BACKEND_CUDA 2  // each step captured as a CUDA graph and replayed

// stepgraph_session_options.sampling and stepgraph_sampling.mode.
#define STEPGRAPH_SAMPLING_GREEDY 0  // argmax
#define STEPGRAPH_SAMPLING_SAMPLE 1  // temperature, top_k, top_p, with each slot's seed

// Sampling at a temperature below this is greedy decoding (argmax, lowest id on ties), the
// limit the distribution tends to; the Sample op does the same on every backend. Below it
// logits / temperature can overflow float and the probabilities would become NaN.
#define STEPGRAPH_SESSION_MIN_TEMPERATURE 1e-5f

// Flags of the text functions (OR them; a flag a function does not take is refused).
// encode and stop_ids: the text is one user turn of the model's chat template, followed by
// the prompt that opens the assistant's turn (transformers' apply_chat_template with
// add_generation_prompt); stop_ids adds the template's end-of-turn id.
#define STEPGRAPH_TEXT_CHAT 1u
// encode: no bos / eos, even where the tokenizer adds them (without it, they are added as
// the tokenizer's files ask: transformers' add_special_tokens=True).
#define STEPGRAPH_TEXT_NO_ADD_SPECIAL 2u
// encode: special tokens written in the text ("<|im_end|>") stay text instead of becoming
// their ids. Not with STEPGRAPH_TEXT_CHAT, whose template is made of such tokens.
#define STEPGRAPH_TEXT_LITERAL_SPECIAL 4u
// decode: leave control tokens (bos, eos, <|im_end|>, ...) out of the text.
#define STEPGRAPH_TEXT_SKIP_SPECIAL 8u

// The longest text encode takes, in bytes, and the most ids decode takes.
#define STEPGRAPH_SESSION_MAX_TEXT_BYTES (INT64_C(1) << 30)
#define STEPGRAPH_SESSION_MAX_DECODE_IDS (INT64_C(1) << 28)
// The most messages encode_chat takes.
#define STEPGRAPH_SESSION_MAX_CHAT_MESSAGES (INT64_C(1) << 16)
// stepgraph_sampling's bounds: the most logit biases, the largest |presence_penalty| and
// |frequency_penalty| (OpenAI's range) and the largest |logit bias| (OpenAI's range).
#define STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS 64
#define STEPGRAPH_SAMPLING_MAX_PENALTY 2.0f
#define STEPGRAPH_SAMPLING_MAX_BIAS 100.0f

typedef struct stepgraph_session stepgraph_session;

// Options of stepgraph_session_create: fill with stepgraph_session_options_init, then set
// what differs.
typedef struct stepgraph_session_options {
  int64_t struct_size;  // sizeof(stepgraph_session_options), set by _init
  int64_t max_slots;    // sequences decoded together (KV cache slots), >= 1; default 1
  int64_t max_seq;      // positions per slot (prompt + generated); 0: the model's, at most 4096
  uint64_t weight_seed;  // the built-in model's random weights (model_path NULL)
  int32_t backend;       // STEPGRAPH_BACKEND_*; default AUTO
  int32_t sampling;      // STEPGRAPH_SAMPLING_*; default GREEDY
  float temperature;     // sampling: finite and > 0 (greedy below
                         // STEPGRAPH_SESSION_MIN_TEMPERATURE); default 1
  int32_t top_k;         // sampling: >= 0, 0 for no limit; default 0
  float top_p;           // sampling: in (0, 1]; default 1
  int32_t cpu_threads;   // CPU backend: threads of the reference's parallel ops; 0: one per core
} stepgraph_session_options;

// How one sequence chooses its ids (stepgraph_session_prefill_sampled): fill with
// stepgraph_sampling_init (greedy, every control off), then set what differs. Every field is
// checked whatever the mode, and a bad one is STEPGRAPH_ERROR_INVALID_VALUE with a message
// naming it (sampling.<field>). The penalties and the bias change the logits before the
// choice, greedy or sampled, in this order: repetition, presence and frequency, bias.
typedef struct stepgraph_sampling {
  int64_t struct_size;  // sizeof(stepgraph_sampling), set by _init
  int32_t mode;         // STEPGRAPH_SAMPLING_*; default GREEDY
  float temperature;    // SAMPLE: finite and > 0 (greedy below
                        // STEPGRAPH_SESSION_MIN_TEMPERATURE); default 1
  int32_t top_k;        // SAMPLE: >= 0, 0 for no limit; default 0
  float top_p;          // SAMPLE: in (0, 1]; default 1
  // transformers' repetition_penalty over the prompt's and the generated ids: a logit l
  // becomes l / r where positive, l * r otherwise. Finite and > 0; default 1 (off).
  float repetition_penalty;
  // OpenAI's presence_penalty and frequency_penalty over the generated ids: l - (presence +
  // frequency * times generated). In [-STEPGRAPH_SAMPLING_MAX_PENALTY,
  // STEPGRAPH_SAMPLING_MAX_PENALTY]; default 0 (off).
  float presence_penalty;
  float frequency_penalty;
  // SAMPLE: ids whose probability (after temperature) is below min_p times the top one's
  // are never drawn (llama.cpp's and transformers' min-p). In [0, 1]; default 0 (off).
  float min_p;
  // OpenAI's logit_bias: logit_bias_values[i] is added to the logit of logit_bias_ids[i].
  // At most STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS entries (both arrays non-NULL when the count
  // is > 0), ids in [0, vocab_size) and each at most once, values in
  // [-STEPGRAPH_SAMPLING_MAX_BIAS, STEPGRAPH_SAMPLING_MAX_BIAS] (-100 bans an id, +100 all
  // but forces it). Read during the call only. Default 0, NULL, NULL.
  int32_t logit_bias_count;
  const int32_t* logit_bias_ids;
  const float* logit_bias_values;
} stepgraph_sampling;

// What a session holds, for sizing the caller's buffers.
typedef struct stepgraph_session_info {
  int64_t vocab_size;  // logits per slot; token ids are in [0, vocab_size)
  int64_t max_slots;
  int64_t max_seq;
  int32_t backend;  // the one that runs: STEPGRAPH_BACKEND_CPU or STEPGRAPH_BACKEND_CUDA
} stepgraph_session_info;

// STEPGRAPH_SESSION_API_VERSION of the library actually loaded.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_abi_version(void) STEPGRAPH_C_NOEXCEPT;

// The defaults, with struct_size set.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_options_init(stepgraph_session_options* options)
    STEPGRAPH_C_NOEXCEPT;

// The defaults of stepgraph_sampling (greedy, every control off), with struct_size set.
STEPGRAPH_C_EXPORT int32_t stepgraph_sampling_init(stepgraph_sampling* sampling)
    STEPGRAPH_C_NOEXCEPT;

// Loads a model and makes a session. model_path: a Hugging Face model folder (config.json
// and safetensors), a GGUF file, or NULL for the built-in tiny Llama with random weights
// from options->weight_seed (it has no tokenizer). options: NULL for the
// defaults. On success *session is the new handle. On failure it is a handle that holds only
// the message (read it with stepgraph_session_error, then destroy it; any other call on it
// is STEPGRAPH_ERROR_INVALID_VALUE), or NULL when even that could not be made.
//
// Every session made here applies per-sequence penalties and logit bias in its decode steps
// (SessionOptions::penalties of the C++ session), so that stepgraph_session_prefill_sampled
// may ask for them on any session: a per-call control must not depend on how the session
// was made. The cost is one pass over each step's logits (and a count of the ids each slot
// chose); sequences without penalties get the ids they would get without it.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_create(const char* model_path,
                                                    const stepgraph_session_options* options,
                                                    stepgraph_session** session)
    STEPGRAPH_C_NOEXCEPT;

// Frees the session and everything it holds; NULL is ignored.
STEPGRAPH_C_EXPORT void stepgraph_session_destroy(stepgraph_session* session)
    STEPGRAPH_C_NOEXCEPT;

// The message of the last failed call on `session` ("" after a success), valid until the
// next call on it; never NULL.
STEPGRAPH_C_EXPORT const char* stepgraph_session_error(const stepgraph_session* session)
    STEPGRAPH_C_NOEXCEPT;

STEPGRAPH_C_EXPORT int32_t stepgraph_session_get_info(stepgraph_session* session,
                                                      stepgraph_session_info* info)
    STEPGRAPH_C_NOEXCEPT;

// Starts a sequence in `slot` (ending the one it held) with the n prompt ids (n >= 1, each
// in [0, vocab_size), n <= max_seq). `seed` is the slot's sampling seed.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_prefill(stepgraph_session* session, int64_t slot,
                                                     const int32_t* ids, int64_t n,
                                                     int32_t seed) STEPGRAPH_C_NOEXCEPT;

// As stepgraph_session_prefill, with the sequence's own way of choosing its ids (sampling
// NULL: the session's options, no penalties; the same as stepgraph_session_prefill). The
// penalties and the bias run in the decode step on the device. A sequence whose mode,
// temperature, top_k or top_p differ from the session's options has its ids chosen on the
// host from its logits after each step (exactly as the device would choose them): its
// steps wait for the device, which costs little on the CPU and a round trip per step on a
// GPU. Nothing of `sampling` is kept after the call.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_prefill_sampled(stepgraph_session* session,
                                                             int64_t slot, const int32_t* ids,
                                                             int64_t n, int32_t seed,
                                                             const stepgraph_sampling* sampling)
    STEPGRAPH_C_NOEXCEPT;

// n decode steps (n >= 1) of every live slot; writes `slot`'s n new ids to ids[0..n). The
// slot must be live and have n free positions.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_generate(stepgraph_session* session, int64_t slot,
                                                      int64_t n,
                                                      int32_t* ids) STEPGRAPH_C_NOEXCEPT;

// Writes the vocab_size f32 logits of `slot`'s row in the last step to logits (capacity >=
// vocab_size). The slot must have been live in the last step.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_logits(stepgraph_session* session, int64_t slot,
                                                    float* logits,
                                                    int64_t capacity) STEPGRAPH_C_NOEXCEPT;

// Ends `slot`'s sequence.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_release(stepgraph_session* session,
                                                     int64_t slot) STEPGRAPH_C_NOEXCEPT;

// ---- Text (the model's tokenizer; see "Text" above) ----

// The token ids of the UTF-8 text[0..text_bytes) (no terminating NUL needed; NULL with
// text_bytes 0 is the empty text). flags: STEPGRAPH_TEXT_CHAT, STEPGRAPH_TEXT_NO_ADD_SPECIAL,
// STEPGRAPH_TEXT_LITERAL_SPECIAL. *count (count non-NULL) receives the number of ids; they
// are written to ids[0..*count) when capacity >= *count. Text that is not valid UTF-8, or
// longer than STEPGRAPH_SESSION_MAX_TEXT_BYTES, is STEPGRAPH_ERROR_INVALID_VALUE; so is
// STEPGRAPH_TEXT_CHAT for a model whose chat template is missing or not one stepgraph
// renders. The ids are the tokenizer's: stepgraph_session_prefill checks them against the
// model's vocabulary.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_encode(stepgraph_session* session,
                                                    const char* text, int64_t text_bytes,
                                                    uint32_t flags, int32_t* ids,
                                                    int64_t capacity,
                                                    int64_t* count) STEPGRAPH_C_NOEXCEPT;

// The token ids of a conversation through the model's chat template, followed by the prompt
// that opens the assistant's turn: what transformers' apply_chat_template(messages,
// add_generation_prompt=True, tokenize=True) gives. messages_json[0..json_bytes) is UTF-8
// JSON (no terminating NUL needed), an array of 1 to STEPGRAPH_SESSION_MAX_CHAT_MESSAGES
// objects {"role": string, "content": string} with no other keys, json_bytes at most
// STEPGRAPH_SESSION_MAX_TEXT_BYTES. The template decides which roles and orders it takes
// (most refuse turns that do not alternate between user and assistant) and says why in the
// error (STEPGRAPH_ERROR_INVALID_VALUE). *count, ids and capacity as for encode.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_encode_chat(stepgraph_session* session,
                                                         const char* messages_json,
                                                         int64_t json_bytes, int32_t* ids,
                                                         int64_t capacity,
                                                         int64_t* count) STEPGRAPH_C_NOEXCEPT;

// The UTF-8 text of ids[0..n) (NULL with n 0 is no ids; n <= STEPGRAPH_SESSION_MAX_DECODE_IDS).
// flags: STEPGRAPH_TEXT_SKIP_SPECIAL. *length (length non-NULL) receives the text's size in
// bytes, without a terminator; when capacity >= *length + 1 the text and a terminating NUL
// are written to text. The text is valid UTF-8: bytes that do not form UTF-8 (a character
// cut between ids) become U+FFFD; it holds a NUL byte only where a token stands for one. An
// id outside the tokenizer's vocabulary is STEPGRAPH_ERROR_INVALID_VALUE.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_decode(stepgraph_session* session,
                                                    const int32_t* ids, int64_t n,
                                                    uint32_t flags, char* text,
                                                    int64_t capacity,
                                                    int64_t* length) STEPGRAPH_C_NOEXCEPT;

// The ids that end a sequence, as the model's files state them (a folder's
// generation_config.json eos_token_id, else config.json's; a GGUF file's eos and eot ids);
// with STEPGRAPH_TEXT_CHAT also the chat
// template's end-of-turn id. The session never stops by itself: a caller generating text
// stops at these. *count receives their number (0 for the built-in model without
// STEPGRAPH_TEXT_CHAT, which needs the tokenizer); written to ids when capacity >= *count.
STEPGRAPH_C_EXPORT int32_t stepgraph_session_stop_ids(stepgraph_session* session,
                                                      uint32_t flags, int32_t* ids,
                                                      int64_t capacity,
                                                      int64_t* count) STEPGRAPH_C_NOEXCEPT;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // STEPGRAPH_C_API_C_SESSION_H_
