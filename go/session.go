package stepgraph

// The decode session of c_session.h: a model loaded once, slots prefilled with prompt ids,
// ids generated step by step, and text turned into ids and back with the model's
// tokenizer. Runs on the CPU reference where there is no GPU.

/*
#include "stepgraph/c_api/c_session.h"
*/
import "C"

import (
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Backend is where a session runs.
type Backend int32

const (
	// CUDA when built with it and a device is found, else the CPU.
	BackendAuto Backend = C.STEPGRAPH_BACKEND_AUTO
	// The f32 CPU reference: slow, always there.
	BackendCPU Backend = C.STEPGRAPH_BACKEND_CPU
	// Each step captured as a CUDA graph and replayed.
	BackendCUDA Backend = C.STEPGRAPH_BACKEND_CUDA
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCPU:
		return "cpu"
	case BackendCUDA:
		return "cuda"
	}
	return "Backend(" + strconv.Itoa(int(b)) + ")"
}

// Sampling picks ids from the logits with a temperature (finite, > 0), top-k (0: no
// limit) and top-p (in (0, 1]), with each slot's seed; Options.Sampling nil is greedy.
type Sampling struct {
	Temperature float32
	TopK        int32
	TopP        float32
}

// SamplingOptions choose one sequence's ids (PrefillWith and the *With generation calls).
// The zero value is the session's sampling with every control off. The library checks
// every value and refuses a bad one naming it (ErrInvalidArgument).
type SamplingOptions struct {
	// nil: the session's (Options.Sampling), or greedy with Greedy. A sampling other than
	// the session's is drawn on the host from each step's logits (its steps wait for the
	// device).
	Sampling *Sampling
	Greedy   bool
	Seed     int32 // the sequence's sampling seed
	// transformers' repetition penalty over the prompt's and the generated ids: a logit l
	// becomes l / r where positive, l * r otherwise. > 0; 0 (the zero value) and 1: off.
	RepetitionPenalty float32
	// OpenAI's presence and frequency penalties over the generated ids: l - (presence +
	// frequency * times generated). In [-2, 2]; 0: off.
	PresencePenalty  float32
	FrequencyPenalty float32
	// Sampled ids have at least MinP times the top one's probability. In [0, 1]; 0: off.
	MinP float32
	// id -> bias added to its logit, OpenAI's logit_bias: at most 64 ids of the
	// vocabulary, biases in [-100, 100] (-100 bans an id, 100 all but forces it).
	LogitBias map[int32]float32
	// Stop strings of the text calls (GenerateTextWith, GenerateChatWith): the text ends
	// before the first of them to appear, matched on the decoded text across token
	// boundaries and left out of it (of two that complete at the same character, the
	// longer). At most MaxStopStrings, each 1 to MaxStopBytes bytes of UTF-8; the id calls
	// (PrefillWith, GenerateUntilWith) refuse them, as ids are not text.
	Stop []string
}

// The bounds of SamplingOptions.Stop (OpenAI's, as `stepgraph serve`'s).
const (
	MaxStopStrings = 4
	MaxStopBytes   = 256
)

// checkStop is ErrInvalidArgument naming the stop string out of bounds, if one is.
func (o *SamplingOptions) checkStop() error {
	if o == nil {
		return nil
	}
	if len(o.Stop) > MaxStopStrings {
		return invalid("", "sampling.stop: %d stop strings, at most %d are taken", len(o.Stop),
			MaxStopStrings)
	}
	for i, t := range o.Stop {
		if len(t) < 1 || len(t) > MaxStopBytes {
			return invalid("", "sampling.stop[%d]: each stop string must hold 1 to %d bytes, "+
				"got %d", i, MaxStopBytes, len(t))
		}
		if !utf8.ValidString(t) {
			return invalid("", "sampling.stop[%d]: a stop string is not valid UTF-8", i)
		}
	}
	return nil
}

// refuseStop is the id calls' refusal of stop strings.
func (o *SamplingOptions) refuseStop(call string) error {
	if o == nil || len(o.Stop) == 0 {
		return nil
	}
	return invalid("", "sampling.stop: stop strings are matched on text; %s takes ids (give "+
		"them to GenerateTextWith or GenerateChatWith)", call)
}

