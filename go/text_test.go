// Text through a session: Encode, Decode, StopIDs and GenerateText against the tokenizer
// fixtures made with transformers (tests/fixtures/tokenizer) and the real
// SmolLM2-135M-Instruct file (tests/fixtures/fetch_smollm2.sh; its tests skip, saying so,
// without it); the refusals: no tokenizer, text that is not UTF-8, ids outside the
// vocabulary, flags that do not go together.
package stepgraph

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const fixtures = "../tests/fixtures"

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtures, path))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// textFolder is the f32_gqa fixture model with the bl_smollm fixture tokenizer (a
// byte-level BPE of 700 tokens trained like SmolLM's, ChatML specials at 0..2) and
// SmolLM2's chat template.
func textFolder(t *testing.T) *Session {
	t.Helper()
	dir := t.TempDir()
	for from, to := range map[string]string{
		"f32_gqa/config.json":                       "config.json",
		"f32_gqa/generation_config.json":            "generation_config.json",
		"f32_gqa/model.safetensors":                 "model.safetensors",
		"tokenizer/bl_smollm/tokenizer.json":        "tokenizer.json",
		"tokenizer/bl_smollm/tokenizer_config.json": "tokenizer_config.json",
		"tokenizer/chat/smollm2.jinja":              "chat_template.jinja",
	} {
		data, err := os.ReadFile(filepath.Join(fixtures, from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(dir, &Options{Backend: BackendCPU, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type tokenizerExpected struct {
	IDs       [][]int32         `json:"ids"`
	Different map[string]string `json:"decoded_where_different"`
}

func corpus(t *testing.T) []string {
	var texts []string
	readJSON(t, "tokenizer/corpus.json", &texts)
	return texts
}

func TestTextRoundTripsAsTransformersDoes(t *testing.T) {
	s := textFolder(t)
	var want tokenizerExpected
	readJSON(t, "tokenizer/bl_smollm/expected.json", &want)
	texts := corpus(t)
	if len(texts) != len(want.IDs) {
		t.Fatalf("%d texts, %d id lists", len(texts), len(want.IDs))
	}
	same := 0
	for i, text := range texts {
		ids, err := s.Encode(text, EncodeOptions{})
		if err != nil {
			t.Fatalf("#%d: %v", i, err)
		}
		if !reflect.DeepEqual(ids, want.IDs[i]) && !(len(ids) == 0 && len(want.IDs[i]) == 0) {
			t.Fatalf("#%d %q: %v, want %v", i, text, ids, want.IDs[i])
		}
		back, err := s.Decode(ids, false)
		if err != nil {
			t.Fatal(err)
		}
		wantBack, differs := want.Different[strconv.Itoa(i)]
		if !differs {
			wantBack = text
		}
		if back != wantBack {
			t.Fatalf("#%d: decoded %q, want %q", i, back, wantBack)
		}
		if back == text {
			same++
		}
	}
	if same < 300 {
		t.Fatalf("%d round trips", same)
	}
	// The options reach the tokenizer: a special token in the text is one id, or text.
	parsed, _ := s.Encode("a<|im_end|>b", EncodeOptions{})
	literal, _ := s.Encode("a<|im_end|>b", EncodeOptions{LiteralSpecial: true})
	has := func(ids []int32, id int32) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
	if !has(parsed, 2) || has(literal, 2) {
		t.Fatalf("parsed %v, literal %v", parsed, literal)
	}
	if text, _ := s.Decode(parsed, true); text != "ab" {
		t.Fatalf("skipping specials: %q", text)
	}
	// Text longer than the first guess of the buffer: the size query's second call.
	long := make([]int32, 300)
	for i := range long {
		long[i] = 1 // <|im_start|>, 12 bytes
	}
	if text, err := s.Decode(long, false); err != nil ||
		text != strings.Repeat("<|im_start|>", 300) {
		t.Fatalf("%d bytes, %v", len(text), err)
	}
}

func TestChatTurnsAreTheTemplatesAndStopAtItsEndOfTurn(t *testing.T) {
	s := textFolder(t)
	var cases map[string]struct {
		Cases []struct{ User, Text string } `json:"cases"`
	}
	readJSON(t, "tokenizer/chat/expected.json", &cases)
	for _, c := range cases["smollm2"].Cases {
		ids, err := s.Encode(c.User, EncodeOptions{Chat: true})
		if err != nil {
			t.Fatal(err)
		}
		if text, _ := s.Decode(ids, false); text != c.Text {
			t.Fatalf("%q: %q, want %q", c.User, text, c.Text)
		}
	}
	if ids, err := s.StopIDs(false); err != nil || len(ids) != 0 {
		t.Fatalf("stop ids %v, %v", ids, err)
	}
	if ids, err := s.StopIDs(true); err != nil || !reflect.DeepEqual(ids, []int32{2}) {
		t.Fatalf("chat stop ids %v, %v", ids, err)
	}
}

// Whole conversations (system message, earlier turns) through the template, as
// transformers rendered them (the template fixtures, generation prompt added).
func TestConversationsRenderAsTransformersRendersThem(t *testing.T) {
	s := textFolder(t)
	var fixture struct {
		Templates map[string]struct {
			Cases []struct {
				Messages            []Message `json:"messages"`
				AddGenerationPrompt bool      `json:"add_generation_prompt"`
				Text                string    `json:"text"`
			} `json:"cases"`
		} `json:"templates"`
	}
	readJSON(t, "chat_templates/expected.json", &fixture)
	several := 0
	for _, c := range fixture.Templates["tokenizer/chat/smollm2.jinja"].Cases {
		if !c.AddGenerationPrompt {
			continue
		}
		ids, err := s.EncodeChat(c.Messages)
		if err != nil {
			t.Fatal(err)
		}
		if text, _ := s.Decode(ids, false); text != c.Text {
			t.Fatalf("%v: %q, want %q", c.Messages, text, c.Text)
		}
		if len(c.Messages) > 1 {
			several++
		}
	}
	if several < 2 {
		t.Fatalf("%d conversations of several messages", several)
	}
	one, err := s.EncodeChat([]Message{{Role: "user", Content: "Hi"}})
	turn, err2 := s.Encode("Hi", EncodeOptions{Chat: true})
	if err != nil || err2 != nil || !reflect.DeepEqual(one, turn) {
		t.Fatalf("one user message %v (%v), the chat turn %v (%v)", one, err, turn, err2)
	}
	if _, err := s.EncodeChat(nil); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "no messages") {
		t.Fatalf("no messages: %v", err)
	}
}

func TestBadTextAndIDsAreRefusedWithMessages(t *testing.T) {
	s := textFolder(t)
	for _, bad := range []string{"ab\xff", "\xe2\x82", "\xc0\xaf", "x\xed\xa0\x80y"} {
		_, err := s.Encode(bad, EncodeOptions{})
		isInvalid(t, strconv.Quote(bad), err, "UTF-8")
	}
	good, err := s.Encode("Hello world", EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int32{700, -1, 1<<31 - 1} {
		ids := append([]int32{good[0], id}, good[1:]...)
		_, err := s.Decode(ids, false)
		isInvalid(t, "id "+strconv.Itoa(int(id)), err, strconv.Itoa(int(id)))
	}
	_, err = s.Encode("hi", EncodeOptions{Chat: true, LiteralSpecial: true})
	isInvalid(t, "chat with literal specials", err, "stepgraph_session_encode")
	// A failure leaves the session usable; empty text and no ids are fine.
	if text, _ := s.Decode(good, false); text != "Hello world" {
		t.Fatalf("%q", text)
	}
	if ids, err := s.Encode("", EncodeOptions{}); err != nil || len(ids) != 0 {
		t.Fatalf("%v, %v", ids, err)
	}
	if text, err := s.Decode(nil, false); err != nil || text != "" {
		t.Fatalf("%q, %v", text, err)
	}
}

func TestAModelWithoutATokenizerSaysSo(t *testing.T) {
	builtin, err := OpenBuiltin(&Options{Backend: BackendCPU, MaxSeq: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer builtin.Close()
	idsOnly, err := Open(filepath.Join(fixtures, "f32_gqa"), &Options{Backend: BackendCPU,
		MaxSeq: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer idsOnly.Close()
	for s, mention := range map[*Session]string{builtin: "built-in", idsOnly: "tokenizer.json"} {
		_, err := s.Encode("hello", EncodeOptions{})
		var e *Error
		if !errors.Is(err, ErrNoTokenizer) || !errors.As(err, &e) ||
			!strings.Contains(e.Message, mention) ||
			!strings.Contains(err.Error(), "no tokenizer") {
			t.Fatalf("%v", err)
		}
		if _, err := s.Decode([]int32{1, 2}, false); !errors.Is(err, ErrNoTokenizer) {
			t.Fatal(err)
		}
		if _, err := s.StopIDs(true); !errors.Is(err, ErrNoTokenizer) {
			t.Fatal(err)
		}
		if ids, err := s.StopIDs(false); err != nil || len(ids) != 0 {
			t.Fatalf("%v, %v", ids, err)
		}
		if err := s.Prefill(0, []int32{3, 4, 5}, 0); err != nil {
			t.Fatal(err)
		}
		if ids, err := s.Generate(0, 2); err != nil || len(ids) != 2 {
			t.Fatalf("%v, %v", ids, err)
		}
	}
}

// ---- the real SmolLM2 file ---------------------------------------------------------------

// SmolLM2Path is the real model file's path, or "" when it has not been fetched. (Exported
// for this package's external tests: readme_test.go.)
func SmolLM2Path() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	path := filepath.Join(cache, "stepgraph-test", "SmolLM2-135M-Instruct.Q4_1.gguf")
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}

func smollm2(t *testing.T) string {
	t.Helper()
	path := SmolLM2Path()
	if path == "" {
		t.Skip("SmolLM2-135M-Instruct.Q4_1.gguf is absent: run tests/fixtures/fetch_smollm2.sh")
	}
	return path
}

// Sanitized: under the sanitizers (tools/test.sh sets STEPGRAPH_TEST_SANITIZED) the CPU
// reference runs about ten times slower, and the model tests leave out their longest
// generation.
func Sanitized() bool { return os.Getenv("STEPGRAPH_TEST_SANITIZED") != "" }

func TestSmolLM2TextIsTransformers(t *testing.T) {
	path := smollm2(t)
	s, err := Open(path, &Options{Backend: BackendCPU, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var want tokenizerExpected
	readJSON(t, "tokenizer/smollm2.expected.json", &want)
	for i, text := range corpus(t) {
		ids, err := s.Encode(text, EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids, want.IDs[i]) && !(len(ids) == 0 && len(want.IDs[i]) == 0) {
			t.Fatalf("#%d %q: %v, want %v", i, text, ids, want.IDs[i])
		}
	}
	imEnd, _ := s.Encode("<|im_end|>", EncodeOptions{})
	plain, _ := s.StopIDs(false)
	chat, _ := s.StopIDs(true)
	if len(imEnd) != 1 || !reflect.DeepEqual(plain, imEnd) || !reflect.DeepEqual(chat, imEnd) {
		t.Fatalf("<|im_end|> %v, stop ids %v, chat %v", imEnd, plain, chat)
	}
}

// Greedy text on the CPU reference: the prompt's ids, the 32 new ids and their text are
// transformers' (tests/fixtures/smollm2/expected.json).
func TestSmolLM2GeneratesTransformersText(t *testing.T) {
	path := smollm2(t)
	s, err := Open(path, &Options{Backend: BackendCPU, MaxSeq: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var fixture struct {
		Cases []struct {
			Text          string  `json:"text"`
			Chat          bool    `json:"chat"`
			PromptIDs     []int32 `json:"prompt_ids"`
			Generated     []int32 `json:"generated"`
			GeneratedText string  `json:"generated_text"`
		} `json:"cases"`
	}
	readJSON(t, "smollm2/expected.json", &fixture)
	for _, c := range fixture.Cases {
		ids, err := s.Encode(c.Text, EncodeOptions{Chat: c.Chat})
		if err != nil || !reflect.DeepEqual(ids, c.PromptIDs) {
			t.Fatalf("%q: %v, %v; want %v", c.Text, ids, err, c.PromptIDs)
		}
	}
	for _, c := range fixture.Cases {
		if !c.Chat {
			continue
		}
		// 32 ids without stopping: transformers' ids and text.
		if !Sanitized() {
			got, err := s.GenerateUntil(0, c.PromptIDs, len(c.Generated), nil)
			if err != nil || !reflect.DeepEqual(got, c.Generated) {
				t.Fatalf("%v, %v; want %v", got, err, c.Generated)
			}
			text, err := s.Decode(got, true)
			if err != nil || text != c.GeneratedText {
				t.Fatalf("%q, %v; want %q", text, err, c.GeneratedText)
			}
		}
		// Stopping at <|im_end|>.
		text, err := s.GenerateText(0, c.Text, EncodeOptions{Chat: true}, len(c.Generated),
			true)
		if err != nil || text != "The capital of France is Paris." {
			t.Fatalf("%q, %v", text, err)
		}
		// The same question as a conversation of one message.
		text, err = s.GenerateChat(0, []Message{{Role: "user", Content: c.Text}},
			len(c.Generated), true)
		if err != nil || text != "The capital of France is Paris." {
			t.Fatalf("GenerateChat: %q, %v", text, err)
		}
		return
	}
	t.Fatal("no chat case in the fixture")
}
