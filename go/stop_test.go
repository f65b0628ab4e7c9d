// Stop strings of the text calls (SamplingOptions.Stop): a stop that spans ids is cut out
// of the text and ends the generation at the id that completes it, with the program's rule
// (the first to complete wins, of two completing together the longer), on the fixture
// tokenizer and on the real SmolLM2 file (skipped, saying so, without it); stop strings out
// of bounds are refused by name.
package stepgraph

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// cutAtStops is where a text ends with stop strings, found the slow way: at the first
// character where one of them completes (the longer of two completing there), cut where it
// begins.
func cutAtStops(text string, stops []string) string {
	for end := 1; end <= len(text); end++ {
		if end < len(text) && !utf8.RuneStart(text[end]) {
			continue
		}
		longest := ""
		for _, s := range stops {
			if strings.HasSuffix(text[:end], s) && len(s) > len(longest) {
				longest = s
			}
		}
		if longest != "" {
			return text[:end-len(longest)]
		}
	}
	return text
}

func TestStopStringsEndTheTextAcrossIDs(t *testing.T) {
	s := textFolder(t)
	prompt, err := s.Encode("Hello", EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := s.GenerateUntil(0, prompt, 24, nil)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := s.GenerateText(0, "Hello", EncodeOptions{}, 24, false)
	if err != nil {
		t.Fatal(err)
	}
	// The text of the first k ids, for each k; a stop straddling the text of ids k-1 and k
	// (two characters before, one after).
	texts := make([]string, len(ids)+1)
	for k := range texts {
		if texts[k], err = s.Decode(ids[:k], true); err != nil {
			t.Fatal(err)
		}
	}
	if texts[len(ids)] != whole {
		t.Fatalf("%q, decoded %q", whole, texts[len(ids)])
	}
	stop := ""
	for k := 2; k < len(ids) && stop == ""; k++ {
		a, b := []rune(texts[k-1]), []rune(texts[k])
		if len(a) < 2 || len(b) <= len(a) || !strings.HasPrefix(texts[k], texts[k-1]) {
			continue
		}
		if c := string(b[len(a)-2 : len(a)+1]); !strings.ContainsRune(c, utf8.RuneError) {
			stop = c
		}
	}
	if stop == "" {
		t.Fatalf("no two ids with text in %q", whole)
	}
	want := whole[:strings.Index(whole, stop)]
	got, err := s.GenerateTextWith(0, "Hello", EncodeOptions{}, 24, false,
		&SamplingOptions{Stop: []string{stop}})
	if err != nil || got != want {
		t.Fatalf("stop %q in %q: %q, %v; want %q", stop, whole, got, err, want)
	}
	// The generation ended at the id whose text completed the stop: the slot's next id is
	// the one that followed it.
	used := 0
	for !strings.Contains(texts[used], stop) {
		used++
	}
	if next, err := s.Generate(0, 1); err != nil || next[0] != ids[used] {
		t.Fatalf("next id %v, %v; want %d", next, err, ids[used])
	}
	// A stop that never comes leaves the text whole, with the 4 strings allowed.
	got, err = s.GenerateTextWith(0, "Hello", EncodeOptions{}, 24, false,
		&SamplingOptions{Stop: []string{"\x00never", "\x01", "zz\x02", "\x03"}})
	if err != nil || got != whole {
		t.Fatalf("%q, %v; want %q", got, err, whole)
	}
	// The first to complete wins over one that began before it; of two completing at the
	// same character, the longer.
	r := []rune(whole)
	if len(r) < 12 {
		t.Fatalf("%q", whole)
	}
	sub := func(a, b int) string { return string(r[a:b]) }
	m := len(r) / 2
	for _, stops := range [][]string{
		{sub(m-3, m+3), sub(m-1, m+1)},
		{sub(m-1, m+2), sub(m-4, m+2)},
		{sub(m, m+2), sub(m-3, m+2), sub(2, 3), stop},
	} {
		got, err := s.GenerateTextWith(0, "Hello", EncodeOptions{}, 24, false,
			&SamplingOptions{Stop: stops})
		if want := cutAtStops(whole, stops); err != nil || got != want {
			t.Fatalf("stops %q in %q: %q, %v; want %q", stops, whole, got, err, want)
		}
	}
}

func TestBadStopStringsAreRefusedByName(t *testing.T) {
	s := textFolder(t)
	ask := []Message{{Role: "user", Content: "Hello"}}
	for field, stop := range map[string][]string{
		"sampling.stop[1]": {"a", ""},
		"sampling.stop[0]": {strings.Repeat("x", MaxStopBytes+1)},
		"sampling.stop[2]": {"a", "b", "c\xff"},
		"sampling.stop:":   {"a", "b", "c", "d", "e"},
	} {
		o := &SamplingOptions{Stop: stop}
		_, err1 := s.GenerateTextWith(0, "Hello", EncodeOptions{}, 4, true, o)
		_, err2 := s.GenerateChatWith(0, ask, 4, true, o)
		for _, err := range []error{err1, err2} {
			var e *Error
			if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &e) ||
				!strings.HasPrefix(e.Message, field) {
				t.Fatalf("%s: %v", field, err)
			}
		}
	}
	o := &SamplingOptions{Stop: []string{"x"}}
	_, err := s.GenerateUntilWith(0, []int32{1, 2, 3}, 2, nil, o)
	for _, err := range []error{s.PrefillWith(0, []int32{1, 2, 3}, o), err} {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "sampling.stop") {
			t.Fatalf("%v", err)
		}
	}
	// The bounds themselves are taken: 4 strings, one of 256 bytes.
	o = &SamplingOptions{Stop: []string{strings.Repeat("\x00", MaxStopBytes), "\x01", "\x02",
		"\x03"}}
	got, err := s.GenerateTextWith(0, "Hello", EncodeOptions{}, 4, false, o)
	want, err2 := s.GenerateText(0, "Hello", EncodeOptions{}, 4, false)
	if err != nil || err2 != nil || got != want {
		t.Fatalf("%q, %v; want %q, %v", got, err, want, err2)
	}
}

// SmolLM2's greedy answer, " Paris.\n\n...": "\n\n" is two ids (198, 198), and the text
// ends before them, the generation with them (the next id is the one that followed); in
// the chat reply a stop across " is" and " Paris" ends it.
func TestSmolLM2StopStrings(t *testing.T) {
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
			Generated     []int32 `json:"generated"`
			GeneratedText string  `json:"generated_text"`
		} `json:"cases"`
	}
	readJSON(t, "smollm2/expected.json", &fixture)
	c := fixture.Cases[0]
	if c.Chat || !strings.HasPrefix(c.GeneratedText, " Paris.\n\n") ||
		!reflect.DeepEqual(c.Generated[2:4], []int32{198, 198}) {
		t.Fatalf("the fixture's first case: %q %v", c.GeneratedText, c.Generated)
	}
	got, err := s.GenerateTextWith(0, c.Text, EncodeOptions{}, 8, true,
		&SamplingOptions{Stop: []string{"\n\n"}})
	if err != nil || got != " Paris." {
		t.Fatalf("%q, %v", got, err)
	}
	if next, err := s.Generate(0, 1); err != nil || next[0] != c.Generated[4] {
		t.Fatalf("next id %v, %v; want %d", next, err, c.Generated[4])
	}
	got, err = s.GenerateChatWith(0, []Message{{Role: "user",
		Content: "What is the capital of France?"}}, 10, true,
		&SamplingOptions{Stop: []string{"s Par", "France is Paris!"}})
	if err != nil || got != "The capital of France i" {
		t.Fatalf("%q, %v", got, err)
	}
}