// Options of Open and OpenBuiltin. The zero value is the library's defaults: one slot, the
// model's context (at most 4096 positions), the backend picked, greedy, a thread per core.
type Options struct {
	MaxSlots   int64  // sequences decoded together (KV cache slots); 0 is 1
	MaxSeq     int64  // positions per slot (prompt + generated); 0: the model's, at most 4096
	WeightSeed uint64 // the built-in model's random weights
	Backend    Backend
	Sampling   *Sampling
	CPUThreads int32 // the CPU backend's threads; 0: one per core
}

// Info is what a session holds, for sizing buffers.
type Info struct {
	VocabSize int64 // logits per slot; ids are in [0, VocabSize)
	MaxSlots  int64
	MaxSeq    int64
	Backend   Backend // the one that runs: BackendCPU or BackendCUDA
}

// Session is a loaded model with its KV cache slots.
//
// Safe for concurrent use: the C handle is used by one thread at a time (c_session.h), so
// every method takes the session's lock, and calls from several goroutines run one after
// another, never together. For decoding in parallel, open one Session per goroutine (they
// are independent) or use several slots of one. Close waits for a call in progress, and
// every call after it returns ErrClosed; a Session that is not closed is freed by a
// finalizer once unreachable, but a model holds much memory: close it.
type Session struct {
	mu       sync.Mutex
	h        *sessionHandle
	info     Info
	sampling *Sampling // the session's, nil for greedy
}

// Open loads a Hugging Face model folder (config.json, safetensors, tokenizer.json) or a
// GGUF file.
func Open(model string, options *Options) (*Session, error) {
	if model == "" {
		return nil, invalid("stepgraph_session_create", "the model path is empty: "+
			"OpenBuiltin opens the built-in model")
	}
	path := append([]byte(model), 0)
	return open(&path[0], options)
}

// OpenBuiltin makes the built-in tiny Llama with random weights from options.WeightSeed.
// It has no tokenizer: ids only.
func OpenBuiltin(options *Options) (*Session, error) {
	return open(nil, options)
}

func open(path *byte, options *Options) (*Session, error) {
	const f = "stepgraph_session_create"
	if err := CheckLibraries(); err != nil {
		return nil, err
	}
	var o sessionOptions
	if code := stepgraph_session_options_init(&o); code != C.STEPGRAPH_OK {
		return nil, check(code, "stepgraph_session_options_init")
	}
	if options != nil {
		if options.MaxSlots != 0 {
			o.max_slots = options.MaxSlots
		}
		o.max_seq = options.MaxSeq
		o.weight_seed = options.WeightSeed
		o.backend = int32(options.Backend)
		o.cpu_threads = options.CPUThreads
		if s := options.Sampling; s != nil {
			o.sampling = C.STEPGRAPH_SAMPLING_SAMPLE
			o.temperature, o.top_k, o.top_p = s.Temperature, s.TopK, s.TopP
		}
	}
	var sampling *Sampling
	if options != nil && options.Sampling != nil {
		copied := *options.Sampling
		sampling = &copied
	}
	var h *sessionHandle
	if code := stepgraph_session_create(path, &o, &h); code != C.STEPGRAPH_OK {
		message := "no handle was made (out of memory)"
		if h != nil {
			message = goString(stepgraph_session_error(h))
			stepgraph_session_destroy(h)
		}
		return nil, &Error{Code: code, Func: f, Message: message}
	}
	s := &Session{h: h, sampling: sampling}
	var info sessionInfo
	if code := stepgraph_session_get_info(h, &info); code != C.STEPGRAPH_OK {
		err := s.fail(code, "stepgraph_session_get_info")
		stepgraph_session_destroy(h)
		return nil, err
	}
	s.info = Info{VocabSize: info.vocab_size, MaxSlots: info.max_slots,
		MaxSeq: info.max_seq, Backend: Backend(info.backend)}
	runtime.SetFinalizer(s, (*Session).Close)
	return s, nil
}

// Close frees the session; later calls return ErrClosed, and a second Close returns nil.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h != nil {
		stepgraph_session_destroy(s.h)
		s.h = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// Info says what the session holds (fixed when it is opened).
func (s *Session) Info() Info { return s.info }

// fail is the *Error of a code, with the message the library left on the handle.
func (s *Session) fail(code int32, function string) error {
	return &Error{Code: code, Func: function, Message: goString(stepgraph_session_error(s.h))}
}

// call runs one C call on the handle under the lock.
func (s *Session) call(function string, c func(h *sessionHandle) int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil {
		return ErrClosed
	}
	if code := c(s.h); code != C.STEPGRAPH_OK {
		return s.fail(code, function)
	}
	return nil
}

// ptr32 is the address of a slice's first element, or nil for an empty slice (the C ABI
// takes NULL with a count of 0).
func ptr32(ids []int32) *int32 {
	if len(ids) == 0 {
		return nil
	}
	return &ids[0]
}

// Prefill starts a sequence in slot (ending the one it held) with the prompt ids; seed is
// the slot's sampling seed.
func (s *Session) Prefill(slot int, ids []int32, seed int32) error {
	return s.call("stepgraph_session_prefill", func(h *sessionHandle) int32 {
		return stepgraph_session_prefill(h, int64(slot), ptr32(ids), int64(len(ids)), seed)
	})
}

// PrefillWith starts a sequence in slot with the prompt ids, choosing its ids as options
// say (nil: as Prefill with seed 0), whose stop strings it refuses (they belong to the text
// calls).
func (s *Session) PrefillWith(slot int, ids []int32, options *SamplingOptions) error {
	if err := options.refuseStop("PrefillWith"); err != nil {
		return err
	}
	return s.prefillSampled(slot, ids, options)
}

// prefillSampled is PrefillWith, whatever options.Stop holds.
func (s *Session) prefillSampled(slot int, ids []int32, options *SamplingOptions) error {
	const f = "stepgraph_session_prefill_sampled"
	if options == nil {
		return s.Prefill(slot, ids, 0)
	}
	if len(options.LogitBias) > C.STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS {
		return invalid(f, "sampling.logit_bias_count: %d logit biases, at most %d are taken",
			len(options.LogitBias), C.STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS)
	}
	var c sessionSampling
	if code := stepgraph_sampling_init(&c); code != C.STEPGRAPH_OK {
		return check(code, "stepgraph_sampling_init")
	}
	sampling := s.sampling
	if options.Sampling != nil {
		sampling = options.Sampling
	}
	if sampling != nil && !options.Greedy {
		c.mode = C.STEPGRAPH_SAMPLING_SAMPLE
		c.temperature, c.top_k, c.top_p = sampling.Temperature, sampling.TopK, sampling.TopP
	}
	if options.RepetitionPenalty != 0 {
		c.repetition_penalty = options.RepetitionPenalty
	}
	c.presence_penalty = options.PresencePenalty
	c.frequency_penalty = options.FrequencyPenalty
	c.min_p = options.MinP
	if n := len(options.LogitBias); n > 0 {
		// In C memory: cgo refuses a Go pointer to memory that holds Go pointers.
		memory := cAlloc(uintptr(n) * 8)
		if memory == nil {
			return &Error{Code: C.STEPGRAPH_ERROR_OUT_OF_MEMORY, Func: f,
				Message: "no memory for the logit biases"}
		}
		defer cFree(memory)
		ids := unsafe.Slice((*int32)(memory), n)
		values := unsafe.Slice((*float32)(unsafe.Add(memory, n*4)), n)
		i := 0
		for id, bias := range options.LogitBias {
			ids[i], values[i] = id, bias
			i++
		}
		c.logit_bias_count = int32(n)
		c.logit_bias_ids, c.logit_bias_values = &ids[0], &values[0]
	}
	return s.call(f, func(h *sessionHandle) int32 {
		return stepgraph_session_prefill_sampled(h, int64(slot), ptr32(ids), int64(len(ids)),
			options.Seed, &c)
	})
}

// GenerateInto runs len(ids) decode steps of every live slot and writes slot's new ids
// into ids.
func (s *Session) GenerateInto(slot int, ids []int32) error {
	return s.call("stepgraph_session_generate", func(h *sessionHandle) int32 {
		return stepgraph_session_generate(h, int64(slot), int64(len(ids)), ptr32(ids))
	})
}

// Generate runs n decode steps and returns slot's n new ids.
func (s *Session) Generate(slot, n int) ([]int32, error) {
	if n < 0 {
		return nil, invalid("stepgraph_session_generate", "n %d < 0", n)
	}
	ids := make([]int32, n)
	if err := s.GenerateInto(slot, ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// Logits are the VocabSize f32 logits of slot's row in the last step.
func (s *Session) Logits(slot int) ([]float32, error) {
	out := make([]float32, s.info.VocabSize)
	err := s.call("stepgraph_session_logits", func(h *sessionHandle) int32 {
		return stepgraph_session_logits(h, int64(slot), &out[0], int64(len(out)))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Release ends slot's sequence.
func (s *Session) Release(slot int) error {
	return s.call("stepgraph_session_release", func(h *sessionHandle) int32 {
		return stepgraph_session_release(h, int64(slot))
	})
}

// ---- text (the model's tokenizer) ----------------------------------------------------

// EncodeOptions say how Encode reads a text; the zero value is plain text with the
// tokenizer's bos / eos, special tokens written in it ("<|im_end|>") becoming their ids.
type EncodeOptions struct {
	// The text is one user turn of the model's chat template, with the assistant's turn
	// opened after it (as `stepgraph run --chat`).
	Chat bool
	// No bos / eos, even where the tokenizer's files ask for them.
	NoAddSpecial bool
	// Special tokens written in the text stay text. Not with Chat.
	LiteralSpecial bool
}

func (o EncodeOptions) flags() uint32 {
	var f uint32
	if o.Chat {
		f |= C.STEPGRAPH_TEXT_CHAT
	}
	if o.NoAddSpecial {
		f |= C.STEPGRAPH_TEXT_NO_ADD_SPECIAL
	}
	if o.LiteralSpecial {
		f |= C.STEPGRAPH_TEXT_LITERAL_SPECIAL
	}
	return f
}

// A first guess of a text call's buffer; the library says what it needs when the guess
// is short (c_session.h's size query), so a guess only saves a call.
const (
	spareIDs   = 64
	bytesPerID = 8
)

// sized runs a text call of c_session.h's size-query convention under one lock: with the
// guessed capacity, then once more with the size the library asked for.
func (s *Session) sized(function string, guess int,
	c func(h *sessionHandle, capacity int) (code int32, need int64)) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil {
		return 0, ErrClosed
	}
	capacity := guess
	for try := 0; try < 2; try++ {
		code, need := c(s.h, capacity)
		if code == C.STEPGRAPH_OK {
			return int(need), nil
		}
		if code != C.STEPGRAPH_ERROR_INVALID_VALUE || need <= int64(capacity) {
			return 0, s.fail(code, function)
		}
		capacity = int(need)
	}
	return 0, &Error{Code: C.STEPGRAPH_ERROR_LAUNCH_FAILED, Func: function,
		Message: "the size it asked for did not suffice"}
}

// Encode gives the token ids of text (UTF-8; other bytes are ErrInvalidArgument) as the
// model's tokenizer makes them. ErrNoTokenizer for a model without one (the built-in).
func (s *Session) Encode(text string, options EncodeOptions) ([]int32, error) {
	const f = "stepgraph_session_encode"
	var bytes []byte
	if len(text) > 0 {
		bytes = []byte(text)
	}
	var ids []int32
	n, err := s.sized(f, len(text)+spareIDs, func(h *sessionHandle, capacity int) (int32, int64) {
		if len(ids) < capacity {
			ids = make([]int32, capacity)
		}
		var count int64
		var p *byte
		if len(bytes) > 0 {
			p = &bytes[0]
		}
		code := stepgraph_session_encode(h, p, int64(len(bytes)), options.flags(), &ids[0],
			int64(len(ids)), &count)
		return code, count
	})
	if err != nil {
		return nil, err
	}
	return ids[:n], nil
}

// Message is one message of a conversation for EncodeChat and GenerateChat.
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant", or what the template knows
	Content string `json:"content"`
}

// EncodeChat gives the token ids of a conversation through the model's chat template,
// followed by the prompt that opens the assistant's turn: what transformers'
// apply_chat_template(messages, add_generation_prompt=True, tokenize=True) gives. The
// template decides which roles and orders it takes (ErrInvalidArgument says why not).
func (s *Session) EncodeChat(messages []Message) ([]int32, error) {
	const f = "stepgraph_session_encode_chat"
	if messages == nil {
		messages = []Message{} // "[]", which the library refuses as no messages, not "null"
	}
	data, err := json.Marshal(messages)
	if err != nil {
		return nil, invalid(f, "the messages do not make JSON: %v", err)
	}
	var ids []int32
	n, err := s.sized(f, len(data)+spareIDs, func(h *sessionHandle, capacity int) (int32, int64) {
		if len(ids) < capacity {
			ids = make([]int32, capacity)
		}
		var count int64
		code := stepgraph_session_encode_chat(h, &data[0], int64(len(data)), &ids[0],
			int64(len(ids)), &count)
		return code, count
	})
	if err != nil {
		return nil, err
	}
	return ids[:n], nil
}

// Decode gives the text of ids; skipSpecial leaves control tokens (bos, eos, <|im_end|>,
// ...) out. Bytes that do not form UTF-8 become U+FFFD; an id outside the tokenizer's
// vocabulary is ErrInvalidArgument.
func (s *Session) Decode(ids []int32, skipSpecial bool) (string, error) {
	const f = "stepgraph_session_decode"
	var flags uint32
	if skipSpecial {
		flags = C.STEPGRAPH_TEXT_SKIP_SPECIAL
	}
	var text []byte
	n, err := s.sized(f, len(ids)*bytesPerID+spareIDs,
		func(h *sessionHandle, capacity int) (int32, int64) {
			// The text and its terminating NUL: a length of `capacity` needs one more byte.
			if len(text) <= capacity {
				text = make([]byte, capacity+1)
			}
			var length int64
			code := stepgraph_session_decode(h, ptr32(ids), int64(len(ids)), flags, &text[0],
				int64(len(text)), &length)
			return code, length
		})
	if err != nil {
		return "", err
	}
	return string(text[:n]), nil
}

// StopIDs are the ids that end a sequence, as the model's files state them; chat adds the
// chat template's end-of-turn id (which needs the tokenizer). The session never stops by
// itself: GenerateText and GenerateUntil stop at them.
func (s *Session) StopIDs(chat bool) ([]int32, error) {
	const f = "stepgraph_session_stop_ids"
	var flags uint32
	if chat {
		flags = C.STEPGRAPH_TEXT_CHAT
	}
	var ids []int32
	n, err := s.sized(f, spareIDs, func(h *sessionHandle, capacity int) (int32, int64) {
		if len(ids) < capacity {
			ids = make([]int32, capacity)
		}
		var count int64
		code := stepgraph_session_stop_ids(h, flags, &ids[0], int64(len(ids)), &count)
		return code, count
	})
	if err != nil {
		return nil, err
	}
	return ids[:n], nil
}

// GenerateText starts slot with prompt (read as Encode reads it) and returns the text of at
// most maxNewTokens new ids, ending before the first stop id (of StopIDs) unless stop is
// false; special tokens are left out of the text.
func (s *Session) GenerateText(slot int, prompt string, options EncodeOptions,
	maxNewTokens int, stop bool) (string, error) {
	return s.GenerateTextWith(slot, prompt, options, maxNewTokens, stop, nil)
}

// GenerateTextWith is GenerateText choosing the ids as sampling says (nil: the session's),
// and ending the text before the first of sampling.Stop (see SamplingOptions.Stop).
func (s *Session) GenerateTextWith(slot int, prompt string, options EncodeOptions,
	maxNewTokens int, stop bool, sampling *SamplingOptions) (string, error) {
	if err := sampling.checkStop(); err != nil {
		return "", err
	}
	ids, err := s.Encode(prompt, options)
	if err != nil {
		return "", err
	}
	var stops []int32
	if stop {
		if stops, err = s.StopIDs(options.Chat); err != nil {
			return "", err
		}
	}
	return s.generateText(slot, ids, maxNewTokens, stops, sampling)
}

// GenerateChat starts slot with the conversation (rendered as EncodeChat renders it) and
// returns the text of the assistant's reply: at most maxNewTokens new ids, ending before
// the chat's first stop id (StopIDs(true)) unless stop is false, special tokens left out.
func (s *Session) GenerateChat(slot int, messages []Message, maxNewTokens int,
	stop bool) (string, error) {
	return s.GenerateChatWith(slot, messages, maxNewTokens, stop, nil)
}

// GenerateChatWith is GenerateChat choosing the ids as sampling says (nil: the session's),
// and ending the text before the first of sampling.Stop (see SamplingOptions.Stop).
func (s *Session) GenerateChatWith(slot int, messages []Message, maxNewTokens int, stop bool,
	sampling *SamplingOptions) (string, error) {
	if err := sampling.checkStop(); err != nil {
		return "", err
	}
	ids, err := s.EncodeChat(messages)
	if err != nil {
		return "", err
	}
	var stops []int32
	if stop {
		if stops, err = s.StopIDs(true); err != nil {
			return "", err
		}
	}
	return s.generateText(slot, ids, maxNewTokens, stops, sampling)
}

// generateText is the text calls from the prompt's ids: the new ids' text, special tokens
// left out, ending before the first of sampling.Stop (checked by the caller).
func (s *Session) generateText(slot int, prompt []int32, maxNewTokens int, stops []int32,
	sampling *SamplingOptions) (string, error) {
	if sampling == nil || len(sampling.Stop) == 0 {
		out, err := s.idsUntil(slot, prompt, maxNewTokens, stops, sampling)
		if err != nil {
			return "", err
		}
		return s.Decode(out, true)
	}
	// Stop strings are found in the text as it comes, so the ids are decoded as they come:
	// a window of a few ids at a time (the C ABI decodes whole id sequences only).
	var text textPieces
	matcher := newStopMatcher(sampling.Stop)
	var out strings.Builder
	take := func(id int32) (bool, error) {
		piece, ok, err := text.push(s, id, false)
		if err != nil {
			return false, err
		}
		if ok {
			out.WriteString(matcher.push(piece))
		}
		return !matcher.stopped, nil
	}
	if err := s.steps(slot, prompt, maxNewTokens, stops, sampling, true, take); err != nil {
		return "", err
	}
	if !matcher.stopped {
		piece, _, err := text.push(s, 0, true)
		if err != nil {
			return "", err
		}
		out.WriteString(matcher.push(piece))
		out.WriteString(matcher.finish())
	}
	return out.String(), nil
}

// GenerateUntil starts slot with the prompt ids and returns at most maxNewTokens new ids,
// ending before the first id in stops.
func (s *Session) GenerateUntil(slot int, prompt []int32, maxNewTokens int,
	stops []int32) ([]int32, error) {
	return s.GenerateUntilWith(slot, prompt, maxNewTokens, stops, nil)
}

// GenerateUntilWith is GenerateUntil choosing the ids as sampling says (nil: the session's),
// whose stop strings it refuses (ids are not text).
func (s *Session) GenerateUntilWith(slot int, prompt []int32, maxNewTokens int, stops []int32,
	sampling *SamplingOptions) ([]int32, error) {
	if err := sampling.refuseStop("GenerateUntilWith"); err != nil {
		return nil, err
	}
	return s.idsUntil(slot, prompt, maxNewTokens, stops, sampling)
}

// idsUntil is GenerateUntilWith, whatever sampling.Stop holds.
func (s *Session) idsUntil(slot int, prompt []int32, maxNewTokens int, stops []int32,
	sampling *SamplingOptions) ([]int32, error) {
	out := make([]int32, 0, maxNewTokens)
	take := func(id int32) (bool, error) {
		out = append(out, id)
		return true, nil
	}
	if err := s.steps(slot, prompt, maxNewTokens, stops, sampling, false, take); err != nil {
		return nil, err
	}
	return out, nil
}

// steps prefills slot with the prompt and hands each new id to take until it returns
// false, an id of stops comes (not handed on) or maxNewTokens ids were made. watched: take
// may end the generation whatever stops holds.
func (s *Session) steps(slot int, prompt []int32, maxNewTokens int, stops []int32,
	sampling *SamplingOptions, watched bool, take func(id int32) (bool, error)) error {
	if maxNewTokens < 1 {
		return invalid("stepgraph_session_generate", "maxNewTokens %d < 1", maxNewTokens)
	}
	if err := s.prefillSampled(slot, prompt, sampling); err != nil {
		return err
	}
	stop := make(map[int32]bool, len(stops))
	for _, id := range stops {
		stop[id] = true
	}
	// Steps in chunks so that a stop ends the work early; the CPU steps one at a time (a
	// step there costs far more than a call).
	chunk := 8
	switch {
	case len(stop) == 0 && !watched:
		chunk = maxNewTokens
	case s.info.Backend == BackendCPU:
		chunk = 1
	}
	buf := make([]int32, chunk)
	for done := 0; done < maxNewTokens; {
		k := chunk
		if rest := maxNewTokens - done; k > rest {
			k = rest
		}
		if err := s.GenerateInto(slot, buf[:k]); err != nil {
			return err
		}
		done += k
		for _, id := range buf[:k] {
			if stop[id] {
				return nil
			}
			if more, err := take(id); err != nil || !more {
				return err
			}
		}
	}
	return nil
}

// heldIDs: text ending in U+FFFD waits while a character's bytes may still be arriving; a
// UTF-8 character spans at most 4 bytes, so more ids than this behind it make it a real one.
const heldIDs = 8

// textPieces is the text of ids given one at a time, piece by piece, as Python's stream
// makes it: each piece is the text the newest ids add to that of the ids of the piece
// before (so that a tokenizer's word starts come out as in decoding the whole), and costs
// a decode of a few ids, not of everything so far: the text of n ids costs O(n) however it
// is cut.
type textPieces struct {
	ids         []int32
	start, done int // ids[start:done] is context already given; ids[done:] is not
}

// push adds id (none when last) and returns the next piece, or ok false while the text
// ends in a character whose bytes may still be arriving. last: the ids have ended.
func (p *textPieces) push(s *Session, id int32, last bool) (piece string, ok bool, err error) {
	if !last {
		p.ids = append(p.ids, id)
	}
	before, err := s.Decode(p.ids[p.start:p.done], true)
	if err != nil {
		return "", false, err
	}
	after, err := s.Decode(p.ids[p.start:], true)
	if err != nil {
		return "", false, err
	}
	if !last && strings.HasSuffix(after, "\uFFFD") && len(p.ids)-p.done < heldIDs {
		return "", false, nil
	}
	// The new text is what follows before in after: all of it does, unless a character
	// that before ended in U+FFFD was completed (then from the first character that
	// differs).
	same := 0
	for same < len(before) && same < len(after) && before[same] == after[same] {
		same++
	}
	for same > 0 && same < len(after) && !utf8.RuneStart(after[same]) {
		same--
	}
	p.start, p.done = p.done, len(p.ids)
	// The window's ids are now context: drop those before it, so memory stays bounded.
	if p.start > heldIDs*4 {
		p.ids = append(p.ids[:0], p.ids[p.start:]...)
		p.done -= p.start
		p.start = 0
	}
	return after[same:], true, nil
}

// stopMatcher finds stop strings in text given piece by piece, as tools/stop_matcher.h
// finds them: the first to complete ends the text where it begins (of two completing at
// the same byte, the longer), and the longest end of the text that could still begin one
// is held back. Each stop string runs a Knuth-Morris-Pratt automaton over the bytes, so the
// cost is linear in the text (plus the stop strings' lengths, once).
type stopMatcher struct {
	stops   []kmpStop
	held    string
	stopped bool
}

type kmpStop struct {
	text string
	// fail[i]: the length of the longest proper prefix of text[:i+1] that is also its end.
	fail []int
	// The length of the longest end of the text so far that begins this stop string.
	state int
}

func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{stops: make([]kmpStop, len(stops))}
	for j, t := range stops {
		fail := make([]int, len(t))
		k := 0
		for i := 1; i < len(t); i++ {
			for k > 0 && t[i] != t[k] {
				k = fail[k-1]
			}
			if t[i] == t[k] {
				k++
			}
			fail[i] = k
		}
		m.stops[j] = kmpStop{text: t, fail: fail}
	}
	return m
}

// push returns the text that follows piece safely; it sets stopped when a stop string
// completed.
func (m *stopMatcher) push(piece string) string {
	if m.stopped {
		return ""
	}
	for i := 0; i < len(piece); i++ {
		b, longest := piece[i], 0
		for j := range m.stops {
			st := &m.stops[j]
			for st.state > 0 && st.text[st.state] != b {
				st.state = st.fail[st.state-1]
			}
			if st.text[st.state] == b {
				st.state++
			}
			if st.state == len(st.text) && st.state > longest {
				longest = st.state
			}
		}
		if longest > 0 {
			m.stopped = true
			text := m.held + piece[:i+1]
			m.held = ""
			return text[:len(text)-longest]
		}
	}
	m.held += piece
	// Each state is at most the held text's length (it grows by one a byte, from at most
	// what was held), so the held end is a whole end of the text.
	hold := 0
	for _, st := range m.stops {
		if st.state > hold {
			hold = st.state
		}
	}
	out := m.held[:len(m.held)-hold]
	m.held = m.held[len(m.held)-hold:]
	return out
}

// finish is the held text, once the text has ended (no stop string can complete any more).
func (m *stopMatcher) finish() string {
	out := m.held
	m.held = ""
	return out
}
